//! Certificates: a throwaway CA per server, its serving certificate (SANs 127.0.0.1 and
//! localhost) and client certificates whose CN is the user and O the groups, as
//! kube-apiserver's x509 authenticator reads them.

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
    params: CertificateParams,
    key: KeyPair,
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
            params,
            key,
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
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).map_err(err(common_name))?;
        Ok(CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
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
