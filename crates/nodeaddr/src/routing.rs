//! Which name a node's tunnel route is derived from, and which nodes have no kubelet.

use k8s_openapi::api::core::v1::Node;

pub use common::keys::{RUNTIME_LABEL, RUNTIME_VIRTUAL};
/// Annotation in which k3s records the arguments a node was started with, as a JSON array
/// of strings (`--flag=value` split into two elements, secret values blanked).
pub const NODE_ARGS_ANNOTATION: &str = "k3s.io/node-args";

/// Annotation in which k3s records the `K3S_*` environment a node was started with, as a
/// JSON object of strings (secret values blanked). `K3S_NODE_NAME` there is the other way
/// to configure the node name.
pub const NODE_ENV_ANNOTATION: &str = "k3s.io/node-env";

/// The environment variable k3s reads the node name from when `--node-name` is not given.
pub const NODE_NAME_ENV: &str = "K3S_NODE_NAME";

/// Length of the suffix k3s' `--with-node-id` appends: `-` and 8 lowercase hex digits
/// (4 random bytes, hex-encoded, persisted on the node).
const NODE_ID_HEX_LEN: usize = 8;

/// Whether `node` is a virtual-kubelet node, judged by its [`RUNTIME_LABEL`] only.
///
/// A virtual node serves the pod lifecycle but not the kubelet's streaming API, so nothing
/// listens at a derived address for it. Publishing an ExternalIP for one would turn
/// "unsupported on a virtual node" into a dial timeout and spend an address in k3s' routing
/// index. Names are never consulted: a name is chosen by whoever registers the node.
pub fn is_virtual_node(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(RUNTIME_LABEL))
        .is_some_and(|v| v == RUNTIME_VIRTUAL)
}

/// The name the worker derives its kubelet route from.
///
/// With `--with-node-id`, k3s registers the node as `<configured name>-<8 hex digits>`, but
/// the worker only knows the configured `--node-name`. k3s records that argument in the
/// [`NODE_ARGS_ANNOTATION`] (`--node-name`) or, when the node was configured through its
/// environment, in the [`NODE_ENV_ANNOTATION`] (`K3S_NODE_NAME`). A command-line flag
/// wins over the environment, as on k3s' own command line. The configured name is used
/// only when the registered name is exactly that name or that name plus a node-id suffix.
/// Anything else (no annotation, malformed JSON, an unrelated name) yields
/// `metadata.name`, so annotation text cannot steer a route toward another node's port.
pub fn routing_name(node: &Node) -> String {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let annotation = |key: &str| {
        node.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    routing_name_from(
        name,
        annotation(NODE_ARGS_ANNOTATION),
        annotation(NODE_ENV_ANNOTATION),
    )
    .to_string()
}

/// [`routing_name`] over plain strings: the registered name and the raw values of the
/// node-args and node-env annotations.
///
/// The result is always `name` itself or a prefix of it that `name` extends by a k3s
/// node-id suffix.
pub fn routing_name_from<'a>(
    name: &'a str,
    node_args: Option<&str>,
    node_env: Option<&str>,
) -> &'a str {
    let configured = node_args
        .and_then(configured_node_name)
        .or_else(|| node_env.and_then(configured_node_name_env));
    let Some(configured) = configured else {
        return name;
    };
    if configured == name {
        return name;
    }
    match name.strip_prefix(configured.as_str()) {
        Some(suffix) if is_node_id_suffix(suffix) => &name[..configured.len()],
        _ => name,
    }
}

/// The last `--node-name` value in a k3s node-args annotation (`["--node-name", "x"]` or
/// `["--node-name=x"]`); `None` when the text is not a JSON array of strings or names no
/// non-empty node name. The last occurrence wins, as it does on k3s' command line.
pub fn configured_node_name(node_args: &str) -> Option<String> {
    let args: Vec<String> = serde_json::from_str(node_args).ok()?;
    let mut found = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--node-name" {
            found = iter.next().cloned();
        } else if let Some(v) = arg.strip_prefix("--node-name=") {
            found = Some(v.to_string());
        }
    }
    found.filter(|n| !n.is_empty())
}

/// `K3S_NODE_NAME` from a k3s node-env annotation (`{"K3S_NODE_NAME": "x", ...}`); `None`
/// when the text is not a JSON object or holds no non-empty string under that key. Other
/// keys and non-string values are ignored (k3s blanks secrets, it does not remove them).
pub fn configured_node_name_env(node_env: &str) -> Option<String> {
    let env: serde_json::Map<String, serde_json::Value> = serde_json::from_str(node_env).ok()?;
    env.get(NODE_NAME_ENV)?
        .as_str()
        .filter(|n| !n.is_empty())
        .map(str::to_string)
}

fn is_node_id_suffix(suffix: &str) -> bool {
    let Some(hex) = suffix.strip_prefix('-') else {
        return false;
    };
    hex.len() == NODE_ID_HEX_LEN && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn node_with_env(name: &str, args: Option<&str>, env: Option<&str>) -> Node {
        let mut n = node(name, args, &[]);
        if let Some(env) = env {
            n.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(NODE_ENV_ANNOTATION.into(), env.into());
        }
        n
    }

    #[test]
    fn node_env_names_the_node_when_the_args_do_not() {
        let env = r#"{"K3S_NODE_NAME":"box","K3S_TOKEN":"********"}"#;
        let n = node_with_env(
            "box-0a1b2c3d",
            Some(r#"["agent","--with-node-id"]"#),
            Some(env),
        );
        assert_eq!(routing_name(&n), "box");
        let n = node_with_env("box-0a1b2c3d", None, Some(env));
        assert_eq!(routing_name(&n), "box");
        // The flag wins over the environment, as on k3s' command line.
        let n = node_with_env(
            "box-0a1b2c3d",
            Some(r#"["agent","--node-name","box-0a1b2c3d"]"#),
            Some(env),
        );
        assert_eq!(routing_name(&n), "box-0a1b2c3d");
        // The same structural check: an unrelated name is ignored.
        let n = node_with_env("worker", None, Some(r#"{"K3S_NODE_NAME":"box"}"#));
        assert_eq!(routing_name(&n), "worker");
        for bad in [
            "[]",
            "not json",
            r#"{"K3S_NODE_NAME":7}"#,
            r#"{"K3S_NODE_NAME":""}"#,
        ] {
            assert_eq!(configured_node_name_env(bad), None, "{bad}");
        }
    }

    fn node(name: &str, args: Option<&str>, labels: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: args
                    .map(|a| BTreeMap::from([(NODE_ARGS_ANNOTATION.into(), a.into())])),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn node_id_suffix_is_stripped_when_the_annotation_names_the_prefix() {
        let n = node(
            "worker-1-0a1b2c3d",
            Some(r#"["agent","--node-name","worker-1","--with-node-id"]"#),
            &[],
        );
        assert_eq!(routing_name(&n), "worker-1");
        // k3s splits --flag=value, but a hand-written annotation may not have.
        let n = node(
            "worker-1-0a1b2c3d",
            Some(r#"["agent","--node-name=worker-1"]"#),
            &[],
        );
        assert_eq!(routing_name(&n), "worker-1");
    }

    #[test]
    fn equal_names_route_as_themselves() {
        let n = node(
            "worker-1",
            Some(r#"["server","--node-name","worker-1"]"#),
            &[],
        );
        assert_eq!(routing_name(&n), "worker-1");
    }

    #[test]
    fn anything_else_falls_back_to_the_registered_name() {
        let cases = [
            // No annotation.
            None,
            // Malformed JSON, wrong shapes.
            Some("not json"),
            Some(r#"{"--node-name":"worker"}"#),
            Some(r#"["--node-name", 7]"#),
            // Flag without a value, or empty.
            Some(r#"["--node-name"]"#),
            Some(r#"["--node-name",""]"#),
            // An unrelated name: another node's route must not be borrowed.
            Some(r#"["--node-name","other"]"#),
            // A prefix, but the suffix is not a k3s node id.
            Some(r#"["--node-name","worker"]"#),
            Some(r#"["--node-name","worker-1-0a1b"]"#),
        ];
        for args in cases {
            let n = node("worker-1-0a1b2c3d", args, &[]);
            assert_eq!(routing_name(&n), "worker-1-0a1b2c3d", "{args:?}");
        }
        // Uppercase hex is not what k3s writes.
        assert_eq!(
            routing_name_from("w-0A1B2C3D", Some(r#"["--node-name","w"]"#), None),
            "w-0A1B2C3D"
        );
        // Nine digits is not a node id either.
        assert_eq!(
            routing_name_from("w-0a1b2c3d4", Some(r#"["--node-name","w"]"#), None),
            "w-0a1b2c3d4"
        );
    }

    #[test]
    fn last_node_name_wins() {
        assert_eq!(
            configured_node_name(r#"["--node-name","a","--node-name=b"]"#).as_deref(),
            Some("b")
        );
        assert_eq!(configured_node_name(r#"["server"]"#), None);
    }

    #[test]
    fn virtual_nodes_are_known_by_label_not_name() {
        assert!(is_virtual_node(&node(
            "gpu",
            None,
            &[(RUNTIME_LABEL, RUNTIME_VIRTUAL)]
        )));
        assert!(!is_virtual_node(&node("virtual-kubelet", None, &[])));
        assert!(!is_virtual_node(&node(
            "gpu",
            None,
            &[(RUNTIME_LABEL, "host")]
        )));
        assert!(!is_virtual_node(&Node::default()));
    }

    fn is_related(name: &str, routed: &str) -> bool {
        routed == name
            || name
                .strip_prefix(routed)
                .is_some_and(|s| is_node_id_suffix(s) && !routed.is_empty())
    }

    proptest! {
        // Any annotation text: no panic, and the answer is the name or its k3s prefix.
        #[test]
        fn parser_never_panics_and_never_leaves_the_name(
            name in "\\PC{0,40}",
            args in "\\PC{0,200}",
            env in "\\PC{0,200}",
        ) {
            let routed = routing_name_from(&name, Some(&args), Some(&env));
            prop_assert!(is_related(&name, routed));
        }

        // Structured but hostile arrays: still the name or its k3s prefix.
        #[test]
        fn structured_arrays_stay_related(
            name in "[a-z0-9.-]{0,30}",
            args in proptest::collection::vec(
                prop_oneof![
                    Just("--node-name".to_string()),
                    "--node-name=[a-z0-9-]{0,20}",
                    "[a-z0-9-]{0,20}",
                    "\\PC{0,20}",
                ],
                0..8,
            ),
        ) {
            let json = serde_json::to_string(&args).unwrap();
            let env = serde_json::json!({ NODE_NAME_ENV: args.first() }).to_string();
            let routed = routing_name_from(&name, Some(&json), None);
            prop_assert!(is_related(&name, routed));
            let routed = routing_name_from(&name, None, Some(&env));
            prop_assert!(is_related(&name, routed));
        }

        // The round trip k3s performs: configured name plus node id maps back.
        #[test]
        fn k3s_node_ids_map_back(base in "[a-z][a-z0-9-]{0,30}", id in "[0-9a-f]{8}") {
            let registered = format!("{base}-{id}");
            let args = serde_json::to_string(&["agent", "--node-name", &base, "--with-node-id"]).unwrap();
            prop_assert_eq!(routing_name_from(&registered, Some(&args), None), base.as_str());
            let env = serde_json::json!({ NODE_NAME_ENV: base }).to_string();
            prop_assert_eq!(routing_name_from(&registered, None, Some(&env)), base.as_str());
        }
    }
}
