//! The benchmarks' parent types: each one namespaced CRD of `bench.metahook.dev/v1` with a status
//! subresource that keeps whatever fields it is given, so a benchmark's workload is free to shape its
//! objects. One definition here, so that every benchmark's type is served the same way.

use kube::core::ApiResource;
use serde_json::json;

/// The group every bench type is in.
const GROUP: &str = "bench.metahook.dev";

/// The plural of `kind`, as its CRD names it: the kind in lower case, with an `s`.
fn plural(kind: &str) -> String {
    format!("{}s", kind.to_lowercase())
}

/// The CRD of the bench type `kind` (`BenchThing`), for `support::install_crds` (JSON is YAML too).
pub fn crd(kind: &str) -> String {
    let schema = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{}.{GROUP}", plural(kind))},
        "spec": {
            "group": GROUP,
            "names": {"kind": kind, "plural": plural(kind), "singular": kind.to_lowercase()},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                          "schema": {"openAPIV3Schema": schema}}],
        },
    })
    .to_string()
}

/// The bench type `kind`, to address its objects with a dynamic `Api`.
pub fn resource(kind: &str) -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: kind.into(),
        plural: plural(kind),
    }
}
