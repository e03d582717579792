//! One running CompositeController: maps watch events to parent keys, and syncs each parent
//! (observe → hook → validate → apply → status).
//!
//! Nothing is written until the hook's whole response has been validated, so a failing or garbage
//! hook never deletes or corrupts existing children or status.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::DynamicObject;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::api::{CompositeController, labels_of};
use crate::children::{ChildMap, ChildType, claim, desired_children, manage, owner_reference, request_map, resources};
use crate::discovery::ResolvedResource;
use crate::events::Events;
use crate::hooks::{CompositeRequest, CompositeResponse};
use crate::hub::Hub;
use crate::informers::{Change, Informer, ObjectKey, controller_uid};
use crate::queue::WorkQueue;
use crate::related::{ParentScope, Related};
use crate::revisions::{self, Claims, Revision, Rollout, TypeInfo};
use crate::selector::Selector;
use crate::sync::{
    Facts, StartError, SyncError, Syncer, api_for, check_hook_settings, controller_queue, every, follow_plan,
    has_finalizer, record_hook_events, replace_status, resync_after, resync_period, run_workers, set_finalizer,
};

/// Label that ties children to their parent when `generateSelector` is on.
pub const CONTROLLER_UID_LABEL: &str = "controller-uid";

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
    /// `ControllerRevision` cache, when a child type rolls.
    revisions: Option<Informer>,
    related: Arc<Related<ObjectKey>>,
    finalizer: String,
    metrics: Arc<crate::metrics::ControllerMetrics>,
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
        check_hook_settings(
            [
                ("sync", hooks.sync.as_ref()),
                ("finalize", hooks.finalize.as_ref()),
                ("customize", hooks.customize.as_ref()),
            ],
            &spec.endpoint_configs,
        )?;
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
        let revisions = if spec.child_resources.iter().any(|r| r.method().is_rolling()) {
            if !parent_resource.namespaced {
                return Err(StartError::RollingNeedsNamespacedParent);
            }
            let resource = hub
                .discovery
                .resolve(crate::api::GROUP_VERSION, "controllerrevisions")
                .await
                .map_err(|source| StartError::NotFound { role: "controllerrevision", source })?;
            let informer = hub.informers.get(&resource);
            informer.wait_synced().await;
            Some(informer)
        } else {
            None
        };
        let parent = hub.informers.get(&parent_resource);
        parent.wait_synced().await;
        for child in &children {
            child.informer.wait_synced().await;
        }
        let name = cc.metadata.name.clone().unwrap_or_default();
        let cc_json = serde_json::to_value(&*cc).unwrap_or(Value::Null);
        let (queue, metrics, enqueue) = controller_queue(hub, "CompositeController", &name);
        Ok(Arc::new(Self {
            metrics,
            related: Related::new(hub.clone(), hooks.customize.clone(), cc_json.clone(), enqueue),
            hub: hub.clone(),
            cc_json,
            finalizer: format!("metacontroller.io/compositecontroller-{name}"),
            name,
            parent,
            parent_selector,
            child_resources: resources(&children),
            children,
            revisions,
            queue,
            cc,
        }))
    }

    /// Runs watches-to-queue mapping and the workers until `cancel` fires.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let mut tasks = JoinSet::new();
        tasks.spawn(Arc::clone(&self).map_parent_events());
        for index in 0..self.children.len() {
            tasks.spawn(Arc::clone(&self).map_child_events(index));
        }
        if let Some(period) = resync_period(self.cc.spec.resync_period_seconds) {
            let this = Arc::clone(&self);
            tasks.spawn(every(period, move || {
                for parent in this.parent.list(None) {
                    this.queue.add(ObjectKey::of(&parent));
                }
            }));
        }
        let workers = self.hub.config.workers;
        run_workers(self, workers, tasks, cancel).await;
    }

    async fn map_parent_events(self: Arc<Self>) {
        let ignore_status = self.cc.spec.parent_resource.ignore_status_changes == Some(true);
        let mut changes = self.parent.subscribe();
        while let Some(change) = changes.recv().await {
            match &change {
                Change::Applied { old: Some(old), new }
                    if old.metadata.resource_version == new.metadata.resource_version
                        || (ignore_status && !meaningful_parent_change(old, new)) =>
                {
                    continue;
                }
                Change::Deleted(obj) => self.related.forget(&ObjectKey::of(obj)),
                Change::Applied { .. } => {}
            }
            self.queue.add(ObjectKey::of(change.object()));
        }
    }

    async fn map_child_events(self: Arc<Self>, index: usize) {
        let mut changes = self.children[index].informer.subscribe();
        while let Some(change) = changes.recv().await {
            match &change {
                Change::Applied { old: Some(old), new } => {
                    if old.metadata.resource_version == new.metadata.resource_version {
                        continue;
                    }
                    // Ownership may have moved: the previous owner must see its child go.
                    if controller_uid(old) != controller_uid(new) {
                        self.enqueue_owner_of(old, false);
                    }
                    self.enqueue_owner_of(new, true);
                }
                Change::Applied { old: None, new } => self.enqueue_owner_of(new, true),
                Change::Deleted(obj) => self.enqueue_owner_of(obj, false),
            }
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
                self.queue.add(key);
            }
            return;
        }
        if !adopt_orphans {
            return;
        }
        let scope = if parent_resource.namespaced { Some(child.metadata.namespace.as_deref()) } else { None };
        let labels = labels_of(&child.metadata);
        for parent in self.parent.list(scope) {
            if self.child_selector(&parent).is_ok_and(|s| s.matches(&labels)) {
                self.queue.add(ObjectKey::of(&parent));
            }
        }
    }

    fn child_selector(&self, parent: &DynamicObject) -> Result<Selector, SyncError> {
        child_selector(&self.cc, parent)
    }

    async fn sync_parent(&self, key: &ObjectKey) -> Result<Option<Duration>, SyncError> {
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

        let selector = self.child_selector(&parent)?;
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
        let parent_json = serde_json::to_value(&*parent).unwrap_or(Value::Null);
        let children = request_map(&self.child_resources, scope.version, scope.namespace, &observed);
        let call = HookCall { hook, children: &children, related: &related, finalizing, selector: &selector };
        let outcome = match &self.revisions {
            None => self.call(&parent, &parent_json, &call).await?,
            Some(revisions) => self.call_revisions(revisions, &parent, &parent_json, &observed, &call).await?,
        };
        let Outcome { desired, status, resync, finalized, events } = outcome;
        record_hook_events(&self.hub.events, &parent, &events).await;

        let errors = manage(&self.hub.applier, &self.children, &observed, &desired).await;
        replace_status(&api, &parent, status, true).await?;
        if !errors.is_empty() {
            return Err(SyncError::Apply(errors));
        }
        if finalizing && finalized {
            set_finalizer(&api, &parent, &self.finalizer, false).await?;
        }
        Ok(resync)
    }

    /// One hook call for the parent as it is.
    async fn call(
        &self,
        parent: &DynamicObject,
        parent_json: &Value,
        call: &HookCall<'_>,
    ) -> Result<Outcome, SyncError> {
        let request = CompositeRequest {
            controller: &self.cc_json,
            parent: parent_json,
            children: call.children,
            related: call.related,
            finalizing: call.finalizing,
        };
        let response = self.hub.hooks.composite(call.hook, &request).await?;
        let parent_resource = self.parent.resource();
        let (desired, status) =
            validate_response(&self.cc, parent, parent_resource, &self.child_resources, &response, call.selector)?;
        Ok(Outcome {
            desired,
            status,
            resync: resync_after(response.resync_after_seconds),
            finalized: response.finalized,
            events: response.events,
        })
    }

    /// Rolling updates: one hook call per live revision (concurrently), children kept on the revision
    /// that claims them, at most one moved to the latest per sync; revisions persisted first.
    async fn call_revisions(
        &self,
        informer: &Informer,
        parent: &DynamicObject,
        parent_json: &Value,
        observed: &[ChildMap<Arc<DynamicObject>>],
        call: &HookCall<'_>,
    ) -> Result<Outcome, SyncError> {
        let paths = self.field_paths();
        let parent_resource = self.parent.resource();
        let uid = parent.metadata.uid.clone().unwrap_or_default();
        let namespace = parent.metadata.namespace.clone().unwrap_or_default();
        let latest_patch = revisions::parent_patch(parent_json, &paths);
        let latest_name = revisions::revision_name(parent_resource, &uid, &latest_patch);
        let mut all = live_revisions(informer, &uid, &namespace, &latest_name, latest_patch);

        // Every revision's parent goes to the hook; any failure aborts the whole sync unchanged.
        let parents: Vec<Value> = all
            .iter()
            .enumerate()
            .map(
                |(i, r)| {
                    if i == 0 { parent_json.clone() } else { revisions::apply_patch(parent_json, &r.patch, &paths) }
                },
            )
            .collect();
        let calls = parents.iter().map(|p| {
            let request = CompositeRequest {
                controller: &self.cc_json,
                parent: p,
                children: call.children,
                related: call.related,
                finalizing: call.finalizing,
            };
            async move { self.hub.hooks.composite(call.hook, &request).await }
        });
        let responses = futures::future::try_join_all(calls).await?;
        let child_resources = &self.child_resources;
        let mut desired_by_revision = Vec::with_capacity(all.len());
        let mut latest_status = Value::Null;
        for (i, (response, revision_parent)) in responses.iter().zip(&parents).enumerate() {
            let revision_parent: DynamicObject =
                serde_json::from_value(revision_parent.clone()).unwrap_or_else(|_| parent.clone());
            let (desired, status) = validate_response(
                &self.cc,
                &revision_parent,
                parent_resource,
                child_resources,
                response,
                call.selector,
            )?;
            if i == 0 {
                latest_status = status;
            }
            desired_by_revision.push(desired);
        }

        let claims = stored_claims(&all, child_resources, &namespace);
        let latest_desired = &desired_by_revision[0];
        let wanted: BTreeSet<(usize, ObjectKey)> =
            latest_desired.iter().enumerate().flat_map(|(t, m)| m.keys().map(move |k| (t, k.clone()))).collect();
        let order = response_order(&responses[0].children, child_resources, &namespace);
        let observed_by_key: BTreeMap<(usize, ObjectKey), Arc<DynamicObject>> = observed
            .iter()
            .enumerate()
            .flat_map(|(t, m)| m.iter().map(move |(k, o)| ((t, k.clone()), Arc::clone(o))))
            .collect();
        let up_to_date = |child: &(usize, ObjectKey)| {
            let want = latest_desired[child.0].get(&child.1);
            let have = observed_by_key.get(child);
            matches!((want, have), (Some(w), Some(h)) if revisions::is_subset(&revisions::comparable(w), &serde_json::to_value(&**h).unwrap_or(Value::Null)))
        };
        let rules = &self.cc.spec.child_resources;
        let types = type_infos(rules, child_resources);
        let (claims, rollout) = revisions::roll(claims, &types, &wanted, &order, &observed_by_key, up_to_date);

        // Persist who owns what before any child changes.
        for revision in &mut all {
            revision.children.clear();
        }
        for ((t, key), index) in &claims {
            let resource = &child_resources[*t];
            let entry = all[*index].children.entry((resource.api_resource.group.clone(), resource.kind().to_owned()));
            entry.or_default().push(key.name.clone());
        }
        let labels = self.revision_labels(parent);
        let owner = owner_reference(parent, parent_resource);
        let objects: Vec<Value> =
            all.iter().map(|r| revisions::revision_object(r, &namespace, &labels, &owner)).collect();
        revisions::persist(&self.hub.applier, informer.resource(), &all, &objects)
            .await
            .map_err(|e| SyncError::Apply(vec![e]))?;

        let desired = claimed_desired(&desired_by_revision, &claims);
        let rollout = match rollout {
            Rollout::OnLatest { .. } => Rollout::OnLatest { revision: latest_name },
            other => other,
        };
        let mut status = latest_status;
        revisions::set_condition(&mut status, rollout.condition());
        let resync = responses.iter().filter_map(|r| resync_after(r.resync_after_seconds)).min();
        let finalized = responses.iter().all(|r| r.finalized);
        let events = responses.into_iter().next().map(|r| r.events).unwrap_or_default();
        Ok(Outcome { desired, status, resync, finalized, events })
    }

    fn field_paths(&self) -> Vec<String> {
        let paths = self.cc.spec.parent_resource.revision_history.as_ref().map(|h| h.field_paths.clone());
        paths.filter(|p| !p.is_empty()).unwrap_or_else(|| vec!["spec".to_owned()])
    }

    /// Labels of a revision: the parent's pod-template labels (or `controller-uid`) plus group/resource.
    fn revision_labels(&self, parent: &DynamicObject) -> BTreeMap<String, String> {
        let mut labels: BTreeMap<String, String> = if self.cc.spec.generate_selector == Some(true) {
            BTreeMap::from([(CONTROLLER_UID_LABEL.to_owned(), parent.metadata.uid.clone().unwrap_or_default())])
        } else {
            parent
                .data
                .pointer("/spec/template/metadata/labels")
                .and_then(|l| serde_json::from_value(l.clone()).ok())
                .unwrap_or_default()
        };
        let resource = self.parent.resource();
        labels.insert(revisions::API_GROUP_LABEL.to_owned(), resource.api_resource.group.clone());
        labels.insert(revisions::RESOURCE_LABEL.to_owned(), resource.api_resource.plural.clone());
        labels
    }
}

/// What a sync asks the hook.
struct HookCall<'a> {
    hook: &'a crate::api::Hook,
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
}

/// The latest revision first (stored, or new with no children), then the other stored ones.
fn live_revisions(
    informer: &Informer,
    uid: &str,
    namespace: &str,
    latest_name: &str,
    latest_patch: Value,
) -> Vec<Revision> {
    let mut stored: Vec<Revision> = informer
        .controlled_by(uid)
        .into_iter()
        .filter(|r| r.metadata.namespace.as_deref() == Some(namespace))
        .map(Revision::from_object)
        .collect();
    stored.sort_by(|a, b| a.name.cmp(&b.name));
    let latest = match stored.iter().position(|r| r.name == latest_name) {
        Some(i) => stored.remove(i),
        None => Revision { name: latest_name.to_owned(), patch: latest_patch, children: BTreeMap::new(), stored: None },
    };
    let mut all = vec![latest];
    all.extend(stored);
    all
}

/// What the rollout rule needs to know of each child type.
fn type_infos<'a>(rules: &'a [crate::api::ChildResourceRule], types: &'a [Arc<ResolvedResource>]) -> Vec<TypeInfo<'a>> {
    rules
        .iter()
        .zip(types)
        .map(|(rule, resource)| TypeInfo {
            kind: resource.kind(),
            method: rule.method(),
            checks: rule.update_strategy.as_ref().and_then(|s| s.status_checks.as_ref()).map_or(&[], |c| &c.conditions),
        })
        .collect()
}

/// Claims recorded in stored revisions; where two claim a child, the latest (index 0) wins.
fn stored_claims(revisions: &[Revision], types: &[Arc<ResolvedResource>], namespace: &str) -> Claims {
    let mut claims = Claims::new();
    for (index, revision) in revisions.iter().enumerate().rev() {
        for ((group, kind), names) in &revision.children {
            let Some(t) = types.iter().position(|r| r.api_resource.group == *group && r.kind() == kind) else {
                continue;
            };
            for name in names {
                claims.insert((t, ObjectKey { namespace: Some(namespace.to_owned()), name: name.clone() }), index);
            }
        }
    }
    claims
}

/// The children to apply: what the latest revision wants, each in the state of the revision claiming it.
fn claimed_desired(desired_by_revision: &[Vec<ChildMap<Value>>], claims: &Claims) -> Vec<ChildMap<Value>> {
    desired_by_revision[0]
        .iter()
        .enumerate()
        .map(|(t, children)| {
            children
                .iter()
                .map(|(key, latest)| {
                    let revision = claims.get(&(t, key.clone())).copied().unwrap_or(0);
                    let chosen = desired_by_revision[revision][t].get(key).unwrap_or(latest);
                    (key.clone(), chosen.clone())
                })
                .collect()
        })
        .collect()
}

/// The latest response's children as (type, key), in the order the hook listed them.
fn response_order(children: &[Value], types: &[Arc<ResolvedResource>], namespace: &str) -> Vec<(usize, ObjectKey)> {
    children
        .iter()
        .filter_map(|c| {
            let text = |p: &str| c.pointer(p).and_then(Value::as_str).unwrap_or_default();
            let t = types.iter().position(|r| r.api_version() == text("/apiVersion") && r.kind() == text("/kind"))?;
            let name = text("/metadata/name").to_owned();
            Some((t, ObjectKey { namespace: Some(namespace.to_owned()), name }))
        })
        .collect()
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

    fn metrics(&self) -> &crate::metrics::ControllerMetrics {
        &self.metrics
    }

    fn object(&self, key: &ObjectKey) -> Option<Arc<DynamicObject>> {
        self.parent.get(key)
    }

    async fn sync(&self, key: &ObjectKey) -> Result<Option<Duration>, SyncError> {
        self.sync_parent(key).await
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

/// Whether a parent update matters when `ignoreStatusChanges` is set.
pub(crate) fn meaningful_parent_change(old: &DynamicObject, new: &DynamicObject) -> bool {
    old.metadata.generation != new.metadata.generation
        || old.metadata.labels != new.metadata.labels
        || old.metadata.annotations != new.metadata.annotations
        || new.metadata.deletion_timestamp.is_some()
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

    #[test]
    fn groups_are_compared_without_versions() {
        assert_eq!(group_of("apps/v1"), "apps");
        assert_eq!(group_of("v1"), "");
    }
}
