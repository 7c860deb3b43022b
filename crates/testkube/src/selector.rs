//! Label and field selectors (`staging/src/k8s.io/apimachinery/pkg/labels`,
//! `pkg/fields`), parsed from query strings and matched against stored objects.

use serde_json::Value;

/// A selector that failed to parse; kube-apiserver answers these with 400 BadRequest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The label selector text is malformed.
    #[error("unable to parse requirement: {0}")]
    Label(String),
    /// The field selector text is malformed.
    #[error("invalid field selector: {0}")]
    Field(String),
    /// The field is not indexed for this resource.
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
}

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelReq {
    /// `key=value` or `key==value`.
    Eq(String, String),
    /// `key!=value` (also matches objects without the key).
    NotEq(String, String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)` (also matches objects without the key).
    NotIn(String, Vec<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    NotExists(String),
}

/// A parsed label selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<LabelReq>);

/// One field requirement: `path=value` or `path!=value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldReq {
    /// The dotted field path (`spec.nodeName`).
    pub field: String,
    /// The value compared against.
    pub value: String,
    /// True for `!=`.
    pub negate: bool,
}

/// A parsed field selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<FieldReq>);

fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_label_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_label_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_set(rest: &str, whole: &str) -> Result<Vec<String>, SelectorError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| SelectorError::Label(format!("{whole}: expected a set like (a,b)")))?;
    let values: Vec<String> = inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    if values.is_empty() {
        return Err(SelectorError::Label(format!("{whole}: empty set")));
    }
    if let Some(bad) = values.iter().find(|v| !valid_label_value(v)) {
        return Err(SelectorError::Label(format!(
            "{whole}: invalid value {bad:?}"
        )));
    }
    Ok(values)
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for part in split_top_level(s) {
            let p = part.trim();
            if p.is_empty() {
                return Err(SelectorError::Label(format!("{s}: empty requirement")));
            }
            let req = if let Some(key) = p.strip_prefix('!') {
                LabelReq::NotExists(key.trim().to_string())
            } else if let Some((k, v)) = p.split_once("!=") {
                LabelReq::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once("==") {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once('=') {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = p.split_once(" notin ") {
                LabelReq::NotIn(k.trim().into(), parse_set(rest, p)?)
            } else if let Some((k, rest)) = p.split_once(" in ") {
                LabelReq::In(k.trim().into(), parse_set(rest, p)?)
            } else {
                LabelReq::Exists(p.to_string())
            };
            let (key, value) = match &req {
                LabelReq::Eq(k, v) | LabelReq::NotEq(k, v) => (k, Some(v)),
                LabelReq::In(k, _)
                | LabelReq::NotIn(k, _)
                | LabelReq::Exists(k)
                | LabelReq::NotExists(k) => (k, None),
            };
            if !valid_label_key(key) {
                return Err(SelectorError::Label(format!(
                    "{p}: invalid label key {key:?}"
                )));
            }
            if let Some(v) = value
                && !valid_label_value(v)
            {
                return Err(SelectorError::Label(format!(
                    "{p}: invalid label value {v:?}"
                )));
            }
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// Whether an object's labels satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }

    /// True when the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Fields a resource can be selected by, besides `metadata.name` and `metadata.namespace`
/// (the field label conversion functions of each type).
pub fn supported_fields(plural: &str) -> &'static [&'static str] {
    match plural {
        "pods" => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        "nodes" => &["spec.unschedulable"],
        "secrets" => &["type"],
        "namespaces" => &["status.phase"],
        "events" => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        _ => &[],
    }
}

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter for a resource.
    pub fn parse(s: &str, plural: &str) -> Result<Self, SelectorError> {
        Self::parse_labels(s, |field| {
            (field == "metadata.name"
                || field == "metadata.namespace"
                || supported_fields(plural).contains(&field))
            .then(|| field.to_string())
        })
    }

    /// Parses the `fieldSelector` query parameter for a served resource, its labels
    /// converted to the fields of the stored form (events.k8s.io/v1 Events select by
    /// `regarding.*` and `reportingController`, matched against core v1 Events).
    pub fn parse_for(s: &str, res: &crate::resources::Resource) -> Result<Self, SelectorError> {
        if crate::convert::is_events_v1(res) {
            Self::parse_labels(s, crate::convert::events_v1_field_label)
        } else {
            Self::parse(s, res.plural)
        }
    }

    /// Parses with `convert` naming the stored field of each label (None: unsupported).
    fn parse_labels(
        s: &str,
        convert: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for part in s.split(',') {
            let p = part.trim();
            let (field, value, negate) = if let Some((f, v)) = p.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = p.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = p.split_once('=') {
                (f, v, false)
            } else {
                return Err(SelectorError::Field(format!(
                    "{p}: expected field=value or field!=value"
                )));
            };
            let field = field.trim();
            let Some(field) = convert(field) else {
                return Err(SelectorError::UnsupportedField(field.to_string()));
            };
            reqs.push(FieldReq {
                field,
                value: value.trim().to_string(),
                negate,
            });
        }
        Ok(Self(reqs))
    }

    /// Whether an object's fields satisfy every requirement. A missing field compares as
    /// the empty string, as the field set of a Go object would hold its zero value.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|r| {
            let v = field_value(obj, &r.field);
            (v == r.value) != r.negate
        })
    }

    /// True when the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value required for `field` with `=`, if any (used to answer `metadata.name`
    /// selectors without scanning).
    pub fn required(&self, field: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|r| r.field == field && !r.negate)
            .map(|r| r.value.as_str())
    }
}

fn field_value(obj: &Value, field: &str) -> String {
    if field == "source" {
        // `ToSelectableFields` in `pkg/registry/core/event/strategy.go`: the source
        // component, else the reporting controller (core v1 `reportingComponent`).
        let component = obj.pointer("/source/component").and_then(Value::as_str);
        return component
            .filter(|c| !c.is_empty())
            .or_else(|| obj.get("reportingComponent").and_then(Value::as_str))
            .unwrap_or("")
            .to_string();
    }
    let path = format!("/{}", field.replace('.', "/"));
    match obj.pointer(&path) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        // Go's zero value for a bool field renders as "false".
        None if matches!(field, "spec.unschedulable" | "spec.hostNetwork") => "false".into(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels},
               "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}})
    }

    #[test]
    fn label_equality_and_inequality() {
        let o = obj(json!({"app": "web", "tier": "fe"}));
        assert!(LabelSelector::parse("app=web").unwrap().matches(&o));
        assert!(
            LabelSelector::parse("app==web,tier=fe")
                .unwrap()
                .matches(&o)
        );
        assert!(!LabelSelector::parse("app=db").unwrap().matches(&o));
        assert!(LabelSelector::parse("app!=db").unwrap().matches(&o));
        assert!(LabelSelector::parse("missing!=x").unwrap().matches(&o));
    }

    #[test]
    fn label_sets_and_existence() {
        let o = obj(json!({"app": "web"}));
        assert!(
            LabelSelector::parse("app in (db, web)")
                .unwrap()
                .matches(&o)
        );
        assert!(
            !LabelSelector::parse("app notin (db,web)")
                .unwrap()
                .matches(&o)
        );
        assert!(LabelSelector::parse("other notin (x)").unwrap().matches(&o));
        assert!(LabelSelector::parse("app").unwrap().matches(&o));
        assert!(!LabelSelector::parse("!app").unwrap().matches(&o));
        assert!(
            LabelSelector::parse("!other,app in (web)")
                .unwrap()
                .matches(&o)
        );
    }

    #[test]
    fn bad_label_selectors_are_errors() {
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("a=b,,c").is_err());
        assert!(LabelSelector::parse("a=b c").is_err());
        assert!(LabelSelector::parse("").unwrap().is_empty());
    }

    #[test]
    fn field_selectors_on_pods() {
        let o = obj(json!({}));
        let s = FieldSelector::parse("spec.nodeName=n1,metadata.name==a", "pods").unwrap();
        assert!(s.matches(&o));
        assert_eq!(s.required("metadata.name"), Some("a"));
        assert!(
            !FieldSelector::parse("spec.nodeName!=n1", "pods")
                .unwrap()
                .matches(&o)
        );
        assert!(
            FieldSelector::parse("status.phase=Running", "pods")
                .unwrap()
                .matches(&o)
        );
        // An unset field compares as empty, which is how "unscheduled pods" are listed.
        let unscheduled = json!({"metadata": {"name": "b"}, "spec": {}});
        assert!(
            FieldSelector::parse("spec.nodeName=", "pods")
                .unwrap()
                .matches(&unscheduled)
        );
    }

    #[test]
    fn event_field_selectors_per_group() {
        let core = crate::resources::find("", "v1", "events").unwrap();
        let ev = crate::resources::find("events.k8s.io", "v1", "events").unwrap();
        let stored = serde_json::json!({"metadata": {"name": "e"},
            "involvedObject": {"kind": "Pod", "name": "p"},
            "reportingComponent": "example.com/ctl", "type": "Normal"});
        // events.k8s.io/v1 labels select core fields.
        let s = FieldSelector::parse_for(
            "regarding.name=p,reportingController=example.com/ctl,type=Normal",
            ev,
        )
        .unwrap();
        assert!(s.matches(&stored));
        assert!(
            !FieldSelector::parse_for("regarding.name=q", ev)
                .unwrap()
                .matches(&stored)
        );
        assert!(
            FieldSelector::parse_for(
                "involvedObject.name=p,reportingComponent=example.com/ctl",
                core
            )
            .unwrap()
            .matches(&stored)
        );
        // Each group refuses the other's spellings.
        assert_eq!(
            FieldSelector::parse_for("involvedObject.name=p", ev).unwrap_err(),
            SelectorError::UnsupportedField("involvedObject.name".into())
        );
        assert_eq!(
            FieldSelector::parse_for("regarding.name=p", core).unwrap_err(),
            SelectorError::UnsupportedField("regarding.name".into())
        );
        // `source` falls back to the reporting controller when there is no source.
        for res in [core, ev] {
            assert!(
                FieldSelector::parse_for("source=example.com/ctl", res)
                    .unwrap()
                    .matches(&stored)
            );
        }
    }

    #[test]
    fn unsupported_fields_are_rejected() {
        assert_eq!(
            FieldSelector::parse("spec.nodeName=x", "configmaps").unwrap_err(),
            SelectorError::UnsupportedField("spec.nodeName".into())
        );
        assert!(FieldSelector::parse("nonsense", "pods").is_err());
        assert!(
            FieldSelector::parse("spec.unschedulable=false", "nodes")
                .unwrap()
                .matches(&json!({"metadata": {"name": "n"}}))
        );
    }
}
