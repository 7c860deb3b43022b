//! Fault injection: errors, throttling, latency, dropped watches and compaction, matched
//! per verb and resource.

use std::sync::Mutex;
use std::time::Duration;

/// What an injected fault does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Answer with this HTTP status and a matching `Status` body.
    Status(u16),
    /// Answer 429 with a `Retry-After` header.
    TooManyRequests {
        /// Seconds in the `Retry-After` header (and `details.retryAfterSeconds`).
        retry_after_secs: u64,
    },
    /// Delay the request, then serve it normally.
    Latency(Duration),
    /// Serve a watch, then close its stream after the events already due (the initial
    /// state or the backlog), as a restarting apiserver or a broken connection would.
    DropWatch,
    /// Forget the retained event window before serving, so older resourceVersions get 410.
    Compact,
}

/// One fault rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The verb it applies to (`get`, `list`, `watch`, `create`, `update`, `patch`,
    /// `delete`, `deletecollection`); None for every verb.
    pub verb: Option<String>,
    /// The resource it applies to: a plural (`pods`) matches the resource and its
    /// subresources, `pods/status` only that subresource; None for every resource.
    pub resource: Option<String>,
    /// How many matching requests it applies to; None until cleared.
    pub times: Option<u32>,
    /// What it does.
    pub kind: FaultKind,
}

impl Fault {
    /// A fault for every request until cleared.
    pub fn new(kind: FaultKind) -> Self {
        Fault {
            verb: None,
            resource: None,
            times: None,
            kind,
        }
    }
    /// Only for this verb.
    pub fn verb(mut self, verb: &str) -> Self {
        self.verb = Some(verb.to_string());
        self
    }
    /// Only for this resource (`pods`, `pods/status`).
    pub fn resource(mut self, resource: &str) -> Self {
        self.resource = Some(resource.to_string());
        self
    }
    /// Only for the next `n` matching requests.
    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }

    fn matches(&self, verb: &str, resource: &str, subresource: Option<&str>) -> bool {
        let verb_ok = self.verb.as_deref().is_none_or(|v| v == verb);
        let res_ok = self
            .resource
            .as_deref()
            .is_none_or(|r| match r.split_once('/') {
                Some((res, sub)) => res == resource && Some(sub) == subresource,
                None => r == resource,
            });
        verb_ok && res_ok
    }
}

/// The active faults.
#[derive(Default, Debug)]
pub struct Faults {
    rules: Mutex<Vec<Fault>>,
}

impl Faults {
    /// Adds a rule.
    pub fn add(&self, fault: Fault) {
        if fault.times == Some(0) {
            return;
        }
        self.lock().push(fault);
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Fault>> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The faults a request meets, counting it against each rule's `times`.
    pub fn take(&self, verb: &str, resource: &str, subresource: Option<&str>) -> Vec<FaultKind> {
        let mut rules = self.lock();
        let mut out = Vec::new();
        rules.retain_mut(|rule| {
            if !rule.matches(verb, resource, subresource) {
                return true;
            }
            out.push(rule.kind.clone());
            match &mut rule.times {
                Some(n) => {
                    *n -= 1;
                    *n > 0
                }
                None => true,
            }
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_counts_matching_requests_only() {
        let f = Faults::default();
        f.add(
            Fault::new(FaultKind::Status(500))
                .verb("list")
                .resource("pods")
                .times(2),
        );
        assert!(f.take("get", "pods", None).is_empty());
        assert!(f.take("list", "nodes", None).is_empty());
        assert_eq!(f.take("list", "pods", None), [FaultKind::Status(500)]);
        assert_eq!(f.take("list", "pods", None).len(), 1);
        assert!(f.take("list", "pods", None).is_empty());
    }

    #[test]
    fn subresource_rules() {
        let f = Faults::default();
        f.add(Fault::new(FaultKind::Compact).resource("nodes/status"));
        assert!(f.take("update", "nodes", None).is_empty());
        assert_eq!(f.take("update", "nodes", Some("status")).len(), 1);
        // Until cleared.
        assert_eq!(f.take("patch", "nodes", Some("status")).len(), 1);
        f.clear();
        assert!(f.take("patch", "nodes", Some("status")).is_empty());
    }
}
