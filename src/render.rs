//! `metahook render`: runs a CompositeController's hook on YAML fixtures, without a cluster.
//!
//! The request is built and the response judged by the engine's own code ([`request_map`],
//! [`composite::validate_response`]), so a hook that renders cleanly here is accepted by the hub. Types
//! are resolved offline: kinds come from the fixtures (or `--kind`), scope from the fixtures' namespaces.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use kube::api::DynamicObject;
use kube::core::ApiResource;
use serde_json::Value;

use crate::api::{CompositeController, Hook, HookVersion, Webhook};
use crate::children::{ChildMap, request_map};
use crate::composite::{child_selector, validate_response};
use crate::discovery::ResolvedResource;
use crate::hooks::{
    CompositeRequest, HookClient, HookKind, HookLabels, ObjectMaps, group_version_kind_key, object_key,
};
use crate::informers::ObjectKey;

/// Arguments of `metahook render`.
#[derive(Debug, Clone, clap::Args)]
pub struct RenderArgs {
    /// The CompositeController (YAML).
    #[arg(long)]
    pub controller: PathBuf,
    /// The parent object (YAML).
    #[arg(long)]
    pub parent: PathBuf,
    /// Observed children (YAML files, several documents or a `List` each).
    #[arg(long, num_args = 1..)]
    pub children: Vec<PathBuf>,
    /// Related objects, as a customize hook would have selected them.
    #[arg(long, num_args = 1..)]
    pub related: Vec<PathBuf>,
    /// URL of a running hook (overrides the controller's URL).
    #[arg(long, conflicts_with = "hook_cmd")]
    pub hook: Option<String>,
    /// Command that starts the hook server; it gets a free port in `PORT`, and is stopped afterwards.
    #[arg(long)]
    pub hook_cmd: Option<String>,
    /// Call the finalize hook with `finalizing: true` instead of sync.
    #[arg(long)]
    pub finalizing: bool,
    /// The parent type is cluster-scoped (otherwise a parent without a namespace is in `default`).
    #[arg(long)]
    pub cluster_scoped_parent: bool,
    /// Kind of a child resource that has no fixture object, e.g. `--kind pods=Pod`.
    #[arg(long, value_parser = parse_kind)]
    pub kind: Vec<(String, String)>,
}

fn parse_kind(text: &str) -> Result<(String, String), String> {
    text.split_once('=').map(|(r, k)| (r.to_owned(), k.to_owned())).ok_or_else(|| "expected RESOURCE=Kind".into())
}

/// Why rendering failed. [`RenderError::Invalid`] is the hook's fault (exit code 1); the rest are the
/// caller's (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("reading {path}: {reason}")]
    Input { path: PathBuf, reason: String },
    #[error("{0}")]
    Setup(String),
    #[error("{0}")]
    Invalid(String),
}

/// Runs the hook and returns the report (desired status and children, and their diff to the fixtures).
pub async fn render(args: &RenderArgs) -> Result<String, RenderError> {
    let cc: CompositeController = serde_json::from_value(read_one(&args.controller)?)
        .map_err(|e| input(&args.controller, &format!("not a CompositeController: {e}")))?;
    let mut parent: DynamicObject =
        serde_json::from_value(read_one(&args.parent)?).map_err(|e| input(&args.parent, &e.to_string()))?;
    parent.metadata.uid.get_or_insert_with(|| "00000000-0000-0000-0000-000000000000".into());
    if !args.cluster_scoped_parent {
        parent.metadata.namespace.get_or_insert_with(|| "default".into());
    }
    let children = read_objects(&args.children)?;
    let related = read_objects(&args.related)?;
    let hooks = cc.spec.hooks.as_ref().ok_or_else(|| RenderError::Setup("the controller defines no hooks".into()))?;
    let hook = if args.finalizing { hooks.finalize.as_ref() } else { hooks.sync.as_ref() };
    let hook = hook.ok_or_else(|| RenderError::Setup("the controller has no hook for this call".into()))?;

    let parent_resource = parent_resource(&cc, &parent)?;
    let child_resources = child_resources(&cc, &children, &args.kind)?;
    let parent_ns = parent_resource.namespaced.then_some(parent.metadata.namespace.as_deref()).flatten();
    let version = hook.version();
    let observed: Vec<ChildMap<Arc<DynamicObject>>> = child_resources
        .iter()
        .map(|r| {
            children
                .iter()
                .filter(|c| type_of(c) == (r.api_version(), r.kind()))
                .map(|c| (ObjectKey::of(c), Arc::new(c.clone())))
                .collect()
        })
        .collect();
    let request_children = request_map(&child_resources, version, parent_ns, &observed);
    let related_map = related_map(&related, version, parent_ns);
    let parent_json = serde_json::to_value(&parent).unwrap_or(Value::Null);
    let cc_json = serde_json::to_value(&cc).unwrap_or(Value::Null);
    let request = CompositeRequest {
        controller: &cc_json,
        parent: &parent_json,
        children: &request_children,
        related: &related_map,
        finalizing: args.finalizing,
    };

    let (hook, _server) = match (&args.hook, &args.hook_cmd) {
        (Some(url), _) => (with_url(hook, url.clone()), None),
        (None, Some(cmd)) => {
            let server = HookProcess::start(cmd).await?;
            let path = hook_path(hook);
            (with_url(hook, format!("http://127.0.0.1:{}{path}", server.port)), Some(server))
        }
        (None, None) => (hook.clone(), None),
    };
    let labels = HookLabels {
        kind: "CompositeController".into(),
        controller: cc.metadata.name.clone().unwrap_or_default(),
        hook: if args.finalizing { HookKind::Finalize } else { HookKind::Sync },
    };
    let endpoint = HookClient::default()
        .endpoint(&hook, &cc.spec.endpoint_configs, labels)
        .map_err(|e| RenderError::Setup(e.to_string()))?;
    let response = endpoint.composite(&request).await.map_err(|e| RenderError::Invalid(e.to_string()))?;
    let selector = child_selector(&cc, &parent).map_err(|e| RenderError::Invalid(e.to_string()))?;
    let (desired, status) = validate_response(&cc, &parent, &parent_resource, &child_resources, &response, &selector)
        .map_err(|e| RenderError::Invalid(e.to_string()))?;
    Ok(report(&status, &desired, &observed, &response))
}

fn input(path: &Path, reason: &str) -> RenderError {
    RenderError::Input { path: path.to_owned(), reason: reason.to_owned() }
}

fn read_docs(path: &Path) -> Result<Vec<Value>, RenderError> {
    let text = std::fs::read_to_string(path).map_err(|e| input(path, &e.to_string()))?;
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(doc).map_err(|e| input(path, &e.to_string()))?;
        match value {
            Value::Null => {}
            Value::Object(ref map) if map.get("kind").and_then(Value::as_str).is_some_and(|k| k.ends_with("List")) => {
                docs.extend(map.get("items").and_then(Value::as_array).into_iter().flatten().cloned());
            }
            other => docs.push(other),
        }
    }
    Ok(docs)
}

fn read_one(path: &Path) -> Result<Value, RenderError> {
    let mut docs = read_docs(path)?;
    match docs.len() {
        1 => Ok(docs.remove(0)),
        n => Err(input(path, &format!("expected one object, found {n}"))),
    }
}

fn read_objects(paths: &[PathBuf]) -> Result<Vec<DynamicObject>, RenderError> {
    let mut objects = Vec::new();
    for path in paths {
        for doc in read_docs(path)? {
            objects.push(serde_json::from_value(doc).map_err(|e| input(path, &e.to_string()))?);
        }
    }
    Ok(objects)
}

fn type_of(obj: &DynamicObject) -> (&str, &str) {
    obj.types.as_ref().map_or(("", ""), |t| (t.api_version.as_str(), t.kind.as_str()))
}

fn resolved(api_version: &str, kind: &str, plural: &str, namespaced: bool) -> Arc<ResolvedResource> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    Arc::new(ResolvedResource {
        api_resource: ApiResource {
            group: group.to_owned(),
            version: version.to_owned(),
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
        },
        namespaced,
        has_status: true,
    })
}

fn parent_resource(cc: &CompositeController, parent: &DynamicObject) -> Result<Arc<ResolvedResource>, RenderError> {
    let rule = &cc.spec.parent_resource;
    let (api_version, kind) = type_of(parent);
    if api_version != rule.api_version {
        return Err(RenderError::Setup(format!(
            "the parent is {api_version}, the controller's parentResource is {}",
            rule.api_version
        )));
    }
    Ok(resolved(api_version, kind, &rule.resource, parent.metadata.namespace.is_some()))
}

/// Kinds of common built-in resources, for child types without fixture objects.
const BUILT_IN: &[(&str, &str, bool)] = &[
    ("pods", "Pod", true),
    ("services", "Service", true),
    ("configmaps", "ConfigMap", true),
    ("secrets", "Secret", true),
    ("serviceaccounts", "ServiceAccount", true),
    ("persistentvolumeclaims", "PersistentVolumeClaim", true),
    ("deployments", "Deployment", true),
    ("replicasets", "ReplicaSet", true),
    ("statefulsets", "StatefulSet", true),
    ("daemonsets", "DaemonSet", true),
    ("jobs", "Job", true),
    ("cronjobs", "CronJob", true),
    ("ingresses", "Ingress", true),
    ("roles", "Role", true),
    ("rolebindings", "RoleBinding", true),
    ("networkpolicies", "NetworkPolicy", true),
    ("resourcequotas", "ResourceQuota", true),
    ("namespaces", "Namespace", false),
    ("nodes", "Node", false),
    ("clusterroles", "ClusterRole", false),
    ("clusterrolebindings", "ClusterRoleBinding", false),
];

fn child_resources(
    cc: &CompositeController,
    children: &[DynamicObject],
    kinds: &[(String, String)],
) -> Result<Vec<Arc<ResolvedResource>>, RenderError> {
    let mut resolved_types = Vec::new();
    for rule in &cc.spec.child_resources {
        let explicit = kinds.iter().find(|(r, _)| *r == rule.resource).map(|(_, k)| k.clone());
        let built_in = BUILT_IN.iter().find(|(r, _, _)| *r == rule.resource);
        let from_fixture =
            children.iter().find(|c| type_of(c).0 == rule.api_version && naive_plural(type_of(c).1) == rule.resource);
        let kind = explicit
            .or_else(|| from_fixture.map(|c| type_of(c).1.to_owned()))
            .or_else(|| built_in.map(|(_, k, _)| (*k).to_owned()))
            .ok_or_else(|| {
                RenderError::Setup(format!(
                    "cannot tell the kind of child resource {}: add a fixture object or --kind {}=Kind",
                    rule.resource, rule.resource
                ))
            })?;
        let namespaced =
            from_fixture.map_or_else(|| built_in.is_none_or(|(_, _, ns)| *ns), |c| c.metadata.namespace.is_some());
        resolved_types.push(resolved(&rule.api_version, &kind, &rule.resource, namespaced));
    }
    Ok(resolved_types)
}

fn naive_plural(kind: &str) -> String {
    let lower = kind.to_lowercase();
    if let Some(stem) = lower.strip_suffix('y') {
        format!("{stem}ies")
    } else if lower.ends_with('s') {
        format!("{lower}es")
    } else {
        format!("{lower}s")
    }
}

fn related_map(related: &[DynamicObject], version: HookVersion, parent_ns: Option<&str>) -> ObjectMaps {
    let mut maps = ObjectMaps::new();
    for obj in related {
        let (api_version, kind) = type_of(obj);
        let entry = maps.entry(group_version_kind_key(api_version, kind)).or_default();
        let key = ObjectKey::of(obj);
        if let Some(k) = object_key(version, parent_ns, key.namespace.as_deref(), &key.name) {
            entry.insert(k, serde_json::to_value(obj).unwrap_or(Value::Null));
        }
    }
    maps
}

fn with_url(hook: &Hook, url: String) -> Hook {
    Hook { webhook: Webhook { url: Some(url), service: None, ..hook.webhook.clone() }, ..hook.clone() }
}

/// The path part of a hook's URL (`/sync`), to call on a locally started server.
fn hook_path(hook: &Hook) -> String {
    let url = hook.webhook.resolved_url().unwrap_or_default();
    let after_scheme = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
    after_scheme.find('/').map_or_else(|| "/".to_owned(), |i| after_scheme[i..].to_owned())
}

/// A hook server started for one render, killed when dropped.
struct HookProcess {
    port: u16,
    _child: tokio::process::Child,
}

impl HookProcess {
    async fn start(cmd: &str) -> Result<Self, RenderError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| RenderError::Setup(format!("finding a free port: {e}")))?
            .port();
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", &format!("exec {cmd}")])
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| RenderError::Setup(format!("starting {cmd:?}: {e}")))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(RenderError::Setup(format!("hook command {cmd:?} exited with {status}")));
            }
            if tokio::time::Instant::now() > deadline {
                return Err(RenderError::Setup(format!(
                    "hook command {cmd:?} did not listen on $PORT ({port}) in 15s"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Self { port, _child: child })
    }
}

/// The report: status, then each desired child with what applying it would do, then deletions.
fn report(
    status: &Value,
    desired: &[ChildMap<Value>],
    observed: &[ChildMap<Arc<DynamicObject>>],
    response: &crate::hooks::CompositeResponse,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# status");
    out.push_str(&yaml(&serde_json::json!({ "status": status })));
    if let Some(after) = response.resync_after_seconds.filter(|s| *s > 0.0) {
        let _ = writeln!(out, "# resync after {after}s");
    }
    for event in &response.events {
        let _ = writeln!(out, "# event {} {}: {}", event.type_, event.reason, event.message);
    }
    for (desired, observed) in desired.iter().zip(observed) {
        for (key, obj) in desired {
            let kind = obj["kind"].as_str().unwrap_or_default();
            let want = yaml(obj);
            match observed.get(key) {
                None => {
                    let _ = writeln!(out, "---\n# create {kind} {key}");
                    out.push_str(&want);
                }
                Some(current) => {
                    // Ownership is the hub's business, not the hook's: leave it out of the comparison.
                    let mut obj = obj.clone();
                    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                        meta.remove("ownerReferences");
                    }
                    let (have, want) = (yaml(&comparable(current, &obj)), yaml(&obj));
                    if have == want {
                        let _ = writeln!(out, "---\n# unchanged {kind} {key}");
                    } else {
                        let _ = writeln!(out, "---\n# update {kind} {key}");
                        out.push_str(&diff(&have, &want));
                    }
                }
            }
        }
        for (key, obj) in observed.iter().filter(|(k, _)| !desired.contains_key(*k)) {
            let kind = obj.types.as_ref().map_or("", |t| t.kind.as_str());
            let _ = writeln!(out, "---\n# delete {kind} {key}");
        }
    }
    out
}

/// The observed object cut down to the fields the desired one sets, so the diff shows only what
/// applying would change (server-side apply leaves other fields alone).
fn comparable(observed: &DynamicObject, desired: &Value) -> Value {
    fn cut(have: &Value, want: &Value) -> Value {
        match (have, want) {
            (Value::Object(h), Value::Object(w)) => {
                Value::Object(w.keys().filter_map(|k| h.get(k).map(|v| (k.clone(), cut(v, &w[k])))).collect())
            }
            _ => have.clone(),
        }
    }
    cut(&serde_json::to_value(observed).unwrap_or(Value::Null), desired)
}

fn yaml(value: &Value) -> String {
    serde_yaml::to_string(value).unwrap_or_default()
}

/// A minimal line diff (longest common subsequence): `-` observed, `+` desired, ` ` both.
fn diff(old: &str, new: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let mut lcs = vec![vec![0_usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            let _ = writeln!(out, "  {}", a[i]);
            (i, j) = (i + 1, j + 1);
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            let _ = writeln!(out, "- {}", a[i]);
            i += 1;
        } else {
            let _ = writeln!(out, "+ {}", b[j]);
            j += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_diff_marks_removed_and_added_lines() {
        assert_eq!(diff("a\nb\nc\n", "a\nx\nc\n"), "  a\n- b\n+ x\n  c\n");
        assert_eq!(diff("", "a\n"), "+ a\n");
    }

    #[test]
    fn plurals_are_guessed_like_kubernetes_names_them() {
        assert_eq!(naive_plural("Pod"), "pods");
        assert_eq!(naive_plural("NetworkPolicy"), "networkpolicies");
        assert_eq!(naive_plural("Ingress"), "ingresses");
    }

    #[test]
    fn hook_paths_come_from_the_controller_url() {
        let hook: Hook =
            serde_json::from_value(serde_json::json!({"webhook": {"url": "http://h.ns:8080/sync"}})).unwrap();
        assert_eq!(hook_path(&hook), "/sync");
        let hook: Hook = serde_json::from_value(
            serde_json::json!({"webhook": {"service": {"name": "h", "namespace": "n"}, "path": "/f"}}),
        )
        .unwrap();
        assert_eq!(hook_path(&hook), "/f");
    }

    #[test]
    fn comparable_keeps_only_fields_the_desired_object_sets() {
        let observed: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "uid": "u", "resourceVersion": "1"}, "data": {"k": "v", "other": "x"}
        }))
        .unwrap();
        let desired =
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "v"}});
        assert_eq!(comparable(&observed, &desired), desired);
    }
}
