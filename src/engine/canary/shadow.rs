//! What a canary counts of a sync that asked a hook (see the parent module): when the candidate's
//! answer fails, the current hook is asked the same request in the shadow, and the failure is the
//! parent's — not the candidate's — when the current hook's answer fails the same checks. Apart from
//! the parent module because it runs over the engine's sync (`Kind`), as `follow` does.
//!
//! The shadow answer is checked and dropped: nothing of it is written, no Event is recorded, no
//! status or held error is set. It is asked only for a failure that would count against the candidate
//! ([`super::Live::shadows`]): a parent's later failures (counted once until it succeeds) and retries
//! of a request already found to be the parent's own are not asked again.

use std::time::Duration;

use super::Outcome;
use crate::engine::answered::RequestId;
use crate::engine::error::{Counted, SyncError, Verdict};
use crate::engine::sync::{Call, Kind, Observing, narrowed, planned};

/// Counts the sync of `observing`'s parent that showed `request` and ended with `result` after `writes`
/// child writes on its side of the canary, if one runs (see [`super::Live::counted`]).
pub(crate) async fn settle<C: Kind>(
    kind: &C,
    observing: &Observing<C>,
    request: Option<RequestId>,
    result: &Result<Option<Duration>, SyncError>,
    writes: usize,
) {
    let Some(pick) = &observing.canary else { return };
    // Counted as the worker reads the result: a quiet retry of the hub's own is nobody's failure.
    let Some(counted) = Verdict::of(result).counted() else { return };
    let uid = observing.obj.metadata.uid.as_deref().unwrap_or_default();
    let stable_fails = if pick.live.shadows(pick.side, uid, request, counted) {
        Some(stable_fails(kind, observing).await)
    } else {
        None
    };
    kind.core().canary.record(pick, (uid, request), Outcome::Answered { counted, stable_fails }, writes);
}

/// Whether the current sync hook's answer to the request `observing` showed the candidate fails the
/// checks the engine's sync makes before it writes anything: the hook's own call and the kind's checks
/// of its answer ([`Kind::decide`], which writes nothing), the namespaces it may write in
/// ([`narrowed`]) and the plan of its writes ([`planned`]). A hook that asks to be called later, or a
/// cache still filling, shows nothing: the candidate's failure counts.
async fn stable_fails<C: Kind>(kind: &C, observing: &Observing<C>) -> bool {
    let Some(stable) = kind.hook(observing.finalizing) else { return false };
    let Observing { obj, resource, finalizing, observed, claimed, children, related, .. } = observing;
    let call = Call {
        endpoint: stable,
        children,
        related,
        finalizing: *finalizing,
        observed,
        asks_again: true,
        retrying: false,
    };
    let checked = async {
        let decision = kind.decide(obj, resource, call, claimed).await?;
        let narrowed = narrowed(kind, observing, &decision)?;
        let adopts = |child: &kube::api::DynamicObject| kind.adopts(obj, resource, child);
        planned(kind, observing, (&decision, narrowed.as_ref()), &adopts)?;
        let left_out = narrowed.is_some_and(|n| !n.refused.is_empty());
        Ok::<_, SyncError>(left_out || decision.refused.is_some())
    };
    let fails = match checked.await {
        Ok(refused) => refused,
        Err(error) => Verdict::Failed(error.action()).counted().is_some_and(|c| c != Counted::Ok),
    };
    tracing::debug!(parent = ?observing.obj.metadata.name, fails, "the current hook asked in the shadow");
    fails
}
