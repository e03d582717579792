//! The controller's finalizer: when to call the finalize hook instead of the sync hook, and putting the
//! finalizer on and taking it off (re-reading the object on a conflict) — one helper owns both ends.

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

use crate::engine::error::SyncError;

/// What to do with an object, given its finalizer state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Not ours to sync (not selected, or going away without our finalizer).
    Skip,
    /// The finalize hook was removed from the spec: drop our finalizer, nothing else.
    DropFinalizer,
    /// Call the hook. `add_finalizer`: put ours on first.
    Sync { finalizing: bool, add_finalizer: bool },
}

/// What the finalizer decision depends on.
#[derive(Debug, Clone, Copy)]
#[allow(clippy::struct_excessive_bools)] // five independent facts; an enum would hide which is which
pub(crate) struct Facts {
    pub finalize_hook: bool,
    /// The object may have children by label (`crossNamespace`), which the hub deletes itself when the
    /// object is deleted: the finalizer holds it until then, finalize hook or not.
    pub cleanup: bool,
    pub selected: bool,
    pub has_finalizer: bool,
    pub deleting: bool,
}

/// Metacontroller's finalizer rules: a finalize hook is called on deletion, and when the object stops
/// matching the controller's selector, for as long as our finalizer is on it. With children by label
/// (`cleanup`), the finalizer is on every synced object and a deletion finalizes, hook or not (an object
/// the controller stops selecting keeps its children, as owned children stay with theirs).
pub(crate) fn plan(facts: Facts) -> Step {
    let Facts { finalize_hook: has_finalize_hook, cleanup, selected, has_finalizer, deleting } = facts;
    let finalizing = (has_finalize_hook && (deleting || !selected)) || (cleanup && deleting);
    let wants_finalizer = has_finalize_hook || cleanup;
    match (wants_finalizer, has_finalizer) {
        (false, true) => Step::DropFinalizer,
        _ if finalizing && has_finalizer => Step::Sync { finalizing: true, add_finalizer: false },
        _ if deleting || !selected => Step::Skip,
        _ => Step::Sync { finalizing: false, add_finalizer: wants_finalizer && !has_finalizer },
    }
}

/// A write of the object's finalizers, resolving to the resourceVersion it left behind (`None`: it
/// wrote nothing).
pub(crate) type FinalizerWrite<'a> = futures::future::BoxFuture<'a, Result<Option<String>, SyncError>>;

/// Carries out [`plan`] for `obj`: adds or drops our finalizer as needed, each write made through
/// `record` (which announces it as the controller's own, so its echo is told from others' changes).
/// Returns `None` when there is nothing more to do, else whether the hook is called to finalize.
pub(crate) async fn follow_plan<'a, R, F>(
    api: &'a Api<DynamicObject>,
    obj: &'a DynamicObject,
    finalizer: &'a str,
    facts: Facts,
    record: R,
) -> Result<Option<bool>, SyncError>
where
    R: FnOnce(FinalizerWrite<'a>) -> F,
    F: std::future::Future<Output = Result<(), SyncError>>,
{
    match plan(facts) {
        Step::Skip => Ok(None),
        Step::DropFinalizer => record(Box::pin(remove_finalizer(api, obj, finalizer))).await.map(|()| None),
        Step::Sync { finalizing, add_finalizer } => {
            if add_finalizer {
                record(Box::pin(set_finalizer(api, obj, finalizer, true))).await?;
            }
            Ok(Some(finalizing))
        }
    }
}

/// Whether `live` is at another stage of its life than `cached` (the copy a hook was called with):
/// deletion started, or a finalizer came or went (the garbage collector's among them). Writing the
/// hook's answer then could act for a stage that is over, so the sync is retried with the fresh copy.
/// `ours` (the hub's own finalizer) does not count: this very sync may just have added it, and the cached
/// copy cannot show that yet.
pub(crate) fn lifecycle_changed(cached: &DynamicObject, live: &DynamicObject, ours: &str) -> bool {
    let others = |obj: &DynamicObject| -> Vec<String> {
        obj.metadata.finalizers.iter().flatten().filter(|f| *f != ours).cloned().collect()
    };
    cached.metadata.deletion_timestamp != live.metadata.deletion_timestamp || others(cached) != others(live)
}

/// Whether `obj` carries `finalizer`.
pub(crate) fn has_finalizer(obj: &DynamicObject, finalizer: &str) -> bool {
    obj.metadata.finalizers.iter().flatten().any(|f| f == finalizer)
}

/// Whether the garbage collector is deleting `obj`'s dependents its own way: `orphan` (`kubectl delete
/// --cascade=orphan`, the user keeps the children) or `foregroundDeletion` (the GC deletes them first).
/// Either way the children are no longer the hub's to write, as in Metacontroller: the finalize hook is
/// still called, but no child is created, changed or deleted.
pub(crate) fn gc_finalizing(obj: &DynamicObject) -> bool {
    obj.metadata.deletion_timestamp.is_some()
        && obj.metadata.finalizers.iter().flatten().any(|f| f == "orphan" || f == "foregroundDeletion")
}

/// Adds or removes `finalizer`, guarded by the object's resourceVersion (a conflict retries the sync).
/// Returns the resourceVersion it left behind (`None`: the object is gone).
async fn set_finalizer(
    api: &Api<DynamicObject>,
    obj: &DynamicObject,
    finalizer: &str,
    present: bool,
) -> Result<Option<String>, SyncError> {
    let mut finalizers: Vec<&String> = obj.metadata.finalizers.iter().flatten().filter(|f| *f != finalizer).collect();
    let ours = finalizer.to_owned();
    if present {
        finalizers.push(&ours);
    }
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": obj.metadata.resource_version}});
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(written) => Ok(written.metadata.resource_version),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(SyncError::Conflict("finalizers")),
        Err(e) => Err(SyncError::Write { what: "finalizers", source: Box::new(e) }),
    }
}

/// How often [`remove_finalizer`] re-reads the object after a conflict before the sync is retried.
const FINALIZER_ATTEMPTS: usize = 5;

/// Removes `finalizer` from `obj`, re-reading it after a conflict. The sync that lets go has usually
/// just written the object's status, so the copy it read is stale by then; a finalize hook whose status
/// changes on every call (a timestamp, a counter) would otherwise conflict on every retry, and the
/// object (and its namespace) could never be deleted. A re-read object that is gone, replaced (another
/// UID) or without our finalizer needs nothing more. Returns the resourceVersion the removal left
/// behind (`None`: nothing was written).
pub(crate) async fn remove_finalizer(
    api: &Api<DynamicObject>,
    obj: &DynamicObject,
    finalizer: &str,
) -> Result<Option<String>, SyncError> {
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    let mut current = std::borrow::Cow::Borrowed(obj);
    for _ in 0..FINALIZER_ATTEMPTS {
        if !has_finalizer(&current, finalizer) {
            return Ok(None);
        }
        match set_finalizer(api, &current, finalizer, false).await {
            Err(SyncError::Conflict(_)) => {}
            done => return done,
        }
        match api.get_opt(name).await {
            Ok(Some(live)) if live.metadata.uid == obj.metadata.uid => current = std::borrow::Cow::Owned(live),
            Ok(_) => return Ok(None),
            Err(e) => return Err(SyncError::Write { what: "finalizers", source: Box::new(e) }),
        }
    }
    Err(SyncError::Conflict("finalizers"))
}

#[cfg(test)]
mod tests {
    use super::*;
    /// Facts in the order (finalize hook, selected, has our finalizer, deleting) keep the table readable.
    #[allow(clippy::fn_params_excessive_bools)]
    fn f(finalize_hook: bool, selected: bool, has_finalizer: bool, deleting: bool) -> Facts {
        Facts { finalize_hook, cleanup: false, selected, has_finalizer, deleting }
    }

    /// [`f`] for a controller with children by label.
    #[allow(clippy::fn_params_excessive_bools)]
    fn c(finalize_hook: bool, selected: bool, has_finalizer: bool, deleting: bool) -> Facts {
        Facts { cleanup: true, ..f(finalize_hook, selected, has_finalizer, deleting) }
    }

    #[test]
    fn children_by_label_hold_the_object_until_its_deletion_is_finalized() {
        // The finalizer goes on without a finalize hook, and stays while the object is not selected.
        assert_eq!(plan(c(false, true, false, false)), Step::Sync { finalizing: false, add_finalizer: true });
        assert_eq!(plan(c(false, true, true, false)), Step::Sync { finalizing: false, add_finalizer: false });
        assert_eq!(plan(c(false, false, true, false)), Step::Skip);
        // A deletion finalizes, selected or not; without our finalizer there is nothing to hold.
        assert_eq!(plan(c(false, true, true, true)), Step::Sync { finalizing: true, add_finalizer: false });
        assert_eq!(plan(c(false, false, true, true)), Step::Sync { finalizing: true, add_finalizer: false });
        assert_eq!(plan(c(false, true, false, true)), Step::Skip);
        // With a finalize hook, its own rules hold too.
        assert_eq!(plan(c(true, false, true, false)), Step::Sync { finalizing: true, add_finalizer: false });
    }

    #[test]
    fn selected_live_objects_sync_and_get_our_finalizer_when_there_is_a_finalize_hook() {
        assert_eq!(plan(f(true, true, false, false)), Step::Sync { finalizing: false, add_finalizer: true });
        assert_eq!(plan(f(true, true, true, false)), Step::Sync { finalizing: false, add_finalizer: false });
        assert_eq!(plan(f(false, true, false, false)), Step::Sync { finalizing: false, add_finalizer: false });
    }

    #[test]
    fn deletion_or_opt_out_finalizes_only_while_our_finalizer_is_on() {
        assert_eq!(plan(f(true, true, true, true)), Step::Sync { finalizing: true, add_finalizer: false });
        assert_eq!(plan(f(true, false, true, false)), Step::Sync { finalizing: true, add_finalizer: false });
        assert_eq!(plan(f(true, true, false, true)), Step::Skip);
        assert_eq!(plan(f(true, false, false, false)), Step::Skip);
        assert_eq!(plan(f(false, true, false, true)), Step::Skip);
    }

    #[test]
    fn removed_finalize_hook_drops_the_finalizer() {
        assert_eq!(plan(f(false, true, true, false)), Step::DropFinalizer);
        assert_eq!(plan(f(false, false, true, true)), Step::DropFinalizer);
    }

    #[test]
    fn only_other_finalizers_and_deletion_change_a_parents_stage() {
        let with = |finalizers: &[&str], deleting: bool| {
            let mut obj =
                DynamicObject::new("p", &kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()));
            obj.metadata.finalizers = Some(finalizers.iter().map(|f| (*f).to_owned()).collect());
            if deleting {
                obj.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
            }
            obj
        };
        let ours = "metacontroller.io/compositecontroller-c";
        assert!(!lifecycle_changed(&with(&[], false), &with(&[ours], false), ours), "our own finalizer was just added");
        assert!(lifecycle_changed(&with(&[ours], false), &with(&[ours, "orphan"], false), ours));
        assert!(lifecycle_changed(&with(&[ours, "foregroundDeletion"], true), &with(&[ours], true), ours));
        assert!(lifecycle_changed(&with(&[ours], false), &with(&[ours], true), ours));
    }
}
