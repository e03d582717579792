//! What every controller kind shares between "a key came off the queue" and "the cluster matches":
//! the error types, the worker loop, the finalizer decision, status writes and hook-requested Events.
//!
//! [`crate::composite`] and [`crate::decorator`] are thin consumers of these pieces.

use std::fmt::Display;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use tracing::{debug, warn};

use crate::apply::ApplyError;
use crate::children::ClaimError;
use crate::discovery::{DiscoveryError, ResolvedResource};
use crate::events::{Events, reference};
use crate::hooks::{HookError, HookEvent};
use crate::queue::WorkQueue;
use crate::selector::SelectorError;

/// Why a controller object cannot run (reported in its `Ready` condition).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("no hooks defined")]
    NoHooks,
    #[error("{role} resource: {source}")]
    NotFound { role: &'static str, source: DiscoveryError },
    #[error("parent resource {resource} has no status subresource; metahook writes parent status through /status")]
    NoStatusSubresource { resource: String },
    #[error("rolling update methods need a namespaced parent (ControllerRevisions live in its namespace)")]
    RollingNeedsNamespacedParent,
    #[error("label selector: {0}")]
    Selector(#[from] SelectorError),
    #[error("{0}")]
    InvalidHookSetting(#[from] crate::hooks::SettingsError),
}

impl StartError {
    /// Short `PascalCase` reason for the condition.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoHooks => "NoHooks",
            Self::NotFound { role: "parent", .. } => "ParentResourceNotFound",
            Self::NotFound { role: "child", .. } => "ChildResourceNotFound",
            Self::NotFound { role: "attachment", .. } => "AttachmentResourceNotFound",
            Self::NotFound { role: "controllerrevision", .. } => "ControllerRevisionCRDNotInstalled",
            Self::NotFound { .. } => "ResourceNotFound",
            Self::NoStatusSubresource { .. } => "NoStatusSubresource",
            Self::RollingNeedsNamespacedParent => "UnsupportedUpdateMethod",
            Self::Selector(_) => "InvalidSelector",
            Self::InvalidHookSetting(_) => "InvalidHookSetting",
        }
    }
}

/// Why one object's sync failed. Every variant but [`SyncError::Apply`] means nothing was written:
/// the hook response is validated whole before any change.
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
    #[error("related resources: {0}")]
    Related(String),
    /// A related type's cache is still filling; retried quietly.
    #[error("related resource {0} not yet synced")]
    RelatedNotSynced(String),
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Apply(Vec<ApplyError>),
    #[error("updating {what}: {source}")]
    Write { what: &'static str, source: Box<kube::Error> },
    /// Someone else wrote the object since we read it; retried quietly with the fresh copy, as
    /// client-go's retry-on-conflict would.
    #[error("conflict updating {0}")]
    Conflict(&'static str),
}

impl From<ClaimError> for SyncError {
    fn from(e: ClaimError) -> Self {
        Self::Claim(Box::new(e))
    }
}

/// One controller's sync, driven by [`work`].
pub(crate) trait Syncer: Send + Sync + 'static {
    type Key: Clone + Eq + Hash + Display + Send + Sync + 'static;
    /// The controller object's name, for logs.
    fn name(&self) -> &str;
    fn queue(&self) -> &WorkQueue<Self::Key>;
    fn events(&self) -> &Events;
    /// Where sync counts and durations go.
    fn metrics(&self) -> &crate::metrics::ControllerMetrics;
    /// The cached object a key stands for (where failure Events go).
    fn object(&self, key: &Self::Key) -> Option<Arc<DynamicObject>>;
    /// Syncs one object; returns when to sync it again, if its hook asked.
    fn sync(&self, key: &Self::Key) -> impl Future<Output = Result<Option<Duration>, SyncError>> + Send;
}

/// A worker: takes keys off the queue until it shuts down. Failures are logged with the controller and
/// object names, recorded as a `SyncError` Event on the object, and retried with per-key backoff.
pub(crate) async fn work<S: Syncer>(syncer: Arc<S>) {
    let queue = syncer.queue().clone();
    while let Some(key) = queue.next().await {
        let started = std::time::Instant::now();
        let result = syncer.sync(&key).await;
        syncer.metrics().record(started.elapsed(), result.is_err());
        match result {
            Ok(resync) => {
                queue.forget(&key);
                if let Some(after) = resync {
                    queue.add_after(key.clone(), after);
                }
            }
            Err(SyncError::Hook(HookError::TooManyRequests { retry_after, .. })) => {
                debug!(controller = syncer.name(), object = %key, ?retry_after, "hook asked to retry later");
                queue.add_after(key.clone(), retry_after);
            }
            Err(SyncError::RelatedNotSynced(resource)) => {
                debug!(controller = syncer.name(), object = %key, resource, "related cache not synced yet");
                queue.add_rate_limited(key.clone());
            }
            Err(SyncError::Conflict(what)) => {
                debug!(controller = syncer.name(), object = %key, what, "conflict; retrying with a fresh copy");
                queue.add_rate_limited(key.clone());
            }
            Err(err) => {
                warn!(controller = syncer.name(), object = %key, "sync failed: {err}");
                if let Some(obj) = syncer.object(&key) {
                    syncer.events().warning(&reference(&obj), "SyncError", format!("Sync error: {err}")).await;
                }
                queue.add_rate_limited(key.clone());
            }
        }
        queue.done(&key);
    }
}

/// What to do with an object, given its finalizer state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Not ours to sync (not selected, or going away without our finalizer).
    Skip,
    /// The finalize hook was removed from the spec: drop our finalizer, nothing else.
    DropFinalizer,
    /// Call the hook. `add_finalizer`: put ours on first.
    Sync { finalizing: bool, add_finalizer: bool },
}

/// What the finalizer decision depends on.
#[derive(Debug, Clone, Copy)]
#[allow(clippy::struct_excessive_bools)] // four independent facts; an enum would hide which is which
pub(crate) struct Facts {
    pub finalize_hook: bool,
    pub selected: bool,
    pub has_finalizer: bool,
    pub deleting: bool,
}

/// Metacontroller's finalizer rules: a finalize hook is called on deletion, and when the object stops
/// matching the controller's selector, for as long as our finalizer is on it.
pub(crate) fn plan(facts: Facts) -> Step {
    let Facts { finalize_hook: has_finalize_hook, selected, has_finalizer, deleting } = facts;
    let finalizing = has_finalize_hook && (deleting || !selected);
    match (has_finalize_hook, has_finalizer) {
        (false, true) => Step::DropFinalizer,
        _ if finalizing && has_finalizer => Step::Sync { finalizing: true, add_finalizer: false },
        _ if deleting || !selected => Step::Skip,
        _ => Step::Sync { finalizing: false, add_finalizer: has_finalize_hook && !has_finalizer },
    }
}

/// Carries out [`plan`] for `obj`: adds or drops our finalizer as needed. Returns `None` when there is
/// nothing more to do, else whether the hook is called to finalize.
pub(crate) async fn follow_plan(
    api: &Api<DynamicObject>,
    obj: &DynamicObject,
    finalizer: &str,
    facts: Facts,
) -> Result<Option<bool>, SyncError> {
    match plan(facts) {
        Step::Skip => Ok(None),
        Step::DropFinalizer => set_finalizer(api, obj, finalizer, false).await.map(|()| None),
        Step::Sync { finalizing, add_finalizer } => {
            if add_finalizer {
                set_finalizer(api, obj, finalizer, true).await?;
            }
            Ok(Some(finalizing))
        }
    }
}

/// Adds a key to a controller's queue.
pub(crate) type Enqueue<K> = Arc<dyn Fn(K) + Send + Sync>;

/// A controller's queue, with its metrics reading the queue's depth and a handle that adds to it
/// (what [`crate::related::Related`] calls when a related object changes).
pub(crate) fn controller_queue<K: Clone + Eq + Hash + Send + Sync + 'static>(
    hub: &crate::hub::Hub,
    kind: &str,
    name: &str,
) -> (WorkQueue<K>, Arc<crate::metrics::ControllerMetrics>, Enqueue<K>) {
    let queue = WorkQueue::new(crate::queue::Backoff { base: hub.config.backoff_base, max: hub.config.backoff_max });
    let metrics = hub.metrics.controller(kind, name);
    metrics.set_depth({
        let queue = queue.clone();
        move || queue.len()
    });
    let enqueue = {
        let queue = queue.clone();
        Arc::new(move |key| queue.add(key))
    };
    (queue, metrics, enqueue)
}

/// Runs `workers` workers beside the controller's other `tasks` until `cancel` fires, then shuts the
/// queue and every task down.
pub(crate) async fn run_workers<S: Syncer>(
    syncer: Arc<S>,
    workers: usize,
    mut tasks: tokio::task::JoinSet<()>,
    cancel: tokio_util::sync::CancellationToken,
) {
    for _ in 0..workers {
        tasks.spawn(work(Arc::clone(&syncer)));
    }
    cancel.cancelled().await;
    syncer.queue().shut_down();
    tasks.shutdown().await;
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

/// Whether `obj` carries `finalizer`.
pub(crate) fn has_finalizer(obj: &DynamicObject, finalizer: &str) -> bool {
    obj.metadata.finalizers.iter().flatten().any(|f| f == finalizer)
}

/// Adds or removes `finalizer`, guarded by the object's resourceVersion (a conflict retries the sync).
pub(crate) async fn set_finalizer(
    api: &Api<DynamicObject>,
    obj: &DynamicObject,
    finalizer: &str,
    present: bool,
) -> Result<(), SyncError> {
    let mut finalizers: Vec<&String> = obj.metadata.finalizers.iter().flatten().filter(|f| *f != finalizer).collect();
    let ours = finalizer.to_owned();
    if present {
        finalizers.push(&ours);
    }
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": obj.metadata.resource_version}});
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(SyncError::Conflict("finalizers")),
        Err(e) => Err(SyncError::Write { what: "finalizers", source: Box::new(e) }),
    }
}

/// Replaces `.status` (through `/status` when the type has that subresource), unless it already is
/// `status`. Guarded by UID, so a recreated object of the same name is never written.
pub(crate) async fn replace_status(
    api: &Api<DynamicObject>,
    obj: &DynamicObject,
    status: Value,
    subresource: bool,
) -> Result<(), SyncError> {
    if obj.data.get("status") == Some(&status) {
        return Ok(());
    }
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/uid", "value": obj.metadata.uid},
        {"op": "add", "path": "/status", "value": status},
    ]))
    .expect("a well-formed JSON patch");
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    let patch = Patch::<()>::Json(patch);
    let written = if subresource {
        api.patch_status(name, &PatchParams::default(), &patch).await
    } else {
        api.patch(name, &PatchParams::default(), &patch).await
    };
    match written {
        Ok(_) => Ok(()),
        // Gone, or replaced by a new object of the same name: the next event brings the new state.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 || s.code == 422 => Ok(()),
        Err(e) => Err(SyncError::Write { what: "status", source: Box::new(e) }),
    }
}

/// Records the Events a hook asked for (metahook extension), at most ten per response.
pub(crate) async fn record_hook_events(events: &Events, obj: &DynamicObject, requested: &[HookEvent]) {
    let target = reference(obj);
    for event in requested.iter().take(10) {
        if event.type_ == "Warning" {
            events.warning(&target, &event.reason, event.message.clone()).await;
        } else {
            events.normal(&target, &event.reason, event.message.clone()).await;
        }
    }
}

/// `resyncAfterSeconds` as a delay; zero, negative or absent means none.
pub(crate) fn resync_after(seconds: Option<f64>) -> Option<Duration> {
    seconds.filter(|s| *s > 0.0).and_then(|s| Duration::try_from_secs_f64(s).ok())
}

/// Runs `tick` every `period` (the controller's `resyncPeriodSeconds`), first after one period.
pub(crate) async fn every(period: Duration, mut tick: impl FnMut()) {
    let mut ticks = tokio::time::interval(period);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        tick();
    }
}

/// `resyncPeriodSeconds` as a period (clamped to at least 1 s, as in Metacontroller).
pub(crate) fn resync_period(seconds: Option<i32>) -> Option<Duration> {
    seconds.map(|s| Duration::from_secs(u64::try_from(s.max(1)).unwrap_or(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Facts in the order (finalize hook, selected, has our finalizer, deleting) keep the table readable.
    #[allow(clippy::fn_params_excessive_bools)]
    fn f(finalize_hook: bool, selected: bool, has_finalizer: bool, deleting: bool) -> Facts {
        Facts { finalize_hook, selected, has_finalizer, deleting }
    }

    #[test]
    fn selected_live_objects_sync_and_get_our_finalizer_when_there_is_a_finalize_hook() {
        assert_eq!(plan(f(true, true, false, false)), Step::Sync { finalizing: false, add_finalizer: true });
        assert_eq!(plan(f(true, true, true, false)), Step::Sync { finalizing: false, add_finalizer: false });
        assert_eq!(plan(f(false, true, false, false)), Step::Sync { finalizing: false, add_finalizer: false });
    }

    #[test]
    fn deletion_or_opt_out_finalizes_only_while_our_finalizer_is_on() {
        assert_eq!(plan(f(true, true, true, true)), Step::Sync { finalizing: true, add_finalizer: false });
        assert_eq!(plan(f(true, false, true, false)), Step::Sync { finalizing: true, add_finalizer: false });
        assert_eq!(plan(f(true, true, false, true)), Step::Skip);
        assert_eq!(plan(f(true, false, false, false)), Step::Skip);
        assert_eq!(plan(f(false, true, false, true)), Step::Skip);
    }

    #[test]
    fn removed_finalize_hook_drops_the_finalizer() {
        assert_eq!(plan(f(false, true, true, false)), Step::DropFinalizer);
        assert_eq!(plan(f(false, false, true, true)), Step::DropFinalizer);
    }

    #[test]
    fn resync_values_follow_metacontroller() {
        assert_eq!(resync_after(Some(0.5)), Some(Duration::from_millis(500)));
        assert_eq!(resync_after(Some(0.0)), None);
        assert_eq!(resync_after(Some(-3.0)), None);
        assert_eq!(resync_period(Some(0)), Some(Duration::from_secs(1)));
        assert_eq!(resync_period(Some(30)), Some(Duration::from_secs(30)));
    }
}
