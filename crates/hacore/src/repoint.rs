//! Repointing a kubeconfig: its clusters' `server` rewritten, every other byte kept.
//!
//! A kubeconfig holds client keys and certificates. Re-serializing it would keep their
//! values but could reflow or requote them, and a reader comparing files, or a tool that
//! signs them, would see a change where there was none. So the rewrite edits only the
//! `server:` lines in place, then parses the result and checks that it equals the
//! original with the servers replaced and nothing else; a layout the line edit cannot
//! handle (a flow mapping, a multi-line scalar) is re-serialized instead, which still keeps
//! every value, and the check runs on that too.

use std::net::IpAddr;

use serde_yaml::Value;

/// A kubeconfig or server URL the rewrite refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepointError {
    /// The new server is not `https://HOST:PORT`.
    #[error("server {0:?} is not https://HOST:PORT")]
    BadServer(String),
    /// The document does not parse as YAML.
    #[error("not a kubeconfig: {0}")]
    NotYaml(String),
    /// The document has no cluster with a server.
    #[error("not a kubeconfig: it has no clusters[].cluster.server")]
    NoClusters,
    /// The rewritten document does not equal the original with the servers replaced.
    #[error("the rewritten kubeconfig would differ from the original in more than its servers")]
    Diverged,
}

/// A rewritten kubeconfig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    /// The new document.
    pub text: String,
    /// The servers it named before, in order.
    pub old_servers: Vec<String>,
    /// Whether anything changed (every server already was the new one: `false`).
    pub changed: bool,
    /// Whether the line edit was enough (`false`: the document was re-serialized).
    pub in_place: bool,
}

/// `https://VIP:PORT`, an IPv6 VIP in brackets.
pub fn server_url(vip: IpAddr, port: u16) -> String {
    match vip {
        IpAddr::V4(v4) => format!("https://{v4}:{port}"),
        IpAddr::V6(v6) => format!("https://[{v6}]:{port}"),
    }
}

/// Checks that `server` is `https://HOST:PORT` with a host of DNS or IP characters only,
/// so it can stand as a plain YAML scalar.
pub fn check_server(server: &str) -> Result<(), RepointError> {
    let bad = || RepointError::BadServer(server.to_string());
    let rest = server.strip_prefix("https://").ok_or_else(bad)?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
        && (host.starts_with('[') == host.ends_with(']'))
        && !host.starts_with(['-', '.', ':']);
    if port_ok && host_ok {
        Ok(())
    } else {
        Err(bad())
    }
}

fn servers_of(doc: &Value) -> Vec<String> {
    doc.get("clusters")
        .and_then(Value::as_sequence)
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c.get("cluster")?.get("server")?.as_str())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn with_servers(doc: &Value, server: &str) -> Value {
    let mut out = doc.clone();
    if let Some(cs) = out.get_mut("clusters").and_then(Value::as_sequence_mut) {
        for c in cs {
            if let Some(cluster) = c.get_mut("cluster").and_then(Value::as_mapping_mut)
                && cluster.contains_key("server")
            {
                cluster.insert(Value::from("server"), Value::from(server));
            }
        }
    }
    out
}

/// The scalar of a `server: X` line (quoted or not, with an optional comment), as (start,
/// end) byte offsets of the value within the line; a quoted value's span holds its quotes.
/// A `- server: X` line is never a cluster's server (that sits under `cluster:`, a mapping)
/// and is left alone: editing it would only force the re-serializing fallback.
fn server_value_span(line: &str) -> Option<(usize, usize)> {
    let rest = line.trim_start();
    let offset = line.len() - rest.len();
    let r = rest.strip_prefix("server:")?;
    if !r.starts_with([' ', '\t']) {
        return None;
    }
    let value = r.trim_start();
    let start = offset + "server:".len() + (r.len() - value.len());
    let end = if let Some(q) = value.strip_prefix('"') {
        start + 2 + q.find('"')?
    } else if let Some(q) = value.strip_prefix('\'') {
        start + 2 + q.find('\'')?
    } else {
        let v = value.split(" #").next().unwrap_or(value).trim_end();
        start + v.len()
    };
    Some((start, end))
}

/// Rewrites every cluster's `server` in the kubeconfig `text` to `server`.
pub fn rewrite_server(text: &str, server: &str) -> Result<Rewritten, RepointError> {
    check_server(server)?;
    let doc: Value =
        serde_yaml::from_str(text).map_err(|e| RepointError::NotYaml(e.to_string()))?;
    let old_servers = servers_of(&doc);
    if old_servers.is_empty() {
        return Err(RepointError::NoClusters);
    }
    let want = with_servers(&doc, server);
    if want == doc {
        return Ok(Rewritten {
            text: text.to_string(),
            old_servers,
            changed: false,
            in_place: true,
        });
    }
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.split_inclusive('\n') {
        match server_value_span(line) {
            Some((s, e)) => {
                out.push_str(&line[..s]);
                out.push_str(server);
                out.push_str(&line[e..]);
            }
            None => out.push_str(line),
        }
    }
    let parsed: Option<Value> = serde_yaml::from_str(&out).ok();
    if parsed.as_ref() == Some(&want) {
        return Ok(Rewritten {
            text: out,
            old_servers,
            changed: true,
            in_place: true,
        });
    }
    let text = serde_yaml::to_string(&want).map_err(|e| RepointError::NotYaml(e.to_string()))?;
    let back: Value =
        serde_yaml::from_str(&text).map_err(|e| RepointError::NotYaml(e.to_string()))?;
    if back != want {
        return Err(RepointError::Diverged);
    }
    Ok(Rewritten {
        text,
        old_servers,
        changed: true,
        in_place: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KC: &str = "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority-data: Q0EgUEVN\n    server: https://127.0.0.1:6443 # the local apiserver\n  name: kubernetes\ncontexts:\n- context:\n    cluster: kubernetes\n    user: admin\n  name: admin@kubernetes\ncurrent-context: admin@kubernetes\nusers:\n- name: admin\n  user:\n    client-certificate-data:   Q0VSVA==\n    client-key-data: \"S0VZ\"\n";

    #[test]
    fn only_the_server_changes_byte_for_byte() {
        let r = rewrite_server(KC, "https://10.0.0.100:6443").unwrap();
        assert!(r.changed && r.in_place);
        assert_eq!(r.old_servers, vec!["https://127.0.0.1:6443"]);
        let want = KC.replace("https://127.0.0.1:6443", "https://10.0.0.100:6443");
        assert_eq!(r.text, want);
        // Running it again changes nothing.
        let again = rewrite_server(&r.text, "https://10.0.0.100:6443").unwrap();
        assert!(!again.changed);
        assert_eq!(again.text, r.text);
    }

    #[test]
    fn quoted_and_first_key_servers_are_rewritten() {
        let kc = "clusters:\n- cluster:\n    server: \"https://a:1\"\n  name: a\n- name: b\n  cluster:\n    server: 'https://b:2'\n";
        let r = rewrite_server(kc, "https://[fd00::1]:6443").unwrap();
        assert!(r.in_place, "{}", r.text);
        assert_eq!(
            r.text.matches("https://[fd00::1]:6443").count(),
            2,
            "{}",
            r.text
        );
        let kc = "clusters:\n- cluster: {server: https://a:1, certificate-authority-data: QQ==}\n  name: a\n";
        let r = rewrite_server(kc, "https://10.0.0.1:6443").unwrap();
        assert!(!r.in_place);
        let v: Value = serde_yaml::from_str(&r.text).unwrap();
        assert_eq!(
            v["clusters"][0]["cluster"]["certificate-authority-data"],
            "QQ=="
        );
        assert_eq!(
            v["clusters"][0]["cluster"]["server"],
            "https://10.0.0.1:6443"
        );
    }

    #[test]
    fn a_server_key_elsewhere_is_not_touched() {
        // A `server:` line that is not a cluster's (here, inside an exec plugin's env)
        // would make the line edit diverge: the fallback keeps it.
        let kc = "clusters:\n- cluster:\n    server: https://a:1\n  name: a\nusers:\n- name: u\n  user:\n    exec:\n      env:\n      - name: X\n        server: https://a:1\n";
        let r = rewrite_server(kc, "https://10.0.0.1:6443").unwrap();
        let v: Value = serde_yaml::from_str(&r.text).unwrap();
        assert_eq!(
            v["users"][0]["user"]["exec"]["env"][0]["server"],
            "https://a:1"
        );
        assert_eq!(
            v["clusters"][0]["cluster"]["server"],
            "https://10.0.0.1:6443"
        );
    }

    #[test]
    fn spaces_tabs_quotes_and_multibyte_text_around_a_server_are_kept() {
        // The span is counted in bytes: whitespace of any width before the value, a quoted
        // old value, and a comment or old value with multi-byte characters.
        let kc = "clusters:\n\
                  - cluster:\n    server:    \"https://127.0.0.1:6443\"   # über den Proxy\n  name: a\n\
                  - cluster:\n    server:\t\t'https://bücher.example:6443' # ☃\n  name: b\n\
                  - cluster:\n    server: \t https://größe.example:6443 # ünïcode\n  name: c\n\
                  - cluster:\n    server:  https://127.0.0.1:6443\n  name: d\n";
        let r = rewrite_server(kc, "https://10.0.0.100:6443").unwrap();
        assert!(r.changed && r.in_place, "{}", r.text);
        assert_eq!(
            r.old_servers,
            [
                "https://127.0.0.1:6443",
                "https://bücher.example:6443",
                "https://größe.example:6443",
                "https://127.0.0.1:6443"
            ]
        );
        // A quoted value is replaced quotes and all: the new server is a plain scalar.
        let want = "clusters:\n\
                    - cluster:\n    server:    https://10.0.0.100:6443   # über den Proxy\n  name: a\n\
                    - cluster:\n    server:\t\thttps://10.0.0.100:6443 # ☃\n  name: b\n\
                    - cluster:\n    server: \t https://10.0.0.100:6443 # ünïcode\n  name: c\n\
                    - cluster:\n    server:  https://10.0.0.100:6443\n  name: d\n";
        assert_eq!(r.text, want);
    }

    #[test]
    fn a_list_item_named_server_is_not_a_clusters_and_is_kept_byte_for_byte() {
        // A cluster's server always sits under `cluster:`, never as a list item's first
        // key; a `- server:` line elsewhere (here an exec plugin's env) stays as it is, and
        // the rest of the file keeps its bytes.
        let kc = "clusters:\n- cluster:\n    server: https://127.0.0.1:6443\n  name: a\nusers:\n- name: u\n  user:\n    exec:\n      command: helper\n      env:\n      - server: https://elsewhere:1\n        name: X\n";
        let r = rewrite_server(kc, "https://10.0.0.100:6443").unwrap();
        assert!(r.changed && r.in_place, "{}", r.text);
        assert_eq!(
            r.text,
            kc.replace("https://127.0.0.1:6443", "https://10.0.0.100:6443")
        );
    }

    #[test]
    fn bad_servers_and_documents_are_refused() {
        for bad in [
            "http://10.0.0.1:6443",
            "https://10.0.0.1",
            "https://10.0.0.1:0",
            "https://a b:6443",
            "https://a\n- x:6443",
            "https://a#:6443",
        ] {
            assert!(
                matches!(rewrite_server(KC, bad), Err(RepointError::BadServer(_))),
                "{bad:?}"
            );
        }
        assert_eq!(
            rewrite_server("kind: Config\n", "https://a:1"),
            Err(RepointError::NoClusters)
        );
        assert!(matches!(
            rewrite_server("a: [", "https://a:1"),
            Err(RepointError::NotYaml(_))
        ));
        assert_eq!(
            server_url("fd00::1".parse().unwrap(), 6443),
            "https://[fd00::1]:6443"
        );
    }
}
