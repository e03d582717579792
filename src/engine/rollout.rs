//! A hook's new version re-syncs its controller's parents, paced, and the controller's status shows how
//! far it has got.
//!
//! When a hook answers with a `Metahook-Hook-Version` that changes the newest one ([`HookVersions`]: a
//! new version, or a rollback), every object the controller manages is queued again, one every `hookChangeResyncQPS`-th of a second:
//! in the delayed line, so changes still go first, and as a resync, so the hook is asked even where the
//! request is the same as last time (its answer may not be). A round that met a replica of the old
//! version (the hook's own rolling update still under way) leaves parents answered by it: those are
//! queued again, up to [`FOLLOW_UPS`] times, once the round's syncs are done. A newer version reported
//! meanwhile starts its own round at once.
//!
//! A hook is heard only when it is called, so while nothing changes, a controller whose hook names its
//! version syncs one parent (in turn) every `hookVersionProbeInterval`: a new version is noticed within
//! that time even on a quiet cluster. A hook that never sent the header is never probed.
//!
//! The controller object's `status.hookVersion` says the version and how many parents it answered for,
//! written as the round goes (at most every [`REPORT_EVERY`]), when it ends, and between rounds as
//! parents come and go (only when the figures changed: nothing at idle) (not with sharding,
//! where each replica knows only its share, nor for a controller read from a file, which has no object:
//! there the log line at the end of a round says it). Without the header,
//! nothing here runs: Metacontroller's behaviour.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::HookVersionStatus;
use crate::engine::queue::Reason;
use crate::engine::sync::Kind;
use crate::hooks::HookVersions;
use crate::hooks::etag::RootKey;

/// Rounds for parents an old version answered after the first, full round.
pub const FOLLOW_UPS: usize = 3;
/// How often the status is written while a round goes.
pub const REPORT_EVERY: Duration = Duration::from_secs(2);
/// How long a round waits for its syncs once every parent is queued, before it looks for parents an
/// old version answered.
const SETTLE: Duration = Duration::from_secs(30);

/// Runs rounds for `kind`'s hook versions until `cancel`; returns at once when re-syncing is off.
pub(crate) async fn run<C: Kind>(kind: Arc<C>, cancel: CancellationToken) {
    let settings = kind.core().hub.settings;
    let Some(interval) = settings.hook_change_resync_interval else {
        return;
    };
    let versions = kind.hook_versions().clone();
    let mut rounds = versions.rounds();
    // The workers start with us and may have heard the first version before we subscribed.
    rounds.mark_changed();
    let mut first = true;
    let mut probe = Probe::new(settings.hook_version_probe_interval);
    let mut reporter = Reporter::new(&*kind);
    let mut reports = tokio::time::interval(REPORT_EVERY);
    reports.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            changed = rounds.changed() => if changed.is_err() { return },
            () = probe.tick() => {
                probe.next(&*kind, &versions);
                continue;
            }
            // Between rounds, parents come and go: the count follows (a write only when it changed).
            _ = reports.tick() => {
                if let Some(version) = versions.newest() {
                    let all = managed(&*kind);
                    reporter.write(&*kind, progress_of(&all, &versions, &version)).await;
                    let here: std::collections::HashSet<RootKey> = all.into_iter().map(|(_, r)| r).collect();
                    versions.retain(|object| here.contains(object));
                }
                continue;
            }
            () = cancel.cancelled() => return,
        }
        let _ = rounds.borrow_and_update();
        let Some(version) = versions.newest() else { continue };
        // The first version this controller hears of: its parents are being synced anyway (it just
        // started), so it is only reported.
        let requeue = !std::mem::take(&mut first);
        tokio::select! {
            () = round(&*kind, &versions, &version, requeue.then_some(interval), &mut rounds, &mut reporter) => {}
            () = cancel.cancelled() => return,
        }
    }
}

/// One version's round: every parent, then those an old version answered, until all answered or a
/// newer version starts its own (then this returns with `rounds` marked changed). Without `interval`,
/// nothing is queued: the round only reports how far the version gets.
async fn round<C: Kind>(
    kind: &C,
    versions: &HookVersions,
    version: &str,
    interval: Option<Duration>,
    rounds: &mut watch::Receiver<u64>,
    reporter: &mut Reporter,
) {
    let core = kind.core();
    let Some(interval) = interval else {
        settle(kind, versions, version, rounds, reporter).await;
        reporter.write(kind, progress(kind, versions, version)).await;
        return;
    };
    info!(controller = %core.name, %version, "a new hook version: syncing every parent again");
    for pass in 0..=FOLLOW_UPS {
        let keys: Vec<(C::Key, RootKey)> =
            managed(kind).into_iter().filter(|(_, root)| pass == 0 || !versions.is_current(root)).collect();
        if keys.is_empty() {
            break;
        }
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for (key, _) in keys {
            ticks.tick().await;
            if rounds.has_changed().unwrap_or(true) {
                return;
            }
            core.queue.add_for(key, Reason::Delay);
            reporter.maybe(kind, versions, version).await;
        }
        if !settle(kind, versions, version, rounds, reporter).await {
            return;
        }
    }
    reporter.write(kind, progress(kind, versions, version)).await;
    let done = progress(kind, versions, version);
    info!(controller = %core.name, %version, synced = done.synced, parents = done.parents, "hook version round done");
}

/// A hook is only heard when it is called: while nothing changes, one parent in turn is synced again
/// every probe interval, once the hook has named a version (a hook without the header costs nothing).
struct Probe {
    ticks: Option<tokio::time::Interval>,
    turn: usize,
}

impl Probe {
    fn new(every: Option<Duration>) -> Self {
        let ticks = every.map(|every| {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks
        });
        Self { ticks, turn: 0 }
    }

    async fn tick(&mut self) {
        match &mut self.ticks {
            Some(ticks) => {
                ticks.tick().await;
            }
            None => std::future::pending().await,
        }
    }

    /// Queues the next parent in turn (as a resync: the hook is asked though nothing changed).
    fn next<C: Kind>(&mut self, kind: &C, versions: &HookVersions) {
        if versions.newest().is_none() {
            return;
        }
        let mut keys = managed(kind);
        if keys.is_empty() {
            return;
        }
        self.turn = (self.turn + 1) % keys.len();
        let (key, _) = keys.swap_remove(self.turn);
        kind.core().queue.add_for(key, Reason::Delay);
    }
}

/// Waits up to [`SETTLE`] for `version` to have answered for every parent (syncs that fail go on
/// retrying without us), reporting on the way; `false` when a newer version came meanwhile.
async fn settle<C: Kind>(
    kind: &C,
    versions: &HookVersions,
    version: &str,
    rounds: &mut watch::Receiver<u64>,
    reporter: &mut Reporter,
) -> bool {
    let deadline = tokio::time::Instant::now() + SETTLE;
    while tokio::time::Instant::now() < deadline {
        if rounds.has_changed().unwrap_or(true) {
            return false;
        }
        let status = progress(kind, versions, version);
        if status.synced == status.parents {
            break;
        }
        reporter.maybe(kind, versions, version).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    true
}

/// Every object the controller manages, with the key hooks know it by.
fn managed<C: Kind>(kind: &C) -> Vec<(C::Key, RootKey)> {
    crate::engine::sync::managed(kind)
        .into_iter()
        .map(|(key, obj)| {
            let kind_name = obj.types.as_ref().map(|t| t.kind.as_str()).unwrap_or_default();
            let namespace = obj.metadata.namespace.as_deref().unwrap_or_default();
            (key, RootKey::new(kind_name, namespace, obj.metadata.name.as_deref().unwrap_or_default()))
        })
        .collect()
}

/// The controller's parents, and how many `version` answered for last.
fn progress<C: Kind>(kind: &C, versions: &HookVersions, version: &str) -> HookVersionStatus {
    progress_of(&managed(kind), versions, version)
}

/// [`progress`] over `all`, the parents listed already.
fn progress_of<K>(all: &[(K, RootKey)], versions: &HookVersions, version: &str) -> HookVersionStatus {
    let synced = all.iter().filter(|(_, root)| versions.is_current(root)).count();
    HookVersionStatus {
        version: version.to_owned(),
        synced: i64::try_from(synced).unwrap_or(i64::MAX),
        parents: i64::try_from(all.len()).unwrap_or(i64::MAX),
    }
}

/// Writes `status.hookVersion` on the controller object when it changed, at most every
/// [`REPORT_EVERY`] (and always at the end of a round).
struct Reporter {
    /// `None` with sharding: each replica sees only its share of the parents, and their reports would
    /// overwrite each other (the log says each replica's progress); and for a controller read from a file.
    api: Option<Api<DynamicObject>>,
    last: Option<HookVersionStatus>,
    at: Option<tokio::time::Instant>,
}

impl Reporter {
    fn new<C: Kind>(kind: &C) -> Self {
        let core = kind.core();
        // A controller read from a file has no object to write to: the log line at the end of a round says it.
        let api = (core.hub.shard.is_none() && !core.from_file)
            .then(|| crate::engine::canary::controller_api(&core.hub, core.kind));
        Self { api, last: None, at: None }
    }

    async fn maybe<C: Kind>(&mut self, kind: &C, versions: &HookVersions, version: &str) {
        if self.at.is_some_and(|at| at.elapsed() < REPORT_EVERY) {
            return;
        }
        self.write(kind, progress(kind, versions, version)).await;
    }

    async fn write<C: Kind>(&mut self, kind: &C, status: HookVersionStatus) {
        self.at = Some(tokio::time::Instant::now());
        if self.last.as_ref() == Some(&status) {
            return;
        }
        let Some(api) = &self.api else { return };
        let name = &kind.core().name;
        let patch = json!({"status": {"hookVersion": status}});
        match api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => self.last = Some(status),
            Err(err) => warn!(controller = %name, "could not write the hook version to the controller's status: {err}"),
        }
    }
}
