//! The top of the hub: builds the shared [`Hub`] and runs one controller per CompositeController /
//! DecoratorController object: starts it, restarts it when its `spec` changes, stops it when the object
//! goes away, and reports on the object's status.
//!
//! Metadata-only edits (labels, annotations) do not restart a controller, as in Metacontroller, except
//! the safe-delete guard annotation, which configures the running controller. When a
//! controller object is deleted, the finalizers it put on parents/targets are removed (Metacontroller
//! leaves them behind, #1062, and those objects can then never be deleted).

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::core::ClusterResourceScope;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::{CompositeController, ControllerStatus, DecoratorController};
use crate::children::MAX_DELETIONS_ANNOTATION;
use crate::config::Config;
use crate::hub::Hub;
use crate::sync::{StartError, api_for};

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
    /// The finalizer this controller puts on the objects it syncs, and the types it may be on.
    fn finalizer(&self) -> (String, Vec<(String, String)>);
}

impl Managed for CompositeController {
    type Spec = crate::api::CompositeControllerSpec;
    type Running = crate::composite::Controller;
    fn spec(&self) -> &Self::Spec {
        &self.spec
    }
    fn status(&self) -> Option<&ControllerStatus> {
        self.status.as_ref()
    }
    async fn start(hub: &Hub, obj: Arc<Self>) -> Result<Arc<Self::Running>, StartError> {
        crate::composite::Controller::start(hub, obj).await
    }
    async fn run(running: Arc<Self::Running>, cancel: CancellationToken) {
        running.run(cancel).await;
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
    type Running = crate::decorator::Controller;
    fn spec(&self) -> &Self::Spec {
        &self.spec
    }
    fn status(&self) -> Option<&ControllerStatus> {
        self.status.as_ref()
    }
    async fn start(hub: &Hub, obj: Arc<Self>) -> Result<Arc<Self::Running>, StartError> {
        crate::decorator::Controller::start(hub, obj).await
    }
    async fn run(running: Arc<Self::Running>, cancel: CancellationToken) {
        running.run(cancel).await;
    }
    fn finalizer(&self) -> (String, Vec<(String, String)>) {
        let types = self.spec.resources.iter().map(|r| (r.api_version.clone(), r.resource.clone())).collect();
        (crate::decorator::finalizer_name(&self.name_any()), types)
    }
}

struct Running<K: Managed> {
    spec: K::Spec,
    uid: Option<String>,
    /// The safe-delete guard annotation: the one metadata field that changes how a controller runs.
    guard: Option<String>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl<K: Managed> Running<K> {
    async fn stop(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}

/// Errors that stop the hub.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("waiting for shutdown signal: {0}")]
    Signal(#[from] std::io::Error),
}

/// Runs every CompositeController and DecoratorController until Ctrl-C / SIGTERM.
pub async fn run(client: Client, config: Config) -> Result<(), HubError> {
    let cancel = CancellationToken::new();
    let hub = tokio::spawn(run_until(client, config, cancel.clone()));
    shutdown_signal().await?;
    info!("shutting down");
    cancel.cancel();
    let _ = hub.await;
    Ok(())
}

/// Runs every CompositeController and DecoratorController until `cancel` fires (how tests and embedders
/// run a hub).
pub async fn run_until(client: Client, config: Config, cancel: CancellationToken) {
    let hub = Hub::new(client, config);
    let server = crate::metrics::start(&hub.config.metrics_address, hub.metrics.clone(), hub.informers.clone()).await;
    let composites = Box::pin(watch_controllers::<CompositeController>(hub.clone(), cancel.clone()));
    let decorators = Box::pin(watch_controllers::<DecoratorController>(hub, cancel));
    tokio::join!(composites, decorators);
    if let Some(server) = server {
        server.abort();
    }
}

async fn shutdown_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}

/// Watches controller objects of kind `K` (those matching the target label selector) until `cancel` fires.
async fn watch_controllers<K: Managed>(hub: Hub, cancel: CancellationToken) {
    let api: Api<K> = Api::all(hub.client.clone());
    let mut config = watcher::Config::default();
    if !hub.config.target_label_selector.is_empty() {
        config = config.labels(&hub.config.target_label_selector);
    }
    let mut events = crate::informers::resilient(watcher(api, config)).boxed();
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
                let seen = relisted.take().unwrap_or_default();
                let gone: Vec<String> = running.keys().filter(|n| !seen.contains(n)).cloned().collect();
                for name in gone {
                    stop(&mut running, &name).await;
                }
            }
            Ok(watcher::Event::Apply(obj)) => reconcile(&hub, &mut running, obj).await,
            Ok(watcher::Event::Delete(obj)) => {
                stop(&mut running, &obj.name_any()).await;
                hub.metrics.remove(&K::kind(&()), &obj.name_any());
                release_finalizers(&hub, &obj).await;
            }
        }
    }
    for (_, controller) in running.drain() {
        controller.stop().await;
    }
}

async fn stop<K: Managed>(running: &mut HashMap<String, Running<K>>, name: &str) {
    if let Some(controller) = running.remove(name) {
        info!(controller = name, kind = %K::kind(&()), "stopping controller");
        controller.stop().await;
    }
}

async fn reconcile<K: Managed>(hub: &Hub, running: &mut HashMap<String, Running<K>>, obj: K) {
    let name = obj.name_any();
    let guard = obj.meta().annotations.as_ref().and_then(|a| a.get(MAX_DELETIONS_ANNOTATION)).cloned();
    if let Some(current) = running.get(&name) {
        if &current.spec == obj.spec() && current.uid == obj.meta().uid && current.guard == guard {
            return;
        }
        info!(controller = %name, kind = %K::kind(&()), "spec or deletion guard changed; restarting controller");
        stop(running, &name).await;
    }
    let cancel = CancellationToken::new();
    let entry = Running {
        spec: obj.spec().clone(),
        uid: obj.meta().uid.clone(),
        guard,
        cancel: cancel.clone(),
        task: tokio::spawn(supervise(hub.clone(), Arc::new(obj), cancel)),
    };
    running.insert(name, entry);
}

/// Starts the controller, retrying with backoff while it cannot start, then runs it until cancelled.
async fn supervise<K: Managed>(hub: Hub, obj: Arc<K>, cancel: CancellationToken) {
    let name = obj.name_any();
    let mut delay = Duration::from_secs(1);
    loop {
        let started = tokio::select! {
            () = cancel.cancelled() => return,
            started = K::start(&hub, Arc::clone(&obj)) => started,
        };
        match started {
            Ok(controller) => {
                info!(controller = %name, kind = %K::kind(&()), "controller started");
                report(&hub, &*obj, true, "Running", "controller is running".into()).await;
                K::run(controller, cancel).await;
                return;
            }
            Err(err) => {
                warn!(controller = %name, kind = %K::kind(&()), "cannot start controller (retrying in {delay:?}): {err}");
                report(&hub, &*obj, false, err.reason(), err.to_string()).await;
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
    let patch = json!({"status": {"observedGeneration": generation, "conditions": [condition]}});
    let api: Api<K> = Api::all(hub.client.clone());
    if let Err(err) = api.patch_status(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        warn!(controller = %obj.name_any(), "could not update controller status: {err}");
    }
}

/// Removes a deleted controller's finalizer from every object that still carries it.
async fn release_finalizers<K: Managed>(hub: &Hub, obj: &K) {
    let (finalizer, types) = obj.finalizer();
    for (api_version, resource) in types {
        let Ok(resolved) = hub.discovery.resolve(&api_version, &resource).await else { continue };
        let list = Api::<kube::api::DynamicObject>::all_with(hub.client.clone(), &resolved.api_resource)
            .list(&kube::api::ListParams::default())
            .await;
        let Ok(list) = list else { continue };
        for item in list.items.iter().filter(|o| crate::sync::has_finalizer(o, &finalizer)) {
            let api = api_for(&hub.client, &resolved, item);
            if let Err(err) = crate::sync::set_finalizer(&api, item, &finalizer, false).await {
                warn!(object = %item.name_any(), "could not remove finalizer {finalizer}: {err}");
            } else {
                info!(object = %item.name_any(), finalizer, "removed finalizer of deleted controller");
            }
        }
    }
}
