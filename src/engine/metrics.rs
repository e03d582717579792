//! The controllers' metrics (through `prometheus-client`): what the engine counts of every sync.
//!
//! The reconcile and work-queue families carry the names every controller dashboard already uses:
//! controller-runtime's `controller_runtime_reconcile_*`, `controller_runtime_active_workers` and
//! `controller_runtime_max_concurrent_reconciles` (labelled `controller`), and client-go's `workqueue_*`
//! (labelled `name`); both label values are `<kind in lower case>/<controller>`
//! (`compositecontroller/web`), one value naming a controller in every family. What only metahook
//! counts is `metahook_*`, labelled `kind` and `controller` (the object's name) as the hook metrics are.
//! The families live here, beside what they count; [`crate::ops::metrics`] registers them with every
//! other stage's in one registry and serves it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::engine::queue::{InFlightProbe, QueueStats};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    kind: String,
    controller: String,
}

/// A controller as controller-runtime's families name it: `<kind in lower case>/<name>`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct ReconcilerLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    controller: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    kind: String,
    controller: String,
    cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SavedLabels {
    kind: String,
    controller: String,
    why: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CanaryLabels {
    kind: String,
    controller: String,
    side: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SideLabels {
    kind: String,
    controller: String,
    side: &'static str,
}

/// The `side` and `result` label values of the canary families (see [`crate::engine::canary`]).
const CANARY_SIDES: [&str; 2] = ["current", "candidate"];
const CANARY_RESULTS: [&str; 3] = ["ok", "error", "permanent_error"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    name: String,
}

/// A flow of a queue: the namespace (or cluster-scoped object) its keys stand for, or `(others)` for the
/// flows summed up beyond the busiest ([`crate::engine::queue::NAMED_FLOWS`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FlowLabels {
    name: String,
    flow: String,
}

/// A line of a flow ([`crate::engine::queue::Lane::name`]): the four lines bound the label's values.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FlowLineLabels {
    name: String,
    flow: String,
    line: &'static str,
}

/// How one sync ended, as the `result` label of `controller_runtime_reconcile_total` (controller-runtime's
/// values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// Succeeded, and the hook asked to be called again after a delay (`resyncAfterSeconds`).
    RequeueAfter,
    /// Retried quietly: the hook said 429, a conflict, a cache still filling.
    Requeue,
    Error,
}

impl From<crate::engine::error::Verdict> for Outcome {
    /// A sync's [`Verdict`](crate::engine::error::Verdict) as the metric says it: a failure someone hears
    /// about (reported or held) is an error, a quiet retry or a hook's 429 a requeue.
    fn from(verdict: crate::engine::error::Verdict) -> Self {
        use crate::engine::error::{Action, Verdict};
        match verdict {
            Verdict::Synced(None) => Self::Success,
            Verdict::Synced(Some(_)) => Self::RequeueAfter,
            Verdict::Failed(Action::Report | Action::Hold) => Self::Error,
            Verdict::Failed(Action::RetryQuietly | Action::RetryAfter(_)) => Self::Requeue,
        }
    }
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::RequeueAfter => "requeue_after",
            Self::Requeue => "requeue",
            Self::Error => "error",
        }
    }
}

/// What queued a sync that went on to call its hook (the `cause` label of `metahook_hook_syncs_total`).
/// Tells the calls a change needed from those an echo or a resync made (`make bench` reads it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Something observed: an event of the object, a child or a related object; a sync request; the
    /// first sync after start.
    Change,
    /// The echo of the controller's own writes (nothing else queued it).
    Echo,
    /// Back by its delay (a resync, a retry, `resyncAfterSeconds`), nothing observed meanwhile.
    Delay,
    /// The same request as the last one its hook answered, though neither a delay nor a request asked
    /// for it again: the last answer was not applied in full (a write failed). Identical work.
    Redundant,
}

impl Cause {
    const ALL: [Self; 4] = [Self::Change, Self::Echo, Self::Delay, Self::Redundant];

    fn label(self) -> &'static str {
        match self {
            Self::Change => "change",
            Self::Echo => "echo",
            Self::Delay => "delay",
            Self::Redundant => "redundant",
        }
    }
}

impl From<crate::engine::queue::Reason> for Cause {
    fn from(reason: crate::engine::queue::Reason) -> Self {
        use crate::engine::queue::Reason;
        match reason {
            Reason::Change | Reason::Requested | Reason::Relist => Self::Change,
            Reason::Echo => Self::Echo,
            Reason::Delay => Self::Delay,
        }
    }
}

/// Why a hook call was left out (the `why` label of `metahook_hook_calls_saved_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Saved {
    /// The request would have been the same as the last one, whose answer was applied in full.
    IdenticalRequest,
    /// The echo of the controller's own create, update or status write, under
    /// `metahook.dev/sync-on-own-writes: "false"` (counted per echo event).
    OwnWrite,
    /// The echo of a write of a sync that failed: the object waits for its backoff retry instead.
    BackingOff,
}

impl Saved {
    const ALL: [Self; 3] = [Self::IdenticalRequest, Self::OwnWrite, Self::BackingOff];

    fn label(self) -> &'static str {
        match self {
            Self::IdenticalRequest => "identical_request",
            Self::OwnWrite => "own_write",
            Self::BackingOff => "backing_off",
        }
    }
}

/// Seconds, from 5 ms to about 80 s: hook calls and API writes dominate a sync.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// The metrics of one running controller; cheap handles into the hub's families.
pub struct ControllerMetrics {
    kind: String,
    controller: String,
    /// `<kind in lower case>/<controller>`, the `controller` label of the reconcile families.
    reconciler: String,
    reconcile: Family<ResultLabels, Counter>,
    errors: Counter,
    duration: Histogram,
    panics: Counter,
    max_concurrent: Gauge,
    guard_refusals: Counter,
    hook_syncs: Family<CauseLabels, Counter>,
    saved: Family<SavedLabels, Counter>,
    canary_syncs: Family<CanaryLabels, Counter>,
    canary_writes: Family<SideLabels, Counter>,
    /// The canary gauges, shown only once a canary ran.
    canary_percent: Family<ControllerLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    canary_halted: Family<ControllerLabels, Gauge>,
}

impl ControllerMetrics {
    /// The controller kind (`CompositeController` or `DecoratorController`).
    #[must_use]
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Records one finished sync. An `error` also counts in `controller_runtime_reconcile_errors_total`,
    /// as controller-runtime counts every error it reports there; quiet retries (`requeue`) do not.
    pub fn record(&self, took: Duration, outcome: Outcome) {
        let labels = ResultLabels { controller: self.reconciler.clone(), result: outcome.label() };
        self.reconcile.get_or_create(&labels).inc();
        if outcome == Outcome::Error {
            self.errors.inc();
        }
        self.duration.observe(took.as_secs_f64());
    }

    /// Counts a sync that panicked (recorded as an `error` by [`ControllerMetrics::record`] too).
    pub fn panicked(&self) {
        self.panics.inc();
    }

    /// Notes how many workers the controller runs: the most syncs it makes at once.
    pub fn workers(&self, workers: usize) {
        self.max_concurrent.set(i64::try_from(workers).unwrap_or(i64::MAX));
    }

    /// Counts a sync that calls its hook, by what queued it.
    pub fn hook_sync(&self, cause: Cause) {
        let labels = CauseLabels { kind: self.kind.clone(), controller: self.controller.clone(), cause: cause.label() };
        self.hook_syncs.get_or_create(&labels).inc();
    }

    /// Counts a hook call left out, and why.
    pub fn hook_call_saved(&self, why: Saved) {
        let labels = SavedLabels { kind: self.kind.clone(), controller: self.controller.clone(), why: why.label() };
        self.saved.get_or_create(&labels).inc();
    }

    /// Counts a sync of a canary's `side` that ended with `result` after `writes` child writes.
    pub fn canary_sync(&self, side: &'static str, result: &'static str, writes: usize) {
        let (kind, controller) = (self.kind.clone(), self.controller.clone());
        let labels = CanaryLabels { kind: kind.clone(), controller: controller.clone(), side, result };
        self.canary_syncs.get_or_create(&labels).inc();
        self.canary_writes.get_or_create(&SideLabels { kind, controller, side }).inc_by(writes as u64);
    }

    /// Notes the share of parents the candidate answers for (0 without a canary, or once halted), and
    /// whether the canary halted.
    pub fn canary_state(&self, percent: f64, halted: bool) {
        let labels = ControllerLabels { kind: self.kind.clone(), controller: self.controller.clone() };
        if percent == 0.0 && !halted && self.canary_percent.get(&labels).is_none() {
            return;
        }
        self.canary_percent.get_or_create(&labels).set(percent);
        self.canary_halted.get_or_create(&labels).set(i64::from(halted));
    }

    /// Counts a sync the safe-delete guard refused.
    pub fn deletion_guard_refused(&self) {
        self.guard_refusals.inc();
    }
}

/// Every family of the hub's own metrics. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    reconcile: Family<ResultLabels, Counter>,
    reconcile_errors: Family<ReconcilerLabels, Counter>,
    reconcile_time: Family<ReconcilerLabels, Histogram>,
    reconcile_panics: Family<ReconcilerLabels, Counter>,
    max_concurrent: Family<ReconcilerLabels, Gauge>,
    /// The keys each controller's workers hold, read when scraped (see [`InFlightProbe`]), by the
    /// controller's `<kind>/<name>` label value.
    in_flight: Arc<Mutex<BTreeMap<String, InFlightProbe>>>,
    queue_depth: Family<QueueLabels, Gauge>,
    queue_adds: Family<QueueLabels, Counter>,
    queue_retries: Family<QueueLabels, Counter>,
    queue_duration: Family<QueueLabels, Histogram>,
    work_duration: Family<QueueLabels, Histogram>,
    guard_refusals: Family<ControllerLabels, Counter>,
    hook_syncs: Family<CauseLabels, Counter>,
    hook_calls_saved: Family<SavedLabels, Counter>,
    canary_syncs: Family<CanaryLabels, Counter>,
    canary_writes: Family<SideLabels, Counter>,
    canary_percent: Family<ControllerLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    canary_halted: Family<ControllerLabels, Gauge>,
    pub apply: crate::write::apply::ApplyMetrics,
    /// This replica's share of a sharded ring (registered only when sharding is on).
    pub shard: ShardMetrics,
    /// The controllers read from files (`controllersFrom`).
    pub files: FileMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            reconcile: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_time: Family::new_with_constructor(duration_histogram),
            reconcile_panics: Family::default(),
            max_concurrent: Family::default(),
            in_flight: Arc::default(),
            queue_depth: Family::default(),
            queue_adds: Family::default(),
            queue_retries: Family::default(),
            queue_duration: Family::new_with_constructor(queue_histogram),
            work_duration: Family::new_with_constructor(queue_histogram),
            guard_refusals: Family::default(),
            hook_syncs: Family::default(),
            hook_calls_saved: Family::default(),
            canary_syncs: Family::default(),
            canary_writes: Family::default(),
            canary_percent: Family::default(),
            canary_halted: Family::default(),
            apply: crate::write::apply::ApplyMetrics::default(),
            shard: ShardMetrics::default(),
            files: FileMetrics::default(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct FileControllerLabels {
    kind: String,
    controller: String,
    file: String,
    reason: String,
}

/// Each file controller's (kind, name): its file, the reason of its `Ready`, and whether it is.
type FileStates = BTreeMap<(String, String), (String, String, bool)>;

/// The controllers read from files (`metahook_controllers_file_*`): what their last reading found wrong,
/// how readings went, and each file controller's state, which an API object would carry in its status.
#[derive(Clone, Debug, Default)]
pub struct FileMetrics {
    errors: Gauge,
    reloads: Family<ReloadLabels, Counter>,
    refused: Family<KindLabel, Gauge>,
    /// Each file controller's `Ready` (1 or 0) with its reason, by kind and name: the status an API
    /// object would carry.
    ready: Arc<Mutex<FileStates>>,
}

impl FileMetrics {
    /// A reading of the files: `errors` documents (or files) refused, 0 when it was good.
    pub fn read(&self, errors: usize) {
        self.errors.set(i64::try_from(errors).unwrap_or(i64::MAX));
        let result = if errors == 0 { "ok" } else { "error" };
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
    }

    /// What the last reading refused (`metahook_controllers_file_errors`).
    #[must_use]
    pub fn errors(&self) -> i64 {
        self.errors.get()
    }

    /// How many file controllers of `kind` are refused because an API object of that kind and name runs.
    pub fn refused(&self, kind: &str, count: usize) {
        let labels = KindLabel { kind: kind.to_owned() };
        self.refused.get_or_create(&labels).set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// File controller `kind`/`name` (from `file`) is ready or not, for `reason`.
    pub fn ready(&self, kind: &str, name: &str, file: &str, ready: bool, reason: &str) {
        let value = (file.to_owned(), reason.to_owned(), ready);
        self.ready.lock().expect("file metrics lock").insert((kind.to_owned(), name.to_owned()), value);
    }

    /// File controller `kind`/`name` no longer runs.
    pub fn forget(&self, kind: &str, name: &str) {
        self.ready.lock().expect("file metrics lock").remove(&(kind.to_owned(), name.to_owned()));
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "metahook_controllers_file_errors",
            "Documents (or files) of controllersFrom that the last reading refused; while above 0 the last good \
             set of file controllers runs",
            self.errors.clone(),
        );
        registry.register(
            "metahook_controllers_file_reload",
            "Readings of controllersFrom that found a change, by result (ok, error)",
            self.reloads.clone(),
        );
        registry.register(
            "metahook_controllers_file_refused",
            "File controllers not run because a controller object of the same kind and name is in the API",
            self.refused.clone(),
        );
        registry.register_collector(Box::new(FileReady(Arc::clone(&self.ready))));
    }
}

/// `metahook_file_controller_ready`, read when scraped.
#[derive(Debug)]
struct FileReady(Arc<Mutex<FileStates>>);

impl Collector for FileReady {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "metahook_file_controller_ready",
            "1 when a controller read from a file runs, 0 when it cannot start (reason says why): the Ready \
             condition an API object would carry.",
            None,
            MetricType::Gauge,
        )?;
        for ((kind, controller), (file, reason, ready)) in self.0.lock().expect("file metrics lock").iter() {
            let labels = FileControllerLabels {
                kind: kind.clone(),
                controller: controller.clone(),
                file: file.clone(),
                reason: reason.clone(),
            };
            ConstGauge::new(i64::from(*ready)).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabels {
    direction: &'static str,
}

/// One replica's share of a sharded ring (`metahook_shard_*`): the parents and buckets it holds, the
/// buckets it let go (`out`) and took (`in`), and how long letting go took (the syncs in flight).
#[derive(Clone, Debug)]
pub struct ShardMetrics {
    enabled: Arc<std::sync::atomic::AtomicBool>,
    parents: Gauge,
    buckets: Gauge,
    moves: Family<DirectionLabels, Counter>,
    drain: Histogram,
}

impl Default for ShardMetrics {
    fn default() -> Self {
        Self {
            enabled: Arc::default(),
            parents: Gauge::default(),
            buckets: Gauge::default(),
            moves: Family::default(),
            // 1 ms to about 30 s: letting go waits for the syncs in flight (a hook call each at most).
            drain: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
        }
    }
}

impl ShardMetrics {
    /// Turns the families on (a hub that is not sharded does not show them).
    pub fn enable(&self) {
        self.enabled.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    #[must_use]
    pub fn enabled(&self) -> bool {
        self.enabled.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A parent came into this replica's cache.
    pub fn parent_arrived(&self) {
        self.parents.inc();
    }

    /// A parent left this replica's cache (its bucket let go, or deleted).
    pub fn parent_left(&self) {
        self.parents.dec();
    }

    /// `count` buckets were let go, after waiting `took` for the syncs in flight.
    pub fn let_go(&self, count: usize, took: Duration) {
        self.moves.get_or_create(&DirectionLabels { direction: "out" }).inc_by(count as u64);
        self.buckets.dec_by(i64::try_from(count).unwrap_or(i64::MAX));
        self.drain.observe(took.as_secs_f64());
    }

    /// `count` buckets were taken; `held` are held now.
    pub fn took(&self, count: usize, held: usize) {
        self.moves.get_or_create(&DirectionLabels { direction: "in" }).inc_by(count as u64);
        self.buckets.set(i64::try_from(held).unwrap_or(i64::MAX));
    }

    /// A term of membership ended: nothing is held.
    pub fn cleared(&self) {
        self.buckets.set(0);
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "metahook_shard_parents",
            "Parents this replica owns (in its sharded caches), summed over its controllers",
            self.parents.clone(),
        );
        registry.register(
            "metahook_shard_buckets",
            "Buckets of parents this replica holds (of 1024)",
            self.buckets.clone(),
        );
        registry.register(
            "metahook_shard_moves",
            "Buckets of parents this replica let go to another (out) and took (in)",
            self.moves.clone(),
        );
        registry.register(
            "metahook_shard_drain_seconds",
            "Time this replica took to let buckets go: until no sync of their parents was in flight",
            self.drain.clone(),
        );
    }
}

/// Seconds, from 1 ms to about 4 min (client-go's workqueue histograms span 10 ns to 10 s; our queue
/// also holds keys for their backoff, which is longer).
fn queue_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 4.0, 10))
}

impl Metrics {
    /// Registers every family in `registry`. Help texts end without a period: `prometheus-client` adds one.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "controller_runtime_reconcile",
            "Syncs finished, by result (requeue: retried quietly after a conflict, a hook's 429 or a cache still \
             filling; requeue_after: succeeded, and the hook asked to be called again)",
            self.reconcile.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Syncs that failed with an error reported on the object (result error)",
            self.reconcile_errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Time one sync took (observe, hooks, apply, status)",
            self.reconcile_time.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_panics",
            "Syncs that panicked (each also counted as an error, and retried)",
            self.reconcile_panics.clone(),
        );
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "Workers of a controller: the most syncs it makes at once",
            self.max_concurrent.clone(),
        );
        self.apply.register(registry);
        registry.register(
            "metahook_deletion_guard_refusals",
            "Syncs refused because they would delete more children than the controller's safe-delete guard allows",
            self.guard_refusals.clone(),
        );
        registry.register(
            "metahook_hook_syncs",
            "Syncs that called their hook, by what queued them (change, echo of own writes, delay), or \
             redundant: the same request as the last one answered",
            self.hook_syncs.clone(),
        );
        registry.register(
            "metahook_hook_calls_saved",
            "Hook calls left out: the same request as the last one answered and applied in full \
             (identical_request), echoes of own writes under sync-on-own-writes=false (own_write), or \
             echoes of a failing sync's own writes, which wait for its backoff retry (backing_off)",
            self.hook_calls_saved.clone(),
        );
        registry.register(
            "metahook_canary_syncs",
            "Syncs of a canary's parents (metahook.dev/canary) that asked their hook, by side (current, \
             candidate) and result (ok, error, permanent_error; a conflict or a hook's 429 is not counted)",
            self.canary_syncs.clone(),
        );
        registry.register(
            "metahook_canary_writes",
            "Children created, updated or deleted by the syncs of a canary's parents, by side",
            self.canary_writes.clone(),
        );
        registry.register(
            "metahook_canary_percent",
            "The share of a controller's parents its canary's candidate answers for (0: none, or halted)",
            self.canary_percent.clone(),
        );
        registry.register(
            "metahook_canary_halted",
            "1 when a controller's canary halted itself (its candidate's error ratio passed maxErrorRatio)",
            self.canary_halted.clone(),
        );
        registry.register("workqueue_depth", "Keys waiting in a controller's queue", self.queue_depth.clone());
        registry.register("workqueue_adds", "Keys added to a controller's queue", self.queue_adds.clone());
        registry.register(
            "workqueue_retries",
            "Keys re-added with backoff after a failure",
            self.queue_retries.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "Time a key waited in the queue before a worker took it",
            self.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "Time a worker held a key (one sync)",
            self.work_duration.clone(),
        );
        registry.register_collector(Box::new(InFlightGauges { queues: Arc::clone(&self.in_flight) }));
        self.files.register(registry);
        if self.shard.enabled() {
            self.shard.register(registry);
        }
    }

    /// The metrics of controller `kind`/`name`, kept across restarts until [`Metrics::remove`].
    #[must_use]
    pub fn controller(&self, kind: &str, name: &str) -> Arc<ControllerMetrics> {
        let labels = ControllerLabels { kind: kind.to_owned(), controller: name.to_owned() };
        let reconciler = reconciler_labels(kind, name);
        Arc::new(ControllerMetrics {
            kind: kind.to_owned(),
            controller: name.to_owned(),
            reconciler: reconciler.controller.clone(),
            reconcile: self.reconcile.clone(),
            errors: self.reconcile_errors.get_or_create(&reconciler).clone(),
            duration: self.reconcile_time.get_or_create(&reconciler).clone(),
            panics: self.reconcile_panics.get_or_create(&reconciler).clone(),
            max_concurrent: self.max_concurrent.get_or_create(&reconciler).clone(),
            guard_refusals: self.guard_refusals.get_or_create(&labels).clone(),
            hook_syncs: self.hook_syncs.clone(),
            saved: self.hook_calls_saved.clone(),
            canary_syncs: self.canary_syncs.clone(),
            canary_writes: self.canary_writes.clone(),
            canary_percent: self.canary_percent.clone(),
            canary_halted: self.canary_halted.clone(),
        })
    }

    /// The handles a controller's work queue updates, and the probe through which its keys in flight
    /// are read when scraped (a restarted controller's new queue replaces the old one's).
    #[must_use]
    pub fn queue(&self, kind: &str, name: &str) -> QueueStats {
        let labels = queue_labels(kind, name);
        let in_flight = InFlightProbe::default();
        self.in_flight.lock().expect("metrics lock").insert(labels.name.clone(), in_flight.clone());
        QueueStats {
            adds: self.queue_adds.get_or_create(&labels).clone(),
            retries: self.queue_retries.get_or_create(&labels).clone(),
            depth: self.queue_depth.get_or_create(&labels).clone(),
            queue_duration: self.queue_duration.get_or_create(&labels).clone(),
            work_duration: self.work_duration.get_or_create(&labels).clone(),
            in_flight,
        }
    }

    /// Forgets a controller that was deleted.
    pub fn remove(&self, kind: &str, name: &str) {
        let labels = ControllerLabels { kind: kind.to_owned(), controller: name.to_owned() };
        let reconciler = reconciler_labels(kind, name);
        self.reconcile_errors.remove(&reconciler);
        self.reconcile_time.remove(&reconciler);
        self.reconcile_panics.remove(&reconciler);
        self.max_concurrent.remove(&reconciler);
        self.in_flight.lock().expect("metrics lock").remove(&reconciler.controller);
        self.guard_refusals.remove(&labels);
        self.canary_percent.remove(&labels);
        self.canary_halted.remove(&labels);
        for side in CANARY_SIDES {
            let (kind, controller) = (kind.to_owned(), name.to_owned());
            self.canary_writes.remove(&SideLabels { kind: kind.clone(), controller: controller.clone(), side });
            for result in CANARY_RESULTS {
                self.canary_syncs.remove(&CanaryLabels {
                    kind: kind.clone(),
                    controller: controller.clone(),
                    side,
                    result,
                });
            }
        }
        for result in [Outcome::Success, Outcome::RequeueAfter, Outcome::Requeue, Outcome::Error] {
            self.reconcile.remove(&ResultLabels { controller: reconciler.controller.clone(), result: result.label() });
        }
        for cause in Cause::ALL {
            self.hook_syncs.remove(&CauseLabels {
                kind: kind.to_owned(),
                controller: name.to_owned(),
                cause: cause.label(),
            });
        }
        for why in Saved::ALL {
            self.hook_calls_saved.remove(&SavedLabels {
                kind: kind.to_owned(),
                controller: name.to_owned(),
                why: why.label(),
            });
        }
        let queue = queue_labels(kind, name);
        self.queue_depth.remove(&queue);
        self.queue_adds.remove(&queue);
        self.queue_retries.remove(&queue);
        self.queue_duration.remove(&queue);
        self.work_duration.remove(&queue);
    }
}

fn queue_labels(kind: &str, name: &str) -> QueueLabels {
    QueueLabels { name: reconciler_labels(kind, name).controller }
}

fn reconciler_labels(kind: &str, name: &str) -> ReconcilerLabels {
    ReconcilerLabels { controller: format!("{}/{name}", kind.to_lowercase()) }
}

/// The families read from the queues when scraped: controller-runtime's active workers and client-go's
/// two gauges of work in flight, which show a stuck hook while it is stuck.
struct InFlightGauges {
    queues: Arc<Mutex<BTreeMap<String, InFlightProbe>>>,
}

impl std::fmt::Debug for InFlightGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlightGauges").finish_non_exhaustive()
    }
}

impl Collector for InFlightGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = tokio::time::Instant::now();
        let read: Vec<_> = {
            let queues = self.queues.lock().expect("metrics lock");
            queues.iter().map(|(name, probe)| (name.clone(), probe.read(now))).collect()
        };
        let mut workers = encoder.encode_descriptor(
            "controller_runtime_active_workers",
            "Workers syncing now, one key each.",
            None,
            MetricType::Gauge,
        )?;
        for (name, in_flight) in &read {
            let labels = ReconcilerLabels { controller: name.clone() };
            ConstGauge::new(i64::try_from(in_flight.keys).unwrap_or(i64::MAX))
                .encode(workers.encode_family(&labels)?)?;
        }
        let mut unfinished = encoder.encode_descriptor(
            "workqueue_unfinished_work_seconds",
            "Seconds the keys held by workers have been held so far, added up: grows while a sync is stuck.",
            None,
            MetricType::Gauge,
        )?;
        for (name, in_flight) in &read {
            let labels = QueueLabels { name: name.clone() };
            ConstGauge::new(in_flight.unfinished.as_secs_f64()).encode(unfinished.encode_family(&labels)?)?;
        }
        let mut longest = encoder.encode_descriptor(
            "workqueue_longest_running_processor_seconds",
            "Seconds the key held longest by a worker has been held.",
            None,
            MetricType::Gauge,
        )?;
        for (name, in_flight) in &read {
            let labels = QueueLabels { name: name.clone() };
            ConstGauge::new(in_flight.longest.as_secs_f64()).encode(longest.encode_family(&labels)?)?;
        }
        // Who waits behind whom: the busiest flows by name, the rest summed (bounded label values).
        let flows = |in_flight: &crate::engine::queue::InFlight, name: &str| {
            in_flight
                .flows
                .iter()
                .map(|f| {
                    let flow = f.flow.clone().unwrap_or_else(|| "(others)".to_owned());
                    (FlowLabels { name: name.to_owned(), flow }, f.clone())
                })
                .collect::<Vec<_>>()
        };
        let mut depth = encoder.encode_descriptor(
            "metahook_queue_flow_depth",
            "Keys waiting, by flow (the parent's namespace): the busiest flows by name, the others as (others).",
            None,
            MetricType::Gauge,
        )?;
        for (name, in_flight) in &read {
            for (labels, figures) in flows(in_flight, name) {
                ConstGauge::new(i64::try_from(figures.waiting).unwrap_or(i64::MAX))
                    .encode(depth.encode_family(&labels)?)?;
            }
        }
        let mut oldest = encoder.encode_descriptor(
            "metahook_queue_flow_oldest_seconds",
            "Seconds the key of the flow queued longest in each line has waited, by flow and line (lines with keys waiting).",
            None,
            MetricType::Gauge,
        )?;
        for (name, in_flight) in &read {
            for (FlowLabels { name, flow }, figures) in flows(in_flight, name) {
                for (lane, waited) in crate::engine::queue::LANES.into_iter().zip(figures.lines) {
                    let Some(waited) = waited else { continue };
                    let labels = FlowLineLabels { name: name.clone(), flow: flow.clone(), line: lane.name() };
                    ConstGauge::new(waited.as_secs_f64()).encode(oldest.encode_family(&labels)?)?;
                }
            }
        }
        let mut held = encoder.encode_descriptor(
            "metahook_queue_flow_workers",
            "Workers syncing a key of the flow now, by flow.",
            None,
            MetricType::Gauge,
        )?;
        for (name, in_flight) in &read {
            for (labels, figures) in flows(in_flight, name) {
                ConstGauge::new(i64::try_from(figures.busy).unwrap_or(i64::MAX))
                    .encode(held.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[tokio::test(start_paused = true)]
    async fn renders_reconcile_and_workqueue_families_per_controller() {
        let metrics = Metrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let web = metrics.controller("CompositeController", "web");
        web.workers(5);
        web.record(Duration::from_millis(1500), Outcome::Success);
        web.record(Duration::from_millis(500), Outcome::Error);
        web.record(Duration::from_millis(500), Outcome::Requeue);
        web.panicked();
        let stats = metrics.queue("CompositeController", "web");
        let queue = crate::engine::queue::WorkQueue::with_stats(crate::engine::queue::Backoff::default(), stats);
        queue.add("a");
        queue.add("b");
        assert_eq!(queue.next().await, Some("a"));
        tokio::time::advance(Duration::from_millis(2500)).await;
        metrics.apply.record("ConfigMap", "created");
        web.hook_sync(Cause::Delay);
        web.hook_sync(Cause::Delay);
        web.hook_sync(Cause::Echo);
        web.hook_call_saved(Saved::IdenticalRequest);
        let text = render(&registry);
        let controller_label = "controller=\"compositecontroller/web\"";
        let name_label = "name=\"compositecontroller/web\"";
        for line in [
            format!("controller_runtime_reconcile_total{{{controller_label},result=\"success\"}} 1"),
            format!("controller_runtime_reconcile_total{{{controller_label},result=\"error\"}} 1"),
            format!("controller_runtime_reconcile_total{{{controller_label},result=\"requeue\"}} 1"),
            format!("controller_runtime_reconcile_errors_total{{{controller_label}}} 1"),
            format!("controller_runtime_reconcile_time_seconds_count{{{controller_label}}} 3"),
            format!("controller_runtime_reconcile_panics_total{{{controller_label}}} 1"),
            format!("controller_runtime_max_concurrent_reconciles{{{controller_label}}} 5"),
            format!("controller_runtime_active_workers{{{controller_label}}} 1"),
            format!("workqueue_depth{{{name_label}}} 1"),
            format!("workqueue_adds_total{{{name_label}}} 2"),
            format!("workqueue_unfinished_work_seconds{{{name_label}}} 2.5"),
            format!("workqueue_longest_running_processor_seconds{{{name_label}}} 2.5"),
            "metahook_apply_total{kind=\"ConfigMap\",result=\"created\"} 1".to_owned(),
            // "b" has waited 2.5 s in its flow's change line; no other line has a sample.
            format!("metahook_queue_flow_oldest_seconds{{{name_label},flow=\"default\",line=\"change\"}} 2.5"),
        ] {
            assert!(text.contains(&line), "missing {line} in\n{text}");
        }
        assert!(!text.contains("line=\"delay\""), "only lines with keys waiting: {text}");
        let labels = "kind=\"CompositeController\",controller=\"web\"";
        assert!(text.contains(&format!("metahook_hook_syncs_total{{{labels},cause=\"delay\"}} 2")), "{text}");
        assert!(text.contains(&format!("metahook_hook_syncs_total{{{labels},cause=\"echo\"}} 1")));
        assert!(text.contains(&format!("metahook_hook_calls_saved_total{{{labels},why=\"identical_request\"}} 1")));
        metrics.remove("CompositeController", "web");
        let text = render(&registry);
        assert!(!text.contains("controller=\"web\"") && !text.contains("compositecontroller/web"), "{text}");
    }
}
