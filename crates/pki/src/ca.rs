//! Certificate authorities and the leaves they issue.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use rand::RngCore as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber,
};

use crate::{PkiError, pem_to_der};

/// How long a CA is valid (kubeadm's ten years).
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long a leaf is valid (kubeadm's one year).
pub const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// Certificates start this long before "now", so a node whose clock is slightly behind
/// the issuer's still accepts a freshly issued certificate.
const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// An extended key usage of a leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// TLS server authentication.
    ServerAuth,
    /// TLS client authentication.
    ClientAuth,
}

/// What a leaf certificate says: its subject, usages and names.
#[derive(Debug, Clone)]
pub struct LeafSpec {
    /// Subject common name (for client certificates, the Kubernetes user name).
    pub common_name: String,
    /// Subject organizations (for client certificates, the Kubernetes groups).
    pub organizations: Vec<String>,
    /// Extended key usages.
    pub usages: Vec<Usage>,
    /// DNS subject alternative names.
    pub dns_names: Vec<String>,
    /// IP subject alternative names.
    pub ips: Vec<IpAddr>,
    /// Validity from now.
    pub validity: Duration,
}

impl LeafSpec {
    /// A leaf with `common_name`, the given usages, no SANs, and a year's validity.
    pub fn new(common_name: impl Into<String>, usages: &[Usage]) -> Self {
        LeafSpec {
            common_name: common_name.into(),
            organizations: Vec::new(),
            usages: usages.to_vec(),
            dns_names: Vec::new(),
            ips: Vec::new(),
            validity: LEAF_VALIDITY,
        }
    }
}

/// A freshly issued certificate and its private key, both PEM.
#[derive(Clone)]
pub struct IssuedCert {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The PKCS#8 private key, PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"[elided]")
            .finish()
    }
}

/// Bytes of a serial number: 20 (RFC 5280's maximum), the top bit clear so it stays
/// positive and the next one set so it is always encoded at full length: 158 random bits.
pub const SERIAL_LEN: usize = 20;

/// A fresh random serial number from the OS-seeded CSPRNG (never derived from the key, so
/// two certificates for one key never share a serial).
fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; SERIAL_LEN];
    rand::rng().fill_bytes(&mut bytes);
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    SerialNumber::from_slice(&bytes)
}

/// A certificate authority that can issue leaves: its certificate and signing key.
pub struct Ca {
    name: String,
    cert_pem: String,
    not_after: time::OffsetDateTime,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").field("name", &self.name).finish()
    }
}

fn validity(params: &mut CertificateParams, how_long: Duration) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + how_long;
}

/// The key usages of every CA: sign certificates (and CRLs), nothing else. ECDSA keys
/// cannot encipher keys, so `keyEncipherment` is never set.
const CA_KEY_USAGES: [KeyUsagePurpose; 3] = [
    KeyUsagePurpose::DigitalSignature,
    KeyUsagePurpose::KeyCertSign,
    KeyUsagePurpose::CrlSign,
];

impl Ca {
    /// A new self-signed CA with common name `cn`, valid ten years.
    pub fn generate(cn: &str) -> Result<Ca, PkiError> {
        let gen_err = |source| PkiError::Generate {
            what: format!("CA {cn}"),
            source,
        };
        let key = KeyPair::generate().map_err(gen_err)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        // pathlen:0: it issues leaves only, never another CA.
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = CA_KEY_USAGES.to_vec();
        params.serial_number = Some(random_serial());
        validity(&mut params, CA_VALIDITY);
        let not_after = params.not_after;
        let cert = params.self_signed(&key).map_err(gen_err)?;
        Ok(Ca {
            name: cn.to_string(),
            cert_pem: cert.pem(),
            not_after,
            issuer: Issuer::new(params, key),
        })
    }

    /// A CA from its PEM certificate and PEM (PKCS#8) key. `name` labels errors.
    /// Refuses a key that does not belong to the certificate.
    pub fn from_pem(name: &str, cert_pem: &str, key_pem: &str) -> Result<Ca, PkiError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| PkiError::Parse {
            what: format!("{name} key"),
            reason: format!("{e} (expected an unencrypted PKCS#8 ECDSA key)"),
        })?;
        let der = pem_to_der(cert_pem.as_bytes(), &format!("{name} certificate"))?;
        let (_, x509) = x509_parser::parse_x509_certificate(&der).map_err(|e| PkiError::Parse {
            what: format!("{name} certificate"),
            reason: e.to_string(),
        })?;
        if x509.tbs_certificate.subject_pki.raw != key.subject_public_key_info().as_slice() {
            return Err(PkiError::Invalid {
                what: name.to_string(),
                reason: "the key does not match the certificate's public key".into(),
            });
        }
        if !x509.is_ca() {
            return Err(PkiError::Invalid {
                what: name.to_string(),
                reason: "the certificate is not a CA (basicConstraints CA:TRUE missing)".into(),
            });
        }
        let not_after = x509.validity().not_after.to_datetime();
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(|e| PkiError::Parse {
            what: format!("{name} certificate"),
            reason: e.to_string(),
        })?;
        Ok(Ca {
            name: name.to_string(),
            cert_pem: cert_pem.to_string(),
            not_after,
            issuer,
        })
    }

    /// Loads `<prefix>.crt` and `<prefix>.key` from `dir` (e.g. prefix `etcd/ca`).
    pub fn load(dir: &Path, prefix: &str) -> Result<Ca, PkiError> {
        let read = |ext: &str| {
            let path = dir.join(format!("{prefix}.{ext}"));
            std::fs::read_to_string(&path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    PkiError::Missing {
                        path,
                        hint: "issuing leaves needs the shared CA: run `stratum-server certs generate` first, or download the shared certs",
                    }
                } else {
                    PkiError::io("read", &path, e)
                }
            })
        };
        let cert = read("crt")?;
        let key = read("key")?;
        Ca::from_pem(&dir.join(prefix).display().to_string(), &cert, &key)
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key, PEM (PKCS#8).
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// When the CA certificate expires.
    pub fn not_after(&self) -> time::OffsetDateTime {
        self.not_after
    }

    /// Issues a leaf with a fresh key and a random serial. Its lifetime is `spec.validity`,
    /// clamped to end no later than the CA's own: a leaf outliving its issuer would fail
    /// verification from the CA's expiry on, long before its own date. An expired CA
    /// issues nothing.
    pub fn issue(&self, spec: &LeafSpec) -> Result<IssuedCert, PkiError> {
        let gen_err = |source| PkiError::Generate {
            what: format!("{} (issued by {})", spec.common_name, self.name),
            source,
        };
        if spec.common_name.is_empty() {
            return Err(PkiError::Invalid {
                what: format!("leaf of {}", self.name),
                reason: "empty common name".into(),
            });
        }
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        for o in &spec.organizations {
            dn.push(DnType::OrganizationName, o.as_str());
        }
        dn.push(DnType::CommonName, spec.common_name.as_str());
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        // ECDSA: digitalSignature only (keyEncipherment is an RSA key-transport usage).
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.serial_number = Some(random_serial());
        params.extended_key_usages = spec
            .usages
            .iter()
            .map(|u| match u {
                Usage::ServerAuth => ExtendedKeyUsagePurpose::ServerAuth,
                Usage::ClientAuth => ExtendedKeyUsagePurpose::ClientAuth,
            })
            .collect();
        params.use_authority_key_identifier_extension = true;
        for name in &spec.dns_names {
            let ia5 = name.clone().try_into().map_err(|_| PkiError::Invalid {
                what: spec.common_name.clone(),
                reason: format!("{name:?} is not a valid DNS name"),
            })?;
            params.subject_alt_names.push(SanType::DnsName(ia5));
        }
        for ip in &spec.ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        validity(&mut params, spec.validity);
        if self.not_after <= params.not_before + BACKDATE {
            return Err(PkiError::Invalid {
                what: format!("leaf {} of {}", spec.common_name, self.name),
                reason: format!(
                    "the CA expired at {}: renew it before issuing",
                    self.not_after
                ),
            });
        }
        params.not_after = params.not_after.min(self.not_after);
        let key = KeyPair::generate().map_err(gen_err)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(gen_err)?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}
