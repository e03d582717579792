//! One running CompositeController: a parent type, its children, and the hook that says what the
//! children should be. The engine ([`crate::engine::sync`]) does the sync; this module says what is a
//! CompositeController's own: which objects are a parent's children (its selector, adoption), how its
//! hook is asked ([`Ask`]) and what its answer must be, and rolling updates ([`revisions`]).
//!
//! Nothing is written until the hook's whole response has been validated, so a failing or garbage hook
//! never deletes or corrupts existing children or status.

pub mod ask;
pub mod revisions;
pub mod rollout;
pub mod rollouts;

use std::sync::{Arc, Mutex};

use kube::api::DynamicObject;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use self::rollouts::{Pending, Rollouts};
use crate::api::{CompositeController, labels_of};
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::{
    Change, Event, Informer, ObjectKey, PARENT_ANNOTATION, PARENT_UID_LABEL, controller_uid,
};
use crate::cache::selector::{Selector, SelectorIndex};
use crate::cache::shard::Role;
use crate::engine::elsewhere;
use crate::engine::error::{StartError, SyncError};
use crate::engine::hub::Hub;
use crate::engine::orphaning::Orphaned;
use crate::engine::sync::{
    Before, Call, Core, CoreSettings, Decision, Kind, Observation, Observed, child_types, controller_hooks,
};
use crate::engine::worker::resync_after;
use crate::hooks::{ControllerHooks, Endpoint};
use crate::write::apply::{Applier, ApplyError};
use crate::write::children::{
    ChildMap, ChildType, Claim, Elsewhere, Ignored, by_label, claim, claim_of, resources, whose_child,
};
use crate::write::records::Records;

pub use self::ask::{Answer, Ask, CONTROLLER_UID_LABEL, child_selector, validate_response};

/// A CompositeController whose types are resolved and whose caches are synced.
pub struct Controller {
    core: Core<ObjectKey>,
    cc: Arc<CompositeController>,
    /// The controller object as hooks receive it (`request.controller`).
    cc_json: Value,
    parent: Informer,
    parent_selector: Selector,
    /// Rolling updates, when a child type rolls.
    rollouts: Option<Rollouts>,
    /// The hooks, ready to call (the engine's related objects hold the `customize` one).
    endpoints: ControllerHooks,
    /// Every parent's child selector, compiled once per parent version, found by a child's labels.
    selectors: Mutex<SelectorIndex<ObjectKey>>,
}

impl Controller {
    /// Resolves the parent and child types, refuses specs it cannot honour, and waits for caches.
    pub async fn start(hub: &Hub, cc: Arc<CompositeController>) -> Result<Arc<Self>, StartError> {
        let spec = &cc.spec;
        let name = cc.metadata.name.clone().unwrap_or_default();
        let hooks = spec.hooks.as_ref().map(|h| [h.sync.as_ref(), h.finalize.as_ref(), h.customize.as_ref()]);
        let endpoints = controller_hooks(hub, "CompositeController", &name, hooks, &spec.endpoint_configs)?;
        let parent_rule = &spec.parent_resource;
        let parent_resource = hub
            .discovery
            .resolve(&parent_rule.api_version, &parent_rule.resource)
            .await
            .map_err(|source| StartError::NotFound { role: "parent", source })?;
        crate::engine::sync::within_namespaces(hub, "parent", &parent_resource)?;
        let parent_selector = match &parent_rule.label_selector {
            Some(s) => Selector::from_label_selector(s)?,
            None => Selector::everything(),
        };
        if spec.child_resources.iter().any(|r| r.adopt_across_namespaces == Some(true) && !r.cross_namespace()) {
            return Err(StartError::CrossNamespace(
                "adoptAcrossNamespaces is for a child type declared crossNamespace".into(),
            ));
        }
        if spec.child_resources.iter().any(crate::api::ChildResourceRule::cross_namespace) {
            if !parent_resource.namespaced {
                return Err(StartError::CrossNamespace(
                    "crossNamespace is for a namespaced parent: a cluster-scoped parent owns children in any \
                     namespace already"
                        .into(),
                ));
            }
            if !hub.informers.namespaces().is_empty() {
                return Err(StartError::CrossNamespace(
                    "crossNamespace needs a hub that watches every namespace a child may be in; this hub watches \
                     only its `namespaces`"
                        .into(),
                ));
            }
        }
        let children = child_types(hub, &spec.child_resources, "child", |method| method).await?;
        let records = records_of(hub, spec, &name).await?;
        let rollouts = if spec.child_resources.iter().any(|r| r.method().is_rolling()) {
            if !parent_resource.namespaced {
                return Err(StartError::RollingNeedsNamespacedParent);
            }
            let resource = hub
                .discovery
                .resolve(crate::api::GROUP_VERSION, "controllerrevisions")
                .await
                .map_err(|source| StartError::NotFound { role: "controllerrevision", source })?;
            // Revisions carry no shard label (rollouts write them apart from the children): sharded,
            // every replica sees them all, and claims only its own parents'.
            let informer = hub.informers.get_unsharded(&resource);
            informer.wait_synced(hub.settings.cache_sync_timeout).await?;
            Some(Rollouts::new(informer, Arc::clone(&parent_resource), resources(&children), spec))
        } else {
            None
        };
        let parent = hub.informers.get(&parent_resource, Role::Parent);
        parent.wait_synced(hub.settings.cache_sync_timeout).await?;
        for child in &children {
            child.informer.wait_synced(hub.settings.cache_sync_timeout).await?;
        }
        let cc_json = serde_json::to_value(&*cc).unwrap_or(Value::Null);
        let core = Core::new(
            hub,
            CoreSettings {
                kind: "CompositeController",
                finalizer: format!("metacontroller.io/compositecontroller-{name}"),
                name,
                annotations: cc.metadata.annotations.as_ref(),
                children,
                customize: endpoints.customize.clone(),
                controller: cc_json.clone(),
                sync_hook: cc.spec.hooks.as_ref().and_then(|h| h.sync.clone()),
                endpoint_configs: cc.spec.endpoint_configs.clone(),
                records,
                related_limit: cc.spec.related_limit.clone(),
            },
        )
        .map_err(StartError::Annotation)?;
        Ok(Arc::new(Self {
            core,
            cc_json,
            parent,
            parent_selector,
            rollouts,
            endpoints,
            selectors: Mutex::default(),
            cc,
        }))
    }

    /// Runs watches-to-queue mapping and the workers, and follows the hook's versions
    /// ([`crate::engine::rollout`]) and its canary ([`crate::engine::canary`]), until `cancel` fires.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        if let Some(records) = self.core.records.clone() {
            // Records a hub stopped between a parent's finalizer and its record's left held.
            let (parents, finalizer) = (self.parent.clone(), self.core.finalizer.clone());
            tokio::spawn(async move {
                elsewhere::sweep(&records, &parents, &Arc::clone(parents.resource()), &finalizer).await;
            });
        }
        let versions = crate::engine::rollout::run(Arc::clone(&self), cancel.clone());
        let canary = crate::engine::canary::run(Arc::clone(&self), cancel.clone());
        tokio::join!(crate::engine::sync::run(self, cancel), versions, canary);
    }

    /// What whoever may create a parent can make the customize hook read through the hub (`None`: no
    /// customize hook).
    #[must_use]
    pub fn related_reach(&self) -> Option<crate::engine::related::Reach> {
        let hooks = self.cc.spec.hooks.as_ref()?;
        hooks.customize.as_ref()?;
        let version = crate::engine::related::related_version(hooks.sync.as_ref(), hooks.finalize.as_ref());
        let namespaced = self.parent.resource().namespaced;
        Some(crate::engine::related::Reach::of(version, namespaced, self.cc.spec.related_limit.as_ref()))
    }

    /// Queues every parent it selects (or still finalizes) now — a sync requested on the controller
    /// object; returns how many.
    pub fn resync_all(&self) -> usize {
        crate::engine::sync::resync_all(self)
    }

    /// Takes the settings of the controller object's annotations (`metahook.dev/sync-on-own-writes`, the
    /// safe-delete guard) from now on, live; an invalid value is refused and the settings stay as they were.
    pub fn configure(&self, annotations: Option<&std::collections::BTreeMap<String, String>>) -> Result<(), String> {
        self.core.configure(annotations)
    }

    /// The selector of `parent`'s children, compiled once per parent version.
    fn selector_of(&self, parent: &DynamicObject) -> Result<Arc<Selector>, SyncError> {
        let version = format!(
            "{}/{}",
            parent.metadata.uid.as_deref().unwrap_or_default(),
            parent.metadata.generation.unwrap_or_default()
        );
        // An orphan anywhere may be the parent's to adopt only where the controller says so
        // (`adoptAcrossNamespaces`); children anywhere (`crossNamespace`) are found by their label.
        let namespaced = self.parent.resource().namespaced && !adopts_elsewhere(&self.core.children);
        let scope = if namespaced { parent.metadata.namespace.as_deref() } else { None };
        self.selectors
            .lock()
            .expect("selectors lock")
            .get_or_compile(&ObjectKey::of(parent), &version, scope, || child_selector(&self.cc, parent))
    }

    /// Whether a child type may have children outside the parent's namespace (`crossNamespace`).
    fn cross_namespace(&self) -> bool {
        self.core.children.iter().any(|t| t.cross_namespace)
    }

    /// How this controller asks its hook.
    fn ask(&self) -> Ask<'_> {
        Ask {
            cc: &self.cc,
            controller: &self.cc_json,
            parent_resource: self.parent.resource(),
            child_resources: &self.core.child_resources,
        }
    }
}

impl Kind for Controller {
    type Key = ObjectKey;
    type Before = Pending;
    /// The parent's `ControllerRevision`s (none without rolling updates).
    type Claimed = Vec<Arc<DynamicObject>>;
    const OBJECT: &'static str = "parent";
    const STATUS_IS_THE_HOOKS: bool = true;
    const SETS_OBSERVED_GENERATION: bool = true;

    fn core(&self) -> &Core<ObjectKey> {
        &self.core
    }

    fn object_informers(&self) -> Vec<&Informer> {
        vec![&self.parent]
    }

    fn key_of(&self, _: usize, obj: &DynamicObject) -> ObjectKey {
        ObjectKey::of(obj)
    }

    fn type_of(&self, _: &ObjectKey) -> usize {
        0
    }

    fn object(&self, key: &ObjectKey) -> Option<(Arc<DynamicObject>, Arc<ResolvedResource>)> {
        self.parent.get(key).map(|parent| (parent, Arc::clone(self.parent.resource())))
    }

    fn contains(&self, key: &ObjectKey) -> bool {
        self.parent.contains(key)
    }

    fn holds(&self, key: &ObjectKey, version: &str) -> bool {
        self.parent.holds(key, version)
    }

    fn selects(&self, _: usize, obj: &DynamicObject) -> bool {
        self.parent_selector.matches(&labels_of(&obj.metadata))
    }

    fn ignores_status_changes(&self, _: usize, _: &DynamicObject) -> bool {
        self.cc.spec.parent_resource.ignore_status_changes == Some(true)
    }

    /// Keeps the selector index current, so an orphan finds the parents that would adopt it without a scan.
    fn noticed(&self, event: &Event) {
        match &event.change {
            Change::Deleted(obj) => {
                self.selectors.lock().expect("selectors lock").remove(&ObjectKey::of(obj));
            }
            Change::Applied { new, .. } => {
                let _ = self.selector_of(new);
            }
        }
    }

    /// The parent controlling `child`, or, for an orphan with `adopt`, every parent that would adopt it.
    fn owners(&self, child: &DynamicObject, adopt: bool) -> Vec<ObjectKey> {
        let parent_resource = self.parent.resource();
        if let Some(key) = labelled_parent(child).filter(|_| parent_resource.namespaced) {
            // A child by label: the annotation says where its parent is, the label whether it is that one.
            let current = self.parent.get(&key).is_some_and(|p| p.metadata.uid.as_deref() == controller_uid(child));
            return if current { vec![key] } else { Vec::new() };
        }
        let owner = child.metadata.owner_references.iter().flatten().find(|r| r.controller == Some(true));
        if let Some(owner) = owner {
            let same_group = group_of(&owner.api_version) == group_of(parent_resource.api_version());
            if !same_group || owner.kind != parent_resource.kind() {
                return Vec::new();
            }
            let namespace = if parent_resource.namespaced { child.metadata.namespace.clone() } else { None };
            let key = ObjectKey { namespace, name: owner.name.clone() };
            let current = self.parent.get(&key).is_some_and(|p| p.metadata.uid.as_deref() == Some(owner.uid.as_str()));
            return if current { vec![key] } else { Vec::new() };
        }
        if !adopt {
            return Vec::new();
        }
        let labels = labels_of(&child.metadata);
        self.selectors.lock().expect("selectors lock").selecting(child.metadata.namespace.as_deref(), &labels)
    }

    fn hook(&self, finalizing: bool) -> Option<&Endpoint> {
        if finalizing { self.endpoints.finalize.as_ref() } else { self.endpoints.sync.as_ref() }
    }

    fn hook_versions(&self) -> &crate::hooks::HookVersions {
        &self.endpoints.versions
    }

    fn has_finalize_hook(&self) -> bool {
        self.cc.spec.hooks.as_ref().is_some_and(|h| h.finalize.is_some())
    }

    fn cleans_up(&self) -> bool {
        self.cross_namespace()
    }

    fn resync_period_seconds(&self) -> Option<i32> {
        self.cc.spec.resync_period_seconds
    }

    /// Claims the parent's children (adopting matching orphans, releasing owned ones it no longer
    /// selects), then, with rolling updates, its revisions (adopting matching orphans).
    async fn observe(
        &self,
        parent: &DynamicObject,
        resource: &ResolvedResource,
    ) -> Result<Option<Observation<Self::Claimed>>, SyncError> {
        let client = &self.core.hub.client;
        let selector = self.selector_of(parent)?;
        let records = self.core.records.as_deref();
        let known = records.map(|records| elsewhere::known(records, parent, &self.core.finalizer));
        let record = records.zip(known.as_ref()).map(|(records, known)| (records, known.elsewhere()));
        let observed = claim(client, parent, resource, &selector, &self.core.children, record).await?;
        // Empty: the parent went away while adopting.
        if observed.len() != self.core.children.len() {
            return Ok(None);
        }
        let revisions = match &self.rollouts {
            Some(rollouts) => match rollouts.claim(client, parent, &selector).await? {
                Some(revisions) => revisions,
                None => return Ok(None),
            },
            None => Vec::new(),
        };
        Ok(Some((observed, revisions)))
    }

    fn identifies_requests(&self) -> bool {
        self.rollouts.is_none()
    }

    async fn decide(
        &self,
        parent: &DynamicObject,
        _: &ResolvedResource,
        call: Call<'_>,
        revisions: &Self::Claimed,
    ) -> Result<Decision<Pending>, SyncError> {
        let selector = self.selector_of(parent)?;
        let ask = self.ask();
        let Some(rollouts) = &self.rollouts else {
            let parent_json = crate::hooks::for_hooks(parent);
            let answer = ask.ask(call.endpoint, parent, &parent_json, call, &selector).await?;
            return Ok(answer.into_decision());
        };
        let rolling = Rolling { rollouts, ask: &ask, endpoint: call.endpoint, selector: &selector };
        rolling.decide(parent, call.into(), call.observed, revisions).await
    }

    /// As claiming takes it ([`whose_child`]): outside its namespace the parent's only if its record
    /// lists it (else anyone who writes there could make a name the hook asks for look like the
    /// parent's, and the sync would retry quietly for ever instead of leaving that namespace out).
    fn whose(&self, parent: &DynamicObject, child: &DynamicObject) -> Claim {
        let Ok(selector) = self.selector_of(parent) else {
            // Unreachable after a decision (it needed the selector); nothing is the parent's without one.
            return Claim::Ignore(Ignored::NotSelected);
        };
        let known = self.core.records.as_deref().map(|records| elsewhere::known(records, parent, &self.core.finalizer));
        let claims = known.as_ref().map_or(Elsewhere::Nothing, elsewhere::Known::elsewhere);
        whose_child(child, parent, self.parent.resource(), None, &selector, claims)
    }

    fn adopts(&self, parent: &DynamicObject, resource: &ResolvedResource, child: &DynamicObject) -> bool {
        let elsewhere = adopts_elsewhere(&self.core.children);
        self.selector_of(parent).is_ok_and(|selector| adopts(parent, resource, &selector, child, elsewhere))
    }

    async fn orphaned_by_collector(&self, parent: &DynamicObject) -> Result<bool, SyncError> {
        let selector = self.selector_of(parent)?;
        let client = &self.core.hub.client;
        Orphaned { client, types: &self.core.child_resources, selector: &selector }.any(parent).await
    }
}

/// The records of the parents' children elsewhere (see `crate::write::records`), when a child type is
/// `crossNamespace`: records a hub before issue 66 kept in Metacontroller's group are moved first
/// ([`crate::write::record_migration`]), for a parent synced without its record would be taken for one
/// from before records.
async fn records_of(
    hub: &Hub,
    spec: &crate::api::CompositeControllerSpec,
    name: &str,
) -> Result<Option<Records>, StartError> {
    if !spec.child_resources.iter().any(crate::api::ChildResourceRule::cross_namespace) {
        return Ok(None);
    }
    let resource = hub
        .discovery
        .resolve(crate::api::OWN_GROUP_VERSION, "childrecords")
        .await
        .map_err(|source| StartError::NotFound { role: "childrecord", source })?;
    let moved = crate::write::record_migration::migrate(&hub.client, name).await.map_err(StartError::Records)?;
    let informer = hub.informers.get(&resource, Role::Child);
    informer.wait_synced(hub.settings.cache_sync_timeout).await?;
    let records = Records::new(hub.client.clone(), informer, name);
    for record in &moved {
        records.know(record);
    }
    Ok(Some(records))
}

/// How a rolling sync decides (see [`Rollouts::sync`]): the engine's sync and `metahook diff` both
/// decide so.
pub(crate) struct Rolling<'a> {
    pub rollouts: &'a Rollouts,
    pub ask: &'a Ask<'a>,
    pub endpoint: &'a Endpoint,
    /// The parent's child selector.
    pub selector: &'a Selector,
}

impl Rolling<'_> {
    /// Every live revision's parent is asked (each answer checked as the latest's is), the children kept
    /// on the revision that claims them and at most one moved to the latest; `children`: the observed
    /// children by type, `revisions`: the parent's, as claimed. Writes nothing: the revisions to write
    /// are the decision's `before`.
    pub async fn decide(
        &self,
        parent: &DynamicObject,
        observed: Observed<'_>,
        children: &[ChildMap<Arc<DynamicObject>>],
        revisions: &[Arc<DynamicObject>],
    ) -> Result<Decision<Pending>, SyncError> {
        let parent_json = crate::hooks::for_hooks(parent);
        let answer = |revision_parent: Value| async move {
            let as_object = serde_json::from_value(revision_parent.clone());
            let revision_object: DynamicObject = as_object.unwrap_or_else(|_| parent.clone());
            self.ask.ask(self.endpoint, &revision_object, &revision_parent, observed, self.selector).await
        };
        let rollouts::Decision { desired, status, responses, pending } =
            self.rollouts.sync(parent, &parent_json, children, revisions, answer).await?;
        // The earliest resync wins, all must agree to finalize, and Events come from the latest's answer.
        Ok(Decision {
            desired,
            status: Some(status),
            metadata: None,
            resync: responses.iter().filter_map(|r| resync_after(r.resync_after_seconds)).min(),
            finalized: responses.iter().all(|r| r.finalized),
            events: responses.into_iter().next().map(|r| r.events).unwrap_or_default(),
            before: Some(pending),
            scope: None,
            refused: None,
        })
    }
}

/// Whether `child` is `parent`'s own: the parent is its controller (whatever its labels say).
#[must_use]
pub fn is_child_of(child: &DynamicObject, parent: &DynamicObject) -> bool {
    controller_uid(child) == parent.metadata.uid.as_deref()
}

/// Whether `parent` (of type `resource`, children selected by `selector`) adopts `child` were it to
/// see it: as [`claim`] decides for an orphan it finds in the cache. A child outside the parent's
/// namespace is adopted only with `elsewhere` (a child type declared `adoptAcrossNamespaces`): a
/// parent's selector alone never reaches another namespace.
#[must_use]
pub fn adopts(
    parent: &DynamicObject,
    resource: &ResolvedResource,
    selector: &Selector,
    child: &DynamicObject,
    elsewhere: bool,
) -> bool {
    let parent_ns = resource.namespaced.then_some(parent.metadata.namespace.as_deref()).flatten();
    let parent_ns =
        if elsewhere && by_label(parent, resource, child.metadata.namespace.as_deref()) { None } else { parent_ns };
    claim_of(child, parent, parent_ns, selector) == Claim::Adopt
}

/// Whether any of `types` adopts selected orphans outside the parent's namespace
/// (`adoptAcrossNamespaces`).
#[must_use]
pub fn adopts_elsewhere(types: &[ChildType]) -> bool {
    types.iter().any(|t| t.adopt_elsewhere)
}

/// The parent a child by label names (its [`PARENT_ANNOTATION`]), when it has no controller
/// `ownerReference`; whether it is that parent's child is the label's to say.
fn labelled_parent(child: &DynamicObject) -> Option<ObjectKey> {
    if child.metadata.owner_references.iter().flatten().any(|r| r.controller == Some(true)) {
        return None;
    }
    child.metadata.labels.as_ref()?.get(PARENT_UID_LABEL)?;
    let (namespace, name) = child.metadata.annotations.as_ref()?.get(PARENT_ANNOTATION)?.split_once('/')?;
    Some(ObjectKey { namespace: Some(namespace.to_owned()), name: name.to_owned() })
}

/// A rollout's revisions are written before any child.
impl Before for Pending {
    fn writes(&self, applier: &Applier) -> bool {
        Pending::writes(self, applier)
    }

    async fn persist(&self, applier: &Applier) -> Result<(), ApplyError> {
        Pending::persist(self, applier).await
    }
}

/// The group part of an apiVersion (`""` for the core group).
fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_compared_without_versions() {
        assert_eq!(group_of("apps/v1"), "apps");
        assert_eq!(group_of("v1"), "");
    }
}
