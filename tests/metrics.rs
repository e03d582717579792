//! `/metrics` as a dashboard, an alert and `metahook status` read it, on the real control plane: every
//! family of the contract (controller-runtime's reconcile metrics, client-go's work queue and API
//! client metrics, the process's) is served with sensible values after a sync, a stuck hook shows in
//! the work in flight while it is stuck, and with `metricsAuth: kubernetes` only a ServiceAccount
//! allowed to `get /metrics` may read them.

mod support;

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use metahook::ops::config::{Config, MetricsAuth};
use serde_json::json;
use support::{TestNamespace, World, eventually};

const WAIT: Duration = Duration::from_secs(90);

/// One ConfigMap per parent; a parent named `slow…` keeps its hook busy for four seconds each call.
const SLOW_GREETER: &str = r#"
import time

def sync(req):
    parent = req["parent"]
    if parent["metadata"]["name"].startswith("slow"):
        time.sleep(4)
    return {
        "status": {"synced": True},
        "children": [{"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": parent["metadata"]["name"] + "-cm"},
                      "data": {"greeting": "hi"}}],
    }
"#;

fn free_address() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("127.0.0.1:{port}")
}

/// A GET of `path` on the hub's address, with `Authorization: Bearer <token>` when given: (status, body).
async fn get(address: &str, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
    let authorization = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    // Read to the end: the connection must close after the answer (HTTP/1.1 keeps it open otherwise).
    let request = format!("GET {path} HTTP/1.1\r\nHost: hub\r\nConnection: close\r\n{authorization}\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, response.split_once("\r\n\r\n")?.1.to_owned()))
}

/// The values of the samples of `family` whose labels contain every one of `labels` (`key="value"`).
fn values(metrics: &str, family: &str, labels: &[&str]) -> Vec<f64> {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .filter(|(series, _)| {
            let name = series.split('{').next().unwrap_or(series);
            name == family && labels.iter().all(|label| series.contains(label))
        })
        .filter_map(|(_, value)| value.parse().ok())
        .collect()
}

/// The one sample of `family` with `labels`.
fn value(metrics: &str, family: &str, labels: &[&str]) -> f64 {
    match values(metrics, family, labels)[..] {
        [value] => value,
        ref other => panic!("{family}{labels:?}: expected one sample, found {other:?} in\n{metrics}"),
    }
}

#[tokio::test]
async fn a_hub_serves_controller_runtime_client_go_and_process_metrics_and_shows_a_stuck_hook() {
    let mut w = World::new("metrics-contract", SLOW_GREETER).await;
    w.stop_hub().await;
    // The hub's client as `metahook run` builds it, so its API requests are counted.
    let config = support::config().await;
    let api_host = config.cluster_url.authority().unwrap().to_string();
    let client = metahook::ops::client::connect(config).unwrap();
    let address = free_address();
    w.start_hub_with(&client, Config { metrics_address: address.clone(), ..Config::default() });
    w.composite(json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    }))
    .await;
    w.thing("fast", json!({})).await;
    eventually(WAIT, || async { w.config_map("fast-cm").await }).await;

    let controller = format!("controller=\"compositecontroller/{}\"", w.label);
    let queue = format!("name=\"compositecontroller/{}\"", w.label);
    let (controller, queue) = (controller.as_str(), queue.as_str());
    let metrics = eventually(WAIT, || async {
        let (_, metrics) = get(&address, "/metrics", None).await?;
        let synced = values(&metrics, "controller_runtime_reconcile_total", &[controller, "result=\"success\""]);
        (synced.first().copied().unwrap_or(0.0) >= 1.0).then_some(metrics)
    })
    .await;

    // controller-runtime's reconcile families.
    assert!(value(&metrics, "controller_runtime_reconcile_time_seconds_count", &[controller]) >= 1.0);
    assert_eq!(value(&metrics, "controller_runtime_reconcile_errors_total", &[controller]), 0.0);
    assert_eq!(value(&metrics, "controller_runtime_reconcile_panics_total", &[controller]), 0.0);
    let workers = Config::default().workers as f64;
    assert_eq!(value(&metrics, "controller_runtime_max_concurrent_reconciles", &[controller]), workers);
    let active = value(&metrics, "controller_runtime_active_workers", &[controller]);
    assert!((0.0..=workers).contains(&active), "{active}");
    // client-go's work queue, the two in-flight gauges included.
    assert!(value(&metrics, "workqueue_adds_total", &[queue]) >= 1.0);
    assert!(value(&metrics, "workqueue_work_duration_seconds_count", &[queue]) >= 1.0);
    assert!(value(&metrics, "workqueue_queue_duration_seconds_count", &[queue]) >= 1.0);
    for family in [
        "workqueue_depth",
        "workqueue_retries_total",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
    ] {
        assert!(value(&metrics, family, &[queue]) >= 0.0);
    }
    // client-go's API client metrics: reads answered 200, creates 201 (the child, its Events).
    let host = format!("host=\"{api_host}\"");
    let host = host.as_str();
    let ok: f64 =
        values(&metrics, "rest_client_requests_total", &["code=\"200\"", "method=\"GET\"", host]).iter().sum();
    assert!(ok >= 1.0, "{metrics}");
    let created: f64 = values(&metrics, "rest_client_requests_total", &["code=\"201\"", host]).iter().sum();
    assert!(created >= 1.0, "{metrics}");
    assert!(value(&metrics, "rest_client_request_duration_seconds_count", &["verb=\"GET\"", host]) >= 1.0);
    // The process's.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let started = value(&metrics, "process_start_time_seconds", &[]);
    assert!(started <= now && started > now - 24.0 * 3600.0, "{started}");
    assert!(value(&metrics, "process_resident_memory_bytes", &[]) > 1e6);
    assert!(
        value(&metrics, "process_virtual_memory_bytes", &[]) >= value(&metrics, "process_resident_memory_bytes", &[])
    );
    assert!(value(&metrics, "process_cpu_seconds_total", &[]) > 0.0);
    assert!(value(&metrics, "process_open_fds", &[]) >= 3.0);
    assert!(value(&metrics, "process_max_fds", &[]) >= value(&metrics, "process_open_fds", &[]));
    // The hub's own families stay.
    let hook = format!("controller=\"{}\"", w.label);
    assert!(value(&metrics, "metahook_hook_requests_total", &[hook.as_str(), "code=\"200\""]) >= 1.0);

    // A hook that takes four seconds: its sync shows in the work in flight while it runs.
    w.thing("slow", json!({})).await;
    eventually(WAIT, || async {
        w.hook.requests("/sync").iter().any(|r| r["parent"]["metadata"]["name"] == "slow").then_some(())
    })
    .await;
    let stuck = eventually(WAIT, || async {
        let (_, metrics) = get(&address, "/metrics", None).await?;
        (value(&metrics, "workqueue_longest_running_processor_seconds", &[queue]) >= 1.0).then_some(metrics)
    })
    .await;
    let longest = value(&stuck, "workqueue_longest_running_processor_seconds", &[queue]);
    assert!(longest < 30.0, "{longest}");
    assert!(value(&stuck, "workqueue_unfinished_work_seconds", &[queue]) >= longest);
    assert!(value(&stuck, "controller_runtime_active_workers", &[controller]) >= 1.0);
    assert!(value(&stuck, "metahook_hook_in_flight_requests", &[hook.as_str(), "hook=\"sync\""]) >= 1.0);
    w.finish("CompositeController").await;
}

/// A token from the TokenRequest API for ServiceAccount `name` in `namespace`.
async fn token_for(client: &kube::Client, namespace: &str, name: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    accounts.create(&PostParams::default(), &account).await.unwrap();
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(600), ..TokenRequestSpec::default() }),
        ..TokenRequest::default()
    };
    let answered = accounts.create_token_request(name, &PostParams::default(), &request).await.unwrap();
    answered.status.and_then(|s| s.token).expect("a token")
}

#[tokio::test]
async fn with_kubernetes_auth_only_a_service_account_allowed_to_get_metrics_reads_them() {
    let client = support::client().await;
    let ns = TestNamespace::create(&client, "metrics-auth").await;
    let reader = format!("{}-metrics-reader", ns.name);
    let role = ClusterRole {
        metadata: ObjectMeta { name: Some(reader.clone()), ..ObjectMeta::default() },
        rules: Some(vec![PolicyRule {
            non_resource_urls: Some(vec!["/metrics".into()]),
            verbs: vec!["get".into()],
            ..PolicyRule::default()
        }]),
        ..ClusterRole::default()
    };
    Api::<ClusterRole>::all(client.clone()).create(&PostParams::default(), &role).await.unwrap();
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta { name: Some(reader.clone()), ..ObjectMeta::default() },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: reader.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "scraper".into(),
            namespace: Some(ns.name.clone()),
            ..Subject::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(client.clone()).create(&PostParams::default(), &binding).await.unwrap();
    let scraper = token_for(&client, &ns.name, "scraper").await;
    let stranger = token_for(&client, &ns.name, "stranger").await;

    let address = free_address();
    let config =
        Config { metrics_address: address.clone(), metrics_auth: MetricsAuth::Kubernetes, ..Config::default() };
    let hub = support::Hub::start_with_config(&client, &ns.name, config);
    let (code, _) = eventually(WAIT, || get(&address, "/healthz", None)).await;
    assert_eq!(code, 200, "the probes need no token");
    assert_eq!(get(&address, "/metrics", None).await.unwrap().0, 401, "no token");
    assert_eq!(get(&address, "/metrics", Some("not-a-token")).await.unwrap().0, 401, "a token nobody issued");
    assert_eq!(get(&address, "/metrics", Some(&stranger)).await.unwrap().0, 403, "a user not allowed");
    // The binding may take a moment to reach the API server's authorizer (a refusal is remembered 10 s).
    let (_, body) =
        eventually(WAIT, || async { get(&address, "/metrics", Some(&scraper)).await.filter(|(code, _)| *code == 200) })
            .await;
    assert!(body.contains("process_cpu_seconds_total "), "{body}");
    assert_eq!(get(&address, "/metrics", Some(&stranger)).await.unwrap().0, 403, "still not allowed");

    hub.stop().await;
    let _ = Api::<ClusterRoleBinding>::all(client.clone()).delete(&reader, &DeleteParams::default()).await;
    let _ = Api::<ClusterRole>::all(client.clone()).delete(&reader, &DeleteParams::default()).await;
    ns.delete().await;
}
