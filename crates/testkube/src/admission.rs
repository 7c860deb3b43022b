//! ValidatingAdmissionPolicy (`admissionregistration.k8s.io/v1`), the part the project
//! relies on (`staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating`):
//! a policy with resource rules, match conditions and validations in CEL, bound with
//! `validationActions: [Deny]`, enforced on CREATE and UPDATE before the write (dry runs
//! included, as kube-apiserver admits them too).
//!
//! What the double does not implement it refuses loudly when the policy or binding is
//! written, instead of storing something it would not enforce: parameters (`paramKind`,
//! `paramRef`), `variables`, `auditAnnotations`, namespace and object selectors,
//! `excludeResourceRules`, `matchResources` on a binding, the `Warn` and `Audit` actions,
//! DELETE and CONNECT operations, and CEL references to anything but `object`,
//! `oldObject` and `request` (no `authorizer`, `namespaceObject`, `params`). Time and
//! duration literals are not available either (the CEL build has no time support): an
//! expression using them fails to compile, which is refused the same way.

use cel::common::ast::{EntryExpr, Expr, IdedEntryExpr};
use cel::{Context, IdedExpr, Program, Value as CelValue};
use serde_json::{Value, json};

use crate::api::Request;
use crate::resources::Resource;
use crate::status::{ApiError, Cause};
use crate::store::{Inner, res_index};

/// The policy resource's plural.
pub const POLICIES: &str = "validatingadmissionpolicies";
/// The binding resource's plural.
pub const BINDINGS: &str = "validatingadmissionpolicybindings";
/// The group both live in.
pub const GROUP: &str = "admissionregistration.k8s.io";

const VARIABLES: &[&str] = &["object", "oldObject", "request"];
const NOT_IMPLEMENTED: &str = "is not implemented by this API double (it enforces only what it can enforce exactly; see testkube::admission)";

/// The operation being admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// A create (POST, or a PUT that creates).
    Create,
    /// An update (PUT or PATCH).
    Update,
}

impl Operation {
    fn name(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
        }
    }
}

fn unsupported(field: &str) -> Cause {
    Cause::forbidden(field, &format!("{field} {NOT_IMPLEMENTED}"))
}

/// kube-apiserver's `NotSupported` cause: the value and the sorted list of allowed ones.
fn not_supported(field: &str, value: &str, allowed: &[&str]) -> Cause {
    let mut allowed: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
    allowed.sort();
    Cause::invalid(
        field,
        &json!(value),
        &format!("supported values: {}", allowed.join(", ")),
    )
}

/// An optional string field that, when set, must be one of `allowed`.
fn one_of(field: &str, v: Option<&Value>, allowed: &[&str], causes: &mut Vec<Cause>) {
    if let Some(value) = v.and_then(Value::as_str)
        && !allowed.contains(&value)
    {
        causes.push(not_supported(field, value, allowed));
    }
}

fn present(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Object(m)) => !m.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    }
}

/// Compiles one expression, checking that it references only what the double provides.
fn compile(expr: &str) -> Result<Program, String> {
    let program = Program::compile(expr).map_err(|e| format!("compilation failed: {e}"))?;
    let mut free = Vec::new();
    free_variables(program.expression(), &mut Vec::new(), &mut free);
    if let Some(name) = free.iter().find(|n| !VARIABLES.contains(&n.as_str())) {
        return Err(format!(
            "the variable {name:?} {NOT_IMPLEMENTED}; only object, oldObject and request are"
        ));
    }
    Ok(program)
}

/// The identifiers an expression reads that no comprehension (`exists`, `all`, `map`,
/// ...) binds: what the evaluation environment must provide.
fn free_variables(e: &IdedExpr, bound: &mut Vec<String>, out: &mut Vec<String>) {
    match &e.expr {
        Expr::Unspecified | Expr::Literal(_) => {}
        Expr::Ident(name) => {
            if !name.starts_with('@') && !bound.contains(name) && !out.contains(name) {
                out.push(name.clone());
            }
        }
        Expr::Select(s) => free_variables(&s.operand, bound, out),
        Expr::Call(c) => {
            if let Some(t) = &c.target {
                free_variables(t, bound, out);
            }
            for a in &c.args {
                free_variables(a, bound, out);
            }
        }
        Expr::List(l) => {
            for x in &l.elements {
                free_variables(x, bound, out);
            }
        }
        Expr::Map(m) => entries(&m.entries, bound, out),
        Expr::Struct(s) => entries(&s.entries, bound, out),
        Expr::Comprehension(c) => {
            free_variables(&c.iter_range, bound, out);
            free_variables(&c.accu_init, bound, out);
            let depth = bound.len();
            bound.push(c.iter_var.clone());
            bound.extend(c.iter_var2.clone());
            bound.push(c.accu_var.clone());
            for x in [&c.loop_cond, &c.loop_step, &c.result] {
                free_variables(x, bound, out);
            }
            bound.truncate(depth);
        }
    }
}

fn entries(list: &[IdedEntryExpr], bound: &mut Vec<String>, out: &mut Vec<String>) {
    for entry in list {
        match &entry.expr {
            EntryExpr::StructField(f) => free_variables(&f.value, bound, out),
            EntryExpr::MapEntry(m) => {
                free_variables(&m.key, bound, out);
                free_variables(&m.value, bound, out);
            }
        }
    }
}

fn check_expression(field: &str, v: Option<&Value>, causes: &mut Vec<Cause>) {
    match v.and_then(Value::as_str) {
        None | Some("") => causes.push(Cause::required(field, "")),
        Some(e) => {
            if let Err(why) = compile(e) {
                causes.push(Cause::invalid(field, &json!(e), &why));
            }
        }
    }
}

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Validation of a ValidatingAdmissionPolicy (`ValidateValidatingAdmissionPolicy`), with
/// the double's refusals of what it does not enforce.
pub fn validate_policy(obj: &Value, causes: &mut Vec<Cause>) {
    let spec = obj.get("spec");
    for (field, path) in [
        ("spec.paramKind", "/spec/paramKind"),
        ("spec.variables", "/spec/variables"),
        ("spec.auditAnnotations", "/spec/auditAnnotations"),
        (
            "spec.matchConstraints.namespaceSelector",
            "/spec/matchConstraints/namespaceSelector",
        ),
        (
            "spec.matchConstraints.objectSelector",
            "/spec/matchConstraints/objectSelector",
        ),
        (
            "spec.matchConstraints.excludeResourceRules",
            "/spec/matchConstraints/excludeResourceRules",
        ),
    ] {
        if present(obj.pointer(path)) {
            causes.push(unsupported(field));
        }
    }
    match spec
        .and_then(|s| s.get("failurePolicy"))
        .and_then(Value::as_str)
    {
        None | Some("Fail" | "Ignore") => {}
        Some(other) => causes.push(not_supported(
            "spec.failurePolicy",
            other,
            &["Fail", "Ignore"],
        )),
    }
    match obj
        .pointer("/spec/matchConstraints/matchPolicy")
        .and_then(Value::as_str)
    {
        None | Some("Equivalent") => {}
        Some("Exact") => causes.push(unsupported("spec.matchConstraints.matchPolicy Exact")),
        Some(other) => causes.push(not_supported(
            "spec.matchConstraints.matchPolicy",
            other,
            &["Equivalent", "Exact"],
        )),
    }
    let rules = obj
        .pointer("/spec/matchConstraints/resourceRules")
        .and_then(Value::as_array);
    match rules {
        None => causes.push(Cause::required("spec.matchConstraints.resourceRules", "")),
        Some(rules) if rules.is_empty() => {
            causes.push(Cause::required("spec.matchConstraints.resourceRules", ""));
        }
        Some(rules) => {
            for (i, rule) in rules.iter().enumerate() {
                let at = format!("spec.matchConstraints.resourceRules[{i}]");
                for list in ["apiGroups", "apiVersions", "resources", "operations"] {
                    if strings(rule.get(list)).is_empty() {
                        causes.push(Cause::required(&format!("{at}.{list}"), ""));
                    }
                }
                for op in strings(rule.get("operations")) {
                    match op {
                        "CREATE" | "UPDATE" => {}
                        "DELETE" | "CONNECT" | "*" => causes.push(unsupported(&format!(
                            "{at}.operations: {op} (the double admits CREATE and UPDATE)"
                        ))),
                        other => causes.push(not_supported(
                            &format!("{at}.operations"),
                            other,
                            &["*", "CONNECT", "CREATE", "DELETE", "UPDATE"],
                        )),
                    }
                }
                one_of(
                    &format!("{at}.scope"),
                    rule.get("scope"),
                    &["*", "Cluster", "Namespaced"],
                    causes,
                );
            }
        }
    }
    let validations = spec
        .and_then(|s| s.get("validations"))
        .and_then(Value::as_array);
    if validations.is_none_or(|v| v.is_empty()) {
        causes.push(Cause::required(
            "spec.validations",
            "validations or auditAnnotations must contain at least one item",
        ));
    }
    for (i, v) in validations.into_iter().flatten().enumerate() {
        let at = format!("spec.validations[{i}]");
        check_expression(&format!("{at}.expression"), v.get("expression"), causes);
        if let Some(m) = v.get("messageExpression") {
            check_expression(&format!("{at}.messageExpression"), Some(m), causes);
        }
        one_of(
            &format!("{at}.reason"),
            v.get("reason"),
            &[
                "Forbidden",
                "Invalid",
                "RequestEntityTooLarge",
                "Unauthorized",
            ],
            causes,
        );
    }
    let conditions = spec
        .and_then(|s| s.get("matchConditions"))
        .and_then(Value::as_array);
    let mut names = Vec::new();
    for (i, c) in conditions.into_iter().flatten().enumerate() {
        let at = format!("spec.matchConditions[{i}]");
        match c.get("name").and_then(Value::as_str) {
            None | Some("") => causes.push(Cause::required(&format!("{at}.name"), "")),
            Some(n) if names.contains(&n) => {
                causes.push(Cause::invalid(
                    &format!("{at}.name"),
                    &json!(n),
                    "Duplicate value",
                ));
            }
            Some(n) => names.push(n),
        }
        check_expression(&format!("{at}.expression"), c.get("expression"), causes);
    }
}

/// Validation of a ValidatingAdmissionPolicyBinding, with the double's refusals.
pub fn validate_binding(obj: &Value, causes: &mut Vec<Cause>) {
    if obj
        .pointer("/spec/policyName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        causes.push(Cause::required("spec.policyName", ""));
    }
    for (field, path) in [
        ("spec.paramRef", "/spec/paramRef"),
        ("spec.matchResources", "/spec/matchResources"),
    ] {
        if present(obj.pointer(path)) {
            causes.push(unsupported(field));
        }
    }
    let actions = strings(obj.pointer("/spec/validationActions"));
    if actions.is_empty() {
        causes.push(Cause::required("spec.validationActions", ""));
    }
    for a in actions {
        match a {
            "Deny" => {}
            "Warn" | "Audit" => {
                causes.push(unsupported(&format!("spec.validationActions: {a}")));
            }
            other => causes.push(not_supported(
                "spec.validationActions",
                other,
                &["Audit", "Deny", "Warn"],
            )),
        }
    }
}

/// The defaults kube-apiserver stores on a policy.
pub fn default_policy(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    spec.entry("failurePolicy").or_insert(json!("Fail"));
    if let Some(mc) = spec
        .get_mut("matchConstraints")
        .and_then(Value::as_object_mut)
    {
        mc.entry("matchPolicy").or_insert(json!("Equivalent"));
        mc.entry("namespaceSelector").or_insert(json!({}));
        mc.entry("objectSelector").or_insert(json!({}));
        if let Some(rules) = mc.get_mut("resourceRules").and_then(Value::as_array_mut) {
            for r in rules.iter_mut().filter_map(Value::as_object_mut) {
                r.entry("scope").or_insert(json!("*"));
            }
        }
    }
}

fn listed(list: &[&str], want: &str) -> bool {
    list.iter().any(|v| *v == "*" || *v == want)
}

fn rule_matches(rule: &Value, req: &Request, op: Operation, name: &str) -> bool {
    let res = req.res;
    let resource = match req.sub.as_deref() {
        None => res.plural.to_string(),
        Some(sub) => format!("{}/{sub}", res.plural),
    };
    let resources = strings(rule.get("resources"));
    let resource_ok = resources.iter().any(|r| {
        *r == resource
            || (*r == "*" && req.sub.is_none())
            || *r == "*/*"
            || (req.sub.is_some() && *r == format!("{}/*", res.plural))
    });
    let names = strings(rule.get("resourceNames"));
    let scope_ok = match rule.get("scope").and_then(Value::as_str).unwrap_or("*") {
        "Cluster" => !res.namespaced,
        "Namespaced" => res.namespaced,
        _ => true,
    };
    listed(&strings(rule.get("apiGroups")), res.group)
        && listed(&strings(rule.get("apiVersions")), res.version)
        && listed(&strings(rule.get("operations")), op.name())
        && resource_ok
        && scope_ok
        && (names.is_empty() || names.contains(&name))
}

fn request_value(req: &Request, res: &Resource, op: Operation, name: &str) -> Value {
    json!({
        "kind": {"group": res.group, "version": res.version, "kind": res.kind},
        "resource": {"group": res.group, "version": res.version, "resource": res.plural},
        "subResource": req.sub.clone().unwrap_or_default(),
        "name": name,
        "namespace": req.ns.clone().unwrap_or_default(),
        "operation": op.name(),
        "userInfo": {
            "username": req.user.username,
            "uid": req.user.uid,
            "groups": req.user.groups,
        },
        "dryRun": req.query.get("dryRun").is_some_and(|v| v == "All"),
    })
}

/// What one expression evaluated to.
enum Outcome {
    True,
    False,
    Error(String),
}

fn evaluate(expr: &str, ctx: &Context) -> Outcome {
    let program = match compile(expr) {
        Ok(p) => p,
        Err(e) => return Outcome::Error(e),
    };
    match program.execute(ctx) {
        Ok(CelValue::Bool(true)) => Outcome::True,
        Ok(CelValue::Bool(false)) => Outcome::False,
        Ok(other) => Outcome::Error(format!("expected a bool, got {:?}", other.type_of())),
        Err(e) => Outcome::Error(e.to_string()),
    }
}

fn to_cel(v: &Value) -> Result<CelValue, String> {
    cel::to_value(v).map_err(|e| e.to_string())
}

/// Runs every bound policy that matches this write; the first denial is the answer.
/// Called with the store locked, after the object passed validation.
pub fn admit(
    g: &Inner,
    req: &Request,
    op: Operation,
    object: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    let (Some(policies), Some(bindings)) = (
        crate::resources::find(GROUP, "v1", POLICIES),
        crate::resources::find(GROUP, "v1", BINDINGS),
    ) else {
        return Ok(());
    };
    let bindings = g.list(res_index(bindings), None);
    if bindings.is_empty() {
        return Ok(());
    }
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut ctx: Option<Context> = None;
    for binding in &bindings {
        let binding_name = binding
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let Some(policy_name) = binding.pointer("/spec/policyName").and_then(Value::as_str) else {
            continue;
        };
        // A binding to a policy that does not exist yet enforces nothing (as upstream).
        let Some(policy) = g.get(res_index(policies), "", policy_name) else {
            continue;
        };
        let rules = policy
            .pointer("/spec/matchConstraints/resourceRules")
            .and_then(Value::as_array);
        if !rules
            .into_iter()
            .flatten()
            .any(|r| rule_matches(r, req, op, name))
        {
            continue;
        }
        let ctx = match &mut ctx {
            Some(c) => &*c,
            None => {
                let mut c = Context::default();
                let vars = [
                    ("object", to_cel(object)),
                    ("oldObject", old.map_or(Ok(CelValue::Null), to_cel)),
                    ("request", to_cel(&request_value(req, req.res, op, name))),
                ];
                for (k, v) in vars {
                    let v = v.map_err(|e| {
                        ApiError::internal(format!("admission: converting {k} for CEL: {e}"))
                    })?;
                    c.add_variable_from_value(k, v);
                }
                &*ctx.insert(c)
            }
        };
        let fail = policy
            .pointer("/spec/failurePolicy")
            .and_then(Value::as_str)
            != Some("Ignore");
        let denied = |message: String, reason: Option<&str>| {
            let (code, reason) = match reason.unwrap_or("Invalid") {
                "Unauthorized" => (401, "Unauthorized"),
                "Forbidden" => (403, "Forbidden"),
                "RequestEntityTooLarge" => (413, "RequestEntityTooLarge"),
                _ => (422, "Invalid"),
            };
            ApiError::new(
                code,
                reason,
                format!(
                    "ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}' denied request: {message}"
                ),
            )
        };
        let mut applies = true;
        for c in policy
            .pointer("/spec/matchConditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let expr = c.get("expression").and_then(Value::as_str).unwrap_or("");
            match evaluate(expr, ctx) {
                Outcome::True => {}
                Outcome::False => {
                    applies = false;
                    break;
                }
                Outcome::Error(e) if fail => {
                    return Err(denied(
                        format!("expression '{expr}' resulted in error: {e}"),
                        None,
                    ));
                }
                Outcome::Error(_) => {
                    applies = false;
                    break;
                }
            }
        }
        if !applies {
            continue;
        }
        for v in policy
            .pointer("/spec/validations")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let expr = v.get("expression").and_then(Value::as_str).unwrap_or("");
            let reason = v.get("reason").and_then(Value::as_str);
            match evaluate(expr, ctx) {
                Outcome::True => {}
                Outcome::False => {
                    let message = v
                        .get("messageExpression")
                        .and_then(Value::as_str)
                        .and_then(|m| {
                            compile(m)
                                .ok()?
                                .execute(ctx)
                                .ok()
                                .and_then(|out| match out {
                                    CelValue::String(s) if !s.trim().is_empty() => {
                                        Some(s.to_string())
                                    }
                                    _ => None,
                                })
                        })
                        .or_else(|| {
                            v.get("message")
                                .and_then(Value::as_str)
                                .filter(|m| !m.is_empty())
                                .map(str::to_string)
                        })
                        .unwrap_or_else(|| format!("failed expression: {expr}"));
                    return Err(denied(message, reason));
                }
                Outcome::Error(e) if fail => {
                    return Err(denied(
                        format!("expression '{expr}' resulted in error: {e}"),
                        None,
                    ));
                }
                Outcome::Error(_) => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval_with(expr: &str, object: Value, old: Value, request: Value) -> Outcome {
        let mut c = Context::default();
        c.add_variable_from_value("object", to_cel(&object).unwrap());
        c.add_variable_from_value("oldObject", to_cel(&old).unwrap());
        c.add_variable_from_value("request", to_cel(&request).unwrap());
        evaluate(expr, &c)
    }

    fn truth(expr: &str, object: Value, old: Value, request: Value) -> Option<bool> {
        match eval_with(expr, object, old, request) {
            Outcome::True => Some(true),
            Outcome::False => Some(false),
            Outcome::Error(_) => None,
        }
    }

    #[test]
    fn macros_and_the_three_variables_compile_other_variables_do_not() {
        for ok in [
            "request.userInfo.groups.exists(g, g == 'x')",
            "object.spec.items.all(i, i.name != '')",
            "has(object.metadata.annotations) && 'a' in object.metadata.annotations",
            "oldObject == null || oldObject.spec.x == object.spec.x",
        ] {
            assert!(compile(ok).is_ok(), "{ok}: {:?}", compile(ok).err());
        }
        for (bad, why) in [
            (
                "authorizer.group('').resource('x').check('get').allowed()",
                "authorizer",
            ),
            ("namespaceObject.metadata.name == 'x'", "namespaceObject"),
            ("params.x == 1", "params"),
            ("variables.foo", "variables"),
            ("object.spec.x ==", "compilation failed"),
        ] {
            let e = compile(bad).err().unwrap_or_default();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn expressions_see_object_old_object_and_request() {
        let req = json!({"userInfo": {"username": "system:bootstrap:abc", "groups": ["g1", "g2"]}});
        let obj =
            json!({"metadata": {"annotations": {"a": "1"}}, "spec": {"holderIdentity": "me"}});
        // `None`: an evaluation error (a missing field, a non-bool result), which the
        // failure policy decides, never read as false.
        for (expr, want) in [
            ("request.userInfo.groups.exists(g, g == 'g2')", Some(true)),
            ("request.userInfo.groups.exists(g, g == 'g3')", Some(false)),
            ("'a' in object.metadata.annotations", Some(true)),
            ("has(object.spec.renewTime)", Some(false)),
            ("oldObject == null", Some(true)),
            (
                "oldObject != null && oldObject.spec.holderIdentity == 'x'",
                Some(false),
            ),
            ("object.spec.renewTime == 'x'", None),
            ("object.spec.holderIdentity", None),
        ] {
            assert_eq!(
                truth(expr, obj.clone(), Value::Null, req.clone()),
                want,
                "{expr}"
            );
        }
    }

    /// The strategy dispatches to this module for these two kinds, and only for them.
    #[test]
    fn the_strategy_validates_and_defaults_policies_and_bindings_only() {
        use crate::resources::find;
        use crate::strategy;
        let policies = find(GROUP, "v1", POLICIES).unwrap();
        let bindings = find(GROUP, "v1", BINDINGS).unwrap();
        let leases = find("coordination.k8s.io", "v1", "leases").unwrap();
        let empty = json!({"metadata": {"name": "x"}, "spec": {}});
        let fields = |res, obj: &Value| -> Vec<String> {
            strategy::validate(res, obj)
                .into_iter()
                .map(|c| c.field)
                .collect()
        };
        assert!(fields(policies, &empty).contains(&"spec.validations".to_string()));
        assert!(fields(bindings, &empty).contains(&"spec.policyName".to_string()));
        assert!(
            fields(leases, &empty).is_empty(),
            "a Lease is not judged as a policy"
        );

        let spec = json!({"metadata": {"name": "x"},
            "spec": {"matchConstraints": {"resourceRules": [{"resources": ["leases"]}]}}});
        let mut created = spec.clone();
        strategy::prepare_create(policies, &mut created);
        assert_eq!(created["spec"]["failurePolicy"], "Fail");
        assert_eq!(
            created["spec"]["matchConstraints"]["matchPolicy"],
            "Equivalent"
        );
        assert_eq!(
            created["spec"]["matchConstraints"]["resourceRules"][0]["scope"],
            "*"
        );
        let mut updated = spec.clone();
        strategy::prepare_update(policies, &mut updated, &created);
        assert_eq!(updated["spec"]["failurePolicy"], "Fail");
        // Other kinds get no policy defaults.
        let mut lease = spec.clone();
        strategy::prepare_create(leases, &mut lease);
        assert!(lease["spec"].get("failurePolicy").is_none(), "{lease}");
        let mut lease_update = spec;
        strategy::prepare_update(leases, &mut lease_update, &lease);
        assert!(
            lease_update["spec"].get("failurePolicy").is_none(),
            "{lease_update}"
        );
    }

    fn rule(ops: &[&str], resources: &[&str], names: &[&str]) -> Value {
        json!({"apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"], "operations": ops,
               "resources": resources, "resourceNames": names})
    }

    fn lease_request(sub: Option<&str>) -> Request {
        Request {
            res: crate::resources::find("coordination.k8s.io", "v1", "leases").unwrap(),
            sub: sub.map(str::to_string),
            ns: Some("kube-system".into()),
            name: Some("fence".into()),
            query: Default::default(),
            body: Default::default(),
            content_type: String::new(),
            user: crate::auth::UserInfo::new("u", &["g"]),
            accept: String::new(),
        }
    }

    #[test]
    fn rules_match_group_version_operation_resource_subresource_and_name() {
        let main = lease_request(None);
        let status = lease_request(Some("status"));
        let up = Operation::Update;
        // (operations, resources, names, subresource request?, matches)
        type Case<'a> = (&'a [&'a str], &'a [&'a str], &'a [&'a str], bool, bool);
        let cases: &[Case] = &[
            (&["UPDATE"], &["leases"], &[], false, true),
            (&["CREATE"], &["leases"], &[], false, false),
            (&["UPDATE"], &["leases"], &["fence"], false, true),
            (&["UPDATE"], &["leases"], &["other"], false, false),
            (&["UPDATE"], &["pods"], &[], false, false),
            // `*` is every resource but no subresource; `*/*` and `leases/*` take those too.
            (&["UPDATE"], &["*"], &[], false, true),
            (&["UPDATE"], &["*"], &[], true, false),
            (&["UPDATE"], &["leases"], &[], true, false),
            (&["UPDATE"], &["*/*"], &[], true, true),
            (&["UPDATE"], &["leases/*"], &[], true, true),
            (&["UPDATE"], &["leases/status"], &[], true, true),
        ];
        for (ops, resources, names, sub, want) in cases {
            let req = if *sub { &status } else { &main };
            assert_eq!(
                rule_matches(&rule(ops, resources, names), req, up, "fence"),
                *want,
                "{ops:?} {resources:?} {names:?} subresource: {sub}"
            );
        }
        let mut other_group = rule(&["UPDATE"], &["leases"], &[]);
        other_group["apiGroups"] = json!(["apps"]);
        assert!(!rule_matches(&other_group, &main, up, "fence"));
        let mut cluster = rule(&["UPDATE"], &["leases"], &[]);
        cluster["scope"] = json!("Cluster");
        assert!(!rule_matches(&cluster, &main, up, "fence"));
    }

    #[test]
    fn what_the_double_cannot_enforce_is_refused_when_written() {
        let base = json!({"metadata": {"name": "p"}, "spec": {
            "matchConstraints": {"resourceRules": [rule(&["CREATE"], &["leases"], &[])]},
            "validations": [{"expression": "true"}]}});
        let mut causes = Vec::new();
        validate_policy(&base, &mut causes);
        assert!(causes.is_empty(), "{causes:?}");
        for (path, value, field) in [
            (
                "/spec/paramKind",
                json!({"kind": "ConfigMap"}),
                "spec.paramKind",
            ),
            (
                "/spec/variables",
                json!([{"name": "a", "expression": "1"}]),
                "spec.variables",
            ),
            (
                "/spec/auditAnnotations",
                json!([{"key": "a", "valueExpression": "'x'"}]),
                "spec.auditAnnotations",
            ),
            (
                "/spec/matchConstraints/objectSelector",
                json!({"matchLabels": {"a": "b"}}),
                "spec.matchConstraints.objectSelector",
            ),
            (
                "/spec/matchConstraints/resourceRules/0/operations",
                json!(["DELETE"]),
                "operations: DELETE",
            ),
        ] {
            let mut p = base.clone();
            let (parent, key) = path.rsplit_once('/').unwrap();
            p.pointer_mut(parent).unwrap()[key] = value.clone();
            let mut causes = Vec::new();
            validate_policy(&p, &mut causes);
            assert!(
                causes
                    .iter()
                    .any(|c| c.message.contains(field) && c.message.contains("not implemented")),
                "{path}: {causes:?}"
            );
        }
        let mut no_validations = base.clone();
        no_validations["spec"]["validations"] = json!([]);
        let mut causes = Vec::new();
        validate_policy(&no_validations, &mut causes);
        assert!(
            causes.iter().any(|c| c.field == "spec.validations"),
            "{causes:?}"
        );
        let mut causes = Vec::new();
        validate_binding(
            &json!({"spec": {"policyName": "p", "validationActions": ["Warn"]}}),
            &mut causes,
        );
        assert!(
            causes.iter().any(|c| c.message.contains("Warn")),
            "{causes:?}"
        );
        let mut causes = Vec::new();
        validate_binding(&json!({"spec": {"policyName": "p"}}), &mut causes);
        assert!(
            causes.iter().any(|c| c.field == "spec.validationActions"),
            "{causes:?}"
        );
        let mut causes = Vec::new();
        validate_binding(
            &json!({"spec": {"policyName": "p", "validationActions": ["Deny"]}}),
            &mut causes,
        );
        assert!(causes.is_empty(), "{causes:?}");
    }

    /// A store holding one policy (`spec` as given, bound with Deny) and `extra` policies
    /// each with their own binding.
    fn store_with(policies: &[(&str, Value)]) -> crate::store::Store {
        let store = crate::store::Store::new(100);
        {
            let mut g = store.lock();
            let p_res = res_index(crate::resources::find(GROUP, "v1", POLICIES).unwrap());
            let b_res = res_index(crate::resources::find(GROUP, "v1", BINDINGS).unwrap());
            for (name, spec) in policies {
                let mut policy = json!({"metadata": {"name": name}, "spec": spec});
                default_policy(&mut policy);
                g.put(p_res, policy);
                g.put(
                    b_res,
                    json!({"metadata": {"name": format!("{name}-binding")},
                           "spec": {"policyName": name, "validationActions": ["Deny"]}}),
                );
            }
        }
        store
    }

    /// A policy on Lease writes (CREATE and UPDATE) with these validations.
    fn lease_policy(validations: Value) -> Value {
        json!({"matchConstraints": {"resourceRules": [rule(&["CREATE", "UPDATE"], &["leases"], &[])]},
               "validations": validations})
    }

    fn lease(holder: &str) -> Value {
        json!({"metadata": {"name": "fence", "namespace": "kube-system"},
               "spec": {"holderIdentity": holder}})
    }

    fn admit_lease(
        store: &crate::store::Store,
        op: Operation,
        object: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        admit(&store.lock(), &lease_request(None), op, object, old)
    }

    #[test]
    fn a_matching_policy_denies_naming_policy_and_binding_and_others_do_not() {
        let deny_all = lease_policy(json!([{"expression": "false", "message": "no leases"}]));
        let store = store_with(&[("leases-off", deny_all.clone())]);
        let err = admit_lease(&store, Operation::Create, &lease("a"), None).unwrap_err();
        assert_eq!((err.code, err.reason), (422, "Invalid"));
        assert_eq!(
            err.message,
            "ValidatingAdmissionPolicy 'leases-off' with binding 'leases-off-binding' denied request: no leases"
        );
        // The same policy on pods does not touch a Lease.
        let mut pods_only = deny_all;
        pods_only["matchConstraints"]["resourceRules"] = json!([rule(&["CREATE"], &["pods"], &[])]);
        let store = store_with(&[("pods-off", pods_only)]);
        assert!(admit_lease(&store, Operation::Create, &lease("a"), None).is_ok());
        // A passing policy lets it through.
        let store = store_with(&[("ok", lease_policy(json!([{"expression": "true"}])))]);
        assert!(admit_lease(&store, Operation::Update, &lease("a"), Some(&lease("b"))).is_ok());
    }

    #[test]
    fn expressions_see_the_request_the_object_and_the_old_object() {
        let policy = lease_policy(json!([
            {"expression": "request.operation == 'UPDATE' || oldObject == null", "message": "op"},
            {"expression": "request.userInfo.username == 'u' && 'g' in request.userInfo.groups", "message": "user"},
            {"expression": "request.namespace == 'kube-system' && request.name == 'fence'", "message": "where"},
            {"expression": "request.resource.resource == 'leases' && request.kind.kind == 'Lease'", "message": "what"},
            {"expression": "oldObject == null || object.spec.holderIdentity != oldObject.spec.holderIdentity", "message": "same holder"},
        ]));
        let store = store_with(&[("p", policy)]);
        assert!(admit_lease(&store, Operation::Create, &lease("a"), None).is_ok());
        assert!(admit_lease(&store, Operation::Update, &lease("a"), Some(&lease("b"))).is_ok());
        let err =
            admit_lease(&store, Operation::Update, &lease("a"), Some(&lease("a"))).unwrap_err();
        assert!(err.message.ends_with(": same holder"), "{}", err.message);
    }

    #[test]
    fn the_validation_reason_chooses_the_status_code() {
        for (reason, code, want) in [
            ("Unauthorized", 401, "Unauthorized"),
            ("Forbidden", 403, "Forbidden"),
            ("RequestEntityTooLarge", 413, "RequestEntityTooLarge"),
            ("Invalid", 422, "Invalid"),
        ] {
            let store = store_with(&[(
                "p",
                lease_policy(json!([{"expression": "false", "reason": reason}])),
            )]);
            let err = admit_lease(&store, Operation::Create, &lease("a"), None).unwrap_err();
            assert_eq!((err.code, err.reason), (code, want), "{reason}");
        }
    }

    #[test]
    fn the_message_comes_from_message_expression_then_message_then_the_expression() {
        let deny = |v: Value| {
            let store = store_with(&[("p", lease_policy(json!([v])))]);
            let err = admit_lease(&store, Operation::Create, &lease("a"), None).unwrap_err();
            err.message
                .rsplit_once("denied request: ")
                .map(|(_, m)| m.to_string())
                .unwrap()
        };
        assert_eq!(
            deny(
                json!({"expression": "false", "messageExpression": "'held by ' + object.spec.holderIdentity", "message": "m"})
            ),
            "held by a"
        );
        // A blank messageExpression result falls back to the message.
        assert_eq!(
            deny(json!({"expression": "false", "messageExpression": "'  '", "message": "m"})),
            "m"
        );
        // An empty message falls back to naming the expression.
        assert_eq!(
            deny(json!({"expression": "1 == 2", "message": ""})),
            "failed expression: 1 == 2"
        );
    }

    #[test]
    fn the_failure_policy_decides_what_an_expression_error_does() {
        // `object.spec.renewTime` is missing: evaluating it is an error, never false.
        let erroring = json!([{"expression": "object.spec.renewTime == 'x'"}]);
        let condition_erroring =
            json!([{"name": "c", "expression": "object.spec.renewTime == 'x'"}]);
        for (failure, denied) in [("Fail", true), ("Ignore", false)] {
            let mut p = lease_policy(erroring.clone());
            p["failurePolicy"] = json!(failure);
            let store = store_with(&[("p", p)]);
            let r = admit_lease(&store, Operation::Create, &lease("a"), None);
            assert_eq!(
                r.is_err(),
                denied,
                "validation error under {failure}: {r:?}"
            );
            if let Err(e) = r {
                assert!(e.message.contains("resulted in error"), "{}", e.message);
            }
            // A match condition that errors: denied under Fail, the policy skipped under
            // Ignore (its failing validation then never runs).
            let mut p = lease_policy(json!([{"expression": "false"}]));
            p["failurePolicy"] = json!(failure);
            p["matchConditions"] = condition_erroring.clone();
            let store = store_with(&[("p", p)]);
            let r = admit_lease(&store, Operation::Create, &lease("a"), None);
            assert_eq!(r.is_err(), denied, "condition error under {failure}: {r:?}");
            if let Err(e) = r {
                assert!(e.message.contains("resulted in error"), "{}", e.message);
            }
        }
    }

    #[test]
    fn a_false_match_condition_skips_the_policy_and_a_true_one_applies_it() {
        for (condition, denied) in [("object.spec.holderIdentity == 'x'", false), ("true", true)] {
            let mut p = lease_policy(json!([{"expression": "false"}]));
            p["matchConditions"] = json!([{"name": "c", "expression": condition}]);
            let store = store_with(&[("p", p)]);
            let r = admit_lease(&store, Operation::Create, &lease("a"), None);
            assert_eq!(r.is_err(), denied, "{condition}: {r:?}");
        }
    }

    #[test]
    fn a_namespaced_scope_does_not_match_a_cluster_scoped_resource() {
        let nodes = crate::resources::find("", "v1", "nodes").unwrap();
        let mut req = lease_request(None);
        req.res = nodes;
        req.ns = None;
        let mut r = json!({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                           "resources": ["nodes"]});
        for (scope, want) in [("Namespaced", false), ("Cluster", true), ("*", true)] {
            r["scope"] = json!(scope);
            assert_eq!(
                rule_matches(&r, &req, Operation::Create, "n1"),
                want,
                "{scope}"
            );
        }
    }

    #[test]
    fn policy_validation_catches_bad_scopes_reasons_expressions_rules_and_duplicates() {
        let base = json!({"metadata": {"name": "p"}, "spec": lease_policy(json!([{"expression": "true"}]))});
        let fields = |edit: &dyn Fn(&mut Value)| -> Vec<String> {
            let mut p = base.clone();
            edit(&mut p);
            let mut causes = Vec::new();
            validate_policy(&p, &mut causes);
            causes.into_iter().map(|c| c.field).collect()
        };
        assert!(fields(&|_| {}).is_empty());
        let scope = "spec.matchConstraints.resourceRules[0].scope";
        assert_eq!(
            fields(
                &|p| p["spec"]["matchConstraints"]["resourceRules"][0]["scope"] =
                    json!("Everywhere")
            ),
            [scope]
        );
        assert!(
            fields(
                &|p| p["spec"]["matchConstraints"]["resourceRules"][0]["scope"] =
                    json!("Namespaced")
            )
            .is_empty()
        );
        assert_eq!(
            fields(&|p| p["spec"]["validations"][0]["reason"] = json!("Teapot")),
            ["spec.validations[0].reason"]
        );
        assert_eq!(
            fields(&|p| p["spec"]["validations"][0]["expression"] = json!("")),
            ["spec.validations[0].expression"]
        );
        assert_eq!(
            fields(&|p| p["spec"]["validations"][0]["expression"] = json!("1 +")),
            ["spec.validations[0].expression"]
        );
        assert_eq!(
            fields(&|p| p["spec"]["matchConstraints"]["resourceRules"] = json!([])),
            ["spec.matchConstraints.resourceRules"]
        );
        let twice =
            json!([{"name": "a", "expression": "true"}, {"name": "a", "expression": "true"}]);
        assert_eq!(
            fields(&|p| p["spec"]["matchConditions"] = twice.clone()),
            ["spec.matchConditions[1].name"]
        );
        let two = json!([{"name": "a", "expression": "true"}, {"name": "b", "expression": "true"}]);
        assert!(fields(&|p| p["spec"]["matchConditions"] = two.clone()).is_empty());
    }

    #[test]
    fn variables_inside_map_and_message_literals_are_found() {
        assert!(compile("{'k': object.spec.x}.k == 1").is_ok());
        let e = compile("{'k': params.x}.k == 1").err().unwrap_or_default();
        assert!(e.contains("params"), "{e}");
        let e = compile("{params.x: 1}.size() == 1")
            .err()
            .unwrap_or_default();
        assert!(e.contains("params"), "{e}");
    }
}
