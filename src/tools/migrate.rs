//! `metahook migrate --dry-run`: what switching a live cluster from Metacontroller to metahook would
//! change, without changing anything.
//!
//! For every controller the hub would run, each parent's (or target's) sync hook is called as the
//! engine calls it, with the live children, and every child Metacontroller wrote is compared with the
//! answer: whose field ownership moves to metahook, and which fields go because the hook no longer
//! returns them (fields that only Metacontroller's managers or metahook own and the desired object
//! lacks). A dry-run create tells those the API server fills in again by default from those really
//! removed. Nothing is written; what it cannot know is printed with the report.
//!
//! It also names every hook URL whose host is a bare Service name (`http://profile-controller/sync`):
//! such a name resolves in the namespace of whoever calls the hook — Metacontroller's Pod, which
//! Kubeflow runs in its own namespace — and not from a hub installed in another, where every sync would
//! fail with a DNS error. It says which namespace holds a Service of that name, and the two ways out:
//! the URL with the namespace, or the hub's `hookHosts` (issue 62).

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::{Client, ResourceExt as _};
use serde_json::Value;

use crate::api::{CompositeController, DecoratorController, UpdateMethod, labels_of};
use crate::cache::discovery::{Discovery, ResolvedResource};
use crate::cache::informers::main_resource;
use crate::cache::informers::{ObjectKey, controller_uid};
use crate::cache::selector::Selector;
use crate::controllers::composite::{self, child_selector};
use crate::controllers::decorator::{self, DECORATOR_ANNOTATION};
use crate::engine::error::SyncError;
use crate::engine::sync::Observed;
use crate::hooks::{HookClient, HookKind, HookLabels, ObjectMaps};
use crate::ops::config::{Config, ConfigOverrides};
use crate::write::children::{ChildMap, request_map};
use crate::write::fields;
use crate::write::take_over::{LAST_APPLIED_ANNOTATION, TakeOver};

/// Arguments of `metahook migrate`.
#[derive(Debug, Clone, clap::Args)]
pub struct MigrateArgs {
    /// Only list what a switch would change. Required: metahook itself takes each object over on its
    /// first write to it, so there is nothing to run beforehand.
    #[arg(long, required = true)]
    pub dry_run: bool,
    /// Kubeconfig file. Without it: `KUBECONFIG`, then `~/.kube/config`, then in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The hub's configuration file (its `fieldManager`, `takeOverFieldManagers`, `targetLabelSelector`).
    #[arg(long, env = "METAHOOK_CONFIG")]
    pub config: Option<PathBuf>,
}

/// Why the listing could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DryRunError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("connecting to the cluster: {0}")]
    Connect(String),
    #[error("listing {what}: {source}")]
    List { what: String, source: kube::Error },
}

/// What the listing says of a hook answer the engine would not act on: the hook failed, or its answer
/// is refused (exactly as the engine refuses it).
fn refusal(error: &SyncError) -> String {
    match error {
        SyncError::Hook(e) => format!("the sync hook failed: {e}"),
        other => format!("the engine would refuse the answer: {other}"),
    }
}

/// Entry point of `metahook migrate`: prints the report, exits 1 when it could not be made.
#[must_use]
pub fn main(args: &MigrateArgs) -> ExitCode {
    let run = async {
        let config = Config::load(args.config.as_deref(), &ConfigOverrides::default())
            .map_err(|e| DryRunError::Config(e.to_string()))?;
        let client = crate::ops::client::client_for(args.kubeconfig.as_deref())
            .await
            .map_err(|e| DryRunError::Connect(format!("{e:#}")))?;
        report(&client, &config).await
    };
    let result = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(run),
        Err(e) => Err(DryRunError::Connect(e.to_string())),
    };
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("metahook migrate: {e}");
            ExitCode::from(1)
        }
    }
}

/// The report for every controller `config` selects on the cluster `client` talks to.
pub async fn report(client: &Client, config: &Config) -> Result<String, DryRunError> {
    let selector = crate::cache::selector::parse_selector_string(&config.target_label_selector)
        .map_err(|e| DryRunError::Config(e.to_string()))?;
    let mut run = DryRun {
        client: client.clone(),
        discovery: Discovery::new(client.clone(), std::time::Duration::from_secs(600)),
        hooks: HookClient::new(&config.hook_client(), Some(client.clone())),
        take_over: TakeOver::new(&config.field_manager, config.take_over_field_managers.clone()),
        listed: HashMap::new(),
        out: String::new(),
        tally: Tally::default(),
    };
    let list = |what: &str| {
        let what = what.to_owned();
        move |source| DryRunError::List { what, source }
    };
    let composites = Api::<CompositeController>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(list("CompositeControllers"))?;
    for cc in composites.items.iter().filter(|c| selector.matches(&labels_of(&c.metadata))) {
        run.composite(cc).await?;
    }
    let decorators = Api::<DecoratorController>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(list("DecoratorControllers"))?;
    for dc in decorators.items.iter().filter(|d| selector.matches(&labels_of(&d.metadata))) {
        run.decorator(dc).await?;
    }
    Ok(run.finish())
}

#[derive(Default)]
struct Tally {
    objects: usize,
    removed: usize,
    defaulted: usize,
    untouched: usize,
    problems: usize,
    /// Hook URLs whose host is a bare Service name.
    bare_hosts: usize,
}

/// The host (and port) of a hook URL whose host is a bare name — no dot, not an IP address, not
/// `localhost` — which the cluster's DNS resolves only in the namespace of whoever calls it.
fn bare_host(url: &str) -> Option<(String, Option<u16>)> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?;
    let bare = !host.contains('.')
        && !host.contains(':')
        && !host.starts_with('[')
        && !host.eq_ignore_ascii_case("localhost")
        && host.parse::<std::net::IpAddr>().is_err();
    bare.then(|| (host.to_owned(), uri.port_u16()))
}

struct DryRun {
    client: Client,
    discovery: Discovery,
    hooks: HookClient,
    take_over: TakeOver,
    /// Every object of a type, listed once per run.
    listed: HashMap<String, Arc<Vec<Arc<DynamicObject>>>>,
    out: String,
    tally: Tally,
}

/// Child (attachment) types of one controller, resolved.
struct Types {
    resources: Vec<Arc<ResolvedResource>>,
    methods: Vec<UpdateMethod>,
}

impl DryRun {
    fn line(&mut self, indent: usize, text: &str) {
        let _ = writeln!(self.out, "{:indent$}{text}", "");
    }

    fn problem(&mut self, indent: usize, text: &str) {
        self.tally.problems += 1;
        self.line(indent, &format!("cannot tell: {text}"));
    }

    async fn list(&mut self, resource: &ResolvedResource) -> Result<Arc<Vec<Arc<DynamicObject>>>, DryRunError> {
        let id = format!("{}/{}", resource.api_version(), resource.api_resource.plural);
        if let Some(hit) = self.listed.get(&id) {
            return Ok(Arc::clone(hit));
        }
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource.api_resource);
        let items = api
            .list(&ListParams::default())
            .await
            .map_err(|source| DryRunError::List { what: resource.api_resource.plural.clone(), source })?
            .items;
        let objects: Arc<Vec<Arc<DynamicObject>>> = Arc::new(
            items
                .into_iter()
                .map(|mut obj| {
                    obj.types = Some(kube::core::TypeMeta {
                        api_version: resource.api_version().to_owned(),
                        kind: resource.kind().to_owned(),
                    });
                    Arc::new(obj)
                })
                .collect(),
        );
        self.listed.insert(id, Arc::clone(&objects));
        Ok(objects)
    }

    async fn types(&mut self, rules: &[crate::api::ChildResourceRule]) -> Result<Types, String> {
        let mut types = Types { resources: Vec::new(), methods: Vec::new() };
        for rule in rules {
            let resource =
                self.discovery.resolve(&rule.api_version, &rule.resource).await.map_err(|e| e.to_string())?;
            types.resources.push(resource);
            types.methods.push(rule.method());
        }
        Ok(types)
    }

    /// Children of each type controlled by `owner` (in its namespace when `namespace` is set) that `keep` accepts.
    async fn owned(
        &mut self,
        types: &Types,
        owner: &DynamicObject,
        namespace: Option<&str>,
        keep: impl Fn(&DynamicObject) -> bool,
    ) -> Result<Vec<ChildMap<Arc<DynamicObject>>>, DryRunError> {
        let uid = owner.metadata.uid.as_deref();
        let mut observed = Vec::with_capacity(types.resources.len());
        for resource in &types.resources {
            let all = self.list(resource).await?;
            let children: ChildMap<Arc<DynamicObject>> = all
                .iter()
                .filter(|o| controller_uid(o) == uid)
                .filter(|o| namespace.is_none() || o.metadata.namespace.as_deref() == namespace)
                .filter(|o| keep(o))
                .map(|o| (ObjectKey::of(o), Arc::clone(o)))
                .collect();
            observed.push(children);
        }
        Ok(observed)
    }

    async fn composite(&mut self, cc: &CompositeController) -> Result<(), DryRunError> {
        self.line(0, &format!("CompositeController {}", cc.name_any()));
        if let Some(hooks) = &cc.spec.hooks {
            let named = [
                ("sync", hooks.sync.as_ref()),
                ("finalize", hooks.finalize.as_ref()),
                ("customize", hooks.customize.as_ref()),
            ];
            self.bare_hosts(&named).await;
        }
        let Some(hook) = cc.spec.hooks.as_ref().and_then(|h| h.sync.clone()) else {
            self.line(2, "no sync hook: children are never written");
            return Ok(());
        };
        let rule = &cc.spec.parent_resource;
        let parent_resource = match self.discovery.resolve(&rule.api_version, &rule.resource).await {
            Ok(r) => r,
            Err(e) => {
                self.problem(2, &e.to_string());
                return Ok(());
            }
        };
        let types = match self.types(&cc.spec.child_resources).await {
            Ok(t) => t,
            Err(e) => {
                self.problem(2, &e);
                return Ok(());
            }
        };
        if types.methods.iter().any(|m| m.is_rolling()) {
            self.line(2, "rolling updates: compared with the latest revision's answer only");
        }
        if !parent_resource.has_status {
            // What the engine does (see `crate::engine::status::replace_status`); Metacontroller refuses
            // such a parent type, so a switch starts writing these parents' status.
            self.line(
                2,
                "the parent type has no status subresource: the status is written with the whole object \
                 (its observedGeneration counts that write)",
            );
        }
        let parent_selector =
            rule.label_selector.as_ref().map_or(Ok(Selector::everything()), Selector::from_label_selector);
        let Ok(parent_selector) = parent_selector else {
            self.problem(2, "the parent label selector is invalid");
            return Ok(());
        };
        let cc_json = serde_json::to_value(cc).unwrap_or(Value::Null);
        let parents = self.list(&parent_resource).await?;
        for parent in parents.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            if !parent_selector.matches(&labels_of(&parent.metadata)) {
                continue;
            }
            let namespace = parent_resource.namespaced.then_some(parent.metadata.namespace.as_deref()).flatten();
            let heading = format!("{} {}", parent_resource.kind(), ObjectKey::of(parent));
            let selector = match child_selector(cc, parent) {
                Ok(s) => s,
                Err(e) => {
                    self.line(2, &heading);
                    self.problem(4, &e.to_string());
                    continue;
                }
            };
            let observed = self.owned(&types, parent, namespace, |o| selector.matches(&labels_of(&o.metadata))).await?;
            if !self.any_needed(&observed) {
                continue;
            }
            self.line(2, &heading);
            let children = request_map(&types.resources, hook.version(), namespace, &observed);
            let labels = HookLabels {
                kind: "CompositeController".into(),
                controller: cc.metadata.name.clone().unwrap_or_default(),
                hook: HookKind::Sync,
            };
            let ask = composite::Ask {
                cc,
                controller: &cc_json,
                parent_resource: &parent_resource,
                child_resources: &types.resources,
            };
            let related = ObjectMaps::new();
            let observed_now = Observed { children: &children, related: &related, finalizing: false };
            let desired = match self.hooks.endpoint(&hook, &cc.spec.endpoint_configs, labels) {
                Ok(endpoint) => {
                    let parent_json = crate::hooks::for_hooks(parent);
                    let answer = ask.ask(&endpoint, parent, &parent_json, observed_now, &selector).await;
                    answer.map(|a| a.desired).map_err(|e| refusal(&e))
                }
                Err(e) => Err(format!("the sync hook failed: {e}")),
            };
            match desired {
                Ok(desired) => self.compare(&types, &observed, &desired).await,
                Err(e) => self.problem(4, &e),
            }
        }
        Ok(())
    }

    async fn decorator(&mut self, dc: &DecoratorController) -> Result<(), DryRunError> {
        let name = dc.name_any();
        self.line(0, &format!("DecoratorController {name}"));
        let hooks = &dc.spec.hooks;
        let named = [
            ("sync", hooks.sync.as_ref()),
            ("finalize", hooks.finalize.as_ref()),
            ("customize", hooks.customize.as_ref()),
        ];
        self.bare_hosts(&named).await;
        let Some(hook) = dc.spec.hooks.sync.clone() else {
            self.line(2, "no sync hook: attachments are never written");
            return Ok(());
        };
        let types = match self.types(&dc.spec.attachments).await {
            Ok(t) => t,
            Err(e) => {
                self.problem(2, &e);
                return Ok(());
            }
        };
        let dc_json = serde_json::to_value(dc).unwrap_or(Value::Null);
        let mut seen = BTreeSet::new();
        for rule in &dc.spec.resources {
            let resource = match self.discovery.resolve(&rule.api_version, &rule.resource).await {
                Ok(r) => r,
                Err(e) => {
                    self.problem(2, &e.to_string());
                    continue;
                }
            };
            let labels = rule.label_selector.as_ref().map_or(Ok(Selector::everything()), Selector::from_label_selector);
            let annotations = rule
                .annotation_selector
                .as_ref()
                .map_or(Ok(Selector::everything()), |a| Selector::from_label_selector(&a.as_label_selector()));
            let (Ok(labels), Ok(annotations)) = (labels, annotations) else {
                self.problem(2, "a resource rule's selector is invalid");
                continue;
            };
            let targets = self.list(&resource).await?;
            for target in targets.iter().filter(|t| t.metadata.deletion_timestamp.is_none()) {
                let selected = labels.matches(&labels_of(&target.metadata))
                    && annotations.matches(&target.metadata.annotations.clone().unwrap_or_default());
                if !selected
                    || !seen.insert((
                        resource.api_version().to_owned(),
                        resource.kind().to_owned(),
                        ObjectKey::of(target),
                    ))
                {
                    continue;
                }
                let namespace = resource.namespaced.then_some(target.metadata.namespace.as_deref()).flatten();
                let ours = |o: &DynamicObject| o.annotations().get(DECORATOR_ANNOTATION) == Some(&name);
                let observed = self.owned(&types, target, namespace, ours).await?;
                if !self.any_needed(&observed) {
                    continue;
                }
                self.line(2, &format!("{} {}", resource.kind(), ObjectKey::of(target)));
                let attachments = request_map(&types.resources, hook.version(), namespace, &observed);
                let labels = HookLabels {
                    kind: "DecoratorController".into(),
                    controller: dc.metadata.name.clone().unwrap_or_default(),
                    hook: HookKind::Sync,
                };
                let ask = decorator::Ask { name: &name, controller: &dc_json, attachment_resources: &types.resources };
                let related = ObjectMaps::new();
                let observed_now = Observed { children: &attachments, related: &related, finalizing: false };
                let desired = match self.hooks.endpoint(&hook, &dc.spec.endpoint_configs, labels) {
                    Ok(endpoint) => {
                        let answer = ask.ask(&endpoint, target, &resource, observed_now).await;
                        answer.map(|(a, _)| a.desired).map_err(|e| refusal(&e))
                    }
                    Err(e) => Err(format!("the sync hook failed: {e}")),
                };
                match desired {
                    Ok(desired) => self.compare(&types, &observed, &desired).await,
                    Err(e) => self.problem(4, &e),
                }
            }
        }
        Ok(())
    }

    /// One entry per hook of a controller whose URL names a bare host (see the module doc).
    async fn bare_hosts(&mut self, hooks: &[(&str, Option<&crate::api::Hook>)]) {
        for (which, hook) in hooks {
            let Some(url) = hook.and_then(|h| h.webhook.url.as_deref()) else { continue };
            let Some((host, port)) = bare_host(url) else { continue };
            self.tally.bare_hosts += 1;
            self.line(
                2,
                &format!(
                    "hook {which} {url}: the host {host:?} names no namespace; it resolves in the namespace of \
                     whoever calls the hook (Metacontroller's Pod's), not from metahook's"
                ),
            );
            let services = Api::<k8s_openapi::api::core::v1::Service>::all(self.client.clone())
                .list(&ListParams::default().fields(&format!("metadata.name={host}")))
                .await;
            let namespaces: Vec<String> = match services {
                Ok(list) => list.items.into_iter().filter_map(|s| s.metadata.namespace).collect(),
                Err(e) => {
                    self.problem(4, &format!("where the Service {host:?} is: listing Services: {e}"));
                    continue;
                }
            };
            let authority =
                |namespace: &str| port.map_or(format!("{host}.{namespace}"), |p| format!("{host}.{namespace}:{p}"));
            match namespaces.as_slice() {
                [namespace] => {
                    let fixed = url.replacen(&port.map_or(host.clone(), |p| format!("{host}:{p}")), &authority(namespace), 1);
                    let target = format!("{host}.{namespace}:{}", port.unwrap_or(if url.starts_with("https") { 443 } else { 80 }));
                    let key = port.map_or(host.clone(), |p| format!("{host}:{p}"));
                    self.line(
                        4,
                        &format!(
                            "the Service {host:?} is in namespace {namespace:?}: set the URL to {fixed} (or use \
                             webhook.service), or keep it and add to the hub's config: hookHosts: {{{key:?}: {target:?}}}"
                        ),
                    );
                }
                [] => self.line(4, &format!("no Service {host:?} in any namespace: name the hook's server with its namespace")),
                several => self.line(
                    4,
                    &format!(
                        "Services {host:?} are in namespaces {}: name the one Metacontroller called (its own namespace's) \
                         in the URL, or in the hub's hookHosts",
                        several.join(", ")
                    ),
                ),
            }
        }
    }

    fn any_needed(&self, observed: &[ChildMap<Arc<DynamicObject>>]) -> bool {
        observed.iter().flat_map(|m| m.values()).any(|o| self.take_over.is_needed(o))
    }

    /// One entry per observed child Metacontroller wrote: what taking it over does to it.
    async fn compare(&mut self, types: &Types, observed: &[ChildMap<Arc<DynamicObject>>], desired: &[ChildMap<Value>]) {
        for (index, (observed, desired)) in observed.iter().zip(desired).enumerate() {
            let resource = &types.resources[index];
            let taken: Vec<(&ObjectKey, &Arc<DynamicObject>)> =
                observed.iter().filter(|(_, o)| self.take_over.is_needed(o)).collect();
            for (key, obj) in taken {
                let kind = resource.kind();
                let Some(wanted) = desired.get(key) else {
                    self.line(
                        4,
                        &format!("{kind} {key}: deleted, as Metacontroller would (the hook no longer returns it)"),
                    );
                    continue;
                };
                if types.methods[index] == UpdateMethod::OnDelete || obj.metadata.deletion_timestamp.is_some() {
                    self.tally.untouched += 1;
                    self.line(4, &format!("{kind} {key}: left as Metacontroller wrote it (OnDelete: never written)"));
                    continue;
                }
                self.tally.objects += 1;
                self.line(4, &format!("{kind} {key}: {}", self.ownership(obj)));
                let removed = self.removed_fields(obj, wanted);
                if removed.is_empty() {
                    continue;
                }
                let defaulted = self.defaults(resource, obj, wanted).await;
                for path in removed {
                    let shown = fields::display(&path);
                    if defaulted.as_ref().is_some_and(|d| fields::present(d, &path)) {
                        self.tally.defaulted += 1;
                        self.line(6, &format!("released, the API server fills it in by default: {shown}"));
                    } else {
                        self.tally.removed += 1;
                        self.line(6, &format!("removed (the hook no longer returns it): {shown}"));
                    }
                }
                if matches!(types.methods[index], UpdateMethod::Recreate | UpdateMethod::RollingRecreate) {
                    self.line(6, "(Recreate: if the object changes, it is deleted and created again)");
                }
            }
        }
    }

    /// "ownership moves from metacontroller/Update to metahook; the last-applied annotation is removed"
    fn ownership(&self, obj: &DynamicObject) -> String {
        let from: BTreeSet<String> = obj
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|e| self.take_over.is_theirs(e))
            .map(|e| format!("{}/{}", e.manager.as_deref().unwrap_or(""), e.operation.as_deref().unwrap_or("")))
            .collect();
        let mut text = if from.is_empty() {
            String::from("no field manager of Metacontroller's left")
        } else {
            format!("ownership moves from {} to {}", from.into_iter().collect::<Vec<_>>().join(", "), self.take_over.to)
        };
        if obj.annotations().contains_key(LAST_APPLIED_ANNOTATION) {
            text.push_str("; the last-applied annotation is removed");
        }
        text
    }

    /// Paths metahook will own after taking `obj` over, that `wanted` lacks and no other manager owns.
    fn removed_fields(&self, obj: &DynamicObject, wanted: &Value) -> Vec<Vec<String>> {
        let entries = obj.metadata.managed_fields.clone().unwrap_or_default();
        let api_version = obj.types.as_ref().map_or("", |t| t.api_version.as_str());
        let upgraded = self.take_over.upgrade(&entries, api_version);
        let Some(set) = upgraded.iter().find(|e| self.take_over.is_ours(e)).and_then(|e| e.fields_v1.as_ref()) else {
            return Vec::new();
        };
        let others: Vec<&Value> = upgraded
            .iter()
            .filter(|e| !self.take_over.is_ours(e) && main_resource(e))
            .filter_map(|e| e.fields_v1.as_ref().map(|f| &f.0))
            .collect();
        fields::missing_from(&set.0, wanted)
            .into_iter()
            .filter(|p| !others.iter().any(|o| fields::contains(o, p)))
            .collect()
    }

    /// `wanted` as the API server would create it (defaults filled in), from a dry-run create under a
    /// generated name; `None` when the server refuses that.
    async fn defaults(&self, resource: &ResolvedResource, obj: &DynamicObject, wanted: &Value) -> Option<Value> {
        let mut candidate = wanted.clone();
        let meta = candidate.get_mut("metadata")?.as_object_mut()?;
        let name = meta.remove("name").and_then(|n| n.as_str().map(str::to_owned)).unwrap_or_default();
        meta.insert("generateName".into(), Value::String(format!("{name}-")));
        meta.remove("ownerReferences");
        let candidate: DynamicObject = serde_json::from_value(candidate).ok()?;
        let api: Api<DynamicObject> = match &obj.metadata.namespace {
            Some(ns) if resource.namespaced => Api::namespaced_with(self.client.clone(), ns, &resource.api_resource),
            _ => Api::all_with(self.client.clone(), &resource.api_resource),
        };
        let params = PostParams { dry_run: true, field_manager: Some(self.take_over.to.clone()) };
        let created = api.create(&params, &candidate).await.ok()?;
        serde_json::to_value(created).ok()
    }

    fn finish(mut self) -> String {
        let t = &self.tally;
        let summary = format!(
            "\n{} objects would be taken over ({} more are OnDelete and stay as they are); {} fields removed, \
             {} released to the API server's defaults; {} places this could not tell. Nothing was changed.\n",
            t.objects, t.untouched, t.removed, t.defaulted, t.problems
        );
        self.out.push_str(&summary);
        if t.bare_hosts > 0 {
            let _ = writeln!(
                self.out,
                "{} hook URLs name a Service without its namespace (see above): fix them before the switch, or \
                 every sync of their controllers fails with a DNS error.",
                t.bare_hosts
            );
        }
        self.out.push_str(CANNOT_KNOW);
        self.out
    }
}

/// What the listing cannot know, printed with every report.
const CANNOT_KNOW: &str = "
What this listing cannot know:
- Hooks are called with an empty `related` map (no customize hook is run); a hook that depends on
  related objects may answer differently when metahook runs it.
- Rolling controllers are compared with the latest revision's answer; children still on an older
  revision keep that revision's state until the rollout reaches them.
- Only the children Metacontroller wrote are listed; what metahook creates, adopts or deletes is what
  Metacontroller would do with the same answer.
- A field's ownership recorded for another apiVersion is dropped (as client-go's csaupgrade does), not
  compared; such a field stays on the object.
- Changes between the last sync and the switch (a hook that answers differently by then, someone
  editing a child) are not foreseen.
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_service_name_is_told_from_a_name_with_its_namespace() {
        assert_eq!(bare_host("http://profile-controller/sync"), Some(("profile-controller".into(), None)));
        assert_eq!(bare_host("http://user:pw@hook:8080/sync"), Some(("hook".into(), Some(8080))));
        for full in [
            "http://profile-controller.kubeflow/sync",
            "http://hook.ns.svc.cluster.local:80/sync",
            "http://127.0.0.1:8080/sync",
            "http://[::1]:8080/sync",
            "http://localhost:8080/sync",
            "not a url",
        ] {
            assert_eq!(bare_host(full), None, "{full}");
        }
    }
}
