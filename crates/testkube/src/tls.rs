//! Certificates: a throwaway CA per server, its serving certificate (SANs 127.0.0.1 and
//! localhost) and client certificates whose CN is the user and O the groups, as
//! kube-apiserver's x509 authenticator reads them.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// Certificate generation failed.
#[derive(Debug, thiserror::Error)]
#[error("generating the {what} certificate: {source}")]
pub struct CertError {
    what: String,
    #[source]
    source: rcgen::Error,
}

/// A PEM certificate and its PEM (PKCS#8) private key.
#[derive(Clone, Debug)]
pub struct CertPair {
    /// The certificate.
    pub cert_pem: String,
    /// The private key.
    pub key_pem: String,
}

/// A certificate authority that signs serving and client certificates.
pub struct Ca {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

fn err(what: &str) -> impl FnOnce(rcgen::Error) -> CertError + '_ {
    move |source| CertError {
        what: what.to_string(),
        source,
    }
}

impl Ca {
    /// A new self-signed CA.
    pub fn generate(common_name: &str) -> Result<Ca, CertError> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err("CA"))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().map_err(err("CA"))?;
        let cert = params.self_signed(&key).map_err(err("CA"))?;
        Ok(Ca {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// A CA from its PEM certificate and PEM (PKCS#8) key (an existing cluster's CA).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Ca, CertError> {
        let key = KeyPair::from_pem(key_pem).map_err(err("cluster CA key"))?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(err("cluster CA"))?;
        Ok(Ca {
            cert_pem: cert_pem.to_string(),
            issuer,
        })
    }

    /// The CA certificate (PEM).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Issues a leaf certificate. `sans` may hold DNS names and IP addresses; only the
    /// first of `organizations` is written (one O attribute).
    pub fn issue(
        &self,
        common_name: &str,
        organizations: &[&str],
        sans: &[&str],
        server: bool,
        client: bool,
    ) -> Result<CertPair, CertError> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err(common_name))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        // rcgen keeps one value per attribute type, so a certificate carries at most one
        // group; give multi-group users a bearer token instead.
        if let Some(o) = organizations.first() {
            dn.push(DnType::OrganizationName, *o);
        }
        params.distinguished_name = dn;
        for san in sans {
            let entry = match san.parse::<std::net::IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*san).try_into().map_err(err(common_name))?),
            };
            params.subject_alt_names.push(entry);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if server {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        if client {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        let key = KeyPair::generate().map_err(err(common_name))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(err(common_name))?;
        Ok(CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A client-certificate verifier that accepts any chain at the handshake (still checking
/// that the client holds the key) and leaves the chain check to the request, through the
/// wrapped verifier: kube-apiserver answers a certificate from an unknown CA with HTTP 401.
#[derive(Debug)]
pub struct DeferredClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
}

impl DeferredClientVerifier {
    /// Wraps the verifier the request-time check uses.
    pub fn new(inner: Arc<dyn ClientCertVerifier>) -> Self {
        DeferredClientVerifier { inner }
    }
}

impl ClientCertVerifier for DeferredClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }
    fn client_auth_mandatory(&self) -> bool {
        false
    }
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }
    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The user a verified client certificate names: CN and the O values.
pub fn identity_from_der(der: &[u8]) -> Option<(String, Vec<String>)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let cn = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok().map(String::from))
        .collect();
    Some((cn, groups))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_certificates_carry_user_and_groups() {
        let ca = Ca::generate("test-ca").unwrap();
        let pair = ca.issue("alice", &["dev"], &[], false, true).unwrap();
        let der = rustls_pemfile::certs(&mut pair.cert_pem.as_bytes())
            .next()
            .unwrap()
            .unwrap();
        let (user, groups) = identity_from_der(&der).unwrap();
        assert_eq!(user, "alice");
        assert_eq!(groups, ["dev"]);
    }
}
