//! `ChildRecord` (`metahook.dev/v1alpha1`, the hub's own bookkeeping, not Metacontroller's API): which objects outside a namespaced parent's
//! namespace are that parent's children (`crossNamespace`).
//!
//! A child elsewhere carries the parent's UID in the `metahook.dev/parent-uid` label, but a label can be
//! written by whoever may write the child's namespace: on its own it would let a tenant make any object
//! of theirs pose as another namespace's child (to be waited on, counted, or to freeze that parent's
//! sync). The record is the parent's side of the claim: one object in the **parent's** namespace,
//! written by the hub alone (no built-in role grants it to anyone else), owned by the parent. A child
//! elsewhere is the parent's only when both the record lists it and its label names the parent.
//!
//! Owned by the parent, the record is also what the garbage collector orphans on `kubectl delete
//! --cascade=orphan`: a hub that saw nothing of such a deletion reads the intent there, even when every
//! child is elsewhere. Its finalizer keeps it readable until the hub has dealt with the children, also
//! under a foreground deletion (the collector deletes a parent's dependents first).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The children a parent has outside its namespace, as the hub made (or adopted) them.
// Two print columns of type string read to clippy as one attribute given twice.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "metahook.dev",
    version = "v1alpha1",
    kind = "ChildRecord",
    plural = "childrecords",
    namespaced,
    printcolumn(name = "Controller", type_ = "string", json_path = ".spec.controller"),
    printcolumn(name = "Parent", type_ = "string", json_path = ".spec.parent.name"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ChildRecordSpec {
    /// The CompositeController whose parent this is.
    pub controller: String,
    /// The parent (in the record's namespace).
    pub parent: RecordedParent,
    /// The parent's children outside its namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<RecordedChild>,
}

/// The parent a record is about.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecordedParent {
    pub name: String,
    pub uid: String,
}

/// One child elsewhere: its type (group and kind, as a `ControllerRevision` names children) and where it is.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecordedChild {
    /// The API group (`""` for the core group).
    pub api_group: String,
    pub kind: String,
    /// Absent for a cluster-scoped child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}
