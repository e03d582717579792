//! Children elsewhere (`crossNamespace`), as a sync deals with them: the parent's record of them
//! ([`crate::write::records`]) made before the parent gets the hub's finalizer, written before a child is
//! created there and after one is deleted, and the children's end when the parent is deleted — each
//! deleted (or, under `--cascade=orphan`, released) once, never waited on: an object whose deletion was
//! accepted is gone as far as its parent goes, and its own finalizers are its owner's business. Then the
//! parent's finalizer goes, and only then the record's.
//!
//! What a child elsewhere is stays one decision, [`Elsewhere`]: listed by the record and labelled with
//! the parent's UID.

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::api::DynamicObject;
use tracing::{info, warn};

use crate::api::record::RecordedChild;
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::{Informer, ObjectKey, controller_uid};
use crate::engine::error::SyncError;
use crate::engine::finalizer::has_finalizer;
use crate::write::apply::Applier;
use crate::write::children::{ChildMap, ChildType, Elsewhere, Executed, by_label};
use crate::write::records::{Record, Records, entry};

/// What is known of one parent's children elsewhere: its record, if any, and whether a hub from
/// before records synced it (it carries the hub's finalizer and no record).
pub(crate) struct Known {
    pub record: Option<Arc<Record>>,
    pub unrecorded: bool,
}

impl Known {
    /// The decision of which labelled objects elsewhere are the parent's.
    pub fn elsewhere(&self) -> Elsewhere<'_> {
        match &self.record {
            Some(record) => Elsewhere::Listed(record),
            None if self.unrecorded => Elsewhere::Labels,
            None => Elsewhere::Nothing,
        }
    }
}

/// What `records` knows of `parent`'s children elsewhere (`finalizer`: the hub's, on parents). The
/// labels are trusted once, to make the record of a live parent a hub from before records synced; never
/// for a parent being deleted: a deleted parent without a record leaves what only says it is its child
/// in place (deleting it could destroy someone else's object; leaving it loses nothing).
pub(crate) fn known(records: &Records, parent: &DynamicObject, finalizer: &str) -> Known {
    let record = records.of(parent);
    let unrecorded =
        record.is_none() && has_finalizer(parent, finalizer) && parent.metadata.deletion_timestamp.is_none();
    Known { record, unrecorded }
}

/// The labelled objects elsewhere of `parent` that `elsewhere` says are its children, by type.
pub(crate) fn children_elsewhere(
    parent: &DynamicObject,
    parent_resource: &ResolvedResource,
    types: &[ChildType],
    elsewhere: Elsewhere<'_>,
) -> Vec<(usize, Arc<DynamicObject>)> {
    let uid = parent.metadata.uid.as_deref().unwrap_or_default();
    let mut found = Vec::new();
    for (index, child_type) in types.iter().enumerate().filter(|(_, t)| t.cross_namespace) {
        let labelled = child_type.informer.controlled_by(uid).into_iter().filter(|child| {
            !child.metadata.owner_references.iter().flatten().any(|r| r.controller == Some(true))
                && by_label(parent, parent_resource, child.metadata.namespace.as_deref())
                && controller_uid(child) == Some(uid)
                && elsewhere.claims(child_type.resource(), &ObjectKey::of(child))
        });
        found.extend(labelled.map(|child| (index, child)));
    }
    found
}

/// Makes sure `parent` has a record before it gets the hub's finalizer (`has_finalizer`: it has it
/// already, from a hub before records — then the labelled children found are recorded, once). Called
/// for a parent about to be synced, not being deleted.
pub(crate) async fn prepare(
    records: &Records,
    parent: &DynamicObject,
    parent_resource: &ResolvedResource,
    types: &[ChildType],
    known: &Known,
    labels: std::collections::BTreeMap<String, String>,
) -> Result<(), SyncError> {
    if let Some(record) = &known.record {
        if !record.finalized && !record.deleting {
            // Released while no hub needed it (its controller stopped keeping records, a sweep raced
            // the parent's finalizer): held again, so a foreground deletion cannot take it first.
            records.hold(record).await.map_err(record_error)?;
        }
        return Ok(());
    }
    let found: BTreeSet<RecordedChild> = if known.unrecorded {
        children_elsewhere(parent, parent_resource, types, Elsewhere::Labels)
            .into_iter()
            .map(|(index, child)| entry(types[index].resource(), &ObjectKey::of(&child)))
            .collect()
    } else {
        BTreeSet::new()
    };
    if known.unrecorded {
        info!(
            children = found.len(),
            "recording the children elsewhere found by their label (a parent synced before records)"
        );
    }
    records.create(parent, parent_resource, found, labels).await.map_err(record_error)?;
    Ok(())
}

/// The entries of the desired children elsewhere of `desired` (by type).
pub(crate) fn desired_elsewhere(
    parent: &DynamicObject,
    parent_resource: &ResolvedResource,
    types: &[ChildType],
    desired: &[ChildMap<serde_json::Value>],
) -> BTreeSet<RecordedChild> {
    types
        .iter()
        .zip(desired)
        .filter(|(t, _)| t.cross_namespace)
        .flat_map(|(t, desired)| {
            desired
                .keys()
                .filter(|key| by_label(parent, parent_resource, key.namespace.as_deref()))
                .map(move |key| entry(t.resource(), key))
        })
        .collect()
}

/// Enters the desired children elsewhere the record does not list yet, before any of them is written:
/// a child the hub makes there is the parent's from its first moment. Returns the record as written.
pub(crate) async fn admit(
    records: &Records,
    known: &Known,
    desired: &BTreeSet<RecordedChild>,
    parent: &DynamicObject,
) -> Result<Option<Arc<Record>>, SyncError> {
    let Some(record) = &known.record else {
        if desired.is_empty() {
            return Ok(None);
        }
        return Err(SyncError::Claim(Box::new(crate::write::children::ClaimError::NoRecord {
            parent: ObjectKey::of(parent),
        })));
    };
    if desired.is_subset(&record.children) {
        return Ok(Some(Arc::clone(record)));
    }
    let all = record.children.union(desired).cloned().collect();
    records.write(record, all).await.map(Some).map_err(record_error)
}

/// Takes out of the record what is no longer the parent's after a sync's writes: the children elsewhere
/// it deleted, and those no longer desired that are gone (deleted by someone else). Gone means the API
/// server said so: a cache that does not show an object (a sharded one, say, that the object's labels
/// keep it out of) is no proof, and an entry taken out too soon would leave its child for good.
pub(crate) async fn settle(
    records: &Records,
    record: Option<&Arc<Record>>,
    types: &[ChildType],
    desired: &BTreeSet<RecordedChild>,
    executed: &Executed,
) -> Result<(), SyncError> {
    let Some(record) = record else { return Ok(()) };
    let deleted: BTreeSet<RecordedChild> = executed
        .writes
        .iter()
        .filter(|w| !w.recreate && w.version.starts_with(crate::write::children::DELETED_PREFIX))
        .map(|w| entry(types[w.type_index].resource(), &w.key))
        .collect();
    let mut gone = BTreeSet::new();
    for unwanted in
        record.children.iter().filter(|e| !desired.contains(*e) && !deleted.contains(*e) && !present(types, e))
    {
        if absent(records.client(), types, unwanted).await? {
            gone.insert(unwanted.clone());
        }
    }
    let kept: BTreeSet<RecordedChild> =
        record.children.iter().filter(|e| !deleted.contains(*e) && !gone.contains(*e)).cloned().collect();
    if kept == record.children {
        return Ok(());
    }
    records.write(record, kept).await.map(drop).map_err(record_error)
}

/// Whether the API server has no object where `child` says (read live).
async fn absent(client: &kube::Client, types: &[ChildType], child: &RecordedChild) -> Result<bool, SyncError> {
    let Some(child_type) = types.iter().find(|t| of_type(t, child)) else { return Ok(false) };
    let resource = &child_type.resource().api_resource;
    let api: kube::Api<DynamicObject> = match &child.namespace {
        Some(ns) => kube::Api::namespaced_with(client.clone(), ns, resource),
        None => kube::Api::all_with(client.clone(), resource),
    };
    match api.get_opt(&child.name).await {
        Ok(found) => Ok(found.is_none()),
        Err(source) => Err(SyncError::Write { what: "a read of a recorded child elsewhere", source: Box::new(source) }),
    }
}

fn of_type(child_type: &ChildType, child: &RecordedChild) -> bool {
    let resource = child_type.resource();
    child_type.cross_namespace && resource.api_resource.group == child.api_group && resource.kind() == child.kind
}

/// Whether the cache of `child`'s type holds an object where `child` says.
fn present(types: &[ChildType], child: &RecordedChild) -> bool {
    let key = ObjectKey { namespace: child.namespace.clone(), name: child.name.clone() };
    types
        .iter()
        .filter(|t| {
            t.cross_namespace && t.resource().api_resource.group == child.api_group && t.resource().kind() == child.kind
        })
        .any(|t| t.informer.contains(&key))
}

/// Whether a sync of `record`'s parent has entries to take out even though it writes no child. An entry
/// of a type no longer declared `crossNamespace` is not: it stays until the parent's deletion deals with
/// its child ([`let_go_undeclared`]).
pub(crate) fn needs_settling(
    record: Option<&Arc<Record>>,
    types: &[ChildType],
    desired: &BTreeSet<RecordedChild>,
) -> bool {
    let declared = |e: &RecordedChild| types.iter().any(|t| of_type(t, e));
    record.is_some_and(|r| r.children.iter().any(|e| declared(e) && !desired.contains(e) && !present(types, e)))
}

/// The end of a deleted parent's children elsewhere, once its finalize hook (if any) let go: each is
/// deleted (as observed: preconditions on its UID and version), or, with `orphan` (`--cascade=orphan`),
/// released — the user keeps them, as the garbage collector keeps owned ones. A child whose deletion is
/// under way already is not deleted again, nor waited for. Returns whether every one was dealt with,
/// so the parent's finalizer may go; otherwise each child's event queues the parent again.
pub(crate) async fn let_go(
    client: &kube::Client,
    applier: &Applier,
    parent: &DynamicObject,
    parent_resource: &ResolvedResource,
    types: &[ChildType],
    elsewhere: Elsewhere<'_>,
    orphan: bool,
) -> Result<bool, SyncError> {
    let mut done = true;
    for (index, child) in children_elsewhere(parent, parent_resource, types, elsewhere) {
        let resource = types[index].resource();
        if orphan {
            crate::write::children::label(client, resource, &child, None, "releasing")
                .await
                .map_err(|e| SyncError::Claim(Box::new(e)))?;
            continue;
        }
        if child.metadata.deletion_timestamp.is_some() {
            continue;
        }
        // The applier's delete: background, only of the child as observed, counted and traced. A child
        // changed since (`false`) is looked at again when its event syncs the parent.
        if !applier.delete(resource, &child).await.map_err(|e| SyncError::Apply(vec![e]))? {
            done = false;
        }
    }
    Ok(done)
}

/// The end of a deleted parent's children elsewhere of types its controller no longer declares
/// `crossNamespace` (taken out of `childResources`, or declared without it now): no cache watches them,
/// but the record still lists them, and they go with the parent as its owned ones of that type go with
/// the garbage collector — or, with `orphan`, are released. Each entry is read live and dealt with only
/// if it is the parent's by the same rule as any child elsewhere: listed (it is an entry) **and**
/// labelled with the parent's UID, with no controller `ownerReference`, outside the parent's namespace.
/// A type the API server no longer serves has no object left to deal with. A child that changed between
/// the read and the delete is read again at the retry the returned error asks for (no watch of its type
/// would queue the parent).
pub(crate) async fn let_go_undeclared(
    client: &kube::Client,
    discovery: &crate::cache::discovery::Discovery,
    applier: &Applier,
    (parent, parent_resource): (&DynamicObject, &ResolvedResource),
    types: &[ChildType],
    record: &Record,
    orphan: bool,
) -> Result<(), SyncError> {
    let uid = parent.metadata.uid.as_deref().unwrap_or_default();
    for listed in record.children.iter().filter(|e| !types.iter().any(|t| of_type(t, e))) {
        let resolved = discovery.resolve_kind(&listed.api_group, &listed.kind).await.map_err(|source| {
            SyncError::Write { what: "a discovery of a recorded child's type", source: Box::new(source) }
        })?;
        let Some(resource) = resolved else { continue };
        let api: kube::Api<DynamicObject> = match &listed.namespace {
            Some(ns) if resource.namespaced => kube::Api::namespaced_with(client.clone(), ns, &resource.api_resource),
            None if !resource.namespaced => kube::Api::all_with(client.clone(), &resource.api_resource),
            // The entry does not fit the type's scope: nothing of it can be there.
            _ => continue,
        };
        let found = api.get_opt(&listed.name).await.map_err(|source| SyncError::Write {
            what: "a read of a recorded child elsewhere",
            source: Box::new(source),
        })?;
        let Some(child) = found else { continue };
        let ours = !child.metadata.owner_references.iter().flatten().any(|r| r.controller == Some(true))
            && by_label(parent, parent_resource, child.metadata.namespace.as_deref())
            && controller_uid(&child) == Some(uid);
        if !ours {
            continue;
        }
        if orphan {
            crate::write::children::label(client, &resource, &child, None, "releasing")
                .await
                .map_err(|e| SyncError::Claim(Box::new(e)))?;
        } else if child.metadata.deletion_timestamp.is_none() {
            info!(kind = %listed.kind, child = %ObjectKey::of(&child), "deleting a child elsewhere of a type the controller no longer declares");
            if !applier.delete(&resource, &child).await.map_err(|e| SyncError::Apply(vec![e]))? {
                return Err(SyncError::Conflict("child elsewhere of a type no longer declared"));
            }
        }
    }
    Ok(())
}

/// Releases the record of a parent whose finalizer is gone (logged, not failed: the parent is done).
pub(crate) async fn release(records: &Records, record: Option<&Record>) {
    let Some(record) = record else { return };
    if let Err(e) = records.release(record).await {
        warn!(record = %record.key, "could not release the record of children elsewhere: {e}");
    }
}

/// Releases the records whose parent is gone or no longer carries the hub's finalizer (a hub stopped
/// between the two): checked live, parent by parent, for the records the cache holds of `parents`'
/// type that no cached parent explains.
pub(crate) async fn sweep(records: &Records, parents: &Informer, parent_resource: &ResolvedResource, finalizer: &str) {
    for record in records.all() {
        let parent_key = ObjectKey { namespace: record.key.namespace.clone(), name: record.parent.name.clone() };
        let uid = Some(record.parent.uid.as_str());
        let cached = parents.get(&parent_key).filter(|p| p.metadata.uid.as_deref() == uid);
        if cached.is_some_and(|p| has_finalizer(&p, finalizer)) {
            continue;
        }
        let namespace = parent_key.namespace.as_deref().unwrap_or_default();
        let api = kube::Api::<DynamicObject>::namespaced_with(
            records.client().clone(),
            namespace,
            &parent_resource.api_resource,
        );
        let live = match api.get_opt(&parent_key.name).await {
            Ok(live) => live.filter(|p| p.metadata.uid.as_deref() == uid),
            Err(e) => {
                warn!(record = %record.key, "could not read the parent of a record: {e}");
                continue;
            }
        };
        if live.is_none_or(|p| !has_finalizer(&p, finalizer)) {
            release(records, Some(&record)).await;
        }
    }
}

/// A record error as a sync error: a record changed since it was read is a quiet retry.
fn record_error(e: crate::write::records::RecordError) -> SyncError {
    SyncError::Claim(Box::new(crate::write::children::ClaimError::Record(Box::new(e))))
}
