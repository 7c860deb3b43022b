//! Where a proxied request goes: the kubelet address, the container, and the kubelet
//! path and query of logs, exec, attach and port-forward (pure decisions).

use super::*;

pub(super) fn first<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The API machinery's query-to-bool conversion: absent, `0` and `false` are false,
/// anything else (even empty) is true.
pub(super) fn query_bool(pairs: &[(String, String)], key: &str) -> bool {
    match first(pairs, key) {
        None => false,
        Some(v) => !(v == "0" || v.eq_ignore_ascii_case("false")),
    }
}

pub(super) fn query_i64(pairs: &[(String, String)], key: &str) -> Result<Option<i64>, ProxyError> {
    match first(pairs, key) {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| {
            ProxyError::BadRequest(format!("strconv.ParseInt: parsing {v:?}: invalid syntax"))
        }),
    }
}

// ---------------------------------------------------------------------------------------
// Pure decisions.

pub(super) fn meta<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj["metadata"][field].as_str().unwrap_or("")
}

/// The kubelet's host and port for a node: the first address in `preferred` type order,
/// and `status.daemonEndpoints.kubeletEndpoint.Port` when positive, else 10250.
pub fn kubelet_target(node: &Value, preferred: &[String]) -> Result<(String, u16), ProxyError> {
    let addresses = node["status"]["addresses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let host = preferred
        .iter()
        .find_map(|t| {
            addresses
                .iter()
                .find(|a| a["type"].as_str() == Some(t.as_str()))
                .and_then(|a| a["address"].as_str())
        })
        .ok_or_else(|| {
            // Go prints the []NodeAddress with %v: [{InternalIP 10.0.0.1} ...]
            let known = addresses
                .iter()
                .map(|a| {
                    format!(
                        "{{{} {}}}",
                        a["type"].as_str().unwrap_or(""),
                        a["address"].as_str().unwrap_or("")
                    )
                })
                .collect::<Vec<_>>()
                .join(" ");
            ProxyError::NoPreferredAddress(format!("[{known}]"))
        })?;
    let port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_i64()
        .filter(|p| *p > 0 && *p <= u16::MAX as i64)
        .map(|p| p as u16)
        .unwrap_or(DEFAULT_KUBELET_PORT);
    Ok((host.to_string(), port))
}

/// kube-apiserver's `validateContainer`: the requested container must exist (among
/// init, regular and ephemeral containers); without one, a pod with exactly one
/// container uses it.
pub fn choose_container(pod: &Value, requested: Option<&str>) -> Result<String, ProxyError> {
    let name = meta(pod, "name");
    let names = |field: &str| -> Vec<String> {
        pod["spec"][field]
            .as_array()
            .map(|cs| {
                cs.iter()
                    .filter_map(|c| c["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let containers = names("containers");
    let all: Vec<String> = names("initContainers")
        .into_iter()
        .chain(containers.iter().cloned())
        .chain(names("ephemeralContainers"))
        .collect();
    match requested.filter(|c| !c.is_empty()) {
        Some(c) if all.iter().any(|n| n == c) => Ok(c.to_string()),
        Some(c) => Err(ProxyError::BadRequest(format!(
            "container {c} is not valid for pod {name}"
        ))),
        None => match containers.len() {
            1 => Ok(containers[0].clone()),
            0 => Err(ProxyError::BadRequest(format!(
                "a container name must be specified for pod {name}"
            ))),
            _ => Err(ProxyError::BadRequest(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                all.join(" ")
            ))),
        },
    }
}

/// What a `pods/log` request turns into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLocation {
    /// `/containerLogs/{ns}/{pod}/{container}?...`, or `None` when the pod has no node
    /// (kube-apiserver then answers 204 No Content).
    pub path_and_query: Option<String>,
    /// `insecureSkipTLSVerifyBackend=true`: skip verifying the kubelet even with a CA.
    pub insecure_skip_verify: bool,
}

/// Maps `pods/{name}/log?...` to the kubelet's `containerLogs` location
/// (`LogLocation` and `ValidatePodLogOptions`).
pub fn log_location(pod: &Value, query: &str) -> Result<LogLocation, ProxyError> {
    let q = crate::query::pairs(query);
    let name = meta(pod, "name");
    let tail = query_i64(&q, "tailLines")?;
    let limit = query_i64(&q, "limitBytes")?;
    let since_seconds = query_i64(&q, "sinceSeconds")?;
    let since_time = match first(&q, "sinceTime") {
        None => None,
        Some(v) => Some(
            crate::times::parse_rfc3339(v)
                .map(crate::times::format_secs)
                .map_err(|e| {
                    ProxyError::BadRequest(format!(
                        "parsing time {v:?} as \"2006-01-02T15:04:05Z07:00\": {e}"
                    ))
                })?,
        ),
    };
    let mut causes: Vec<(String, String, &'static str)> = Vec::new();
    if let Some(t) = tail.filter(|t| *t < 0) {
        causes.push((
            "tailLines".into(),
            format!("Invalid value: {t}: must be greater than or equal to 0"),
            "FieldValueInvalid",
        ));
    }
    if let Some(l) = limit.filter(|l| *l < 1) {
        causes.push((
            "limitBytes".into(),
            format!("Invalid value: {l}: must be greater than 0"),
            "FieldValueInvalid",
        ));
    }
    if since_seconds.is_some() && since_time.is_some() {
        causes.push((
            "".into(),
            "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified".into(),
            "FieldValueForbidden",
        ));
    } else if let Some(s) = since_seconds.filter(|s| *s < 1) {
        causes.push((
            "sinceSeconds".into(),
            format!("Invalid value: {s}: must be greater than 0"),
            "FieldValueInvalid",
        ));
    }
    if !causes.is_empty() {
        let render = |(f, m, _): &(String, String, &str)| {
            if f.is_empty() {
                m.clone()
            } else {
                format!("{f}: {m}")
            }
        };
        let message = if causes.len() == 1 {
            render(&causes[0])
        } else {
            format!(
                "[{}]",
                causes.iter().map(render).collect::<Vec<_>>().join(", ")
            )
        };
        return Err(ProxyError::InvalidLogOptions {
            pod: name.to_string(),
            message,
            causes,
        });
    }
    let container = choose_container(pod, first(&q, "container"))?;
    let insecure_skip_verify = query_bool(&q, "insecureSkipTLSVerifyBackend");
    if pod["spec"]["nodeName"].as_str().unwrap_or("").is_empty() {
        return Ok(LogLocation {
            path_and_query: None,
            insecure_skip_verify,
        });
    }
    let mut params: Vec<(&str, String)> = Vec::new();
    for key in ["follow", "previous", "timestamps"] {
        if query_bool(&q, key) {
            params.push((key, "true".into()));
        }
    }
    if let Some(s) = since_seconds {
        params.push(("sinceSeconds", s.to_string()));
    }
    if let Some(t) = since_time {
        params.push(("sinceTime", t));
    }
    if let Some(t) = tail {
        params.push(("tailLines", t.to_string()));
    }
    if let Some(l) = limit {
        params.push(("limitBytes", l.to_string()));
    }
    Ok(LogLocation {
        path_and_query: Some(with_query(
            format!(
                "/containerLogs/{}/{}/{container}",
                meta(pod, "namespace"),
                name
            ),
            &params,
        )),
        insecure_skip_verify,
    })
}

pub(super) fn with_query(path: String, params: &[(&str, String)]) -> String {
    if params.is_empty() {
        path
    } else {
        format!("{path}?{}", crate::query::encode(params))
    }
}

pub(super) fn require_node(pod: &Value) -> Result<(), ProxyError> {
    if pod["spec"]["nodeName"].as_str().unwrap_or("").is_empty() {
        return Err(ProxyError::BadRequest(format!(
            "pod {} does not have a host assigned",
            meta(pod, "name")
        )));
    }
    Ok(())
}

/// Maps `pods/{name}/exec` or `attach` (`kind`) to `/{kind}/{ns}/{pod}/{container}?...`
/// (`streamLocation`): stdin/stdout/stderr/tty become input/output/error/tty=1 when true,
/// `command` values are kept in order.
pub fn exec_location(pod: &Value, kind: &str, query: &str) -> Result<String, ProxyError> {
    let q = crate::query::pairs(query);
    let container = choose_container(pod, first(&q, "container"))?;
    require_node(pod)?;
    let mut params: Vec<(&str, String)> = Vec::new();
    for (from, to) in [
        ("stdin", "input"),
        ("stdout", "output"),
        ("stderr", "error"),
        ("tty", "tty"),
    ] {
        if query_bool(&q, from) {
            params.push((to, "1".into()));
        }
    }
    if kind == "exec" {
        for (k, v) in &q {
            if k == "command" {
                params.push(("command", v.clone()));
            }
        }
    }
    Ok(with_query(
        format!(
            "/{kind}/{}/{}/{container}",
            meta(pod, "namespace"),
            meta(pod, "name")
        ),
        &params,
    ))
}

/// Maps `pods/{name}/portforward?ports=...` to `/portForward/{ns}/{pod}?port=a,b`.
pub fn port_forward_location(pod: &Value, query: &str) -> Result<String, ProxyError> {
    let q = crate::query::pairs(query);
    require_node(pod)?;
    let mut ports = Vec::new();
    for (k, v) in &q {
        if k != "ports" {
            continue;
        }
        for p in v.split(',') {
            let port: u16 = p.parse().map_err(|_| {
                ProxyError::BadRequest(format!(
                    "cannot convert to []int32: strconv.ParseUint: parsing {p:?}: invalid syntax"
                ))
            })?;
            ports.push(port.to_string());
        }
    }
    let params: Vec<(&str, String)> = if ports.is_empty() {
        vec![]
    } else {
        vec![("port", ports.join(","))]
    };
    Ok(with_query(
        format!(
            "/portForward/{}/{}",
            meta(pod, "namespace"),
            meta(pod, "name")
        ),
        &params,
    ))
}
