//! An answer Metacontroller accepts is accepted (issue 62 item 5): a child with a field its type's schema
//! does not declare is made without it, as Metacontroller's create makes it, and the parent's Warning
//! Event names each field dropped; with `childUnknownFields: Strict` it is refused whole, as server-side
//! apply refuses it.
//!
//! The StatefulSet is the SKA telescope's MPI operator's worker set, whose hook puts `type:
//! RollingUpdate` at `spec.type` (it belongs under `updateStrategy`); the custom resource's schema
//! declares `spec.size` and not `spec.colour`.

mod support;

use std::time::Duration;

use metahook::ops::config::Config;
use metahook::write::unknown_fields::UnknownFields;
use serde_json::json;
use support::{World, api, eventually};

const WAIT: Duration = Duration::from_secs(90);

/// A custom resource whose schema declares its fields (no `x-kubernetes-preserve-unknown-fields`).
const STRICT_CRD: &str = r"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: strictthings.test.metahook.dev}
spec:
  group: test.metahook.dev
  scope: Namespaced
  names: {kind: StrictThing, plural: strictthings, singular: strictthing}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
";

/// The MPI operator's worker StatefulSet (its `spec.type` a slip), a custom resource with an undeclared
/// `spec.colour`, and a ConfigMap with nothing wrong.
const HOOK: &str = r#"
def sync(req):
    name = req["parent"]["metadata"]["name"]
    labels = {"mpi-job-name": name, "mpi-job-role": "worker"}
    return {"children": [
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name + "-worker"},
         "spec": {"type": "RollingUpdate", "podManagementPolicy": "Parallel", "replicas": 0,
                  "serviceName": name + "-worker", "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels},
                               "spec": {"containers": [{"name": "worker", "image": "registry.k8s.io/pause:3.10",
                                                        "command": ["sleep", "365d"]}]}}}},
        {"apiVersion": "test.metahook.dev/v1", "kind": "StrictThing", "metadata": {"name": name + "-strict"},
         "spec": {"size": 3, "colour": "red"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name + "-cm"}, "data": {"ok": "yes"}},
    ]}
"#;

/// A world whose hub treats undeclared fields as `unknown_fields` says, with the controller of [`HOOK`].
async fn world(test: &str, unknown_fields: UnknownFields) -> World {
    let mut w = World::new(test, HOOK).await;
    support::install_crds(&w.client, STRICT_CRD).await;
    w.stop_hub().await;
    let client = w.client.clone();
    let config = Config { child_unknown_fields: unknown_fields, metrics_address: String::new(), ..Config::default() };
    w.start_hub_with(&client, config);
    w.composite(json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
        "childResources": [
            {"apiVersion": "apps/v1", "resource": "statefulsets", "updateStrategy": {"method": "InPlace"}},
            {"apiVersion": "test.metahook.dev/v1", "resource": "strictthings", "updateStrategy": {"method": "InPlace"}},
            {"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}},
        ],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    }))
    .await;
    w
}

/// The Warning Events on the parent `name` whose reason is `reason`.
async fn warnings(w: &World, name: &str, reason: &str) -> Vec<String> {
    let all = support::warnings_for(&w.client, &w.ns.name, name).await;
    all.into_iter().filter(|e| e.starts_with(&format!("{reason}:"))).collect()
}

#[tokio::test]
async fn a_child_with_a_field_its_schema_does_not_declare_is_made_without_it_and_the_parent_says_which() {
    let mut w = world("unknown-fields-dropped", UnknownFields::Drop).await;
    w.thing("mpi", json!({})).await;
    let ns = w.ns.name.clone();
    let sets = api(&w.client, "apps/v1", "StatefulSet", Some(&ns)).await;
    let stricts = api(&w.client, "test.metahook.dev/v1", "StrictThing", Some(&ns)).await;
    let set = eventually(WAIT, || async { sets.get_opt("mpi-worker").await.unwrap() }).await;
    let strict = eventually(WAIT, || async { stricts.get_opt("mpi-strict").await.unwrap() }).await;
    assert!(set.data["spec"].get("type").is_none(), "{:?}", set.data["spec"]);
    assert_eq!(set.data["spec"]["podManagementPolicy"], "Parallel", "the rest is as the hook asked");
    assert_eq!(strict.data["spec"], json!({"size": 3}), "the undeclared colour is dropped, the size kept");
    w.config_map("mpi-cm").await.expect("the ConfigMap beside them is made");

    // The parent says which fields of which child were dropped.
    let said = eventually(WAIT, || async {
        let said = warnings(&w, "mpi", "UnknownFieldsDropped").await;
        (said.len() >= 2).then_some(said)
    })
    .await;
    let about =
        |child: &str, field: &str| said.iter().any(|e| e.contains(&format!("{ns}/{child} written without {field}")));
    assert!(about("mpi-worker", ".spec.type"), "{said:#?}");
    assert!(about("mpi-strict", ".spec.colour"), "{said:#?}");
    assert!(warnings(&w, "mpi", "SyncError").await.is_empty(), "no sync failed");

    // Nothing more is written for them: not by the syncs after (the echoes, a change of the parent),
    // nor by a restarted hub, which must find them current without the fields it dropped before.
    let versions = || async {
        let set = sets.get("mpi-worker").await.unwrap();
        let strict = stricts.get("mpi-strict").await.unwrap();
        (set.metadata.generation, strict.metadata.resource_version)
    };
    let before = versions().await;
    w.thing("mpi", json!({"round": 2})).await;
    w.stop_hub().await;
    let client = w.client.clone();
    w.start_hub_with(&client, Config { metrics_address: String::new(), ..Config::default() });
    let asked = w.hook.requests("/sync").len();
    eventually(WAIT, || async { (w.hook.requests("/sync").len() > asked).then_some(()) }).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(versions().await, before, "neither child written again");
    assert_eq!(warnings(&w, "mpi", "UnknownFieldsDropped").await.len(), said.len(), "no new write said so");
    w.finish("CompositeController").await;
}

#[tokio::test]
async fn a_strict_hub_refuses_such_a_child_whole_as_server_side_apply_does() {
    let w = world("unknown-fields-strict", UnknownFields::Strict).await;
    w.thing("mpi", json!({})).await;
    let warning = eventually(WAIT, || async {
        warnings(&w, "mpi", "SyncError").await.into_iter().find(|e| e.contains(".spec.type"))
    })
    .await;
    assert!(warning.contains("field not declared in schema"), "{warning}");
    let sets = api(&w.client, "apps/v1", "StatefulSet", Some(&w.ns.name)).await;
    assert!(sets.get_opt("mpi-worker").await.unwrap().is_none(), "refused whole: not made");
    assert!(warnings(&w, "mpi", "UnknownFieldsDropped").await.is_empty());
    w.finish("CompositeController").await;
}
