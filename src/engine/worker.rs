//! The worker loop every controller runs: takes keys off its queue, syncs each in a span of its own,
//! survives panics, schedules resyncs and retries, and reports each outcome.

use std::fmt::Display;
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use kube::api::DynamicObject;
use tracing::{Instrument as _, debug, info, info_span, warn};

use crate::engine::error::{Action, SyncError, Verdict, with_causes};
use crate::engine::events::{Events, reference};
use crate::engine::queue::{Reasons, WorkQueue};
use crate::write::children::PlanError;

/// What a sync that did not fail did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Synced {
    /// The object was synced; `Some`: when to sync it again, as its hook asked.
    Done(Option<Duration>),
    /// The object is another replica's to sync (sharded): nothing was done here, so nothing is
    /// reported, counted or scheduled for it — its holder does that.
    Elsewhere,
}

/// One controller's sync, driven by [`work`].
pub(crate) trait Syncer: Send + Sync + 'static {
    type Key: Clone + Eq + Hash + Display + crate::engine::queue::Flowing + Send + Sync + 'static;
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
    /// Syncs one object (see [`Synced`]). `reasons`: what queued the key since its last sync (whether
    /// the hook must be asked again, and the metrics' `cause`).
    fn sync(&self, key: &Self::Key, reasons: Reasons) -> impl Future<Output = Result<Synced, SyncError>> + Send;
    /// The controller's `resyncPeriodSeconds`, if the object is still cached (a deleted one needs no
    /// more resyncs).
    fn resync_period(&self, key: &Self::Key) -> Option<Duration>;
}

/// Numbers the syncs of this process, so every log line of one sync can be told apart.
static SYNC_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A worker: takes keys off the queue until it shuts down. Each sync runs in a `sync` span (controller,
/// object, sync id) that every log line of it — hook calls and writes included — carries, and that
/// is the root of the sync's trace when traces are exported (never a child of whatever span was
/// current, so one sync is one trace). Failures are
/// logged, recorded as a Warning Event on the object, and retried with per-key backoff. A sync that
/// panics is such a failure too: the worker lives on and the key is retried, never left in flight.
pub(crate) async fn work<S: Syncer>(syncer: Arc<S>) {
    let queue = syncer.queue().clone();
    while let Some(key) = queue.next().await {
        let sync_id = SYNC_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (kind, controller) = (syncer.metrics().kind(), syncer.name());
        let span = info_span!(parent: None, "sync", kind, controller, object = %key, sync_id);
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
    let result = match result {
        Ok(Synced::Done(resync)) => Ok(resync),
        Ok(Synced::Elsewhere) => {
            debug!("another replica's to sync");
            return;
        }
        Err(e) => Err(e),
    };
    if matches!(result, Err(SyncError::Panicked(_))) {
        syncer.metrics().panicked();
    }
    // The one reading of the result (see `Verdict`): the metrics, the retry and the Event below follow it.
    let verdict = Verdict::of(&result);
    syncer.metrics().record(started.elapsed(), Outcome::from(verdict));
    // The periodic resync runs on each object's own schedule: a period after its first sync, and a
    // period after every resync (the queue keeps the earliest of a key's delays, so syncs in between
    // do not push it back, and a sooner retry or `resyncAfterSeconds` wins). Metacontroller's timer
    // queues every parent in the same instant instead: with 10,000 parents, 10,000 hook calls at
    // once every period, and in a backlog longer than a period a second call for every parent
    // already synced (hook calls per parent 1.35 in `make bench` at N=1000). A hook's 429 sets its own
    // time: the resync must not call it sooner.
    if !matches!(verdict, Verdict::Failed(Action::RetryAfter(_)))
        && let Some(period) = syncer.resync_period(key)
    {
        queue.add_after(key.clone(), period);
    }
    let err = match result {
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
            return;
        }
        Err(err) => err,
    };
    let failures = queue.failures(key);
    match err.action().after(failures) {
        Action::RetryAfter(delay) => {
            debug!(?delay, "hook asked to retry later");
            queue.add_after(key.clone(), delay);
        }
        Action::Hold => {
            // Reported by the sync (once per message); the next change or resync syncs it again.
            info!("not retried until the object or its children change: {}", with_causes(&err));
            queue.forget(key);
        }
        Action::RetryQuietly => {
            debug!("retrying: {}", with_causes(&err));
            queue.add_rate_limited(key.clone());
        }
        Action::Report => {
            // A quiet retry that kept coming back says how long it has.
            let repeated = if err.action() == Action::RetryQuietly {
                format!(" ({} failed syncs in a row)", failures + 1)
            } else {
                String::new()
            };
            warn!("sync failed{repeated}: {}", with_causes(&err));
            if matches!(err, SyncError::Plan(PlanError::DeletionGuard { .. })) {
                syncer.metrics().deletion_guard_refused();
            }
            if let Some(obj) = syncer.object(key) {
                let message = format!("Sync error{repeated}: {err}");
                syncer.events().warning(&reference(&obj), err.event_reason(), message).await;
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

/// Adds a key to a controller's queue.
pub(crate) type Enqueue<K> = Arc<dyn Fn(K) + Send + Sync>;

/// A controller's queue reporting `workqueue_*` metrics, its reconcile metrics, and a handle that adds to it
/// (what [`crate::engine::related::Related`] calls when a related object changes).
pub(crate) fn controller_queue<K: Clone + Eq + Hash + crate::engine::queue::Flowing + Send + Sync + 'static>(
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
    syncer.metrics().workers(workers);
    syncer.queue().set_workers(workers);
    for _ in 0..workers {
        tasks.spawn(work(Arc::clone(&syncer)));
    }
    cancel.cancelled().await;
    syncer.queue().shut_down();
    tasks.shutdown().await;
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
                events: Events::new(kube::Client::try_from(config).unwrap()),
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
        async fn sync(&self, key: &&'static str, reasons: Reasons) -> Result<Synced, SyncError> {
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
            Ok(if *key == "elsewhere" { Synced::Elsewhere } else { Synced::Done(None) })
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
                // A change is served before an echo (the echo of the hub's own write is not news).
                ("changed", change.and(Reason::Delay)),
                ("echoed", Reasons::of(Reason::Echo).and(Reason::Delay)),
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

    /// A key another replica holds is not synced here: its sync request stays unanswered (no "done"
    /// Event from a replica that did nothing), no outcome is counted and no resync is scheduled.
    #[tokio::test(start_paused = true)]
    async fn a_key_that_is_another_replicas_is_neither_reported_nor_counted_nor_resynced() {
        let metrics = crate::engine::metrics::Metrics::default();
        let syncer = Panicky::new(&metrics, false, Some(Duration::from_secs(10)));
        let annotated = |value: Option<&str>| -> DynamicObject {
            let mut obj = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "e"}});
            if let Some(value) = value {
                obj["metadata"]["annotations"] = serde_json::json!({crate::engine::trigger::SYNC_REQUESTED_AT: value});
            }
            serde_json::from_value(obj).unwrap()
        };
        assert!(syncer.requests.observe(&"elsewhere", Some(&annotated(None)), &annotated(Some("t1"))));
        let worker = tokio::spawn(work(Arc::clone(&syncer)));
        syncer.queue.add("elsewhere");
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(syncer.calls_of("elsewhere").len(), 1, "no resync of another replica's object");
        assert_eq!(syncer.requests.take(&"elsewhere").as_deref(), Some("t1"), "the request is left to its holder");
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(!text.contains(r#"result="success"} 1"#), "nothing was synced: {text}");
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
        assert!(text.contains(r#"controller_runtime_reconcile_panics_total{controller="test/panicky"} 2"#), "{text}");
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
}
