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
    #[error("parent resource {resource} has no status subresource; metahook writes parent status through /status")]
    NoStatusSubresource { resource: String },
    #[error("rolling update methods need a namespaced parent (ControllerRevisions live in its namespace)")]
    RollingNeedsNamespacedParent,
    #[error("label selector: {0}")]
    Selector(#[from] SelectorError),
    #[error("{0}")]
    Annotation(String),
    /// A cache could not be filled: the type may not be listed/watched, or the API did not answer.
    #[error("{0}")]
    CacheSync(#[from] crate::cache::informers::SyncTimeout),
    #[error("{0}")]
    InvalidHookSetting(#[from] crate::hooks::SettingsError),
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
            Self::NotFound { .. } => "ResourceNotFound",
            Self::NoStatusSubresource { .. } => "NoStatusSubresource",
            Self::RollingNeedsNamespacedParent => "UnsupportedUpdateMethod",
            Self::Selector(_) => "InvalidSelector",
            Self::Annotation(_) => "InvalidAnnotation",
            Self::CacheSync(crate::cache::informers::SyncTimeout::Forbidden { .. }) => "Forbidden",
            Self::CacheSync(crate::cache::informers::SyncTimeout::NotSynced { .. }) => "WatchFailed",
            Self::InvalidHookSetting(_) => "InvalidHookSetting",
        }
    }
}

/// Why one object's sync failed. Every variant but [`SyncError::Apply`] and [`SyncError::Status`] means
/// nothing was written: the hook response is validated whole, and the writes planned, before any change.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Hook(#[from] HookError),
    #[error("invalid hook response: {0}")]
    InvalidResponse(String),
    #[error("{0}")]
    Claim(Box<ClaimError>),
    #[error("parent .spec.selector: {0}")]
    ParentSelector(String),
    #[error("sync hook not defined")]
    NoSyncHook,
    #[error("related resources: {0}")]
    Related(String),
    /// A related type's cache is still filling; retried quietly.
    #[error("related resource {0} not yet synced")]
    RelatedNotSynced(String),
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Apply(Vec<ApplyError>),
    #[error("updating {what}: {source}")]
    Write { what: &'static str, source: Box<kube::Error> },
    /// Someone else wrote the object since we read it; retried quietly with the fresh copy, as
    /// client-go's retry-on-conflict would.
    #[error("conflict updating {0}")]
    Conflict(&'static str),
    /// The planned writes were refused before any of them was made.
    #[error("{0}")]
    Plan(#[from] PlanError),
    /// The API server refused the status the hook asked for (e.g. it breaks the CRD's schema).
    #[error("the API server refused the status: {0}")]
    Status(String),
    /// The sync itself failed unexpectedly; the worker survives and the object is retried.
    #[error("sync panicked: {0}")]
    Panicked(String),
}

impl SyncError {
    /// The reason of the Warning Event that reports this error.
    #[must_use]
    pub fn event_reason(&self) -> &'static str {
        match self {
            Self::Plan(PlanError::DeletionGuard { .. }) => "DeletionGuard",
            _ => "SyncError",
        }
    }

    /// Whether this is a transient state that a retry resolves without anyone's help: logged at debug,
    /// retried with backoff, no Event.
    #[must_use]
    pub fn is_quiet(&self) -> bool {
        match self {
            Self::RelatedNotSynced(_) | Self::Conflict(_) | Self::Plan(PlanError::Stale { .. }) => true,
            Self::Apply(errors) => !errors.is_empty() && errors.iter().all(ApplyError::is_stale),
            _ => false,
        }
    }
}

impl From<ClaimError> for SyncError {
    fn from(e: ClaimError) -> Self {
        Self::Claim(Box::new(e))
    }
}
