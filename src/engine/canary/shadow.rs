//! What a canary counts of a sync that asked a hook (see the parent module): when the candidate's
//! answer fails, the current hook is asked the same request in the shadow, and the failure is the
//! parent's — not the candidate's — when the current hook's answer fails the same checks. Apart from
//! the parent module because it runs over the engine's sync (`Kind`), as `follow` does.
//!
//! The shadow answer is checked and dropped: nothing of it is written, no Event is recorded, no
//! status or held error is set. Where the candidate's update of a child was refused by the API server
//! as invalid, the current answer's update of that child is sent as a server-side dry run (a tenant's
//! `immutable` child refuses both): only a write shows such a refusal. The failures must be of the same kind ([`Failure`]), and a failure in
//! part never excuses a whole one: a tenant holding its copy of a platform parent's child makes every
//! answer for that parent lose a namespace, and must not make a candidate that crashes on that parent,
//! whose answer is refused whole, or whose writes the API server refuses, look healthy (an attack
//! review kept a candidate whose every write for a platform parent was refused `Running` so). It is asked only for a failure that would count against the candidate
//! ([`super::Live::shadows`]): a parent's later failures (counted once until it succeeds) and retries
//! of a request already found to be the parent's own are not asked again.

use std::time::Duration;

use super::Outcome;
use crate::engine::answered::RequestId;
use crate::engine::error::{Action, Counted, SyncError, Verdict};
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
    let stable_fails = match result {
        Err(error) if pick.live.shadows(pick.side, uid, request, counted) => {
            match stable_failure(kind, observing, error).await {
                Shadow::Passes => Some(false),
                Shadow::Fails(shadow) => Some(Failure::of(error).excused_by(shadow)),
                // The shadow could not tell: the parent's retry is asked again, and counted then.
                Shadow::Unknown => return,
            }
        }
        _ => None,
    };
    kind.core().canary.record(pick, (uid, request), Outcome::Answered { counted, stable_fails }, writes);
}

/// What the current hook's answer, asked in the shadow, showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shadow {
    /// It passes the checks: the candidate's failure is the candidate's.
    Passes,
    /// It fails them so.
    Fails(Failure),
    /// It met a state a retry resolves (`RetryQuietly`): most often a child the candidate's own sync
    /// has just written, in the cache but not in the observation both answers are checked against.
    /// Counted as failing, it let a tenant halt a healthy candidate (an attack review: a parent whose
    /// answer the candidate wrote in part was found "not failing" under the current hook, by the
    /// candidate's own write); the retry, observed afresh, is asked again.
    Unknown,
}

/// What failed in a sync, to compare a candidate's failure with the current hook's in the shadow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    /// The hook's call itself: an error status, a timeout, a body that is no answer.
    Call,
    /// The answer, refused whole by the hub's checks before anything is written (an invalid answer, a
    /// plan that cannot be made).
    Refused,
    /// The answer, refused for some namespaces only (a name someone else holds there, a copy held in
    /// its deletion): the rest of it is written.
    RefusedInPart,
    /// Anything else (a write the API server refused): the shadow call, which writes nothing, shows it
    /// only by a dry run of the writes the candidate's were refused for ([`WriteRefused`](Self::WriteRefused));
    /// else only a current hook that fails whole excuses it.
    Other,
    /// The current hook's answer, asked in the shadow, would be refused by the API server where the
    /// candidate's write was (a server-side dry run of the same child's update): the parent's own, as a
    /// tenant's `immutable` child whose data both answers change.
    WriteRefused,
}

impl Failure {
    fn of(error: &SyncError) -> Self {
        match error {
            SyncError::Hook(_) => Self::Call,
            SyncError::InvalidResponse(_) | SyncError::Plan(_) => Self::Refused,
            SyncError::Parts(_) => Self::RefusedInPart,
            _ => Self::Other,
        }
    }

    /// Whether the current hook's failure `shadow`, for the same request, makes this candidate failure
    /// the parent's: a failed call only by a failed call; an answer refused whole, or a write refused,
    /// by a failed call or an answer refused whole (the parent fails whole under the current hook
    /// too); an answer refused in part by any refusal or failed call. A failure in part never excuses a
    /// whole one.
    fn excused_by(self, shadow: Self) -> bool {
        match self {
            Self::Call => shadow == Self::Call,
            Self::Refused => matches!(shadow, Self::Call | Self::Refused),
            Self::Other | Self::WriteRefused => matches!(shadow, Self::Call | Self::Refused | Self::WriteRefused),
            Self::RefusedInPart => !matches!(shadow, Self::Other | Self::WriteRefused),
        }
    }
}

/// How the current sync hook's answer to the request `observing` showed the candidate fares in the
/// checks the engine's sync makes before it writes anything: the hook's own call and the kind's checks
/// of its answer ([`Kind::decide`], which writes nothing), the namespaces it may write in
/// ([`narrowed`]) and the plan of its writes ([`planned`]); and, where the candidate's `error` is
/// updates the API server refused as invalid, a dry run of the current answer's updates of the same
/// children ([`refused_alike`]). A hook that asks to be called later shows nothing (the candidate's
/// failure counts); a state a retry resolves is [`Shadow::Unknown`].
async fn stable_failure<C: Kind>(kind: &C, observing: &Observing<C>, error: &SyncError) -> Shadow {
    let Some(stable) = kind.hook(observing.finalizing) else { return Shadow::Passes };
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
        let left_out = narrowed.as_ref().is_some_and(|n| !n.refused.is_empty());
        if left_out || decision.refused.is_some() {
            return Ok(Shadow::Fails(Failure::RefusedInPart));
        }
        let desired = narrowed.as_ref().map_or(&decision.desired[..], |n| &n.desired[..]);
        Ok::<_, SyncError>(refused_alike(kind, observing, desired, error).await)
    };
    let failure = match checked.await {
        // The plan was made: what is refused is a part of it, or what a dry run of its writes showed.
        Ok(shadow) => shadow,
        Err(error) if matches!(error.action(), Action::RetryQuietly) => Shadow::Unknown,
        Err(error) => match Verdict::Failed(error.action()).counted() {
            Some(Counted::Error | Counted::PermanentError) => Shadow::Fails(Failure::of(&error)),
            _ => Shadow::Passes,
        },
    };
    tracing::debug!(parent = ?observing.obj.metadata.name, ?failure, "the current hook asked in the shadow");
    failure
}

/// Whether the current hook's answer (`desired`, by child type) would have its writes refused where the
/// candidate's were: the candidate's failure must be updates the API server refused as invalid (422:
/// an immutable field), every one of them; for each, the current answer's version of that child is
/// sent as a server-side dry run. Every one refused as invalid as well: [`Failure::WriteRefused`]. Any
/// other failure of the candidate's, a child the current answer leaves out or leaves as it is, or one
/// dry run accepted: [`Shadow::Passes`] (one child a tenant froze must not excuse the candidate's own
/// invalid write of another: an attack review kept a candidate failing every platform parent `Running`
/// so). A dry run that meets a changed child (409) or fails otherwise cannot tell: [`Shadow::Unknown`].
async fn refused_alike<C: Kind>(
    kind: &C,
    observing: &Observing<C>,
    desired: &[crate::write::children::ChildMap<serde_json::Value>],
    error: &SyncError,
) -> Shadow {
    let SyncError::Apply(errors) = error else { return Shadow::Passes };
    if errors.is_empty() {
        return Shadow::Passes;
    }
    let core = kind.core();
    for failed in errors {
        let crate::write::apply::ApplyError::Apply { kind: failed_kind, key, source: kube::Error::Api(status) } =
            failed
        else {
            return Shadow::Passes;
        };
        if status.code != 422 {
            return Shadow::Passes;
        }
        let found = core.child_resources.iter().enumerate().find_map(|(index, resource)| {
            let wanted = desired.get(index)?.get(key)?;
            let child = observing.observed.get(index)?.get(key)?;
            (resource.kind() == failed_kind).then_some((resource, wanted, child))
        });
        let Some((resource, wanted, child)) = found else { return Shadow::Passes };
        match core.hub.applier.dry_run_update(resource, wanted, child).await {
            Err(kube::Error::Api(status)) if status.code == 422 => {}
            Ok(()) => return Shadow::Passes,
            Err(_) => return Shadow::Unknown,
        }
    }
    Shadow::Fails(Failure::WriteRefused)
}

#[cfg(test)]
mod tests {
    use super::Failure;

    /// A candidate's failed call is excused only by the current hook's failed call: a tenant who makes
    /// every answer for a parent lose a namespace does not excuse a candidate that crashes on it.
    #[test]
    fn a_failure_is_the_parents_only_when_the_current_hook_fails_the_same_way() {
        assert!(Failure::Call.excused_by(Failure::Call));
        assert!(!Failure::Call.excused_by(Failure::Refused), "a crash is not excused by a namespace left out");
        assert!(!Failure::Call.excused_by(Failure::Other));
        assert!(Failure::Refused.excused_by(Failure::Refused));
        assert!(Failure::Refused.excused_by(Failure::Call));
        assert!(Failure::Other.excused_by(Failure::Refused));
        assert!(Failure::Other.excused_by(Failure::Call));
        assert!(Failure::RefusedInPart.excused_by(Failure::RefusedInPart));
        assert!(Failure::RefusedInPart.excused_by(Failure::Refused));
    }

    /// Attack review (issue 67): a tenant that makes the current hook's answer for a platform parent
    /// lose the tenant's namespace excused every failure of the candidate's on that parent, and kept a
    /// candidate whose writes the API server refused, or whose answer was refused whole, `Running`.
    #[test]
    fn a_failure_in_part_never_excuses_a_whole_one() {
        assert!(!Failure::Other.excused_by(Failure::RefusedInPart), "a refused write");
        assert!(!Failure::Refused.excused_by(Failure::RefusedInPart), "an answer refused whole");
        assert!(!Failure::Call.excused_by(Failure::RefusedInPart), "a failed call");
        assert!(!Failure::Other.excused_by(Failure::Other), "the shadow writes nothing: it shows no write refusal");
        assert!(!Failure::RefusedInPart.excused_by(Failure::WriteRefused), "a part is not excused by a whole");
    }

    /// Attack review F2 (issue 67): a tenant's own children made `immutable` refuse every update of
    /// them, whichever hook answers; the current hook's answer, dry-run, is refused the same way, and
    /// the candidate's refused write is the parent's.
    #[test]
    fn a_write_refused_alike_in_the_shadows_dry_run_is_the_parents() {
        assert!(Failure::Other.excused_by(Failure::WriteRefused));
        assert!(!Failure::Call.excused_by(Failure::WriteRefused), "a crash is not excused by a refused write");
        assert!(!Failure::Refused.excused_by(Failure::WriteRefused), "an answer refused whole is the candidate's");
    }
}
