//! A work queue of keys: de-duplicated, one worker per key at a time, delayed and rate-limited requeues.
//!
//! This is client-go's workqueue contract, which Metacontroller users' expectations are built on.
//! kube-runtime's `Controller` has a scheduler but couples it to its own watches and gives no
//! per-item exponential backoff or queue depth to export, so metahook keeps its own queue here.
//!
//! Every key carries the [`Reasons`] it was queued for (a change by someone else, the echo of the hub's
//! own write, its delay), merged while it waits, so the sync that takes it knows why it runs without
//! reconstructing it (as kube-runtime's `ReconcileRequest` carries its reason).
//!
//! Keys are served **fairly by flow** — the namespace of the object a key stands for (a cluster-scoped
//! object is a flow of its own) — round robin, one key a turn, whatever kind of work the flow has, as
//! the API server's Priority and Fairness queues requests by flow: a flood of changes in one namespace
//! gets its turns, not the queue, and another namespace's key, whatever it waits for, waits for at most
//! one key of each flow ahead of it. A flow also holds at most its share of the controller's workers
//! while another flow waits (the workers divided by the flows with work, at least one), so a flow whose
//! syncs are slow cannot take them all.
//!
//! Within a flow, its keys wait in four lines, served in this order:
//! 1. **changes**: something was observed (a watch event of an object or a child by someone else, a
//!    sync request);
//! 2. **relisted**: work found by a list — a hub's start, a relist after a watch expired, a bucket of
//!    parents moving to this replica — where the hub saw nothing change, only that it had not looked;
//! 3. **echoes**: the watch events of the hub's own writes, work the hub caused rather than news;
//! 4. **delays**: keys back by their delay (a resync, a retry, `resyncAfterSeconds`).
//!
//! So a change is never stuck behind its own flow's period's worth of resyncs (with 3,000 parents
//! resynced every 10 s, 300 resyncs a second were queued ahead of the change a user had just made),
//! behind a restart's relist, or behind the echoes of a backlog's own writes. controller-runtime's
//! priority queue does the first two (events first, its initial list and resyncs low). A key queued for
//! several reasons waits in the first line any of them asks for.
//!
//! The lines were once served across flows (a line only when every flow's earlier lines were empty):
//! under a sustained flood of changes in one namespace, no other namespace's relisted key, retry, resync
//! or echo was served at all (0 hook calls in 30 s for a change made while the hub restarted). Flows come
//! first now, and **nothing waits without bound** even within its flow: a relisted key or a key back by
//! its delay that has waited [`AGED_AFTER`] in its line is *aged*, and the flow's turns then alternate
//! between its aged keys (oldest first) and its lines in order, so the flow's own flood of changes cannot
//! starve its resyncs and retries for longer than that (and its aged keys' half of its turns). Echoes do
//! not age: they are the hub's own work, and a backlog's echoes served among its new work would slow it.
//! With one flow, or nothing else waiting, every line drains as a plain FIFO at full speed.
//!
//! Invariants (all under one lock, held only for amortised O(1) work, O(flows) at worst for a pick):
//! - a key is in `queued` at most once, and iff it is in `dirty` and not in `processing`; of its entries
//!   in the lines only the one with its ticket counts (moving a key to an earlier line leaves a stale
//!   entry behind, skipped when reached);
//! - a flow is in the ring iff one of its lines is not empty, and is kept in `flows` while anything of
//!   it is listed or held;
//! - a key added while being processed is parked in `dirty` and queued again by [`WorkQueue::done`].

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Arc as Shared;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use futures::StreamExt as _;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::time::DelayQueue;

/// The longest delay the queue accepts; longer ones (a hook's `resyncAfterSeconds: 1e12`, a
/// `Retry-After` of years) are cut to this. A day is far beyond any useful resync, and keeps every
/// deadline far inside what the timer wheel and `Instant` arithmetic can hold (the timer panics past
/// about two years, and `Instant + Duration` overflows near 9e18 seconds).
pub const MAX_DELAY: Duration = Duration::from_secs(24 * 60 * 60);

/// Delays of `SLOTTED_FROM` or more (resyncs) come due on a boundary of this slot, counted from the
/// queue's creation. Each parent is resynced a period after its own sync, so at idle their resyncs come
/// one by one (100 a second at 1,000 parents and 10 s); in slots they come in groups, and a group's
/// syncs share the wake-ups of the timer and of the workers.
const SLOT: Duration = Duration::from_millis(100);

/// The shortest delay put in a `SLOT`: backoff retries (5 ms doubling) and short `resyncAfterSeconds`
/// keep their exact time.
const SLOTTED_FROM: Duration = Duration::from_secs(1);

/// How long a relisted key or a key back by its delay waits in its line before it is *aged*: served on
/// every other turn of its flow, oldest first, ahead of the flow's changes (see the module doc). Short
/// against a resync period (a 10 s resync is served within 12 s whatever its flow's own changes), long
/// against a sync, so that a burst of changes still goes first.
pub const AGED_AFTER: Duration = Duration::from_secs(2);

/// When a key added after `delay` at `now` comes due.
fn due(origin: Instant, now: Instant, delay: Duration) -> Instant {
    let at = now + delay;
    if delay < SLOTTED_FROM {
        return at;
    }
    let slot = SLOT.as_nanos();
    let slots = at.saturating_duration_since(origin).as_nanos().div_ceil(slot);
    origin + Duration::from_nanos(u64::try_from(slots * slot).unwrap_or(u64::MAX))
}

/// Per-key exponential backoff: `base * 2^failures`, capped at `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    /// client-go's default controller rate limiter: 5 ms doubling to 1000 s.
    fn default() -> Self {
        Self { base: Duration::from_millis(5), max: Duration::from_secs(1000) }
    }
}

impl Backoff {
    /// Delay before retry number `failures + 1`.
    #[must_use]
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 2_u32.checked_pow(failures).unwrap_or(u32::MAX);
        self.base.checked_mul(factor).map_or(self.max, |d| d.min(self.max))
    }
}

/// What the queue reports, as client-go's `workqueue_*` metrics: handles into the hub's metric families
/// ([`crate::engine::metrics::Metrics::queue`]), or detached ones ([`QueueStats::default`]) nobody scrapes.
#[derive(Clone, Debug)]
pub struct QueueStats {
    pub adds: Counter,
    pub retries: Counter,
    pub depth: Gauge,
    /// Seconds from being queued to being handed to a worker.
    pub queue_duration: Histogram,
    /// Seconds from being handed to a worker to [`WorkQueue::done`].
    pub work_duration: Histogram,
    /// The keys held now, read when scraped.
    pub in_flight: InFlightProbe,
}

impl Default for QueueStats {
    fn default() -> Self {
        let histogram = || Histogram::new([1.0]);
        Self {
            adds: Counter::default(),
            retries: Counter::default(),
            depth: Gauge::default(),
            queue_duration: histogram(),
            work_duration: histogram(),
            in_flight: InFlightProbe::default(),
        }
    }
}

/// The keys workers hold now, summed up: what client-go's `workqueue_unfinished_work_seconds` and
/// `workqueue_longest_running_processor_seconds` report, and controller-runtime's active workers (one
/// worker per key held). A hook that hangs shows here while it hangs, not only once it times out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InFlight {
    /// Keys handed to a worker and not yet done.
    pub keys: usize,
    /// How long each of them has been held so far, added up.
    pub unfinished: Duration,
    /// How long the one held longest has been held.
    pub longest: Duration,
    /// Who waits behind whom: the busiest flows, keys waiting and held (see [`FlowFigures`]).
    pub flows: Vec<FlowFigures>,
}

/// Reads a queue's [`InFlight`] when metrics are scraped, rather than keeping gauges up to date on every
/// take and done: the queue already notes when each key was handed out, so the cost is paid per scrape,
/// over the few keys held (at most one per worker). Filled in by [`WorkQueue::with_stats`]; it holds the
/// queue weakly, so a stopped controller's queue is freed and reads as idle.
#[derive(Clone, Default)]
pub struct InFlightProbe(Arc<OnceLock<Weak<dyn HeldKeys>>>);

impl std::fmt::Debug for InFlightProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("InFlightProbe").field(&self.read(Instant::now())).finish()
    }
}

impl InFlightProbe {
    /// What the queue's workers hold at `now` (nothing, before a queue reports here or after it is gone).
    #[must_use]
    pub fn read(&self, now: Instant) -> InFlight {
        self.0.get().and_then(Weak::upgrade).map(|queue| queue.in_flight(now)).unwrap_or_default()
    }
}

/// A queue of any key type, as the probe sees it.
trait HeldKeys: Send + Sync {
    fn in_flight(&self, now: Instant) -> InFlight;
}

impl<K: Clone + Eq + Hash + Flowing + Send + Sync> HeldKeys for Inner<K> {
    fn in_flight(&self, now: Instant) -> InFlight {
        let state = self.state.lock().expect("queue lock");
        let flows = state.flow_figures(now);
        let mut in_flight = InFlight { keys: state.processing.len(), flows, ..InFlight::default() };
        for started in state.processing.keys().filter_map(|key| state.since.get(key)) {
            let held = now.saturating_duration_since(*started);
            in_flight.unfinished += held;
            in_flight.longest = in_flight.longest.max(held);
        }
        in_flight
    }
}

/// Why a key was queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Something was observed: the object, one of its children or related objects changed (by someone
    /// else than this controller), or a sync was requested.
    Change,
    /// The watch event of one of this controller's own writes for the key (its echo).
    Echo,
    /// It came back by its delay: a resync, a retry, `resyncAfterSeconds`.
    Delay,
    /// Someone asked for its hook to be called again (a sync requested on the controller object).
    Requested,
    /// A list found it (a start, a relist, a bucket that moved here): the hub saw no change, only that it
    /// had not looked. Counts as a change everywhere but in the line it waits in.
    Relist,
}

/// The reasons a key was queued for since a worker last took it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reasons(u8);

impl Reasons {
    const fn bit(reason: Reason) -> u8 {
        match reason {
            Reason::Change => 1,
            Reason::Echo => 2,
            Reason::Delay => 4,
            Reason::Requested => 8,
            Reason::Relist => 16,
        }
    }

    /// Just `reason`.
    #[must_use]
    pub const fn of(reason: Reason) -> Self {
        Self(Self::bit(reason))
    }

    /// These reasons and `reason`.
    #[must_use]
    pub const fn and(self, reason: Reason) -> Self {
        Self(self.0 | Self::bit(reason))
    }

    /// These reasons without `reason`.
    #[must_use]
    pub const fn without(self, reason: Reason) -> Self {
        Self(self.0 & !Self::bit(reason))
    }

    /// Whether `reason` is among them.
    #[must_use]
    pub const fn has(self, reason: Reason) -> bool {
        self.0 & Self::bit(reason) != 0
    }

    /// The reason that names the sync: a change (or request, or relist) before an echo before a delay.
    /// (A key with no reason, which a worker never gets, counts as a change.)
    #[must_use]
    pub const fn main(self) -> Reason {
        if self.has(Reason::Change) || self.has(Reason::Requested) || self.has(Reason::Relist) || self.0 == 0 {
            Reason::Change
        } else if self.has(Reason::Echo) {
            Reason::Echo
        } else {
            Reason::Delay
        }
    }

    /// Whether the hook must be asked even if the request is the same as last time: a resync or retry
    /// (the hook may read state outside the cluster), or a sync someone asked for.
    #[must_use]
    pub const fn asks_again(self) -> bool {
        self.has(Reason::Delay) || self.has(Reason::Requested)
    }

    /// The line these reasons wait in: the first any of them asks for.
    fn lane(self) -> Lane {
        if self.has(Reason::Change) || self.has(Reason::Requested) || self.0 == 0 {
            Lane::Change
        } else if self.has(Reason::Relist) {
            Lane::Relisted
        } else if self.has(Reason::Echo) {
            Lane::Echo
        } else {
            Lane::Delayed
        }
    }
}

/// The line a queued key waits in within its flow, in the order they are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lane {
    /// Something was observed: served first.
    Change = 0,
    /// Found by a list, nothing seen to change: served when no change waits.
    Relisted = 1,
    /// The echo of the hub's own write: served when nothing new waits.
    Echo = 2,
    /// Back by its delay: served last.
    Delayed = 3,
}

/// Every line, in the order they are served.
pub const LANES: [Lane; 4] = [Lane::Change, Lane::Relisted, Lane::Echo, Lane::Delayed];

impl Lane {
    /// The line's name in metrics and in `metahook status`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Change => "change",
            Self::Relisted => "relisted",
            Self::Echo => "echo",
            Self::Delayed => "delay",
        }
    }

    /// Whether a key that has waited [`AGED_AFTER`] in this line is served ahead of its flow's earlier
    /// lines on every other turn: relisted keys and delays (echoes are the hub's own work).
    const fn ages(self) -> bool {
        matches!(self, Self::Relisted | Self::Delayed)
    }
}

/// The flow a key belongs to, for fair service (see the module doc): the namespace of the object it
/// stands for, or a cluster-scoped object's own name.
pub trait Flowing {
    fn flow(&self) -> &str;
}

impl Flowing for crate::cache::informers::ObjectKey {
    fn flow(&self) -> &str {
        self.namespace.as_deref().unwrap_or(&self.name)
    }
}

/// Plain names (the engine's tests key by them) are all one flow, `"default"`: what they test is the
/// order of service within a flow.
impl Flowing for &'static str {
    fn flow(&self) -> &'static str {
        "default"
    }
}

/// A key waiting in a line: the key, the ticket of this entry, and when it was put in the line.
type Entry<K> = (K, u64, Instant);

/// One flow's keys, by line, and how many of its keys workers hold.
struct FlowState<K> {
    lines: [VecDeque<Entry<K>>; 4],
    /// Whether the flow is in the ring.
    in_ring: bool,
    /// Whether the flow's next turn goes to its oldest aged key, if it has one (turns alternate).
    aged_turn: bool,
    busy: usize,
}

impl<K> Default for FlowState<K> {
    fn default() -> Self {
        Self { lines: Default::default(), in_ring: false, aged_turn: false, busy: 0 }
    }
}

impl<K: Eq + Hash> FlowState<K> {
    fn idle(&self) -> bool {
        self.busy == 0 && self.lines.iter().all(VecDeque::is_empty)
    }

    /// Drops the stale entries at the front of each line (keys since moved to an earlier line, or
    /// taken): afterwards every front is a key waiting there.
    fn skip_stale(&mut self, queued: &HashMap<K, (Lane, u64)>) {
        for lane in LANES {
            let line = &mut self.lines[lane as usize];
            while let Some((key, ticket, _)) = line.front() {
                if queued.get(key) == Some(&(lane, *ticket)) {
                    break;
                }
                line.pop_front();
            }
        }
    }

    /// The line to serve this turn (fronts are live: see [`FlowState::skip_stale`]): on every other
    /// turn while the flow has aged keys, the line of the one put in its line first; otherwise the
    /// first line with a key.
    fn line_to_serve(&mut self, now: Instant) -> Option<Lane> {
        let first = LANES.into_iter().find(|lane| !self.lines[*lane as usize].is_empty())?;
        let aged = LANES
            .into_iter()
            .filter(|lane| lane.ages() && *lane != first)
            .filter_map(|lane| self.lines[lane as usize].front().map(|(_, _, at)| (*at, lane)))
            .filter(|(at, _)| now.saturating_duration_since(*at) >= AGED_AFTER)
            .min();
        match aged {
            Some((_, lane)) if self.aged_turn => {
                self.aged_turn = false;
                Some(lane)
            }
            Some(_) => {
                self.aged_turn = true;
                Some(first)
            }
            None => Some(first),
        }
    }
}

/// How many keys of a flow wait and since when, and how many workers it holds (read when scraped).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowFigures {
    /// The flow (a namespace), or `None` for the flows summed up beyond the busiest.
    pub flow: Option<String>,
    pub waiting: usize,
    /// How long its key queued longest has waited.
    pub oldest: Duration,
    /// How long its key queued longest in each line has waited, in the order of [`LANES`] (`None`:
    /// nothing waits there).
    pub lines: [Option<Duration>; 4],
    /// Keys of it workers hold now.
    pub busy: usize,
}

/// The busiest flows named in the metrics; the others are summed up in one entry.
pub const NAMED_FLOWS: usize = 5;

struct State<K> {
    /// The flows with keys listed or held, by name.
    flows: HashMap<Shared<str>, FlowState<K>>,
    /// The flows with keys waiting, in the order their turns come.
    ring: VecDeque<Shared<str>>,
    /// Keys waiting in a line: which one, and the ticket of their live entry there.
    queued: HashMap<K, (Lane, u64)>,
    tickets: u64,
    /// Keys waiting to be processed, and why (their line follows: see [`Reasons::lane`]).
    dirty: HashMap<K, Reasons>,
    /// Keys handed to a worker, with the reasons they were taken for.
    processing: HashMap<K, Reasons>,
    failures: HashMap<K, u32>,
    /// When each key in `queue` was queued, and when each key in `processing` was handed out (metrics).
    since: HashMap<K, Instant>,
    /// The controller's workers: a flow's share of them is this divided by the flows with work.
    workers: usize,
    shutting_down: bool,
}

impl<K: Clone + Eq + Hash + Flowing> State<K> {
    fn new() -> Self {
        Self {
            flows: HashMap::new(),
            ring: VecDeque::new(),
            queued: HashMap::new(),
            tickets: 0,
            dirty: HashMap::new(),
            processing: HashMap::new(),
            failures: HashMap::new(),
            since: HashMap::new(),
            workers: 1,
            shutting_down: false,
        }
    }

    /// Appends `key` to the end of its flow's list in `lane` (moving it there if it waits in a later
    /// line), noting when it was first queued (for `workqueue_queue_duration_seconds`).
    fn push(&mut self, key: K, lane: Lane, stats: &QueueStats) {
        let now = Instant::now();
        self.since.entry(key.clone()).or_insert(now);
        self.tickets += 1;
        self.queued.insert(key.clone(), (lane, self.tickets));
        let known = self.flows.get_key_value(key.flow()).map(|(known, _)| Shared::clone(known));
        let name = known.unwrap_or_else(|| Shared::from(key.flow()));
        let flow = self.flows.entry(Shared::clone(&name)).or_default();
        flow.lines[lane as usize].push_back((key, self.tickets, now));
        if !flow.in_ring {
            flow.in_ring = true;
            self.ring.push_back(name);
        }
        stats.depth.set(i64::try_from(self.queued.len()).unwrap_or(i64::MAX));
    }

    /// The next key to serve: from the next flow in turn whose keys held stay within its share of the
    /// workers (or, when every flow is at its share, the next flow in turn: workers are never left idle
    /// while keys wait), the key its lines give this turn ([`FlowState::line_to_serve`]). The key's
    /// flow holds one more worker, and takes its next turn after every other flow's.
    fn pop(&mut self, now: Instant) -> Option<K> {
        let share = (self.workers / self.flows.len().max(1)).max(1);
        let mut chosen = None;
        let mut over_share = None;
        let mut turn = 0;
        while turn < self.ring.len() {
            let flow = self.flows.get_mut(&self.ring[turn]).expect("a ringed flow is kept");
            flow.skip_stale(&self.queued);
            if flow.lines.iter().all(VecDeque::is_empty) {
                flow.in_ring = false;
                if let Some(name) = self.ring.remove(turn)
                    && self.flows.get(&name).is_some_and(FlowState::idle)
                {
                    self.flows.remove(&name);
                }
                continue;
            }
            if flow.busy < share {
                chosen = Some(turn);
                break;
            }
            over_share.get_or_insert(turn);
            turn += 1;
        }
        let name = self.ring.remove(chosen.or(over_share)?).expect("a flow in turn");
        let flow = self.flows.get_mut(&name).expect("a ringed flow is kept");
        let lane = flow.line_to_serve(now).expect("a ringed flow has a key waiting");
        let (key, _, _) = flow.lines[lane as usize].pop_front().expect("a live entry at its front");
        flow.busy += 1;
        if flow.lines.iter().all(VecDeque::is_empty) {
            flow.in_ring = false;
        } else {
            self.ring.push_back(name);
        }
        self.queued.remove(&key);
        Some(key)
    }

    /// `key`, held by a worker, is done: its flow holds one worker less.
    fn release(&mut self, key: &K) {
        if let Some(flow) = self.flows.get_mut(key.flow()) {
            flow.busy = flow.busy.saturating_sub(1);
            if flow.idle() {
                self.flows.remove(key.flow());
            }
        }
    }

    /// The busiest flows (by keys waiting, then held) at `now`, at most [`NAMED_FLOWS`] of them by name
    /// and the rest summed up.
    fn flow_figures(&self, now: Instant) -> Vec<FlowFigures> {
        let mut by_flow: HashMap<&str, FlowFigures> = HashMap::new();
        for (key, (lane, _)) in &self.queued {
            let figures = by_flow.entry(key.flow()).or_default();
            figures.waiting += 1;
            if let Some(since) = self.since.get(key) {
                let waited = now.saturating_duration_since(*since);
                figures.oldest = figures.oldest.max(waited);
                let line = &mut figures.lines[*lane as usize];
                *line = Some(line.map_or(waited, |oldest| oldest.max(waited)));
            }
        }
        for (name, flow) in self.flows.iter().filter(|(_, f)| f.busy > 0) {
            by_flow.entry(name).or_default().busy = flow.busy;
        }
        let mut flows: Vec<(&str, FlowFigures)> = by_flow.into_iter().collect();
        flows.sort_by(|(a, fa), (b, fb)| (fb.waiting, fb.busy, a).cmp(&(fa.waiting, fa.busy, b)));
        let mut named: Vec<FlowFigures> = Vec::new();
        let mut others = FlowFigures::default();
        for (index, (name, figures)) in flows.into_iter().enumerate() {
            if index < NAMED_FLOWS {
                named.push(FlowFigures { flow: Some(name.to_owned()), ..figures });
            } else {
                others.waiting += figures.waiting;
                others.busy += figures.busy;
                others.oldest = others.oldest.max(figures.oldest);
                for (sum, line) in others.lines.iter_mut().zip(figures.lines) {
                    *sum = (*sum).max(line);
                }
            }
        }
        if others != FlowFigures::default() {
            named.push(others);
        }
        named
    }
}

struct Inner<K> {
    state: Mutex<State<K>>,
    ready: Notify,
    timer: mpsc::UnboundedSender<(K, Instant)>,
    backoff: Backoff,
    stats: QueueStats,
    /// Where `SLOT`s are counted from.
    origin: Instant,
}

/// Handle to a queue; clones share it. Must be created inside a Tokio runtime (it spawns its timer).
pub struct WorkQueue<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }
}

impl<K> WorkQueue<K>
where
    K: Clone + Eq + Hash + Flowing + Send + Sync + 'static,
{
    #[must_use]
    pub fn new(backoff: Backoff) -> Self {
        Self::with_stats(backoff, QueueStats::default())
    }

    /// A queue that reports into `stats`.
    #[must_use]
    pub fn with_stats(backoff: Backoff, stats: QueueStats) -> Self {
        let (timer, requests) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            state: Mutex::new(State::new()),
            ready: Notify::new(),
            timer,
            backoff,
            stats,
            origin: Instant::now(),
        });
        tokio::spawn(run_timer(Arc::downgrade(&inner), requests));
        let held: Weak<dyn HeldKeys> = Arc::downgrade(&inner) as Weak<Inner<K>>;
        // The probe reads the first queue given these stats; every controller start gets fresh ones.
        let _ = inner.stats.in_flight.0.set(held);
        Self { inner }
    }

    /// How many workers take keys from this queue: a flow holds at most its share of them while another
    /// flow waits (see the module doc).
    pub fn set_workers(&self, workers: usize) {
        self.inner.state.lock().expect("queue lock").workers = workers.max(1);
    }

    /// Queues `key` now for a change, unless it is already waiting (a key waiting in a later line moves
    /// to the end of its flow's list in the change line).
    pub fn add(&self, key: K) {
        add_as(&self.inner, key, Reason::Change);
    }

    /// Queues `key` now for `reason` (a [`Reason::Delay`] goes to the delay line), as [`WorkQueue::add`].
    pub fn add_for(&self, key: K, reason: Reason) {
        add_as(&self.inner, key, reason);
    }

    /// Queues `key` after `delay` (at most [`MAX_DELAY`]; from `SLOTTED_FROM` on, rounded up to the
    /// next `SLOT`). Of several pending delays for one key the earliest wins.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            add_as(&self.inner, key, Reason::Delay);
        } else {
            let at = due(self.inner.origin, Instant::now(), delay.min(MAX_DELAY));
            // The timer task lives as long as `inner`, so the send cannot fail while we hold it.
            let _ = self.inner.timer.send((key, at));
        }
    }

    /// Queues `key` for the echo of its own sync's write — unless its syncs are failing: a key whose
    /// last sync failed waits for its backoff retry, which sees what the echo shows anyway. Returns
    /// whether it was queued (or parked, while its sync runs).
    ///
    /// Why: a failing sync may still write (the status, as Metacontroller writes it even when a child
    /// could not be written). Its echo would queue the key at once, the sync fail again, and its status
    /// write echo again: thousands of failed syncs a minute for one parent whose status changes on every
    /// call, instead of a backoff. A change by someone else ([`WorkQueue::add`]) still goes at once.
    pub fn add_echo(&self, key: K) -> bool {
        let backing_off = {
            let state = self.inner.state.lock().expect("queue lock");
            !state.processing.contains_key(&key) && state.failures.get(&key).is_some_and(|f| *f > 0)
        };
        if !backing_off {
            add_as(&self.inner, key, Reason::Echo);
        }
        !backing_off
    }

    /// Queues `key` after its backoff delay, and counts one more failure for it. An echo parked while
    /// its failed sync ran is dropped: the retry sees what it shows (see [`WorkQueue::add_echo`]).
    pub fn add_rate_limited(&self, key: K) {
        let failures = {
            let mut state = self.inner.state.lock().expect("queue lock");
            if state.processing.contains_key(&key)
                && let Some(reasons) = state.dirty.get(&key).copied()
                && reasons.has(Reason::Echo)
            {
                let left = reasons.without(Reason::Echo);
                if left == Reasons::default() {
                    state.dirty.remove(&key);
                } else {
                    state.dirty.insert(key.clone(), left);
                }
            }
            let failures = state.failures.entry(key.clone()).or_insert(0);
            *failures += 1;
            *failures - 1
        };
        self.inner.stats.retries.inc();
        self.add_after(key, self.inner.backoff.delay(failures));
    }

    /// Clears the failure count of `key` (after a successful sync).
    pub fn forget(&self, key: &K) {
        self.inner.state.lock().expect("queue lock").failures.remove(key);
    }

    /// Failures counted for `key` since it was last forgotten.
    #[must_use]
    pub fn failures(&self, key: &K) -> u32 {
        self.inner.state.lock().expect("queue lock").failures.get(key).copied().unwrap_or(0)
    }

    /// Waits for the next key; `None` once the queue is shut down. The caller owns the key until
    /// [`WorkQueue::done`]: no other worker receives it meanwhile.
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.inner.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut state = self.inner.state.lock().expect("queue lock");
                if state.shutting_down {
                    return None;
                }
                if let Some(key) = state.pop(Instant::now()) {
                    let report = &self.inner.stats;
                    report.depth.set(i64::try_from(state.queued.len()).unwrap_or(i64::MAX));
                    if let Some(queued) = state.since.insert(key.clone(), Instant::now()) {
                        report.queue_duration.observe(queued.elapsed().as_secs_f64());
                    }
                    let reasons = state.dirty.remove(&key).unwrap_or_default();
                    state.processing.insert(key.clone(), reasons);
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    /// Why the worker holding `key` got it: every reason it was queued for since it was last taken.
    #[must_use]
    pub fn reasons(&self, key: &K) -> Reasons {
        self.inner.state.lock().expect("queue lock").processing.get(key).copied().unwrap_or_default()
    }

    /// Marks `key` as no longer being processed; queues it again if it was added meanwhile.
    pub fn done(&self, key: &K) {
        let mut state = self.inner.state.lock().expect("queue lock");
        if state.processing.remove(key).is_some() {
            state.release(key);
        }
        if let Some(started) = state.since.remove(key) {
            self.inner.stats.work_duration.observe(started.elapsed().as_secs_f64());
        }
        if let Some(reasons) = state.dirty.get(key) {
            let lane = reasons.lane();
            state.push(key.clone(), lane, &self.inner.stats);
            drop(state);
            self.inner.ready.notify_one();
        }
    }

    /// Wakes every waiting worker with `None`; later adds are ignored.
    pub fn shut_down(&self) {
        self.inner.state.lock().expect("queue lock").shutting_down = true;
        self.inner.ready.notify_waiters();
    }

    /// Keys waiting to be processed.
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.state.lock().expect("queue lock").queued.len()
    }

    /// Whether `key` is waiting to be processed (queued, or parked while a worker has it).
    #[must_use]
    pub fn is_pending(&self, key: &K) -> bool {
        self.inner.state.lock().expect("queue lock").dirty.contains_key(key)
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counters for metrics.
    #[must_use]
    pub fn stats(&self) -> &QueueStats {
        &self.inner.stats
    }
}

/// Queues `key` for `reason`, in the line its reasons ask for.
fn add_as<K: Clone + Eq + Hash + Flowing>(inner: &Inner<K>, key: K, reason: Reason) {
    let mut state = inner.state.lock().expect("queue lock");
    if state.shutting_down {
        return;
    }
    let lane = if let Some(reasons) = state.dirty.get_mut(&key) {
        let before = reasons.lane();
        *reasons = reasons.and(reason);
        let now = reasons.lane();
        // Already waiting: only a key that now asks for an earlier line moves up (a parked one goes back
        // in its line when its worker is done).
        if now >= before || !state.queued.contains_key(&key) {
            return;
        }
        now
    } else {
        inner.stats.adds.inc();
        let reasons = Reasons::of(reason);
        state.dirty.insert(key.clone(), reasons);
        if state.processing.contains_key(&key) {
            return;
        }
        reasons.lane()
    };
    state.push(key, lane, &inner.stats);
    drop(state);
    inner.ready.notify_one();
}

/// Owns the delayed keys; ends when the queue is dropped.
async fn run_timer<K>(inner: Weak<Inner<K>>, mut requests: mpsc::UnboundedReceiver<(K, Instant)>)
where
    K: Clone + Eq + Hash + Flowing + Send + Sync + 'static,
{
    let mut delays: DelayQueue<K> = DelayQueue::new();
    let mut pending: HashMap<K, (tokio_util::time::delay_queue::Key, Instant)> = HashMap::new();
    loop {
        tokio::select! {
            request = requests.recv() => {
                let Some((key, at)) = request else { return };
                match pending.get(&key) {
                    Some((_, existing)) if *existing <= at => {}
                    Some((slot, _)) => {
                        let slot = *slot;
                        delays.reset_at(&slot, at);
                        pending.insert(key, (slot, at));
                    }
                    None => {
                        let slot = delays.insert_at(key.clone(), at);
                        pending.insert(key, (slot, at));
                    }
                }
            }
            Some(expired) = delays.next(), if !delays.is_empty() => {
                let key = expired.into_inner();
                pending.remove(&key);
                let Some(inner) = inner.upgrade() else { return };
                add_as(&inner, key, Reason::Delay);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_delays_come_due_on_a_slot_boundary_and_short_ones_exactly() {
        let origin = Instant::now();
        let now = origin + Duration::from_millis(1234);
        // Two resyncs asked for 20 ms apart come due together, at the next slot boundary after each.
        assert_eq!(due(origin, now, Duration::from_secs(10)), origin + Duration::from_millis(11_300));
        let later = now + Duration::from_millis(20);
        assert_eq!(due(origin, later, Duration::from_secs(10)), origin + Duration::from_millis(11_300));
        // Never earlier than asked; a deadline on a boundary stays.
        assert_eq!(due(origin, origin, Duration::from_secs(2)), origin + Duration::from_secs(2));
        // Retries keep their exact time.
        assert_eq!(due(origin, now, Duration::from_millis(5)), now + Duration::from_millis(5));
    }

    /// Takes every waiting key with its reasons, in order.
    async fn drain(q: &WorkQueue<&'static str>) -> Vec<(&'static str, Reasons)> {
        let mut taken = Vec::new();
        while let Some(key) = tokio::time::timeout(Duration::from_millis(10), q.next()).await.ok().flatten() {
            taken.push((key, q.reasons(&key)));
            q.done(&key);
        }
        taken
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_carries_every_reason_it_was_queued_for_once() {
        let q = WorkQueue::new(Backoff::default());
        q.add("now");
        q.add("both");
        q.add_after("both", Duration::from_secs(1));
        q.add_after("later", Duration::from_secs(1));
        q.add_for("echoed", Reason::Echo);
        q.add_for("echoed-and-changed", Reason::Echo);
        q.add("echoed-and-changed");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let change_and_delay = Reasons::of(Reason::Change).and(Reason::Delay);
        let echo_and_change = Reasons::of(Reason::Echo).and(Reason::Change);
        assert_eq!(
            drain(&q).await,
            [
                ("now", Reasons::of(Reason::Change)),
                ("both", change_and_delay),
                ("echoed-and-changed", echo_and_change),
                ("echoed", Reasons::of(Reason::Echo)),
                ("later", Reasons::of(Reason::Delay)),
            ]
        );
        assert_eq!(change_and_delay.main(), Reason::Change);
        assert_eq!(echo_and_change.main(), Reason::Change, "a change is a change, whatever else queued it");
        assert_eq!(Reasons::of(Reason::Echo).and(Reason::Delay).main(), Reason::Echo);
        assert!(change_and_delay.asks_again() && Reasons::of(Reason::Requested).asks_again());
        assert!(!echo_and_change.asks_again(), "only a delay or a request asks the same question twice");
        q.add("now");
        assert_eq!(drain(&q).await, [("now", Reasons::of(Reason::Change))], "taken reasons are not told again");
    }

    #[tokio::test(start_paused = true)]
    async fn changes_are_served_before_keys_back_by_their_delay() {
        let q = WorkQueue::new(Backoff::default());
        q.add_after("resync-1", Duration::from_secs(1));
        q.add_after("resync-2", Duration::from_secs(1));
        q.add_after("moved", Duration::from_secs(1));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(q.len(), 3);
        q.add("change");
        q.add_for("moved", Reason::Echo);
        assert_eq!(q.len(), 4, "a key moved to the change line is still one key");
        let order: Vec<_> = drain(&q).await.into_iter().map(|(key, _)| key).collect();
        assert_eq!(order, ["change", "moved", "resync-1", "resync-2"], "each key once, observed first");
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_parked_key_changed_meanwhile_comes_back_as_a_change() {
        let q = WorkQueue::new(Backoff::default());
        q.add("busy");
        let busy = q.next().await.unwrap();
        q.add_after("busy", Duration::from_millis(1));
        q.add_after("resync", Duration::from_millis(1));
        tokio::time::sleep(Duration::from_millis(5)).await;
        q.add("busy");
        q.done(&busy);
        assert_eq!(q.len(), 2);
        assert_eq!(q.next().await, Some("busy"), "its change wins over the older resync");
        assert_eq!(q.reasons(&"busy"), Reasons::of(Reason::Change).and(Reason::Delay));
        assert_eq!(q.next().await, Some("resync"));
        assert_eq!(q.reasons(&"resync"), Reasons::of(Reason::Delay), "only its delay queued it");
    }

    /// The echo of a failing sync's own write waits for the backoff retry; a change does not, and once a
    /// sync succeeds its echoes sync again.
    #[tokio::test(start_paused = true)]
    async fn the_echo_of_a_failing_sync_waits_for_its_backoff_but_a_change_does_not() {
        let q = WorkQueue::new(Backoff { base: Duration::from_secs(10), max: Duration::from_secs(60) });
        q.add("p");
        let p = q.next().await.unwrap();
        assert!(q.add_echo("p"), "parked while its sync runs");
        q.add_rate_limited("p");
        q.done(&p);
        assert!(q.is_empty(), "the failed sync's own echo does not queue it at once");
        assert!(!q.add_echo("p"), "nor one that comes after the sync ended");
        assert!(q.is_empty());
        q.add("p");
        assert_eq!(drain(&q).await, [("p", Reasons::of(Reason::Change))], "a change by someone else goes at once");
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(drain(&q).await, [("p", Reasons::of(Reason::Delay))], "the retry comes after its backoff");
        q.forget(&"p");
        assert!(q.add_echo("p"), "after a success, echoes sync again");
        assert_eq!(drain(&q).await, [("p", Reasons::of(Reason::Echo))]);
        // An echo parked with a change: the change stays when the sync fails.
        q.add("q");
        let key = q.next().await.unwrap();
        q.add_echo("q");
        q.add("q");
        q.add_rate_limited("q");
        q.done(&key);
        assert_eq!(drain(&q).await, [("q", Reasons::of(Reason::Change))]);
    }

    /// Keys of several flows: `"<flow>/<n>"`.
    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    struct Keyed(&'static str);

    impl Flowing for Keyed {
        fn flow(&self) -> &str {
            self.0.split_once('/').map_or(self.0, |(flow, _)| flow)
        }
    }

    async fn order(q: &WorkQueue<Keyed>) -> Vec<&'static str> {
        let mut taken = Vec::new();
        while let Some(key) = tokio::time::timeout(Duration::from_millis(10), q.next()).await.ok().flatten() {
            taken.push(key.0);
            q.done(&key);
        }
        taken
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_in_another_namespace_waits_for_one_key_of_a_flood_not_for_the_flood() {
        let q = WorkQueue::new(Backoff::default());
        for key in ["flood/1", "flood/2", "flood/3", "flood/4"] {
            q.add(Keyed(key));
        }
        q.add(Keyed("team/1"));
        q.add(Keyed("other/1"));
        assert_eq!(order(&q).await, ["flood/1", "team/1", "other/1", "flood/2", "flood/3", "flood/4"]);
        // One flow alone is served first come, first served.
        for key in ["flood/1", "flood/2", "flood/3"] {
            q.add(Keyed(key));
        }
        assert_eq!(order(&q).await, ["flood/1", "flood/2", "flood/3"]);
    }

    /// Flows first, lines within a flow. (Until issue 68 the lines came first across flows: `b/change`
    /// went before `a/relisted` and `c/resync` went last, behind every flow's echoes.)
    #[tokio::test(start_paused = true)]
    async fn each_flow_gets_its_turn_whatever_its_line_and_within_a_flow_changes_go_first() {
        let q = WorkQueue::new(Backoff::default());
        q.add_for(Keyed("flood/echo-1"), Reason::Echo);
        q.add_for(Keyed("flood/echo-2"), Reason::Echo);
        q.add_for(Keyed("a/relisted"), Reason::Relist);
        q.add(Keyed("flood/new"));
        q.add(Keyed("b/change"));
        q.add_after(Keyed("c/resync"), Duration::ZERO);
        q.add_for(Keyed("flood/echo-2"), Reason::Change);
        q.add_after(Keyed("flood/resync"), Duration::ZERO);
        q.add_for(Keyed("flood/relisted"), Reason::Relist);
        let taken = order(&q).await;
        let expected = ["flood/new", "a/relisted", "b/change", "c/resync", "flood/echo-2", "flood/relisted"];
        assert_eq!(taken, [&expected[..], &["flood/echo-1", "flood/resync"]].concat());
        assert_eq!(Reasons::of(Reason::Relist).main(), Reason::Change, "a relisted key counts as a change");
        assert!(!Reasons::of(Reason::Relist).asks_again());
    }

    /// Serves `q` one key at a time while `flood` keeps two changes waiting, each sync taking `took`:
    /// the keys in the order taken, `calls` of them.
    async fn under_a_flood(
        q: &WorkQueue<Keyed>,
        flood: [&'static str; 2],
        calls: usize,
        took: Duration,
    ) -> Vec<&'static str> {
        let mut taken = Vec::new();
        for _ in 0..calls {
            q.add(Keyed(flood[0]));
            q.add(Keyed(flood[1]));
            let key = q.next().await.expect("a key waits");
            tokio::time::sleep(took).await;
            taken.push(key.0);
            q.done(&key);
        }
        taken
    }

    #[tokio::test(start_paused = true)]
    async fn a_flow_flooding_changes_starves_no_other_flows_relisted_keys_retries_resyncs_or_echoes() {
        let q = WorkQueue::new(Backoff::default());
        let flood = ["flood/1", "flood/2"];
        q.add(Keyed(flood[0]));
        q.add_for(Keyed("restarted/relisted"), Reason::Relist);
        assert!(q.add_echo(Keyed("drifted/echo")));
        q.add_rate_limited(Keyed("failing/retry"));
        q.add_after(Keyed("resynced/resync"), Duration::from_secs(1));
        // The retry's backoff (5 ms) and the resync's period have passed.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let taken = under_a_flood(&q, flood, 40, Duration::from_millis(10)).await;
        let others = ["restarted/relisted", "drifted/echo", "failing/retry", "resynced/resync"];
        assert_eq!(taken[..5], [&["flood/1"][..], &others].concat(), "one turn each, the flood's first");
        assert_eq!(
            taken[5..].iter().filter(|k| k.starts_with("flood/")).count(),
            35,
            "then the flood alone: {taken:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn within_a_flow_relisted_keys_and_delays_age_into_service_under_its_own_flood_echoes_do_not() {
        let q = WorkQueue::new(Backoff::default());
        q.add_for(Keyed("t/relisted"), Reason::Relist);
        q.add_for(Keyed("t/echo"), Reason::Echo);
        q.add_after(Keyed("t/resync"), Duration::from_secs(1));
        let took = Duration::from_millis(100);
        let taken = under_a_flood(&q, ["t/c1", "t/c2"], 60, took).await;
        let turn = |key: &str| taken.iter().position(|k| *k == key);
        // Aged after 2 s (20 calls of 100 ms): then served within two turns of the flow.
        let aged = usize::try_from(AGED_AFTER.as_millis() / took.as_millis()).unwrap();
        let relisted = turn("t/relisted").unwrap_or_else(|| panic!("never served: {taken:?}"));
        assert!((aged - 1..=aged + 2).contains(&relisted), "relisted served at call {relisted}: {taken:?}");
        // Due at 1 s, aged at 3 s.
        let resync = turn("t/resync").unwrap_or_else(|| panic!("never served: {taken:?}"));
        assert!((aged + 9..=aged + 13).contains(&resync), "resync served at call {resync}: {taken:?}");
        assert_eq!(turn("t/echo"), None, "the hub's own echo waits for the flow's changes: {taken:?}");
        assert_eq!(taken.len() - 2, taken.iter().filter(|k| k.starts_with("t/c")).count());
        // Turns alternate: with several keys aged, the flood still gets every other call.
        for key in ["t/r1", "t/r2", "t/r3"] {
            q.add_for(Keyed(key), Reason::Relist);
        }
        let taken = under_a_flood(&q, ["t/c1", "t/c2"], 40, took).await;
        let served: Vec<usize> =
            ["t/r1", "t/r2", "t/r3"].iter().filter_map(|key| taken.iter().position(|k| k == key)).collect();
        assert_eq!(served.len(), 3, "{taken:?}");
        assert!(served.windows(2).all(|w| w[1] == w[0] + 2), "aged keys every other call: {taken:?}");
        assert!(order(&q).await.contains(&"t/echo"), "once the flood ends, the echo is served");
    }

    #[tokio::test(start_paused = true)]
    async fn a_flow_holds_at_most_its_share_of_the_workers_while_another_waits() {
        let q = WorkQueue::new(Backoff::default());
        q.set_workers(4);
        for key in ["slow/1", "slow/2", "slow/3", "slow/4", "slow/5"] {
            q.add(Keyed(key));
        }
        // Four workers, one flow: all of them (nothing else waits).
        let held: Vec<Keyed> = [q.next().await, q.next().await, q.next().await].into_iter().flatten().collect();
        assert_eq!(held.len(), 3);
        q.add(Keyed("fast/1"));
        q.add(Keyed("fast/2"));
        // Two flows: two workers each. The slow flow holds three; the fourth worker goes to the fast one.
        assert_eq!(q.next().await, Some(Keyed("fast/1")));
        q.done(&Keyed("fast/1"));
        assert_eq!(q.next().await, Some(Keyed("fast/2")), "slow is over its share: fast goes first");
        q.done(&Keyed("fast/2"));
        // Nothing else waits: the slow flow gets the free worker again.
        assert_eq!(q.next().await, Some(Keyed("slow/4")));
    }

    #[tokio::test]
    async fn duplicate_adds_are_delivered_once() {
        let q = WorkQueue::new(Backoff::default());
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.len(), 2);
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(q.next().await, Some("b"));
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn key_added_while_processing_waits_for_done() {
        let q = WorkQueue::new(Backoff::default());
        q.add("a");
        let key = q.next().await.unwrap();
        q.add("a");
        assert!(q.is_empty(), "a key in flight must not be handed to a second worker");
        q.done(&key);
        assert_eq!(q.len(), 1);
        assert_eq!(q.next().await, Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_add_arrives_after_delay_and_earliest_delay_wins() {
        let q = WorkQueue::new(Backoff::default());
        let started = Instant::now();
        q.add_after("a", Duration::from_secs(10));
        q.add_after("a", Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(q.is_empty());
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(started.elapsed().as_secs(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_adds_back_off_exponentially_until_forgotten() {
        let q = WorkQueue::new(Backoff { base: Duration::from_millis(100), max: Duration::from_secs(1) });
        for expected_ms in [100, 200, 400, 800, 1000, 1000] {
            let started = Instant::now();
            q.add_rate_limited("a");
            let key = q.next().await.unwrap();
            assert_eq!(started.elapsed().as_millis(), expected_ms);
            q.done(&key);
        }
        assert_eq!(q.failures(&"a"), 6);
        q.forget(&"a");
        assert_eq!(q.failures(&"a"), 0);
    }

    #[tokio::test]
    async fn shut_down_wakes_waiting_workers() {
        let q: WorkQueue<&str> = WorkQueue::new(Backoff::default());
        let worker = tokio::spawn({
            let q = q.clone();
            async move { q.next().await }
        });
        tokio::task::yield_now().await;
        q.shut_down();
        assert_eq!(worker.await.unwrap(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn absurd_delays_are_capped_and_the_timer_survives_them() {
        let q = WorkQueue::new(Backoff::default());
        q.add_after("years", Duration::from_secs(3 * 365 * 24 * 3600));
        q.add_after("forever", Duration::MAX);
        q.add_after("soon", Duration::from_secs(1));
        assert_eq!(q.next().await, Some("soon"), "the timer still runs after absurd delays");
        let started = Instant::now();
        let first = q.next().await.unwrap();
        assert!(first == "years" || first == "forever");
        assert_eq!(started.elapsed() + Duration::from_secs(1), MAX_DELAY);
    }

    #[tokio::test(start_paused = true)]
    async fn reports_adds_retries_depth_and_both_durations() {
        let stats = QueueStats::default();
        let q = WorkQueue::with_stats(Backoff::default(), stats.clone());
        q.add("a");
        q.add("b");
        assert_eq!((stats.adds.get(), stats.depth.get()), (2, 2));
        tokio::time::advance(Duration::from_secs(3)).await;
        let key = q.next().await.unwrap();
        assert_eq!(stats.depth.get(), 1);
        tokio::time::advance(Duration::from_secs(2)).await;
        q.add_rate_limited(key);
        q.done(&key);
        assert_eq!(stats.retries.get(), 1);
        let text = |h: &Histogram| {
            let mut registry = prometheus_client::registry::Registry::default();
            registry.register("h", "h", h.clone());
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
            out
        };
        assert!(text(&stats.queue_duration).contains("h_sum 3.0"), "{}", text(&stats.queue_duration));
        assert!(text(&stats.work_duration).contains("h_sum 2.0"), "{}", text(&stats.work_duration));
    }

    #[tokio::test(start_paused = true)]
    async fn keys_held_by_workers_are_read_with_how_long_they_have_been_held() {
        let stats = QueueStats::default();
        let q = WorkQueue::with_stats(Backoff::default(), stats.clone());
        q.add("stuck");
        q.add("slow");
        q.add("waiting");
        let read = stats.in_flight.read(Instant::now());
        assert_eq!((read.keys, read.longest), (0, Duration::ZERO), "queued keys are not in flight");
        assert_eq!(read.flows.iter().map(|f| f.waiting).sum::<usize>(), 3, "but they wait: {:?}", read.flows);
        let stuck = q.next().await.unwrap();
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(q.next().await, Some("slow"));
        tokio::time::advance(Duration::from_secs(1)).await;
        let read = stats.in_flight.read(Instant::now());
        let expected = (2, Duration::from_secs(5), Duration::from_secs(4));
        assert_eq!((read.keys, read.unfinished, read.longest), expected);
        let waited = Duration::from_secs(4);
        let lines = [Some(waited), None, None, None];
        let waiting = FlowFigures { flow: Some("default".into()), waiting: 1, oldest: waited, lines, busy: 2 };
        assert_eq!(read.flows[0], waiting, "who waits, and since when: {:?}", read.flows);
        assert_eq!(read.flows.iter().map(|f| f.busy).sum::<usize>(), 2);
        q.done(&stuck);
        let read = stats.in_flight.read(Instant::now());
        let expected = (1, Duration::from_secs(1), Duration::from_secs(1));
        assert_eq!((read.keys, read.unfinished, read.longest), expected, "a key done is no longer counted");
        drop(q);
        assert_eq!(stats.in_flight.read(Instant::now()), InFlight::default(), "a queue gone reads as idle");
    }

    #[test]
    fn backoff_caps_and_never_overflows() {
        let b = Backoff::default();
        assert_eq!(b.delay(0), Duration::from_millis(5));
        assert_eq!(b.delay(3), Duration::from_millis(40));
        assert_eq!(b.delay(40), Duration::from_secs(1000));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1000));
    }
}
