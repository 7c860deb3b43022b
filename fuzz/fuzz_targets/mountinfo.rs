//! /proc/self/mountinfo text (or a mount table file given on the command line) is parsed
//! and then planned into an unmount order: a wrong plan detaches mounts outside the
//! prefixes a reset was asked to clean. Input: a scope byte, prefix lines, a NUL, then the
//! mount table. Invariants: parsing never panics; every planned mount is in the table, in
//! deepest-first order; and for kernel-normal mount points the plan's fast byte test
//! agrees with the path-component definition (`is_at_or_below`).

#![no_main]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use hostnode::mountinfo::{Scope, is_at_or_below, parse, plan};
use libfuzzer_sys::fuzz_target;

fn depth(p: &Path) -> usize {
    p.as_os_str()
        .as_bytes()
        .iter()
        .filter(|b| **b == b'/')
        .count()
}

fuzz_target!(|data: &[u8]| {
    let Some((&scope, rest)) = data.split_first() else {
        return;
    };
    let scope = if scope % 2 == 0 {
        Scope::AtOrBelow
    } else {
        Scope::StrictlyBelow
    };
    let (prefix_text, table_text) = match rest.iter().position(|b| *b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (&b""[..], rest),
    };
    let Ok(table) = parse(table_text, Path::new("fuzz")) else {
        return;
    };
    for entry in &table {
        assert!(entry.mount_point.as_os_str().as_bytes().starts_with(b"/"));
    }
    // Only absolute prefixes: that is what callers pass.
    let prefixes: Vec<PathBuf> = prefix_text
        .split(|b| *b == b'\n')
        .filter(|p| p.starts_with(b"/"))
        .map(|p| PathBuf::from(OsStr::from_bytes(p)))
        .collect();
    let planned = plan(&table, &prefixes, scope);

    assert!(planned.len() <= table.len());
    for pair in planned.windows(2) {
        assert!(
            depth(&pair[0].mount_point) >= depth(&pair[1].mount_point),
            "plan is not deepest first: {:?} before {:?}",
            pair[0].mount_point,
            pair[1].mount_point
        );
    }
    for p in &planned {
        assert!(table.iter().any(|e| e.mount_point == p.mount_point));
        assert!(!p.prefixes.is_empty());
        assert!(p.prefixes.iter().all(|i| *i < prefixes.len()));
    }

    // The reference: by whole path components, for mount points the kernel could print
    // (no "." components, doubled or trailing slashes).
    // Bytes, not `Path` equality: `Path` compares by components, so "//" == "/".
    let normal = |p: &Path| p.components().collect::<PathBuf>().as_os_str() == p.as_os_str();
    let mut expected: Vec<(PathBuf, Vec<usize>)> = table
        .iter()
        .filter(|e| normal(&e.mount_point))
        .filter_map(|e| {
            let matching: Vec<usize> = prefixes
                .iter()
                .enumerate()
                .filter(|(_, prefix)| {
                    let at = e.mount_point == prefix.components().collect::<PathBuf>();
                    is_at_or_below(&e.mount_point, prefix) && !(scope == Scope::StrictlyBelow && at)
                })
                .map(|(i, _)| i)
                .collect();
            (!matching.is_empty()).then(|| (e.mount_point.clone(), matching))
        })
        .collect();
    let mut got: Vec<(PathBuf, Vec<usize>)> = planned
        .into_iter()
        .filter(|p| normal(&p.mount_point))
        .map(|p| (p.mount_point, p.prefixes))
        .collect();
    expected.sort();
    got.sort();
    assert_eq!(got, expected, "plan disagrees with is_at_or_below");
});
