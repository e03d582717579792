//! `metahook status -o json` on the real control plane, against a hub that serves its metrics: the
//! test's controller is there, `Ready`, with the parents its selector selects; syncs while it watches
//! show as syncs per minute, the hook's latency is known; and once the hook fails for a parent, its
//! `SyncError` is the last error, naming that parent, and the errors are counted.

mod support;

use std::time::Duration;

use metahook::ops::config::Config;
use serde_json::{Value, json};
use support::{World, eventually};

const WAIT: Duration = Duration::from_secs(60);

/// One ConfigMap per Thing; a Thing with `spec.fail` makes the hook answer 500.
const HOOK: &str = r#"
def sync(req):
    parent = req["parent"]
    if parent["spec"].get("fail"):
        raise RuntimeError("this thing is meant to fail")
    return {"children": [{"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": parent["metadata"]["name"] + "-cm"},
                          "data": {"n": str(parent["spec"].get("n", 0))}}]}
"#;

fn free_address() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("127.0.0.1:{port}")
}

/// `metahook status -o json ARGS...` for the test's controllers, started now; its JSON when it ends.
fn status(label: &str, args: &[&str]) -> tokio::task::JoinHandle<Value> {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_metahook"));
    command.args(["status", "-o", "json", "-l", &format!("metahook-test={label}")]).args(args);
    command.env("KUBECONFIG", support::kubeconfig_path()).kill_on_drop(true);
    tokio::spawn(async move {
        let output = command.output().await.expect("running metahook status");
        assert!(output.status.success(), "metahook status: {}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice(&output.stdout).expect("JSON")
    })
}

#[tokio::test]
async fn status_shows_ready_parents_rates_latency_and_the_last_error_with_its_parent() {
    let mut w = World::new("status", HOOK).await;
    w.stop_hub().await;
    let address = free_address();
    let client = w.client.clone();
    w.start_hub_with(&client, Config { metrics_address: address.clone(), ..Config::default() });
    w.composite(json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    }))
    .await;
    w.thing("a", json!({"n": 0})).await;
    w.thing("b", json!({})).await;
    eventually(WAIT, || async { w.config_map("b-cm").await }).await;
    let metrics_url = format!("http://{address}/metrics");

    // Syncs while it watches: three changes of a within the interval.
    let running = status(&w.label, &["--metrics-url", &metrics_url, "--interval", "4s"]);
    tokio::time::sleep(Duration::from_millis(800)).await;
    for n in 1..=3 {
        w.thing("a", json!({"n": n})).await;
        let written = n.to_string();
        eventually(WAIT, || async { w.config_map("a-cm").await.filter(|cm| cm.data["data"]["n"] == written.as_str()) })
            .await;
    }
    let report = running.await.unwrap();
    let controllers = report["controllers"].as_array().unwrap();
    assert_eq!(controllers.len(), 1, "only the test's controller: {report}");
    let web = &controllers[0];
    assert_eq!((web["kind"].as_str(), web["name"].as_str()), (Some("CompositeController"), Some(w.label.as_str())));
    assert_eq!(web["ready"]["status"], "True", "{web}");
    assert_eq!(web["ready"]["reason"], "Running");
    assert_eq!(web["parents"], 2, "{web}");
    assert!(web["syncsPerMinute"].as_f64().unwrap() >= 3.0 * 60.0 / 5.0, "three syncs in at most 5 s: {web}");
    assert_eq!(web["errors"], 0, "{web}");
    let (p50, p99) =
        (web["hookLatencySeconds"]["p50"].as_f64().unwrap(), web["hookLatencySeconds"]["p99"].as_f64().unwrap());
    assert!(p50 > 0.0 && p50 <= p99, "{web}");
    assert!(web["lastError"].is_null(), "{web}");
    assert_eq!(web["problems"], json!([]));
    assert_eq!(report["metrics"]["url"], json!(metrics_url));
    assert!(report["metrics"]["intervalSeconds"].as_f64().unwrap() >= 4.0, "{report}");
    assert!(report["metrics"]["leader"].is_null(), "no leader election: {report}");

    // The hook fails for a new parent: its SyncError is the last error, and the errors are counted.
    w.thing("broken", json!({"fail": true})).await;
    eventually(WAIT, || async {
        let warnings = support::warnings_for(&w.client, &w.ns.name, "broken").await;
        warnings.iter().any(|w| w.starts_with("SyncError: ")).then_some(())
    })
    .await;
    let report = status(&w.label, &["--metrics-url", &metrics_url, "--interval", "0s"]).await.unwrap();
    let web = &report["controllers"][0];
    assert_eq!(web["parents"], 3, "{web}");
    assert!(web["errors"].as_u64().unwrap() >= 1, "{web}");
    assert!(web["syncsPerMinute"].is_null(), "one scrape, no rate: {web}");
    let last = &web["lastError"];
    assert_eq!(last["reason"], "SyncError", "{web}");
    assert!(last["note"].as_str().unwrap().contains("this thing is meant to fail"), "{last}");
    assert_eq!(
        last["parent"],
        json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing", "namespace": w.ns.name, "name": "broken"})
    );
    assert!(last["time"].is_string(), "{last}");

    // Without metrics: the API's half of the report, the figures unknown.
    let report = status(&w.label, &[]).await.unwrap();
    let web = &report["controllers"][0];
    assert_eq!((web["ready"]["status"].as_str(), web["parents"].as_u64()), (Some("True"), Some(3)));
    assert!(web["errors"].is_null() && web["hookLatencySeconds"]["p50"].is_null(), "{web}");
    assert_eq!(web["lastError"]["parent"]["name"], "broken");
    assert!(report["metrics"].is_null());
    w.finish("CompositeController").await;
}
