//! ValidatingAdmissionPolicy as kube-apiserver enforces it
//! (`staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating`), and the double's
//! loud refusals of the parts it does not implement.

use base64::Engine;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use testkube::ApiServer;

fn client_as(s: &ApiServer, user: &str, groups: &[&str]) -> kube::Client {
    let cert = s.issue_client_cert(user, groups).unwrap();
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let mut cfg = s.config();
    cfg.auth_info = Default::default();
    cfg.auth_info.client_certificate_data = Some(b64(cert.cert_pem.as_bytes()));
    cfg.auth_info.client_key_data = Some(b64(cert.key_pem.as_bytes()).into());
    kube::Client::try_from(cfg).unwrap()
}

/// `(code, message)` of a refusal; a success is `(200, "")`.
fn answer<T>(r: Result<T, kube::Error>) -> (u16, String) {
    match r {
        Ok(_) => (200, String::new()),
        Err(kube::Error::Api(s)) => (s.code, s.message.clone()),
        Err(e) => panic!("expected an HTTP answer, got {e}"),
    }
}

fn policy(name: &str, spec: serde_json::Value) -> ValidatingAdmissionPolicy {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

fn binding(name: &str, policy: &str, actions: &[&str]) -> ValidatingAdmissionPolicyBinding {
    serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"policyName": policy, "validationActions": actions}}))
    .unwrap()
}

fn own_name_policy() -> ValidatingAdmissionPolicy {
    policy(
        "own-name",
        json!({
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["leases"],
                "resourceNames": ["fence"]}]},
            "matchConditions": [{"name": "devs",
                "expression": "request.userInfo.groups.exists(g, g == 'dev')"}],
            "validations": [{
                "expression": "has(object.spec.holderIdentity) && object.spec.holderIdentity == request.userInfo.username",
                "message": "a dev may hold the fence under its own name only",
                "reason": "Forbidden"}]
        }),
    )
}

fn holder(name: &str) -> Patch<serde_json::Value> {
    Patch::Merge(json!({"spec": {"holderIdentity": name}}))
}

#[tokio::test]
async fn a_bound_policy_denies_what_its_validations_refuse_and_only_for_matching_requests() {
    let s = ApiServer::start().await.unwrap();
    let admin = s.client();
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "default");
    for name in ["fence", "other"] {
        leases
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}, "spec": {}})).unwrap(),
            )
            .await
            .unwrap();
    }
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
    let stored = policies
        .create(&PostParams::default(), &own_name_policy())
        .await
        .unwrap();
    // Defaults as kube-apiserver stores them.
    let spec = stored.spec.unwrap();
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    let mc = spec.match_constraints.unwrap();
    assert_eq!(mc.match_policy.as_deref(), Some("Equivalent"));
    assert_eq!(stored.metadata.generation, Some(1));

    let alice: Api<Lease> = Api::namespaced(client_as(&s, "alice", &["dev"]), "default");
    let pp = PatchParams::default();
    // Not bound yet: nothing is enforced.
    assert_eq!(
        answer(alice.patch("fence", &pp, &holder("bob")).await).0,
        200
    );

    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(admin.clone());
    bindings
        .create(
            &PostParams::default(),
            &binding("own-name-b", "own-name", &["Deny"]),
        )
        .await
        .unwrap();
    let (code, message) = answer(alice.patch("fence", &pp, &holder("mallory")).await);
    assert_eq!(code, 403, "{message}");
    assert_eq!(
        message,
        "ValidatingAdmissionPolicy 'own-name' with binding 'own-name-b' denied request: a dev may hold the fence under its own name only"
    );
    assert_eq!(
        leases
            .get("fence")
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("bob"),
        "a denied write changes nothing"
    );
    // A dry run is admitted the same way (a probe of enforcement relies on it).
    let dry = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    assert_eq!(
        answer(alice.patch("fence", &dry, &holder("mallory")).await).0,
        403
    );
    // Its own name passes; so does another Lease, and anyone outside the group.
    assert_eq!(
        answer(alice.patch("fence", &pp, &holder("alice")).await).0,
        200
    );
    assert_eq!(
        answer(alice.patch("other", &pp, &holder("mallory")).await).0,
        200
    );
    let carol: Api<Lease> = Api::namespaced(client_as(&s, "carol", &["ops"]), "default");
    assert_eq!(
        answer(carol.patch("fence", &pp, &holder("mallory")).await).0,
        200
    );
    // A create of the named Lease is matched as well.
    alice.delete("fence", &Default::default()).await.unwrap();
    let (code, _) = answer(
        alice
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "fence"},
                    "spec": {"holderIdentity": "mallory"}}))
                .unwrap(),
            )
            .await,
    );
    assert_eq!(code, 403);
}

#[tokio::test]
async fn an_expression_error_denies_under_fail_and_is_skipped_under_ignore() {
    let s = ApiServer::start().await.unwrap();
    let admin = s.client();
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "default");
    leases
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "l"}, "spec": {}})).unwrap(),
        )
        .await
        .unwrap();
    let spec = |failure: &str| {
        json!({"failurePolicy": failure,
            "matchConstraints": {"resourceRules": [{"apiGroups": ["coordination.k8s.io"],
                "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["leases"]}]},
            // No renewTime on the object: selecting it is an error, not false.
            "validations": [{"expression": "object.spec.renewTime != ''"}]})
    };
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(admin.clone());
    policies
        .create(&PostParams::default(), &policy("p", spec("Fail")))
        .await
        .unwrap();
    bindings
        .create(&PostParams::default(), &binding("b", "p", &["Deny"]))
        .await
        .unwrap();
    let pp = PatchParams::default();
    let (code, message) = answer(leases.patch("l", &pp, &holder("x")).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.starts_with("ValidatingAdmissionPolicy 'p' with binding 'b' denied request: expression 'object.spec.renewTime != ''' resulted in error"),
        "{message}"
    );
    let mut p = policies.get("p").await.unwrap();
    p.spec.as_mut().unwrap().failure_policy = Some("Ignore".into());
    let p = policies
        .replace("p", &PostParams::default(), &p)
        .await
        .unwrap();
    assert_eq!(
        p.metadata.generation,
        Some(2),
        "a spec change bumps the generation"
    );
    assert_eq!(answer(leases.patch("l", &pp, &holder("x")).await).0, 200);
}

#[tokio::test]
async fn policies_and_bindings_the_double_cannot_enforce_are_refused_when_written() {
    let s = ApiServer::start().await.unwrap();
    let admin = s.client();
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
    let rules = json!({"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
        "operations": ["CREATE"], "resources": ["configmaps"]}]});
    for (spec, wanted) in [
        (
            json!({"matchConstraints": rules, "validations": [{"expression": "object.x =="}]}),
            "compilation failed",
        ),
        (
            json!({"matchConstraints": rules, "validations": [{"expression": "authorizer.group('').resource('pods').check('get').allowed()"}]}),
            "\"authorizer\" is not implemented by this API double",
        ),
        (
            json!({"matchConstraints": rules, "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
                "validations": [{"expression": "true"}]}),
            "spec.paramKind is not implemented by this API double",
        ),
        (
            json!({"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["DELETE"], "resources": ["configmaps"]}]},
                "validations": [{"expression": "true"}]}),
            "DELETE (the double admits CREATE and UPDATE) is not implemented",
        ),
        (
            json!({"matchConstraints": rules}),
            "spec.validations: Required value",
        ),
        (
            json!({"validations": [{"expression": "true"}]}),
            "spec.matchConstraints.resourceRules: Required value",
        ),
    ] {
        let (code, message) = answer(
            policies
                .create(&PostParams::default(), &policy("p", spec.clone()))
                .await,
        );
        assert_eq!(code, 422, "{spec}: {message}");
        assert!(message.contains(wanted), "{spec}: {message}");
    }
    assert!(
        policies
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(admin);
    for (b, wanted) in [
        (
            binding("b", "p", &["Warn"]),
            "spec.validationActions: Warn is not implemented",
        ),
        (
            binding("b", "p", &[]),
            "spec.validationActions: Required value",
        ),
        (
            binding("b", "", &["Deny"]),
            "spec.policyName: Required value",
        ),
    ] {
        let (code, message) = answer(bindings.create(&PostParams::default(), &b).await);
        assert_eq!(code, 422, "{message}");
        assert!(message.contains(wanted), "{message}");
    }
}
