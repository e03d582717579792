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
use support::{Tenant, World, api, eventually};

const WAIT: Duration = Duration::from_secs(90);

/// A custom resource type of `group` whose schema declares `spec.size` and `more` of its `spec` (strings),
/// and nothing else (no `x-kubernetes-preserve-unknown-fields`).
fn declaring_crd(group: &str, kind: &str, more: &[&str]) -> String {
    let plural = format!("{}s", kind.to_lowercase());
    let more: String = more.iter().map(|field| format!("\n              {field}: {{type: string}}")).collect();
    format!(
        r"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: {plural}.{group}}}
spec:
  group: {group}
  scope: Namespaced
  names: {{kind: {kind}, plural: {plural}, singular: {singular}}}
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
              size: {{type: integer}}{more}
",
        singular = kind.to_lowercase()
    )
}

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
    support::install_crds(&w.client, &declaring_crd("test.metahook.dev", "StrictThing", &[])).await;
    let config = Config { child_unknown_fields: unknown_fields, metrics_address: String::new(), ..Config::default() };
    w.restart_hub_with(config).await;
    // The plain controller, with three child types: a built-in, the CRD above and ConfigMaps.
    let mut spec = w.in_place_spec("/sync");
    let in_place = |api_version, resource| {
        json!({"apiVersion": api_version, "resource": resource,
               "updateStrategy": {"method": "InPlace"}})
    };
    spec["childResources"] = json!([
        in_place("apps/v1", "statefulsets"),
        in_place("test.metahook.dev/v1", "strictthings"),
        in_place("v1", "configmaps")
    ]);
    w.composite(spec).await;
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
    w.restart_hub_with(Config { metrics_address: String::new(), ..Config::default() }).await;
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

/// Issue 67 item 1: each Thing's ConfigMap holds `data.v` from the Thing's `spec.v`, and every key of
/// the Thing's `spec.echo` at its top level, beside `data` — fields a ConfigMap does not declare, named as
/// the parent's owner (a tenant) likes.
const ECHO: &str = r#"
def sync(req):
    spec = req["parent"].get("spec") or {}
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": req["parent"]["metadata"]["name"] + "-cm"},
          "data": {"v": str(spec.get("v", "1"))}}
    for key, value in (spec.get("echo") or {}).items():
        cm[key] = value
    return {"children": [cm]}
"#;

/// Field names a hostile parent's owner echoes into its child: the refusal's own separator with the path
/// of a declared field after it, brackets and quotes, a line break, unicode and a long one (the unit
/// tests of `write::unknown_fields` have the whole alphabet).
fn hostile_names() -> Vec<String> {
    let names = ["x): .data", "y): .metadata.labels", "[name=\"v\"]", "l\nm", "ünï ✓"];
    names.into_iter().map(str::to_owned).chain([".".repeat(300)]).collect()
}

/// Issue 67 item 1, as a tenant (a ServiceAccount with a namespaced Role only): its parent makes the hook
/// echo `x): .data` (and other hostile names) into its ConfigMap. Its child is made without those fields
/// and its parent says so; another controller's ConfigMaps in another namespace keep their `data`, when
/// updated and when created, and no false `UnknownFieldsDropped` Event is said of their parents.
#[tokio::test]
async fn a_tenants_field_names_do_not_make_the_hub_drop_declared_fields_of_other_objects() {
    let w = World::new("uf-tenant", ECHO).await;
    let tenant = Tenant::create(&w.client, "uf-tenant-a").await;
    let controller = |team: &str| {
        json!({
            "generateSelector": true,
            "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things",
                               "labelSelector": {"matchLabels": {"metahook-test": w.label, "team": team}}},
            "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
            "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
        })
    };
    w.composite(controller("tenant")).await;
    let platform = format!("{}-platform", w.label);
    w.controller("CompositeController", &platform, controller("platform")).await;
    let team = |team: &str| json!({"team": team});
    w.thing_labelled("p1", &team("platform"), json!({"v": "1"})).await;
    eventually(WAIT, || async { w.config_map("p1-cm").await.filter(|cm| cm.data["data"]["v"] == "1") }).await;

    let echo: serde_json::Map<String, serde_json::Value> =
        hostile_names().into_iter().map(|name| (name, json!("boom"))).collect();
    let things = tenant.api("test.metahook.dev/v1", "Thing").await;
    let thing = json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing",
                       "metadata": {"name": "t", "labels": {"metahook-test": w.label, "team": "tenant"}},
                       "spec": {"v": "7", "echo": echo}});
    things.create(&Default::default(), &serde_json::from_value(thing).unwrap()).await.unwrap();
    // Its sync has written (or been refused: the hub before issue 67 read `.data` out of the refusal).
    let said = eventually(WAIT, || async {
        let all = support::warnings_for(&w.client, &tenant.namespace.name, "t").await;
        all.into_iter().find(|e| e.starts_with("UnknownFieldsDropped:") || e.starts_with("SyncError:"))
    })
    .await;

    // The other controller's ConfigMaps, in another namespace, keep their data: updated and created.
    w.thing_labelled("p1", &team("platform"), json!({"v": "2"})).await;
    w.thing_labelled("p2", &team("platform"), json!({"v": "3"})).await;
    let bound = Duration::from_secs(30);
    eventually(bound, || async { w.config_map("p1-cm").await.filter(|cm| cm.data["data"] == json!({"v": "2"})) }).await;
    eventually(bound, || async { w.config_map("p2-cm").await.filter(|cm| cm.data["data"] == json!({"v": "3"})) }).await;
    // And keep it: the syncs after these (their echoes) drop nothing either.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(w.config_map("p1-cm").await.unwrap().data["data"], json!({"v": "2"}));
    for parent in ["p1", "p2"] {
        let false_ones = warnings(&w, parent, "UnknownFieldsDropped").await;
        assert!(false_ones.is_empty(), "{parent}: {false_ones:#?}");
        assert!(warnings(&w, parent, "SyncError").await.is_empty(), "{parent}");
    }

    // The tenant's parent is answered: its child is made without the fields a ConfigMap does not
    // declare, its own data kept, and the parent says which.
    assert!(said.starts_with("UnknownFieldsDropped:") && said.contains("t-cm written without"), "{said}");
    assert!(said.contains(r#"["x): .data"]"#), "{said}");
    let made = tenant.api("v1", "ConfigMap").await.get("t-cm").await.unwrap();
    assert_eq!(made.data["data"], json!({"v": "7"}), "the tenant's own data is kept");
    let fields: Vec<&String> = made.data.as_object().unwrap().keys().collect();
    assert_eq!(fields, ["data"], "nothing else of its own");

    let controllers = w.controllers("CompositeController").await;
    let _ = controllers.delete(&platform, &Default::default()).await;
    tenant.namespace.delete().await;
    w.finish("CompositeController").await;
    let unheld = json!({"metadata": {"finalizers": null}});
    let _ = controllers.patch(&platform, &Default::default(), &kube::api::Patch::Merge(unheld)).await;
}

/// A Growth of the parent's `spec.group`, with a size and a colour.
const GROW: &str = r#"
def sync(req):
    parent = req["parent"]
    return {"children": [{"apiVersion": parent["spec"]["group"] + "/v1", "kind": "Growth",
                          "metadata": {"name": parent["metadata"]["name"] + "-g"},
                          "spec": {"size": 1, "colour": "red"}}]}
"#;

/// A child type whose CRD starts declaring a field after the hub started: the field, dropped while
/// undeclared, is written on the parent's next sync, without a restart of the hub.
#[tokio::test]
async fn a_field_a_crd_starts_declaring_is_kept_without_a_restart() {
    let w = World::new("uf-grows", GROW).await;
    let group = format!("g{}.test.metahook.dev", support::unique_suffix());
    let api_version = format!("{group}/v1");
    support::install_crds(&w.client, &declaring_crd(&group, "Growth", &[])).await;
    w.composite(json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
        "childResources": [{"apiVersion": api_version, "resource": "growths", "updateStrategy": {"method": "InPlace"}}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    }))
    .await;
    w.thing("g", json!({"group": group})).await;
    let growths = api(&w.client, &api_version, "Growth", Some(&w.ns.name)).await;
    let made = eventually(WAIT, || async { growths.get_opt("g-g").await.unwrap() }).await;
    assert_eq!(made.data["spec"], json!({"size": 1}), "the undeclared colour is dropped");
    eventually(WAIT, || async {
        warnings(&w, "g", "UnknownFieldsDropped").await.into_iter().find(|e| e.contains(".spec.colour"))
    })
    .await;

    support::install_crds(&w.client, &declaring_crd(&group, "Growth", &["colour"])).await;
    // The API server publishes the new schema a moment after the CRD changes.
    let published = format!("/openapi/v3/apis/{group}/v1");
    eventually(WAIT, || async {
        let request = http::Request::get(&published).body(Vec::new()).unwrap();
        w.client.request_text(request).await.ok().filter(|doc| doc.contains("colour"))
    })
    .await;
    // The hub reads the index of schemas again every discoveryInterval (2 s for the tests' hubs).
    tokio::time::sleep(Duration::from_secs(3)).await;
    w.thing("g", json!({"group": group, "round": 2})).await;
    eventually(Duration::from_secs(30), || async {
        growths.get_opt("g-g").await.unwrap().filter(|g| g.data["spec"] == json!({"size": 1, "colour": "red"}))
    })
    .await;

    let crds =
        kube::Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(
            w.client.clone(),
        );
    let _ = crds.delete(&format!("growths.{group}"), &Default::default()).await;
    w.finish("CompositeController").await;
}
