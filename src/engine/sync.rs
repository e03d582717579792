//! The sync every controller kind shares: whether to ask the hook at all ([`ask_hook`]), and the
//! helpers its phases use.
//!
//! [`crate::controllers::composite`] and [`crate::controllers::decorator`] are thin consumers of these pieces.

use std::hash::Hash;

use kube::Client;
use kube::api::{Api, DynamicObject};
use tracing::debug;

use crate::cache::discovery::ResolvedResource;
use crate::engine::answered::{Answered, RequestId};
use crate::engine::queue::Reasons;

/// Whether a sync for `reasons` asks its hook `request`, given what was asked last: not when it is the
/// very request whose answer was last applied in full and nothing asks to ask again (a resync, a retry,
/// a requested sync; see [`crate::engine::answered`]). When it asks, the metrics count it by cause, `redundant`
/// for a repeat of the last request (its answer was not applied in full).
pub(crate) fn ask_hook<K: Clone + Eq + Hash>(
    answered: &Answered<K>,
    metrics: &crate::engine::metrics::ControllerMetrics,
    key: &K,
    request: Option<RequestId>,
    reasons: Reasons,
) -> bool {
    use crate::engine::metrics::{Cause, Saved};
    let seen = request.and_then(|r| answered.seen(key, r));
    if seen == Some(true) && !reasons.asks_again() {
        debug!("the same request as the last one, whose answer was applied in full: not asked again");
        metrics.hook_call_saved(Saved::IdenticalRequest);
        return false;
    }
    let cause = if seen.is_some() && !reasons.asks_again() { Cause::Redundant } else { reasons.main().into() };
    metrics.hook_sync(cause);
    match request {
        Some(request) => answered.asked(key, request),
        None => answered.forget(key),
    }
    true
}

/// An `Api` for `obj`'s type and namespace.
pub(crate) fn api_for(client: &Client, resource: &ResolvedResource, obj: &DynamicObject) -> Api<DynamicObject> {
    match obj.metadata.namespace.as_deref() {
        Some(ns) if resource.namespaced => Api::namespaced_with(client.clone(), ns, &resource.api_resource),
        _ => Api::all_with(client.clone(), &resource.api_resource),
    }
}

/// Whether an update of a parent/target matters when `ignoreStatusChanges` is set.
pub(crate) fn meaningful_parent_change(old: &DynamicObject, new: &DynamicObject) -> bool {
    old.metadata.generation != new.metadata.generation
        || old.metadata.labels != new.metadata.labels
        || old.metadata.annotations != new.metadata.annotations
        || new.metadata.deletion_timestamp.is_some()
}
