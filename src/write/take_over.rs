//! Takes over what Metacontroller wrote, so that switching hubs on a live cluster re-creates nothing
//! and server-side apply removes what a hook stops returning.
//!
//! Metacontroller's default `dynamic-apply` creates and updates children with plain create/update
//! requests, recorded in `managedFields` under its client's name (`metacontroller`, operation
//! `Update`), and keeps its own `metacontroller.k8s.io/last-applied-configuration` annotation; its
//! server-side-apply mode applies as `metacontroller` (operation `Apply`). Server-side apply removes a
//! field the applier stops sending only when no other manager owns it, so after a plain switch every
//! field Metacontroller ever set would stay owned by it and never go away.
//!
//! The hub therefore takes an object over on its first write to it, the way client-go's `csaupgrade`
//! upgrades a client-side-applied object: Metacontroller's entries (main resource only) are merged into
//! the hub's `Apply` entry, the annotation is dropped from both the object and the merged set. An
//! apply request cannot carry `managedFields` (the API server refuses them), so this is one JSON patch,
//! guarded by tests of the UID and resourceVersion the hub read; a dry-run apply then tells whether the
//! normal apply still has anything to change, so an object whose desired state is what Metacontroller
//! left gets exactly one write. Nothing is deleted or re-created; an object that changed meanwhile
//! fails the test and its sync is retried with the fresh state.
//!
//! The same patch writes the hub's own `metahook.dev/applied` annotation (the hash of the desired state
//! it takes the object over for), which the applier reads to know an object current without a write.
//! Left to "the next apply that changes something", that intent lived only in the hub's memory: the
//! first restart after a switch found no annotation and applied every such child again (issue 62).
//! And the dry run compares what an apply would change, not what the hub's own patch did: not the
//! `metadata.generation` a Deployment raises for any change of its annotations, nor a status the
//! object's own controller wrote meanwhile (an apply of a desired state without a status changes none).
//!
//! The watch cache keeps only who wrote an object (manager and operation), which is all [`TakeOver::
//! is_needed`] looks at; the full `managedFields` are read with a GET once per object, when taking over.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use super::fields;
use crate::cache::informers::ObjectKey;
use crate::cache::informers::main_resource;

/// The annotation Metacontroller's `dynamic-apply` keeps its last applied desired state in.
pub const LAST_APPLIED_ANNOTATION: &str = "metacontroller.k8s.io/last-applied-configuration";

/// The field manager Metacontroller writes children under in both of its apply modes (its binary's
/// name for create/update, and its `--apply-strategy-ssa-field-manager` default).
pub const METACONTROLLER_MANAGER: &str = "metacontroller";

/// Path of [`LAST_APPLIED_ANNOTATION`] in a field set.
const ANNOTATION_PATH: [&str; 3] =
    ["f:metadata", "f:annotations", "f:metacontroller.k8s.io/last-applied-configuration"];

/// Who takes over from whom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TakeOver {
    /// The hub's field manager: owner of everything taken over, as an `Apply` manager.
    pub(crate) to: String,
    /// Field managers whose ownership moves to `to` (any operation, main resource only).
    from: Vec<String>,
}

/// An object after it was taken over.
#[derive(Debug)]
pub struct TookOver {
    /// The object as the take-over patch left it.
    pub object: DynamicObject,
    /// Whether applying the desired state would still change the object (beyond who owns what).
    pub apply_needed: bool,
}

/// Why an object could not be taken over.
#[derive(Debug, thiserror::Error)]
pub enum TakeOverError {
    /// It was deleted, replaced or changed since it was read: the sync is retried with the fresh state.
    #[error("it changed while it was being taken over")]
    Changed,
    #[error("taking it over from Metacontroller: {0}")]
    Api(#[source] kube::Error),
}

impl TakeOver {
    #[must_use]
    pub fn new(to: impl Into<String>, from: Vec<String>) -> Self {
        let to = to.into();
        let from = from.into_iter().filter(|m| *m != to).collect();
        Self { to, from }
    }

    /// Whether an entry is one of the managers taken over from (main resource only: Metacontroller
    /// never writes a child's subresources, and someone else's status writes are theirs).
    pub(crate) fn is_theirs(&self, entry: &ManagedFieldsEntry) -> bool {
        main_resource(entry) && entry.manager.as_ref().is_some_and(|m| self.from.contains(m))
    }

    pub(crate) fn is_ours(&self, entry: &ManagedFieldsEntry) -> bool {
        main_resource(entry)
            && entry.manager.as_deref() == Some(&self.to)
            && entry.operation.as_deref() == Some("Apply")
    }

    /// Whether `obj` still carries something of Metacontroller's: a field manager entry or the
    /// annotation. Works on cached objects, whose entries hold only manager and operation.
    #[must_use]
    pub fn is_needed(&self, obj: &DynamicObject) -> bool {
        obj.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(LAST_APPLIED_ANNOTATION))
            || obj.metadata.managed_fields.iter().flatten().any(|e| self.is_theirs(e))
    }

    /// `entries` with the managers taken over from merged into the hub's `Apply` entry for
    /// `api_version` (created where the first merged entry was), minus the annotation, as csaupgrade's
    /// `UpgradeManagedFields` does. Their entries recorded for another apiVersion are dropped, as
    /// csaupgrade drops them: field sets of different versions cannot be merged without the schema.
    #[must_use]
    pub fn upgrade(&self, entries: &[ManagedFieldsEntry], api_version: &str) -> Vec<ManagedFieldsEntry> {
        if !entries.iter().any(|e| self.is_theirs(e)) {
            return entries.to_vec();
        }
        let ours = entries.iter().find(|e| self.is_ours(e));
        let version = ours.and_then(|e| e.api_version.clone()).unwrap_or_else(|| api_version.to_owned());
        let merged: Vec<&ManagedFieldsEntry> = entries
            .iter()
            .filter(|e| (self.is_ours(e) || self.is_theirs(e)) && e.api_version.as_deref() == Some(version.as_str()))
            .collect();
        let set = fields::without(
            &fields::union_all(merged.iter().filter_map(|e| e.fields_v1.as_ref().map(|f| &f.0))),
            &ANNOTATION_PATH,
        );
        let entry = ManagedFieldsEntry {
            api_version: Some(version),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(set.clone())),
            manager: Some(self.to.clone()),
            operation: Some("Apply".into()),
            subresource: None,
            time: merged.first().and_then(|e| e.time.clone()),
        };
        let mut upgraded = Vec::with_capacity(entries.len());
        let mut placed = set.as_object().is_some_and(serde_json::Map::is_empty);
        for e in entries {
            if self.is_ours(e) || self.is_theirs(e) {
                if !placed {
                    upgraded.push(entry.clone());
                    placed = true;
                }
            } else {
                upgraded.push(e.clone());
            }
        }
        upgraded
    }

    /// The JSON patch that takes `live` over, or `None` when there is nothing of Metacontroller's on it.
    /// It tests UID and resourceVersion first, so it only ever changes the object as it was read, and
    /// sets the hub's [`APPLIED_ANNOTATION`](crate::api::APPLIED_ANNOTATION) to `applied` (the hash of
    /// the desired state) when given.
    #[must_use]
    pub fn patch(&self, live: &DynamicObject, applied: Option<&str>) -> Option<Value> {
        let entries = live.metadata.managed_fields.clone().unwrap_or_default();
        let api_version = live.types.as_ref().map_or("", |t| t.api_version.as_str());
        let upgraded = self.upgrade(&entries, api_version);
        let annotated = live.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(LAST_APPLIED_ANNOTATION));
        if upgraded == entries && !annotated {
            return None;
        }
        let mut ops = vec![
            json!({"op": "test", "path": "/metadata/uid", "value": live.metadata.uid}),
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": live.metadata.resource_version}),
        ];
        if upgraded != entries {
            ops.push(json!({"op": "replace", "path": "/metadata/managedFields", "value": upgraded}));
        }
        if annotated {
            ops.push(json!({"op": "remove", "path": annotation_path(LAST_APPLIED_ANNOTATION)}));
        }
        if let Some(hash) = applied {
            let annotations = live.metadata.annotations.as_ref();
            // Only Metacontroller's annotation there: removing it leaves an empty map, which stays.
            if annotations.is_some() {
                let key = crate::api::APPLIED_ANNOTATION;
                ops.push(json!({"op": "add", "path": annotation_path(key), "value": hash}));
            } else {
                ops.push(json!({"op": "add", "path": "/metadata/annotations",
                                "value": {crate::api::APPLIED_ANNOTATION: hash}}));
            }
        }
        Some(Value::Array(ops))
    }

    /// Takes `observed` over if it needs it (see the module doc); `body` is what the hub is about to
    /// apply, used in a dry run to tell whether that apply is still needed afterwards. `None`: nothing
    /// to take over, go on as usual.
    pub async fn run_if_needed(
        &self,
        api: &Api<DynamicObject>,
        observed: &DynamicObject,
        body: &Value,
    ) -> Result<Option<TookOver>, TakeOverError> {
        if !self.is_needed(observed) {
            return Ok(None);
        }
        let name = observed.metadata.name.as_deref().unwrap_or_default();
        let live = match api.get_opt(name).await {
            Ok(Some(live)) if live.metadata.uid == observed.metadata.uid => live,
            Ok(_) => return Err(TakeOverError::Changed),
            Err(e) => return Err(TakeOverError::Api(e)),
        };
        let applied = body.pointer("/metadata/annotations").and_then(|a| a.get(crate::api::APPLIED_ANNOTATION));
        let Some(patch) = self.patch(&live, applied.and_then(Value::as_str)) else { return Ok(None) };
        let patch: json_patch::Patch =
            serde_json::from_value(patch).map_err(|e| TakeOverError::Api(kube::Error::SerdeError(e)))?;
        let params = PatchParams { field_manager: Some(self.to.clone()), ..PatchParams::default() };
        let object = match api.patch(name, &params, &Patch::<()>::Json(patch)).await {
            Ok(object) => object,
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 || failed_test(&status) => {
                return Err(TakeOverError::Changed);
            }
            Err(e) => return Err(TakeOverError::Api(e)),
        };
        tracing::info!(
            kind = object.types.as_ref().map_or("", |t| t.kind.as_str()),
            object = %ObjectKey::of(&object),
            from = ?self.from,
            "took over from Metacontroller"
        );
        // A refused dry run (an immutable field, say) leaves the decision to the normal apply.
        let dry_run = PatchParams::apply(&self.to).force().dry_run();
        let sets_status = body.get("status").is_some();
        let apply_needed = match api.patch(name, &dry_run, &Patch::Apply(body)).await {
            Ok(result) => comparable(&result, sets_status) != comparable(&object, sets_status),
            Err(_) => true,
        };
        Ok(Some(TookOver { object, apply_needed }))
    }
}

/// Whether the API server refused a JSON patch because one of its tests failed: it answers that with a
/// bare 422 ("the server rejected our request due to an error in our request") naming no field, where
/// an invalid result would name the offending fields.
fn failed_test(status: &kube::core::Status) -> bool {
    status.code == 422 && status.details.as_ref().is_none_or(|d| d.causes.is_empty())
}

/// The JSON pointer of the annotation `key`.
fn annotation_path(key: &str) -> String {
    format!("/metadata/annotations/{}", key.replace('~', "~0").replace('/', "~1"))
}

/// An object as far as an apply of a desired state can change it: all but who owns what, the counters
/// the API server keeps (`resourceVersion`, and `generation`, which a Deployment raises for any change of
/// its annotations: the take-over patch's own), the hub's applied-hash annotation (the take-over patch
/// writes it), and, unless the desired state sets one (`sets_status`), the status, which the object's own
/// controller may have written between the take-over patch and the dry run.
fn comparable(obj: &DynamicObject, sets_status: bool) -> Value {
    let mut value = serde_json::to_value(obj).unwrap_or(Value::Null);
    if !sets_status && let Some(fields) = value.as_object_mut() {
        fields.remove("status");
    }
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
        meta.remove("resourceVersion");
        meta.remove("generation");
        if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            annotations.remove(crate::api::APPLIED_ANNOTATION);
            if annotations.is_empty() {
                meta.remove("annotations");
            }
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::informers::slim_managed_fields;

    fn entry(manager: &str, operation: &str, api_version: &str, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            api_version: Some(api_version.into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            subresource: None,
            time: None,
        }
    }

    fn take_over() -> TakeOver {
        TakeOver::new("metahook", vec!["metacontroller".into()])
    }

    fn annotation_and(field: &str) -> Value {
        json!({"f:metadata": {"f:annotations": {".": {}, "f:metacontroller.k8s.io/last-applied-configuration": {}}},
               "f:data": {".": {}, (format!("f:{field}")): {}}})
    }

    #[test]
    fn dynamic_apply_updates_become_the_hubs_apply_entry_without_the_annotation() {
        let entries = vec![
            entry("kube-controller-manager", "Update", "v1", json!({"f:status": {}})),
            entry("metacontroller", "Update", "v1", annotation_and("a")),
            entry("metacontroller", "Update", "v1", annotation_and("b")),
        ];
        let upgraded = take_over().upgrade(&entries, "v1");
        assert_eq!(upgraded.len(), 2, "{upgraded:#?}");
        assert_eq!(upgraded[0], entries[0], "other managers are untouched");
        assert_eq!(upgraded[1].manager.as_deref(), Some("metahook"));
        assert_eq!(upgraded[1].operation.as_deref(), Some("Apply"));
        assert_eq!(upgraded[1].fields_v1.as_ref().unwrap().0, json!({"f:data": {".": {}, "f:a": {}, "f:b": {}}}));
    }

    #[test]
    fn metacontroller_apply_merges_into_an_existing_hub_entry_and_other_versions_are_dropped() {
        let entries = vec![
            entry("metahook", "Apply", "apps/v1", json!({"f:spec": {"f:replicas": {}}})),
            entry("metacontroller", "Apply", "apps/v1", json!({"f:spec": {"f:paused": {}}})),
            entry("metacontroller", "Update", "apps/v1beta2", json!({"f:spec": {"f:old": {}}})),
            entry("metacontroller", "Update", "apps/v1", json!({"f:status": {"f:x": {}}}))
                .clone_with_subresource("status"),
        ];
        let upgraded = take_over().upgrade(&entries, "apps/v1");
        assert_eq!(upgraded.len(), 2, "{upgraded:#?}");
        assert_eq!(upgraded[0].fields_v1.as_ref().unwrap().0, json!({"f:spec": {"f:paused": {}, "f:replicas": {}}}));
        assert_eq!(upgraded[1].subresource.as_deref(), Some("status"), "subresource entries stay");
    }

    trait WithSubresource {
        fn clone_with_subresource(self, subresource: &str) -> Self;
    }

    impl WithSubresource for ManagedFieldsEntry {
        fn clone_with_subresource(mut self, subresource: &str) -> Self {
            self.subresource = Some(subresource.into());
            self
        }
    }

    fn object(annotations: &Value, entries: &[ManagedFieldsEntry]) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "namespace": "n", "uid": "u-1", "resourceVersion": "42",
                         "annotations": annotations, "managedFields": entries}
        }))
        .unwrap()
    }

    #[test]
    fn the_patch_tests_identity_first_and_removes_the_annotation() {
        let entries = [entry("metacontroller", "Update", "v1", annotation_and("a"))];
        let live = object(&json!({LAST_APPLIED_ANNOTATION: "{}", "keep": "x"}), &entries);
        let patch = take_over().patch(&live, None).unwrap();
        assert_eq!(patch[0], json!({"op": "test", "path": "/metadata/uid", "value": "u-1"}));
        assert_eq!(patch[1], json!({"op": "test", "path": "/metadata/resourceVersion", "value": "42"}));
        assert_eq!(patch[2]["path"], "/metadata/managedFields");
        assert_eq!(patch[2]["value"][0]["manager"], "metahook");
        assert_eq!(
            patch[3],
            json!({"op": "remove", "path": "/metadata/annotations/metacontroller.k8s.io~1last-applied-configuration"})
        );
        assert!(serde_json::from_value::<json_patch::Patch>(patch).is_ok());
    }

    #[test]
    fn objects_without_metacontroller_traces_need_nothing() {
        let ours = [entry("metahook", "Apply", "v1", json!({"f:data": {"f:a": {}}}))];
        let live = object(&json!({"keep": "x"}), &ours);
        assert!(!take_over().is_needed(&live));
        assert_eq!(take_over().patch(&live, None), None);
        // Only the annotation left (say, managedFields were reset): the patch just removes it.
        let annotated = object(&json!({LAST_APPLIED_ANNOTATION: ""}), &ours);
        assert!(take_over().is_needed(&annotated));
        assert_eq!(take_over().patch(&annotated, None).unwrap().as_array().unwrap().len(), 3);
    }

    /// Issue 62 item 4: the take-over writes the hub's applied-hash annotation itself, so a restart
    /// after a switch finds the object current without writing it again.
    #[test]
    fn the_take_over_patch_writes_the_hubs_applied_annotation() {
        let entries = [entry("metacontroller", "Update", "v1", annotation_and("a"))];
        let live = object(&json!({LAST_APPLIED_ANNOTATION: "{}"}), &entries);
        let patch = take_over().patch(&live, Some("hash-1")).unwrap();
        let last = patch.as_array().unwrap().last().unwrap();
        assert_eq!(
            last,
            &json!({"op": "add", "path": "/metadata/annotations/metahook.dev~1applied", "value": "hash-1"})
        );
        let mut value = serde_json::to_value(&live).unwrap();
        json_patch::patch(&mut value, &serde_json::from_value::<json_patch::Patch>(patch).unwrap()).unwrap();
        assert_eq!(value["metadata"]["annotations"], json!({"metahook.dev/applied": "hash-1"}));
        // No annotations at all (a child Metacontroller applied server-side, the annotation gone).
        let mut bare = object(&json!({}), &entries);
        bare.metadata.annotations = None;
        let patch = take_over().patch(&bare, Some("hash-2")).unwrap();
        let mut value = serde_json::to_value(&bare).unwrap();
        json_patch::patch(&mut value, &serde_json::from_value::<json_patch::Patch>(patch).unwrap()).unwrap();
        assert_eq!(value["metadata"]["annotations"], json!({"metahook.dev/applied": "hash-2"}));
    }

    /// Issue 62 item 3: what the take-over patch itself changed (a Deployment's generation, raised by
    /// the annotation it removed) and what the object's controller wrote meanwhile (its status) are no
    /// difference an apply would make.
    #[test]
    fn the_dry_run_compares_what_an_apply_would_change_not_what_the_patch_did() {
        let at = |generation: i64, status: Value, data: &str| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "a", "namespace": "n", "uid": "u-1", "resourceVersion": format!("{generation}0"),
                             "generation": generation, "annotations": {"metahook.dev/applied": "h"}},
                "spec": {"replicas": data}, "status": status}))
            .unwrap()
        };
        let patched = at(2, json!({"observedGeneration": 1}), "1");
        let dry_run = at(3, json!({"observedGeneration": 2}), "1");
        assert_eq!(comparable(&patched, false), comparable(&dry_run, false));
        assert_ne!(comparable(&patched, true), comparable(&dry_run, true), "a desired status is compared");
        assert_ne!(comparable(&patched, false), comparable(&at(3, json!({}), "2"), false), "a change is one");
    }

    #[test]
    fn the_cache_keeps_who_wrote_an_object_but_not_what_they_own() {
        let mut live = object(&json!({}), &[entry("metacontroller", "Update", "v1", annotation_and("a"))]);
        slim_managed_fields(&mut live);
        let slim = &live.metadata.managed_fields.as_ref().unwrap()[0];
        assert!(slim.fields_v1.is_none());
        assert!(take_over().is_needed(&live));
    }

    #[test]
    fn the_hub_never_takes_over_from_itself() {
        let t = TakeOver::new("metahook", vec!["metahook".into(), "metacontroller".into()]);
        assert_eq!(t.from, ["metacontroller"]);
    }
}
