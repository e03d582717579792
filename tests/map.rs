//! MapController against the real control plane, with hooks as real Python processes: one map call per
//! input, outputs tagged by input, detached outputs deleted or kept by a tombstone answer, the status
//! the hub aggregates, a refused answer that writes nothing for its input only, and a hub killed mid-way.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{World, api, apply_value, eventually};

const WAIT: Duration = Duration::from_secs(60);
const MAP_KEY: &str = "metahook.dev/map-key";

/// Each input ConfigMap becomes a ConfigMap `<name>-copy` with its data and labels, and a Thing
/// `<name>-thing`; an input labelled `break: "yes"` gets an answer the hub must refuse (an output of a
/// type the controller does not declare).
const COPY: &str = r#"
def map(req):
    cm = req["input"]
    name = cm["metadata"]["name"]
    if cm["metadata"].get("labels", {}).get("break") == "yes":
        return {"outputs": [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name + "-secret"}}]}
    labels = dict(cm["metadata"].get("labels", {}))
    return {"outputs": [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name + "-copy", "labels": labels},
         "data": cm.get("data", {})},
        {"apiVersion": "test.metahook.dev/v1", "kind": "Thing", "metadata": {"name": name + "-thing"},
         "spec": {"from": name}},
    ]}
"#;

fn label(obj: &DynamicObject, key: &str) -> Option<String> {
    obj.metadata.labels.as_ref()?.get(key).cloned()
}

/// The test's MapController: parents are Things labelled `role: parent` (and for this test); inputs
/// ConfigMaps; outputs ConfigMaps and Things.
async fn map_controller(w: &World, hooks: Value) -> DynamicObject {
    let outputs = json!([
        {"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}},
        {"apiVersion": "test.metahook.dev/v1", "resource": "things", "updateStrategy": {"method": "InPlace"}},
    ]);
    map_controller_with(w, outputs, hooks).await
}

/// [`map_controller`] with other `outputs` (its `outputResources`).
async fn map_controller_with(w: &World, outputs: Value, hooks: Value) -> DynamicObject {
    w.controller(
        "MapController",
        &w.label,
        json!({
            "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things",
                               "labelSelector": {"matchLabels": {"metahook-test": w.label, "role": "parent"}}},
            "inputResources": [{"apiVersion": "v1", "resource": "configmaps"}],
            "outputResources": outputs,
            "hooks": hooks,
        }),
    )
    .await
}

/// An input ConfigMap `name` in the test's namespace labelled `role: input` (and `more`), with `data`.
async fn input(w: &World, name: &str, more: Value, data: Value) -> DynamicObject {
    let mut labels = json!({"role": "input"});
    for (k, v) in more.as_object().into_iter().flatten() {
        labels[k] = v.clone();
    }
    apply_value(
        &w.client,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": w.ns.name, "labels": labels}, "data": data}),
    )
    .await
}

/// The map requests received so far for the input `name`.
fn map_calls(w: &World, name: &str) -> usize {
    w.hook.requests("/map").iter().filter(|r| r["input"]["metadata"]["name"] == name).count()
}

/// The parent Thing `p`, selecting the inputs labelled `role: input`.
async fn parent(w: &World) -> DynamicObject {
    w.thing_labelled("p", &json!({"role": "parent"}), json!({"selector": {"matchLabels": {"role": "input"}}})).await
}

#[tokio::test]
async fn each_input_is_mapped_once_to_its_tagged_outputs_and_changes_removals_and_drift_follow() {
    let w = World::new("map-basic", COPY).await;
    map_controller(&w, json!({"map": {"webhook": {"url": w.hook.url("/map")}}})).await;
    // An input elsewhere that the parent's selector would select: a parent reads only its own namespace.
    let elsewhere = support::TestNamespace::create(&w.client, "map-elsewhere").await;
    let elsewhere_cms = api(&w.client, "v1", "ConfigMap", Some(&elsewhere.name)).await;
    elsewhere_cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "far", "labels": {"role": "input"}}, "data": {"v": "far"}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let a = input(&w, "a", json!({}), json!({"v": "1"})).await;
    input(&w, "b", json!({}), json!({"v": "1"})).await;
    input(&w, "c", json!({"role": "other"}), json!({"v": "1"})).await;
    let p = parent(&w).await;
    let cms = w.config_maps().await;
    let things = w.things().await;

    let a_copy = eventually(WAIT, || async { cms.get_opt("a-copy").await.unwrap() }).await;
    eventually(WAIT, || async { cms.get_opt("b-copy").await.unwrap() }).await;
    eventually(WAIT, || async { things.get_opt("a-thing").await.unwrap() }).await;
    eventually(WAIT, || async { things.get_opt("b-thing").await.unwrap() }).await;
    assert_eq!(label(&a_copy, MAP_KEY), a.metadata.uid, "an output is tagged with its input's UID");
    let owner = &a_copy.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(Some(&owner.uid), p.metadata.uid.as_ref(), "the parent owns its outputs");
    assert_eq!(owner.controller, Some(true));
    assert_eq!(a_copy.data["data"]["v"], "1");
    let status = eventually(WAIT, || async {
        let p = things.get("p").await.unwrap();
        (p.data["status"]["outputs"]["configmaps"]["total"] == 2).then_some(p.data["status"].clone())
    })
    .await;
    assert_eq!(status["inputs"]["configmaps"]["total"], 2, "{status}");
    assert_eq!(status["outputs"]["things"]["total"], 2, "{status}");

    // Let every echo settle, then change one input: only it is asked again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let b_before = map_calls(&w, "b");
    let a_before = map_calls(&w, "a");
    let b_copy = cms.get("b-copy").await.unwrap();
    input(&w, "a", json!({}), json!({"v": "2"})).await;
    eventually(WAIT, || async { cms.get("a-copy").await.ok().filter(|c| c.data["data"]["v"] == "2") }).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(map_calls(&w, "a") > a_before, "the changed input is asked");
    assert_eq!(map_calls(&w, "b"), b_before, "an input whose request did not change is not asked again");
    assert_eq!(
        cms.get("b-copy").await.unwrap().metadata.resource_version,
        b_copy.metadata.resource_version,
        "another input's outputs are not written"
    );

    // No output of an output: the parent's own objects are never its inputs, though they match.
    assert!(cms.get_opt("a-copy-copy").await.unwrap().is_none());
    assert!(w.hook.requests("/map").iter().all(|r| r["input"]["metadata"]["name"] != "a-copy"));
    assert!(w.hook.requests("/map").iter().all(|r| r["input"]["metadata"]["name"] != "c"), "not selected");
    assert!(w.hook.requests("/map").iter().all(|r| r["input"]["metadata"]["name"] != "far"), "another namespace");
    assert!(elsewhere_cms.get_opt("far-copy").await.unwrap().is_none());
    // The request carries the input's outputs, and only them.
    let last = w.hook.requests("/map").into_iter().rev().find(|r| r["input"]["metadata"]["name"] == "a").unwrap();
    assert_eq!(last["mapKey"], json!(a.metadata.uid));
    let shown: BTreeSet<String> = last["outputs"]["ConfigMap.v1"].as_object().unwrap().keys().cloned().collect();
    assert_eq!(shown, BTreeSet::from(["a-copy".to_owned()]), "{last}");

    // A condition on an output is counted in the parent's status.
    things
        .patch_status(
            "a-thing",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})),
        )
        .await
        .unwrap();
    eventually(WAIT, || async {
        let p = things.get("p").await.unwrap();
        (p.data["status"]["outputs"]["things"]["ready"] == 1).then_some(())
    })
    .await;

    // Drift is put back.
    cms.patch("a-copy", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "tampered"}}))).await.unwrap();
    eventually(WAIT, || async { cms.get("a-copy").await.ok().filter(|c| c.data["data"]["v"] == "2") }).await;

    // An input added changes the counts the hub writes in the parent's status, yet only it is asked:
    // the counts are the hub's, and requests show the parent without its status (or resourceVersion).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (a_before, b_before) = (map_calls(&w, "a"), map_calls(&w, "b"));
    input(&w, "d", json!({}), json!({"v": "1"})).await;
    eventually(WAIT, || async { cms.get_opt("d-copy").await.unwrap() }).await;
    eventually(WAIT, || async {
        let p = things.get("p").await.unwrap();
        (p.data["status"]["inputs"]["configmaps"]["total"] == 3).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!((map_calls(&w, "a"), map_calls(&w, "b")), (a_before, b_before), "the status write asked again");
    let last = w.hook.requests("/map").into_iter().rev().find(|r| r["input"]["metadata"]["name"] == "d").unwrap();
    assert!(last["parent"].get("status").is_none(), "{}", last["parent"]);
    assert!(last["parent"]["metadata"].get("resourceVersion").is_none(), "{}", last["parent"]);
    assert_eq!(last["parent"]["metadata"]["uid"], json!(p.metadata.uid));
    // A change of the parent, which every request shows, asks every input again.
    let d_before = map_calls(&w, "d");
    things
        .patch("p", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})))
        .await
        .unwrap();
    eventually(WAIT, || async {
        (map_calls(&w, "a") > a_before && map_calls(&w, "b") > b_before && map_calls(&w, "d") > d_before).then_some(())
    })
    .await;
    cms.delete("d", &DeleteParams::default()).await.unwrap();
    support::gone(&cms, "d-copy", WAIT).await;

    // An input removed: its outputs are detached, and deleted (no tombstone hook).
    cms.delete("b", &DeleteParams::default()).await.unwrap();
    support::gone(&cms, "b-copy", WAIT).await;
    support::gone(&things, "b-thing", WAIT).await;
    eventually(WAIT, || async {
        let p = things.get("p").await.unwrap();
        (p.data["status"]["inputs"]["configmaps"]["total"] == 1
            && p.data["status"]["outputs"]["configmaps"]["total"] == 1)
            .then_some(())
    })
    .await;
    assert!(cms.get_opt("a-copy").await.unwrap().is_some(), "the other input's outputs stay");
    // An input that is no longer selected is detached too.
    input(&w, "a", json!({"role": "gone"}), json!({"v": "2"})).await;
    support::gone(&cms, "a-copy", WAIT).await;
    elsewhere.delete().await;
    w.finish("MapController").await;
}

#[tokio::test]
async fn a_refused_answer_writes_nothing_for_its_input_while_the_others_go_on_and_it_backs_off() {
    let w = World::new("map-refused", COPY).await;
    map_controller(&w, json!({"map": {"webhook": {"url": w.hook.url("/map")}}})).await;
    input(&w, "good", json!({}), json!({"v": "1"})).await;
    input(&w, "bad", json!({}), json!({"v": "1"})).await;
    parent(&w).await;
    let cms = w.config_maps().await;
    let things = w.things().await;
    eventually(WAIT, || async { cms.get_opt("good-copy").await.unwrap() }).await;
    let bad_copy = eventually(WAIT, || async { cms.get_opt("bad-copy").await.unwrap() }).await;
    let bad_thing = eventually(WAIT, || async { things.get_opt("bad-thing").await.unwrap() }).await;

    // The hook now answers something the hub refuses, for `bad` only.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = map_calls(&w, "bad");
    input(&w, "bad", json!({"break": "yes"}), json!({"v": "2"})).await;
    input(&w, "good", json!({}), json!({"v": "2"})).await;
    eventually(WAIT, || async { cms.get("good-copy").await.ok().filter(|c| c.data["data"]["v"] == "2") }).await;
    let warning =
        support::warning_eventually(&w.client, &w.ns.name, "p", WAIT, |m| m.contains("bad") && m.contains("Secret"))
            .await;
    assert!(warning.contains("1 of 2 inputs refused"), "{warning}");
    // Issue 62: a MapController has outputs, and says so.
    assert!(warning.contains("v1/Secret is not a declared output resource"), "{warning}");
    tokio::time::sleep(Duration::from_secs(8)).await;
    let again = map_calls(&w, "bad") - before;
    // Backoff from 5 ms doubling: about 11 attempts in 10 s, where a hot loop would make hundreds.
    assert!((2..=16).contains(&again), "the refused input is retried with backoff: {again} calls in ~10 s");
    let copy = cms.get("bad-copy").await.unwrap();
    assert_eq!(copy.metadata.resource_version, bad_copy.metadata.resource_version, "its outputs are untouched");
    assert_eq!(copy.data["data"]["v"], "1");
    let thing = things.get("bad-thing").await.unwrap();
    assert_eq!(thing.metadata.resource_version, bad_thing.metadata.resource_version);
    assert!(cms.get_opt("good-copy").await.unwrap().is_some());

    // Mended: its answer is written.
    input(&w, "bad", json!({}), json!({"v": "3"})).await;
    eventually(WAIT, || async { cms.get("bad-copy").await.ok().filter(|c| c.data["data"]["v"] == "3") }).await;
    w.finish("MapController").await;
}

/// The map hook makes `<name>-keep` and `<name>-drop` for each input; the tombstone hook keeps the
/// `-keep` ones.
const SNAPSHOTS: &str = r#"
def map(req):
    name = req["input"]["metadata"]["name"]
    return {"outputs": [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name + "-keep"}, "data": {"of": name}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name + "-drop"}, "data": {"of": name}},
    ]}

def tombstone(req):
    kept = [o for o in req["outputs"].get("ConfigMap.v1", {}).values() if o["metadata"]["name"].endswith("-keep")]
    return {"outputs": kept}
"#;

/// The input `x` and the parent, once the hook of [`SNAPSHOTS`] has both `x-keep` and `x-drop`
/// written: the input and `x-keep`.
async fn keep_and_drop_x(w: &World, cms: &kube::Api<DynamicObject>) -> (DynamicObject, DynamicObject) {
    let x = input(w, "x", json!({}), json!({})).await;
    parent(w).await;
    let kept = eventually(WAIT, || async { cms.get_opt("x-keep").await.unwrap() }).await;
    eventually(WAIT, || async { cms.get_opt("x-drop").await.unwrap() }).await;
    (x, kept)
}

#[tokio::test]
async fn a_tombstone_answer_keeps_detached_outputs_and_a_hub_killed_mid_way_loses_and_duplicates_nothing() {
    let mut w = World::new("map-tombstone", SNAPSHOTS).await;
    w.stop_hub().await;
    tombstone_controller(&w).await;
    let mut hub = Some(support::HubProcess::start(&w.label));
    let cms = w.config_maps().await;
    let (_, kept) = keep_and_drop_x(&w, &cms).await;
    let x = cms.get("x").await.unwrap();
    cms.delete("x", &DeleteParams::default()).await.unwrap();
    support::gone(&cms, "x-drop", WAIT).await;
    let tombstone = eventually(WAIT, || async { w.hook.requests("/tombstone").into_iter().next() }).await;
    assert_eq!(tombstone["mapKey"], json!(x.metadata.uid));
    let still = cms.get("x-keep").await.unwrap();
    assert_eq!(still.metadata.resource_version, kept.metadata.resource_version, "a kept output is not written");
    assert_eq!(label(&still, MAP_KEY), x.metadata.uid, "and keeps its tag");

    // 20 inputs at once, the hub killed 0.4 s in; an input deleted while it is down.
    for i in 0..20 {
        input(&w, &format!("in-{i}"), json!({}), json!({})).await;
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    hub.take().unwrap().kill();
    cms.delete("in-0", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    hub = Some(support::HubProcess::start(&w.label));
    let p = w.things().await.get("p").await.unwrap();
    let owned = || async {
        let list = cms.list(&Default::default()).await.unwrap();
        list.items
            .into_iter()
            .filter(|c| c.metadata.owner_references.iter().flatten().any(|o| Some(&o.uid) == p.metadata.uid.as_ref()))
            .map(|c| c.metadata.name.unwrap())
            .collect::<BTreeSet<_>>()
    };
    let mut expected: BTreeSet<String> =
        (1..20).flat_map(|i| [format!("in-{i}-keep"), format!("in-{i}-drop")]).collect();
    expected.insert("x-keep".into());
    let settled = eventually(WAIT, || async {
        let now = owned().await;
        // `in-0-keep` may be there (kept by the tombstone) if the dead hub made it; `in-0-drop` may not.
        let mut without = now.clone();
        without.remove("in-0-keep");
        (without == expected).then_some(now)
    })
    .await;
    assert!(!settled.contains("in-0-drop"));
    for name in &expected {
        let output = cms.get(name).await.unwrap();
        let input = name.trim_end_matches("-keep").trim_end_matches("-drop");
        if input != "x" {
            let uid = cms.get(input).await.unwrap().metadata.uid;
            assert_eq!(label(&output, MAP_KEY), uid, "{name} is tagged with its own input");
        }
    }
    let status = eventually(WAIT, || async {
        let p = w.things().await.get("p").await.unwrap();
        (p.data["status"]["inputs"]["configmaps"]["total"] == 19).then_some(p.data["status"].clone())
    })
    .await;
    assert_eq!(status["outputs"]["configmaps"]["total"], json!(settled.len()), "{status}");
    drop(hub);
    w.finish("MapController").await;
}

#[tokio::test]
async fn a_finalize_hook_holds_the_parent_until_it_answers() {
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("release");
    let handlers = format!(
        "import os\n\ndef map(req):\n    return {{\"outputs\": []}}\n\n\
         def finalize(req):\n    return {{\"finalized\": os.path.exists({:?})}}\n",
        release.display().to_string()
    );
    let w = World::new("map-finalize", &handlers).await;
    map_controller(
        &w,
        json!({"map": {"webhook": {"url": w.hook.url("/map")}}, "finalize": {"webhook": {"url": w.hook.url("/finalize")}}}),
    )
    .await;
    parent(&w).await;
    let things = w.things().await;
    let finalizer = format!("metacontroller.io/mapcontroller-{}", w.label);
    eventually(WAIT, || async {
        things.get("p").await.unwrap().metadata.finalizers.filter(|f| f.contains(&finalizer))
    })
    .await;
    things.delete("p", &DeleteParams::default()).await.unwrap();
    eventually(WAIT, || async { (!w.hook.requests("/finalize").is_empty()).then_some(()) }).await;
    assert_eq!(w.hook.requests("/finalize")[0]["finalizing"], true);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(things.get_opt("p").await.unwrap().is_some(), "held while the hook says not finalized");
    std::fs::write(&release, "").unwrap();
    // A hook that has not finalized is asked again on a change: the test makes one.
    things
        .patch("p", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"poke": "1"}}})))
        .await
        .unwrap();
    support::gone(&things, "p", WAIT).await;
    w.finish("MapController").await;
}

#[tokio::test]
async fn a_namespaced_parent_with_a_cluster_scoped_input_type_is_refused() {
    let w = World::new("map-refuse", COPY).await;
    let controllers = w.controllers("MapController").await;
    w.controller(
        "MapController",
        &w.label,
        json!({
            "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
            "inputResources": [{"apiVersion": "v1", "resource": "namespaces"}],
            "outputResources": [{"apiVersion": "v1", "resource": "configmaps"}],
            "hooks": {"map": {"webhook": {"url": w.hook.url("/map")}}},
        }),
    )
    .await;
    let reason = eventually(WAIT, || async {
        let mc = controllers.get(&w.label).await.unwrap();
        let ready = mc.data["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "Ready")?.clone();
        (ready["status"] == "False").then(|| ready["reason"].as_str().unwrap_or_default().to_owned())
    })
    .await;
    assert_eq!(reason, "UnsupportedMapSpec");
    assert!(w.hook.requests("/map").is_empty());
    w.finish("MapController").await;
}

/// A GET of `/metrics` on the hub at `address`.
async fn scrape(address: &str) -> Option<String> {
    support::http_get(address, "/metrics").await.map(|(_, body)| body)
}

/// The sum of the samples of `family` whose labels contain all of `labels`.
fn sum(metrics: &str, family: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|line| line.starts_with(&format!("{family}{{")) && labels.iter().all(|l| line.contains(l)))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_map_controllers_syncs_calls_and_saved_calls_are_in_the_metrics() {
    let mut w = World::new("map-metrics", COPY).await;
    w.stop_hub().await;
    let address = {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        format!("127.0.0.1:{port}")
    };
    let client = w.client.clone();
    w.start_hub_with(&client, metahook::ops::config::Config { metrics_address: address.clone(), ..Default::default() });
    map_controller(&w, json!({"map": {"webhook": {"url": w.hook.url("/map")}}})).await;
    for name in ["a", "b", "c"] {
        input(&w, name, json!({}), json!({"v": "1"})).await;
    }
    parent(&w).await;
    let cms = w.config_maps().await;
    for name in ["a-copy", "b-copy", "c-copy"] {
        eventually(WAIT, || async { cms.get_opt(name).await.unwrap() }).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    input(&w, "a", json!({}), json!({"v": "2"})).await;
    eventually(WAIT, || async { cms.get("a-copy").await.ok().filter(|c| c.data["data"]["v"] == "2") }).await;
    let controller = format!("controller=\"mapcontroller/{}\"", w.label);
    let hook = format!("controller=\"{}\"", w.label);
    let metrics = eventually(WAIT, || async {
        let metrics = scrape(&address).await?;
        let saved = ["kind=\"MapController\"", hook.as_str(), "why=\"identical_request\""];
        (sum(&metrics, "metahook_hook_calls_saved_total", &saved) >= 2.0).then_some(metrics)
    })
    .await;
    assert!(sum(&metrics, "controller_runtime_reconcile_total", &[&controller, "result=\"success\""]) >= 1.0);
    // Every call the hook saw is counted. Read together, as the hub may be making one more (an echo's
    // sync) between the scrape and the hook's count: the two agree once it is done.
    let map_calls = ["kind=\"MapController\"", hook.as_str(), "hook=\"map\""];
    eventually(WAIT, || async {
        let metrics = scrape(&address).await?;
        let calls = sum(&metrics, "metahook_hook_requests_total", &map_calls);
        (calls as usize == w.hook.requests("/map").len()).then_some(())
    })
    .await;
    w.finish("MapController").await;
}

/// Issue 61 item 7: under a percentage guard (`"50%"`), the share is of all the parent's outputs, not
/// of the outputs of the one input whose removal a sync is about: one input of ten removed deletes its
/// outputs (2 of 20), with no refusal.
#[tokio::test]
async fn a_percentage_guard_takes_its_share_of_all_the_parents_outputs_not_of_one_inputs() {
    let w = World::new("map-guard", COPY).await;
    let mut controller = json!({"apiVersion": support::CONTROLLERS, "kind": "MapController",
    "metadata": {"name": w.label, "labels": {"metahook-test": w.label},
                 "annotations": {"metahook.dev/max-deletions-per-sync": "50%"}},
    "spec": {
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things",
                           "labelSelector": {"matchLabels": {"metahook-test": w.label, "role": "parent"}}},
        "inputResources": [{"apiVersion": "v1", "resource": "configmaps"}],
        "outputResources": [
            {"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}},
            {"apiVersion": "test.metahook.dev/v1", "resource": "things", "updateStrategy": {"method": "InPlace"}},
        ],
    }});
    controller["spec"]["hooks"] = json!({"map": {"webhook": {"url": w.hook.url("/map")}}});
    apply_value(&w.client, &controller).await;
    let names: Vec<String> = (0..10).map(|i| format!("in{i}")).collect();
    for name in &names {
        input(&w, name, json!({}), json!({"v": "1"})).await;
    }
    parent(&w).await;
    let cms = w.config_maps().await;
    for name in &names {
        eventually(WAIT, || async { cms.get_opt(&format!("{name}-copy")).await.unwrap() }).await;
    }
    cms.delete("in0", &DeleteParams::default()).await.unwrap();
    let things = w.things().await;
    eventually(WAIT, || async {
        let copy = cms.get_opt("in0-copy").await.unwrap();
        let thing = things.get_opt("in0-thing").await.unwrap();
        (copy.is_none() && thing.is_none()).then_some(())
    })
    .await;
    let warnings = support::warnings_for(&w.client, &w.ns.name, "p").await;
    assert!(warnings.iter().all(|m| !m.contains("sync would delete")), "{warnings:?}");
    assert!(cms.get_opt("in1-copy").await.unwrap().is_some());
    w.finish("MapController").await;
}

/// The map and tombstone hooks of [`SNAPSHOTS`], the tombstone failing for every group.
const BROKEN_TOMBSTONE: &str = r#"
def map(req):
    name = req["input"]["metadata"]["name"]
    return {"outputs": [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name + "-keep"}, "data": {"of": name}},
    ]}

def tombstone(req):
    raise RuntimeError("the tombstone hook is broken")
"#;

/// The test's MapController over ConfigMap inputs and outputs, with a tombstone hook.
async fn tombstone_controller(w: &World) {
    let hooks = json!({"map": {"webhook": {"url": w.hook.url("/map")}},
                       "tombstone": {"webhook": {"url": w.hook.url("/tombstone")}}});
    map_controller_with(w, json!([{"apiVersion": "v1", "resource": "configmaps"}]), hooks).await;
}

/// Issue 62: an input deleted and created again under the same name is a new input (a new UID), and
/// the output the tombstone hook kept for the first keeps its name for it: never handed over, nor
/// edited (the design's rule). The new input waits — nothing of its answer is written, not even the
/// output no one holds — said once by a Warning Event `OutputKept`, not failed and retried with backoff
/// (which kept it blocked and retrying for good); once the kept output is gone, the new input gets
/// its outputs at once.
#[tokio::test]
async fn a_re_created_input_waits_for_the_output_the_tombstone_keeps_and_gets_it_once_it_is_gone() {
    let w = World::new("map-re-created", SNAPSHOTS).await;
    tombstone_controller(&w).await;
    let cms = w.config_maps().await;
    let (first, kept) = keep_and_drop_x(&w, &cms).await;
    cms.delete("x", &DeleteParams::default()).await.unwrap();
    support::gone(&cms, "x-drop", WAIT).await;

    // x again: a new input, asking for x-keep (kept for the first x) and x-drop (free).
    let before = map_calls(&w, "x");
    let second = input(&w, "x", json!({}), json!({})).await;
    assert_ne!(second.metadata.uid, first.metadata.uid);
    let said = support::warning_eventually(&w.client, &w.ns.name, "p", WAIT, |m| m.starts_with("OutputKept:")).await;
    assert!(said.contains("x-keep") && said.contains(first.metadata.uid.as_deref().unwrap()), "{said}");
    tokio::time::sleep(Duration::from_secs(8)).await;
    let calls = map_calls(&w, "x") - before;
    assert!((1..=4).contains(&calls), "the waiting input is asked as the parent is synced, not retried: {calls}");
    let warnings = support::warnings_for(&w.client, &w.ns.name, "p").await;
    assert!(!warnings.iter().any(|m| m.starts_with("SyncError:")), "waiting is no failed sync: {warnings:#?}");
    let still = cms.get("x-keep").await.unwrap();
    assert_eq!(still.metadata.resource_version, kept.metadata.resource_version, "the kept output is not written");
    assert_eq!(label(&still, MAP_KEY), first.metadata.uid, "nor handed to the new input");
    assert!(cms.get_opt("x-drop").await.unwrap().is_none(), "nothing of the waiting input's answer is written");

    // The kept output deleted (by its owner's decision): the new input gets both, tagged as its own.
    cms.delete("x-keep", &DeleteParams::default()).await.unwrap();
    for name in ["x-keep", "x-drop"] {
        let made = eventually(WAIT, || async {
            cms.get_opt(name).await.unwrap().filter(|o| label(o, MAP_KEY) == second.metadata.uid)
        })
        .await;
        assert_ne!(made.metadata.uid, kept.metadata.uid, "{name} is made for the new input");
    }
    w.finish("MapController").await;
}

/// Issue 62: the Warning of a sync whose tombstone call failed counts groups of detached outputs as
/// such, not as inputs ("1 of 3 inputs refused" for two inputs and a group).
#[tokio::test]
async fn a_failed_tombstone_call_is_counted_as_a_group_of_detached_outputs_not_as_an_input() {
    let w = World::new("map-tombstone-count", BROKEN_TOMBSTONE).await;
    tombstone_controller(&w).await;
    let cms = w.config_maps().await;
    for name in ["a", "b", "c"] {
        input(&w, name, json!({}), json!({})).await;
    }
    parent(&w).await;
    for name in ["a-keep", "b-keep", "c-keep"] {
        eventually(WAIT, || async { cms.get_opt(name).await.unwrap() }).await;
    }
    let c = cms.get("c").await.unwrap();
    cms.delete("c", &DeleteParams::default()).await.unwrap();
    let warning =
        support::warning_eventually(&w.client, &w.ns.name, "p", WAIT, |m| m.contains("the tombstone hook is broken"))
            .await;
    let group = format!(
        "1 of 1 groups of detached outputs refused, left as they are: detached outputs of {}",
        c.metadata.uid.unwrap()
    );
    assert!(warning.contains(&group), "{warning}");
    assert!(!warning.contains("inputs refused"), "no input was refused: {warning}");
    assert!(cms.get_opt("c-keep").await.unwrap().is_some(), "left as it is");
    w.finish("MapController").await;
}
