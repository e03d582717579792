//! The customize hook and related objects, for both controller kinds, on the real control plane.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{World, api, apply_value, eventually, warnings_for};

const WAIT: Duration = Duration::from_secs(60);

impl World {
    /// The test's CompositeController over `parent_resource` with `children`, its sync and customize
    /// hooks at `version`.
    async fn composite_with_customize(&self, parent_resource: &str, version: &str, children: Value) {
        self.composite(json!({
            "generateSelector": true,
            "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": parent_resource},
            "childResources": children,
            "hooks": {"sync": {"version": version, "webhook": {"url": self.hook.url("/sync")}},
                      "customize": {"version": version, "webhook": {"url": self.hook.url("/customize")}}},
        }))
        .await;
    }

    async fn namespace(&self, suffix: &str, labels: Value) -> String {
        let name = format!("{}-{suffix}", self.ns.name);
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        Api::<Namespace>::all(self.client.clone()).create(&PostParams::default(), &ns).await.unwrap();
        name
    }
}

/// Copies the source ConfigMap named by the parent into every namespace labelled `copy-to=<test>`.
const PROPAGATE: &str = r#"
def customize(req):
    spec = req["parent"]["spec"]
    return {"relatedResources": [
        {"apiVersion": "v1", "resource": "configmaps", "namespace": spec["sourceNamespace"], "names": [spec["source"]]},
        {"apiVersion": "v1", "resource": "namespaces", "labelSelector": {"matchLabels": {"copy-to": spec["label"]}}},
    ]}

def sync(req):
    spec = req["parent"]["spec"]
    sources = list(req["related"]["ConfigMap.v1"].values())
    namespaces = sorted(ns["metadata"]["name"] for ns in req["related"]["Namespace.v1"].values())
    if not sources:
        return {"status": {"copies": 0}, "children": []}
    data = sources[0].get("data", {})
    copies = [{"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": spec["source"], "namespace": ns}, "data": data} for ns in namespaces]
    return {"status": {"copies": len(copies)}, "children": copies}
"#;

#[tokio::test]
async fn configmap_propagation_follows_the_source_and_namespace_labels() {
    let w = World::new("propagate", PROPAGATE).await;
    apply_value(
        &w.client,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "shared", "namespace": w.ns.name}, "data": {"k": "1"}}),
    )
    .await;
    let a = w.namespace("a", json!({"copy-to": w.label})).await;
    let b = w.namespace("b", json!({})).await;
    w.composite_with_customize(
        "clusterthings",
        "v1",
        json!([{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}]),
    )
    .await;
    let parent = format!("p-{}", w.label);
    apply_value(
        &w.client,
        &json!({"apiVersion": "test.metahook.dev/v1", "kind": "ClusterThing",
        "metadata": {"name": parent, "labels": {"metahook-test": w.label}},
        "spec": {"source": "shared", "sourceNamespace": w.ns.name, "label": w.label}}),
    )
    .await;
    let in_a = api(&w.client, "v1", "ConfigMap", Some(&a)).await;
    let in_b = api(&w.client, "v1", "ConfigMap", Some(&b)).await;
    eventually(WAIT, || async { in_a.get_opt("shared").await.unwrap().filter(|c| c.data["data"]["k"] == "1") }).await;
    let parents = api(&w.client, "test.metahook.dev/v1", "ClusterThing", None).await;
    eventually(WAIT, || async { (parents.get(&parent).await.unwrap().data["status"]["copies"] == 1).then_some(()) })
        .await;

    // A change to the related source re-syncs the parent.
    let source = w.config_maps().await;
    source.patch("shared", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": "2"}}))).await.unwrap();
    eventually(WAIT, || async { in_a.get_opt("shared").await.unwrap().filter(|c| c.data["data"]["k"] == "2") }).await;

    // Labelling another namespace (a related object) brings a copy there.
    Api::<Namespace>::all(w.client.clone())
        .patch(&b, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"copy-to": w.label}}})))
        .await
        .unwrap();
    eventually(WAIT, || async { in_b.get_opt("shared").await.unwrap().filter(|c| c.data["data"]["k"] == "2") }).await;
    eventually(WAIT, || async { (parents.get(&parent).await.unwrap().data["status"]["copies"] == 2).then_some(()) })
        .await;
    parents.delete(&parent, &DeleteParams::default()).await.unwrap();
    w.finish_with_namespaces("CompositeController", &[a, b]).await;
}

/// Asks for a ConfigMap in the namespace `spec.relatedNamespace` and a Namespace; echoes related keys.
const CROSS_NAMESPACE: &str = r#"
def customize(req):
    spec = req["parent"]["spec"]
    return {"relatedResources": [
        {"apiVersion": "v1", "resource": "configmaps", "namespace": spec["relatedNamespace"], "names": ["wanted"]},
        {"apiVersion": "v1", "resource": "namespaces", "names": [spec["relatedNamespace"]]},
    ]}

def sync(req):
    return {"status": {"related": {t: sorted(objs) for t, objs in req["related"].items()}}, "children": []}
"#;

#[tokio::test]
async fn v1_hooks_cannot_ask_for_another_namespace() {
    let w = World::new("related-v1", CROSS_NAMESPACE).await;
    let other = w.namespace("other", json!({})).await;
    w.composite_with_customize("things", "v1", json!([{"apiVersion": "v1", "resource": "configmaps"}])).await;
    w.thing("p", json!({"relatedNamespace": other})).await;
    let expected =
        format!("requested related object namespace {other} differs from parent object namespace {}", w.ns.name);
    eventually(WAIT, || async {
        warnings_for(&w.client, &w.ns.name, "p").await.into_iter().find(|e| e.contains(&expected))
    })
    .await;
    w.finish_with_namespaces("CompositeController", &[other]).await;
}

#[tokio::test]
async fn v2_hooks_see_related_objects_in_other_namespaces_and_cluster_scoped_ones() {
    let w = World::new("related-v2", CROSS_NAMESPACE).await;
    let other = w.namespace("other", json!({})).await;
    apply_value(
        &w.client,
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "wanted", "namespace": other}}),
    )
    .await;
    w.composite_with_customize("things", "v2", json!([{"apiVersion": "v1", "resource": "configmaps"}])).await;
    w.thing("p", json!({"relatedNamespace": other})).await;
    let things = w.things().await;
    let related = eventually(WAIT, || async {
        let p = things.get("p").await.unwrap();
        p.data["status"].get("related").cloned()
    })
    .await;
    assert_eq!(related, json!({"ConfigMap.v1": [format!("{other}/wanted")], "Namespace.v1": [other]}));
    w.finish_with_namespaces("CompositeController", &[other]).await;
}

/// Each parent relates to the ConfigMap named in its spec; counts how often each parent is synced.
const BY_NAME: &str = r#"
def customize(req):
    return {"relatedResources": [{"apiVersion": "v1", "resource": "configmaps", "names": [req["parent"]["spec"]["watch"]]}]}

def sync(req):
    return {"children": []}
"#;

#[tokio::test]
async fn a_related_change_resyncs_only_the_parents_that_select_it() {
    let w = World::new("related-targeted", BY_NAME).await;
    for cm in ["watched-a", "watched-b"] {
        apply_value(
            &w.client,
            &json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": cm, "namespace": w.ns.name}, "data": {"v": "0"}}),
        )
        .await;
    }
    w.composite_with_customize("things", "v1", json!([{"apiVersion": "v1", "resource": "secrets"}])).await;
    for (parent, cm) in [("pa", "watched-a"), ("pb", "watched-b")] {
        w.thing(parent, json!({"watch": cm})).await;
    }
    let syncs =
        |parent: &str| w.hook.requests("/sync").iter().filter(|r| r["parent"]["metadata"]["name"] == parent).count();
    eventually(WAIT, || async { (syncs("pa") >= 1 && syncs("pb") >= 1).then_some(()) }).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (before_a, before_b) = (syncs("pa"), syncs("pb"));
    let customizes = w.hook.requests("/customize").len();

    let cms = w.config_maps().await;
    cms.patch("watched-a", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "1"}}))).await.unwrap();
    eventually(WAIT, || async { (syncs("pa") > before_a).then_some(()) }).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(syncs("pb"), before_b, "a parent whose rules do not select the object is not re-synced");
    assert_eq!(w.hook.requests("/customize").len(), customizes, "customize is cached per parent generation");
    w.finish("CompositeController").await;
}

/// Names the ConfigMap `answer-1` the first time it is asked, `answer-2` ever after: a customize hook
/// whose answer depends on more than its parent (here, how often it was asked).
const ANSWER_CHANGES: &str = r#"
import itertools
calls = itertools.count(1)

def customize(req):
    n = next(calls)
    return {"relatedResources": [{"apiVersion": "v1", "resource": "configmaps", "names": ["answer-%d" % min(n, 2)]}]}

def sync(req):
    return {"status": {"related": sorted(req["related"]["ConfigMap.v1"])}, "children": []}
"#;

/// A customize answer is used by every sync of an unchanged parent until it is older than
/// `customizeCacheTimeout`; then the hook is asked again (Metacontroller caches it 20 minutes).
#[tokio::test]
async fn a_customize_answer_is_asked_again_once_it_expires() {
    const TIMEOUT: Duration = Duration::from_secs(4);
    let mut w = World::new("related-expiry", ANSWER_CHANGES).await;
    w.stop_hub().await;
    w.start_hub_with(&w.client.clone(), metahook::Config { customize_cache_timeout: TIMEOUT, ..Default::default() });
    for cm in ["answer-1", "answer-2"] {
        apply_value(
            &w.client,
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm, "namespace": w.ns.name}}),
        )
        .await;
    }
    w.composite(json!({
        "generateSelector": true,
        "resyncPeriodSeconds": 1,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}},
                  "customize": {"webhook": {"url": w.hook.url("/customize")}}},
    }))
    .await;
    w.thing("p", json!({})).await;
    let related = || async { w.things().await.get("p").await.unwrap().data["status"]["related"].clone() };
    eventually(WAIT, || async { (related().await == json!(["answer-1"])).then_some(()) }).await;
    eventually(TIMEOUT * 4, || async { (related().await == json!(["answer-2"])).then_some(()) }).await;

    // The hook log in order: between the two customize calls, syncs (one a second) used the first answer.
    let log = std::fs::read_to_string(&w.hook.log).unwrap();
    let paths: Vec<String> =
        log.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["path"].as_str().unwrap().to_owned()).collect();
    let asked: Vec<usize> = paths.iter().enumerate().filter(|(_, p)| *p == "/customize").map(|(i, _)| i).collect();
    assert_eq!(asked.len(), 2, "asked once, then once more after the timeout: {paths:?}");
    let syncs_between = paths[asked[0]..asked[1]].iter().filter(|p| *p == "/sync").count();
    assert!(syncs_between >= 3, "the syncs before the timeout used the cached answer: {paths:?}");
    w.finish("CompositeController").await;
}

/// A DecoratorController's hook over Pods that copies the Pod's own Namespace's `team` label onto the
/// Pod, as a public Metacontroller controller does (its README pins Metacontroller 4.10.2: from 4.10.3
/// on a v1 request carries `{"Namespace.v1": {}}` and its hook fails). The customize hook asks for a
/// Namespace by name — the Pod's own, or the one its annotation `related-name` names — or, with the
/// annotation `related-by: labels`, by a label selector; `related-resource` makes it ask for another
/// cluster-scoped type instead. `sync` reads `related["Namespace.v1"][<name>]` and fails without it.
const NAMESPACE_LABELS: &str = r#"
def customize(req):
    meta = req["parent"]["metadata"]
    want = meta.get("annotations") or {}
    resource = want.get("related-resource", "namespaces")
    if want.get("related-by") == "labels":
        return {"relatedResources": [{"apiVersion": "v1", "resource": resource,
                                      "labelSelector": {"matchLabels": {"metahook-ns": meta["namespace"]}}}]}
    return {"relatedResources": [{"apiVersion": "v1", "resource": resource,
                                  "names": [want.get("related-name", meta["namespace"])]}]}

def sync(req):
    meta = req["object"]["metadata"]
    name = (meta.get("annotations") or {}).get("related-name", meta["namespace"])
    namespace = req["related"]["Namespace.v1"][name]
    return {"labels": {"team": (namespace["metadata"].get("labels") or {}).get("team")}}
"#;

impl World {
    /// The test's DecoratorController over its Pods, its sync and customize hooks at `version`, with
    /// `more` merged into its spec.
    async fn pod_decorator(&self, version: &str, more: Value) -> kube::api::DynamicObject {
        let mut spec = json!({
            "resources": [{"apiVersion": "v1", "resource": "pods"}],
            "hooks": {"sync": {"version": version, "webhook": {"url": self.hook.url("/sync")}},
                      "customize": {"version": version, "webhook": {"url": self.hook.url("/customize")}}},
        });
        for (field, value) in more.as_object().into_iter().flatten() {
            spec[field] = value.clone();
        }
        self.decorator(spec).await
    }

    /// The Pod `name` in the test's namespace, labelled for the test, with `annotations`. Retried while
    /// the namespace's `default` ServiceAccount, which admission wants, is not made yet.
    async fn pod(&self, name: &str, annotations: Value) {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": name, "namespace": self.ns.name, "annotations": annotations,
                                      "labels": {"metahook-test": self.label}},
                         "spec": {"containers": [{"name": "main", "image": "nginx"}]}});
        let pods = api(&self.client, "v1", "Pod", Some(&self.ns.name)).await;
        eventually(WAIT, || async {
            pods.patch(name, &PatchParams::apply("metahook-tests").force(), &Patch::Apply(&pod)).await.ok()
        })
        .await;
    }

    /// The `team` label of the test's Pod `name`, once it equals `want`.
    async fn team_becomes(&self, name: &str, want: &str) {
        let pods = api(&self.client, "v1", "Pod", Some(&self.ns.name)).await;
        eventually(WAIT, || async {
            let pod = pods.get(name).await.ok()?;
            (pod.metadata.labels?.get("team").map(String::as_str) == Some(want)).then_some(())
        })
        .await;
    }

    /// How many sync requests the hook got for the Pod `name`.
    fn syncs_of(&self, name: &str) -> usize {
        self.hook.requests("/sync").iter().filter(|r| r["object"]["metadata"]["name"] == name).count()
    }
}

/// Issue 69: a namespaced parent's related Namespace reaches its hook keyed by name, by name or by
/// selector, and a change of the Namespace re-syncs exactly the Pods whose rules select it.
async fn a_pods_namespace_reaches_its_hook_and_its_change_resyncs_the_pod(version: &str) {
    let w = World::new(&format!("related-ns-{version}"), NAMESPACE_LABELS).await;
    let namespaces = Api::<Namespace>::all(w.client.clone());
    let labels = |team: &str| json!({"metadata": {"labels": {"team": team, "metahook-ns": w.ns.name}}});
    namespaces.patch(&w.ns.name, &PatchParams::default(), &Patch::Merge(labels("red"))).await.unwrap();
    let other = w.namespace("other", json!({"team": "green"})).await;
    let controller = w.pod_decorator(version, json!({})).await;
    w.pod("by-name", json!({})).await;
    w.pod("by-labels", json!({"related-by": "labels"})).await;
    w.pod("elsewhere", json!({"related-name": other})).await;
    w.team_becomes("by-name", "red").await;
    w.team_becomes("by-labels", "red").await;
    w.team_becomes("elsewhere", "green").await;
    let request = w.hook.requests("/sync").into_iter().find(|r| r["object"]["metadata"]["name"] == "by-name").unwrap();
    let keys: Vec<&String> = request["related"]["Namespace.v1"].as_object().unwrap().keys().collect();
    assert_eq!(keys, [&w.ns.name], "keyed by name, in {version}");

    // The controller says what its parents' authors may make it read: cluster-scoped objects too.
    let note = eventually(WAIT, || async {
        let events = support::events_on(&w.client, "default", controller.metadata.name.as_deref().unwrap()).await;
        events.into_iter().find(|e| e.reason.as_deref() == Some("RelatedUnlimited")).and_then(|e| e.note)
    })
    .await;
    let reach = if version == "v1" { "any cluster-scoped object" } else { "any type in any namespace" };
    assert!(note.contains(reach) && note.contains("relatedLimit"), "{note}");

    tokio::time::sleep(Duration::from_secs(2)).await;
    let (elsewhere, customizes) = (w.syncs_of("elsewhere"), w.hook.requests("/customize").len());
    namespaces.patch(&w.ns.name, &PatchParams::default(), &Patch::Merge(labels("blue"))).await.unwrap();
    w.team_becomes("by-name", "blue").await;
    w.team_becomes("by-labels", "blue").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(w.syncs_of("elsewhere"), elsewhere, "a Pod whose rule selects another Namespace is not re-synced");
    assert_eq!(w.hook.requests("/customize").len(), customizes, "customize is cached per Pod generation");
    w.finish_with_namespaces("DecoratorController", &[other]).await;
}

#[tokio::test]
async fn a_v1_hook_sees_its_pods_namespace_by_name_and_its_label_change() {
    a_pods_namespace_reaches_its_hook_and_its_change_resyncs_the_pod("v1").await;
}

#[tokio::test]
async fn a_v2_hook_sees_its_pods_namespace_by_name_and_its_label_change() {
    a_pods_namespace_reaches_its_hook_and_its_change_resyncs_the_pod("v2").await;
}

/// Issue 69: under a `relatedLimit` listing Namespaces only, a Pod's rule for Nodes is refused with a
/// Warning Event on the Pod, and the sync hook never sees it; the Namespace still reaches the hook, and
/// the controller is not warned about (its author bounded it).
#[tokio::test]
async fn a_cluster_scoped_type_beyond_the_related_limit_is_refused_with_an_event() {
    let w = World::new("related-ns-limit", NAMESPACE_LABELS).await;
    let namespaces = Api::<Namespace>::all(w.client.clone());
    let labels = json!({"metadata": {"labels": {"team": "red"}}});
    namespaces.patch(&w.ns.name, &PatchParams::default(), &Patch::Merge(labels)).await.unwrap();
    let limit = json!({"relatedLimit": {"resources": [{"apiVersion": "v1", "resource": "namespaces"}]}});
    let controller = w.pod_decorator("v1", limit).await;
    w.pod("nodes", json!({"related-resource": "nodes", "related-by": "labels"})).await;
    w.pod("allowed", json!({})).await;
    let refused = eventually(WAIT, || async {
        warnings_for(&w.client, &w.ns.name, "nodes").await.into_iter().find(|m| m.contains("relatedLimit"))
    })
    .await;
    assert!(refused.contains("nodes.v1"), "{refused}");
    w.team_becomes("allowed", "red").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(w.syncs_of("nodes"), 0, "nothing of a refused rule reaches the sync hook");
    let events = support::events_on(&w.client, "default", controller.metadata.name.as_deref().unwrap()).await;
    assert!(events.iter().any(|e| e.reason.as_deref() == Some("Started")), "{events:?}");
    assert!(events.iter().all(|e| e.reason.as_deref() != Some("RelatedUnlimited")), "{events:?}");
    w.finish("DecoratorController").await;
}
