//! Runs one [`composite::Controller`] per CompositeController object: starts it, restarts it when its
//! `spec` changes, stops it when the object goes away, and reports on the object's status.
//!
//! Metadata-only edits (labels, annotations) do not restart a controller, as in Metacontroller.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::{CompositeController, CompositeControllerSpec};
use crate::composite::Controller;
use crate::hub::Hub;

struct Running {
    spec: CompositeControllerSpec,
    uid: Option<String>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}

/// Watches CompositeControllers (those matching the target label selector) until `cancel` fires.
pub async fn run(hub: Hub, cancel: CancellationToken) {
    let api: Api<CompositeController> = Api::all(hub.client.clone());
    let mut config = watcher::Config::default();
    if !hub.config.target_label_selector.is_empty() {
        config = config.labels(&hub.config.target_label_selector);
    }
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut running: HashMap<String, Running> = HashMap::new();
    let mut relisted: Option<Vec<String>> = None;
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => break,
            event = events.next() => event,
        };
        let Some(event) = event else { break };
        match event {
            Err(err) => warn!("watching CompositeControllers (retrying): {err}"),
            Ok(watcher::Event::Init) => relisted = Some(Vec::new()),
            Ok(watcher::Event::InitApply(cc)) => {
                relisted.get_or_insert_with(Vec::new).push(cc.metadata.name.clone().unwrap_or_default());
                reconcile(&hub, &mut running, cc).await;
            }
            Ok(watcher::Event::InitDone) => {
                let seen = relisted.take().unwrap_or_default();
                let gone: Vec<String> = running.keys().filter(|n| !seen.contains(n)).cloned().collect();
                for name in gone {
                    stop(&mut running, &name).await;
                }
            }
            Ok(watcher::Event::Apply(cc)) => reconcile(&hub, &mut running, cc).await,
            Ok(watcher::Event::Delete(cc)) => stop(&mut running, cc.metadata.name.as_deref().unwrap_or_default()).await,
        }
    }
    for (_, controller) in running.drain() {
        controller.stop().await;
    }
}

async fn stop(running: &mut HashMap<String, Running>, name: &str) {
    if let Some(controller) = running.remove(name) {
        info!(controller = name, "stopping CompositeController");
        controller.stop().await;
    }
}

async fn reconcile(hub: &Hub, running: &mut HashMap<String, Running>, cc: CompositeController) {
    let name = cc.metadata.name.clone().unwrap_or_default();
    if let Some(current) = running.get(&name) {
        if current.spec == cc.spec && current.uid == cc.metadata.uid {
            return;
        }
        info!(controller = %name, "spec changed; restarting CompositeController");
        stop(running, &name).await;
    }
    let cancel = CancellationToken::new();
    let entry = Running {
        spec: cc.spec.clone(),
        uid: cc.metadata.uid.clone(),
        cancel: cancel.clone(),
        task: tokio::spawn(supervise(hub.clone(), Arc::new(cc), cancel)),
    };
    running.insert(name, entry);
}

/// Starts the controller, retrying with backoff while it cannot start, then runs it until cancelled.
async fn supervise(hub: Hub, cc: Arc<CompositeController>, cancel: CancellationToken) {
    let name = cc.metadata.name.clone().unwrap_or_default();
    let mut delay = Duration::from_secs(1);
    loop {
        let started = tokio::select! {
            () = cancel.cancelled() => return,
            started = Controller::start(&hub, Arc::clone(&cc)) => started,
        };
        match started {
            Ok(controller) => {
                info!(controller = %name, "CompositeController started");
                report(&hub, &cc, true, "Running", "controller is running".into()).await;
                controller.run(cancel).await;
                return;
            }
            Err(err) => {
                warn!(controller = %name, "cannot start CompositeController (retrying in {delay:?}): {err}");
                report(&hub, &cc, false, err.reason(), err.to_string()).await;
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
async fn report(hub: &Hub, cc: &CompositeController, ready: bool, reason: &str, message: String) {
    let status = if ready { "True" } else { "False" };
    let current = cc.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    let generation = cc.metadata.generation;
    let unchanged = current.is_some_and(|c| c.status == status && c.reason == reason && c.message == message)
        && cc.status.as_ref().and_then(|s| s.observed_generation) == generation;
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
    let api: Api<CompositeController> = Api::all(hub.client.clone());
    let name = cc.metadata.name.as_deref().unwrap_or_default();
    if let Err(err) = api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        warn!(controller = name, "could not update CompositeController status: {err}");
    }
}
