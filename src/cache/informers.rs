//! Shared, indexed caches of any resource type: one store per type for the whole hub, filled by one
//! watch per type, or, for a hub limited to some namespaces (`namespaces`), by one watch per type and
//! namespace, merged into the same store.
//!
//! kube-runtime's `reflector::Store` has no secondary indexes; claiming a parent's children needs
//! "objects controlled by UID x" and "orphans in namespace n" without scanning every object of the
//! type (Metacontroller #1085), so the store here keeps those indexes. The watch itself is
//! kube-runtime's `watcher`.
//!
//! An [`Informer`] is a handle: controllers that use the same type share its watches and one store, and
//! the watches stop when the last handle is dropped. The store keeps each object as its JSON (see
//! `Entry`) and hands out freshly decoded `Arc`s, which are never mutated; callers clone before
//! changing anything.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::core::TypeMeta;
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use crate::cache::discovery::ResolvedResource;
use crate::cache::relist::relisting;
use crate::cache::selector::Selector;
use crate::cache::shard::{Role, Selection};

/// Namespace (None for cluster-scoped objects) and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectKey {
    #[must_use]
    pub fn of(obj: &DynamicObject) -> Self {
        Self { namespace: obj.metadata.namespace.clone(), name: obj.metadata.name.clone().unwrap_or_default() }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// What a subscriber receives: a change, and whether a relist found it (see [`Event::relisted`]).
#[derive(Clone, Debug)]
pub struct Event {
    pub change: Change,
    /// Found by a list (the watch's first, or a relist after it expired or broke) rather than told by a
    /// watch event: whatever happened meanwhile is summed up in it, so it is never taken for the echo of
    /// one of the hub's writes.
    pub relisted: bool,
}

/// A change seen by the watch. A subscriber first receives `Applied { old: None }` for every cached object.
#[derive(Clone, Debug)]
pub enum Change {
    Applied { old: Option<Arc<DynamicObject>>, new: Arc<DynamicObject> },
    Deleted(Arc<DynamicObject>),
}

impl Change {
    /// The object as it is now (or was last seen, for a deletion).
    #[must_use]
    pub fn object(&self) -> &Arc<DynamicObject> {
        match self {
            Self::Applied { new, .. } => new,
            Self::Deleted(obj) => obj,
        }
    }
}

/// The label that names the parent of a child no `ownerReference` can point from (in another namespace
/// than its namespaced parent, or cluster-scoped under one): the parent's UID. Such children exist only
/// for child types declared `crossNamespace`; the label is their claim, as a controller `ownerReference`
/// is an owned child's (see the book's "Children in other namespaces").
pub const PARENT_UID_LABEL: &str = "metahook.dev/parent-uid";

/// The annotation beside [`PARENT_UID_LABEL`]: `<namespace>/<name>` of the parent, to find it by when
/// the child changes (the label decides whose child it is).
pub const PARENT_ANNOTATION: &str = "metahook.dev/parent";

/// The UID of the controller of `obj`, if any: its controller owner's, or the parent its
/// [`PARENT_UID_LABEL`] names.
#[must_use]
pub fn controller_uid(obj: &DynamicObject) -> Option<&str> {
    let owner = obj.metadata.owner_references.iter().flatten().find(|r| r.controller == Some(true));
    owner
        .map(|r| r.uid.as_str())
        .or_else(|| obj.metadata.labels.as_ref().and_then(|l| l.get(PARENT_UID_LABEL)).map(String::as_str))
}

/// (namespace, label key, label value): how orphans are found by a selector's required label.
type LabelIndex = (Option<String>, String, String);

/// A cached object's key, shared by the map and every index that lists the object: a key is two
/// strings, and an object stands in three or four places, so owned copies cost more than many objects'
/// own metadata (about 600 bytes an object, measured with massif at 8,000 objects).
type Key = Arc<ObjectKey>;

/// A cached object, kept as its JSON.
///
/// Parsed, an object is mostly small maps and strings: `serde_json`'s and k8s-openapi's maps are
/// B-tree leaves of about 600 bytes even for one key, so a small config map took about 4.7 KB in the
/// cache (massif at 8,000 objects: 78% of the hub's heap) where its JSON takes under 1 KB. Objects are
/// read from the cache a few at a time (a parent and its children for a sync), so decoding on read
/// costs microseconds where it is used, and the memory is saved for every object of the cluster.
/// `make bench MEM=1` (10,000 parents, 30,000 children), side by side: 94.5 MiB steady RSS, 2,109 bytes
/// per cached object, against 184.5 MiB and 4,505 bytes for the parsed cache of build 31e57ca.
struct Entry {
    json: Box<[u8]>,
    /// Compared for every object of a relist, so kept decoded.
    resource_version: Option<Box<str>>,
}

impl Entry {
    fn encode(obj: &DynamicObject) -> Self {
        // A DynamicObject is strings, maps and JSON values: it always serializes.
        let json = serde_json::to_vec(obj).unwrap_or_default().into_boxed_slice();
        Self { json, resource_version: obj.metadata.resource_version.as_deref().map(Box::from) }
    }

    /// The object's labels alone: choosing among many cached objects by label reads only these, several
    /// times faster than decoding whole objects, and only the chosen are decoded.
    fn labels(&self) -> BTreeMap<String, String> {
        #[derive(serde::Deserialize)]
        struct Object {
            metadata: Option<Meta>,
        }
        #[derive(serde::Deserialize)]
        struct Meta {
            labels: Option<BTreeMap<String, String>>,
        }
        serde_json::from_slice::<Object>(&self.json).ok().and_then(|o| o.metadata?.labels).unwrap_or_default()
    }

    fn decode(&self, key: &ObjectKey) -> Option<Arc<DynamicObject>> {
        match serde_json::from_slice(&self.json) {
            Ok(obj) => Some(Arc::new(obj)),
            Err(err) => {
                // The store wrote these bytes itself: this would be a bug, not bad input.
                warn!(object = %key, "cached object does not decode: {err}");
                None
            }
        }
    }
}

#[derive(Default)]
struct Store {
    objects: HashMap<Key, Entry>,
    /// Keys of objects whose controller ownerRef has this UID.
    by_controller: HashMap<String, BTreeSet<Key>>,
    /// Keys of objects without a controller ownerRef, by namespace.
    orphans: HashMap<Option<String>, BTreeSet<Key>>,
    /// Keys of orphans by each of their labels: claiming finds the orphans a parent's selector could
    /// adopt without testing every orphan of the namespace (most objects of a child type are usually
    /// someone else's, and all of them are orphans to the hub).
    orphans_by_label: HashMap<LabelIndex, BTreeSet<Key>>,
    /// Keys of all objects, by namespace.
    by_namespace: HashMap<Option<String>, BTreeSet<Key>>,
}

impl Store {
    /// Stores `obj`; returns what it replaces.
    fn insert(&mut self, obj: &DynamicObject) -> Option<Arc<DynamicObject>> {
        let key = Arc::new(ObjectKey::of(obj));
        // Most changes (a status, a spec) leave an object under the same controller, or an orphan with the
        // same labels: it stays where the indexes have it, and only its JSON is replaced. The stored copy
        // is decoded once, for that test and for unindexing it otherwise.
        let old = match self.objects.get_key_value(&*key) {
            None => None,
            Some((stored, entry)) => {
                let (stored, old) = (Arc::clone(stored), entry.decode(stored));
                if old.as_deref().is_some_and(|old| indexed_alike(old, obj)) {
                    self.objects.insert(stored, Entry::encode(obj));
                    return old;
                }
                self.objects.remove(&*key);
                self.unindex(&key, old.as_deref());
                old
            }
        };
        if let Some(uid) = controller_uid(obj) {
            self.by_controller.entry(uid.to_owned()).or_default().insert(Arc::clone(&key));
        } else {
            self.orphans.entry(key.namespace.clone()).or_default().insert(Arc::clone(&key));
            for (k, v) in obj.metadata.labels.iter().flatten() {
                let index = (key.namespace.clone(), k.clone(), v.clone());
                self.orphans_by_label.entry(index).or_default().insert(Arc::clone(&key));
            }
        }
        self.by_namespace.entry(key.namespace.clone()).or_default().insert(Arc::clone(&key));
        self.objects.insert(key, Entry::encode(obj));
        old
    }

    fn remove(&mut self, key: &ObjectKey) -> Option<Arc<DynamicObject>> {
        let entry = self.objects.remove(key)?;
        // Unindexing needs the owner and labels the object was indexed under.
        let old = entry.decode(key);
        self.unindex(key, old.as_deref());
        old
    }

    /// Takes `key` out of every index, where `old` (its stored copy, decoded) stood.
    fn unindex(&mut self, key: &ObjectKey, old: Option<&DynamicObject>) {
        if let Some(old) = old {
            if let Some(uid) = controller_uid(old) {
                unindex(&mut self.by_controller, &uid.to_owned(), key);
            } else {
                unindex(&mut self.orphans, &key.namespace, key);
                for (k, v) in old.metadata.labels.iter().flatten() {
                    unindex(&mut self.orphans_by_label, &(key.namespace.clone(), k.clone(), v.clone()), key);
                }
            }
        } else {
            // Undecodable (never expected): take the key out of every index the slow way.
            purge(&mut self.by_controller, key);
            purge(&mut self.orphans, key);
            purge(&mut self.orphans_by_label, key);
        }
        unindex(&mut self.by_namespace, &key.namespace, key);
    }

    fn get(&self, key: &ObjectKey) -> Option<Arc<DynamicObject>> {
        self.objects.get_key_value(key).and_then(|(k, entry)| entry.decode(k))
    }

    fn resolve<'a>(&self, keys: impl IntoIterator<Item = &'a Key>) -> Vec<Arc<DynamicObject>> {
        keys.into_iter().filter_map(|k| self.get(k)).collect()
    }

    /// The objects of `keys` whose labels `selector` selects, decoding only those.
    fn resolve_selected<'a>(
        &self,
        keys: impl IntoIterator<Item = &'a Key>,
        selector: &Selector,
    ) -> Vec<Arc<DynamicObject>> {
        keys.into_iter()
            .filter_map(|k| self.objects.get_key_value(k))
            .filter(|(_, entry)| selector.matches(&entry.labels()))
            .filter_map(|(k, entry)| entry.decode(k))
            .collect()
    }

    fn all(&self) -> Vec<Arc<DynamicObject>> {
        self.objects.iter().filter_map(|(k, entry)| entry.decode(k)).collect()
    }
}

/// Whether `old` and `new` stand in the same places of a store's indexes: the same controller, and
/// for an orphan the same labels.
fn indexed_alike(old: &DynamicObject, new: &DynamicObject) -> bool {
    match (controller_uid(old), controller_uid(new)) {
        (Some(old), Some(new)) => old == new,
        (None, None) => old.metadata.labels == new.metadata.labels,
        _ => false,
    }
}

fn purge<I>(map: &mut HashMap<I, BTreeSet<Key>>, key: &ObjectKey) {
    map.retain(|_, set| {
        set.remove(key);
        !set.is_empty()
    });
}

fn unindex<I: Eq + std::hash::Hash>(map: &mut HashMap<I, BTreeSet<Key>>, index: &I, key: &ObjectKey) {
    if let Some(set) = map.get_mut(index) {
        set.remove(key);
        if set.is_empty() {
            map.remove(index);
        }
    }
}

struct Shared {
    resource: Arc<ResolvedResource>,
    store: RwLock<Store>,
    subscribers: Mutex<Vec<mpsc::UnboundedSender<Event>>>,
    synced: watch::Sender<bool>,
    /// The watch's last error since it last listed or received an event (what a start that cannot
    /// sync reports).
    last_error: watch::Sender<Option<WatchFailure>>,
    task: Mutex<Option<tokio::task::AbortHandle>>,
    /// With sharding, which of the shard selectors its watches carry.
    role: Option<Role>,
    /// The shard selector of the last list every scope finished (sharded caches only).
    listed_with: watch::Sender<Option<String>>,
}

/// Why a watch is not delivering: the API's status code (if it answered) and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchFailure {
    pub code: Option<u16>,
    pub message: String,
}

/// A cache that did not sync in time.
#[derive(Debug, thiserror::Error)]
pub enum SyncTimeout {
    /// The API refused to list or watch the type (403): waiting longer cannot help.
    #[error("cannot list/watch {resource}: {message}")]
    Forbidden { resource: String, message: String },
    #[error("cache of {resource} not synced after {waited:?}: {}", last_error.as_deref().unwrap_or("no answer from the API server"))]
    NotSynced { resource: String, waited: Duration, last_error: Option<String> },
}

/// Size and state of one shared cache, for metrics.
#[derive(Clone, Debug)]
pub struct CacheStats {
    /// `apiVersion/plural`.
    pub resource: String,
    pub objects: usize,
    pub synced: bool,
}

fn failure(err: &watcher::Error) -> WatchFailure {
    let code = match err {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
        | watcher::Error::WatchError(s) => Some(s.code),
        _ => None,
    };
    WatchFailure { code, message: err.to_string() }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().ok().and_then(Option::take) {
            task.abort();
        }
    }
}

impl Shared {
    /// Applies changes to the store and tells subscribers, under the store lock so that a subscriber
    /// joining concurrently sees each change exactly once (in its snapshot or as an event). `relisted`:
    /// the changes come from a list, not a watch event.
    fn publish(&self, relisted: bool, apply: impl FnOnce(&mut Store) -> Vec<Change>) {
        let mut store = self.store.write().expect("store lock");
        let changes = apply(&mut store);
        if changes.is_empty() {
            return;
        }
        let mut subscribers = self.subscribers.lock().expect("subscribers lock");
        subscribers.retain(|tx| changes.iter().all(|c| tx.send(Event { change: c.clone(), relisted }).is_ok()));
    }
}

/// Handle to the shared cache of one resource type.
#[derive(Clone)]
pub struct Informer {
    shared: Arc<Shared>,
}

impl Informer {
    /// A cache filled once with `objects` (of type `resource`, as a LIST returns them) and never
    /// watched: synced from the start, it never changes. For a one-off reader that must decide exactly
    /// as the hub decides from its caches — `metahook diff` claims children and plans writes through
    /// the engine's own functions, which read informers — without starting a watch per type.
    #[must_use]
    pub fn listed(resource: &Arc<ResolvedResource>, objects: impl IntoIterator<Item = DynamicObject>) -> Self {
        // Prepared as a watch prepares what it caches, so the objects read the same.
        let mut store = Store::default();
        for obj in objects {
            store.insert(&prepare(obj, resource));
        }
        let shared = Shared {
            resource: Arc::clone(resource),
            store: RwLock::new(store),
            subscribers: Mutex::default(),
            synced: watch::channel(true).0,
            last_error: watch::channel(None).0,
            task: Mutex::default(),
            role: None,
            listed_with: watch::channel(None).0,
        };
        Self { shared: Arc::new(shared) }
    }

    #[must_use]
    pub fn resource(&self) -> &Arc<ResolvedResource> {
        &self.shared.resource
    }

    /// Waits until the initial list is in the cache, at most `timeout`. Gives up at once when the API
    /// forbids listing or watching the type, and otherwise names the watch's last error.
    pub async fn wait_synced(&self, timeout: Duration) -> Result<(), SyncTimeout> {
        let resource = format!("{}/{}", self.shared.resource.api_version(), self.shared.resource.api_resource.plural);
        let mut synced = self.shared.synced.subscribe();
        let mut errors = self.shared.last_error.subscribe();
        let forbidden = |e: &Option<WatchFailure>| e.as_ref().is_some_and(|f| f.code == Some(403));
        // The senders live in `shared`, which we hold, so neither wait can fail.
        let outcome = tokio::time::timeout(timeout, async {
            tokio::select! {
                _ = synced.wait_for(|s| *s) => Ok(()),
                _ = errors.wait_for(forbidden) => Err(()),
            }
        })
        .await;
        let last = self.shared.last_error.borrow().clone();
        match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(())) => {
                Err(SyncTimeout::Forbidden { resource, message: last.map(|f| f.message).unwrap_or_default() })
            }
            Err(_) if self.is_synced() => Ok(()),
            Err(_) => Err(SyncTimeout::NotSynced { resource, waited: timeout, last_error: last.map(|f| f.message) }),
        }
    }

    #[must_use]
    pub fn is_synced(&self) -> bool {
        *self.shared.synced.borrow()
    }

    #[must_use]
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<DynamicObject>> {
        self.shared.store.read().expect("store lock").get(key)
    }

    #[must_use]
    pub fn contains(&self, key: &ObjectKey) -> bool {
        self.shared.store.read().expect("store lock").objects.contains_key(key)
    }

    /// Whether the cached object `key` is at resourceVersion `version`: the very object a caller
    /// decoded before, told without decoding it again.
    #[must_use]
    pub fn holds(&self, key: &ObjectKey, version: &str) -> bool {
        let store = self.shared.store.read().expect("store lock");
        store.objects.get(key).is_some_and(|entry| entry.resource_version.as_deref() == Some(version))
    }

    /// Objects whose controller ownerRef points at `uid`.
    #[must_use]
    pub fn controlled_by(&self, uid: &str) -> Vec<Arc<DynamicObject>> {
        let store = self.shared.store.read().expect("store lock");
        store.by_controller.get(uid).map(|keys| store.resolve(keys)).unwrap_or_default()
    }

    /// Every cached orphan (an object without a controller ownerRef), in every namespace.
    #[must_use]
    pub fn orphans(&self) -> Vec<Arc<DynamicObject>> {
        let store = self.shared.store.read().expect("store lock");
        store.orphans.values().flat_map(|keys| store.resolve(keys)).collect()
    }

    /// Orphans in `namespace` (`Some(None)` = cluster-scoped; `None` = everywhere) that `selector` selects,
    /// found by its required label when it has one.
    #[must_use]
    pub fn orphans_selected(&self, namespace: Option<Option<&str>>, selector: &Selector) -> Vec<Arc<DynamicObject>> {
        let store = self.shared.store.read().expect("store lock");
        match (namespace, selector.required_label()) {
            (Some(ns), Some((k, v))) => {
                let index = (ns.map(str::to_owned), k.to_owned(), v.to_owned());
                store
                    .orphans_by_label
                    .get(&index)
                    .map(|keys| store.resolve_selected(keys, selector))
                    .unwrap_or_default()
            }
            (Some(ns), None) => store
                .orphans
                .get(&ns.map(str::to_owned))
                .map(|k| store.resolve_selected(k, selector))
                .unwrap_or_default(),
            // Everywhere (a cluster-scoped parent's children, a `crossNamespace` type's): by the required
            // label in each namespace that has objects (a few hash lookups each), not every orphan read.
            (None, Some((k, v))) => store
                .by_namespace
                .keys()
                .filter_map(|ns| store.orphans_by_label.get(&(ns.clone(), k.to_owned(), v.to_owned())))
                .flat_map(|keys| store.resolve_selected(keys, selector))
                .collect(),
            (None, None) => store.orphans.values().flat_map(|keys| store.resolve_selected(keys, selector)).collect(),
        }
    }

    /// Objects in `namespace` (as for [`Informer::list`]) whose labels `selector` selects; only those
    /// are decoded.
    #[must_use]
    pub fn list_selected(&self, namespace: Option<Option<&str>>, selector: &Selector) -> Vec<Arc<DynamicObject>> {
        let store = self.shared.store.read().expect("store lock");
        match namespace {
            Some(ns) => store
                .by_namespace
                .get(&ns.map(str::to_owned))
                .map(|k| store.resolve_selected(k, selector))
                .unwrap_or_default(),
            None => store.resolve_selected(store.objects.keys(), selector),
        }
    }

    /// Objects in `namespace` (`Some(None)` = cluster-scoped), or everywhere (`None`).
    #[must_use]
    pub fn list(&self, namespace: Option<Option<&str>>) -> Vec<Arc<DynamicObject>> {
        let store = self.shared.store.read().expect("store lock");
        match namespace {
            Some(ns) => store.by_namespace.get(&ns.map(str::to_owned)).map(|k| store.resolve(k)).unwrap_or_default(),
            None => store.all(),
        }
    }

    /// A stream of changes, starting with every object already cached.
    #[must_use]
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<Event> {
        let (tx, rx) = mpsc::unbounded_channel();
        let store = self.shared.store.read().expect("store lock");
        for obj in store.all() {
            let _ = tx.send(Event { change: Change::Applied { old: None, new: obj }, relisted: true });
        }
        self.shared.subscribers.lock().expect("subscribers lock").push(tx);
        rx
    }

    /// A stream of the changes from now on, without the objects already cached. For a controller's
    /// children: its parents' subscription, taken after this one, queues every parent once anyway, and
    /// a child that changed before this call is in the cache those syncs read. Replaying the children
    /// too decoded every one of them at start and queued their parents a second time, after some had
    /// been synced already.
    #[must_use]
    pub fn subscribe_changes(&self) -> mpsc::UnboundedReceiver<Event> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.shared.subscribers.lock().expect("subscribers lock").push(tx);
        rx
    }
}

/// Hands out shared informers, starting a watch on first use of a type.
#[derive(Clone)]
pub struct Informers {
    client: Client,
    /// How often each watch lists its type again (see [`crate::cache::relist`]); `None`: never.
    flush_interval: Option<Duration>,
    /// The namespaces namespaced types are watched in, one watch each; empty: the whole cluster.
    namespaces: Arc<[String]>,
    /// With sharding, the server-side label selectors of this replica's own objects as they change (see
    /// [`crate::cache::shard`]): every watch of [`Informers::get`] carries the one of its role, so a
    /// cache holds one member's share of its type, and lists again when it changes.
    selection: Option<watch::Receiver<Selection>>,
    live: Arc<Mutex<HashMap<String, Weak<Shared>>>>,
}

impl Informers {
    /// Informers on `client` whose watches list their type again every `flush_interval` (zero: never).
    #[must_use]
    pub fn new(client: Client, flush_interval: Duration) -> Self {
        Self {
            client,
            flush_interval: Some(flush_interval).filter(|d| !d.is_zero()),
            namespaces: Arc::default(),
            selection: None,
            live: Arc::default(),
        }
    }

    /// These informers, watching namespaced types only in `namespaces` (empty: the whole cluster), one
    /// watch per namespace into each type's one store: a hub on Roles in those namespaces can list and
    /// watch nothing wider.
    #[must_use]
    pub fn in_namespaces(mut self, namespaces: Vec<String>) -> Self {
        self.namespaces = namespaces.into();
        self
    }

    /// The namespaces the hub is limited to; empty: none (the whole cluster).
    #[must_use]
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// Whether objects in `namespace` are watched (always, for a hub not limited to namespaces).
    #[must_use]
    pub fn covers(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace)
    }

    /// These informers, watching only the objects `selection` (server-side label selectors, as they
    /// change) matches: a sharded replica's own parents and children.
    #[must_use]
    pub fn sharded(mut self, selection: Option<watch::Receiver<Selection>>) -> Self {
        self.selection = selection;
        self
    }

    /// Waits until every sharded cache has listed its type with the selector of its role in `selection`
    /// (the buckets just taken are in it), at most `timeout`; `false` if one had not by then.
    pub async fn wait_listed(&self, selection: &Selection, timeout: Duration) -> bool {
        let sharded: Vec<(Arc<Shared>, Role)> = self
            .live
            .lock()
            .expect("informers lock")
            .values()
            .filter_map(Weak::upgrade)
            .filter_map(|s| s.role.map(|role| (s, role)))
            .collect();
        let all = futures::future::join_all(sharded.iter().map(|(shared, role)| {
            let mut listed = shared.listed_with.subscribe();
            let selector = selection.of_role(*role);
            async move {
                let _ = listed.wait_for(|l| l.as_deref() == Some(selector)).await;
            }
        }));
        tokio::time::timeout(timeout, all).await.is_ok()
    }

    /// How often watches list their type again; `None`: never. For other watches of the hub (the
    /// controller objects') to do the same.
    #[must_use]
    pub fn flush_interval(&self) -> Option<Duration> {
        self.flush_interval
    }

    /// The informer for `resource`, shared with every other user of the same type in the same `role`.
    /// Unsharded, both roles share one cache; sharded, a type that is both a parent type and a child
    /// type is watched once per role, each with its own label's selector.
    #[must_use]
    pub fn get(&self, resource: &Arc<ResolvedResource>, role: Role) -> Informer {
        let sharding = self.selection.as_ref().map(|selection| (role, selection.clone()));
        self.informer(resource, sharding)
    }

    /// The informer [`Informers::get`] would share for `resource` in `role`, if one is running: for a
    /// look at what is cached that must not start a watch of its own.
    #[must_use]
    pub fn running(&self, resource: &Arc<ResolvedResource>, role: Role) -> Option<Informer> {
        let id = informer_id(resource, self.selection.as_ref().map(|_| role));
        let shared = self.live.lock().expect("informers lock").get(&id).and_then(Weak::upgrade)?;
        Some(Informer { shared })
    }

    /// The informer for `resource` with every object of the type, even when sharded: for what a
    /// replica must see whoever owns it (a rollout's `ControllerRevision`s carry no shard label).
    #[must_use]
    pub fn get_unsharded(&self, resource: &Arc<ResolvedResource>) -> Informer {
        self.informer(resource, None)
    }

    fn informer(
        &self,
        resource: &Arc<ResolvedResource>,
        sharding: Option<(Role, watch::Receiver<Selection>)>,
    ) -> Informer {
        let role = sharding.as_ref().map(|(role, _)| *role);
        let id = informer_id(resource, role);
        let mut live = self.live.lock().expect("informers lock");
        if let Some(shared) = live.get(&id).and_then(Weak::upgrade) {
            return Informer { shared };
        }
        let (synced, _) = watch::channel(false);
        let (last_error, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            resource: Arc::clone(resource),
            store: RwLock::default(),
            subscribers: Mutex::default(),
            synced,
            last_error,
            task: Mutex::default(),
            role,
            listed_with: watch::channel(None).0,
        });
        let task = tokio::spawn(run_watch(
            self.client.clone(),
            Arc::downgrade(&shared),
            self.flush_interval,
            Arc::clone(&self.namespaces),
            sharding,
        ));
        *shared.task.lock().expect("task lock") = Some(task.abort_handle());
        live.retain(|_, weak| weak.strong_count() > 0);
        live.insert(id, Arc::downgrade(&shared));
        Informer { shared }
    }

    /// Number of resource types currently watched.
    #[must_use]
    pub fn watched_types(&self) -> usize {
        self.live.lock().expect("informers lock").values().filter(|w| w.strong_count() > 0).count()
    }

    /// Size and sync state of every live cache.
    #[must_use]
    pub fn stats(&self) -> Vec<CacheStats> {
        let live: Vec<(String, Arc<Shared>)> = self
            .live
            .lock()
            .expect("informers lock")
            .iter()
            .filter_map(|(id, weak)| weak.upgrade().map(|s| (id.clone(), s)))
            .collect();
        let mut stats: Vec<CacheStats> = live
            .into_iter()
            .map(|(resource, shared)| CacheStats {
                resource,
                objects: shared.store.read().expect("store lock").objects.len(),
                synced: *shared.synced.borrow(),
            })
            .collect();
        stats.sort_by(|a, b| a.resource.cmp(&b.resource));
        stats
    }
}

/// Prepares an object for the cache: full type information (list items lack it), and managedFields
/// reduced to who wrote the object: the field sets are most of an object's size and nothing reads them
/// from the cache, but the applier must know whether Metacontroller's managers wrote an object, to take
/// it over on its first write (it reads the full entries then, once, see `migrate`).
fn prepare(mut obj: DynamicObject, resource: &ResolvedResource) -> Arc<DynamicObject> {
    obj.types = Some(TypeMeta {
        api_version: resource.api_resource.api_version.clone(),
        kind: resource.api_resource.kind.clone(),
    });
    // Who wrote the object last, without what they own (`fieldsV1`, most of the size): the applier
    // compares its own apply time with others' after a restart. Hooks never see this summary.
    // (`migrate` also reads whether Metacontroller's managers wrote it, to take it over.)
    slim_managed_fields(&mut obj);
    // kubectl's copy of an earlier desired state: large, and read by nobody here. Metacontroller's copy
    // stays: it marks an object to take over (`migrate`) even when another manager name wrote it, as
    // `metahook migrate --dry-run` (which reads live objects) says; and hooks see it as they did under
    // Metacontroller. It goes away with the hub's first write to the object.
    if let Some(annotations) = &mut obj.metadata.annotations {
        annotations.remove(KUBECTL_LAST_APPLIED);
    }
    Arc::new(obj)
}

const KUBECTL_LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The key of `resource`'s shared informer among the live ones (sharded: one per role).
fn informer_id(resource: &ResolvedResource, role: Option<Role>) -> String {
    let id = format!("{}/{}", resource.api_version(), resource.api_resource.plural);
    match role {
        None => id,
        Some(Role::Parent) => format!("{id}?sharded-parents"),
        Some(Role::Child) => format!("{id}?sharded-children"),
    }
}

/// Whether a managedFields entry is of the main resource (not a subresource such as status).
pub fn main_resource(entry: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry) -> bool {
    entry.subresource.as_deref().is_none_or(str::is_empty)
}

/// Reduces cached `managedFields` to who wrote the object's main resource and when (manager,
/// operation, time): enough for [`crate::write::take_over::TakeOver::is_needed`] and for the applier's "written by anyone
/// since" check after a restart, without the field sets that make up most of their size.
pub fn slim_managed_fields(obj: &mut DynamicObject) {
    let Some(entries) = &mut obj.metadata.managed_fields else { return };
    // Subresource entries (status writers) matter to neither, and most parents carry one.
    entries.retain(main_resource);
    for entry in entries.iter_mut() {
        entry.fields_v1 = None;
        entry.fields_type = None;
        entry.api_version = None;
    }
    if entries.is_empty() {
        obj.metadata.managed_fields = None;
    }
}

/// Where the watches of `resource` look: the whole cluster (`[None]`), or each of `namespaces` for a
/// namespaced type when the hub is limited to them. Cluster-scoped types have no namespace to limit.
fn scopes(resource: &ResolvedResource, namespaces: &[String]) -> Vec<Option<String>> {
    if resource.namespaced && !namespaces.is_empty() {
        namespaces.iter().cloned().map(Some).collect()
    } else {
        vec![None]
    }
}

/// One watch per scope (see [`scopes`]), merged: each lists, relists and fails on its own, and the
/// store is synced once every one of them has listed. A relist of one namespace removes only what is
/// gone from that namespace.
/// With `selector` (sharding), every one of them lists and watches only the objects it matches, and
/// all of them list again when it changes: what the new selector does not match leaves the store as
/// deleted at the end of that list, what it newly matches arrives in it.
async fn run_watch(
    client: Client,
    shared: Weak<Shared>,
    flush_interval: Option<Duration>,
    namespaces: Arc<[String]>,
    mut sharding: Option<(Role, watch::Receiver<Selection>)>,
) {
    let resource = match shared.upgrade() {
        Some(s) => Arc::clone(&s.resource),
        None => return,
    };
    let scopes = scopes(&resource, &namespaces);
    loop {
        let current = sharding.as_mut().map(|(role, s)| s.borrow_and_update().of_role(*role).to_owned());
        let watches = scopes.iter().enumerate().map(|(index, scope)| {
            let api: Api<DynamicObject> = match scope {
                Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource.api_resource),
                None => Api::all_with(client.clone(), &resource.api_resource),
            };
            // Listed again every flush interval: what changed unseen reaches subscribers as `relisted` changes.
            let mut config = watcher::Config::default();
            if let Some(selector) = &current {
                config = config.labels(selector);
            }
            let start = move || resilient(watcher(api.clone(), config.clone())).boxed();
            relisting(start, flush_interval).map(move |event| (index, event))
        });
        let events = futures::stream::select_all(watches);
        let changed = async {
            let Some((role, selection)) = sharding.as_mut() else { return std::future::pending().await };
            // Only a change of this role's selector lists again.
            if selection.wait_for(|now| Some(now.of_role(*role)) != current.as_deref()).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = watch_scopes(&shared, &resource, &scopes, events, current.as_deref()) => return,
            () = changed => debug!(resource = %resource.api_resource.plural, "shard selector changed: listing again"),
        }
    }
}

/// Runs the merged watches of every scope into the store, until they end or the store is dropped.
/// `selector`: the shard selector they carry, noted when every scope has listed with it.
async fn watch_scopes(
    shared: &Weak<Shared>,
    resource: &ResolvedResource,
    scopes: &[Option<String>],
    mut events: impl Stream<Item = (usize, Result<watcher::Event<DynamicObject>, watcher::Error>)> + Unpin,
    selector: Option<&str>,
) {
    // Keys seen by each scope's relist in progress: objects go into the store as they arrive (no second
    // full copy of the cache while a relist runs); at InitDone, what the relist did not see is gone.
    let mut relisted: Vec<Option<HashSet<ObjectKey>>> = vec![None; scopes.len()];
    let mut listed = vec![false; scopes.len()];
    let mut errors: Vec<Option<WatchFailure>> = vec![None; scopes.len()];
    while let Some((index, event)) = events.next().await {
        let Some(shared) = shared.upgrade() else { return };
        let scope = scopes[index].as_deref();
        match event {
            Err(err) => {
                warn!(resource = %resource.api_resource.plural, namespace = scope, "watch error (retrying): {err}");
                errors[index] = Some(failure(&err));
                shared.last_error.send_replace(errors.iter().flatten().next().cloned());
            }
            Ok(watcher::Event::Init) => {
                errors[index] = None;
                shared.last_error.send_replace(errors.iter().flatten().next().cloned());
                relisted[index] = Some(HashSet::new());
            }
            Ok(watcher::Event::InitApply(obj)) => {
                let obj = prepare(obj, resource);
                relisted[index].get_or_insert_with(HashSet::new).insert(ObjectKey::of(&obj));
                shared.publish(true, |store| refresh(store, obj).into_iter().collect());
            }
            Ok(watcher::Event::InitDone) => {
                let seen = relisted[index].take().unwrap_or_default();
                shared.publish(true, |store| remove_unseen(store, scope, &seen));
                listed[index] = true;
                if listed.iter().all(|l| *l) {
                    shared.synced.send_replace(true);
                    if let Some(selector) = selector {
                        shared.listed_with.send_if_modified(|l| {
                            let new = l.as_deref() != Some(selector);
                            *l = Some(selector.to_owned());
                            new
                        });
                    }
                }
                debug!(resource = %resource.api_resource.plural, namespace = scope, "cache synced");
            }
            Ok(watcher::Event::Apply(obj)) => {
                let obj = prepare(obj, resource);
                shared.publish(false, |store| {
                    let old = store.insert(&obj);
                    vec![Change::Applied { old, new: obj }]
                });
            }
            Ok(watcher::Event::Delete(obj)) => {
                let key = ObjectKey::of(&obj);
                shared.publish(false, |store| store.remove(&key).map(Change::Deleted).into_iter().collect());
            }
        }
    }
}

/// A watch stream that comes back quickly after the API server does: errors back off with
/// [`WatchBackoff`], except "410 Gone" (the resourceVersion is too old, as after an API server
/// restart), after which the watcher's next step is a fresh list: waiting first would only delay it.
pub(crate) fn resilient<K: Send, S>(stream: S) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    stream
        .filter(|event| {
            let expired = matches!(event, Err(watcher::Error::WatchError(status)) if status.code == 410);
            if expired {
                debug!("watch expired (410); relisting at once");
            }
            futures::future::ready(!expired)
        })
        .backoff(WatchBackoff::default())
}

/// How long a broken watch waits before it reconnects: 200 ms doubling to 1 s, a little jitter, back to
/// the start after any success.
///
/// kube-runtime's default (800 ms doubling to 30 s, reset only after two quiet minutes) let the first
/// child write come 17-33 s after a restarted API server was ready again: the watches were asleep in
/// their backoff. A hub has a few dozen watches at most, so reconnecting every second while the API
/// server is down costs it nothing.
pub(crate) struct WatchBackoff {
    next: Duration,
}

impl WatchBackoff {
    const FIRST: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(1);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self { next: Self::FIRST }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        // Up to 20% jitter, so watches broken together do not all knock at once.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        Some(delay + delay.mul_f64(f64::from(nanos % 200) / 1000.0))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// Puts a listed object into the store; a change unless the store already has that resourceVersion.
fn refresh(store: &mut Store, obj: Arc<DynamicObject>) -> Option<Change> {
    let key = ObjectKey::of(&obj);
    let unchanged = store
        .objects
        .get(&key)
        .is_some_and(|old| old.resource_version.as_deref() == obj.metadata.resource_version.as_deref());
    if unchanged {
        return None;
    }
    let old = store.insert(&obj);
    Some(Change::Applied { old, new: obj })
}

/// Removes what a finished relist of `namespace` (`None`: of the whole cluster) did not see; reports
/// the deletions. Objects of other namespaces are another watch's, listed on their own.
fn remove_unseen(store: &mut Store, namespace: Option<&str>, seen: &HashSet<ObjectKey>) -> Vec<Change> {
    let gone: Vec<Key> = match namespace {
        None => store.objects.keys().filter(|k| !seen.contains(k.as_ref())).cloned().collect(),
        Some(ns) => store
            .by_namespace
            .get(&Some(ns.to_owned()))
            .into_iter()
            .flatten()
            .filter(|k| !seen.contains(k.as_ref()))
            .cloned()
            .collect(),
    };
    gone.iter().filter_map(|k| store.remove(k)).map(Change::Deleted).collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::ObjectMeta;
    use serde_json::json;

    use super::*;

    fn object(ns: &str, name: &str, rv: &str, controller: Option<&str>) -> Arc<DynamicObject> {
        Arc::new(DynamicObject {
            types: None,
            metadata: ObjectMeta {
                namespace: Some(ns.to_owned()),
                name: Some(name.to_owned()),
                resource_version: Some(rv.to_owned()),
                owner_references: controller.map(|uid| {
                    vec![OwnerReference { uid: uid.to_owned(), controller: Some(true), ..OwnerReference::default() }]
                }),
                ..ObjectMeta::default()
            },
            data: serde_json::Value::Null,
        })
    }

    /// A `ConfigMap` informer whose lists all fail: nothing listens on port 9 of the loopback.
    fn unreachable_config_maps() -> Informer {
        let client = Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let resource = config_maps();
        Informers::new(client, Duration::ZERO).get(&resource, Role::Child)
    }

    #[tokio::test]
    async fn a_cache_that_cannot_fill_gives_up_after_the_timeout_naming_the_last_watch_error() {
        let informer = unreachable_config_maps();
        // However loaded the machine, the first failed list comes before the (short) timeout is measured.
        let mut failed = informer.shared.last_error.subscribe();
        tokio::time::timeout(Duration::from_secs(60), failed.wait_for(Option::is_some)).await.unwrap().unwrap();
        let err = informer.wait_synced(Duration::from_millis(200)).await.unwrap_err();
        let SyncTimeout::NotSynced { resource, last_error, .. } = &err else { panic!("{err}") };
        assert_eq!(resource, "v1/configmaps");
        assert!(last_error.as_deref().is_some_and(|e| e.contains("list")), "{err}");
    }

    /// `subscribe` starts with what is cached, `subscribe_changes` only with what changes next.
    #[tokio::test]
    async fn a_subscription_for_changes_only_does_not_replay_the_cache() {
        let informer = unreachable_config_maps();
        let add =
            |obj: Arc<DynamicObject>| informer.shared.publish(false, |store| refresh(store, obj).into_iter().collect());
        add(object("a", "cached", "1", None));
        let mut everything = informer.subscribe();
        let mut changes = informer.subscribe_changes();
        add(object("a", "new", "2", None));
        let names = |rx: &mut mpsc::UnboundedReceiver<Event>| {
            std::iter::from_fn(|| rx.try_recv().ok()).map(|e| ObjectKey::of(e.change.object()).name).collect::<Vec<_>>()
        };
        assert_eq!(names(&mut everything), ["cached", "new"]);
        assert_eq!(names(&mut changes), ["new"]);
    }

    /// The resource of `ConfigMap`s, a namespaced type without a status.
    fn config_maps() -> Arc<ResolvedResource> {
        Arc::new(ResolvedResource {
            api_resource: kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            namespaced: true,
            has_status: false,
        })
    }

    #[test]
    fn a_listed_cache_is_synced_and_indexed_like_a_watched_one() {
        let resource = config_maps();
        let objects = [object("a", "owned", "1", Some("u-1")), object("a", "orphan", "2", None)];
        let informer = Informer::listed(&resource, objects.iter().map(|o| (**o).clone()));
        assert!(informer.is_synced());
        let names = |objs: Vec<Arc<DynamicObject>>| objs.iter().map(|o| ObjectKey::of(o).name).collect::<Vec<_>>();
        assert_eq!(names(informer.controlled_by("u-1")), ["owned"]);
        assert_eq!(names(informer.orphans()), ["orphan"]);
        assert!(informer.get(&ObjectKey { namespace: Some("a".into()), name: "owned".into() }).is_some());
    }

    #[test]
    fn orphans_selected_everywhere_are_found_by_their_label_in_every_namespace() {
        let resource = config_maps();
        let labelled = |ns: &str, name: &str, value: &str, controller: Option<&str>| {
            let mut obj = (*object(ns, name, "1", controller)).clone();
            obj.metadata.labels = Some(BTreeMap::from([("app".to_owned(), value.to_owned())]));
            obj
        };
        let objects = [
            labelled("a", "a-web", "web", None),
            labelled("b", "b-web", "web", None),
            labelled("b", "b-db", "db", None),
            labelled("c", "c-web-owned", "web", Some("u-1")),
        ];
        let informer = Informer::listed(&resource, objects);
        let names = |selector: &Selector| {
            let mut found: Vec<String> =
                informer.orphans_selected(None, selector).iter().map(|o| ObjectKey::of(o).to_string()).collect();
            found.sort();
            found
        };
        let web = Selector::from_labels(&BTreeMap::from([("app".to_owned(), "web".to_owned())]));
        assert_eq!(names(&web), ["a/a-web", "b/b-web"]);
        assert_eq!(names(&Selector::everything()), ["a/a-web", "b/b-db", "b/b-web"]);
    }

    #[test]
    fn watch_backoff_stays_short_and_resets() {
        use kube::runtime::utils::Backoff as _;
        let mut backoff = WatchBackoff::default();
        let delays: Vec<Duration> = backoff.by_ref().take(6).collect();
        assert!(delays[0] >= Duration::from_millis(200) && delays[0] < Duration::from_millis(250));
        assert!(delays.iter().all(|d| *d < Duration::from_millis(1200)), "{delays:?}");
        assert!(delays[5] >= Duration::from_secs(1));
        backoff.reset();
        assert!(backoff.next().unwrap() < Duration::from_millis(250));
    }

    #[test]
    fn indexes_follow_ownership_changes() {
        let mut store = Store::default();
        store.insert(&object("a", "x", "1", None));
        store.insert(&object("a", "y", "1", Some("p1")));
        assert_eq!(store.orphans[&Some("a".into())].len(), 1);
        assert_eq!(store.by_controller["p1"].len(), 1);
        // x gets adopted: it leaves the orphan index and joins its controller's.
        store.insert(&object("a", "x", "2", Some("p1")));
        assert!(!store.orphans.contains_key(&Some("a".into())));
        assert_eq!(store.by_controller["p1"].len(), 2);
        store.remove(&ObjectKey { namespace: Some("a".into()), name: "y".into() });
        assert_eq!(store.by_controller["p1"].len(), 1);
        assert_eq!(store.by_namespace[&Some("a".into())].len(), 1);
    }

    #[test]
    fn an_object_changed_in_place_is_read_back_changed_and_a_relabelled_orphan_moves_index() {
        let mut store = Store::default();
        let key = |name: &str| ObjectKey { namespace: Some("a".into()), name: name.into() };
        let labelled = |rv: &str, label: &str| {
            let mut obj = (*object("a", "o", rv, None)).clone();
            obj.metadata.labels = Some([("app".to_owned(), label.to_owned())].into());
            obj
        };
        store.insert(&object("a", "c", "1", Some("p1")));
        let old = store.insert(&object("a", "c", "2", Some("p1")));
        assert_eq!(old.and_then(|o| o.metadata.resource_version.clone()).as_deref(), Some("1"));
        assert_eq!(store.get(&key("c")).and_then(|o| o.metadata.resource_version.clone()).as_deref(), Some("2"));
        assert_eq!(store.by_controller["p1"].len(), 1);

        let by_label = |store: &Store, label: &str| {
            store.orphans_by_label.get(&(Some("a".into()), "app".into(), label.into())).map_or(0, BTreeSet::len)
        };
        store.insert(&labelled("1", "x"));
        store.insert(&labelled("2", "x"));
        assert_eq!((by_label(&store, "x"), by_label(&store, "y")), (1, 0));
        store.insert(&labelled("3", "y"));
        assert_eq!((by_label(&store, "x"), by_label(&store, "y")), (0, 1));
        assert_eq!(store.get(&key("o")).and_then(|o| o.metadata.resource_version.clone()).as_deref(), Some("3"));
        assert_eq!(store.by_namespace[&Some("a".into())].len(), 2);
    }

    #[test]
    fn a_cached_object_reads_back_as_it_was_stored() {
        let value = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "namespace": "a", "resourceVersion": "7", "uid": "u1",
                         "creationTimestamp": "2026-12-01T11:00:00Z",
                         "labels": {"app": "web", "controller-uid": "p1"},
                         "annotations": {"metahook.dev/applied": "abc"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "P", "name": "p", "uid": "p1", "controller": true}]},
            "data": {"a": "1", "nested": "{\"k\": [1, 2.5, null]}"},
            "extra": {"list": [1, -2, 3.25, true, null, {"deep": {}}]}
        });
        let obj: DynamicObject = serde_json::from_value(value.clone()).unwrap();
        let mut store = Store::default();
        store.insert(&obj);
        let key = ObjectKey::of(&obj);
        let back = store.get(&key).unwrap();
        assert_eq!(serde_json::to_value(&*back).unwrap(), value);
        let controlled: Vec<&str> = store.by_controller["p1"].iter().map(|k| k.name.as_str()).collect();
        assert_eq!(controlled, ["x"]);
        // What an update replaces comes back whole too.
        let old = store.insert(&obj).unwrap();
        assert_eq!(serde_json::to_value(&*old).unwrap(), value);
    }

    #[test]
    fn label_selection_reads_the_labels_of_the_stored_json() {
        let mut store = Store::default();
        for (name, labels) in [("web", json!({"app": "web"})), ("db", json!({"app": "db"})), ("bare", json!(null))] {
            let obj: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": "a", "labels": labels}
            }))
            .unwrap();
            store.insert(&obj);
        }
        let names = |selector: &Selector| -> Vec<String> {
            let mut names: Vec<String> = store
                .resolve_selected(store.objects.keys(), selector)
                .iter()
                .map(|o| o.metadata.name.clone().unwrap())
                .collect();
            names.sort();
            names
        };
        assert_eq!(names(&Selector::from_labels(&BTreeMap::from([("app".into(), "web".into())]))), ["web"]);
        assert_eq!(names(&Selector::everything()), ["bare", "db", "web"]);
    }

    #[test]
    fn namespaced_types_are_watched_per_namespace_and_cluster_scoped_ones_cluster_wide() {
        let resource = |namespaced| ResolvedResource {
            api_resource: kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            namespaced,
            has_status: false,
        };
        let two = ["a".to_owned(), "b".to_owned()];
        assert_eq!(scopes(&resource(true), &two), [Some("a".to_owned()), Some("b".to_owned())]);
        assert_eq!(scopes(&resource(true), &[]), [None], "no namespaces: one watch, cluster-wide");
        assert_eq!(scopes(&resource(false), &two), [None], "a cluster-scoped type has no namespace");
    }

    #[test]
    fn a_namespaces_relist_removes_only_what_is_gone_from_that_namespace() {
        let mut store = Store::default();
        store.insert(&object("a", "kept", "1", None));
        store.insert(&object("a", "gone", "1", None));
        store.insert(&object("b", "other", "1", None));
        let seen: HashSet<ObjectKey> = [ObjectKey { namespace: Some("a".into()), name: "kept".into() }].into();
        let deleted: Vec<String> = remove_unseen(&mut store, Some("a"), &seen)
            .iter()
            .map(|c| c.object().metadata.name.clone().unwrap())
            .collect();
        assert_eq!(deleted, ["gone"], "b's object is b's watch's to list");
        assert_eq!(store.objects.len(), 2);
        assert!(remove_unseen(&mut store, Some("c"), &HashSet::new()).is_empty());
    }

    #[test]
    fn relist_reports_deletions_and_changed_objects_only() {
        let mut store = Store::default();
        store.insert(&object("a", "same", "1", None));
        store.insert(&object("a", "changed", "1", None));
        store.insert(&object("a", "gone", "1", None));
        let fresh = [object("a", "same", "1", None), object("a", "changed", "2", None), object("a", "new", "1", None)];
        let seen: HashSet<ObjectKey> = fresh.iter().map(|o| ObjectKey::of(o)).collect();
        let mut changes: Vec<Change> = fresh.into_iter().filter_map(|o| refresh(&mut store, o)).collect();
        changes.extend(remove_unseen(&mut store, None, &seen));
        let mut names: Vec<String> = changes
            .iter()
            .map(|c| match c {
                Change::Applied { new, .. } => format!("applied {}", new.metadata.name.as_deref().unwrap()),
                Change::Deleted(o) => format!("deleted {}", o.metadata.name.as_deref().unwrap()),
            })
            .collect();
        names.sort();
        assert_eq!(names, ["applied changed", "applied new", "deleted gone"]);
        assert_eq!(store.objects.len(), 3);
    }
}
