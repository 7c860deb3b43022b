//! Routing: paths to resources, authentication and authorization, fault injection, the
//! request log, and the HTTP plumbing of resource requests.

use super::*;

/// A parsed request path.
#[derive(Debug)]
enum Route {
    Version,
    CoreVersions,
    Groups,
    Group(String),
    ResourceList(String, String),
    Resource {
        res: &'static Resource,
        ns: Option<String>,
        name: Option<String>,
        sub: Option<String>,
        legacy_watch: bool,
    },
    Healthz,
    OpenApiV3Root,
    OpenApiV3(String, String),
    OpenApiV2,
    OpenApi,
    NotFound,
}

fn route(path: &str) -> Route {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["version"] => return Route::Version,
        ["healthz" | "livez" | "readyz", ..] => return Route::Healthz,
        ["openapi", "v3"] => return Route::OpenApiV3Root,
        ["openapi", "v3", "api", v] => return Route::OpenApiV3(String::new(), v.to_string()),
        ["openapi", "v3", "apis", g, v] => return Route::OpenApiV3(g.to_string(), v.to_string()),
        ["openapi", "v2"] => return Route::OpenApiV2,
        ["openapi", ..] => return Route::OpenApi,
        ["api"] => return Route::CoreVersions,
        ["apis"] => return Route::Groups,
        ["apis", g] => return Route::Group(g.to_string()),
        ["api", v] => return Route::ResourceList(String::new(), v.to_string()),
        ["apis", g, v] => return Route::ResourceList(g.to_string(), v.to_string()),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Route::NotFound,
    };
    let (legacy_watch, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    let owned = |s: &&str| s.to_string();
    // /namespaces/{ns}/{plural}[/{name}[/{sub}]] for namespaced kinds.
    if let ["namespaces", ns, plural, tail @ ..] = rest
        && let Some(res) = resources::find(group, version, plural)
        && res.namespaced
        && tail.len() <= 2
    {
        return Route::Resource {
            res,
            ns: Some(ns.to_string()),
            name: tail.first().map(owned),
            sub: tail.get(1).map(owned),
            legacy_watch,
        };
    }
    // /api/v1/nodes/{name}/proxy/{path...}: the node proxy (the path is read again from
    // the request when it is forwarded).
    if let ["nodes", name, "proxy", ..] = rest
        && group.is_empty()
        && !legacy_watch
        && let Some(res) = resources::find(group, version, "nodes")
    {
        return Route::Resource {
            res,
            ns: None,
            name: Some(name.to_string()),
            sub: Some("proxy".to_string()),
            legacy_watch,
        };
    }
    match rest {
        [plural, tail @ ..] if tail.len() <= 2 => match resources::find(group, version, plural) {
            Some(res) if !res.namespaced || tail.is_empty() => Route::Resource {
                res,
                ns: None,
                name: tail.first().map(owned),
                sub: tail.get(1).map(owned),
                legacy_watch,
            },
            _ => Route::NotFound,
        },
        _ => Route::NotFound,
    }
}

/// Reads a request body up to [`MAX_BODY`].
async fn read_body(req: Request<Incoming>) -> Result<bytes::Bytes, ApiError> {
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        && len > MAX_BODY
    {
        return Err(ApiError::too_large(MAX_BODY));
    }
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                return Err(ApiError::too_large(MAX_BODY));
            }
            Err(ApiError::bad_request(format!(
                "reading the request body: {e}"
            )))
        }
    }
}

fn json_created(v: &Value) -> Response<Body> {
    Response::builder()
        .status(201)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(v.to_string()))
        .expect("static response parts are valid")
}

fn json_ok(v: &Value) -> Response<Body> {
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(v.to_string()))
        .expect("static response parts are valid")
}

/// `/openapi/v2` without definitions. kubectl 1.27 asks for it (as protobuf) to decide on
/// validation; with no schema for a kind it skips client-side validation, which is what
/// an empty document (the empty protobuf message) gives it.
fn openapi_v2(accept: &str) -> Response<Body> {
    if accept.contains("protobuf") {
        return Response::builder()
            .status(200)
            .header(
                header::CONTENT_TYPE,
                "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
            )
            .body(full(Vec::new()))
            .expect("static response parts are valid");
    }
    json_ok(&serde_json::json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": format!("v1.{}.0-testkube", discovery::MINOR)},
        "paths": {},
        "definitions": {},
    }))
}

fn bearer(req: &Request<Incoming>) -> Option<String> {
    let h = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = h.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}

fn verb_for(method: &Method, has_name: bool, watch: bool) -> Option<&'static str> {
    Some(match (method.as_str(), has_name) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", false) => "create",
        ("PUT", true) => "update",
        ("PATCH", true) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    })
}

pub(super) async fn handle(
    state: Arc<State>,
    peer: PeerAuth,
    req: Request<Incoming>,
) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query_str = req.uri().query().unwrap_or("").to_string();
    let query = crate::query::map(&query_str);
    let mut rec = RequestRecord {
        verb: method.as_str().to_ascii_lowercase(),
        method: method.as_str().to_string(),
        path: path.clone(),
        query: query_str.clone(),
        resource: String::new(),
        subresource: None,
        namespace: None,
        name: None,
        code: 0,
    };

    // Authentication, in kube-apiserver's order: x509, then bearer tokens; a credential
    // that fails is 401 even where anonymous requests are allowed (the anonymous
    // authenticator sits behind FailOnError); no credential at all is anonymous.
    let token = bearer(&req);
    let by_token = token.as_deref().map(|t| state.authenticate_token(t));
    let mut anonymous_cluster_info = false;
    let user = match (&peer, by_token) {
        (PeerAuth::User(u), _) => Some(auth::with_authenticated_group(u.clone())),
        (_, Some(Some(u))) => Some(u),
        (PeerAuth::Invalid, _) | (_, Some(None)) => None,
        (PeerAuth::None, None) if state.policy.mode == AuthMode::AllowAll => {
            Some(UserInfo::anonymous())
        }
        (PeerAuth::None, None)
            if state.cluster_info_public
                && crate::bootstrap::is_cluster_info_read(&method, &path) =>
        {
            anonymous_cluster_info = true;
            Some(UserInfo::anonymous())
        }
        (PeerAuth::None, None) => None,
    };
    let route = route(&path);
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    if let Route::Resource {
        res, ns, name, sub, ..
    } = &route
    {
        rec.resource = res.plural.to_string();
        rec.namespace = ns.clone();
        rec.name = name.clone();
        rec.subresource = sub.clone();
    }
    let Some(user) = user else {
        return finish(&state, rec, ApiError::unauthorized().into_response());
    };
    let resp = match route {
        Route::Resource {
            res,
            ns,
            name,
            sub,
            legacy_watch,
        } => {
            let watch = legacy_watch || query.get("watch").is_some_and(|w| crate::api::go_bool(w));
            let connect = (res.plural == "pods"
                && name.is_some()
                && matches!(
                    sub.as_deref(),
                    Some("log" | "exec" | "attach" | "portforward")
                ))
                || (res.plural == "nodes" && name.is_some() && sub.as_deref() == Some("proxy"));
            // Streaming subresources take any method (kubectl exec POSTs, WebSocket clients
            // GET); kube-apiserver names POST "create" and GET "get" for them.
            let verb = if connect {
                Some(match method.as_str() {
                    "POST" => "create",
                    "GET" => "get",
                    "PUT" => "update",
                    "DELETE" => "delete",
                    "PATCH" => "patch",
                    _ => "connect",
                })
            } else if res.plural == "pods"
                && name.is_some()
                && matches!(sub.as_deref(), Some("binding" | "eviction"))
                && method == Method::POST
            {
                Some("create")
            } else {
                verb_for(&method, name.is_some(), watch)
            };
            let Some(verb) = verb else {
                return finish(
                    &state,
                    rec,
                    ApiError::method_not_allowed(method.as_str(), &path).into_response(),
                );
            };
            rec.verb = verb.to_string();
            let attrs = Attributes {
                verb: verb.to_string(),
                group: res.group.to_string(),
                resource: res.plural.to_string(),
                subresource: sub.clone().unwrap_or_default(),
                namespace: ns.clone().unwrap_or_default(),
                name: name.clone().unwrap_or_default(),
                path: path.clone(),
            };
            // Asking about oneself is always allowed (kube's default system:basic-user role).
            let self_review = res.plural == "selfsubjectaccessreviews";
            // kubeadm binds `system:anonymous` to a Role that reads cluster-info.
            let public = crate::bootstrap::is_cluster_info_read(&method, &path)
                && state.cluster_info_public
                && user.username == "system:anonymous";
            if !self_review
                && !public
                && !anonymous_cluster_info
                && !state.policy.authorize(&user, &attrs)
            {
                let e = ApiError {
                    details: Some(
                        serde_json::json!({"name": attrs.name, "group": attrs.group, "kind": attrs.resource}),
                    ),
                    ..ApiError::new(403, "Forbidden", auth::forbidden_message(&user, &attrs))
                };
                return finish(&state, rec, e.into_response());
            }
            let mut drop_watch = false;
            for fault in state.faults.take(verb, res.plural, sub.as_deref()) {
                match fault {
                    FaultKind::Latency(d) => tokio::time::sleep(d).await,
                    FaultKind::Status(code) => {
                        return finish(&state, rec, ApiError::for_code(code).into_response());
                    }
                    FaultKind::TooManyRequests { retry_after_secs } => {
                        let e = ApiError {
                            retry_after: Some(retry_after_secs),
                            ..ApiError::new(
                                429,
                                "TooManyRequests",
                                "injected fault: too many requests, please try again later",
                            )
                        };
                        return finish(&state, rec, e.into_response());
                    }
                    FaultKind::DropWatch => drop_watch = true,
                    FaultKind::Compact => {
                        state.store.lock().compact();
                    }
                }
            }
            resource_request(
                &state, req, res, ns, name, sub, verb, query, user, drop_watch,
            )
            .await
        }
        other => {
            if method != Method::GET {
                ApiError::method_not_allowed(method.as_str(), &path).into_response()
            } else {
                match other {
                    Route::Version => json_ok(&discovery::version()),
                    Route::Healthz => Response::builder()
                        .status(200)
                        .header(header::CONTENT_TYPE, "text/plain")
                        .body(full("ok"))
                        .expect("static response parts are valid"),
                    Route::CoreVersions => {
                        let addr = state
                            .server_address
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .clone();
                        json_ok(&discovery::core_versions(&addr))
                    }
                    Route::Groups => json_ok(&discovery::group_list()),
                    Route::OpenApiV2 => openapi_v2(&accept),
                    Route::OpenApiV3Root => json_ok(&discovery::openapi_v3_root()),
                    Route::OpenApiV3(g, v) => match discovery::openapi_v3_gv(&g, &v) {
                        Some(d) => json_ok(&d),
                        None => ApiError::no_route(&path).into_response(),
                    },
                    Route::Group(g) => match discovery::group(&g) {
                        Some(v) => json_ok(&v),
                        None => ApiError::no_route(&path).into_response(),
                    },
                    Route::ResourceList(g, v) => match discovery::resource_list(&g, &v) {
                        Some(l) => json_ok(&l),
                        None => ApiError::no_route(&path).into_response(),
                    },
                    // No OpenAPI v2 (kubectl fetches it as protobuf); v3 above suffices.
                    Route::OpenApi | Route::NotFound | Route::Resource { .. } => {
                        ApiError::no_route(&path).into_response()
                    }
                }
            }
        }
    };
    finish(&state, rec, resp)
}

fn finish(state: &State, mut rec: RequestRecord, resp: Response<Body>) -> Response<Body> {
    rec.code = resp.status().as_u16();
    state.log(rec);
    resp
}

#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename these
async fn resource_request(
    state: &Arc<State>,
    req: Request<Incoming>,
    res: &'static Resource,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
    verb: &'static str,
    query: HashMap<String, String>,
    user: UserInfo,
    drop_watch: bool,
) -> Response<Body> {
    // The node proxy: the rest of the path after `proxy` goes to the node's kubelet.
    if res.plural == "nodes"
        && sub.as_deref() == Some("proxy")
        && let Some(n) = name.as_deref()
    {
        let node = state.store.lock().get(res_index(res), "", n);
        let Some(node) = node else {
            return ApiError::not_found(res, n).into_response();
        };
        let full = req.uri().path().to_string();
        let marker = format!("/nodes/{n}/proxy");
        let tail = full
            .find(&marker)
            .map(|i| &full[i + marker.len()..])
            .unwrap_or("");
        let tail = if tail.is_empty() { "/" } else { tail };
        return crate::proxy_seam::forward_node(state, &node, tail, req).await;
    }
    // Streaming subresources go to the kubelet proxy with the request untouched.
    if let (Some(s), Some(n)) = (sub.as_deref(), name.as_deref())
        && res.plural == "pods"
        && matches!(s, "log" | "exec" | "attach" | "portforward")
    {
        let pod = state
            .store
            .lock()
            .get(res_index(res), ns.as_deref().unwrap_or(""), n);
        let Some(pod) = pod else {
            return ApiError::not_found(res, n).into_response();
        };
        let node = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .and_then(|node| {
                state.store.lock().get(
                    res_index(resources::find("", "v1", "nodes").expect("served")),
                    "",
                    node,
                )
            });
        return crate::proxy_seam::forward(state, &pod, node.as_deref(), s, req).await;
    }
    if res.plural == "pods"
        && sub.as_deref() == Some("binding")
        && let Some(n) = name.as_deref()
    {
        if verb != "create" {
            return ApiError::method_not_allowed(verb, "pods/binding").into_response();
        }
        let body = match read_body(req).await {
            Ok(b) => b,
            Err(e) => return e.into_response(),
        };
        return match crate::scheduler::binding(state, ns.as_deref().unwrap_or(""), n, &body) {
            Ok(v) => json_created(&v),
            Err(e) => e.into_response(),
        };
    }
    if res.plural == "pods"
        && sub.as_deref() == Some("eviction")
        && let Some(n) = name.clone()
    {
        if verb != "create" {
            return ApiError::method_not_allowed(verb, "pods/eviction").into_response();
        }
        let body = match read_body(req).await {
            Ok(b) => b,
            Err(e) => return e.into_response(),
        };
        return api::evict(state, res, ns, n, query, user, body)
            .unwrap_or_else(ApiError::into_response);
    }
    if let Some(s) = sub.as_deref()
        && !(s == "status" && res.has_status)
    {
        return ApiError::no_route(&format!("{}/{s}", res.plural)).into_response();
    }
    if res.create_only && verb != "create" {
        return ApiError::method_not_allowed(verb, res.plural).into_response();
    }
    if sub.is_some() && !matches!(verb, "get" | "update" | "patch") {
        return ApiError::method_not_allowed(verb, &format!("{}/status", res.plural))
            .into_response();
    }
    if res.namespaced && ns.is_none() && matches!(verb, "create") {
        return ApiError::method_not_allowed("POST", res.plural).into_response();
    }
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = match read_body(req).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let (body, content_type) = if matches!(verb, "create" | "update")
        && content_type.starts_with("application/vnd.kubernetes.protobuf")
    {
        match crate::protobuf::decode(&body) {
            Ok(v) => (
                bytes::Bytes::from(serde_json::to_vec(&v).unwrap_or_default()),
                "application/json".to_string(),
            ),
            Err(crate::protobuf::ProtoError::Malformed(m)) => {
                return ApiError::bad_request(format!("malformed protobuf body: {m}"))
                    .into_response();
            }
            Err(e) => {
                let mut err =
                    ApiError::unsupported_media_type(&content_type, &["application/json"]);
                err.message = format!(
                    "{e} (for kubectl 1.32+ `kubectl create <kind>`, use `kubectl create -f` with YAML or JSON)"
                );
                return err.into_response();
            }
        }
    } else {
        (body, content_type)
    };
    if matches!(verb, "create" | "update")
        && !content_type.is_empty()
        && !content_type.starts_with("application/json")
        && !content_type.starts_with("*/*")
    {
        let mut e = ApiError::unsupported_media_type(&content_type, &["application/json"]);
        if content_type.contains("protobuf") {
            e.message.push_str(
                " (this API double speaks JSON only; kubectl 1.32+ sends the objects of `kubectl create namespace|configmap|secret|...` as protobuf: use `kubectl create -f` with YAML or JSON)",
            );
        }
        return e.into_response();
    }
    let areq = api::Request {
        res,
        sub,
        ns,
        name,
        query,
        body,
        content_type,
        user,
        accept,
    };
    let result = match verb {
        "get" => api::get(state, &areq),
        "list" => api::list(state, &areq),
        "watch" => api::watch(state, &areq, drop_watch),
        "create" => api::create(state, &areq),
        "update" => api::update(state, &areq),
        "patch" => api::patch(state, &areq),
        "delete" => api::delete(state, &areq),
        "deletecollection" => api::delete_collection(state, &areq),
        _ => Err(ApiError::method_not_allowed(verb, res.plural)),
    };
    result.unwrap_or_else(ApiError::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert!(matches!(route("/version"), Route::Version));
        assert!(matches!(route("/api/v1"), Route::ResourceList(g, v) if g.is_empty() && v == "v1"));
        match route("/api/v1/namespaces/default/pods/p/status") {
            Route::Resource {
                res, ns, name, sub, ..
            } => {
                assert_eq!(res.plural, "pods");
                assert_eq!(ns.as_deref(), Some("default"));
                assert_eq!(name.as_deref(), Some("p"));
                assert_eq!(sub.as_deref(), Some("status"));
            }
            other => panic!("{other:?}"),
        }
        match route("/api/v1/namespaces/kube-system") {
            Route::Resource { res, name, ns, .. } => {
                assert_eq!(res.plural, "namespaces");
                assert_eq!(name.as_deref(), Some("kube-system"));
                assert!(ns.is_none());
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            route("/api/v1/pods"),
            Route::Resource {
                ns: None,
                name: None,
                ..
            }
        ));
        assert!(matches!(route("/api/v1/pods/x"), Route::NotFound));
        assert!(matches!(
            route("/api/v1/watch/nodes"),
            Route::Resource {
                legacy_watch: true,
                ..
            }
        ));
        assert!(matches!(
            route("/apis/apps/v1/namespaces/a/deployments/d/status"),
            Route::Resource { .. }
        ));
        assert!(matches!(route("/apis/nope/v1/things"), Route::NotFound));
        assert!(matches!(
            route("/api/v1/namespaces/a/pods/p/status/extra"),
            Route::NotFound
        ));
    }
}
