//! Label and field selectors come straight from request query strings. Input: a plural,
//! a NUL, the label selector, a NUL, the field selector, a NUL, then a JSON object to
//! match against. Invariants: parsing never panics; an accepted selector written back in
//! canonical form parses to the same requirements; and each requirement and its negation
//! (Eq/NotEq, In/NotIn, Exists/NotExists, = and !=) never both match one object.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use testkube::selector::{FieldReq, FieldSelector, LabelReq, LabelSelector};

fn render_label(req: &LabelReq) -> String {
    match req {
        LabelReq::Eq(k, v) => format!("{k}={v}"),
        LabelReq::NotEq(k, v) => format!("{k}!={v}"),
        LabelReq::In(k, vs) => format!("{k} in ({})", vs.join(",")),
        LabelReq::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
        LabelReq::Exists(k) => k.clone(),
        LabelReq::NotExists(k) => format!("!{k}"),
    }
}

fn negate_label(req: &LabelReq) -> LabelReq {
    match req.clone() {
        LabelReq::Eq(k, v) => LabelReq::NotEq(k, v),
        LabelReq::NotEq(k, v) => LabelReq::Eq(k, v),
        LabelReq::In(k, vs) => LabelReq::NotIn(k, vs),
        LabelReq::NotIn(k, vs) => LabelReq::In(k, vs),
        LabelReq::Exists(k) => LabelReq::NotExists(k),
        LabelReq::NotExists(k) => LabelReq::Exists(k),
    }
}

fn render_field(req: &FieldReq) -> String {
    let op = if req.negate { "!=" } else { "==" };
    format!("{}{op}{}", req.field, req.value)
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(4, '\0');
    let plural = parts.next().unwrap_or("");
    let labels = parts.next().unwrap_or("");
    let fields = parts.next().unwrap_or("");
    let object: Value = parts
        .next()
        .and_then(|o| serde_json::from_str(o).ok())
        .unwrap_or(Value::Null);

    if let Ok(sel) = LabelSelector::parse(labels) {
        let canonical: Vec<String> = sel.0.iter().map(render_label).collect();
        let canonical = canonical.join(",");
        assert_eq!(
            LabelSelector::parse(&canonical).as_ref(),
            Ok(&sel),
            "label selector {labels:?} rendered as {canonical:?} parses differently"
        );
        for req in &sel.0 {
            let one = LabelSelector(vec![req.clone()]);
            let neg = LabelSelector(vec![negate_label(req)]);
            assert_ne!(
                one.matches(&object),
                neg.matches(&object),
                "{req:?} and its negation agree on {object}"
            );
        }
        assert!(LabelSelector::default().matches(&object));
        let all = sel
            .0
            .iter()
            .all(|r| LabelSelector(vec![r.clone()]).matches(&object));
        assert_eq!(sel.matches(&object), all);
    }

    if let Ok(sel) = FieldSelector::parse(fields, plural) {
        let canonical: Vec<String> = sel.0.iter().map(render_field).collect();
        let canonical = canonical.join(",");
        assert_eq!(
            FieldSelector::parse(&canonical, plural).as_ref(),
            Ok(&sel),
            "field selector {fields:?} rendered as {canonical:?} parses differently"
        );
        for req in &sel.0 {
            let one = FieldSelector(vec![req.clone()]);
            let mut flipped = req.clone();
            flipped.negate = !flipped.negate;
            let neg = FieldSelector(vec![flipped]);
            assert_ne!(one.matches(&object), neg.matches(&object));
        }
    }
});
