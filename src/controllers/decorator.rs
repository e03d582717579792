//! One running DecoratorController: for every object of its target types that matches its selectors,
//! calls the hook and merges labels and annotations, replaces status, and manages attachments.
//!
//! Attachments are owned by their target (controller ownerRef) and marked with the
//! `metacontroller.k8s.io/decorator-controller` annotation; only objects carrying both count as observed,
//! so two decorators of one target never see (or delete) each other's attachments.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{DynamicObject, Patch, PatchParams};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::api::{DecoratorController, labels_of};
use crate::cache::informers::{Change, Event, Informer, ObjectKey, controller_uid};
use crate::cache::selector::Selector;
use crate::engine::answered::{Answered, RequestId};
use crate::engine::echoes::{Echo, EchoPolicy, Echoes, Seen, Settled, Watched};
use crate::engine::error::{StartError, SyncError};
use crate::engine::events::Events;
use crate::engine::finalizer::{Facts, follow_plan, gc_finalizing, has_finalizer, lifecycle_changed, remove_finalizer};
use crate::engine::hub::Hub;
use crate::engine::queue::{Reason, Reasons, WorkQueue};
use crate::engine::related::{ParentScope, Related};
use crate::engine::status::{record_hook_events, replace_status};
use crate::engine::sync::{api_for, ask_hook, meaningful_parent_change};
use crate::engine::worker::{Syncer, controller_queue, resync_after, resync_period, run_workers};
use crate::hooks::{DecoratorRequest, DecoratorResponse};
use crate::write::children::{
    ChildMap, ChildType, DeletionGuard, Executed, Plan, WriteObserver, deleted_version, desired_children, live_parent,
    request_map, resources,
};

/// Annotation naming the DecoratorController that manages an attachment.
pub const DECORATOR_ANNOTATION: &str = "metacontroller.k8s.io/decorator-controller";

/// Whether `obj` is one of `controller`'s attachments of the target whose UID is `target_uid`: controlled by
/// the target and marked with the controller's annotation. The engine and `metahook render` both use it.
#[must_use]
pub fn is_attachment_of(obj: &DynamicObject, target_uid: &str, controller: &str) -> bool {
    crate::cache::informers::controller_uid(obj) == Some(target_uid)
        && obj.metadata.annotations.as_ref().and_then(|a| a.get(DECORATOR_ANNOTATION)).map(String::as_str)
            == Some(controller)
}

/// A decorator hook's answer, validated whole: nothing is written unless all of it is acceptable.
#[derive(Debug)]
pub struct Answer {
    /// Desired attachments by declared type, annotated with the controller's name and owned by the target.
    pub desired: Vec<ChildMap<Value>>,
    /// The status to write; `None` leaves the target's status alone.
    pub status: Option<Value>,
    /// Labels and annotations to merge into the target; `None` when it has them already.
    pub metadata_patch: Option<Value>,
}

/// Validates a decorator sync/finalize response for `target`. The engine and `metahook render` both use
/// this, so a hook tested offline is judged the same way.
pub fn validate_response(
    controller: &str,
    attachment_resources: &[Arc<crate::cache::discovery::ResolvedResource>],
    target: &DynamicObject,
    resource: &crate::cache::discovery::ResolvedResource,
    response: &DecoratorResponse,
) -> Result<Answer, SyncError> {
    let desired = desired_children(attachment_resources, target, resource, &response.attachments, |meta| {
        let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
        let annotations = annotations.as_object_mut().ok_or("metadata.annotations is not an object")?;
        annotations.insert(DECORATOR_ANNOTATION.into(), Value::String(controller.to_owned()));
        Ok(())
    })
    .map_err(SyncError::InvalidResponse)?;
    let status = match &response.status {
        None | Some(Value::Null) => None,
        Some(Value::Object(map)) => Some(Value::Object(map.clone())),
        Some(other) => return Err(SyncError::InvalidResponse(format!("status must be an object, got {other}"))),
    };
    let metadata_patch =
        metadata_patch(target, &response.labels, &response.annotations).map_err(SyncError::InvalidResponse)?;
    Ok(Answer { desired, status, metadata_patch })
}

/// Finalizer a DecoratorController puts on its targets when it has a finalize hook.
#[must_use]
pub fn finalizer_name(controller: &str) -> String {
    format!("metacontroller.io/decoratorcontroller-{controller}")
}

/// A target object: its type (index into the controller's distinct target types) and namespace/name.
///
/// Keyed by object, not by rule: two `resources[]` rules of one type that both select an object must
/// not sync it twice at once (nor let one rule finalize what the other still selects).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TargetKey {
    pub target_type: usize,
    pub key: ObjectKey,
}

impl fmt::Display for TargetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.key)
    }
}

/// One `resources[]` rule's selectors.
struct Rule {
    labels: Selector,
    annotations: Selector,
    ignore_status_changes: bool,
}

impl Rule {
    fn selects(&self, obj: &DynamicObject) -> bool {
        self.labels.matches(&labels_of(&obj.metadata))
            && self.annotations.matches(&obj.metadata.annotations.clone().unwrap_or_default())
    }
}

/// One target type with every rule that names it.
struct Target {
    informer: Informer,
    rules: Vec<Rule>,
}

impl Target {
    /// Selected = any rule of the type matches.
    fn selects(&self, obj: &DynamicObject) -> bool {
        self.rules.iter().any(|r| r.selects(obj))
    }

    /// Whether status-only changes of `obj` are ignored: every rule that selects it says so (or, when
    /// none selects it, every rule of the type).
    fn ignores_status_changes(&self, obj: &DynamicObject) -> bool {
        let selecting: Vec<&Rule> = self.rules.iter().filter(|r| r.selects(obj)).collect();
        let relevant = if selecting.is_empty() { self.rules.iter().collect() } else { selecting };
        relevant.iter().all(|r| r.ignore_status_changes)
    }
}

/// A DecoratorController whose types are resolved and whose caches are synced.
pub struct Controller {
    hub: Hub,
    name: String,
    dc_json: Value,
    dc: Arc<DecoratorController>,
    targets: Vec<Target>,
    attachments: Vec<ChildType>,
    /// The resolved types of `attachments`, computed once (every sync needs them).
    attachment_resources: Vec<Arc<crate::cache::discovery::ResolvedResource>>,
    related: Arc<Related<TargetKey>>,
    /// The hooks, ready to call (`related` holds the `customize` one too).
    endpoints: crate::hooks::ControllerHooks,
    finalizer: String,
    /// The safe-delete guard, from the controller's annotation.
    deletion_guard: Option<DeletionGuard>,
    /// What this controller's syncs wrote, to tell the echo from others' changes.
    echoes: Echoes<TargetKey>,
    /// Which echoes sync their target (`metahook.dev/sync-on-own-writes`).
    echo_policy: EchoPolicy,
    /// Each target's last hook request, and whether its answer was applied in full.
    answered: Answered<TargetKey>,
    metrics: Arc<crate::engine::metrics::ControllerMetrics>,
    requests: crate::engine::trigger::SyncRequests<TargetKey>,
    queue: WorkQueue<TargetKey>,
}

impl Controller {
    /// Resolves target and attachment types and waits for their caches.
    pub async fn start(hub: &Hub, dc: Arc<DecoratorController>) -> Result<Arc<Self>, StartError> {
        let spec = &dc.spec;
        if spec.hooks.sync.is_none() && spec.hooks.finalize.is_none() {
            return Err(StartError::NoHooks);
        }
        let hooks = &spec.hooks;
        let deletion_guard =
            DeletionGuard::from_annotations(dc.metadata.annotations.as_ref()).map_err(StartError::Annotation)?;
        let echo_policy =
            EchoPolicy::from_annotations(dc.metadata.annotations.as_ref()).map_err(StartError::Annotation)?;
        let name = dc.metadata.name.clone().unwrap_or_default();
        let endpoints = hub.hooks.controller_hooks(
            "DecoratorController",
            &name,
            [hooks.sync.as_ref(), hooks.finalize.as_ref(), hooks.customize.as_ref()],
            &spec.endpoint_configs,
        )?;
        let mut targets: Vec<Target> = Vec::new();
        for rule in &spec.resources {
            let resource = hub
                .discovery
                .resolve(&rule.api_version, &rule.resource)
                .await
                .map_err(|source| StartError::NotFound { role: "target", source })?;
            let compiled = Rule {
                labels: rule
                    .label_selector
                    .as_ref()
                    .map(Selector::from_label_selector)
                    .transpose()?
                    .unwrap_or_default(),
                annotations: rule
                    .annotation_selector
                    .as_ref()
                    .map(|a| Selector::from_label_selector(&a.as_label_selector()))
                    .transpose()?
                    .unwrap_or_default(),
                ignore_status_changes: rule.ignore_status_changes == Some(true),
            };
            match targets.iter_mut().find(|t| *t.informer.resource() == resource) {
                Some(target) => target.rules.push(compiled),
                None => targets.push(Target { informer: hub.informers.get(&resource), rules: vec![compiled] }),
            }
        }
        let mut attachments = Vec::with_capacity(spec.attachments.len());
        for rule in &spec.attachments {
            let resource = hub
                .discovery
                .resolve(&rule.api_version, &rule.resource)
                .await
                .map_err(|source| StartError::NotFound { role: "attachment", source })?;
            // Decorators have no revisions: rolling methods act like their non-rolling forms (as in Metacontroller).
            let method = match rule.method() {
                crate::api::UpdateMethod::RollingRecreate => crate::api::UpdateMethod::Recreate,
                crate::api::UpdateMethod::RollingInPlace => crate::api::UpdateMethod::InPlace,
                other => other,
            };
            attachments.push(ChildType { method, informer: hub.informers.get(&resource) });
        }
        for informer in targets.iter().map(|t| &t.informer).chain(attachments.iter().map(|a| &a.informer)) {
            informer.wait_synced(hub.settings.cache_sync_timeout).await?;
        }
        let dc_json = serde_json::to_value(&*dc).unwrap_or(Value::Null);
        let (queue, metrics, enqueue) = controller_queue(hub, "DecoratorController", &name);
        Ok(Arc::new(Self {
            metrics,
            requests: crate::engine::trigger::SyncRequests::default(),
            related: Related::new(hub.clone(), endpoints.customize.clone(), dc_json.clone(), enqueue),
            endpoints,
            hub: hub.clone(),
            dc_json,
            finalizer: finalizer_name(&name),
            deletion_guard,
            echoes: Echoes::default(),
            echo_policy,
            answered: Answered::default(),
            name,
            targets,
            attachment_resources: resources(&attachments),
            attachments,
            queue,
            dc,
        }))
    }

    /// Runs watches-to-queue mapping and the workers until `cancel` fires.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let mut tasks = JoinSet::new();
        // Attachments' changes from now on first, then every target: each target is queued once at
        // start, and an attachment change either comes through its stream or is cached before that
        // target's sync.
        let attachment_changes: Vec<_> = self.attachments.iter().map(|a| a.informer.subscribe_changes()).collect();
        for (target_type, target) in self.targets.iter().enumerate() {
            tasks.spawn(Arc::clone(&self).map_target_events(target_type, target.informer.subscribe()));
        }
        for (index, changes) in attachment_changes.into_iter().enumerate() {
            tasks.spawn(Arc::clone(&self).map_attachment_events(index, changes));
        }
        let workers = self.hub.settings.workers;
        run_workers(self, workers, tasks, cancel).await;
    }

    /// Queues every selected target now (a sync requested on the controller object); returns how many.
    pub fn resync_all(&self) -> usize {
        let mut queued = 0;
        for (target_type, target) in self.targets.iter().enumerate() {
            for obj in target.informer.list(None).into_iter().filter(|o| target.selects(o)) {
                self.queue.add_for(TargetKey { target_type, key: ObjectKey::of(&obj) }, Reason::Requested);
                queued += 1;
            }
        }
        queued
    }

    async fn map_target_events(self: Arc<Self>, target_type: usize, mut changes: mpsc::UnboundedReceiver<Event>) {
        let target = &self.targets[target_type];
        while let Some(Event { change, relisted }) = changes.recv().await {
            let key = TargetKey { target_type, key: ObjectKey::of(change.object()) };
            match &change {
                Change::Applied { old, new }
                    if (target.selects(new) || has_finalizer(new, &self.finalizer))
                        && self.requests.observe(&key, old.as_deref(), new) => {}
                Change::Applied { old: Some(old), new }
                    if old.metadata.resource_version == new.metadata.resource_version
                        || (target.ignores_status_changes(new) && !meaningful_parent_change(old, new)) =>
                {
                    continue;
                }
                Change::Deleted(_) => {
                    self.related.forget(&key);
                    self.requests.forget(&key);
                    self.echoes.forget(&key);
                    self.answered.forget(&key);
                    continue;
                }
                // Objects neither selected nor carrying our finalizer are none of our business.
                Change::Applied { new, .. } if !target.selects(new) && !has_finalizer(new, &self.finalizer) => continue,
                Change::Applied { .. } if relisted => self.echoes.forget_object(Watched::Parent, &key.key),
                Change::Applied { new, .. } => {
                    let version = new.metadata.resource_version.as_deref().unwrap_or_default();
                    match self.echoes.classify(Watched::Parent, &key.key, version) {
                        Seen::Echo(_) => {
                            self.enqueue_echo(key, Echo::Parent);
                            continue;
                        }
                        Seen::Held => continue,
                        Seen::Other => {}
                    }
                }
            }
            self.enqueue(key);
        }
    }

    /// Queues a target for a change made by someone else.
    fn enqueue(&self, key: TargetKey) {
        self.queue.add(key);
    }

    /// Acts on what a settled write found held: its echo, and changes by others.
    fn settle(&self, settled: Settled<TargetKey>, kind: Echo) {
        if let Some(target) = settled.foreign {
            self.enqueue(target);
        }
        if let Some(target) = settled.echo {
            self.enqueue_echo(target, kind);
        }
    }

    /// Writes to the target itself (status, then labels and annotations), each announced to the echoes.
    async fn write_target(
        &self,
        key: &TargetKey,
        write: impl Future<Output = Result<Option<String>, SyncError>>,
    ) -> Result<(), SyncError> {
        self.echoes.begin(key, Watched::Parent, &key.key);
        let result = write.await;
        let version = result.as_ref().ok().and_then(Option::as_deref);
        self.settle(self.echoes.finish(Watched::Parent, &key.key, version), Echo::Parent);
        result.map(drop)
    }

    /// Queues a target for the echo of its own sync's write, unless the controller said its hook needs no
    /// such sync (see [`crate::engine::echoes`]).
    fn enqueue_echo(&self, key: TargetKey, kind: Echo) {
        if self.echo_policy.syncs(kind) {
            self.queue.add_for(key, Reason::Echo);
        } else {
            self.metrics.hook_call_saved(crate::engine::metrics::Saved::OwnWrite);
        }
    }

    async fn map_attachment_events(self: Arc<Self>, index: usize, mut changes: mpsc::UnboundedReceiver<Event>) {
        let resource = Arc::clone(self.attachments[index].resource());
        while let Some(Event { change, relisted }) = changes.recv().await {
            let version = match &change {
                Change::Applied { old: Some(old), new }
                    if old.metadata.resource_version == new.metadata.resource_version =>
                {
                    continue;
                }
                Change::Applied { new, .. } => new.metadata.resource_version.clone(),
                Change::Deleted(obj) => {
                    self.hub.applier.forget(&resource, &ObjectKey::of(obj));
                    obj.metadata.uid.as_deref().map(deleted_version)
                }
            };
            let object = ObjectKey::of(change.object());
            if relisted {
                self.echoes.forget_object(Watched::Child(index), &object);
            }
            let seen = match &version {
                Some(v) if !relisted => self.echoes.classify(Watched::Child(index), &object, v),
                _ => Seen::Other,
            };
            match seen {
                Seen::Echo(target) => self.enqueue_echo(target, Echo::of_child(version.as_deref().unwrap_or_default())),
                Seen::Held => {}
                Seen::Other => {
                    if let Some(key) = self.owner_of(change.object()) {
                        self.enqueue(key);
                    }
                }
            }
        }
    }

    /// The target an attachment of ours belongs to, if it is still there with the same UID.
    fn owner_of(&self, attachment: &DynamicObject) -> Option<TargetKey> {
        let ours = attachment.metadata.annotations.as_ref()?.get(DECORATOR_ANNOTATION)? == &self.name;
        let owner = attachment.metadata.owner_references.iter().flatten().find(|r| r.controller == Some(true))?;
        if !ours {
            return None;
        }
        self.targets.iter().enumerate().find_map(|(target_type, target)| {
            let resource = target.informer.resource();
            if resource.kind() != owner.kind || resource.api_version() != owner.api_version {
                return None;
            }
            let namespace = if resource.namespaced { attachment.metadata.namespace.clone() } else { None };
            let key = ObjectKey { namespace, name: owner.name.clone() };
            target
                .informer
                .get(&key)
                .filter(|t| t.metadata.uid.as_deref() == Some(owner.uid.as_str()))
                .map(|_| TargetKey { target_type, key })
        })
    }

    /// Whether an attachment carries this controller's annotation.
    fn is_ours(&self, obj: &DynamicObject) -> bool {
        obj.metadata.annotations.as_ref().and_then(|a| a.get(DECORATOR_ANNOTATION)) == Some(&self.name)
    }

    /// Attachments of `target` that are ours: controlled by it and carrying our annotation.
    fn observed_attachments(&self, target: &DynamicObject, namespaced: bool) -> Vec<ChildMap<Arc<DynamicObject>>> {
        let uid = target.metadata.uid.as_deref().unwrap_or_default();
        self.attachments
            .iter()
            .map(|attachment| {
                attachment
                    .informer
                    .controlled_by(uid)
                    .into_iter()
                    .filter(|obj| !namespaced || obj.metadata.namespace == target.metadata.namespace)
                    .filter(|obj| self.is_ours(obj))
                    .map(|obj| (ObjectKey::of(&obj), obj))
                    .collect()
            })
            .collect()
    }

    async fn sync_target(&self, key: &TargetKey, reasons: Reasons) -> Result<Option<Duration>, SyncError> {
        let target_type = &self.targets[key.target_type];
        let Some(target) = target_type.informer.get(&key.key) else { return Ok(None) };
        let hooks = &self.dc.spec.hooks;
        let resource = target_type.informer.resource();
        let api = api_for(&self.hub.client, resource, &target);
        let facts = Facts {
            finalize_hook: hooks.finalize.is_some(),
            selected: target_type.selects(&target),
            has_finalizer: has_finalizer(&target, &self.finalizer),
            deleting: target.metadata.deletion_timestamp.is_some(),
        };
        let Some(finalizing) = follow_plan(&api, &target, &self.finalizer, facts).await? else { return Ok(None) };
        let hook =
            if finalizing { hooks.finalize.as_ref() } else { hooks.sync.as_ref() }.ok_or(SyncError::NoSyncHook)?;
        let scope = ParentScope {
            namespace: resource.namespaced.then_some(target.metadata.namespace.as_deref()).flatten(),
            version: hook.version(),
        };
        let observed = self.observed_attachments(&target, resource.namespaced);
        let related = self.related.gather(key, &target, scope).await?;
        let object = crate::hooks::for_hooks(&target);
        let attachments = request_map(&self.attachment_resources, scope.version, scope.namespace, &observed);
        let request = RequestId::of(&target, finalizing, &attachments, &related);
        if !ask_hook(&self.answered, &self.metrics, key, Some(request), reasons) {
            return Ok(None);
        }
        let request = DecoratorRequest {
            controller: &self.dc_json,
            object: &object,
            attachments: &attachments,
            related: &related,
            finalizing,
        };
        let endpoint = if finalizing { &self.endpoints.finalize } else { &self.endpoints.sync };
        let response = endpoint.as_ref().ok_or(SyncError::NoSyncHook)?.decorator(&request).await?;

        let Answer { desired, status, metadata_patch } =
            validate_response(&self.name, &self.attachment_resources, &target, resource, &response)?;

        // Nothing is written until the whole response is known to be writable.
        let target_uid = target.metadata.uid.as_deref();
        let plan = Plan::new(&self.attachments, &observed, &desired, |obj| {
            controller_uid(obj) == target_uid && self.is_ours(obj)
        })?;
        if !finalizing {
            plan.check_guard(self.deletion_guard, &target)?;
        }
        record_hook_events(&self.hub.events, &target, &response.events).await;
        let writes = AttachmentWrites { controller: self, target: key };
        let executed = if gc_finalizing(&target) || !plan.writes(&self.hub.applier) {
            Executed::default()
        } else if !plan.creates_or_deletes() {
            // Updates only, each with its attachment's UID precondition (see the composite sync).
            plan.execute(&self.hub.applier, &writes).await
        } else {
            // No attachment created or deleted for a target that is gone, replaced, or at another stage.
            match live_parent(&self.hub.client, resource, &target).await? {
                None => return Ok(None),
                Some(live) if lifecycle_changed(&target, &live, &self.finalizer) => {
                    return Err(SyncError::Conflict("target"));
                }
                Some(_) => plan.execute(&self.hub.applier, &writes).await,
            }
        };
        if let Some(status) = status {
            self.write_target(key, replace_status(&api, &target, status, resource.has_status)).await?;
        }
        if let Some(patch) = metadata_patch {
            let name = target.metadata.name.as_deref().unwrap_or_default();
            let write = async {
                match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(patched) => Ok(patched.metadata.resource_version),
                    // Gone, or replaced (the UID in the patch no longer matches): its own sync follows.
                    Err(kube::Error::Api(s))
                        if s.code == 404 || s.code == 422 && s.message.contains("metadata.uid") =>
                    {
                        Ok(None)
                    }
                    Err(e) => Err(SyncError::Write { what: "labels and annotations", source: Box::new(e) }),
                }
            };
            self.write_target(key, write).await?;
        }
        if !executed.errors.is_empty() {
            return Err(SyncError::Apply(executed.errors));
        }
        if finalizing && response.finalized {
            remove_finalizer(&api, &target, &self.finalizer).await?;
        }
        if executed.writes.iter().any(|w| w.recreate) {
            // An attachment deleted to be recreated: the next sync creates it, whatever becomes of the echo.
            self.queue.add_for(key.clone(), Reason::Echo);
        }
        self.answered.applied(key);
        Ok(resync_after(response.resync_after_seconds))
    }
}

/// Tells the controller's echoes about the attachment writes of one target's sync.
struct AttachmentWrites<'a> {
    controller: &'a Controller,
    target: &'a TargetKey,
}

impl WriteObserver for AttachmentWrites<'_> {
    fn started(&self, type_index: usize, key: &ObjectKey) {
        self.controller.echoes.begin(self.target, Watched::Child(type_index), key);
    }

    fn finished(&self, type_index: usize, key: &ObjectKey, version: Option<&str>) {
        let settled = self.controller.echoes.finish(Watched::Child(type_index), key, version);
        self.controller.settle(settled, version.map_or(Echo::Write, Echo::of_child));
    }
}

/// A merge patch for the labels and annotations the hook wants changed (`None` = delete), or `None`
/// when the object already has them: no write for a no-op. The patch names the object's UID, so it is
/// refused rather than applied to a new object of the same name. New values must be valid labels and
/// annotations, or the whole response is refused.
fn metadata_patch(
    obj: &DynamicObject,
    labels: &BTreeMap<String, Option<String>>,
    annotations: &BTreeMap<String, Option<String>>,
) -> Result<Option<Value>, String> {
    fn changes(
        current: Option<&BTreeMap<String, String>>,
        wanted: &BTreeMap<String, Option<String>>,
    ) -> Map<String, Value> {
        wanted
            .iter()
            .filter(|(k, v)| current.and_then(|c| c.get(*k)) != v.as_ref())
            .map(|(k, v)| (k.clone(), v.clone().map_or(Value::Null, Value::String)))
            .collect()
    }
    let set = |wanted: &BTreeMap<String, Option<String>>| -> Value {
        wanted.iter().filter_map(|(k, v)| v.clone().map(|v| (k.clone(), Value::String(v)))).collect()
    };
    let proposed: Map<String, Value> =
        [("labels".to_owned(), set(labels)), ("annotations".to_owned(), set(annotations))].into_iter().collect();
    crate::api::validation::check_metadata_maps(&proposed)?;
    let labels = changes(obj.metadata.labels.as_ref(), labels);
    let annotations = changes(obj.metadata.annotations.as_ref(), annotations);
    if labels.is_empty() && annotations.is_empty() {
        return Ok(None);
    }
    let mut meta = Map::new();
    meta.insert("uid".into(), json!(obj.metadata.uid));
    if !labels.is_empty() {
        meta.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        meta.insert("annotations".into(), Value::Object(annotations));
    }
    Ok(Some(json!({ "metadata": meta })))
}

impl Syncer for Controller {
    type Key = TargetKey;

    fn name(&self) -> &str {
        &self.name
    }

    fn queue(&self) -> &WorkQueue<TargetKey> {
        &self.queue
    }

    fn events(&self) -> &Events {
        &self.hub.events
    }

    fn metrics(&self) -> &crate::engine::metrics::ControllerMetrics {
        &self.metrics
    }

    fn sync_requests(&self) -> &crate::engine::trigger::SyncRequests<TargetKey> {
        &self.requests
    }

    fn object(&self, key: &TargetKey) -> Option<Arc<DynamicObject>> {
        self.targets.get(key.target_type)?.informer.get(&key.key)
    }

    async fn sync(&self, key: &TargetKey, reasons: Reasons) -> Result<Option<Duration>, SyncError> {
        self.sync_target(key, reasons).await
    }

    fn resync_period(&self, key: &TargetKey) -> Option<Duration> {
        let cached = self.targets.get(key.target_type).is_some_and(|t| t.informer.contains(&key.key));
        resync_period(self.dc.spec.resync_period_seconds).filter(|_| cached)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(labels: &Value, annotations: &Value) -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "labels": labels, "annotations": annotations}}))
        .unwrap()
    }

    #[test]
    fn metadata_patch_sets_changes_deletes_with_null_and_skips_no_ops() {
        let obj = object(&json!({"keep": "1", "same": "v", "gone": "x"}), &json!({}));
        let labels = BTreeMap::from([
            ("same".to_owned(), Some("v".to_owned())),
            ("new".to_owned(), Some("n".to_owned())),
            ("gone".to_owned(), None),
            ("never-there".to_owned(), None),
        ]);
        let patch = metadata_patch(&obj, &labels, &BTreeMap::new()).unwrap().unwrap();
        assert_eq!(patch, json!({"metadata": {"uid": null, "labels": {"new": "n", "gone": null}}}));
    }

    #[test]
    fn metadata_patch_is_none_when_nothing_changes() {
        let obj = object(&json!({"a": "1"}), &json!({"b": "2"}));
        let labels = BTreeMap::from([("a".to_owned(), Some("1".to_owned()))]);
        let annotations = BTreeMap::from([("b".to_owned(), Some("2".to_owned())), ("c".to_owned(), None)]);
        assert_eq!(metadata_patch(&obj, &labels, &annotations), Ok(None));
    }

    #[test]
    fn metadata_patch_refuses_invalid_label_values() {
        let obj = object(&json!({}), &json!({}));
        let labels = BTreeMap::from([("app".to_owned(), Some("not a valid value".to_owned()))]);
        assert!(metadata_patch(&obj, &labels, &BTreeMap::new()).unwrap_err().contains("invalid value"));
    }
}
