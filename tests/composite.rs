//! CompositeController engine against the real control plane, with hooks as real Python processes.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use support::{HookServer, World, api, apply_value, eventually, warnings_for};

const WAIT: Duration = Duration::from_secs(60);

impl World {
    /// Names of ConfigMaps in the namespace controlled by something (ignores kube-root-ca.crt).
    async fn owned_config_maps(&self) -> BTreeSet<String> {
        self.config_maps()
            .await
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|cm| cm.metadata.owner_references.as_ref().is_some_and(|r| !r.is_empty()))
            .filter_map(|cm| cm.metadata.name)
            .collect()
    }
}

fn sync_spec(hook: &HookServer, child_method: &str) -> Value {
    json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": child_method}}],
        "hooks": {"sync": {"webhook": {"url": hook.url("/sync")}}},
    })
}

/// One ConfigMap per parent carrying `spec.greeting`; status counts observed ConfigMaps.
const GREETER: &str = r#"
def sync(req):
    parent = req["parent"]
    cms = req["children"]["ConfigMap.v1"]
    return {
        "status": {"configMaps": len(cms), "keys": sorted(cms)},
        "children": [{"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": parent["metadata"]["name"] + "-cm"},
                      "data": {"greeting": parent["spec"].get("greeting", "hi")}}],
    }
"#;

fn data(obj: &DynamicObject, key: &str) -> Option<String> {
    obj.data.pointer(&format!("/data/{key}")).and_then(Value::as_str).map(str::to_owned)
}

#[tokio::test]
async fn sync_creates_children_and_status_with_observed_generation() {
    let w = World::new("sync-creates", GREETER).await;
    w.composite(sync_spec(&w.hook, "InPlace")).await;
    let parent = w.thing("one", json!({"greeting": "hello"})).await;

    let cm = eventually(WAIT, || async { w.config_map("one-cm").await }).await;
    assert_eq!(data(&cm, "greeting").as_deref(), Some("hello"));
    let owner = &cm.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(Some(owner.uid.clone()), parent.metadata.uid);
    assert_eq!((owner.controller, owner.block_owner_deletion), (Some(true), Some(true)));
    assert_eq!(cm.metadata.labels.as_ref().unwrap()["controller-uid"], owner.uid, "generateSelector label");

    let status = eventually(WAIT, || async {
        let p = w.things().await.get("one").await.unwrap();
        (p.data["status"]["configMaps"] == 1).then(|| p.data["status"].clone())
    })
    .await;
    assert_eq!(status["observedGeneration"], 1);

    w.thing("one", json!({"greeting": "bonjour"})).await;
    eventually(WAIT, || async {
        w.config_map("one-cm").await.filter(|c| data(c, "greeting").as_deref() == Some("bonjour"))
    })
    .await;
    eventually(WAIT, || async {
        (w.things().await.get("one").await.unwrap().data["status"]["observedGeneration"] == 2).then_some(())
    })
    .await;
    w.finish("CompositeController").await;
}

/// Echoes the children keys it receives into status, so the test can see the wire format.
const KEY_ECHO: &str = r#"
def sync(req):
    parent = req["parent"]
    ns = parent["metadata"].get("namespace") or parent["spec"]["childNamespace"]
    child = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": parent["metadata"]["name"] + "-cm"}}
    if not parent["metadata"].get("namespace"):
        child["metadata"]["namespace"] = ns
    return {"status": {"keys": sorted(req["children"]["ConfigMap.v1"]),
                       "types": sorted(req["children"])},
            "children": [child]}
"#;

#[tokio::test]
async fn children_are_keyed_by_name_in_v1_and_namespace_slash_name_in_v2() {
    let w = World::new("keys-v1-v2", KEY_ECHO).await;
    let ns = w.ns.name.clone();
    for (version, parent_kind, resource) in
        [("v1", "Thing", "things"), ("v2", "Thing", "things"), ("v1", "ClusterThing", "clusterthings")]
    {
        let cc_name = format!("{}-{version}-{resource}", w.label);
        w.controller(
            "CompositeController",
            &cc_name,
            json!({
                "generateSelector": true,
                "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": resource,
                                   "labelSelector": {"matchLabels": {"proto": version, "test": w.label}}},
                "childResources": [{"apiVersion": "v1", "resource": "configmaps"}, {"apiVersion": "v1", "resource": "secrets"}],
                "hooks": {"sync": {"version": version, "webhook": {"url": w.hook.url("/sync")}}},
            }),
        )
        .await;
        let mut parent = json!({"apiVersion": "test.metahook.dev/v1", "kind": parent_kind,
            "metadata": {"name": format!("p-{version}-{}", parent_kind.to_lowercase()), "labels": {"proto": version, "test": w.label}},
            "spec": {"childNamespace": ns}});
        if parent_kind == "Thing" {
            parent["metadata"]["namespace"] = json!(ns);
        }
        let created = apply_value(&w.client, &parent).await;
        let name = created.metadata.name.clone().unwrap();
        let parents = api(&w.client, "test.metahook.dev/v1", parent_kind, created.metadata.namespace.as_deref()).await;
        let status = eventually(WAIT, || async {
            let p = parents.get(&name).await.unwrap();
            (p.data["status"]["keys"].as_array().is_some_and(|k| !k.is_empty())).then(|| p.data["status"].clone())
        })
        .await;
        let expected_key = match (version, parent_kind) {
            ("v1", "Thing") => format!("{name}-cm"),
            _ => format!("{ns}/{name}-cm"),
        };
        assert_eq!(status["keys"], json!([expected_key]), "{version} keys for a {parent_kind} parent");
        assert_eq!(status["types"], json!(["ConfigMap.v1", "Secret.v1"]), "an entry per declared child type");
        if parent_kind == "ClusterThing" {
            parents.delete(&name, &DeleteParams::default()).await.unwrap();
        }
        let ccs = w.controllers("CompositeController").await;
        ccs.delete(&cc_name, &DeleteParams::default()).await.unwrap();
    }
    w.finish("CompositeController").await;
}

/// One child per declared type, each carrying `spec.version`.
const VERSIONED: &str = r#"
def sync(req):
    p = req["parent"]
    name, v = p["metadata"]["name"], p["spec"]["version"]
    return {"children": [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": v}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"v": v}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "annotations": {"v": v}}},
    ]}
"#;

#[tokio::test]
async fn update_strategies_update_in_place_recreate_or_wait_for_deletion() {
    let w = World::new("strategies", VERSIONED).await;
    w.composite(json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
        "childResources": [
            {"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}},
            {"apiVersion": "v1", "resource": "secrets", "updateStrategy": {"method": "Recreate"}},
            {"apiVersion": "v1", "resource": "serviceaccounts"},
        ],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    }))
    .await;
    w.thing("s", json!({"version": "1"})).await;
    let cms = w.config_maps().await;
    let secrets = api(&w.client, "v1", "Secret", Some(&w.ns.name)).await;
    let sas = api(&w.client, "v1", "ServiceAccount", Some(&w.ns.name)).await;
    let cm1 = eventually(WAIT, || async { cms.get_opt("s").await.unwrap() }).await;
    let secret1 = eventually(WAIT, || async { secrets.get_opt("s").await.unwrap() }).await;
    let sa1 = eventually(WAIT, || async { sas.get_opt("s").await.unwrap() }).await;

    w.thing("s", json!({"version": "2"})).await;
    let cm2 =
        eventually(WAIT, || async { cms.get_opt("s").await.unwrap().filter(|c| data(c, "v").as_deref() == Some("2")) })
            .await;
    assert_eq!(cm2.metadata.uid, cm1.metadata.uid, "InPlace keeps the object");
    let secret2 = eventually(WAIT, || async {
        secrets
            .get_opt("s")
            .await
            .unwrap()
            .filter(|s| s.metadata.uid != secret1.metadata.uid && s.metadata.deletion_timestamp.is_none())
    })
    .await;
    assert_eq!(secret2.data["data"]["v"], "Mg==", "Recreate makes a new object with the new data");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let sa_still = sas.get("s").await.unwrap();
    assert_eq!(sa_still.metadata.uid, sa1.metadata.uid, "OnDelete leaves the child alone");
    assert_eq!(sa_still.metadata.annotations.as_ref().unwrap()["v"], "1");

    sas.delete("s", &DeleteParams::default()).await.unwrap();
    let sa2 =
        eventually(WAIT, || async { sas.get_opt("s").await.unwrap().filter(|s| s.metadata.uid != sa1.metadata.uid) })
            .await;
    assert_eq!(sa2.metadata.annotations.as_ref().unwrap()["v"], "2", "OnDelete recreates with the new state");
    w.finish("CompositeController").await;
}

/// `spec.count` ConfigMaps.
const COUNTER: &str = r#"
def sync(req):
    p = req["parent"]
    n = p["spec"]["count"]
    return {"children": [{"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "%s-%d" % (p["metadata"]["name"], i)}, "data": {"k": "v"}}
                         for i in range(n)]}
"#;

#[tokio::test]
async fn children_missing_from_the_response_are_deleted() {
    let w = World::new("removed-children", COUNTER).await;
    w.composite(sync_spec(&w.hook, "InPlace")).await;
    w.thing("c", json!({"count": 3})).await;
    let all = BTreeSet::from(["c-0".to_owned(), "c-1".to_owned(), "c-2".to_owned()]);
    eventually(WAIT, || async { (w.owned_config_maps().await == all).then_some(()) }).await;
    w.thing("c", json!({"count": 1})).await;
    eventually(WAIT, || async { (w.owned_config_maps().await == BTreeSet::from(["c-0".to_owned()])).then_some(()) })
        .await;
    w.finish("CompositeController").await;
}

#[tokio::test]
async fn out_of_band_edits_are_reverted_under_in_place() {
    let w = World::new("revert-drift", GREETER).await;
    w.composite(sync_spec(&w.hook, "InPlace")).await;
    w.thing("d", json!({"greeting": "hello"})).await;
    let cms = w.config_maps().await;
    eventually(WAIT, || async { cms.get_opt("d-cm").await.unwrap() }).await;
    cms.patch("d-cm", &PatchParams::default(), &Patch::Merge(json!({"data": {"greeting": "tampered"}}))).await.unwrap();
    eventually(WAIT, || async {
        cms.get_opt("d-cm").await.unwrap().filter(|c| data(c, "greeting").as_deref() == Some("hello"))
    })
    .await;
    w.finish("CompositeController").await;
}

/// Desires exactly the ConfigMap named in `spec.want`, labelled to match `spec.selector`.
const SELECTOR_HOOK: &str = r#"
def sync(req):
    p = req["parent"]
    return {"status": {"observed": sorted(req["children"]["ConfigMap.v1"])},
            "children": [{"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": p["spec"]["want"], "labels": {"app": p["spec"]["app"]}},
                          "data": {"by": "hook"}}]}
"#;

#[tokio::test]
async fn matching_orphans_are_adopted_and_non_matching_children_released() {
    let w = World::new("adopt-release", SELECTOR_HOOK).await;
    let app = w.label.clone();
    let cms = w.config_maps().await;
    let orphan = apply_value(
        &w.client,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "orphan", "namespace": w.ns.name, "labels": {"app": app}}, "data": {"by": "someone"}}),
    )
    .await;
    let parent = w.thing("a", json!({"want": "orphan", "app": app, "selector": {"matchLabels": {"app": app}}})).await;
    let stray = apply_value(
        &w.client,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "stray", "namespace": w.ns.name, "labels": {"app": "other"},
                     "ownerReferences": [{"apiVersion": "test.metahook.dev/v1", "kind": "Thing", "name": "a",
                                          "uid": parent.metadata.uid, "controller": true}]}}),
    )
    .await;
    w.composite(json!({
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    }))
    .await;
    let adopted = eventually(WAIT, || async {
        cms.get("orphan").await.ok().filter(|c| {
            c.metadata
                .owner_references
                .as_ref()
                .is_some_and(|r| r.iter().any(|o| Some(&o.uid) == parent.metadata.uid.as_ref()))
        })
    })
    .await;
    assert_eq!(adopted.metadata.uid, orphan.metadata.uid, "adopted, not recreated");
    let released = eventually(WAIT, || async {
        cms.get("stray").await.ok().filter(|c| c.metadata.owner_references.as_ref().is_none_or(Vec::is_empty))
    })
    .await;
    assert_eq!(released.metadata.uid, stray.metadata.uid, "released, not deleted");
    eventually(WAIT, || async {
        (w.things().await.get("a").await.unwrap().data["status"]["observed"] == json!(["orphan"])).then_some(())
    })
    .await;
    w.finish("CompositeController").await;
}

/// Sync makes one ConfigMap; finalize deletes children and finishes once the parent is annotated `done`.
const FINALIZER_HOOK: &str = r#"
def sync(req):
    p = req["parent"]
    if req["finalizing"]:
        done = (p["metadata"].get("annotations") or {}).get("done") == "yes"
        return {"children": [], "finalized": done}
    return {"children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": p["metadata"]["name"] + "-cm"}}]}
"#;

#[tokio::test]
async fn finalize_hook_runs_until_it_reports_finalized() {
    let w = World::new("finalize", FINALIZER_HOOK).await;
    let mut spec = sync_spec(&w.hook, "InPlace");
    spec["hooks"]["finalize"] = json!({"webhook": {"url": w.hook.url("/sync")}});
    w.composite(spec).await;
    w.thing("f", json!({})).await;
    let things = w.things().await;
    let finalizer = format!("metacontroller.io/compositecontroller-{}", w.label);
    eventually(WAIT, || async {
        things.get("f").await.unwrap().metadata.finalizers.filter(|f| f.contains(&finalizer))
    })
    .await;
    eventually(WAIT, || async { w.config_map("f-cm").await }).await;

    things.delete("f", &DeleteParams::default()).await.unwrap();
    eventually(WAIT, || async { w.config_map("f-cm").await.is_none().then_some(()) }).await;
    assert!(w.hook.requests("/sync").iter().any(|r| r["finalizing"] == true));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(things.get_opt("f").await.unwrap().is_some(), "finalized: false keeps the parent");

    things
        .patch("f", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"done": "yes"}}})))
        .await
        .unwrap();
    eventually(WAIT, || async { things.get_opt("f").await.unwrap().is_none().then_some(()) }).await;
    w.finish("CompositeController").await;
}

const RESYNC_AFTER: &str = r#"
def sync(req):
    return {"children": [], "resyncAfterSeconds": 0.5}
"#;

#[tokio::test]
async fn resync_after_seconds_calls_the_hook_again() {
    let w = World::new("resync-after", RESYNC_AFTER).await;
    w.composite(sync_spec(&w.hook, "InPlace")).await;
    w.thing("r", json!({})).await;
    eventually(WAIT, || async { (w.hook.requests("/sync").len() >= 5).then_some(()) }).await;
    w.finish("CompositeController").await;
}

const QUIET: &str = r#"
def sync(req):
    return {"children": []}
"#;

#[tokio::test]
async fn resync_period_seconds_resyncs_every_parent() {
    let w = World::new("resync-period", QUIET).await;
    let mut spec = sync_spec(&w.hook, "InPlace");
    spec["resyncPeriodSeconds"] = json!(1);
    w.composite(spec).await;
    w.thing("r1", json!({})).await;
    w.thing("r2", json!({})).await;
    eventually(WAIT, || async {
        let requests = w.hook.requests("/sync");
        let per_parent = |n: &str| requests.iter().filter(|r| r["parent"]["metadata"]["name"] == n).count();
        (per_parent("r1") >= 4 && per_parent("r2") >= 4).then_some(())
    })
    .await;
    w.finish("CompositeController").await;
}

/// Behaves according to the parent's `spec.mode`; "ok" desires one ConfigMap.
const MISBEHAVING: &str = r#"
import time
def sync(req):
    p = req["parent"]
    mode = p["spec"]["mode"]
    good = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keep"}, "data": {"v": "1"}}
    if mode == "500":
        return (500, "boom")
    if mode == "timeout":
        time.sleep(3)
    if mode == "garbage":
        return (200, "this is not json")
    if mode == "undeclared":
        return {"children": [good, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "nope"}}]}
    if mode == "mismatch":
        return {"children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keep", "labels": {"controller-uid": "someone-else"}}}]}
    if mode == "badstatus":
        return {"status": "fine", "children": []}
    return {"status": {"mode": mode}, "children": [good]}
"#;

#[tokio::test]
async fn failing_or_invalid_hooks_leave_children_and_status_untouched() {
    let w = World::new("bad-hooks", MISBEHAVING).await;
    let mut spec = sync_spec(&w.hook, "InPlace");
    spec["hooks"]["sync"]["webhook"]["timeout"] = json!("1s");
    w.composite(spec).await;
    w.thing("b", json!({"mode": "ok"})).await;
    let before = eventually(WAIT, || async { w.config_map("keep").await }).await;
    let things = w.things().await;
    eventually(WAIT, || async { (things.get("b").await.unwrap().data["status"]["mode"] == "ok").then_some(()) }).await;

    for (mode, expected) in [
        ("500", "unsupported status code 500"),
        ("timeout", "timed out"),
        ("garbage", "not valid JSON"),
        ("undeclared", "not a declared child resource"),
        ("mismatch", "don't match parent selector"),
        ("badstatus", "status must be an object"),
    ] {
        w.thing("b", json!({"mode": mode})).await;
        eventually(WAIT, || async {
            warnings_for(&w.client, &w.ns.name, "b")
                .await
                .into_iter()
                .find(|e| e.starts_with("SyncError") && e.contains(expected))
        })
        .await;
        let after = w.config_map("keep").await.expect("child must survive a bad hook response");
        assert_eq!(after.metadata.uid, before.metadata.uid, "{mode}: child recreated");
        assert_eq!(data(&after, "v").as_deref(), Some("1"), "{mode}: child changed");
        let status = things.get("b").await.unwrap().data["status"].clone();
        assert_eq!(status["mode"], "ok", "{mode}: status must not change");
    }
    w.finish("CompositeController").await;
}

const SLOW: &str = r#"
import time
def sync(req):
    time.sleep(1.5)
    return {"children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "slow-%d" % i}} for i in range(3)]}
"#;

#[tokio::test]
async fn hub_restart_mid_sync_creates_no_duplicates() {
    let mut w = World::new("restart", SLOW).await;
    w.composite(sync_spec(&w.hook, "InPlace")).await;
    w.thing("x", json!({})).await;
    eventually(WAIT, || async { (!w.hook.requests("/sync").is_empty()).then_some(()) }).await;
    w.restart_hub().await; // the first sync was still waiting for the hook
    let want = BTreeSet::from(["slow-0".to_owned(), "slow-1".to_owned(), "slow-2".to_owned()]);
    eventually(WAIT, || async { (w.owned_config_maps().await == want).then_some(()) }).await;
    let uids = |items: Vec<DynamicObject>| items.into_iter().filter_map(|c| c.metadata.uid).collect::<BTreeSet<_>>();
    let first = uids(w.config_maps().await.list(&ListParams::default()).await.unwrap().items);
    w.restart_hub().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(w.owned_config_maps().await, want);
    let second = uids(w.config_maps().await.list(&ListParams::default()).await.unwrap().items);
    assert_eq!(first, second, "a restarted hub must not recreate existing children");
    w.finish("CompositeController").await;
}

/// What changed while no hub ran is put right when one starts: the start syncs every parent once (the
/// children's cache is not replayed as changes; the parents' replay must cover a child deleted, a child
/// edited by someone else, and a parent changed meanwhile).
#[tokio::test]
async fn changes_made_while_the_hub_was_down_are_put_right_when_it_starts() {
    let mut w = World::new("down-changes", GREETER).await;
    w.composite(sync_spec(&w.hook, "InPlace")).await;
    for name in ["a", "b", "c"] {
        w.thing(name, json!({"greeting": "hi"})).await;
    }
    let greeting = |cm: &DynamicObject| cm.data["data"]["greeting"].as_str().map(str::to_owned);
    for name in ["a-cm", "b-cm", "c-cm"] {
        eventually(WAIT, || async { w.config_map(name).await.filter(|cm| greeting(cm).as_deref() == Some("hi")) })
            .await;
    }
    w.stop_hub().await;
    let cms = w.config_maps().await;
    cms.delete("a-cm", &DeleteParams::default()).await.unwrap();
    eventually(WAIT, || async { w.config_map("a-cm").await.is_none().then_some(()) }).await;
    let someone = PatchParams { field_manager: Some("someone-else".into()), ..PatchParams::default() };
    cms.patch("b-cm", &someone, &Patch::Merge(json!({"data": {"greeting": "tampered"}}))).await.unwrap();
    w.thing("c", json!({"greeting": "hello"})).await;

    w.start_hub();
    for (name, want) in [("a-cm", "hi"), ("b-cm", "hi"), ("c-cm", "hello")] {
        let cm =
            eventually(WAIT, || async { w.config_map(name).await.filter(|cm| greeting(cm).as_deref() == Some(want)) })
                .await;
        let owner = cm.metadata.owner_references.unwrap_or_default();
        assert!(owner.iter().any(|r| r.controller == Some(true) && r.name == name.trim_end_matches("-cm")), "{name}");
    }
    w.finish("CompositeController").await;
}

const LABELLER: &str = r#"
def a(req):
    return {"children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": req["parent"]["metadata"]["name"]}, "data": {"hook": "a"}}]}
def b(req):
    return {"children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": req["parent"]["metadata"]["name"]}, "data": {"hook": "b"}}]}
"#;

#[tokio::test]
async fn spec_change_restarts_the_controller_and_deletion_stops_it() {
    let w = World::new("restart-on-spec", LABELLER).await;
    let mut spec = sync_spec(&w.hook, "InPlace");
    spec["hooks"]["sync"]["webhook"]["url"] = json!(w.hook.url("/a"));
    w.composite(spec.clone()).await;
    w.thing("one", json!({})).await;
    eventually(WAIT, || async { w.config_map("one").await.filter(|c| data(c, "hook").as_deref() == Some("a")) }).await;
    let ccs = w.controllers("CompositeController").await;
    let cc = ccs.get(&w.label).await.unwrap();
    assert_eq!(cc.data["status"]["conditions"][0]["status"], "True", "Ready condition");

    spec["hooks"]["sync"]["webhook"]["url"] = json!(w.hook.url("/b"));
    w.composite(spec).await;
    eventually(WAIT, || async { w.config_map("one").await.filter(|c| data(c, "hook").as_deref() == Some("b")) }).await;

    ccs.delete(&w.label, &DeleteParams::default()).await.unwrap();
    eventually(WAIT, || async { ccs.get_opt(&w.label).await.unwrap().is_none().then_some(()) }).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let calls = w.hook.requests("/b").len();
    w.thing("two", json!({})).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(w.config_map("two").await.is_none(), "a deleted controller must not sync");
    assert_eq!(w.hook.requests("/b").len(), calls, "a deleted controller must not call its hook");
    w.finish("CompositeController").await;
}

#[tokio::test]
async fn controllers_that_cannot_run_say_why_in_their_ready_condition() {
    let w = World::new("not-ready", QUIET).await;
    let ccs = w.controllers("CompositeController").await;
    for (suffix, parent, child, reason) in [
        (
            "missing",
            json!({"apiVersion": "nope.example.com/v1", "resource": "widgets"}),
            "configmaps",
            "ParentResourceNotFound",
        ),
        (
            "badchild",
            json!({"apiVersion": "test.metahook.dev/v1", "resource": "things"}),
            "gizmos",
            "ChildResourceNotFound",
        ),
        (
            "auth",
            json!({"apiVersion": "test.metahook.dev/v1", "resource": "things"}),
            "configmaps",
            "InvalidHookSetting",
        ),
    ] {
        let name = format!("{}-{suffix}", w.label);
        let mut webhook = json!({"url": w.hook.url("/sync")});
        if suffix == "auth" {
            // Settings Metacontroller refuses (here: two kinds of Authorization header at once) keep the
            // controller from running rather than leaving the choice to chance.
            webhook["basicAuth"] = json!({"secretRef": {"name": "creds", "namespace": "default"}});
            webhook["authorization"] = json!({"secretRef": {"name": "token", "namespace": "default", "key": "t"}});
        }
        let spec = json!({"parentResource": parent, "childResources": [{"apiVersion": "v1", "resource": child}],
                          "hooks": {"sync": {"webhook": webhook}}});
        w.controller("CompositeController", &name, spec).await;
        let condition = eventually(WAIT, || async {
            let cc = ccs.get(&name).await.unwrap();
            let c = cc.data["status"]["conditions"][0].clone();
            (c["reason"] == reason).then_some(c)
        })
        .await;
        assert_eq!(condition["status"], "False");
        assert!(!condition["message"].as_str().unwrap().is_empty());
        ccs.delete(&name, &DeleteParams::default()).await.unwrap();
    }
    w.finish("CompositeController").await;
}

/// A controller whose parents are Namespaces (a built-in type Metacontroller refuses, #714).
const NAMESPACE_HOOK: &str = r#"
def sync(req):
    ns = req["parent"]
    # Built-in types keep only the status fields their schema has: a Namespace keeps phase and conditions.
    status = {"phase": ns["status"]["phase"],
              "conditions": [{"type": "MetahookGreeted", "status": "True", "reason": "Greeted", "message": "hello"}]}
    return {"status": status,
            "children": [{"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "welcome", "namespace": ns["metadata"]["name"]}, "data": {"hello": "ns"}}]}
"#;

#[tokio::test]
async fn built_in_types_can_be_parents() {
    let w = World::new("builtin-parent", NAMESPACE_HOOK).await;
    w.composite(json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "v1", "resource": "namespaces",
                           "labelSelector": {"matchLabels": {"greet": w.label}}},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps"}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    }))
    .await;
    let namespaces = api(&w.client, "v1", "Namespace", None).await;
    namespaces
        .patch(&w.ns.name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"greet": w.label}}})))
        .await
        .unwrap();
    eventually(WAIT, || async { w.config_map("welcome").await }).await;
    let ns = eventually(WAIT, || async {
        namespaces.get(&w.ns.name).await.ok().filter(|n| n.data["status"]["conditions"][0]["type"] == "MetahookGreeted")
    })
    .await;
    assert_eq!(ns.data["status"]["phase"], "Active");
    w.finish("CompositeController").await;
}

#[tokio::test]
async fn resyncs_write_nothing_when_nothing_changed() {
    let w = World::new("no-write-resync", GREETER).await;
    let mut spec = sync_spec(&w.hook, "InPlace");
    spec["resyncPeriodSeconds"] = json!(1);
    w.composite(spec).await;
    w.thing("q", json!({"greeting": "hello"})).await;
    let things = w.things().await;
    eventually(WAIT, || async { (things.get("q").await.unwrap().data["status"]["configMaps"] == 1).then_some(()) })
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cm_version = w.config_map("q-cm").await.unwrap().metadata.resource_version;
    let parent_version = things.get("q").await.unwrap().metadata.resource_version;
    let calls = w.hook.requests("/sync").len();
    eventually(WAIT, || async { (w.hook.requests("/sync").len() >= calls + 3).then_some(()) }).await;
    assert_eq!(w.config_map("q-cm").await.unwrap().metadata.resource_version, cm_version, "child rewritten on resync");
    assert_eq!(things.get("q").await.unwrap().metadata.resource_version, parent_version, "status rewritten on resync");
    w.finish("CompositeController").await;
}

/// Answers 429 with Retry-After on the first call, then desires one ConfigMap.
const BUSY_ONCE: &str = r#"
calls = {"n": 0}
def sync(req):
    calls["n"] += 1
    if calls["n"] == 1:
        return (429, "busy", {"Retry-After": "1"})
    return {"children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after-429"}}]}
"#;

#[tokio::test]
async fn too_many_requests_is_retried_after_the_delay_without_an_error_event() {
    let w = World::new("retry-after", BUSY_ONCE).await;
    w.composite(sync_spec(&w.hook, "InPlace")).await;
    w.thing("r", json!({})).await;
    eventually(WAIT, || async { w.config_map("after-429").await }).await;
    assert!(w.hook.requests("/sync").len() >= 2);
    let warnings = warnings_for(&w.client, &w.ns.name, "r").await;
    assert!(warnings.is_empty(), "429 is not an error: {warnings:?}");
    w.finish("CompositeController").await;
}

/// One ConfigMap per parent; a negative `spec.size` is answered as a permanent error.
const STRICT: &str = r#"
def sync(req):
    size = req["parent"].get("spec", {}).get("size", 1)
    if size < 0:
        return (422, f"spec.size must not be negative, got {size}\nTraceback: not for humans", {"Metahook-Error": "permanent"})
    name = req["parent"]["metadata"]["name"] + "-cm"
    return {"status": {"size": size},
            "children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"size": str(size)}}]}
"#;

/// A permanent hook error (`Metahook-Error: permanent`) is said once — one Warning Event, one
/// `Synced=False` condition with the hook's first line — leaves the children as they are, and is not
/// retried: the hook is called again when the parent changes, and its answer then clears the condition.
#[tokio::test]
async fn a_permanent_hook_error_is_reported_once_keeps_the_children_and_is_not_retried() {
    let w = World::new("permanent", STRICT).await;
    w.composite(sync_spec(&w.hook, "InPlace")).await;
    w.thing("p", json!({"size": 2})).await;
    let things = w.things().await;
    eventually(WAIT, || async { w.config_map("p-cm").await }).await;
    let child = w.config_map("p-cm").await.unwrap();

    w.thing("p", json!({"size": -1})).await;
    let held = eventually(WAIT, || async {
        let status = things.get("p").await.unwrap().data["status"].clone();
        let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
        conditions.into_iter().find(|c| c["type"] == "Synced")
    })
    .await;
    assert_eq!(held["status"], "False");
    assert_eq!(held["reason"], "HookPermanentError");
    assert_eq!(held["message"], "spec.size must not be negative, got -1", "the first line only");
    // The condition's own echo is synced once more; after that, nothing calls the hook again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = w.hook.requests("/sync").len();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(w.hook.requests("/sync").len(), calls, "a permanent error is not retried");
    let warnings = warnings_for(&w.client, &w.ns.name, "p").await;
    let permanent: Vec<_> = warnings.iter().filter(|w| w.starts_with("HookPermanentError: ")).collect();
    assert_eq!(permanent.len(), 1, "{warnings:?}");
    assert!(permanent[0].contains("spec.size must not be negative"), "{permanent:?}");
    let events = support::events_on(&w.client, &w.ns.name, "p").await;
    let event = events.iter().find(|e| e.reason.as_deref() == Some("HookPermanentError")).unwrap();
    assert!(event.series.is_none(), "said once, not repeated: {:?}", event.series);
    let kept = w.config_map("p-cm").await.expect("the child is kept");
    assert_eq!(kept.metadata.resource_version, child.metadata.resource_version, "and left as it was");

    w.thing("p", json!({"size": 3})).await;
    eventually(WAIT, || async {
        let status = things.get("p").await.unwrap().data["status"].clone();
        (status["size"] == 3 && status.get("conditions").is_none()).then_some(())
    })
    .await;
    assert_eq!(w.config_map("p-cm").await.unwrap().data["data"]["size"], "3");
    w.finish("CompositeController").await;
}

#[tokio::test]
async fn malformed_controllers_are_rejected_at_admission() {
    let w = World::new("admission", QUIET).await;
    let ccs = w.controllers("CompositeController").await;
    let base = json!({
        "apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
        "metadata": {"name": format!("{}-bad", w.label)},
        "spec": {"parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
                 "childResources": [{"apiVersion": "v1", "resource": "configmaps"}],
                 "hooks": {"sync": {"webhook": {"url": "http://127.0.0.1:1/sync"}}}},
    });
    let mut no_url = base.clone();
    no_url["spec"]["hooks"]["sync"]["webhook"] = json!({"path": "/sync"});
    let mut bad_method = base.clone();
    bad_method["spec"]["childResources"][0]["updateStrategy"] = json!({"method": "Sideways"});
    let mut no_parent = base.clone();
    no_parent["spec"].as_object_mut().unwrap().remove("parentResource");
    for (case, expected) in [
        (no_url, "must specify either a full 'url', or both 'service' and 'path'"),
        (bad_method, "Sideways"),
        (no_parent, "parentResource"),
    ] {
        let obj: DynamicObject = serde_json::from_value(case).unwrap();
        let err = ccs.create(&kube::api::PostParams::default(), &obj).await.expect_err("admission must refuse it");
        assert!(err.to_string().contains(expected), "{err}");
    }
    w.finish("CompositeController").await;
}

/// The CRDs default what Metacontroller's default (hook `version: v1`; `Bearer`, `ca.crt`, `tls.crt` /
/// `tls.key`, `username` / `password` in hook TLS and auth settings): a controller applied without them
/// is stored with them, and hooks receive it so, exactly as stored — what Metacontroller sends.
#[tokio::test]
async fn controllers_are_stored_and_sent_to_hooks_with_metacontroller_defaults() {
    let handlers = format!("{GREETER}\ndef customize(req):\n    return {{\"relatedResources\": []}}\n");
    let w = World::new("crd-defaults", &handlers).await;
    let secret = json!({"name": "creds", "namespace": w.ns.name});
    let mut spec = sync_spec(&w.hook, "InPlace");
    spec["hooks"]["customize"] = json!({"webhook": {"url": w.hook.url("/customize")}});
    // Hosts no hook calls: their settings are stored, never resolved.
    spec["endpointConfigs"] = json!([
        {"host": "one.invalid", "caBundle": {"secretRef": secret}, "clientTLS": {"secretRef": secret},
         "authorization": {"secretRef": {"name": "creds", "namespace": w.ns.name, "key": "token"}}},
        {"host": "two.invalid", "caBundle": {"configMapRef": secret}, "basicAuth": {"secretRef": secret}},
    ]);
    let cc = w.composite(spec).await;
    let stored = &cc.data["spec"];
    for hook in ["sync", "customize"] {
        assert_eq!(stored["hooks"][hook]["version"], "v1", "{hook}: {stored}");
    }
    let (one, two) = (&stored["endpointConfigs"][0], &stored["endpointConfigs"][1]);
    assert_eq!(one["caBundle"]["secretRef"]["key"], "ca.crt");
    assert_eq!(
        (&one["clientTLS"]["certKey"], &one["clientTLS"]["privateKeyKey"]),
        (&json!("tls.crt"), &json!("tls.key"))
    );
    assert_eq!(one["authorization"]["type"], "Bearer");
    assert_eq!(two["caBundle"]["configMapRef"]["key"], "ca.crt");
    assert_eq!(
        (&two["basicAuth"]["usernameKey"], &two["basicAuth"]["passwordKey"]),
        (&json!("username"), &json!("password"))
    );

    w.thing("one", json!({})).await;
    let request = eventually(WAIT, || async { w.hook.requests("/sync").into_iter().next() }).await;
    assert_eq!(request["controller"]["spec"], *stored, "the hook sees the controller as stored, defaults and all");
    w.finish("CompositeController").await;
}

#[tokio::test]
async fn hub_serves_health_and_per_controller_metrics() {
    let mut w = World::new("metrics", GREETER).await;
    w.stop_hub().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    w.hub = Some(support::Hub::start_with(&w.client, &w.label, format!("127.0.0.1:{port}")));
    w.composite(sync_spec(&w.hook, "InPlace")).await;
    w.thing("m", json!({"greeting": "hi"})).await;
    eventually(WAIT, || async { w.config_map("m-cm").await }).await;

    let get = |path: &'static str| async move {
        let response = reqwest::get(format!("http://127.0.0.1:{port}{path}")).await.ok()?;
        Some((response.status().as_u16(), response.text().await.ok()?))
    };
    assert_eq!(eventually(WAIT, || get("/healthz")).await, (200, "ok\n".to_owned()));
    assert_eq!(get("/readyz").await.unwrap().0, 200);
    let series = format!(
        "controller_runtime_reconcile_total{{controller=\"compositecontroller/{}\",result=\"success\"}} ",
        w.label
    );
    let text =
        eventually(WAIT, || async { get("/metrics").await.map(|(_, body)| body).filter(|b| b.contains(&series)) })
            .await;
    let syncs: u64 = text.lines().find_map(|l| l.strip_prefix(&series)).unwrap().parse().unwrap();
    assert!(syncs >= 1, "{text}");
    assert!(text.contains(&format!("workqueue_depth{{name=\"compositecontroller/{}\"}}", w.label)), "{text}");
    assert!(text.contains("metahook_watched_types "), "{text}");
    w.finish("CompositeController").await;
}
