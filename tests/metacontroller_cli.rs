//! Swapping the image and keeping the manifest (issue 29): the hub started exactly as Metacontroller's
//! Helm chart and its production manifest start Metacontroller — the binary under the name
//! `metacontroller` (the chart's `command: /usr/bin/metacontroller`; the image links that path to
//! `/metahook`, see tests/image.rs) with their arguments — on the real control plane, with a real
//! Python hook: the probes answer where the chart's probes look (8081), metrics are on Metacontroller's
//! default port (9999), and a CompositeController syncs. A flag Metacontroller does not have, or a lock
//! metahook does not support, stops it at once with status 2 and a message naming it.
//!
//! Two things are added to the manifests' arguments, as a test must: `--kubeconfig` (a flag of
//! Metacontroller's too; in a Pod the in-cluster config is used) and `--target-label-selector`, so the
//! hub runs only this test's controller on a cluster other tests share.
//!
//! `--pprof-address` serves CPU and heap profiles that parse as pprof's protobuf, and with
//! `--leader-election` the Lease is `--leader-election-id` in `--leader-election-namespace` or else
//! the Pod's namespace.
//!
//! Ports: the two starts take turns (one lock), on 8081 and 9999 themselves when those are free. When
//! something else on the machine holds one, only its number is swapped for a free port, and the test
//! says so on its output.

mod support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use support::{HookServer, TestNamespace, World, eventually, http_get};

const WAIT: Duration = Duration::from_secs(90);

// Copied from Metacontroller v4.17.2 as shared/reference/metacontroller.md §7 describes it.

/// The chart (`deploy/helm/metacontroller`, values.yaml): `command`.
const CHART_COMMAND: &str = "/usr/bin/metacontroller";
/// The chart's `commandArgs`.
const CHART_ARGS: [&str; 4] = [
    "--zap-log-level=4",
    "--discovery-interval=20s",
    "--cache-flush-interval=30m",
    "--health-probe-bind-address=:8081",
];
/// The production manifest (`manifests/production`, StatefulSet `metacontroller`): `command` is the
/// chart's; its `args`.
const MANIFEST_ARGS: [&str; 2] = ["--zap-log-level=4", "--discovery-interval=20s"];
/// Where both point their liveness and readiness probes (the chart's `probes.port`).
const PROBE_PORT: u16 = 8081;
/// Metacontroller's default `--metrics-address`, `:9999`.
const METRICS_PORT: u16 = 9999;

/// One start at a time: both want ports 8081 and 9999.
static PORTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One ConfigMap per parent carrying `spec.greeting`.
const GREETER: &str = r#"
def sync(req):
    parent = req["parent"]
    return {
        "status": {"configMaps": len(req["children"]["ConfigMap.v1"])},
        "children": [{"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": parent["metadata"]["name"] + "-cm"},
                      "data": {"greeting": parent["spec"].get("greeting", "hi")}}],
    }
"#;

/// The test binary as `<dir>/metacontroller`: the name is what the hub looks at, as the image's
/// `/usr/bin/metacontroller` link gives it.
fn metacontroller(dir: &std::path::Path) -> PathBuf {
    let path = dir.join(CHART_COMMAND.rsplit('/').next().unwrap());
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_metahook"), &path).unwrap();
    path
}

fn port_is_free(port: u16) -> bool {
    std::net::TcpListener::bind(("0.0.0.0", port)).is_ok()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `port` if free, else a free one, saying so.
fn port_or_free(port: u16, what: &str) -> u16 {
    if port_is_free(port) {
        return port;
    }
    let free = free_port();
    println!("NOTE: port {port} ({what}) is taken on this machine; the test uses {free} instead");
    free
}

/// The manifests' `args` with only the port numbers swapped (when [`port_or_free`] had to), and the
/// flags a port-swapped default needs.
fn with_ports(args: &[&str], probe: u16, metrics: u16) -> Vec<String> {
    let mut args: Vec<String> =
        args.iter().map(|a| a.replace(&format!(":{PROBE_PORT}"), &format!(":{probe}"))).collect();
    if probe != PROBE_PORT && !args.iter().any(|a| a.starts_with("--health-probe-bind-address")) {
        args.push(format!("--health-probe-bind-address=:{probe}"));
    }
    if metrics != METRICS_PORT {
        args.push(format!("--metrics-address=:{metrics}"));
    }
    args
}

/// The hub as a child process; killed when dropped.
struct Started {
    child: tokio::process::Child,
    log: PathBuf,
}

impl Started {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Starts `program` with `args`, its output (both streams) into `dir/hub.log`.
fn start(program: &std::path::Path, args: &[String], dir: &std::path::Path) -> Started {
    start_with_env(program, args, &[], dir)
}

/// [`start`] with `env` set.
fn start_with_env(program: &std::path::Path, args: &[String], env: &[(&str, &str)], dir: &std::path::Path) -> Started {
    let log = dir.join("hub.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = tokio::process::Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .env_remove("METAHOOK_LOG")
        .env_remove("METAHOOK_CONFIG")
        .kill_on_drop(true)
        .spawn()
        .expect("starting metacontroller");
    Started { child, log }
}

/// Starts the hub as `source` starts Metacontroller, with `args`, and checks what a cluster operator
/// would: the probes, the metrics, a controller syncing, and the log.
async fn starts_as_metacontroller(test: &str, source: &str, args: &[&str]) {
    let _ports = PORTS.lock().await;
    let (client, ns) = support::with_test_crds(test).await;
    let hook = HookServer::start(GREETER).await;
    let label = ns.name.clone();
    let world = World { client, ns, hook, hub: None, label };

    let probe = port_or_free(PROBE_PORT, "probes");
    let metrics = port_or_free(METRICS_PORT, "metrics");
    let mut args = with_ports(args, probe, metrics);
    args.extend(["--kubeconfig".to_owned(), support::kubeconfig_path().display().to_string()]);
    args.push(format!("--target-label-selector=metahook-test={}", world.label));
    let dir = tempfile::tempdir().unwrap();
    let mut hub = start(&metacontroller(dir.path()), &args, dir.path());

    let probes = format!("127.0.0.1:{probe}");
    let deadline = tokio::time::Instant::now() + WAIT;
    let (code, body) = loop {
        if let Some(status) = hub.child.try_wait().unwrap() {
            panic!("{source}: the hub exited ({status}) with {args:?}:\n{}", hub.log());
        }
        if let Some(answer) = http_get(&probes, "/healthz").await {
            break answer;
        }
        assert!(tokio::time::Instant::now() < deadline, "{source}: no probe listener on {probes}:\n{}", hub.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!((code, body.as_str()), (200, "ok\n"), "{source}: liveness on the probe port");
    eventually(WAIT, || async { http_get(&probes, "/readyz").await.filter(|(code, _)| *code == 200) }).await;
    let (code, _) = http_get(&probes, "/metrics").await.unwrap();
    assert_eq!(code, 404, "{source}: the probe listener serves only the probes, as Metacontroller's");

    let metrics_address = format!("127.0.0.1:{metrics}");
    let (code, body) = http_get(&metrics_address, "/metrics").await.expect("metrics listener");
    assert_eq!(code, 200, "{source}: {body}");
    assert!(body.contains("metahook_controllers"), "{source}: {body}");
    assert_eq!(http_get(&metrics_address, "/healthz").await.unwrap().0, 404, "{source}: probes are not on 9999");

    world.composite(world.in_place_spec("/sync")).await;
    world.thing("one", json!({"greeting": "hello from metacontroller's manifest"})).await;
    let cm = eventually(WAIT, || async { world.config_map("one-cm").await }).await;
    assert_eq!(cm.data["data"]["greeting"], "hello from metacontroller's manifest", "{source}");
    eventually(WAIT, || async {
        let parent = world.things().await.get("one").await.unwrap();
        (parent.data["status"]["configMaps"] == 1).then_some(())
    })
    .await;

    let log = hub.log();
    let lines: Vec<serde_json::Value> = log.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert!(!lines.is_empty() && lines.len() == log.lines().count(), "{source}: JSON lines, zap's default:\n{log}");
    let said = |words: &str| lines.iter().filter(|l| l["message"].as_str().is_some_and(|m| m.contains(words))).count();
    assert_eq!(said("Configuration information"), 1, "{log}");
    assert_eq!(said("apply strategy dynamic-apply"), 1, "{source}: said once:\n{log}");
    assert!(log.contains(r#"discovery-interval=\"20s\""#), "{source}: {log}");
    assert!(
        lines.iter().any(|l| l["level"] == "DEBUG"),
        "{source}: --zap-log-level=4 shows metahook's debug lines:\n{log}"
    );
    assert!(
        lines.iter().all(|l| l["timestamp"].as_str().is_some_and(|t| t.ends_with('Z') && t.len() == 20)),
        "RFC 3339 times"
    );
    assert!(hub.child.try_wait().unwrap().is_none(), "{source}: the hub still runs");
    drop(hub);
    world.finish("CompositeController").await;
}

#[tokio::test]
async fn the_helm_charts_command_and_arguments_run_the_hub() {
    let args: Vec<&str> = CHART_ARGS.to_vec();
    starts_as_metacontroller("mc-cli-chart", "the Helm chart", &args).await;
}

#[tokio::test]
async fn the_production_manifests_arguments_run_the_hub() {
    starts_as_metacontroller("mc-cli-manifest", "the production manifest", &MANIFEST_ARGS).await;
}

/// Runs the binary (as `metacontroller`, or as itself) with `args` and no cluster: (status, stderr).
async fn refused(as_metacontroller: bool, args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let program =
        if as_metacontroller { metacontroller(dir.path()) } else { PathBuf::from(env!("CARGO_BIN_EXE_metahook")) };
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(program).args(args).env("KUBECONFIG", "/nonexistent").output(),
    )
    .await
    .expect("a refused command line exits at once")
    .unwrap();
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[tokio::test]
async fn an_unknown_flag_exits_2_naming_it() {
    let mut args = CHART_ARGS.to_vec();
    args.push("--no-such-flag=1");
    let (code, stderr) = refused(true, &args).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("flag provided but not defined: --no-such-flag"), "{stderr}");

    // With flags only and no subcommand, `metahook` itself reads Metacontroller's command line.
    let (code, stderr) = refused(false, &["--zap-log-level=4", "-unknown"]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("flag provided but not defined: -unknown"), "{stderr}");

    // `metahook run` is as it was: its own flags, not Metacontroller's.
    let (code, stderr) = refused(false, &["run", "--zap-log-level=4"]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--zap-log-level"), "{stderr}");
}

#[tokio::test]
async fn a_lock_other_than_leases_exits_2_naming_it() {
    let mut args = CHART_ARGS.to_vec();
    args.extend(["--leader-election", "--leader-election-resource-lock=configmapsleases"]);
    let (code, stderr) = refused(true, &args).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--leader-election-resource-lock") && stderr.contains("configmapsleases"), "{stderr}");
    assert!(stderr.contains("only \"leases\""), "{stderr}");

    let (code, stderr) = refused(true, &["--apply-strategy=client-side-apply"]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--apply-strategy") && stderr.contains("client-side-apply"), "{stderr}");
}

/// A GET of `path` on `address`: (status, body bytes).
async fn get_bytes(address: &str, path: &str) -> Option<(u16, Vec<u8>)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
    // Read to the end: the connection must close after the answer (HTTP/1.1 keeps it open otherwise).
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: hub\r\nConnection: close\r\n\r\n").as_bytes()).await.ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.ok()?;
    let end = response.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&response[..end]);
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, response[end + 4..].to_vec()))
}

fn sample_types(profile: &pprof::protos::Profile) -> Vec<String> {
    let name = |i: i64| profile.string_table[usize::try_from(i).unwrap()].clone();
    profile.sample_type.iter().map(|t| format!("{}/{}", name(t.ty), name(t.unit))).collect()
}

/// Names of the functions in the stacks of samples with memory still in use.
fn in_use_functions(profile: &pprof::protos::Profile) -> Vec<String> {
    let mut names = Vec::new();
    for sample in profile.sample.iter().filter(|s| s.value[3] > 0) {
        for id in &sample.location_id {
            let location = profile.location.iter().find(|l| l.id == *id).unwrap();
            for line in &location.line {
                let function = profile.function.iter().find(|f| f.id == line.function_id).unwrap();
                names.push(profile.string_table[usize::try_from(function.name).unwrap()].clone());
            }
        }
    }
    names
}

#[tokio::test]
async fn profiles_are_served_in_pprofs_format() {
    use pprof::protos::Message as _;
    support::client().await;
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = [
        format!("--pprof-address=127.0.0.1:{port}"),
        "--metrics-address=0".to_owned(),
        "--health-probe-bind-address=0".to_owned(),
        "--discovery-interval=1s".to_owned(),
        "--kubeconfig".to_owned(),
        support::kubeconfig_path().display().to_string(),
        format!("--target-label-selector=metahook-test=profiles-{}", support::unique_suffix()),
    ]
    .into();
    let mut hub = start(&metacontroller(dir.path()), &args, dir.path());
    let address = format!("127.0.0.1:{port}");
    let deadline = tokio::time::Instant::now() + WAIT;
    let index = loop {
        if let Some(status) = hub.child.try_wait().unwrap() {
            panic!("the hub exited ({status}):\n{}", hub.log());
        }
        if let Some((200, body)) = get_bytes(&address, "/debug/pprof/").await {
            break String::from_utf8(body).unwrap();
        }
        assert!(tokio::time::Instant::now() < deadline, "no profile listener:\n{}", hub.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(index.contains("profile") && index.contains("heap"), "{index}");
    assert!(hub.log().contains("serving CPU and heap profiles"), "{}", hub.log());

    let (code, body) = get_bytes(&address, "/debug/pprof/profile?seconds=1").await.unwrap();
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let cpu = pprof::protos::Profile::parse_from_bytes(&body).expect("a CPU profile in pprof's protobuf");
    assert_eq!(sample_types(&cpu), ["samples/count", "cpu/nanoseconds"]);

    // The heap samples from the moment profiles are served; the hub allocates as it refreshes
    // discovery every second, so samples of its own code come.
    let heap = eventually(WAIT, || async {
        let (code, body) = get_bytes(&address, "/debug/pprof/heap").await?;
        assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
        let heap = pprof::protos::Profile::parse_from_bytes(&body).expect("a heap profile in pprof's protobuf");
        in_use_functions(&heap).iter().any(|f| f.starts_with("metahook::")).then_some(heap)
    })
    .await;
    assert_eq!(
        sample_types(&heap),
        ["alloc_objects/count", "alloc_space/bytes", "inuse_objects/count", "inuse_space/bytes"]
    );
    assert_eq!(heap.period, 512 * 1024, "Go's sampling rate");
    assert!(
        in_use_functions(&heap).iter().all(|f| !f.contains("ops::heap::Sampled")),
        "the sampler's own frames are left out"
    );
    assert!(hub.child.try_wait().unwrap().is_none(), "the hub still runs:\n{}", hub.log());
}

#[tokio::test]
async fn leader_election_holds_the_lease_named_by_its_id_in_the_flags_or_the_pods_namespace() {
    use k8s_openapi::api::coordination::v1::Lease;
    let client = support::client().await;
    let ns = TestNamespace::create(&client, "mc-cli-lease").await;
    let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), &ns.name);
    let dir = tempfile::tempdir().unwrap();
    let program = metacontroller(dir.path());
    let base = |id: &str| -> Vec<String> {
        vec![
            "--leader-election".to_owned(),
            format!("--leader-election-id={id}"),
            "--metrics-address=0".to_owned(),
            "--health-probe-bind-address=0".to_owned(),
            "--kubeconfig".to_owned(),
            support::kubeconfig_path().display().to_string(),
            format!("--target-label-selector=metahook-test={}", ns.name),
        ]
    };
    for (id, flag, pod_namespace) in [
        // In a Pod without the flag: the Pod's namespace (the chart sets no POD_NAMESPACE, but kube's
        // in-cluster config reads the same from the service account; this is the explicit form).
        ("mc-lease-pod", false, ns.name.as_str()),
        // The flag wins over the Pod's namespace.
        ("mc-lease-flag", true, "no-such-namespace"),
    ] {
        let mut args = base(id);
        if flag {
            args.push(format!("--leader-election-namespace={}", ns.name));
        }
        let log_dir = tempfile::tempdir().unwrap();
        let hub = start_with_env(&program, &args, &[("POD_NAMESPACE", pod_namespace)], log_dir.path());
        let lease = eventually(WAIT, || async {
            leases.get_opt(id).await.unwrap().filter(|l| l.spec.as_ref().is_some_and(|s| s.holder_identity.is_some()))
        })
        .await;
        let holder = lease.spec.unwrap().holder_identity.unwrap();
        assert!(!holder.is_empty(), "{id}: held, by {holder}");
        assert!(hub.log().contains("waiting to lead"), "{id}: {}", hub.log());
        drop(hub);
    }
    ns.delete().await;
}
