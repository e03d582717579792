//! What a tenant can make the hub do to another namespace's parent (issue 61), on the real control
//! plane, each as the tenant would do it: a ServiceAccount that may write ConfigMaps, Secrets and the
//! test types in its own namespace only ([`Tenant`]). None of it may stop, freeze or reveal a parent
//! of another namespace: not a decoy labelled with that parent's UID (with a finalizer of its own, or ten
//! of them under the safe-delete guard), not a child elsewhere taken away in one namespace, not a related
//! rule the parent's spec points at another namespace (under the controller's `relatedLimit`). And what
//! the hub promises across its own absence holds: a controller deleted while no hub runs lets its
//! parents go, and `--cascade=orphan` keeps children that are all elsewhere.

mod support;

use std::time::Duration;

use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PropagationPolicy};
use serde_json::{Value, json};
use support::elsewhere::{HOOK, PARENT, PARENT_UID, child, config_map, config_map_with_v, cross_namespace_spec, label};
use support::{Tenant, TestNamespace, World, api, apply_value, eventually};

const WAIT: Duration = Duration::from_secs(60);
/// How long a parent that nothing holds may take to go, or a change to reach its child: far above what
/// the hub needs (well under a second here), far below the 60 s and more the failures showed.
const BOUND: Duration = Duration::from_secs(30);

/// The world most tests here start from: the cross-namespace controller, a tenant `<test>-t1` and a
/// namespace `<test>-t2` that no tenant holds, with their names.
struct Tenants {
    w: World,
    t1: Tenant,
    t2: TestNamespace,
    n1: String,
    n2: String,
    /// The tenant's ConfigMaps, acting as the tenant.
    cms: kube::Api<DynamicObject>,
}

impl Tenants {
    async fn new(test: &str) -> Self {
        let w = World::new(test, HOOK).await;
        let t1 = Tenant::create(&w.client, &format!("{test}-t1")).await;
        let t2 = TestNamespace::create(&w.client, &format!("{test}-t2")).await;
        w.composite(cross_namespace_spec(&w)).await;
        let (n1, n2) = (t1.namespace.name.clone(), t2.name.clone());
        let cms = tenant_config_maps(&t1).await;
        Self { w, t1, t2, n1, n2, cms }
    }
}

/// A world with one tenant (`tenant`, its namespace) beside it, and the tenant's ConfigMaps.
async fn world_and_tenant(test: &str, tenant: &str) -> (World, Tenant, kube::Api<DynamicObject>) {
    let w = World::new(test, HOOK).await;
    let tenant = Tenant::create(&w.client, tenant).await;
    let cms = tenant_config_maps(&tenant).await;
    (w, tenant, cms)
}

/// Deletes the tenant's namespace, then the world.
async fn finish_tenant(w: World, tenant: Tenant) {
    tenant.namespace.delete().await;
    w.finish("CompositeController").await;
}

/// Deletes the tenant's namespace and the other, then the world.
async fn finish(w: World, t1: Tenant, t2: TestNamespace) {
    t1.namespace.delete().await;
    t2.delete().await;
    w.finish("CompositeController").await;
}

/// A ConfigMap of the tenant's that says it is `parent`'s child: the parent's UID in both labels a child
/// elsewhere of a `generateSelector` controller has, the annotation naming the parent, and `finalizers`.
fn decoy(name: &str, parent: &DynamicObject, finalizers: &[&str]) -> Value {
    let uid = parent.metadata.uid.clone().unwrap();
    let at = format!("{}/{}", parent.metadata.namespace.as_deref().unwrap(), parent.metadata.name.as_deref().unwrap());
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "labels": {PARENT_UID: uid, "controller-uid": uid},
                        "annotations": {PARENT: at}, "finalizers": finalizers},
           "data": {"v": "decoy"}})
}

/// The ConfigMaps API of `tenant`, acting as the tenant.
async fn tenant_config_maps(tenant: &Tenant) -> kube::Api<DynamicObject> {
    tenant.api("v1", "ConfigMap").await
}

/// [`cross_namespace_spec`] with a finalize hook: the controller puts its finalizer on every parent.
fn finalizing_spec(w: &World) -> Value {
    let mut spec = cross_namespace_spec(w);
    spec["hooks"]["finalize"] = json!({"webhook": {"url": w.hook.url("/finalize")}});
    spec
}

/// Waits up to `within` until the Thing `name` holds the test's controller's finalizer (`want`) or no
/// longer does.
async fn holds_finalizer(w: &World, things: &kube::Api<DynamicObject>, name: &str, want: bool, within: Duration) {
    let finalizer = format!("metacontroller.io/compositecontroller-{}", w.label);
    eventually(within, || async {
        let thing = things.get(name).await.unwrap();
        (thing.metadata.finalizers.iter().flatten().any(|f| *f == finalizer) == want).then_some(())
    })
    .await;
}

/// A platform parent with its `team-config` in both namespaces `n1` and `n2`, once both are written;
/// returns its `spec.children`.
async fn platform(w: &World, n1: &str, n2: &str) -> Value {
    let children = json!([child("team-config", Some(n1)), child("team-config", Some(n2))]);
    w.thing("platform", json!({"children": children})).await;
    eventually(WAIT, || config_map(w, n1, "team-config")).await;
    eventually(WAIT, || config_map(w, n2, "team-config")).await;
    children
}

/// Issue 61 item 1: a tenant's ConfigMap labelled with another namespace's parent's UID, holding a
/// finalizer of its own, neither holds that parent's deletion nor is touched by the hub.
#[tokio::test]
async fn a_decoy_labelled_with_another_namespaces_parent_neither_holds_its_deletion_nor_is_touched() {
    let (w, tenant, cms) = world_and_tenant("tn-decoy", "tn-decoy-a").await;
    w.composite(cross_namespace_spec(&w)).await;
    let vp = w.thing("vp", json!({"children": [child("vp-a", None)]})).await;
    eventually(WAIT, || config_map(&w, &w.ns.name, "vp-a")).await;

    let placed = cms
        .create(&Default::default(), &serde_json::from_value(decoy("decoy", &vp, &["tenant.example/keep"])).unwrap())
        .await
        .unwrap();
    // A change of vp, so that its sync sees the decoy (the decoy's own event queues vp too).
    w.thing("vp", json!({"v": "2", "children": [child("vp-a", None)]})).await;
    config_map_with_v(&w, &w.ns.name, "vp-a", "2", WAIT).await;
    let things = w.things().await;
    things.delete("vp", &DeleteParams::background()).await.unwrap();
    support::gone(&things, "vp", BOUND).await;

    let after = cms.get("decoy").await.unwrap();
    assert!(after.metadata.deletion_timestamp.is_none(), "the hub deleted the tenant's decoy");
    assert_eq!(after.metadata.resource_version, placed.metadata.resource_version, "the decoy was written");

    support::drop_finalizers(&cms, "decoy").await;
    finish_tenant(w, tenant).await;
}

/// Issue 61 item 2: ten decoys in a tenant's namespace do not make the safe-delete guard refuse every
/// sync of another namespace's parent: its own change reaches its child.
#[tokio::test]
async fn decoys_do_not_freeze_another_namespaces_parent_under_the_safe_delete_guard() {
    let (w, tenant, cms) = world_and_tenant("tn-guard", "tn-guard-a").await;
    w.composite_annotated(json!({"metahook.dev/max-deletions-per-sync": "1"}), cross_namespace_spec(&w)).await;
    let vp = w.thing("vp", json!({"children": [child("vp-a", None)]})).await;
    eventually(WAIT, || config_map(&w, &w.ns.name, "vp-a")).await;
    for i in 0..10 {
        let decoy = decoy(&format!("decoy-{i}"), &vp, &[]);
        cms.create(&Default::default(), &serde_json::from_value(decoy).unwrap()).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    w.thing("vp", json!({"v": "2", "children": [child("vp-a", None)]})).await;
    config_map_with_v(&w, &w.ns.name, "vp-a", "2", BOUND).await;
    let warnings = support::warnings_for(&w.client, &w.ns.name, "vp").await;
    assert!(warnings.iter().all(|m| !m.contains("sync would delete")), "{warnings:?}");
    for i in 0..10 {
        let left = cms.get(&format!("decoy-{i}")).await.unwrap();
        assert_eq!(left.data["data"]["v"], "decoy", "decoy-{i} untouched");
    }
    finish_tenant(w, tenant).await;
}

/// Issue 61 item 3: a platform parent has `team-config` in two tenants' namespaces; the first tenant
/// takes its copy away (removes the parent's label, as the book says to). The parent's next change
/// still reaches the second tenant's copy; the first's is left as it is, and the parent says why.
#[tokio::test]
async fn a_tenant_taking_its_copy_away_does_not_freeze_the_parents_children_in_other_namespaces() {
    let Tenants { w, t1, t2, n1, n2, cms } = Tenants::new("tn-take").await;
    let children = platform(&w, &n1, &n2).await;

    let taken = json!({"metadata": {"labels": {PARENT_UID: null}}});
    let taken = cms.patch("team-config", &PatchParams::default(), &Patch::Merge(taken)).await.unwrap();
    w.thing("platform", json!({"v": "2", "children": children})).await;
    config_map_with_v(&w, &n2, "team-config", "2", BOUND).await;
    let refused = support::warning_eventually(&w.client, &w.ns.name, "platform", WAIT, |m| {
        m.contains(&format!("{n1}/team-config"))
    })
    .await;
    assert!(refused.contains("namespaces refused"), "{refused}");
    let kept = cms.get("team-config").await.unwrap();
    assert_eq!(kept.metadata.resource_version, taken.metadata.resource_version, "the taken copy is left as it is");
    assert_eq!(label(&kept, PARENT_UID), None);

    finish(w, t1, t2).await;
}

/// v2 hooks; the customize hook reads the Secret the parent's `spec.source` names (Metacontroller's own
/// `sourceNamespace` pattern), and the sync hook shows its data in the status.
const READER: &str = r#"
def customize(request):
    source = (request["parent"].get("spec") or {}).get("source") or {}
    return {"relatedResources": [{"apiVersion": "v1", "resource": "secrets",
                                  "namespace": source.get("namespace"), "names": [source.get("name")]}]}

def sync(request):
    secrets = request.get("related", {}).get("Secret.v1", {})
    return {"status": {"read": {k: v.get("data", {}) for k, v in secrets.items()}}, "children": []}
"#;

/// Issue 61 item 4: a tenant's parent naming another namespace's Secret. Without a `relatedLimit` the
/// hub keeps Metacontroller's v2 behaviour and warns on the controller; with one that allows only the
/// parent's namespace, the rule is refused and nothing of the Secret reaches the status.
#[tokio::test]
async fn a_related_rule_reaching_another_namespace_is_warned_about_and_refused_under_the_controllers_limit() {
    let w = World::new("tn-related", READER).await;
    let tenant = Tenant::create(&w.client, "tn-related-a").await;
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": "db-credentials", "namespace": w.ns.name},
                        "stringData": {"password": "hunter2"}});
    apply_value(&w.client, &secret).await;
    let spec = |limit: Option<Value>| {
        let mut spec = json!({
            "generateSelector": true,
            "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things",
                               "labelSelector": {"matchLabels": {"metahook-test": w.label}}},
            // A v2 sync hook and a customize hook of no version (v1, the CRD's default): the sync
            // request's version is what lets a rule reach any namespace.
            "hooks": {"sync": {"version": "v2", "webhook": {"url": w.hook.url("/sync")}},
                      "customize": {"webhook": {"url": w.hook.url("/customize")}}},
        });
        if let Some(limit) = limit {
            spec["relatedLimit"] = limit;
        }
        spec
    };
    let controller = w.composite(spec(None)).await;
    let things = tenant.api("test.metahook.dev/v1", "Thing").await;
    let parent = json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing",
                        "metadata": {"name": "reader", "labels": {"metahook-test": w.label}},
                        "spec": {"source": {"namespace": w.ns.name, "name": "db-credentials"}}});
    things.create(&Default::default(), &serde_json::from_value(parent).unwrap()).await.unwrap();
    // Metacontroller's behaviour, kept for its manifests: read — and said, on the controller.
    eventually(WAIT, || async {
        let status = things.get("reader").await.unwrap().data["status"].clone();
        (!status["read"].as_object().is_none_or(serde_json::Map::is_empty)).then_some(())
    })
    .await;
    let events = support::events_on(&w.client, "default", controller.metadata.name.as_deref().unwrap()).await;
    let warned = events.iter().find(|e| e.reason.as_deref() == Some("RelatedUnlimited"));
    let note = warned.and_then(|e| e.note.clone()).unwrap_or_default();
    assert!(note.contains("any type in any namespace") && note.contains("relatedLimit"), "{events:?}");

    // The controller's author bounds it: the parent's own namespace only.
    things.delete("reader", &DeleteParams::default()).await.unwrap();
    support::gone(&things, "reader", WAIT).await;
    w.composite(spec(Some(json!({"namespaces": [], "resources": [{"apiVersion": "v1", "resource": "secrets"}]}))))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let parent = json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing",
                        "metadata": {"name": "reader2", "labels": {"metahook-test": w.label}},
                        "spec": {"source": {"namespace": w.ns.name, "name": "db-credentials"}}});
    things.create(&Default::default(), &serde_json::from_value(parent).unwrap()).await.unwrap();
    let refused =
        support::warning_eventually(&w.client, &tenant.namespace.name, "reader2", WAIT, |m| m.contains("relatedLimit"))
            .await;
    assert!(refused.contains(&w.ns.name), "{refused}");
    let status = things.get("reader2").await.unwrap().data["status"].clone();
    assert!(!status.to_string().contains("aHVudGVyMg"), "the Secret's data reached the status: {status}");

    tenant.namespace.delete().await;
    w.finish("CompositeController").await;
}

/// Issue 61 item 5 (Metacontroller #1062): a controller with a finalize hook deleted while no hub runs.
/// When a hub runs again its parents lose the controller's finalizer, and a delete of one completes.
#[tokio::test]
async fn a_controller_deleted_while_the_hub_is_down_lets_its_parents_go() {
    let mut w = World::new("tn-ctl-gone", HOOK).await;
    let spec = finalizing_spec(&w);
    w.composite(spec).await;
    let things = w.things().await;
    for name in ["p1", "p2"] {
        w.thing(name, json!({"children": [child(&format!("{name}-a"), None)]})).await;
    }
    for name in ["p1", "p2"] {
        holds_finalizer(&w, &things, name, true, WAIT).await;
    }
    let controllers = w.controllers("CompositeController").await;
    // The hub's own finalizer is on the controller before any parent gets the controller's.
    let controller = controllers.get(&w.label).await.unwrap();
    assert!(controller.metadata.finalizers.iter().flatten().any(|f| f == "metahook.dev/release-objects"));

    w.stop_hub().await;
    controllers.delete(&w.label, &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(controllers.get_opt(&w.label).await.unwrap().is_some(), "the controller waits for a hub");
    w.start_hub();
    things.delete("p1", &DeleteParams::background()).await.unwrap();
    support::gone(&things, "p1", BOUND).await;
    holds_finalizer(&w, &things, "p2", false, BOUND).await;
    support::gone(&controllers, &w.label, BOUND).await;
    w.finish("CompositeController").await;
}

/// Issue 61 item 6: `kubectl delete --cascade=orphan` of a parent whose every child is in another
/// namespace, with the hub killed just before it and back only after the garbage collector has taken
/// `orphan` off: the children are kept (released), not deleted.
#[tokio::test]
async fn an_orphaning_delete_of_a_parent_whose_children_are_all_elsewhere_keeps_them_across_a_hub_down() {
    let mut w = World::new("tn-orphan", HOOK).await;
    let b = TestNamespace::create(&w.client, "tn-orphan-b").await;
    w.composite(cross_namespace_spec(&w)).await;
    let things = w.things().await;
    w.thing("p", json!({"children": [child("p-b1", Some(&b.name)), child("p-b2", Some(&b.name))]})).await;
    let first = eventually(WAIT, || config_map(&w, &b.name, "p-b1")).await;
    eventually(WAIT, || config_map(&w, &b.name, "p-b2")).await;

    w.stop_hub().await;
    let orphan = DeleteParams { propagation_policy: Some(PropagationPolicy::Orphan), ..DeleteParams::default() };
    things.delete("p", &orphan).await.unwrap();
    // The collector orphans the parent's dependents and takes `orphan` off; the hub's finalizer holds it.
    eventually(WAIT, || async {
        let p = things.get("p").await.unwrap();
        (!p.metadata.finalizers.iter().flatten().any(|f| f == "orphan")).then_some(())
    })
    .await;
    w.start_hub();
    support::gone(&things, "p", BOUND).await;
    for name in ["p-b1", "p-b2"] {
        let kept =
            config_map(&w, &b.name, name).await.unwrap_or_else(|| panic!("{name} deleted under --cascade=orphan"));
        assert_eq!(label(&kept, PARENT_UID), None, "released: {:?}", kept.metadata);
        if name == "p-b1" {
            assert_eq!(kept.metadata.uid, first.metadata.uid, "the same object, kept");
        }
    }
    b.delete().await;
    w.finish("CompositeController").await;
}

/// A child elsewhere as the tenant of its namespace can fake one: a name the parent's hook asks for,
/// labelled with the parent's UID (or given a controller `ownerReference` to it) before the hub makes it.
/// Not in the parent's record, it is not the parent's: that namespace is refused, and said; the parent's
/// children everywhere else are written (issue 61, a review's finding: this froze the whole answer).
#[tokio::test]
async fn a_squat_that_says_it_is_the_parents_child_elsewhere_refuses_only_its_namespace() {
    let Tenants { w, t1, t2, n1, n2, cms } = Tenants::new("tn-squat").await;
    let pp =
        w.thing("pp", json!({"children": [child("team-config", Some(&n1)), child("team-config", Some(&n2))]})).await;
    eventually(WAIT, || config_map(&w, &n2, "team-config")).await;
    let uid = pp.metadata.uid.clone().unwrap();
    let labelled = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "team-extra", "labels": {PARENT_UID: uid, "controller-uid": uid}}, "data": {"v": "mine"}});
    cms.create(&Default::default(), &serde_json::from_value(labelled).unwrap()).await.unwrap();
    let owned = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "team-owned", "finalizers": ["tenant.example/keep"],
                     "ownerReferences": [{"apiVersion": "test.metahook.dev/v1", "kind": "Thing", "name": "pp",
                                          "uid": uid, "controller": true}]},
        "data": {"v": "mine"}});
    cms.create(&Default::default(), &serde_json::from_value(owned).unwrap()).await.unwrap();
    let children = json!([
        child("team-config", Some(&n1)),
        child("team-config", Some(&n2)),
        child("team-extra", Some(&n1)),
        child("team-extra", Some(&n2)),
        child("team-owned", Some(&n1)),
        child("team-owned", Some(&n2))
    ]);
    w.thing("pp", json!({"v": "2", "children": children})).await;
    for name in ["team-config", "team-extra", "team-owned"] {
        config_map_with_v(&w, &n2, name, "2", BOUND).await;
    }
    let refused = support::warning_eventually(&w.client, &w.ns.name, "pp", WAIT, |m| {
        m.contains("namespaces refused") && m.contains(&n1)
    })
    .await;
    assert!(!refused.contains(&uid), "the refusal names no UID: {refused}");
    for name in ["team-extra", "team-owned"] {
        assert_eq!(cms.get(name).await.unwrap().data["data"]["v"], "mine", "{name} untouched");
    }
    support::drop_finalizers(&cms, "team-owned").await;
    finish(w, t1, t2).await;
}

/// A write a tenant makes fail in its namespace (its copy made `immutable`) holds back that namespace's
/// deletions only: a child the parent no longer wants in another namespace is deleted (a review's
/// finding: it was held for good).
#[tokio::test]
async fn a_tenant_making_its_copy_immutable_holds_back_only_its_namespaces_deletions() {
    let Tenants { w, t1, t2, n1, n2, cms } = Tenants::new("tn-immutable").await;
    w.thing(
        "pi",
        json!({"children": [child("pi-config", Some(&n1)), child("pi-old", Some(&n2)), child("pi-keep", Some(&n2))]}),
    )
    .await;
    eventually(WAIT, || config_map(&w, &n2, "pi-old")).await;
    eventually(WAIT, || config_map(&w, &n1, "pi-config")).await;
    cms.patch("pi-config", &PatchParams::default(), &Patch::Merge(json!({"immutable": true}))).await.unwrap();
    w.thing("pi", json!({"v": "2", "children": [child("pi-config", Some(&n1)), child("pi-keep", Some(&n2))]})).await;
    eventually(BOUND, || async { config_map(&w, &n2, "pi-old").await.is_none().then_some(()) }).await;
    config_map_with_v(&w, &n2, "pi-keep", "2", BOUND).await;
    assert_eq!(cms.get("pi-config").await.unwrap().data["data"]["v"], "1", "the tenant's immutable copy");
    finish(w, t1, t2).await;
}

/// A parent's record whose finalizer was taken off (its controller stopped keeping records for a while)
/// is held again, and a foreground delete of the parent deletes no decoy: labels are never trusted for
/// a parent being deleted (a review's finding: the decoy was deleted).
#[tokio::test]
async fn a_released_record_is_held_again_and_a_foreground_delete_deletes_no_decoy() {
    let Tenants { w, t1, t2, cms, .. } = Tenants::new("tn-rerecord").await;
    let pe = w.thing("pe", json!({"children": [child("pe-cm", Some(&t2.name))]})).await;
    eventually(WAIT, || config_map(&w, &t2.name, "pe-cm")).await;
    cms.create(&Default::default(), &serde_json::from_value(decoy("decoy-e", &pe, &["tenant.example/keep"])).unwrap())
        .await
        .unwrap();
    let records = api(&w.client, support::RECORDS, "ChildRecord", Some(&w.ns.name)).await;
    let record = format!("{}.{}", pe.metadata.uid.as_deref().unwrap(), w.label);
    let held = |want: bool| {
        let records = records.clone();
        let record = record.clone();
        async move {
            let found = records.get(&record).await.unwrap();
            let holds = found.metadata.finalizers.iter().flatten().any(|f| f == "metahook.dev/children-elsewhere");
            (holds == want).then_some(())
        }
    };
    eventually(WAIT, || held(true)).await;
    let mut without = cross_namespace_spec(&w);
    without["childResources"][0].as_object_mut().unwrap().remove("crossNamespace");
    w.composite(without).await;
    eventually(WAIT, || held(false)).await;
    w.composite(cross_namespace_spec(&w)).await;
    eventually(WAIT, || held(true)).await;
    let things = w.things().await;
    things.delete("pe", &DeleteParams::foreground()).await.unwrap();
    support::gone(&things, "pe", BOUND).await;
    let after = cms.get("decoy-e").await.unwrap();
    assert!(after.metadata.deletion_timestamp.is_none(), "the hub deleted a decoy");
    support::drop_finalizers(&cms, "decoy-e").await;
    finish(w, t1, t2).await;
}

/// A controller whose parent type is changed takes its finalizer off the parents of the type it left:
/// nothing else would, and a delete of one would wait for ever (a review's finding).
#[tokio::test]
async fn a_controller_whose_parent_type_changed_lets_the_old_types_parents_go() {
    let w = World::new("tn-retype", HOOK).await;
    let mut spec = finalizing_spec(&w);
    w.composite(spec.clone()).await;
    let things = w.things().await;
    w.thing("old", json!({"children": [child("old-a", None)]})).await;
    holds_finalizer(&w, &things, "old", true, WAIT).await;
    spec["parentResource"]["resource"] = json!("catsets");
    w.composite(spec).await;
    holds_finalizer(&w, &things, "old", false, BOUND).await;
    things.delete("old", &DeleteParams::background()).await.unwrap();
    support::gone(&things, "old", BOUND).await;
    w.finish("CompositeController").await;
}

/// Issue 67 item 2: a tenant holds its copy of a platform parent's child in its deletion (a finalizer of
/// its own, then a delete) and takes it out of the parent's selector. The copy is neither the parent's
/// child any more nor free: only that namespace waits, and the parent says why; the parent's next change
/// reaches the other namespace's copy (it froze everywhere, retried quietly for ever, before), and once
/// the tenant lets its copy go the parent's child is made again there.
#[tokio::test]
async fn a_tenant_holding_its_copy_in_deletion_freezes_only_its_own_namespace_and_is_told_about() {
    let Tenants { w, t1, t2, n1, n2, cms } = Tenants::new("tn-hold").await;
    let children = platform(&w, &n1, &n2).await;

    let hold = json!({"metadata": {"finalizers": ["tenant.example/hold"]}});
    cms.patch("team-config", &PatchParams::default(), &Patch::Merge(hold)).await.unwrap();
    cms.delete("team-config", &DeleteParams::default()).await.unwrap();
    let unselected = json!({"metadata": {"labels": {"controller-uid": null}}});
    let held = cms.patch("team-config", &PatchParams::default(), &Patch::Merge(unselected)).await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());

    w.thing("platform", json!({"v": "2", "children": children})).await;
    config_map_with_v(&w, &n2, "team-config", "2", BOUND).await;
    let said = support::warning_eventually(&w.client, &w.ns.name, "platform", WAIT, |m| {
        m.contains(&format!("{n1}/team-config")) && m.contains("being deleted")
    })
    .await;
    assert!(said.contains("tenant.example/hold"), "the parent names what holds the copy: {said}");
    // One more change of the parent, synced everywhere else: the held copy is not written meanwhile.
    let before = cms.get("team-config").await.unwrap();
    assert_eq!(label(&before, "controller-uid"), None, "still out of the parent's selector");
    w.thing("platform", json!({"v": "3", "children": children})).await;
    config_map_with_v(&w, &n2, "team-config", "3", BOUND).await;
    let kept = cms.get("team-config").await.unwrap();
    assert_eq!(kept.metadata.resource_version, before.metadata.resource_version, "the held copy is not written");

    // Let go: the namespace that waited gets the parent's child back, at the parent's spec.
    support::drop_finalizers(&cms, "team-config").await;
    let back = eventually(BOUND, || async {
        config_map(&w, &n1, "team-config").await.filter(|cm| cm.metadata.deletion_timestamp.is_none())
    })
    .await;
    assert_eq!(back.data["data"]["v"], "3");
    assert_ne!(back.metadata.uid, held.metadata.uid, "made again, not the held one");

    finish(w, t1, t2).await;
}

/// Issue 67 (attack on the canary): a tenant holding its copy of a platform parent's child makes every
/// answer for that parent lose the tenant's namespace — under the current hook too. A candidate that
/// crashes on that parent must not be excused by it: the current hook's answer is only refused in
/// part, its call does not fail. Before, the crash counted as the parent's own failure, and a failing
/// candidate whose side was that one parent stayed Running, the parent frozen everywhere.
#[tokio::test]
async fn a_tenant_holding_a_copy_does_not_excuse_a_candidate_that_crashes_on_its_parent() {
    let (w, t1, cms) = world_and_tenant("tn-canary", "tn-canary-t1").await;
    w.composite(cross_namespace_spec(&w)).await;
    let n1 = t1.namespace.name.clone();
    let children = json!([child("home-config", None), child("team-config", Some(&n1))]);
    w.thing("platform", json!({"children": children})).await;
    eventually(WAIT, || config_map(&w, &n1, "team-config")).await;
    let hold = json!({"metadata": {"finalizers": ["tenant.example/hold"], "labels": {"controller-uid": null}}});
    cms.patch("team-config", &PatchParams::default(), &Patch::Merge(hold)).await.unwrap();
    cms.delete("team-config", &DeleteParams::default()).await.unwrap();

    let candidate =
        support::HookServer::start("def sync(request):\n    raise RuntimeError('broken candidate')\n").await;
    let canary = json!({"url": candidate.url("/sync"), "percent": 100}).to_string();
    let controllers = w.controllers("CompositeController").await;
    let annotate = json!({"metadata": {"annotations": {"metahook.dev/canary": canary}}});
    controllers.patch(&w.label, &PatchParams::default(), &Patch::Merge(&annotate)).await.unwrap();
    let halted = eventually(WAIT, || async {
        let controller = controllers.get(&w.label).await.ok()?;
        let status = controller.data["status"]["canary"].clone();
        (status["state"] == "Halted").then_some(status)
    })
    .await;
    assert_eq!(halted["candidate"]["errors"], 1, "the crash is the candidate's: {halted}");
    assert!(!candidate.requests("/sync").is_empty(), "the candidate was asked");
    // Back with the current hook, the parent's home child follows its spec again.
    w.thing("platform", json!({"v": "2", "children": children})).await;
    config_map_with_v(&w, &w.ns.name, "home-config", "2", WAIT).await;

    support::drop_finalizers(&cms, "team-config").await;
    finish_tenant(w, t1).await;
}

/// Issue 67 item 2: an object already where a parent's record of children elsewhere goes, which is not
/// that parent's (it names another parent's UID), is never taken as the parent's record: the parent says
/// so, nothing of it is written elsewhere, the object is left as it is, and once it is gone the parent's
/// own record is made and its children with it.
#[tokio::test]
async fn an_object_where_a_parents_record_goes_is_not_taken_for_it() {
    let w = World::new("tn-record", HOOK).await;
    let t2 = TestNamespace::create(&w.client, "tn-record-t2").await;
    let n2 = t2.name.clone();
    // The parent first, then a record under its name naming another UID, then the controller.
    let parent = w.thing("pp", json!({"children": [child("team-config", Some(&n2))]})).await;
    let uid = parent.metadata.uid.clone().unwrap();
    let records = api(&w.client, "metahook.dev/v1alpha1", "ChildRecord", Some(&w.ns.name)).await;
    let name = format!("{uid}.{}", w.label);
    let squat = json!({"apiVersion": "metahook.dev/v1alpha1", "kind": "ChildRecord",
        "metadata": {"name": name, "namespace": w.ns.name},
        "spec": {"controller": w.label, "parent": {"name": "pp", "uid": "another-parents-uid"}, "children": []}});
    let squat = records.create(&Default::default(), &serde_json::from_value(squat).unwrap()).await.unwrap();
    w.composite(cross_namespace_spec(&w)).await;

    let said =
        support::warning_eventually(&w.client, &w.ns.name, "pp", WAIT, |m| m.contains("is not this parent's")).await;
    assert!(said.contains("another-parents-uid"), "{said}");
    assert!(config_map(&w, &n2, "team-config").await.is_none(), "nothing written elsewhere without its record");
    let left = records.get(&name).await.unwrap();
    assert_eq!(left.metadata.resource_version, squat.metadata.resource_version, "the object is left as it is");

    records.delete(&name, &DeleteParams::default()).await.unwrap();
    eventually(BOUND, || config_map(&w, &n2, "team-config")).await;
    let made = records.get(&name).await.unwrap();
    assert_eq!(made.data["spec"]["parent"]["uid"], uid.as_str(), "the parent's own record");

    t2.delete().await;
    w.finish("CompositeController").await;
}
