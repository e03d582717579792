//! Children in other namespaces (issue 44, part 2; the book's "Children in other namespaces") on the
//! real control plane: a child type declared `crossNamespace` lets a namespaced parent's hook put children
//! in another namespace, tracked by the parent's UID label instead of an ownerReference, under the same
//! rules as owned children — drift put back, a dropped child deleted, a name held by anyone else refusing
//! the whole sync, another parent's child never claimed, a selected orphan adopted in place — and deleted
//! by the hub with their parent (also when the hub was down meanwhile), kept under `--cascade=orphan`.

mod support;

use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams, PropagationPolicy};
use serde_json::{Value, json};
use support::elsewhere::{
    HOOK, PARENT, PARENT_UID, annotation, child, config_map, config_map_with_v, cross_namespace_spec, label,
};
use support::replicas::Replicas;
use support::{TestNamespace, World, eventually};

const WAIT: Duration = Duration::from_secs(60);
/// The world: a controller of Things whose ConfigMaps are `crossNamespace`, and a second namespace.
async fn world(test: &str) -> (World, TestNamespace) {
    world_with(test, cross_namespace_spec).await
}

/// [`world`] with the controller `spec` makes.
async fn world_with(test: &str, spec: impl Fn(&World) -> Value) -> (World, TestNamespace) {
    let w = World::new(test, HOOK).await;
    let other = TestNamespace::create(&w.client, &format!("{test}-b")).await;
    w.composite(spec(&w)).await;
    (w, other)
}

/// Deletes the second namespace, then the world.
async fn finish(w: World, other: TestNamespace) {
    other.delete().await;
    w.finish("CompositeController").await;
}

/// [`cross_namespace_spec`] whose parents adopt selected orphans in every namespace
/// (`adoptAcrossNamespaces`, the controller author's opt-in).
fn adopting_everywhere_spec(w: &World) -> Value {
    let mut spec = cross_namespace_spec(w);
    spec["childResources"][0]["adoptAcrossNamespaces"] = json!(true);
    spec
}

/// [`cross_namespace_spec`] without `generateSelector`: each parent's own `spec.selector` selects its
/// children (as whoever may create a parent writes it).
fn parent_selector_spec(w: &World) -> Value {
    let mut spec = cross_namespace_spec(w);
    spec.as_object_mut().unwrap().remove("generateSelector");
    spec
}

async fn exists(w: &World, namespace: &str, name: &str) -> kube::api::DynamicObject {
    eventually(WAIT, || config_map(w, namespace, name)).await
}

async fn gone(w: &World, namespace: &str, name: &str) {
    eventually(WAIT, || async { config_map(w, namespace, name).await.is_none().then_some(()) }).await;
}

#[tokio::test]
async fn a_child_elsewhere_carries_its_parents_uid_and_is_put_back_and_deleted_like_an_owned_one() {
    let (w, other) = world("xns-rules").await;
    let b = other.name.as_str();
    let parent = w.thing("p1", json!({"children": [child("p1-a", None), child("p1-b", Some(b))]})).await;
    let uid = parent.metadata.uid.clone().unwrap();
    let here = exists(&w, &w.ns.name, "p1-a").await;
    let there = exists(&w, b, "p1-b").await;
    // Here an ownerReference, as always; there the parent's marks, and no ownerReference.
    assert_eq!(here.metadata.owner_references.as_ref().unwrap()[0].uid, uid);
    assert!(label(&here, PARENT_UID).is_none());
    assert!(there.metadata.owner_references.as_ref().is_none_or(Vec::is_empty), "{:?}", there.metadata);
    assert_eq!(label(&there, PARENT_UID), Some(uid.as_str()));
    assert_eq!(annotation(&there, PARENT).map(str::to_owned), Some(format!("{}/p1", w.ns.name)));
    // The hook sees it among the parent's children, keyed namespace/name.
    let expected = json!(["p1-a", format!("{b}/p1-b")]);
    eventually(WAIT, || async {
        let thing = w.things().await.get("p1").await.unwrap();
        (thing.data["status"]["seen"] == expected).then_some(())
    })
    .await;

    // Drift is put back; a deleted child is made again.
    let cms = support::api(&w.client, "v1", "ConfigMap", Some(b)).await;
    let drift = json!({"data": {"v": "drifted"}});
    cms.patch("p1-b", &PatchParams::default(), &Patch::Merge(&drift)).await.unwrap();
    config_map_with_v(&w, b, "p1-b", "1", WAIT).await;
    cms.delete("p1-b", &DeleteParams::default()).await.unwrap();
    let again = eventually(WAIT, || async {
        config_map(&w, b, "p1-b").await.filter(|cm| cm.metadata.uid != there.metadata.uid)
    })
    .await;
    assert_eq!(label(&again, PARENT_UID), Some(uid.as_str()));

    // A child the hook no longer asks for is deleted; the other stays.
    w.thing("p1", json!({"children": [child("p1-a", None)]})).await;
    gone(&w, b, "p1-b").await;
    assert_eq!(config_map(&w, &w.ns.name, "p1-a").await.unwrap().metadata.uid, here.metadata.uid);

    finish(w, other).await;
}

#[tokio::test]
async fn a_name_held_elsewhere_by_anyone_else_refuses_that_namespace_only_and_a_selected_orphan_is_adopted() {
    // Adoption in another namespace is the controller author's opt-in (issue 53 item 1).
    let (mut w, other) = world_with("xns-claims", adopting_everywhere_spec).await;
    let b = other.name.as_str();
    let cms = support::api(&w.client, "v1", "ConfigMap", Some(b)).await;

    // Someone's own ConfigMap of the desired name, which the parent does not select.
    support::apply_value(
        &w.client,
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "taken", "namespace": b},
                "data": {"v": "theirs"}}),
    )
    .await;
    w.thing("p2", json!({"children": [child("p2-a", None), child("taken", Some(b))]})).await;
    eventually(WAIT, || async {
        let warnings = support::warnings_for(&w.client, &w.ns.name, "p2").await;
        warnings.iter().any(|m| m.contains("taken")).then_some(())
    })
    .await;
    // Whoever holds a name in one namespace stops nothing the hub does for the parent elsewhere (issue
    // 61 item 3): the rest of the answer is written, nothing of it in that namespace.
    exists(&w, &w.ns.name, "p2-a").await;
    let theirs = cms.get("taken").await.unwrap();
    assert_eq!((label(&theirs, PARENT_UID), theirs.data["data"]["v"].as_str()), (None, Some("theirs")));

    // Another parent's child is never claimed: the second parent's answer naming it is refused.
    let p3 = w.thing("p3", json!({"children": [child("p3-b", Some(b))]})).await;
    let held = exists(&w, b, "p3-b").await;
    w.thing("p4", json!({"children": [child("p4-a", None), child("p3-b", Some(b))]})).await;
    let refused = support::warning_eventually(&w.client, &w.ns.name, "p4", WAIT, |m| m.contains("p3-b")).await;
    // The refusal names the parent that holds it (issue 53 item 8).
    assert!(refused.contains(&format!("the child of parent {}/p3", w.ns.name)), "{refused}");
    let still = cms.get("p3-b").await.unwrap();
    assert_eq!(label(&still, PARENT_UID), p3.metadata.uid.as_deref());
    assert_eq!(still.metadata.resource_version, held.metadata.resource_version, "p3-b untouched");
    exists(&w, &w.ns.name, "p4-a").await;

    // An orphan the parent selects (`controller-uid=<its uid>` under generateSelector) is adopted where
    // it is: the same object, now with the parent's marks. (Made while the hub is down: a selected
    // orphan the hook does not ask for is adopted and then deleted, as an owned child would be.)
    let p5 = w.thing("p5", json!({"children": []})).await;
    let p5_uid = p5.metadata.uid.clone().unwrap();
    w.stop_hub().await;
    let orphan = support::apply_value(
        &w.client,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "stray", "namespace": b, "labels": {"controller-uid": p5_uid}},
                "data": {"v": "old"}}),
    )
    .await;
    w.thing("p5", json!({"children": [child("stray", Some(b))]})).await;
    w.start_hub();
    let adopted = eventually(WAIT, || async {
        config_map(&w, b, "stray").await.filter(|cm| cm.data["data"]["v"] == "1" && label(cm, PARENT_UID).is_some())
    })
    .await;
    assert_eq!(adopted.metadata.uid, orphan.metadata.uid, "adopted in place, not recreated");
    assert_eq!(label(&adopted, PARENT_UID), Some(p5_uid.as_str()));

    finish(w, other).await;
}

#[tokio::test]
async fn a_deleted_parent_takes_its_children_elsewhere_even_if_the_hub_was_down_and_orphaning_keeps_them() {
    let (mut w, other) = world("xns-delete").await;
    let b = other.name.as_str();
    let things = w.things().await;

    w.thing("p6", json!({"children": [child("p6-a", None), child("p6-b", Some(b))]})).await;
    exists(&w, b, "p6-b").await;
    exists(&w, &w.ns.name, "p6-a").await;
    // The hub's finalizer holds the parent while the hub is down: nothing is deleted without it.
    w.stop_hub().await;
    things.delete("p6", &DeleteParams::background()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = things.get_opt("p6").await.unwrap().expect("the parent waits for the hub");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(config_map(&w, b, "p6-b").await.is_some(), "the child elsewhere is still there");
    w.start_hub();
    gone(&w, b, "p6-b").await;
    support::gone(&things, "p6", WAIT).await;

    // `--cascade=orphan`: the parent goes, its children stay, no longer anyone's.
    w.thing("p7", json!({"children": [child("p7-a", None), child("p7-b", Some(b))]})).await;
    exists(&w, b, "p7-b").await;
    exists(&w, &w.ns.name, "p7-a").await;
    let orphan = DeleteParams { propagation_policy: Some(PropagationPolicy::Orphan), ..DeleteParams::default() };
    things.delete("p7", &orphan).await.unwrap();
    support::gone(&things, "p7", WAIT).await;
    let kept = config_map(&w, b, "p7-b").await.expect("kept under --cascade=orphan");
    assert_eq!((label(&kept, PARENT_UID), annotation(&kept, PARENT)), (None, None), "{:?}", kept.metadata);
    let kept_here = config_map(&w, &w.ns.name, "p7-a").await.expect("kept under --cascade=orphan");
    eventually(WAIT, || async {
        let cm = config_map(&w, &w.ns.name, "p7-a").await?;
        cm.metadata.owner_references.as_ref().is_none_or(Vec::is_empty).then_some(())
    })
    .await;
    drop(kept_here);

    finish(w, other).await;
}

/// Issue 53 item 1: a parent's selector reaches no other namespace. A tenant's parent selecting
/// `app: x`, whose hook answers no child, adopts (and so deletes) the matching orphan in its own
/// namespace — the selector is live — but never the matching orphan in another namespace, which stays
/// untouched (same resourceVersion, no parent label) after the parent's syncs.
#[tokio::test]
async fn a_parents_selector_adopts_and_deletes_nothing_in_another_namespace() {
    let (w, other) = world_with("xns-tenant", parent_selector_spec).await;
    let b = other.name.as_str();
    let orphan = |namespace: &str, name: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": namespace, "labels": {"app": "x"}}, "data": {"v": "theirs"}})
    };
    let victim = support::apply_value(&w.client, &orphan(b, "victim")).await;
    support::apply_value(&w.client, &orphan(&w.ns.name, "local")).await;

    w.thing("tenant", json!({"selector": {"matchLabels": {"app": "x"}}, "children": []})).await;
    // The orphan in the parent's own namespace is adopted, and, not desired, deleted: the selector works.
    gone(&w, &w.ns.name, "local").await;
    eventually(WAIT, || async {
        let thing = w.things().await.get("tenant").await.unwrap();
        thing.data["status"]["seen"].is_array().then_some(())
    })
    .await;
    // More syncs of the parent (a change, then time for its echoes).
    w.thing("tenant", json!({"selector": {"matchLabels": {"app": "x"}}, "children": [], "again": 1})).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = config_map(&w, b, "victim").await.expect("the orphan in another namespace is not deleted");
    assert_eq!(still.metadata.uid, victim.metadata.uid);
    assert_eq!(still.metadata.resource_version, victim.metadata.resource_version, "not even labelled");
    assert_eq!(label(&still, PARENT_UID), None);

    finish(w, other).await;
}

/// Issue 53 item 3: `--cascade=orphan` is recorded in the API, not only in the hub's memory. A hub
/// killed (SIGKILL) right after the orphaning delete, or before it, so that it never saw the `orphan`
/// finalizer the garbage collector takes off, keeps the child in the other namespace when it comes
/// back: released (no parent label), the same object; the intent is on the parent
/// (`metahook.dev/cascade: orphan`) while it waits for the hub.
#[tokio::test]
async fn an_orphaning_delete_keeps_the_children_elsewhere_across_a_hub_killed_before_or_after_it() {
    let (mut w, other) = world("xns-orphan-kill").await;
    let b = other.name.as_str();
    let things = w.things().await;
    w.stop_hub().await;
    let mut hub = Some(support::HubProcess::start(&w.label));
    let orphan = DeleteParams { propagation_policy: Some(PropagationPolicy::Orphan), ..DeleteParams::default() };

    for (name, kill_after) in [("k1", Some(Duration::from_millis(300))), ("k2", None)] {
        let (here, there) = (format!("{name}-a"), format!("{name}-b"));
        w.thing(name, json!({"children": [child(&here, None), child(&there, Some(b))]})).await;
        let kept = exists(&w, b, &there).await;
        exists(&w, &w.ns.name, &here).await;
        // The parent carries the hub's finalizer before it is deleted.
        eventually(WAIT, || async {
            let thing = things.get(name).await.unwrap();
            thing.metadata.finalizers.as_ref().is_some_and(|f| !f.is_empty()).then_some(())
        })
        .await;
        match kill_after {
            Some(after) => {
                things.delete(name, &orphan).await.unwrap();
                tokio::time::sleep(after).await;
                hub.take().unwrap().kill();
            }
            None => {
                hub.take().unwrap().kill();
                things.delete(name, &orphan).await.unwrap();
            }
        }
        // The garbage collector orphans the child here and takes its `orphan` finalizer off meanwhile (the
        // parent may be gone already, if the first hub finished before its kill).
        eventually(WAIT, || async {
            let finalizers = things.get_opt(name).await.unwrap().and_then(|t| t.metadata.finalizers);
            (!finalizers.unwrap_or_default().iter().any(|f| f == "orphan")).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1800)).await;
        hub = Some(support::HubProcess::start(&w.label));
        support::gone(&things, name, WAIT).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = config_map(&w, b, &there).await.unwrap_or_else(|| panic!("{there} kept under --cascade=orphan"));
        assert_eq!(after.metadata.uid, kept.metadata.uid, "{there}: the same object");
        assert_eq!((label(&after, PARENT_UID), annotation(&after, PARENT)), (None, None), "{:?}", after.metadata);
        let here_after = config_map(&w, &w.ns.name, &here).await.expect("kept under --cascade=orphan");
        assert!(here_after.metadata.owner_references.as_ref().is_none_or(Vec::is_empty));
    }
    drop(hub);

    finish(w, other).await;
}

#[tokio::test]
async fn a_childs_namespace_deleted_and_made_again_gets_its_child_back_and_nothing_else_is_lost() {
    let (w, other) = world("xns-namespace").await;
    let b = other.name.clone();
    w.thing("p8", json!({"children": [child("p8-a", None), child("p8-b", Some(&b))]})).await;
    let here = exists(&w, &w.ns.name, "p8-a").await;
    exists(&w, &b, "p8-b").await;
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(w.client.clone());
    namespaces.delete(&b, &DeleteParams::default()).await.unwrap();
    support::gone(&namespaces, &b, Duration::from_secs(120)).await;
    // The sync fails while the namespace is missing (an Event names it); the child here stays as it was.
    eventually(WAIT, || async {
        let warnings = support::warnings_for(&w.client, &w.ns.name, "p8").await;
        warnings.iter().any(|m| m.contains(&b)).then_some(())
    })
    .await;
    let still = config_map(&w, &w.ns.name, "p8-a").await.expect("the child here is kept");
    assert_eq!(still.metadata.uid, here.metadata.uid);
    // The namespace again: the retries (backing off) make the child there again.
    support::apply_value(&w.client, &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": b}})).await;
    let back = eventually(Duration::from_secs(120), || config_map(&w, &b, "p8-b")).await;
    assert!(label(&back, PARENT_UID).is_some());
    let _ = namespaces.delete(&b, &DeleteParams::default()).await;
    w.finish("CompositeController").await;
}

#[tokio::test]
async fn cross_namespace_is_refused_where_it_cannot_be_honoured() {
    let w = World::new("xns-refused", HOOK).await;
    // A cluster-scoped parent owns children anywhere already.
    w.composite(json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "clusterthings"},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps", "crossNamespace": true}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    }))
    .await;
    let controllers = w.controllers("CompositeController").await;
    let ready = eventually(WAIT, || async {
        let cc = controllers.get(&w.label).await.unwrap();
        let conditions = cc.data["status"]["conditions"].as_array().cloned().unwrap_or_default();
        conditions.into_iter().find(|c| c["type"] == "Ready" && c["status"] == "False")
    })
    .await;
    assert_eq!(ready["reason"], "UnsupportedCrossNamespace", "{ready}");
    assert!(ready["message"].as_str().unwrap().contains("cluster-scoped parent"), "{ready}");
    w.finish("CompositeController").await;
}

/// Two sharded `metahook run` replicas share the parents: each child elsewhere carries its parent's
/// bucket label, so it is in the cache of the replica holding the parent — which puts its drift back and
/// deletes it with the parent. (A child without it would be in no replica's cache: never put back, never
/// deleted, and the parents would wait on their finalizer for good.)
#[tokio::test]
async fn with_sharding_the_replica_holding_the_parent_keeps_and_deletes_its_children_elsewhere() {
    const PARENTS: usize = 12;
    let mut w = World::new("xns-shards", HOOK).await;
    w.stop_hub().await;
    let other = TestNamespace::create(&w.client, "xns-shards-b").await;
    let b = other.name.clone();
    let sharded = support::replicas::sharded_config(&w.label, &w.ns.name, 1);
    let ring =
        Replicas::new(&format!("targetLabelSelector: metahook-test={}\nmetricsAddress: \"\"\n{sharded}", w.label));
    let replicas: Vec<tokio::process::Child> =
        ["hub-a", "hub-b"].iter().map(|name| ring.start(name, &[], &[])).collect();
    w.composite(cross_namespace_spec(&w)).await;
    let bucket_label = format!("parent.shard.metahook.dev/{}", w.label);
    let mut uids = Vec::new();
    for i in 0..PARENTS {
        let thing = w.thing(&format!("s{i}"), json!({"children": [child(&format!("s{i}-b"), Some(&b))]})).await;
        uids.push(thing.metadata.uid.unwrap());
    }
    for (i, uid) in uids.iter().enumerate() {
        let name = format!("s{i}-b");
        let cm = eventually(Duration::from_secs(120), || config_map(&w, &b, &name)).await;
        assert_eq!(label(&cm, PARENT_UID), Some(uid.as_str()));
        let expected = metahook::cache::shard::bucket(uid).to_string();
        assert_eq!(label(&cm, &bucket_label), Some(expected.as_str()), "s{i}-b carries its parent's bucket");
    }
    // Drift is put back by whichever replica holds each parent.
    let cms = support::api(&w.client, "v1", "ConfigMap", Some(&b)).await;
    for i in 0..PARENTS {
        let drift = json!({"data": {"v": "drifted"}});
        cms.patch(&format!("s{i}-b"), &PatchParams::default(), &Patch::Merge(&drift)).await.unwrap();
    }
    for i in 0..PARENTS {
        eventually(WAIT, || async {
            config_map(&w, &b, &format!("s{i}-b")).await.filter(|cm| cm.data["data"]["v"] == "1")
        })
        .await;
    }
    // Every parent deleted: every child elsewhere goes, and every parent with it.
    let things = w.things().await;
    for i in 0..PARENTS {
        things.delete(&format!("s{i}"), &DeleteParams::background()).await.unwrap();
    }
    for i in 0..PARENTS {
        gone(&w, &b, &format!("s{i}-b")).await;
        eventually(WAIT, || async { things.get_opt(&format!("s{i}")).await.unwrap().is_none().then_some(()) }).await;
    }
    drop(replicas);
    finish(w, other).await;
}

/// Each Thing's `spec.children` lists its children: `{"name", "namespace"?, "kind"?}` (a ConfigMap, or a
/// Secret while the controller declares secrets); the status names the child types the request showed.
const TWO_TYPES_HOOK: &str = r#"
def sync(request):
    spec = request["parent"].get("spec") or {}
    declared = [r["resource"] for r in request["controller"]["spec"]["childResources"]]
    children = []
    for c in spec.get("children", []):
        kind = c.get("kind", "ConfigMap")
        if kind == "Secret" and "secrets" not in declared:
            continue
        metadata = {"name": c["name"]}
        if c.get("namespace"):
            metadata["namespace"] = c["namespace"]
        children.append({"apiVersion": "v1", "kind": kind, "metadata": metadata, "data": {"v": "MQ=="} if kind == "Secret" else {"v": "1"}})
    return {"children": children, "status": {"types": sorted(request["children"].keys())}}
"#;

/// A controller of Things whose ConfigMaps and (with `secrets`) Secrets are `crossNamespace`.
fn two_types_spec(w: &World, secrets: bool) -> Value {
    let mut types = vec![json!({"apiVersion": "v1", "resource": "configmaps", "crossNamespace": true})];
    if secrets {
        types.push(json!({"apiVersion": "v1", "resource": "secrets", "crossNamespace": true}));
    }
    json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
        "childResources": types,
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    })
}

/// Issue 66 item 2: a `crossNamespace` child type taken out of the controller's spec does not leak. The
/// parent's record still lists its children elsewhere of that type, and they go with the parent as its
/// owned ones of that type go with the garbage collector; a decoy labelled with the parent's UID that the
/// record does not list is not the parent's, and is left untouched.
#[tokio::test]
async fn children_elsewhere_of_a_type_taken_out_of_the_spec_go_with_their_parent_and_a_decoy_stays() {
    let w = World::new("xns-removed", TWO_TYPES_HOOK).await;
    let other = TestNamespace::create(&w.client, "xns-removed-b").await;
    let b = other.name.as_str();
    w.composite(two_types_spec(&w, true)).await;
    let secrets = support::api(&w.client, "v1", "Secret", Some(b)).await;
    let records = support::api(&w.client, support::RECORDS, "ChildRecord", Some(&w.ns.name)).await;
    let things = w.things().await;

    let secret = |name: &str| json!({"name": name, "namespace": b, "kind": "Secret"});
    let spec = json!({"children": [child("r-cm", Some(b)), secret("r-secret"), child("r-here", None)]});
    let parent = w.thing("r1", spec).await;
    let uid = parent.metadata.uid.clone().unwrap();
    exists(&w, b, "r-cm").await;
    exists(&w, &w.ns.name, "r-here").await;
    let made = eventually(WAIT, || async { secrets.get_opt("r-secret").await.unwrap() }).await;
    assert_eq!(label(&made, PARENT_UID), Some(uid.as_str()));
    let record = eventually(WAIT, || async {
        let listed = records.list(&Default::default()).await.unwrap().items;
        listed.into_iter().find(|r| r.data["spec"]["children"].as_array().is_some_and(|c| c.len() == 2))
    })
    .await;
    // A decoy: labelled and annotated as the parent's, but not in its record.
    let decoy = support::apply_value(
        &w.client,
        &json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "r-decoy", "namespace": b, "labels": {(PARENT_UID): uid},
                             "annotations": {(PARENT): format!("{}/r1", w.ns.name)}},
                "data": {"v": "MQ=="}}),
    )
    .await;

    // Secrets are no longer the controller's children: once it runs so, the hook sees ConfigMaps only.
    w.composite(two_types_spec(&w, false)).await;
    eventually(WAIT, || async {
        let thing = things.get("r1").await.unwrap();
        (thing.data["status"]["types"] == json!(["ConfigMap.v1"])).then_some(())
    })
    .await;
    // The sync leaves the child of the removed type, and its entry, alone.
    let kept = secrets.get_opt("r-secret").await.unwrap().expect("a child of a removed type is not deleted by a sync");
    assert_eq!(kept.metadata.uid, made.metadata.uid);
    let listed = records.get(&record.metadata.name.clone().unwrap()).await.unwrap();
    assert_eq!(listed.data["spec"]["children"].as_array().map(Vec::len), Some(2), "{:?}", listed.data);

    // The parent deleted: everything of it elsewhere goes, of either type, and its record.
    things.delete("r1", &DeleteParams::background()).await.unwrap();
    support::gone(&things, "r1", WAIT).await;
    gone(&w, b, "r-cm").await;
    gone(&w, &w.ns.name, "r-here").await;
    support::gone(&secrets, "r-secret", WAIT).await;
    eventually(WAIT, || async {
        records.get_opt(&record.metadata.name.clone().unwrap()).await.unwrap().is_none().then_some(())
    })
    .await;
    // The decoy is not the parent's: untouched.
    let still = secrets.get_opt("r-decoy").await.unwrap().expect("the decoy stays");
    assert_eq!(still.metadata.resource_version, decoy.metadata.resource_version, "the decoy untouched");

    finish(w, other).await;
}

/// A parent as a hub before issue 66 left it: its finalizer, its child elsewhere `child` (labelled and
/// annotated as that hub made it) and, in Metacontroller's group, its record listing the child, with
/// (`held`) or without the record's finalizer. Returns the child.
async fn as_the_old_hub_left_it(
    w: &World,
    parent: &kube::api::DynamicObject,
    elsewhere: &str,
    child: &str,
    held: bool,
) -> kube::api::DynamicObject {
    let (name, uid) = (parent.metadata.name.clone().unwrap(), parent.metadata.uid.clone().unwrap());
    let finalizer = format!("metacontroller.io/compositecontroller-{}", w.label);
    let things = w.things().await;
    let patch = json!({"metadata": {"finalizers": [finalizer]}});
    things.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let made = support::apply_value(
        &w.client,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": child, "namespace": elsewhere,
                             "labels": {(PARENT_UID): uid, "controller-uid": uid},
                             "annotations": {(PARENT): format!("{}/{name}", w.ns.name)}},
                "data": {"v": "1"}}),
    )
    .await;
    support::apply_value(&w.client, &old_group_record(w, parent, elsewhere, child, held, OLD_RECORDS)).await;
    made
}

/// The record of `parent` listing `child` in `elsewhere`, as a hub writes it, in `group_version`.
fn old_group_record(
    w: &World,
    parent: &kube::api::DynamicObject,
    elsewhere: &str,
    child: &str,
    held: bool,
    group_version: &str,
) -> Value {
    let (name, uid) = (parent.metadata.name.clone().unwrap(), parent.metadata.uid.clone().unwrap());
    let finalizers = if held { json!(["metahook.dev/children-elsewhere"]) } else { json!([]) };
    json!({"apiVersion": group_version, "kind": "ChildRecord",
           "metadata": {"name": format!("{uid}.{}", w.label), "namespace": w.ns.name,
                        "labels": {"metahook.dev/record-of": w.label}, "finalizers": finalizers,
                        "ownerReferences": [{"apiVersion": "test.metahook.dev/v1", "kind": "Thing", "name": name,
                                             "uid": uid, "controller": true, "blockOwnerDeletion": false}]},
           "spec": {"controller": w.label, "parent": {"name": name, "uid": uid},
                    "children": [{"apiGroup": "", "kind": "ConfigMap", "namespace": elsewhere, "name": child}]}})
}

/// Where hubs before issue 66 kept records: Metacontroller's group.
const OLD_RECORDS: &str = "metacontroller.k8s.io/v1alpha1";

/// Issue 66 item 4: records move from Metacontroller's group to `metahook.dev` with nothing lost. Three
/// parents as a hub of before left them — one with its record in the old group only, one whose record a
/// new hub copied before it was stopped, one whose old record it had let go of too but not deleted — and
/// a decoy labelled with the first parent's UID. A new hub moves every record (the old ones go, the new
/// ones list the same child), keeps the children as they are (the same objects, never taken by their
/// label alone, so the decoy is no child), and after a restart deletes them with their parents.
#[tokio::test]
async fn records_in_the_old_group_are_moved_across_a_restart_and_their_children_still_go_with_the_parents() {
    let client = support::client().await;
    support::install_crds(&client, include_str!("fixtures/childrecords-old-group.yaml")).await;
    let (mut w, other) = world("xns-move").await;
    let b = other.name.as_str();
    w.stop_hub().await;
    let things = w.things().await;
    let old = support::api(&w.client, OLD_RECORDS, "ChildRecord", Some(&w.ns.name)).await;
    let new = support::api(&w.client, support::RECORDS, "ChildRecord", Some(&w.ns.name)).await;

    let mut children = Vec::new();
    for (i, held) in [(1, true), (2, true), (3, false)] {
        let parent = w.thing(&format!("m{i}"), json!({"children": [child(&format!("m{i}-b"), Some(b))]})).await;
        children.push(as_the_old_hub_left_it(&w, &parent, b, &format!("m{i}-b"), held).await);
        if i > 1 {
            // Copied by a new hub stopped before it deleted the old one.
            support::apply_value(
                &w.client,
                &old_group_record(&w, &parent, b, &format!("m{i}-b"), true, support::RECORDS),
            )
            .await;
        }
    }
    let m1 = things.get("m1").await.unwrap();
    let decoy = support::apply_value(
        &w.client,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "m1-decoy", "namespace": b,
                             "labels": {(PARENT_UID): m1.metadata.uid.clone().unwrap()},
                             "annotations": {(PARENT): format!("{}/m1", w.ns.name)}},
                "data": {"v": "decoy"}}),
    )
    .await;

    // A new hub moves the records, syncs the parents, and keeps their children.
    w.start_hub();
    eventually(WAIT, || async { old.list(&Default::default()).await.unwrap().items.is_empty().then_some(()) }).await;
    for (i, made) in children.iter().enumerate() {
        let name = format!("m{}", i + 1);
        let uid = things.get(&name).await.unwrap().metadata.uid.unwrap();
        let record = new.get(&format!("{uid}.{}", w.label)).await.unwrap();
        let listed = &record.data["spec"]["children"];
        assert_eq!(
            listed,
            &json!([{"apiGroup": "", "kind": "ConfigMap", "namespace": b, "name": format!("{name}-b")}])
        );
        assert_eq!(record.metadata.finalizers, Some(vec!["metahook.dev/children-elsewhere".to_owned()]));
        let expected = json!([format!("{b}/{name}-b")]);
        eventually(WAIT, || async {
            let thing = things.get(&name).await.unwrap();
            (thing.data["status"]["seen"] == expected).then_some(())
        })
        .await;
        let kept = config_map(&w, b, &format!("{name}-b")).await.expect("the child elsewhere is kept");
        assert_eq!(
            (kept.metadata.uid.as_ref(), label(&kept, PARENT_UID)),
            (made.metadata.uid.as_ref(), Some(uid.as_str()))
        );
    }

    // After a restart, the parents deleted take their children elsewhere, and only those.
    w.restart_hub().await;
    for i in 1..=3 {
        things.delete(&format!("m{i}"), &DeleteParams::background()).await.unwrap();
    }
    for i in 1..=3 {
        gone(&w, b, &format!("m{i}-b")).await;
        eventually(WAIT, || async { things.get_opt(&format!("m{i}")).await.unwrap().is_none().then_some(()) }).await;
    }
    eventually(WAIT, || async { new.list(&Default::default()).await.unwrap().items.is_empty().then_some(()) }).await;
    assert!(old.list(&Default::default()).await.unwrap().items.is_empty());
    let still = config_map(&w, b, "m1-decoy").await.expect("the decoy stays");
    assert_eq!(still.metadata.resource_version, decoy.metadata.resource_version, "the decoy untouched");

    finish(w, other).await;
}

/// Issue 66, the lifecycle matrix: a namespace deleted that holds a parent with children elsewhere. The
/// hub's finalizer holds the parent until its children elsewhere are deleted; the namespace is being
/// deleted meanwhile (nothing can be written in it), and its deletion still finishes within the bound,
/// the child elsewhere gone with its parent, nothing of the hub's left.
#[tokio::test]
async fn a_namespace_deleted_with_a_parent_goes_within_the_bound_and_takes_its_children_elsewhere() {
    const BOUND: Duration = Duration::from_secs(30);
    let (w, other) = world("xns-nsdel").await;
    let b = other.name.as_str();
    let doomed = TestNamespace::create(&w.client, "xns-nsdel-c").await;
    let thing = json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing",
                       "metadata": {"name": "p", "namespace": doomed.name, "labels": {"metahook-test": w.label}},
                       "spec": {"children": [child("p-a", None), child("p-b", Some(b))]}});
    support::apply_value(&w.client, &thing).await;
    exists(&w, b, "p-b").await;
    exists(&w, &doomed.name, "p-a").await;
    let things = support::api(&w.client, "test.metahook.dev/v1", "Thing", Some(&doomed.name)).await;
    eventually(WAIT, || async { things.get("p").await.unwrap().metadata.finalizers.filter(|f| !f.is_empty()) }).await;

    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(w.client.clone());
    let started = std::time::Instant::now();
    namespaces.delete(&doomed.name, &DeleteParams::default()).await.unwrap();
    support::gone(&namespaces, &doomed.name, BOUND).await;
    eprintln!("the namespace with a parent holding a child elsewhere went in {:?}", started.elapsed());
    gone(&w, b, "p-b").await;
    finish(w, other).await;
}

/// Issue 66, the matrix with the hub down: the last `crossNamespace` child type taken out of the spec
/// while no hub ran. The controller no longer keeps records, so nothing in its spec says its parents'
/// records carry the hub's finalizer; its status does (`status.keepsRecords`). The next start releases
/// them as a hub running at the edit would have (cross-namespace.md: the children elsewhere stay, with
/// their label), and a parent deleted in the foreground afterwards goes within the bound. Before, the
/// records kept their finalizer for good and such a delete waited on them.
#[tokio::test]
async fn the_last_cross_namespace_type_taken_out_while_no_hub_ran_has_its_records_released_at_the_next_start() {
    const BOUND: Duration = Duration::from_secs(30);
    let (mut w, other) = world("xns-lastdown").await;
    let b = other.name.as_str();
    let things = w.things().await;
    let records = support::api(&w.client, support::RECORDS, "ChildRecord", Some(&w.ns.name)).await;
    let controllers = w.controllers("CompositeController").await;
    w.thing("p", json!({"children": [child("p-far", Some(b)), child("p-here", None)]})).await;
    exists(&w, b, "p-far").await;
    let record =
        eventually(WAIT, || async { records.list(&Default::default()).await.unwrap().items.into_iter().next() }).await;
    let record_name = record.metadata.name.clone().unwrap();
    assert!(record.metadata.finalizers.iter().flatten().any(|f| f == "metahook.dev/children-elsewhere"));
    let status = controllers.get(&w.label).await.unwrap().data["status"].clone();
    assert_eq!(status["keepsRecords"], true, "recorded before the first record: {status}");

    w.stop_hub().await;
    let mut spec = cross_namespace_spec(&w);
    spec["childResources"][0].as_object_mut().unwrap().remove("crossNamespace");
    w.composite(spec).await;
    w.start_hub();
    eventually(BOUND, || async {
        let record = records.get_opt(&record_name).await.unwrap();
        let held =
            record.is_some_and(|r| r.metadata.finalizers.iter().flatten().any(|f| f.starts_with("metahook.dev/")));
        let keeps = controllers.get(&w.label).await.unwrap().data["status"]["keepsRecords"].clone();
        (!held && keeps.is_null()).then_some(())
    })
    .await;

    let params = DeleteParams { propagation_policy: Some(PropagationPolicy::Foreground), ..DeleteParams::default() };
    things.delete("p", &params).await.unwrap();
    support::gone(&things, "p", BOUND).await;
    // Released, as with a hub running at the edit: the child elsewhere stays, its owned one goes.
    assert!(config_map(&w, b, "p-far").await.is_some(), "the child elsewhere stays");
    gone(&w, &w.ns.name, "p-here").await;
    finish(w, other).await;
}
