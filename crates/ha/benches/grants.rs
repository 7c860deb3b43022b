//! `cargo xtask bench grants`: seal and open a full shared-cert bundle, against a baseline
//! measured in the same run (the same bytes copied, and serialized and parsed without any
//! cryptography), printed as ratios.
//!
//! Two bundles: the real shared set `pki::generate_shared` writes plus an encryption
//! config, and a 64 KiB one standing in for a mid-rotation set (staged CAs, trust bundles)
//! with RSA-sized keys.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use ha::grants::envelope::{self, Bundle, CertKey, EntryBinding};

const BINDING: EntryBinding<'static> = EntryBinding {
    secret: "kube-system/stratum-certs",
    entry: "certs-abcdef",
    token_id: "abcdef",
};

/// Runs `f` repeatedly for about `budget` and returns the mean time per call.
fn measure(budget: Duration, mut f: impl FnMut()) -> Duration {
    // Warm up caches and the allocator.
    for _ in 0..50 {
        f();
    }
    let mut iterations = 0u64;
    let start = Instant::now();
    while start.elapsed() < budget {
        for _ in 0..32 {
            f();
        }
        iterations += 32;
    }
    start.elapsed() / u32::try_from(iterations).unwrap_or(u32::MAX)
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn real_bundle() -> Bundle {
    let dir = tempfile::tempdir().expect("tempdir");
    pki::generate_shared(dir.path(), false).expect("generate the shared PKI");
    std::fs::write(
        dir.path().join(ha::grants::ENCRYPTION_CONFIG_FILE),
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- \
         resources: [secrets]\n  providers:\n  - aescbc:\n      keys:\n      - name: key1\n        \
         secret: 9GZm0v7r3fJ2YqXl1cW8bN4tKs6uPeHdAaIoQzVxTgE=\n  - identity: {}\n",
    )
    .expect("write the encryption config");
    let files = ha::grants::read_bundle_files(dir.path()).expect("read the bundle");
    Bundle {
        files,
        generation: 12,
        carries_encryption_key: true,
        vip: Some("10.0.0.100".into()),
        etcd_endpoints: vec![
            "https://10.0.0.1:2379".into(),
            "https://10.0.0.2:2379".into(),
            "https://10.0.0.3:2379".into(),
        ],
    }
}

fn rotation_bundle(real: &Bundle) -> Bundle {
    let mut files: BTreeMap<String, Vec<u8>> = real.files.clone();
    // Staged CAs and trust bundles: RSA-sized PEMs until the set is about 64 KiB.
    let mut i = 0;
    while files.values().map(Vec::len).sum::<usize>() < 64 * 1024 {
        files.insert(format!("staged/ca-{i}.crt"), vec![b'M'; 1200]);
        files.insert(format!("staged/ca-{i}.key"), vec![b'K'; 1700]);
        i += 1;
    }
    Bundle {
        files,
        ..real.clone()
    }
}

fn run(name: &str, bundle: &Bundle) {
    let budget = Duration::from_millis(700);
    let key = CertKey::generate();
    let bytes: usize = bundle.files.values().map(Vec::len).sum();
    let sealed = envelope::seal_bundle(&key, BINDING, bundle).expect("seal");
    let legacy = envelope::seal_legacy(&key, &bundle.files);

    let copy = measure(budget, || {
        black_box(black_box(bundle).files.clone());
    });
    let plain = measure(budget, || {
        let encoded = envelope::encode_bundle(black_box(bundle)).expect("encode");
        black_box(envelope::decode_bundle(&encoded).expect("decode"));
    });
    let seal = measure(budget, || {
        black_box(envelope::seal_bundle(&key, BINDING, black_box(bundle)).expect("seal"));
    });
    let open = measure(budget, || {
        black_box(envelope::open_bundle(&key, BINDING, black_box(&sealed)).expect("open"));
    });
    let legacy_seal = measure(budget, || {
        black_box(envelope::seal_legacy(&key, black_box(&bundle.files)));
    });
    let legacy_open = measure(budget, || {
        black_box(envelope::open_legacy(&key, black_box(&legacy)).expect("open legacy"));
    });

    println!(
        "\n{name}: {} files, {bytes} bytes of files, sealed entry {} bytes, legacy entry {} bytes",
        bundle.files.len(),
        sealed.len(),
        legacy.len()
    );
    println!(
        "  {:<34} {:>10} {:>10} {:>12}",
        "operation", "µs/op", "MiB/s", "× baseline"
    );
    let row = |what: &str, d: Duration, baseline: Duration| {
        let mib_s = bytes as f64 / d.as_secs_f64() / (1024.0 * 1024.0);
        println!(
            "  {:<34} {:>10.2} {:>10.0} {:>12.2}",
            what,
            micros(d),
            mib_s,
            d.as_secs_f64() / baseline.as_secs_f64()
        );
    };
    row("baseline: copy the file map", copy, copy);
    row("baseline: encode + decode, no AEAD", plain, copy);
    row("seal (encode + AES-256-GCM)", seal, plain);
    row("open (AES-256-GCM + decode)", open, plain);
    row("seal + open", seal + open, plain);
    row("legacy seal (JSON+base64+GCM)", legacy_seal, plain);
    row("legacy open", legacy_open, plain);
    println!("  (the seal/open ratios are against the encode + decode baseline)");
}

fn main() {
    // `cargo bench` passes --bench; nothing to parse.
    let real = real_bundle();
    run("real shared set (ECDSA P-256) + encryption config", &real);
    run("64 KiB rotation-sized set", &rotation_bundle(&real));
}
