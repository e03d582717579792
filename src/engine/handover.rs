//! Handing a parent over to another replica of the ring (sharding, see [`crate::cache::shard`]).
//!
//! The coordinator never moves a parent whose owner is alive: it puts the drain label on it, naming the
//! new member. The owner sees the label in its own watch and, instead of syncing the parent, hands it
//! over — as the worker holding the parent's key, so no sync of that parent is in flight, and none
//! starts after (every later pass of the key finds the drain label again, or the parent gone from this
//! replica's cache). It relabels the parent's children first (listed live, with its own shard selector:
//! its cache may not have the last sync's creates yet), so the new owner's child watch has them by the
//! time the parent arrives, then the parent itself (shard label to the new member, drain label
//! removed) with a compare-and-swap on the resourceVersion it saw: a parent the coordinator re-targeted
//! meanwhile is a conflict and a retry with the fresh copy, never a move to a stale target.
//!
//! The new owner starts syncing only once the parent is labelled with its member, that is after the old
//! owner's last sync ended: never two replicas syncing one parent. A child its watch has not caught up
//! with is never created over (a create of an existing object is refused, `crate::write::apply`) nor
//! deleted (only observed children are), so a sync that comes too early is a quiet retry.

use std::time::Instant;

use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tracing::info;

use crate::cache::discovery::ResolvedResource;
use crate::cache::shard::{MOVED_FROM_ANNOTATION, Shard};
use crate::engine::error::SyncError;
use crate::engine::metrics::ShardMetrics;
use crate::write::children::ChildType;

/// What a hand-over needs of its controller: the API client, the declared child types, the metrics.
pub(crate) struct Owner<'a> {
    pub client: &'a kube::Client,
    pub children: &'a [ChildType],
    pub metrics: &'a ShardMetrics,
    /// The parent's children's own label selector, if its kind has one (narrows the live list).
    pub selector: Option<String>,
}

/// Hands `parent` (labelled for `shard`'s member) over to `target`: its children, then the parent.
pub(crate) async fn hand_over(
    owner: Owner<'_>,
    shard: &Shard,
    parent: &DynamicObject,
    resource: &ResolvedResource,
    target: &str,
) -> Result<(), SyncError> {
    let started = Instant::now();
    let label = shard.label();
    let uid = parent.metadata.uid.as_deref().unwrap_or_default();
    let client = owner.client;
    let mut relabelled = 0usize;
    let namespace = parent.metadata.namespace.as_deref().filter(|_| resource.namespaced);
    for child_type in owner.children {
        // Read live, not from the cache: a child the last sync created may not have reached this
        // replica's watch yet, and left behind it would be invisible to the new owner for good.
        let child_resource = child_type.resource();
        let all: Api<DynamicObject> = match namespace.filter(|_| child_resource.namespaced) {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &child_resource.api_resource),
            None => Api::all_with(client.clone(), &child_resource.api_resource),
        };
        let selector = match &owner.selector {
            Some(theirs) if !theirs.is_empty() => format!("{},{theirs}", shard.selector()),
            _ => shard.selector(),
        };
        let mine = ListParams::default().labels(&selector);
        let listed = all.list_metadata(&mine).await.map_err(|source| SyncError::HandOver {
            target: target.to_owned(),
            what: format!("{} (listing)", child_resource.kind()),
            source: Box::new(source),
        })?;
        for child in listed.items {
            let ours =
                child.metadata.owner_references.iter().flatten().any(|r| r.controller == Some(true) && r.uid == uid);
            if !ours {
                continue;
            }
            // Naming the child's UID makes the patch a precondition: a child replaced meanwhile is refused.
            let patch = json!({"metadata": {"uid": child.metadata.uid, "labels": {&label: target}}});
            let name = child.metadata.name.clone().unwrap_or_default();
            let api: Api<DynamicObject> = match child.metadata.namespace.as_deref() {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &child_resource.api_resource),
                None => Api::all_with(client.clone(), &child_resource.api_resource),
            };
            match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => relabelled += 1,
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(source) => {
                    return Err(SyncError::HandOver {
                        target: target.to_owned(),
                        what: format!("{} {name}", child_resource.kind()),
                        source: Box::new(source),
                    });
                }
            }
        }
    }
    let patch = parent_move(shard, parent, target);
    let api: Api<DynamicObject> = match parent.metadata.namespace.as_deref().filter(|_| resource.namespaced) {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource.api_resource),
        None => Api::all_with(client.clone(), &resource.api_resource),
    };
    let name = parent.metadata.name.as_deref().unwrap_or_default();
    match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {}
        // Gone: nothing left to hand over.
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => return Err(SyncError::Conflict("parent")),
        Err(source) => {
            return Err(SyncError::HandOver {
                target: target.to_owned(),
                what: "parent".into(),
                source: Box::new(source),
            });
        }
    }
    owner.metrics.moved_out(started.elapsed(), drain_requested_at(parent));
    info!(to = target, children = relabelled, took = ?started.elapsed(), "handed the parent over");
    Ok(())
}

/// The merge patch that moves `parent` to `target`: shard label set, drain label removed, the old member
/// noted, all under a compare-and-swap on the resourceVersion the decision was made on.
#[must_use]
pub fn parent_move(shard: &Shard, parent: &DynamicObject, target: &str) -> Value {
    json!({"metadata": {
        "resourceVersion": parent.metadata.resource_version,
        "labels": {shard.label(): target, shard.drain_label(): null},
        "annotations": {MOVED_FROM_ANNOTATION: shard.member, crate::cache::shard::DRAIN_REQUESTED_ANNOTATION: null},
    }})
}

/// When the coordinator asked for the move (its annotation), for the drain time metric.
fn drain_requested_at(parent: &DynamicObject) -> Option<std::time::Duration> {
    let stamp = parent.metadata.annotations.as_ref()?.get(crate::cache::shard::DRAIN_REQUESTED_ANNOTATION)?;
    let at: k8s_openapi::jiff::Timestamp = stamp.parse().ok()?;
    let elapsed = k8s_openapi::jiff::Timestamp::now().duration_since(at);
    std::time::Duration::try_from(elapsed).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_swaps_on_the_version_seen_and_clears_the_drain_mark() {
        let shard = Shard { ring: "r".into(), member: "m1".into() };
        let mut parent =
            DynamicObject::new("p", &kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()));
        parent.metadata.resource_version = Some("42".into());
        let patch = parent_move(&shard, &parent, "m2");
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        assert_eq!(patch["metadata"]["labels"]["shard.metahook.dev/r"], "m2");
        assert_eq!(patch["metadata"]["labels"]["drain.shard.metahook.dev/r"], Value::Null);
        assert_eq!(patch["metadata"]["annotations"][MOVED_FROM_ANNOTATION], "m1");
    }
}
