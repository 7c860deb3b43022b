//! Component tests of the pki crate: files on disk in a tempdir, checked with x509-parser
//! signature verification, the openssl CLI and kubectl.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use pki::{NodeIdentity, PkiError};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::*;

fn der(path: &Path) -> Vec<u8> {
    let pem = std::fs::read(path).unwrap();
    let (_, block) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
    block.contents
}

fn node() -> NodeIdentity {
    let mut id = NodeIdentity::new("cp-1");
    id.node_ip = Some("10.1.0.5".parse().unwrap());
    id.vip = Some("10.1.0.100".parse().unwrap());
    id
}

fn generated() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    pki::generate_shared(dir.path(), false).unwrap();
    pki::issue_node_leaves(dir.path(), &node(), false).unwrap();
    dir
}

fn tool(name: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(found, "{name} not found on PATH: apt-get install {package}");
}

#[test]
fn every_leaf_verifies_against_its_ca_with_the_right_usages() {
    let dir = generated();
    let d = dir.path();
    for (leaf, ca) in [
        ("apiserver", "ca"),
        ("apiserver-kubelet-client", "ca"),
        ("front-proxy-client", "front-proxy-ca"),
        ("etcd/server", "etcd/ca"),
        ("etcd/peer", "etcd/ca"),
        ("etcd/healthcheck-client", "etcd/ca"),
        ("apiserver-etcd-client", "etcd/ca"),
    ] {
        let ca_der = der(&d.join(format!("{ca}.crt")));
        let (_, ca_cert) = parse_x509_certificate(&ca_der).unwrap();
        assert!(ca_cert.is_ca());
        ca_cert.verify_signature(None).expect("CA is self-signed");
        let leaf_der = der(&d.join(format!("{leaf}.crt")));
        let (_, cert) = parse_x509_certificate(&leaf_der).unwrap();
        cert.verify_signature(Some(ca_cert.public_key()))
            .unwrap_or_else(|e| panic!("{leaf} does not verify against {ca}: {e}"));
        assert_eq!(cert.issuer(), ca_cert.subject(), "{leaf}");
        assert!(!cert.is_ca(), "{leaf} must not be a CA");
        // ...and not against another CA.
        let other = if ca == "ca" { "etcd/ca" } else { "ca" };
        let other_der = der(&d.join(format!("{other}.crt")));
        let (_, other_cert) = parse_x509_certificate(&other_der).unwrap();
        assert!(
            cert.verify_signature(Some(other_cert.public_key()))
                .is_err()
        );

        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        match leaf {
            "apiserver" => assert!(eku.server_auth && !eku.client_auth),
            "etcd/server" | "etcd/peer" => assert!(eku.server_auth && eku.client_auth, "{leaf}"),
            _ => assert!(eku.client_auth && !eku.server_auth, "{leaf}"),
        }
    }

    let api_der = der(&d.join("apiserver.crt"));
    let (_, api) = parse_x509_certificate(&api_der).unwrap();
    let sans = &api
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names;
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    for n in sans {
        match n {
            GeneralName::DNSName(d) => dns.push(d.to_string()),
            GeneralName::IPAddress(b) => ips.push(b.to_vec()),
            _ => {}
        }
    }
    for want in ["kubernetes.default.svc.cluster.local", "cp-1", "localhost"] {
        assert!(
            dns.iter().any(|d| d == want),
            "apiserver SANs lack {want}: {dns:?}"
        );
    }
    for want in [
        [10, 1, 0, 100],
        [10, 43, 0, 1],
        [127, 0, 0, 1],
        [10, 1, 0, 5],
    ] {
        assert!(ips.contains(&want.to_vec()), "apiserver SANs lack {want:?}");
    }

    let kc_der = der(&d.join("apiserver-kubelet-client.crt"));
    let (_, kc) = parse_x509_certificate(&kc_der).unwrap();
    let orgs: Vec<_> = kc
        .subject()
        .iter_organization()
        .map(|o| o.as_str().unwrap().to_string())
        .collect();
    assert_eq!(orgs, vec!["system:masters"]);

    // sa.pub is the public half of sa.key.
    let sa_pub = std::fs::read_to_string(d.join("sa.pub")).unwrap();
    assert!(sa_pub.starts_with("-----BEGIN PUBLIC KEY-----"), "{sa_pub}");
    let sa_key =
        rcgen::KeyPair::from_pem(&std::fs::read_to_string(d.join("sa.key")).unwrap()).unwrap();
    assert_eq!(sa_key.public_key_pem(), sa_pub);
}

#[test]
fn modes_are_0600_for_keys_and_0644_for_certs_with_no_temp_files_left() {
    let dir = generated();
    let mut seen = 0;
    let mut stack = vec![dir.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            assert!(
                !name.starts_with('.'),
                "temp file left behind: {}",
                p.display()
            );
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            let want = if name.ends_with(".key") { 0o600 } else { 0o644 };
            assert_eq!(mode, want, "{}", p.display());
            seen += 1;
        }
    }
    assert_eq!(seen, pki::SHARED_FILES.len() + pki::node_leaf_files().len());
}

#[test]
fn existing_keys_are_refused_unless_overwrite_is_asked() {
    let dir = generated();
    let d = dir.path();
    let before = pki::read_shared(d).unwrap();

    let err = pki::generate_shared(d, false).unwrap_err();
    assert!(
        matches!(&err, PkiError::KeyExists { path } if path == &d.join("ca.key")),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("ca.key") && text.contains("--force"),
        "{text}"
    );
    assert_eq!(pki::read_shared(d).unwrap(), before, "nothing written");

    let err = pki::issue_node_leaves(d, &node(), false).unwrap_err();
    assert!(matches!(err, PkiError::KeyExists { .. }), "{err}");

    pki::generate_shared(d, true).unwrap();
    let after = pki::read_shared(d).unwrap();
    assert_ne!(after, before, "overwrite replaced the material");
    assert_eq!(after.len(), pki::SHARED_FILES.len());

    // Leaves issued before the new CA no longer verify; re-issuing fixes that.
    pki::issue_node_leaves(d, &node(), true).unwrap();
    let ca_der = der(&d.join("ca.crt"));
    let (_, ca) = parse_x509_certificate(&ca_der).unwrap();
    let leaf_der = der(&d.join("apiserver.crt"));
    let (_, leaf) = parse_x509_certificate(&leaf_der).unwrap();
    leaf.verify_signature(Some(ca.public_key())).unwrap();
}

#[test]
fn a_ca_with_the_wrong_key_is_refused() {
    let dir = generated();
    let d = dir.path();
    std::fs::copy(d.join("front-proxy-ca.key"), d.join("ca.key")).unwrap();
    let err = pki::Ca::load(d, "ca").unwrap_err();
    assert!(err.to_string().contains("does not match"), "{err}");
    let missing = pki::Ca::load(&d.join("nowhere"), "ca").unwrap_err();
    assert!(matches!(missing, PkiError::Missing { .. }), "{missing}");
}

#[test]
fn ca_cert_hash_matches_openssl() {
    tool("openssl", "openssl");
    let dir = generated();
    let ca = dir.path().join("ca.crt");
    let ours = pki::ca_cert_hash(&std::fs::read(&ca).unwrap()).unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl x509 -in '{}' -pubkey -noout | openssl pkey -pubin -outform der | sha256sum",
            ca.display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs = String::from_utf8(out.stdout).unwrap();
    let theirs = theirs.split_whitespace().next().unwrap();
    assert_eq!(ours, format!("sha256:{theirs}"));
    assert_eq!(ours.len(), "sha256:".len() + 64);
}

#[test]
fn check_reports_expiry_against_the_threshold() {
    let dir = generated();
    let d = dir.path();
    let now = SystemTime::now();
    let month = Duration::from_secs(30 * 24 * 3600);

    let report = pki::check(d, now).unwrap();
    assert_eq!(report.certs.len(), 10, "three CAs and seven leaves");
    assert!(
        report.attention(month).is_empty(),
        "{:?}",
        report.attention(month)
    );

    // 340 days on: every leaf (a year) has under 30 days left; CAs (ten years) do not.
    let later = now + Duration::from_secs(340 * 24 * 3600);
    let report = pki::check(d, later).unwrap();
    let flagged: Vec<String> = report
        .attention(month)
        .iter()
        .map(|c| c.path.strip_prefix(d).unwrap().display().to_string())
        .collect();
    assert_eq!(flagged.len(), 7, "{flagged:?}");
    assert!(
        flagged.iter().all(|p| !p.ends_with("ca.crt")),
        "{flagged:?}"
    );
    assert!(report.attention(Duration::from_secs(3600)).is_empty());

    // A certificate that cannot be read is flagged at any threshold, not skipped.
    std::fs::write(d.join("broken.crt"), "garbage").unwrap();
    let report = pki::check(d, now).unwrap();
    let bad = report.attention(Duration::ZERO);
    assert_eq!(bad.len(), 1);
    assert!(bad[0].path.ends_with("broken.crt") && bad[0].error.is_some());

    assert!(matches!(
        pki::check(&d.join("absent"), now),
        Err(PkiError::Missing { .. })
    ));
}

#[test]
fn kubeconfigs_embed_verifiable_credentials_that_kubectl_reads() {
    tool("kubectl", "kubectl (on the machine image)");
    let dir = generated();
    let out = tempfile::tempdir().unwrap();
    let written =
        pki::write_kubeconfigs(dir.path(), out.path(), "https://10.1.0.100:6443", false).unwrap();
    assert_eq!(written.len(), 4);
    for (file, user, groups) in pki::KUBECONFIG_FILES {
        let path = out.path().join(file);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{file} embeds a key");
        let o = Command::new("kubectl")
            .args(["config", "view", "--raw", "--kubeconfig"])
            .arg(&path)
            .args([
                "-o",
                "jsonpath={.clusters[0].cluster.server} {.users[0].name} {.users[0].user.client-certificate-data}",
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let text = String::from_utf8(o.stdout).unwrap();
        let parts: Vec<&str> = text.split(' ').collect();
        assert_eq!(parts[0], "https://10.1.0.100:6443");
        assert_eq!(parts[1], *user);
        use base64::Engine;
        let pem = base64::engine::general_purpose::STANDARD
            .decode(parts[2])
            .unwrap();
        let (_, block) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
        let (_, cert) = parse_x509_certificate(&block.contents).unwrap();
        let cn = cert.subject().iter_common_name().next().unwrap();
        assert_eq!(cn.as_str().unwrap(), *user);
        let orgs: Vec<&str> = cert
            .subject()
            .iter_organization()
            .map(|o| o.as_str().unwrap())
            .collect();
        assert_eq!(orgs, *groups, "{file}");
        let ca_der = der(&dir.path().join("ca.crt"));
        let (_, ca) = parse_x509_certificate(&ca_der).unwrap();
        cert.verify_signature(Some(ca.public_key())).unwrap();
    }
    let err = pki::write_kubeconfigs(dir.path(), out.path(), "https://10.1.0.100:6443", false)
        .unwrap_err();
    assert!(err.to_string().contains("admin.conf"), "{err}");
}

/// admin.conf is not in system:masters (a group RBAC can revoke), and the break-glass
/// super-admin.conf is.
#[test]
fn admin_conf_is_a_revocable_cluster_admin_and_super_admin_is_break_glass() {
    let dir = generated();
    let out = tempfile::tempdir().unwrap();
    pki::write_kubeconfigs(dir.path(), out.path(), "https://10.1.0.100:6443", false).unwrap();
    let orgs_of = |file: &str| -> Vec<String> {
        let text = std::fs::read_to_string(out.path().join(file)).unwrap();
        let b64 = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("client-certificate-data: "))
            .unwrap();
        use base64::Engine;
        let pem = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .unwrap();
        let (_, block) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
        let (_, cert) = parse_x509_certificate(&block.contents).unwrap();
        cert.subject()
            .iter_organization()
            .map(|o| o.as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(orgs_of("admin.conf"), vec![pki::CLUSTER_ADMINS_GROUP]);
    assert_eq!(orgs_of(pki::SUPER_ADMIN_KUBECONFIG), vec!["system:masters"]);
}

/// Serials are random (not a hash of the public key, which repeats for a re-issued key)
/// and at least 128 bits; ECDSA certificates carry no keyEncipherment; CAs are pathlen:0.
#[test]
fn serials_are_random_usages_fit_ecdsa_and_cas_are_pathlen_0() {
    use sha2::Digest;
    let dir = generated();
    let d = dir.path();
    let mut serials = std::collections::BTreeSet::new();
    for file in [
        "ca.crt",
        "front-proxy-ca.crt",
        "etcd/ca.crt",
        "apiserver.crt",
        "apiserver-kubelet-client.crt",
        "front-proxy-client.crt",
        "etcd/server.crt",
        "etcd/peer.crt",
    ] {
        let der = der(&d.join(file));
        let (_, cert) = parse_x509_certificate(&der).unwrap();
        let serial = cert.raw_serial();
        let significant = serial.iter().skip_while(|b| **b == 0).count();
        assert!(significant >= 16, "{file}: serial of {significant} bytes");
        // rcgen's default serial: SHA-256 of the public key, 20 bytes, top bit cleared.
        let trimmed: Vec<u8> = serial.iter().copied().skip_while(|b| *b == 0).collect();
        for key_bytes in [
            cert.public_key().raw,
            &cert.public_key().subject_public_key.data[..],
        ] {
            let mut derived = sha2::Sha256::digest(key_bytes)[..20].to_vec();
            derived[0] &= 0x7f;
            let derived: Vec<u8> = derived.into_iter().skip_while(|b| *b == 0).collect();
            assert_ne!(trimmed, derived, "{file}: serial derived from the key");
        }
        assert!(serials.insert(serial.to_vec()), "{file}: serial repeated");
        let ku = cert.key_usage().unwrap().unwrap().value;
        assert!(
            !ku.key_encipherment(),
            "{file}: keyEncipherment on an ECDSA key"
        );
        assert!(ku.digital_signature(), "{file}");
        if cert.is_ca() {
            let bc = cert.basic_constraints().unwrap().unwrap().value;
            assert_eq!(bc.path_len_constraint, Some(0), "{file}");
            assert!(ku.key_cert_sign(), "{file}");
        }
    }
}

/// A leaf asked to live longer than its CA ends when the CA does.
#[test]
fn leaves_never_outlive_their_ca() {
    let ca = pki::Ca::generate("short-ca").unwrap();
    let mut spec = pki::LeafSpec::new("long-leaf", &[pki::Usage::ClientAuth]);
    spec.validity = Duration::from_secs(20 * 365 * 24 * 3600);
    let leaf = ca.issue(&spec).unwrap();
    let (_, block) = x509_parser::pem::parse_x509_pem(leaf.cert_pem.as_bytes()).unwrap();
    let (_, cert) = parse_x509_certificate(&block.contents).unwrap();
    let (_, ca_block) = x509_parser::pem::parse_x509_pem(ca.cert_pem().as_bytes()).unwrap();
    let (_, ca_cert) = parse_x509_certificate(&ca_block.contents).unwrap();
    assert!(
        cert.validity().not_after <= ca_cert.validity().not_after,
        "leaf ends {} after its CA {}",
        cert.validity().not_after,
        ca_cert.validity().not_after
    );
}

/// Every file below `dir`, relative, sorted, with its bytes.
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(base: &Path, d: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                let rel = p.strip_prefix(base).unwrap().display().to_string();
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// `plan_pki` refuses the whole PKI when any one key it would replace exists, before
/// anything is written; `leaves_only` keeps the shared CAs; `overwrite` replaces.
#[test]
fn the_pki_plan_is_all_or_nothing() {
    let root = tempfile::tempdir().unwrap();
    let mut req = pki::PkiRequest::new(root.path().join("pki"), node());
    assert_eq!(req.kubeconfig_dir, root.path());
    assert_eq!(req.server, "https://10.1.0.100:6443", "the VIP first");

    // Only a stale kubeconfig exists: the plan is refused and no CA appears.
    std::fs::write(root.path().join("scheduler.conf"), "stale").unwrap();
    let err = pki::plan_pki(&req).unwrap_err();
    assert!(
        matches!(&err, PkiError::WouldOverwrite { path, shared: true } if path.ends_with("scheduler.conf")),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("--force") && text.contains("--leaves-only"),
        "{text}"
    );
    assert_eq!(tree(root.path()).len(), 1, "nothing was written");
    std::fs::remove_file(root.path().join("scheduler.conf")).unwrap();

    let plan = pki::plan_pki(&req).unwrap();
    assert!(
        !format!("{plan:?}").contains("PRIVATE KEY"),
        "no key in Debug"
    );
    let pin = plan.ca_cert_hash().unwrap();
    let written = plan.apply().unwrap();
    assert_eq!(
        written.len(),
        pki::SHARED_FILES.len() + pki::node_leaf_files().len() + pki::KUBECONFIG_FILES.len()
    );
    let ca_pem = std::fs::read(root.path().join("pki/ca.crt")).unwrap();
    assert_eq!(pki::ca_cert_hash(&ca_pem).unwrap(), pin);
    // The leaves are issued by the CAs written beside them.
    let ca_der = der(&root.path().join("pki/ca.crt"));
    let leaf_der = der(&root.path().join("pki/apiserver.crt"));
    let (_, ca) = parse_x509_certificate(&ca_der).unwrap();
    let (_, leaf) = parse_x509_certificate(&leaf_der).unwrap();
    leaf.verify_signature(Some(ca.public_key())).unwrap();
    let admin: pki::Kubeconfig =
        serde_yaml::from_str(&std::fs::read_to_string(root.path().join("admin.conf")).unwrap())
            .unwrap();
    assert_eq!(admin.clusters[0].cluster.server, "https://10.1.0.100:6443");

    // A second run refuses and changes nothing; leaves-only names a leaf key, not the CA.
    let before = tree(root.path());
    let err = pki::plan_pki(&req).unwrap_err();
    assert!(
        matches!(&err, PkiError::WouldOverwrite { path, .. } if path.ends_with("pki/ca.key")),
        "{err}"
    );
    req.leaves_only = true;
    let err = pki::plan_pki(&req).unwrap_err();
    assert!(
        matches!(&err, PkiError::WouldOverwrite { shared: false, .. })
            && !err.to_string().contains("--leaves-only"),
        "{err}"
    );
    assert_eq!(tree(root.path()), before);

    // Leaves only, overwriting: the shared CA stays, the leaves are new.
    req.overwrite = true;
    pki::plan_pki(&req).unwrap().apply().unwrap();
    let after = tree(root.path());
    let get = |t: &[(String, Vec<u8>)], f: &str| t.iter().find(|(p, _)| p == f).unwrap().1.clone();
    assert_eq!(get(&after, "pki/ca.key"), get(&before, "pki/ca.key"));
    assert_ne!(
        get(&after, "pki/apiserver.key"),
        get(&before, "pki/apiserver.key")
    );

    // Leaves only without the CAs is a clear error, and writes nothing.
    let empty = tempfile::tempdir().unwrap();
    let mut req = pki::PkiRequest::new(empty.path().join("pki"), node());
    req.leaves_only = true;
    let err = pki::plan_pki(&req).unwrap_err();
    assert!(err.to_string().contains("ca.crt"), "{err}");
    assert!(tree(empty.path()).is_empty());
}
