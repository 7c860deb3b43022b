//! Resource handlers: create, get, list, update, patch, delete, deletecollection and
//! watch over the store, applying the strategies as kube-apiserver's generic registry does.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use rand::Rng;
use serde_json::{Value, json};

use crate::auth;
use crate::body::{Body, full};
use crate::convert::{to_served, to_storage};
use crate::patch::{self, PatchError, PatchKind};
use crate::resources::{RESOURCES, Resource, find};
use crate::selector::{FieldSelector, LabelSelector};
use crate::server::State;
use crate::status::ApiError;
use crate::store::{Inner, res_index};
use crate::strategy::{self, DeleteOutcome};
use crate::watch::{self, Start, WatchSpec};

/// The optimistic-lock message (`staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go`).
pub const OPTIMISTIC_LOCK: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

/// A query flag as Go's `strconv.ParseBool` reads it (the python client sends `True`).
pub fn go_bool(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// A resource request, parsed from the URL.
#[derive(Debug, Clone)]
pub struct Request {
    /// The resource.
    pub res: &'static Resource,
    /// Subresource (`status`).
    pub sub: Option<String>,
    /// Namespace from the path.
    pub ns: Option<String>,
    /// Name from the path.
    pub name: Option<String>,
    /// Query parameters (last value wins).
    pub query: HashMap<String, String>,
    /// The body.
    pub body: Bytes,
    /// Content-Type of the body.
    pub content_type: String,
    /// The authenticated caller.
    pub user: auth::UserInfo,
    /// The Accept header (Tables for kubectl).
    pub accept: String,
}

impl Request {
    fn table(&self) -> Option<String> {
        crate::table::wants_table(&self.accept)
            .then(|| self.query.get("includeObject").cloned().unwrap_or_default())
    }
}

type Reply = Result<Response<Body>, ApiError>;

/// A JSON response carrying `Warning` headers.
fn warned(code: u16, v: &Value, warnings: &[String]) -> Response<Body> {
    let mut r = json_response(code, v);
    for w in warnings {
        if let Ok(h) = http::HeaderValue::from_str(&crate::typed::warning_header(w)) {
            r.headers_mut().append(header::WARNING, h);
        }
    }
    r
}

fn field_validation(req: &Request) -> Result<crate::typed::FieldValidation, ApiError> {
    crate::typed::FieldValidation::parse(req.query.get("fieldValidation").map(String::as_str))
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    bytes_response(code, serde_json::to_vec(v).unwrap_or_default())
}

fn bytes_response(code: u16, b: Vec<u8>) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::OK))
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(b))
        .expect("static response parts are valid")
}

fn now_secs() -> i64 {
    crate::times::now_secs()
}

fn meta_str<'a>(v: &'a Value, field: &str) -> Option<&'a str> {
    v.get("metadata")?.get(field)?.as_str()
}

fn new_uid() -> String {
    let mut b = [0u8; 16];
    rand::rng().fill(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The random suffix of generateName (`staging/src/k8s.io/apimachinery/pkg/util/rand`):
/// 5 characters from an alphabet without vowels or look-alikes.
pub fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut r = rand::rng();
    (0..5)
        .map(|_| ALPHABET[r.random_range(0..ALPHABET.len())] as char)
        .collect()
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request(
            "the request body is empty; send a JSON object",
        ));
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body of the request could not be decoded as JSON: {e}"
        ))
    })?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    if v.get("metadata")
        .is_some_and(|m| !m.is_object() && !m.is_null())
    {
        return Err(ApiError::bad_request("metadata must be a JSON object"));
    }
    Ok(v)
}

/// Checks apiVersion/kind of a body and fills them in when absent.
fn check_type(res: &Resource, obj: &mut Value) -> Result<(), ApiError> {
    let want_av = res.api_version();
    match obj.get("apiVersion").and_then(Value::as_str) {
        Some(av) if av != want_av => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({want_av})"
            )));
        }
        _ => obj["apiVersion"] = json!(want_av),
    }
    match obj.get("kind").and_then(Value::as_str) {
        Some(k) if k != res.kind => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                res.kind
            )));
        }
        _ => obj["kind"] = json!(res.kind),
    }
    if obj.get("metadata").is_none_or(Value::is_null) {
        obj["metadata"] = json!({});
    }
    Ok(())
}

fn check_namespace(req: &Request, obj: &mut Value) -> Result<(), ApiError> {
    if req.res.namespaced {
        let path_ns = req.ns.clone().unwrap_or_default();
        match meta_str(obj, "namespace") {
            Some(ns) if !ns.is_empty() && ns != path_ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => obj["metadata"]["namespace"] = json!(path_ns),
        }
    } else if let Some(m) = obj["metadata"].as_object_mut() {
        m.remove("namespace");
    }
    Ok(())
}

fn namespaces() -> &'static Resource {
    find("", "v1", "namespaces").expect("namespaces are served")
}

fn namespace_usable(g: &Inner, ns: &str) -> Result<(), ApiError> {
    let nsres = namespaces();
    match g.get(res_index(nsres), "", ns) {
        None => Err(ApiError::not_found(nsres, ns)),
        Some(n) if n.pointer("/metadata/deletionTimestamp").is_some() => Err(ApiError {
            details: Some(json!({"name": ns, "kind": "namespaces", "causes": [{
                "reason": "NamespaceTerminating",
                "message": format!("namespace {ns} is being terminated"),
                "field": "metadata.namespace"}]})),
            ..ApiError::new(
                403,
                "Forbidden",
                format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                ),
            )
        }),
        Some(_) => Ok(()),
    }
}

fn is_dry_run(req: &Request) -> bool {
    req.query.get("dryRun").is_some_and(|v| v == "All")
}

/// POST.
pub fn create(st: &State, req: &Request) -> Reply {
    let mut obj = parse_body(&req.body)?;
    check_type(req.res, &mut obj)?;
    if req.res.create_only {
        return review(st, req, obj);
    }
    strategy::normalize_times(&mut obj).map_err(ApiError::bad_request)?;
    let (mut obj, warnings) = crate::typed::decode(req.res, obj, field_validation(req)?)?;
    check_namespace(req, &mut obj)?;
    let meta = &mut obj["metadata"];
    if meta_str(&json!({"metadata": meta.clone()}), "name").is_none_or(str::is_empty)
        && let Some(prefix) = meta.get("generateName").and_then(Value::as_str)
        && !prefix.is_empty()
    {
        let prefix: String = prefix.chars().take(58).collect();
        meta["name"] = json!(format!("{prefix}{}", name_suffix()));
    }
    if meta
        .get("resourceVersion")
        .and_then(Value::as_str)
        .is_some_and(|rv| !rv.is_empty())
    {
        return Err(ApiError::internal(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    let name = meta_str(&obj, "name").unwrap_or("").to_string();
    let mut causes = strategy::validate(req.res, &obj);
    if crate::convert::is_event(req.res) {
        let stored = to_storage(req.res, obj.clone());
        causes.extend(strategy::validate_event(req.res, &stored, None));
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(req.res, &name, &causes));
    }
    let m = obj["metadata"].as_object_mut().expect("checked above");
    for f in [
        "managedFields",
        "selfLink",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ] {
        m.remove(f);
    }
    m.insert("uid".into(), json!(new_uid()));
    m.insert(
        "creationTimestamp".into(),
        json!(strategy::rfc3339(now_secs())),
    );
    strategy::prepare_create(req.res, &mut obj);
    let idx = res_index(req.res);
    let ns = req.ns.clone().unwrap_or_default();
    let stored = {
        let mut g = st.store.lock();
        if req.res.namespaced {
            namespace_usable(&g, &ns)?;
        }
        if g.get(idx, if req.res.namespaced { &ns } else { "" }, &name)
            .is_some()
        {
            return Err(ApiError::already_exists(req.res, &name));
        }
        crate::admission::admit(&g, req, crate::admission::Operation::Create, &obj, None)?;
        if is_dry_run(req) {
            Arc::new(obj)
        } else {
            let owned = obj
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty());
            let s = g.put(idx, to_storage(req.res, obj));
            drop(g);
            st.notify();
            if owned {
                // The collector sees new dependents at once (its informers would).
                st.kick_gc();
            }
            to_served(req.res, s)
        }
    };
    Ok(warned(201, &stored, &warnings))
}

fn review(st: &State, req: &Request, mut obj: Value) -> Reply {
    let spec = obj.get("spec").cloned().unwrap_or(json!({}));
    let status = match req.res.plural {
        "tokenreviews" => {
            let token = spec.get("token").and_then(Value::as_str).unwrap_or("");
            let user = st.authenticate_token(token);
            auth::token_review_status(user.as_ref())
        }
        _ => {
            let (mut user, attrs) = auth::access_review_request(&spec);
            if req.res.plural == "selfsubjectaccessreviews" {
                // Asks about the caller, whoever the spec names.
                user = req.user.clone();
            }
            let allowed = st.policy.authorize(&user, &attrs);
            if allowed {
                json!({"allowed": true, "reason": "allowed by the testkube policy"})
            } else {
                json!({"allowed": false, "reason": auth::forbidden_message(&user, &attrs)})
            }
        }
    };
    obj["status"] = status;
    if obj["metadata"].is_null() {
        obj["metadata"] = json!({});
    }
    obj["metadata"]["creationTimestamp"] = Value::Null;
    Ok(json_response(201, &obj))
}

fn scope(req: &Request) -> (String, String) {
    (
        if req.res.namespaced {
            req.ns.clone().unwrap_or_default()
        } else {
            String::new()
        },
        req.name.clone().unwrap_or_default(),
    )
}

/// GET one object (or its status subresource).
pub fn get(st: &State, req: &Request) -> Reply {
    let (ns, name) = scope(req);
    let obj = st
        .store
        .lock()
        .get(res_index(req.res), &ns, &name)
        .map(|o| to_served(req.res, o));
    match (obj, req.table()) {
        (Some(o), Some(include)) => {
            let meta = json!({"resourceVersion": o.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null)});
            Ok(json_response(
                200,
                &crate::table::table(req.res, &[&*o], meta, &include, true, now_secs()),
            ))
        }
        (Some(o), None) => Ok(json_response(200, &o)),
        (None, _) => Err(ApiError::not_found(req.res, &name)),
    }
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse::<u64>().map_err(|_| {
        ApiError::bad_request(format!(
            "resourceVersion: Invalid value: {s:?}: not a valid resource version"
        ))
    })
}

fn selectors(req: &Request) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(req.query.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let fields = FieldSelector::parse_for(
        req.query.get("fieldSelector").map_or("", String::as_str),
        req.res,
    )
    .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok((labels, fields))
}

fn too_large_rv(requested: u64, current: u64) -> ApiError {
    ApiError {
        details: Some(json!({"causes": [{"reason": "ResourceVersionTooLarge",
            "message": "Too large resource version"}], "retryAfterSeconds": 1})),
        ..ApiError::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        )
    }
}

/// A continue token: the list's resourceVersion and the last key served.
fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(json!({"rv": rv, "ns": ns, "name": name}).to_string())
}

fn decode_continue(token: &str) -> Result<(u64, String, String), ApiError> {
    use base64::Engine;
    let bad = || {
        ApiError::bad_request(
            "continue key is not valid: the token is malformed; restart the list without it",
        )
    };
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    Ok((
        v["rv"].as_u64().ok_or_else(bad)?,
        v["ns"].as_str().ok_or_else(bad)?.to_string(),
        v["name"].as_str().ok_or_else(bad)?.to_string(),
    ))
}

/// GET a collection. Paged lists (`limit`/`continue`) read later pages from the current
/// state rather than a snapshot, and report the first page's resourceVersion on every
/// page, so a watch started from it misses nothing.
pub fn list(st: &State, req: &Request) -> Reply {
    let (labels, fields) = selectors(req)?;
    let idx = res_index(req.res);
    let ns = req.ns.as_deref().filter(|_| req.res.namespaced);
    let limit = match req.query.get("limit") {
        Some(l) => l
            .parse::<i64>()
            .map_err(|_| ApiError::bad_request(format!("limit: Invalid value: {l:?}")))?,
        None => 0,
    };
    let rv_param = req.query.get("resourceVersion").filter(|s| !s.is_empty());
    let exact = req.query.get("resourceVersionMatch").map(String::as_str) == Some("Exact");
    let cont = req.query.get("continue").filter(|s| !s.is_empty());
    let g = st.store.lock();
    let (items, list_rv) = if let Some(token) = cont {
        let (rv, tns, tname) = decode_continue(token)?;
        if rv < g.floor_of(idx) {
            return Err(ApiError::expired(
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
            ));
        }
        (g.list_after(idx, ns, &(tns, tname)), rv)
    } else if let Some(rvs) = rv_param.filter(|s| s.as_str() != "0") {
        let rv = parse_rv(rvs)?;
        if rv > g.rv() {
            return Err(too_large_rv(rv, g.rv()));
        }
        if exact {
            let snap = g
                .snapshot_at(idx, ns, rv)
                .map_err(|t| ApiError::expired(t.message()))?;
            (snap, rv)
        } else {
            (g.list(idx, ns), g.rv())
        }
    } else {
        (g.list(idx, ns), g.rv())
    };
    drop(g);
    let field_name = fields.required("metadata.name").map(String::from);
    // Selection runs on the stored form (selector labels are converted to its fields).
    let mut selected = items
        .into_iter()
        .filter(|o| {
            field_name
                .as_deref()
                .is_none_or(|n| meta_str(o, "name") == Some(n))
        })
        .filter(|o| labels.matches(o) && fields.matches(o));
    let mut out: Vec<Arc<Value>> = Vec::new();
    let mut next = None;
    if limit > 0 {
        for o in selected.by_ref() {
            out.push(o);
            if out.len() as i64 == limit {
                break;
            }
        }
        let remaining = selected.count();
        if remaining > 0
            && let Some(last) = out.last()
        {
            next = Some((
                encode_continue(
                    list_rv,
                    meta_str(last, "namespace").unwrap_or(""),
                    meta_str(last, "name").unwrap_or(""),
                ),
                remaining,
            ));
        }
    } else {
        out.extend(selected);
    }
    let out: Vec<Arc<Value>> = out.into_iter().map(|o| to_served(req.res, o)).collect();
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if let Some((token, remaining)) = next {
        meta["continue"] = json!(token);
        meta["remainingItemCount"] = json!(remaining);
    }
    if let Some(include) = req.table() {
        let objs: Vec<&Value> = out.iter().map(|o| &**o).collect();
        return Ok(json_response(
            200,
            &crate::table::table(req.res, &objs, meta, &include, true, now_secs()),
        ));
    }
    let mut body = Vec::with_capacity(out.len() * 512 + 256);
    body.extend_from_slice(
        format!(
            "{{\"kind\":\"{}List\",\"apiVersion\":\"{}\",\"metadata\":{},\"items\":[",
            req.res.kind,
            req.res.api_version(),
            meta
        )
        .as_bytes(),
    );
    for (i, o) in out.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&serde_json::to_vec(&**o).unwrap_or_default());
    }
    body.extend_from_slice(b"]}");
    Ok(bytes_response(200, body))
}

/// GET with `watch=true`.
pub fn watch(st: &State, req: &Request, drop_after_backlog: bool) -> Reply {
    let (labels, fields) = selectors(req)?;
    let send_initial = req
        .query
        .get("sendInitialEvents")
        .is_some_and(|v| go_bool(v));
    let start = match req.query.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => Start::Current,
        // Streaming lists: the state as of now (at least that version), then changes.
        Some(_) if send_initial => Start::Current,
        Some(rv) => {
            let rv = parse_rv(rv)?;
            let current = st.store.lock().rv();
            if rv > current {
                // The watch cache waits briefly for a fresher store, then answers this;
                // a single store never gets there, so it answers at once.
                return Err(too_large_rv(rv, current));
            }
            Start::From(rv)
        }
    };
    let bookmarks = req
        .query
        .get("allowWatchBookmarks")
        .is_some_and(|v| go_bool(v));
    let timeout = req
        .query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .map(Duration::from_secs);
    let ns = req.ns.clone().filter(|_| req.res.namespaced);
    // A watch on one object (`/pods/x?watch=true`) is a watch with a name selector.
    let mut fields = fields;
    if let Some(name) = &req.name {
        fields.0.push(crate::selector::FieldReq {
            field: "metadata.name".into(),
            value: name.clone(),
            negate: false,
        });
    }
    let spec = WatchSpec {
        res: res_index(req.res),
        served: req.res,
        namespace: ns.filter(|n| !n.is_empty()),
        labels,
        fields,
        start,
        bookmarks,
        bookmark_interval: st.bookmark_interval,
        timeout,
        drop_after_backlog,
        table: req.table(),
        initial_events_end: send_initial && bookmarks,
    };
    let body = watch::start(st.store.clone(), spec);
    Ok(Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::TRANSFER_ENCODING, "chunked")
        .body(body)
        .expect("static response parts are valid"))
}

fn check_preconditions(
    res: &Resource,
    name: &str,
    existing: &Value,
    uid: Option<&str>,
    rv: Option<&str>,
) -> Result<(), ApiError> {
    if let Some(uid) = uid.filter(|u| !u.is_empty()) {
        let have = meta_str(existing, "uid").unwrap_or("");
        if have != uid {
            return Err(ApiError::conflict(
                res,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"
                ),
            ));
        }
    }
    if let Some(rv) = rv.filter(|r| !r.is_empty()) {
        let have = meta_str(existing, "resourceVersion").unwrap_or("");
        if have != rv {
            return Err(ApiError::conflict(
                res,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {have}"
                ),
            ));
        }
    }
    Ok(())
}

/// The shared tail of update and patch: validate `new` against the stored object and
/// store it. `existing` and `new` are in the form `req.res` serves, and so is the answer. Returns the stored object, or the object as it was when it was removed
/// because its last finalizer went.
fn write_update(
    req: &Request,
    g: &mut Inner,
    new: Value,
    existing: &Arc<Value>,
) -> Result<(u16, Arc<Value>, Vec<String>), ApiError> {
    let (ns, name) = scope(req);
    let mut new = new;
    check_type(req.res, &mut new)?;
    strategy::normalize_times(&mut new).map_err(ApiError::bad_request)?;
    let (mut new, warnings) = crate::typed::decode(req.res, new, field_validation(req)?)?;
    if let Some(n) = meta_str(&new, "name")
        && n != name
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        )));
    }
    new["metadata"]["name"] = json!(name);
    check_namespace(req, &mut new)?;
    // The uid in the body is a precondition, the resourceVersion an optimistic lock.
    check_preconditions(req.res, &name, existing, meta_str(&new, "uid"), None)?;
    if let Some(rv) = meta_str(&new, "resourceVersion").filter(|r| !r.is_empty())
        && Some(rv) != meta_str(existing, "resourceVersion")
    {
        return Err(ApiError::conflict(req.res, &name, OPTIMISTIC_LOCK));
    }
    if let Some(m) = new["metadata"].as_object_mut() {
        m.remove("managedFields");
        m.remove("selfLink");
    }
    let status_write = req.sub.as_deref() == Some("status");
    if status_write && req.res.plural == "pods" {
        // The pods/status strategy drops a new deletionTimestamp before the
        // immutability check sees it.
        strategy::prepare_status_update(req.res, &mut new, existing);
    }
    strategy::carry_system_meta(&mut new, existing);
    let mut causes = strategy::validate_meta_update(&new, existing);
    if status_write {
        strategy::prepare_status_update(req.res, &mut new, existing);
    } else {
        strategy::prepare_update(req.res, &mut new, existing);
    }
    causes.extend(strategy::validate(req.res, &new));
    causes.extend(strategy::validate_kind_update(req.res, &new, existing));
    if crate::convert::is_event(req.res) {
        let (stored_new, stored_old) = (
            to_storage(req.res, new.clone()),
            to_storage(req.res, (**existing).clone()),
        );
        causes.extend(strategy::validate_event(
            req.res,
            &stored_new,
            Some(&stored_old),
        ));
    }
    if req.res.plural == "pods" && !status_write {
        causes.extend(strategy::validate_pod_update(&new, existing));
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(req.res, &name, &causes));
    }
    new["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"].clone();
    // Validating admission runs on every update that passed validation, a no-op or a dry
    // run included (kube-apiserver admits before the storage compares).
    crate::admission::admit(
        g,
        req,
        crate::admission::Operation::Update,
        &new,
        Some(existing),
    )?;
    if new == **existing || is_dry_run(req) {
        // kube-apiserver skips the write when nothing changed: same resourceVersion,
        // no watch event.
        return Ok((
            200,
            if is_dry_run(req) {
                Arc::new(new)
            } else {
                existing.clone()
            },
            warnings,
        ));
    }
    let idx = res_index(req.res);
    if strategy::should_remove_after_update(&new) {
        let gone = match g.remove(idx, &ns, &name) {
            Some(o) => to_served(req.res, o),
            None => Arc::new(new),
        };
        return Ok((200, gone, warnings));
    }
    let stored = g.put(idx, to_storage(req.res, new));
    Ok((200, to_served(req.res, stored), warnings))
}

/// PUT.
pub fn update(st: &State, req: &Request) -> Reply {
    let new = parse_body(&req.body)?;
    let (ns, name) = scope(req);
    let idx = res_index(req.res);
    let (code, obj, deleting, warnings) = {
        let mut g = st.store.lock();
        let Some(existing) = g.get(idx, &ns, &name) else {
            drop(g);
            return create_on_update(st, req, new, &name);
        };
        let existing = to_served(req.res, existing);
        if !allows_unconditional_update(req.res)
            && meta_str(&new, "resourceVersion").is_none_or(str::is_empty)
        {
            return Err(ApiError::invalid(
                req.res,
                &name,
                &[crate::status::Cause::invalid(
                    "metadata.resourceVersion",
                    &json!(""),
                    "must be specified for an update",
                )],
            ));
        }
        let (code, obj, warnings) = write_update(req, &mut g, new, &existing)?;
        (
            code,
            obj,
            existing.pointer("/metadata/deletionTimestamp").is_some(),
            warnings,
        )
    };
    st.notify();
    if deleting
        || obj
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
    {
        st.kick_gc();
    }
    Ok(warned(code, &obj, &warnings))
}

/// `AllowUnconditionalUpdate` of the kind's strategy: false for Leases
/// (`pkg/registry/coordination/lease/strategy.go`).
fn allows_unconditional_update(res: &Resource) -> bool {
    res.plural != "leases"
}

/// `AllowCreateOnUpdate` of the kind's strategy: Leases, Events, Endpoints and the RBAC
/// kinds are created by a PUT of a missing object.
fn allows_create_on_update(res: &Resource) -> bool {
    matches!(
        res.plural,
        "leases"
            | "events"
            | "endpoints"
            | "roles"
            | "rolebindings"
            | "clusterroles"
            | "clusterrolebindings"
    )
}

/// A PUT of a missing object: 404, or a create (201) where the kind allows it.
fn create_on_update(st: &State, req: &Request, mut body: Value, name: &str) -> Reply {
    if !allows_create_on_update(req.res) || req.sub.is_some() {
        return Err(ApiError::not_found(req.res, name));
    }
    if meta_str(&body, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
        return Err(ApiError::not_found(req.res, name));
    }
    match meta_str(&body, "name") {
        Some(n) if n != name => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        _ => {}
    }
    if !body["metadata"].is_object() {
        body["metadata"] = json!({});
    }
    body["metadata"]["name"] = json!(name);
    let creq = Request {
        body: Bytes::from(serde_json::to_vec(&body).unwrap_or_default()),
        name: None,
        ..req.clone()
    };
    create(st, &creq)
}

/// PATCH.
pub fn patch(st: &State, req: &Request) -> Reply {
    let kind = PatchKind::from_content_type(&req.content_type).map_err(|_| {
        let mut e = ApiError::unsupported_media_type(&req.content_type, patch::ACCEPTED);
        if req.content_type.starts_with("application/apply-patch") {
            e.message = format!(
                "{} (server-side apply is not implemented by this API double, and product code must not use it: send a strategic merge, merge or JSON patch)",
                e.message
            );
        }
        e
    })?;
    let (ns, name) = scope(req);
    let idx = res_index(req.res);
    let (code, obj, deleting, warnings) = {
        let mut g = st.store.lock();
        let Some(existing) = g.get(idx, &ns, &name) else {
            return Err(ApiError::not_found(req.res, &name));
        };
        // The patch applies to the object as this API version serves it.
        let existing = to_served(req.res, existing);
        let patched = patch::apply(kind, &existing, &req.body).map_err(|e| match e {
            PatchError::Malformed(m) => ApiError::bad_request(m),
            PatchError::Failed(m) => ApiError::new(422, "Invalid", m),
            PatchError::Unsupported(t) => ApiError::unsupported_media_type(&t, patch::ACCEPTED),
        })?;
        if !patched.is_object() || !patched["metadata"].is_object() {
            return Err(ApiError::bad_request(
                "the patched object is not a JSON object with metadata",
            ));
        }
        let (code, obj, warnings) = write_update(req, &mut g, patched, &existing)?;
        (
            code,
            obj,
            existing.pointer("/metadata/deletionTimestamp").is_some(),
            warnings,
        )
    };
    st.notify();
    if deleting
        || obj
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
    {
        st.kick_gc();
    }
    Ok(warned(code, &obj, &warnings))
}

/// DeleteOptions from the body and the query.
#[derive(Debug, Default, Clone)]
struct DeleteOptions {
    grace: Option<i64>,
    uid: Option<String>,
    rv: Option<String>,
    propagation: Option<String>,
    /// `orphanDependents: false` given explicitly (the one case of a 202).
    orphan_false: bool,
    dry_run: bool,
}

fn delete_options(req: &Request) -> Result<DeleteOptions, ApiError> {
    let mut o = DeleteOptions::default();
    if !req.body.is_empty() {
        let v: Value = serde_json::from_slice(&req.body).map_err(|e| {
            ApiError::bad_request(format!("the DeleteOptions body could not be decoded: {e}"))
        })?;
        o.grace = v.get("gracePeriodSeconds").and_then(Value::as_i64);
        o.uid = v
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(String::from);
        o.rv = v
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(String::from);
        o.propagation = v
            .get("propagationPolicy")
            .and_then(Value::as_str)
            .map(String::from);
        match v.get("orphanDependents").and_then(Value::as_bool) {
            Some(true) => o.propagation = Some("Orphan".into()),
            Some(false) => o.orphan_false = true,
            None => {}
        }
        o.dry_run = v
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x == "All"));
    }
    if let Some(g) = req.query.get("gracePeriodSeconds") {
        o.grace = Some(g.parse().map_err(|_| {
            ApiError::bad_request(format!("gracePeriodSeconds: Invalid value: {g:?}"))
        })?);
    }
    if let Some(p) = req.query.get("propagationPolicy") {
        o.propagation = Some(p.clone());
    }
    match req.query.get("orphanDependents").map(String::as_str) {
        Some("true") => o.propagation = Some("Orphan".into()),
        Some("false") => o.orphan_false = true,
        _ => {}
    }
    o.dry_run |= is_dry_run(req);
    match o.propagation.as_deref() {
        None | Some("Background") | Some("Foreground") | Some("Orphan") => Ok(o),
        Some(other) => Err(ApiError::bad_request(format!(
            "propagationPolicy: Unsupported value: {other:?}: supported values: \"Orphan\", \"Background\", \"Foreground\""
        ))),
    }
}

/// Whether the registry returns the deleted object rather than a Status
/// (`ReturnDeletedObject` in the kind's storage).
fn returns_deleted_object(res: &Resource) -> bool {
    matches!(res.plural, "pods" | "namespaces" | "services")
}

fn success_status(res: &Resource, obj: &Value) -> Value {
    let mut details = json!({"name": meta_str(obj, "name").unwrap_or(""), "kind": res.plural,
        "uid": meta_str(obj, "uid").unwrap_or("")});
    if !res.group.is_empty() {
        details["group"] = json!(res.group);
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

/// Deletes one object under the lock. Returns (removed now, the resulting object).
pub(crate) fn delete_locked(
    g: &mut Inner,
    res: &'static Resource,
    ns: &str,
    name: &str,
    grace: Option<i64>,
    propagation: Option<&str>,
    dry_run: bool,
) -> Result<(bool, Arc<Value>), ApiError> {
    let idx = res_index(res);
    let Some(existing) = g.get(idx, ns, name) else {
        return Err(ApiError::not_found(res, name));
    };
    let mut extra = match propagation {
        Some("Orphan") => Some("orphan"),
        Some("Foreground") => Some("foregroundDeletion"),
        _ => None,
    };
    if res.plural == "namespaces" {
        // The namespace controller empties it, then drops its finalizer.
        extra = Some("kubernetes");
    }
    let outcome = if res.plural == "namespaces" {
        let mut o = (*existing).clone();
        if o.pointer("/metadata/deletionTimestamp").is_none() {
            o["metadata"]["deletionTimestamp"] = json!(strategy::rfc3339(now_secs()));
            o["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        }
        o["status"]["phase"] = json!("Terminating");
        if o == *existing {
            DeleteOutcome::Unchanged
        } else {
            DeleteOutcome::Update(o)
        }
    } else {
        strategy::decide_delete(res, &existing, grace, extra, now_secs())
    };
    if dry_run {
        return Ok((false, existing));
    }
    Ok(match outcome {
        DeleteOutcome::Remove => (true, g.remove(idx, ns, name).unwrap_or(existing)),
        DeleteOutcome::Update(o) => (false, g.put(idx, o)),
        DeleteOutcome::Unchanged => (false, existing),
    })
}

/// DELETE one object.
pub fn delete(st: &State, req: &Request) -> Reply {
    let opts = delete_options(req)?;
    let (ns, name) = scope(req);
    let (removed, obj) = {
        let mut g = st.store.lock();
        let Some(existing) = g.get(res_index(req.res), &ns, &name) else {
            return Err(ApiError::not_found(req.res, &name));
        };
        before_delete_preconditions(req.res, &name, &existing, &opts)?;
        delete_locked(
            &mut g,
            req.res,
            &ns,
            &name,
            opts.grace,
            opts.propagation.as_deref(),
            opts.dry_run,
        )?
    };
    st.notify();
    st.kick_gc();
    let obj = to_served(req.res, obj);
    if !removed {
        // `handlers/delete.go`: 200 with the object still there (graceful or held by a
        // finalizer); 202 only when the caller set `orphanDependents: false`.
        return Ok(json_response(
            if opts.orphan_false { 202 } else { 200 },
            &obj,
        ));
    }
    if returns_deleted_object(req.res) {
        Ok(json_response(200, &obj))
    } else {
        Ok(json_response(200, &success_status(req.res, &obj)))
    }
}

/// The precondition checks of `rest.BeforeDelete`, with its messages; the conflict names
/// the Kind (it is built from the object's GroupVersionKind).
fn before_delete_preconditions(
    res: &'static Resource,
    name: &str,
    existing: &Value,
    opts: &DeleteOptions,
) -> Result<(), ApiError> {
    let by_kind = Resource {
        plural: res.kind,
        ..*res
    };
    if let Some(uid) = opts.uid.as_deref()
        && uid != meta_str(existing, "uid").unwrap_or("")
    {
        let mut e = ApiError::conflict(
            &by_kind,
            name,
            &format!(
                "the UID in the precondition ({uid}) does not match the UID in record ({}). The object might have been deleted and then recreated",
                meta_str(existing, "uid").unwrap_or("")
            ),
        );
        e.details = Some(json!({"name": name, "kind": res.kind, "group": res.group}));
        return Err(e);
    }
    if let Some(rv) = opts.rv.as_deref()
        && rv != meta_str(existing, "resourceVersion").unwrap_or("")
    {
        let mut e = ApiError::conflict(
            &by_kind,
            name,
            &format!(
                "the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({}). The object might have been modified",
                meta_str(existing, "resourceVersion").unwrap_or("")
            ),
        );
        e.details = Some(json!({"name": name, "kind": res.kind, "group": res.group}));
        return Err(e);
    }
    Ok(())
}

/// `POST pods/{name}/eviction` (`pkg/registry/core/pod/storage/eviction.go`): with no
/// PodDisruptionBudgets served, an eviction is the delete its `deleteOptions` describe;
/// a pod already being deleted is a success. Answers 201 with a Success Status.
pub fn evict(
    st: &State,
    res: &'static Resource,
    ns: Option<String>,
    name: String,
    query: HashMap<String, String>,
    user: auth::UserInfo,
    body: Bytes,
) -> Reply {
    let ev: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::bad_request(format!(
                "the Eviction body could not be decoded as JSON: {e}"
            ))
        })?
    };
    if let Some(k) = ev.get("kind").and_then(Value::as_str)
        && k != "Eviction"
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind (Eviction)"
        )));
    }
    if let Some(n) = meta_str(&ev, "name")
        && n != name
    {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    let opts = ev.get("deleteOptions").cloned().unwrap_or(json!({}));
    let dreq = Request {
        res,
        sub: None,
        ns,
        name: Some(name.clone()),
        query,
        body: Bytes::from(serde_json::to_vec(&opts).unwrap_or_default()),
        content_type: "application/json".into(),
        user,
        accept: "application/json".into(),
    };
    let (pns, pname) = scope(&dreq);
    let terminating = match st.store.lock().get(res_index(res), &pns, &pname) {
        None => return Err(ApiError::not_found(res, &name)),
        Some(p) => p.pointer("/metadata/deletionTimestamp").is_some(),
    };
    if !terminating {
        delete(st, &dreq)?;
    }
    Ok(json_response(
        201,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

/// DELETE a collection: deletes every selected object; answers the list of them.
pub fn delete_collection(st: &State, req: &Request) -> Reply {
    let opts = delete_options(req)?;
    let (labels, fields) = selectors(req)?;
    let idx = res_index(req.res);
    let ns = req.ns.as_deref().filter(|_| req.res.namespaced);
    let mut items = Vec::new();
    let rv = {
        let mut g = st.store.lock();
        let targets: Vec<Arc<Value>> = g
            .list(idx, ns)
            .into_iter()
            .filter(|o| labels.matches(o) && fields.matches(o))
            .collect();
        for t in targets {
            let (tns, tname) = crate::store::obj_key(&t);
            let (_, obj) = delete_locked(
                &mut g,
                req.res,
                &tns,
                &tname,
                opts.grace,
                opts.propagation.as_deref(),
                opts.dry_run,
            )?;
            items.push((*to_served(req.res, obj)).clone());
        }
        g.rv()
    };
    st.notify();
    st.kick_gc();
    Ok(json_response(
        200,
        &json!({"kind": format!("{}List", req.res.kind), "apiVersion": req.res.api_version(),
            "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
    ))
}

/// The resources whose objects live in namespaces (for the namespace controller).
/// Each storage once: events.k8s.io/v1 Events are the core ones.
pub fn namespaced_resources() -> impl Iterator<Item = &'static Resource> {
    RESOURCES
        .iter()
        .filter(|r| r.namespaced && !r.create_only && crate::resources::storage(r) == *r)
}

/// A fresh object for seeding the store (default namespaces).
pub fn seed_namespace(g: &mut Inner, name: &str) {
    let nsres = namespaces();
    let mut obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name,
        "uid": new_uid(), "creationTimestamp": strategy::rfc3339(now_secs())}});
    strategy::prepare_create(nsres, &mut obj);
    g.put(res_index(nsres), obj);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(42, "ns", "a");
        assert_eq!(decode_continue(&t).unwrap(), (42, "ns".into(), "a".into()));
        assert_eq!(decode_continue("!!").unwrap_err().code, 400);
    }

    #[test]
    fn generated_names_and_uids_look_like_kubernetes_ones() {
        let s = name_suffix();
        assert_eq!(s.len(), 5);
        assert!(
            s.bytes()
                .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b))
        );
        let u = new_uid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
    }
}
