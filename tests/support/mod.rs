//! Shared by every integration test: the real local control plane, a namespace per test, real Python
//! hook processes, and an in-process hub.
//!
//! The cluster is the one `make cluster-up` starts (reused from `.cluster/kubeconfig`, started when
//! absent). Tests isolate themselves by namespace and by a `metahook-test` label on the controllers
//! they create, which their own hub is told to run (target label selector).
#![allow(dead_code)]

pub mod elsewhere;
pub mod replicas;
pub mod teardown;

use std::future::Future;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Once;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::ApiResource;
use kube::{Client, ResourceExt as _};
use metahook::ops::yaml;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt as _;
use tokio_util::sync::CancellationToken;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn kubeconfig_path() -> PathBuf {
    std::env::var_os("METAHOOK_TEST_KUBECONFIG").map_or_else(|| repo_root().join(".cluster/kubeconfig"), PathBuf::from)
}

static CLUSTER: Once = Once::new();

/// A client for the local control plane, starting it if needed (once per test binary).
pub async fn client() -> Client {
    CLUSTER.call_once(|| {
        // Hub logs go to the test's captured output, shown when it fails.
        let filter = std::env::var("METAHOOK_TEST_LOG").unwrap_or_else(|_| "info".into());
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
        // up.sh reuses a healthy cluster in well under a second and repairs a dead one.
        if std::env::var_os("METAHOOK_TEST_KUBECONFIG").is_none() {
            let status = std::process::Command::new("bash")
                .arg(repo_root().join("tests/cluster/up.sh"))
                .stdout(Stdio::null())
                .status()
                .expect("running tests/cluster/up.sh");
            assert!(status.success(), "tests/cluster/up.sh failed; see .cluster/logs/");
        }
    });
    Client::try_from(config().await).expect("building client")
}

/// The client configuration for the local control plane, from [`kubeconfig_path`] (which [`client`]
/// makes sure of).
pub async fn config() -> kube::Config {
    let kubeconfig = Kubeconfig::read_from(kubeconfig_path()).expect("reading .cluster/kubeconfig");
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("loading .cluster/kubeconfig")
}

/// A fresh namespace, named after the test. Deleted by [`TestNamespace::delete`].
pub struct TestNamespace {
    pub name: String,
    client: Client,
}

impl TestNamespace {
    pub async fn create(client: &Client, test: &str) -> Self {
        let name = format!("{}-{}", test.replace('_', "-").chars().take(40).collect::<String>(), unique_suffix());
        let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.expect("creating namespace");
        Self { name, client: client.clone() }
    }

    pub async fn delete(self) {
        let _ = Api::<Namespace>::all(self.client.clone()).delete(&self.name, &DeleteParams::default()).await;
    }
}

pub fn unique_suffix() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{:x}{:04x}", nanos, std::process::id() & 0xffff)
}

/// Creates or updates objects from YAML (server-side apply, field manager `metahook-tests`).
pub async fn apply_yaml(client: &Client, yaml: &str) -> Vec<DynamicObject> {
    let mut applied = Vec::new();
    for value in yaml::from_documents::<serde_json::Value>(yaml).expect("valid YAML") {
        applied.push(apply_value(client, &value).await);
    }
    applied
}

pub async fn apply_value(client: &Client, value: &serde_json::Value) -> DynamicObject {
    let obj: DynamicObject = serde_json::from_value(value.clone()).expect("a Kubernetes object");
    let api = api_for(client, &obj).await;
    api.patch(&obj.name_any(), &PatchParams::apply("metahook-tests").force(), &Patch::Apply(value))
        .await
        .unwrap_or_else(|e| panic!("applying {}: {e}", obj.name_any()))
}

/// An `Api` for the object's type (resolved by discovery) and namespace.
pub async fn api_for(client: &Client, obj: &DynamicObject) -> Api<DynamicObject> {
    let types = obj.types.clone().expect("apiVersion and kind");
    let (ar, namespaced) = resolve_kind(client, &types.api_version, &types.kind).await;
    match (&obj.metadata.namespace, namespaced) {
        (Some(ns), true) => Api::namespaced_with(client.clone(), ns, &ar),
        _ => Api::all_with(client.clone(), &ar),
    }
}

/// Resolves apiVersion + kind to an ApiResource, retrying while a fresh CRD is not yet served.
pub async fn resolve_kind(client: &Client, api_version: &str, kind: &str) -> (ApiResource, bool) {
    let gv: kube::core::GroupVersion = api_version.parse().unwrap();
    eventually(Duration::from_secs(30), || async {
        let group = kube::discovery::oneshot::pinned_group(client, &gv).await.ok()?;
        group
            .versioned_resources(&gv.version)
            .into_iter()
            .find(|(ar, _)| ar.kind == kind)
            .map(|(ar, caps)| (ar, caps.scope == kube::discovery::Scope::Namespaced))
    })
    .await
}

/// A namespaced `Api` for `apiVersion`/`kind` in `namespace` (or cluster-wide when `None`).
pub async fn api(client: &Client, api_version: &str, kind: &str, namespace: Option<&str>) -> Api<DynamicObject> {
    let (ar, namespaced) = resolve_kind(client, api_version, kind).await;
    match namespace {
        Some(ns) if namespaced => Api::namespaced_with(client.clone(), ns, &ar),
        _ => Api::all_with(client.clone(), &ar),
    }
}

/// Installs CRDs (idempotent) and waits until each is Established and served.
pub async fn install_crds(client: &Client, yaml: &str) {
    for crd in yaml::from_documents::<CustomResourceDefinition>(yaml).expect("CRDs") {
        let api = Api::<CustomResourceDefinition>::all(client.clone());
        api.patch(&crd.name_any(), &PatchParams::apply("metahook-tests").force(), &Patch::Apply(&crd))
            .await
            .expect("applying CRD");
        let version = &crd.spec.versions[0].name;
        resolve_kind(client, &format!("{}/{version}", crd.spec.group), &crd.spec.names.kind).await;
    }
}

/// The metahook CRDs from `crds/`.
pub async fn install_metahook_crds(client: &Client) {
    for entry in std::fs::read_dir(repo_root().join("crds")).unwrap() {
        install_crds(client, &std::fs::read_to_string(entry.unwrap().path()).unwrap()).await;
    }
}

/// Binds the ClusterRole `role` to the ServiceAccount `namespace/account` with a ClusterRoleBinding of
/// the role's name: what a test gives the account it acts or scrapes as.
pub async fn bind_cluster_role(client: &Client, role: &str, namespace: &str, account: &str) {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]});
    let binding: ClusterRoleBinding = serde_json::from_value(binding).unwrap();
    Api::<ClusterRoleBinding>::all(client.clone()).create(&PostParams::default(), &binding).await.unwrap();
}

/// A client for the control plane, the metahook CRDs installed, and a namespace of `test`'s own: where
/// a test that runs its hub its own way (a process, another account, replicas) starts.
pub async fn with_crds(test: &str) -> (Client, TestNamespace) {
    let client = client().await;
    install_metahook_crds(&client).await;
    let ns = TestNamespace::create(&client, test).await;
    (client, ns)
}

/// [`with_crds`] with the test CRDs (`Thing` and its kin) installed too, before the namespace: what a
/// [`World`] starts from.
pub async fn with_test_crds(test: &str) -> (Client, TestNamespace) {
    let client = client().await;
    install_metahook_crds(&client).await;
    install_crds(&client, include_str!("../fixtures/test-crds.yaml")).await;
    let ns = TestNamespace::create(&client, test).await;
    (client, ns)
}

/// Polls `check` until it returns `Some`, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "condition not met within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The names of the objects `api` lists now.
pub async fn names(api: &Api<DynamicObject>) -> Vec<String> {
    api.list(&Default::default()).await.unwrap().items.into_iter().filter_map(|o| o.metadata.name).collect()
}

/// Waits up to `within` until `name` is gone from `api`: deleted, its finalizers all taken off.
pub async fn gone<K>(api: &Api<K>, name: &str, within: Duration)
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(within, || async { api.get_opt(name).await.unwrap().is_none().then_some(()) }).await;
}

/// A real Python hook process serving the functions in `handlers` (see tests/hooks/hookserver.py).
pub struct HookServer {
    pub port: u16,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
    _child: tokio::process::Child,
}

impl HookServer {
    pub async fn start(handlers: &str) -> Self {
        Self::start_on(handlers, 0).await
    }

    /// Like [`HookServer::start`], on `port` (0 = a free one): how a test brings a hook back where the
    /// hub expects it.
    pub async fn start_on(handlers: &str, port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("handlers.py");
        std::fs::write(&script, handlers).unwrap();
        let log = dir.path().join("requests.jsonl");
        let mut child = tokio::process::Command::new("python3")
            .arg(repo_root().join("tests/hooks/hookserver.py"))
            .arg(&script)
            .env("HOOK_LOG", &log)
            .env("HOOK_PORT", port.to_string())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting python3 hook server");
        let port = port_line(&mut child).await;
        Self { port, log, _dir: dir, _child: child }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Requests received so far on `path`.
    pub fn requests(&self, path: &str) -> Vec<serde_json::Value> {
        self.logged(path).into_iter().map(|r| r["request"].clone()).collect()
    }

    /// Requests received so far on `path`, each as `{"request", "headers"}` (header names in lower case).
    pub fn requests_with_headers(&self, path: &str) -> Vec<serde_json::Value> {
        self.logged(path)
    }

    fn logged(&self, path: &str) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|r| r["path"] == path)
            .collect()
    }
}

/// The port a test hook server announces on its first stdout line (`PORT <n>`), waiting for it.
pub async fn port_line(child: &mut tokio::process::Child) -> u16 {
    let stdout = child.stdout.take().expect("the hook's stdout is piped");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("hook server did not start in time")
        .unwrap()
        .expect("hook server exited before printing its port");
    line.strip_prefix("PORT ").and_then(|p| p.trim().parse().ok()).expect("PORT line")
}

/// Starts `tests/hooks/transport_hook.py` with the JSON config file `config` (killed on drop): the
/// process and the port it announced. The hook-transport tests and `make bench-hooks` both use it.
pub async fn start_transport_hook(config: &std::path::Path) -> (tokio::process::Child, u16) {
    let mut child = tokio::process::Command::new("python3")
        .arg(repo_root().join("tests/hooks/transport_hook.py"))
        .arg(config)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting python3 transport_hook.py");
    let port = port_line(&mut child).await;
    (child, port)
}

/// A plain HTTP GET of `path` on a hub's metrics/health address: (status code, body).
pub async fn http_get(address: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
    // Read to the end: the connection must close after the answer (HTTP/1.1 keeps it open otherwise).
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: hub\r\nConnection: close\r\n\r\n").as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, response.split_once("\r\n\r\n")?.1.to_owned()))
}

/// An in-process hub that runs only controllers labelled `metahook-test=<label>`.
pub struct Hub {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Hub {
    pub fn start(client: &Client, label: &str) -> Self {
        Self::start_with(client, label, String::new())
    }

    /// Like [`Hub::start`], serving metrics and health on `metrics_address` (tests run many hubs at
    /// once, so by default they serve none).
    pub fn start_with(client: &Client, label: &str, metrics_address: String) -> Self {
        let config = metahook::ops::config::Config { metrics_address, ..metahook::ops::config::Config::default() };
        Self::start_with_config(client, label, config)
    }

    /// Like [`Hub::start`], with `config` (its target label selector and discovery interval are set
    /// for the test).
    pub fn start_with_config(client: &Client, label: &str, config: metahook::ops::config::Config) -> Self {
        let config = metahook::ops::config::Config {
            target_label_selector: format!("metahook-test={label}"),
            discovery_interval: Duration::from_secs(2),
            ..config
        };
        let cancel = CancellationToken::new();
        let task = tokio::spawn(metahook::run_until(client.clone(), config, cancel.clone()));
        Self { cancel, task }
    }

    pub async fn stop(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}

/// A hub as its own `metahook run` process (the binary this test build made), so a test can kill -9 it.
/// Runs only controllers labelled `metahook-test=<label>`; its log (stdout and stderr) goes to `log`.
pub struct HubProcess {
    pub log: PathBuf,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl HubProcess {
    pub fn start(label: &str) -> Self {
        Self::start_with(label, "", &[])
    }

    /// Like [`HubProcess::start`], with more of the config file (`more_config`, YAML lines) and
    /// environment variables.
    pub fn start_with(label: &str, more_config: &str, env: &[(&str, &str)]) -> Self {
        Self::start_as(label, more_config, env, &kubeconfig_path(), &[])
    }

    /// Like [`HubProcess::start_with`], connecting with `kubeconfig` (e.g. [`HubAccount::kubeconfig`])
    /// and given more command-line arguments after `run` (e.g. `--namespaces a,b`).
    pub fn start_as(
        label: &str,
        more_config: &str,
        env: &[(&str, &str)],
        kubeconfig: &std::path::Path,
        args: &[&str],
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("metahook.yaml");
        std::fs::write(
            &config,
            format!(
                "targetLabelSelector: \"metahook-test={label}\"\ndiscoveryInterval: 2\nmetricsAddress: \"\"\n{more_config}"
            ),
        )
        .unwrap();
        let log = dir.path().join("hub.log");
        // The hub logs to stdout; a panic or a start error goes to stderr: the log file has both.
        let file = std::fs::File::create(&log).unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
            .args(["run", "--config"])
            .arg(&config)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .envs(env.iter().copied())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("starting metahook run");
        Self { log, child, _dir: dir }
    }

    /// SIGKILL: no shutdown, no cleanup, as when a node dies.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for HubProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Events recorded on an object with this name in `namespace` (a cluster-scoped object's are in
/// `default`).
pub async fn events_on(client: &Client, namespace: &str, name: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    api.list(&Default::default())
        .await
        .map(|list| list.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

/// Warning events recorded on an object with this name in `namespace`, as "reason: note".
pub async fn warnings_for(client: &Client, namespace: &str, name: &str) -> Vec<String> {
    events_on(client, namespace, name)
        .await
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .map(|e| format!("{}: {}", e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// The first Warning Event on `namespace/name` (as [`warnings_for`] words it) that `matches`, waited for up
/// to `within`: what a test reads when the hub is to say why it refused or held something.
pub async fn warning_eventually(
    client: &Client,
    namespace: &str,
    name: &str,
    within: Duration,
    matches: impl Fn(&str) -> bool,
) -> String {
    eventually(within, || async { warnings_for(client, namespace, name).await.into_iter().find(|m| matches(m)) }).await
}

/// Takes every finalizer off `name` (a test's own, put there to hold the object), so that its namespace
/// can go.
pub async fn drop_finalizers(api: &Api<DynamicObject>, name: &str) {
    api.patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();
}

/// The documents `metahook rbac ARGS...` prints (the binary this test build made).
pub fn metahook_rbac(args: &[&str]) -> Vec<Value> {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
        .arg("rbac")
        .args(args)
        .output()
        .expect("running metahook rbac");
    assert!(output.status.success(), "metahook rbac {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    yaml::from_documents(&text).unwrap()
}

/// A token for the ServiceAccount `namespace/name`, from the TokenRequest API (valid an hour).
pub async fn service_account_token(client: &Client, namespace: &str, name: &str) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..TokenRequestSpec::default() }),
        ..TokenRequest::default()
    };
    let answer = accounts.create_token_request(name, &PostParams::default(), &request).await.unwrap();
    answer.status.and_then(|s| s.token).expect("a token")
}

/// A client for the local control plane that authenticates with `token` only (the cluster's CA, no
/// client certificate), as a Pod's ServiceAccount does.
pub async fn token_client(token: &str) -> Client {
    let mut config = config().await;
    config.auth_info = kube::config::AuthInfo { token: Some(token.to_owned().into()), ..Default::default() };
    Client::try_from(config).unwrap()
}

/// The hub's identity as a cluster admin sets it up: a ServiceAccount `hub` in `namespace`, bound to the
/// roles `metahook rbac` printed, and a client with its token. ClusterRoles are renamed `<prefix>-<name>`
/// (tests run at once) and bound to the account by a ClusterRoleBinding each, not aggregated; Roles and
/// RoleBindings are applied as printed (print them with `--service-account <namespace>/hub`).
pub struct HubAccount {
    pub client: Client,
    admin: Client,
    namespace: String,
    /// The ServiceAccount's name (`hub` unless [`HubAccount::create_named`]).
    name: String,
    prefix: String,
    /// ClusterRoles and ClusterRoleBindings made (same names), deleted by [`HubAccount::delete`].
    cluster_wide: Vec<String>,
    token: String,
}

impl HubAccount {
    pub async fn create(admin: &Client, namespace: &str, prefix: &str) -> Self {
        Self::create_named(admin, namespace, "hub", prefix).await
    }

    /// A ServiceAccount `name` in `namespace`, which may be shared with other tests (the account, not
    /// the namespace, is deleted by [`HubAccount::delete`]): e.g. in [`AUDITED_NAMESPACE`].
    pub async fn create_named(admin: &Client, namespace: &str, name: &str, prefix: &str) -> Self {
        let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
        let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        accounts.create(&PostParams::default(), &account).await.unwrap();
        let token = service_account_token(admin, namespace, name).await;
        Self {
            client: token_client(&token).await,
            admin: admin.clone(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            prefix: prefix.to_owned(),
            cluster_wide: Vec::new(),
            token,
        }
    }

    /// A kubeconfig file in `dir` for the local control plane that authenticates with the account's
    /// token only, for a hub run as its own process ([`HubProcess::start_as`]).
    pub fn kubeconfig(&self, dir: &std::path::Path) -> PathBuf {
        let text = std::fs::read_to_string(kubeconfig_path()).expect("reading the kubeconfig");
        let mut config: Value = yaml::from_str(&text).unwrap();
        config["users"][0]["user"] = json!({"token": self.token});
        let path = dir.join(format!("{}.kubeconfig", self.name));
        std::fs::write(&path, yaml::to_string(&config).unwrap()).unwrap();
        path
    }

    /// The account's user name as the API server (and its audit log) knows it.
    pub fn user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }

    /// Grants what `docs` (`metahook rbac` output) say, binding ClusterRoles to the account directly.
    pub async fn grant(&mut self, docs: &[Value]) {
        for doc in docs {
            let mut doc = doc.clone();
            if doc["kind"] == "ClusterRole" {
                let name = format!("{}-{}", self.prefix, doc["metadata"]["name"].as_str().unwrap());
                doc["metadata"]["name"] = json!(name);
                apply_value(&self.admin, &doc).await;
                let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                    "subjects": [{"kind": "ServiceAccount", "name": self.name, "namespace": self.namespace}]});
                apply_value(&self.admin, &binding).await;
                self.cluster_wide.push(name);
            } else {
                apply_value(&self.admin, &doc).await;
            }
        }
    }

    /// Deletes the cluster-wide objects [`HubAccount::grant`] made (namespaced ones go with their
    /// namespace).
    pub async fn delete(self) {
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
        for name in &self.cluster_wide {
            let _ = Api::<ClusterRoleBinding>::all(self.admin.clone()).delete(name, &DeleteParams::default()).await;
            let _ = Api::<ClusterRole>::all(self.admin.clone()).delete(name, &DeleteParams::default()).await;
        }
        let accounts: Api<ServiceAccount> = Api::namespaced(self.admin.clone(), &self.namespace);
        let _ = accounts.delete(&self.name, &DeleteParams::default()).await;
    }
}

/// The namespace whose ServiceAccounts the test control plane's API server audits
/// (`tests/cluster/audit-policy.yaml`); nobody else's requests are recorded.
pub const AUDITED_NAMESPACE: &str = "metahook-audited";

/// Makes sure [`AUDITED_NAMESPACE`] exists (it is shared by the tests that audit, and never deleted).
pub async fn audited_namespace(admin: &Client) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": AUDITED_NAMESPACE}})).unwrap();
    match Api::<Namespace>::all(admin.clone()).create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating namespace {AUDITED_NAMESPACE}: {e}"),
    }
}

/// The API server's audit records (`.cluster/logs/audit.log`, or `CLUSTER_AUDIT_LOG`) of `user`, as
/// JSON: `verb`, `objectRef.{resource,namespace,apiGroup}`, `requestURI`, `stage`.
pub fn audit_records(user: &str) -> Vec<Value> {
    let path = std::env::var_os("CLUSTER_AUDIT_LOG")
        .map_or_else(|| repo_root().join(".cluster/logs/audit.log"), PathBuf::from);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading the audit log {}: {e}", path.display()));
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|record| record["user"]["username"] == user)
        .collect()
}

/// The certificates `tests/hooks/make_pki.sh` makes: a CA, a second CA nobody uses, a client CA; server
/// certificates for 127.0.0.1 and for `greeter.hooks` only, signed by the CA; a client certificate
/// signed by the client CA, and an X.509 v1 one (`v1-client`, CN `metacontroller`) signed by it as
/// Metacontroller's `webhook-auth` example signs its own.
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("bash")
            .arg(repo_root().join("tests/hooks/make_pki.sh"))
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("running openssl");
        assert!(status.success(), "making test certificates with openssl failed");
        Self { dir }
    }

    pub fn path(&self, file: &str) -> String {
        self.dir.path().join(file).to_string_lossy().into_owned()
    }

    /// The directory the certificates are in (gone with the `Pki`), for files that go with them.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub fn pem(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(file)).unwrap()
    }

    /// The environment the hook libraries' servers take their TLS from: the server certificate for
    /// 127.0.0.1, and the client CA whose certificates they then require (mutual TLS).
    pub fn hook_env(&self) -> Vec<(String, String)> {
        vec![
            ("TLS_CERT_FILE".to_owned(), self.path("server.crt")),
            ("TLS_KEY_FILE".to_owned(), self.path("server.key")),
            ("TLS_CLIENT_CA_FILE".to_owned(), self.path("client-ca.crt")),
        ]
    }
}

/// The Secrets a controller's hooks name for their TLS (`caBundle.secretRef`, `clientTLS.secretRef`),
/// made from these PEMs and moved to `namespace` (the references in `docs` are rewritten to match), under
/// the keys the references name or default to as the CRD does (`ca.crt`, `tls.crt`, `tls.key`).
pub fn hook_tls_secrets(docs: &mut [Value], namespace: &str, ca: &str, cert: &str, key: &str) -> Vec<Value> {
    let mut secrets = Vec::new();
    let mut webhooks = Vec::new();
    for doc in docs.iter_mut() {
        if let Some(hooks) = doc["spec"]["hooks"].as_object_mut() {
            webhooks.extend(hooks.values_mut().filter_map(|h| h.get_mut("webhook")));
        }
    }
    for webhook in webhooks {
        if let Some(reference) = webhook.pointer_mut("/caBundle/secretRef") {
            reference["namespace"] = json!(namespace);
            let data_key = reference["key"].as_str().unwrap_or("ca.crt").to_owned();
            secrets.push(secret(namespace, &reference["name"], json!({ data_key: ca })));
        }
        if let Some(tls) = webhook.get_mut("clientTLS") {
            let cert_key = tls["certKey"].as_str().unwrap_or("tls.crt").to_owned();
            let key_key = tls["privateKeyKey"].as_str().unwrap_or("tls.key").to_owned();
            tls["secretRef"]["namespace"] = json!(namespace);
            secrets.push(secret(namespace, &tls["secretRef"]["name"], json!({ cert_key: cert, key_key: key })));
        }
    }
    secrets
}

fn secret(namespace: &str, name: &Value, string_data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
           "stringData": string_data})
}

/// Runs an example's `make-certs.sh` into a new temporary directory (as its README tells users to).
pub fn example_certs(dir: &str) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("sh")
        .arg(repo_root().join(dir).join("make-certs.sh"))
        .arg(out.path())
        .env("DAYS", "2")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("running make-certs.sh");
    assert!(status.success(), "{dir}/make-certs.sh failed");
    out
}

/// An example's own hook server (`python3 hook.py`, `node hook.mjs`, ...), started in its directory with
/// `PORT` set to a free port (`HOST` to loopback), and the helper libraries importable (`PYTHONPATH`). Killed on drop.
pub struct ExampleHook {
    pub port: u16,
    _child: tokio::process::Child,
}

impl ExampleHook {
    /// Starts `program args...` in `dir` (relative to the repo root) and waits until it accepts connections.
    pub async fn start(dir: &str, program: &str, args: &[&str]) -> Self {
        Self::start_with_env(dir, program, args, &[]).await
    }

    /// [`ExampleHook::start`] with more environment (e.g. [`Pki::hook_env`]).
    pub async fn start_with_env(dir: &str, program: &str, args: &[&str], env: &[(String, String)]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = tokio::process::Command::new(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(repo_root().join(dir))
            .env("PORT", port.to_string())
            .env("HOST", "127.0.0.1")
            .env("PYTHONPATH", repo_root().join("examples-python/metahook-hooks"))
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {program} in {dir}: {e}"));
        eventually(Duration::from_secs(20), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok().map(drop)
        })
        .await;
        Self { port, _child: child }
    }
}

/// One example under test (`examples-python/*`, `examples-js/*`): its own hook process, a namespace, and a
/// hub that runs only this test's controllers.
pub struct Example {
    pub client: Client,
    /// The example's directory, relative to the repository root.
    pub dir: String,
    pub ns: TestNamespace,
    /// The test's `metahook-test` label value (the namespace's name).
    pub label: String,
    pub hook: ExampleHook,
    pub hub: Hub,
    /// (kind, name) of the controllers [`Example::finish`] deletes.
    pub controllers: Vec<(String, String)>,
    /// Namespaces the test made besides `ns`, deleted by [`Example::finish`].
    pub namespaces: Vec<String>,
    /// The API groups of the CRDs in the example's directory: each test gets them under a group of its
    /// own (`<label>.<group>`), so that its teardown can delete them as the example's users do while
    /// other tests of the same example run.
    groups: Vec<String>,
    /// Every document the test applied, in order: its teardown deletes them all together.
    applied: std::sync::Mutex<Vec<Value>>,
}

impl Example {
    /// The example in `dir`, its hook started as `program args...` there (see [`ExampleHook::start`]),
    /// with the metahook CRDs installed, a namespace named after `test`, and a hub.
    pub async fn start(test: &str, dir: &str, program: &str, args: &[&str]) -> Self {
        Self::start_with_env(test, dir, program, args, &[]).await
    }

    /// [`Example::start`], the hook given more environment (e.g. [`Pki::hook_env`]).
    pub async fn start_with_env(test: &str, dir: &str, program: &str, args: &[&str], env: &[(String, String)]) -> Self {
        let client = client().await;
        install_metahook_crds(&client).await;
        let ns = TestNamespace::create(&client, test).await;
        let label = ns.name.clone();
        let hook = ExampleHook::start_with_env(dir, program, args, env).await;
        let hub = Hub::start(&client, &label);
        let groups = crd_groups(dir);
        let (controllers, namespaces, applied) = (Vec::new(), Vec::new(), std::sync::Mutex::default());
        Self { client, dir: dir.to_owned(), ns, label, hook, hub, controllers, namespaces, groups, applied }
    }

    /// The documents of one of the example's files, prepared for this test (see [`example_docs`]), the
    /// example's own API groups made the test's (see [`Example::api_version`]).
    pub fn docs(&self, file: &str) -> Vec<Value> {
        let mut docs = example_docs(&format!("{}/{file}", self.dir), self.hook.port, &self.label, &self.ns.name);
        for doc in &mut docs {
            self.own_groups(doc);
        }
        docs
    }

    /// `api_version` as this test has it: a group of the example's CRDs becomes `<label>.<group>`.
    pub fn api_version(&self, api_version: &str) -> String {
        match api_version.split_once('/') {
            Some((group, version)) if self.groups.iter().any(|g| g == group) => {
                format!("{}.{group}/{version}", self.label)
            }
            _ => api_version.to_owned(),
        }
    }

    /// Every `apiVersion` in `doc` (the object's, a controller's parent and child types, ...) and a CRD's
    /// group and name, moved to the test's groups.
    fn own_groups(&self, doc: &mut Value) {
        match doc {
            Value::Object(map) => {
                for (key, value) in map.iter_mut() {
                    match (key.as_str(), value.as_str()) {
                        ("apiVersion", Some(version)) => *value = json!(self.api_version(version)),
                        _ => self.own_groups(value),
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.own_groups(item)),
            _ => {}
        }
        if doc["kind"] == "CustomResourceDefinition"
            && let Some(group) = doc["spec"]["group"].as_str().filter(|g| self.groups.iter().any(|o| o == g))
        {
            let group = format!("{}.{group}", self.label);
            doc["metadata"]["name"] = json!(format!("{}.{group}", doc["spec"]["names"]["plural"].as_str().unwrap()));
            doc["spec"]["group"] = json!(group);
        }
    }

    /// Applies `docs` (CRDs first), and remembers them for the teardown.
    pub async fn apply(&self, docs: &[Value]) {
        self.applied.lock().unwrap().extend(docs.iter().cloned());
        apply_docs(&self.client, docs).await;
    }

    /// The `kind` objects in the test's namespace.
    pub async fn api(&self, api_version: &str, kind: &str) -> Api<DynamicObject> {
        self.api_in(api_version, kind, Some(&self.ns.name)).await
    }

    /// The `kind` objects in `namespace` (`None`: cluster-wide).
    pub async fn api_in(&self, api_version: &str, kind: &str, namespace: Option<&str>) -> Api<DynamicObject> {
        api(&self.client, &self.api_version(api_version), kind, namespace).await
    }

    /// A namespace for this test, `<test namespace>-<suffix>`, with `labels` (plus the test's label).
    pub async fn namespace(&mut self, suffix: &str, labels: &Value) -> String {
        let name = format!("{}-{suffix}", self.ns.name);
        let mut labels = labels.clone();
        labels["metahook-test"] = json!(self.label);
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        Api::<Namespace>::all(self.client.clone()).create(&PostParams::default(), &ns).await.unwrap();
        self.namespaces.push(name.clone());
        name
    }

    /// Tears the example down as its users do, Metacontroller's examples' way: `kubectl delete -f` of
    /// everything the test applied from its directory (its samples, then CRDs, controllers and the rest
    /// in the order applied, so the parents' CRD goes before its controller), with the hub running. Asserts that it returned
    /// within [`teardown::BOUND`] and left nothing of the hub's behind ([`teardown::left_behind`]).
    /// Then stops the hub and deletes the test's namespaces.
    pub async fn finish(self) {
        let applied = std::mem::take(&mut *self.applied.lock().unwrap());
        let mut whole: Vec<&Value> = Vec::new();
        for doc in &applied {
            let key = |d: &Value| {
                (
                    d["apiVersion"].clone(),
                    d["kind"].clone(),
                    d["metadata"]["namespace"].clone(),
                    d["metadata"]["name"].clone(),
                )
            };
            if !whole.iter().any(|seen| key(seen) == key(doc)) {
                whole.push(doc);
            }
        }
        // The samples (objects of the example's own types) first, as Metacontroller's examples delete
        // theirs before `kubectl delete -k` of the rest: after its CRD went, kubectl could not map them.
        let own = format!("{}.", self.label);
        whole.sort_by_key(|d| !d["apiVersion"].as_str().is_some_and(|v| v.starts_with(&own)));
        let controllers: Vec<Value> = whole
            .iter()
            .filter(|d| CONTROLLER_KINDS.contains(&d["kind"].as_str().unwrap_or_default()))
            .map(|d| (*d).clone())
            .collect();
        let took = teardown::kubectl_delete(&whole, true).await;
        assert!(took < teardown::BOUND, "{}: kubectl delete of the whole example took {took:?}", self.dir);
        let mut namespaces = vec![self.ns.name.clone()];
        namespaces.extend(self.namespaces.iter().cloned());
        teardown::assert_nothing_left(&self.client, &controllers, &namespaces, &self.label).await;
        eprintln!("{}: kubectl delete of the whole example returned in {took:?}, nothing left", self.dir);
        self.hub.stop().await;
        for (kind, name) in &self.controllers {
            let controllers = api(&self.client, CONTROLLERS, kind, None).await;
            let _ = controllers.delete(name, &DeleteParams::default()).await;
        }
        let namespaces = Api::<Namespace>::all(self.client.clone());
        for ns in &self.namespaces {
            let _ = namespaces.delete(ns, &DeleteParams::default()).await;
        }
        self.ns.delete().await;
    }
}

/// The API groups of the CRDs in the example directory `dir`'s manifests.
fn crd_groups(dir: &str) -> Vec<String> {
    let mut groups = Vec::new();
    for entry in std::fs::read_dir(repo_root().join(dir)).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            for doc in yaml::from_documents::<Value>(&text).unwrap_or_default() {
                if let Some(group) = doc["spec"]["group"].as_str().filter(|_| doc["kind"] == "CustomResourceDefinition")
                {
                    groups.push(group.to_owned());
                }
            }
        }
    }
    groups
}

/// The YAML documents of an example file, ready for a test: hook URLs point at `port` (examples use
/// `127.0.0.1:18080`), controllers carry the `metahook-test=<label>` label their test hub selects, and
/// namespaced objects without a namespace go to `namespace`.
pub fn example_docs(path: &str, port: u16, label: &str, namespace: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let text = text.replace("127.0.0.1:18080", &format!("127.0.0.1:{port}"));
    let mut docs = Vec::new();
    for mut value in yaml::from_documents::<serde_json::Value>(&text).expect("valid YAML") {
        let kind = value["kind"].as_str().unwrap_or_default().to_owned();
        if CONTROLLER_KINDS.contains(&kind.as_str()) {
            value["metadata"]["labels"]["metahook-test"] = serde_json::json!(label);
        } else if !CLUSTER_KINDS.contains(&kind.as_str()) && value["metadata"].get("namespace").is_none() {
            value["metadata"]["namespace"] = serde_json::json!(namespace);
        }
        docs.push(value);
    }
    docs
}

/// Kinds the examples use that are cluster-scoped (never given a namespace by [`example_docs`]).
const CLUSTER_KINDS: &[&str] = &[
    "CustomResourceDefinition",
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CompositeController",
    "DecoratorController",
    "MapController",
    "NamespacePolicy",
];

/// The kinds of controllers a test hub runs when they carry its label.
const CONTROLLER_KINDS: &[&str] = &["CompositeController", "DecoratorController", "MapController"];

/// Applies documents in order, installing CRDs first and waiting for them to be served.
pub async fn apply_docs(client: &Client, docs: &[serde_json::Value]) {
    for doc in docs.iter().filter(|d| d["kind"] == "CustomResourceDefinition") {
        install_crds(client, &serde_json::to_string(doc).unwrap()).await;
    }
    for doc in docs.iter().filter(|d| d["kind"] != "CustomResourceDefinition") {
        apply_value(client, doc).await;
    }
}

/// One test's world: the metahook and test CRDs installed, a namespace of its own, a real Python hook
/// process, and a hub that runs only the controllers labelled `metahook-test=<label>` (the namespace name).
pub struct World {
    pub client: Client,
    pub ns: TestNamespace,
    pub hook: HookServer,
    pub hub: Option<Hub>,
    pub label: String,
}

impl World {
    pub async fn new(test: &str, handlers: &str) -> Self {
        let (client, ns) = with_test_crds(test).await;
        let hook = HookServer::start(handlers).await;
        let label = ns.name.clone();
        let hub = Some(Hub::start(&client, &label));
        Self { client, ns, hook, hub, label }
    }

    pub async fn stop_hub(&mut self) {
        if let Some(hub) = self.hub.take() {
            hub.stop().await;
        }
    }

    pub async fn restart_hub(&mut self) {
        self.stop_hub().await;
        self.start_hub();
    }

    /// A hub again, after [`World::stop_hub`].
    pub fn start_hub(&mut self) {
        self.hub = Some(Hub::start(&self.client, &self.label));
    }

    /// A hub on `client` (e.g. one a [`WatchCut`] made) with `config`, after [`World::stop_hub`].
    pub fn start_hub_with(&mut self, client: &Client, config: metahook::ops::config::Config) {
        self.hub = Some(Hub::start_with_config(client, &self.label, config));
    }

    /// [`World::stop_hub`], then a hub on the test's own client with `config` (its metrics address, its
    /// rates): what a test that reads the hub's figures starts from.
    pub async fn restart_hub_with(&mut self, config: metahook::ops::config::Config) {
        self.stop_hub().await;
        let client = self.client.clone();
        self.start_hub_with(&client, config);
    }

    /// The plainest CompositeController spec: Things owning `InPlace` ConfigMaps, synced by the test
    /// hook's `path` (`/sync` for most). Tests that measure or report on a controller start from it.
    pub fn in_place_spec(&self, path: &str) -> Value {
        json!({
            "generateSelector": true,
            "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
            "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
            "hooks": {"sync": {"webhook": {"url": self.hook.url(path)}}},
        })
    }

    /// The plainest DecoratorController spec: the test's Things, decorated by the test hook's `/sync`.
    pub fn things_decorator_spec(&self) -> Value {
        json!({
            "resources": [{"apiVersion": "test.metahook.dev/v1", "resource": "things"}],
            "hooks": {"sync": {"webhook": {"url": self.hook.url("/sync")}}},
        })
    }

    /// Applies a `kind` controller (`CompositeController`, `DecoratorController`) called `name`, labelled
    /// for this test's hub, with `spec` as given.
    pub async fn controller(&self, kind: &str, name: &str, spec: Value) -> DynamicObject {
        apply_value(&self.client, &self.controller_object(kind, name, spec)).await
    }

    fn controller_object(&self, kind: &str, name: &str, spec: Value) -> Value {
        json!({"apiVersion": CONTROLLERS, "kind": kind,
               "metadata": {"name": name, "labels": {"metahook-test": self.label}}, "spec": spec})
    }

    /// Applies the test's CompositeController: named after the test, labelled for its hub and, unless
    /// the spec says otherwise, selecting only this test's parents (tests share the parent CRDs).
    pub async fn composite(&self, spec: Value) -> DynamicObject {
        self.composite_annotated(Value::Null, spec).await
    }

    /// [`World::composite`] with `annotations` on the controller (`Null`: none).
    pub async fn composite_annotated(&self, annotations: Value, mut spec: Value) -> DynamicObject {
        if spec["parentResource"].get("labelSelector").is_none() {
            spec["parentResource"]["labelSelector"] = json!({"matchLabels": {"metahook-test": self.label}});
        }
        let mut controller = self.controller_object("CompositeController", &self.label, spec);
        if !annotations.is_null() {
            controller["metadata"]["annotations"] = annotations;
        }
        apply_value(&self.client, &controller).await
    }

    /// Applies the test's DecoratorController, named after the test and labelled for its hub. Its
    /// resource rules without a label selector select only this test's objects.
    pub async fn decorator(&self, mut spec: Value) -> DynamicObject {
        for rule in spec["resources"].as_array_mut().into_iter().flatten() {
            if rule.get("labelSelector").is_none() {
                rule["labelSelector"] = json!({"matchLabels": {"metahook-test": self.label}});
            }
        }
        self.controller("DecoratorController", &self.label, spec).await
    }

    /// The controllers of `kind` (cluster-scoped).
    pub async fn controllers(&self, kind: &str) -> Api<DynamicObject> {
        api(&self.client, CONTROLLERS, kind, None).await
    }

    /// Applies the Thing `name` in the test's namespace, labelled for the test.
    pub async fn thing(&self, name: &str, spec: Value) -> DynamicObject {
        self.thing_labelled(name, &json!({}), spec).await
    }

    /// [`World::thing`] with more labels; a `Null` spec leaves the Thing without one.
    pub async fn thing_labelled(&self, name: &str, labels: &Value, spec: Value) -> DynamicObject {
        let mut thing = json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing",
                               "metadata": {"name": name, "namespace": self.ns.name, "labels": labels}});
        thing["metadata"]["labels"]["metahook-test"] = json!(self.label);
        if !spec.is_null() {
            thing["spec"] = spec;
        }
        apply_value(&self.client, &thing).await
    }

    /// The Things in the test's namespace.
    pub async fn things(&self) -> Api<DynamicObject> {
        api(&self.client, "test.metahook.dev/v1", "Thing", Some(&self.ns.name)).await
    }

    /// The ConfigMaps in the test's namespace.
    pub async fn config_maps(&self) -> Api<DynamicObject> {
        api(&self.client, "v1", "ConfigMap", Some(&self.ns.name)).await
    }

    /// The ConfigMap `name` in the test's namespace, if there is one.
    pub async fn config_map(&self, name: &str) -> Option<DynamicObject> {
        self.config_maps().await.get_opt(name).await.unwrap()
    }

    /// Stops the hub, then deletes the test's `kind` controller and its namespace.
    pub async fn finish(self, kind: &str) {
        self.finish_with_namespaces(kind, &[]).await;
    }

    /// [`World::finish`], deleting the test's other `namespaces` too.
    pub async fn finish_with_namespaces(mut self, kind: &str, namespaces: &[String]) {
        self.stop_hub().await;
        let controllers = self.controllers(kind).await;
        let _ = controllers.delete(&self.label, &DeleteParams::default()).await;
        // No hub runs to take its finalizer off (it would release the parents' finalizers first).
        let _ = controllers
            .patch(&self.label, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
            .await;
        for ns in namespaces {
            let _ = Api::<Namespace>::all(self.client.clone()).delete(ns, &DeleteParams::default()).await;
        }
        self.ns.delete().await;
    }
}

/// The API group and version of the controllers (Metacontroller's).
pub const CONTROLLERS: &str = "metacontroller.k8s.io/v1alpha1";
/// The apiVersion of the hub's `ChildRecord`s.
pub const RECORDS: &str = "metahook.dev/v1alpha1";

/// A hub's API client with watches a test can cut, to make the hub really miss a watch event.
///
/// While a resource's watch is cut, every event the API server sends on the hub's watches of that
/// resource is dropped before the hub reads it: the connection stays open, the API server goes on
/// sending, and once the cut is lifted later events pass again. The hub's watch then goes on from a
/// newer resourceVersion, so it never learns of what it missed; not even a reconnect would replay it.
/// That is what a plain disconnect cannot do (a watch resumes from the last resourceVersion it saw, and
/// the API server replays the rest). Lists, reads and writes pass untouched. It sits between the hub's
/// client stack and the real client, where requests are plain HTTP (TLS is below), and knows a watch by
/// its `watch=true` query.
///
/// It can also *hold* a resource's watch events: they wait, in order, until released, as a watch that
/// lags behind the others does (each type has its own watch; nothing orders one type's events against
/// another's). And it notes every write request the hub sends ([`WatchCut::writes`]).
#[derive(Clone, Default)]
pub struct WatchCut {
    state: std::sync::Arc<std::sync::Mutex<CutState>>,
    /// Bumped whenever what is held changes, to wake the held watches.
    changed: std::sync::Arc<tokio::sync::Notify>,
}

#[derive(Default)]
struct CutState {
    /// The resource (plural) whose watch events are dropped now.
    cut: Option<String>,
    /// The events dropped so far (JSON lines).
    dropped: Vec<String>,
    /// The resource whose watch events wait now.
    hold: Option<String>,
    /// The events that waited, or wait (JSON lines).
    held: Vec<String>,
    /// "METHOD path" of every request but GET the client sent.
    writes: Vec<String>,
}

impl WatchCut {
    /// A client over `inner` whose watches this cut can cut.
    pub fn client(&self, inner: &Client) -> Client {
        let namespace = inner.default_namespace().to_owned();
        Client::new(CutService { inner: inner.clone(), cut: self.clone() }, namespace)
    }

    /// From now on, events on watches of `resource` (a plural, `configmaps`) are dropped.
    pub fn cut(&self, resource: &str) {
        self.state.lock().unwrap().cut = Some(resource.to_owned());
    }

    /// Events pass again.
    pub fn restore(&self) {
        self.state.lock().unwrap().cut = None;
    }

    /// The watch events dropped so far, as the API server sent them.
    pub fn dropped(&self) -> Vec<String> {
        self.state.lock().unwrap().dropped.clone()
    }

    /// From now on, events on watches of `resource` wait until [`WatchCut::release`], in order.
    pub fn hold(&self, resource: &str) {
        self.state.lock().unwrap().hold = Some(resource.to_owned());
    }

    /// Held events go on, in the order they came.
    pub fn release(&self) {
        self.state.lock().unwrap().hold = None;
        self.changed.notify_waiters();
    }

    /// The watch events held so far, as the API server sent them.
    pub fn held(&self) -> Vec<String> {
        self.state.lock().unwrap().held.clone()
    }

    /// "METHOD path" of every request but a GET sent so far (a watch and a list are GETs).
    pub fn writes(&self) -> Vec<String> {
        self.state.lock().unwrap().writes.clone()
    }

    /// Notes `line`, an event on a watch of `resource`, as held if that resource's events are.
    fn note_if_held(&self, resource: &str, line: &[u8]) {
        let mut state = self.state.lock().unwrap();
        if state.hold.as_deref() == Some(resource) {
            state.held.push(String::from_utf8_lossy(line).into_owned());
        }
    }

    /// Waits while `resource`'s events are held.
    async fn wait_while_held(&self, resource: &str) {
        loop {
            let released = self.changed.notified();
            if self.state.lock().unwrap().hold.as_deref() != Some(resource) {
                return;
            }
            released.await;
        }
    }

    /// Whether `line`, an event on a watch of `resource`, is dropped (and if so, records it).
    fn drops(&self, resource: &str, line: &[u8]) -> bool {
        let mut state = self.state.lock().unwrap();
        if state.cut.as_deref() != Some(resource) {
            return false;
        }
        state.dropped.push(String::from_utf8_lossy(line).into_owned());
        true
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type CutBody = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, BoxError>;

#[derive(Clone)]
struct CutService {
    inner: Client,
    cut: WatchCut,
}

impl tower_service::Service<http::Request<kube::client::Body>> for CutService {
    type Response = http::Response<CutBody>;
    type Error = BoxError;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let uri = request.uri();
        let watch = uri.query().is_some_and(|q| q.split('&').any(|p| p == "watch=true"));
        let resource = watch.then(|| uri.path().rsplit('/').next().unwrap_or_default().to_owned());
        if request.method() != http::Method::GET {
            self.cut.state.lock().unwrap().writes.push(format!("{} {}", request.method(), uri.path()));
        }
        let (inner, cut) = (self.inner.clone(), self.cut.clone());
        Box::pin(async move {
            use http_body_util::BodyExt as _;
            let (parts, body) = inner.send(request).await?.into_parts();
            let body = match resource {
                Some(resource) => cut_events(body, cut, resource),
                None => body.map_err(BoxError::from).boxed_unsync(),
            };
            Ok(http::Response::from_parts(parts, body))
        })
    }
}

/// A watch response body (one JSON event per line) without the events `cut` drops, and with the events
/// it holds passed on only once they are released. The API server's events are read as they come (a
/// task of its own), so what is held is known while it waits.
fn cut_events(body: kube::client::Body, cut: WatchCut, resource: String) -> CutBody {
    use futures::StreamExt as _;
    use http_body_util::BodyExt as _;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<hyper::body::Frame<bytes::Bytes>, BoxError>>();
    let reader = cut.clone();
    let read = resource.clone();
    tokio::spawn(async move {
        let mut partial: Vec<u8> = Vec::new();
        let mut frames = http_body_util::BodyStream::new(body);
        while let Some(frame) = frames.next().await {
            let item = match frame {
                Err(e) => Some(Err(BoxError::from(e))),
                Ok(frame) => match frame.into_data() {
                    Ok(data) => {
                        partial.extend_from_slice(&data);
                        let mut lines = Vec::new();
                        while let Some(end) = partial.iter().position(|b| *b == b'\n') {
                            let line: Vec<u8> = partial.drain(..=end).collect();
                            if !reader.drops(&read, &line) {
                                reader.note_if_held(&read, &line);
                                lines.extend(line);
                            }
                        }
                        (!lines.is_empty()).then(|| Ok(hyper::body::Frame::data(bytes::Bytes::from(lines))))
                    }
                    Err(trailers) => Some(Ok(trailers)),
                },
            };
            if let Some(item) = item
                && tx.send(item).is_err()
            {
                return;
            }
        }
    });
    let frames =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) }).then(move |item| {
            let (cut, resource) = (cut.clone(), resource.clone());
            async move {
                cut.wait_while_held(&resource).await;
                item
            }
        });
    http_body_util::StreamBody::new(frames).boxed_unsync()
}

/// A tenant: a ServiceAccount in its own namespace, bound to a Role that may do anything with ConfigMaps,
/// Secrets and the test CRDs' objects there and nothing elsewhere — what a team given one namespace of a
/// shared cluster has. `client` acts as it (its token, as `kubectl --as` would).
pub struct Tenant {
    pub namespace: TestNamespace,
    pub client: Client,
    pub user: String,
}

impl Tenant {
    pub async fn create(admin: &Client, name: &str) -> Self {
        let namespace = TestNamespace::create(admin, name).await;
        let ns = namespace.name.clone();
        let account =
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tenant", "namespace": ns}});
        apply_value(admin, &account).await;
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "tenant", "namespace": ns},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["*"]},
            {"apiGroups": ["test.metahook.dev"], "resources": ["*"], "verbs": ["*"]},
        ]});
        apply_value(admin, &role).await;
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "tenant", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": ns}]});
        apply_value(admin, &binding).await;
        let token = service_account_token(admin, &ns, "tenant").await;
        let client = token_client(&token).await;
        Self { user: format!("system:serviceaccount:{ns}:tenant"), namespace, client }
    }

    /// The tenant's API for `kind` objects in its namespace.
    pub async fn api(&self, api_version: &str, kind: &str) -> Api<DynamicObject> {
        let (resource, _) = resolve_kind(&self.client, api_version, kind).await;
        Api::namespaced_with(self.client.clone(), &self.namespace.name, &resource)
    }
}
