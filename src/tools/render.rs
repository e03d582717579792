//! `metahook render`: runs a CompositeController's or DecoratorController's hook on YAML fixtures,
//! without a cluster, and shows what the hub would do.
//!
//! Everything the hub decides is decided here by the engine's own code: which fixture objects are
//! children ([`claim_of`] for a composite, [`is_attachment_of`] for a decorator), the request
//! ([`request_map`]) and the verdict on the response ([`composite::validate_response`],
//! [`decorator::validate_response`]). So a hook that renders cleanly is accepted by the hub, and an
//! object the hub would never touch is shown as ignored, never as deleted. Types are resolved offline:
//! kinds from the fixtures (or `--kind`), plurals by kube-core's rules, scope from the fixtures.
//!
//! [`composite::validate_response`]: crate::controllers::composite::validate_response
//! [`decorator::validate_response`]: crate::controllers::decorator::validate_response

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use kube::api::DynamicObject;
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use crate::api::{
    ChildResourceRule, CompositeController, DecoratorController, Hook, HookVersion, UpdateMethod, Webhook,
};
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::ObjectKey;
use crate::controllers::composite::{self, child_selector};
use crate::controllers::decorator::{self, DECORATOR_ANNOTATION, is_attachment_of};
use crate::engine::error::with_causes;
use crate::hooks::{
    Endpoint, HookClient, HookEvent, HookKind, HookLabels, ObjectMaps, WireObject, group_version_kind_key, object_key,
};
use crate::write::children::{ChildMap, Claim, claim_of, owner_reference, request_map};

/// Arguments of `metahook render`.
#[derive(Debug, Clone, clap::Args)]
pub struct RenderArgs {
    /// The CompositeController or DecoratorController (YAML).
    #[arg(long)]
    pub controller: PathBuf,
    /// The parent object (YAML); for a DecoratorController, the object it decorates.
    #[arg(long, visible_alias = "target")]
    pub parent: PathBuf,
    /// Objects in the cluster of the declared child (attachment) types: YAML files, several documents
    /// or a `List` each. The hub's claim rules decide which of them the hook sees.
    #[arg(long, visible_alias = "attachments", num_args = 1..)]
    pub children: Vec<PathBuf>,
    /// Related objects, as a customize hook would have selected them.
    #[arg(long, num_args = 1..)]
    pub related: Vec<PathBuf>,
    /// URL of a running hook (overrides the controller's URL).
    #[arg(long, conflicts_with = "hook_cmd")]
    pub hook: Option<String>,
    /// Command that starts the hook server; it gets a free port in `PORT` (and `HOST=127.0.0.1`), its
    /// output goes to stderr, and it is stopped afterwards.
    #[arg(long)]
    pub hook_cmd: Option<String>,
    /// Call the finalize hook with `finalizing: true` instead of sync.
    #[arg(long)]
    pub finalizing: bool,
    /// The parent type is cluster-scoped (built-in cluster-scoped kinds are recognised without it;
    /// otherwise a parent without a namespace is in `default`).
    #[arg(long)]
    pub cluster_scoped_parent: bool,
    /// Kind of a child resource that has no fixture object, e.g. `--kind widgets=Widget`.
    #[arg(long, value_parser = parse_kind)]
    pub kind: Vec<(String, String)>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Yaml)]
    pub output: Format,
}

/// How the report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// YAML documents with `#` comments saying what the hub would do, and a diff for updates.
    Yaml,
    /// One JSON object, for scripts and CI checks.
    Json,
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

fn invalid(err: &(dyn std::error::Error + 'static)) -> RenderError {
    RenderError::Invalid(with_causes(err))
}

/// Runs the hook and returns the report in the requested format.
pub async fn render(args: &RenderArgs) -> Result<String, RenderError> {
    let controller = read_one(&args.controller)?;
    let report = match controller.get("kind").and_then(Value::as_str) {
        Some("CompositeController") => render_composite(args, controller).await?,
        Some("DecoratorController") => render_decorator(args, controller).await?,
        other => {
            return Err(input(
                &args.controller,
                &format!("expected a CompositeController or a DecoratorController, found kind {other:?}"),
            ));
        }
    };
    Ok(match args.output {
        Format::Yaml => report.yaml(),
        Format::Json => report.json(),
    })
}

async fn render_composite(args: &RenderArgs, controller: Value) -> Result<Report, RenderError> {
    let cc: CompositeController = serde_json::from_value(controller.clone())
        .map_err(|e| input(&args.controller, &format!("not a valid CompositeController: {e}")))?;
    let rule = &cc.spec.parent_resource;
    let parent = read_parent(args, &rule.api_version)?;
    let parent_resource = resolved_parent(&parent, &rule.resource, args.cluster_scoped_parent);
    let parent_ns = parent_resource.namespaced.then_some(parent.metadata.namespace.as_deref()).flatten();
    let hooks = cc.spec.hooks.as_ref().ok_or_else(|| RenderError::Setup("the controller defines no hooks".into()))?;
    let hook = if args.finalizing { hooks.finalize.as_ref() } else { hooks.sync.as_ref() };
    let hook = hook.ok_or_else(|| RenderError::Setup("the controller has no hook for this call".into()))?;
    let types = child_types(&cc.spec.child_resources, &read_objects(&args.children)?, &args.kind, parent_ns)?;
    let selector = child_selector(&cc, &parent).map_err(|e| invalid(&e))?;

    // The hub's claim, object by object: owned and adopted ones are the children the hook sees.
    let mut observed = vec![ChildMap::new(); types.len()];
    let mut adopted = BTreeSet::new();
    let mut untouched = Vec::new();
    for (index, obj) in &types.fixtures {
        let Some(index) = *index else {
            untouched.push(Change::ignored(obj, "not of a child type the controller declares".into()));
            continue;
        };
        match claim_of(obj, &parent, parent_ns, &selector) {
            Claim::Owned => {
                observed[index].insert(ObjectKey::of(obj), Arc::new(obj.clone()));
            }
            Claim::Adopt => {
                // The hook sees it as the hub sends it: with the parent as its controller.
                let mut obj = obj.clone();
                let owner = owner_reference(&parent, &parent_resource);
                obj.metadata.owner_references.get_or_insert_with(Vec::new).push(owner);
                adopted.insert((index, ObjectKey::of(&obj)));
                observed[index].insert(ObjectKey::of(&obj), Arc::new(obj));
            }
            Claim::Release => untouched.push(Change::other(
                Action::Release,
                obj,
                "controlled by this parent, but the selector no longer matches its labels: the hub removes its \
                 ownerReference and leaves the object"
                    .into(),
            )),
            Claim::Ignore(why) => untouched.push(Change::ignored(obj, why.to_string())),
        }
    }

    let version = hook.version();
    let request_children = request_map(&types.resources, version, parent_ns, &observed);
    let related = related_map(&read_objects(&args.related)?, version, parent_ns);
    let (hook, _server) = hook_to_call(hook, args).await?;
    let endpoint =
        endpoint(&hook, &cc.spec.endpoint_configs, "CompositeController", cc.metadata.name.as_deref(), args)?;
    let ask = composite::Ask {
        cc: &cc,
        controller: &controller,
        parent_resource: &parent_resource,
        child_resources: &types.resources,
    };
    let parent_json = crate::hooks::for_hooks(&parent);
    let observed_now =
        composite::Observed { children: &request_children, related: &related, finalizing: args.finalizing };
    let composite::Answer { desired, status, response } =
        ask.ask(&endpoint, &parent, &parent_json, observed_now, &selector).await.map_err(|e| invalid(&e))?;

    let methods: Vec<UpdateMethod> = cc.spec.child_resources.iter().map(ChildResourceRule::method).collect();
    let mut changes = child_changes(&desired, &observed, &adopted, &methods);
    changes.extend(untouched);
    Ok(Report {
        controller: ("CompositeController", cc.metadata.name.clone().unwrap_or_default()),
        parent: describe(&parent),
        status_changed: parent.data.get("status") != Some(&status),
        status: Some(status),
        metadata_patch: None,
        resync_after: response.resync_after_seconds,
        finalized: response.finalized,
        events: response.events,
        objects_field: "children",
        changes,
        notes: Vec::new(),
    })
}

async fn render_decorator(args: &RenderArgs, controller: Value) -> Result<Report, RenderError> {
    let dc: DecoratorController = serde_json::from_value(controller.clone())
        .map_err(|e| input(&args.controller, &format!("not a valid DecoratorController: {e}")))?;
    let name = dc.metadata.name.clone().unwrap_or_default();
    let target = read_parent(args, "")?;
    let (api_version, kind) = type_of(&target);
    let rules: Vec<_> = dc.spec.resources.iter().filter(|r| r.api_version == api_version).collect();
    let rule = match rules.as_slice() {
        [one] => *one,
        several => several.iter().copied().find(|r| r.resource == plural_of(api_version, kind)).ok_or_else(|| {
            RenderError::Setup(format!(
                "the target is a {api_version} {kind}, and no `resources` rule of the controller is for it"
            ))
        })?,
    };
    let resource = resolved_parent(&target, &rule.resource, args.cluster_scoped_parent);
    let target_ns = resource.namespaced.then_some(target.metadata.namespace.as_deref()).flatten();
    let hooks = &dc.spec.hooks;
    let hook = if args.finalizing { hooks.finalize.as_ref() } else { hooks.sync.as_ref() };
    let hook = hook.ok_or_else(|| RenderError::Setup("the controller has no hook for this call".into()))?;
    let types = child_types(&dc.spec.attachments, &read_objects(&args.children)?, &args.kind, target_ns)?;

    let mut notes = Vec::new();
    if !selects(rule, &target)? && !args.finalizing {
        notes.push(
            "the target does not match the controller's label/annotation selectors: the hub would not call \
             the sync hook for it (only the finalize hook, if it carries the controller's finalizer)"
                .to_owned(),
        );
    }
    // A decorator adopts nothing: its attachments are the objects it made, marked with its name.
    let target_uid = target.metadata.uid.clone().unwrap_or_default();
    let mut observed = vec![ChildMap::new(); types.len()];
    let mut untouched = Vec::new();
    for (index, obj) in &types.fixtures {
        let Some(index) = *index else {
            untouched.push(Change::ignored(obj, "not of an attachment type the controller declares".into()));
            continue;
        };
        if target_ns.is_some() && obj.metadata.namespace.as_deref() != target_ns {
            untouched.push(Change::ignored(obj, "not in the target's namespace".into()));
        } else if is_attachment_of(obj, &target_uid, &name) {
            observed[index].insert(ObjectKey::of(obj), Arc::new(obj.clone()));
        } else {
            let why = format!(
                "not an attachment of this target: that needs a controller ownerReference to the target and the \
                 annotation {DECORATOR_ANNOTATION}: {name}"
            );
            untouched.push(Change::ignored(obj, why));
        }
    }

    let version = hook.version();
    let attachments = request_map(&types.resources, version, target_ns, &observed);
    let related = related_map(&read_objects(&args.related)?, version, target_ns);
    let (hook, _server) = hook_to_call(hook, args).await?;
    let endpoint =
        endpoint(&hook, &dc.spec.endpoint_configs, "DecoratorController", dc.metadata.name.as_deref(), args)?;
    let ask = decorator::Ask { name: &name, controller: &controller, attachment_resources: &types.resources };
    let observed_now =
        decorator::Observed { attachments: &attachments, related: &related, finalizing: args.finalizing };
    let (answer, response) = ask.ask(&endpoint, &target, &resource, observed_now).await.map_err(|e| invalid(&e))?;

    let methods: Vec<UpdateMethod> = dc.spec.attachments.iter().map(ChildResourceRule::method).collect();
    let mut changes = child_changes(&answer.desired, &observed, &BTreeSet::new(), &methods);
    changes.extend(untouched);
    Ok(Report {
        controller: ("DecoratorController", name),
        parent: describe(&target),
        status_changed: answer.status.as_ref().is_some_and(|s| target.data.get("status") != Some(s)),
        status: answer.status,
        metadata_patch: answer.metadata_patch,
        resync_after: response.resync_after_seconds,
        finalized: response.finalized,
        events: response.events,
        objects_field: "attachments",
        changes,
        notes,
    })
}

/// Whether a decorator rule's label and annotation selectors match the target.
fn selects(rule: &crate::api::DecoratorResourceRule, target: &DynamicObject) -> Result<bool, RenderError> {
    let setup =
        |e: crate::cache::selector::SelectorError| RenderError::Setup(format!("the controller's selector: {e}"));
    let labels = rule.label_selector.as_ref().map(crate::cache::selector::Selector::from_label_selector).transpose();
    let annotations = rule
        .annotation_selector
        .as_ref()
        .map(|a| crate::cache::selector::Selector::from_label_selector(&a.as_label_selector()))
        .transpose();
    let (labels, annotations) = (labels.map_err(setup)?, annotations.map_err(setup)?);
    Ok(labels.is_none_or(|s| s.matches(&crate::api::labels_of(&target.metadata)))
        && annotations.is_none_or(|s| s.matches(&target.metadata.annotations.clone().unwrap_or_default())))
}

// ---- fixtures ------------------------------------------------------------------------------------

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

/// The parent fixture, with what the API server would have given it: a UID, and a namespace unless
/// its type is cluster-scoped. `api_version` is checked against the controller's rule when given.
fn read_parent(args: &RenderArgs, api_version: &str) -> Result<DynamicObject, RenderError> {
    let mut parent: DynamicObject =
        serde_json::from_value(read_one(&args.parent)?).map_err(|e| input(&args.parent, &e.to_string()))?;
    let (have, kind) = type_of(&parent);
    let (have, kind) = (have.to_owned(), kind.to_owned());
    if kind.is_empty() {
        return Err(input(&args.parent, "the object has no apiVersion and kind"));
    }
    if !api_version.is_empty() && have != api_version {
        return Err(RenderError::Setup(format!(
            "the parent is {have}, the controller's parentResource is {api_version}"
        )));
    }
    parent.metadata.uid.get_or_insert_with(|| "00000000-0000-0000-0000-000000000000".into());
    let cluster_scoped = args.cluster_scoped_parent || CLUSTER_SCOPED_KINDS.contains(&kind.as_str());
    if !cluster_scoped {
        parent.metadata.namespace.get_or_insert_with(|| "default".into());
    }
    Ok(parent)
}

fn type_of(obj: &DynamicObject) -> (&str, &str) {
    obj.types.as_ref().map_or(("", ""), |t| (t.api_version.as_str(), t.kind.as_str()))
}

/// The plural resource name of a kind by kube-core's discovery-free rules (`ApiResource::from_gvk`):
/// `Gateway` → `gateways`, `Box` → `boxes`, `Policy` → `policies`. Right for every built-in type and
/// for CRDs that follow the usual English rules; `--kind` covers the others.
fn plural_of(api_version: &str, kind: &str) -> String {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind)).plural
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

fn resolved_parent(parent: &DynamicObject, plural: &str, cluster_scoped: bool) -> Arc<ResolvedResource> {
    let (api_version, kind) = type_of(parent);
    resolved(api_version, kind, plural, !cluster_scoped && parent.metadata.namespace.is_some())
}

/// Kinds of common built-in resources by group and plural, for child types without fixture objects
/// (a plural cannot be turned back into a kind: `endpoints`, `networkpolicies`), and their scope.
const BUILT_IN: &[(&str, &str, &str, bool)] = &[
    ("", "pods", "Pod", true),
    ("", "services", "Service", true),
    ("", "configmaps", "ConfigMap", true),
    ("", "secrets", "Secret", true),
    ("", "serviceaccounts", "ServiceAccount", true),
    ("", "persistentvolumeclaims", "PersistentVolumeClaim", true),
    ("", "resourcequotas", "ResourceQuota", true),
    ("", "limitranges", "LimitRange", true),
    ("", "namespaces", "Namespace", false),
    ("", "nodes", "Node", false),
    ("", "persistentvolumes", "PersistentVolume", false),
    ("apps", "deployments", "Deployment", true),
    ("apps", "replicasets", "ReplicaSet", true),
    ("apps", "statefulsets", "StatefulSet", true),
    ("apps", "daemonsets", "DaemonSet", true),
    ("batch", "jobs", "Job", true),
    ("batch", "cronjobs", "CronJob", true),
    ("networking.k8s.io", "ingresses", "Ingress", true),
    ("networking.k8s.io", "networkpolicies", "NetworkPolicy", true),
    ("policy", "poddisruptionbudgets", "PodDisruptionBudget", true),
    ("autoscaling", "horizontalpodautoscalers", "HorizontalPodAutoscaler", true),
    ("rbac.authorization.k8s.io", "roles", "Role", true),
    ("rbac.authorization.k8s.io", "rolebindings", "RoleBinding", true),
    ("rbac.authorization.k8s.io", "clusterroles", "ClusterRole", false),
    ("rbac.authorization.k8s.io", "clusterrolebindings", "ClusterRoleBinding", false),
    ("apiextensions.k8s.io", "customresourcedefinitions", "CustomResourceDefinition", false),
];

/// Built-in kinds whose objects have no namespace.
const CLUSTER_SCOPED_KINDS: &[&str] = &[
    "Namespace",
    "Node",
    "PersistentVolume",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "StorageClass",
    "PriorityClass",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "CompositeController",
    "DecoratorController",
];

/// The declared child types, resolved, and the fixture objects with the index of their type (`None`:
/// not a declared type).
struct ChildTypes {
    resources: Vec<Arc<ResolvedResource>>,
    fixtures: Vec<(Option<usize>, DynamicObject)>,
}

impl ChildTypes {
    fn len(&self) -> usize {
        self.resources.len()
    }
}

fn child_types(
    rules: &[ChildResourceRule],
    fixtures: &[DynamicObject],
    kinds: &[(String, String)],
    parent_ns: Option<&str>,
) -> Result<ChildTypes, RenderError> {
    let mut resources = Vec::new();
    for rule in rules {
        let explicit = kinds.iter().find(|(r, _)| *r == rule.resource).map(|(_, k)| k.clone());
        let group = rule.api_version.rsplit_once('/').map_or("", |(group, _)| group);
        let built_in = BUILT_IN.iter().find(|(g, r, _, _)| *g == group && *r == rule.resource);
        let from_fixture = fixtures.iter().find(|c| {
            let (api_version, kind) = type_of(c);
            api_version == rule.api_version && plural_of(api_version, kind) == rule.resource
        });
        let kind = explicit
            .or_else(|| from_fixture.map(|c| type_of(c).1.to_owned()))
            .or_else(|| built_in.map(|(_, _, k, _)| (*k).to_owned()))
            .ok_or_else(|| {
                RenderError::Setup(format!(
                    "cannot tell the kind of child resource {}: add a fixture object or --kind {}=Kind",
                    rule.resource, rule.resource
                ))
            })?;
        let namespaced = match (built_in, from_fixture) {
            (Some((_, _, _, namespaced)), _) => *namespaced,
            (None, Some(c)) => c.metadata.namespace.is_some() || parent_ns.is_some(),
            (None, None) => !CLUSTER_SCOPED_KINDS.contains(&kind.as_str()),
        };
        resources.push(resolved(&rule.api_version, &kind, &rule.resource, namespaced));
    }
    let fixtures = fixtures
        .iter()
        .map(|obj| {
            let (api_version, kind) = type_of(obj);
            let index = resources.iter().position(|r| r.api_version() == api_version && r.kind() == kind);
            let mut obj = obj.clone();
            // A fixture without a namespace lives in the parent's, as the Python and Node helpers take it.
            if index.is_some_and(|i| resources[i].namespaced) && obj.metadata.namespace.is_none() {
                obj.metadata.namespace = parent_ns.map(str::to_owned);
            }
            (index, obj)
        })
        .collect();
    Ok(ChildTypes { resources, fixtures })
}

fn related_map(related: &[DynamicObject], version: HookVersion, parent_ns: Option<&str>) -> ObjectMaps {
    let mut maps = ObjectMaps::new();
    for obj in related {
        let (api_version, kind) = type_of(obj);
        let entry = maps.entry(group_version_kind_key(api_version, kind)).or_default();
        let key = ObjectKey::of(obj);
        if let Some(k) = object_key(version, parent_ns, key.namespace.as_deref(), &key.name) {
            entry.insert(k, WireObject(Arc::new(obj.clone())));
        }
    }
    maps
}

// ---- the hook --------------------------------------------------------------------------------------

/// The hook to call: the controller's, or `--hook`, or a server started with `--hook-cmd` (kept alive
/// by the returned handle).
async fn hook_to_call(hook: &Hook, args: &RenderArgs) -> Result<(Hook, Option<HookProcess>), RenderError> {
    Ok(match (&args.hook, &args.hook_cmd) {
        (Some(url), _) => (with_url(hook, url.clone()), None),
        (None, Some(cmd)) => {
            let server = HookProcess::start(cmd).await?;
            let path = hook_path(hook);
            (with_url(hook, format!("http://127.0.0.1:{}{path}", server.port)), Some(server))
        }
        (None, None) => (hook.clone(), None),
    })
}

/// The hook client's endpoint for `hook`, with the TLS/auth settings the controller gives it (settings
/// that need the cluster, such as a Secret reference, are refused with the reason).
fn endpoint(
    hook: &Hook,
    endpoint_configs: &[crate::api::EndpointConfig],
    kind: &str,
    name: Option<&str>,
    args: &RenderArgs,
) -> Result<Endpoint, RenderError> {
    let labels = HookLabels {
        kind: kind.to_owned(),
        controller: name.unwrap_or_default().to_owned(),
        hook: if args.finalizing { HookKind::Finalize } else { HookKind::Sync },
    };
    HookClient::default().endpoint(hook, endpoint_configs, labels).map_err(|e| RenderError::Setup(with_causes(&e)))
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

/// A hook server started for one render, killed when dropped. Its stdout and stderr go to render's
/// stderr, so a hook's prints and tracebacks are seen without mixing into the report.
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
            .env("HOST", "127.0.0.1")
            .stdout(Stdio::from(std::io::stderr()))
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
                    "hook command {cmd:?} did not listen on $PORT ({port}) in 15s; does it read PORT? \
                     (serve() of the helper libraries does, unless given a port)"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Self { port, _child: child })
    }
}

// ---- the report ------------------------------------------------------------------------------------

/// What the hub would do with one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Create,
    Update,
    Unchanged,
    Delete,
    Release,
    Ignore,
}

impl Action {
    fn word(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Update => "update",
            Self::Unchanged => "unchanged",
            Self::Delete => "delete",
            Self::Release => "release",
            Self::Ignore => "ignore",
        }
    }
}

/// One object of the report.
struct Change {
    action: Action,
    /// Adopted by the parent before anything else (an orphan its selector matches).
    adopted: bool,
    kind: String,
    api_version: String,
    key: ObjectKey,
    /// Why, when the action alone does not say it.
    reason: Option<String>,
    /// The desired object (create, update, unchanged).
    desired: Option<Value>,
    /// Observed → desired, line by line (update, or unchanged under `OnDelete`).
    diff: Option<String>,
}

impl Change {
    fn other(action: Action, obj: &DynamicObject, reason: String) -> Self {
        let (api_version, kind) = type_of(obj);
        Self {
            action,
            adopted: false,
            kind: kind.to_owned(),
            api_version: api_version.to_owned(),
            key: ObjectKey::of(obj),
            reason: Some(reason),
            desired: None,
            diff: None,
        }
    }

    fn ignored(obj: &DynamicObject, reason: String) -> Self {
        Self::other(Action::Ignore, obj, reason)
    }

    fn comment(&self) -> String {
        let mut why: Vec<String> = Vec::new();
        if self.adopted {
            why.push("adopted first: an orphan the selector matches".into());
        }
        why.extend(self.reason.clone());
        let why = if why.is_empty() { String::new() } else { format!(" ({})", why.join("; ")) };
        format!("# {} {} {}{why}", self.action.word(), self.kind, self.key)
    }
}

/// Creates, updates and deletes, per the update method of each type, as `children::manage` and
/// `apply` would do them.
fn child_changes(
    desired: &[ChildMap<Value>],
    observed: &[ChildMap<Arc<DynamicObject>>],
    adopted: &BTreeSet<(usize, ObjectKey)>,
    methods: &[UpdateMethod],
) -> Vec<Change> {
    let mut changes = Vec::new();
    for (index, (desired, observed)) in desired.iter().zip(observed).enumerate() {
        let method = methods.get(index).copied().unwrap_or_default();
        for (key, obj) in desired {
            let text = |field: &str| obj[field].as_str().unwrap_or_default().to_owned();
            let mut change = Change {
                action: Action::Create,
                adopted: adopted.contains(&(index, key.clone())),
                kind: text("kind"),
                api_version: text("apiVersion"),
                key: key.clone(),
                reason: None,
                desired: Some(obj.clone()),
                diff: None,
            };
            if let Some(current) = observed.get(key) {
                // Ownership is the hub's business, not the hook's: leave it out of the comparison.
                let mut wanted = obj.clone();
                if let Some(meta) = wanted.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.remove("ownerReferences");
                }
                let (have, want) = (yaml(&comparable(current, &wanted)), yaml(&wanted));
                change.action = Action::Unchanged;
                if current.metadata.deletion_timestamp.is_some() {
                    change.reason = Some("being deleted: the hub waits until it is gone".into());
                } else if have != want {
                    change.diff = Some(diff(&have, &want));
                    (change.action, change.reason) = match method {
                        UpdateMethod::OnDelete => (
                            Action::Unchanged,
                            Some("OnDelete: the hub updates it only by recreating it once deleted".into()),
                        ),
                        UpdateMethod::Recreate | UpdateMethod::RollingRecreate => {
                            (Action::Update, Some("Recreate: deleted, then created again".into()))
                        }
                        UpdateMethod::InPlace | UpdateMethod::RollingInPlace => (Action::Update, None),
                    };
                }
            }
            changes.push(change);
        }
        for (key, obj) in observed.iter().filter(|(k, _)| !desired.contains_key(*k)) {
            let mut change = Change::other(Action::Delete, obj, String::new());
            change.reason = obj.metadata.deletion_timestamp.is_some().then(|| "already being deleted".into());
            change.adopted = adopted.contains(&(index, key.clone()));
            changes.push(change);
        }
    }
    changes
}

/// Everything `render` found out, printed as YAML or JSON.
struct Report {
    controller: (&'static str, String),
    parent: String,
    /// The status the hub would write (`None`: a decorator leaving it alone).
    status: Option<Value>,
    status_changed: bool,
    /// Labels and annotations a decorator merges into its target.
    metadata_patch: Option<Value>,
    resync_after: Option<f64>,
    finalized: bool,
    events: Vec<HookEvent>,
    /// `children` or `attachments`.
    objects_field: &'static str,
    changes: Vec<Change>,
    notes: Vec<String>,
}

impl Report {
    fn count(&self, action: Action) -> usize {
        self.changes.iter().filter(|c| c.action == action).count()
    }

    /// `2 created, 1 updated, 0 deleted, status changed`, plus what was adopted, released or ignored.
    fn summary(&self) -> String {
        let mut text = format!(
            "{} created, {} updated, {} deleted",
            self.count(Action::Create),
            self.count(Action::Update),
            self.count(Action::Delete)
        );
        let adopted = self.changes.iter().filter(|c| c.adopted).count();
        for (n, word) in
            [(adopted, "adopted"), (self.count(Action::Release), "released"), (self.count(Action::Ignore), "ignored")]
        {
            if n > 0 {
                let _ = write!(text, ", {n} {word}");
            }
        }
        text.push_str(if self.status_changed { ", status changed" } else { ", status unchanged" });
        if self.metadata_patch.is_some() {
            text.push_str(", labels/annotations changed");
        }
        text
    }

    fn yaml(&self) -> String {
        let mut out = String::new();
        for note in &self.notes {
            let _ = writeln!(out, "# note: {note}");
        }
        match &self.status {
            Some(status) => {
                let _ = writeln!(out, "# status{}", if self.status_changed { "" } else { " (unchanged)" });
                out.push_str(&yaml(&json!({ "status": status })));
            }
            None => {
                let _ = writeln!(out, "# status: left alone (the hook returned none)");
            }
        }
        if let Some(patch) = &self.metadata_patch {
            let _ = writeln!(out, "# merged into {} (null deletes)", self.parent);
            out.push_str(&yaml(patch));
        }
        if let Some(after) = self.resync_after.filter(|s| *s > 0.0) {
            let _ = writeln!(out, "# resync after {after}s");
        }
        if self.finalized {
            let _ = writeln!(out, "# finalized: the hub removes its finalizer");
        }
        for event in &self.events {
            let _ = writeln!(out, "# event {} {}: {}", event.type_, event.reason, event.message);
        }
        for change in &self.changes {
            let _ = writeln!(out, "---\n{}", change.comment());
            match (change.action, &change.diff, &change.desired) {
                (_, Some(diff), _) => out.push_str(diff),
                (Action::Create, None, Some(desired)) => out.push_str(&yaml(desired)),
                _ => {}
            }
        }
        let _ = writeln!(out, "---\n# summary: {}", self.summary());
        out
    }

    fn json(&self) -> String {
        let objects: Vec<Value> = self
            .changes
            .iter()
            .map(|c| {
                json!({
                    "action": c.action.word(),
                    "adopted": c.adopted,
                    "apiVersion": c.api_version,
                    "kind": c.kind,
                    "namespace": c.key.namespace,
                    "name": c.key.name,
                    "reason": c.reason,
                    "object": c.desired,
                    "diff": c.diff,
                })
            })
            .collect();
        let mut report = json!({
            "controller": {"kind": self.controller.0, "name": self.controller.1},
            "parent": self.parent,
            "status": self.status,
            "statusChanged": self.status_changed,
            "resyncAfterSeconds": self.resync_after,
            "finalized": self.finalized,
            "events": self.events,
            self.objects_field: objects,
            "notes": self.notes,
            "summary": {
                "created": self.count(Action::Create),
                "updated": self.count(Action::Update),
                "unchanged": self.count(Action::Unchanged),
                "deleted": self.count(Action::Delete),
                "adopted": self.changes.iter().filter(|c| c.adopted).count(),
                "released": self.count(Action::Release),
                "ignored": self.count(Action::Ignore),
                "statusChanged": self.status_changed,
                "text": self.summary(),
            },
        });
        if let Some(patch) = &self.metadata_patch {
            report["metadata"] = patch["metadata"].clone();
        }
        let mut text = serde_json::to_string_pretty(&report).unwrap_or_default();
        text.push('\n');
        text
    }
}

/// `Kind namespace/name`.
fn describe(obj: &DynamicObject) -> String {
    format!("{} {}", type_of(obj).1, ObjectKey::of(obj))
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
    fn plurals_follow_kube_core_not_guesses() {
        assert_eq!(plural_of("v1", "Pod"), "pods");
        assert_eq!(plural_of("networking.k8s.io/v1", "NetworkPolicy"), "networkpolicies");
        assert_eq!(plural_of("networking.k8s.io/v1", "Ingress"), "ingresses");
        assert_eq!(plural_of("gateway.networking.k8s.io/v1", "Gateway"), "gateways");
        assert_eq!(plural_of("example.com/v1", "Box"), "boxes");
        assert_eq!(plural_of("example.com/v1", "Policy"), "policies");
        assert_eq!(plural_of("v1", "Endpoints"), "endpoints");
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

    fn change(action: Action, adopted: bool) -> Change {
        Change {
            action,
            adopted,
            kind: "Pod".into(),
            api_version: "v1".into(),
            key: ObjectKey { namespace: Some("default".into()), name: "p".into() },
            reason: None,
            desired: None,
            diff: None,
        }
    }

    #[test]
    fn the_summary_counts_what_the_hub_would_do() {
        let mut report = Report {
            controller: ("CompositeController", "c".into()),
            parent: "P default/p".into(),
            status: Some(json!({})),
            status_changed: true,
            metadata_patch: None,
            resync_after: None,
            finalized: false,
            events: Vec::new(),
            objects_field: "children",
            changes: vec![
                change(Action::Create, false),
                change(Action::Create, false),
                change(Action::Update, true),
                change(Action::Unchanged, false),
            ],
            notes: Vec::new(),
        };
        assert_eq!(report.summary(), "2 created, 1 updated, 0 deleted, 1 adopted, status changed");
        report.changes.push(change(Action::Ignore, false));
        report.status_changed = false;
        assert_eq!(report.summary(), "2 created, 1 updated, 0 deleted, 1 adopted, 1 ignored, status unchanged");
    }
}
