//! What a canary's changes need besides the syncs: the parents that change sides queued, a halt
//! announced, the controller's status written (see the parent module). Apart from it because it
//! runs over the engine's sync (`Kind`), which the canary's state is part of.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{CANARY_ANNOTATION, Canary, HALTED_CONDITION, Live, REPORT_EVERY};
use crate::api::CanaryStatus;
use crate::cache::shard::bucket;
use crate::engine::hub::Hub;
use crate::engine::queue::Reason;
use crate::engine::sync::Kind;

/// Follows `kind`'s canary until `cancel`: queues the parents that change sides, announces a halt, and
/// reports.
pub(crate) async fn run<C: Kind>(kind: Arc<C>, cancel: CancellationToken) {
    let core = kind.core();
    let canary = &core.canary;
    let mut changes = canary.changes.subscribe();
    let mut ticks = tokio::time::interval(REPORT_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Every parent is synced when the controller starts: the sides need no queueing then.
    let (live, _) = canary.view();
    let mut answering = live.as_ref().and_then(|l| l.answering());
    // The canary whose side was last queued: a new one (the annotation edited) is judged afresh, and
    // its side's parents are asked again even where its URL and share are the same, or a small fleet's
    // judgment would wait for parents nothing changes (see `Live::judge`).
    let mut queued = live.clone();
    let mut announced: Option<Arc<Live>> = None;
    let mut reporter = Reporter::new(canary);
    loop {
        tokio::select! {
            woke = changes.changed() => if woke.is_err() { return },
            _ = ticks.tick() => {}
            () = cancel.cancelled() => return,
        }
        if canary.judges_side() {
            // A candidate's side of fewer parents than `minSyncs` is judged by its parents, each asked
            // once (see `Live::judge`): which parents are on its side is the cache's to say.
            let parents = crate::engine::sync::managed(&*kind);
            let live = parents.iter().filter(|(_, p)| p.metadata.deletion_timestamp.is_none());
            canary.judge_side(live.map(|(_, p)| p.metadata.uid.as_deref().unwrap_or_default()));
        }
        let (live, invalid) = canary.view();
        let now = live.as_ref().and_then(|l| l.answering());
        let renewed =
            now.is_some() && live.as_ref().is_some_and(|l| !queued.as_ref().is_some_and(|q| Arc::ptr_eq(q, l)));
        if now != answering || renewed {
            let below = [&answering, &now].iter().filter_map(|a| a.as_ref().map(|(_, b)| *b)).max().unwrap_or(0);
            answering = now;
            queued.clone_from(&live);
            tokio::select! {
                () = requeue(&*kind, below) => {}
                () = cancel.cancelled() => return,
            }
        }
        if let Some(why) = &invalid
            && changes.borrow().ne(&reporter.invalid_announced)
        {
            reporter.invalid_announced = *changes.borrow();
            if !canary.from_file {
                let note = format!("{CANARY_ANNOTATION}: {why}");
                core.hub.events.warning(&canary.controller, "InvalidCanary", note).await;
            }
        }
        let percent = live.as_ref().filter(|l| l.halted().is_none()).map_or(0.0, |l| l.spec.percent);
        canary.metrics.canary_state(percent, live.as_ref().is_some_and(|l| l.halted().is_some()));
        let status = match (&live, invalid) {
            (Some(live), _) => Some(live.status()),
            (None, Some(why)) => {
                Some(CanaryStatus { state: "Invalid".into(), message: why, ..CanaryStatus::default() })
            }
            (None, None) => None,
        };
        // The halt is recorded in the API first, then said: a hub killed in between must find it there
        // (a candidate asked again after a restart is what a halt promises not to do).
        reporter.write(&core.name, status).await;
        if let Some(live) = &live
            && let Some(why) = live.halted()
            && !announced.as_ref().is_some_and(|a| Arc::ptr_eq(a, live))
        {
            announced = Some(Arc::clone(live));
            warn!(controller = %core.name, "canary halted: {why}");
            if !canary.from_file {
                core.hub.events.warning(&canary.controller, "CanaryHalted", format!("Canary halted: {why}")).await;
            }
        }
    }
}

/// Queues every parent of a bucket below `below` (as a resync: its hook is asked even where the request
/// is the same), paced as a new hook version's parents are.
async fn requeue<C: Kind>(kind: &C, below: u16) {
    let core = kind.core();
    let keys: Vec<C::Key> = crate::engine::sync::managed(kind)
        .into_iter()
        .filter(|(_, obj)| bucket(obj.metadata.uid.as_deref().unwrap_or_default()) < below)
        .map(|(key, _)| key)
        .collect();
    info!(controller = %core.name, parents = keys.len(), "canary changed: syncing the parents that change sides");
    let mut ticks = core.hub.settings.hook_change_resync_interval.map(|every| {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    });
    for key in keys {
        if let Some(ticks) = &mut ticks {
            ticks.tick().await;
        }
        core.queue.add_for(key, Reason::Delay);
    }
}

/// Writes `status.canary` and the [`HALTED_CONDITION`] on the controller object when they changed.
struct Reporter {
    /// `None` with sharding (see the module doc).
    api: Option<Api<DynamicObject>>,
    /// What was written last (`None`: no canary shown), once `known`.
    last: Option<CanaryStatus>,
    /// Whether the controller object shows `last`.
    known: bool,
    at: Option<tokio::time::Instant>,
    /// The change whose invalid annotation was announced by an Event.
    invalid_announced: u64,
}

impl Reporter {
    fn new(canary: &Canary) -> Self {
        let api = (canary.hub.shard.is_none() && !canary.from_file).then(|| controller_api(&canary.hub, canary.kind));
        // Nothing was shown when the controller started: nothing to clear.
        Self { api, last: None, known: !canary.reported, at: None, invalid_announced: 0 }
    }

    async fn write(&mut self, name: &str, status: Option<CanaryStatus>) {
        if self.known && self.last == status {
            return;
        }
        // Within a canary's run, figures change with every sync: at most one write per period.
        let same_state = |last: &Option<CanaryStatus>| {
            last.as_ref().map(|s| (&s.url, &s.state)) == status.as_ref().map(|s| (&s.url, &s.state))
        };
        if self.known && same_state(&self.last) && self.at.is_some_and(|at| at.elapsed() < REPORT_EVERY) {
            return;
        }
        let Some(api) = &self.api else { return };
        self.at = Some(tokio::time::Instant::now());
        match write_status(api, name, status.as_ref()).await {
            Ok(()) => (self.last, self.known) = (status, true),
            Err(err) => warn!(controller = %name, "could not write the canary to the controller's status: {err}"),
        }
    }
}

/// Writes `status` (none: clears it) and the halted condition, over the controller's other conditions as
/// read now (the write names the version read, so a condition written meanwhile is not lost: a conflict
/// is tried again at the next report).
async fn write_status(api: &Api<DynamicObject>, name: &str, status: Option<&CanaryStatus>) -> Result<(), kube::Error> {
    let controller = api.get_status(name).await?;
    let conditions: Vec<Condition> =
        serde_json::from_value(controller.data["status"]["conditions"].clone()).unwrap_or_default();
    let previous = conditions.iter().find(|c| c.type_ == HALTED_CONDITION).cloned();
    let mut conditions: Vec<Condition> = conditions.into_iter().filter(|c| c.type_ != HALTED_CONDITION).collect();
    if let Some(status) = status.filter(|s| s.state == "Halted") {
        let transition =
            previous.filter(|p| p.status == "True").map_or_else(|| Time(Timestamp::now()), |p| p.last_transition_time);
        conditions.push(Condition {
            type_: HALTED_CONDITION.into(),
            status: "True".into(),
            reason: "ErrorRatioExceeded".into(),
            message: status.message.clone(),
            observed_generation: controller.metadata.generation,
            last_transition_time: transition,
        });
    }
    let mut canary = serde_json::to_value(status).unwrap_or_default();
    if let Some(fields) = canary.as_object_mut() {
        // A merge patch keeps what it leaves out: a new canary's empty message must take the last
        // halt's away.
        for field in ["message", "annotation"] {
            fields.entry(field).or_insert(serde_json::Value::Null);
        }
    }
    let patch = json!({
        "metadata": {"resourceVersion": controller.metadata.resource_version},
        "status": {"canary": canary, "conditions": conditions},
    });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

/// An `Api` for the hub's controller objects of `kind` (`CompositeController`, `DecoratorController`).
pub(crate) fn controller_api(hub: &Hub, kind: &str) -> Api<DynamicObject> {
    let (group, version) = crate::api::GROUP_VERSION.split_once('/').unwrap_or(("", crate::api::GROUP_VERSION));
    let resource = ApiResource {
        group: group.to_owned(),
        version: version.to_owned(),
        api_version: crate::api::GROUP_VERSION.to_owned(),
        kind: kind.to_owned(),
        plural: format!("{}s", kind.to_ascii_lowercase()),
    };
    Api::all_with(hub.client.clone(), &resource)
}
