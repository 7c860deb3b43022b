//! The mount table (`/proc/self/mountinfo`, see proc(5)) and the pure planning of which
//! mounts to take down, in which order.
//!
//! A line reads
//! `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`:
//! mount id, parent id, major:minor, root within the filesystem, mount point, mount
//! options, optional fields ended by `-`, filesystem type, source, super options. The
//! kernel escapes space, tab, newline and backslash in paths as `\040`, `\011`, `\012`,
//! `\134`.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// One mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// Mount id.
    pub id: u32,
    /// Parent mount id.
    pub parent: u32,
    /// `major:minor` of the filesystem.
    pub dev: String,
    /// The directory of the filesystem that is mounted (a bind mount's source).
    pub root: PathBuf,
    /// Where it is mounted, decoded.
    pub mount_point: PathBuf,
    /// Filesystem type (`tmpfs`, `ext4`, ...).
    pub fs_type: String,
    /// Mount source (`tmpfs`, `/dev/sda1`, ...), decoded.
    pub source: String,
}

/// The mount table could not be read or understood.
#[derive(Debug, thiserror::Error)]
pub enum MountInfoError {
    /// The file could not be read.
    #[error("cannot read the mount table {}", path.display())]
    Read {
        /// The mount table file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line does not have the mountinfo shape.
    #[error("mount table {}, line {line}: {reason}: {text:?}", path.display())]
    Malformed {
        /// The mount table file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: &'static str,
        /// The line as read (cut to 200 bytes).
        text: String,
    },
}

/// Reads and parses a mount table file; `None` is [`crate::PROC_MOUNTINFO`].
pub fn read(path: Option<&Path>) -> Result<Vec<MountEntry>, MountInfoError> {
    let path = path.unwrap_or(Path::new(crate::PROC_MOUNTINFO));
    let bytes = std::fs::read(path).map_err(|source| MountInfoError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&bytes, path)
}

/// Parses mountinfo text. `path` only names the source in errors.
pub fn parse(text: &[u8], path: &Path) -> Result<Vec<MountEntry>, MountInfoError> {
    let mut entries = Vec::new();
    for (index, line) in text.split(|b| *b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let entry = parse_line(line).map_err(|reason| MountInfoError::Malformed {
            path: path.to_path_buf(),
            line: index + 1,
            reason,
            text: String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned(),
        })?;
        entries.push(entry);
    }
    Ok(entries)
}

fn parse_line(line: &[u8]) -> Result<MountEntry, &'static str> {
    let mut fields = line.split(|b| *b == b' ');
    let mut next = |what: &'static str| fields.next().filter(|f| !f.is_empty()).ok_or(what);
    let id = parse_u32(next("missing mount id")?).ok_or("mount id is not a number")?;
    let parent = parse_u32(next("missing parent id")?).ok_or("parent id is not a number")?;
    let dev = next("missing major:minor")?;
    if !dev.contains(&b':') {
        return Err("major:minor has no colon");
    }
    let root = decode(next("missing root")?)?;
    let mount_point = decode(next("missing mount point")?)?;
    if !mount_point.starts_with(b"/") {
        return Err("mount point is not an absolute path");
    }
    next("missing mount options")?;
    // Optional fields (shared:N, master:N, ...) run until a lone "-".
    loop {
        let field = next("missing the \"-\" separator")?;
        if field == b"-" {
            break;
        }
    }
    let fs_type = next("missing filesystem type")?;
    // Some filesystems have an empty source; only the type is required after "-".
    let source = fields.next().unwrap_or_default();
    Ok(MountEntry {
        id,
        parent,
        dev: String::from_utf8_lossy(dev).into_owned(),
        root: PathBuf::from(OsString::from_vec(root)),
        mount_point: PathBuf::from(OsString::from_vec(mount_point)),
        fs_type: String::from_utf8_lossy(fs_type).into_owned(),
        source: String::from_utf8(decode(source)?)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
    })
}

fn parse_u32(field: &[u8]) -> Option<u32> {
    std::str::from_utf8(field).ok()?.parse().ok()
}

/// Decodes the kernel's `\ooo` octal escapes.
pub fn decode(field: &[u8]) -> Result<Vec<u8>, &'static str> {
    if !field.contains(&b'\\') {
        return Ok(field.to_vec());
    }
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\' {
            let digits = field.get(i + 1..i + 4).ok_or("truncated octal escape")?;
            let mut value: u32 = 0;
            for d in digits {
                if !(b'0'..=b'7').contains(d) {
                    return Err("backslash not followed by three octal digits");
                }
                value = value * 8 + u32::from(d - b'0');
            }
            out.push(u8::try_from(value).map_err(|_| "octal escape above \\377")?);
            i += 4;
        } else {
            out.push(field[i]);
            i += 1;
        }
    }
    Ok(out)
}

/// Which mounts a plan takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Mounts at a prefix and below it.
    AtOrBelow,
    /// Mounts below a prefix, not one at the prefix itself.
    StrictlyBelow,
}

/// One unmount in a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedUnmount {
    /// The mount point to detach.
    pub mount_point: PathBuf,
    /// The mount's id in the table: what must be found at `mount_point` when it is
    /// detached.
    pub mount_id: u32,
    /// The indexes (into the prefixes given to [`plan`]) this mount is below; a failure
    /// to unmount it is attributed to each.
    pub prefixes: Vec<usize>,
}

/// Whether `path` is `prefix` or below it, by whole path components:
/// `/var/lib/kubelet-x` is not below `/var/lib/kubelet`.
pub fn is_at_or_below(path: &Path, prefix: &Path) -> bool {
    path.starts_with(prefix)
}

/// Plans the unmounts of every mount in `table` within `scope` of any prefix, deepest
/// first. Mounts at the same depth go in reverse table order, so of two mounts stacked on
/// one directory the upper (later) one goes first.
pub fn plan(table: &[MountEntry], prefixes: &[PathBuf], scope: Scope) -> Vec<PlannedUnmount> {
    use std::os::unix::ffi::OsStrExt;
    // Kernel mount points are normalized (no trailing or doubled slashes), so after
    // normalizing the prefixes the component test is a byte test: the prefix, then the
    // end of the path or a '/'. That keeps a 100,000-line table fast to plan.
    let normalized: Vec<Vec<u8>> = prefixes
        .iter()
        .map(|p| {
            let clean: PathBuf = p.components().collect();
            let mut bytes = clean.as_os_str().as_bytes().to_vec();
            if bytes == b"/" {
                bytes.clear();
            }
            bytes
        })
        .collect();
    let mut picked: Vec<(usize, usize, PlannedUnmount)> = Vec::new();
    for (order, entry) in table.iter().enumerate() {
        let point = entry.mount_point.as_os_str().as_bytes();
        let mut matching = Vec::new();
        for (i, prefix) in normalized.iter().enumerate() {
            let below = point.starts_with(prefix)
                && (point.len() == prefix.len() || point[prefix.len()] == b'/');
            let at = point.len() == prefix.len() || (prefix.is_empty() && point == b"/");
            if below && !(scope == Scope::StrictlyBelow && at) {
                matching.push(i);
            }
        }
        if matching.is_empty() {
            continue;
        }
        let depth = point.iter().filter(|b| **b == b'/').count();
        picked.push((
            depth,
            order,
            PlannedUnmount {
                mount_point: entry.mount_point.clone(),
                mount_id: entry.id,
                prefixes: matching,
            },
        ));
    }
    picked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    picked.into_iter().map(|(_, _, p)| p).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:25 / /var/lib/kubelet rw,relatime shared:2 - tmpfs tmpfs rw
31 30 0:26 / /var/lib/kubelet/pods/a/volumes/kubernetes.io~secret/tok rw - tmpfs tmpfs rw
32 30 0:21 /data /var/lib/kubelet/pods/b/volumes/my\\040vol rw master:3 - ext4 /dev/vda rw
33 22 0:27 / /var/lib/kubelet-x rw - tmpfs tmpfs rw
34 30 0:28 / /var/lib/kubelet/pods/a rw - tmpfs none rw
35 34 0:29 / /var/lib/kubelet/pods/a rw - tmpfs none rw
";

    fn table() -> Vec<MountEntry> {
        parse(SAMPLE.as_bytes(), Path::new("sample")).unwrap()
    }

    #[test]
    fn parses_fields_and_optional_fields() {
        let t = table();
        assert_eq!(t.len(), 7);
        assert_eq!(t[3].id, 32);
        assert_eq!(t[3].parent, 30);
        assert_eq!(t[3].root, Path::new("/data"));
        assert_eq!(t[3].fs_type, "ext4");
        assert_eq!(t[3].source, "/dev/vda");
        assert_eq!(
            t[3].mount_point,
            Path::new("/var/lib/kubelet/pods/b/volumes/my vol")
        );
    }

    #[test]
    fn decodes_every_kernel_escape() {
        assert_eq!(decode(br"a\040b\011c\012d\134e").unwrap(), b"a b\tc\nd\\e");
        assert_eq!(decode(br"\303\251").unwrap(), "é".as_bytes());
        assert!(decode(br"a\04").is_err());
        assert!(decode(br"a\09x").is_err());
        assert!(decode(br"\777").is_err());
    }

    #[test]
    fn malformed_lines_name_the_line() {
        let text = "22 1 0:21 / / rw shared:1 - ext4 /dev/vda rw\n23 22 0:5 / /x rw shared:1\n";
        let err = parse(text.as_bytes(), Path::new("/proc/self/mountinfo")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("line 2"), "{msg}");
        assert!(msg.contains("separator"), "{msg}");

        for (bad, reason) in [
            ("x 1 0:1 / /a rw - tmpfs t rw", "mount id"),
            ("1 1 01 / /a rw - tmpfs t rw", "colon"),
            ("1 1 0:1 / a rw - tmpfs t rw", "absolute"),
            ("1 1 0:1 / /a\\9 rw - tmpfs t rw", "escape"),
            ("1 1 0:1 / /a rw -", "filesystem type"),
            ("1 1", "major:minor"),
        ] {
            let err = parse(bad.as_bytes(), Path::new("t"))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("line 1") && err.contains(reason),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn depth_counts_path_components_not_bytes() {
        // A long shallow mount point and a short deep one: the deep one goes first, which
        // a depth by length would get backwards (found by cargo-mutants).
        let text = "\
22 1 0:21 / / rw - ext4 /dev/vda rw
40 22 0:30 / /k/a-very-long-volume-name rw - tmpfs t rw
41 22 0:31 / /k/b/c/d rw - tmpfs t rw
";
        let table = parse(text.as_bytes(), Path::new("t")).unwrap();
        let plan = plan(&table, &[PathBuf::from("/k")], Scope::AtOrBelow);
        let ids: Vec<_> = plan.iter().map(|p| p.mount_id).collect();
        assert_eq!(ids, [41, 40]);
    }

    #[test]
    fn plan_is_deepest_first_and_by_whole_components() {
        let plan = plan(
            &table(),
            &[PathBuf::from("/var/lib/kubelet")],
            Scope::AtOrBelow,
        );
        let points: Vec<_> = plan
            .iter()
            .map(|p| p.mount_point.to_str().unwrap())
            .collect();
        assert_eq!(
            points,
            [
                "/var/lib/kubelet/pods/a/volumes/kubernetes.io~secret/tok",
                "/var/lib/kubelet/pods/b/volumes/my vol",
                // Two mounts stacked on pods/a: the upper (later) one first.
                "/var/lib/kubelet/pods/a",
                "/var/lib/kubelet/pods/a",
                "/var/lib/kubelet",
            ]
        );
        assert!(!points.contains(&"/var/lib/kubelet-x"));
    }

    #[test]
    fn strictly_below_keeps_the_prefix_mount() {
        let plan = plan(
            &table(),
            &[PathBuf::from("/var/lib/kubelet/")],
            Scope::StrictlyBelow,
        );
        assert_eq!(plan.len(), 4);
        assert!(
            plan.iter()
                .all(|p| p.mount_point != Path::new("/var/lib/kubelet"))
        );
    }

    #[test]
    fn failures_are_attributed_to_every_matching_prefix() {
        let prefixes = [
            PathBuf::from("/var/lib/kubelet"),
            PathBuf::from("/var/lib/kubelet/pods/a"),
            PathBuf::from("/nothing"),
        ];
        let plan = plan(&table(), &prefixes, Scope::AtOrBelow);
        let tok = plan
            .iter()
            .find(|p| p.mount_point.ends_with("tok"))
            .unwrap();
        assert_eq!(tok.prefixes, [0, 1]);
        assert!(plan.iter().all(|p| !p.prefixes.contains(&2)));
    }

    #[test]
    fn arbitrary_input_is_an_error_never_a_panic() {
        // Every truncation of a valid line, and pseudo-random lines over the characters
        // that matter to the parser.
        let line = SAMPLE.lines().nth(3).unwrap().as_bytes();
        for cut in 0..line.len() {
            let _ = parse(&line[..cut], Path::new("t"));
        }
        let alphabet = b"0123456789 :/-\\\nabc";
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            let len = (state % 64) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    alphabet[(state % alphabet.len() as u64) as usize]
                })
                .collect();
            if let Err(e) = parse(&bytes, Path::new("fuzz")) {
                assert!(e.to_string().contains("fuzz, line "), "{e}");
            }
        }
    }

    #[test]
    fn root_and_unnormalized_prefixes() {
        let all = plan(&table(), &[PathBuf::from("/")], Scope::AtOrBelow);
        assert_eq!(all.len(), 7);
        assert_eq!(all.last().unwrap().mount_point, Path::new("/"));
        let strictly = plan(&table(), &[PathBuf::from("/")], Scope::StrictlyBelow);
        assert_eq!(strictly.len(), 6);
        let messy = plan(
            &table(),
            &[PathBuf::from("/var//lib/kubelet/")],
            Scope::AtOrBelow,
        );
        assert_eq!(messy.len(), 5);
    }

    #[test]
    fn component_matching() {
        assert!(is_at_or_below(
            Path::new("/var/lib/kubelet/pods"),
            Path::new("/var/lib/kubelet")
        ));
        assert!(is_at_or_below(
            Path::new("/var/lib/kubelet"),
            Path::new("/var/lib/kubelet/")
        ));
        assert!(!is_at_or_below(
            Path::new("/var/lib/kubelet-x"),
            Path::new("/var/lib/kubelet")
        ));
        assert!(!is_at_or_below(
            Path::new("/var/lib"),
            Path::new("/var/lib/kubelet")
        ));
    }
}
