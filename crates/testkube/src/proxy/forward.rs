//! Forwarding: log streams and upgraded connections spliced byte for byte.

use super::*;

/// Forwards one `pods/{log,exec,attach,portforward}` request to the pod's kubelet, as
/// kube-apiserver does. The caller has authenticated the request and found the pod; `node`
/// is the pod's node, `None` when it does not exist.
pub async fn forward(
    cfg: &ProxyConfig,
    pod: &Value,
    node: Option<&Value>,
    subresource: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    let result = match subresource {
        "log" => forward_log(cfg, pod, node, req).await,
        "exec" | "attach" => match exec_location(pod, subresource, req.uri().query().unwrap_or(""))
        {
            Ok(path) => forward_upgrade(cfg, pod, node, path, req).await,
            Err(e) => Err(e),
        },
        "portforward" => match port_forward_location(pod, req.uri().query().unwrap_or("")) {
            Ok(path) => forward_upgrade(cfg, pod, node, path, req).await,
            Err(e) => Err(e),
        },
        other => Err(ProxyError::UnknownSubresource(format!(
            "{}/{other}",
            req.uri().path()
        ))),
    };
    result.unwrap_or_else(ProxyError::into_response)
}

pub(super) fn node_target(
    cfg: &ProxyConfig,
    pod: &Value,
    node: Option<&Value>,
) -> Result<(String, u16), ProxyError> {
    let node_name = pod["spec"]["nodeName"].as_str().unwrap_or("");
    let node = node.ok_or_else(|| ProxyError::NodeNotFound(node_name.to_string()))?;
    kubelet_target(node, &cfg.preferred_address_types)
}

pub(super) async fn forward_log(
    cfg: &ProxyConfig,
    pod: &Value,
    node: Option<&Value>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ProxyError> {
    let loc = log_location(pod, req.uri().query().unwrap_or(""))?;
    let Some(path) = loc.path_and_query else {
        // kube-apiserver's stream writer answers a location-less stream with 204.
        return Ok(Response::builder()
            .status(StatusCode::NO_CONTENT)
            .body(empty())
            .expect("static response parts are valid"));
    };
    let (host, port) = node_target(cfg, pod, node)?;
    let host_port = join_host_port(&host, port);
    let url = format!("https://{host_port}{path}");
    let backend = |e: String| ProxyError::Backend(format!("Get {url:?}: {e}"));
    let verify = cfg.kubelet_ca.is_some() && !loc.insecure_skip_verify;
    let stream = dial(cfg, &host, port, verify).await.map_err(backend)?;
    let mut send = handshake(stream)
        .await
        .map_err(|e| backend(e.to_string()))?;
    let out = Request::get(path.as_str())
        .header(header::HOST, host_port.as_str())
        .header(header::USER_AGENT, "testkube-apiserver")
        .body(empty())
        .map_err(|e| backend(e.to_string()))?;
    let resp = send
        .send_request(out)
        .await
        .map_err(|e| backend(e.to_string()))?;
    let code = resp.status().as_u16();
    if (300..400).contains(&code) && resp.headers().contains_key(header::LOCATION) {
        // The kubelet client refuses to follow redirects.
        return Err(backend("redirects forbidden".into()));
    }
    if !(200..=206).contains(&code) {
        let body = Limited::new(resp.into_body(), MAX_ERROR_BODY)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Err(ProxyError::KubeletStatus {
            code,
            body: String::from_utf8_lossy(&body).into_owned(),
            pod: meta(pod, "name").to_string(),
        });
    }
    // Streamed frame by frame: `logs -f` must see lines as the kubelet writes them.
    let body = resp
        .into_body()
        .map_err(|e| Box::new(e) as BoxError)
        .boxed();
    Ok(plain_ok(body))
}

pub(super) fn plain_ok(body: Body) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/plain")
        .body(body)
        .expect("static response parts are valid")
}

/// Whether a request asks for a protocol upgrade (`Connection: Upgrade` and an `Upgrade`).
pub fn is_upgrade_request(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Headers of the client's request that must not reach the kubelet: the API server's own
/// credentials stay with it (kube-apiserver's authentication filter removes them).
pub(super) fn forwardable(name: &header::HeaderName) -> bool {
    let n = name.as_str();
    // Framing headers describe the client's body, which is not forwarded (the upgraded
    // connection carries the data); hyper frames the empty body itself.
    !(n == "authorization"
        || n == "proxy-authorization"
        || n == "host"
        || n == "content-length"
        || n == "transfer-encoding"
        || n.starts_with("impersonate-"))
}

pub(super) async fn forward_upgrade(
    cfg: &ProxyConfig,
    pod: &Value,
    node: Option<&Value>,
    path: String,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, ProxyError> {
    let (host, port) = node_target(cfg, pod, node)?;
    if !is_upgrade_request(req.headers()) {
        return Err(ProxyError::BadRequest("Upgrade request required".into()));
    }
    let host_port = join_host_port(&host, port);
    let client_upgrade = hyper::upgrade::on(&mut req);
    let stream = dial(cfg, &host, port, cfg.kubelet_ca.is_some())
        .await
        .map_err(|e| ProxyError::Backend(format!("error dialing backend: {e}")))?;
    let mut send = handshake(stream)
        .await
        .map_err(|e| ProxyError::Backend(format!("error sending request: {e}")))?;
    let mut out = Request::builder()
        .method(req.method().clone())
        .uri(path.as_str());
    for (name, value) in req.headers() {
        if forwardable(name) {
            out = out.header(name, value);
        }
    }
    let out = out
        .header(header::HOST, host_port.as_str())
        .body(empty())
        .map_err(|e| ProxyError::Backend(format!("error sending request: {e}")))?;
    let mut resp = send
        .send_request(out)
        .await
        .map_err(|e| ProxyError::Backend(format!("error sending request: {e}")))?;
    let status = resp.status();
    if status == StatusCode::SWITCHING_PROTOCOLS {
        let kubelet_upgrade = hyper::upgrade::on(&mut resp);
        let mut back = Response::builder().status(status);
        for (name, value) in resp.headers() {
            back = back.header(name, value);
        }
        tokio::spawn(async move {
            match tokio::try_join!(client_upgrade, kubelet_upgrade) {
                Ok((client, kubelet)) => splice(TokioIo::new(client), TokioIo::new(kubelet)).await,
                Err(e) => tracing::debug!(error = %e, "upgrade did not complete"),
            }
        });
        return back
            .body(empty())
            .map_err(|e| ProxyError::Backend(e.to_string()));
    }
    if status.as_u16() < 400 {
        return Err(ProxyError::Backend(format!(
            "invalid upgrade response: status code {}",
            status.as_u16()
        )));
    }
    // An error from the kubelet goes back to the client as it is.
    let headers = resp.headers().clone();
    let body = Limited::new(resp.into_body(), MAX_ERROR_BODY)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_else(|_| Bytes::new());
    let mut back = Response::builder().status(status);
    for (name, value) in &headers {
        if name != header::TRANSFER_ENCODING && name != header::CONTENT_LENGTH {
            back = back.header(name, value);
        }
    }
    back.header(header::CONNECTION, HeaderValue::from_static("close"))
        .body(crate::body::full(body))
        .map_err(|e| ProxyError::Backend(e.to_string()))
}

/// Copies both ways until the kubelet side ends (nothing more can reach the client) or
/// both have. A client half-close is passed on, so a kubelet may still answer it.
pub(super) async fn splice<A, B>(client: A, kubelet: B)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut kr, mut kw) = tokio::io::split(kubelet);
    let up = async {
        let _ = tokio::io::copy(&mut cr, &mut kw).await;
        let _ = kw.shutdown().await;
    };
    let down = async {
        let _ = tokio::io::copy(&mut kr, &mut cw).await;
        let _ = cw.shutdown().await;
    };
    tokio::pin!(up, down);
    tokio::select! {
        _ = &mut down => {}
        _ = &mut up => down.await,
    }
}

/// Forwards `nodes/{name}/proxy/{path}` to the node's kubelet as kube-apiserver's node
/// proxy does (`pkg/registry/core/node/rest/proxy.go`: the kubelet's location with the
/// path appended, the query kept): the kubelet's status, content type and body come back
/// as they are, streamed. The double serves only plain `GET`s here; any other method or
/// an upgrade is refused with 405 naming what is missing.
pub async fn forward_node(
    cfg: &ProxyConfig,
    node: &Value,
    path: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    if req.method() != http::Method::GET || is_upgrade_request(req.headers()) {
        return failure(
            405,
            "MethodNotAllowed",
            &format!(
                "the API double proxies only plain GET requests to nodes/proxy, not {} {path}",
                req.method()
            ),
            None,
        );
    }
    let result = async {
        let (host, port) = kubelet_target(node, &cfg.preferred_address_types)?;
        let host_port = join_host_port(&host, port);
        let path_and_query = match req.uri().query() {
            Some(q) => format!("{path}?{q}"),
            None => path.to_string(),
        };
        let url = format!("https://{host_port}{path_and_query}");
        let backend = |e: String| ProxyError::Backend(format!("Get {url:?}: {e}"));
        let stream = dial(cfg, &host, port, cfg.kubelet_ca.is_some())
            .await
            .map_err(backend)?;
        let mut send = handshake(stream)
            .await
            .map_err(|e| backend(e.to_string()))?;
        let mut out = Request::get(path_and_query.as_str())
            .header(header::HOST, host_port.as_str())
            .body(empty())
            .map_err(|e| backend(e.to_string()))?;
        for (name, value) in req.headers() {
            if forwardable(name) {
                out.headers_mut().append(name.clone(), value.clone());
            }
        }
        let resp = send
            .send_request(out)
            .await
            .map_err(|e| backend(e.to_string()))?;
        let (parts, body) = resp.into_parts();
        let body = body.map_err(|e| Box::new(e) as BoxError).boxed();
        let mut answer = Response::new(body);
        *answer.status_mut() = parts.status;
        if let Some(ct) = parts.headers.get(header::CONTENT_TYPE) {
            answer
                .headers_mut()
                .insert(header::CONTENT_TYPE, ct.clone());
        }
        Ok::<_, ProxyError>(answer)
    };
    result.await.unwrap_or_else(ProxyError::into_response)
}
