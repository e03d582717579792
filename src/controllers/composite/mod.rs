//! One running CompositeController: maps watch events to parent keys, and syncs each parent
//! (observe → hook → validate → apply → status).
//!
//! Nothing is written until the hook's whole response has been validated, so a failing or garbage
//! hook never deletes or corrupts existing children or status.

pub mod revisions;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::DynamicObject;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use self::revisions::Rollouts;
use crate::api::{CompositeController, labels_of};
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::{Change, Event, Informer, ObjectKey, controller_uid};
use crate::cache::selector::{Selector, SelectorIndex};
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
use crate::hooks::{CompositeRequest, CompositeResponse, ControllerHooks};
use crate::write::children::{
    ChildMap, ChildType, DeletionGuard, Executed, Plan, WriteObserver, claim, deleted_version, desired_children,
    live_parent, request_map, resources,
};

pub use crate::controllers::composite::revisions::CONTROLLER_UID_LABEL;

/// A CompositeController whose types are resolved and whose caches are synced.
pub struct Controller {
    hub: Hub,
    name: String,
    /// The controller object as hooks receive it (`request.controller`).
    cc_json: Value,
    cc: Arc<CompositeController>,
    parent: Informer,
    parent_selector: Selector,
    children: Vec<ChildType>,
    /// The resolved types of `children`, computed once (every sync needs them).
    child_resources: Vec<Arc<ResolvedResource>>,
    /// Rolling updates, when a child type rolls.
    rollouts: Option<revisions::Rollouts>,
    related: Arc<Related<ObjectKey>>,
    /// The hooks, ready to call (`related` holds the `customize` one too).
    endpoints: ControllerHooks,
    finalizer: String,
    /// The safe-delete guard, from the controller's annotation.
    deletion_guard: Option<DeletionGuard>,
    metrics: Arc<crate::engine::metrics::ControllerMetrics>,
    requests: crate::engine::trigger::SyncRequests<ObjectKey>,
    /// Every parent's child selector, compiled once per parent version, found by a child's labels.
    selectors: Mutex<SelectorIndex<ObjectKey>>,
    /// What this controller's syncs wrote, to tell the echo from others' changes.
    echoes: Echoes<ObjectKey>,
    /// Which echoes sync their parent (`metahook.dev/sync-on-own-writes`).
    echo_policy: EchoPolicy,
    /// Each parent's last hook request, and whether its answer was applied in full.
    answered: Answered<ObjectKey>,
    queue: WorkQueue<ObjectKey>,
}

impl Controller {
    /// Resolves the parent and child types, refuses specs it cannot honour, and waits for caches.
    pub async fn start(hub: &Hub, cc: Arc<CompositeController>) -> Result<Arc<Self>, StartError> {
        let spec = &cc.spec;
        let hooks = spec.hooks.as_ref().ok_or(StartError::NoHooks)?;
        if hooks.sync.is_none() && hooks.finalize.is_none() {
            return Err(StartError::NoHooks);
        }
        let name = cc.metadata.name.clone().unwrap_or_default();
        let endpoints = hub.hooks.controller_hooks(
            "CompositeController",
            &name,
            [hooks.sync.as_ref(), hooks.finalize.as_ref(), hooks.customize.as_ref()],
            &spec.endpoint_configs,
        )?;
        let deletion_guard =
            DeletionGuard::from_annotations(cc.metadata.annotations.as_ref()).map_err(StartError::Annotation)?;
        let echo_policy =
            EchoPolicy::from_annotations(cc.metadata.annotations.as_ref()).map_err(StartError::Annotation)?;
        let parent_rule = &spec.parent_resource;
        let parent_resource = hub
            .discovery
            .resolve(&parent_rule.api_version, &parent_rule.resource)
            .await
            .map_err(|source| StartError::NotFound { role: "parent", source })?;
        if !parent_resource.has_status {
            return Err(StartError::NoStatusSubresource {
                resource: format!("{}.{}", parent_rule.resource, parent_rule.api_version),
            });
        }
        let parent_selector = match &parent_rule.label_selector {
            Some(s) => Selector::from_label_selector(s)?,
            None => Selector::everything(),
        };
        let mut children = Vec::with_capacity(spec.child_resources.len());
        for rule in &spec.child_resources {
            let resource = hub
                .discovery
                .resolve(&rule.api_version, &rule.resource)
                .await
                .map_err(|source| StartError::NotFound { role: "child", source })?;
            children.push(ChildType { method: rule.method(), informer: hub.informers.get(&resource) });
        }
        let rollouts = if spec.child_resources.iter().any(|r| r.method().is_rolling()) {
            if !parent_resource.namespaced {
                return Err(StartError::RollingNeedsNamespacedParent);
            }
            let resource = hub
                .discovery
                .resolve(crate::api::GROUP_VERSION, "controllerrevisions")
                .await
                .map_err(|source| StartError::NotFound { role: "controllerrevision", source })?;
            let informer = hub.informers.get(&resource);
            informer.wait_synced(hub.settings.cache_sync_timeout).await?;
            let child_resources = resources(&children);
            Some(Rollouts::new(informer, Arc::clone(&parent_resource), child_resources, spec))
        } else {
            None
        };
        let parent = hub.informers.get(&parent_resource);
        parent.wait_synced(hub.settings.cache_sync_timeout).await?;
        for child in &children {
            child.informer.wait_synced(hub.settings.cache_sync_timeout).await?;
        }
        let cc_json = serde_json::to_value(&*cc).unwrap_or(Value::Null);
        let (queue, metrics, enqueue) = controller_queue(hub, "CompositeController", &name);
        Ok(Arc::new(Self {
            metrics,
            requests: crate::engine::trigger::SyncRequests::default(),
            related: Related::new(hub.clone(), endpoints.customize.clone(), cc_json.clone(), enqueue),
            endpoints,
            hub: hub.clone(),
            cc_json,
            finalizer: format!("metacontroller.io/compositecontroller-{name}"),
            deletion_guard,
            name,
            parent,
            parent_selector,
            child_resources: resources(&children),
            children,
            rollouts,
            selectors: Mutex::default(),
            echoes: Echoes::default(),
            echo_policy,
            answered: Answered::default(),
            queue,
            cc,
        }))
    }

    /// Runs watches-to-queue mapping and the workers until `cancel` fires.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let mut tasks = JoinSet::new();
        // Children's changes from now on first, then every parent: each parent is queued once at start,
        // and a child change either comes through its stream or is cached before that parent's sync.
        let child_changes: Vec<_> = self.children.iter().map(|c| c.informer.subscribe_changes()).collect();
        tasks.spawn(Arc::clone(&self).map_parent_events(self.parent.subscribe()));
        for (index, changes) in child_changes.into_iter().enumerate() {
            tasks.spawn(Arc::clone(&self).map_child_events(index, changes));
        }
        let workers = self.hub.settings.workers;
        run_workers(self, workers, tasks, cancel).await;
    }

    /// Queues every parent it selects (or still finalizes) now — a sync requested on the controller
    /// object; returns how many.
    pub fn resync_all(&self) -> usize {
        let mut queued = 0;
        for parent in self.parent.list(None) {
            if self.parent_selector.matches(&labels_of(&parent.metadata)) || has_finalizer(&parent, &self.finalizer) {
                self.queue.add_for(ObjectKey::of(&parent), Reason::Requested);
                queued += 1;
            }
        }
        queued
    }

    /// Queues a parent for a change made by someone else.
    fn enqueue(&self, key: ObjectKey) {
        self.queue.add(key);
    }

    /// Queues a parent for the echo of its own sync's write, unless the controller said its hook needs no
    /// such sync (see [`crate::engine::echoes`]).
    fn enqueue_echo(&self, key: ObjectKey, kind: Echo) {
        if self.echo_policy.syncs(kind) {
            self.queue.add_for(key, Reason::Echo);
        } else {
            tracing::trace!(parent = %key, ?kind, "echo of own write; the controller needs no sync for it");
            self.metrics.hook_call_saved(crate::engine::metrics::Saved::OwnWrite);
        }
    }

    async fn map_parent_events(self: Arc<Self>, mut changes: mpsc::UnboundedReceiver<Event>) {
        let ignore_status = self.cc.spec.parent_resource.ignore_status_changes == Some(true);
        while let Some(Event { change, relisted }) = changes.recv().await {
            let key = ObjectKey::of(change.object());
            let new = match &change {
                Change::Deleted(obj) => {
                    self.related.forget(&key);
                    self.requests.forget(&key);
                    self.echoes.forget(&key);
                    self.answered.forget(&key);
                    self.selectors.lock().expect("selectors lock").remove(&key);
                    if has_finalizer(obj, &self.finalizer) || self.parent_selector.matches(&labels_of(&obj.metadata)) {
                        self.enqueue(key);
                    }
                    continue;
                }
                Change::Applied { new, .. } => new,
            };
            // Keep the selector index current, so an orphan finds this parent without a scan.
            let _ = self.selector_of(new);
            // Parents neither selected nor carrying our finalizer are none of this controller's business.
            if !self.parent_selector.matches(&labels_of(&new.metadata)) && !has_finalizer(new, &self.finalizer) {
                continue;
            }
            match &change {
                Change::Applied { old, new } if self.requests.observe(&key, old.as_deref(), new) => {}
                Change::Applied { old: Some(old), new }
                    if old.metadata.resource_version == new.metadata.resource_version
                        || (ignore_status && !meaningful_parent_change(old, new)) =>
                {
                    continue;
                }
                Change::Applied { .. } if relisted => self.echoes.forget_object(Watched::Parent, &key),
                Change::Applied { new, .. } => {
                    let version = new.metadata.resource_version.as_deref().unwrap_or_default();
                    match self.echoes.classify(Watched::Parent, &key, version) {
                        Seen::Echo(_) => {
                            self.enqueue_echo(key, Echo::Parent);
                            continue;
                        }
                        Seen::Held => continue,
                        Seen::Other => {}
                    }
                }
                Change::Deleted(_) => {}
            }
            self.enqueue(key);
        }
    }

    async fn map_child_events(self: Arc<Self>, index: usize, mut changes: mpsc::UnboundedReceiver<Event>) {
        let resource = Arc::clone(self.children[index].resource());
        while let Some(Event { change, relisted }) = changes.recv().await {
            if relisted {
                self.echoes.forget_object(Watched::Child(index), &ObjectKey::of(change.object()));
            }
            match &change {
                Change::Applied { old: Some(old), new } => {
                    if old.metadata.resource_version == new.metadata.resource_version {
                        continue;
                    }
                    // Ownership may have moved: the previous owner must see its child go.
                    if controller_uid(old) != controller_uid(new) {
                        self.enqueue_owner_of(old, false);
                    }
                    if relisted || !self.echo(index, new, new.metadata.resource_version.as_deref()) {
                        self.enqueue_owner_of(new, true);
                    }
                }
                Change::Applied { old: None, new } => {
                    if relisted || !self.echo(index, new, new.metadata.resource_version.as_deref()) {
                        self.enqueue_owner_of(new, true);
                    }
                }
                Change::Deleted(obj) => {
                    self.hub.applier.forget(&resource, &ObjectKey::of(obj));
                    let version = obj.metadata.uid.as_deref().map(deleted_version);
                    if relisted || !self.echo(index, obj, version.as_deref()) {
                        self.enqueue_owner_of(obj, false);
                    }
                }
            }
        }
    }

    /// Whether a child event is (or may be, with its write still in flight) the echo of one of this
    /// controller's writes, and was dealt with as such.
    fn echo(&self, index: usize, child: &DynamicObject, version: Option<&str>) -> bool {
        let Some(version) = version else { return false };
        match self.echoes.classify(Watched::Child(index), &ObjectKey::of(child), version) {
            Seen::Echo(parent) => {
                self.enqueue_echo(parent, Echo::of_child(version));
                true
            }
            Seen::Held => true,
            Seen::Other => false,
        }
    }

    /// Acts on what a settled write found held: its echo, and changes by others.
    fn settle(&self, settled: Settled<ObjectKey>, kind: Echo) {
        if let Some(parent) = settled.foreign {
            self.enqueue(parent);
        }
        if let Some(parent) = settled.echo {
            self.enqueue_echo(parent, kind);
        }
    }

    /// Queues the parent controlling `child`, or, for an orphan, every parent that would adopt it.
    fn enqueue_owner_of(&self, child: &DynamicObject, adopt_orphans: bool) {
        let parent_resource = self.parent.resource();
        let owner = child.metadata.owner_references.iter().flatten().find(|r| r.controller == Some(true));
        if let Some(owner) = owner {
            let same_group = group_of(&owner.api_version) == group_of(parent_resource.api_version());
            if !same_group || owner.kind != parent_resource.kind() {
                return;
            }
            let namespace = if parent_resource.namespaced { child.metadata.namespace.clone() } else { None };
            let key = ObjectKey { namespace, name: owner.name.clone() };
            if self.parent.get(&key).is_some_and(|p| p.metadata.uid.as_deref() == Some(owner.uid.as_str())) {
                self.enqueue(key);
            }
            return;
        }
        if !adopt_orphans {
            return;
        }
        let labels = labels_of(&child.metadata);
        let candidates =
            self.selectors.lock().expect("selectors lock").selecting(child.metadata.namespace.as_deref(), &labels);
        for parent in candidates {
            self.enqueue(parent);
        }
    }

    /// The selector of `parent`'s children, compiled once per parent version.
    fn selector_of(&self, parent: &DynamicObject) -> Result<Arc<Selector>, SyncError> {
        let version = format!(
            "{}/{}",
            parent.metadata.uid.as_deref().unwrap_or_default(),
            parent.metadata.generation.unwrap_or_default()
        );
        let scope = if self.parent.resource().namespaced { parent.metadata.namespace.as_deref() } else { None };
        self.selectors
            .lock()
            .expect("selectors lock")
            .get_or_compile(&ObjectKey::of(parent), &version, scope, || child_selector(&self.cc, parent))
    }

    async fn sync_parent(&self, key: &ObjectKey, reasons: Reasons) -> Result<Option<Duration>, SyncError> {
        let Some(parent) = self.parent.get(key) else { return Ok(None) };
        let hooks = self.cc.spec.hooks.as_ref().ok_or(SyncError::NoSyncHook)?;
        let parent_resource = self.parent.resource();
        let api = api_for(&self.hub.client, parent_resource, &parent);
        let facts = Facts {
            finalize_hook: hooks.finalize.is_some(),
            selected: self.parent_selector.matches(&labels_of(&parent.metadata)),
            has_finalizer: has_finalizer(&parent, &self.finalizer),
            deleting: parent.metadata.deletion_timestamp.is_some(),
        };
        let Some(finalizing) = follow_plan(&api, &parent, &self.finalizer, facts).await? else { return Ok(None) };

        let selector = self.selector_of(&parent)?;
        let observed = claim(&self.hub.client, &parent, parent_resource, &selector, &self.children).await?;
        if observed.len() != self.children.len() {
            return Ok(None); // the parent went away while adopting
        }
        let hook =
            if finalizing { hooks.finalize.as_ref() } else { hooks.sync.as_ref() }.ok_or(SyncError::NoSyncHook)?;
        let scope = ParentScope {
            namespace: parent_resource.namespaced.then_some(parent.metadata.namespace.as_deref()).flatten(),
            version: hook.version(),
        };
        let related = self.related.gather(key, &parent, scope).await?;
        let parent_json = crate::hooks::for_hooks(&parent);
        let children = request_map(&self.child_resources, scope.version, scope.namespace, &observed);
        // Rolling updates build their requests from ControllerRevisions too: always asked.
        let request = self.rollouts.is_none().then(|| RequestId::of(&parent, finalizing, &children, &related));
        if !ask_hook(&self.answered, &self.metrics, key, request, reasons) {
            return Ok(None);
        }
        let call = HookCall { children: &children, related: &related, finalizing, selector: &selector };
        let outcome = match &self.rollouts {
            None => Outcome::from(self.answer(&parent, &parent_json, &call).await?),
            Some(rollouts) => {
                let answer = |revision_parent: Value| {
                    let call = &call;
                    let parent = &parent;
                    async move {
                        let as_object = serde_json::from_value(revision_parent.clone());
                        let revision_object: DynamicObject = as_object.unwrap_or_else(|_| (**parent).clone());
                        self.answer(&revision_object, &revision_parent, call).await
                    }
                };
                let decision = rollouts.sync(&parent, &parent_json, &observed, answer).await?;
                Outcome::from(decision)
            }
        };
        let Outcome { desired, status, resync, finalized, events, revisions } = outcome;

        // Nothing is written until the whole response is known to be writable: no name taken from
        // someone else, no more deletions than the guard allows.
        let parent_uid = parent.metadata.uid.as_deref();
        let plan = Plan::new(&self.children, &observed, &desired, |obj| controller_uid(obj) == parent_uid)?;
        if !finalizing {
            plan.check_guard(self.deletion_guard, &parent)?;
        }
        record_hook_events(&self.hub.events, &parent, &events).await;
        let applier = &self.hub.applier;
        let revisions_written = revisions.as_ref().is_some_and(|r| r.writes(applier));
        let executed = if gc_finalizing(&parent) || !(revisions_written || plan.writes(applier)) {
            Executed::default()
        } else if !revisions_written && !plan.creates_or_deletes() {
            // Updates only: each carries its child's UID, so a parent that went away meanwhile cannot get
            // anything resurrected; no need to ask the API server about the parent first.
            plan.execute(applier, &ChildWrites { controller: self, parent: key }).await
        } else {
            // No child created or deleted for a parent that is gone or replaced (server-side apply would
            // re-create children the garbage collector has just deleted), or that changed its stage of life
            // while the hook was thinking (deleted; the GC's orphan or foreground finalizer came or went):
            // the answer was for another stage, and the next sync asks again.
            match live_parent(&self.hub.client, parent_resource, &parent).await? {
                None => return Ok(None),
                Some(live) if lifecycle_changed(&parent, &live, &self.finalizer) => {
                    return Err(SyncError::Conflict("parent"));
                }
                Some(_) => {
                    if let Some(revisions) = &revisions {
                        revisions.persist(applier).await.map_err(|e| SyncError::Apply(vec![e]))?;
                    }
                    plan.execute(applier, &ChildWrites { controller: self, parent: key }).await
                }
            }
        };
        self.echoes.begin(key, Watched::Parent, key);
        let status_written = replace_status(&api, &parent, status, true).await;
        let version = status_written.as_ref().ok().and_then(Option::as_deref);
        self.settle(self.echoes.finish(Watched::Parent, key, version), Echo::Parent);
        status_written?;
        if !executed.errors.is_empty() {
            return Err(SyncError::Apply(executed.errors));
        }
        if finalizing && finalized {
            remove_finalizer(&api, &parent, &self.finalizer).await?;
        }
        if executed.writes.iter().any(|w| w.recreate) {
            // A child deleted to be recreated: the next sync creates it, whatever becomes of the echo.
            self.queue.add_for(key.clone(), Reason::Echo);
        }
        self.answered.applied(key);
        Ok(resync)
    }

    /// One hook call for `parent` (the live one, or a revision's), its response validated whole.
    async fn answer(
        &self,
        parent: &DynamicObject,
        parent_json: &Value,
        call: &HookCall<'_>,
    ) -> Result<revisions::Answer, SyncError> {
        let request = CompositeRequest {
            controller: &self.cc_json,
            parent: parent_json,
            children: call.children,
            related: call.related,
            finalizing: call.finalizing,
        };
        let endpoint = if call.finalizing { &self.endpoints.finalize } else { &self.endpoints.sync };
        let response = endpoint.as_ref().ok_or(SyncError::NoSyncHook)?.composite(&request).await?;
        let parent_resource = self.parent.resource();
        let (desired, status) =
            validate_response(&self.cc, parent, parent_resource, &self.child_resources, &response, call.selector)?;
        Ok(revisions::Answer { desired, status, response })
    }
}

/// Tells the controller's echoes about the child writes of one parent's sync.
struct ChildWrites<'a> {
    controller: &'a Controller,
    parent: &'a ObjectKey,
}

impl WriteObserver for ChildWrites<'_> {
    fn started(&self, type_index: usize, key: &ObjectKey) {
        self.controller.echoes.begin(self.parent, Watched::Child(type_index), key);
    }

    fn finished(&self, type_index: usize, key: &ObjectKey, version: Option<&str>) {
        let settled = self.controller.echoes.finish(Watched::Child(type_index), key, version);
        self.controller.settle(settled, version.map_or(Echo::Write, Echo::of_child));
    }
}

/// What a sync asks the hook.
struct HookCall<'a> {
    children: &'a crate::hooks::ObjectMaps,
    related: &'a crate::hooks::ObjectMaps,
    finalizing: bool,
    selector: &'a Selector,
}

/// What the hook answered, validated.
struct Outcome {
    desired: Vec<ChildMap<Value>>,
    status: Value,
    resync: Option<Duration>,
    finalized: bool,
    events: Vec<crate::hooks::HookEvent>,
    /// Rolling updates: the revisions to write before any child.
    revisions: Option<revisions::Pending>,
}

impl From<revisions::Answer> for Outcome {
    fn from(answer: revisions::Answer) -> Self {
        let revisions::Answer { desired, status, response } = answer;
        Self {
            desired,
            status,
            resync: resync_after(response.resync_after_seconds),
            finalized: response.finalized,
            events: response.events,
            revisions: None,
        }
    }
}

impl From<revisions::Decision> for Outcome {
    /// With several revisions: the earliest resync wins, all must agree to finalize, and Events come
    /// from the latest revision's answer.
    fn from(decision: revisions::Decision) -> Self {
        let revisions::Decision { desired, status, responses, pending } = decision;
        Self {
            desired,
            status,
            resync: responses.iter().filter_map(|r| resync_after(r.resync_after_seconds)).min(),
            finalized: responses.iter().all(|r| r.finalized),
            events: responses.into_iter().next().map(|r| r.events).unwrap_or_default(),
            revisions: Some(pending),
        }
    }
}

impl Syncer for Controller {
    type Key = ObjectKey;

    fn name(&self) -> &str {
        &self.name
    }

    fn queue(&self) -> &WorkQueue<ObjectKey> {
        &self.queue
    }

    fn events(&self) -> &Events {
        &self.hub.events
    }

    fn metrics(&self) -> &crate::engine::metrics::ControllerMetrics {
        &self.metrics
    }

    fn sync_requests(&self) -> &crate::engine::trigger::SyncRequests<ObjectKey> {
        &self.requests
    }

    fn object(&self, key: &ObjectKey) -> Option<Arc<DynamicObject>> {
        self.parent.get(key)
    }

    async fn sync(&self, key: &ObjectKey, reasons: Reasons) -> Result<Option<Duration>, SyncError> {
        self.sync_parent(key, reasons).await
    }

    fn resync_period(&self, key: &ObjectKey) -> Option<Duration> {
        resync_period(self.cc.spec.resync_period_seconds).filter(|_| self.parent.contains(key))
    }
}

/// Selector that decides which objects are `parent`'s children: `controller-uid=<uid>` with
/// `generateSelector`, else the parent's `spec.selector`.
pub fn child_selector(cc: &CompositeController, parent: &DynamicObject) -> Result<Selector, SyncError> {
    if cc.spec.generate_selector == Some(true) {
        let uid = parent.metadata.uid.clone().unwrap_or_default();
        return Ok(Selector::from_labels(&BTreeMap::from([(CONTROLLER_UID_LABEL.to_owned(), uid)])));
    }
    let raw = parent.data.pointer("/spec/selector").cloned().unwrap_or(Value::Null);
    let selector: LabelSelector = serde_json::from_value(raw).map_err(|e| SyncError::ParentSelector(e.to_string()))?;
    if selector.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
        && selector.match_expressions.as_ref().is_none_or(Vec::is_empty)
    {
        return Err(SyncError::ParentSelector(
            ".spec.selector must have either matchLabels, matchExpressions, or both".into(),
        ));
    }
    Selector::from_label_selector(&selector).map_err(|e| SyncError::ParentSelector(e.to_string()))
}

/// Validates a sync/finalize response whole: the desired children by declared type (each must match
/// the parent's selector; `controller-uid` is added under `generateSelector`) and the status to write.
/// The engine and `metahook render` both use this, so a hook tested offline is judged the same way.
pub fn validate_response(
    cc: &CompositeController,
    parent: &DynamicObject,
    parent_resource: &ResolvedResource,
    child_resources: &[Arc<ResolvedResource>],
    response: &CompositeResponse,
    selector: &Selector,
) -> Result<(Vec<ChildMap<Value>>, Value), SyncError> {
    let generate = cc.spec.generate_selector == Some(true);
    let uid = parent.metadata.uid.clone().unwrap_or_default();
    let desired = desired_children(child_resources, parent, parent_resource, &response.children, |meta| {
        if generate {
            let labels = meta.entry("labels").or_insert_with(|| json!({}));
            if let Some(labels) = labels.as_object_mut() {
                labels.entry(CONTROLLER_UID_LABEL).or_insert_with(|| Value::String(uid.clone()));
            }
        }
        let labels: BTreeMap<String, String> = serde_json::from_value(meta.get("labels").cloned().unwrap_or(json!({})))
            .map_err(|e| format!("labels: {e}"))?;
        if selector.matches(&labels) {
            Ok(())
        } else {
            Err("labels on desired child don't match parent selector".into())
        }
    })
    .map_err(SyncError::InvalidResponse)?;
    Ok((desired, desired_status(parent, response.status.as_ref())?))
}

/// The group part of an apiVersion (`""` for the core group).
fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// The status to write: the hook's (an object, or nothing) plus `observedGeneration`.
fn desired_status(parent: &DynamicObject, status: Option<&Value>) -> Result<Value, SyncError> {
    let mut status = match status {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(other) => return Err(SyncError::InvalidResponse(format!("status must be an object, got {other}"))),
    };
    status.insert("observedGeneration".into(), json!(parent.metadata.generation.unwrap_or(0)));
    Ok(Value::Object(status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_gets_observed_generation_and_must_be_an_object() {
        let parent: DynamicObject = serde_json::from_value(
            json!({"apiVersion": "x/v1", "kind": "P", "metadata": {"name": "p", "generation": 4}}),
        )
        .unwrap();
        assert_eq!(desired_status(&parent, None).unwrap(), json!({"observedGeneration": 4}));
        assert_eq!(
            desired_status(&parent, Some(&json!({"ready": 2}))).unwrap(),
            json!({"ready": 2, "observedGeneration": 4})
        );
        assert!(desired_status(&parent, Some(&json!("ok"))).is_err());
    }

    mod responses {
        //! Property: whatever a hook sends, decoding and validating it never panics, and a response is
        //! either accepted whole (every child it lists becomes exactly one desired child, owned by the
        //! parent) or refused whole (an error; nothing to write).
        use proptest::prelude::*;

        use super::*;
        use crate::api::UnmarshalMode;
        use crate::hooks::{COMPOSITE_RESPONSE_FIELDS, decode};

        /// Cases per property; each is a pure function call, so thousands take well under a second.
        const CASES: u32 = 4000;

        fn resource(api_version: &str, kind: &str, plural: &str, namespaced: bool) -> Arc<ResolvedResource> {
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
            Arc::new(ResolvedResource {
                api_resource: kube::core::ApiResource {
                    group: group.into(),
                    version: version.into(),
                    api_version: api_version.into(),
                    kind: kind.into(),
                    plural: plural.into(),
                },
                namespaced,
                has_status: true,
            })
        }

        fn controller() -> CompositeController {
            serde_json::from_value(
                json!({"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
                "metadata": {"name": "cc"},
                "spec": {"generateSelector": true,
                         "parentResource": {"apiVersion": "x.dev/v1", "resource": "things"},
                         "childResources": [{"apiVersion": "v1", "resource": "configmaps"},
                                            {"apiVersion": "v1", "resource": "services"}]}}),
            )
            .unwrap()
        }

        fn parent() -> DynamicObject {
            serde_json::from_value(json!({"apiVersion": "x.dev/v1", "kind": "Thing",
                "metadata": {"name": "p", "namespace": "ns", "uid": "parent-uid", "generation": 2}}))
            .unwrap()
        }

        /// Decodes and validates `body` as the engine does; `Ok(n)` = accepted with `n` desired children.
        fn judge(body: &Value) -> Result<usize, String> {
            let cc = controller();
            let parent = parent();
            let types =
                vec![resource("v1", "ConfigMap", "configmaps", true), resource("v1", "Service", "services", true)];
            let selector = child_selector(&cc, &parent).unwrap();
            for mode in [UnmarshalMode::Loose, UnmarshalMode::Strict] {
                let decoded: Result<CompositeResponse, _> = decode("u", body.clone(), mode, COMPOSITE_RESPONSE_FIELDS);
                let Ok(response) = decoded else { continue };
                let result = validate_response(
                    &cc,
                    &parent,
                    &resource("x.dev/v1", "Thing", "things", true),
                    &types,
                    &response,
                    &selector,
                );
                return match result {
                    Ok((desired, status)) => {
                        let count: usize = desired.iter().map(BTreeMap::len).sum();
                        assert_eq!(count, response.children.len(), "accepted, but not whole: {body}");
                        for child in desired.iter().flat_map(BTreeMap::values) {
                            let refs = child["metadata"]["ownerReferences"].as_array().expect("ownership set");
                            assert_eq!(refs.len(), 1);
                            assert_eq!(refs[0]["uid"], "parent-uid");
                            assert_eq!(child["metadata"]["labels"]["controller-uid"], "parent-uid");
                        }
                        assert_eq!(status["observedGeneration"], 2);
                        Ok(count)
                    }
                    Err(e) => Err(e.to_string()),
                };
            }
            Err("undecodable".into())
        }

        fn text() -> impl Strategy<Value = String> {
            prop_oneof![
                "[a-z0-9-]{1,12}",
                "[A-Za-z0-9_./:% -]{0,20}",
                Just("x".repeat(300)),
                Just(String::new()),
                Just("ns".to_owned()),
                Just("parent-uid".to_owned()),
            ]
        }

        fn key() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("apiVersion"),
                Just("kind"),
                Just("metadata"),
                Just("name"),
                Just("namespace"),
                Just("labels"),
                Just("annotations"),
                Just("ownerReferences"),
                Just("uid"),
                Just("controller"),
                Just("children"),
                Just("status"),
                Just("resyncAfterSeconds"),
                Just("finalized"),
                Just("events"),
                Just("data"),
                Just("spec"),
            ]
            .prop_map(str::to_owned)
        }

        /// Any JSON, biased towards the keys a response has.
        fn any_json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(|n| json!(n)),
                any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
                text().prop_map(Value::String),
            ];
            leaf.prop_recursive(4, 64, 8, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                    prop::collection::btree_map(key(), inner, 0..6)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        fn child(i: usize) -> Value {
            if i.is_multiple_of(2) {
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("cm-{i}")}, "data": {"k": "v"}})
            } else {
                json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": format!("svc-{i}"), "labels": {"app": "a"}},
                       "spec": {"ports": [{"port": 80}]}})
            }
        }

        /// A valid response with a few random edits, each at a random child.
        fn mutated() -> impl Strategy<Value = Value> {
            let edit = (0..12_usize, 0..6_usize, text(), any_json());
            (1..6_usize, prop::collection::vec(edit, 0..4)).prop_map(|(n, edits)| {
                let mut children: Vec<Value> = (0..n).map(child).collect();
                for (what, at, word, junk) in edits {
                    let c = &mut children[at % n];
                    // Indexing a non-object panics in serde_json itself; such a child stays as junk.
                    let editable_meta = c.get("metadata").is_some_and(Value::is_object);
                    if !c.is_object() || (what < 8 && what != 1 && what != 2 && !editable_meta) {
                        continue;
                    }
                    match what {
                        0 => c["metadata"]["name"] = json!(word),
                        1 => c["kind"] = json!(word),
                        2 => c["apiVersion"] = json!(word),
                        3 => c["metadata"]["namespace"] = json!(word),
                        4 => c["metadata"]["labels"] = json!({word.clone(): word}),
                        5 => {
                            c["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "X", "name": word,
                                                                       "uid": word, "controller": true}]);
                        }
                        6 => c["metadata"]["annotations"] = json!({word.clone(): junk}),
                        7 => c["metadata"] = junk,
                        8 => *c = junk,
                        9 => {
                            let copy = c.clone();
                            children.push(copy);
                        }
                        10 if editable_meta => c["metadata"]["labels"] = json!({"controller-uid": word}),
                        _ => c["data"] = junk,
                    }
                }
                json!({"status": {"ready": n}, "children": children})
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

            #[test]
            fn random_json_is_judged_without_panicking(body in any_json()) {
                let _ = judge(&body);
            }

            #[test]
            fn random_responses_are_accepted_or_refused_whole(
                status in any_json(),
                children in prop::collection::vec(any_json(), 0..5),
            ) {
                let _ = judge(&json!({"status": status, "children": children}));
            }

            #[test]
            fn mutated_valid_responses_are_accepted_or_refused_whole(body in mutated()) {
                let _ = judge(&body);
            }
        }

        #[test]
        fn the_unmutated_response_is_accepted_whole() {
            let body = json!({"status": {}, "children": (0..5).map(child).collect::<Vec<_>>()});
            assert_eq!(judge(&body), Ok(5));
        }
    }

    #[test]
    fn groups_are_compared_without_versions() {
        assert_eq!(group_of("apps/v1"), "apps");
        assert_eq!(group_of("v1"), "");
    }
}
