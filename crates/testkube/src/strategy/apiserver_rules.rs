//! Unit tests that pin each rule of [`super`] to what kube-apiserver does, one test per
//! rule, so that `cargo xtask mutants testkube` (unit tests only) catches a changed
//! decision without the conformance suite. The sources named are in kubernetes/kubernetes.

use base64::Engine;
use serde_json::{Value, json};

use super::*;
use crate::resources::find;

fn res(group: &str, plural: &str) -> &'static Resource {
    find(group, "v1", plural).unwrap_or_else(|| panic!("no resource {group}/v1 {plural}"))
}

fn core(plural: &str) -> &'static Resource {
    res("", plural)
}

/// The fields of the causes, in order.
fn fields(causes: &[Cause]) -> Vec<&str> {
    causes.iter().map(|c| c.field.as_str()).collect()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn secret(ty: Option<&str>, data: Value) -> Value {
    let mut s = json!({"metadata": {"name": "s", "namespace": "default"}, "data": data});
    if let Some(ty) = ty {
        s["type"] = json!(ty);
    }
    s
}

fn configmap(data: Value, binary: Value) -> Value {
    json!({"metadata": {"name": "c", "namespace": "default"}, "data": data, "binaryData": binary})
}

// --- names (`staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go`) ---

#[test]
fn dns_labels_are_lowercase_alphanumerics_and_inner_dashes_up_to_63() {
    for ok in ["my-name", "123-abc", "a", &"a".repeat(63)] {
        assert!(is_dns_label(ok), "{ok:?} is a label");
    }
    for bad in ["", &"a".repeat(64), "-a", "a-", "A", "a_b", "a.b"] {
        assert!(!is_dns_label(bad), "{bad:?} is not a label");
    }
}

#[test]
fn dns_subdomains_are_dotted_labels_up_to_253() {
    let longest = format!("{}.{}", "a".repeat(63), "b".repeat(189));
    assert_eq!(longest.len(), 253);
    for ok in ["example.com", "a-1.b-2", longest.as_str()] {
        assert!(is_dns_subdomain(ok), "{ok:?} is a subdomain");
    }
    for bad in [
        "",
        &format!("{longest}c"),
        ".a",
        "a.",
        "a..b",
        "-a.b",
        "a-.b",
        "a.B",
    ] {
        assert!(!is_dns_subdomain(bad), "{bad:?} is not a subdomain");
    }
}

#[test]
fn each_name_rule_refuses_only_its_own_invalid_names() {
    assert_eq!(name_problem(NameRule::Subdomain, "example.com"), None);
    assert!(
        name_problem(NameRule::Subdomain, "Example")
            .unwrap()
            .contains("subdomain")
    );
    assert_eq!(name_problem(NameRule::Label, "my-name"), None);
    assert!(
        name_problem(NameRule::Label, "a.b")
            .unwrap()
            .contains("RFC 1123 label")
    );
    // Path segments (RBAC names) allow what the DNS rules refuse, except these.
    assert_eq!(name_problem(NameRule::PathSegment, "system:Node_1"), None);
    for dots in [".", ".."] {
        assert_eq!(
            name_problem(NameRule::PathSegment, dots),
            Some("may not be '.' or '..'"),
            "{dots:?}"
        );
    }
    assert_eq!(name_problem(NameRule::PathSegment, "..."), None);
    for bad in ["a/b", "a%b"] {
        assert_eq!(
            name_problem(NameRule::PathSegment, bad),
            Some("may not contain '/' or '%'"),
            "{bad:?}"
        );
    }
}

// --- labels (`ValidateLabels`) ---

#[test]
fn label_values_are_empty_or_63_characters_starting_and_ending_alphanumeric() {
    let cms = core("configmaps");
    let with_label = |v: Value| json!({"metadata": {"name": "c", "labels": {"k": v}}});
    for ok in ["", "a", "A-b_c.9", &"a".repeat(63)] {
        assert!(validate(cms, &with_label(json!(ok))).is_empty(), "{ok:?}");
    }
    for bad in [&"a".repeat(64), "a b", "-a", "a-", "_", "a/b"] {
        let causes = validate(cms, &with_label(json!(bad)));
        assert_eq!(fields(&causes), ["metadata.labels"], "{bad:?}");
        assert_eq!(causes[0].reason, "FieldValueInvalid");
    }
    // A null labels map is no map at all; anything else that is not a map is refused.
    let null = json!({"metadata": {"name": "c", "labels": null}});
    assert!(validate(cms, &null).is_empty());
    let list = json!({"metadata": {"name": "c", "labels": ["a"]}});
    let causes = validate(cms, &list);
    assert_eq!(fields(&causes), ["metadata.labels"]);
    assert!(causes[0].message.ends_with("must be a map"), "{causes:?}");
}

// --- leases (`ValidateLeaseSpec`) ---

#[test]
fn lease_durations_must_be_positive() {
    let leases = res("coordination.k8s.io", "leases");
    let lease = |d: Value| json!({"metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": d}});
    assert!(validate(leases, &lease(json!(40))).is_empty());
    assert!(validate(leases, &lease(json!(1))).is_empty());
    for bad in [json!(0), json!(-1), json!("40")] {
        assert_eq!(
            fields(&validate(leases, &lease(bad.clone()))),
            ["spec.leaseDurationSeconds"],
            "{bad}"
        );
    }
    assert!(validate(leases, &json!({"metadata": {"name": "l"}, "spec": {}})).is_empty());
}

// --- Secret and ConfigMap data (`ValidateSecret`, `ValidateConfigMap`, `IsConfigMapKey`) ---

#[test]
fn data_keys_follow_is_config_map_key() {
    for ok in [
        "key.name",
        "KEY_NAME",
        "key-name",
        ".dockercfg",
        "a..b",
        &"k".repeat(253),
    ] {
        assert_eq!(config_key_problem(ok), None, "{ok:?}");
    }
    assert_eq!(
        config_key_problem(""),
        Some("must be no more than 253 characters".into())
    );
    assert_eq!(
        config_key_problem(&"k".repeat(254)),
        Some("must be no more than 253 characters".into())
    );
    assert!(
        config_key_problem("a b")
            .unwrap()
            .starts_with("a valid config key")
    );
    assert!(
        config_key_problem("a/b")
            .unwrap()
            .starts_with("a valid config key")
    );
    assert_eq!(config_key_problem("."), Some("must not be '.'".into()));
    assert_eq!(config_key_problem(".."), Some("must not be '..'".into()));
    assert_eq!(
        config_key_problem("..a"),
        Some("must not start with '..'".into())
    );
}

#[test]
fn secret_and_config_map_data_keys_are_validated() {
    let causes = validate(core("secrets"), &secret(None, json!({"ok": "", "a b": ""})));
    assert_eq!(fields(&causes), ["data[a b]"]);
    let causes = validate(
        core("configmaps"),
        &configmap(
            json!({"ok": "v", "..x": "v"}),
            json!({"bin": b64(b"v"), "/": b64(b"v")}),
        ),
    );
    assert_eq!(fields(&causes), ["data[..x]", "binaryData[/]"]);
}

#[test]
fn a_config_map_key_may_not_be_in_both_data_and_binary_data() {
    let cms = core("configmaps");
    assert!(
        validate(
            cms,
            &configmap(json!({"a": "1", "b": "2"}), json!({"c": b64(b"3")}))
        )
        .is_empty()
    );
    let causes = validate(cms, &configmap(json!({"a": "1"}), json!({"a": b64(b"1")})));
    assert_eq!(fields(&causes), ["binaryData[a]"]);
    assert!(
        causes[0]
            .message
            .ends_with("duplicate of key present in data")
    );
}

#[test]
fn the_size_limit_is_one_mebibyte() {
    assert_eq!(MAX_DATA_SIZE, 1_048_576);
}

#[test]
fn secret_data_may_hold_one_mebibyte_decoded() {
    let secrets = core("secrets");
    let half = b64(&vec![7u8; MAX_DATA_SIZE / 2]);
    let exact = secret(None, json!({"a": half, "b": half}));
    assert!(validate(secrets, &exact).is_empty());
    let over = secret(None, json!({"a": half, "b": half, "c": b64(b"x")}));
    let causes = validate(secrets, &over);
    assert_eq!(fields(&causes), ["data"]);
    assert_eq!(causes[0].reason, "FieldValueTooLong");
    assert_eq!(
        causes[0].message,
        "Too long: must have at most 1048576 bytes"
    );
    // One big value alone counts as much as its bytes.
    let one = secret(None, json!({"a": b64(&vec![7u8; MAX_DATA_SIZE + 1])}));
    assert_eq!(fields(&validate(secrets, &one)), ["data"]);
}

#[test]
fn config_map_data_counts_characters_and_binary_data_decoded_bytes() {
    let cms = core("configmaps");
    // `data` counts its strings' bytes: one past the limit (not valid base64) is refused.
    let text_over = configmap(json!({"a": "x".repeat(MAX_DATA_SIZE + 1)}), json!({}));
    let causes = validate(cms, &text_over);
    assert_eq!(fields(&causes), [""]);
    assert_eq!(causes[0].reason, "FieldValueTooLong");
    let text_exact = configmap(json!({"a": "x".repeat(MAX_DATA_SIZE)}), json!({}));
    assert!(validate(cms, &text_exact).is_empty());
    // `binaryData` counts decoded bytes, not the longer base64 text.
    let bin_exact = configmap(json!({}), json!({"b": b64(&vec![1u8; MAX_DATA_SIZE])}));
    assert!(validate(cms, &bin_exact).is_empty());
    let bin_over = configmap(json!({}), json!({"b": b64(&vec![1u8; MAX_DATA_SIZE + 1])}));
    assert_eq!(fields(&validate(cms, &bin_over)), [""]);
    // Both add up.
    let both = configmap(
        json!({"a": "x".repeat(MAX_DATA_SIZE / 2)}),
        json!({"b": b64(&vec![1u8; MAX_DATA_SIZE / 2 + 1])}),
    );
    assert_eq!(fields(&validate(cms, &both)), [""]);
}

// --- Secret types (`ValidateSecret`'s switch on the type) ---

#[test]
fn service_account_token_secrets_name_their_service_account() {
    let secrets = core("secrets");
    let ty = Some("kubernetes.io/service-account-token");
    let mut named = secret(ty, json!({}));
    named["metadata"]["annotations"] = json!({"kubernetes.io/service-account.name": "default"});
    assert!(validate(secrets, &named).is_empty());
    let causes = validate(secrets, &secret(ty, json!({})));
    assert_eq!(
        fields(&causes),
        ["metadata.annotations[kubernetes.io/service-account.name]"]
    );
    assert_eq!(causes[0].reason, "FieldValueRequired");
    let mut empty = named.clone();
    empty["metadata"]["annotations"]["kubernetes.io/service-account.name"] = json!("");
    assert_eq!(validate(secrets, &empty).len(), 1);
}

#[test]
fn typed_secrets_need_their_keys() {
    let secrets = core("secrets");
    for (ty, key) in [
        ("kubernetes.io/dockercfg", ".dockercfg"),
        ("kubernetes.io/dockerconfigjson", ".dockerconfigjson"),
        ("kubernetes.io/ssh-auth", "ssh-privatekey"),
    ] {
        let with = secret(Some(ty), json!({key: b64(b"x")}));
        assert!(validate(secrets, &with).is_empty(), "{ty} with {key}");
        let without = secret(Some(ty), json!({"other": b64(b"x")}));
        let causes = validate(secrets, &without);
        assert_eq!(fields(&causes), [format!("data[{key}]")], "{ty}");
        assert_eq!(causes[0].reason, "FieldValueRequired");
    }
    // An Opaque secret (or one without a type) needs no key.
    assert!(validate(secrets, &secret(Some("Opaque"), json!({}))).is_empty());
    assert!(validate(secrets, &secret(None, json!({}))).is_empty());
}

#[test]
fn basic_auth_secrets_need_a_username_or_a_password() {
    let secrets = core("secrets");
    let ty = Some("kubernetes.io/basic-auth");
    for keys in [
        json!({"username": ""}),
        json!({"password": ""}),
        json!({"username": "", "password": ""}),
    ] {
        assert!(
            validate(secrets, &secret(ty, keys.clone())).is_empty(),
            "{keys}"
        );
    }
    assert_eq!(
        fields(&validate(secrets, &secret(ty, json!({})))),
        ["data[username]", "data[password]"]
    );
}

#[test]
fn tls_secrets_need_a_certificate_and_a_key() {
    let secrets = core("secrets");
    let ty = Some("kubernetes.io/tls");
    let both = json!({"tls.crt": b64(b"c"), "tls.key": b64(b"k")});
    assert!(validate(secrets, &secret(ty, both)).is_empty());
    assert_eq!(
        fields(&validate(secrets, &secret(ty, json!({})))),
        ["data[tls.crt]", "data[tls.key]"]
    );
    assert_eq!(
        fields(&validate(
            secrets,
            &secret(ty, json!({"tls.crt": b64(b"c")}))
        )),
        ["data[tls.key]"]
    );
}

// --- updates of Secrets, ConfigMaps and RoleBindings ---

#[test]
fn a_secret_type_is_immutable() {
    let secrets = core("secrets");
    let old = secret(Some("Opaque"), json!({"a": b64(b"1")}));
    let same = secret(Some("Opaque"), json!({"a": b64(b"2")}));
    assert!(validate_kind_update(secrets, &same, &old).is_empty());
    let changed = secret(Some("kubernetes.io/tls"), json!({"a": b64(b"1")}));
    let causes = validate_kind_update(secrets, &changed, &old);
    assert_eq!(fields(&causes), ["type"]);
    assert!(causes[0].message.ends_with("field is immutable"));
}

#[test]
fn mutable_secrets_and_config_maps_change_freely() {
    let old = secret(None, json!({"a": b64(b"1")}));
    let new = secret(None, json!({"a": b64(b"2")}));
    assert!(validate_kind_update(core("secrets"), &new, &old).is_empty());
    let mut off = old.clone();
    off["immutable"] = json!(false);
    let mut on = new.clone();
    on["immutable"] = json!(true);
    assert!(validate_kind_update(core("secrets"), &on, &off).is_empty());
    let old = configmap(json!({"a": "1"}), json!({}));
    let new = configmap(json!({"a": "2"}), json!({"b": b64(b"2")}));
    assert!(validate_kind_update(core("configmaps"), &new, &old).is_empty());
}

#[test]
fn an_immutable_secret_keeps_its_data_and_stays_immutable() {
    let secrets = core("secrets");
    let mut old = secret(None, json!({"a": b64(b"1")}));
    old["immutable"] = json!(true);
    // Metadata may still change.
    let mut relabelled = old.clone();
    relabelled["metadata"]["labels"] = json!({"x": "y"});
    assert!(validate_kind_update(secrets, &relabelled, &old).is_empty());
    let mut changed = old.clone();
    changed["data"]["a"] = json!(b64(b"2"));
    let causes = validate_kind_update(secrets, &changed, &old);
    assert_eq!(fields(&causes), ["data"]);
    assert_eq!(causes[0].reason, "FieldValueForbidden");
    let mut mutable = old.clone();
    mutable["immutable"] = json!(false);
    assert_eq!(
        fields(&validate_kind_update(secrets, &mutable, &old)),
        ["immutable"]
    );
    // An empty data map and no data are the same.
    let mut empty = secret(None, json!({}));
    empty["immutable"] = json!(true);
    let mut none = empty.clone();
    none.as_object_mut().unwrap().remove("data");
    assert!(validate_kind_update(secrets, &none, &empty).is_empty());
}

#[test]
fn an_immutable_config_map_keeps_data_and_binary_data() {
    let cms = core("configmaps");
    let mut old = configmap(json!({"a": "1"}), json!({"b": b64(b"1")}));
    old["immutable"] = json!(true);
    assert!(validate_kind_update(cms, &old.clone(), &old).is_empty());
    let mut data = old.clone();
    data["data"]["a"] = json!("2");
    assert_eq!(fields(&validate_kind_update(cms, &data, &old)), ["data"]);
    let mut binary = old.clone();
    binary["binaryData"]["b"] = json!(b64(b"2"));
    assert_eq!(
        fields(&validate_kind_update(cms, &binary, &old)),
        ["binaryData"]
    );
}

#[test]
fn a_role_binding_keeps_its_role_ref() {
    let rb = |role: &str| {
        json!({"metadata": {"name": "b"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "User", "name": "u"}]})
    };
    for plural in ["rolebindings", "clusterrolebindings"] {
        let r = res("rbac.authorization.k8s.io", plural);
        let mut more = rb("a");
        more["subjects"] = json!([{"kind": "User", "name": "u"}, {"kind": "User", "name": "v"}]);
        assert!(
            validate_kind_update(r, &more, &rb("a")).is_empty(),
            "{plural}"
        );
        let causes = validate_kind_update(r, &rb("b"), &rb("a"));
        assert_eq!(fields(&causes), ["roleRef"], "{plural}");
        assert!(causes[0].message.ends_with("cannot change roleRef"));
    }
}

// --- nodes (`ValidateNode`, `ValidateNodeUpdate`) ---

fn node(spec: Value, status: Value) -> Value {
    json!({"metadata": {"name": "n"}, "spec": spec, "status": status})
}

#[test]
fn node_pod_cidrs_and_provider_id_are_fixed_once_set() {
    let nodes = core("nodes");
    let unset = node(json!({}), json!({}));
    let set = node(
        json!({"podCIDRs": ["10.0.0.0/24"], "providerID": "p://1"}),
        json!({}),
    );
    assert!(validate_kind_update(nodes, &set, &unset).is_empty());
    assert!(validate_kind_update(nodes, &set.clone(), &set).is_empty());
    let empty = node(json!({"podCIDRs": [], "providerID": ""}), json!({}));
    assert!(validate_kind_update(nodes, &set, &empty).is_empty());
    let moved = node(
        json!({"podCIDRs": ["10.0.1.0/24"], "providerID": "p://1"}),
        json!({}),
    );
    let causes = validate_kind_update(nodes, &moved, &set);
    assert_eq!(fields(&causes), ["spec.podCIDRs"]);
    assert_eq!(causes[0].reason, "FieldValueForbidden");
    let renamed = node(
        json!({"podCIDRs": ["10.0.0.0/24"], "providerID": "p://2"}),
        json!({}),
    );
    assert_eq!(
        fields(&validate_kind_update(nodes, &renamed, &set)),
        ["spec.providerID"]
    );
    assert_eq!(
        fields(&validate_kind_update(nodes, &unset, &set)),
        ["spec.podCIDRs", "spec.providerID"]
    );
}

#[test]
fn node_addresses_are_unique_by_type_and_address() {
    let nodes = core("nodes");
    let addrs = |a: Value| node(json!({}), json!({"addresses": a}));
    let distinct = addrs(json!([
        {"type": "InternalIP", "address": "10.0.0.1"},
        {"type": "ExternalIP", "address": "10.0.0.1"},
        {"type": "InternalIP", "address": "10.0.0.2"},
    ]));
    assert!(validate(nodes, &distinct).is_empty());
    let twice = addrs(json!([
        {"type": "InternalIP", "address": "10.0.0.1"},
        {"type": "Hostname", "address": "n"},
        {"type": "InternalIP", "address": "10.0.0.1"},
    ]));
    let causes = validate(nodes, &twice);
    assert_eq!(fields(&causes), ["status.addresses[2]"]);
    assert_eq!(causes[0].reason, "FieldValueDuplicate");
}

fn tainted(taints: Value) -> Value {
    node(json!({"taints": taints}), json!({}))
}

#[test]
fn node_taints_are_well_formed() {
    let nodes = core("nodes");
    let good = tainted(json!([
        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
        {"key": "dedicated", "value": "infra-1", "effect": "PreferNoSchedule"},
        {"key": "dedicated", "value": "", "effect": "NoExecute"},
    ]));
    assert!(validate(nodes, &good).is_empty());
    let bad = tainted(json!([
        {"key": "", "effect": "NoSchedule"},
        {"key": "bad key", "effect": "NoSchedule"},
        {"key": "k", "value": "a b", "effect": "NoSchedule"},
        {"key": "k2"},
        {"key": "k3", "effect": "Sometimes"},
    ]));
    let causes = validate(nodes, &bad);
    assert_eq!(
        fields(&causes),
        [
            "spec.taints[0].key",
            "spec.taints[1].key",
            "spec.taints[2].value",
            "spec.taints[3].effect",
            "spec.taints[4].effect"
        ]
    );
    let reasons: Vec<_> = causes.iter().map(|c| c.reason).collect();
    assert_eq!(
        reasons,
        [
            "FieldValueRequired",
            "FieldValueInvalid",
            "FieldValueInvalid",
            "FieldValueRequired",
            "FieldValueNotSupported"
        ]
    );
}

#[test]
fn node_taints_are_unique_by_key_and_effect() {
    let nodes = core("nodes");
    let twice = tainted(json!([
        {"key": "k", "value": "a", "effect": "NoSchedule"},
        {"key": "k", "value": "b", "effect": "NoExecute"},
        {"key": "k", "value": "c", "effect": "NoSchedule"},
    ]));
    let causes = validate(nodes, &twice);
    assert_eq!(fields(&causes), ["spec.taints[2]"]);
    assert_eq!(causes[0].reason, "FieldValueDuplicate");
}

#[test]
fn label_values_and_qualified_names() {
    for ok in ["a", "A-b_c.9", &"a".repeat(63)] {
        assert!(is_label_value(ok), "{ok:?}");
    }
    for bad in ["", &"a".repeat(64), "a b", "-a", "a-", ".", "a/b"] {
        assert!(!is_label_value(bad), "{bad:?}");
    }
    for ok in [
        "k",
        "example.com/name",
        "node-role.kubernetes.io/control-plane",
        "a/B_c",
    ] {
        assert!(is_qualified_name(ok), "{ok:?}");
    }
    for bad in [
        "",
        "/name",
        "a/",
        "Example.com/name",
        "bad prefix/name",
        "example.com/-name",
        "a b",
        "a/b/c",
    ] {
        assert!(!is_qualified_name(bad), "{bad:?}");
    }
}

// --- pods ---

fn pod(node: Option<&str>) -> Value {
    let mut p = json!({"metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    p
}

#[test]
fn a_pod_needs_at_least_one_container() {
    let pods = core("pods");
    assert!(validate(pods, &pod(None)).is_empty());
    for containers in [json!([]), Value::Null] {
        let mut p = pod(None);
        p["spec"]["containers"] = containers.clone();
        let causes = validate(pods, &p);
        assert_eq!(fields(&causes), ["spec.containers"], "{containers}");
        assert_eq!(causes[0].reason, "FieldValueRequired");
    }
}

#[test]
fn a_gated_pod_may_extend_its_node_selector() {
    let mut old = pod(None);
    old["spec"]["schedulingGates"] = json!([{"name": "g"}]);
    old["spec"]["nodeSelector"] = json!({"zone": "a"});
    let mut extended = old.clone();
    extended["spec"]["nodeSelector"]["rack"] = json!("1");
    assert!(validate_pod_update(&extended, &old).is_empty());
    // Once the gates are gone, the selector is fixed.
    let mut ungated = old.clone();
    ungated["spec"]["schedulingGates"] = json!([]);
    let mut then_extended = ungated.clone();
    then_extended["spec"]["nodeSelector"]["rack"] = json!("1");
    assert_eq!(
        fields(&validate_pod_update(&then_extended, &ungated)),
        ["spec"]
    );
}

#[test]
fn tolerations_may_be_added_but_not_removed() {
    let mut old = pod(Some("n"));
    old["spec"]["tolerations"] = json!([{"key": "a", "operator": "Exists"}]);
    let mut added = old.clone();
    added["spec"]["tolerations"] =
        json!([{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}]);
    assert!(validate_pod_update(&added, &old).is_empty());
    assert!(validate_pod_update(&old.clone(), &old).is_empty());
    let mut removed = old.clone();
    removed["spec"]["tolerations"] = json!([]);
    let causes = validate_pod_update(&removed, &old);
    assert_eq!(fields(&causes), ["spec.tolerations"]);
    assert_eq!(causes[0].reason, "FieldValueForbidden");
}

#[test]
fn guaranteed_needs_cpu_and_memory_limits() {
    let mut p = pod(None);
    p["spec"]["containers"][0]["resources"] =
        json!({"requests": {"cpu": "1"}, "limits": {"cpu": "1"}});
    assert_eq!(qos_class(&p), "Burstable");
    p["spec"]["containers"][0]["resources"] =
        json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}});
    assert_eq!(qos_class(&p), "Burstable");
}

#[test]
fn pod_create_applies_the_defaults() {
    let mut p = pod(None);
    p["spec"]["containers"] = json!([
        {"name": "a", "image": "busybox"},
        {"name": "b", "image": "busybox:latest"},
        {"name": "c", "image": "busybox:1.36"},
        {"name": "d", "image": "registry:5000/busybox"},
        {"name": "e", "image": "registry:5000/busybox:1.36", "imagePullPolicy": "Never",
         "terminationMessagePath": "/t", "terminationMessagePolicy": "FallbackToLogsOnError",
         "resources": {"limits": {"cpu": "1"}}},
    ]);
    p["spec"]["restartPolicy"] = json!("Never");
    prepare_create(core("pods"), &mut p);
    let spec = &p["spec"];
    assert_eq!(spec["restartPolicy"], "Never");
    assert_eq!(spec["terminationGracePeriodSeconds"], 30);
    assert_eq!(spec["dnsPolicy"], "ClusterFirst");
    assert_eq!(spec["schedulerName"], "default-scheduler");
    assert_eq!(spec["securityContext"], json!({}));
    assert_eq!(spec["enableServiceLinks"], true);
    assert_eq!(spec["preemptionPolicy"], "PreemptLowerPriority");
    assert_eq!(spec["priority"], 0);
    let pulls: Vec<_> = spec["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["imagePullPolicy"].as_str().unwrap())
        .collect();
    assert_eq!(
        pulls,
        ["Always", "Always", "IfNotPresent", "Always", "Never"]
    );
    let c = &spec["containers"][0];
    assert_eq!(c["terminationMessagePath"], "/dev/termination-log");
    assert_eq!(c["terminationMessagePolicy"], "File");
    assert_eq!(c["resources"], json!({}));
    let e = &spec["containers"][4];
    assert_eq!(e["terminationMessagePath"], "/t");
    assert_eq!(e["terminationMessagePolicy"], "FallbackToLogsOnError");
    assert_eq!(e["resources"]["limits"]["cpu"], "1");
    assert_eq!(p["status"]["qosClass"], "Burstable");
    assert!(p["status"].get("conditions").is_none());
}

#[test]
fn a_put_without_the_defaulted_fields_is_no_spec_change() {
    let pods = core("pods");
    let mut old = pod(Some("n"));
    prepare_create(pods, &mut old);
    assert_eq!(old["metadata"]["generation"], 1);
    // The handler's order: the stored system fields first, then the strategy.
    let mut new = pod(Some("n"));
    carry_system_meta(&mut new, &old);
    prepare_update(pods, &mut new, &old);
    assert_eq!(new["spec"], old["spec"]);
    assert_eq!(new["metadata"]["generation"], 1);
    // A real change moves the generation.
    let mut changed = pod(Some("n"));
    changed["spec"]["activeDeadlineSeconds"] = json!(60);
    carry_system_meta(&mut changed, &old);
    prepare_update(pods, &mut changed, &old);
    assert_eq!(changed["metadata"]["generation"], 2);
}

#[test]
fn a_node_update_is_not_defaulted_and_drops_config_source() {
    let mut old = node(json!({"unschedulable": true}), json!({}));
    let mut new = node(
        json!({"unschedulable": false, "configSource": {"x": 1}}),
        json!({}),
    );
    prepare_create(core("nodes"), &mut old);
    assert!(old["metadata"].get("generation").is_none());
    prepare_update(core("nodes"), &mut new, &old);
    assert_eq!(new["spec"], json!({"unschedulable": false}));
    assert!(new["metadata"].get("generation").is_none());
}

// --- create of the other kinds (their `PrepareForCreate`) ---

#[test]
fn node_create_drops_config_and_config_source() {
    let mut n = node(
        json!({"configSource": {"configMap": {}}, "podCIDRs": ["10.0.0.0/24"]}),
        json!({"config": {"active": {}}, "addresses": []}),
    );
    prepare_create(core("nodes"), &mut n);
    assert_eq!(n["spec"], json!({"podCIDRs": ["10.0.0.0/24"]}));
    assert_eq!(n["status"], json!({"addresses": []}));
}

#[test]
fn namespace_create_is_active_with_the_kubernetes_finalizer_and_name_label() {
    let mut ns = json!({"metadata": {"name": "team-a", "labels": {"x": "y"}}});
    prepare_create(core("namespaces"), &mut ns);
    assert_eq!(ns["status"], json!({"phase": "Active"}));
    assert_eq!(ns["spec"], json!({"finalizers": ["kubernetes"]}));
    assert_eq!(
        ns["metadata"]["labels"],
        json!({"x": "y", "kubernetes.io/metadata.name": "team-a"})
    );
}

#[test]
fn secret_create_defaults_the_type_to_opaque() {
    let secrets = core("secrets");
    for ty in [None, Some("")] {
        let mut s = secret(ty, json!({}));
        prepare_create(secrets, &mut s);
        assert_eq!(s["type"], "Opaque", "{ty:?}");
    }
    let mut tls = secret(Some("kubernetes.io/tls"), json!({}));
    prepare_create(secrets, &mut tls);
    assert_eq!(tls["type"], "kubernetes.io/tls");
}

#[test]
fn workload_and_service_create_reset_the_status() {
    for (group, plural) in [
        ("apps", "deployments"),
        ("apps", "daemonsets"),
        ("", "services"),
    ] {
        let mut o = json!({"metadata": {"name": "x", "generation": 7}, "spec": {}, "status": {"readyReplicas": 3}});
        prepare_create(res(group, plural), &mut o);
        assert_eq!(o["status"], json!({}), "{plural}");
    }
}

// --- update metadata (`rest.BeforeUpdate`, `ValidateObjectMetaUpdate`) ---

#[test]
fn an_update_takes_the_system_fields_from_the_stored_object() {
    let old = json!({"metadata": {"name": "c", "uid": "u-1", "creationTimestamp": "2026-01-01T00:00:00Z",
        "generation": 3, "deletionTimestamp": "2026-01-02T00:00:00Z", "deletionGracePeriodSeconds": 30}});
    for uid in [None, Some(json!("")), Some(Value::Null)] {
        let mut new = json!({"metadata": {"name": "c", "creationTimestamp": "2030-01-01T00:00:00Z", "generation": 9}});
        if let Some(u) = uid.clone() {
            new["metadata"]["uid"] = u;
        }
        carry_system_meta(&mut new, &old);
        assert_eq!(new["metadata"], old["metadata"], "uid {uid:?}");
        assert!(validate_meta_update(&new, &old).is_empty());
    }
}

#[test]
fn an_update_keeps_its_own_uid_and_grace_period() {
    // Only a missing uid or grace period is filled in; a different one stays, to be
    // refused (the uid as a precondition, the grace period as immutable).
    let old = json!({"metadata": {"name": "c", "uid": "u-1", "deletionTimestamp": "2026-01-02T00:00:00Z",
        "deletionGracePeriodSeconds": 30}});
    let mut new =
        json!({"metadata": {"name": "c", "uid": "u-2", "deletionGracePeriodSeconds": 10}});
    carry_system_meta(&mut new, &old);
    assert_eq!(new["metadata"]["uid"], "u-2");
    assert_eq!(new["metadata"]["deletionGracePeriodSeconds"], 10);
    let causes = validate_meta_update(&new, &old);
    assert_eq!(fields(&causes), ["metadata.deletionGracePeriodSeconds"]);
    assert!(causes[0].message.ends_with("field is immutable"));
}

#[test]
fn an_update_without_a_stored_generation_has_none() {
    let old = json!({"metadata": {"name": "c", "uid": "u-1"}});
    let mut new = json!({"metadata": {"name": "c", "generation": 4}});
    carry_system_meta(&mut new, &old);
    assert_eq!(new["metadata"], json!({"name": "c", "uid": "u-1"}));
}

#[test]
fn an_update_may_not_start_a_deletion() {
    let old = json!({"metadata": {"name": "c"}});
    let new = json!({"metadata": {"name": "c", "deletionTimestamp": "2026-01-02T00:00:00Z", "deletionGracePeriodSeconds": 0}});
    let causes = validate_meta_update(&new, &old);
    assert_eq!(
        fields(&causes),
        [
            "metadata.deletionTimestamp",
            "metadata.deletionGracePeriodSeconds"
        ]
    );
    assert!(causes.iter().all(|c| c.reason == "FieldValueInvalid"));
    let nulls = json!({"metadata": {"name": "c", "deletionTimestamp": null, "deletionGracePeriodSeconds": null}});
    assert!(validate_meta_update(&nulls, &old).is_empty());
}

// `ValidateObjectMetaAccessorUpdate` -> `ValidateNoNewFinalizers`
// (`staging/src/k8s.io/apimachinery/pkg/api/validation/objectmeta.go`): once the old
// object has a deletionTimestamp, the new finalizers must be a subset of the old ones.
#[test]
fn an_object_being_deleted_takes_no_new_finalizers() {
    let old = json!({"metadata": {"name": "c", "deletionTimestamp": "2026-01-02T00:00:00Z",
        "deletionGracePeriodSeconds": 0, "finalizers": ["a", "b"]}});
    let mut fewer = old.clone();
    fewer["metadata"]["finalizers"] = json!(["b"]);
    assert!(validate_meta_update(&fewer, &old).is_empty());
    let mut none = old.clone();
    none["metadata"]["finalizers"] = Value::Null;
    assert!(validate_meta_update(&none, &old).is_empty());
    let mut reordered = old.clone();
    reordered["metadata"]["finalizers"] = json!(["b", "a", "a"]);
    assert!(validate_meta_update(&reordered, &old).is_empty());
    assert!(validate_meta_update(&old.clone(), &old).is_empty());
    // One Forbidden cause for all the additions: a sorted set, duplicates once, worded
    // with Go's `%#v` of the `[]string`.
    let mut more = old.clone();
    more["metadata"]["finalizers"] = json!(["z/z", "a", "c/c", "z/z"]);
    let causes = validate_meta_update(&more, &old);
    assert_eq!(fields(&causes), ["metadata.finalizers"]);
    assert_eq!(causes[0].reason, "FieldValueForbidden");
    assert_eq!(
        causes[0].message,
        r#"Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{"c/c", "z/z"}"#
    );
    // It comes before the immutable-field causes, as the Go function appends them.
    more["metadata"]["deletionGracePeriodSeconds"] = json!(5);
    let causes = validate_meta_update(&more, &old);
    assert_eq!(
        fields(&causes),
        ["metadata.finalizers", "metadata.deletionGracePeriodSeconds"]
    );
    // Before the deletion, finalizers come and go.
    let live = json!({"metadata": {"name": "c", "finalizers": ["a"]}});
    let added = json!({"metadata": {"name": "c", "finalizers": ["a", "c"]}});
    assert!(validate_meta_update(&added, &live).is_empty());
}

#[test]
fn a_node_status_update_keeps_the_spec_and_drops_config() {
    let nodes = core("nodes");
    let old = node(json!({"podCIDRs": ["10.0.0.0/24"]}), json!({}));
    let mut new = node(
        json!({}),
        json!({"config": {"active": {}}, "phase": "Running"}),
    );
    new["metadata"]["labels"] = json!({"x": "y"});
    prepare_status_update(nodes, &mut new, &old);
    assert_eq!(new["spec"], old["spec"]);
    assert_eq!(new["status"], json!({"phase": "Running"}));
    assert_eq!(new["metadata"]["labels"], json!({"x": "y"}));
}

// --- times (`metav1.Time`, `metav1.MicroTime`) ---

#[test]
fn times_are_written_in_utc_at_their_precision() {
    let mut v = json!({
        "metadata": {"name": "x", "creationTimestamp": "2026-12-02T09:30:00.75+01:00", "deletionTimestamp": ""},
        "spec": {"renewTime": "2026-12-02T08:30:00.1234567-00:30", "acquireTime": null},
        "status": {"conditions": [{"type": "Ready", "lastTransitionTime": "2026-12-02T08:30:00Z"}]},
        "note": "2026-12-02T09:30:00+01:00",
    });
    normalize_times(&mut v).unwrap();
    assert_eq!(v["metadata"]["creationTimestamp"], "2026-12-02T08:30:00Z");
    assert_eq!(v["metadata"]["deletionTimestamp"], Value::Null);
    assert_eq!(v["spec"]["renewTime"], "2026-12-02T09:00:00.123456Z");
    assert_eq!(v["spec"]["acquireTime"], Value::Null);
    assert_eq!(
        v["status"]["conditions"][0]["lastTransitionTime"],
        "2026-12-02T08:30:00Z"
    );
    // A field that is not a time is left as it is.
    assert_eq!(v["note"], "2026-12-02T09:30:00+01:00");
}

#[test]
fn a_time_that_does_not_parse_names_its_field() {
    let mut bad = json!({"status": {"conditions": [{"lastProbeTime": "yesterday"}]}});
    let e = normalize_times(&mut bad).unwrap_err();
    assert!(
        e.starts_with("status.conditions.lastProbeTime: cannot parse"),
        "{e}"
    );
    let mut number = json!({"metadata": {"creationTimestamp": 5}});
    let e = normalize_times(&mut number).unwrap_err();
    assert!(
        e.starts_with("metadata.creationTimestamp: expected an RFC 3339 time"),
        "{e}"
    );
}

// --- deletion (`rest.BeforeDelete`, the store's finalizer handling) ---

#[test]
fn a_delete_with_an_extra_finalizer_keeps_the_object_until_it_is_removed() {
    let cms = core("configmaps");
    let cm = json!({"metadata": {"name": "c"}});
    let DeleteOutcome::Update(held) = decide_delete(cms, &cm, None, Some("orphan"), 100) else {
        panic!("an orphaning delete keeps the object")
    };
    assert_eq!(held["metadata"]["finalizers"], json!(["orphan"]));
    assert_eq!(
        held["metadata"]["deletionTimestamp"],
        "1970-01-01T00:01:40Z"
    );
    assert_eq!(held["metadata"]["deletionGracePeriodSeconds"], 0);
    // Appended after the object's own, once.
    let own = json!({"metadata": {"name": "c", "finalizers": ["x"]}});
    let DeleteOutcome::Update(both) = decide_delete(cms, &own, None, Some("orphan"), 100) else {
        panic!("finalizers hold")
    };
    assert_eq!(both["metadata"]["finalizers"], json!(["x", "orphan"]));
    let orphaning = json!({"metadata": {"name": "c", "finalizers": ["orphan", "x"]}});
    let DeleteOutcome::Update(once) = decide_delete(cms, &orphaning, None, Some("orphan"), 100)
    else {
        panic!("finalizers hold")
    };
    assert_eq!(once["metadata"]["finalizers"], json!(["orphan", "x"]));
    // A second delete of an object held by finalizers changes nothing.
    assert_eq!(
        decide_delete(cms, &both, None, Some("orphan"), 200),
        DeleteOutcome::Unchanged
    );
}

#[test]
fn a_delete_without_finalizers_or_grace_removes_at_once() {
    let cms = core("configmaps");
    let cm = json!({"metadata": {"name": "c"}});
    assert_eq!(
        decide_delete(cms, &cm, None, None, 100),
        DeleteOutcome::Remove
    );
    // Only pods have a grace period.
    assert_eq!(
        decide_delete(cms, &cm, Some(30), None, 100),
        DeleteOutcome::Remove
    );
    let emptied = json!({"metadata": {"name": "c", "finalizers": []}});
    assert_eq!(
        decide_delete(cms, &emptied, None, None, 100),
        DeleteOutcome::Remove
    );
}

#[test]
fn a_delete_that_keeps_the_object_bumps_a_tracked_generation() {
    let pods = core("pods");
    let mut p = pod(Some("n"));
    p["metadata"]["generation"] = json!(1);
    let DeleteOutcome::Update(d) = decide_delete(pods, &p, None, None, 0) else {
        panic!("a scheduled pod is deleted gracefully")
    };
    assert_eq!(d["metadata"]["generation"], 2);
    assert_eq!(d["metadata"]["deletionTimestamp"], "1970-01-01T00:00:30Z");
    // No generation, or generation 0 (not tracked): none is set.
    for g in [None, Some(0)] {
        let mut p = pod(Some("n"));
        if let Some(g) = g {
            p["metadata"]["generation"] = json!(g);
        }
        let DeleteOutcome::Update(d) = decide_delete(pods, &p, None, None, 0) else {
            panic!("a scheduled pod is deleted gracefully")
        };
        assert_eq!(
            d["metadata"].get("generation"),
            g.map(|g| json!(g)).as_ref(),
            "{g:?}"
        );
    }
}

#[test]
fn an_object_being_deleted_goes_once_its_finalizers_and_grace_are_done() {
    let gone = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z", "deletionGracePeriodSeconds": 0}});
    assert!(should_remove_after_update(&gone));
    let graceful = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z", "deletionGracePeriodSeconds": 30}});
    assert!(!should_remove_after_update(&graceful));
    let held =
        json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["x"]}});
    assert!(!should_remove_after_update(&held));
    let live = json!({"metadata": {"finalizers": []}});
    assert!(!should_remove_after_update(&live));
}

#[test]
fn deletion_times_are_rfc3339_seconds() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(1_796_200_000), "2026-12-02T08:26:40Z");
}

/// A valid events.k8s.io/v1 Event in its stored (core v1) form.
fn new_style_event() -> Value {
    json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "e", "namespace": "default"},
        "eventTime": "2026-01-02T03:04:05.000000Z",
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "p"},
        "reportingComponent": "example.com/ctl", "reportingInstance": "ctl-0",
        "action": "Probe", "reason": "Failed", "type": "Warning", "message": "m"})
}

#[test]
fn events_k8s_io_creates_follow_validate_event_create() {
    // pkg/apis/core/validation/events.go ValidateEventCreate: strict for events.k8s.io/v1.
    let ev = res("events.k8s.io", "events");
    assert!(validate_event(ev, &new_style_event(), None).is_empty());
    let old_style = json!({"metadata": {"name": "e", "namespace": "default"},
        "involvedObject": {"kind": "Node", "name": "n1"}, "reason": "Starting",
        "type": "Normal", "message": "m", "count": 2, "source": {"component": "kubelet"},
        "firstTimestamp": "2026-01-02T03:04:05Z"});
    assert_eq!(
        fields(&validate_event(ev, &old_style, None)),
        ["eventTime", "firstTimestamp", "count", "source"]
    );
    let mut bare = new_style_event();
    for f in ["reportingComponent", "reportingInstance", "action"] {
        bare.as_object_mut().unwrap().remove(f);
    }
    bare["type"] = json!("Odd");
    bare["series"] = json!({"count": 1});
    assert_eq!(
        fields(&validate_event(ev, &bare, None)),
        [
            "reportingController",
            "reportingController",
            "reportingInstance",
            "action",
            "series.count",
            "series.lastObservedTime",
            "type"
        ]
    );
    // Through core v1 only the legacy rules apply.
    assert!(validate_event(core("events"), &old_style, None).is_empty());
    assert!(validate_event(core("configmaps"), &bare, None).is_empty());
}

#[test]
fn legacy_event_rules_apply_through_both_groups() {
    // legacyValidateEvent: namespaces agree; an eventTime brings the reporter rules.
    for r in [core("events"), res("events.k8s.io", "events")] {
        let mut e = new_style_event();
        // With an eventTime, an involvedObject without a namespace needs the Event in
        // default or kube-system.
        e["metadata"]["namespace"] = json!("other");
        e["involvedObject"]
            .as_object_mut()
            .unwrap()
            .remove("namespace");
        e["reason"] = json!("R".repeat(129));
        assert_eq!(
            fields(&validate_event(r, &e, None)),
            ["involvedObject.namespace", "reason"],
            "{}",
            r.api_version()
        );
    }
    let no_time = json!({"metadata": {"name": "e", "namespace": "ns1"},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "ns2"}});
    assert_eq!(
        fields(&validate_event(core("events"), &no_time, None)),
        ["involvedObject.namespace"]
    );
}

#[test]
fn legacy_event_namespaces_and_limits_at_their_edges() {
    // legacyValidateEvent, without an eventTime: an involvedObject without a namespace
    // needs the Event in "" or default; with one, the namespaces must be equal.
    let no_time = |ns: &str, inv_ns: Option<&str>| {
        let mut e = json!({"metadata": {"name": "e", "namespace": ns},
            "involvedObject": {"kind": "Pod", "name": "p"}});
        if let Some(i) = inv_ns {
            e["involvedObject"]["namespace"] = json!(i);
        }
        fields(&validate_event(core("events"), &e, None))
            .into_iter()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(no_time("ns1", None), ["involvedObject.namespace"]);
    assert!(no_time("default", None).is_empty());
    assert!(no_time("ns1", Some("ns1")).is_empty());
    // With an eventTime only a missing involvedObject namespace is checked (default and
    // kube-system allowed): a different one is not refused.
    let mut e = new_style_event();
    e["metadata"]["namespace"] = json!("other");
    e["involvedObject"]["namespace"] = json!("elsewhere");
    assert!(fields(&validate_event(core("events"), &e, None)).is_empty());
    e["metadata"]["namespace"] = json!("kube-system");
    e["involvedObject"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    assert!(fields(&validate_event(core("events"), &e, None)).is_empty());
    // Limits: 128 characters for reason, action and reportingInstance, 1024 for message.
    let mut e = new_style_event();
    e["reason"] = json!("R".repeat(128));
    e["action"] = json!("A".repeat(128));
    e["reportingInstance"] = json!("i".repeat(128));
    e["message"] = json!("m".repeat(1024));
    assert!(fields(&validate_event(core("events"), &e, None)).is_empty());
    e["action"] = json!("A".repeat(129));
    e["message"] = json!("m".repeat(1025));
    assert_eq!(
        fields(&validate_event(core("events"), &e, None)),
        ["action", "message"]
    );
}

#[test]
fn events_k8s_io_updates_change_only_series_and_metadata() {
    // ValidateEventUpdate: every field but series and metadata is immutable there.
    let ev = res("events.k8s.io", "events");
    let old = new_style_event();
    let mut new = old.clone();
    new["series"] = json!({"count": 2, "lastObservedTime": "2026-01-02T03:05:05.000000Z"});
    new["metadata"]["labels"] = json!({"a": "b"});
    assert!(validate_event(ev, &new, Some(&old)).is_empty());
    new["message"] = json!("changed");
    new["reason"] = json!("Other");
    new["reportingComponent"] = json!("other");
    assert_eq!(
        fields(&validate_event(ev, &new, Some(&old))),
        ["reason", "message", "reason", "reportingController"]
    );
    // Through core v1 the same change is allowed.
    assert!(validate_event(core("events"), &new, Some(&old)).is_empty());
    // Zero values equal absent ones.
    let mut zeroed = old.clone();
    zeroed["count"] = json!(0);
    zeroed["source"] = json!({});
    zeroed["involvedObject"]["fieldPath"] = json!("");
    assert!(validate_event(ev, &zeroed, Some(&old)).is_empty());
    // A field inside the regarded object is compared too.
    let mut moved = old.clone();
    moved["involvedObject"]["name"] = json!("q");
    assert_eq!(
        fields(&validate_event(ev, &moved, Some(&old))),
        ["involvedObject"]
    );
    // A changed series is validated (ValidateEventUpdate calls validateEventSeries when
    // it changed): a count below 2 is refused.
    let mut series = old.clone();
    series["series"] = json!({"count": 1, "lastObservedTime": "2026-01-02T03:05:05.000000Z"});
    assert_eq!(
        fields(&validate_event(ev, &series, Some(&old))),
        ["series.count"]
    );
}
