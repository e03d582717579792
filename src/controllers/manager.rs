//! The top of the hub: builds the shared [`Hub`] and runs one controller per CompositeController /
//! DecoratorController / MapController object: starts it, restarts it when its `spec` changes, stops it when the object
//! goes away, and reports on the object's status.
//!
//! Metadata-only edits (labels, annotations) do not restart a controller, as in Metacontroller; the
//! annotations that are settings (`metahook.dev/sync-on-own-writes`, the safe-delete guard) reach the
//! running controller as they change, with no restart (an invalid value restarts it, and its start says
//! why); the
//! `metahook.dev/sync-requested-at` annotation ([`crate::engine::trigger`]) queues every object it manages. When a
//! controller object is deleted, the finalizers it put on parents/targets are removed (Metacontroller
//! leaves them behind, #1062, and those objects can then never be deleted). That promise must outlive a
//! hub that is down, restarting or handing over leadership at the moment of the delete, so it is kept in
//! the API: the hub puts its own finalizer ([`CONTROLLER_FINALIZER`]) on every controller object before
//! starting it, and takes it off a deleted one only once the controller is stopped and its finalizers are
//! off every object (and its records of children elsewhere released). Starts, failures to start and
//! stops are Events on the controller object.
//!
//! Controllers read from files ([`crate::controllers::files`]) run here too, by the same rules: a changed
//! spec restarts one, a removed one stops (and its finalizers go, as for a deleted object). What would go
//! on the object (status, Events) goes to the log, the metrics and the hub's Pod instead.
//!
//! [`crate::ops::run`] runs it, with leader election only while this hub holds the Lease, with a client
//! whose writes stop at the renew deadline.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::core::ClusterResourceScope;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::{CompositeController, ControllerStatus, DecoratorController, FinalizedType, MapController};
use crate::controllers::files::{FileControllers, Files};
use crate::engine::error::StartError;
use crate::engine::health::ControllerState;
use crate::engine::hub::Hub;
use crate::engine::sync::Settings;

pub use crate::controllers::release::CONTROLLER_FINALIZER;
use crate::controllers::release::{Holdings, Release, Scope, Waiting};

/// A kind of controller object the manager runs.
pub trait Managed:
    Resource<DynamicType = (), Scope = ClusterResourceScope> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
    type Spec: PartialEq + Clone + Send + Sync + 'static;
    type Running: Send + Sync + 'static;
    /// Whether the hub runs without this kind's CRD installed, asking discovery again every discovery
    /// interval (a kind added after the others: an upgrade that did not install its CRD keeps working).
    const OPTIONAL: bool = false;
    fn spec(&self) -> &Self::Spec;
    fn status(&self) -> Option<&ControllerStatus>;
    /// Resolves types and waits for caches.
    fn start(hub: &Hub, obj: Arc<Self>) -> impl Future<Output = Result<Arc<Self::Running>, StartError>> + Send;
    /// Runs until `cancel` fires.
    fn run(running: Arc<Self::Running>, cancel: CancellationToken) -> impl Future<Output = ()> + Send;
    /// Queues every object the controller manages; returns how many.
    fn resync_all(running: &Self::Running) -> usize;
    /// Takes the settings of the controller object's annotations, live; an invalid one is refused.
    fn configure(running: &Self::Running, annotations: Option<&BTreeMap<String, String>>) -> Result<(), String>;
    /// The finalizer this controller puts on the objects it syncs, and the types it may be on.
    fn finalizer(&self) -> (String, Vec<(String, String)>);
    /// The types (apiVersion, plural) of the children it makes.
    fn child_types(&self) -> Vec<(String, String)>;
    /// What whoever may create its parents (targets) can make its customize hook read (`None`: it has
    /// none).
    fn related_reach(_running: &Self::Running) -> Option<crate::engine::related::Reach> {
        None
    }
    /// Whether the controller keeps records of children elsewhere (`crossNamespace`), each held by the
    /// hub's finalizer (see [`crate::write::records`]).
    fn keeps_records(&self) -> bool {
        false
    }
    /// The controllers of this kind in a reading of the files.
    fn from_files(files: &FileControllers) -> &BTreeMap<String, (String, Arc<Self>)>;
    /// The types its status says the hub ran it on (`status.finalizedTypes`, written before the hub
    /// puts its finalizer on any object of a type, pruned once it let go of a type the spec no longer names).
    fn recorded_types(&self) -> Vec<(String, String)> {
        self.status()
            .into_iter()
            .flat_map(|s| &s.finalized_types)
            .map(|t| (t.api_version.clone(), t.resource.clone()))
            .collect()
    }
    /// Whether its status says the hub kept records for it (`status.keepsRecords`).
    fn recorded_records(&self) -> bool {
        self.status().is_some_and(|s| s.keeps_records)
    }
    /// What the controller holds, to be let go of when it goes ([`crate::controllers::release`]): the
    /// types of its spec and those its status records from an earlier spec, and its records.
    fn holdings(&self) -> Holdings {
        let (finalizer, mut types) = self.finalizer();
        for t in self.recorded_types() {
            if !types.contains(&t) {
                types.push(t);
            }
        }
        let records = self.keeps_records() || self.recorded_records();
        Holdings { controller: self.name_any(), finalizer, types, records, children: self.child_types() }
    }
}

impl Managed for CompositeController {
    type Spec = crate::api::CompositeControllerSpec;
    type Running = crate::controllers::composite::Controller;
    fn spec(&self) -> &Self::Spec {
        &self.spec
    }
    fn status(&self) -> Option<&ControllerStatus> {
        self.status.as_ref()
    }
    async fn start(hub: &Hub, obj: Arc<Self>) -> Result<Arc<Self::Running>, StartError> {
        crate::controllers::composite::Controller::start(hub, obj).await
    }
    async fn run(running: Arc<Self::Running>, cancel: CancellationToken) {
        running.run(cancel).await;
    }
    fn resync_all(running: &Self::Running) -> usize {
        running.resync_all()
    }
    fn configure(running: &Self::Running, annotations: Option<&BTreeMap<String, String>>) -> Result<(), String> {
        running.configure(annotations)
    }
    fn finalizer(&self) -> (String, Vec<(String, String)>) {
        let parent = &self.spec.parent_resource;
        (
            format!("metacontroller.io/compositecontroller-{}", self.name_any()),
            vec![(parent.api_version.clone(), parent.resource.clone())],
        )
    }
    fn child_types(&self) -> Vec<(String, String)> {
        self.spec.child_resources.iter().map(|c| (c.api_version.clone(), c.resource.clone())).collect()
    }
    fn keeps_records(&self) -> bool {
        self.spec.child_resources.iter().any(crate::api::ChildResourceRule::cross_namespace)
    }
    fn related_reach(running: &Self::Running) -> Option<crate::engine::related::Reach> {
        running.related_reach()
    }
    fn from_files(files: &FileControllers) -> &BTreeMap<String, (String, Arc<Self>)> {
        &files.composites
    }
}

impl Managed for DecoratorController {
    type Spec = crate::api::DecoratorControllerSpec;
    type Running = crate::controllers::decorator::Controller;
    fn spec(&self) -> &Self::Spec {
        &self.spec
    }
    fn status(&self) -> Option<&ControllerStatus> {
        self.status.as_ref()
    }
    async fn start(hub: &Hub, obj: Arc<Self>) -> Result<Arc<Self::Running>, StartError> {
        crate::controllers::decorator::Controller::start(hub, obj).await
    }
    async fn run(running: Arc<Self::Running>, cancel: CancellationToken) {
        running.run(cancel).await;
    }
    fn resync_all(running: &Self::Running) -> usize {
        running.resync_all()
    }
    fn configure(running: &Self::Running, annotations: Option<&BTreeMap<String, String>>) -> Result<(), String> {
        running.configure(annotations)
    }
    fn finalizer(&self) -> (String, Vec<(String, String)>) {
        let types = self.spec.resources.iter().map(|r| (r.api_version.clone(), r.resource.clone())).collect();
        (crate::controllers::decorator::finalizer_name(&self.name_any()), types)
    }
    fn child_types(&self) -> Vec<(String, String)> {
        self.spec.attachments.iter().map(|c| (c.api_version.clone(), c.resource.clone())).collect()
    }
    fn related_reach(running: &Self::Running) -> Option<crate::engine::related::Reach> {
        running.related_reach()
    }
    fn from_files(files: &FileControllers) -> &BTreeMap<String, (String, Arc<Self>)> {
        &files.decorators
    }
}

impl Managed for MapController {
    type Spec = crate::api::MapControllerSpec;
    type Running = crate::controllers::map::Controller;
    /// A hub upgraded without the MapController CRD runs its other controllers as before.
    const OPTIONAL: bool = true;
    fn spec(&self) -> &Self::Spec {
        &self.spec
    }
    fn status(&self) -> Option<&ControllerStatus> {
        self.status.as_ref()
    }
    async fn start(hub: &Hub, obj: Arc<Self>) -> Result<Arc<Self::Running>, StartError> {
        crate::controllers::map::Controller::start(hub, obj).await
    }
    async fn run(running: Arc<Self::Running>, cancel: CancellationToken) {
        running.run(cancel).await;
    }
    fn resync_all(running: &Self::Running) -> usize {
        running.resync_all()
    }
    fn configure(running: &Self::Running, annotations: Option<&BTreeMap<String, String>>) -> Result<(), String> {
        running.configure(annotations)
    }
    fn finalizer(&self) -> (String, Vec<(String, String)>) {
        let parent = &self.spec.parent_resource;
        (
            crate::controllers::map::finalizer_name(&self.name_any()),
            vec![(parent.api_version.clone(), parent.resource.clone())],
        )
    }
    fn child_types(&self) -> Vec<(String, String)> {
        self.spec.output_resources.iter().map(|o| (o.api_version.clone(), o.resource.clone())).collect()
    }
    fn from_files(files: &FileControllers) -> &BTreeMap<String, (String, Arc<Self>)> {
        &files.maps
    }
}

struct Running<K: Managed> {
    spec: K::Spec,
    uid: Option<String>,
    /// Where it was read, for a controller from a file (`None`: an API object).
    origin: Option<String>,
    /// The annotations that are settings ([`Settings::annotations`]): a change reaches the running
    /// controller without a restart.
    settings: BTreeMap<String, String>,
    /// The value of the sync request annotation last acted on.
    requested: Option<String>,
    /// Whether it keeps records of children elsewhere ([`Managed::keeps_records`]).
    keeps_records: bool,
    /// The types its finalizer may be on ([`Managed::finalizer`]).
    finalized_types: Vec<(String, String)>,
    /// The controller, once it has started.
    started: Arc<OnceLock<Arc<K::Running>>>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl<K: Managed> Running<K> {
    async fn stop(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}

/// A reference to a controller object, for Events (cluster-scoped: they go to `default`).
fn reference<K: Managed>(obj: &K) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: obj.meta().name.clone(),
        uid: obj.meta().uid.clone(),
        ..k8s_openapi::api::core::v1::ObjectReference::default()
    }
}

/// An Event about controller `obj`: on the object, or for one read from a file (which is nowhere in the
/// API) on the hub's Pod, `pod`, naming the controller and its file; without a Pod, none (the log says it).
async fn announce<K: Managed>(
    hub: &Hub,
    pod: Option<&ObjectReference>,
    obj: &K,
    warning: bool,
    reason: &str,
    note: String,
) {
    let (target, note) = match crate::api::from_file(obj.meta()) {
        None => (reference(obj), note),
        Some(file) => match pod {
            Some(pod) => (pod.clone(), format!("{} {} ({file}): {note}", K::kind(&()), obj.name_any())),
            None => return,
        },
    };
    if warning {
        hub.events.warning(&target, reason, note).await;
    } else {
        hub.events.normal(&target, reason, note).await;
    }
}

/// Runs the controllers of both kinds until `cancel` fires: those whose objects match `selector` (a label
/// selector; empty = all), and those read from `files`, if given.
pub async fn run_controllers(hub: Hub, selector: String, files: Option<Files>, cancel: CancellationToken) {
    let composites = Box::pin(watch_controllers::<CompositeController>(
        hub.clone(),
        selector.clone(),
        files.clone(),
        cancel.clone(),
    ));
    let decorators = Box::pin(watch_controllers::<DecoratorController>(
        hub.clone(),
        selector.clone(),
        files.clone(),
        cancel.clone(),
    ));
    let maps = Box::pin(watch_controllers::<MapController>(hub, selector, files, cancel));
    tokio::join!(composites, decorators, maps);
}

/// Watches controller objects of kind `K` (those matching the target label selector), and follows the
/// file controllers of `files`, until `cancel` fires.
///
/// With files, the kind's CRD may be absent (standalone mode, for clusters where a team may not install
/// cluster-scoped CRDs): then nothing is watched, and discovery is asked again every discovery interval,
/// so a CRD installed later is watched from then on. Without files a missing CRD is an error the watch
/// retries and logs, as before: a hub that has nothing to run says so.
async fn watch_controllers<K: Managed>(hub: Hub, selector: String, files: Option<Files>, cancel: CancellationToken) {
    let api: Api<K> = Api::all(hub.client.clone());
    let mut config = watcher::Config::default();
    if !selector.is_empty() {
        config = config.labels(&selector);
    }
    // Listed again every flush interval, as every cache of the hub is: a controller object changed or
    // deleted unseen is acted on then.
    let start = move || crate::cache::informers::resilient(watcher(api.clone(), config.clone())).boxed();
    let flush = hub.informers.flush_interval();
    let open = || crate::cache::relist::relisting(start.clone(), flush);
    let mut controllers = Controllers::<K>::new(hub.clone(), files.as_ref().and_then(|f| f.pod.clone()));
    let mut set = files.map(|f| f.set);
    if let Some(set) = &mut set {
        let first = K::from_files(&set.borrow_and_update()).clone();
        controllers.files_changed(first).await;
    }
    let mut events = if (set.is_none() && !K::OPTIONAL) || served::<K>(&hub, true).await { Some(open()) } else { None };
    let mut recheck = tokio::time::interval(hub.discovery.ttl().max(Duration::from_secs(1)));
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    recheck.reset();
    let mut relisted: Option<Vec<String>> = None;
    loop {
        let watching = events.is_some();
        let next = async {
            match &mut events {
                Some(events) => events.next().await,
                None => std::future::pending().await,
            }
        };
        let changed = async {
            match &mut set {
                Some(set) => set.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        let step = tokio::select! {
            () = cancel.cancelled() => break,
            event = next => Step::Event(event),
            open = changed => Step::Files(open),
            _ = recheck.tick(), if !watching => Step::Recheck,
        };
        match step {
            Step::Event(None) => break,
            Step::Event(Some(event)) => controllers.event(event, &mut relisted).await,
            Step::Files(open) => match set.as_mut().filter(|_| open) {
                Some(receiver) => {
                    let files = K::from_files(&receiver.borrow_and_update()).clone();
                    controllers.files_changed(files).await;
                }
                // The reader is gone (the hub is stopping): the last set runs on.
                None => set = None,
            },
            Step::Recheck => {
                if served::<K>(&hub, false).await {
                    events = Some(open());
                }
            }
        }
    }
    for (name, controller) in controllers.running.drain() {
        controller.stop().await;
        hub.health.remove(&K::kind(&()), &name);
    }
    // This hub stops (or lost the lease): the next one releases what was left, from the API.
    for (_, releasing) in controllers.releasing.drain() {
        releasing.task.abort();
    }
}

/// What woke the manager's loop.
enum Step<E> {
    /// A watch event of the controller objects (`None`: the watch ended).
    Event(Option<E>),
    /// A new reading of the files (`false`: the reader is gone).
    Files(bool),
    /// Time to ask discovery again whether the CRD is installed.
    Recheck,
}

/// Whether the API serves kind `K` (its CRD is installed); `first`: the first asking, which says in the
/// log what follows when it is not. A kind not served counts as listed (there is nothing to list), so
/// the hub gets ready on its file controllers.
async fn served<K: Managed>(hub: &Hub, first: bool) -> bool {
    let kind = K::kind(&());
    match hub.discovery.resolve(crate::api::GROUP_VERSION, &K::plural(&())).await {
        Ok(_) => {
            if !first {
                info!(%kind, "the {kind} CRD is installed now: watching its objects beside the controllers from files");
            }
            true
        }
        Err(err) => {
            if first {
                info!(
                    %kind,
                    "not watching {kind}s: {err}; running the controllers from files, and asking again every \
                     discovery interval"
                );
            }
            hub.health.listed(&kind);
            false
        }
    }
}

/// The controllers of one kind: those of the API and of the files, and which of them run.
struct Controllers<K: Managed> {
    hub: Hub,
    /// Where Events about file controllers go.
    pod: Option<ObjectReference>,
    /// The controller objects of the API (matching the selector), as last seen.
    api: HashMap<String, K>,
    /// The file controllers, as last read, each with where it was read.
    files: BTreeMap<String, (String, Arc<K>)>,
    /// File controllers not run because an API object has their name (reported once each).
    refused: BTreeSet<String>,
    running: HashMap<String, Running<K>>,
    /// Releases under way ([`crate::controllers::release`]), by controller name.
    releasing: HashMap<String, Releasing>,
}

/// A release of a controller's holdings under way, in a task of its own that retries until done.
struct Releasing {
    /// The controller object it is for.
    uid: Option<String>,
    holdings: Holdings,
    /// Whether the hub's finalizer comes off the controller object once all is released.
    drop_own: bool,
    /// Set once everything is let go of (before the status is pruned): from then on it holds nothing.
    released: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

/// Says on the controller object (or, for one read from a file, the hub's Pod and the log) what a
/// release waits for: a Warning Event and the `Ready` condition, reason `Releasing`, which `kubectl
/// get` shows.
struct SayWaiting<K: Managed> {
    hub: Hub,
    pod: Option<ObjectReference>,
    obj: K,
}

impl<K: Managed> crate::controllers::release::Report for SayWaiting<K> {
    async fn waiting(&self, waiting: &Waiting, retry: Duration) {
        let what = self.obj.holdings();
        let note = format!(
            "waiting to take finalizer {} off its objects before the controller goes (next attempt in {}s): {waiting}",
            what.finalizer,
            retry.as_secs()
        );
        report(&self.hub, &self.obj, false, crate::controllers::release::RELEASING, note.clone()).await;
        announce(&self.hub, self.pod.as_ref(), &self.obj, true, "ReleaseWaiting", note).await;
    }
}

impl<K: Managed> Controllers<K> {
    fn new(hub: Hub, pod: Option<ObjectReference>) -> Self {
        Self {
            hub,
            pod,
            api: HashMap::new(),
            files: BTreeMap::new(),
            refused: BTreeSet::new(),
            running: HashMap::new(),
            releasing: HashMap::new(),
        }
    }

    /// Lets go of `holdings` of controller `obj` in a task of its own, retried with backoff until done
    /// (then, with `drop_own`, the hub's finalizer comes off the object). What an unfinished release of
    /// the same controller still had to do is joined in. With `runs` (the controller runs now, as
    /// `obj` says), what it holds again is kept: its types, and its records if it keeps records.
    fn let_go(&mut self, obj: &K, mut holdings: Holdings, drop_own: bool, runs: bool) {
        let name = obj.name_any();
        let uid = obj.meta().uid.clone();
        let previous = self.releasing.remove(&name).filter(|p| !p.task.is_finished());
        if let Some(previous) = &previous {
            for t in &previous.holdings.types {
                if !holdings.types.contains(t) {
                    holdings.types.push(t.clone());
                }
            }
            holdings.records |= previous.holdings.records;
        }
        if runs {
            let (_, kept) = obj.finalizer();
            holdings.types.retain(|t| !kept.contains(t));
            holdings.records &= !obj.keeps_records();
        }
        if let Some(previous) = previous {
            if previous.uid == uid && previous.holdings == holdings && previous.drop_own == drop_own {
                // The same release carries on.
                self.releasing.insert(name, previous);
                return;
            }
            previous.task.abort();
        }
        if holdings.types.is_empty() && !holdings.records && !drop_own {
            return;
        }
        let hub = self.hub.clone();
        let scope = Scope {
            client: hub.client.clone(),
            discovery: hub.discovery.clone(),
            namespaces: hub.informers.namespaces().to_vec(),
        };
        let say = SayWaiting { hub: hub.clone(), pod: self.pod.clone(), obj: obj.clone() };
        let release = Release { scope, holdings: holdings.clone() };
        let task_uid = uid.clone();
        let released_flag = Arc::new(AtomicBool::new(false));
        let done = Arc::clone(&released_flag);
        let task = tokio::spawn(async move {
            let kind = K::kind(&());
            if !drop_own && let Err(err) = record_types(&hub.client, &say.obj, Some(&release.holdings)).await {
                // Released all the same; a crash before it is done leaves what the status lacks held.
                warn!(controller = %name, %kind, "could not record what it lets go of in its status: {err}");
            }
            let released = release.run(&say).await;
            done.store(true, Ordering::SeqCst);
            info!(controller = %name, %kind, released, "the controller let go of its objects");
            if !drop_own {
                // The controller runs on: what it let go of is no longer recorded as held.
                let held = &release.holdings;
                if (!held.types.is_empty() || held.records)
                    && let Err(err) = forget_types(&release.scope, &say.obj, held).await
                {
                    warn!(controller = %name, %kind, "could not prune what its status records as held (the next start lets go of it again): {err}");
                }
                return;
            }
            let mut attempt = 0;
            loop {
                match crate::controllers::release::remove_controller_finalizer::<K>(
                    &hub.client,
                    &name,
                    task_uid.as_deref(),
                )
                .await
                {
                    Ok(()) => {
                        info!(controller = %name, %kind, "took the hub's finalizer off the controller");
                        break;
                    }
                    Err(err) => {
                        let retry = crate::controllers::release::backoff(attempt);
                        warn!(controller = %name, %kind, "could not remove the hub's finalizer (retrying in {retry:?}): {err}");
                        tokio::time::sleep(retry).await;
                        attempt += 1;
                    }
                }
            }
        });
        self.releasing.insert(obj.name_any(), Releasing { uid, holdings, drop_own, released: released_flag, task });
    }

    async fn event(&mut self, event: Result<watcher::Event<K>, watcher::Error>, relisted: &mut Option<Vec<String>>) {
        match event {
            Err(err) => warn!("watching {}s (retrying): {err}", K::kind(&())),
            Ok(watcher::Event::Init) => *relisted = Some(Vec::new()),
            Ok(watcher::Event::InitApply(obj)) => {
                relisted.get_or_insert_with(Vec::new).push(obj.name_any());
                self.applied(obj).await;
            }
            Ok(watcher::Event::InitDone) => {
                self.hub.health.listed(&K::kind(&()));
                let seen = relisted.take().unwrap_or_default();
                let gone: Vec<String> = self.api.keys().filter(|n| !seen.contains(n)).cloned().collect();
                for name in gone {
                    self.api.remove(&name);
                    self.settle(&name).await;
                }
            }
            Ok(watcher::Event::Apply(obj)) => self.applied(obj).await,
            Ok(watcher::Event::Delete(obj)) => {
                let name = obj.name_any();
                self.api.remove(&name);
                if self.files.contains_key(&name) {
                    // The file's controller of that name takes over, with the same finalizer.
                    self.settle(&name).await;
                } else {
                    stop(&self.hub, &mut self.running, &name, None).await;
                    self.hub.metrics.remove(&K::kind(&()), &name);
                    // Deleted, or (not deleted) it left this hub's `targetLabelSelector`: this hub lets go
                    // of its objects, and its own finalizer goes too, or a delete of it would wait for a
                    // hub that no longer selects it.
                    let drop_own = has_controller_finalizer(&obj);
                    self.let_go(&obj, obj.holdings(), drop_own, false);
                }
            }
        }
    }

    async fn applied(&mut self, mut obj: K) {
        // Only the hub marks a controller as read from a file.
        if let Some(annotations) = obj.meta_mut().annotations.as_mut() {
            annotations.remove(crate::api::FROM_FILE_ANNOTATION);
        }
        let name = obj.name_any();
        if obj.meta().deletion_timestamp.is_some() {
            self.deleting(obj).await;
            return;
        }
        if !has_controller_finalizer(&obj) {
            // On before the controller starts: from its first parent's finalizer on, a delete of the
            // controller waits for a hub to take those finalizers off.
            match add_controller_finalizer(&self.hub, &obj).await {
                Ok(()) => {}
                Err(err) => {
                    warn!(controller = %name, kind = %K::kind(&()), "could not put the hub's finalizer on the controller: {err}; a delete of it while no hub runs leaves its finalizers on the objects it synced");
                }
            }
        }
        self.api.insert(name.clone(), obj);
        self.settle(&name).await;
    }

    /// A controller object being deleted: it stops, and once its finalizers are off every object (unless
    /// a file's controller of the same name takes over, with the same finalizer), the hub's own comes
    /// off the object. Until then it stays, whether or not a hub was running when it was deleted; what
    /// cannot exist any more (a parent type whose CRD went with it) is not waited for, and a release that
    /// failed is retried with backoff in seconds ([`Controllers::let_go`]).
    async fn deleting(&mut self, obj: K) {
        let name = obj.name_any();
        self.api.remove(&name);
        let drop_own = has_controller_finalizer(&obj);
        if self.files.contains_key(&name) {
            // The file's controller of that name takes over, with the same finalizer.
            self.settle(&name).await;
            let nothing = Holdings { types: Vec::new(), records: false, ..obj.holdings() };
            self.let_go(&obj, nothing, drop_own, false);
        } else {
            stop(&self.hub, &mut self.running, &name, None).await;
            self.hub.metrics.remove(&K::kind(&()), &name);
            self.let_go(&obj, obj.holdings(), drop_own, false);
        }
    }

    /// Takes a new reading of the files: starts, restarts and stops what changed.
    async fn files_changed(&mut self, files: BTreeMap<String, (String, Arc<K>)>) {
        let gone: Vec<(String, Arc<K>)> = self
            .files
            .iter()
            .filter(|(n, _)| !files.contains_key(*n))
            .map(|(n, (_, obj))| (n.clone(), Arc::clone(obj)))
            .collect();
        let names: Vec<String> = files.keys().cloned().collect();
        self.files = files;
        for (name, obj) in gone {
            self.settle(&name).await;
            self.hub.metrics.files.forget(&K::kind(&()), &name);
            if !self.api.contains_key(&name) {
                // Removed from the files as a controller object is deleted: its finalizers go too.
                self.hub.metrics.remove(&K::kind(&()), &name);
                self.let_go(&obj, obj.holdings(), false, false);
            }
        }
        for name in names {
            self.settle(&name).await;
        }
    }

    /// Runs what `name` should be now: the API object, else the file's controller, else nothing. A name
    /// both have runs the API object, and the file's is refused (said once, until it is no longer).
    async fn settle(&mut self, name: &str) {
        let kind = K::kind(&());
        let file = self.files.get(name).cloned();
        match (&file, self.api.contains_key(name)) {
            (Some((origin, obj)), true) => {
                if self.refused.insert(name.to_owned()) {
                    let why = format!(
                        "{kind} {name:?} of {origin} is not run: a {kind} object of that name is in the API, and \
                         the API object runs (the file's starts when the object is deleted)"
                    );
                    warn!(controller = name, %kind, file = %origin, "{why}");
                    self.hub.metrics.files.ready(&kind, name, origin, false, "NameInUse");
                    announce(&self.hub, self.pod.as_ref(), &**obj, true, "NameInUse", why).await;
                }
            }
            _ => {
                self.refused.remove(name);
            }
        }
        self.hub.metrics.files.refused(&kind, self.refused.len());
        let run = self.api.get(name).cloned().or_else(|| file.map(|(_, obj)| (*obj).clone()));
        if let Some(obj) = run {
            let left = reconcile(&self.hub, self.pod.as_ref(), &mut self.running, obj.clone()).await;
            if left.is_some() || self.releasing.contains_key(name) {
                // What the controller no longer syncs is let go of; what it holds again (a parent type
                // changed back, a controller selected again) is kept, and its own finalizer stays.
                let nothing = Holdings { types: Vec::new(), records: false, ..obj.holdings() };
                self.let_go(&obj, left.unwrap_or(nothing), false, true);
            }
            self.keep_recorded(&obj).await;
        } else {
            stop(&self.hub, &mut self.running, name, None).await;
        }
    }

    /// Puts back in a running controller's status what it holds — by its spec, and by a release of it
    /// still under way — when the object shows a status without it (someone else wiped it: a restore
    /// that drops status). A controller still starting records it itself, before its first sync.
    async fn keep_recorded(&self, obj: &K) {
        let name = obj.name_any();
        if self.running.get(&name).is_none_or(|r| r.started.get().is_none()) {
            return;
        }
        let releasing = self.releasing_now(obj);
        if !records_what_it_holds(obj, releasing.as_ref())
            && let Err(err) = record_types(&self.hub.client, obj, releasing.as_ref()).await
        {
            warn!(controller = %name, kind = %K::kind(&()), "could not put back what its status records as held: {err}");
        }
    }

    /// What a release of controller object `obj` still lets go of while the controller runs on.
    fn releasing_now(&self, obj: &K) -> Option<Holdings> {
        self.releasing
            .get(&obj.name_any())
            .filter(|r| !r.released.load(Ordering::SeqCst) && !r.drop_own && r.uid == obj.meta().uid)
            .map(|r| r.holdings.clone())
    }
}

/// Stops controller `name`; `obj` (when it still exists) gets a `Stopped` Event saying `why`.
async fn stop<K: Managed>(
    hub: &Hub,
    running: &mut HashMap<String, Running<K>>,
    name: &str,
    obj: Option<(&K, Option<&ObjectReference>, &str)>,
) {
    if let Some(controller) = running.remove(name) {
        info!(controller = name, kind = %K::kind(&()), "stopping controller");
        controller.stop().await;
        hub.health.remove(&K::kind(&()), name);
        if let Some((obj, pod, why)) = obj {
            announce(hub, pod, obj, false, "Stopped", format!("Controller stopped: {why}")).await;
        }
    }
}

/// Starts, restarts or reconfigures controller `obj`. Returns what a restart left for the controller to
/// let go of (a parent type it no longer syncs, records it no longer keeps), if anything.
async fn reconcile<K: Managed>(
    hub: &Hub,
    pod: Option<&ObjectReference>,
    running: &mut HashMap<String, Running<K>>,
    obj: K,
) -> Option<Holdings> {
    let name = obj.name_any();
    let mut left = None;
    let settings = Settings::annotations(obj.meta().annotations.as_ref());
    let requested = crate::engine::trigger::requested_at(obj.meta()).map(str::to_owned);
    let origin = crate::api::from_file(obj.meta()).map(str::to_owned);
    if let Some(current) = running.get_mut(&name)
        && &current.spec == obj.spec()
        && current.uid == obj.meta().uid
        && current.origin == origin
        && current.settings != settings
        && let Some(controller) = current.started.get()
    {
        // Settings are live: the running controller takes them (an invalid value restarts it below,
        // and the start refuses it with a condition saying why).
        if K::configure(controller, obj.meta().annotations.as_ref()).is_ok() {
            info!(controller = %name, kind = %K::kind(&()), ?settings, "settings changed; applied without a restart");
            current.settings = settings.clone();
        }
    }
    if let Some(current) = running.get_mut(&name) {
        if &current.spec == obj.spec()
            && current.uid == obj.meta().uid
            && current.origin == origin
            && current.settings == settings
        {
            if requested.is_some() && requested != current.requested {
                current.requested.clone_from(&requested);
                if let Some(controller) = current.started.get() {
                    let queued = K::resync_all(controller);
                    let at = requested.unwrap_or_default();
                    info!(controller = %name, kind = %K::kind(&()), queued, "sync requested at {at}");
                    let note = format!("Sync requested at {at}: queued {queued} objects");
                    announce(hub, pod, &obj, false, "SyncRequested", note).await;
                }
            }
            return None;
        }
        info!(controller = %name, kind = %K::kind(&()), file = ?origin, "spec or settings changed; restarting controller");
        let kept_records = running.get(&name).is_some_and(|r| r.keeps_records);
        let types = obj.finalizer().1;
        let mut left_types: Vec<(String, String)> = running
            .get(&name)
            .map(|r| r.finalized_types.iter().filter(|t| !types.contains(t)).cloned().collect())
            .unwrap_or_default();
        for t in left_in_status(&obj) {
            if !left_types.contains(&t) {
                left_types.push(t);
            }
        }
        stop(hub, running, &name, Some((&obj, pod, "spec changed, restarting"))).await;
        // A parent (target) type the controller no longer syncs: nothing would take its finalizer off the
        // objects of that type it synced, and they could never be deleted. No child type is
        // `crossNamespace` any more: nothing will deal with the records' finalizers.
        let records = (kept_records || obj.recorded_records()) && !obj.keeps_records();
        if !left_types.is_empty() || records {
            left = Some(Holdings { types: left_types, records, ..obj.holdings() });
        }
    } else {
        // First seen by this hub: a type its status records and its spec no longer names (or records it
        // no longer keeps) were taken out while no hub ran (or before this one started), and are let go
        // of as if taken out now.
        let left_types = left_in_status(&obj);
        let records = obj.recorded_records() && !obj.keeps_records();
        if !left_types.is_empty() || records {
            info!(controller = %name, kind = %K::kind(&()), types = ?left_types, records, "taken out of the spec while no hub ran; letting go of them");
            left = Some(Holdings { types: left_types, records, ..obj.holdings() });
        }
    }
    let cancel = CancellationToken::new();
    let started = Arc::new(OnceLock::new());
    hub.health.set(&K::kind(&()), &name, ControllerState::Starting);
    let entry = Running {
        spec: obj.spec().clone(),
        uid: obj.meta().uid.clone(),
        origin,
        settings,
        requested,
        keeps_records: obj.keeps_records(),
        finalized_types: obj.finalizer().1,
        started: Arc::clone(&started),
        cancel: cancel.clone(),
        task: tokio::spawn(supervise(hub.clone(), pod.cloned(), Arc::new(obj), started, cancel)),
    };
    running.insert(name, entry);
    left
}

/// Starts the controller, retrying with backoff while it cannot start, then runs it until cancelled.
async fn supervise<K: Managed>(
    hub: Hub,
    pod: Option<ObjectReference>,
    obj: Arc<K>,
    slot: Arc<OnceLock<Arc<K::Running>>>,
    cancel: CancellationToken,
) {
    let name = obj.name_any();
    let kind = K::kind(&());
    let file = crate::api::from_file(obj.meta()).map(str::to_owned);
    let pod = pod.as_ref();
    let mut delay = Duration::from_secs(1);
    // Only the first attempt holds `/readyz` back: a controller that failed reports on itself.
    loop {
        let start = async {
            // Recorded before the controller can put its finalizer on any object of these types.
            record_types(&hub.client, &*obj, None).await.map_err(StartError::RecordTypes)?;
            K::start(&hub, Arc::clone(&obj)).await
        };
        let started = tokio::select! {
            () = cancel.cancelled() => return,
            started = start => started,
        };
        match started {
            Ok(controller) => {
                info!(controller = %name, kind = %kind, file, "controller started");
                hub.health.set(&kind, &name, ControllerState::Running);
                let _ = slot.set(Arc::clone(&controller));
                // Said while the controller runs: its first syncs need not wait for the status write
                // and the Event (60-70 ms of a restart's 0.75 s at 1,000 parents).
                let reach = K::related_reach(&controller).filter(crate::engine::related::Reach::unbounded);
                let announced = async {
                    report(&hub, &*obj, true, "Running", "controller is running".into()).await;
                    announce(&hub, pod, &*obj, false, "Started", "Controller started: caches synced".into()).await;
                    if let Some(reach) = reach {
                        // Metacontroller's rules, kept for its manifests, and said: nothing else would.
                        let note = format!(
                            "whoever may create a {kind}'s parents can make its customize hook's related rules \
                             read {reach} through the hub; declare spec.relatedLimit to bound it"
                        );
                        warn!(controller = %name, %kind, "{note}");
                        announce(&hub, pod, &*obj, true, "RelatedUnlimited", note).await;
                    }
                };
                tokio::join!(announced, K::run(controller, cancel));
                return;
            }
            Err(err) => {
                warn!(controller = %name, kind = %kind, file, "cannot start controller (retrying in {delay:?}): {err}");
                hub.health.set(&kind, &name, ControllerState::Failed(err.reason().to_owned()));
                report(&hub, &*obj, false, err.reason(), err.to_string()).await;
                announce(&hub, pod, &*obj, true, err.reason(), format!("Cannot start controller: {err}")).await;
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(60));
            }
        }
    }
}

/// Writes the `Ready` condition and `observedGeneration` when they change.
/// For a controller read from a file, which has no status to write, `metahook_file_controller_ready`
/// says it instead (and the log, where the manager says each start and each failure).
async fn report<K: Managed>(hub: &Hub, obj: &K, ready: bool, reason: &str, message: String) {
    if let Some(file) = crate::api::from_file(obj.meta()) {
        hub.metrics.files.ready(&K::kind(&()), &obj.name_any(), file, ready, reason);
        return;
    }
    let status = if ready { "True" } else { "False" };
    let current = obj.status().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    let generation = obj.meta().generation;
    let unchanged = current.is_some_and(|c| c.status == status && c.reason == reason && c.message == message)
        && obj.status().and_then(|s| s.observed_generation) == generation;
    if unchanged {
        return;
    }
    let condition = Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: Time(Timestamp::now()),
    };
    // The other conditions (a canary's) are kept: a merge patch replaces the whole list.
    let mut conditions: Vec<&Condition> =
        obj.status().into_iter().flat_map(|s| &s.conditions).filter(|c| c.type_ != "Ready").collect();
    conditions.push(&condition);
    let patch = json!({"status": {"observedGeneration": generation, "conditions": conditions}});
    let api: Api<K> = Api::all(hub.client.clone());
    if let Err(err) = api.patch_status(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        warn!(controller = %obj.name_any(), "could not update controller status: {err}");
    }
}

/// The types `obj`'s status records (`status.finalizedTypes`) that its spec no longer names.
pub(crate) fn left_in_status<K: Managed>(obj: &K) -> Vec<(String, String)> {
    let current = obj.finalizer().1;
    obj.recorded_types().into_iter().filter(|t| !current.contains(t)).collect()
}

/// What a controller's status records as held: the types its finalizer may be on, and whether it
/// keeps records.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Held {
    types: Vec<(String, String)>,
    records: bool,
}

/// Rewrites what the status of controller `name` (UID `uid`) records as held, as `change` makes it from
/// what the API holds now, with the object's `resourceVersion` as a precondition (a conflict reads it
/// again): the manager adds and a finished release prunes, and neither may undo the other. A controller
/// read from a file has no status to keep it in (its files are the operator's record); one deleted or
/// made anew meanwhile is left alone.
async fn rewrite_held<K: Managed>(
    client: &kube::Client,
    name: &str,
    uid: Option<&str>,
    change: impl Fn(&K, Held) -> Held,
) -> Result<(), kube::Error> {
    let api: Api<K> = Api::all(client.clone());
    let mut attempt = 0;
    loop {
        let Some(fresh) = api.get_opt(name).await? else { return Ok(()) };
        if fresh.meta().uid.as_deref() != uid || fresh.meta().deletion_timestamp.is_some() {
            return Ok(());
        }
        let recorded = Held { types: fresh.recorded_types(), records: fresh.recorded_records() };
        let wanted = change(&fresh, recorded.clone());
        if wanted == recorded {
            return Ok(());
        }
        let types: Vec<FinalizedType> =
            wanted.types.into_iter().map(|(api_version, resource)| FinalizedType { api_version, resource }).collect();
        let patch = json!({
            "metadata": {"resourceVersion": fresh.meta().resource_version},
            // Absent rather than `false` or `[]`: a status that holds nothing says nothing.
            "status": {
                "finalizedTypes": if types.is_empty() { serde_json::Value::Null } else { json!(types) },
                "keepsRecords": if wanted.records { json!(true) } else { serde_json::Value::Null },
            },
        });
        match api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < 10 => attempt += 1,
            Err(err) => return Err(err),
        }
    }
}

/// Whether `obj`'s status records all it holds by its spec and, with `releasing`, what a release still
/// lets go of (a controller read from a file has nothing to record).
fn records_what_it_holds<K: Managed>(obj: &K, releasing: Option<&Holdings>) -> bool {
    let recorded = obj.recorded_types();
    let types = obj.finalizer().1.into_iter().chain(releasing.into_iter().flat_map(|h| h.types.clone()));
    let records = obj.keeps_records() || releasing.is_some_and(|h| h.records);
    crate::api::from_file(obj.meta()).is_some()
        || (types.into_iter().all(|t| recorded.contains(&t)) && (!records || obj.recorded_records()))
}

/// Adds what `obj` holds to its status — the types its finalizer will be on, and whether it keeps
/// records, by its spec and, with `releasing`, by a release still under way — keeping what is recorded
/// already. Read afresh each time (one GET; a write only when something is missing): the object a
/// start was given may be older than a status someone wiped.
async fn record_types<K: Managed>(
    client: &kube::Client,
    obj: &K,
    releasing: Option<&Holdings>,
) -> Result<(), kube::Error> {
    if crate::api::from_file(obj.meta()).is_some() {
        return Ok(());
    }
    let mut adding = obj.finalizer().1;
    adding.extend(releasing.into_iter().flat_map(|h| h.types.clone()));
    let keeps = obj.keeps_records() || releasing.is_some_and(|h| h.records);
    rewrite_held::<K>(client, &obj.name_any(), obj.meta().uid.as_deref(), |_, mut held| {
        for t in &adding {
            if !held.types.contains(t) {
                held.types.push(t.clone());
            }
        }
        held.records |= keeps;
        held
    })
    .await
}

/// Takes what a finished release let go of (`released`: its types, and its records) out of `obj`'s
/// status, except what its spec holds again by now. Only after a release over the whole cluster
/// (`scope.namespaces` empty): the record is the cluster's, and a release limited to some namespaces
/// left the others' objects held.
pub(crate) async fn forget_types<K: Managed>(scope: &Scope, obj: &K, released: &Holdings) -> Result<(), kube::Error> {
    if crate::api::from_file(obj.meta()).is_some() || !scope.namespaces.is_empty() {
        return Ok(());
    }
    let client = &scope.client;
    rewrite_held::<K>(client, &obj.name_any(), obj.meta().uid.as_deref(), |fresh, held| {
        let current = fresh.finalizer().1;
        let types = held.types.into_iter().filter(|t| !released.types.contains(t) || current.contains(t)).collect();
        let records = held.records && (!released.records || fresh.keeps_records());
        Held { types, records }
    })
    .await
}

/// Whether the hub's finalizer is on controller object `obj`.
fn has_controller_finalizer<K: Managed>(obj: &K) -> bool {
    obj.meta().finalizers.iter().flatten().any(|f| f == CONTROLLER_FINALIZER)
}

/// Puts the hub's finalizer on controller object `obj` (a patch naming its resourceVersion: a conflict
/// is retried at its next event).
async fn add_controller_finalizer<K: Managed>(hub: &Hub, obj: &K) -> Result<(), kube::Error> {
    let mut finalizers: Vec<String> = obj.meta().finalizers.clone().unwrap_or_default();
    finalizers.push(CONTROLLER_FINALIZER.to_owned());
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": obj.meta().resource_version}});
    let api: Api<K> = Api::all(hub.client.clone());
    api.patch(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await.map(drop)
}
