//! Children in other namespaces, as the cross-namespace and tenant tests set them up: one hook that puts
//! a Thing's ConfigMaps wherever its spec lists them, the controller that lets it, and the reads both
//! files make of those ConfigMaps (the parent's marks on a child elsewhere).

use std::time::Duration;

use kube::api::DynamicObject;
use serde_json::{Value, json};

use super::{World, api, eventually};

/// The label carrying the parent's UID on a child elsewhere (no ownerReference can cross namespaces).
pub const PARENT_UID: &str = "metahook.dev/parent-uid";
/// The annotation naming a child elsewhere's parent, `namespace/name`.
pub const PARENT: &str = "metahook.dev/parent";

/// Each Thing's `spec.children` lists its ConfigMaps: `{"name", "namespace"?, "v"?}`, each with `data.v`
/// from the child's `v`, else the Thing's `spec.v`, else "1". The status counts the children answered
/// and lists those the request showed (`seen`, keyed `namespace/name` elsewhere); `finalize` lets go.
pub const HOOK: &str = r#"
def sync(request):
    spec = request["parent"].get("spec") or {}
    children = []
    for c in spec.get("children", []):
        metadata = {"name": c["name"]}
        if c.get("namespace"):
            metadata["namespace"] = c["namespace"]
        children.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
                         "data": {"v": str(c.get("v", spec.get("v", "1")))}})
    seen = sorted(request["children"].get("ConfigMap.v1", {}).keys())
    return {"children": children, "status": {"children": len(children), "seen": seen}}

def finalize(request):
    return {"children": [], "finalized": True}
"#;

/// A controller of Things whose ConfigMaps are `crossNamespace`, synced by [`HOOK`].
pub fn cross_namespace_spec(w: &World) -> Value {
    json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps", "crossNamespace": true,
                            "updateStrategy": {"method": "InPlace"}}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    })
}

/// One entry of a Thing's `spec.children`: here (`None`) or in `namespace`.
pub fn child(name: &str, namespace: Option<&str>) -> Value {
    match namespace {
        Some(ns) => json!({"name": name, "namespace": ns}),
        None => json!({"name": name}),
    }
}

/// The ConfigMap `namespace/name`, if there is one (read as the test's admin).
pub async fn config_map(w: &World, namespace: &str, name: &str) -> Option<DynamicObject> {
    api(&w.client, "v1", "ConfigMap", Some(namespace)).await.get_opt(name).await.unwrap()
}

/// The ConfigMap `namespace/name` once its `data.v` is `v`, waited for up to `within`: a parent's change
/// that reached that child.
pub async fn config_map_with_v(w: &World, namespace: &str, name: &str, v: &str, within: Duration) -> DynamicObject {
    eventually(within, || async { config_map(w, namespace, name).await.filter(|cm| cm.data["data"]["v"] == v) }).await
}

/// The label `key` of `obj`, if it has it.
pub fn label<'a>(obj: &'a DynamicObject, key: &str) -> Option<&'a str> {
    obj.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// The annotation `key` of `obj`, if it has it.
pub fn annotation<'a>(obj: &'a DynamicObject, key: &str) -> Option<&'a str> {
    obj.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}
