//! PATCH bodies are client input. Input: a kind byte, the target JSON, a NUL, the patch
//! body. Invariants: applying never panics; a JSON merge patch is idempotent (RFC 7386);
//! a strategic merge patch without lists or `$` directives means exactly what the same
//! body means as a JSON merge patch; an empty JSON patch changes nothing.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use testkube::patch::{PatchKind, apply};

fn plain_maps(v: &Value) -> bool {
    match v {
        Value::Array(_) => false,
        Value::Object(m) => m.iter().all(|(k, v)| !k.starts_with('$') && plain_maps(v)),
        _ => true,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let (target, body) = match rest.iter().position(|b| *b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (&b"{}"[..], rest),
    };
    let Ok(target) = serde_json::from_slice::<Value>(target) else {
        return;
    };
    match kind % 3 {
        0 => {
            if let Ok(once) = apply(PatchKind::Merge, &target, body) {
                let twice = apply(PatchKind::Merge, &once, body).expect("the patch parsed once");
                assert_eq!(once, twice, "merge patch is not idempotent");
            }
        }
        1 => {
            let strategic = apply(PatchKind::Strategic, &target, body);
            if let Ok(patch) = serde_json::from_slice::<Value>(body)
                && patch.is_object()
                && plain_maps(&patch)
            {
                let merge = apply(PatchKind::Merge, &target, body);
                assert_eq!(
                    strategic, merge,
                    "strategic and merge patch differ on plain maps"
                );
            }
        }
        _ => {
            let _ = apply(PatchKind::Json, &target, body);
            assert_eq!(apply(PatchKind::Json, &target, b"[]"), Ok(target.clone()));
        }
    }
});
