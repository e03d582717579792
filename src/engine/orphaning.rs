//! A user's `--cascade=orphan`, remembered in the API: whether a deleted object's children are the user's
//! to keep.
//!
//! The garbage collector shows an orphaning deletion by its `orphan` finalizer, and takes that finalizer
//! off as soon as it has removed the object's ownerReferences from the owned children — often before the
//! hub's sync of the deletion, and always before a hub that was down meanwhile comes back. Children the
//! hub tracks by label (`crossNamespace`) are the hub's to delete or to release, so the intent must
//! outlive the finalizer: a restart, a leader hand-over or a bucket moving to another replica must not
//! turn "keep them" into "delete them". Hence three sources, strongest first:
//!
//! 1. [`ORPHAN_ANNOTATION`] on the object, written by the first sync of an orphaning deletion before
//!    anything else is done for it ([`Intent::record`]): the record every replica reads;
//! 2. the `orphan` finalizer itself, on the object now or on the first deleting version the object's
//!    events showed this process ([`Deletions`]);
//! 3. an inference from the API, for a hub that saw none of it: the owned children in the object's own
//!    namespace that the garbage collector orphaned (selected by the parent, written by the hub, no
//!    controller any more; read live, see [`Orphaned`]).
//!
//! A deletion is decided only once the object's events have shown it ([`Deletions::seen`]): the cache
//! is updated before its event is handled, so a sync may read the version from after the collector took
//! `orphan` off before the event of the version that had it reached this module.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::api::APPLIED_ANNOTATION;
use crate::cache::discovery::{ResolvedResource, cannot_exist};
use crate::cache::informers::controller_uid;
use crate::cache::selector::Selector;
use crate::engine::error::SyncError;

/// The annotation that records, on an object being deleted, that its deletion orphans its children
/// (`kubectl delete --cascade=orphan`): value `orphan`. Written by the hub; read by every replica.
pub const ORPHAN_ANNOTATION: &str = "metahook.dev/cascade";

/// The value of [`ORPHAN_ANNOTATION`].
const ORPHAN: &str = "orphan";

/// Whether `obj` shows an orphaning deletion by itself: the annotation, or the collector's finalizer.
#[must_use]
pub fn shows_orphaning(obj: &DynamicObject) -> bool {
    recorded(obj) || obj.metadata.finalizers.iter().flatten().any(|f| f == "orphan")
}

/// Whether [`ORPHAN_ANNOTATION`] is on `obj`.
#[must_use]
pub fn recorded(obj: &DynamicObject) -> bool {
    obj.metadata.annotations.as_ref().and_then(|a| a.get(ORPHAN_ANNOTATION)).is_some_and(|v| v == ORPHAN)
}

/// The deletions the events of one controller's objects showed this process, by UID: whether the first
/// deleting version (or any later one) carried the `orphan` finalizer.
#[derive(Default)]
pub struct Deletions {
    /// UID → orphaning. An entry exists once an event showed the object with a deletion timestamp, and
    /// goes with the object's deletion event.
    seen: Mutex<HashMap<String, bool>>,
}

impl Deletions {
    /// Notes a version of an object from its events (call before the event queues the object).
    pub fn observe(&self, obj: &DynamicObject) {
        if obj.metadata.deletion_timestamp.is_none() {
            return;
        }
        let uid = obj.metadata.uid.clone().unwrap_or_default();
        let orphan = shows_orphaning(obj);
        let mut seen = self.seen.lock().expect("deletions lock");
        let entry = seen.entry(uid).or_insert(orphan);
        *entry |= orphan;
    }

    /// Forgets an object that is gone.
    pub fn forget(&self, uid: &str) {
        self.seen.lock().expect("deletions lock").remove(uid);
    }

    /// What this process knows of `obj`'s deletion: `None` while no event has shown it being deleted
    /// (a sync ahead of its events must not decide yet), else whether it orphans by what was seen.
    #[must_use]
    pub fn seen(&self, obj: &DynamicObject) -> Option<bool> {
        let uid = obj.metadata.uid.as_deref().unwrap_or_default();
        let seen = self.seen.lock().expect("deletions lock").get(uid).copied();
        seen.map(|orphan| orphan || shows_orphaning(obj))
    }
}

/// What is known of a deleting object's orphaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intent {
    /// The events have not shown the deletion yet: decide nothing (the event queues the object again).
    Unseen,
    /// The user keeps the children.
    Orphan,
    /// Nothing says so: the children go with the object, unless [`Orphaned`] finds the collector orphaned
    /// its owned ones.
    NotShown,
}

impl Intent {
    /// What `deletions` and `obj` itself say.
    #[must_use]
    pub fn of(obj: &DynamicObject, deletions: &Deletions) -> Self {
        match deletions.seen(obj) {
            None => Self::Unseen,
            Some(true) => Self::Orphan,
            Some(false) => Self::NotShown,
        }
    }

    /// Writes [`ORPHAN_ANNOTATION`] on `obj` if it is not there yet: a merge patch naming the object's
    /// UID (refused for a new object of the same name). Returns the version it left behind.
    pub async fn record(api: &Api<DynamicObject>, obj: &DynamicObject) -> Result<Option<String>, SyncError> {
        if recorded(obj) {
            return Ok(None);
        }
        let patch = json!({"metadata": {"uid": obj.metadata.uid, "annotations": {ORPHAN_ANNOTATION: ORPHAN}}});
        let name = obj.metadata.name.as_deref().unwrap_or_default();
        match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(written) => Ok(written.metadata.resource_version),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 422 && s.message.contains("metadata.uid") => {
                Ok(None)
            }
            Err(e) => Err(SyncError::Write { what: "the --cascade=orphan record", source: Box::new(e) }),
        }
    }
}

/// The inference for a hub that saw nothing of an orphaning deletion: the garbage collector took the
/// ownerReference off the object's owned children in its namespace, and kept them. A child type's
/// objects there that the parent's `selector` selects, that the hub wrote ([`APPLIED_ANNOTATION`]), and
/// that no longer have a controller are such children: under any other deletion they keep their
/// ownerReference until the object is gone (the hub's finalizer holds it). Read live, not from the
/// cache: the cache of the children may be older than the object's version the sync holds.
pub struct Orphaned<'a> {
    pub client: &'a kube::Client,
    /// The child types whose children are in the parent's namespace (all declared types).
    pub types: &'a [std::sync::Arc<ResolvedResource>],
    pub selector: &'a Selector,
}

impl Orphaned<'_> {
    /// Whether any child of `parent` in its namespace was orphaned by the garbage collector.
    pub async fn any(&self, parent: &DynamicObject) -> Result<bool, SyncError> {
        let Some(namespace) = parent.metadata.namespace.as_deref() else { return Ok(false) };
        // The selector's one required label, if it has one, narrows the list on the server.
        let params = match self.selector.required_label() {
            Some((key, value)) => ListParams::default().labels(&format!("{key}={value}")),
            None => ListParams::default(),
        };
        for resource in self.types.iter().filter(|r| r.namespaced) {
            let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &resource.api_resource);
            let listed = match api.list(&params).await {
                Ok(listed) => listed,
                // The type is not served any more (its CRD deleted): it has no children to keep.
                Err(e) if cannot_exist(&e) => continue,
                Err(e) => {
                    return Err(SyncError::Write {
                        what: "a read of the children kept by --cascade=orphan",
                        source: Box::new(e),
                    });
                }
            };
            if listed.items.iter().any(|child| self.orphaned(child)) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether `child` is one the collector orphaned (see the type's doc).
    fn orphaned(&self, child: &DynamicObject) -> bool {
        let applied = child.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(APPLIED_ANNOTATION));
        applied
            && child.metadata.deletion_timestamp.is_none()
            && controller_uid(child).is_none()
            && self.selector.matches(&crate::api::labels_of(&child.metadata))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deleting(uid: &str, finalizers: &[&str], annotation: bool) -> DynamicObject {
        let mut obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "p", "namespace": "n", "uid": uid,
                         "deletionTimestamp": "2026-12-05T00:00:00Z", "finalizers": finalizers},
        }))
        .unwrap();
        if annotation {
            obj.metadata.annotations = Some([(ORPHAN_ANNOTATION.to_owned(), ORPHAN.to_owned())].into());
        }
        obj
    }

    #[test]
    fn a_deletion_is_undecided_until_its_event_was_seen() {
        let deletions = Deletions::default();
        let later = deleting("u", &["ours"], false);
        assert_eq!(Intent::of(&later, &deletions), Intent::Unseen);
        deletions.observe(&deleting("u", &["orphan", "ours"], false));
        // The collector took `orphan` off: what the events showed first still says orphan.
        assert_eq!(Intent::of(&later, &deletions), Intent::Orphan);
        deletions.forget("u");
        assert_eq!(Intent::of(&later, &deletions), Intent::Unseen);
    }

    #[test]
    fn the_record_in_the_api_outlives_the_finalizer_and_the_process() {
        let deletions = Deletions::default();
        let recorded = deleting("u", &["ours"], true);
        deletions.observe(&recorded);
        assert_eq!(Intent::of(&recorded, &deletions), Intent::Orphan);
        let plain = deleting("v", &["ours"], false);
        deletions.observe(&plain);
        assert_eq!(Intent::of(&plain, &deletions), Intent::NotShown);
    }
}
