//! The manifests in `deploy/`: read them (following `kustomization.yaml` files) and apply them
//! to a test cluster with server-side apply, for real or as a dry run.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use serde_json::Value;

use crate::TestCluster;

/// The repository's `deploy/` directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// A file of Volcano's own installer (`installer/<rel>` of the `volcano.sh/volcano` module that
/// `e2e/upstream/volcano` pins, in Go's module cache): what a real Volcano install creates.
pub fn volcano_installer_file(rel: &str) -> Result<PathBuf> {
    let out = std::process::Command::new("go")
        .args(["list", "-m", "-f", "{{.Dir}}", "volcano.sh/volcano"])
        .current_dir(crate::upstream::e2e_dir().join("upstream/volcano"))
        .output()
        .context("running go list")?;
    if !out.status.success() {
        return Err(anyhow!(
            "go list -m volcano.sh/volcano: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let dir = String::from_utf8(out.stdout)?;
    let path = Path::new(dir.trim()).join("installer").join(rel);
    if !path.is_file() {
        return Err(anyhow!("{} is not a file", path.display()));
    }
    Ok(path)
}

/// The objects of a kustomization directory, in its `resources` order (directories recurse),
/// each named `file: Kind/name`.
pub fn kustomization(dir: &Path) -> Result<Vec<(String, Value)>> {
    let file = dir.join("kustomization.yaml");
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let k: Value = serde_norway::from_str(&text)?;
    let resources = k["resources"]
        .as_array()
        .ok_or_else(|| anyhow!("{}: no resources list", file.display()))?;
    let mut objects = Vec::new();
    for resource in resources {
        let rel = resource
            .as_str()
            .ok_or_else(|| anyhow!("{}: resource {resource} is not a path", file.display()))?;
        let path = dir.join(rel);
        if path.is_dir() {
            objects.extend(kustomization(&path)?);
        } else {
            objects.extend(documents(&path)?);
        }
    }
    Ok(objects)
}

/// The YAML documents of a file, each named `file: Kind/name`.
pub fn documents(path: &Path) -> Result<Vec<(String, Value)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().to_string())
        .unwrap_or_default();
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc)
            .with_context(|| format!("parsing {}", path.display()))?;
        let name = format!(
            "{file}: {}/{}",
            v["kind"].as_str().unwrap_or("?"),
            v["metadata"]["name"].as_str().unwrap_or("?")
        );
        out.push((name, v));
    }
    Ok(out)
}

/// Server-side applies `object` (field manager `fumarole-e2e`), for real or as a dry run.
pub async fn apply(client: &Client, object: &Value, dry_run: bool) -> Result<()> {
    let api_version = object["apiVersion"]
        .as_str()
        .ok_or_else(|| anyhow!("no apiVersion"))?;
    let kind = object["kind"].as_str().ok_or_else(|| anyhow!("no kind"))?;
    let name = object["metadata"]["name"]
        .as_str()
        .ok_or_else(|| anyhow!("no metadata.name"))?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (ar, caps) = pinned_kind(client, &gvk).await?;
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default"),
            &ar,
        ),
        Scope::Cluster => Api::all_with(client.clone(), &ar),
    };
    let mut params = PatchParams::apply("fumarole-e2e").force();
    params.dry_run = dry_run;
    api.patch(name, &params, &Patch::Apply(object)).await?;
    Ok(())
}

impl TestCluster {
    /// Installs `deploy/daemonset` as `kubectl apply -k` would (server-side apply, in the
    /// kustomization's order). Nothing runs its pods: there is no controller manager.
    ///
    /// But for the agent-writes webhook's configuration: no test cluster's API server can reach
    /// it through its Service, and, failing closed, it would refuse every Event and eviction of
    /// an agent. The deployment e2e registers the webhook for real, by URL.
    pub async fn install_deploy_daemonset(&self) -> Result<()> {
        let client = self.client();
        for (name, object) in kustomization(&deploy_dir().join("daemonset"))? {
            if object["kind"] == "ValidatingWebhookConfiguration" {
                continue;
            }
            apply(&client, &object, false)
                .await
                .with_context(|| format!("applying {name}"))?;
        }
        Ok(())
    }
}

/// A caBundle for the chart's agent-writes webhook (on by default; the chart refuses to render
/// it without one): base64 of "ca".
const WEBHOOK_CA: &str = "schedulerExt.agentWritesWebhook.caBundle=Y2E=";

/// The chart rendered with Helm's engine (release `fumarole` in `fumarole-system`) with `--set`
/// `values`, each object named `chart: Kind/name`.
pub fn render_chart(values: &[&str]) -> Result<Vec<(String, Value)>> {
    let mut cmd = std::process::Command::new(crate::upstream::Upstream::get()?.bin("helm-render"));
    cmd.arg("--chart").arg(deploy_dir().join("helm/fumarole"));
    // The agent-writes webhook is on by default and needs a CA to render; a caller's own
    // `--set` of it comes later and wins.
    cmd.args(["--set", WEBHOOK_CA]);
    for v in values {
        cmd.args(["--set", v]);
    }
    let out = cmd.output().context("running helm-render")?;
    if !out.status.success() {
        return Err(anyhow!(
            "helm-render failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8(out.stdout)?;
    let mut objects = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc)?;
        if let (Some(kind), Some(name)) = (v["kind"].as_str(), v["metadata"]["name"].as_str()) {
            let name = format!("chart: {kind}/{name}");
            objects.push((name, v));
        }
    }
    Ok(objects)
}

/// The object of `kind` named `name` among `objects`.
pub fn pick<'a>(objects: &'a [(String, Value)], kind: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|(_, v)| v["kind"] == kind && v["metadata"]["name"] == name)
        .map(|(_, v)| v)
}

/// [`pick`], for tests: panics naming what is missing.
#[allow(clippy::panic)]
pub fn must<'a>(objects: &'a [(String, Value)], kind: &str, name: &str) -> &'a Value {
    pick(objects, kind, name).unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// Every `group resource verb` a (Cluster)Role grants.
pub fn grants(role: &Value) -> std::collections::BTreeSet<String> {
    let list = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = std::collections::BTreeSet::new();
    for rule in role["rules"].as_array().into_iter().flatten() {
        for group in list(&rule["apiGroups"]) {
            for resource in list(&rule["resources"]) {
                for verb in list(&rule["verbs"]) {
                    out.insert(format!("{group} {resource} {verb}"));
                }
            }
        }
    }
    out
}
