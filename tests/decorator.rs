//! DecoratorController against the real control plane, with hooks as real Python processes.

mod support;

use std::time::Duration;

use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use support::{World, api, apply_value, eventually};

const WAIT: Duration = Duration::from_secs(60);

fn label(obj: &DynamicObject, key: &str) -> Option<String> {
    obj.metadata.labels.as_ref()?.get(key).cloned()
}

fn annotation(obj: &DynamicObject, key: &str) -> Option<String> {
    obj.metadata.annotations.as_ref()?.get(key).cloned()
}

const DECORATE: &str = r#"
def sync(req):
    obj = req["object"]
    note = obj.get("spec", {}).get("note", "n")
    name = obj["metadata"]["name"]
    return {
        "labels": {"decorated": "yes", "remove-me": None},
        "annotations": {"note": note},
        "status": {"decorated": True, "attachments": sorted(req["attachments"]["ConfigMap.v1"])},
        "attachments": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name + "-att"}, "data": {"note": note}}],
    }
"#;

#[tokio::test]
async fn decorator_merges_labels_writes_status_and_keeps_attachments_as_desired() {
    let w = World::new("dec-merge", DECORATE).await;
    w.decorator(json!({
        "resources": [{"apiVersion": "test.metahook.dev/v1", "resource": "things"}],
        "attachments": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    }))
    .await;
    w.thing_labelled("t", &json!({"remove-me": "x", "keep": "k"}), json!({"note": "first"})).await;
    let things = w.things().await;
    let thing = eventually(WAIT, || async {
        things
            .get("t")
            .await
            .ok()
            .filter(|t| label(t, "decorated").is_some() && t.data["status"]["attachments"] == json!(["t-att"]))
    })
    .await;
    assert_eq!(label(&thing, "remove-me"), None, "null deletes a label");
    assert_eq!(label(&thing, "keep").as_deref(), Some("k"), "labels the hook does not name are untouched");
    assert_eq!(annotation(&thing, "note").as_deref(), Some("first"));
    assert_eq!(thing.data["status"]["decorated"], true);
    assert!(thing.data["status"].get("observedGeneration").is_none(), "decorators do not inject observedGeneration");

    let cms = w.config_maps().await;
    let att = cms.get("t-att").await.unwrap();
    assert_eq!(annotation(&att, "metacontroller.k8s.io/decorator-controller").as_deref(), Some(w.label.as_str()));
    assert_eq!(att.metadata.owner_references.as_ref().unwrap()[0].uid, thing.metadata.uid.clone().unwrap());

    cms.patch("t-att", &PatchParams::default(), &Patch::Merge(json!({"data": {"note": "tampered"}}))).await.unwrap();
    eventually(WAIT, || async { cms.get("t-att").await.ok().filter(|c| c.data["data"]["note"] == "first") }).await;

    cms.delete("t-att", &DeleteParams::default()).await.unwrap();
    let again = eventually(WAIT, || async {
        cms.get_opt("t-att").await.unwrap().filter(|c| c.metadata.uid != att.metadata.uid)
    })
    .await;
    assert_eq!(again.data["data"]["note"], "first");
    w.finish("DecoratorController").await;
}

const FINALIZING: &str = r#"
def sync(req):
    name = req["object"]["metadata"]["name"]
    if req["finalizing"]:
        return {"labels": {"decorated": None}, "attachments": [], "finalized": True}
    return {"labels": {"decorated": "yes"},
            "attachments": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name + "-att"}}]}
"#;

#[tokio::test]
async fn opting_out_finalizes_and_deleting_the_decorator_releases_its_finalizers() {
    let w = World::new("dec-finalize", FINALIZING).await;
    w.decorator(json!({
        "resources": [{"apiVersion": "test.metahook.dev/v1", "resource": "things",
                       "labelSelector": {"matchLabels": {"metahook-test": w.label, "decorate": "yes"}}}],
        "attachments": [{"apiVersion": "v1", "resource": "configmaps"}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}, "finalize": {"webhook": {"url": w.hook.url("/sync")}}},
    }))
    .await;
    let finalizer = format!("metacontroller.io/decoratorcontroller-{}", w.label);
    for name in ["leaves", "stays"] {
        w.thing_labelled(name, &json!({"decorate": "yes"}), Value::Null).await;
    }
    let things = w.things().await;
    let cms = w.config_maps().await;
    for name in ["leaves", "stays"] {
        eventually(WAIT, || async {
            things.get(name).await.unwrap().metadata.finalizers.filter(|f| f.contains(&finalizer))
        })
        .await;
        eventually(WAIT, || async { cms.get_opt(&format!("{name}-att")).await.unwrap() }).await;
    }

    things
        .patch("leaves", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"decorate": "no"}}})))
        .await
        .unwrap();
    let left = eventually(WAIT, || async {
        things
            .get("leaves")
            .await
            .ok()
            .filter(|t| !t.metadata.finalizers.as_ref().is_some_and(|f| f.contains(&finalizer)))
    })
    .await;
    assert_eq!(label(&left, "decorated"), None, "the finalize hook's labels were applied");
    assert!(
        w.hook.requests("/sync").iter().any(|r| r["finalizing"] == true && r["object"]["metadata"]["name"] == "leaves")
    );
    support::gone(&cms, "leaves-att", WAIT).await;

    w.controllers("DecoratorController").await.delete(&w.label, &DeleteParams::default()).await.unwrap();
    eventually(WAIT, || async {
        things
            .get("stays")
            .await
            .ok()
            .filter(|t| !t.metadata.finalizers.as_ref().is_some_and(|f| f.contains(&finalizer)))
    })
    .await;
    w.finish("DecoratorController").await;
}

const CLUSTER_TARGET: &str = r#"
def sync(req):
    obj = req["object"]
    return {"attachments": [{"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": obj["metadata"]["name"], "namespace": obj["spec"]["ns"]}}]}
"#;

#[tokio::test]
async fn cluster_scoped_targets_get_namespaced_attachments() {
    let w = World::new("dec-cluster", CLUSTER_TARGET).await;
    w.decorator(json!({
        "resources": [{"apiVersion": "test.metahook.dev/v1", "resource": "clusterthings"}],
        "attachments": [{"apiVersion": "v1", "resource": "configmaps"}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    }))
    .await;
    let name = format!("ct-{}", w.label);
    let target = apply_value(
        &w.client,
        &json!({"apiVersion": "test.metahook.dev/v1", "kind": "ClusterThing",
        "metadata": {"name": name, "labels": {"metahook-test": w.label}}, "spec": {"ns": w.ns.name}}),
    )
    .await;
    let cms = w.config_maps().await;
    let att = eventually(WAIT, || async { cms.get_opt(&name).await.unwrap() }).await;
    let owner = &att.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), Some(&owner.uid)), ("ClusterThing", target.metadata.uid.as_ref()));
    let cluster_things = api(&w.client, "test.metahook.dev/v1", "ClusterThing", None).await;
    cluster_things.delete(&name, &DeleteParams::default()).await.unwrap();
    w.finish("DecoratorController").await;
}

/// Decorates every Thing but one whose `spec.note` is `bad`, which it refuses for good.
const REFUSING: &str = r#"
def sync(req):
    if req["object"].get("spec", {}).get("note") == "bad":
        return (422, "spec.note must not be bad", {"Metahook-Error": "permanent"})
    return {"labels": {"decorated": "yes"}}
"#;

/// A decorator's target belongs to someone else, status included: a permanent hook error is said
/// there only as one Event, nothing is written to the target, and it is not retried.
#[tokio::test]
async fn a_permanent_hook_error_on_a_target_is_one_event_and_no_write() {
    let w = World::new("dec-permanent", REFUSING).await;
    w.decorator(w.things_decorator_spec()).await;
    let thing = w.thing("t", json!({"note": "bad"})).await;
    let warning =
        support::warning_eventually(&w.client, &w.ns.name, "t", WAIT, |w| w.starts_with("HookPermanentError: ")).await;
    assert!(warning.contains("spec.note must not be bad"), "{warning}");
    let calls = w.hook.requests("/sync").len();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(w.hook.requests("/sync").len(), calls, "not retried");
    let things = w.things().await;
    let now = things.get("t").await.unwrap();
    assert_eq!(now.metadata.resource_version, thing.metadata.resource_version, "the target is not written");
    let permanent = support::warnings_for(&w.client, &w.ns.name, "t").await;
    assert_eq!(permanent.iter().filter(|w| w.starts_with("HookPermanentError: ")).count(), 1, "{permanent:?}");

    w.thing("t", json!({"note": "good"})).await;
    eventually(WAIT, || async { things.get("t").await.ok().filter(|t| label(t, "decorated").is_some()) }).await;
    w.finish("DecoratorController").await;
}

/// A decorator whose labels answer claims its target for the parent `spec.claim` names.
const CLAIMING: &str = r#"
def sync(req):
    claim = req["object"].get("spec", {}).get("claim", "")
    return {"labels": {"metahook.dev/parent-uid": claim, "decorated": "yes"}}
"#;

/// Issue 53 item 7 (threat model): a decorator's `labels` answer may not set `metahook.dev/parent-uid`.
/// That label makes an object a parent's child by label (`crossNamespace`), which that parent's sync
/// deletes when its hook does not ask for it; a target's author could steer the decorator's answer to
/// any parent's UID. The answer is refused whole (a Warning Event names the label) and the target is
/// not written: neither that label nor the answer's other one is on it.
#[tokio::test]
async fn a_decorator_answer_setting_the_parent_label_is_refused_and_writes_nothing() {
    let w = World::new("dec-parent-label", CLAIMING).await;
    w.decorator(w.things_decorator_spec()).await;
    let thing = w.thing("t", json!({"claim": "0d4c8f4e-some-parents-uid"})).await;
    let warning =
        support::warning_eventually(&w.client, &w.ns.name, "t", WAIT, |m| m.contains("metahook.dev/parent-uid")).await;
    assert!(warning.contains("hub's to set"), "{warning}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = w.things().await.get("t").await.unwrap();
    assert_eq!((label(&after, "metahook.dev/parent-uid"), label(&after, "decorated")), (None, None));
    assert_eq!(after.metadata.resource_version, thing.metadata.resource_version, "the target was not written");
    w.finish("DecoratorController").await;
}

/// The target's `spec.n`, said in its status; slow to answer a target whose status is behind `n: 2`: 2 s
/// for a Thing, 3 s for a StatuslessThing (time for the test to hold the Things' watch before the
/// Thing's status is written, and for that write to be made before the StatuslessThing's is decided).
const STATUS_N: &str = r#"
import time
def sync(req):
    obj = req["object"]
    n = obj.get("spec", {}).get("n", 0)
    if n == 2 and obj.get("status", {}).get("n") != 2:
        time.sleep(2 if obj["kind"] == "Thing" else 3)
    return {"status": {"n": n}}
"#;

/// Issue 53 item 7: a DecoratorController's record of its last status write is kept per target type. A
/// Thing and a StatuslessThing both named `t` both change to `n: 2`; the Thing's status write comes
/// first and its echo is held (a cut in the Things' watch), then the StatuslessThing's answer says the
/// same status. Keyed by name alone, the Thing's record took it for "written, echo not come", and the
/// StatuslessThing's status was not written.
#[tokio::test]
async fn two_targets_of_one_name_and_different_types_each_get_their_status() {
    let mut w = World::new("dec-two-types", STATUS_N).await;
    w.stop_hub().await;
    w.decorator(json!({
        "resources": [{"apiVersion": "test.metahook.dev/v1", "resource": "things"},
                      {"apiVersion": "test.metahook.dev/v1", "resource": "statuslessthings"}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    }))
    .await;
    let cut = support::WatchCut::default();
    let no_relists = metahook::ops::config::Config {
        cache_flush_interval: Duration::ZERO,
        ..metahook::ops::config::Config::default()
    };
    w.start_hub_with(&cut.client(&w.client), no_relists);
    let statusless_thing = |n: i64| {
        json!({"apiVersion": "test.metahook.dev/v1", "kind": "StatuslessThing",
               "metadata": {"name": "t", "namespace": w.ns.name, "labels": {"metahook-test": w.label}},
               "spec": {"n": n}})
    };
    w.thing("t", json!({"n": 1})).await;
    apply_value(&w.client, &statusless_thing(1)).await;
    let things = w.things().await;
    let statusless = api(&w.client, "test.metahook.dev/v1", "StatuslessThing", Some(&w.ns.name)).await;
    let n_of = |api: &kube::Api<DynamicObject>| {
        let api = api.clone();
        async move { api.get("t").await.unwrap().data["status"]["n"].clone() }
    };
    eventually(WAIT, || async { (n_of(&things).await == 1 && n_of(&statusless).await == 1).then_some(()) }).await;

    w.thing("t", json!({"n": 2})).await;
    apply_value(&w.client, &statusless_thing(2)).await;
    // The Thing's sync is in its (slow) hook call: hold its status write's echo.
    eventually(WAIT, || async {
        let asked = w.hook.requests("/sync");
        asked.iter().any(|r| r["object"]["kind"] == "Thing" && r["object"]["spec"]["n"] == 2).then_some(())
    })
    .await;
    cut.hold("things");
    eventually(WAIT, || async { (n_of(&things).await == 2).then_some(()) }).await;
    // While the Thing's echo is held, the StatuslessThing gets its own status.
    eventually(Duration::from_secs(20), || async { (n_of(&statusless).await == 2).then_some(()) }).await;
    assert!(!cut.held().is_empty(), "the Thing's echo was held meanwhile");
    cut.release();
    w.finish("DecoratorController").await;
}
