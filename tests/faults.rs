//! The fault suite: what the hub promises when things go wrong, checked on the real control plane.
//!
//! Nothing lost, nothing taken: every scenario ends with an invariant check — each live parent has
//! exactly the children its hook last returned, each controlled by that parent's UID; no child was
//! deleted and re-created (child UIDs are tracked by a watch for the whole scenario); objects that are
//! not the hub's were not touched. Figures go to stdout and to `target/faults/<scenario>.txt`
//! (`make test` prints them at the end).
//!
//! Scenarios: bad hook responses of every kind (each: children and status untouched, a Warning Event,
//! other parents unaffected); `Recreate` with an invalid replacement; `--cascade=orphan` and
//! `--cascade=foreground` deletes; children changed while their deletion is planned; a parent deleted
//! mid-sync; absurd resync delays; the safe-delete guard; two decorator rules selecting one object; the
//! hook down for 30 s; the hub killed with SIGKILL during a rollout (`FAULT_KILLS`, default 5; `make
//! chaos` runs 20); the API server killed and restarted.
//!
//! The API server restart must not pull the API out from under the other scenarios of this binary (they
//! run in parallel threads): every scenario holds [`API_SERVER`] for reading, the restart for writing.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde_json::{Value, json};
use support::{HookServer, HubProcess, World, api, apply_value, eventually, repo_root, warnings_for};

const WAIT: Duration = Duration::from_secs(120);

static API_SERVER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The fault suite's hook: parent `<p>` with `spec.replicas` (default 3) and `spec.version` wants
/// ConfigMaps `<p>-0..n` carrying the version; `spec.fault` makes it misbehave in one named way.
const HOOK: &str = r#"
import json, time

def cm(name, version, meta=None):
    metadata = {"name": name, "labels": {"app": "faults"}}
    metadata.update(meta or {})
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"v": version}}

def desired(parent):
    spec = parent.get("spec") or {}
    name, version = parent["metadata"]["name"], str(spec.get("version", "1"))
    return [cm(f"{name}-{i}", version) for i in range(int(spec.get("replicas", 3)))]

def sync(req):
    parent = req["parent"]
    spec = parent.get("spec") or {}
    if spec.get("slow"):
        time.sleep(float(spec["slow"]))
    if spec.get("retryAfter"):
        return (429, "", {"Retry-After": str(spec["retryAfter"])})
    version = str(spec.get("version", "1"))
    children = desired(parent)
    status = {"children": len(req["children"]["ConfigMap.v1"]), "version": version}
    fault = spec.get("fault", "")
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "decoy", "uid": spec.get("decoyUid", "x")}
    if fault == "uppercase":
        children.append(cm("Upper-Case", version))
    elif fault == "long-name":
        children.append(cm("x" * 300, version))
    elif fault == "second-controller":
        children[0]["metadata"]["ownerReferences"] = [dict(owner, controller=True)]
    elif fault == "foreign-owner":
        children[0]["metadata"]["ownerReferences"] = [dict(owner, controller=False)]
    elif fault == "bad-label":
        children[1]["metadata"]["labels"] = {"tier": "has spaces"}
    elif fault == "taken":
        children.append(cm("decoy", version))
    elif fault == "bad-status":
        status["children"] = "many"
    elif fault == "array":
        # A JSON array, not an answer: read as a struct's fields by position it was all defaults —
        # no children, no status — and deleted every child.
        return (200, "[]", {"Content-Type": "application/json"})
    elif fault == "huge":
        body = {"status": {"pad": "x" * (20 * 1024 * 1024)}, "children": children}
        return (200, json.dumps(body), {"Content-Type": "application/json"})
    response = {"status": status, "children": children}
    if "resyncAfter" in spec:
        response["resyncAfterSeconds"] = spec["resyncAfter"]
    return response

def finalize(req):
    parent = req["parent"]
    left = req["children"]["ConfigMap.v1"]
    if (parent.get("spec") or {}).get("finalizeMode") == "keep" and "foregroundDeletion" in (parent["metadata"].get("finalizers") or []):
        # Keeps wanting its children while the garbage collector deletes them in the foreground: a hook
        # the hub must not obey then (it would fight the GC).
        return {"children": desired(parent), "finalized": False}
    return {"children": [], "finalized": True}
"#;

// ---- the fleet: parents, their controller, and the invariant checker ----------------------------

struct Fleet {
    w: World,
    tracker: Tracker,
    /// Objects in the namespace the hub must never write, with their resourceVersions.
    decoys: BTreeMap<String, String>,
}

impl Fleet {
    async fn new(test: &str, method: &str, extra_spec: Value) -> Self {
        let _ = std::fs::create_dir_all(repo_root().join("target/faults"));
        let w = World::new(test, HOOK).await;
        let tracker = Tracker::start(&w.client, &w.ns.name);
        let mut spec = json!({
            "generateSelector": true,
            "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "faultthings",
                               "labelSelector": {"matchLabels": {"metahook-test": w.label}}},
            "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": method}}],
            "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync"), "timeout": "20s"}}},
        });
        merge(&mut spec, extra_spec);
        let mut fleet = Self { w, tracker, decoys: BTreeMap::new() };
        fleet.controller(spec, json!({})).await;
        let decoy = fleet.decoy("decoy").await;
        fleet.decoys.insert("decoy".into(), decoy.resource_version().unwrap());
        fleet
    }

    async fn controller(&self, spec: Value, annotations: Value) {
        apply_value(
            &self.w.client,
            &json!({"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
                    "metadata": {"name": self.w.label, "labels": {"metahook-test": self.w.label},
                                 "annotations": annotations},
                    "spec": spec}),
        )
        .await;
    }

    /// An unowned ConfigMap the hub has no business with.
    async fn decoy(&self, name: &str) -> DynamicObject {
        apply_value(
            &self.w.client,
            &json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": self.w.ns.name, "labels": {"owner": "someone-else"}},
                    "data": {"mine": "yes"}}),
        )
        .await
    }

    async fn parents(&self) -> Api<DynamicObject> {
        api(&self.w.client, "test.metahook.dev/v1", "FaultThing", Some(&self.w.ns.name)).await
    }

    fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.w.client.clone(), &self.w.ns.name)
    }

    async fn parent(&self, name: &str, spec: Value) -> DynamicObject {
        apply_value(
            &self.w.client,
            &json!({"apiVersion": "test.metahook.dev/v1", "kind": "FaultThing",
                    "metadata": {"name": name, "namespace": self.w.ns.name, "labels": {"metahook-test": self.w.label}},
                    "spec": spec}),
        )
        .await
    }

    /// Merge-patches a parent's spec (leaving the rest of it alone).
    async fn patch_spec(&self, name: &str, spec: Value) {
        self.parents()
            .await
            .patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": spec})))
            .await
            .unwrap_or_else(|e| panic!("patching {name}: {e}"));
    }

    /// Waits until `name` has exactly its desired children at `version` and a status saying so.
    async fn converged(&self, name: &str, replicas: usize, version: &str) {
        eventually(WAIT, || async {
            let cms = self.config_maps().list(&ListParams::default()).await.ok()?.items;
            let mine: Vec<&ConfigMap> =
                cms.iter().filter(|c| c.name_any().rsplit_once('-').is_some_and(|(p, _)| p == name)).collect();
            let ready = mine.len() == replicas
                && mine.iter().all(|c| c.data.as_ref().and_then(|d| d.get("v")).map(String::as_str) == Some(version));
            let parent = self.parents().await.get(name).await.ok()?;
            let status_ok = parent.data["status"]["children"] == json!(replicas)
                && parent.data["status"]["version"] == json!(version);
            (ready && status_ok).then_some(())
        })
        .await;
    }

    /// The children of `name` as (name → (uid, resourceVersion)), and its status.
    async fn snapshot(&self, name: &str) -> (BTreeMap<String, (String, String)>, Value) {
        let cms = self.config_maps().list(&ListParams::default()).await.unwrap().items;
        let children = cms
            .iter()
            .filter(|c| c.name_any().starts_with(&format!("{name}-")))
            .map(|c| (c.name_any(), (c.uid().unwrap(), c.resource_version().unwrap())))
            .collect();
        let status = self.parents().await.get(name).await.unwrap().data["status"].clone();
        (children, status)
    }

    /// Checks the invariants over the whole namespace and reports the figures.
    async fn check(&self, scenario: &str, extra: &str) -> Figures {
        let parents = self.parents().await.list(&ListParams::default()).await.unwrap().items;
        let cms = self.config_maps().list(&ListParams::default()).await.unwrap().items;
        let by_name: BTreeMap<String, &ConfigMap> = cms.iter().map(|c| (c.name_any(), c)).collect();
        let mut figures = Figures::default();
        let mut expected_names = BTreeSet::new();
        let mut known_names = BTreeSet::new();
        for parent in parents.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            let spec = &parent.data["spec"];
            let replicas = spec["replicas"].as_u64().unwrap_or(3);
            if spec.get("fault").and_then(Value::as_str).is_some_and(|f| !f.is_empty()) {
                // Its hook answers badly; its children (kept as they were) are checked by its scenario.
                known_names.extend((0..replicas).map(|i| format!("{}-{i}", parent.name_any())));
                continue;
            }
            let version = spec["version"].as_str().unwrap_or("1");
            for i in 0..replicas {
                let name = format!("{}-{i}", parent.name_any());
                expected_names.insert(name.clone());
                let Some(cm) = by_name.get(&name) else {
                    figures.lost += 1;
                    continue;
                };
                if cm.data.as_ref().and_then(|d| d.get("v")).map(String::as_str) != Some(version) {
                    figures.stale += 1;
                }
                let controllers: Vec<_> = cm.owner_references().iter().filter(|r| r.controller == Some(true)).collect();
                if controllers.len() != 1 || Some(&controllers[0].uid) != parent.metadata.uid.as_ref() {
                    figures.wrong_owner += 1;
                }
            }
        }
        for cm in &cms {
            let owned = !cm.owner_references().is_empty();
            let name = cm.name_any();
            let known = expected_names.contains(&name) || known_names.contains(&name);
            if owned && !known && cm.metadata.deletion_timestamp.is_none() {
                figures.extra += 1;
            }
        }
        for (name, rv) in &self.decoys {
            if by_name.get(name).and_then(|c| c.resource_version()).as_ref() != Some(rv) {
                figures.touched += 1;
            }
        }
        let seen = self.tracker.uids.lock().unwrap().clone();
        figures.duplicated = seen.values().filter(|uids| uids.len() > 1).count();
        figures.wrongly_deleted =
            self.tracker.deleted.lock().unwrap().iter().filter(|n| expected_names.contains(*n)).count();
        figures.report(scenario, expected_names.len(), extra);
        figures
    }

    async fn finish(self) {
        let mut w = self.w;
        w.stop_hub().await;
        let ccs = api(&w.client, "metacontroller.k8s.io/v1alpha1", "CompositeController", None).await;
        let _ = ccs.delete(&w.label, &DeleteParams::default()).await;
        w.ns.delete().await;
    }
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Figures {
    lost: usize,
    duplicated: usize,
    wrongly_deleted: usize,
    stale: usize,
    wrong_owner: usize,
    extra: usize,
    touched: usize,
}

impl Figures {
    fn report(&self, scenario: &str, children: usize, extra: &str) {
        let line = format!(
            "{scenario}: children={children} lost={} duplicated={} wrongly_deleted={} stale={} wrong_owner={} \
             extra={} foreign_touched={}{extra}",
            self.lost, self.duplicated, self.wrongly_deleted, self.stale, self.wrong_owner, self.extra, self.touched
        );
        println!("{line}");
        let _ = std::fs::write(repo_root().join(format!("target/faults/{scenario}.txt")), format!("{line}\n"));
    }

    fn assert_clean(&self) {
        assert_eq!(self, &Figures::default(), "invariants broken");
    }
}

/// Watches the namespace's ConfigMaps for the whole scenario: every UID each name ever had, and every
/// deletion, so a delete + re-create cannot hide behind a good final state.
struct Tracker {
    uids: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>,
    deleted: Arc<Mutex<Vec<String>>>,
    /// Names created (first seen) since the scenario started.
    added: Arc<Mutex<Vec<(String, Instant)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Tracker {
    fn start(client: &Client, namespace: &str) -> Self {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let uids: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>> = Arc::default();
        let deleted: Arc<Mutex<Vec<String>>> = Arc::default();
        let added: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
        let (u, d, a) = (Arc::clone(&uids), Arc::clone(&deleted), Arc::clone(&added));
        let task = tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                        let fresh = u.lock().unwrap().entry(cm.name_any()).or_default().insert(cm.uid().unwrap());
                        if fresh {
                            a.lock().unwrap().push((cm.name_any(), Instant::now()));
                        }
                    }
                    Ok(watcher::Event::Delete(cm)) => d.lock().unwrap().push(cm.name_any()),
                    _ => {}
                }
            }
        });
        Self { uids, deleted, added, task }
    }

    /// Names first seen after `since`.
    fn added_since(&self, since: Instant) -> Vec<String> {
        self.added.lock().unwrap().iter().filter(|(_, at)| *at > since).map(|(n, _)| n.clone()).collect()
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn merge(base: &mut Value, patch: Value) {
    if let (Some(base), Value::Object(patch)) = (base.as_object_mut(), patch) {
        for (k, v) in patch {
            base.insert(k, v);
        }
    }
}

async fn warning_containing(client: &Client, namespace: &str, name: &str, text: &str) -> String {
    eventually(WAIT, || async { warnings_for(client, namespace, name).await.into_iter().find(|w| w.contains(text)) })
        .await
}

// ---- scenarios -----------------------------------------------------------------------------------

/// Each bad response is refused whole: no child created, changed or deleted, status untouched, one
/// Warning Event naming the cause, and a healthy parent beside it keeps syncing.
#[tokio::test]
async fn bad_responses_change_nothing_and_say_why() {
    let _api = API_SERVER.read().await;
    let fleet = Fleet::new("bad-responses", "InPlace", json!({})).await;
    let decoy_uid = fleet.config_maps().get("decoy").await.unwrap().uid().unwrap();
    let faults = [
        ("uppercase", "Upper-Case: name \"Upper-Case\" is invalid"),
        ("long-name", "(300 characters)"),
        ("second-controller", "metadata.ownerReferences names ConfigMap decoy"),
        ("foreign-owner", "metadata.ownerReferences names ConfigMap decoy"),
        ("bad-label", "label \"tier\" has invalid value"),
        ("taken", "decoy already exists and is not controlled by this parent"),
        ("bad-status", "refused the status"),
        ("huge", "larger than the limit"),
        ("array", "must be a JSON object"),
    ];
    fleet.parent("healthy", json!({"version": "1"})).await;
    for (fault, _) in &faults {
        fleet.parent(fault, json!({"version": "1"})).await;
    }
    for (fault, _) in &faults {
        fleet.converged(fault, 3, "1").await;
    }
    let before: BTreeMap<&str, _> = {
        let mut snapshots = BTreeMap::new();
        for (fault, _) in &faults {
            snapshots.insert(*fault, fleet.snapshot(fault).await);
        }
        snapshots
    };
    // A good answer would now bump every child to version 2; each of these answers is bad. (A status
    // the API server refuses is found out only when written, after the children: that parent's
    // children get nothing to change, so "untouched" means what it says for it too.)
    for (fault, _) in &faults {
        let version = if *fault == "bad-status" { "1" } else { "2" };
        fleet.patch_spec(fault, json!({"fault": fault, "version": version, "decoyUid": decoy_uid})).await;
    }
    for (fault, reason) in &faults {
        let warning = warning_containing(&fleet.w.client, &fleet.w.ns.name, fault, reason).await;
        assert!(warning.starts_with("SyncError: "), "{fault}: {warning}");
    }
    // Other parents are unaffected.
    fleet.patch_spec("healthy", json!({"version": "2"})).await;
    fleet.converged("healthy", 3, "2").await;
    // Give the retries (with backoff) time to go wrong, then look again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (fault, _) in &faults {
        let after = fleet.snapshot(fault).await;
        assert_eq!(after.0, before[fault].0, "{fault}: children were written");
        assert_eq!(after.1, before[fault].1, "{fault}: status was written");
        let warnings = warnings_for(&fleet.w.client, &fleet.w.ns.name, fault).await;
        assert!(!warnings.is_empty() && warnings.iter().all(|w| w.starts_with("SyncError")), "{fault}: {warnings:?}");
    }
    fleet.check("bad_responses", "").await.assert_clean();
    fleet.finish().await;
}

/// `Recreate` deletes a child only when the API server would accept its replacement: a hook answering
/// with an invalid Pod gets a SyncError, and the running Pod stays.
#[tokio::test]
async fn recreate_keeps_the_child_when_its_replacement_would_be_refused() {
    let _api = API_SERVER.read().await;
    const PODS: &str = r#"
def sync(req):
    p = req["parent"]
    image = p["spec"]["image"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": p["metadata"]["name"] + "-pod"},
           "spec": {"containers": [{"name": p["spec"].get("container", "main"), "image": image}],
                    "nodeSelector": p["spec"].get("nodeSelector", {})}}
    return {"status": {}, "children": [pod]}
"#;
    let mut w = World::new("recreate-invalid", PODS).await;
    apply_value(
        &w.client,
        &json!({"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
                "metadata": {"name": w.label, "labels": {"metahook-test": w.label}},
                "spec": {"generateSelector": true,
                         "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things",
                                            "labelSelector": {"matchLabels": {"metahook-test": w.label}}},
                         "childResources": [{"apiVersion": "v1", "resource": "pods",
                                             "updateStrategy": {"method": "Recreate"}}],
                         "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}}}}),
    )
    .await;
    let things = api(&w.client, "test.metahook.dev/v1", "Thing", Some(&w.ns.name)).await;
    let thing = |spec: Value| {
        json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing",
               "metadata": {"name": "web", "namespace": w.ns.name, "labels": {"metahook-test": w.label}},
               "spec": spec})
    };
    apply_value(&w.client, &thing(json!({"image": "nginx:1"}))).await;
    let pods: Api<DynamicObject> = api(&w.client, "v1", "Pod", Some(&w.ns.name)).await;
    let first = eventually(WAIT, || async { pods.get_opt("web-pod").await.unwrap() }).await;
    // An immutable change with an invalid container name: the replacement would be refused.
    apply_value(&w.client, &thing(json!({"image": "nginx:2", "container": "Not_Valid"}))).await;
    let warning = warning_containing(&w.client, &w.ns.name, "web", "not recreating Pod").await;
    assert!(warning.contains("Not_Valid") || warning.contains("containers"), "{warning}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = pods.get("web-pod").await.unwrap();
    assert_eq!(still.uid(), first.uid(), "the running Pod must not be deleted");
    assert!(still.metadata.deletion_timestamp.is_none());
    // A valid immutable change is still recreated, as Recreate promises.
    apply_value(&w.client, &thing(json!({"image": "nginx:2"}))).await;
    eventually(WAIT, || async {
        pods.get_opt("web-pod")
            .await
            .unwrap()
            .filter(|p| p.uid() != first.uid() && p.data["spec"]["containers"][0]["image"] == "nginx:2")
    })
    .await;
    let _ = things.delete("web", &DeleteParams::default()).await;
    w.stop_hub().await;
    let ccs = api(&w.client, "metacontroller.k8s.io/v1alpha1", "CompositeController", None).await;
    let _ = ccs.delete(&w.label, &DeleteParams::default()).await;
    w.ns.delete().await;
}

/// `kubectl delete --cascade=orphan` keeps the children (the finalize hook runs, but its empty answer
/// deletes nothing); `--cascade=foreground` lets the garbage collector delete them without the hub
/// putting them back, even though the finalize hook asks for them for as long as the GC's finalizer is on.
#[tokio::test]
async fn orphan_and_foreground_deletes_are_left_to_the_garbage_collector() {
    let _api = API_SERVER.read().await;
    let finalize = |w: &World| json!({"finalize": {"webhook": {"url": w.hook.url("/finalize")}}});
    let fleet = Fleet::new("gc-finalizers", "InPlace", json!({})).await;
    let mut spec = json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "faultthings",
                           "labelSelector": {"matchLabels": {"metahook-test": fleet.w.label}}},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
        "hooks": {"sync": {"webhook": {"url": fleet.w.hook.url("/sync")}}},
    });
    merge(&mut spec["hooks"], finalize(&fleet.w));
    fleet.controller(spec, json!({})).await;
    fleet.parent("orphaned", json!({"version": "1"})).await;
    fleet.parent("foreground", json!({"version": "1", "finalizeMode": "keep"})).await;
    fleet.converged("orphaned", 3, "1").await;
    fleet.converged("foreground", 3, "1").await;
    let (orphans, _) = fleet.snapshot("orphaned").await;
    let parents = fleet.parents().await;
    eventually(WAIT, || async {
        let p = parents.get("orphaned").await.unwrap();
        p.finalizers().iter().any(|f| f.starts_with("metacontroller.io/")).then_some(())
    })
    .await;

    let since = Instant::now();
    parents.delete("orphaned", &DeleteParams::orphan()).await.unwrap();
    parents.delete("foreground", &DeleteParams::foreground()).await.unwrap();
    eventually(WAIT, || async {
        let gone = parents.get_opt("orphaned").await.unwrap().is_none()
            && parents.get_opt("foreground").await.unwrap().is_none();
        gone.then_some(())
    })
    .await;
    // Orphaned children survive, same objects, no longer owned.
    let cms = fleet.config_maps();
    let kept = eventually(WAIT, || async {
        let mut kept = BTreeMap::new();
        for name in orphans.keys() {
            let cm = cms.get_opt(name).await.unwrap()?;
            if !cm.owner_references().is_empty() {
                return None;
            }
            kept.insert(name.clone(), cm.uid().unwrap());
        }
        Some(kept)
    })
    .await;
    for (name, (uid, _)) in &orphans {
        assert_eq!(&kept[name], uid, "{name} was replaced");
    }
    // Foreground: the GC deleted them, and the hub never put one back.
    eventually(WAIT, || async {
        let left = cms.list(&ListParams::default()).await.unwrap().items;
        (!left.iter().any(|c| c.name_any().starts_with("foreground-"))).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let recreated: Vec<String> = fleet.tracker.added_since(since);
    assert!(recreated.is_empty(), "children created after the deletes began: {recreated:?}");
    let figures = fleet.check("gc_finalizers", "").await;
    assert_eq!(figures.duplicated, 0);
    fleet.finish().await;
}

/// A parent deleted while its hook is still thinking gets no children: the hub checks the live parent
/// before its first write, instead of re-creating children the garbage collector has just removed.
#[tokio::test]
async fn a_parent_deleted_mid_sync_gets_no_children() {
    let _api = API_SERVER.read().await;
    let fleet = Fleet::new("deleted-mid-sync", "InPlace", json!({})).await;
    let since = Instant::now();
    fleet.parent("doomed", json!({"version": "1", "replicas": 5, "slow": 3})).await;
    // Wait for the hook to have the request, then delete the parent under it.
    eventually(WAIT, || async { (!fleet.w.hook.requests("/sync").is_empty()).then_some(()) }).await;
    fleet.parents().await.delete("doomed", &DeleteParams::default()).await.unwrap();
    // The hook answers 3 s after it was asked; give the hub time to act on the answer.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let created = fleet.tracker.added_since(since);
    let doomed: Vec<&String> = created.iter().filter(|n| n.starts_with("doomed-")).collect();
    println!("deleted_mid_sync: transient_children={}", doomed.len());
    let _ = std::fs::write(
        repo_root().join("target/faults/deleted_mid_sync.txt"),
        format!("deleted_mid_sync: transient_children={}\n", doomed.len()),
    );
    assert!(doomed.is_empty(), "children written for a deleted parent: {doomed:?}");
    fleet.finish().await;
}

/// A child the hook stops wanting is deleted only as the hub observed it. Two children dropped in one
/// answer change while the hook is thinking: `changed-1` is annotated (still the parent's) and
/// `changed-2` is released by its user (owner reference and labels removed: no longer the parent's).
/// The sync's deletes, planned on what the hook was shown, are refused for both (resourceVersion
/// precondition); the change's own watch event syncs the parent again on what is there now, which
/// deletes `changed-1` and leaves `changed-2` alone. Resync is an hour, so only that change-driven sync
/// can have done it.
#[tokio::test]
async fn a_child_changed_during_its_sync_is_deleted_only_if_still_the_parents() {
    let _api = API_SERVER.read().await;
    let fleet = Fleet::new("changed-during-sync", "InPlace", json!({"resyncPeriodSeconds": 3600})).await;
    fleet.parent("changed", json!({"version": "1"})).await;
    fleet.converged("changed", 3, "1").await;
    let shown = |r: &Value, child: &str| r["children"]["ConfigMap.v1"][child].clone();
    let asked_before = fleet.w.hook.requests("/sync").len();
    // One answer drops both children; the hook takes 4 s to give it.
    fleet.patch_spec("changed", json!({"replicas": 1, "slow": 4})).await;
    eventually(WAIT, || async {
        let requests = fleet.w.hook.requests("/sync");
        requests[asked_before.min(requests.len())..]
            .iter()
            .any(|r| r["parent"]["spec"]["replicas"] == 1 && !shown(r, "changed-2").is_null())
            .then_some(())
    })
    .await;
    let cms = fleet.config_maps();
    let mut kept = cms.get("changed-1").await.unwrap();
    kept.annotations_mut().insert("touched".into(), "by-a-user".into());
    let kept = cms.replace("changed-1", &PostParams::default(), &kept).await.unwrap();
    let mut released = cms.get("changed-2").await.unwrap();
    released.metadata.owner_references = None;
    released.metadata.labels = Some([("released".to_owned(), "by-a-user".to_owned())].into());
    let released = cms.replace("changed-2", &PostParams::default(), &released).await.unwrap();
    let since = Instant::now();

    // The parent's next sync is shown changed-1 as changed, and deletes it.
    eventually(WAIT, || async { cms.get_opt("changed-1").await.unwrap().is_none().then_some(()) }).await;
    let deleted_after = since.elapsed();
    let requests = fleet.w.hook.requests("/sync");
    assert!(
        requests.iter().any(|r| {
            let child = shown(r, "changed-1");
            child["metadata"]["annotations"]["touched"] == "by-a-user"
                && child["metadata"]["resourceVersion"] == json!(kept.resource_version())
        }),
        "changed-1 was deleted before any sync was shown it changed"
    );
    // changed-2 is no longer the parent's: never shown again, never written.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let now = cms.get("changed-2").await.expect("the released child was deleted");
    assert_eq!(now.uid(), released.uid());
    assert_eq!(now.resource_version(), released.resource_version(), "the released child was written");
    let line = format!(" deleted_after_change_s={:.2}", deleted_after.as_secs_f64());
    fleet.check("changed_during_sync", &line).await.assert_clean();
    fleet.finish().await;
}

/// Absurd delays from a hook (resync in 1e9 or 9e18 seconds, Retry-After of centuries) are capped:
/// the controller's queue keeps working for every parent, including those very ones.
#[tokio::test]
async fn absurd_delays_from_a_hook_do_not_stop_the_queue() {
    let _api = API_SERVER.read().await;
    let fleet = Fleet::new("absurd-delays", "InPlace", json!({})).await;
    fleet.parent("forever", json!({"version": "1", "resyncAfter": 9e18})).await;
    fleet.parent("decades", json!({"version": "1", "resyncAfter": 1e9})).await;
    fleet.parent("centuries", json!({"version": "1", "retryAfter": 99_999_999_999_u64})).await;
    fleet.converged("forever", 3, "1").await;
    fleet.converged("decades", 3, "1").await;
    // The very parents that asked for absurd delays still sync on their next change...
    fleet.patch_spec("forever", json!({"version": "2"})).await;
    fleet.patch_spec("decades", json!({"version": "2"})).await;
    fleet.patch_spec("centuries", json!({"retryAfter": null, "version": "2"})).await;
    fleet.converged("forever", 3, "2").await;
    fleet.converged("decades", 3, "2").await;
    fleet.converged("centuries", 3, "2").await;
    // ...and delayed requeues of other parents still fire (the timer survived).
    fleet.parent("ticking", json!({"version": "1", "resyncAfter": 0.5})).await;
    fleet.converged("ticking", 3, "1").await;
    let count =
        || fleet.w.hook.requests("/sync").iter().filter(|r| r["parent"]["metadata"]["name"] == "ticking").count();
    let before = count();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(count() >= before + 3, "resyncAfterSeconds 0.5 gave {} calls in 4 s", count() - before);
    fleet.check("absurd_delays", "").await.assert_clean();
    fleet.finish().await;
}

/// The safe-delete guard refuses a sync that would delete more than its share of a parent's children
/// (the classic hook bug: an empty list), until the parent acknowledges exactly those deletions.
#[tokio::test]
async fn the_safe_delete_guard_holds_mass_deletions_until_acknowledged() {
    let _api = API_SERVER.read().await;
    let fleet = Fleet::new("delete-guard", "InPlace", json!({})).await;
    let spec = json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "faultthings",
                           "labelSelector": {"matchLabels": {"metahook-test": fleet.w.label}}},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
        "hooks": {"sync": {"webhook": {"url": fleet.w.hook.url("/sync")}}},
    });
    fleet.controller(spec, json!({"metahook.dev/max-deletions-per-sync": "50%"})).await;
    fleet.parent("guarded", json!({"version": "1", "replicas": 4})).await;
    fleet.converged("guarded", 4, "1").await;
    // Within the share: 4 -> 2 deletes half, allowed.
    fleet.patch_spec("guarded", json!({"replicas": 2})).await;
    fleet.converged("guarded", 2, "1").await;
    // Beyond it: everything at once is held.
    let (before, _) = fleet.snapshot("guarded").await;
    fleet.patch_spec("guarded", json!({"replicas": 0})).await;
    let warning = warning_containing(&fleet.w.client, &fleet.w.ns.name, "guarded", "DeletionGuard:").await;
    assert!(warning.contains("would delete 2 of 2 children"), "{warning}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(fleet.snapshot("guarded").await.0, before, "children deleted despite the guard");
    // The Event names the acknowledgement; with it, exactly this deletion goes through.
    let token = warning.rsplit("metahook.dev/confirm-deletions=").next().unwrap().trim().to_owned();
    fleet
        .parents()
        .await
        .patch(
            "guarded",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"metahook.dev/confirm-deletions": token}}})),
        )
        .await
        .unwrap();
    eventually(WAIT, || async {
        let (children, status) = fleet.snapshot("guarded").await;
        (children.is_empty() && status["children"] == 0).then_some(())
    })
    .await;
    fleet.finish().await;
}

/// Two `resources[]` rules of one type are one target per object: an object only the second rule
/// selects is synced, never finalized by the first.
#[tokio::test]
async fn decorator_rules_of_one_type_share_one_key_per_object() {
    let _api = API_SERVER.read().await;
    const DECORATE: &str = r#"
def sync(req):
    return {"labels": {"decorated": "yes"}}

def finalize(req):
    return {"labels": {"decorated": None}, "finalized": True}
"#;
    let mut w = World::new("decorator-rules", DECORATE).await;
    apply_value(
        &w.client,
        &json!({"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "DecoratorController",
                "metadata": {"name": w.label, "labels": {"metahook-test": w.label}},
                "spec": {"resources": [
                            {"apiVersion": "v1", "resource": "configmaps", "labelSelector": {"matchLabels": {"rule-a": w.label}}},
                            {"apiVersion": "v1", "resource": "configmaps", "labelSelector": {"matchLabels": {"rule-b": w.label}}}],
                         "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}},
                                   "finalize": {"webhook": {"url": w.hook.url("/finalize")}}}}}),
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(w.client.clone(), &w.ns.name);
    apply_value(
        &w.client,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "only-b", "namespace": w.ns.name, "labels": {"rule-b": w.label}}}),
    )
    .await;
    eventually(WAIT, || async {
        let cm = cms.get("only-b").await.ok()?;
        (cm.labels().get("decorated").map(String::as_str) == Some("yes")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let finalizing = w.hook.requests("/finalize").len();
    assert_eq!(finalizing, 0, "a rule that does not select the object finalized it");
    let cm = cms.get("only-b").await.unwrap();
    assert_eq!(cm.labels().get("decorated").map(String::as_str), Some("yes"));
    // Deleting it runs the finalize hook (which lets it go) while the hub still runs.
    let _ = cms.delete("only-b", &DeleteParams::default()).await;
    eventually(WAIT, || async { cms.get_opt("only-b").await.unwrap().is_none().then_some(()) }).await;
    w.stop_hub().await;
    w.ns.delete().await;
}

/// With the hook down for 30 s, children stay as they are (syncs fail with an Event and back off);
/// when it comes back the parents converge.
#[tokio::test]
async fn a_hook_down_for_30_seconds_loses_nothing() {
    let _api = API_SERVER.read().await;
    let mut fleet = Fleet::new("hook-down", "InPlace", json!({})).await;
    for i in 0..5 {
        fleet.parent(&format!("p{i}"), json!({"version": "1"})).await;
    }
    for i in 0..5 {
        fleet.converged(&format!("p{i}"), 3, "1").await;
    }
    let before = fleet.snapshot("p0").await.0;
    let port = fleet.w.hook.port;
    // Stop the hook (kill its process), change every parent, wait 30 s.
    let handlers_down = std::mem::replace(&mut fleet.w.hook, HookServer::start(HOOK).await);
    drop(handlers_down);
    let down_since = Instant::now();
    for i in 0..5 {
        fleet.patch_spec(&format!("p{i}"), json!({"version": "2"})).await;
    }
    warning_containing(&fleet.w.client, &fleet.w.ns.name, "p0", "http error").await;
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(down_since.elapsed())).await;
    assert_eq!(fleet.snapshot("p0").await.0, before, "children changed while the hook was down");
    fleet.w.hook = HookServer::start_on(HOOK, port).await;
    let back = Instant::now();
    for i in 0..5 {
        fleet.converged(&format!("p{i}"), 3, "2").await;
    }
    let recovery = back.elapsed().as_secs_f64();
    fleet.check("hook_down_30s", &format!(" recovery_s={recovery:.1}")).await.assert_clean();
    fleet.finish().await;
}

/// The hub, as its own process, is killed with SIGKILL again and again while parents roll to new
/// versions; after each restart the work goes on. At the end: nothing lost, nothing created twice,
/// nothing wrongly deleted.
#[tokio::test]
async fn killing_the_hub_mid_rollout_loses_and_duplicates_nothing() {
    let _api = API_SERVER.read().await;
    let kills: usize = std::env::var("FAULT_KILLS").ok().and_then(|k| k.parse().ok()).unwrap_or(5);
    let parents: usize = std::env::var("FAULT_PARENTS").ok().and_then(|k| k.parse().ok()).unwrap_or(20);
    let mut fleet = Fleet::new("hub-kills", "InPlace", json!({})).await;
    fleet.w.stop_hub().await;
    let mut hub = HubProcess::start(&fleet.w.label);
    for i in 0..parents {
        fleet.parent(&format!("p{i}"), json!({"version": "0"})).await;
    }
    let started = Instant::now();
    for round in 1..=kills {
        for i in 0..parents {
            fleet.patch_spec(&format!("p{i}"), json!({"version": round.to_string()})).await;
        }
        // Kill it somewhere inside the rollout: after 0.3-1.5 s of work.
        let pause = 300 + (round * 377 % 1200);
        tokio::time::sleep(Duration::from_millis(pause as u64)).await;
        hub.kill();
        hub = HubProcess::start(&fleet.w.label);
    }
    for i in 0..parents {
        fleet.converged(&format!("p{i}"), 3, &kills.to_string()).await;
    }
    let figures = fleet
        .check("hub_kills", &format!(" kills={kills} parents={parents} total_s={:.1}", started.elapsed().as_secs_f64()))
        .await;
    drop(hub);
    figures.assert_clean();
    fleet.finish().await;
}

/// kube-apiserver is killed and started again under a running hub: the hub reconnects by itself and
/// the first child write for a change made right after the API server is ready follows within seconds.
#[tokio::test]
async fn the_hub_recovers_by_itself_from_an_api_server_restart() {
    let fleet = Fleet::new("apiserver-restart", "InPlace", json!({})).await;
    for i in 0..5 {
        fleet.parent(&format!("p{i}"), json!({"version": "1"})).await;
    }
    for i in 0..5 {
        fleet.converged(&format!("p{i}"), 3, "1").await;
    }
    let recovery = {
        let _exclusive = API_SERVER.write().await;
        let out = tokio::process::Command::new("bash")
            .arg(repo_root().join("tests/cluster/restart.sh"))
            .args(["kube-apiserver", "5"])
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "restart.sh: {}", String::from_utf8_lossy(&out.stderr));
        // Ready now: change a parent at once and time its first child write.
        let ready = Instant::now();
        eventually(WAIT, || async {
            fleet
                .parents()
                .await
                .patch("p0", &PatchParams::default(), &Patch::Merge(json!({"spec": {"version": "2"}})))
                .await
                .ok()
        })
        .await;
        let cms = fleet.config_maps();
        eventually(WAIT, || async {
            let cm = cms.get("p0-0").await.ok()?;
            (cm.data.as_ref()?.get("v")? == "2").then_some(())
        })
        .await;
        ready.elapsed().as_secs_f64()
    };
    for i in 1..5 {
        fleet.patch_spec(&format!("p{i}"), json!({"version": "2"})).await;
    }
    for i in 0..5 {
        fleet.converged(&format!("p{i}"), 3, "2").await;
    }
    fleet.check("apiserver_restart", &format!(" first_write_after_ready_s={recovery:.2}")).await.assert_clean();
    fleet.finish().await;
}

/// Creating an object with a name that is taken is refused by the API server, not an upsert: the
/// precondition the hub relies on, checked on this API server.
#[tokio::test]
async fn the_create_precondition_holds_on_this_api_server() {
    let _api = API_SERVER.read().await;
    let client = support::client().await;
    let ns = support::TestNamespace::create(&client, "create-precondition").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let existing: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "taken"}, "data": {"a": "1"}})).unwrap();
    let existing = cms.create(&PostParams::default(), &existing).await.unwrap();
    let params = PatchParams::apply("metahook").force();
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": "taken", "resourceVersion": "1"}, "data": {"a": "2"}});
    let err = cms.patch("taken", &params, &Patch::Apply(&body)).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 409), "{err}");
    assert_eq!(cms.get("taken").await.unwrap().resource_version(), existing.resource_version());
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": "fresh", "resourceVersion": "1"}, "data": {"a": "2"}});
    let created = cms.patch("fresh", &params, &Patch::Apply(&body)).await.unwrap();
    assert_ne!(created.resource_version().as_deref(), Some("1"));
    ns.delete().await;
}

/// The hub's applier over the ConfigMaps of a namespace of the test's own: single writes, as a sync
/// makes them, without a controller around them.
struct ConfigMapWrites {
    ns: support::TestNamespace,
    cms: Api<ConfigMap>,
    resource: metahook::cache::discovery::ResolvedResource,
    applier: metahook::write::apply::Applier,
}

impl ConfigMapWrites {
    async fn new(test: &str) -> Self {
        let client = support::client().await;
        let ns = support::TestNamespace::create(&client, test).await;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
        let resource = metahook::cache::discovery::ResolvedResource {
            api_resource: kube::core::ApiResource::erase::<ConfigMap>(&()),
            namespaced: true,
            has_status: false,
        };
        let applier = metahook::write::apply::Applier::new(client, "metahook".into());
        Self { ns, cms, resource, applier }
    }
}

/// A child deleted by someone else (the garbage collector, a user) while the hub deletes it too: the
/// hub's delete reports that it deleted nothing, so the other deletion's watch event is not taken for the
/// echo of the hub's own write (under `sync-on-own-writes: "false"` an echo is not synced, and the parent
/// would wait for its next resync to see its child gone). The replaced-child case: same name, new UID,
/// left alone. A child changed since it was observed is left alone too (resourceVersion precondition).
#[tokio::test]
async fn a_delete_that_finds_the_child_gone_or_replaced_claims_nothing() {
    let _api = API_SERVER.read().await;
    let ConfigMapWrites { ns, cms, resource, applier } = ConfigMapWrites::new("delete-gone").await;
    let create = |name: &str| {
        serde_json::from_value::<ConfigMap>(json!({"metadata": {"name": name, "namespace": ns.name}})).unwrap()
    };
    let as_dynamic =
        |cm: &ConfigMap| serde_json::from_value::<DynamicObject>(serde_json::to_value(cm).unwrap()).unwrap();

    let child = as_dynamic(&cms.create(&PostParams::default(), &create("c")).await.unwrap());
    assert!(applier.delete(&resource, &child).await.unwrap(), "the first delete deletes");
    assert!(!applier.delete(&resource, &child).await.unwrap(), "the child is gone: nothing deleted");

    let old = as_dynamic(&cms.create(&PostParams::default(), &create("r")).await.unwrap());
    cms.delete("r", &DeleteParams::default()).await.unwrap();
    let replacement = cms.create(&PostParams::default(), &create("r")).await.unwrap();
    assert!(!applier.delete(&resource, &old).await.unwrap(), "another object of the same name: nothing deleted");
    assert_eq!(cms.get("r").await.unwrap().uid(), replacement.uid(), "the replacement is left alone");

    let observed = as_dynamic(&cms.create(&PostParams::default(), &create("v")).await.unwrap());
    let mut changed = cms.get("v").await.unwrap();
    changed.labels_mut().insert("changed".into(), "yes".into());
    let changed = cms.replace("v", &PostParams::default(), &changed).await.unwrap();
    assert!(!applier.delete(&resource, &observed).await.unwrap(), "changed since observed: nothing deleted");
    assert_eq!(cms.get("v").await.unwrap().resource_version(), changed.resource_version(), "the change is left alone");
    assert!(applier.delete(&resource, &as_dynamic(&changed)).await.unwrap(), "as observed now: deleted");
    ns.delete().await;
}

/// The update that lets a sync skip reading its parent: a child's apply names the resourceVersion it was
/// observed at. A sync that only updates children checks its parent in the cache, which may not show an
/// orphaning delete yet; the garbage collector may by then have taken the owner reference off the
/// child the hook was shown. That apply must not put the reference back (the collector would delete
/// the child the user asked to keep, its owner being gone): it is refused as stale, and the child stays
/// as the collector left it. The real collector orphans it here.
#[tokio::test]
async fn an_update_planned_before_the_collector_orphaned_a_child_does_not_give_it_back_its_owner() {
    let _api = API_SERVER.read().await;
    let ConfigMapWrites { ns, cms, resource, applier } = ConfigMapWrites::new("orphaned-update").await;
    let parent = cms
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "parent"}})).unwrap())
        .await
        .unwrap();
    let owner = json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "parent", "uid": parent.uid(),
                       "controller": true, "blockOwnerDeletion": true});
    let desired = |v: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "child", "namespace": ns.name, "ownerReferences": [owner]}, "data": {"v": v}})
    };
    let nothing = metahook::write::apply::ADOPTS_NOTHING;
    let method = metahook::api::UpdateMethod::InPlace;
    let created = applier.apply(&resource, &desired("1"), None, method, nothing, || false).await.unwrap();
    assert!(matches!(created, metahook::write::apply::Applied::Created { .. }));
    let observed: DynamicObject =
        serde_json::from_value(serde_json::to_value(cms.get("child").await.unwrap()).unwrap()).unwrap();
    assert_eq!(observed.owner_references().len(), 1, "the child names its parent");

    let orphan =
        DeleteParams { propagation_policy: Some(kube::api::PropagationPolicy::Orphan), ..DeleteParams::default() };
    cms.delete("parent", &orphan).await.unwrap();
    let orphaned = eventually(WAIT, || async {
        let child = cms.get("child").await.unwrap();
        (cms.get_opt("parent").await.unwrap().is_none() && child.owner_references().is_empty()).then_some(child)
    })
    .await;

    let refused = applier.apply(&resource, &desired("2"), Some(&observed), method, nothing, || false).await;
    assert!(matches!(&refused, Err(e) if e.is_stale()), "an apply over the orphaning is refused: {refused:?}");
    // Had it put the reference back, the collector would delete the child: give it the time to.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let kept = cms.get("child").await.unwrap();
    assert_eq!(kept.uid(), orphaned.uid(), "the child the user kept is there");
    assert!(kept.owner_references().is_empty(), "and has no owner");
    assert_eq!(kept.resource_version(), orphaned.resource_version(), "nor was it written");
    ns.delete().await;
}
