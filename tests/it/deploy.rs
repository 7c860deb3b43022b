//! The deploy manifests and units in `docs/deploy/`: every Kubernetes document is valid
//! against the schema its `k8s-openapi` type carries (offline, strict: an unknown or
//! mistyped field fails), kubectl applies every manifest to the API double, and every
//! systemd unit passes `systemd-analyze verify` with the flags its `ExecStart` passes known
//! to the binary it starts, as does every container of ours in a manifest.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail, ensure};
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/deploy")
}

/// Files in `dir` whose name ends with `ext`, sorted; at least one.
fn files(dir: &Path, ext: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
    out.sort();
    ensure!(!out.is_empty(), "no *.{ext} files in {}", dir.display());
    Ok(out)
}

fn documents(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path)?;
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc)
            .with_context(|| format!("{} is not YAML", path.display()))?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

fn tool(name: &str, package: &str) -> anyhow::Result<PathBuf> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()?;
    if !out.status.success() {
        bail!("{name} is not on PATH: install {package} to run this test");
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

#[test]
fn every_manifest_is_valid_against_the_openapi_types() -> anyhow::Result<()> {
    let mut checked = 0;
    for path in files(&deploy_dir(), "yaml")? {
        for doc in documents(&path)? {
            let what = format!(
                "{} {}/{} in {}",
                doc["kind"].as_str().unwrap_or("?"),
                doc["metadata"]["namespace"].as_str().unwrap_or(""),
                doc["metadata"]["name"].as_str().unwrap_or("?"),
                path.display()
            );
            testkube::typed::validate_strict(&doc).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
            checked += 1;
        }
    }
    // nebula-manager's 9 documents and outpost-agent's 3.
    ensure!(checked >= 12, "only {checked} documents checked");
    Ok(())
}

#[test]
fn the_validator_refuses_an_unknown_field_and_an_unknown_kind() {
    let typo = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {"replica": 2, "selector": {}, "template": {}},
    });
    let err = testkube::typed::validate_strict(&typo).unwrap_err();
    assert!(err.contains("spec.replica"), "{err}");
    let unknown = serde_json::json!({"apiVersion": "example.com/v1", "kind": "Widget"});
    assert!(testkube::typed::validate_strict(&unknown).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_every_manifest() -> anyhow::Result<()> {
    let kubectl = tool("kubectl", "kubectl (1.27-1.33)")?;
    let server = testkube::ApiServer::start().await?;
    for path in files(&deploy_dir(), "yaml")? {
        // Async: the API double serves from this test's runtime.
        let out = tokio::process::Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(server.kubeconfig_path())
            .args(["apply", "--validate=strict", "-f"])
            .arg(&path)
            .output()
            .await?;
        ensure!(
            out.status.success(),
            "kubectl apply -f {} failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        // Every document is there afterwards, as applied.
        let stdout = String::from_utf8_lossy(&out.stdout);
        let applied = stdout.lines().filter(|l| l.contains(" created")).count();
        ensure!(
            applied == documents(&path)?.len(),
            "{}: kubectl reported {applied} created objects: {stdout}",
            path.display()
        );
    }
    Ok(())
}

/// The `ExecStart=` command of a unit: binary name and arguments.
fn exec_start(unit: &str) -> anyhow::Result<(String, Vec<String>)> {
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .context("no ExecStart= line")?;
    let mut words = line.split_whitespace().map(str::to_string);
    let bin = words.next().context("empty ExecStart=")?;
    let name = bin
        .strip_prefix("/usr/local/bin/")
        .with_context(|| format!("ExecStart= runs {bin}, not a binary in /usr/local/bin"))?;
    Ok((name.to_string(), words.collect()))
}

/// Fails unless `name`'s subcommand in `args` exists and knows every `--flag` in `args`
/// (its `--help` lists them); `origin` names the file that passes them.
fn check_flags(name: &str, args: &[String], origin: &Path) -> anyhow::Result<()> {
    let binary = e2e::binary(name);
    let sub: Vec<&str> = args
        .iter()
        .take_while(|a| !a.starts_with('-'))
        .map(String::as_str)
        .collect();
    let help = Command::new(&binary).args(&sub).arg("--help").output()?;
    ensure!(
        help.status.success(),
        "{}: {name} {sub:?} --help failed: the subcommand does not exist",
        origin.display()
    );
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in args.iter().filter(|a| a.starts_with("--")) {
        let flag = flag.split('=').next().unwrap_or(flag);
        ensure!(
            help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
            "{}: {name} {} has no flag {flag}",
            origin.display(),
            sub.join(" ")
        );
    }
    Ok(())
}

/// Every container of ours (image `.../<binary>:tag`) passes only flags its binary has, and
/// the agent's ConfigMap holds an agent.yaml the agent accepts for any node name.
#[test]
fn every_container_passes_only_flags_its_binary_has() -> anyhow::Result<()> {
    let mut checked = Vec::new();
    for path in files(&deploy_dir(), "yaml")? {
        for doc in documents(&path)? {
            if doc["kind"] == "ConfigMap" && doc["metadata"]["name"] == "outpost-agent" {
                let text = doc["data"]["agent.yaml"]
                    .as_str()
                    .context("the outpost-agent ConfigMap has no agent.yaml")?;
                agent::AgentConfig::parse_for_node(text, &path, Some("node-1"))
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                checked.push("agent.yaml".to_string());
            }
            let containers = doc
                .pointer("/spec/template/spec/containers")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for c in containers {
                let image = c["image"].as_str().unwrap_or("");
                let name = image.rsplit('/').next().unwrap_or("");
                let name = name.split(':').next().unwrap_or("");
                if !["outpost-agent", "nebula-manager", "stratum-server"].contains(&name) {
                    continue;
                }
                let args: Vec<String> = c["args"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|a| a.as_str().map(str::to_string))
                    .collect();
                check_flags(name, &args, &path)?;
                checked.push(name.to_string());
            }
        }
    }
    checked.sort();
    ensure!(
        checked == ["agent.yaml", "nebula-manager", "outpost-agent"],
        "checked {checked:?}: expected the agent's config and the two containers"
    );
    Ok(())
}

#[test]
fn every_unit_verifies_and_passes_only_flags_its_binary_has() -> anyhow::Result<()> {
    let analyze = tool("systemd-analyze", "systemd")?;
    let scratch = tempfile::tempdir()?;
    for path in files(&deploy_dir().join("systemd"), "service")? {
        let text = std::fs::read_to_string(&path)?;
        let (name, args) = exec_start(&text).with_context(|| path.display().to_string())?;
        check_flags(&name, &args, &path)?;
        let binary = e2e::binary(&name);
        // systemd-analyze checks that the executable exists: point it at the built one.
        let local = scratch
            .path()
            .join(path.file_name().context("a unit file name")?);
        let rewritten = text.replace(
            &format!("/usr/local/bin/{name}"),
            &binary.display().to_string(),
        );
        std::fs::write(&local, rewritten)?;
        let out = Command::new(&analyze).arg("verify").arg(&local).output()?;
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // Unknown keys are only warnings to systemd: any output is a failure here.
        ensure!(
            out.status.success() && said.trim().is_empty(),
            "systemd-analyze verify {}: {said}",
            path.display()
        );
    }
    Ok(())
}
