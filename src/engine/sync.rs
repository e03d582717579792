//! What every controller kind shares between "a key came off the queue" and "the cluster matches":
//! the error types, the worker loop, the finalizer decision, status writes and hook-requested Events.
//!
//! [`crate::controllers::composite`] and [`crate::controllers::decorator`] are thin consumers of these pieces.

use std::fmt::Display;
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use tracing::{Instrument as _, debug, info_span, warn};

use crate::cache::discovery::{DiscoveryError, ResolvedResource};
use crate::cache::selector::SelectorError;
use crate::engine::answered::{Answered, RequestId};
use crate::engine::events::{Events, reference};
use crate::engine::queue::{Reasons, WorkQueue};
use crate::hooks::{HookError, HookEvent};
use crate::write::apply::ApplyError;
use crate::write::children::{ClaimError, PlanError};

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
    Annotation(String),
    /// A cache could not be filled: the type may not be listed/watched, or the API did not answer.
    #[error("{0}")]
    CacheSync(#[from] crate::cache::informers::SyncTimeout),
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
            Self::Annotation(_) => "InvalidAnnotation",
            Self::CacheSync(crate::cache::informers::SyncTimeout::Forbidden { .. }) => "Forbidden",
            Self::CacheSync(crate::cache::informers::SyncTimeout::NotSynced { .. }) => "WatchFailed",
            Self::InvalidHookSetting(_) => "InvalidHookSetting",
        }
    }
}

/// Why one object's sync failed. Every variant but [`SyncError::Apply`] and [`SyncError::Status`] means
/// nothing was written: the hook response is validated whole, and the writes planned, before any change.
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
    /// The planned writes were refused before any of them was made.
    #[error("{0}")]
    Plan(#[from] PlanError),
    /// The API server refused the status the hook asked for (e.g. it breaks the CRD's schema).
    #[error("the API server refused the status: {0}")]
    Status(String),
    /// The sync itself failed unexpectedly; the worker survives and the object is retried.
    #[error("sync panicked: {0}")]
    Panicked(String),
}

impl SyncError {
    /// The reason of the Warning Event that reports this error.
    #[must_use]
    pub fn event_reason(&self) -> &'static str {
        match self {
            Self::Plan(PlanError::DeletionGuard { .. }) => "DeletionGuard",
            _ => "SyncError",
        }
    }

    /// Whether this is a transient state that a retry resolves without anyone's help: logged at debug,
    /// retried with backoff, no Event.
    #[must_use]
    pub fn is_quiet(&self) -> bool {
        match self {
            Self::RelatedNotSynced(_) | Self::Conflict(_) | Self::Plan(PlanError::Stale { .. }) => true,
            Self::Apply(errors) => !errors.is_empty() && errors.iter().all(ApplyError::is_stale),
            _ => false,
        }
    }
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
    fn metrics(&self) -> &crate::engine::metrics::ControllerMetrics;
    /// Sync requests (`metahook.dev/sync-requested-at`) waiting for a successful sync.
    fn sync_requests(&self) -> &crate::engine::trigger::SyncRequests<Self::Key>;
    /// The cached object a key stands for (where failure Events go).
    fn object(&self, key: &Self::Key) -> Option<Arc<DynamicObject>>;
    /// Syncs one object; returns when to sync it again, if its hook asked. `reasons`: what queued the
    /// key since its last sync (whether the hook must be asked again, and the metrics' `cause`).
    fn sync(
        &self,
        key: &Self::Key,
        reasons: Reasons,
    ) -> impl Future<Output = Result<Option<Duration>, SyncError>> + Send;
    /// The controller's `resyncPeriodSeconds`, if the object is still cached (a deleted one needs no
    /// more resyncs).
    fn resync_period(&self, key: &Self::Key) -> Option<Duration>;
}

/// Numbers the syncs of this process, so every log line of one sync can be told apart.
static SYNC_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A worker: takes keys off the queue until it shuts down. Each sync runs in a `sync` span (controller,
/// object, sync id) that every log line of it — hook calls and writes included — carries. Failures are
/// logged, recorded as a Warning Event on the object, and retried with per-key backoff. A sync that
/// panics is such a failure too: the worker lives on and the key is retried, never left in flight.
pub(crate) async fn work<S: Syncer>(syncer: Arc<S>) {
    let queue = syncer.queue().clone();
    while let Some(key) = queue.next().await {
        let sync_id = SYNC_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let span =
            info_span!("sync", kind = syncer.metrics().kind(), controller = syncer.name(), object = %key, sync_id);
        handle(&*syncer, &queue, &key).instrument(span).await;
        queue.done(&key);
    }
}

async fn handle<S: Syncer>(syncer: &S, queue: &WorkQueue<S::Key>, key: &S::Key) {
    use crate::engine::metrics::Outcome;
    let started = std::time::Instant::now();
    let reasons = queue.reasons(key);
    debug!(?reasons, "sync started");
    let result = AssertUnwindSafe(syncer.sync(key, reasons))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| Err(SyncError::Panicked(panic_message(&*panic))));
    let outcome = match &result {
        Ok(None) => Outcome::Success,
        Ok(Some(_)) => Outcome::RequeueAfter,
        Err(SyncError::Hook(HookError::TooManyRequests { .. })) => Outcome::Requeue,
        Err(err) if err.is_quiet() => Outcome::Requeue,
        Err(_) => Outcome::Error,
    };
    syncer.metrics().record(started.elapsed(), outcome);
    // The periodic resync runs on each object's own schedule: a period after its first sync, and a
    // period after every resync (the queue keeps the earliest of a key's delays, so syncs in between
    // do not push it back, and a sooner retry or `resyncAfterSeconds` wins). Metacontroller's timer
    // queues every parent in the same instant instead: with 10,000 parents, 10,000 hook calls at
    // once every period, and in a backlog longer than a period a second call for every parent
    // already synced (hook calls per parent 1.35 in `make bench` at N=1000). A hook's 429 sets its own
    // time: the resync must not call it sooner.
    let resync = match &result {
        Err(SyncError::Hook(HookError::TooManyRequests { .. })) => None,
        _ => syncer.resync_period(key),
    };
    if let Some(period) = resync {
        queue.add_after(key.clone(), period);
    }
    match result {
        Ok(resync) => {
            debug!(took = ?started.elapsed(), "sync finished");
            queue.forget(key);
            if let Some(after) = resync {
                queue.add_after(key.clone(), after);
            }
            // Only when a request waits: reading the object decodes it from the cache.
            if let Some(requested) = syncer.sync_requests().take(key)
                && let Some(obj) = syncer.object(key)
            {
                let note = format!("Sync requested at {requested} done");
                syncer.events().normal(&reference(&obj), "SyncRequested", note).await;
            }
        }
        Err(SyncError::Hook(HookError::TooManyRequests { retry_after, .. })) => {
            debug!(?retry_after, "hook asked to retry later");
            queue.add_after(key.clone(), retry_after);
        }
        Err(err) if err.is_quiet() => {
            debug!("retrying: {err}");
            queue.add_rate_limited(key.clone());
        }
        Err(err) => {
            warn!("sync failed: {err}");
            if matches!(err, SyncError::Plan(PlanError::DeletionGuard { .. })) {
                syncer.metrics().deletion_guard_refused();
            }
            if let Some(obj) = syncer.object(key) {
                syncer.events().warning(&reference(&obj), err.event_reason(), format!("Sync error: {err}")).await;
            }
            queue.add_rate_limited(key.clone());
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

/// Whether a sync for `reasons` asks its hook `request`, given what was asked last: not when it is the
/// very request whose answer was last applied in full and nothing asks to ask again (a resync, a retry,
/// a requested sync; see [`crate::engine::answered`]). When it asks, the metrics count it by cause, `redundant`
/// for a repeat of the last request (its answer was not applied in full).
pub(crate) fn ask_hook<K: Clone + Eq + Hash>(
    answered: &Answered<K>,
    metrics: &crate::engine::metrics::ControllerMetrics,
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

/// A controller's queue reporting `workqueue_*` metrics, its reconcile metrics, and a handle that adds to it
/// (what [`crate::controllers::related::Related`] calls when a related object changes).
pub(crate) fn controller_queue<K: Clone + Eq + Hash + Send + Sync + 'static>(
    hub: &crate::engine::hub::Hub,
    kind: &str,
    name: &str,
) -> (WorkQueue<K>, Arc<crate::engine::metrics::ControllerMetrics>, Enqueue<K>) {
    let queue = WorkQueue::with_stats(hub.settings.backoff, hub.metrics.queue(kind, name));
    let metrics = hub.metrics.controller(kind, name);
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

/// Whether `live` is at another stage of its life than `cached` (the copy a hook was called with):
/// deletion started, or a finalizer came or went (the garbage collector's among them). Writing the
/// hook's answer then could act for a stage that is over, so the sync is retried with the fresh copy.
/// `ours` (the hub's own finalizer) does not count: this very sync may just have added it, and the cached
/// copy cannot show that yet.
pub(crate) fn lifecycle_changed(cached: &DynamicObject, live: &DynamicObject, ours: &str) -> bool {
    let others = |obj: &DynamicObject| -> Vec<String> {
        obj.metadata.finalizers.iter().flatten().filter(|f| *f != ours).cloned().collect()
    };
    cached.metadata.deletion_timestamp != live.metadata.deletion_timestamp || others(cached) != others(live)
}

/// Whether `obj` carries `finalizer`.
pub(crate) fn has_finalizer(obj: &DynamicObject, finalizer: &str) -> bool {
    obj.metadata.finalizers.iter().flatten().any(|f| f == finalizer)
}

/// Whether the garbage collector is deleting `obj`'s dependents its own way: `orphan` (`kubectl delete
/// --cascade=orphan`, the user keeps the children) or `foregroundDeletion` (the GC deletes them first).
/// Either way the children are no longer the hub's to write, as in Metacontroller: the finalize hook is
/// still called, but no child is created, changed or deleted.
pub(crate) fn gc_finalizing(obj: &DynamicObject) -> bool {
    obj.metadata.deletion_timestamp.is_some()
        && obj.metadata.finalizers.iter().flatten().any(|f| f == "orphan" || f == "foregroundDeletion")
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

/// How often [`remove_finalizer`] re-reads the object after a conflict before the sync is retried.
const FINALIZER_ATTEMPTS: usize = 5;

/// Removes `finalizer` from `obj`, re-reading it after a conflict. The sync that lets go has usually
/// just written the object's status, so the copy it read is stale by then; a finalize hook whose status
/// changes on every call (a timestamp, a counter) would otherwise conflict on every retry, and the
/// object (and its namespace) could never be deleted. A re-read object that is gone, replaced (another
/// UID) or without our finalizer needs nothing more.
pub(crate) async fn remove_finalizer(
    api: &Api<DynamicObject>,
    obj: &DynamicObject,
    finalizer: &str,
) -> Result<(), SyncError> {
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    let mut current = std::borrow::Cow::Borrowed(obj);
    for _ in 0..FINALIZER_ATTEMPTS {
        if !has_finalizer(&current, finalizer) {
            return Ok(());
        }
        match set_finalizer(api, &current, finalizer, false).await {
            Err(SyncError::Conflict(_)) => {}
            done => return done,
        }
        match api.get_opt(name).await {
            Ok(Some(live)) if live.metadata.uid == obj.metadata.uid => current = std::borrow::Cow::Owned(live),
            Ok(_) => return Ok(()),
            Err(e) => return Err(SyncError::Write { what: "finalizers", source: Box::new(e) }),
        }
    }
    Err(SyncError::Conflict("finalizers"))
}

/// Replaces `.status` (through `/status` when the type has that subresource), unless it already is
/// `status`. Guarded by UID, so a recreated object of the same name is never written. Returns the
/// resourceVersion the write left behind, if it wrote.
pub(crate) async fn replace_status(
    api: &Api<DynamicObject>,
    obj: &DynamicObject,
    status: Value,
    subresource: bool,
) -> Result<Option<String>, SyncError> {
    if obj.data.get("status") == Some(&status) {
        return Ok(None);
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
        Ok(written) => Ok(written.metadata.resource_version),
        // Gone: the next event brings the new state.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(SyncError::Conflict("status")),
        // Either the UID test failed (replaced by a new object of the same name, whose own sync follows)
        // or the status itself is refused; only a fresh read tells which.
        Err(kube::Error::Api(s)) if s.code == 422 => match api.get_opt(name).await {
            Ok(Some(live)) if live.metadata.uid == obj.metadata.uid => Err(SyncError::Status(describe(&s))),
            Ok(_) => Ok(None),
            Err(e) => Err(SyncError::Write { what: "status", source: Box::new(e) }),
        },
        Err(e) => Err(SyncError::Write { what: "status", source: Box::new(e) }),
    }
}

/// An API server refusal with its causes, for messages.
fn describe(status: &kube::core::Status) -> String {
    let causes: Vec<String> = status
        .details
        .iter()
        .flat_map(|d| &d.causes)
        .map(|c| if c.field.is_empty() { c.message.clone() } else { format!("{}: {}", c.field, c.message) })
        .collect();
    if causes.is_empty() { status.message.clone() } else { format!("{} ({})", status.message, causes.join("; ")) }
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

/// `resyncAfterSeconds` as a delay; zero, negative, absent or NaN means none, and more than
/// [`crate::engine::queue::MAX_DELAY`] (a hook asking for a year, or for 1e300 seconds) means that maximum.
pub(crate) fn resync_after(seconds: Option<f64>) -> Option<Duration> {
    let max = crate::engine::queue::MAX_DELAY;
    seconds.filter(|s| *s > 0.0).map(|s| Duration::try_from_secs_f64(s).map_or(max, |d| d.min(max)))
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

    /// A syncer that records its calls; with `panic_first`, the first sync of every key panics.
    struct Panicky {
        queue: WorkQueue<&'static str>,
        events: Events,
        metrics: Arc<crate::engine::metrics::ControllerMetrics>,
        requests: crate::engine::trigger::SyncRequests<&'static str>,
        calls: std::sync::Mutex<Vec<(&'static str, tokio::time::Instant)>>,
        /// Each sync's key and the reasons it was queued for.
        causes: std::sync::Mutex<Vec<(&'static str, Reasons)>>,
        panic_first: bool,
        /// `resyncPeriodSeconds`, for every key but "gone".
        period: Option<Duration>,
    }

    impl Panicky {
        fn new(metrics: &crate::engine::metrics::Metrics, panic_first: bool, period: Option<Duration>) -> Arc<Self> {
            let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
            Arc::new(Self {
                queue: WorkQueue::new(crate::engine::queue::Backoff::default()),
                events: Events::new(Client::try_from(config).unwrap()),
                metrics: metrics.controller("Test", "panicky"),
                requests: crate::engine::trigger::SyncRequests::default(),
                calls: std::sync::Mutex::default(),
                causes: std::sync::Mutex::default(),
                panic_first,
                period,
            })
        }

        fn calls_of(&self, key: &str) -> Vec<Duration> {
            let calls = self.calls.lock().unwrap();
            let start = calls.first().map(|(_, at)| *at);
            calls.iter().filter(|(k, _)| *k == key).map(|(_, at)| *at - start.unwrap()).collect()
        }
    }

    impl Syncer for Panicky {
        type Key = &'static str;
        fn name(&self) -> &'static str {
            "panicky"
        }
        fn queue(&self) -> &WorkQueue<&'static str> {
            &self.queue
        }
        fn events(&self) -> &Events {
            &self.events
        }
        fn metrics(&self) -> &crate::engine::metrics::ControllerMetrics {
            &self.metrics
        }
        fn sync_requests(&self) -> &crate::engine::trigger::SyncRequests<&'static str> {
            &self.requests
        }
        fn object(&self, _: &&'static str) -> Option<Arc<DynamicObject>> {
            None
        }
        async fn sync(&self, key: &&'static str, reasons: Reasons) -> Result<Option<Duration>, SyncError> {
            self.causes.lock().unwrap().push((key, reasons));
            if *key == "slow" {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            let first = {
                let mut calls = self.calls.lock().unwrap();
                calls.push((key, tokio::time::Instant::now()));
                calls.iter().filter(|(k, _)| k == key).count() == 1
            };
            assert!(!(first && self.panic_first), "a bug in a sync");
            Ok(None)
        }
        fn resync_period(&self, key: &&'static str) -> Option<Duration> {
            self.period.filter(|_| *key != "gone")
        }
    }

    /// A sync is told every reason its key was queued for since the last one: a resync that came due
    /// while an echo or a change waited is one sync, for all of them.
    #[tokio::test(start_paused = true)]
    async fn a_sync_is_told_every_reason_its_key_waited_for() {
        use crate::engine::queue::Reason;
        let syncer = Panicky::new(&crate::engine::metrics::Metrics::default(), false, Some(Duration::from_secs(10)));
        let worker = tokio::spawn(work(Arc::clone(&syncer)));
        syncer.queue.add("echoed");
        syncer.queue.add("changed");
        tokio::time::sleep(Duration::from_secs(9)).await;
        // One worker, busy from 9 s to 11 s: both keys wait while their resyncs come due.
        syncer.queue.add("slow");
        tokio::time::sleep(Duration::from_millis(500)).await;
        syncer.queue.add_for("echoed", Reason::Echo);
        syncer.queue.add("changed");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let causes = syncer.causes.lock().unwrap().clone();
        let change = Reasons::of(Reason::Change);
        assert_eq!(
            causes,
            [
                ("echoed", change),
                ("changed", change),
                ("slow", change),
                ("echoed", Reasons::of(Reason::Echo).and(Reason::Delay)),
                ("changed", change.and(Reason::Delay)),
            ],
        );
        syncer.queue.shut_down();
        worker.await.unwrap();
    }

    /// Each object is resynced a period after its first sync and every period after that, whatever
    /// synced it in between; an object no longer cached is not.
    #[tokio::test(start_paused = true)]
    async fn resyncs_come_a_period_apart_per_object() {
        let syncer = Panicky::new(&crate::engine::metrics::Metrics::default(), false, Some(Duration::from_secs(10)));
        let worker = tokio::spawn(work(Arc::clone(&syncer)));
        syncer.queue.add("a");
        syncer.queue.add("gone");
        tokio::time::sleep(Duration::from_secs(3)).await;
        syncer.queue.add("b");
        tokio::time::sleep(Duration::from_secs(2)).await;
        // A change of "a" at 5 s: synced at once, and its resync stays at 10 s.
        syncer.queue.add("a");
        tokio::time::sleep(Duration::from_secs(20)).await;
        let seconds = |key| syncer.calls_of(key).iter().map(Duration::as_secs).collect::<Vec<_>>();
        assert_eq!(seconds("a"), [0, 5, 10, 20]);
        assert_eq!(seconds("b"), [3, 13, 23]);
        assert_eq!(seconds("gone"), [0]);
        syncer.queue.shut_down();
        worker.await.unwrap();
    }

    #[tokio::test]
    async fn a_panicking_sync_is_retried_and_the_worker_lives_on() {
        let metrics = crate::engine::metrics::Metrics::default();
        let syncer = Panicky::new(&metrics, true, None);
        let worker = tokio::spawn(work(Arc::clone(&syncer)));
        syncer.queue.add("a");
        tokio::time::timeout(Duration::from_secs(5), async {
            while syncer.calls.lock().unwrap().len() < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the key is synced again after the panic");
        syncer.queue.add("b");
        tokio::time::timeout(Duration::from_secs(5), async {
            while syncer.calls.lock().unwrap().len() < 4 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the same worker goes on with other keys");
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains(r#"result="error"} 2"#), "both panics count as failed syncs: {text}");
        syncer.queue.shut_down();
        worker.await.expect("the worker ends normally");
    }

    #[test]
    fn resync_values_follow_metacontroller() {
        assert_eq!(resync_after(Some(0.5)), Some(Duration::from_millis(500)));
        assert_eq!(resync_after(Some(0.0)), None);
        assert_eq!(resync_after(Some(-3.0)), None);
        assert_eq!(resync_after(Some(f64::NAN)), None);
        assert_eq!(resync_after(Some(9e18)), Some(crate::engine::queue::MAX_DELAY));
        assert_eq!(resync_after(Some(f64::INFINITY)), Some(crate::engine::queue::MAX_DELAY));
        assert_eq!(resync_period(Some(0)), Some(Duration::from_secs(1)));
        assert_eq!(resync_period(Some(30)), Some(Duration::from_secs(30)));
    }

    #[test]
    fn only_other_finalizers_and_deletion_change_a_parents_stage() {
        let with = |finalizers: &[&str], deleting: bool| {
            let mut obj =
                DynamicObject::new("p", &kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()));
            obj.metadata.finalizers = Some(finalizers.iter().map(|f| (*f).to_owned()).collect());
            if deleting {
                obj.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
            }
            obj
        };
        let ours = "metacontroller.io/compositecontroller-c";
        assert!(!lifecycle_changed(&with(&[], false), &with(&[ours], false), ours), "our own finalizer was just added");
        assert!(lifecycle_changed(&with(&[ours], false), &with(&[ours, "orphan"], false), ours));
        assert!(lifecycle_changed(&with(&[ours, "foregroundDeletion"], true), &with(&[ours], true), ours));
        assert!(lifecycle_changed(&with(&[ours], false), &with(&[ours], true), ours));
    }
}
