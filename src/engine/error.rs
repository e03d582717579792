//! Why a controller cannot start ([`StartError`], its `Ready` condition) and why one object's sync
//! failed ([`SyncError`], an Event and a retry).

use crate::cache::discovery::DiscoveryError;
use crate::cache::selector::SelectorError;
use crate::hooks::HookError;
use crate::write::apply::ApplyError;
use crate::write::children::{ClaimError, PlanError};

/// Why a controller object cannot run (reported in its `Ready` condition).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("no hooks defined")]
    NoHooks,
    #[error("{role} resource: {source}")]
    NotFound { role: &'static str, source: DiscoveryError },
    #[error("rolling update methods need a namespaced parent (ControllerRevisions live in its namespace)")]
    RollingNeedsNamespacedParent,
    /// The hub is limited to some namespaces (`namespaces`), and one of the controller's types has no
    /// namespace: watching it would be cluster-wide, which the hub's Roles cannot grant and its
    /// operators did not allow.
    #[error(
        "{role} resource {resource} is cluster-scoped, but this hub watches only namespaces {namespaces}: \
         namespaced RBAC cannot grant it (run it on a hub without `namespaces`)"
    )]
    ClusterScoped { role: &'static str, resource: String, namespaces: String },
    #[error("label selector: {0}")]
    Selector(#[from] SelectorError),
    #[error("{0}")]
    Annotation(String),
    /// A cache could not be filled: the type may not be listed/watched, or the API did not answer.
    #[error("{0}")]
    CacheSync(#[from] crate::cache::informers::SyncTimeout),
    #[error("{0}")]
    InvalidHookSetting(#[from] crate::hooks::SettingsError),
    /// A child type is declared `crossNamespace` where that cannot be honoured.
    #[error("{0}")]
    CrossNamespace(String),
    /// A MapController's spec asks for what a MapController cannot do.
    #[error("{0}")]
    Map(String),
    /// The parents' records could not be moved out of the old group
    /// ([`crate::write::record_migration`]); the start is tried again.
    #[error("{0}")]
    Records(#[source] crate::write::records::RecordError),
    /// The types the controller's finalizer will be on could not be recorded in its status
    /// (`status.finalizedTypes`) before it puts the finalizer on any: the start is tried again.
    #[error("recording the types its finalizer will be on in status.finalizedTypes: {0}")]
    RecordTypes(#[source] kube::Error),
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
            Self::NotFound { role: "childrecord", .. } => "ChildRecordCRDNotInstalled",
            Self::NotFound { role: "input", .. } => "InputResourceNotFound",
            Self::NotFound { role: "output", .. } => "OutputResourceNotFound",
            Self::NotFound { .. } => "ResourceNotFound",
            Self::RollingNeedsNamespacedParent => "UnsupportedUpdateMethod",
            Self::ClusterScoped { .. } => "ClusterScopedResource",
            Self::Selector(_) => "InvalidSelector",
            Self::Annotation(_) => "InvalidAnnotation",
            Self::CacheSync(crate::cache::informers::SyncTimeout::Forbidden { .. }) => "Forbidden",
            Self::CacheSync(crate::cache::informers::SyncTimeout::NotSynced { .. }) => "WatchFailed",
            Self::InvalidHookSetting(_) => "InvalidHookSetting",
            Self::CrossNamespace(_) => "UnsupportedCrossNamespace",
            Self::Map(_) => "UnsupportedMapSpec",
            Self::Records(_) => "ChildRecordMigrationFailed",
            Self::RecordTypes(_) => "CannotRecordTypes",
        }
    }
}

/// Why one object's sync failed. Every variant but [`SyncError::Apply`] and [`SyncError::Status`] means
/// nothing was written: the hook response is validated whole, and the writes planned, before any change.
/// Each wraps its cause ([`std::error::Error::source`]) where there is one, so a log line or Event can
/// say it all; [`SyncError::action`] is the one place that decides what the worker does next.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The hook could not be called, failed, or answered something undecodable.
    #[error("{0}")]
    Hook(#[from] HookError),
    /// The hook's answer breaks a rule the hub enforces (names, labels, selector, ownership, size).
    #[error("invalid hook response: {0}")]
    InvalidResponse(String),
    #[error("{0}")]
    Claim(#[source] Box<ClaimError>),
    /// The parent's `spec.selector` cannot select children.
    #[error("parent .spec.selector: {0}")]
    ParentSelector(#[source] ParentSelectorError),
    #[error("sync hook not defined")]
    NoSyncHook,
    /// A rule of the customize hook's answer cannot be followed.
    #[error("related resources: {rule}: {reason}")]
    RelatedRule { rule: String, reason: String },
    /// A related rule names a type the API server does not serve.
    #[error("related resources: {rule}: {source}")]
    RelatedType {
        rule: String,
        #[source]
        source: DiscoveryError,
    },
    /// A related type's cache is still filling; retried quietly.
    #[error("related resource {0} not yet synced")]
    RelatedNotSynced(String),
    /// Writes of children failed (the others were made; deletes were held back).
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Apply(Vec<ApplyError>),
    #[error("updating {what}: {source}")]
    Write {
        what: &'static str,
        #[source]
        source: Box<kube::Error>,
    },
    /// Someone else wrote the object since we read it; retried quietly with the fresh copy, as
    /// client-go's retry-on-conflict would.
    #[error("conflict updating {0}")]
    Conflict(&'static str),
    /// The planned writes were refused before any of them was made.
    #[error("{0}")]
    Plan(#[from] PlanError),
    /// The API server refused the status the hook asked for (e.g. it breaks the CRD's schema); `causes`
    /// are the API server's, field by field.
    #[error("the API server refused the status: {causes}")]
    Status {
        causes: String,
        #[source]
        source: Box<kube::Error>,
    },
    /// Parts of the answer were refused, each whole (a MapController's inputs whose map call failed or
    /// answered something the hub refuses, its groups of detached outputs whose tombstone call
    /// failed): the other parts were written. One entry per kind of part that had a refusal.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Parts(Vec<RefusedParts>),
    /// The sync itself failed unexpectedly; the worker survives and the object is retried.
    #[error("sync panicked: {0}")]
    Panicked(String),
}

/// The parts of one kind that were refused (see [`SyncError::Parts`]): `failed` of `total` `what`,
/// each said with why, and what became of them (`left`).
#[derive(Debug, thiserror::Error)]
#[error("{} of {total} {what} refused, {left}: {}", .failed.len(), .failed.join("; "))]
pub struct RefusedParts {
    pub what: &'static str,
    pub total: usize,
    pub left: &'static str,
    pub failed: Vec<String>,
}

/// Why a parent's `spec.selector` cannot select children.
#[derive(Debug, thiserror::Error)]
pub enum ParentSelectorError {
    #[error("{0}")]
    Decode(#[source] serde_json::Error),
    #[error(".spec.selector must have either matchLabels, matchExpressions, or both")]
    Empty,
    #[error("{0}")]
    Invalid(#[source] SelectorError),
}

/// How one sync ended, read once from its result: the one reading every consumer of a result takes —
/// the worker's next step (a retry with backoff, a Warning Event, or neither), the reconcile metrics'
/// `result`, and a canary's tally of the hook that answered ([`Verdict::counted`]). Two readings drifted
/// apart before (issue 62): the worker retried a write refused for a stale resourceVersion quietly,
/// while the canary counted it as the candidate's failure, and halted a healthy candidate under write
/// traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Synced; `Some`: to be synced again after that long, as the hook asked.
    Synced(Option<std::time::Duration>),
    /// Failed; what is done about it ([`SyncError::action`]).
    Failed(Action),
}

impl Verdict {
    /// The verdict on a sync's result.
    #[must_use]
    pub fn of(result: &Result<Option<std::time::Duration>, SyncError>) -> Self {
        match result {
            Ok(resync) => Self::Synced(*resync),
            Err(e) => Self::Failed(e.action()),
        }
    }

    /// What the sync says of the hook that answered it, as a canary counts it per side; `None` for what
    /// says nothing of the hook: the hub's own quiet retries (a write that met a newer version than its
    /// cache showed, a conflict with another writer, a related cache still filling) and the hook's 429.
    /// An error someone must hear about is the hook's failure, whoever refused it (the hook, the hub's
    /// checks of its answer, the API server refusing a write); a permanent one is that, and held.
    #[must_use]
    pub fn counted(self) -> Option<Counted> {
        match self {
            Self::Synced(_) => Some(Counted::Ok),
            Self::Failed(Action::Report) => Some(Counted::Error),
            Self::Failed(Action::Hold) => Some(Counted::PermanentError),
            Self::Failed(Action::RetryQuietly | Action::RetryAfter(_)) => None,
        }
    }
}

/// How a sync counts for the hook that answered it (see [`Verdict::counted`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    Ok,
    Error,
    PermanentError,
}

impl Counted {
    /// The `result` label of the canary metrics.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Error => "error",
            Self::PermanentError => "permanent_error",
        }
    }
}

/// What the worker does after a failed sync: the one retry policy, as kube-runtime's `error_policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A transient state that a retry resolves without anyone's help: retried with backoff, logged at
    /// debug, no Event.
    RetryQuietly,
    /// The hook asked to be called again after this long (`429` with `Retry-After`): no Event, no
    /// backoff, and no resync sooner.
    RetryAfter(std::time::Duration),
    /// Someone must hear about it: a Warning Event on the object, and a retry with backoff.
    Report,
    /// The hook said its error is permanent: retrying the same object cannot help, so it is not retried
    /// (no backoff, no hot loop); the object is synced again when it or its children change, or at its
    /// resync period. The sync itself reported it, once per message (see `engine::sync::Held`).
    Hold,
}

/// How many failed syncs of one object in a row a quiet retry stays quiet. A state "a retry resolves
/// without anyone's help" that is still there after this many retries (about 5 s of the default backoff
/// doubling from 5 ms) is not transient: from then on it is reported, each retry, so that nothing a
/// tenant can keep in place — a child held in its deletion, a record written behind the hub's back —
/// freezes a parent without a word.
pub const QUIET_RETRIES: u32 = 10;

impl Action {
    /// What the worker does after a failure that `failures` failed syncs of the same object came before
    /// (in a row): [`Action::RetryQuietly`] only while that count is under [`QUIET_RETRIES`], then
    /// [`Action::Report`]. The one place that says how long a quiet retry stays quiet.
    #[must_use]
    pub fn after(self, failures: u32) -> Self {
        match self {
            Self::RetryQuietly if failures >= QUIET_RETRIES => Self::Report,
            action => action,
        }
    }
}

impl SyncError {
    /// The reason of the Warning Event that reports this error.
    #[must_use]
    pub fn event_reason(&self) -> &'static str {
        match self {
            Self::Plan(PlanError::DeletionGuard { .. }) => "DeletionGuard",
            Self::Hook(HookError::Permanent { .. }) => "HookPermanentError",
            _ => "SyncError",
        }
    }

    /// What the worker does next (see [`Action`]).
    #[must_use]
    pub fn action(&self) -> Action {
        match self {
            Self::Hook(HookError::TooManyRequests { retry_after, .. }) => Action::RetryAfter(*retry_after),
            Self::Hook(HookError::Permanent { .. }) => Action::Hold,
            Self::RelatedNotSynced(_) | Self::Conflict(_) | Self::Plan(PlanError::Stale { .. }) => Action::RetryQuietly,
            // A record of children elsewhere read from a cache behind the hub's own write of it.
            Self::Claim(e) if e.is_stale() => Action::RetryQuietly,
            Self::Apply(errors) if !errors.is_empty() && errors.iter().all(ApplyError::is_stale) => {
                Action::RetryQuietly
            }
            _ => Action::Report,
        }
    }
}

/// An error and all its causes, `outer: cause: root cause`, each said once (errors often quote their
/// source in their own message): "error sending request" alone does not tell a refused connection
/// from a DNS failure.
#[must_use]
pub fn with_causes(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

impl From<ClaimError> for SyncError {
    fn from(e: ClaimError) -> Self {
        Self::Claim(Box::new(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrapped_cause_is_kept_and_said() {
        let err = SyncError::ParentSelector(ParentSelectorError::Invalid(SelectorError::UnknownOperator {
            key: "app".into(),
            operator: "Near".into(),
        }));
        assert!(std::error::Error::source(&err).is_some(), "the selector error is the source");
        assert!(err.to_string().starts_with("parent .spec.selector: "), "{err}");
        assert_eq!(err.action(), Action::Report);
        assert_eq!(SyncError::Conflict("status").action(), Action::RetryQuietly);
    }

    #[test]
    fn a_quiet_retry_that_keeps_coming_back_is_reported() {
        let stale = SyncError::Conflict("status");
        assert_eq!(stale.action().after(0), Action::RetryQuietly);
        assert_eq!(stale.action().after(QUIET_RETRIES - 1), Action::RetryQuietly);
        assert_eq!(stale.action().after(QUIET_RETRIES), Action::Report);
        assert_eq!(Action::Hold.after(100), Action::Hold, "only quiet retries are escalated");
        let later = Action::RetryAfter(std::time::Duration::from_secs(1));
        assert_eq!(later.after(100), later, "a hook's 429 is its own schedule, not a refusal");
    }

    #[test]
    fn a_permanent_hook_error_is_held_not_retried() {
        let err = SyncError::Hook(HookError::Permanent { url: "http://h".into(), code: 422, message: "bad".into() });
        assert_eq!(err.action(), Action::Hold);
        assert_eq!(err.event_reason(), "HookPermanentError");
        let err = SyncError::Hook(HookError::Status { url: "http://h".into(), code: 422, body: "bad".into() });
        assert_eq!(err.action(), Action::Report, "a 422 not marked permanent is retried as Metacontroller would");
    }

    /// Issue 62: a write refused for a stale resourceVersion is retried quietly by the worker, counted as
    /// a requeue by the metrics, and is no failure of the hook's in a canary: one reading for all three.
    #[test]
    fn what_a_sync_says_of_its_hook_follows_what_the_worker_does() {
        use crate::cache::informers::ObjectKey;
        let url = String::new();
        assert_eq!(Verdict::of(&Ok(None)).counted(), Some(Counted::Ok));
        let invalid = Err(SyncError::InvalidResponse("x".into()));
        assert_eq!(Verdict::of(&invalid), Verdict::Failed(Action::Report));
        assert_eq!(Verdict::of(&invalid).counted(), Some(Counted::Error));
        let permanent = HookError::Permanent { url: url.clone(), code: 422, message: "no".into() };
        assert_eq!(Verdict::of(&Err(SyncError::Hook(permanent))).counted(), Some(Counted::PermanentError));
        let status = HookError::Status { url: url.clone(), code: 500, body: String::new() };
        assert_eq!(Verdict::of(&Err(SyncError::Hook(status))).counted(), Some(Counted::Error));
        let later = HookError::TooManyRequests { url, retry_after: std::time::Duration::ZERO };
        assert_eq!(Verdict::of(&Err(SyncError::Hook(later))).counted(), None);
        assert_eq!(Verdict::of(&Err(SyncError::Conflict("parent"))).counted(), None);
        let key = || ObjectKey { namespace: Some("n".into()), name: "c".into() };
        let stale = Err(SyncError::Apply(vec![ApplyError::Stale { kind: "ConfigMap".into(), key: key() }]));
        assert_eq!(Verdict::of(&stale), Verdict::Failed(Action::RetryQuietly));
        assert_eq!(Verdict::of(&stale).counted(), None, "the hub's own quiet retry is not the hook's failure");
        let planned_stale = Err(SyncError::Plan(PlanError::Stale { kind: "ConfigMap".into(), key: key() }));
        assert_eq!(Verdict::of(&planned_stale).counted(), None);
        let refused = ApplyError::NotOurs { kind: "ConfigMap".into(), key: key(), holder: "someone".into() };
        let mixed = Err(SyncError::Apply(vec![ApplyError::Stale { kind: "ConfigMap".into(), key: key() }, refused]));
        assert_eq!(Verdict::of(&mixed).counted(), Some(Counted::Error), "a refused write among them is reported");
    }

    #[test]
    fn error_causes_are_all_said_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("calling the hook: {0}")]
        struct Outer(#[source] Middle);
        #[derive(Debug, thiserror::Error)]
        #[error("error sending request")]
        struct Middle(#[source] std::io::Error);
        let err = Outer(Middle(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused")));
        assert_eq!(with_causes(&err), "calling the hook: error sending request: connection refused");
    }
}
