//! Rolling updates (ControllerRevisions, RollingRecreate / RollingInPlace, statusChecks) with a
//! StatefulSet-like "CatSet" controller whose hook is a real Python process, on the real control plane
//! with fake nodes (Pods become Ready, or stay Pending when they cannot be scheduled).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kube::api::{DeleteParams, DynamicObject, ListParams};
use serde_json::{Value, json};
use support::{World, api, apply_value, eventually};

const WAIT: Duration = Duration::from_secs(90);

/// Pods `<name>-<i>` from `spec.template`, a PVC per Pod (OnDelete) and a headless Service.
const CATSET: &str = r#"
import copy

def sync(req):
    p = req["parent"]
    name, spec = p["metadata"]["name"], p["spec"]
    labels = spec["template"]["metadata"]["labels"]
    pods, pvcs = [], []
    for i in range(spec["replicas"]):
        pod_spec = copy.deepcopy(spec["template"]["spec"])
        pod_spec["hostname"] = "%s-%d" % (name, i)
        pod_spec["subdomain"] = name
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": "%s-%d" % (name, i), "labels": labels,
                                  "annotations": spec["template"]["metadata"].get("annotations", {})},
                     "spec": pod_spec})
        pvcs.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                     "metadata": {"name": "data-%s-%d" % (name, i), "labels": labels},
                     "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
               "spec": {"clusterIP": "None", "selector": labels, "ports": [{"port": 80}]}}
    observed = req["children"]["Pod.v1"].values()
    ready = sum(1 for pod in observed for c in pod.get("status", {}).get("conditions", [])
                if c["type"] == "Ready" and c["status"] == "True")
    return {"status": {"replicas": len(observed), "readyReplicas": ready}, "children": pods + pvcs + [service]}
"#;

impl World {
    /// The test's CatSet controller, rolling its Pods with `pod_method`.
    async fn catset_controller(&self, pod_method: &str) {
        self.composite(json!({
            "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "catsets",
                               "revisionHistory": {"fieldPaths": ["spec.template"]}},
            "childResources": [
                {"apiVersion": "v1", "resource": "pods",
                 "updateStrategy": {"method": pod_method, "statusChecks": {"conditions": [{"type": "Ready", "status": "True"}]}}},
                {"apiVersion": "v1", "resource": "persistentvolumeclaims", "updateStrategy": {"method": "OnDelete"}},
                {"apiVersion": "v1", "resource": "services", "updateStrategy": {"method": "InPlace"}},
            ],
            "hooks": {"sync": {"webhook": {"url": self.hook.url("/sync")}}},
        }))
        .await;
    }

    /// The CatSet `cats` with `replicas` Pods whose template carries `version` (and `extra` pod spec fields).
    async fn catset(&self, replicas: u32, version: &str, extra: Value) {
        let mut pod_spec = json!({"containers": [{"name": "cat", "image": format!("registry.invalid/cat:{version}")}]});
        if let (Some(spec), Some(extra)) = (pod_spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        apply_value(
            &self.client,
            &json!({
                "apiVersion": "test.metahook.dev/v1", "kind": "CatSet",
                "metadata": {"name": "cats", "namespace": self.ns.name, "labels": {"metahook-test": self.label}},
                "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "cats"}},
                         "template": {"metadata": {"labels": {"app": "cats"}, "annotations": {"version": version}},
                                      "spec": pod_spec}},
            }),
        )
        .await;
    }

    async fn pods(&self) -> BTreeMap<String, DynamicObject> {
        let pods = api(&self.client, "v1", "Pod", Some(&self.ns.name)).await;
        let list = pods.list(&ListParams::default().labels("app=cats")).await.unwrap();
        list.items.into_iter().map(|p| (p.metadata.name.clone().unwrap(), p)).collect()
    }

    async fn catset_status(&self) -> Value {
        let api = api(&self.client, "test.metahook.dev/v1", "CatSet", Some(&self.ns.name)).await;
        api.get("cats").await.unwrap().data["status"].clone()
    }

    async fn revisions(&self) -> Vec<DynamicObject> {
        let api = api(&self.client, "metacontroller.k8s.io/v1alpha1", "ControllerRevision", Some(&self.ns.name)).await;
        api.list(&ListParams::default()).await.unwrap().items
    }
}

fn version(pod: &DynamicObject) -> String {
    pod.metadata.annotations.as_ref().and_then(|a| a.get("version")).cloned().unwrap_or_default()
}

fn ready(pod: &DynamicObject) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.data["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

fn updated_condition(status: &Value) -> Value {
    status["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == "Updated").cloned()).unwrap_or_default()
}

/// Waits until `names` are exactly the Pods, all Ready at `version`, while checking at every poll that
/// at most one Pod is away from Ready (missing, terminating or not Ready): one at a time.
async fn roll_to(w: &World, names: &[&str], version: &str) {
    let want: BTreeSet<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let pods = w.pods().await;
        let unavailable = want.iter().filter(|n| !pods.get(*n).is_some_and(ready)).count();
        assert!(unavailable <= 1, "more than one Pod unavailable at once: {:?}", pods.keys().collect::<Vec<_>>());
        let done = pods.keys().cloned().collect::<BTreeSet<_>>() == want
            && pods.values().all(|p| ready(p) && self::version(p) == version);
        if done {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "rollout to {version} did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `names` are exactly the Pods, all Ready at `version` (creation: no one-at-a-time rule).
async fn settle(w: &World, names: &[&str], version: &str) {
    let want: BTreeSet<String> = names.iter().map(|n| (*n).to_owned()).collect();
    eventually(WAIT, || async {
        let pods = w.pods().await;
        let done = pods.keys().cloned().collect::<BTreeSet<_>>() == want
            && pods.values().all(|p| ready(p) && self::version(p) == version);
        done.then_some(())
    })
    .await;
}

/// Rolls the two-Pod CatSet to v2 (see [`roll_to`]): the Pods' UIDs before, and the Pods after.
async fn roll_two_pods_to_v2(w: &World) -> (BTreeMap<String, Option<String>>, BTreeMap<String, DynamicObject>) {
    let before = w.pods().await.into_iter().map(|(n, p)| (n, p.metadata.uid)).collect();
    w.catset(2, "v2", json!({})).await;
    roll_to(w, &["cats-0", "cats-1"], "v2").await;
    (before, w.pods().await)
}

#[tokio::test]
async fn catset_scales_and_rolls_pods_one_at_a_time_waiting_for_ready() {
    let w = World::new("catset-roll", CATSET).await;
    w.catset_controller("RollingRecreate").await;
    w.catset(3, "v1", json!({})).await;
    eventually(WAIT, || async {
        let pods = w.pods().await;
        (pods.len() == 3 && pods.values().all(ready)).then_some(())
    })
    .await;
    eventually(WAIT, || async {
        (updated_condition(&w.catset_status().await)["reason"] == "OnLatestRevision").then_some(())
    })
    .await;
    let pvcs = api(&w.client, "v1", "PersistentVolumeClaim", Some(&w.ns.name)).await;
    assert_eq!(pvcs.list(&ListParams::default()).await.unwrap().items.len(), 3);
    assert!(api(&w.client, "v1", "Service", Some(&w.ns.name)).await.get_opt("cats").await.unwrap().is_some());
    assert_eq!(w.revisions().await.len(), 1);

    // Replicas are not a rolled field: scaling applies at once.
    w.catset(4, "v1", json!({})).await;
    settle(&w, &["cats-0", "cats-1", "cats-2", "cats-3"], "v1").await;
    w.catset(2, "v1", json!({})).await;
    eventually(WAIT, || async { (w.pods().await.len() == 2).then_some(()) }).await;

    let (before, after) = roll_two_pods_to_v2(&w).await;
    for (name, uid) in before {
        assert_ne!(after[&name].metadata.uid, uid, "{name} was recreated (RollingRecreate)");
    }
    let status = eventually(WAIT, || async {
        let s = w.catset_status().await;
        (updated_condition(&s)["reason"] == "OnLatestRevision").then_some(s)
    })
    .await;
    assert!(updated_condition(&status)["message"].as_str().unwrap().contains("latest ControllerRevision"));
    eventually(WAIT, || async { (w.revisions().await.len() == 1).then_some(()) }).await;
    w.finish("CompositeController").await;
}

#[tokio::test]
async fn a_pod_that_never_becomes_ready_halts_the_rollout_across_hub_restarts() {
    let mut w = World::new("catset-halt", CATSET).await;
    w.catset_controller("RollingRecreate").await;
    w.catset(2, "v1", json!({})).await;
    settle(&w, &["cats-0", "cats-1"], "v1").await;
    let old_1 = w.pods().await["cats-1"].metadata.uid.clone();

    // v2 cannot be scheduled anywhere: its first Pod stays Pending.
    w.catset(2, "v2", json!({"nodeSelector": {"metahook.dev/nowhere": "true"}})).await;
    // The condition names the Pod and what it is waiting for.
    eventually(WAIT, || async {
        let c = updated_condition(&w.catset_status().await);
        let message = c["message"].as_str().unwrap_or_default().to_owned();
        (c["reason"] == "RolloutWaiting" && message.contains("Pod cats-0") && message.contains("Ready")).then_some(())
    })
    .await;
    let stuck_0 =
        eventually(WAIT, || async { w.pods().await.get("cats-0").filter(|p| version(p) == "v2").cloned() }).await;

    w.restart_hub().await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let pods = w.pods().await;
    assert_eq!(pods["cats-1"].metadata.uid, old_1, "the rollout must not move past a Pod that is not Ready");
    assert_eq!(version(&pods["cats-1"]), "v1");
    assert_eq!(pods["cats-0"].metadata.uid, stuck_0.metadata.uid, "a restarted hub resumes, it does not replace again");
    assert_eq!(w.revisions().await.len(), 2, "both revisions persisted");

    w.catset(2, "v3", json!({})).await;
    roll_to(&w, &["cats-0", "cats-1"], "v3").await;
    w.finish("CompositeController").await;
}

#[tokio::test]
async fn rolling_in_place_updates_pods_without_recreating_them() {
    let w = World::new("catset-inplace", CATSET).await;
    w.catset_controller("RollingInPlace").await;
    w.catset(2, "v1", json!({})).await;
    settle(&w, &["cats-0", "cats-1"], "v1").await;
    let (before, after) = roll_two_pods_to_v2(&w).await;
    for (name, uid) in before {
        assert_eq!(after[&name].metadata.uid, uid, "{name} was updated in place");
        assert_eq!(after[&name].data["spec"]["containers"][0]["image"], "registry.invalid/cat:v2");
    }
    w.finish("CompositeController").await;
}

/// Metacontroller's documented recovery: a parent deleted with its dependents orphaned, ControllerRevisions
/// included, then created again, adopts the orphaned revisions (they match its selector and carry its
/// type's group/resource labels) and resumes the rollout where it stood. Without adoption the new parent
/// would have no revisions, count every Pod as on the latest revision and replace the v1 Pod at once,
/// although the v2 Pod before it is not Ready.
#[tokio::test]
async fn a_recreated_parent_adopts_orphaned_revisions_and_resumes_the_rollout() {
    let w = World::new("catset-adopt", CATSET).await;
    w.catset_controller("RollingRecreate").await;
    w.catset(2, "v1", json!({})).await;
    settle(&w, &["cats-0", "cats-1"], "v1").await;
    w.catset(2, "v2", json!({"nodeSelector": {"metahook.dev/nowhere": "true"}})).await;
    eventually(WAIT, || async {
        let c = updated_condition(&w.catset_status().await);
        (c["reason"] == "RolloutWaiting" && c["message"].as_str().unwrap_or_default().contains("Pod cats-0"))
            .then_some(())
    })
    .await;
    let v1_pod = w.pods().await["cats-1"].metadata.uid.clone();
    let names = |revisions: &[DynamicObject]| -> BTreeSet<String> {
        revisions.iter().filter_map(|r| r.metadata.name.clone()).collect()
    };
    let before = names(&w.revisions().await);
    assert_eq!(before.len(), 2, "the v1 revision still claims cats-1");

    // Delete the CatSet leaving its dependents; the garbage collector orphans them before it goes.
    let catsets = api(&w.client, "test.metahook.dev/v1", "CatSet", Some(&w.ns.name)).await;
    catsets.delete("cats", &DeleteParams::orphan()).await.unwrap();
    eventually(WAIT, || async { catsets.get_opt("cats").await.unwrap().is_none().then_some(()) }).await;
    let orphaned = w.revisions().await;
    assert!(orphaned.iter().all(|r| r.metadata.owner_references.as_deref().unwrap_or_default().is_empty()));
    // Let the hub's caches see the orphans before the new parent's first sync.
    tokio::time::sleep(Duration::from_secs(1)).await;

    w.catset(2, "v2", json!({"nodeSelector": {"metahook.dev/nowhere": "true"}})).await;
    let uid = catsets.get("cats").await.unwrap().metadata.uid.unwrap();
    let adopted = eventually(WAIT, || async {
        let revisions = w.revisions().await;
        let ours = |r: &DynamicObject| {
            r.metadata.owner_references.iter().flatten().any(|o| o.uid == uid && o.controller == Some(true))
        };
        (revisions.len() == 2 && revisions.iter().all(ours)).then_some(revisions)
    })
    .await;
    assert_eq!(names(&adopted), before, "the orphaned revisions themselves, the v2 one reused as the latest");
    eventually(WAIT, || async {
        let c = updated_condition(&w.catset_status().await);
        (c["reason"] == "RolloutWaiting" && c["message"].as_str().unwrap_or_default().contains("Pod cats-0"))
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let pods = w.pods().await;
    assert_eq!(pods["cats-1"].metadata.uid, v1_pod, "cats-1 stays on the adopted v1 revision");
    assert_eq!(version(&pods["cats-1"]), "v1");

    // The next rollout goes on from the adopted revisions.
    w.catset(2, "v3", json!({})).await;
    roll_to(&w, &["cats-0", "cats-1"], "v3").await;
    eventually(WAIT, || async { (w.revisions().await.len() == 1).then_some(()) }).await;
    w.finish("CompositeController").await;
}
