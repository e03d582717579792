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
//! Keys wait in two lines. One holds keys queued for something observed (a watch event, an echo, a
//! sync request); the other keys that came back by their delay (a resync, a retry, `resyncAfterSeconds`).
//! A worker takes from the second only when the first is empty, so a change is never stuck behind a
//! period's worth of resyncs: with 3,000 parents resynced every 10 s, 300 resyncs a second were queued
//! ahead of the change a user had just made. controller-runtime's priority queue does the same (events
//! first, resyncs low). The price: under a load that never lets the change line empty, resyncs and
//! retries wait; they are the work that is not new.
//!
//! Invariants (all under one lock, held only for amortised O(1) work):
//! - a key is in `queued` at most once, and iff it is in `dirty` and not in `processing`; of its entries
//!   in the two lines only the one with its ticket counts (moving a key to the change line leaves a
//!   stale entry behind, skipped when reached);
//! - a key added while being processed is parked in `dirty` and queued again by [`WorkQueue::done`].

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InFlight {
    /// Keys handed to a worker and not yet done.
    pub keys: usize,
    /// How long each of them has been held so far, added up.
    pub unfinished: Duration,
    /// How long the one held longest has been held.
    pub longest: Duration,
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

impl<K: Clone + Eq + Hash + Send + Sync> HeldKeys for Inner<K> {
    fn in_flight(&self, now: Instant) -> InFlight {
        let state = self.state.lock().expect("queue lock");
        let mut in_flight = InFlight { keys: state.processing.len(), ..InFlight::default() };
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

    /// The reason that names the sync: a change (or request) before an echo before a delay. (A key with
    /// no reason, which a worker never gets, counts as a change.)
    #[must_use]
    pub const fn main(self) -> Reason {
        if self.has(Reason::Change) || self.has(Reason::Requested) || self.0 == 0 {
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

    fn lane(self) -> Lane {
        if self.0 == Self::bit(Reason::Delay) { Lane::Delayed } else { Lane::Change }
    }
}

/// The line a queued key waits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lane {
    /// Something was observed: served first.
    Change,
    /// Back by its delay: served when no change waits.
    Delayed,
}

struct State<K> {
    changes: VecDeque<(K, u64)>,
    delays: VecDeque<(K, u64)>,
    /// Keys waiting in a line: which one, and the ticket of their live entry there.
    queued: HashMap<K, (Lane, u64)>,
    tickets: u64,
    /// Keys waiting to be processed, and why (their line follows: anything observed wins over a delay).
    dirty: HashMap<K, Reasons>,
    /// Keys handed to a worker, with the reasons they were taken for.
    processing: HashMap<K, Reasons>,
    failures: HashMap<K, u32>,
    /// When each key in `queue` was queued, and when each key in `processing` was handed out (metrics).
    since: HashMap<K, Instant>,
    shutting_down: bool,
}

impl<K: Clone + Eq + Hash> State<K> {
    /// Appends `key` to the end of `lane`'s line (moving it there if it waits in the other), noting
    /// when it was first queued (for `workqueue_queue_duration_seconds`).
    fn push(&mut self, key: K, lane: Lane, stats: &QueueStats) {
        self.since.entry(key.clone()).or_insert_with(Instant::now);
        self.tickets += 1;
        self.queued.insert(key.clone(), (lane, self.tickets));
        let waiting = match lane {
            Lane::Change => &mut self.changes,
            Lane::Delayed => &mut self.delays,
        };
        waiting.push_back((key, self.tickets));
        stats.depth.set(i64::try_from(self.queued.len()).unwrap_or(i64::MAX));
    }

    /// The oldest key of the change line, else of the delay line.
    fn pop(&mut self) -> Option<K> {
        for (lane, line) in [(Lane::Change, &mut self.changes), (Lane::Delayed, &mut self.delays)] {
            while let Some((key, ticket)) = line.pop_front() {
                if self.queued.get(&key) == Some(&(lane, ticket)) {
                    self.queued.remove(&key);
                    return Some(key);
                }
            }
        }
        None
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
    K: Clone + Eq + Hash + Send + Sync + 'static,
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
            state: Mutex::new(State {
                changes: VecDeque::new(),
                delays: VecDeque::new(),
                queued: HashMap::new(),
                tickets: 0,
                dirty: HashMap::new(),
                processing: HashMap::new(),
                failures: HashMap::new(),
                since: HashMap::new(),
                shutting_down: false,
            }),
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

    /// Queues `key` now for a change, unless it is already waiting (a key waiting in the delay line
    /// moves to the end of the change line).
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
                if let Some(key) = state.pop() {
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
        state.processing.remove(key);
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
fn add_as<K: Clone + Eq + Hash>(inner: &Inner<K>, key: K, reason: Reason) {
    let mut state = inner.state.lock().expect("queue lock");
    if state.shutting_down {
        return;
    }
    let lane = if let Some(reasons) = state.dirty.get_mut(&key) {
        let before = reasons.lane();
        *reasons = reasons.and(reason);
        // Already waiting: only a key that now waits for something observed moves up (a parked one goes
        // back in that line when its worker is done).
        if before == reasons.lane() || !state.queued.contains_key(&key) {
            return;
        }
        Lane::Change
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
    K: Clone + Eq + Hash + Send + Sync + 'static,
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
                ("echoed", Reasons::of(Reason::Echo)),
                ("echoed-and-changed", echo_and_change),
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
        assert_eq!(stats.in_flight.read(Instant::now()), InFlight::default(), "queued keys are not in flight");
        let stuck = q.next().await.unwrap();
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(q.next().await, Some("slow"));
        tokio::time::advance(Duration::from_secs(1)).await;
        let expected = InFlight { keys: 2, unfinished: Duration::from_secs(5), longest: Duration::from_secs(4) };
        assert_eq!(stats.in_flight.read(Instant::now()), expected);
        q.done(&stuck);
        let expected = InFlight { keys: 1, unfinished: Duration::from_secs(1), longest: Duration::from_secs(1) };
        assert_eq!(stats.in_flight.read(Instant::now()), expected, "a key done is no longer counted");
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
