//! Whether an etcd cluster can be downgraded to a target version, decided from the
//! versions its members report. etcd has a downgrade API (`Maintenance.Downgrade`:
//! validate, enable, cancel) only from 3.5 on, and it lowers the cluster version by one
//! minor version at a time; anything else is refused here, before a request is sent, with
//! a [`DowngradeRefusal`] that says why and what would work.

/// The first etcd release with the downgrade API.
pub const DOWNGRADE_SINCE: MinorVersion = MinorVersion { major: 3, minor: 5 };

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
        "etcd cluster version {cluster} has no downgrade API: `downgrade validate/enable` \
         exists from etcd {DOWNGRADE_SINCE} on. Upgrade every member to etcd {DOWNGRADE_SINCE} \
         or later first, or roll back by restoring a snapshot taken on the older version"
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

/// A downgrade etcd can be asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DowngradePlan {
    /// The cluster version now (the lowest member version).
    pub cluster: MinorVersion,
    /// The version to go to.
    pub target: MinorVersion,
}

/// Decides whether `(member, version)` answers allow a downgrade to `target`. The cluster
/// version is the lowest member version (what etcd itself sets it to).
pub fn plan_downgrade(
    members: &[(String, String)],
    target: &str,
) -> Result<DowngradePlan, DowngradeRefusal> {
    let t = MinorVersion::parse(target).ok_or_else(|| DowngradeRefusal::BadTarget {
        target: target.to_string(),
    })?;
    let mut cluster: Option<MinorVersion> = None;
    for (member, version) in members {
        let v = MinorVersion::parse(version).ok_or_else(|| DowngradeRefusal::BadMemberVersion {
            member: member.clone(),
            version: version.clone(),
        })?;
        cluster = Some(cluster.map_or(v, |c| c.min(v)));
    }
    let cluster = cluster.ok_or(DowngradeRefusal::NoVersions)?;
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
    Ok(DowngradePlan { cluster, target: t })
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
    fn one_minor_down_is_the_only_plan() {
        let plan = plan_downgrade(&m(&["3.6.0", "3.6.1"]), "3.5").unwrap();
        assert_eq!(plan.target.to_string(), "3.5");
        assert_eq!(plan.cluster.to_string(), "3.6");
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
