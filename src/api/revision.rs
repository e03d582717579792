//! Metacontroller's `ControllerRevision` (`metacontroller.k8s.io/v1alpha1`, not apps/v1's): the record
//! of a parent revision in a rolling update. Its objects are read and written as dynamic objects; this is
//! its CRD, as Metacontroller installs it.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::json;

/// The `ControllerRevision` CRD (no `spec`: `parentPatch` and `children` are top-level, as in Metacontroller).
#[must_use]
pub fn crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "controllerrevisions.metacontroller.k8s.io"},
        "spec": {
            "group": "metacontroller.k8s.io",
            "names": {"kind": "ControllerRevision", "listKind": "ControllerRevisionList",
                      "plural": "controllerrevisions", "singular": "controllerrevision"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {
                    "description": "A parent revision of a CompositeController with rolling child updates.",
                    "type": "object",
                    "required": ["metadata", "parentPatch"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "parentPatch": {
                            "description": "The parent's fields listed in revisionHistory.fieldPaths, as of this revision.",
                            "type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "children": {
                            "description": "Children that belong to this revision.",
                            "type": "array",
                            "items": {"type": "object", "required": ["apiGroup", "kind", "names"], "properties": {
                                "apiGroup": {"type": "string"},
                                "kind": {"type": "string"},
                                "names": {"type": "array", "items": {"type": "string"}}}}},
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                    }
                }}
            }]
        }
    }))
    .expect("a well-formed CRD")
}
