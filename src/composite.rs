//! One running CompositeController: maps watch events to parent keys, and syncs each parent
//! (observe → hook → validate → apply → status).
//!
//! Nothing is written until the hook's whole response has been validated, so a failing or garbage
//! hook never deletes or corrupts existing children or status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::api::{CompositeController, HookVersion, labels_of};
use crate::apply::{ApplyError, strip_server_fields};
use crate::children::{ChildMap, ChildType, ClaimError, claim, manage, owner_reference};
use crate::discovery::{DiscoveryError, ResolvedResource};
use crate::events::reference;
use crate::hooks::{CompositeRequest, CompositeResponse, HookError, ObjectMaps, group_version_kind_key, object_key};
use crate::hub::Hub;
use crate::informers::{Change, Informer, ObjectKey};
use crate::queue::{Backoff, WorkQueue};
use crate::selector::{Selector, SelectorError};

/// Label that ties children to their parent when `generateSelector` is on.
pub const CONTROLLER_UID_LABEL: &str = "controller-uid";

/// Why a CompositeController cannot run (reported in its `Ready` condition).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("no hooks defined")]
    NoHooks,
    #[error("parent resource: {0}")]
    Parent(#[source] DiscoveryError),
    #[error("child resource: {0}")]
    Child(#[source] DiscoveryError),
    #[error("parent resource {resource} has no status subresource; metahook writes parent status through /status")]
    NoStatusSubresource { resource: String },
    #[error(
        "child resource {resource} uses update method {method:?}, which this version of metahook does not support yet"
    )]
    UnsupportedMethod { resource: String, method: crate::api::UpdateMethod },
    #[error("parentResource.labelSelector: {0}")]
    Selector(#[from] SelectorError),
}

impl StartError {
    /// Short `PascalCase` reason for the condition.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoHooks => "NoHooks",
            Self::Parent(_) => "ParentResourceNotFound",
            Self::Child(_) => "ChildResourceNotFound",
            Self::NoStatusSubresource { .. } => "NoStatusSubresource",
            Self::UnsupportedMethod { .. } => "UnsupportedUpdateMethod",
            Self::Selector(_) => "InvalidSelector",
        }
    }
}

/// Why one parent's sync failed. Every variant leaves children and status as they were, except
/// [`SyncError::Apply`], which reports the writes that failed after validation succeeded.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Hook(#[from] HookError),
    #[error("invalid hook response: {0}")]
    InvalidResponse(String),
    #[error("{0}")]
    Claim(Box<ClaimError>),
    #[error("parent .spec.selector: {0}")]
    ParentSelector(String),
    #[error("sync hook not defined")]
    NoSyncHook,
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Apply(Vec<ApplyError>),
    #[error("updating parent status: {0}")]
    Status(#[source] kube::Error),
    #[error("updating parent finalizers: {0}")]
    Finalizer(#[source] kube::Error),
}

impl From<ClaimError> for SyncError {
    fn from(e: ClaimError) -> Self {
        Self::Claim(Box::new(e))
    }
}

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
    finalizer: String,
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
        let parent_rule = &spec.parent_resource;
        let parent_resource =
            hub.discovery.resolve(&parent_rule.api_version, &parent_rule.resource).await.map_err(StartError::Parent)?;
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
            if rule.method().is_rolling() {
                return Err(StartError::UnsupportedMethod {
                    resource: format!("{}.{}", rule.resource, rule.api_version),
                    method: rule.method(),
                });
            }
            let resource = hub.discovery.resolve(&rule.api_version, &rule.resource).await.map_err(StartError::Child)?;
            children.push(ChildType { method: rule.method(), informer: hub.informers.get(&resource) });
        }
        let parent = hub.informers.get(&parent_resource);
        parent.wait_synced().await;
        for child in &children {
            child.informer.wait_synced().await;
        }
        let name = cc.metadata.name.clone().unwrap_or_default();
        Ok(Arc::new(Self {
            hub: hub.clone(),
            cc_json: serde_json::to_value(&*cc).unwrap_or(Value::Null),
            finalizer: format!("metacontroller.io/compositecontroller-{name}"),
            name,
            parent,
            parent_selector,
            children,
            queue: WorkQueue::new(Backoff { base: hub.config.backoff_base, max: hub.config.backoff_max }),
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
        if let Some(period) = self.cc.spec.resync_period_seconds {
            let period = Duration::from_secs(u64::try_from(period.max(1)).unwrap_or(1));
            tasks.spawn(Arc::clone(&self).resync_every(period));
        }
        for _ in 0..self.hub.config.workers {
            tasks.spawn(Arc::clone(&self).work());
        }
        cancel.cancelled().await;
        self.queue.shut_down();
        tasks.shutdown().await;
    }

    async fn map_parent_events(self: Arc<Self>) {
        let ignore_status = self.cc.spec.parent_resource.ignore_status_changes == Some(true);
        let mut changes = self.parent.subscribe();
        while let Some(change) = changes.recv().await {
            if let Change::Applied { old: Some(old), new } = &change {
                if old.metadata.resource_version == new.metadata.resource_version {
                    continue;
                }
                if ignore_status && !meaningful_parent_change(old, new) {
                    continue;
                }
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
                    if crate::informers::controller_uid(old) != crate::informers::controller_uid(new) {
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

    async fn resync_every(self: Arc<Self>, period: Duration) {
        let mut ticks = tokio::time::interval(period);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            for parent in self.parent.list(None) {
                self.queue.add(ObjectKey::of(&parent));
            }
        }
    }

    async fn work(self: Arc<Self>) {
        while let Some(key) = self.queue.next().await {
            match self.sync(&key).await {
                Ok(resync) => {
                    self.queue.forget(&key);
                    if let Some(after) = resync {
                        self.queue.add_after(key.clone(), after);
                    }
                }
                Err(SyncError::Hook(HookError::TooManyRequests { retry_after, .. })) => {
                    debug!(controller = %self.name, parent = %key, ?retry_after, "hook asked to retry later");
                    self.queue.add_after(key.clone(), retry_after);
                }
                Err(err) => {
                    warn!(controller = %self.name, parent = %key, "sync failed: {err}");
                    if let Some(parent) = self.parent.get(&key) {
                        self.hub.events.warning(&reference(&parent), "SyncError", format!("Sync error: {err}")).await;
                    }
                    self.queue.add_rate_limited(key.clone());
                }
            }
            self.queue.done(&key);
        }
    }

    /// Selector that decides which objects are this parent's children.
    fn child_selector(&self, parent: &DynamicObject) -> Result<Selector, SyncError> {
        if self.cc.spec.generate_selector == Some(true) {
            let uid = parent.metadata.uid.clone().unwrap_or_default();
            return Ok(Selector::from_labels(&BTreeMap::from([(CONTROLLER_UID_LABEL.to_owned(), uid)])));
        }
        let raw = parent.data.pointer("/spec/selector").cloned().unwrap_or(Value::Null);
        let selector: LabelSelector =
            serde_json::from_value(raw).map_err(|e| SyncError::ParentSelector(e.to_string()))?;
        if selector.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
            && selector.match_expressions.as_ref().is_none_or(Vec::is_empty)
        {
            return Err(SyncError::ParentSelector(
                ".spec.selector must have either matchLabels, matchExpressions, or both".into(),
            ));
        }
        Selector::from_label_selector(&selector).map_err(|e| SyncError::ParentSelector(e.to_string()))
    }

    /// Syncs one parent; returns when to sync it again, if the hook asked.
    async fn sync(&self, key: &ObjectKey) -> Result<Option<Duration>, SyncError> {
        let Some(parent) = self.parent.get(key) else { return Ok(None) };
        let hooks = self.cc.spec.hooks.as_ref().ok_or(SyncError::NoSyncHook)?;
        let matches = self.parent_selector.matches(&labels_of(&parent.metadata));
        let has_finalizer = parent.metadata.finalizers.iter().flatten().any(|f| f == &self.finalizer);
        let deleting = parent.metadata.deletion_timestamp.is_some();
        let finalizing = hooks.finalize.is_some() && (deleting || !matches);

        if hooks.finalize.is_none() && has_finalizer {
            // The finalize hook was removed from the spec: nothing will ever clear our finalizer.
            self.set_finalizer(&parent, false).await?;
            return Ok(None);
        }
        if (!matches || deleting) && !(finalizing && has_finalizer) {
            return Ok(None);
        }
        if hooks.finalize.is_some() && !finalizing && !has_finalizer {
            self.set_finalizer(&parent, true).await?;
        }

        let selector = self.child_selector(&parent)?;
        let parent_resource = self.parent.resource();
        let observed = claim(&self.hub.client, &parent, parent_resource, &selector, &self.children).await?;
        if observed.len() != self.children.len() {
            return Ok(None); // the parent went away while adopting
        }
        let hook =
            if finalizing { hooks.finalize.as_ref() } else { hooks.sync.as_ref() }.ok_or(SyncError::NoSyncHook)?;
        let parent_json = serde_json::to_value(&*parent).unwrap_or(Value::Null);
        let children_maps = self.request_children(hook.version(), &parent, &observed);
        let related = ObjectMaps::new();
        let request = CompositeRequest {
            controller: &self.cc_json,
            parent: &parent_json,
            children: &children_maps,
            related: &related,
            finalizing,
        };
        let response = self.hub.hooks.composite(hook, &request).await?;
        let desired = self.validate(&parent, &response, &selector)?;
        let status = desired_status(&parent, response.status.as_ref())?;
        for event in response.events.iter().take(10) {
            let obj = reference(&parent);
            if event.type_ == "Warning" {
                self.hub.events.warning(&obj, &event.reason, event.message.clone()).await;
            } else {
                self.hub.events.normal(&obj, &event.reason, event.message.clone()).await;
            }
        }

        let errors = manage(&self.hub.applier, &self.children, &observed, &desired).await;
        self.write_status(&parent, status).await?;
        if !errors.is_empty() {
            return Err(SyncError::Apply(errors));
        }
        if finalizing && response.finalized {
            self.set_finalizer(&parent, false).await?;
        }
        Ok(response.resync_after_seconds.filter(|s| *s > 0.0).and_then(|s| Duration::try_from_secs_f64(s).ok()))
    }

    /// `children` of the request: an entry per declared type, keyed per the hook version.
    fn request_children(
        &self,
        version: HookVersion,
        parent: &DynamicObject,
        observed: &[ChildMap<Arc<DynamicObject>>],
    ) -> ObjectMaps {
        let parent_ns = self.parent.resource().namespaced.then_some(parent.metadata.namespace.as_deref()).flatten();
        let mut maps = ObjectMaps::new();
        for (child_type, objects) in self.children.iter().zip(observed) {
            let resource = child_type.resource();
            let entry = maps.entry(group_version_kind_key(resource.api_version(), resource.kind())).or_default();
            for (key, obj) in objects {
                if let Some(k) = object_key(version, parent_ns, key.namespace.as_deref(), &key.name) {
                    entry.insert(k, serde_json::to_value(&**obj).unwrap_or(Value::Null));
                }
            }
        }
        maps
    }

    /// Checks every desired child and turns it into a complete object to apply. Any problem rejects the
    /// whole response: a partial apply could delete children the hook meant to keep.
    fn validate(
        &self,
        parent: &DynamicObject,
        response: &CompositeResponse,
        selector: &Selector,
    ) -> Result<Vec<ChildMap<Value>>, SyncError> {
        let invalid = |msg: String| SyncError::InvalidResponse(msg);
        let parent_resource = self.parent.resource();
        let parent_ns = parent_resource.namespaced.then(|| parent.metadata.namespace.clone()).flatten();
        let owner = serde_json::to_value(owner_reference(parent, parent_resource)).unwrap_or(Value::Null);
        let mut desired: Vec<ChildMap<Value>> = vec![ChildMap::new(); self.children.len()];
        for (position, child) in response.children.iter().enumerate() {
            let api_version = child.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
            let kind = child.get("kind").and_then(Value::as_str).unwrap_or_default();
            let name = child.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
            if !child.is_object() || api_version.is_empty() || kind.is_empty() {
                return Err(invalid(format!("children[{position}] must be an object with apiVersion and kind")));
            }
            if name.is_empty() {
                return Err(invalid(format!("children[{position}] ({kind}) has no metadata.name")));
            }
            let index = self
                .children
                .iter()
                .position(|t| t.resource().api_version() == api_version && t.resource().kind() == kind)
                .ok_or_else(|| {
                    invalid(format!("child {kind} {name}: {api_version}/{kind} is not a declared child resource"))
                })?;
            let resource = self.children[index].resource();
            let mut obj = strip_server_fields(child.clone());
            let meta = obj
                .get_mut("metadata")
                .and_then(Value::as_object_mut)
                .ok_or_else(|| invalid(format!("child {kind} {name}: metadata is not an object")))?;
            let namespace =
                resolve_namespace(resource, parent_ns.as_deref(), meta.get("namespace").and_then(Value::as_str))
                    .map_err(|reason| invalid(format!("child {kind} {name}: {reason}")))?;
            match &namespace {
                Some(ns) => meta.insert("namespace".into(), Value::String(ns.clone())),
                None => meta.remove("namespace"),
            };
            if self.cc.spec.generate_selector == Some(true) {
                let labels = meta.entry("labels").or_insert_with(|| json!({}));
                if let Some(labels) = labels.as_object_mut() {
                    labels
                        .entry(CONTROLLER_UID_LABEL)
                        .or_insert_with(|| Value::String(parent.metadata.uid.clone().unwrap_or_default()));
                }
            }
            let labels: BTreeMap<String, String> =
                serde_json::from_value(meta.get("labels").cloned().unwrap_or(json!({})))
                    .map_err(|e| invalid(format!("child {kind} {name}: labels: {e}")))?;
            if !selector.matches(&labels) {
                return Err(invalid(format!("labels on desired child {kind} {name} don't match parent selector")));
            }
            let parent_uid = parent.metadata.uid.as_deref().unwrap_or_default();
            let mut refs: Vec<Value> = meta
                .get("ownerReferences")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|r| r.get("uid").and_then(Value::as_str) != Some(parent_uid))
                .cloned()
                .collect();
            refs.push(owner.clone());
            meta.insert("ownerReferences".into(), Value::Array(refs));
            let key = ObjectKey { namespace, name: name.to_owned() };
            if desired[index].insert(key.clone(), obj).is_some() {
                return Err(invalid(format!("child {kind} {key} appears more than once")));
            }
        }
        Ok(desired)
    }

    /// Replaces `.status` through the status subresource, unless it is already what we would write.
    async fn write_status(&self, parent: &DynamicObject, status: Value) -> Result<(), SyncError> {
        if parent.data.get("status") == Some(&status) {
            return Ok(());
        }
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/uid", "value": parent.metadata.uid},
            {"op": "add", "path": "/status", "value": status},
        ]))
        .expect("a well-formed JSON patch");
        let name = parent.metadata.name.as_deref().unwrap_or_default();
        match self.parent_api(parent).patch_status(name, &PatchParams::default(), &Patch::<()>::Json(patch)).await {
            Ok(_) => Ok(()),
            // Gone, or replaced by a new object of the same name: the next event brings the new state.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 || s.code == 422 => Ok(()),
            Err(e) => Err(SyncError::Status(e)),
        }
    }

    /// Adds or removes our finalizer, guarded by the parent's resourceVersion.
    async fn set_finalizer(&self, parent: &DynamicObject, present: bool) -> Result<(), SyncError> {
        let mut finalizers: Vec<String> =
            parent.metadata.finalizers.iter().flatten().filter(|f| **f != self.finalizer).cloned().collect();
        if present {
            finalizers.push(self.finalizer.clone());
        }
        let patch =
            json!({"metadata": {"finalizers": finalizers, "resourceVersion": parent.metadata.resource_version}});
        let name = parent.metadata.name.as_deref().unwrap_or_default();
        match self.parent_api(parent).patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(SyncError::Finalizer(e)),
        }
    }

    fn parent_api(&self, parent: &DynamicObject) -> Api<DynamicObject> {
        let resource = self.parent.resource();
        match parent.metadata.namespace.as_deref() {
            Some(ns) if resource.namespaced => {
                Api::namespaced_with(self.hub.client.clone(), ns, &resource.api_resource)
            }
            _ => Api::all_with(self.hub.client.clone(), &resource.api_resource),
        }
    }
}

/// The group part of an apiVersion (`""` for the core group).
fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// Whether a parent update matters when `ignoreStatusChanges` is set.
fn meaningful_parent_change(old: &DynamicObject, new: &DynamicObject) -> bool {
    old.metadata.generation != new.metadata.generation
        || old.metadata.labels != new.metadata.labels
        || old.metadata.annotations != new.metadata.annotations
        || new.metadata.deletion_timestamp.is_some()
}

/// Namespace a desired child lands in. Namespaced children default to the parent's namespace and must
/// stay in it; under a cluster-scoped parent they must name one.
fn resolve_namespace(
    resource: &ResolvedResource,
    parent_ns: Option<&str>,
    requested: Option<&str>,
) -> Result<Option<String>, String> {
    match (resource.namespaced, parent_ns, requested) {
        (false, None, _) => Ok(None),
        (false, Some(_), _) => Err("cluster-scoped children of a namespaced parent are not supported".into()),
        (true, Some(p), None) => Ok(Some(p.to_owned())),
        (true, Some(p), Some(r)) if r == p || r.is_empty() => Ok(Some(p.to_owned())),
        (true, Some(p), Some(r)) => Err(format!("namespace {r} differs from the parent's namespace {p}")),
        (true, None, Some(r)) if !r.is_empty() => Ok(Some(r.to_owned())),
        (true, None, _) => Err("a namespaced child of a cluster-scoped parent must set metadata.namespace".into()),
    }
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
    use kube::core::ApiResource;

    use super::*;

    fn resource(namespaced: bool) -> ResolvedResource {
        ResolvedResource {
            api_resource: ApiResource {
                group: String::new(),
                version: "v1".into(),
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                plural: "configmaps".into(),
            },
            namespaced,
            has_status: false,
        }
    }

    #[test]
    fn namespaced_children_default_to_and_stay_in_the_parent_namespace() {
        let r = resource(true);
        assert_eq!(resolve_namespace(&r, Some("a"), None).unwrap().as_deref(), Some("a"));
        assert_eq!(resolve_namespace(&r, Some("a"), Some("a")).unwrap().as_deref(), Some("a"));
        assert!(resolve_namespace(&r, Some("a"), Some("b")).unwrap_err().contains("differs"));
    }

    #[test]
    fn cluster_parents_need_explicit_child_namespaces() {
        assert_eq!(resolve_namespace(&resource(true), None, Some("b")).unwrap().as_deref(), Some("b"));
        assert!(resolve_namespace(&resource(true), None, None).is_err());
        assert_eq!(resolve_namespace(&resource(false), None, None).unwrap(), None);
        assert!(resolve_namespace(&resource(false), Some("a"), None).is_err());
    }

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
