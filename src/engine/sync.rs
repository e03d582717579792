//! One sync, the same for every controller kind, in explicit phases:
//!
//! 1. **observe**: the object from the cache, its finalizer decision, its children (and a rollout's
//!    revisions) as the controller claims them (`Kind::observe`) and its related objects;
//! 2. **decide**: whether to ask the hook at all (`ask_hook`: not for the very request whose answer was
//!    last applied in full), the hook's answer checked whole (`Kind::decide`), and the plan of writes
//!    refused before anything is written (a name taken by someone else, the safe-delete guard);
//! 3. **act**: the children in the order that cannot lose data, then the object's own status and
//!    metadata — every write announced to the controller's [`Echoes`] through a `Journal`;
//! 4. **record**: the finalizer let go, a recreate followed up, the request marked applied in full.
//!
//! What differs between CompositeController and DecoratorController is what `Kind` supplies; the rest,
//! including how watch events become queued keys (`Core::object_event`, `Core::child_event`), lives
//! here once.

use std::fmt::Display;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::Value;
use tracing::{Instrument as _, debug, info, info_span, warn};

use crate::api::{HookVersion, UpdateMethod};
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::{Change, Event, Informer, ObjectKey, controller_uid};
use crate::cache::shard::Role;
use crate::engine::answered::{Answered, RequestId};
use crate::engine::canary::{Canary, CanarySettings, Pick};
use crate::engine::echoes::{Echo, EchoPolicy, Echoes, Seen, Settled, Watched};
use crate::engine::elsewhere;
use crate::engine::error::{StartError, SyncError, with_causes};
use crate::engine::events::reference;
use crate::engine::finalizer::{
    Facts, Step, follow_plan, gc_finalizing, has_finalizer, lifecycle_changed, remove_finalizer,
};
use crate::engine::held::Held;
use crate::engine::hub::Hub;
use crate::engine::metrics::ControllerMetrics;
use crate::engine::orphaning::{Deletions, Intent};
use crate::engine::queue::{Reason, Reasons, WorkQueue};
use crate::engine::related::{ParentScope, Related};
use crate::engine::status::{StatusWrite, held_status, record_hook_events, replace_status};
use crate::engine::trigger::SyncRequests;
use crate::engine::worker::{Synced, Syncer, controller_queue, resync_period, run_workers};
use crate::hooks::{ControllerHooks, Endpoint, HookError, HookEvent, ObjectMaps};
use crate::write::apply::{Applier, ApplyError};
use crate::write::children::{
    ChildMap, ChildType, DeletionGuard, Executed, Narrowed, Plan, WriteObserver, Writes, deleted_version, live_parent,
    request_map, resources,
};
use crate::write::records::Records;

/// What a controller kind supplies to the engine's sync.
pub(crate) trait Kind: Send + Sync + 'static {
    type Key: Clone + Eq + Hash + Display + crate::engine::queue::Flowing + Send + Sync + 'static;
    /// Writes a decision needs before any child's (a rollout's `ControllerRevision`s).
    type Before: Before;
    /// What `observe` claims besides the children, for `decide` (a rollout's `ControllerRevision`s).
    type Claimed: Send + Sync;
    /// What the synced object is called in messages ("parent", "target").
    const OBJECT: &'static str;
    /// Whether the synced object's status is the hook's to write, so the hub may say a permanent hook
    /// error there too (a parent's is; a decorator's target's belongs to whoever owns that type).
    const STATUS_IS_THE_HOOKS: bool;
    /// Whether the status a decision writes carries `observedGeneration`, set by the hub to the
    /// object's generation (a composite parent's does, as Metacontroller's).
    const SETS_OBSERVED_GENERATION: bool;

    fn core(&self) -> &Core<Self::Key>;
    /// The caches of the synced objects' types (the parent type; each target type), in type order.
    fn object_informers(&self) -> Vec<&Informer>;
    /// The key of an object of synced type `type_index`.
    fn key_of(&self, type_index: usize, obj: &DynamicObject) -> Self::Key;
    /// The synced type of `key`.
    fn type_of(&self, key: &Self::Key) -> usize;
    /// The cached object `key` stands for, and its type.
    fn object(&self, key: &Self::Key) -> Option<(Arc<DynamicObject>, Arc<ResolvedResource>)>;
    /// Whether the object `key` stands for is cached (without decoding it).
    fn contains(&self, key: &Self::Key) -> bool;
    /// Whether the object `key` stands for is cached at resourceVersion `version` (without decoding it).
    fn holds(&self, key: &Self::Key, version: &str) -> bool;
    /// Whether the controller selects `obj`, of synced type `type_index` (a deselected object with our
    /// finalizer is finalized).
    fn selects(&self, type_index: usize, obj: &DynamicObject) -> bool;
    /// Whether changes of `obj` that touch only its status are of no interest (`ignoreStatusChanges`).
    fn ignores_status_changes(&self, type_index: usize, obj: &DynamicObject) -> bool;
    /// Sees every event of a synced object before the engine maps it to the queue (the composite keeps
    /// its index of child selectors current with it).
    fn noticed(&self, _event: &Event) {}
    /// The objects to sync for a change of `child` (see `Core::child_event`).
    fn owners(&self, child: &DynamicObject, adopt: bool) -> Vec<Self::Key>;
    /// The hook a sync calls, if the controller has one (`finalizing`: the finalize hook).
    fn hook(&self, finalizing: bool) -> Option<&Endpoint>;
    /// The versions its hooks reported (`Metahook-Hook-Version`), which [`crate::engine::rollout`] follows.
    fn hook_versions(&self) -> &crate::hooks::HookVersions;
    /// Whether the controller has a finalize hook (it then puts its finalizer on what it syncs).
    fn has_finalize_hook(&self) -> bool;
    /// Whether objects may have children by label (`crossNamespace`), which the hub deletes itself.
    fn cleans_up(&self) -> bool {
        false
    }
    /// `resyncPeriodSeconds`.
    fn resync_period_seconds(&self) -> Option<i32>;
    /// The object's children (or attachments) as this kind claims them, by declared type, and what else
    /// it claims; `None` when the object went away meanwhile.
    fn observe(
        &self,
        obj: &DynamicObject,
        resource: &ResolvedResource,
    ) -> impl Future<Output = Result<Option<Observation<Self::Claimed>>, SyncError>> + Send;
    /// Whether a request is identified by what it shows (see [`crate::engine::answered`]); not with
    /// rolling updates, whose requests come from `ControllerRevision`s too.
    fn identifies_requests(&self) -> bool {
        true
    }
    /// Asks the hook and checks its answer whole (`claimed`: what `observe` claimed besides the
    /// children). Writes nothing.
    fn decide(
        &self,
        obj: &DynamicObject,
        resource: &ResolvedResource,
        call: Call<'_>,
        claimed: &Self::Claimed,
    ) -> impl Future<Output = Result<Decision<Self::Before>, SyncError>> + Send;
    /// What `child`, found in the cache under a desired name but not observed, is to `obj`: its own (its
    /// creation's echo was not cached yet), its own held in a deletion by someone, or someone else's
    /// (read by [`crate::write::children::in_the_way`]).
    fn whose(&self, obj: &DynamicObject, child: &DynamicObject) -> crate::write::children::Claim;
    /// Whether `obj` (of type `resource`) adopts `child` as its own were it to see it: an orphan its
    /// selector selects. A decorator adopts nothing.
    fn adopts(&self, _obj: &DynamicObject, _resource: &ResolvedResource, _child: &DynamicObject) -> bool {
        false
    }
    /// Whether the garbage collector orphaned the children of `obj`, being deleted, that it owned in its
    /// namespace (read live; see [`crate::engine::orphaning::Orphaned`]). A decorator owns none.
    fn orphaned_by_collector(&self, _obj: &DynamicObject) -> impl Future<Output = Result<bool, SyncError>> + Send {
        std::future::ready(Ok(false))
    }
    /// The caches of types whose changes sync objects without being their children (a MapController's
    /// inputs), in input order.
    fn input_informers(&self) -> Vec<&Informer> {
        Vec::new()
    }
    /// The objects to sync for a change of `obj`, of input type `input` (the parents selecting it).
    fn readers(&self, _input: usize, _obj: &DynamicObject) -> Vec<Self::Key> {
        Vec::new()
    }
    /// The answer of the sync of `key` was written in full (every child write succeeded): what the kind
    /// keeps of its own about requests answered (a MapController's per input) may say so now, even when
    /// the decision refused a part ([`Decision::refused`]).
    fn applied(&self, _key: &Self::Key) {}
}

/// What `Kind::observe` claims: the children (or attachments) by declared type, and what else the kind
/// claims (`Kind::Claimed`).
pub(crate) type Observation<C> = (Vec<ChildMap<Arc<DynamicObject>>>, C);

/// What a sync asks its hook.
#[derive(Clone, Copy)]
pub(crate) struct Call<'a> {
    pub endpoint: &'a Endpoint,
    pub children: &'a ObjectMaps,
    pub related: &'a ObjectMaps,
    pub finalizing: bool,
    pub observed: &'a [ChildMap<Arc<DynamicObject>>],
    /// The sync came back by its delay or was requested (a resync, a retry): what the kind saves
    /// for identical requests of its own is asked again too (see [`crate::engine::answered`]).
    pub asks_again: bool,
    /// The object's last sync failed, and nobody requested this one: it is that sync's retry (the
    /// worker schedules no resync after a failure, and of two delays the earlier one wins). A kind that
    /// asks its hook in parts (a MapController's inputs) asks again only the parts not answered in full.
    pub retrying: bool,
}

/// What a hook is asked about an object: its children (or attachments) and related objects, as the
/// request maps show them, and whether it is finalizing. Each kind's `Ask` takes it, from the engine's
/// `Call` or from `metahook render` and `migrate --dry-run`.
#[derive(Clone, Copy)]
pub struct Observed<'a> {
    pub children: &'a ObjectMaps,
    pub related: &'a ObjectMaps,
    pub finalizing: bool,
}

impl<'a> From<Call<'a>> for Observed<'a> {
    fn from(call: Call<'a>) -> Self {
        Self { children: call.children, related: call.related, finalizing: call.finalizing }
    }
}

/// The first step of starting any controller: it needs a sync or a finalize hook, and its hooks (sync,
/// finalize, customize) ready to call (settings checked, credentials watched).
pub(crate) fn controller_hooks(
    hub: &Hub,
    kind: &str,
    name: &str,
    hooks: Option<[Option<&crate::api::Hook>; 3]>,
    endpoint_configs: &[crate::api::EndpointConfig],
) -> Result<ControllerHooks, StartError> {
    let hooks = check_hooks(hooks)?;
    Ok(hub.hooks.controller_hooks(kind, name, hooks, endpoint_configs)?)
}

/// A controller needs a sync or a finalize hook (of `[sync, finalize, customize]`): what of its start
/// needs no cluster, also checked when controllers are read from files.
pub fn check_hooks(
    hooks: Option<[Option<&crate::api::Hook>; 3]>,
) -> Result<[Option<&crate::api::Hook>; 3], StartError> {
    let hooks = hooks.ok_or(StartError::NoHooks)?;
    let [sync, finalize, _] = hooks;
    if sync.is_none() && finalize.is_none() {
        return Err(StartError::NoHooks);
    }
    Ok(hooks)
}

/// The declared child (or attachment) types, resolved, each with the update method `method` says;
/// `role` names them in the error when one is not served.
pub(crate) async fn child_types(
    hub: &Hub,
    rules: &[crate::api::ChildResourceRule],
    role: &'static str,
    method: impl Fn(UpdateMethod) -> UpdateMethod,
) -> Result<Vec<ChildType>, StartError> {
    let mut types = Vec::with_capacity(rules.len());
    for rule in rules {
        let resource = hub
            .discovery
            .resolve(&rule.api_version, &rule.resource)
            .await
            .map_err(|source| StartError::NotFound { role, source })?;
        within_namespaces(hub, role, &resource)?;
        let informer = hub.informers.get(&resource, Role::Child);
        types.push(ChildType::new(rule, method(rule.method()), informer));
    }
    Ok(types)
}

/// Refuses a cluster-scoped type on a hub limited to some namespaces: its watch would be cluster-wide.
/// Checked before any watch of the controller starts, so a refused controller lists nothing.
pub(crate) fn within_namespaces(hub: &Hub, role: &'static str, resource: &ResolvedResource) -> Result<(), StartError> {
    let namespaces = hub.informers.namespaces();
    if resource.namespaced || namespaces.is_empty() {
        return Ok(());
    }
    Err(StartError::ClusterScoped {
        role,
        resource: format!("{}.{}", resource.api_resource.plural, resource.api_version()),
        namespaces: namespaces.join(","),
    })
}

/// What a hook's answer, checked whole, asks to be written.
pub(crate) struct Decision<B> {
    /// The desired children by declared type.
    pub desired: Vec<ChildMap<Value>>,
    /// The status to write (`None`: leave it as it is).
    pub status: Option<Value>,
    /// A merge patch of the object's labels and annotations (`None`: none).
    pub metadata: Option<Value>,
    pub resync: Option<Duration>,
    pub finalized: bool,
    pub events: Vec<HookEvent>,
    /// Written before any child, once the whole sync is known to be writable.
    pub before: Option<B>,
    /// The observed children this decision is about, by declared type; the others are left as they
    /// are, neither written nor deleted (a MapController's outputs of inputs not asked, or whose answer
    /// was refused). `None`: every observed child.
    pub scope: Option<Vec<ChildMap<Arc<DynamicObject>>>>,
    /// A part of the answer refused (one input's, of a MapController): the rest is written, then the
    /// sync fails with this error (retried, backing off) — all-or-nothing per part.
    pub refused: Option<SyncError>,
}

impl<B> Decision<B> {
    /// A hook's answer taken whole: `desired`, `status` and `metadata` as answered, with the hook's
    /// `resync`, `finalized` and `events`; nothing written before the children, every observed child in
    /// scope, nothing refused.
    pub(crate) fn whole(
        desired: Vec<ChildMap<Value>>,
        status: Option<Value>,
        metadata: Option<Value>,
        resync: Option<Duration>,
        finalized: bool,
        events: Vec<HookEvent>,
    ) -> Self {
        Self { desired, status, metadata, resync, finalized, events, before: None, scope: None, refused: None }
    }
}

/// Writes that go before the children's.
pub(crate) trait Before: Send + Sync {
    /// Whether persisting writes anything.
    fn writes(&self, applier: &Applier) -> bool;
    fn persist(&self, applier: &Applier) -> impl Future<Output = Result<(), ApplyError>> + Send;
}

/// Nothing before the children.
impl Before for () {
    fn writes(&self, _: &Applier) -> bool {
        false
    }

    async fn persist(&self, _: &Applier) -> Result<(), ApplyError> {
        Ok(())
    }
}

/// What the engine keeps for one running controller, whatever its kind.
pub(crate) struct Core<K> {
    pub hub: Hub,
    /// `CompositeController` or `DecoratorController`.
    pub kind: &'static str,
    /// The controller object's name.
    pub name: String,
    pub queue: WorkQueue<K>,
    pub metrics: Arc<ControllerMetrics>,
    /// Sync requests (`metahook.dev/sync-requested-at`) waiting for a successful sync.
    pub requests: SyncRequests<K>,
    pub related: Arc<Related<K>>,
    /// What this controller's syncs wrote, to tell the echo from others' changes.
    pub echoes: Echoes<K>,
    /// What the controller object's annotations set (which echoes sync, the safe-delete guard): read
    /// at start and replaced whenever the annotations change (see [`Core::configure`]).
    settings: std::sync::RwLock<Settings>,
    /// Each object's last hook request, and whether its answer was applied in full.
    pub answered: Answered<K>,
    /// The permanent hook errors reported, so each is reported once.
    pub held: Held<K>,
    /// The finalizer this controller puts on the objects it syncs.
    pub finalizer: String,
    /// The declared child (or attachment) types.
    pub children: Vec<ChildType>,
    /// Their resolved types, computed once (every sync needs them).
    pub child_resources: Vec<Arc<ResolvedResource>>,
    /// The canary of the sync hook, if the controller object's annotation starts one.
    pub canary: Canary,
    /// The deletions the objects' events showed, and whether they orphan (see [`crate::engine::orphaning`]).
    deletions: Deletions,
    /// Read from a file (`controllersFrom`): there is no controller object in the API to write a status to.
    pub from_file: bool,
    /// The records of the parents' children elsewhere, when a child type is `crossNamespace` (see
    /// [`crate::engine::elsewhere`]).
    pub records: Option<Arc<Records>>,
}

/// What a controller object's annotations set for the engine (each documented as a setting, each read
/// live).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Settings {
    /// Which echoes sync their object (`metahook.dev/sync-on-own-writes`).
    pub echo_policy: EchoPolicy,
    /// The safe-delete guard (`metahook.dev/max-deletions-per-sync`).
    pub deletion_guard: Option<DeletionGuard>,
}

impl Settings {
    /// The settings `annotations` give; an invalid value is refused with the annotation's name.
    pub fn from_annotations(annotations: Option<&std::collections::BTreeMap<String, String>>) -> Result<Self, String> {
        Ok(Self {
            echo_policy: EchoPolicy::from_annotations(annotations)?,
            deletion_guard: DeletionGuard::from_annotations(annotations)?,
        })
    }

    /// The annotations that are settings, of `annotations` (what a change of must reach the controller).
    #[must_use]
    pub fn annotations(
        annotations: Option<&std::collections::BTreeMap<String, String>>,
    ) -> std::collections::BTreeMap<String, String> {
        const SETTINGS: [&str; 3] = [
            crate::engine::echoes::SYNC_ON_OWN_WRITES_ANNOTATION,
            crate::write::children::MAX_DELETIONS_ANNOTATION,
            crate::engine::canary::CANARY_ANNOTATION,
        ];
        annotations
            .into_iter()
            .flatten()
            .filter(|(name, _)| SETTINGS.contains(&name.as_str()))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect()
    }
}

/// How a controller object configures the engine's part.
pub(crate) struct CoreSettings<'a> {
    /// `CompositeController` or `DecoratorController`.
    pub kind: &'static str,
    pub name: String,
    pub annotations: Option<&'a std::collections::BTreeMap<String, String>>,
    pub finalizer: String,
    pub children: Vec<ChildType>,
    /// The `customize` hook, if any, and the controller object as hooks receive it.
    pub customize: Option<Endpoint>,
    pub controller: Value,
    /// The `sync` hook and the `endpointConfigs` a canary's candidate takes its settings from.
    pub sync_hook: Option<crate::api::Hook>,
    pub endpoint_configs: Vec<crate::api::EndpointConfig>,
    /// The records of children elsewhere, for a controller with a `crossNamespace` child type.
    pub records: Option<Records>,
    /// What the `customize` hook's related rules may reach (`relatedLimit`).
    pub related_limit: Option<crate::api::RelatedLimit>,
}

impl<K: Clone + Eq + Hash + Display + crate::engine::queue::Flowing + Send + Sync + 'static> Core<K> {
    pub fn new(hub: &Hub, settings: CoreSettings<'_>) -> Result<Self, String> {
        let CoreSettings {
            kind,
            name,
            annotations,
            finalizer,
            children,
            customize,
            controller,
            sync_hook,
            endpoint_configs,
            records,
            related_limit,
        } = settings;
        let settings = Settings::from_annotations(annotations)?;
        let from_file = annotations.is_some_and(|a| a.contains_key(crate::api::FROM_FILE_ANNOTATION));
        let (queue, metrics, enqueue) = controller_queue(hub, kind, &name);
        let canary = CanarySettings {
            kind,
            name: &name,
            base: sync_hook,
            endpoint_configs,
            controller: &controller,
            annotations,
            from_file,
        };
        let canary = Canary::new(hub, Arc::clone(&metrics), canary);
        Ok(Self {
            canary,
            deletions: Deletions::default(),
            related: Related::new(hub.clone(), customize, related_limit, controller, enqueue),
            hub: hub.clone(),
            kind,
            name,
            queue,
            metrics,
            requests: SyncRequests::default(),
            echoes: Echoes::default(),
            settings: std::sync::RwLock::new(settings),
            answered: Answered::default(),
            held: Held::default(),
            finalizer,
            child_resources: resources(&children),
            children,
            from_file,
            records: records.map(Arc::new),
        })
    }

    /// What the controller's annotations set now.
    pub fn settings(&self) -> Settings {
        *self.settings.read().expect("settings lock")
    }

    /// Takes the settings of the controller object's `annotations` from now on (they are live: a
    /// change needs no restart); an invalid value is refused, and the settings stay as they were.
    pub fn configure(&self, annotations: Option<&std::collections::BTreeMap<String, String>>) -> Result<(), String> {
        let settings = Settings::from_annotations(annotations)?;
        *self.settings.write().expect("settings lock") = settings;
        self.canary.configure(annotations);
        Ok(())
    }

    /// Queues `key` for a change made by someone else.
    pub fn enqueue(&self, key: K) {
        self.queue.add(key);
    }

    /// Queues `key` for what a watch showed: a change made by someone else, or, found by a list
    /// (`relisted`: a start, a relist, a bucket moved here), work that waits behind the changes seen live.
    pub fn enqueue_seen(&self, key: K, relisted: bool) {
        self.queue.add_for(key, if relisted { Reason::Relist } else { Reason::Change });
    }

    /// Queues `key` for the echo of its own sync's write, unless the controller said its hook needs no
    /// such sync (see [`crate::engine::echoes`]).
    pub fn enqueue_echo(&self, key: K, echo: Echo) {
        if self.settings().echo_policy.syncs(echo) {
            if !self.queue.add_echo(key) {
                tracing::trace!(?echo, "echo of a failing sync's own write; its backoff retry sees it");
                self.metrics.hook_call_saved(crate::engine::metrics::Saved::BackingOff);
            }
        } else {
            tracing::trace!(object = %key, ?echo, "echo of own write; the controller needs no sync for it");
            self.metrics.hook_call_saved(crate::engine::metrics::Saved::OwnWrite);
        }
    }

    /// Acts on what a settled write found held: its echo, and changes by others.
    fn settle(&self, settled: Settled<K>, echo: Echo) {
        if let Some(key) = settled.foreign {
            self.enqueue(key);
        }
        if let Some(key) = settled.echo {
            self.enqueue_echo(key, echo);
        }
    }

    /// A watch event of a synced object (parent or target) of key `key`: queued unless it changes nothing
    /// the controller acts on (same version; under `ignoreStatusChanges`, nothing but status) or is the
    /// echo of its own write. `selected`: the controller selects it; deselected objects matter only while
    /// they carry our finalizer. A deletion forgets everything kept about the object.
    pub fn object_event(&self, key: K, type_index: usize, event: &Event, selected: bool, ignore_status: bool) {
        let watched = Watched::Object(type_index);
        let Event { change, relisted } = event;
        if self.hub.shard.is_some() {
            match change {
                Change::Applied { old: None, .. } => self.hub.metrics.shard.parent_arrived(),
                Change::Deleted(_) => self.hub.metrics.shard.parent_left(),
                Change::Applied { .. } => {}
            }
        }
        let new = match change {
            Change::Deleted(obj) => {
                self.deletions.forget(obj.metadata.uid.as_deref().unwrap_or_default());
                self.canary.forget(obj.metadata.uid.as_deref().unwrap_or_default());
                if let Some(records) = &self.records {
                    // A hub stopped between the parent's finalizer and the record's leaves this to do.
                    if let Some(record) = records.of(obj).filter(|r| r.finalized) {
                        let records = Arc::clone(records);
                        tokio::spawn(async move { elsewhere::release(&records, Some(&record)).await });
                    }
                }
                self.related.forget(&key);
                self.requests.forget(&key);
                self.echoes.forget(&key);
                self.answered.forget(&key);
                self.held.clear(&key);
                if selected || has_finalizer(obj, &self.finalizer) {
                    self.enqueue_seen(key, *relisted);
                }
                return;
            }
            Change::Applied { new, .. } => new,
        };
        // The garbage collector takes `orphan` off once it has orphaned the owned children, which may be
        // before this object's sync: noted before the object is queued, so its sync knows.
        self.deletions.observe(new);
        if !selected && !has_finalizer(new, &self.finalizer) {
            return;
        }
        let Change::Applied { old, new } = change else { return };
        if self.requests.observe(&key, old.as_deref(), new) {
            self.enqueue(key);
            return;
        }
        if old.as_deref().is_some_and(|old| old.metadata.resource_version == new.metadata.resource_version) {
            return;
        }
        let status_only = ignore_status && old.as_deref().is_some_and(|old| !meaningful_parent_change(old, new));
        let object = ObjectKey::of(new);
        if *relisted {
            self.echoes.forget_object(watched, &object);
            if !status_only {
                self.enqueue_seen(key, true);
            }
            return;
        }
        let version = new.metadata.resource_version.as_deref().unwrap_or_default();
        // Classified even when it is ignored (`ignoreStatusChanges`): the echo of the hub's own status write
        // is mostly a change of status only, and its record, left unseen, would keep every later sync from
        // putting back a status someone else wrote.
        let seen = self.echoes.classify(watched, &object, version);
        if status_only {
            return;
        }
        match seen {
            Seen::Echo(_) => self.enqueue_echo(key, Echo::Parent),
            Seen::Held => {}
            Seen::Other => self.enqueue(key),
        }
    }

    /// A watch event of a child (or attachment) of declared type `index`: the echo of this controller's
    /// own write queues its object as an echo; anything else queues the objects `owners` names — the
    /// owner the child had before too, when its controller changed. `owners(child, adopt)`: the object
    /// controlling `child`, or with `adopt`, for an orphan, those that would adopt it.
    pub fn child_event(&self, index: usize, event: &Event, owners: impl Fn(&DynamicObject, bool) -> Vec<K>) {
        let Event { change, relisted } = event;
        let object = ObjectKey::of(change.object());
        if *relisted {
            self.echoes.forget_object(Watched::Child(index), &object);
        }
        let (child, version, adopt) = match change {
            Change::Applied { old: Some(old), new } => {
                if old.metadata.resource_version == new.metadata.resource_version {
                    return;
                }
                // Ownership may have moved: the previous owner must see its child go.
                if controller_uid(old) != controller_uid(new) {
                    for key in owners(old, false) {
                        self.enqueue_seen(key, *relisted);
                    }
                }
                (new, new.metadata.resource_version.clone(), true)
            }
            Change::Applied { old: None, new } => (new, new.metadata.resource_version.clone(), true),
            Change::Deleted(obj) => {
                self.hub.applier.forget(&self.child_resources[index], &object);
                (obj, obj.metadata.uid.as_deref().map(deleted_version), false)
            }
        };
        let seen = match version {
            Some(version) if !relisted => match self.echoes.classify(Watched::Child(index), &object, &version) {
                Seen::Echo(key) => {
                    self.enqueue_echo(key, Echo::of_child(&version));
                    return;
                }
                seen => seen,
            },
            _ => Seen::Other,
        };
        if seen == Seen::Other {
            for key in owners(child, adopt) {
                self.enqueue_seen(key, *relisted);
            }
        }
    }

    /// The labels a record of `parent`'s children elsewhere carries besides its controller's: the
    /// parent's bucket when sharded, so it is in the cache of whoever holds the parent.
    fn record_labels(&self, parent: &DynamicObject) -> std::collections::BTreeMap<String, String> {
        let Some(shard) = &self.hub.shard else { return std::collections::BTreeMap::new() };
        let mut stamped = serde_json::json!({"metadata": {}});
        shard.stamp(&mut stamped, parent.metadata.uid.as_deref().unwrap_or_default());
        serde_json::from_value(stamped["metadata"]["labels"].clone()).unwrap_or_default()
    }

    /// Whether the garbage collector orphaned `parent`'s record of children elsewhere (read live): it
    /// does so only under `--cascade=orphan`. A parent with no record has nothing to say here.
    async fn record_orphaned(&self, parent: &DynamicObject) -> Result<bool, SyncError> {
        let Some(records) = &self.records else { return Ok(false) };
        let live = records
            .live(parent)
            .await
            .map_err(|e| SyncError::Claim(Box::new(crate::write::children::ClaimError::Record(Box::new(e)))))?;
        Ok(live.is_some_and(|record| record.orphaned(parent.metadata.uid.as_deref().unwrap_or_default())))
    }

    /// The end of a deleted object, once its finalize hook (if any) let go: its children elsewhere dealt
    /// with ([`elsewhere::let_go`]: deleted, or released with `orphan`), then the hub's finalizer
    /// removed, then the record's. A child still there (changed since observed) leaves the finalizer on;
    /// its event syncs the object again.
    async fn finish_deletion(
        &self,
        key: &K,
        type_index: usize,
        obj: &DynamicObject,
        (api, resource): (&Api<DynamicObject>, &ResolvedResource),
        orphan: bool,
    ) -> Result<(), SyncError> {
        let known = self.records.as_deref().map(|records| elsewhere::known(records, obj, &self.finalizer));
        if let Some(known) = &known {
            let (client, applier) = (&self.hub.client, &self.hub.applier);
            if !elsewhere::let_go(client, applier, obj, resource, &self.children, known.elsewhere(), orphan).await? {
                return Ok(());
            }
            if let Some(record) = &known.record {
                let discovery = &self.hub.discovery;
                let parent = (obj, resource);
                elsewhere::let_go_undeclared(client, discovery, applier, parent, &self.children, record, orphan)
                    .await?;
            }
        }
        self.write_object(key, (type_index, &ObjectKey::of(obj)), remove_finalizer(api, obj, &self.finalizer)).await?;
        if let Some(records) = &self.records {
            // Live: the collector may have orphaned it since the cache's copy (then it is deleted here).
            match records.live(obj).await {
                Ok(record) => elsewhere::release(records, record.as_ref()).await,
                Err(e) => warn!("could not read the record of children elsewhere to release it: {e}"),
            }
        }
        Ok(())
    }

    /// Writes to the object itself (status, labels), announced to the echoes.
    async fn write_object(
        &self,
        key: &K,
        object: (usize, &ObjectKey),
        write: impl Future<Output = Result<Option<String>, SyncError>>,
    ) -> Result<(), SyncError> {
        self.write_object_saying(key, object, None, write).await
    }

    /// [`Core::write_object`], remembering while its echo is unseen that the write said `digest`.
    async fn write_object_saying(
        &self,
        key: &K,
        (type_index, object): (usize, &ObjectKey),
        digest: Option<u64>,
        write: impl Future<Output = Result<Option<String>, SyncError>>,
    ) -> Result<(), SyncError> {
        let watched = Watched::Object(type_index);
        self.echoes.begin(key, watched, object);
        let result = write.await;
        let version = result.as_ref().ok().and_then(Option::as_deref);
        let settled = match digest {
            Some(digest) => self.echoes.settle_saying(watched, object, version, digest),
            None => self.echoes.finish(watched, object, version),
        };
        self.settle(settled, Echo::Parent);
        result.map(drop)
    }
}

/// The journal of one sync's child writes: each announced to the controller's echoes before it is sent
/// and settled when it returns, so its echo is told from others' changes.
struct Journal<'a, K> {
    core: &'a Core<K>,
    key: &'a K,
}

impl<K: Clone + Eq + Hash + Display + crate::engine::queue::Flowing + Send + Sync + 'static> WriteObserver
    for Journal<'_, K>
{
    fn started(&self, type_index: usize, child: &ObjectKey) {
        self.core.echoes.begin(self.key, Watched::Child(type_index), child);
    }

    fn finished(&self, type_index: usize, child: &ObjectKey, version: Option<&str>) {
        let settled = self.core.echoes.finish(Watched::Child(type_index), child, version);
        self.core.settle(settled, version.map_or(Echo::Write, Echo::of_child));
    }

    fn behind(&self, type_index: usize, child: &ObjectKey) -> bool {
        self.core.echoes.unseen(Watched::Child(type_index), child)
    }
}

/// What a sync's observe phase found: the object and its finalizer decision, the hook to ask and what
/// it is asked about, and what the kind claimed besides the children (for `decide`).
pub(crate) struct Observing<C: Kind> {
    pub obj: Arc<DynamicObject>,
    pub resource: Arc<ResolvedResource>,
    api: Api<DynamicObject>,
    pub finalizing: bool,
    /// The hook to ask: the controller's, or a canary's candidate.
    endpoint: Endpoint,
    /// The side of a canary this sync is on, if one runs.
    pub canary: Option<Pick>,
    pub observed: Vec<ChildMap<Arc<DynamicObject>>>,
    pub claimed: C::Claimed,
    /// Being deleted with `--cascade=orphan`: the children are the user's to keep, none is written.
    pub orphaning: bool,
    /// The children as the request shows them.
    pub children: ObjectMaps,
    pub related: ObjectMaps,
}

/// The observe phase of a sync of `key` (in an `observe` span: a trace shows how long the cache reads,
/// the finalizer and the customize hook took). `None`: nothing to sync, the object went away.
async fn observe<C: Kind>(kind: &C, key: &C::Key) -> Result<Option<Observing<C>>, SyncError> {
    let core = kind.core();
    let Some((obj, resource)) = kind.object(key) else { return Ok(None) };
    let api = api_for(&core.hub.client, &resource, &obj);
    let facts = Facts {
        finalize_hook: kind.has_finalize_hook(),
        cleanup: kind.cleans_up(),
        selected: kind.selects(kind.type_of(key), &obj),
        has_finalizer: has_finalizer(&obj, &core.finalizer),
        deleting: obj.metadata.deletion_timestamp.is_some(),
    };
    let object = ObjectKey::of(&obj);
    if let Some(records) = &core.records
        && !facts.deleting
        && matches!(crate::engine::finalizer::plan(facts), Step::Sync { finalizing: false, .. })
    {
        // The parent's record of its children elsewhere exists before its finalizer does.
        let known = elsewhere::known(records, &obj, &core.finalizer);
        let labels = core.record_labels(&obj);
        elsewhere::prepare(records, &obj, &resource, &core.children, &known, labels).await?;
    }
    let record = |write| core.write_object(key, (kind.type_of(key), &object), write);
    let Some(finalizing) = follow_plan(&api, &obj, &core.finalizer, facts, record).await? else { return Ok(None) };
    let orphaning = if finalizing && facts.deleting {
        match orphaning(kind, key, &obj, &api).await? {
            Some(orphaning) => orphaning,
            // A sync ahead of the object's events decides nothing; the event queues the object again.
            None => return Ok(None),
        }
    } else {
        false
    };
    if finalizing && kind.hook(true).is_none() {
        // Deleted, with children elsewhere and no finalize hook to ask: they go, then the finalizer.
        core.finish_deletion(key, kind.type_of(key), &obj, (&api, &resource), orphaning).await?;
        return Ok(None);
    }
    let canary = core.canary.pick(obj.metadata.uid.as_deref().unwrap_or_default(), finalizing);
    let endpoint = match canary.as_ref().and_then(Pick::candidate) {
        Some(candidate) => candidate.clone(),
        None => kind.hook(finalizing).ok_or(SyncError::NoSyncHook)?.clone(),
    };
    let Some((observed, claimed)) = kind.observe(&obj, &resource).await? else { return Ok(None) };
    let version: HookVersion = endpoint.version();
    let namespace = resource.namespaced.then_some(obj.metadata.namespace.as_deref()).flatten();
    let related = match core.related.gather(key, &obj, ParentScope { namespace, version }).await {
        Ok(related) => related,
        Err(SyncError::Hook(e)) if e.permanent_message().is_some() => {
            return Err(hold(kind, key, &obj, &api, &resource, e).await);
        }
        Err(e) => return Err(e),
    };
    let children = request_map(&core.child_resources, version, namespace, &observed);
    Ok(Some(Observing {
        obj,
        resource,
        api,
        finalizing,
        endpoint,
        canary,
        observed,
        claimed,
        orphaning,
        children,
        related,
    }))
}

/// Whether `obj`, being deleted and finalized by `kind`, is deleted with `--cascade=orphan`, recorded in
/// the API before anything else is done for it ([`crate::engine::orphaning`]). `None`: the object's
/// events have not shown the deletion yet, so nothing is decided.
async fn orphaning<C: Kind>(
    kind: &C,
    key: &C::Key,
    obj: &DynamicObject,
    api: &Api<DynamicObject>,
) -> Result<Option<bool>, SyncError> {
    let core = kind.core();
    let orphaning = match Intent::of(obj, &core.deletions) {
        Intent::Unseen => return Ok(None),
        Intent::Orphan => true,
        // The record of the children elsewhere is the parent's own dependent: the collector orphans it
        // too, which says the intent when no child is in the parent's namespace.
        Intent::NotShown => core.record_orphaned(obj).await? || kind.orphaned_by_collector(obj).await?,
    };
    if orphaning && !crate::engine::orphaning::recorded(obj) {
        core.write_object(key, (kind.type_of(key), &ObjectKey::of(obj)), Intent::record(api, obj)).await?;
    }
    Ok(Some(orphaning))
}

/// One sync of `key` (see the module doc). Sharded, only an object of a bucket this replica holds is
/// synced ([`Synced::Elsewhere`] otherwise), and the bucket is not let go while the sync runs (the
/// guard lives until it returns).
pub(crate) async fn sync<C: Kind>(kind: &C, key: &C::Key, reasons: Reasons) -> Result<Synced, SyncError> {
    let mut _entered = None;
    if let Some(shard) = &kind.core().hub.shard
        && let Some((obj, _)) = kind.object(key)
    {
        match shard.held.enter(obj.metadata.uid.as_deref().unwrap_or_default()).await {
            Some(guard) => _entered = Some(guard),
            None => return Ok(Synced::Elsewhere),
        }
    }
    sync_here(kind, key, reasons).await.map(Synced::Done)
}

/// [`sync`] of an object this replica holds; returns when to sync it again, if the hook asked.
async fn sync_here<C: Kind>(kind: &C, key: &C::Key, reasons: Reasons) -> Result<Option<Duration>, SyncError> {
    let core = kind.core();
    let observing = match observe(kind, key).instrument(info_span!(target: crate::TRACE_SPANS, "observe")).await {
        Ok(observing) => observing,
        Err(error) => {
            if let Some((obj, _)) = kind.object(key) {
                core.canary.unreached(obj.metadata.uid.as_deref().unwrap_or_default(), &error);
            }
            return Err(error);
        }
    };
    let Some(observing) = observing else {
        return Ok(None);
    };
    let request = kind.identifies_requests().then(|| {
        let Observing { obj, endpoint, finalizing, children, related, .. } = &observing;
        RequestId::of(endpoint.url(), obj, *finalizing, children, related)
    });
    if !ask_hook(&core.answered, &core.metrics, key, request, reasons) {
        return Ok(None);
    }
    let mut writes = 0;
    let retrying = core.queue.failures(key) > 0 && !reasons.has(Reason::Requested);
    let result = answer(kind, key, &observing, (reasons.asks_again(), retrying), &mut writes).await;
    crate::engine::canary::settle(kind, &observing, request, &result, writes).await;
    result
}

/// The rest of a sync that asks its hook: decide, act and record (see the module doc). `writes` counts
/// the children written, whatever the outcome.
async fn answer<C: Kind>(
    kind: &C,
    key: &C::Key,
    observing: &Observing<C>,
    (asks_again, retrying): (bool, bool),
    writes: &mut usize,
) -> Result<Option<Duration>, SyncError> {
    let core = kind.core();
    let Observing { obj, resource, api, finalizing, endpoint, observed, claimed, orphaning, children, related, .. } =
        observing;
    let finalizing = *finalizing;

    // Decide.
    let call = Call { endpoint, children, related, finalizing, observed, asks_again, retrying };
    let mut decision = match kind.decide(obj, resource, call, claimed).await {
        Ok(decision) => decision,
        Err(SyncError::Hook(e)) if e.permanent_message().is_some() => {
            return Err(hold(kind, key, obj, api, resource, e).await);
        }
        Err(e) => return Err(e),
    };
    core.held.clear(key);
    if let Some(shard) = &core.hub.shard {
        // Every child carries its parent's bucket: it is in the watch of whoever holds the parent.
        let uid = obj.metadata.uid.as_deref().unwrap_or_default();
        decision
            .desired
            .iter_mut()
            .flat_map(|children| children.values_mut())
            .for_each(|child| shard.stamp(child, uid));
    }
    let narrowed = narrowed(kind, observing, &decision)?;
    if let Some(refused) = narrowed.as_ref().and_then(|n| refused_namespaces(&n.refused, &decision.desired)) {
        // Written around, and said: the sync fails (and backs off) once the rest is written.
        warn!("{}", with_causes(&refused));
        decision.refused = Some(match (decision.refused.take(), refused) {
            (Some(SyncError::Parts(mut earlier)), SyncError::Parts(more)) => {
                earlier.extend(more);
                SyncError::Parts(earlier)
            }
            (_, refused) => refused,
        });
    }
    let adopts = |child: &DynamicObject| kind.adopts(obj, resource, child);
    let plan = planned(kind, observing, (&decision, narrowed.as_ref()), &adopts)?;
    let (_, desired) = answered_parts(observing, &decision, narrowed.as_ref());

    // Act.
    record_hook_events(&core.hub.events, obj, &decision.events).await;
    let wanted = match &core.records {
        Some(_) => elsewhere::desired_elsewhere(obj, resource, &core.children, desired),
        None => std::collections::BTreeSet::new(),
    };
    let executed = match &plan {
        Some(plan) => act_on_children(kind, key, obj, resource, plan, decision.before.as_ref(), &wanted).await?,
        None => Some(Executed::default()),
    };
    let Some(executed) = executed else {
        return Ok(None);
    };
    *writes = executed.writes.len();
    for dropped in &executed.dropped {
        warn!("{dropped}");
        core.hub.events.warning(&reference(obj), "UnknownFieldsDropped", dropped.to_string()).await;
    }
    let object = ObjectKey::of(obj);
    let object = (kind.type_of(key), &object);
    if let Some(status) = decision.status {
        let how = StatusWrite { subresource: resource.has_status, observed_generation: C::SETS_OBSERVED_GENERATION };
        // The cache may show the object from before this controller's last status write (the echo of a
        // child write came first): if that write said this very status, writing it again changes nothing.
        // A change by someone else after it comes after its echo, and syncs the object again.
        let digest = digest_of(&status);
        if core.echoes.unseen_saying(Watched::Object(object.0), object.1) == Some(digest) {
            debug!("status as the last write said it, whose echo has not come: not written again");
        } else {
            core.write_object_saying(key, object, Some(digest), replace_status(api, obj, status, how)).await?;
        }
    }
    if let Some(patch) = decision.metadata {
        core.write_object(key, object, patch_metadata(api, obj, &patch)).await?;
    }

    // Record. A finalizing sync does not wait for what cannot exist any more: a child its answer keeps
    // in a namespace being deleted cannot be created there again, and that namespace's deletion waits
    // for this parent, which waits for this sync.
    let mut errors = executed.errors;
    if finalizing {
        errors.retain(|e| {
            let gone = e.namespace_terminating();
            if gone {
                info!("{e}: its namespace is being deleted, finalizing without it");
            }
            !gone
        });
    }
    if !errors.is_empty() {
        return Err(SyncError::Apply(errors));
    }
    if finalizing && decision.finalized {
        core.finish_deletion(key, object.0, obj, (api, resource), *orphaning).await?;
    }
    if executed.writes.iter().any(|w| w.recreate) {
        // A child deleted to be recreated: the next sync creates it, whatever becomes of the echo.
        core.queue.add_for(key.clone(), Reason::Echo);
    }
    kind.applied(key);
    if let Some(refused) = decision.refused {
        return Err(refused);
    }
    core.answered.applied(key);
    Ok(decision.resync)
}

/// A digest of a JSON value, the same for equal values in this process (their canonical form hashed).
fn digest_of(value: &Value) -> u64 {
    use std::hash::Hasher as _;
    let mut hasher = std::hash::DefaultHasher::new();
    hasher.write(crate::api::json::canonical_json(value).as_bytes());
    hasher.finish()
}

/// The plan of a decision's child writes, refused whole before anything is written: a desired name
/// taken by an object that is not `obj`'s ([`Plan::new`]; `whose` and `adopts` say what is), or more
/// deletions than `guard` allows (`None` when finalizing: a finalize hook may delete everything). The
/// engine's sync and `metahook diff` both plan through it, so a preview refuses what a sync refuses.
///
/// `total`: how many children `obj` has in all (the guard's share is of those). Call it with what
/// [`narrow`] left of the answer, when it left something out.
#[allow(clippy::too_many_arguments)] // the plan's inputs, each its own thing; a struct would only rename them
pub(crate) fn plan<'a>(
    children: &'a [ChildType],
    observed: &'a [ChildMap<Arc<DynamicObject>>],
    desired: &'a [ChildMap<Value>],
    obj: &DynamicObject,
    guard: Option<DeletionGuard>,
    total: usize,
    whose: impl Fn(&DynamicObject) -> crate::write::children::Claim,
    adopts: crate::write::apply::Adopts<'a>,
) -> Result<Plan<'a>, SyncError> {
    let plan = Plan::new(children, observed, desired, whose, adopts)?.at_home(obj.metadata.namespace.as_deref());
    plan.check_guard(guard, obj, total)?;
    Ok(plan)
}

/// What of an answer may be written, for the engine's sync and a canary's shadow call alike (the
/// checks after the hook's own, [`Kind::decide`]): each namespace other than the parent's where a
/// desired child's name is someone else's is left out ([`crate::write::children::narrow`]). `None`:
/// all of it, or, under `--cascade=orphan`, none (the children are the user's now: the garbage
/// collector took this parent's ownerReferences off them, and the finalize hook's answer of children is
/// neither written nor checked against children that are no longer the parent's).
pub(crate) fn narrowed<C: Kind>(
    kind: &C,
    observing: &Observing<C>,
    decision: &Decision<C::Before>,
) -> Result<Option<Narrowed>, SyncError> {
    let Observing { obj, resource, observed, orphaning, .. } = observing;
    if *orphaning {
        return Ok(None);
    }
    let observed = decision.scope.as_deref().unwrap_or(observed);
    let whose = |child: &DynamicObject| kind.whose(obj, child);
    Ok(crate::write::children::narrow(&kind.core().children, observed, &decision.desired, obj, resource, whose)?)
}

/// The observed and desired children an answer is written with: what [`narrowed`] left of it.
fn answered_parts<'a, C: Kind>(
    observing: &'a Observing<C>,
    decision: &'a Decision<C::Before>,
    narrowed: Option<&'a Narrowed>,
) -> (&'a [ChildMap<Arc<DynamicObject>>], &'a [ChildMap<Value>]) {
    match narrowed {
        Some(narrowed) => (&narrowed.observed[..], &narrowed.desired[..]),
        None => (decision.scope.as_deref().unwrap_or(&observing.observed), &decision.desired[..]),
    }
}

/// The plan of an answer's writes ([`plan`]: the writes the cache shows to be allowed, the safe-delete
/// guard), of what [`narrowed`] left of it, `adopts` saying which orphans the parent adopts
/// ([`Kind::adopts`]); `None` under `--cascade=orphan` (nothing is written).
pub(crate) fn planned<'a, C: Kind>(
    kind: &'a C,
    observing: &'a Observing<C>,
    (decision, narrowed): (&'a Decision<C::Before>, Option<&'a Narrowed>),
    adopts: crate::write::apply::Adopts<'a>,
) -> Result<Option<Plan<'a>>, SyncError> {
    let Observing { obj, finalizing, observed, orphaning, .. } = observing;
    if *orphaning {
        return Ok(None);
    }
    let core = kind.core();
    let whose = |child: &DynamicObject| kind.whose(obj, child);
    let guard = (!finalizing).then(|| core.settings().deletion_guard).flatten();
    let total = children_count(observed);
    let (observed, desired) = answered_parts(observing, decision, narrowed);
    Ok(Some(plan(&core.children, observed, desired, obj, guard, total, whose, adopts)?))
}

/// How many children the observation lists, of every type: what the safe-delete guard's share is of.
pub(crate) fn children_count(observed: &[ChildMap<Arc<DynamicObject>>]) -> usize {
    observed.iter().map(std::collections::BTreeMap::len).sum()
}

/// The namespaces where a desired child's name is taken by someone else's object, left out of the
/// answer ([`crate::write::children::narrow`]) and said as the refused parts of the sync.
pub(crate) fn refused_namespaces(
    refused: &[crate::write::children::PlanError],
    desired: &[ChildMap<Value>],
) -> Option<SyncError> {
    let namespaces: std::collections::BTreeSet<Option<&str>> =
        desired.iter().flat_map(|children| children.keys().map(|k| k.namespace.as_deref())).collect();
    (!refused.is_empty()).then(|| {
        SyncError::Parts(vec![crate::engine::error::RefusedParts {
            what: "namespaces",
            total: namespaces.len(),
            left: "nothing written for them",
            failed: refused.iter().map(ToString::to_string).collect(),
        }])
    })
}

/// Reports a permanent hook error, once per message: a Warning Event and, where the status is the
/// hook's, a `Synced=False` condition. Nothing else is written; the error goes back to the worker,
/// which does not retry it.
async fn hold<C: Kind>(
    kind: &C,
    key: &C::Key,
    obj: &DynamicObject,
    api: &Api<DynamicObject>,
    resource: &ResolvedResource,
    error: HookError,
) -> SyncError {
    let core = kind.core();
    let message = error.permanent_message().unwrap_or_default().to_owned();
    let error = SyncError::Hook(error);
    if !core.held.note(key, obj.metadata.uid.as_deref().unwrap_or_default(), &message) {
        return error;
    }
    warn!("hook refused the {} for good: {}", C::OBJECT, with_causes(&error));
    core.hub.events.warning(&reference(obj), error.event_reason(), format!("Sync error: {error}")).await;
    if C::STATUS_IS_THE_HOOKS {
        let now = serde_json::to_value(Time(Timestamp::now())).unwrap_or_default();
        let status = held_status(obj, &message, now.as_str().unwrap_or_default());
        let how = StatusWrite { subresource: resource.has_status, observed_generation: false };
        let write = replace_status(api, obj, status, how);
        if let Err(e) = core.write_object(key, (kind.type_of(key), &ObjectKey::of(obj)), write).await {
            warn!("could not say the hook's permanent error in the {}'s status: {}", C::OBJECT, with_causes(&e));
        }
    }
    error
}

/// The children's writes of a plan (and the writes before them). `None`: the object is gone.
async fn act_on_children<C: Kind>(
    kind: &C,
    key: &C::Key,
    obj: &DynamicObject,
    resource: &ResolvedResource,
    plan: &Plan<'_>,
    before: Option<&C::Before>,
    wanted: &std::collections::BTreeSet<crate::api::record::RecordedChild>,
) -> Result<Option<Executed>, SyncError> {
    let core = kind.core();
    let applier = &core.hub.applier;
    let before_writes = before.is_some_and(|b| b.writes(applier));
    let journal = Journal { core, key };
    if gc_finalizing(obj) {
        return Ok(Some(Executed::default()));
    }
    plan.read_schemas(applier).await;
    let writes = plan.writes(applier, &journal);
    let known = core.records.as_deref().map(|records| (records, elsewhere::known(records, obj, &core.finalizer)));
    let settling =
        known.as_ref().is_some_and(|(_, k)| elsewhere::needs_settling(k.record.as_ref(), &core.children, wanted));
    if !before_writes && writes == Writes::Nothing && !settling {
        return Ok(Some(Executed::default()));
    }
    // No child written for an object that is gone or replaced, or that changed its stage of life while
    // the hook was thinking (deleted; the GC's orphan or foreground finalizer came or went): the answer
    // was for another stage, and the next sync asks again. Which copy of the object tells depends on
    // what the writes can undo. A deletion cannot be undone, and an orphaning delete is the user's
    // promise to keep the children, so a sync that deletes (a child no longer desired, a `Recreate`)
    // reads the object from the API server first; so does one that writes children elsewhere, which no
    // owner reference ties to it, and one that persists rollout revisions first. The other writes
    // guard themselves (see [`Writes::Guarded`]): a child created for an object deleted
    // meanwhile names its UID as its owner, and the garbage collector deletes it; an update is refused
    // if the collector orphaned the child since it was observed. For them the cache's copy is enough,
    // and spares the API server a read (about a tenth of what a bare sync costs it): it shows a deletion as
    // soon as its watch event comes, so a deletion during the hook call still writes nothing. A cache
    // that still holds the version observed holds the very object observed: nothing to decode.
    let stage_changed = |live: &DynamicObject| lifecycle_changed(obj, live, &core.finalizer);
    let observed_version = obj.metadata.resource_version.as_deref();
    let changed = if before_writes || writes == Writes::NeedParentRead {
        live_parent(&core.hub.client, resource, obj).await?.map(|live| stage_changed(&live))
    } else if observed_version.is_some_and(|version| kind.holds(key, version)) {
        Some(false)
    } else {
        kind.object(key)
            .filter(|(cached, _)| cached.metadata.uid == obj.metadata.uid)
            .map(|(cached, _)| stage_changed(&cached))
    };
    match changed {
        None => Ok(None),
        Some(true) => Err(SyncError::Conflict(C::OBJECT)),
        Some(false) => {
            if let Some(before) = before {
                before.persist(applier).await.map_err(|e| SyncError::Apply(vec![e]))?;
            }
            // The parent's side of a claim on a child elsewhere is written before the child.
            let record = match &known {
                Some((records, known)) => elsewhere::admit(records, known, wanted, obj).await?,
                None => None,
            };
            let executed = plan.execute(applier, &journal).await;
            if let Some((records, _)) = &known {
                // Also after a write failed: the deletions made in the other namespaces leave the record.
                elsewhere::settle(records, record.as_ref(), &core.children, wanted, &executed).await?;
            }
            Ok(Some(executed))
        }
    }
}

/// Merges the labels and annotations a hook asked for (a patch naming the object's UID, so it is
/// refused rather than applied to a new object of the same name). Returns the version it left behind.
async fn patch_metadata(
    api: &Api<DynamicObject>,
    obj: &DynamicObject,
    patch: &Value,
) -> Result<Option<String>, SyncError> {
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    match api.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await {
        Ok(patched) => Ok(patched.metadata.resource_version),
        // Gone, or replaced (the UID in the patch no longer matches): its own sync follows.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 422 && s.message.contains("metadata.uid") => Ok(None),
        Err(e) => Err(SyncError::Write { what: "labels and annotations", source: Box::new(e) }),
    }
}

/// Runs `kind` until `cancel` fires: its children's changes from now on, then every synced object (each
/// is queued once at start, and a child change either comes through its stream or is cached before that
/// object's sync), and its workers.
pub(crate) async fn run<C: Kind>(kind: Arc<C>, cancel: tokio_util::sync::CancellationToken) {
    let mut tasks = tokio::task::JoinSet::new();
    let core = kind.core();
    let child_changes: Vec<_> = core.children.iter().map(|c| c.informer.subscribe_changes()).collect();
    let input_changes: Vec<_> = kind.input_informers().into_iter().map(Informer::subscribe_changes).collect();
    for (type_index, informer) in kind.object_informers().into_iter().enumerate() {
        let mut events = informer.subscribe();
        let kind = Arc::clone(&kind);
        tasks.spawn(async move {
            while let Some(event) = events.recv().await {
                kind.noticed(&event);
                let obj = event.change.object();
                let key = kind.key_of(type_index, obj);
                let (selected, ignore) = (kind.selects(type_index, obj), kind.ignores_status_changes(type_index, obj));
                kind.core().object_event(key, type_index, &event, selected, ignore);
            }
        });
    }
    for (input, mut events) in input_changes.into_iter().enumerate() {
        let kind = Arc::clone(&kind);
        tasks.spawn(async move {
            while let Some(event) = events.recv().await {
                // The objects that read it before the change and those that read it now.
                let mut keys = Vec::new();
                if let Change::Applied { old: Some(old), .. } = &event.change {
                    keys.extend(kind.readers(input, old));
                }
                keys.extend(kind.readers(input, event.change.object()));
                for key in keys {
                    kind.core().enqueue_seen(key, event.relisted);
                }
            }
        });
    }
    for (index, mut events) in child_changes.into_iter().enumerate() {
        let kind = Arc::clone(&kind);
        tasks.spawn(async move {
            while let Some(event) = events.recv().await {
                kind.core().child_event(index, &event, |child, adopt| kind.owners(child, adopt));
            }
        });
    }
    let workers = core.hub.settings.workers;
    run_workers(kind, workers, tasks, cancel).await;
}

/// Queues every object `kind` selects or still finalizes, for a sync requested on the controller object
/// (its hook is asked even if nothing changed); returns how many.
pub(crate) fn resync_all<C: Kind>(kind: &C) -> usize {
    let managed = managed(kind);
    for (key, _) in &managed {
        kind.core().queue.add_for(key.clone(), Reason::Requested);
    }
    managed.len()
}

/// Every object `kind` manages now — it selects it, or still has its finalizer on it — with its key.
pub(crate) fn managed<C: Kind>(kind: &C) -> Vec<(C::Key, Arc<DynamicObject>)> {
    let finalizer = &kind.core().finalizer;
    let mut out = Vec::new();
    for (type_index, informer) in kind.object_informers().into_iter().enumerate() {
        for obj in informer.list(None) {
            if kind.selects(type_index, &obj) || has_finalizer(&obj, finalizer) {
                out.push((kind.key_of(type_index, &obj), obj));
            }
        }
    }
    out
}

/// Every kind runs in the engine's worker.
impl<C: Kind> Syncer for C {
    type Key = C::Key;

    fn name(&self) -> &str {
        &self.core().name
    }

    fn queue(&self) -> &WorkQueue<C::Key> {
        &self.core().queue
    }

    fn events(&self) -> &crate::engine::events::Events {
        &self.core().hub.events
    }

    fn metrics(&self) -> &ControllerMetrics {
        &self.core().metrics
    }

    fn sync_requests(&self) -> &SyncRequests<C::Key> {
        &self.core().requests
    }

    fn object(&self, key: &C::Key) -> Option<Arc<DynamicObject>> {
        Kind::object(self, key).map(|(obj, _)| obj)
    }

    async fn sync(&self, key: &C::Key, reasons: Reasons) -> Result<Synced, SyncError> {
        sync(self, key, reasons).await
    }

    fn resync_period(&self, key: &C::Key) -> Option<Duration> {
        resync_period(self.resync_period_seconds()).filter(|_| self.contains(key))
    }
}

/// Whether a sync for `reasons` asks its hook `request`, given what was asked last: not when it is the
/// very request whose answer was last applied in full and nothing asks to ask again (a resync, a retry,
/// a requested sync; see [`crate::engine::answered`]). When it asks, the metrics count it by cause,
/// `redundant` for a repeat of the last request (its answer was not applied in full).
pub(crate) fn ask_hook<K: Clone + Eq + Hash>(
    answered: &Answered<K>,
    metrics: &ControllerMetrics,
    key: &K,
    request: Option<RequestId>,
    reasons: Reasons,
) -> bool {
    use crate::engine::metrics::{Cause, Saved};
    let seen = request.and_then(|r| answered.seen(key, r));
    if seen == Some(true) && !reasons.asks_again() {
        debug!("the same request as the last one, whose answer was applied in full: not asked again");
        metrics.hook_call_saved(Saved::IdenticalRequest);
        return false;
    }
    let cause = if seen.is_some() && !reasons.asks_again() { Cause::Redundant } else { reasons.main().into() };
    metrics.hook_sync(cause);
    match request {
        Some(request) => answered.asked(key, request),
        None => answered.forget(key),
    }
    true
}

/// An `Api` for `obj`'s type and namespace.
pub(crate) fn api_for(client: &Client, resource: &ResolvedResource, obj: &DynamicObject) -> Api<DynamicObject> {
    match obj.metadata.namespace.as_deref() {
        Some(ns) if resource.namespaced => Api::namespaced_with(client.clone(), ns, &resource.api_resource),
        _ => Api::all_with(client.clone(), &resource.api_resource),
    }
}

/// Whether an update of a parent/target matters when `ignoreStatusChanges` is set.
pub(crate) fn meaningful_parent_change(old: &DynamicObject, new: &DynamicObject) -> bool {
    old.metadata.generation != new.metadata.generation
        || old.metadata.labels != new.metadata.labels
        || old.metadata.annotations != new.metadata.annotations
        || new.metadata.deletion_timestamp.is_some()
}
