//! The hub as a platform team runs it, on the real control plane: with a ServiceAccount token bound
//! only to the roles `metahook rbac` prints (an example works; a child type not granted gives a clear
//! `Ready=False`/`Forbidden`), `/readyz` and `/metrics`, Events on controller objects, syncs on demand,
//! and JSON logs with the sync's span on every line.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{AggregationRule, ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use metahook::ops::yaml;
use metahook::tools::rbac::AGGREGATE_LABEL;
use serde_json::{Value, json};
use support::{ExampleHook, HookServer, World, api, apply_docs, apply_value, events_on, eventually, example_docs};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(90);

fn free_address() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("127.0.0.1:{port}")
}

/// The value of the first sample line starting with `prefix` (name and labels).
fn sample(metrics: &str, prefix: &str) -> Option<f64> {
    metrics.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// (reason, note) of Events about the cluster-scoped object `name` (they are recorded in `default`).
async fn controller_events(client: &Client, name: &str) -> Vec<(String, String)> {
    let events = events_on(client, "default", name).await;
    events.into_iter().map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default())).collect()
}

/// "reason: note" of every Event about `name` in `namespace`.
async fn events_for(client: &Client, namespace: &str, name: &str) -> Vec<String> {
    let events = events_on(client, namespace, name).await;
    events.into_iter().map(|e| format!("{}: {}", e.reason.unwrap_or_default(), e.note.unwrap_or_default())).collect()
}

async fn ready_condition(client: &Client, name: &str) -> Option<Value> {
    let ccs = api(client, "metacontroller.k8s.io/v1alpha1", "CompositeController", None).await;
    let cc = ccs.get_opt(name).await.ok()??;
    cc.data["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "Ready").cloned()
}

#[tokio::test]
async fn a_hub_with_only_the_printed_roles_runs_an_example_and_reports_a_forbidden_child_type() {
    let (client, ns) = support::with_crds("rbac_token").await;
    let label = ns.name.clone();
    let hook = ExampleHook::start("examples-python/hello-world", "python3", &["hook.py"]).await;
    let mut docs = Vec::new();
    for file in ["crd.yaml", "controller.yaml", "hello.yaml"] {
        docs.extend(example_docs(&format!("examples-python/hello-world/{file}"), hook.port, &label, &ns.name));
    }
    for doc in &mut docs {
        if doc["kind"] == "CompositeController" {
            doc["metadata"]["name"] = json!(label);
            doc["spec"]["parentResource"]["labelSelector"]["matchLabels"]["metahook-test"] = json!(label);
        } else if doc["kind"] == "HelloWorld" {
            doc["metadata"]["labels"]["metahook-test"] = json!(label);
        }
    }
    let controller_doc = docs.iter().find(|d| d["kind"] == "CompositeController").unwrap().clone();
    let parent_doc = docs.iter().find(|d| d["kind"] == "HelloWorld").unwrap().clone();
    apply_docs(&client, &docs.iter().filter(|d| d["kind"] == "CustomResourceDefinition").cloned().collect::<Vec<_>>())
        .await;

    // The hub's identity: a ServiceAccount whose ClusterRole aggregates the base role and the role
    // `metahook rbac` derives from the example's controller (labelled for this test only).
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns.name);
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "hub"}})).unwrap();
    sas.create(&PostParams::default(), &sa).await.unwrap();
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let hub_role = ClusterRole {
        metadata: ObjectMeta { name: Some(format!("{label}-hub")), ..ObjectMeta::default() },
        aggregation_rule: Some(AggregationRule {
            cluster_role_selectors: Some(vec![
                serde_json::from_value(json!({"matchLabels": {AGGREGATE_LABEL: label}})).unwrap(),
            ]),
        }),
        rules: None,
    };
    roles.create(&PostParams::default(), &hub_role).await.unwrap();
    // The roles exactly as `metahook rbac --base -f controller.yaml` prints them, relabelled for this test.
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), yaml::to_string(&controller_doc).unwrap()).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
        .args(["rbac", "--base", "-f"])
        .arg(file.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let mut printed: Vec<ClusterRole> = yaml::from_documents(&String::from_utf8(output.stdout).unwrap()).unwrap();
    assert_eq!(printed.len(), 2, "the base role and the controller's");
    for role in &mut printed {
        assert_eq!(role.labels().get(AGGREGATE_LABEL).map(String::as_str), Some("true"));
        role.metadata.name = Some(format!("{label}-{}", role.name_any()));
        role.metadata.labels = Some([(AGGREGATE_LABEL.to_owned(), label.clone())].into());
    }
    let token = support::service_account_token(&client, &ns.name, "hub").await;

    // The hub starts before its roles exist: it cannot list its controllers, so it is not ready.
    let address = free_address();
    let config = metahook::ops::config::Config {
        target_label_selector: format!("metahook-test={label}"),
        discovery_interval: Duration::from_secs(2),
        cache_sync_timeout: Duration::from_secs(20),
        metrics_address: address.clone(),
        ..metahook::ops::config::Config::default()
    };
    let cancel = CancellationToken::new();
    let hub = tokio::spawn(metahook::run_until(support::token_client(&token).await, config, cancel.clone()));
    let (code, body) = eventually(WAIT, || support::http_get(&address, "/readyz")).await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("CompositeControllers: not listed yet"), "{body}");

    for role in &printed {
        roles.create(&PostParams::default(), role).await.unwrap();
    }
    support::bind_cluster_role(&client, &format!("{label}-hub"), &ns.name, "hub").await;
    eventually(WAIT, || async { support::http_get(&address, "/readyz").await.filter(|(c, _)| *c == 200) }).await;

    // The example works with exactly those permissions.
    apply_value(&client, &controller_doc).await;
    apply_value(&client, &parent_doc).await;
    let pods = api(&client, "v1", "Pod", Some(&ns.name)).await;
    eventually(WAIT, || async {
        let list = pods.list(&Default::default()).await.ok()?;
        (list.items.len() == 2).then_some(())
    })
    .await;
    let ready =
        eventually(WAIT, || async { ready_condition(&client, &label).await.filter(|c| c["status"] == "True") }).await;
    assert_eq!(ready["reason"], "Running");

    // A controller whose child type was not granted: Ready=False naming Forbidden, not a hang.
    let mut secret_controller = controller_doc.clone();
    let forbidden_name = format!("{label}-secrets");
    secret_controller["metadata"]["name"] = json!(forbidden_name);
    secret_controller["spec"]["childResources"] = json!([{"apiVersion": "v1", "resource": "secrets"}]);
    apply_value(&client, &secret_controller).await;
    let condition = eventually(WAIT, || async {
        ready_condition(&client, &forbidden_name).await.filter(|c| c["status"] == "False")
    })
    .await;
    assert_eq!(condition["reason"], "Forbidden", "{condition}");
    assert!(condition["message"].as_str().unwrap().contains("secrets"), "{condition}");
    let (code, body) = support::http_get(&address, "/readyz").await.unwrap();
    assert_eq!(code, 200, "a controller that cannot start does not make the hub unready: {body}");
    assert!(body.contains(&format!("CompositeController/{forbidden_name}: not running: Forbidden")), "{body}");

    // Events on the controller objects.
    let started = eventually(WAIT, || async {
        let events = controller_events(&client, &label).await;
        events.iter().any(|(reason, _)| reason == "Started").then_some(events)
    })
    .await;
    assert!(started.iter().all(|(reason, _)| reason != "Forbidden"), "{started:?}");
    let failed = eventually(WAIT, || async {
        let events = controller_events(&client, &forbidden_name).await;
        events.into_iter().find(|(reason, _)| reason == "Forbidden")
    })
    .await;
    assert!(failed.1.contains("secrets"), "{failed:?}");

    // Conventional metrics, scraped from the running hub.
    let (_, metrics) = support::http_get(&address, "/metrics").await.unwrap();
    let ours = format!("controller=\"compositecontroller/{label}\"");
    assert!(
        sample(&metrics, &format!("controller_runtime_reconcile_total{{{ours},result=\"success\"}}")).unwrap_or(0.0)
            >= 1.0,
        "{metrics}"
    );
    assert!(
        sample(&metrics, &format!("controller_runtime_reconcile_time_seconds_count{{{ours}}}")).unwrap_or(0.0) >= 1.0
    );
    let queue = format!("name=\"compositecontroller/{label}\"");
    assert!(sample(&metrics, &format!("workqueue_adds_total{{{queue}}}")).unwrap_or(0.0) >= 1.0, "{metrics}");
    for family in [
        "workqueue_depth",
        "workqueue_retries_total",
        "workqueue_queue_duration_seconds_count",
        "workqueue_work_duration_seconds_count",
    ] {
        assert!(sample(&metrics, &format!("{family}{{{queue}}}")).is_some(), "{family} missing:\n{metrics}");
    }
    assert!(
        sample(&metrics, "metahook_apply_total{kind=\"Pod\",result=\"created\"}").unwrap_or(0.0) >= 2.0,
        "{metrics}"
    );
    assert!(sample(&metrics, "metahook_informer_objects{resource=\"v1/pods\"}").is_some(), "{metrics}");
    assert_eq!(sample(&metrics, "metahook_controllers{state=\"failed\"}"), Some(1.0), "{metrics}");

    cancel.cancel();
    let _ = hub.await;
    let ccs = api(&client, "metacontroller.k8s.io/v1alpha1", "CompositeController", None).await;
    for name in [&label, &forbidden_name] {
        let _ = ccs.delete(name, &DeleteParams::default()).await;
    }
    for role in printed.iter().map(ResourceExt::name_any).chain([format!("{label}-hub")]) {
        let _ = roles.delete(&role, &DeleteParams::default()).await;
    }
    let _ =
        Api::<ClusterRoleBinding>::all(client.clone()).delete(&format!("{label}-hub"), &DeleteParams::default()).await;
    ns.delete().await;
}

/// Counts hook calls per parent in the status, so a test can see a sync happen.
const COUNTING: &str = r#"
calls = {}

def sync(req):
    name = req["parent"]["metadata"]["name"]
    calls[name] = calls.get(name, 0) + 1
    return {"status": {"calls": calls[name]}, "children": []}
"#;

#[tokio::test]
async fn the_sync_requested_at_annotation_syncs_a_parent_or_every_parent_at_once() {
    let world = World::new("sync_request", COUNTING).await;
    let controller = json!({
        "apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
        "metadata": {"name": world.label, "labels": {"metahook-test": world.label}},
        "spec": {
            "generateSelector": true,
            "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things", "ignoreStatusChanges": true,
                               "labelSelector": {"matchLabels": {"metahook-test": world.label}}},
            "hooks": {"sync": {"webhook": {"url": world.hook.url("/sync")}}},
        },
    });
    apply_value(&world.client, &controller).await;
    for name in ["a", "b"] {
        apply_value(
            &world.client,
            &json!({
            "apiVersion": "test.metahook.dev/v1", "kind": "Thing",
            "metadata": {"name": name, "namespace": world.ns.name, "labels": {"metahook-test": world.label}},
            "spec": {}}),
        )
        .await;
    }
    let things = api(&world.client, "test.metahook.dev/v1", "Thing", Some(&world.ns.name)).await;
    let calls = |name: &'static str| {
        let things = things.clone();
        async move { things.get(name).await.ok()?.data["status"]["calls"].as_u64() }
    };
    let before = eventually(WAIT, || async { calls("a").await }).await;
    eventually(WAIT, || async { calls("b").await }).await;

    // On a parent: it is synced at once, and an Event says when.
    let annotate = |at: &str| json!({"metadata": {"annotations": {metahook::engine::trigger::SYNC_REQUESTED_AT: at}}});
    things.patch("a", &PatchParams::default(), &Patch::Merge(&annotate("2030-01-01T00:00:00Z"))).await.unwrap();
    eventually(WAIT, || async { calls("a").await.filter(|c| *c > before) }).await;
    let note = eventually(WAIT, || async {
        let events = events_for(&world.client, &world.ns.name, "a").await;
        events.into_iter().find(|e| e.starts_with("SyncRequested:"))
    })
    .await;
    assert!(note.contains("Sync requested at 2030-01-01T00:00:00Z done"), "{note}");

    // On the controller: every parent is synced, without a restart.
    let (a, b) = (calls("a").await.unwrap(), calls("b").await.unwrap());
    let ccs = api(&world.client, "metacontroller.k8s.io/v1alpha1", "CompositeController", None).await;
    ccs.patch(&world.label, &PatchParams::default(), &Patch::Merge(&annotate("now"))).await.unwrap();
    eventually(WAIT, || async { (calls("a").await? > a && calls("b").await? > b).then_some(()) }).await;
    let events = eventually(WAIT, || async {
        let events = controller_events(&world.client, &world.label).await;
        events.iter().any(|(reason, _)| reason == "SyncRequested").then_some(events)
    })
    .await;
    assert!(events.iter().any(|(_, note)| note.contains("queued 2 objects")), "{events:?}");
    assert!(!events.iter().any(|(reason, _)| reason == "Stopped"), "an annotation does not restart: {events:?}");

    // A spec change restarts the controller, with a Stopped Event before the new Started.
    let mut changed = controller.clone();
    changed["spec"]["resyncPeriodSeconds"] = json!(3600);
    apply_value(&world.client, &changed).await;
    eventually(WAIT, || async {
        let events = controller_events(&world.client, &world.label).await;
        events.iter().any(|(reason, note)| reason == "Stopped" && note.contains("spec changed")).then_some(())
    })
    .await;

    let mut world = world;
    world.stop_hub().await;
    let _ = ccs.delete(&world.label, &DeleteParams::default()).await;
    world.ns.delete().await;
}

#[tokio::test]
async fn json_logs_carry_controller_object_and_sync_id_on_every_line_of_a_sync() {
    let (client, ns) = support::with_test_crds("json_logs").await;
    let label = ns.name.clone();
    let hook = HookServer::start("def sync(req):\n    raise Exception('broken on purpose')\n").await;
    apply_value(
        &client,
        &json!({
            "apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
            "metadata": {"name": label, "labels": {"metahook-test": label}},
            "spec": {"generateSelector": true,
                     "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things",
                                        "labelSelector": {"matchLabels": {"metahook-test": label}}},
                     "hooks": {"sync": {"webhook": {"url": hook.url("/sync")}}}},
        }),
    )
    .await;
    apply_value(
        &client,
        &json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing",
        "metadata": {"name": "p", "namespace": ns.name, "labels": {"metahook-test": label}}, "spec": {}}),
    )
    .await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
        .args(["run", "--log-format", "json", "--metrics-address", "", "--target-label-selector"])
        .arg(format!("metahook-test={label}"))
        .arg("--kubeconfig")
        .arg(support::kubeconfig_path())
        .env("METAHOOK_LOG", "debug,kube=info,hyper=info,tower=info,rustls=info")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // A failing sync logs its start, the failure and its end; wait for two of them (a retry).
    eventually(WAIT, || async { (hook.requests("/sync").len() >= 2).then_some(()) }).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    child.start_kill().unwrap();
    let output = child.wait_with_output().await.unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<Value> =
        text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    // Every line logged inside a sync carries the sync's span: controller, object and sync id.
    let of_syncs: Vec<&Value> = lines.iter().filter(|l| l["span"]["name"] == "sync").collect();
    for line in &of_syncs {
        let span = &line["span"];
        assert!(span["controller"].is_string() && span["object"].is_string(), "{line}");
        assert!(span["sync_id"].as_u64().is_some(), "{line}");
    }
    let object = json!(format!("{}/p", ns.name));
    let ours: Vec<&Value> = of_syncs.iter().copied().filter(|l| l["span"]["object"] == object).collect();
    assert!(ours.iter().all(|l| l["span"]["controller"] == json!(label)), "{ours:?}");
    let failed = ours.iter().filter(|l| l["message"].as_str().is_some_and(|m| m.starts_with("sync failed"))).count();
    assert!(failed >= 1, "the failed sync is logged inside its span:\n{text}");
    let ids: std::collections::BTreeSet<u64> = ours.iter().filter_map(|l| l["span"]["sync_id"].as_u64()).collect();
    assert!(ids.len() >= 2, "each sync has its own id: {ids:?}");
    for id in &ids {
        let messages: Vec<&str> =
            ours.iter().filter(|l| l["span"]["sync_id"] == *id).filter_map(|l| l["message"].as_str()).collect();
        assert!(messages.contains(&"sync started"), "sync {id}: {messages:?}");
    }
    let ccs = api(&client, "metacontroller.k8s.io/v1alpha1", "CompositeController", None).await;
    let _ = ccs.delete(&label, &DeleteParams::default()).await;
    ns.delete().await;
}
