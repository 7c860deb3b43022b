//! The election and the admin listener against the API double over real HTTPS.

mod admin;
mod lease;

/// Starts the API double with rustls' provider installed.
pub async fn api_server() -> testkube::ApiServer {
    testkube::fixtures::install_crypto();
    testkube::ApiServer::start()
        .await
        .expect("API double starts")
}
