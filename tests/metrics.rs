//! `/metrics` as a dashboard, an alert and `metahook status` read it, on the real control plane: every
//! family of the contract (controller-runtime's reconcile metrics, client-go's work queue and API
//! client metrics, the process's) is served with sensible values after a sync, a stuck hook shows in
//! the work in flight while it is stuck, and with `metricsAuth: kubernetes` only a ServiceAccount
//! allowed to `get /metrics` may read them.

mod support;

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule};
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
    w.composite(w.in_place_spec("/sync")).await;
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
    support::bind_cluster_role(&client, &reader, &ns.name, "scraper").await;
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

/// Runs `program` with `args`, failing the test with its output if it fails; its stdout.
fn run(program: &str, args: &[&str]) -> String {
    let output =
        std::process::Command::new(program).args(args).output().unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A certificate authority in `dir` (`ca.crt`, `ca.key`), named `name`.
fn certificate_authority(dir: &std::path::Path, name: &str) {
    let (crt, key) = (dir.join("ca.crt"), dir.join("ca.key"));
    run(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            crt.to_str().unwrap(),
        ],
    );
}

/// A serving certificate for `server_name` signed by the authority in `ca`, written as `tls.crt` and
/// `tls.key` into `out` (as the kubelet lays out a `kubernetes.io/tls` Secret). Its serial number.
fn serving_pair(ca: &std::path::Path, server_name: &str, out: &std::path::Path) -> String {
    let work = tempfile::tempdir().unwrap();
    let path = |name: &str| work.path().join(name).to_str().unwrap().to_owned();
    std::fs::write(
        work.path().join("ext"),
        format!(
            "subjectAltName=DNS:{server_name}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n\
             extendedKeyUsage=serverAuth\n"
        ),
    )
    .unwrap();
    run(
        "openssl",
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            // The name is in the subjectAltName (all a client checks); a CN holds 64 bytes at most.
            "/CN=metahook metrics",
            "-keyout",
            &path("tls.key"),
            "-out",
            &path("tls.csr"),
        ],
    );
    let serial = format!("{:X}", u64::from(std::process::id()) << 32 | u64::from(rand_u32()));
    run(
        "openssl",
        &[
            "x509",
            "-req",
            "-in",
            &path("tls.csr"),
            "-CA",
            ca.join("ca.crt").to_str().unwrap(),
            "-CAkey",
            ca.join("ca.key").to_str().unwrap(),
            "-set_serial",
            &format!("0x{serial}"),
            "-days",
            "1",
            "-extfile",
            &path("ext"),
            "-out",
            &path("tls.crt"),
        ],
    );
    // The key first, then the certificate: between the two the hub sees a pair that does not match
    // and must keep serving the last good one.
    for name in ["tls.key", "tls.crt"] {
        std::fs::copy(work.path().join(name), out.join(name)).unwrap();
    }
    serial
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos());
    u32::try_from(hasher.finish() & 0xffff_ffff).unwrap()
}

/// The serial number of the certificate the server at `address` presents (asked by a process the
/// runtime waits for without blocking: the hub under test runs on the same runtime).
async fn served_serial(address: &str, server_name: &str) -> Option<String> {
    let script = format!(
        "openssl s_client -connect {address} -servername {server_name} </dev/null 2>/dev/null \
         | openssl x509 -noout -serial"
    );
    let output = tokio::process::Command::new("bash").args(["-c", &script]).output().await.ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    Some(text.trim().strip_prefix("serial=")?.trim_start_matches('0').to_owned())
}

/// The chart rendered with `values`, every object.
fn chart(release: &str, namespace: &str, values: &[&str]) -> Vec<serde_json::Value> {
    let root = support::repo_root();
    run("bash", &[root.join("deploy/helm/tools/build.sh").to_str().unwrap()]);
    let helm = root.join("tests/cluster/bin/helm");
    let chart_dir = root.join("deploy/helm/metahook").to_str().unwrap().to_owned();
    let mut args = vec!["template", release, &chart_dir, "--namespace", namespace];
    for value in values {
        args.extend(["--set", value]);
    }
    let rendered = run(helm.to_str().unwrap(), &args);
    let objects: Vec<serde_json::Value> = metahook::ops::yaml::from_documents(&rendered).expect("helm renders YAML");
    objects.into_iter().filter(|v| !v.is_null()).collect()
}

/// A Prometheus scrape job for one endpoint of a ServiceMonitor, as the Prometheus Operator writes it for
/// the fields the chart sets (`scheme`, `path`, `tlsConfig.serverName`, `tlsConfig.ca` as a file,
/// `bearerTokenFile` as `authorization.credentials_file`), with `target` in place of the endpoints the
/// operator would discover. A field it does not know fails the test, so a chart change is looked at here.
fn scrape_job(job: &str, endpoint: &serde_json::Value, target: &str, ca_file: &str, token_file: &str) -> String {
    let known = ["port", "path", "interval", "scheme", "tlsConfig", "bearerTokenFile"];
    for field in endpoint.as_object().unwrap().keys() {
        assert!(known.contains(&field.as_str()), "the ServiceMonitor endpoint sets {field}: translate it here");
    }
    let mut lines = vec![
        format!("- job_name: {job}"),
        "  scrape_interval: 1s".to_owned(),
        format!("  metrics_path: {}", endpoint["path"].as_str().unwrap_or("/metrics")),
        format!("  scheme: {}", endpoint["scheme"].as_str().unwrap_or("http")),
        format!("  static_configs: [{{targets: ['{target}']}}]"),
    ];
    if let Some(tls) = endpoint.get("tlsConfig") {
        lines.push("  tls_config:".to_owned());
        lines.push(format!("    ca_file: {ca_file}"));
        if let Some(name) = tls["serverName"].as_str() {
            lines.push(format!("    server_name: {name}"));
        }
    }
    if endpoint.get("bearerTokenFile").is_some() {
        lines.push(format!("  authorization: {{type: Bearer, credentials_file: {token_file}}}"));
    }
    lines.join("\n") + "\n"
}

/// The active targets of the Prometheus on `port`, by job: (health, last error).
async fn targets(port: u16) -> Option<std::collections::BTreeMap<String, (String, String)>> {
    let body: serde_json::Value =
        reqwest::get(format!("http://127.0.0.1:{port}/api/v1/targets")).await.ok()?.json().await.ok()?;
    Some(
        body["data"]["activeTargets"]
            .as_array()?
            .iter()
            .map(|t| {
                let text = |key: &str| t[key].as_str().unwrap_or_default().to_owned();
                (text("scrapePool"), (text("health"), text("lastError")))
            })
            .collect(),
    )
}

/// Kills the Prometheus when the test ends, passing or not.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn prometheus_scrapes_https_metrics_with_a_token_as_the_charts_service_monitor_asks() {
    let root = support::repo_root();
    run("bash", &[root.join("tests/prometheus/build.sh").to_str().unwrap()]);
    let (client, ns) = support::with_crds("metrics-tls").await;

    // The chart with HTTPS metrics, scrapes by token, a ServiceMonitor and Prometheus's reader binding.
    let release = ns.name.clone();
    let objects = chart(
        &release,
        &ns.name,
        &[
            "metrics.tls.secretName=metrics-tls",
            "config.metricsAuth=kubernetes",
            "metrics.serviceMonitor.enabled=true",
            &format!(
                "metrics.serviceMonitor.readerServiceAccount.name=prometheus,metrics.serviceMonitor.readerServiceAccount.namespace={}",
                ns.name
            ),
        ],
    );
    let find = |kind: &str| objects.iter().filter(|o| o["kind"] == kind).cloned().collect::<Vec<_>>();
    let [monitor] = &find("ServiceMonitor")[..] else { panic!("one ServiceMonitor") };
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"], "https", "{endpoint}");
    assert_eq!(endpoint["bearerTokenFile"], "/var/run/secrets/kubernetes.io/serviceaccount/token");
    let server_name = endpoint["tlsConfig"]["serverName"].as_str().expect("a server name").to_owned();
    assert_eq!(server_name, format!("{release}-metahook-metrics.{}.svc", ns.name));
    let readers: Vec<_> = find("ClusterRole")
        .into_iter()
        .filter(|r| r["metadata"]["name"].as_str().unwrap().ends_with("-metrics-reader"))
        .collect();
    let [reader] = &readers[..] else { panic!("one metrics-reader ClusterRole") };
    let [binding] = &find("ClusterRoleBinding")
        .into_iter()
        .filter(|b| b["roleRef"]["name"] == reader["metadata"]["name"])
        .collect::<Vec<_>>()[..]
    else {
        panic!("one binding of the metrics reader")
    };
    let reader: ClusterRole = serde_json::from_value(reader.clone()).unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(binding.clone()).unwrap();
    Api::<ClusterRole>::all(client.clone()).create(&PostParams::default(), &reader).await.unwrap();
    Api::<ClusterRoleBinding>::all(client.clone()).create(&PostParams::default(), &binding).await.unwrap();
    let [deployment] = &find("Deployment")[..] else { panic!("one Deployment") };
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["readinessProbe"]["httpGet"]["scheme"], "HTTPS", "probes share the HTTPS port");
    let [config] = &find("ConfigMap")[..] else { panic!("one ConfigMap") };
    let file: Config = metahook::ops::yaml::from_str(config["data"]["metahook.yaml"].as_str().unwrap()).unwrap();
    let mount =
        container["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "metrics-tls").expect("mounted");
    assert_eq!(file.metrics_cert_dir, mount["mountPath"].as_str().unwrap(), "the config names the mounted Secret");

    // The hub, on the machine, with the same two settings (its certificate from a directory).
    let dir = tempfile::tempdir().unwrap();
    let (ca, other_ca, certs) = (dir.path().join("ca"), dir.path().join("other-ca"), dir.path().join("certs"));
    for d in [&ca, &other_ca, &certs] {
        std::fs::create_dir(d).unwrap();
    }
    certificate_authority(&ca, "metahook test CA");
    certificate_authority(&other_ca, "someone else's CA");
    let first = serving_pair(&ca, &server_name, &certs);
    let address = free_address();
    let config = Config {
        metrics_address: address.clone(),
        metrics_auth: MetricsAuth::Kubernetes,
        metrics_cert_dir: certs.to_str().unwrap().to_owned(),
        ..Config::default()
    };
    let hub = support::Hub::start_with_config(&client, &ns.name, config);

    // A real Prometheus: the ServiceMonitor's job with Prometheus's token, the same without a token,
    // and one in plain HTTP.
    let token = token_for(&client, &ns.name, "prometheus").await;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &token).unwrap();
    let ca_file = ca.join("ca.crt");
    let (ca_file, token_file) = (ca_file.to_str().unwrap(), token_file.to_str().unwrap());
    let mut anonymous = endpoint.clone();
    anonymous.as_object_mut().unwrap().remove("bearerTokenFile");
    let mut plain = anonymous.clone();
    plain.as_object_mut().unwrap().retain(|k, _| k == "port" || k == "path");
    let scrape_configs = [
        scrape_job("servicemonitor", endpoint, &address, ca_file, token_file),
        scrape_job("no-token", &anonymous, &address, ca_file, token_file),
        scrape_job("plain-http", &plain, &address, ca_file, token_file),
    ]
    .concat();
    std::fs::write(dir.path().join("prometheus.yml"), format!("scrape_configs:\n{scrape_configs}")).unwrap();
    let prometheus = |run: &str| {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = std::fs::File::create(dir.path().join(format!("prometheus-{run}.log"))).unwrap();
        let process = Killed(
            std::process::Command::new(root.join("tests/cluster/bin/prometheus"))
                .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
                .arg(format!("--storage.tsdb.path={}", dir.path().join(format!("data-{run}")).display()))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("starting prometheus"),
        );
        (port, process)
    };
    let target_health = |port: u16, job: &'static str, want: &'static str| async move {
        eventually(WAIT, || async move {
            let all = targets(port).await?;
            let (health, error) = all.get(job)?.clone();
            (health == want).then_some(error)
        })
        .await
    };
    let (port, first_prometheus) = prometheus("first");
    let health = |job: &'static str, want: &'static str| target_health(port, job, want);
    health("servicemonitor", "up").await;
    let refused = health("no-token", "down").await;
    assert!(refused.contains("401"), "without a token: {refused}");
    let plain_error = health("plain-http", "down").await;
    assert!(!plain_error.is_empty(), "plain HTTP is not served");
    let query =
        format!("http://127.0.0.1:{port}/api/v1/query?query=process_cpu_seconds_total%7Bjob%3D%22servicemonitor%22%7D");
    let answer: serde_json::Value = reqwest::get(&query).await.unwrap().json().await.unwrap();
    assert_eq!(answer["data"]["result"].as_array().map(Vec::len), Some(1), "the hub's metrics are stored: {answer}");
    assert_eq!(served_serial(&address, &server_name).await.as_deref(), Some(first.trim_start_matches('0')));

    // A renewal: the new pair is served without a restart and Prometheus goes on scraping.
    let renewed = serving_pair(&ca, &server_name, &certs);
    eventually(WAIT, || async {
        (served_serial(&address, &server_name).await? == renewed.trim_start_matches('0')).then_some(())
    })
    .await;
    let since = std::time::Instant::now();
    eventually(WAIT, || async {
        let all = targets(port).await?;
        (since.elapsed() > Duration::from_secs(3) && all.get("servicemonitor")?.0 == "up").then_some(())
    })
    .await;
    // A certificate Prometheus does not trust: a Prometheus connecting after the change refuses it — the
    // hub serves what it reloaded. (The first one's open keep-alive connection keeps the certificate it
    // was opened with, as any TLS server's does.)
    serving_pair(&other_ca, &server_name, &certs);
    eventually(WAIT, || async {
        (served_serial(&address, &server_name).await.is_some_and(|s| s != renewed.trim_start_matches('0')))
            .then_some(())
    })
    .await;
    drop(first_prometheus);
    let (second_port, _second_prometheus) = prometheus("second");
    let untrusted = target_health(second_port, "servicemonitor", "down").await;
    assert!(untrusted.contains("certificate"), "an untrusted certificate: {untrusted}");

    hub.stop().await;
    let _ = Api::<ClusterRoleBinding>::all(client.clone())
        .delete(binding.metadata.name.as_deref().unwrap(), &DeleteParams::default())
        .await;
    let _ = Api::<ClusterRole>::all(client.clone())
        .delete(reader.metadata.name.as_deref().unwrap(), &DeleteParams::default())
        .await;
    ns.delete().await;
}
