//! The promises in every corner (the issue "Promises in every corner"): each test names the corner it
//! guards, runs on the real control plane with a real Python hook, and counts what must not happen.
//! Each was seen to fail before its corner was mended.

mod support;

use std::time::{Duration, Instant};

use kube::api::{DeleteParams, Patch, PatchParams, PropagationPolicy};
use serde_json::{Value, json};
use support::{World, api, apply_value, eventually};

const WAIT: Duration = Duration::from_secs(60);

/// The test's CompositeController over its Things, with `children` rules and `annotations`.
async fn controller(w: &World, annotations: Value, children: Value) {
    let spec = json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
        "childResources": children,
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    });
    w.composite_annotated(annotations, spec).await;
}

/// Hook calls for the parent `name` so far.
fn calls_for(w: &World, name: &str) -> usize {
    w.hook.requests("/sync").iter().filter(|r| r["parent"]["metadata"]["name"] == name).count()
}

/// A Warning Event on `name` whose text holds `text`.
async fn warning_with(w: &World, name: &str, text: &str) -> String {
    eventually(WAIT, || async {
        support::warnings_for(&w.client, &w.ns.name, name).await.into_iter().find(|e| e.contains(text))
    })
    .await
}

/// Corner 9: a Recreate forced by an immutable field happens. A NodePort Service child with a fixed
/// `nodePort` whose `clusterIP` the hook changes: the update is refused ("may not change once set"),
/// the replacement's dry run only because the original holds the port — which the delete frees.
#[tokio::test]
async fn a_service_whose_cluster_ip_changes_is_recreated_keeping_its_node_port() {
    const SERVICE: &str = r#"
import time
def sync(req):
    p = req["parent"]
    s = p["spec"]
    return {"status": {"at": time.time()},
            "children": [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": p["metadata"]["name"]},
                          "spec": {"type": "NodePort", "clusterIP": s["clusterIP"], "selector": {"app": "x"},
                                   "ports": [{"port": 80, "nodePort": s["nodePort"]}]}}]}
"#;
    let w = World::new("corner-clusterip", SERVICE).await;
    controller(
        &w,
        json!({}),
        json!([{"apiVersion": "v1", "resource": "services", "updateStrategy": {"method": "Recreate"}}]),
    )
    .await;
    // A port and addresses of the test's own: tests share the cluster's ranges.
    let pid = std::process::id();
    let port = 30_000 + (pid % 2_700) + 50;
    let ip = |n: u32| format!("10.96.{}.{}", 200 + pid % 50, 10 + n + (pid / 50) % 200);
    w.thing("svc", json!({"nodePort": port, "clusterIP": ip(0)})).await;
    let services = api(&w.client, "v1", "Service", Some(&w.ns.name)).await;
    let first = eventually(WAIT, || async { services.get_opt("svc").await.unwrap() }).await;
    assert_eq!(first.data["spec"]["clusterIP"], ip(0));

    let changed = Instant::now();
    w.thing("svc", json!({"nodePort": port, "clusterIP": ip(1)})).await;
    let second = eventually(WAIT, || async {
        let s = services.get_opt("svc").await.unwrap()?;
        (s.metadata.uid != first.metadata.uid && s.data["spec"]["clusterIP"] == ip(1)).then_some(s)
    })
    .await;
    println!("recreated with the new clusterIP {:.2} s after the change", changed.elapsed().as_secs_f64());
    assert_eq!(second.data["spec"]["ports"][0]["nodePort"], port, "the same node port, freed by the delete");
    let refusals = support::warnings_for(&w.client, &w.ns.name, "svc").await;
    assert!(refusals.iter().all(|e| !e.contains("not recreating")), "{refusals:?}");
    w.finish("CompositeController").await;
}

/// One Pod per parent under `Recreate`, asking `spec.cpu` (a Pod's requests cannot change in place).
const CPU_POD: &str = r#"
def sync(req):
    p = req["parent"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": p["metadata"]["name"]},
           "spec": {"containers": [{"name": "main", "image": "nginx",
                                    "resources": {"requests": {"cpu": p["spec"]["cpu"]}}}]}}
    return {"status": {"cpu": p["spec"]["cpu"]}, "children": [pod]}
"#;

/// Corner 2: Recreate never blocks for good on a refusal only the original causes. A quota of
/// `requests.cpu: 2`, another Pod holding 0.5, the child holding 1: its replacement asking 1.5 is
/// refused while the original exists and fits once it is gone (decided from the quota's figures), so it
/// is recreated; one asking 2 would not fit even then, and the original stays.
#[tokio::test]
async fn a_replacement_that_fits_the_quota_once_the_original_is_gone_is_recreated() {
    let w = World::new("corner-quota", CPU_POD).await;
    apply_value(
        &w.client,
        &json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "cpu", "namespace": w.ns.name},
                "spec": {"hard": {"requests.cpu": "2"}}}),
    )
    .await;
    let quotas = api(&w.client, "v1", "ResourceQuota", Some(&w.ns.name)).await;
    eventually(WAIT, || async { quotas.get("cpu").await.ok()?.data["status"].get("used").map(drop) }).await;
    apply_value(
        &w.client,
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "other", "namespace": w.ns.name},
                "spec": {"containers": [{"name": "main", "image": "nginx", "resources": {"requests": {"cpu": "500m"}}}]}}),
    )
    .await;
    controller(
        &w,
        json!({}),
        json!([{"apiVersion": "v1", "resource": "pods", "updateStrategy": {"method": "Recreate"}}]),
    )
    .await;
    w.thing("web", json!({"cpu": "1"})).await;
    let pods = api(&w.client, "v1", "Pod", Some(&w.ns.name)).await;
    let first = eventually(WAIT, || async { pods.get_opt("web").await.unwrap() }).await;
    eventually(WAIT, || async {
        (quotas.get("cpu").await.ok()?.data["status"]["used"]["requests.cpu"] == "1500m").then_some(())
    })
    .await;

    w.thing("web", json!({"cpu": "1500m"})).await;
    let second = eventually(WAIT, || async {
        let pod = pods.get_opt("web").await.unwrap()?;
        let cpu = pod.data["spec"]["containers"][0]["resources"]["requests"]["cpu"].clone();
        (pod.metadata.uid != first.metadata.uid && cpu == "1500m").then_some(pod)
    })
    .await;

    // Too big even without the original: 0.5 + 2 > 2. The running Pod stays, and the hub says why.
    let calls = calls_for(&w, "web");
    w.thing("web", json!({"cpu": "2"})).await;
    let warning = warning_with(&w, "web", "not recreating Pod").await;
    assert!(warning.contains("does not fit even without the original"), "{warning}");
    assert!(warning.contains("requests.cpu"), "{warning}");
    eventually(WAIT, || async { (calls_for(&w, "web") >= calls + 2).then_some(()) }).await;
    let still = pods.get("web").await.unwrap();
    assert_eq!(still.metadata.uid, second.metadata.uid, "the running Pod is kept");
    assert!(still.metadata.deletion_timestamp.is_none());
    w.finish("CompositeController").await;
}

/// A Pod (`Recreate`: its env cannot change in place) and a ConfigMap (`InPlace`) per parent. A parent
/// whose `spec.gate` names a file is answered only once that file exists: the test decides when the
/// hook's answer arrives.
const GATED: &str = r#"
import os, time
def sync(req):
    p = req["parent"]
    s = p["spec"]
    gate = s.get("gate")
    deadline = time.time() + 60
    while gate and not os.path.exists(gate) and time.time() < deadline:
        time.sleep(0.05)
    name = p["metadata"]["name"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"containers": [{"name": "main", "image": "nginx", "env": [{"name": "V", "value": s["v"]}]}]}}
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": s["v"]}}
    return {"status": {}, "children": [pod, cm]}
"#;

/// A policy that refuses any update taking an owner reference off a Pod or ConfigMap of `namespace`:
/// the garbage collector cannot orphan them while it stands.
async fn keep_owner_references(w: &World) -> String {
    let name = format!("{}-keep-owners", w.ns.name);
    apply_value(
        &w.client,
        &json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": name},
                "spec": {"failurePolicy": "Fail",
                         "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                             "operations": ["UPDATE"], "resources": ["pods", "configmaps"]}]},
                         "validations": [{
                             "expression": "!has(oldObject.metadata.ownerReferences) || (has(object.metadata.ownerReferences) && size(object.metadata.ownerReferences) >= size(oldObject.metadata.ownerReferences))",
                             "message": "test: owner references stay"}]}}),
    )
    .await;
    apply_value(
        &w.client,
        &json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": name},
                "spec": {"policyName": name, "validationActions": ["Deny"],
                         "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": w.ns.name}}}}}),
    )
    .await;
    name
}

/// Corner 3: a parent deleted with `--cascade=orphan` while its hook thinks about a change to its Pod and
/// its ConfigMap. The user asked to keep the children: the Pod is not deleted, and neither child is
/// written after the delete. (The garbage collector is held from orphaning them by a policy, so the
/// children still name the parent when the answer comes: what the hub must look at is the parent.)
/// Under `Recreate` the change deletes the Pod, so the hub reads the parent from the API server first.
#[tokio::test]
async fn children_of_a_parent_deleted_with_orphan_during_a_slow_hook_are_kept_as_they_are() {
    orphaned_during_a_slow_hook("corner-orphan", "Recreate").await;
}

/// Corner 3 where the change only updates in place: the hub looks at the parent in its cache (no read
/// from the API server), which by the time the answer comes shows the deletion; nothing is written.
#[tokio::test]
async fn children_updated_in_place_of_a_parent_deleted_with_orphan_during_a_slow_hook_are_kept_as_they_are() {
    orphaned_during_a_slow_hook("corner-orphan-inplace", "InPlace").await;
}

async fn orphaned_during_a_slow_hook(name: &str, pod_method: &str) {
    let w = World::new(name, GATED).await;
    let gate_dir = tempfile::tempdir().unwrap();
    let gate = gate_dir.path().join("answer");
    controller(
        &w,
        json!({}),
        json!([{"apiVersion": "v1", "resource": "pods", "updateStrategy": {"method": pod_method}},
               {"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}]),
    )
    .await;
    w.thing("keep", json!({"v": "one"})).await;
    let pods = api(&w.client, "v1", "Pod", Some(&w.ns.name)).await;
    let pod = eventually(WAIT, || async { pods.get_opt("keep").await.unwrap() }).await;
    let cm = eventually(WAIT, || async { w.config_map("keep").await }).await;

    let policy = keep_owner_references(&w).await;
    // The policy is in force once a dry-run orphaning is refused.
    let orphaned = json!({"metadata": {"ownerReferences": null}});
    eventually(WAIT, || async {
        let dry = PatchParams { dry_run: true, ..PatchParams::default() };
        pods.patch("keep", &dry, &Patch::Merge(&orphaned)).await.is_err().then_some(())
    })
    .await;

    w.thing("keep", json!({"v": "two", "gate": gate.to_str().unwrap()})).await;
    eventually(WAIT, || async {
        w.hook.requests("/sync").iter().any(|r| r["parent"]["spec"]["v"] == "two").then_some(())
    })
    .await;
    let orphan = DeleteParams { propagation_policy: Some(PropagationPolicy::Orphan), ..DeleteParams::default() };
    w.things().await.delete("keep", &orphan).await.unwrap();
    eventually(WAIT, || async {
        w.things().await.get_opt("keep").await.unwrap()?.metadata.deletion_timestamp.map(drop)
    })
    .await;
    std::fs::write(&gate, b"go").unwrap();
    // The answer for the parent as it was is in; a few seconds for anything it would write.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let still = pods.get("keep").await.unwrap();
    assert_eq!(still.metadata.uid, pod.metadata.uid, "the Pod the user kept was not deleted");
    assert!(still.metadata.deletion_timestamp.is_none(), "nor is it being deleted");
    let cm_now = w.config_map("keep").await.unwrap();
    assert_eq!(cm_now.metadata.resource_version, cm.metadata.resource_version, "the ConfigMap was not written");

    // The garbage collector may orphan them now: both stay, as the user asked.
    let bindings = api(&w.client, "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding", None).await;
    let policies = api(&w.client, "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", None).await;
    bindings.delete(&policy, &DeleteParams::default()).await.unwrap();
    policies.delete(&policy, &DeleteParams::default()).await.unwrap();
    eventually(Duration::from_secs(120), || async {
        w.things().await.get_opt("keep").await.unwrap().is_none().then_some(())
    })
    .await;
    let kept = pods.get("keep").await.unwrap();
    assert_eq!(kept.metadata.uid, pod.metadata.uid);
    assert!(kept.metadata.owner_references.unwrap_or_default().is_empty(), "orphaned, as asked");
    assert_eq!(w.config_map("keep").await.unwrap().data["data"]["v"], "one");
    w.finish("CompositeController").await;
}

/// One ConfigMap the API server always refuses (a key with a space), and a status that changes on
/// every call when `spec.stamp` is set.
const ALWAYS_REFUSED: &str = r#"
import time
def sync(req):
    p = req["parent"]
    status = {"at": time.time()} if p["spec"].get("stamp") else {"fixed": True}
    child = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": p["metadata"]["name"]},
             "data": {"not a key!": "x"}}
    return {"status": status, "children": [child]}
"#;

/// Corner 10: a failing sync backs off, whatever its status does. A failed sync still writes the
/// status (as Metacontroller does); the echo of that write must wait for the parent's backoff rather
/// than sync it again at once. Counted over 30 s, for a status that changes on every call and one that
/// does not: the backoff (5 ms doubling) allows about 13 attempts; a sync per echo would be thousands.
#[tokio::test]
async fn a_failing_sync_backs_off_whether_or_not_its_status_changes() {
    let w = World::new("corner-backoff", ALWAYS_REFUSED).await;
    controller(
        &w,
        json!({}),
        json!([{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}]),
    )
    .await;
    w.thing("stamped", json!({"stamp": true})).await;
    w.thing("fixed", json!({})).await;
    let things = w.things().await;
    let first_status = eventually(WAIT, || async {
        let status = things.get("stamped").await.unwrap().data["status"].clone();
        status.get("at").is_some().then_some(status)
    })
    .await;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (stamped, fixed) = (calls_for(&w, "stamped"), calls_for(&w, "fixed"));
    println!("hook calls in {:.0} s: changing status {stamped}, fixed status {fixed}", started.elapsed().as_secs_f64());
    assert!(stamped <= 20, "a failing sync with a changing status was retried {stamped} times in 30 s");
    assert!(fixed <= 20, "a failing sync with a fixed status was retried {fixed} times in 30 s");
    assert!(stamped >= 5 && fixed >= 5, "failing syncs are retried: {stamped}, {fixed}");
    let status = things.get("stamped").await.unwrap().data["status"].clone();
    assert_ne!(status, first_status, "the failed syncs still write the hook's status, as Metacontroller does");
    let warnings = support::warnings_for(&w.client, &w.ns.name, "stamped").await;
    assert!(warnings.iter().any(|e| e.contains("not a key")), "{warnings:?}");
    // A change by someone else still goes at once.
    let calls = calls_for(&w, "stamped");
    let changed = Instant::now();
    w.thing("stamped", json!({"stamp": true, "touched": 1})).await;
    eventually(Duration::from_secs(10), || async { (calls_for(&w, "stamped") > calls).then_some(()) }).await;
    assert!(changed.elapsed() < Duration::from_secs(10));
    w.finish("CompositeController").await;
}

/// Answers a negative `spec.size` with a permanent error.
const STRICT: &str = r#"
def sync(req):
    size = req["parent"].get("spec", {}).get("size", 1)
    if size < 0:
        return (422, f"spec.size must not be negative, got {size}", {"Metahook-Error": "permanent"})
    return {"status": {"size": size}, "children": []}
"#;

/// The `Synced` condition of the Thing `name`, once there is one.
async fn synced_condition(w: &World, name: &str) -> Value {
    let things = w.things().await;
    eventually(WAIT, || async {
        let thing = things.get_opt(name).await.unwrap()?;
        let conditions = thing.data["status"]["conditions"].as_array().cloned().unwrap_or_default();
        conditions.into_iter().find(|c| c["type"] == "Synced")
    })
    .await
}

/// Corner 4: a permanent hook error follows the object, not its name. A parent deleted and created
/// again under the same name gets its own Event and its own condition for the same message.
#[tokio::test]
async fn a_parent_created_again_under_the_same_name_is_told_its_permanent_error_again() {
    let w = World::new("corner-held", STRICT).await;
    controller(&w, json!({}), json!([{"apiVersion": "v1", "resource": "configmaps"}])).await;
    let first = w.thing("p", json!({"size": -1})).await;
    assert_eq!(synced_condition(&w, "p").await["reason"], "HookPermanentError");
    let things = w.things().await;
    things.delete("p", &DeleteParams::default()).await.unwrap();
    eventually(WAIT, || async { things.get_opt("p").await.unwrap().is_none().then_some(()) }).await;

    let second = w.thing("p", json!({"size": -1})).await;
    assert_ne!(first.metadata.uid, second.metadata.uid);
    let condition = synced_condition(&w, "p").await;
    assert_eq!(condition["reason"], "HookPermanentError");
    assert!(condition["message"].as_str().unwrap().contains("spec.size must not be negative"), "{condition}");
    let told = eventually(WAIT, || async {
        let events = support::events_on(&w.client, &w.ns.name, "p").await;
        let permanent: Vec<_> = events
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("HookPermanentError"))
            .filter_map(|e| e.regarding.and_then(|r| r.uid))
            .collect();
        permanent.contains(second.metadata.uid.as_ref().unwrap()).then_some(permanent)
    })
    .await;
    assert!(told.contains(first.metadata.uid.as_ref().unwrap()), "each object told once: {told:?}");
    w.finish("CompositeController").await;
}

/// Two ConfigMaps per parent; the status counts the children the hook observed.
const COUNTING: &str = r#"
def sync(req):
    name = req["parent"]["metadata"]["name"]
    return {"status": {"children": len(req["children"]["ConfigMap.v1"])},
            "children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "%s-%d" % (name, i)}}
                         for i in range(2)]}
"#;

/// Corner 5: annotations the docs call live are read live. Under `sync-on-own-writes: "false"` a new
/// parent's status counting its children stays at 0 (the echoes of the creates sync nothing); once the
/// annotation is removed from the running controller — with no restart — a new parent's status counts
/// its 2 children.
#[tokio::test]
async fn removing_sync_on_own_writes_from_a_running_controller_takes_effect_at_once() {
    let w = World::new("corner-live", COUNTING).await;
    let children = json!([{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}]);
    controller(&w, json!({"metahook.dev/sync-on-own-writes": "false"}), children).await;
    w.thing("before", json!({})).await;
    eventually(WAIT, || async { w.config_map("before-1").await }).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let status = w.things().await.get("before").await.unwrap().data["status"].clone();
    assert_eq!(status["children"], 0, "the echoes of its creates synced nothing");

    let controllers = w.controllers("CompositeController").await;
    let remove = json!({"metadata": {"annotations": {"metahook.dev/sync-on-own-writes": null}}});
    controllers.patch(&w.label, &PatchParams::default(), &Patch::Merge(&remove)).await.unwrap();
    // The hub has seen the controller's change once a sync request on it is answered.
    let request = json!({"metadata": {"annotations": {"metahook.dev/sync-requested-at": "now"}}});
    controllers.patch(&w.label, &PatchParams::default(), &Patch::Merge(&request)).await.unwrap();
    eventually(WAIT, || async {
        let events = support::events_on(&w.client, "default", &w.label).await;
        events.iter().any(|e| e.reason.as_deref() == Some("SyncRequested")).then_some(())
    })
    .await;
    w.thing("after", json!({})).await;
    eventually(WAIT, || async {
        let status = w.things().await.get("after").await.unwrap().data["status"].clone();
        (status["children"] == 2).then_some(())
    })
    .await;
    let events = support::events_on(&w.client, "default", &w.label).await;
    let starts = events.iter().filter(|e| e.reason.as_deref() == Some("Started")).count();
    assert_eq!(starts, 1, "taken without a restart: {events:?}");
    w.finish("CompositeController").await;
}

/// Corner 6: a hook URL's credentials never show — not in the controller's condition, its Events, the
/// hub's log or `metahook status` — whatever the URL's form.
#[tokio::test]
async fn a_hook_urls_password_never_shows() {
    let mut w = World::new("corner-secret", COUNTING).await;
    w.stop_hub().await;
    let hub = support::HubProcess::start(&w.label);
    let forms = [
        format!("alice7:pw1secret@127.0.0.1:{}/sync", w.hook.port),
        "https:/alice7:pw1secret@127.0.0.1/sync".to_owned(),
        "http://alice7:pw1secret@127.0.0.1:99999/sync".to_owned(),
    ];
    let controllers = w.controllers("CompositeController").await;
    for (i, url) in forms.iter().enumerate() {
        let name = format!("{}-{i}", w.label);
        w.controller(
            "CompositeController",
            &name,
            json!({"generateSelector": true,
                   "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
                   "childResources": [{"apiVersion": "v1", "resource": "configmaps"}],
                   "hooks": {"sync": {"webhook": {"url": url}}}}),
        )
        .await;
        let condition = eventually(WAIT, || async {
            let cc = controllers.get(&name).await.ok()?;
            let conditions = cc.data["status"]["conditions"].as_array().cloned().unwrap_or_default();
            conditions.into_iter().find(|c| c["type"] == "Ready" && c["status"] == "False")
        })
        .await;
        let message = condition["message"].as_str().unwrap_or_default();
        assert!(message.contains("invalid hook URL") && message.contains("<redacted>"), "{url}: {message}");
        assert!(!message.contains("pw1secret") && !message.contains("alice7"), "{url}: {message}");
        // The Event is recorded after the condition is written: wait for it.
        let events = eventually(WAIT, || async {
            let events = support::events_on(&w.client, "default", &name).await;
            (!events.is_empty()).then_some(events)
        })
        .await;
        for event in events {
            let note = event.note.unwrap_or_default();
            assert!(!note.contains("pw1secret") && !note.contains("alice7"), "{url}: {note}");
        }
    }
    // A few retries later, the log and the status report still say nothing of it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = std::fs::read_to_string(&hub.log).unwrap();
    assert!(log.contains("<redacted>"), "the log says which URL is wrong:\n{log}");
    assert!(!log.contains("pw1secret") && !log.contains("alice7"), "{log}");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
        .args(["status", "-o", "json", "-l", &format!("metahook-test={}", w.label), "--kubeconfig"])
        .arg(support::kubeconfig_path())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&status.stdout);
    assert!(report.contains(&format!("{}-0", w.label)) && report.contains("<redacted>"), "{report}");
    assert!(!report.contains("pw1secret") && !report.contains("alice7"), "{report}");
    hub.kill();
    for i in 0..forms.len() {
        let _ = controllers.delete(&format!("{}-{i}", w.label), &DeleteParams::default()).await;
    }
    w.ns.delete().await;
}

/// Two ConfigMaps per parent, and a status that says how many the hook saw.
const STATUSLESS: &str = r#"
def sync(req):
    name = req["parent"]["metadata"]["name"]
    return {"status": {"children": len(req["children"]["ConfigMap.v1"]), "size": req["parent"]["spec"]["size"]},
            "children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "%s-%d" % (name, i)}}
                         for i in range(2)]}
"#;

/// Corner 7: a parent type without a status subresource works as on Metacontroller's whole-object
/// update: the children are written and the status with the object — and its `observedGeneration`,
/// which that very write moves on, says the generation the object is at. Nothing loops: once settled,
/// a resync or the echo of the last write writes nothing. `migrate --dry-run` says what the engine does.
#[tokio::test]
async fn a_parent_type_without_a_status_subresource_gets_its_children_and_status_without_a_loop() {
    let w = World::new("corner-statusless", STATUSLESS).await;
    w.composite(json!({
        "generateSelector": true,
        "resyncPeriodSeconds": 1,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "statuslessthings",
                           "labelSelector": {"matchLabels": {"metahook-test": w.label}}},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    }))
    .await;
    let parents = api(&w.client, "test.metahook.dev/v1", "StatuslessThing", Some(&w.ns.name)).await;
    let parent = |size: i64| {
        json!({"apiVersion": "test.metahook.dev/v1", "kind": "StatuslessThing",
               "metadata": {"name": "p", "namespace": w.ns.name, "labels": {"metahook-test": w.label}},
               "spec": {"size": size}})
    };
    apply_value(&w.client, &parent(1)).await;
    let settled = |size: i64| {
        let parents = parents.clone();
        async move {
            let p = parents.get("p").await.ok()?;
            let status = &p.data["status"];
            let right = status["children"] == 2
                && status["size"] == size
                && status["observedGeneration"].as_i64() == p.metadata.generation;
            right.then_some(p)
        }
    };
    eventually(WAIT, || settled(1)).await;
    assert!(w.config_map("p-0").await.is_some() && w.config_map("p-1").await.is_some());

    apply_value(&w.client, &parent(2)).await;
    let at = eventually(WAIT, || settled(2)).await;
    // Five resyncs later, nothing was written: no loop of status writes chasing the generation.
    let calls = calls_for(&w, "p");
    eventually(WAIT, || async { (calls_for(&w, "p") >= calls + 5).then_some(()) }).await;
    let now = parents.get("p").await.unwrap();
    assert_eq!(now.metadata.resource_version, at.metadata.resource_version, "no write once settled");
    assert_eq!(now.metadata.generation, at.metadata.generation);

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("metahook.yaml");
    std::fs::write(&config, format!("targetLabelSelector: \"metahook-test={}\"\n", w.label)).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
        .args(["migrate", "--dry-run", "--config"])
        .arg(&config)
        .arg("--kubeconfig")
        .arg(support::kubeconfig_path())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{report}{}", String::from_utf8_lossy(&output.stderr));
    assert!(report.contains("no status subresource: the status is written with the whole object"), "{report}");
    w.finish("CompositeController").await;
}

/// One ConfigMap per parent, kept while finalizing (the garbage collector deletes it after its parent:
/// a delete of the hub's would sync the parent again, as a delete's echo always does); finalizes at once.
const FINALIZING: &str = r#"
def sync(req):
    name = req["parent"]["metadata"]["name"]
    return {"status": {"seen": True}, "finalized": req["finalizing"],
            "children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}]}
"#;

/// Corner 8: the finalizer's add and removal are the hub's own writes. With `sync-on-own-writes:
/// "false"`, a new parent is synced once — putting the controller's finalizer on it does not sync it
/// again — and its deletion calls the finalize hook once.
#[tokio::test]
async fn the_finalizers_own_writes_sync_nothing_under_the_opt_out() {
    let w = World::new("corner-finalizer", FINALIZING).await;
    w.composite_annotated(
        json!({"metahook.dev/sync-on-own-writes": "false"}),
        json!({"generateSelector": true,
               "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
               "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
               "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}},
                         "finalize": {"webhook": {"url": w.hook.url("/sync")}}}}),
    )
    .await;
    w.thing("f", json!({})).await;
    let finalizer = format!("metacontroller.io/compositecontroller-{}", w.label);
    let things = w.things().await;
    eventually(WAIT, || async {
        let thing = things.get("f").await.unwrap();
        let carries = thing.metadata.finalizers.unwrap_or_default().contains(&finalizer);
        (carries && thing.data["status"]["seen"] == true).then_some(())
    })
    .await;
    eventually(WAIT, || async { w.config_map("f").await }).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let syncs = w.hook.requests("/sync").iter().filter(|r| r["finalizing"] == false).count();
    assert_eq!(syncs, 1, "the finalizer's own write synced the parent again");

    things.delete("f", &DeleteParams::default()).await.unwrap();
    eventually(WAIT, || async { things.get_opt("f").await.unwrap().is_none().then_some(()) }).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let finalizes = w.hook.requests("/sync").iter().filter(|r| r["finalizing"] == true).count();
    assert_eq!(finalizes, 1, "finalized once");
    w.finish("CompositeController").await;
}

/// One ConfigMap named after the parent, from its sync hook and its finalize hook alike; the finalize
/// hook says finalized.
const SAME_CHILDREN: &str = r#"
def child(p):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": p["metadata"]["name"]}, "data": {"v": "1"}}
def sync(req):
    return {"status": {"ok": True}, "children": [child(req["parent"])]}
def finalize(req):
    return {"status": {"ok": True}, "children": [child(req["parent"])], "finalized": True}
"#;

/// Issue 53 item 7: a parent deleted with `--cascade=orphan` whose finalize hook answers the same
/// children as its sync hook is let go, not stuck. The hub is down while the garbage collector takes
/// the parent's ownerReference off the child and its `orphan` finalizer off the parent; the finalize
/// hook's answer then used to be refused on every retry ("already exists and is not controlled by this
/// parent"), so the parent never went. The child stays as it was (the same object), the parent goes,
/// and its finalize hook was asked a handful of times, not on every retry of a stuck sync.
#[tokio::test]
async fn a_parent_orphan_deleted_whose_finalize_hook_answers_its_children_is_let_go() {
    let mut w = World::new("corner-orphan-finalize", SAME_CHILDREN).await;
    let spec = json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}},
                  "finalize": {"webhook": {"url": w.hook.url("/finalize")}}},
    });
    w.composite(spec).await;
    w.thing("kept", json!({})).await;
    let cm = eventually(WAIT, || async { w.config_map("kept").await }).await;
    eventually(WAIT, || async {
        let thing = w.things().await.get("kept").await.unwrap();
        thing.metadata.finalizers.is_some_and(|f| !f.is_empty()).then_some(())
    })
    .await;

    w.stop_hub().await;
    let orphan = DeleteParams { propagation_policy: Some(PropagationPolicy::Orphan), ..DeleteParams::default() };
    w.things().await.delete("kept", &orphan).await.unwrap();
    eventually(WAIT, || async {
        let finalizers = w.things().await.get("kept").await.unwrap().metadata.finalizers.unwrap_or_default();
        (!finalizers.iter().any(|f| f == "orphan")).then_some(())
    })
    .await;
    w.start_hub();
    eventually(WAIT, || async { w.things().await.get_opt("kept").await.unwrap().is_none().then_some(()) }).await;
    let kept = w.config_map("kept").await.expect("the child is kept");
    assert_eq!(kept.metadata.uid, cm.metadata.uid);
    assert!(kept.metadata.owner_references.unwrap_or_default().is_empty(), "orphaned, as asked");
    let finalize_calls = w.hook.requests("/finalize").len();
    assert!((1..=5).contains(&finalize_calls), "finalize hook asked {finalize_calls} times");
    w.finish("CompositeController").await;
}

/// Issue 53 item 7: under `ignoreStatusChanges`, a status someone else wrote is put back by the next
/// resync. The echo of the hub's own status write is a change of status only, so it was ignored before
/// being told from others' changes; its record never cleared, and every later sync took the status as
/// already written: a status patched to 99 stayed 99 through resyncs, the hook answering 1 each time.
#[tokio::test]
async fn under_ignore_status_changes_a_status_written_by_someone_else_is_put_back_by_a_resync() {
    const ONE: &str = r#"
def sync(req):
    return {"status": {"n": 1}, "children": []}
"#;
    let w = World::new("corner-ignore-status", ONE).await;
    let spec = json!({
        "generateSelector": true,
        "resyncPeriodSeconds": 1,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things", "ignoreStatusChanges": true},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps"}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    });
    w.composite(spec).await;
    w.thing("s", json!({})).await;
    let things = w.things().await;
    let status_n = || async { things.get("s").await.unwrap().data["status"]["n"].clone() };
    eventually(WAIT, || async { (status_n().await == json!(1)).then_some(()) }).await;
    let calls = calls_for(&w, "s");
    let patch = Patch::Merge(json!({"status": {"n": 99}}));
    things.patch_status("s", &PatchParams::default(), &patch).await.unwrap();
    eventually(Duration::from_secs(20), || async { (status_n().await == json!(1)).then_some(()) }).await;
    assert!(calls_for(&w, "s") > calls, "a resync put it back");
    w.finish("CompositeController").await;
}
