//! Standalone mode (`controllersFrom`, issue 44): controllers read from files, against real control
//! planes, with hooks as real Python processes.
//!
//! The first test needs a cluster with no controller CRDs at all, which the shared cluster cannot be
//! (every other test installs them, and deleting them would break the tests running beside it): it
//! brings up a second control plane of its own (`tests/cluster/up.sh` with `CLUSTER_DIR`), runs the hub
//! as its own `metahook run` process there (so its log can be read), and takes the cluster down after.
//! The second test mixes file and API controllers on the shared cluster, with an in-process hub whose
//! every API request is recorded, to count what must not happen: a request for a file controller's
//! object.

mod support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt as _};
use metahook::api::CompositeController;
use serde_json::{Value, json};
use support::{HookServer, HubProcess, TestNamespace, World, api, events_on, eventually, http_get, install_crds};

const WAIT: Duration = Duration::from_secs(60);

/// Each hook names itself in the child it asks for, so a test sees which hook a controller calls.
const HOOKS: &str = r#"
def child(req, hook):
    name = req["parent"]["metadata"]["name"]
    return {"children": [{"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": name + "-cm"}, "data": {"hook": hook}}]}

def sync(req):
    return child(req, "one")

def sync2(req):
    return child(req, "two")

def sync3(req):
    return child(req, "three")
"#;

/// A CompositeController document: Things labelled `metahook-test: <label>` (and `which: <which>`) get a
/// ConfigMap from the hook at `url`.
fn composite(name: &str, label: &str, which: &str, url: &str) -> String {
    format!(
        "apiVersion: metacontroller.k8s.io/v1alpha1
kind: CompositeController
metadata:
  name: {name}
spec:
  generateSelector: true
  parentResource:
    apiVersion: test.metahook.dev/v1
    resource: things
    labelSelector: {{matchLabels: {{metahook-test: {label}, which: {which}}}}}
  childResources:
  - apiVersion: v1
    resource: configmaps
    updateStrategy: {{method: InPlace}}
  hooks:
    sync:
      webhook: {{url: \"{url}\"}}
"
    )
}

/// A second control plane, in `<repo>/.cluster-standalone`, taken down when dropped.
struct SecondCluster {
    dir: PathBuf,
    kubeconfig: PathBuf,
}

impl SecondCluster {
    fn up() -> Self {
        let dir = support::repo_root().join(".cluster-standalone");
        let output = std::process::Command::new("bash")
            .arg(support::repo_root().join("tests/cluster/up.sh"))
            .env("CLUSTER_DIR", &dir)
            .env("FAKE_NODES", "0")
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("running tests/cluster/up.sh");
        assert!(output.status.success(), "tests/cluster/up.sh for {} failed", dir.display());
        let stdout = String::from_utf8_lossy(&output.stdout);
        let kubeconfig = PathBuf::from(stdout.lines().last().expect("up.sh prints the kubeconfig path").trim());
        Self { dir, kubeconfig }
    }

    async fn client(&self) -> Client {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.unwrap();
        Client::try_from(config).unwrap()
    }
}

impl Drop for SecondCluster {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(support::repo_root().join("tests/cluster/down.sh"))
            .env("CLUSTER_DIR", &self.dir)
            .stdout(std::process::Stdio::null())
            .status();
    }
}

/// A free port on the loopback, for a hub's metrics.
fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("127.0.0.1:{}", listener.local_addr().unwrap().port())
}

/// The value of the first series of `/metrics` at `address` that starts with `series`.
async fn metric(address: &str, series: &str) -> Option<f64> {
    let (_, body) = http_get(address, "/metrics").await?;
    body.lines().find(|l| l.starts_with(series)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

async fn hook_of(config_maps: &Api<DynamicObject>, name: &str) -> Option<String> {
    let cm = config_maps.get_opt(name).await.ok()??;
    cm.data.pointer("/data/hook").and_then(Value::as_str).map(str::to_owned)
}

/// Waits until the ConfigMap `name` says it was asked of `hook`.
async fn wait_for_hook(config_maps: &Api<DynamicObject>, name: &str, hook: &str) {
    eventually(WAIT, || async { (hook_of(config_maps, name).await.as_deref() == Some(hook)).then_some(()) }).await;
}

/// Deletes the ConfigMap `name` and waits until a running controller has made it again.
async fn recreated(config_maps: &Api<DynamicObject>, name: &str, hook: &str) {
    let uid = config_maps.get(name).await.unwrap().uid();
    config_maps.delete(name, &DeleteParams::default()).await.unwrap();
    eventually(WAIT, || async {
        let cm = config_maps.get_opt(name).await.ok()??;
        (cm.uid() != uid && cm.data.pointer("/data/hook").and_then(Value::as_str) == Some(hook)).then_some(())
    })
    .await;
}

fn log_of(hub: &HubProcess) -> String {
    std::fs::read_to_string(&hub.log).unwrap_or_default()
}

async fn wait_for_log(hub: &HubProcess, text: &str) {
    eventually(WAIT, || async { log_of(hub).contains(text).then_some(()) }).await;
}

/// Writes `text` to `path` as an editor does: a new file renamed over the old one.
fn write(path: &Path, text: &str) {
    let new = path.with_extension("new");
    std::fs::write(&new, text).unwrap();
    std::fs::rename(&new, path).unwrap();
}

#[tokio::test]
async fn file_controllers_run_without_the_controller_crds_and_follow_their_files() {
    let cluster = SecondCluster::up();
    let client = cluster.client().await;
    install_crds(&client, include_str!("fixtures/test-crds.yaml")).await;
    let served = Api::<CompositeController>::all(client.clone()).list(&Default::default()).await;
    assert!(
        matches!(served, Err(kube::Error::Api(ref e)) if e.code == 404),
        "this cluster must not serve CompositeControllers: {served:?}"
    );
    let ns = TestNamespace::create(&client, "standalone").await;
    let label = ns.name.clone();
    let hook = HookServer::start(HOOKS).await;
    // The hub's "own Pod", for its Events (no node runs it: it stays Pending).
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "metahook-hub"},
        "spec": {"automountServiceAccountToken": false, "containers": [{"name": "hub", "image": "metahook"}]}}))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pod = eventually(WAIT, || async { pods.create(&PostParams::default(), &pod).await.ok() }).await;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("controllers.yaml");
    let idle = composite("idle", &label, "none", &hook.url("/sync3"));
    let web = composite("web", &label, "web", &hook.url("/sync"));
    write(&file, &format!("{web}---\n{idle}"));
    let address = free_address();
    let controllers_dir = dir.path().display().to_string();
    let uid = pod.uid().unwrap();
    let hub = HubProcess::start_as(
        &label,
        "",
        &[("POD_NAME", "metahook-hub"), ("POD_NAMESPACE", &ns.name), ("POD_UID", &uid)],
        &cluster.kubeconfig,
        &["--controllers-from", &controllers_dir, "--metrics-address", &address],
    );
    eventually(WAIT, || async { http_get(&address, "/readyz").await.filter(|(code, _)| *code == 200) }).await;

    // 1. Files only, no controller CRDs: a parent gets its child from the hook.
    let things = api(&client, "test.metahook.dev/v1", "Thing", Some(&ns.name)).await;
    let thing = |name: &str, which: &str| {
        json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing",
               "metadata": {"name": name, "namespace": ns.name, "labels": {"metahook-test": label, "which": which}},
               "spec": {}})
    };
    support::apply_value(&client, &thing("one", "web")).await;
    let config_maps = api(&client, "v1", "ConfigMap", Some(&ns.name)).await;
    wait_for_hook(&config_maps, "one-cm", "one").await;
    assert_eq!(metric(&address, "metahook_controllers_file_errors ").await, Some(0.0));
    let ready = "metahook_file_controller_ready{kind=\"CompositeController\",controller=\"web\"";
    eventually(WAIT, || async { (metric(&address, ready).await == Some(1.0)).then_some(()) }).await;
    // `metahook status` shows it, from the hub's metrics (the cluster has no controller objects to list).
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
        .args(["status", "--interval", "0s", "-o", "json", "--metrics-url", &format!("http://{address}/metrics")])
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .output()
        .unwrap();
    assert!(output.status.success(), "metahook status: {}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let web_status = report["controllers"].as_array().unwrap().iter().find(|c| c["name"] == "web").cloned();
    let web_status = web_status.unwrap_or_else(|| panic!("no web in {report:#}"));
    assert_eq!(web_status["file"], format!("{} document 1", file.display()));
    assert_eq!(
        (web_status["ready"]["status"].as_str(), web_status["ready"]["reason"].as_str()),
        (Some("True"), Some("Running"))
    );

    // 2. A live change of the file restarts the controller with it: its children follow the new hook.
    write(&file, &format!("{}---\n{idle}", composite("web", &label, "web", &hook.url("/sync2"))));
    wait_for_hook(&config_maps, "one-cm", "two").await;
    wait_for_log(&hub, "spec or settings changed; restarting controller").await;

    // 3a. A YAML error: the last good set keeps running, and the hub says why, naming the file.
    let good = std::fs::read_to_string(&file).unwrap();
    let errors_before =
        metric(&address, "metahook_controllers_file_reload_total{result=\"error\"}").await.unwrap_or(0.0);
    write(&file, &format!("{good}---\nspec: [unclosed\n"));
    let place = file.display().to_string();
    eventually(WAIT, || async {
        (metric(&address, "metahook_controllers_file_errors ").await == Some(1.0)).then_some(())
    })
    .await;
    wait_for_log(&hub, &format!("controllersFrom: {place}: ")).await;
    recreated(&config_maps, "one-cm", "two").await;
    let warnings = || async { support::warnings_for(&client, &ns.name, "metahook-hub").await };
    eventually(WAIT, || async {
        warnings().await.iter().any(|w| w.starts_with(&format!("InvalidControllerFile: {place}: "))).then_some(())
    })
    .await;

    // 3b. A failing check (the second document has no hook): the same, naming the document.
    let no_hooks = idle.split("  hooks:").next().unwrap().to_owned();
    write(&file, &format!("{}---\n{no_hooks}", composite("web", &label, "web", &hook.url("/sync2"))));
    let why = format!("{place} document 2: no hooks defined");
    wait_for_log(&hub, &why).await;
    eventually(WAIT, || async { warnings().await.iter().any(|w| w.contains(&why)).then_some(()) }).await;
    assert_eq!(metric(&address, "metahook_controllers_file_errors ").await, Some(1.0));
    recreated(&config_maps, "one-cm", "two").await;
    let errors_after = metric(&address, "metahook_controllers_file_reload_total{result=\"error\"}").await.unwrap();
    assert_eq!(errors_after - errors_before, 2.0, "two bad readings");
    let event = events_on(&client, &ns.name, "metahook-hub")
        .await
        .into_iter()
        .find(|e| e.note.as_deref().is_some_and(|n| n.contains(&why)));
    let regarding = event.and_then(|e| e.regarding).expect("the Event is on the hub's Pod");
    assert_eq!((regarding.kind.as_deref(), regarding.uid.as_deref()), (Some("Pod"), Some(uid.as_str())));

    // 3c. Fixing the file recovers: the reading is good again, and a change in it is taken.
    write(&file, &format!("{}---\n{idle}", composite("web", &label, "web", &hook.url("/sync3"))));
    wait_for_hook(&config_maps, "one-cm", "three").await;
    assert_eq!(metric(&address, "metahook_controllers_file_errors ").await, Some(0.0));

    // A controller removed from the files stops: a new parent of it gets nothing.
    write(&file, &idle);
    eventually(WAIT, || async { metric(&address, ready).await.is_none().then_some(()) }).await;
    support::apply_value(&client, &thing("two", "web")).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(hook_of(&config_maps, "two-cm").await, None, "no controller runs for web any more");

    // What must not have happened: a write to a controller object (there is none), a watch of a CRD
    // that is not installed.
    let log = log_of(&hub);
    for never in [
        "could not update controller status",
        "could not write the hook version",
        "watching CompositeControllers (retrying)",
    ] {
        assert!(!log.contains(never), "the hub logged {never:?}:\n{log}");
    }
    assert!(log.contains("not watching CompositeControllers"), "the hub says it runs without the CRD:\n{log}");
    drop(hub);
    let _ = things.delete("one", &DeleteParams::default()).await;
    ns.delete().await;
    drop(cluster);
}

/// Every API request a hub makes, as `(method, path)`.
#[derive(Clone, Default)]
struct Requests(Arc<Mutex<Vec<(String, String)>>>);

impl Requests {
    /// A client over `inner` that records every request here.
    fn client(&self, inner: &Client) -> Client {
        Client::new(Recorder { inner: inner.clone(), requests: self.clone() }, inner.default_namespace().to_owned())
    }

    fn all(&self) -> Vec<(String, String)> {
        self.0.lock().unwrap().clone()
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone)]
struct Recorder {
    inner: Client,
    requests: Requests,
}

impl tower_service::Service<http::Request<kube::client::Body>> for Recorder {
    type Response = http::Response<kube::client::Body>;
    type Error = BoxError;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let entry = (request.method().to_string(), request.uri().path().to_owned());
        self.requests.0.lock().unwrap().push(entry);
        let inner = self.inner.clone();
        Box::pin(async move { Ok(inner.send(request).await?) })
    }
}

#[tokio::test]
async fn a_name_in_a_file_and_the_api_runs_the_api_object_and_nothing_asks_for_file_controllers() {
    let mut w = World::new("standalone-mixed", HOOKS).await;
    w.stop_hub().await;
    let label = w.label.clone();
    let file_only = format!("{label}-file");
    // The API object first, named as the test's: the file's controller of that name is refused.
    let clash_selector = json!({"matchLabels": {"metahook-test": label, "which": "clash"}});
    let api_spec = json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things", "labelSelector": clash_selector},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    });
    w.composite(api_spec.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("controllers.yml");
    let clash = composite(&label, &label, "clash", &w.hook.url("/sync2"));
    write(&file, &format!("{clash}---\n{}", composite(&file_only, &label, "file", &w.hook.url("/sync3"))));
    let requests = Requests::default();
    let address = free_address();
    let config = metahook::Config {
        metrics_address: address.clone(),
        controllers_from: vec![file.display().to_string()],
        ..metahook::Config::default()
    };
    w.start_hub_with(&requests.client(&w.client), config);

    w.thing_labelled("a", &json!({"which": "clash"}), json!({})).await;
    w.thing_labelled("b", &json!({"which": "file"}), json!({})).await;
    let config_maps = w.config_maps().await;
    wait_for_hook(&config_maps, "a-cm", "one").await;
    wait_for_hook(&config_maps, "b-cm", "three").await;
    let refused = "metahook_controllers_file_refused{kind=\"CompositeController\"}";
    assert_eq!(metric(&address, refused).await, Some(1.0));
    let name_in_use = format!(
        "metahook_file_controller_ready{{kind=\"CompositeController\",controller=\"{label}\",file=\"{} document 1\",reason=\"NameInUse\"}}",
        file.display()
    );
    assert_eq!(metric(&address, &name_in_use).await, Some(0.0), "the refusal is in the metrics");
    // The API object's status is written as ever.
    eventually(WAIT, || async {
        let cc = w.controllers("CompositeController").await.get(&label).await.ok()?;
        let conditions = cc.data["status"]["conditions"].as_array()?.clone();
        conditions.iter().any(|c| c["type"] == "Ready" && c["status"] == "True").then_some(())
    })
    .await;

    // The object deleted, the file's controller of its name takes over; applied again, it runs again.
    let deleted_at = requests.all().len();
    w.controllers("CompositeController").await.delete(&label, &DeleteParams::default()).await.unwrap();
    wait_for_hook(&config_maps, "a-cm", "two").await;
    eventually(WAIT, || async { (metric(&address, refused).await == Some(0.0)).then_some(()) }).await;
    let reapplied_at = requests.all().len();
    w.composite(api_spec).await;
    wait_for_hook(&config_maps, "a-cm", "one").await;
    assert_eq!(metric(&address, refused).await, Some(1.0));
    wait_for_hook(&config_maps, "b-cm", "three").await;

    // No request ever named the file-only controller, nor the clashing name while only the file's ran.
    let controllers = "/apis/metacontroller.k8s.io/v1alpha1/compositecontrollers/";
    let all = requests.all();
    let for_file: Vec<_> =
        all.iter().filter(|(_, path)| path.starts_with(&format!("{controllers}{file_only}"))).collect();
    assert!(for_file.is_empty(), "requests for a controller read from a file: {for_file:?}");
    // Taking the hub's finalizer off the deleted object (a PATCH of the object itself, not its status)
    // is for that object; nothing else may be written for the name while only the file's runs.
    let object = format!("{controllers}{label}");
    let while_file: Vec<_> = all[deleted_at..reapplied_at]
        .iter()
        .filter(|(method, path)| method != "GET" && path.starts_with(&object))
        .filter(|(method, path)| !(method == "PATCH" && path.split('?').next() == Some(object.as_str())))
        .collect();
    assert!(while_file.is_empty(), "writes for {label} while only its file ran: {while_file:?}");
    w.finish("CompositeController").await;
}

/// A sync hook that asks for one ConfigMap, and a finalize hook that lets go at once.
const FINALIZING: &str = r#"
def sync(req):
    name = req["parent"]["metadata"]["name"]
    return {"children": [{"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": name + "-cm"}, "data": {"hook": "one"}}]}

def finalize(req):
    return {"children": [], "finalized": True}
"#;

/// Issue 53 item 2: a bad reading of the files neither stops a controller nor releases its finalizers.
/// A file controller with a finalize hook (so its parents carry its finalizer) and another one beside
/// it, read from a directory. The file emptied for 3.5 s, then a dangling symlink in its place (a
/// `ConfigMap` key between the kubelet's `..data` swap and its new links) for 3.5 s: each time a parent
/// deleted meanwhile gets its finalize call and the other parents keep the finalizer (before, the
/// controller stopped, the finalizers went, and the deleted parent got 0 finalize calls). A controller
/// really removed from the files still stops (its finalizers go) once a second reading agrees.
#[tokio::test]
async fn a_bad_reading_of_the_files_keeps_the_controllers_and_their_finalizers() {
    let mut w = World::new("standalone-bad-readings", FINALIZING).await;
    w.stop_hub().await;
    let label = w.label.clone();
    let fin = composite(&format!("{label}-fin"), &label, "fin", &w.hook.url("/sync")).replace(
        "  hooks:\n    sync:\n",
        &format!("  hooks:\n    finalize:\n      webhook: {{url: \"{}\"}}\n    sync:\n", w.hook.url("/finalize")),
    );
    let other = composite(&format!("{label}-other"), &label, "other", &w.hook.url("/sync"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("controllers.yaml");
    let both = format!("{fin}---\n{other}");
    write(&file, &both);
    let config =
        metahook::Config { controllers_from: vec![dir.path().display().to_string()], ..metahook::Config::default() };
    let client = w.client.clone();
    w.start_hub_with(&client, config);

    let things = w.things().await;
    for name in ["p1", "p2", "p3"] {
        w.thing_labelled(name, &json!({"which": "fin"}), json!({})).await;
    }
    let config_maps = w.config_maps().await;
    let has_finalizer = |name: &'static str| {
        let things = things.clone();
        async move { things.get_opt(name).await.unwrap().is_some_and(|t| !t.finalizers().is_empty()) }
    };
    for name in ["p1", "p2", "p3"] {
        wait_for_hook(&config_maps, &format!("{name}-cm"), "one").await;
        eventually(WAIT, || async { has_finalizer(name).await.then_some(()) }).await;
    }
    let finalize_calls =
        |name: &str| w.hook.requests("/finalize").iter().filter(|r| r["parent"]["metadata"]["name"] == name).count();

    for (deleted, kept, bad) in [("p1", "p2", "an empty file"), ("p2", "p3", "a dangling symlink")] {
        if bad == "an empty file" {
            write(&file, "");
        } else {
            std::fs::remove_file(&file).unwrap();
            std::os::unix::fs::symlink(dir.path().join("..data/controllers.yaml"), &file).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(2500)).await; // a reading (every 2 s) saw it
        things.delete(deleted, &DeleteParams::default()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(has_finalizer(kept).await, "{bad}: {kept} keeps the finalizer");
        eventually(WAIT, || async { things.get_opt(deleted).await.unwrap().is_none().then_some(()) }).await;
        assert!(finalize_calls(deleted) >= 1, "{bad}: {deleted} was deleted without its finalize call");
        std::fs::remove_file(&file).unwrap();
        write(&file, &both);
    }

    // Removed for real: the controller stops and its finalizers go, once a second reading agrees.
    write(&file, &other);
    eventually(WAIT, || async { (!has_finalizer("p3").await).then_some(()) }).await;
    w.finish("CompositeController").await;
}
