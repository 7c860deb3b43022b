//! The sealed forms a grant entry takes in the grant Secret, and the certificate-key that
//! seals them.
//!
//! Everything here is pure: no I/O, no clock. Opening is fed bytes read from a Secret that
//! anyone with write access to it could have replaced, so every parse returns an error
//! instead of panicking, and nothing is trusted before the AEAD tag verifies.
//!
//! # Sealed frame (grant entries and the key proof)
//!
//! ```text
//! "STGR" | version (1 byte, 1) | nonce (12 bytes) | AES-256-GCM ciphertext + 16-byte tag
//! ```
//!
//! The associated data is `"stratum-grant\0"`, the 5 header bytes, then the Secret
//! (`namespace/name`), the entry name and the token id, each length-prefixed (u16 BE). A
//! ciphertext copied under another entry name, into another Secret, or presented for another
//! token fails authentication, exactly like a wrong key or a flipped byte.
//!
//! # Bundle plaintext (version 1)
//!
//! ```text
//! generation u64 BE | flags u8 (bit 0: carries the at-rest encryption config; others 0)
//! vip: u16 len + UTF-8 (0 = none)
//! etcd endpoints: u16 count, each u16 len + UTF-8
//! files: u32 count, each u16 path len + UTF-8 path, u32 len + bytes; paths strictly ascending
//! ```
//!
//! # Legacy flat map (`certs` entry)
//!
//! `nonce (12 bytes) | AES-256-GCM(JSON object: relative path -> base64 of the file)`, no
//! associated data. This is the framing kubeadm's `upload-certs` uses for each of its values
//! (nonce prepended to the GCM ciphertext) applied to one JSON document, which is what Go's
//! `encoding/json` produces for a `map[string][]byte`: the shape every older joiner decodes.

use std::collections::BTreeMap;
use std::fmt;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use base64::Engine as _;
use rand::RngCore as _;
use sha2::{Digest as _, Sha256};

/// First four bytes of every sealed grant entry and key proof.
pub const ENVELOPE_MAGIC: [u8; 4] = *b"STGR";
/// The envelope version this build writes and the only one it opens.
pub const ENVELOPE_VERSION: u8 = 1;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
const HEADER_LEN: usize = ENVELOPE_MAGIC.len() + 1 + NONCE_LEN;
const AAD_DOMAIN: &[u8] = b"stratum-grant\0";
const FLAG_CARRIES_KEY: u8 = 0b1;
/// What the key proof entry encrypts: a fixed text, since only whether it opens matters.
const PROOF_PLAINTEXT: &[u8] = b"stratum at-rest key proof v1";
const PROOF_KDF_DOMAIN: &[u8] = b"stratum key-proof v1\0";

/// The 32-byte AES-256 key a grant is sealed under, printed once by `token create
/// --control-plane` as 64 hex digits. It decrypts the cluster's CA keys: never log it. Its
/// `Debug` is redacted, its bytes are wiped when it is dropped, and it has no `PartialEq`
/// (a comparison is a timing oracle; compare [`CertKey::same_key`] in constant time).
#[derive(Clone)]
pub struct CertKey([u8; 32]);

impl Drop for CertKey {
    fn drop(&mut self) {
        use zeroize::Zeroize as _;
        self.0.zeroize();
    }
}

impl CertKey {
    /// A fresh key from the operating system's CSPRNG (through rand's thread RNG, which is
    /// seeded from and periodically reseeded by the OS).
    pub fn generate() -> CertKey {
        let mut key = [0u8; 32];
        rand::rng().fill_bytes(&mut key);
        CertKey(key)
    }

    /// Parses the 64 hex digits `token create --control-plane` printed.
    pub fn from_hex(text: &str) -> Result<CertKey, CertKeyError> {
        let text = text.trim();
        if text.len() != 64 {
            return Err(CertKeyError::Length { len: text.len() });
        }
        let mut key = [0u8; 32];
        hex::decode_to_slice(text, &mut key).map_err(|_| CertKeyError::NotHex)?;
        Ok(CertKey(key))
    }

    /// Whether `other` is the same key, compared in constant time.
    pub fn same_key(&self, other: &CertKey) -> bool {
        self.0
            .iter()
            .zip(other.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }

    /// The key as 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Wraps raw key bytes (tests and key derivation).
    pub fn from_bytes(bytes: [u8; 32]) -> CertKey {
        CertKey(bytes)
    }

    /// The key that seals the key proof: derived from the at-rest encryption config, so only
    /// a node holding the same config can open it. The config carries a random 32-byte
    /// secret, so a hash of it is as unguessable as the secret itself.
    pub fn for_key_proof(encryption_config: &[u8]) -> CertKey {
        let mut hasher = Sha256::new();
        hasher.update(PROOF_KDF_DOMAIN);
        hasher.update(encryption_config);
        CertKey(hasher.finalize().into())
    }

    fn cipher(&self) -> Aes256Gcm {
        Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&self.0))
    }
}

impl fmt::Debug for CertKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A Debug print ends up in logs and panic messages; the key must not.
        f.write_str("CertKey(<redacted>)")
    }
}

/// A certificate-key that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertKeyError {
    /// Not 64 characters long.
    #[error(
        "the certificate-key must be 64 hex digits (32 bytes), got {len} characters: \
         copy it whole from the output of `stratum-server token create --control-plane`"
    )]
    Length {
        /// The length that was given.
        len: usize,
    },
    /// 64 characters, but not all hex digits.
    #[error(
        "the certificate-key is not hexadecimal: copy it whole from the output of \
         `stratum-server token create --control-plane`"
    )]
    NotHex,
}

/// What one grant entry carries: the shared files and the facts a joiner needs beside them.
/// Its `Debug` lists the files' names and sizes, never their bytes (CA keys among them).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Bundle {
    /// The shared control-plane files, by path relative to the pki dir.
    pub files: BTreeMap<String, Vec<u8>>,
    /// The publication's generation: one more than the Secret's previous one.
    pub generation: u64,
    /// Whether `files` includes the at-rest encryption config.
    pub carries_encryption_key: bool,
    /// The cluster VIP the publishing control plane recorded, if any.
    pub vip: Option<String>,
    /// The etcd client endpoints the cluster published.
    pub etcd_endpoints: Vec<String>,
}

impl fmt::Debug for Bundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let files: BTreeMap<&str, String> = self
            .files
            .iter()
            .map(|(p, b)| (p.as_str(), format!("<{} bytes redacted>", b.len())))
            .collect();
        f.debug_struct("Bundle")
            .field("files", &files)
            .field("generation", &self.generation)
            .field("carries_encryption_key", &self.carries_encryption_key)
            .field("vip", &self.vip)
            .field("etcd_endpoints", &self.etcd_endpoints)
            .finish()
    }
}

/// Where a sealed entry lives: all three are authenticated as associated data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryBinding<'a> {
    /// `namespace/name` of the Secret holding the entry.
    pub secret: &'a str,
    /// The data key of the entry (`certs-<token-id>`, `key-proof`).
    pub entry: &'a str,
    /// The bootstrap token id the grant was minted for ("" for the key proof).
    pub token_id: &'a str,
}

/// Why an entry could not be sealed or opened. The caller adds which entry it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// Shorter than a header and a tag.
    #[error(
        "truncated: {len} bytes, a sealed entry has at least {min}; the Secret was cut short or \
         edited by hand"
    )]
    Truncated {
        /// The length found.
        len: usize,
        /// The smallest valid length.
        min: usize,
    },
    /// Does not start with the envelope magic.
    #[error("not a stratum grant envelope (bad magic bytes)")]
    BadMagic,
    /// A version this build does not know.
    #[error(
        "envelope version {found} is not supported (this build opens version {supported}): \
         download with the stratum release that published it, or re-mint the join command"
    )]
    UnknownVersion {
        /// The version byte found.
        found: u8,
        /// The version this build opens.
        supported: u8,
    },
    /// The AEAD tag did not verify.
    #[error(
        "authentication failed: the certificate-key is wrong, or the entry was altered or moved \
         from another grant or Secret; check the key printed with this join command, or mint a \
         new one"
    )]
    Authentication,
    /// Authenticated, yet not a well-formed bundle: a bug in whoever sealed it.
    #[error("the bundle is malformed: {0}")]
    Malformed(String),
    /// Too big to encode (a field longer than its length prefix allows).
    #[error("the bundle cannot be encoded: {0}")]
    TooLarge(String),
}

/// Seals `plaintext` under `key` in the versioned frame, with a fresh random nonce.
// aes-gcm refuses only messages over 64 GiB, which no bundle held in memory reaches.
#[allow(clippy::expect_used)]
pub fn seal_bytes(key: &CertKey, binding: EntryBinding<'_>, plaintext: &[u8]) -> Vec<u8> {
    let mut nonce = [0u8; NONCE_LEN];
    rand::rng().fill_bytes(&mut nonce);
    let mut out = Vec::with_capacity(HEADER_LEN + plaintext.len() + TAG_LEN);
    out.extend_from_slice(&ENVELOPE_MAGIC);
    out.push(ENVELOPE_VERSION);
    out.extend_from_slice(&nonce);
    let aad = associated_data(&out[..ENVELOPE_MAGIC.len() + 1], binding);
    let ciphertext = key
        .cipher()
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: plaintext,
                aad: &aad,
            },
        )
        // aes-gcm refuses only messages over 64 GiB; a bundle is bounded far below that.
        .expect("AES-GCM encryption of a bounded message");
    out.extend_from_slice(&ciphertext);
    out
}

/// Opens a frame sealed by [`seal_bytes`] for the same binding.
pub fn open_bytes(
    key: &CertKey,
    binding: EntryBinding<'_>,
    sealed: &[u8],
) -> Result<Vec<u8>, EnvelopeError> {
    let min = HEADER_LEN + TAG_LEN;
    if sealed.len() < ENVELOPE_MAGIC.len() || sealed[..ENVELOPE_MAGIC.len()] != ENVELOPE_MAGIC {
        // A short prefix of the magic is still "truncated"; anything else is not ours.
        if ENVELOPE_MAGIC.starts_with(sealed) {
            return Err(EnvelopeError::Truncated {
                len: sealed.len(),
                min,
            });
        }
        return Err(EnvelopeError::BadMagic);
    }
    if let Some(&version) = sealed.get(ENVELOPE_MAGIC.len())
        && version != ENVELOPE_VERSION
    {
        return Err(EnvelopeError::UnknownVersion {
            found: version,
            supported: ENVELOPE_VERSION,
        });
    }
    if sealed.len() < min {
        return Err(EnvelopeError::Truncated {
            len: sealed.len(),
            min,
        });
    }
    let (header, ciphertext) = sealed.split_at(HEADER_LEN);
    let nonce = &header[ENVELOPE_MAGIC.len() + 1..];
    let aad = associated_data(&header[..ENVELOPE_MAGIC.len() + 1], binding);
    key.cipher()
        .decrypt(
            Nonce::from_slice(nonce),
            Payload {
                msg: ciphertext,
                aad: &aad,
            },
        )
        .map_err(|_| EnvelopeError::Authentication)
}

fn associated_data(header: &[u8], binding: EntryBinding<'_>) -> Vec<u8> {
    let mut aad = Vec::with_capacity(
        AAD_DOMAIN.len()
            + header.len()
            + 6
            + binding.secret.len()
            + binding.entry.len()
            + binding.token_id.len(),
    );
    aad.extend_from_slice(AAD_DOMAIN);
    aad.extend_from_slice(header);
    for field in [binding.secret, binding.entry, binding.token_id] {
        // Length prefixes keep ("ab","c") and ("a","bc") apart. Names are far below 64 KiB;
        // a longer one is clamped, which only makes the AAD differ, never collide silently
        // with a legitimate binding (legitimate names are short).
        let len = u16::try_from(field.len()).unwrap_or(u16::MAX);
        aad.extend_from_slice(&len.to_be_bytes());
        aad.extend_from_slice(field.as_bytes());
    }
    aad
}

/// Seals a bundle for one grant entry.
pub fn seal_bundle(
    key: &CertKey,
    binding: EntryBinding<'_>,
    bundle: &Bundle,
) -> Result<Vec<u8>, EnvelopeError> {
    let plaintext = encode_bundle(bundle)?;
    Ok(seal_bytes(key, binding, &plaintext))
}

/// Opens a grant entry sealed by [`seal_bundle`] for the same binding.
pub fn open_bundle(
    key: &CertKey,
    binding: EntryBinding<'_>,
    sealed: &[u8],
) -> Result<Bundle, EnvelopeError> {
    let plaintext = open_bytes(key, binding, sealed)?;
    decode_bundle(&plaintext)
}

/// What the key proof of publication `generation` encrypts: the fixed text, then the
/// generation (u64 BE), so a proof speaks for one publication only.
fn proof_plaintext(generation: u64) -> Vec<u8> {
    let mut text = PROOF_PLAINTEXT.to_vec();
    text.extend_from_slice(&generation.to_be_bytes());
    text
}

/// Seals the key proof of publication `generation`: a fixed text and the generation under
/// the key derived from the encryption config.
pub fn seal_key_proof(
    encryption_config: &[u8],
    binding: EntryBinding<'_>,
    generation: u64,
) -> Vec<u8> {
    seal_bytes(
        &CertKey::for_key_proof(encryption_config),
        binding,
        &proof_plaintext(generation),
    )
}

/// Whether a key proof opens under the key derived from `encryption_config` and names
/// publication `generation`. Any failure is "no": a proof under another config, a damaged
/// one, an unknown version, and one carried over from another publication all mean the
/// published bundle does not (as far as anyone can prove) carry this node's key.
pub fn key_proof_opens(
    encryption_config: &[u8],
    binding: EntryBinding<'_>,
    sealed: &[u8],
    generation: u64,
) -> bool {
    open_bytes(&CertKey::for_key_proof(encryption_config), binding, sealed)
        .is_ok_and(|text| text == proof_plaintext(generation))
}

/// Serializes a bundle to the version 1 plaintext.
pub fn encode_bundle(bundle: &Bundle) -> Result<Vec<u8>, EnvelopeError> {
    let size: usize = bundle
        .files
        .iter()
        .map(|(path, data)| 6 + path.len() + data.len())
        .sum::<usize>()
        + 64;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&bundle.generation.to_be_bytes());
    out.push(if bundle.carries_encryption_key {
        FLAG_CARRIES_KEY
    } else {
        0
    });
    put_str16(&mut out, bundle.vip.as_deref().unwrap_or(""), "the VIP")?;
    let count = u16::try_from(bundle.etcd_endpoints.len())
        .map_err(|_| EnvelopeError::TooLarge("more than 65535 etcd endpoints".into()))?;
    out.extend_from_slice(&count.to_be_bytes());
    for endpoint in &bundle.etcd_endpoints {
        put_str16(&mut out, endpoint, "an etcd endpoint")?;
    }
    let count = u32::try_from(bundle.files.len())
        .map_err(|_| EnvelopeError::TooLarge("too many files".into()))?;
    out.extend_from_slice(&count.to_be_bytes());
    for (path, data) in &bundle.files {
        put_str16(&mut out, path, "a file path")?;
        let len = u32::try_from(data.len())
            .map_err(|_| EnvelopeError::TooLarge(format!("{path} is larger than 4 GiB")))?;
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(data);
    }
    Ok(out)
}

fn put_str16(out: &mut Vec<u8>, text: &str, what: &str) -> Result<(), EnvelopeError> {
    let len = u16::try_from(text.len())
        .map_err(|_| EnvelopeError::TooLarge(format!("{what} is longer than 65535 bytes")))?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(text.as_bytes());
    Ok(())
}

/// Parses the version 1 plaintext. Never panics, whatever the input.
pub fn decode_bundle(bytes: &[u8]) -> Result<Bundle, EnvelopeError> {
    let mut r = Reader { bytes, at: 0 };
    let generation = u64::from_be_bytes(r.array("the generation")?);
    let [flags] = r.array::<1>("the flags")?;
    if flags & !FLAG_CARRIES_KEY != 0 {
        return Err(EnvelopeError::Malformed(format!(
            "unknown flag bits {flags:#04x}"
        )));
    }
    let vip = r.str16("the VIP")?;
    let count = u16::from_be_bytes(r.array("the etcd endpoint count")?);
    let mut etcd_endpoints = Vec::with_capacity(usize::from(count).min(r.remaining()));
    for _ in 0..count {
        etcd_endpoints.push(r.str16("an etcd endpoint")?);
    }
    let count = u32::from_be_bytes(r.array("the file count")?);
    let mut files = BTreeMap::new();
    let mut previous: Option<String> = None;
    for _ in 0..count {
        let path = r.str16("a file path")?;
        let len = u32::from_be_bytes(r.array("a file length")?) as usize;
        let data = r.take(len, &path)?.to_vec();
        if previous.as_deref().is_some_and(|p| p >= path.as_str()) {
            return Err(EnvelopeError::Malformed(format!(
                "file paths are not strictly ascending at {path:?}"
            )));
        }
        previous = Some(path.clone());
        files.insert(path, data);
    }
    if r.remaining() != 0 {
        return Err(EnvelopeError::Malformed(format!(
            "{} trailing bytes after the last file",
            r.remaining()
        )));
    }
    Ok(Bundle {
        files,
        generation,
        carries_encryption_key: flags & FLAG_CARRIES_KEY != 0,
        vip: (!vip.is_empty()).then_some(vip),
        etcd_endpoints,
    })
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn take(&mut self, len: usize, what: &str) -> Result<&'a [u8], EnvelopeError> {
        if len > self.remaining() {
            return Err(EnvelopeError::Malformed(format!(
                "{what} runs past the end ({len} bytes wanted, {} left)",
                self.remaining()
            )));
        }
        let slice = &self.bytes[self.at..self.at + len];
        self.at += len;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], EnvelopeError> {
        let slice = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    fn str16(&mut self, what: &str) -> Result<String, EnvelopeError> {
        let len = u16::from_be_bytes(self.array(what)?);
        let bytes = self.take(usize::from(len), what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| EnvelopeError::Malformed(format!("{what} is not UTF-8")))
    }
}

/// Seals the legacy flat map (see the module docs for its shape).
// A map of strings always serializes, and aes-gcm refuses only messages over 64 GiB.
#[allow(clippy::expect_used)]
pub fn seal_legacy(key: &CertKey, files: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let map: BTreeMap<&str, String> = files
        .iter()
        .map(|(path, data)| (path.as_str(), b64.encode(data)))
        .collect();
    let plaintext = serde_json::to_vec(&map).expect("a map of strings serializes");
    let mut nonce = [0u8; NONCE_LEN];
    rand::rng().fill_bytes(&mut nonce);
    let ciphertext = key
        .cipher()
        .encrypt(Nonce::from_slice(&nonce), plaintext.as_slice())
        .expect("AES-GCM encryption of a bounded message");
    let mut out = Vec::with_capacity(NONCE_LEN + ciphertext.len());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&ciphertext);
    out
}

/// Opens the legacy flat map. Never panics, whatever the input.
pub fn open_legacy(
    key: &CertKey,
    sealed: &[u8],
) -> Result<BTreeMap<String, Vec<u8>>, EnvelopeError> {
    if sealed.len() < NONCE_LEN + TAG_LEN {
        return Err(EnvelopeError::Truncated {
            len: sealed.len(),
            min: NONCE_LEN + TAG_LEN,
        });
    }
    let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
    let plaintext = key
        .cipher()
        .decrypt(Nonce::from_slice(nonce), ciphertext)
        .map_err(|_| EnvelopeError::Authentication)?;
    let map: BTreeMap<String, String> = serde_json::from_slice(&plaintext).map_err(|err| {
        EnvelopeError::Malformed(format!("not a JSON object of base64 strings: {err}"))
    })?;
    let b64 = base64::engine::general_purpose::STANDARD;
    map.into_iter()
        .map(|(path, data)| {
            let bytes = b64.decode(data.as_bytes()).map_err(|_| {
                EnvelopeError::Malformed(format!("the content of {path:?} is not base64"))
            })?;
            Ok((path, bytes))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_legacy_entry_of_exactly_nonce_and_tag_is_checked_not_called_truncated() {
        let key = CertKey::generate();
        assert!(matches!(
            open_legacy(&key, &[0u8; 28]),
            Err(EnvelopeError::Authentication)
        ));
        assert_eq!(
            open_legacy(&key, &[0u8; 27]).unwrap_err(),
            EnvelopeError::Truncated { len: 27, min: 28 }
        );
    }

    fn bundle() -> Bundle {
        let mut files = BTreeMap::new();
        files.insert(
            "ca.crt".to_string(),
            b"-----BEGIN CERTIFICATE-----".to_vec(),
        );
        files.insert("ca.key".to_string(), vec![0u8, 1, 2, 255]);
        files.insert("etcd/ca.key".to_string(), Vec::new());
        Bundle {
            files,
            generation: 7,
            carries_encryption_key: true,
            vip: Some("10.0.0.10".into()),
            etcd_endpoints: vec![
                "https://10.0.0.1:2379".into(),
                "https://10.0.0.2:2379".into(),
            ],
        }
    }

    const BINDING: EntryBinding<'static> = EntryBinding {
        secret: "kube-system/stratum-certs",
        entry: "certs-abcdef",
        token_id: "abcdef",
    };

    #[test]
    fn keys_that_differ_in_two_bytes_by_the_same_bits_are_different() {
        // An XOR-accumulating comparison would cancel the two differences out.
        let a = CertKey::from_hex(&"00".repeat(32)).unwrap();
        let b = CertKey::from_hex(&format!("0101{}", "00".repeat(30))).unwrap();
        assert!(!a.same_key(&b));
        assert!(a.same_key(&a.clone()));
    }

    #[test]
    fn an_empty_plaintext_opens_at_exactly_the_minimum_length() {
        let key = CertKey::generate();
        let sealed = seal_bytes(&key, BINDING, b"");
        assert_eq!(sealed.len(), HEADER_LEN + TAG_LEN);
        assert_eq!(open_bytes(&key, BINDING, &sealed).unwrap(), b"");
        assert!(matches!(
            open_bytes(&key, BINDING, &sealed[..sealed.len() - 1]),
            Err(EnvelopeError::Truncated { .. })
        ));
    }

    #[test]
    fn a_bundle_without_the_encryption_key_says_so_after_the_round_trip() {
        for carries in [false, true] {
            let mut b = bundle();
            b.carries_encryption_key = carries;
            let back = decode_bundle(&encode_bundle(&b).unwrap()).unwrap();
            assert_eq!(back.carries_encryption_key, carries);
            assert_eq!(back, b);
        }
    }

    #[test]
    fn seal_then_open_round_trips() {
        let key = CertKey::generate();
        let sealed = seal_bundle(&key, BINDING, &bundle()).unwrap();
        assert_eq!(&sealed[..4], b"STGR");
        assert_eq!(sealed[4], 1);
        assert_eq!(open_bundle(&key, BINDING, &sealed).unwrap(), bundle());
    }

    #[test]
    fn every_seal_uses_a_fresh_nonce() {
        let key = CertKey::generate();
        let a = seal_bundle(&key, BINDING, &bundle()).unwrap();
        let b = seal_bundle(&key, BINDING, &bundle()).unwrap();
        assert_ne!(a[5..HEADER_LEN], b[5..HEADER_LEN]);
        assert_ne!(a, b);
    }

    #[test]
    fn wrong_key_fails_authentication() {
        let sealed = seal_bundle(&CertKey::generate(), BINDING, &bundle()).unwrap();
        assert_eq!(
            open_bundle(&CertKey::generate(), BINDING, &sealed),
            Err(EnvelopeError::Authentication)
        );
    }

    #[test]
    fn any_flipped_byte_fails() {
        let key = CertKey::generate();
        let sealed = seal_bundle(&key, BINDING, &bundle()).unwrap();
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x01;
            let err = open_bundle(&key, BINDING, &bad).unwrap_err();
            match i {
                0..4 => assert_eq!(err, EnvelopeError::BadMagic, "byte {i}"),
                4 => assert!(
                    matches!(err, EnvelopeError::UnknownVersion { found: 0, .. }),
                    "byte {i}: {err:?}"
                ),
                _ => assert_eq!(err, EnvelopeError::Authentication, "byte {i}"),
            }
        }
    }

    #[test]
    fn moved_entries_fail() {
        let key = CertKey::generate();
        let sealed = seal_bundle(&key, BINDING, &bundle()).unwrap();
        for other in [
            EntryBinding {
                entry: "certs-zzzzzz",
                ..BINDING
            },
            EntryBinding {
                token_id: "zzzzzz",
                ..BINDING
            },
            EntryBinding {
                secret: "kube-system/other",
                ..BINDING
            },
            // Length prefixes: moving a character between fields changes the AAD.
            EntryBinding {
                secret: "kube-system/stratum-certsc",
                entry: "erts-abcdef",
                token_id: "abcdef",
            },
        ] {
            assert_eq!(
                open_bundle(&key, other, &sealed),
                Err(EnvelopeError::Authentication),
                "{other:?}"
            );
        }
    }

    #[test]
    fn truncation_and_garbage_are_clear_errors() {
        let key = CertKey::generate();
        let sealed = seal_bundle(&key, BINDING, &bundle()).unwrap();
        for len in 0..sealed.len() {
            let err = open_bundle(&key, BINDING, &sealed[..len]).unwrap_err();
            assert!(
                matches!(
                    err,
                    EnvelopeError::Truncated { .. } | EnvelopeError::Authentication
                ),
                "len {len}: {err:?}"
            );
            if len < HEADER_LEN + TAG_LEN {
                assert!(matches!(err, EnvelopeError::Truncated { .. }), "len {len}");
            }
        }
        assert_eq!(
            open_bundle(&key, BINDING, b"hello world, not an envelope"),
            Err(EnvelopeError::BadMagic)
        );
    }

    #[test]
    fn unknown_version_is_named() {
        let key = CertKey::generate();
        let mut sealed = seal_bundle(&key, BINDING, &bundle()).unwrap();
        sealed[4] = 9;
        let err = open_bundle(&key, BINDING, &sealed).unwrap_err();
        assert_eq!(
            err,
            EnvelopeError::UnknownVersion {
                found: 9,
                supported: 1
            }
        );
        assert!(err.to_string().contains("version 9"));
    }

    #[test]
    fn decode_rejects_every_truncation_and_trailing_bytes() {
        let plain = encode_bundle(&bundle()).unwrap();
        assert_eq!(decode_bundle(&plain).unwrap(), bundle());
        for len in 0..plain.len() {
            assert!(
                matches!(
                    decode_bundle(&plain[..len]),
                    Err(EnvelopeError::Malformed(_))
                ),
                "len {len}"
            );
        }
        let mut long = plain.clone();
        long.push(0);
        assert!(matches!(
            decode_bundle(&long),
            Err(EnvelopeError::Malformed(m)) if m.contains("trailing")
        ));
    }

    #[test]
    fn decode_rejects_duplicate_paths_and_unknown_flags() {
        let mut plain = encode_bundle(&Bundle {
            files: BTreeMap::from([("a".into(), b"x".to_vec())]),
            ..Bundle::default()
        })
        .unwrap();
        // Bump the file count to 2 and repeat the single file record.
        let files_at = 8 + 1 + 2 + 2;
        plain[files_at..files_at + 4].copy_from_slice(&2u32.to_be_bytes());
        let record = plain[files_at + 4..].to_vec();
        plain.extend_from_slice(&record);
        assert!(matches!(
            decode_bundle(&plain),
            Err(EnvelopeError::Malformed(m)) if m.contains("ascending")
        ));

        let mut plain = encode_bundle(&Bundle::default()).unwrap();
        plain[8] = 0x80;
        assert!(matches!(
            decode_bundle(&plain),
            Err(EnvelopeError::Malformed(m)) if m.contains("flag")
        ));
    }

    #[test]
    fn decode_survives_pseudo_random_input() {
        // A cheap stand-in for the fuzz target: arbitrary bytes never panic.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..2000 {
            let len = round % 97;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            let _ = decode_bundle(&bytes);
            let _ = open_legacy(&CertKey::from_bytes([1; 32]), &bytes);
            let _ = open_bundle(&CertKey::from_bytes([1; 32]), BINDING, &bytes);
        }
    }

    #[test]
    fn legacy_map_round_trips_and_rejects_damage() {
        let key = CertKey::generate();
        let files = bundle().files;
        let sealed = seal_legacy(&key, &files);
        assert_eq!(open_legacy(&key, &sealed).unwrap(), files);
        assert_eq!(
            open_legacy(&CertKey::generate(), &sealed),
            Err(EnvelopeError::Authentication)
        );
        let mut bad = sealed.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(open_legacy(&key, &bad), Err(EnvelopeError::Authentication));
        assert!(matches!(
            open_legacy(&key, &sealed[..20]),
            Err(EnvelopeError::Truncated { .. })
        ));
    }

    #[test]
    fn legacy_plaintext_is_a_json_map_of_base64() {
        // The shape older joiners decode: Go's json for map[string][]byte.
        let key = CertKey::from_bytes([7; 32]);
        let files = BTreeMap::from([("ca.crt".to_string(), b"abc".to_vec())]);
        let sealed = seal_legacy(&key, &files);
        let plain = key
            .cipher()
            .decrypt(Nonce::from_slice(&sealed[..12]), &sealed[12..])
            .unwrap();
        assert_eq!(plain, br#"{"ca.crt":"YWJj"}"#);
    }

    #[test]
    fn key_proof_opens_only_under_the_same_config() {
        let binding = EntryBinding {
            secret: "kube-system/stratum-certs",
            entry: "key-proof",
            token_id: "",
        };
        let proof = seal_key_proof(b"config A", binding, 3);
        assert!(key_proof_opens(b"config A", binding, &proof, 3));
        assert!(!key_proof_opens(b"config B", binding, &proof, 3));
        assert!(!key_proof_opens(b"config A", BINDING, &proof, 3));
        assert!(!key_proof_opens(b"config A", binding, b"junk", 3));
        // Bound to its publication: another generation's Secret cannot reuse it.
        assert!(!key_proof_opens(b"config A", binding, &proof, 4));
        assert!(!key_proof_opens(b"config A", binding, &proof, 2));
    }

    #[test]
    fn cert_key_parses_and_redacts() {
        let key = CertKey::generate();
        assert!(CertKey::from_hex(&key.to_hex()).unwrap().same_key(&key));
        assert!(
            CertKey::from_hex(&format!(" {} \n", key.to_hex()))
                .unwrap()
                .same_key(&key)
        );
        assert_eq!(
            CertKey::from_hex("abc").err(),
            Some(CertKeyError::Length { len: 3 })
        );
        assert_eq!(
            CertKey::from_hex(&"g".repeat(64)).err(),
            Some(CertKeyError::NotHex)
        );
        assert_eq!(format!("{key:?}"), "CertKey(<redacted>)");
        assert!(!CertKey::generate().same_key(&CertKey::generate()));
    }

    #[test]
    fn bundle_debug_names_files_but_prints_no_key() {
        let mut b = bundle();
        b.files.insert(
            "sa.key".into(),
            b"-----BEGIN PRIVATE KEY-----SECRETBYTES".to_vec(),
        );
        let text = format!("{b:?}");
        assert!(
            text.contains("sa.key") && text.contains("bytes redacted"),
            "{text}"
        );
        assert!(
            !text.contains("SECRETBYTES") && !text.contains("BEGIN"),
            "{text}"
        );
        assert!(text.contains("10.0.0.10"), "{text}");
    }
}
