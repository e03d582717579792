//! `metahook status -o json` on the real control plane, against a hub that serves its metrics: the
//! test's controller is there, `Ready`, with the parents its selector selects; syncs while it watches
//! show as syncs per minute, the hook's latency is known; and once the hook fails for a parent, its
//! `SyncError` is the last error, naming that parent, and the errors are counted. With two sharded
//! replicas, each read by its own `--metrics-url`, the figures are the sum of the replicas' shares, each
//! replica's role is named, and a replica that does not answer is reported without hiding the others.

mod support;

use std::time::Duration;

use metahook::ops::config::Config;
use serde_json::{Value, json};
use support::{HubProcess, World, eventually};

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

/// `metahook status -o json ARGS...` for the test's controllers, started now; its JSON when it ends,
/// which must be with exit status 0.
fn status(label: &str, args: &[&str]) -> tokio::task::JoinHandle<Value> {
    let running = status_exiting(label, args);
    tokio::spawn(async move {
        let (code, report) = running.await.unwrap();
        assert_eq!(code, Some(0), "metahook status exit status: {report}");
        report
    })
}

/// Like [`status`], with the exit status whatever it is.
fn status_exiting(label: &str, args: &[&str]) -> tokio::task::JoinHandle<(Option<i32>, Value)> {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_metahook"));
    command.args(["status", "-o", "json", "-l", &format!("metahook-test={label}")]).args(args);
    command.env("KUBECONFIG", support::kubeconfig_path()).kill_on_drop(true);
    tokio::spawn(async move {
        let output = command.output().await.expect("running metahook status");
        let report = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("JSON ({e}): {}", String::from_utf8_lossy(&output.stderr)));
        (output.status.code(), report)
    })
}

/// Waits for a `SyncError` Warning Event on the test's parent `name`.
async fn sync_error_on(w: &World, name: &str) {
    eventually(WAIT, || async {
        let warnings = support::warnings_for(&w.client, &w.ns.name, name).await;
        warnings.iter().any(|w| w.starts_with("SyncError: ")).then_some(())
    })
    .await;
}

#[tokio::test]
async fn status_shows_ready_parents_rates_latency_and_the_last_error_with_its_parent() {
    let mut w = World::new("status", HOOK).await;
    let address = free_address();
    w.restart_hub_with(Config { metrics_address: address.clone(), ..Config::default() }).await;
    w.composite(w.in_place_spec("/sync")).await;
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
    let source = &report["metrics"]["sources"][0];
    assert_eq!(report["metrics"]["sources"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!((&source["url"], &source["answered"]), (&json!(metrics_url), &json!(true)), "{report}");
    assert!(source["intervalSeconds"].as_f64().unwrap() >= 4.0, "{report}");
    assert!(source["leader"].is_null() && source["shardBuckets"].is_null(), "no leader election: {report}");
    assert_eq!(web["bySource"].as_array().unwrap().len(), 1, "{web}");

    // The hook fails for a new parent: its SyncError is the last error, and the errors are counted.
    w.thing("broken", json!({"fail": true})).await;
    sync_error_on(&w, "broken").await;
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

/// Two sharded replicas as `metahook run` processes, each serving its metrics: `metahook status` given
/// both `--metrics-url`s reports the controller's syncs and errors as the sum of what each replica did
/// (each did some: the ring splits the parents), names the ring's coordinator and each replica's
/// buckets; given a third URL nobody answers, it still reports the two, names the third with its
/// error and exits 2.
#[tokio::test]
async fn status_sums_sharded_replicas_and_names_a_replica_that_does_not_answer() {
    const PARENTS: usize = 24;
    let mut w = World::new("status-shards", HOOK).await;
    w.stop_hub().await;
    let sharded = support::replicas::sharded_config(&w.label, &w.ns.name, 2);
    let addresses = [free_address(), free_address()];
    let _replicas: Vec<HubProcess> = addresses
        .iter()
        .enumerate()
        .map(|(i, address)| {
            let pod = format!("replica-{i}");
            HubProcess::start_with(&w.label, &sharded, &[("POD_NAME", &pod), ("METAHOOK_METRICS_ADDRESS", address)])
        })
        .collect();
    let urls: Vec<String> = addresses.iter().map(|a| format!("http://{a}/metrics")).collect();
    w.composite(w.in_place_spec("/sync")).await;
    for i in 0..PARENTS {
        w.thing(&format!("t{i}"), json!({"n": 0})).await;
    }
    let both = ["--metrics-url", &urls[0], "--metrics-url", &urls[1]];
    // The ring settled: both replicas hold buckets, all 1024 between them, and every parent has its child.
    eventually(WAIT, || async {
        let report = status_exiting(&w.label, &[&both[..], &["--interval", "0s"]].concat()).await.unwrap().1;
        let sources = report["metrics"]["sources"].as_array()?.clone();
        let buckets: Vec<u64> = sources.iter().filter_map(|s| s["shardBuckets"].as_u64()).collect();
        (buckets.len() == 2 && buckets.iter().all(|b| *b > 0) && buckets.iter().sum::<u64>() == 1024).then_some(())
    })
    .await;
    for i in 0..PARENTS {
        eventually(WAIT, || async { w.config_map(&format!("t{i}-cm")).await }).await;
    }

    // Every parent changes while status watches: each change is one sync, on whichever replica holds it.
    let running = status(&w.label, &[&both[..], &["--interval", "6s"]].concat());
    tokio::time::sleep(Duration::from_millis(800)).await;
    for i in 0..PARENTS {
        w.thing(&format!("t{i}"), json!({"n": 1})).await;
    }
    for i in 0..PARENTS {
        eventually(WAIT, || async { w.config_map(&format!("t{i}-cm")).await.filter(|cm| cm.data["data"]["n"] == "1") })
            .await;
    }
    let report = running.await.unwrap();
    let sources = report["metrics"]["sources"].as_array().unwrap();
    assert_eq!(sources.iter().map(|s| s["url"].as_str().unwrap()).collect::<Vec<_>>(), urls, "{report}");
    assert!(sources.iter().all(|s| s["answered"] == true && s["error"].is_null()), "{report}");
    let leaders: Vec<bool> = sources.iter().map(|s| s["leader"].as_bool().expect("leader election is on")).collect();
    assert_eq!(leaders.iter().filter(|l| **l).count(), 1, "one coordinator of the ring: {report}");
    let buckets: Vec<u64> = sources.iter().map(|s| s["shardBuckets"].as_u64().unwrap()).collect();
    assert_eq!(buckets.iter().sum::<u64>(), 1024, "{report}");
    let web = &report["controllers"][0];
    assert_eq!(web["parents"], PARENTS, "{web}");
    let interval = sources[0]["intervalSeconds"].as_f64().unwrap();
    let total = web["syncsPerMinute"].as_f64().unwrap();
    // At least one sync per changed parent within the interval (resyncs and echoes may add more).
    assert!(total * interval / 60.0 >= PARENTS as f64 - 0.5, "{PARENTS} syncs in {interval} s: {web}");
    let shares = web["bySource"].as_array().unwrap();
    assert_eq!(shares.len(), 2, "both replicas synced some of the parents: {web}");
    let summed: f64 = shares.iter().map(|s| s["syncsPerMinute"].as_f64().unwrap()).sum();
    assert!((summed - total).abs() < 1e-6, "the total is the sum of the shares: {web}");
    assert!(shares.iter().all(|s| s["syncsPerMinute"].as_f64().unwrap() > 0.0), "{web}");
    let p50 = web["hookLatencySeconds"]["p50"].as_f64().unwrap();
    assert!(p50 > 0.0 && p50 <= web["hookLatencySeconds"]["p99"].as_f64().unwrap(), "{web}");

    // A parent whose hook fails: its errors are counted by the replica holding it, and in the total.
    w.thing("broken", json!({"fail": true})).await;
    sync_error_on(&w, "broken").await;
    let report = status(&w.label, &[&both[..], &["--interval", "0s"]].concat()).await.unwrap();
    let web = &report["controllers"][0];
    let errors = web["errors"].as_u64().unwrap();
    assert!(errors >= 1, "{web}");
    let shares: u64 = web["bySource"].as_array().unwrap().iter().filter_map(|s| s["errors"].as_u64()).sum();
    assert_eq!(shares, errors, "{web}");

    // A third replica that does not answer: named with its error, the others still summed, exit 2.
    let gone = format!("http://{}/metrics", free_address());
    let (code, report) =
        status_exiting(&w.label, &[&both[..], &["--metrics-url", &gone, "--interval", "0s"]].concat()).await.unwrap();
    assert_eq!(code, Some(2), "a partial report: {report}");
    let sources = report["metrics"]["sources"].as_array().unwrap();
    assert_eq!(sources.len(), 3, "{report}");
    assert_eq!((&sources[2]["url"], &sources[2]["answered"]), (&json!(gone), &json!(false)), "{report}");
    assert!(sources[2]["error"].as_str().is_some_and(|e| !e.is_empty()), "{report}");
    let web = &report["controllers"][0];
    assert!(web["errors"].as_u64().unwrap() >= errors, "the two that answered still count: {web}");
    assert_eq!(web["bySource"].as_array().unwrap().len(), 2, "{web}");
    w.finish("CompositeController").await;
}
