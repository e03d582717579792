//! A canary of a controller's sync hook: a candidate hook answers for a share of the parents and the
//! current hook for the rest, each side's syncs are counted side by side, and the canary halts itself
//! when the candidate fails too often.
//!
//! It is set by the controller object's [`CANARY_ANNOTATION`], read live (no restart):
//! `{"url": "http://hook-v2/sync", "percent": 10}`, or `"service"` (with `"path"`) as a hook names its
//! server, and optionally `"timeout"`, `"maxErrorRatio"` (default 0.1) and `"minSyncs"` (default 20).
//! The candidate is called with the sync hook's own settings (protocol version, timeout unless the
//! annotation sets one, TLS, authorization, ETag) at its own URL; the finalize and customize hooks stay
//! the current ones, and finalizing syncs are not part of the canary.
//!
//! **Which parents.** Those whose bucket — the hash of the UID that sharding splits by
//! ([`crate::cache::shard::bucket`]) — falls in the first `percent` of the [`BUCKETS`]. A bucket never
//! changes, so a parent stays on its side for the whole canary, and raising the percent only adds
//! parents to it.
//!
//! **Level-triggered.** A parent that changes sides is asked again: the request identity the engine
//! uses to skip an identical request includes the hook's URL ([`crate::engine::answered`]), and each
//! change of sides — a canary started, a new percent or URL, a halt, the annotation removed — queues
//! the parents that move, at `hookChangeResyncQPS` as a new hook version's parents are.
//!
//! **Halting.** The candidate is judged by its parents, each counted once by its last sync: failing
//! (a reported error, an answer the hub refused, a write the API server refused) or answered well.
//! Once it has answered `minSyncs` parents — or, on a side of fewer parents than that, once every
//! parent on its side has been asked — a share of failing parents above `maxErrorRatio` halts it: its
//! parents go back to the current hook, the controller's status says `Halted` and why (and a
//! `CanaryHalted` condition), and a Warning Event on the controller says it too. A halted canary stays
//! halted until its annotation changes (any edit starts a new one, with new counts) or is removed.
//! Promoting is changing the sync hook's URL in the controller's spec. The halt is a promise that must
//! outlive the process: the status records it with the annotation's value, and a controller started
//! again (a restart, a fail-over, a change of its spec) reads it back from there and starts the same
//! annotation halted, with its counts.
//!
//! **Counting.** A sync counts as the worker reads its result ([`Verdict`]): what the worker retries
//! quietly (a write that met a newer version than the hub's cache showed, a conflict, a related cache
//! still filling) and a hook's 429 count on neither side; what it reports is an error. Judging by
//! parents rather than by syncs is what keeps one parent from weighing more than another: a failing
//! parent retried quickly is one failing parent, and a parent a tenant edits many times a second, the
//! candidate answering it well each time, is one parent answered well (counted per sync, its successes
//! hid a candidate failing every other parent). The `syncs` and `errors` tallies still count syncs (a
//! parent's failures once until it succeeds), for the status and the metrics.
//!
//! **Reported** in the controller's `status.canary` while it runs (at most every [`REPORT_EVERY`], only
//! when the figures changed) and in the `metahook_canary_*` metrics. With sharding each replica counts
//! and halts on its own share, so the status is not written (the replicas would overwrite each other);
//! the metrics sum the shares, and each replica's halt is an Event and a log line.
//!
//! An annotation that cannot be used (not JSON, no URL, a percent out of range, hook settings the hub
//! refuses) changes nothing: the current hook answers for every parent, and the status, a Warning Event
//! and the log say why. Unlike the other settings annotations it does not stop the controller: a typo in
//! a rollout's tooling must not stop the controller it rolls out.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::api::{CanaryStatus, CanaryTally, EndpointConfig, Hook, ServiceReference};
use crate::cache::shard::{BUCKETS, bucket};
use crate::engine::answered::RequestId;
use crate::engine::error::{Counted, SyncError, Verdict};
use crate::engine::hub::Hub;
use crate::engine::metrics::ControllerMetrics;
use crate::hooks::{Endpoint, HookKind, HookLabels};

mod follow;
mod shadow;

pub(crate) use self::follow::{controller_api, run};
pub(crate) use self::shadow::settle;

/// The controller annotation that starts a canary (see the module doc).
pub const CANARY_ANNOTATION: &str = "metahook.dev/canary";
/// The condition a halted canary puts on its controller.
pub const HALTED_CONDITION: &str = "CanaryHalted";
/// How often the status is written while a canary runs (when its figures changed).
pub const REPORT_EVERY: Duration = Duration::from_secs(2);
const DEFAULT_MAX_ERROR_RATIO: f64 = 0.1;
const DEFAULT_MIN_SYNCS: u64 = 20;

/// The annotation's value.
#[derive(Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Spec {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    service: Option<ServiceReference>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    timeout: Option<String>,
    percent: f64,
    #[serde(default = "default_max_error_ratio")]
    max_error_ratio: f64,
    #[serde(default = "default_min_syncs")]
    min_syncs: u64,
}

fn default_max_error_ratio() -> f64 {
    DEFAULT_MAX_ERROR_RATIO
}

fn default_min_syncs() -> u64 {
    DEFAULT_MIN_SYNCS
}

impl Spec {
    fn parse(text: &str) -> Result<Self, String> {
        let spec: Self = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if !(spec.percent > 0.0 && spec.percent <= 100.0) {
            return Err(format!("percent must be more than 0 and at most 100, not {}", spec.percent));
        }
        if !(0.0..=1.0).contains(&spec.max_error_ratio) {
            return Err(format!("maxErrorRatio must be from 0 to 1, not {}", spec.max_error_ratio));
        }
        if spec.url.is_some() == spec.service.is_some() {
            return Err("exactly one of url and service must be set".into());
        }
        if let Some(timeout) = &spec.timeout
            && crate::api::parse_go_duration(timeout).is_none()
        {
            return Err(format!("timeout {timeout:?} is not a duration such as 10s"));
        }
        Ok(spec)
    }

    /// The candidate: the sync hook `base` at the annotation's URL.
    fn hook(&self, base: &Hook) -> Hook {
        let mut hook = base.clone();
        hook.webhook.url.clone_from(&self.url);
        hook.webhook.service.clone_from(&self.service);
        hook.webhook.path = self.service.as_ref().and(self.path.clone());
        if self.timeout.is_some() {
            hook.webhook.timeout.clone_from(&self.timeout);
        }
        hook
    }

    /// Parents of buckets below this are the candidate's.
    fn buckets(&self) -> u16 {
        let share = (self.percent / 100.0 * f64::from(BUCKETS)).ceil();
        // In range: percent is at most 100.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let buckets = share as u16;
        buckets.min(BUCKETS)
    }
}

/// Which hook answers for a parent while a canary runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Current,
    Candidate,
}

impl Side {
    /// The `side` label of the metrics.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Current => "current",
            Self::Candidate => "candidate",
        }
    }
}

/// One side's counts.
#[derive(Debug, Default)]
struct Tally {
    syncs: AtomicU64,
    errors: AtomicU64,
    permanent: AtomicU64,
    writes: AtomicU64,
}

impl Tally {
    fn add(&self, result: Counted, writes: usize) {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        match result {
            Counted::Ok => {}
            Counted::Error => {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
            Counted::PermanentError => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                self.permanent.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.writes.fetch_add(writes as u64, Ordering::Relaxed);
    }

    /// The counts a status recorded.
    fn from_status(tally: &CanaryTally) -> Self {
        let count = |n: i64| AtomicU64::new(u64::try_from(n).unwrap_or_default());
        Self {
            syncs: count(tally.syncs),
            errors: count(tally.errors),
            permanent: count(tally.permanent_errors),
            writes: count(tally.writes),
        }
    }

    fn status(&self) -> CanaryTally {
        let read = |n: &AtomicU64| i64::try_from(n.load(Ordering::Relaxed)).unwrap_or(i64::MAX);
        CanaryTally {
            syncs: read(&self.syncs),
            errors: read(&self.errors),
            permanent_errors: read(&self.permanent),
            writes: read(&self.writes),
        }
    }
}

/// A canary started by one value of the annotation.
#[derive(Debug)]
pub struct Live {
    spec: Spec,
    /// The annotation's value it was started from (recorded with a halt).
    annotation: String,
    endpoint: Endpoint,
    buckets: u16,
    current: Tally,
    candidate: Tally,
    /// Why it halted, once it has.
    halted: OnceLock<String>,
    /// What the canary knows of each parent, for [`Live::counted`] and [`Live::judge`].
    parents: Mutex<Parents>,
}

/// What a canary knows of its parents, by UID.
#[derive(Debug, Default)]
struct Parents {
    /// The parents whose failure was counted, until they succeed: a parent's failures count once,
    /// whatever its requests (each edit of a broken parent is a new request, and must not count again).
    failing: HashSet<String>,
    /// The parents whose last sync said nothing of the candidate: it failed before a sync hook was
    /// asked (`None`), or the current hook's answer to the same request (`Some`) failed the same way.
    /// They count for neither side, and the judgment does not wait for them; a retry of that request
    /// needs no second shadow call.
    own_failure: HashMap<String, Option<RequestId>>,
    /// The candidate's parents by what their last sync says of the candidate: it failed them (`true`)
    /// or answered them well (`false`); a parent whose last sync was its own failure is not here. The
    /// judgment's figures ([`Live::judge`]): each parent counts once, however often it is synced, so
    /// one parent's syncs — a tenant editing its own parent many times a second — weigh no more than
    /// any other parent's.
    latest: HashMap<String, bool>,
    /// How many of [`Parents::latest`] are failing, kept as it changes: the judgment after each sync
    /// reads it without counting a fleet's parents under the lock.
    latest_failing: usize,
}

impl Parents {
    /// Sets what the last sync of `uid` says of the candidate (`None`: nothing, it is not judged by it).
    fn set_latest(&mut self, uid: &str, failing: Option<bool>) {
        let before = match failing {
            Some(failing) => self.latest.insert(uid.to_owned(), failing),
            None => self.latest.remove(uid),
        };
        self.latest_failing -= usize::from(before == Some(true));
        self.latest_failing += usize::from(failing == Some(true));
    }
}

/// How one sync of a parent ended, as a canary reads it ([`Live::counted`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It failed before a sync hook was asked (the parent's own `spec.selector`, a related rule): no
    /// hook's answer is in it.
    Unreached,
    /// A sync hook answered, and the sync ended `counted` ([`Verdict::counted`]); for a candidate's
    /// failure, `stable_fails` says whether the current hook's answer to the same request, asked in
    /// the shadow, failed the same checks (`None`: not asked).
    Answered { counted: Counted, stable_fails: Option<bool> },
}

impl Live {
    fn new(spec: Spec, annotation: String, endpoint: Endpoint) -> Self {
        Self {
            buckets: spec.buckets(),
            spec,
            annotation,
            endpoint,
            current: Tally::default(),
            candidate: Tally::default(),
            halted: OnceLock::new(),
            parents: Mutex::default(),
        }
    }

    /// Started halted, as `recorded` says (the status of a canary of the same annotation that halted
    /// before this process, or this controller, started).
    fn resumed_halted(mut self, recorded: &CanaryStatus) -> Self {
        self.current = Tally::from_status(&recorded.current);
        self.candidate = Tally::from_status(&recorded.candidate);
        let _ = self.halted.set(recorded.message.clone());
        self
    }

    /// What a sync of the parent `uid` on `side` that showed `request` and ended as `outcome` counts
    /// for its side, if anything: the one reading of what is the candidate's. A sync that failed
    /// before any sync hook was asked counts for neither side; a candidate's failure the current hook
    /// gives for the same request too is the parent's, not the candidate's; a parent's failure counts
    /// once until it succeeds (not once per request: each edit of a broken parent is a new one).
    fn counted(&self, side: Side, uid: &str, request: Option<RequestId>, outcome: Outcome) -> Option<Counted> {
        let mut parents = self.parents.lock().expect("canary parents lock");
        let candidate = side == Side::Candidate;
        let counted = match outcome {
            Outcome::Unreached => {
                parents.own_failure.insert(uid.to_owned(), None);
                parents.set_latest(uid, None);
                return None;
            }
            Outcome::Answered { counted, stable_fails } => (counted, stable_fails),
        };
        match counted {
            (Counted::Ok, _) => {
                parents.failing.remove(uid);
                parents.own_failure.remove(uid);
                if candidate {
                    parents.set_latest(uid, Some(false));
                }
                Some(Counted::Ok)
            }
            (failed, stable_fails) => {
                let known_own = request.is_some() && parents.own_failure.get(uid) == Some(&request);
                if candidate && (stable_fails == Some(true) || known_own) {
                    parents.own_failure.insert(uid.to_owned(), request);
                    parents.set_latest(uid, None);
                    return None;
                }
                parents.own_failure.remove(uid);
                if candidate {
                    parents.set_latest(uid, Some(true));
                }
                parents.failing.insert(uid.to_owned()).then_some(failed)
            }
        }
    }

    /// Whether a sync of the parent `uid` on `side` that showed `request` and ended `counted` is to be
    /// asked of the current hook in the shadow ([`Live::counted`] tells the parent's failures from the
    /// candidate's by it): only a candidate's failure that would count, of a request that is known
    /// (the same request is asked), and not known already to be the parent's.
    fn shadows(&self, side: Side, uid: &str, request: Option<RequestId>, counted: Counted) -> bool {
        if side != Side::Candidate || counted == Counted::Ok || request.is_none() || self.halted().is_some() {
            return false;
        }
        let parents = self.parents.lock().expect("canary parents lock");
        !parents.failing.contains(uid) && parents.own_failure.get(uid) != Some(&request)
    }

    fn halted(&self) -> Option<&str> {
        self.halted.get().map(String::as_str)
    }

    /// Forgets the parent `uid`, deleted: what its syncs said no longer counts, so parents made and
    /// deleted again and again neither weigh in the judgment nor grow what is kept.
    fn forget(&self, uid: &str) {
        let mut parents = self.parents.lock().expect("canary parents lock");
        parents.failing.remove(uid);
        parents.own_failure.remove(uid);
        parents.set_latest(uid, None);
    }

    /// The candidate's URL and share while it answers for parents; `None` once halted.
    fn answering(&self) -> Option<(String, u16)> {
        self.halted().is_none().then(|| (self.endpoint.url().to_owned(), self.buckets))
    }

    /// Counts one sync of `side` in its tally (what [`Live::counted`] said of it); returns whether it
    /// halted the canary (see [`Live::judge`]).
    fn count(&self, side: Side, counted: Counted, writes: usize) -> bool {
        let tally = match side {
            Side::Current => &self.current,
            Side::Candidate => &self.candidate,
        };
        tally.add(counted, writes);
        if side == Side::Current || self.halted().is_some() {
            return false;
        }
        self.judge(None)
    }

    /// Halts the canary when the candidate's figures are enough to judge and the share of its parents
    /// it fails is above `maxErrorRatio`; returns whether this call halted it. The figures are its
    /// parents', each counted once by its last sync ([`Parents::latest`]): a parent synced a thousand
    /// times is one parent, failing or not, so a flood of one parent's successes cannot hide the
    /// candidate failing the others (nor one parent's retries halt it). Enough is `minSyncs` parents,
    /// or, on a candidate's side of fewer parents than that (`parents`: the UIDs of the parents on its
    /// side now, when known), every one of them asked at least once: such a side could never reach
    /// `minSyncs`, and its parents would stay on a failing hook for good (issue 62). A parent whose
    /// last sync was its own failure ([`Parents::own_failure`]) is not waited for: one that never
    /// reaches a hook is never asked.
    fn judge(&self, parents: Option<&[&str]>) -> bool {
        if self.halted().is_some() {
            return false;
        }
        let known = self.parents.lock().expect("canary parents lock");
        let judged = known.latest.len();
        let failing = known.latest_failing;
        #[allow(clippy::cast_precision_loss)]
        let ratio = failing as f64 / judged.max(1) as f64;
        if judged == 0 || ratio <= self.spec.max_error_ratio {
            return false;
        }
        let every_parent = if judged as u64 >= self.spec.min_syncs {
            None
        } else {
            let waited: Vec<&&str> =
                parents.into_iter().flatten().filter(|uid| !known.own_failure.contains_key(**uid)).collect();
            if waited.is_empty() || !waited.iter().all(|uid| known.latest.contains_key(**uid)) {
                return false;
            }
            Some(waited.len())
        };
        drop(known);
        let syncs = self.candidate.syncs.load(Ordering::Relaxed);
        let errors = self.candidate.errors.load(Ordering::Relaxed);
        let mut why = format!(
            "the candidate fails {failing} of the {judged} parents it answered (an error ratio of {ratio}), more \
             than maxErrorRatio {}",
            self.spec.max_error_ratio
        );
        if let Some(parents) = every_parent {
            let _ = std::fmt::Write::write_fmt(
                &mut why,
                format_args!(
                    ", with every parent on its side asked ({parents}, fewer than minSyncs {})",
                    self.spec.min_syncs
                ),
            );
        }
        let _ = std::fmt::Write::write_fmt(
            &mut why,
            format_args!(" (it failed {errors} of {syncs} syncs): the current hook answers for every parent again"),
        );
        self.halted.set(why).is_ok()
    }

    /// Whether the candidate's side is to be judged by its parents rather than by `minSyncs`: it runs,
    /// it has answered parents, and fewer than `minSyncs` of them.
    fn judged_by_parents(&self) -> bool {
        let judged = self.parents.lock().expect("canary parents lock").latest.len();
        self.halted().is_none() && judged > 0 && (judged as u64) < self.spec.min_syncs
    }

    fn status(&self) -> CanaryStatus {
        CanaryStatus {
            url: self.endpoint.url().to_owned(),
            percent: self.spec.percent,
            state: if self.halted().is_some() { "Halted" } else { "Running" }.into(),
            message: self.halted().unwrap_or_default().to_owned(),
            annotation: self.annotation.clone(),
            current: self.current.status(),
            candidate: self.candidate.status(),
        }
    }
}

/// The side a sync is on, for counting it once it ends.
#[derive(Debug, Clone)]
pub struct Pick {
    live: Arc<Live>,
    side: Side,
}

impl Pick {
    /// The candidate, when this sync is the candidate's.
    #[must_use]
    pub fn candidate(&self) -> Option<&Endpoint> {
        (self.side == Side::Candidate).then_some(&self.live.endpoint)
    }
}

#[derive(Debug, Default)]
struct State {
    /// The halted canary the controller object's status recorded when the controller started, until
    /// the annotation is first read: the same value starts halted.
    recorded_halt: Option<CanaryStatus>,
    /// The annotation's value the state comes from.
    annotation: Option<String>,
    live: Option<Arc<Live>>,
    /// Why the annotation cannot be used.
    invalid: Option<String>,
}

/// A controller's canary, if its annotation starts one.
pub(crate) struct Canary {
    hub: Hub,
    kind: &'static str,
    name: String,
    /// The sync hook the candidate takes its settings from (none: no canary can start).
    base: Option<Hook>,
    endpoint_configs: Vec<EndpointConfig>,
    /// The controller object, for Events.
    controller: ObjectReference,
    /// Whether the controller object's status showed a canary when it started (one to clear).
    reported: bool,
    /// Read from a file: the log (and the metrics) say what the status and Events would.
    from_file: bool,
    metrics: Arc<ControllerMetrics>,
    state: Mutex<State>,
    /// Bumped on every change of the state (a new annotation, a halt).
    changes: watch::Sender<u64>,
}

/// What [`Canary::new`] builds from.
pub(crate) struct CanarySettings<'a> {
    pub kind: &'static str,
    pub name: &'a str,
    pub base: Option<Hook>,
    pub endpoint_configs: Vec<EndpointConfig>,
    /// The controller object, as hooks receive it.
    pub controller: &'a Value,
    pub annotations: Option<&'a std::collections::BTreeMap<String, String>>,
    /// Read from a file (`controllersFrom`): no object to write a status or an Event to.
    pub from_file: bool,
}

impl Canary {
    pub fn new(hub: &Hub, metrics: Arc<ControllerMetrics>, settings: CanarySettings<'_>) -> Self {
        let CanarySettings { kind, name, base, endpoint_configs, controller, annotations, from_file } = settings;
        let text = |field: &str| controller[field].as_str().map(str::to_owned);
        let reference = ObjectReference {
            api_version: text("apiVersion"),
            kind: text("kind"),
            name: Some(name.to_owned()),
            uid: controller["metadata"]["uid"].as_str().map(str::to_owned),
            ..ObjectReference::default()
        };
        let status = &controller["status"];
        let reported = !status["canary"].is_null()
            || status["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == HALTED_CONDITION));
        let recorded_halt = serde_json::from_value::<CanaryStatus>(status["canary"].clone())
            .ok()
            .filter(|c| c.state == "Halted" && !c.annotation.is_empty());
        let canary = Self {
            hub: hub.clone(),
            kind,
            name: name.to_owned(),
            base,
            endpoint_configs,
            controller: reference,
            reported,
            from_file,
            metrics,
            state: Mutex::new(State { recorded_halt, ..State::default() }),
            changes: watch::Sender::new(0),
        };
        canary.configure(annotations);
        canary
    }

    /// Takes the controller object's annotations: a new value of [`CANARY_ANNOTATION`] starts a new
    /// canary (or none); the same value changes nothing (a halted canary stays halted).
    pub fn configure(&self, annotations: Option<&std::collections::BTreeMap<String, String>>) {
        let annotation = annotations.and_then(|a| a.get(CANARY_ANNOTATION)).cloned();
        let mut state = self.state.lock().expect("canary lock");
        let recorded_halt = state.recorded_halt.take();
        if state.annotation == annotation {
            return;
        }
        *state = State { annotation: annotation.clone(), ..State::default() };
        if let Some(text) = annotation {
            match self.start(&text) {
                Ok(live) => {
                    let live = if let Some(halt) = recorded_halt.filter(|halt| halt.annotation == text) {
                        info!(controller = %self.name, url = live.endpoint.url(), "canary halted before, as its status says: it stays halted");
                        live.resumed_halted(&halt)
                    } else {
                        info!(controller = %self.name, url = live.endpoint.url(), percent = live.spec.percent, "canary started");
                        live
                    };
                    state.live = Some(Arc::new(live));
                }
                Err(why) => {
                    warn!(controller = %self.name, "{CANARY_ANNOTATION} cannot be used, no canary runs: {why}");
                    state.invalid = Some(why);
                }
            }
        }
        drop(state);
        self.changes.send_modify(|n| *n += 1);
    }

    fn start(&self, text: &str) -> Result<Live, String> {
        let spec = Spec::parse(text)?;
        let base = self.base.as_ref().ok_or("the controller has no sync hook")?;
        let labels = HookLabels { kind: self.kind.to_owned(), controller: self.name.clone(), hook: HookKind::Canary };
        let endpoint =
            self.hub.hooks.endpoint(&spec.hook(base), &self.endpoint_configs, labels).map_err(|e| e.to_string())?;
        Ok(Live::new(spec, text.to_owned(), endpoint))
    }

    /// The side of the object whose UID is `uid` in the canary running now; `None` without one, and for
    /// a finalizing sync (the finalize hook is not part of a canary).
    pub fn pick(&self, uid: &str, finalizing: bool) -> Option<Pick> {
        if finalizing {
            return None;
        }
        let live = self.state.lock().expect("canary lock").live.clone()?;
        let side = if live.halted().is_none() && bucket(uid) < live.buckets { Side::Candidate } else { Side::Current };
        Some(Pick { live, side })
    }

    /// Counts a sync of the parent `uid` that asked `pick`'s hook with `request` and ended as `outcome`
    /// after `writes` child writes, as [`Live::counted`] reads it; halts the canary when the
    /// candidate's error ratio passes its limit.
    fn record(&self, pick: &Pick, (uid, request): (&str, Option<RequestId>), outcome: Outcome, writes: usize) {
        let Some(counted) = pick.live.counted(pick.side, uid, request, outcome) else { return };
        self.metrics.canary_sync(pick.side.label(), counted.label(), writes);
        if pick.live.count(pick.side, counted, writes) {
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// Notes that a sync of the parent `uid` failed with `error` before any sync hook was asked: it
    /// counts for neither side, and the judgment does not wait for it ([`Outcome::Unreached`]). What the
    /// worker retries quietly is not a failure, and changes nothing.
    pub fn unreached(&self, uid: &str, error: &SyncError) {
        if Verdict::Failed(error.action()).counted().is_none() {
            return;
        }
        if let Some(pick) = self.pick(uid, false) {
            self.record(&pick, (uid, None), Outcome::Unreached, 0);
        }
    }

    /// Judges a candidate whose side has fewer parents than `minSyncs` (see [`Live::judge`]), the
    /// parents on its side now being `parents` (UID and bucket, of those not being deleted); returns
    /// whether this halted it.
    pub fn judge_side<'a>(&self, parents: impl Iterator<Item = &'a str>) -> bool {
        let Some(live) = self.view().0.filter(|live| live.judged_by_parents()) else { return false };
        let on_side: Vec<&str> = parents.filter(|uid| bucket(uid) < live.buckets).collect();
        if !live.judge(Some(&on_side)) {
            return false;
        }
        self.changes.send_modify(|n| *n += 1);
        true
    }

    /// Forgets the deleted parent `uid` in the canary running now (see [`Live::forget`]).
    pub fn forget(&self, uid: &str) {
        if let Some(live) = self.view().0 {
            live.forget(uid);
        }
    }

    /// Whether [`Canary::judge_side`] has anything to judge now (so its caller need not list the parents).
    pub fn judges_side(&self) -> bool {
        self.view().0.is_some_and(|live| live.judged_by_parents())
    }

    /// The canary now, and why the annotation cannot be used.
    fn view(&self) -> (Option<Arc<Live>>, Option<String>) {
        let state = self.state.lock().expect("canary lock");
        (state.live.clone(), state.invalid.clone())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_annotation_is_checked_whole() {
        let spec = Spec::parse(r#"{"url": "http://h/sync", "percent": 10}"#).unwrap();
        assert_eq!((spec.max_error_ratio, spec.min_syncs), (0.1, 20));
        assert_eq!(spec.buckets(), 103, "10 % of 1024 buckets, rounded up");
        assert_eq!(Spec::parse(r#"{"url": "http://h/sync", "percent": 100}"#).unwrap().buckets(), BUCKETS);
        for (bad, says) in [
            (r#"{"url": "http://h/sync"}"#, "missing field `percent`"),
            (r#"{"url": "http://h/sync", "percent": 0}"#, "percent must be more than 0"),
            (r#"{"url": "http://h/sync", "percent": 101}"#, "at most 100"),
            (r#"{"percent": 10}"#, "exactly one of url and service"),
            (r#"{"url": "http://h/sync", "percent": 10, "maxErrorRatio": 2}"#, "maxErrorRatio must be from 0 to 1"),
            (r#"{"url": "http://h/sync", "percent": 10, "timeout": "soon"}"#, "not a duration"),
            (r#"{"url": "http://h/sync", "percent": 10, "pct": 1}"#, "unknown field `pct`"),
            ("10%", "invalid type"),
        ] {
            let err = Spec::parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn the_candidate_keeps_the_sync_hooks_settings_at_its_own_url() {
        let base: Hook = serde_json::from_value(json!({"version": "v2", "webhook": {
            "service": {"name": "hook", "namespace": "ns"}, "path": "/sync", "timeout": "5s",
            "etag": {"enabled": true}}}))
        .unwrap();
        let spec = Spec::parse(r#"{"url": "http://hook-v2/sync", "percent": 5}"#).unwrap();
        let hook = spec.hook(&base);
        assert_eq!(hook.webhook.url.as_deref(), Some("http://hook-v2/sync"));
        assert!(hook.webhook.service.is_none() && hook.webhook.path.is_none());
        assert_eq!((hook.version, hook.webhook.timeout.as_deref()), (base.version, Some("5s")));
        assert_eq!(hook.webhook.etag, base.webhook.etag);
        let spec = Spec::parse(
            r#"{"service": {"name": "hook-v2", "namespace": "ns"}, "path": "/v2", "percent": 5, "timeout": "1s"}"#,
        )
        .unwrap();
        let hook = spec.hook(&base);
        assert_eq!(hook.webhook.service.as_ref().map(|s| s.name.as_str()), Some("hook-v2"));
        assert_eq!((hook.webhook.path.as_deref(), hook.webhook.timeout.as_deref()), (Some("/v2"), Some("1s")));
    }

    fn live(annotation: &str) -> Live {
        let spec = Spec::parse(annotation).unwrap();
        let base: Hook = serde_json::from_value(json!({"webhook": {"url": "http://current/sync"}})).unwrap();
        let labels = HookLabels { kind: "CompositeController".into(), controller: "c".into(), hook: HookKind::Canary };
        let endpoint = crate::hooks::HookClient::default().endpoint(&spec.hook(&base), &[], labels).unwrap();
        Live::new(spec, annotation.to_owned(), endpoint)
    }

    #[test]
    fn the_candidate_halts_past_its_error_ratio_once_it_has_answered_enough_parents() {
        let canary = live(r#"{"url": "http://candidate/sync", "percent": 10}"#);
        // The current hook's failures are not the candidate's.
        for i in 0..30 {
            assert!(!record(&canary, Side::Current, &format!("c{i}"), Counted::Error));
        }
        // 19 failing parents of 19: too few parents to judge.
        for i in 0..19 {
            assert!(!record(&canary, Side::Candidate, &format!("p{i}"), Counted::Error));
        }
        assert_eq!(canary.answering(), Some(("http://candidate/sync".into(), 103)));
        assert!(record(&canary, Side::Candidate, "p19", Counted::Ok), "the 20th parent: 19 of 20 fail");
        assert_eq!(canary.answering(), None);
        assert!(!record(&canary, Side::Candidate, "p20", Counted::Error), "halts once");
        let status = canary.status();
        assert_eq!(status.state, "Halted");
        assert!(
            status.message.contains("fails 19 of the 20 parents it answered (an error ratio of 0.95)"),
            "{}",
            status.message
        );
        assert_eq!((status.candidate.syncs, status.candidate.errors), (21, 20));
        assert_eq!((status.current.syncs, status.current.errors), (30, 30));
    }

    /// Issue 67 (attack review): a tenant editing its own parent many times a second, the candidate
    /// answering it well each time, counted a success per sync where a failing parent counts once: the
    /// ratio of a candidate failing the other parents stayed below `maxErrorRatio`. Each parent counts
    /// once, by its last sync.
    #[test]
    fn a_flood_of_one_parents_successes_does_not_hide_the_candidate_failing_the_others() {
        let canary = live(r#"{"url": "http://candidate/sync", "percent": 50, "minSyncs": 5}"#);
        for _ in 0..1000 {
            assert!(!record(&canary, Side::Candidate, "flooded", Counted::Ok), "one parent is not enough parents");
        }
        for i in 0..3 {
            assert!(!record(&canary, Side::Candidate, &format!("p{i}"), Counted::Error), "{} parents", i + 2);
        }
        assert!(record(&canary, Side::Candidate, "p3", Counted::Error), "4 of 5 parents fail");
        let status = canary.status();
        assert!(status.message.contains("fails 4 of the 5 parents it answered"), "{}", status.message);
        assert!(status.message.contains("(it failed 4 of 1004 syncs)"), "{}", status.message);

        // A parent that fails, then is answered well, counts as answered well; and failing again, failing.
        let healing = live(r#"{"url": "http://candidate/sync", "percent": 50, "minSyncs": 2}"#);
        assert!(!record(&healing, Side::Candidate, "a", Counted::Ok));
        assert!(!record(&healing, Side::Candidate, "b", Counted::Ok));
        assert!(record(&healing, Side::Candidate, "b", Counted::Error), "b fails after a success: 1 of 2 parents");
        let healed = live(r#"{"url": "http://candidate/sync", "percent": 50, "minSyncs": 3, "maxErrorRatio": 0.5}"#);
        for (uid, counted) in [("a", Counted::Error), ("a", Counted::Ok), ("b", Counted::Ok), ("c", Counted::Ok)] {
            assert!(!record(&healed, Side::Candidate, uid, counted), "{uid} healed: 0 of 3 fail");
        }
        assert_eq!(healed.parents.lock().unwrap().latest_failing, 0, "a's failure, healed, is not counted");
        assert!(!record(&healed, Side::Candidate, "b", Counted::Error), "1 of 3");
        assert!(record(&healed, Side::Candidate, "a", Counted::Error), "2 of 3 fail again");
    }

    /// Parents made, answered well and deleted again and again do not stay in the judgment: a candidate
    /// failing the parents that remain is judged on those.
    #[test]
    fn a_deleted_parent_no_longer_counts() {
        let canary = live(r#"{"url": "http://candidate/sync", "percent": 50, "minSyncs": 3}"#);
        for i in 0..100 {
            let uid = format!("churned{i}");
            assert!(!record(&canary, Side::Candidate, &uid, Counted::Ok));
            canary.forget(&uid);
        }
        let kept = canary.parents.lock().unwrap();
        assert!(kept.latest.is_empty() && kept.latest_failing == 0, "nothing kept of deleted parents");
        drop(kept);
        assert!(!record(&canary, Side::Candidate, "a", Counted::Error));
        assert!(!record(&canary, Side::Candidate, "b", Counted::Error));
        assert!(record(&canary, Side::Candidate, "c", Counted::Ok), "2 of the 3 parents there fail");
    }

    /// A sync of `side`'s parent `uid` ending `counted`, counted as `Canary::record` counts it (no
    /// request known, no shadow); whether it halted the canary.
    fn record(canary: &Live, side: Side, uid: &str, counted: Counted) -> bool {
        let outcome = Outcome::Answered { counted, stable_fails: None };
        canary.counted(side, uid, None, outcome).is_some_and(|c| canary.count(side, c, 0))
    }

    const FAILED: Outcome = Outcome::Answered { counted: Counted::Error, stable_fails: None };
    const SUCCEEDED: Outcome = Outcome::Answered { counted: Counted::Ok, stable_fails: None };

    fn request(n: u8) -> RequestId {
        RequestId::from_bytes([n; 20])
    }

    /// A sync of the candidate's parent `uid` counted as `Canary::record` counts it; whether it halted.
    fn sync(canary: &Live, uid: &str, request: Option<RequestId>, outcome: Outcome) -> bool {
        canary.counted(Side::Candidate, uid, request, outcome).is_some_and(|c| canary.count(Side::Candidate, c, 0))
    }

    /// Issue 67: a parent's failures count once until it succeeds, whatever its requests: each edit of
    /// a broken parent is a new request, and three edits halted a healthy candidate.
    #[test]
    fn a_parents_failures_count_once_until_it_succeeds() {
        let canary = live(r#"{"url": "http://candidate/sync", "percent": 10}"#);
        let counted = |uid, request| canary.counted(Side::Candidate, uid, request, FAILED);
        assert_eq!(counted("a", Some(request(1))), Some(Counted::Error));
        assert_eq!(counted("a", Some(request(1))), None, "a retry of the same request");
        assert_eq!(counted("a", Some(request(2))), None, "an edit of a failing parent");
        assert_eq!(counted("b", Some(request(1))), Some(Counted::Error), "another parent");
        assert_eq!(canary.counted(Side::Candidate, "a", Some(request(2)), SUCCEEDED), Some(Counted::Ok));
        assert_eq!(counted("a", Some(request(3))), Some(Counted::Error), "failing again after a success");
        assert_eq!((counted("c", None), counted("c", None)), (Some(Counted::Error), None), "no request known");
        let current = |uid| canary.counted(Side::Current, uid, Some(request(4)), FAILED);
        assert_eq!((current("d"), current("d")), (Some(Counted::Error), None), "on the current side too");
    }

    /// Issue 67: a candidate's failure the current hook gives for the same request too is the parent's:
    /// it counts for neither side; the shadow is asked once per request of such a parent, and not for
    /// a parent whose failure already counted (its failures count once anyway).
    #[test]
    fn a_failure_the_current_hook_gives_too_is_the_parents() {
        let canary = live(r#"{"url": "http://candidate/sync", "percent": 10}"#);
        let parents_own = Outcome::Answered { counted: Counted::Error, stable_fails: Some(true) };
        let candidates = Outcome::Answered { counted: Counted::PermanentError, stable_fails: Some(false) };
        assert!(canary.shadows(Side::Candidate, "t", Some(request(1)), Counted::Error));
        assert!(!canary.shadows(Side::Current, "t", Some(request(1)), Counted::Error), "the candidate's failures only");
        assert!(!canary.shadows(Side::Candidate, "t", Some(request(1)), Counted::Ok));
        assert!(!canary.shadows(Side::Candidate, "t", None, Counted::Error), "no request to ask the same");
        assert_eq!(canary.counted(Side::Candidate, "t", Some(request(1)), parents_own), None);
        assert!(!canary.shadows(Side::Candidate, "t", Some(request(1)), Counted::Error), "known: not asked again");
        assert_eq!(
            canary.counted(Side::Candidate, "t", Some(request(1)), FAILED),
            None,
            "its retry is the parent's too"
        );
        assert!(canary.shadows(Side::Candidate, "t", Some(request(2)), Counted::Error), "an edit is asked");
        assert_eq!(canary.counted(Side::Candidate, "t", Some(request(2)), parents_own), None);
        assert_eq!(canary.counted(Side::Candidate, "t", Some(request(3)), candidates), Some(Counted::PermanentError));
        assert!(
            !canary.shadows(Side::Candidate, "t", Some(request(4)), Counted::Error),
            "counted once until it succeeds"
        );
        assert_eq!(canary.counted(Side::Candidate, "t", Some(request(4)), FAILED), None);
        let status = canary.status();
        assert_eq!((status.candidate.syncs, status.candidate.errors), (0, 0), "counted by `count` only");
    }

    /// Issue 67: a parent that never reaches a hook (its `spec.selector` cannot select) counts for
    /// neither side and is not waited for; nor is one whose failure the current hook gives too.
    #[test]
    fn a_parent_that_never_reaches_a_hook_does_not_hold_up_the_judgment() {
        let waiting = live(r#"{"url": "http://candidate/sync", "percent": 50}"#);
        for uid in ["a", "b"] {
            assert!(!sync(&waiting, uid, Some(request(1)), FAILED));
        }
        assert!(!waiting.judge(Some(&["a", "b", "x"])), "x was not asked yet");

        let canary = live(r#"{"url": "http://candidate/sync", "percent": 50}"#);
        assert!(!sync(&canary, "x", None, Outcome::Unreached));
        let parents_own = Outcome::Answered { counted: Counted::Error, stable_fails: Some(true) };
        assert!(!sync(&canary, "y", Some(request(1)), parents_own));
        for uid in ["a", "b"] {
            assert!(!sync(&canary, uid, Some(request(1)), FAILED));
        }
        assert!(canary.judge(Some(&["a", "b", "x", "y"])), "a and b failed; x and y are their own");
        let status = canary.status();
        assert!(status.message.contains("failed 2 of 2 syncs"), "{}", status.message);
        assert!(status.message.contains("every parent on its side asked (2,"), "{}", status.message);

        // Only its own failures: a parent that reaches a hook again is waited for again.
        let healed = live(r#"{"url": "http://candidate/sync", "percent": 50}"#);
        assert!(!sync(&healed, "x", None, Outcome::Unreached));
        assert!(!sync(&healed, "a", Some(request(1)), FAILED));
        assert!(!sync(&healed, "x", Some(request(2)), SUCCEEDED));
        assert!(healed.judge(Some(&["a", "x"])), "1 of 2 failed, both asked");
        assert!(!live(r#"{"url": "http://candidate/sync", "percent": 50}"#).judge(Some(&["x"])), "none asked");
        let only_own = live(r#"{"url": "http://candidate/sync", "percent": 50}"#);
        assert!(!sync(&only_own, "x", None, Outcome::Unreached));
        assert!(!only_own.judge(Some(&["x"])), "nothing of the candidate's to judge");
    }

    #[test]
    fn a_halt_recorded_in_the_status_is_resumed_for_the_same_annotation() {
        let annotation = r#"{"url": "http://candidate/sync", "percent": 10, "minSyncs": 2}"#;
        let halted = live(annotation);
        assert!(!record(&halted, Side::Candidate, "p", Counted::Error));
        assert!(record(&halted, Side::Candidate, "q", Counted::Error));
        let recorded: CanaryStatus = serde_json::from_value(serde_json::to_value(halted.status()).unwrap()).unwrap();
        assert_eq!(recorded.annotation, annotation);
        let resumed = live(annotation).resumed_halted(&recorded);
        assert_eq!(resumed.answering(), None, "halted: the candidate answers for no parent");
        assert_eq!(resumed.status(), halted.status(), "the same status, counts and message");
    }

    #[test]
    fn a_side_of_fewer_parents_than_min_syncs_is_judged_once_each_was_asked() {
        let canary = live(r#"{"url": "http://candidate/sync", "percent": 50}"#);
        assert!(!record(&canary, Side::Candidate, "a", Counted::Error));
        assert!(!canary.judge(Some(&["a", "b"])), "b was not asked yet");
        assert!(!canary.judge(None), "1 parent of minSyncs 20, and the parents unknown");
        assert!(!record(&canary, Side::Candidate, "b", Counted::Error));
        assert!(canary.judged_by_parents());
        assert!(canary.judge(Some(&["a", "b"])), "both asked, both failed");
        let status = canary.status();
        assert!(
            status.message.contains("fails 2 of the 2 parents it answered (an error ratio of 1)"),
            "{}",
            status.message
        );
        assert!(
            status.message.contains("every parent on its side asked (2, fewer than minSyncs 20)"),
            "{}",
            status.message
        );
        assert!(!canary.judged_by_parents(), "halted");

        // A healthy side is asked as often, and stays.
        let healthy = live(r#"{"url": "http://candidate/sync", "percent": 50}"#);
        for uid in ["a", "b"] {
            assert!(!record(&healthy, Side::Candidate, uid, Counted::Ok));
        }
        assert!(!healthy.judge(Some(&["a", "b"])));
        // One failure of two parents is a ratio of 0.5: above 0.1.
        let half = live(r#"{"url": "http://candidate/sync", "percent": 50}"#);
        assert!(!record(&half, Side::Candidate, "a", Counted::Ok));
        assert!(!record(&half, Side::Candidate, "b", Counted::Error));
        assert!(half.judge(Some(&["a", "b"])));
        assert!(!live(r#"{"url": "http://candidate/sync", "percent": 50}"#).judge(Some(&[])), "nothing to judge");
    }

    #[test]
    fn a_ratio_at_the_limit_does_not_halt() {
        let canary = live(r#"{"url": "http://candidate/sync", "percent": 50, "maxErrorRatio": 0.25, "minSyncs": 4}"#);
        for (uid, counted) in
            [("a", Counted::Ok), ("b", Counted::Ok), ("c", Counted::Ok), ("d", Counted::PermanentError)]
        {
            assert!(!record(&canary, Side::Candidate, uid, counted), "1 of 4 parents is 0.25: not above");
        }
        assert!(record(&canary, Side::Candidate, "e", Counted::PermanentError), "2 of 5 is");
        let status = canary.status();
        assert_eq!((status.candidate.errors, status.candidate.permanent_errors), (2, 2));
    }
}
