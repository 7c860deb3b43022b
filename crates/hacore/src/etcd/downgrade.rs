//! Whether an etcd cluster can be downgraded to a target version, decided from the
//! versions its members report. etcd downgrades one minor version at a time, and only from
//! 3.5 on; anything else is refused here, before a request is sent, with a
//! [`DowngradeRefusal`] that says why and what would work.
//!
//! How depends on the version left ([`DowngradeMethod`]), as real etcd behaves:
//! - 3.5 to 3.4 is etcd's documented rolling replacement, without the downgrade API: each
//!   member is restarted on etcd 3.4.32 or later with `--next-cluster-version-compatible`.
//!   etcd 3.5.16 does accept `Maintenance.Downgrade` enable to 3.4, but (tested against it)
//!   the request never answers (it is cancelled at the client's timeout although applied),
//!   and once enabled no 3.5 member can start again ("server version is not allowed to join
//!   when downgrade is enabled") while a 3.4 before 3.4.32 cannot start either ("server
//!   version is lower than determined cluster version"); a cancel does not help a member
//!   that was stopped meanwhile (its data keeps the enabled downgrade). Enabling would leave
//!   a cluster a crash away from losing members. So it is never enabled for 3.5.
//! - From 3.6 on: `Maintenance.Downgrade` validate then enable, then each member restarted
//!   on the older binary.

/// The first etcd release that can be downgraded (to the minor version before it).
pub const DOWNGRADE_SINCE: MinorVersion = MinorVersion { major: 3, minor: 5 };

/// The first etcd release whose downgrade goes through the downgrade API's enable.
pub const ENABLE_SINCE: MinorVersion = MinorVersion { major: 3, minor: 6 };

/// The oldest etcd 3.4 release that starts on a 3.5 cluster's data (etcd's 3.5 to 3.4
/// downgrade guide; Debian bookworm's 3.4.23 exits instead).
pub const MIN_3_4_PATCH_FOR_DOWNGRADE: u32 = 32;

/// How a downgrade is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DowngradeMethod {
    /// Validate and enable it through the downgrade API, then restart each member on the
    /// older binary (etcd 3.6 and later).
    Enable,
    /// Restart each member on etcd 3.4.32 or later with `--next-cluster-version-compatible`;
    /// nothing is asked of etcd (3.5 to 3.4).
    RollingRestart,
}

impl DowngradeMethod {
    /// What the operator does to each member, one at a time, for a downgrade to `target`.
    pub fn restart_instructions(self, target: MinorVersion) -> String {
        match self {
            DowngradeMethod::Enable => format!(
                "restart each member, one at a time, on the etcd {target} binary with the same \
                 data directory and flags"
            ),
            DowngradeMethod::RollingRestart => format!(
                "restart each member, one at a time, on etcd {target}.{MIN_3_4_PATCH_FOR_DOWNGRADE} \
                 or later with the same data directory and flags plus \
                 --next-cluster-version-compatible (an older {target} exits: \"server version \
                 is lower than determined cluster version\")"
            ),
        }
    }
}

/// An etcd `major.minor` version (the cluster version's granularity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct MinorVersion {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
}

impl std::fmt::Display for MinorVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl MinorVersion {
    /// Parses `3.5`, `3.5.0`, `v3.5.12` (a pre-release or build suffix on the patch is
    /// ignored). `None` for anything else.
    pub fn parse(text: &str) -> Option<MinorVersion> {
        let t = text.trim();
        let t = t.strip_prefix('v').unwrap_or(t);
        let mut parts = t.splitn(3, '.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        if let Some(patch) = parts.next() {
            let digits: String = patch.chars().take_while(char::is_ascii_digit).collect();
            let rest = &patch[digits.len()..];
            if digits.is_empty() || !(rest.is_empty() || rest.starts_with(['-', '+'])) {
                return None;
            }
        }
        Some(MinorVersion { major, minor })
    }
}

/// Why a downgrade is refused before anything is asked of etcd.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DowngradeRefusal {
    /// The target is not a version.
    #[error("downgrade target {target:?} is not an etcd version (give MAJOR.MINOR, e.g. 3.5)")]
    BadTarget {
        /// The target as given.
        target: String,
    },
    /// No member reported a version.
    #[error("no etcd member reported its version: cannot tell the cluster version")]
    NoVersions,
    /// A member reported a version that does not parse.
    #[error("etcd member {member} reports version {version:?}, which is not MAJOR.MINOR.PATCH")]
    BadMemberVersion {
        /// The member.
        member: String,
        /// What it reported.
        version: String,
    },
    /// The cluster runs an etcd without the downgrade API.
    #[error(
        "etcd cluster version {cluster} cannot be downgraded: etcd supports a downgrade \
         (and has the downgrade API) from etcd {DOWNGRADE_SINCE} on. Upgrade every member to \
         etcd {DOWNGRADE_SINCE} or later first, or roll back by restoring a snapshot taken on \
         the older version"
    )]
    Unsupported {
        /// The cluster version (the lowest member version).
        cluster: MinorVersion,
    },
    /// The target is not below the cluster version.
    #[error("etcd cluster version is {cluster}: {target} is not a downgrade")]
    NotADowngrade {
        /// The cluster version.
        cluster: MinorVersion,
        /// The target.
        target: MinorVersion,
    },
    /// The target is more than one minor version below.
    #[error(
        "etcd cluster version is {cluster}: etcd downgrades one minor version at a time, to \
         {next} first"
    )]
    TooFar {
        /// The cluster version.
        cluster: MinorVersion,
        /// The target asked for.
        target: MinorVersion,
        /// The one version it can go to now.
        next: MinorVersion,
    },
}

/// A downgrade etcd can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DowngradePlan {
    /// The version left (the highest member version).
    pub cluster: MinorVersion,
    /// The version to go to.
    pub target: MinorVersion,
    /// How.
    pub method: DowngradeMethod,
    /// Some members already run the target (a downgrade under way, or an upgrade from it
    /// not finished): nothing is to be enabled, only the rest to be restarted.
    pub under_way: bool,
}

/// Decides whether `(member, version)` answers allow a downgrade to `target`. The cluster
/// version is the lowest member version (what etcd itself sets it to); a cluster whose
/// lowest members already run the target and the rest the version above it is a downgrade
/// under way.
pub fn plan_downgrade(
    members: &[(String, String)],
    target: &str,
) -> Result<DowngradePlan, DowngradeRefusal> {
    let t = MinorVersion::parse(target).ok_or_else(|| DowngradeRefusal::BadTarget {
        target: target.to_string(),
    })?;
    let mut range: Option<(MinorVersion, MinorVersion)> = None;
    for (member, version) in members {
        let v = MinorVersion::parse(version).ok_or_else(|| DowngradeRefusal::BadMemberVersion {
            member: member.clone(),
            version: version.clone(),
        })?;
        range = Some(range.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))));
    }
    let (cluster, highest) = range.ok_or(DowngradeRefusal::NoVersions)?;
    let method_from = |from: MinorVersion| {
        if from >= ENABLE_SINCE {
            DowngradeMethod::Enable
        } else {
            DowngradeMethod::RollingRestart
        }
    };
    if cluster == t
        && highest >= DOWNGRADE_SINCE
        && highest.major == t.major
        && highest.minor == t.minor + 1
    {
        return Ok(DowngradePlan {
            cluster: highest,
            target: t,
            method: method_from(highest),
            under_way: true,
        });
    }
    if cluster < DOWNGRADE_SINCE {
        return Err(DowngradeRefusal::Unsupported { cluster });
    }
    if t >= cluster {
        return Err(DowngradeRefusal::NotADowngrade { cluster, target: t });
    }
    let next = MinorVersion {
        major: cluster.major,
        minor: cluster.minor.saturating_sub(1),
    };
    if t != next || cluster.minor == 0 {
        return Err(DowngradeRefusal::TooFar {
            cluster,
            target: t,
            next,
        });
    }
    Ok(DowngradePlan {
        cluster,
        target: t,
        method: method_from(cluster),
        under_way: false,
    })
}

/// The members (by the name given) whose version is not yet `target`.
pub fn members_not_on(members: &[(String, String)], target: MinorVersion) -> Vec<String> {
    members
        .iter()
        .filter(|(_, v)| MinorVersion::parse(v) != Some(target))
        .map(|(m, v)| format!("{m} ({v})"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(v: &[&str]) -> Vec<(String, String)> {
        v.iter()
            .enumerate()
            .map(|(i, v)| (format!("m{i}"), v.to_string()))
            .collect()
    }

    #[test]
    fn versions_parse() {
        let v = |a, b| Some(MinorVersion { major: a, minor: b });
        assert_eq!(MinorVersion::parse("3.4.23"), v(3, 4));
        assert_eq!(MinorVersion::parse("v3.5"), v(3, 5));
        assert_eq!(MinorVersion::parse("3.6.0-rc.1"), v(3, 6));
        for bad in ["", "3", "x.y", "3.5.x", "3.5.1x"] {
            assert_eq!(MinorVersion::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn etcd_3_4_is_refused_naming_the_version_with_the_api() {
        let err = plan_downgrade(&m(&["3.4.23", "3.4.23"]), "3.5.0").unwrap_err();
        assert_eq!(
            err,
            DowngradeRefusal::Unsupported {
                cluster: MinorVersion { major: 3, minor: 4 }
            }
        );
        let text = err.to_string();
        assert!(
            text.contains("3.4") && text.contains("etcd 3.5 or later"),
            "{text}"
        );
        // A mixed cluster's version is its lowest member's.
        assert!(matches!(
            plan_downgrade(&m(&["3.6.1", "3.4.23"]), "3.5"),
            Err(DowngradeRefusal::Unsupported { .. })
        ));
    }

    #[test]
    fn etcd_3_5_goes_to_3_4_by_restarts_never_by_enable() {
        let plan = plan_downgrade(&m(&["3.5.16", "3.5.16", "3.5.9"]), "3.4").unwrap();
        assert_eq!(plan.method, DowngradeMethod::RollingRestart);
        assert!(!plan.under_way);
        assert_eq!(plan.cluster.to_string(), "3.5");
        let how = plan.method.restart_instructions(plan.target);
        assert!(
            how.contains("3.4.32 or later") && how.contains("--next-cluster-version-compatible"),
            "{how}"
        );
        // Half way: one member restarted on 3.4 lowered the cluster version; the rest is
        // still to be restarted, and nothing is refused as "3.4 has no downgrade".
        let plan = plan_downgrade(&m(&["3.4.32", "3.5.16", "3.5.16"]), "3.4.0").unwrap();
        assert_eq!(plan.method, DowngradeMethod::RollingRestart);
        assert!(plan.under_way);
        assert_eq!(plan.cluster.to_string(), "3.5");
        // A mixed 3.4/3.5 cluster asked for anything but 3.4 is a 3.4 cluster.
        assert!(matches!(
            plan_downgrade(&m(&["3.4.32", "3.5.16"]), "3.3"),
            Err(DowngradeRefusal::Unsupported { .. })
        ));
        // Two minor versions apart is not a downgrade under way.
        assert!(matches!(
            plan_downgrade(&m(&["3.4.32", "3.6.0"]), "3.4"),
            Err(DowngradeRefusal::Unsupported { .. })
        ));
    }

    #[test]
    fn one_minor_down_is_the_only_plan() {
        let plan = plan_downgrade(&m(&["3.6.0", "3.6.1"]), "3.5").unwrap();
        assert_eq!(plan.target.to_string(), "3.5");
        assert_eq!(plan.cluster.to_string(), "3.6");
        assert_eq!(plan.method, DowngradeMethod::Enable);
        assert!(!plan.under_way);
        let plan = plan_downgrade(&m(&["3.5.21", "3.6.1"]), "3.5").unwrap();
        assert!(plan.under_way && plan.method == DowngradeMethod::Enable);
        assert!(matches!(
            plan_downgrade(&m(&["3.6.0"]), "3.6.0"),
            Err(DowngradeRefusal::NotADowngrade { .. })
        ));
        assert!(matches!(
            plan_downgrade(&m(&["3.7.0"]), "3.5"),
            Err(DowngradeRefusal::TooFar { .. })
        ));
        assert!(matches!(
            plan_downgrade(&m(&["3.6.0"]), "three"),
            Err(DowngradeRefusal::BadTarget { .. })
        ));
        assert_eq!(
            plan_downgrade(&[], "3.5"),
            Err(DowngradeRefusal::NoVersions)
        );
        assert!(matches!(
            plan_downgrade(&m(&["garbage"]), "3.5"),
            Err(DowngradeRefusal::BadMemberVersion { .. })
        ));
    }

    #[test]
    fn pending_members_are_named() {
        let t = MinorVersion { major: 3, minor: 5 };
        assert_eq!(
            members_not_on(&m(&["3.5.9", "3.6.0"]), t),
            vec!["m1 (3.6.0)".to_string()]
        );
    }
}
