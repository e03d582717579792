//! A hub limited to some namespaces (`namespaces: [a, b]`) on the real control plane.
//!
//! A replica started as `metahook run --namespaces a,b` runs as a ServiceAccount that holds only what
//! `metahook rbac --base --namespaces a,b` printed (a Role per namespace, the base ClusterRole), syncs
//! parents in `a` and `b` through the real Python hello-world hook, and never touches a parent in `c`.
//! The API server's audit log (which records the ServiceAccounts of `metahook-audited` only,
//! `tests/cluster/audit-policy.yaml`) proves the hub's user never listed or watched anything
//! cluster-wide but its own controller objects, nor in another namespace. A controller whose parent
//! type is cluster-scoped is refused, with a reason of its own; related rules reaching outside the
//! namespaces fail the sync, saying why.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams};
use metahook::ops::yaml;
use serde_json::{Value, json};
use support::{
    AUDITED_NAMESPACE, ExampleHook, Hub, HubAccount, HubProcess, TestNamespace, api, apply_docs, apply_value,
    eventually,
};

const WAIT: Duration = Duration::from_secs(90);
const EXAMPLE: &str = "examples-python/hello-world";

/// The metacontroller.k8s.io types a hub watches cluster-wide whatever its namespaces: its controller
/// objects are cluster-scoped.
const CONTROLLER_TYPES: &[&str] = &["compositecontrollers", "decoratorcontrollers", "mapcontrollers"];

fn hello(namespace: &str, label: &str) -> Value {
    json!({"apiVersion": "example.metahook.dev/v1", "kind": "HelloWorld",
        "metadata": {"name": "world", "namespace": namespace, "labels": {"metahook-test": label}},
        "spec": {"who": namespace, "replicas": 1}})
}

#[tokio::test]
async fn a_hub_limited_to_two_namespaces_syncs_there_on_their_roles_and_never_lists_or_watches_elsewhere() {
    let client = support::client().await;
    support::install_metahook_crds(&client).await;
    support::audited_namespace(&client).await;
    let a = TestNamespace::create(&client, "ns-limited-a").await;
    let b = TestNamespace::create(&client, "ns-limited-b").await;
    let c = TestNamespace::create(&client, "ns-limited-c").await;
    let label = a.name.clone();
    let hook = ExampleHook::start(EXAMPLE, "python3", &["hook.py"]).await;
    let doc = |file: &str| support::example_docs(&format!("{EXAMPLE}/{file}"), hook.port, &label, &a.name);
    apply_docs(&client, &doc("crd.yaml")).await;
    let mut controller = doc("controller.yaml").remove(0);
    controller["metadata"]["name"] = json!(label);
    controller["spec"]["parentResource"]["labelSelector"] = json!({"matchLabels": {"metahook-test": label}});

    // What `metahook rbac --namespaces a,b` prints: the base ClusterRole, and the controller's grants as a
    // Role + RoleBinding in a and in b; no ClusterRole for the controller.
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), yaml::to_string(&controller).unwrap()).unwrap();
    let user_name = format!("hub-{}", support::unique_suffix());
    let account_arg = format!("{AUDITED_NAMESPACE}/{user_name}");
    let namespaces_arg = format!("{},{}", a.name, b.name);
    let printed = support::metahook_rbac(&[
        "--base",
        "-f",
        file.path().to_str().unwrap(),
        "--service-account",
        &account_arg,
        "--namespaces",
        &namespaces_arg,
    ]);
    let described: Vec<String> = printed
        .iter()
        .map(|d| format!("{} {}", d["kind"].as_str().unwrap(), d["metadata"]["namespace"].as_str().unwrap_or("-")))
        .collect();
    assert_eq!(
        described,
        [
            "ClusterRole -".to_owned(),
            format!("Role {}", a.name),
            format!("RoleBinding {}", a.name),
            format!("Role {}", b.name),
            format!("RoleBinding {}", b.name),
        ],
        "only the base role is cluster-wide"
    );
    let mut account = HubAccount::create_named(&client, AUDITED_NAMESPACE, &user_name, &label).await;
    account.grant(&printed).await;

    // A replica as deployed: its own `metahook run --namespaces a,b` process, on the account's token.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = account.kubeconfig(dir.path());
    let hub = HubProcess::start_as(&label, "", &[], &kubeconfig, &["--namespaces", &namespaces_arg]);
    apply_value(&client, &controller).await;
    // c's parent first: had the hub watched c, it would be synced no later than a's and b's.
    for ns in [&c.name, &a.name, &b.name] {
        apply_value(&client, &hello(ns, &label)).await;
    }

    // a and b: the hook's Pod, and the parent's status, written by the hub on its Roles.
    for ns in [&a.name, &b.name] {
        let pods = api(&client, "v1", "Pod", Some(ns)).await;
        let pod = eventually(WAIT, || async { pods.get_opt("world-0").await.unwrap() }).await;
        let command = pod.data["spec"]["containers"][0]["command"].to_string();
        assert!(command.contains(&format!("Hello, {ns}!")), "{command}");
        let worlds = api(&client, "example.metahook.dev/v1", "HelloWorld", Some(ns)).await;
        eventually(WAIT, || async { worlds.get("world").await.unwrap().data.get("status").map(drop) }).await;
    }
    // c: asked to sync again, and still untouched (no child, no status, no finalizer).
    let c_worlds = api(&client, "example.metahook.dev/v1", "HelloWorld", Some(&c.name)).await;
    let ask = json!({"metadata": {"annotations": {"metahook.dev/sync-requested-at": "now"}}});
    c_worlds.patch("world", &PatchParams::default(), &Patch::Merge(ask)).await.unwrap();
    let again = json!({"metadata": {"annotations": {"metahook.dev/sync-requested-at": "again"}}});
    let a_worlds = api(&client, "example.metahook.dev/v1", "HelloWorld", Some(&a.name)).await;
    a_worlds.patch("world", &PatchParams::default(), &Patch::Merge(again)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let c_pods = api(&client, "v1", "Pod", Some(&c.name)).await;
    assert!(c_pods.list(&Default::default()).await.unwrap().items.is_empty(), "no child in c");
    let c_world = c_worlds.get("world").await.unwrap();
    assert!(c_world.data.get("status").is_none(), "c's parent has no status: {:?}", c_world.data);
    assert!(c_world.metadata.finalizers.is_none(), "{:?}", c_world.metadata.finalizers);
    let writers: Vec<String> =
        c_world.metadata.managed_fields.iter().flatten().filter_map(|m| m.manager.clone()).collect();
    // The hub writes as `metahook` (its field manager and user agent); the test as `metahook-tests`.
    assert!(
        !writers.iter().any(|m| m.starts_with("metahook") && m != "metahook-tests"),
        "only the test wrote c's parent: {writers:?}"
    );

    // The audit log: every list and watch of the hub's user is in a or b, but for its controller objects.
    let records = support::audit_records(&account.user());
    let reads: Vec<&Value> = records.iter().filter(|r| r["verb"] == "list" || r["verb"] == "watch").collect();
    let mut outside = Vec::new();
    let mut seen = BTreeSet::new();
    for record in &reads {
        let resource = record["objectRef"]["resource"].as_str().unwrap_or_default();
        let namespace = record["objectRef"]["namespace"].as_str();
        let verb = record["verb"].as_str().unwrap_or_default();
        match namespace {
            Some(ns) if ns == a.name || ns == b.name => {
                seen.insert(format!("{verb} {resource} in {ns}"));
            }
            None if record["objectRef"]["apiGroup"] == "metacontroller.k8s.io"
                && CONTROLLER_TYPES.contains(&resource) =>
            {
                seen.insert(format!("{verb} {resource}"));
            }
            _ => outside.push(format!("{verb} {}", record["requestURI"].as_str().unwrap_or_default())),
        }
    }
    assert!(outside.is_empty(), "the hub listed or watched outside {} and {}: {outside:#?}", a.name, b.name);
    for ns in [&a.name, &b.name] {
        for resource in ["helloworlds", "pods"] {
            for verb in ["list", "watch"] {
                let expected = format!("{verb} {resource} in {ns}");
                assert!(
                    seen.contains(&expected),
                    "no {expected} in the audit log ({} records): {seen:#?}",
                    reads.len()
                );
            }
        }
    }
    assert!(seen.contains("watch compositecontrollers"), "{seen:#?}");

    hub.kill();
    let controllers = api(&client, support::CONTROLLERS, "CompositeController", None).await;
    let _ = controllers.delete(&label, &DeleteParams::default()).await;
    account.delete().await;
    for ns in [a, b, c] {
        ns.delete().await;
    }
}

#[tokio::test]
async fn a_controller_with_a_cluster_scoped_parent_is_refused_by_a_hub_limited_to_namespaces() {
    let (client, ns) = support::with_crds("ns-limited-cluster-parent").await;
    let label = ns.name.clone();
    let config =
        metahook::ops::config::Config { namespaces: vec![ns.name.clone()], ..metahook::ops::config::Config::default() };
    let hub = Hub::start_with_config(&client, &label, config);
    // Namespaces are cluster-scoped: the hub, as admin here, could watch them, but a hub on Roles cannot.
    let controller = json!({"apiVersion": support::CONTROLLERS, "kind": "CompositeController",
        "metadata": {"name": label, "labels": {"metahook-test": label}},
        "spec": {"parentResource": {"apiVersion": "v1", "resource": "namespaces"},
                 "childResources": [{"apiVersion": "v1", "resource": "configmaps"}],
                 "hooks": {"sync": {"webhook": {"url": "http://127.0.0.1:9/sync"}}}}});
    apply_value(&client, &controller).await;

    let controllers = api(&client, support::CONTROLLERS, "CompositeController", None).await;
    let condition = eventually(WAIT, || async {
        let obj = controllers.get(&label).await.unwrap();
        let conditions = obj.data["status"]["conditions"].as_array().cloned().unwrap_or_default();
        conditions.into_iter().find(|c| c["type"] == "Ready" && c["status"] == "False")
    })
    .await;
    assert_eq!(condition["reason"], "ClusterScopedResource", "{condition}");
    let message = condition["message"].as_str().unwrap();
    assert!(message.contains("namespaces") && message.contains(&ns.name), "{message}");
    let warning =
        support::warning_eventually(&client, "default", &label, WAIT, |w| w.starts_with("ClusterScopedResource: "))
            .await;
    assert!(warning.contains("parent resource namespaces"), "{warning}");

    hub.stop().await;
    let _ = controllers.delete(&label, &DeleteParams::default()).await;
    ns.delete().await;
}

/// The customize hook asks for the rule in the parent's spec; sync reports what it was given.
const RULE_FROM_SPEC: &str = r#"
def customize(req):
    return {"relatedResources": [req["parent"]["spec"]["rule"]]}

def sync(req):
    return {"status": {"related": {t: sorted(objs) for t, objs in req["related"].items()}}, "children": []}
"#;

#[tokio::test]
async fn related_rules_reaching_outside_a_namespaced_hubs_namespaces_fail_the_sync_saying_so() {
    let mut w = support::World::new("ns-limited-related", RULE_FROM_SPEC).await;
    w.stop_hub().await;
    let config = metahook::ops::config::Config {
        namespaces: vec![w.ns.name.clone()],
        ..metahook::ops::config::Config::default()
    };
    let client = w.client.clone();
    w.start_hub_with(&client, config);
    let other = TestNamespace::create(&w.client, "ns-limited-related-other").await;
    for ns in [&w.ns.name, &other.name] {
        apply_value(
            &w.client,
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "wanted", "namespace": ns}}),
        )
        .await;
    }
    w.composite(json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
        "hooks": {"sync": {"version": "v2", "webhook": {"url": w.hook.url("/sync")}},
                  "customize": {"version": "v2", "webhook": {"url": w.hook.url("/customize")}}},
    }))
    .await;
    let rule = |namespace: &str| {
        let names = json!(["wanted"]);
        json!({"apiVersion": "v1", "resource": "configmaps", "namespace": namespace, "names": names})
    };
    w.thing("inside", json!({"rule": rule(&w.ns.name)})).await;
    w.thing("other-namespace", json!({"rule": rule(&other.name)})).await;
    w.thing("cluster-scoped", json!({"rule": {"apiVersion": "v1", "resource": "namespaces", "names": [other.name]}}))
        .await;
    w.thing(
        "namespace-selector",
        json!({"rule": {"apiVersion": "v1", "resource": "configmaps",
                        "namespaceSelector": {"matchLabels": {"x": "y"}}}}),
    )
    .await;

    let things = w.things().await;
    let related =
        eventually(WAIT, || async { things.get("inside").await.unwrap().data["status"].get("related").cloned() }).await;
    assert_eq!(related, json!({"ConfigMap.v1": [format!("{}/wanted", w.ns.name)]}), "a rule inside works");
    for (parent, expected) in [
        ("other-namespace", format!("namespace {} is not one this hub watches ({})", other.name, w.ns.name)),
        ("cluster-scoped", format!("a cluster-scoped type, but this hub watches only namespaces {}", w.ns.name)),
        ("namespace-selector", "namespaceSelector reads Namespaces".to_owned()),
    ] {
        let warning = support::warning_eventually(&w.client, &w.ns.name, parent, WAIT, |e| {
            e.starts_with("SyncError: ") && e.contains(&expected)
        })
        .await;
        assert!(warning.contains("related resources"), "{warning}");
        let status = things.get(parent).await.unwrap().data.get("status").cloned();
        assert_eq!(status, None, "{parent}: nothing written");
    }
    other.delete().await;
    w.finish("CompositeController").await;
}
