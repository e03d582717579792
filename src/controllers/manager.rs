//! The top of the hub: builds the shared [`Hub`] and runs one controller per CompositeController /
//! DecoratorController object: starts it, restarts it when its `spec` changes, stops it when the object
//! goes away, and reports on the object's status.
//!
//! Metadata-only edits (labels, annotations) do not restart a controller, as in Metacontroller; the
//! annotations that are settings (`metahook.dev/sync-on-own-writes`, the safe-delete guard) reach the
//! running controller as they change, with no restart (an invalid value restarts it, and its start says
//! why); the
//! `metahook.dev/sync-requested-at` annotation ([`crate::engine::trigger`]) queues every object it manages. When a
//! controller object is deleted, the finalizers it put on parents/targets are removed (Metacontroller
//! leaves them behind, #1062, and those objects can then never be deleted). Starts, failures to start
//! and stops are Events on the controller object.
//!
//! [`crate::ops::run`] runs it, with leader election only while this hub holds the Lease, with a client
//! whose writes stop at the renew deadline.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt as _;
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

use crate::api::{CompositeController, ControllerStatus, DecoratorController};
use crate::engine::error::StartError;
use crate::engine::health::ControllerState;
use crate::engine::hub::Hub;
use crate::engine::sync::Settings;
use crate::engine::sync::api_for;

/// A kind of controller object the manager runs.
pub trait Managed:
    Resource<DynamicType = (), Scope = ClusterResourceScope> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
    type Spec: PartialEq + Clone + Send + Sync + 'static;
    type Running: Send + Sync + 'static;
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
}

struct Running<K: Managed> {
    spec: K::Spec,
    uid: Option<String>,
    /// The annotations that are settings ([`Settings::annotations`]): a change reaches the running
    /// controller without a restart.
    settings: BTreeMap<String, String>,
    /// The value of the sync request annotation last acted on.
    requested: Option<String>,
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

/// Runs the controllers of both kinds (those whose objects match `selector`, a label selector; empty =
/// all) until `cancel` fires.
pub async fn run_controllers(hub: Hub, selector: String, cancel: CancellationToken) {
    let composites = Box::pin(watch_controllers::<CompositeController>(hub.clone(), selector.clone(), cancel.clone()));
    let decorators = Box::pin(watch_controllers::<DecoratorController>(hub, selector, cancel));
    tokio::join!(composites, decorators);
}

/// Watches controller objects of kind `K` (those matching the target label selector) until `cancel` fires.
async fn watch_controllers<K: Managed>(hub: Hub, selector: String, cancel: CancellationToken) {
    let api: Api<K> = Api::all(hub.client.clone());
    let mut config = watcher::Config::default();
    if !selector.is_empty() {
        config = config.labels(&selector);
    }
    // Listed again every flush interval, as every cache of the hub is: a controller object changed or
    // deleted unseen is acted on then.
    let start = move || crate::cache::informers::resilient(watcher(api.clone(), config.clone())).boxed();
    let mut events = crate::cache::relist::relisting(start, hub.informers.flush_interval());
    let mut running: HashMap<String, Running<K>> = HashMap::new();
    let mut relisted: Option<Vec<String>> = None;
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => break,
            event = events.next() => event,
        };
        let Some(event) = event else { break };
        match event {
            Err(err) => warn!("watching {}s (retrying): {err}", K::kind(&())),
            Ok(watcher::Event::Init) => relisted = Some(Vec::new()),
            Ok(watcher::Event::InitApply(obj)) => {
                relisted.get_or_insert_with(Vec::new).push(obj.name_any());
                reconcile(&hub, &mut running, obj).await;
            }
            Ok(watcher::Event::InitDone) => {
                hub.health.listed(&K::kind(&()));
                let seen = relisted.take().unwrap_or_default();
                let gone: Vec<String> = running.keys().filter(|n| !seen.contains(n)).cloned().collect();
                for name in gone {
                    stop(&hub, &mut running, &name, None).await;
                }
            }
            Ok(watcher::Event::Apply(obj)) => reconcile(&hub, &mut running, obj).await,
            Ok(watcher::Event::Delete(obj)) => {
                stop(&hub, &mut running, &obj.name_any(), None).await;
                hub.metrics.remove(&K::kind(&()), &obj.name_any());
                release_finalizers(&hub, &obj).await;
            }
        }
    }
    for (name, controller) in running.drain() {
        controller.stop().await;
        hub.health.remove(&K::kind(&()), &name);
    }
}

/// Stops controller `name`; `obj` (when it still exists) gets a `Stopped` Event saying `why`.
async fn stop<K: Managed>(hub: &Hub, running: &mut HashMap<String, Running<K>>, name: &str, obj: Option<(&K, &str)>) {
    if let Some(controller) = running.remove(name) {
        info!(controller = name, kind = %K::kind(&()), "stopping controller");
        controller.stop().await;
        hub.health.remove(&K::kind(&()), name);
        if let Some((obj, why)) = obj {
            hub.events.normal(&reference(obj), "Stopped", format!("Controller stopped: {why}")).await;
        }
    }
}

async fn reconcile<K: Managed>(hub: &Hub, running: &mut HashMap<String, Running<K>>, obj: K) {
    let name = obj.name_any();
    let settings = Settings::annotations(obj.meta().annotations.as_ref());
    let requested = crate::engine::trigger::requested_at(obj.meta()).map(str::to_owned);
    if let Some(current) = running.get_mut(&name)
        && &current.spec == obj.spec()
        && current.uid == obj.meta().uid
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
        if &current.spec == obj.spec() && current.uid == obj.meta().uid && current.settings == settings {
            if requested.is_some() && requested != current.requested {
                current.requested.clone_from(&requested);
                if let Some(controller) = current.started.get() {
                    let queued = K::resync_all(controller);
                    let at = requested.unwrap_or_default();
                    info!(controller = %name, kind = %K::kind(&()), queued, "sync requested at {at}");
                    let note = format!("Sync requested at {at}: queued {queued} objects");
                    hub.events.normal(&reference(&obj), "SyncRequested", note).await;
                }
            }
            return;
        }
        info!(controller = %name, kind = %K::kind(&()), "spec or settings changed; restarting controller");
        stop(hub, running, &name, Some((&obj, "spec changed, restarting"))).await;
    }
    let cancel = CancellationToken::new();
    let started = Arc::new(OnceLock::new());
    hub.health.set(&K::kind(&()), &name, ControllerState::Starting);
    let entry = Running {
        spec: obj.spec().clone(),
        uid: obj.meta().uid.clone(),
        settings,
        requested,
        started: Arc::clone(&started),
        cancel: cancel.clone(),
        task: tokio::spawn(supervise(hub.clone(), Arc::new(obj), started, cancel)),
    };
    running.insert(name, entry);
}

/// Starts the controller, retrying with backoff while it cannot start, then runs it until cancelled.
async fn supervise<K: Managed>(hub: Hub, obj: Arc<K>, slot: Arc<OnceLock<Arc<K::Running>>>, cancel: CancellationToken) {
    let name = obj.name_any();
    let kind = K::kind(&());
    let mut delay = Duration::from_secs(1);
    // Only the first attempt holds `/readyz` back: a controller that failed reports on itself.
    loop {
        let started = tokio::select! {
            () = cancel.cancelled() => return,
            started = K::start(&hub, Arc::clone(&obj)) => started,
        };
        match started {
            Ok(controller) => {
                info!(controller = %name, kind = %kind, "controller started");
                hub.health.set(&kind, &name, ControllerState::Running);
                let _ = slot.set(Arc::clone(&controller));
                // Said while the controller runs: its first syncs need not wait for the status write
                // and the Event (60-70 ms of a restart's 0.75 s at 1,000 parents).
                let announce = async {
                    report(&hub, &*obj, true, "Running", "controller is running".into()).await;
                    hub.events.normal(&reference(&*obj), "Started", "Controller started: caches synced".into()).await;
                };
                tokio::join!(announce, K::run(controller, cancel));
                return;
            }
            Err(err) => {
                warn!(controller = %name, kind = %kind, "cannot start controller (retrying in {delay:?}): {err}");
                hub.health.set(&kind, &name, ControllerState::Failed(err.reason().to_owned()));
                report(&hub, &*obj, false, err.reason(), err.to_string()).await;
                hub.events.warning(&reference(&*obj), err.reason(), format!("Cannot start controller: {err}")).await;
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
async fn report<K: Managed>(hub: &Hub, obj: &K, ready: bool, reason: &str, message: String) {
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

/// Removes a deleted controller's finalizer from every object that still carries it (in the hub's
/// namespaces, for a hub limited to some: it may list nothing else).
async fn release_finalizers<K: Managed>(hub: &Hub, obj: &K) {
    let (finalizer, types) = obj.finalizer();
    for (api_version, resource) in types {
        let Ok(resolved) = hub.discovery.resolve(&api_version, &resource).await else { continue };
        let apis: Vec<Api<kube::api::DynamicObject>> = match hub.informers.namespaces() {
            namespaces if resolved.namespaced && !namespaces.is_empty() => namespaces
                .iter()
                .map(|ns| Api::namespaced_with(hub.client.clone(), ns, &resolved.api_resource))
                .collect(),
            _ => vec![Api::all_with(hub.client.clone(), &resolved.api_resource)],
        };
        let mut items = Vec::new();
        for api in apis {
            if let Ok(list) = api.list(&kube::api::ListParams::default()).await {
                items.extend(list.items);
            }
        }
        for item in items.iter().filter(|o| crate::engine::finalizer::has_finalizer(o, &finalizer)) {
            let api = api_for(&hub.client, &resolved, item);
            if let Err(err) = crate::engine::finalizer::remove_finalizer(&api, item, &finalizer).await {
                warn!(object = %item.name_any(), "could not remove finalizer {finalizer}: {err}");
            } else {
                info!(object = %item.name_any(), finalizer, "removed finalizer of deleted controller");
            }
        }
    }
}
