//! Hook transport against the real control plane: HTTPS verified with a CA bundle, mutual TLS, bearer
//! and basic auth, `endpointConfigs`, credential rotation, ETags, and Service-form hooks reached through
//! `hookHosts`. Hooks are real Python processes (`tests/hooks/transport_hook.py`, Python's `ssl`);
//! certificates are made with openssl for each run, in a temporary directory.
//!
//! The tests that use credentials also check that none of them shows up in the hub's log (captured at
//! debug level for the whole run) or in an Event.

mod support;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{LazyLock, Mutex, Once};
use std::time::Duration;

use base64::Engine as _;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams};
use kube::{Client, ResourceExt as _};
use serde_json::{Value, json};
use support::{Pki, TestNamespace, api, apply_value, eventually, warnings_for};

const WAIT: Duration = Duration::from_secs(60);

/// Everything the hub logged in this test binary, to search for secrets.
static LOG: LazyLock<Mutex<Vec<u8>>> = LazyLock::new(Mutex::default);

/// Writes log lines to [`LOG`] and to the test's captured output.
struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(buf);
        eprint!("{}", String::from_utf8_lossy(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the capturing subscriber, at debug level, before `support::client` would install its own.
fn capture_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ =
            tracing_subscriber::fmt().with_env_filter("debug").with_ansi(false).with_writer(|| LogWriter).try_init();
    });
}

/// Fails if any of `secrets` occurs in the hub's log or in `events`.
fn assert_nowhere(secrets: &[&str], events: &str) {
    let log = String::from_utf8_lossy(&LOG.lock().unwrap()).into_owned();
    assert!(log.contains("metahook"), "the log capture works");
    for secret in secrets {
        assert!(!log.contains(secret), "a credential appears in the hub's log");
        assert!(!events.contains(secret), "a credential appears in an Event: {events}");
    }
}

/// A running `transport_hook.py`. Killed on drop.
struct Hook {
    port: u16,
    log: PathBuf,
    dir: tempfile::TempDir,
    _child: tokio::process::Child,
}

impl Hook {
    async fn start(config: Value) -> Self {
        Self::start_in(tempfile::tempdir().unwrap(), config).await
    }

    /// A hook that requires the bearer token `token` (read from a file of its own at each call, see
    /// [`Hook::require_token`]), with more `config`.
    async fn requiring_token(token: &str, mut config: Value) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, token).unwrap();
        config["auth"] = json!({"bearer_file": token_file});
        Self::start_in(dir, config).await
    }

    async fn start_in(dir: tempfile::TempDir, mut config: Value) -> Self {
        let log = dir.path().join("requests.jsonl");
        config["log"] = json!(log);
        let config_file = dir.path().join("config.json");
        std::fs::write(&config_file, config.to_string()).unwrap();
        let (child, port) = support::start_transport_hook(&config_file).await;
        Self { port, log, dir, _child: child }
    }

    /// From now on the hook of [`Hook::requiring_token`] requires `token` instead.
    fn require_token(&self, token: &str) {
        std::fs::write(self.dir.path().join("token"), token).unwrap();
    }

    fn url(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}/sync", self.port)
    }

    /// The requests answered so far: `{path, status, ifNoneMatch, clientCert, clientCertSubject}`.
    fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// One test's namespace and hub; its controllers are named `<label>-<id>` and select parents
/// labelled `controller: <id>`.
struct Setup {
    client: Client,
    ns: TestNamespace,
    label: String,
    hub: Option<support::Hub>,
}

impl Setup {
    async fn new(test: &str, config: metahook::ops::config::Config) -> Self {
        capture_logs();
        let (client, ns) = support::with_test_crds(test).await;
        let label = ns.name.clone();
        let hub = Some(support::Hub::start_with_config(&client, &label, config));
        Self { client, ns, label, hub }
    }

    /// A CompositeController whose sync hook is `webhook`; `extra` is merged into its spec.
    async fn controller(&self, id: &str, webhook: Value, extra: Value) -> DynamicObject {
        let mut spec = json!({
            "generateSelector": true,
            "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things",
                               "labelSelector": {"matchLabels": {"metahook-test": self.label, "controller": id}}},
            "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
            "hooks": {"sync": {"webhook": webhook}},
        });
        for (key, value) in extra.as_object().into_iter().flatten() {
            spec[key] = value.clone();
        }
        apply_value(
            &self.client,
            &json!({"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
                    "metadata": {"name": format!("{}-{id}", self.label), "labels": {"metahook-test": self.label}},
                    "spec": spec}),
        )
        .await
    }

    /// A parent for controller `id`.
    async fn thing(&self, name: &str, id: &str, greeting: &str) -> DynamicObject {
        apply_value(
            &self.client,
            &json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing",
                    "metadata": {"name": name, "namespace": self.ns.name,
                                 "labels": {"metahook-test": self.label, "controller": id}},
                    "spec": {"greeting": greeting}}),
        )
        .await
    }

    /// `data.greeting` of the ConfigMap child of parent `name`, if it exists.
    async fn greeting(&self, parent: &str) -> Option<String> {
        let config_maps = api(&self.client, "v1", "ConfigMap", Some(&self.ns.name)).await;
        let cm = config_maps.get_opt(&format!("{parent}-cm")).await.unwrap()?;
        cm.data.pointer("/data/greeting").and_then(Value::as_str).map(str::to_owned)
    }

    async fn wait_greeting(&self, parent: &str, greeting: &str) {
        eventually(WAIT, || async { (self.greeting(parent).await.as_deref() == Some(greeting)).then_some(()) }).await;
    }

    /// A hook's `authorization`: the bearer token under `token` in the test namespace's Secret `secret`.
    fn token_in(&self, secret: &str) -> Value {
        json!({"secretRef": {"name": secret, "namespace": self.ns.name, "key": "token"}})
    }

    /// Creates or replaces a Secret in the test namespace.
    async fn secret(&self, name: &str, data: &[(&str, &str)]) {
        let encode = |v: &str| base64::engine::general_purpose::STANDARD.encode(v);
        let data: serde_json::Map<String, Value> =
            data.iter().map(|(k, v)| ((*k).to_owned(), json!(encode(v)))).collect();
        apply_value(
            &self.client,
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": self.ns.name},
                    "data": data}),
        )
        .await;
    }

    /// Creates or replaces a ConfigMap holding `pem` under `ca.crt`.
    async fn ca_config_map(&self, name: &str, pem: &str) {
        apply_value(
            &self.client,
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": self.ns.name},
                    "data": {"ca.crt": pem}}),
        )
        .await;
    }

    /// Waits for a `SyncError` Event on parent `name` and returns it.
    async fn sync_error(&self, name: &str) -> String {
        eventually(WAIT, || async {
            warnings_for(&self.client, &self.ns.name, name).await.into_iter().find(|w| w.starts_with("SyncError"))
        })
        .await
    }

    /// Reason and note of every Event in the namespace, one per line.
    async fn events(&self) -> String {
        let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(self.client.clone(), &self.ns.name);
        let list = api.list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .map(|e| format!("{}: {}\n", e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }

    async fn finish(mut self) {
        if let Some(hub) = self.hub.take() {
            hub.stop().await;
        }
        let ccs = api(&self.client, "metacontroller.k8s.io/v1alpha1", "CompositeController", None).await;
        let mine = ListParams::default().labels(&format!("metahook-test={}", self.label));
        for cc in ccs.list(&mine).await.unwrap().items {
            let _ = ccs.delete(&cc.name_any(), &DeleteParams::default()).await;
        }
        self.ns.delete().await;
    }
}

fn config() -> metahook::ops::config::Config {
    metahook::ops::config::Config::default()
}

#[tokio::test]
async fn https_hook_is_verified_with_a_ca_bundle_from_a_config_map_that_may_rotate() {
    let pki = Pki::new();
    let hook = Hook::start(json!({"tls": {"cert": pki.path("server.crt"), "key": pki.path("server.key")}})).await;
    let t = Setup::new("https-ca-bundle", config()).await;
    t.ca_config_map("hook-ca", &pki.pem("ca.crt")).await;
    let ca = json!({"configMapRef": {"name": "hook-ca", "namespace": t.ns.name}});
    t.controller("tls", json!({"url": hook.url("https"), "caBundle": ca}), json!({})).await;
    t.thing("one", "tls", "hello").await;
    t.wait_greeting("one", "hello").await;

    // The ConfigMap now holds a CA that did not sign the hook's certificate: the next sync fails to
    // verify the server, says so in an Event, and leaves the child alone.
    t.ca_config_map("hook-ca", &pki.pem("wrong-ca.crt")).await;
    t.thing("one", "tls", "bonjour").await;
    let error = t.sync_error("one").await;
    assert!(error.contains("invalid peer certificate"), "{error}");
    assert_eq!(t.greeting("one").await.as_deref(), Some("hello"), "children untouched after a failed sync");

    // Back to the right CA, without touching the controller: the watch picks it up.
    t.ca_config_map("hook-ca", &pki.pem("ca.crt")).await;
    t.wait_greeting("one", "bonjour").await;
    t.finish().await;
}

#[tokio::test]
async fn mutual_tls_hook_accepts_the_client_certificate_and_refuses_a_hub_without_one() {
    let pki = Pki::new();
    let tls =
        json!({"cert": pki.path("server.crt"), "key": pki.path("server.key"), "client_ca": pki.path("client-ca.crt")});
    let hook = Hook::start(json!({"tls": tls})).await;
    let t = Setup::new("mutual-tls", config()).await;
    t.secret("client-cert", &[("tls.crt", &pki.pem("client.crt")), ("tls.key", &pki.pem("client.key"))]).await;
    let ca = json!({"inline": pki.pem("ca.crt")});
    let client_tls = json!({"secretRef": {"name": "client-cert", "namespace": t.ns.name}});
    t.controller("with", json!({"url": hook.url("https"), "caBundle": ca, "clientTLS": client_tls}), json!({})).await;
    t.controller("without", json!({"url": hook.url("https"), "caBundle": ca}), json!({})).await;
    t.thing("with-cert", "with", "hello").await;
    t.thing("without-cert", "without", "hello").await;

    t.wait_greeting("with-cert", "hello").await;
    let error = t.sync_error("without-cert").await;
    assert!(error.contains("http error"), "{error}");
    assert_eq!(t.greeting("without-cert").await, None);
    let requests = hook.requests();
    assert!(!requests.is_empty() && requests.iter().all(|r| r["clientCert"] == true), "{requests:?}");
    let key = pki.pem("client.key");
    let key_body = key.lines().nth(1).unwrap();
    assert_nowhere(&[key_body], &t.events().await);
    t.finish().await;
}

#[tokio::test]
async fn mutual_tls_works_with_an_x509_v1_client_certificate_as_openssl_x509_req_makes_it() {
    let pki = Pki::new();
    let text = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in", &pki.path("v1-client.crt")])
        .output()
        .expect("running openssl");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("Version: 1 (0x0)") && !text.contains("X509v3"), "not a v1 certificate:\n{text}");
    let tls =
        json!({"cert": pki.path("server.crt"), "key": pki.path("server.key"), "client_ca": pki.path("client-ca.crt")});
    let hook = Hook::start(json!({"tls": tls})).await;
    let t = Setup::new("v1-client-cert", config()).await;
    t.secret("client-cert", &[("tls.crt", &pki.pem("v1-client.crt")), ("tls.key", &pki.pem("v1-client.key"))]).await;
    let webhook = json!({"url": hook.url("https"), "caBundle": {"inline": pki.pem("ca.crt")},
                         "clientTLS": {"secretRef": {"name": "client-cert", "namespace": t.ns.name}}});
    t.controller("v1", webhook, json!({})).await;
    t.thing("one", "v1", "hello").await;

    t.wait_greeting("one", "hello").await;
    let requests = hook.requests();
    assert!(
        !requests.is_empty() && requests.iter().all(|r| r["clientCertSubject"] == "metacontroller"),
        "the hook saw the v1 certificate on every call: {requests:?}"
    );
    assert!(warnings_for(&t.client, &t.ns.name, "one").await.is_empty());
    t.finish().await;
}

#[tokio::test]
async fn bearer_token_from_a_secret_is_sent_and_a_wrong_one_is_refused_without_leaking_it() {
    let (right, wrong) = ("right-token-7f3a9c", "wrong-token-51be02");
    let hook = Hook::requiring_token(right, json!({})).await;
    let t = Setup::new("bearer-token", config()).await;
    t.secret("right", &[("token", right)]).await;
    t.secret("wrong", &[("token", wrong)]).await;
    for id in ["right", "wrong"] {
        let authorization = t.token_in(id);
        t.controller(id, json!({"url": hook.url("http"), "authorization": authorization}), json!({})).await;
        t.thing(&format!("{id}-thing"), id, "hello").await;
    }

    t.wait_greeting("right-thing", "hello").await;
    let error = t.sync_error("wrong-thing").await;
    assert!(error.contains("401"), "{error}");
    assert!(error.contains("bad credentials: Bearer <redacted>"), "the hook's echo is scrubbed: {error}");
    assert_eq!(t.greeting("wrong-thing").await, None);
    assert_nowhere(&[right, wrong], &t.events().await);
    t.finish().await;
}

#[tokio::test]
async fn basic_auth_is_built_from_the_secret_and_a_colon_in_the_username_is_refused() {
    let (user, password) = ("alice", "pa55-word-93c1");
    let hook = Hook::start(json!({"auth": {"basic": {"username": user, "password": password}}})).await;
    let t = Setup::new("basic-auth", config()).await;
    t.secret("creds", &[("username", user), ("password", password)]).await;
    t.secret("custom-keys", &[("user", user), ("pass", password)]).await;
    t.secret("colon", &[("username", "al:ice"), ("password", password)]).await;
    let basic = |secret: &str| json!({"secretRef": {"name": secret, "namespace": t.ns.name}});
    let mut custom = basic("custom-keys");
    custom["usernameKey"] = json!("user");
    custom["passwordKey"] = json!("pass");
    t.controller("default-keys", json!({"url": hook.url("http"), "basicAuth": basic("creds")}), json!({})).await;
    t.controller("custom-keys", json!({"url": hook.url("http"), "basicAuth": custom}), json!({})).await;
    t.controller("colon", json!({"url": hook.url("http"), "basicAuth": basic("colon")}), json!({})).await;
    for id in ["default-keys", "custom-keys", "colon"] {
        t.thing(id, id, "hello").await;
    }

    t.wait_greeting("default-keys", "hello").await;
    t.wait_greeting("custom-keys", "hello").await;
    let error = t.sync_error("colon").await;
    assert!(error.contains("must not contain ':'"), "{error}");
    assert!(hook.requests().iter().all(|r| r["status"] == 200), "the refused username was never sent");
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    assert_nowhere(&[password, &encoded], &t.events().await);
    t.finish().await;
}

#[tokio::test]
async fn url_userinfo_is_sent_as_basic_auth_unless_the_hook_sets_a_header_and_never_shows() {
    let (user, password, wrong) = ("hook-user", "p@ss-w0rd-5e1f", "wr0ng-pa55-77c2");
    let basic = json!({"basic": {"username": user, "password": password}});
    let hook = Hook::start(json!({"auth": basic})).await;
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = metahook::ops::config::Config { metrics_address: format!("127.0.0.1:{metrics_port}"), ..config() };
    let t = Setup::new("url-userinfo", config).await;
    // Percent-encoded as a URL must carry an '@'; Go decodes it before building the header.
    let with_userinfo = |userinfo: &str| format!("http://{userinfo}@127.0.0.1:{}/sync", hook.port);
    let right_url = with_userinfo(&format!("{user}:p%40ss-w0rd-5e1f"));
    let wrong_url = with_userinfo(&format!("{user}:{wrong}"));
    t.secret("creds", &[("username", user), ("password", password)]).await;
    t.controller("url", json!({"url": right_url}), json!({})).await;
    t.controller("wrong", json!({"url": wrong_url}), json!({})).await;
    // Go sets the header from the URL only when the request has none: basicAuth wins.
    let basic_auth = json!({"secretRef": {"name": "creds", "namespace": t.ns.name}});
    t.controller("header-wins", json!({"url": wrong_url, "basicAuth": basic_auth}), json!({})).await;
    for id in ["url", "wrong", "header-wins"] {
        t.thing(id, id, "hello").await;
    }

    t.wait_greeting("url", "hello").await;
    t.wait_greeting("header-wins", "hello").await;
    let error = t.sync_error("wrong").await;
    assert!(error.contains(&format!("hook {} answered", hook.url("http"))), "the URL without userinfo: {error}");
    assert!(error.contains("bad credentials: Basic <redacted>"), "the hook's echo is scrubbed: {error}");
    assert_eq!(t.greeting("wrong").await, None);

    let metrics = eventually(WAIT, || async {
        let text = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics")).await.ok()?.text().await.ok()?;
        text.contains("code=\"401\"").then_some(text)
    })
    .await;
    assert!(metrics.contains(&format!("controller=\"{}-url\",hook=\"sync\",code=\"200\"", t.label)), "{metrics}");
    let encode = |pair: String| base64::engine::general_purpose::STANDARD.encode(pair);
    let (right_b64, wrong_b64) = (encode(format!("{user}:{password}")), encode(format!("{user}:{wrong}")));
    let secrets = [password, "p%40ss-w0rd-5e1f", wrong, &right_b64, &wrong_b64];
    for secret in secrets.iter().chain([&user]) {
        assert!(!metrics.contains(secret), "a credential appears in the metrics: {metrics}");
    }
    assert_nowhere(&secrets, &t.events().await);
    t.finish().await;
}

#[tokio::test]
async fn credentials_where_the_hub_cuts_a_quoted_body_are_scrubbed_before_the_cut() {
    let (right, wrong) = ("Xk3v-right-token-ab12", "Zq7w-wrong-token-cd34");
    // 1024 characters are quoted; the echoed token starts 9 before that, so a body cut first would
    // end in the first 9 characters of it, which no longer match the scrub.
    let echo = "bad credentials: Bearer ";
    let pad = 1024 - 9 - echo.len();
    let hook = Hook::requiring_token(right, json!({"pad": pad})).await;
    let t = Setup::new("quoted-body-cut", config()).await;
    t.secret("wrong", &[("token", wrong)]).await;
    let authorization = t.token_in("wrong");
    t.controller("cut", json!({"url": hook.url("http"), "authorization": authorization}), json!({})).await;
    t.thing("one", "cut", "hello").await;

    t.sync_error("one").await;
    let quoted = format!("{}{echo}", "x".repeat(pad));
    let log = eventually(WAIT, || async {
        let log = String::from_utf8_lossy(&LOG.lock().unwrap()).into_owned();
        log.contains(&quoted).then_some(log)
    })
    .await;
    let line = log.lines().find(|l| l.contains(&quoted)).unwrap();
    assert!(!line.contains(&wrong[..4]), "a piece of the token was quoted: {line}");
    assert!(!line.contains("<reda"), "no piece of a marker either: {line}");
    assert_nowhere(&[right, wrong], &t.events().await);
    t.finish().await;
}

#[tokio::test]
async fn endpoint_configs_supply_tls_and_auth_by_host_to_hooks_that_set_none() {
    let pki = Pki::new();
    let token = "endpoint-token-c41d";
    let tls = json!({"cert": pki.path("server.crt"), "key": pki.path("server.key")});
    let hook = Hook::requiring_token(token, json!({"tls": tls})).await;
    let t = Setup::new("endpoint-configs", config()).await;
    t.ca_config_map("hook-ca", &pki.pem("ca.crt")).await;
    t.secret("token", &[("token", token)]).await;
    t.secret("decoy", &[("token", "decoy-token-0000")]).await;
    let auth = |secret: &str| t.token_in(secret);
    let endpoint_configs = json!([
        {"host": "127.0.0.1:1", "authorization": auth("decoy")},
        {"host": format!("127.0.0.1:{}", hook.port),
         "caBundle": {"configMapRef": {"name": "hook-ca", "namespace": t.ns.name}},
         "authorization": auth("token")},
    ]);
    t.controller("by-host", json!({"url": hook.url("https")}), json!({"endpointConfigs": endpoint_configs})).await;
    t.thing("one", "by-host", "hello").await;

    t.wait_greeting("one", "hello").await;
    assert_nowhere(&[token], &t.events().await);
    t.finish().await;
}

#[tokio::test]
async fn rotated_token_is_used_without_touching_the_controller() {
    let (old, new) = ("old-token-2b7e11", "new-token-98af3d");
    let hook = Hook::requiring_token(old, json!({})).await;
    let t = Setup::new("token-rotation", config()).await;
    t.secret("token", &[("token", old)]).await;
    let authorization = t.token_in("token");
    let cc =
        t.controller("rotating", json!({"url": hook.url("http"), "authorization": authorization}), json!({})).await;
    t.thing("one", "rotating", "hello").await;
    t.wait_greeting("one", "hello").await;

    // The hook now wants the new token, and the Secret carries it; the controller is not edited.
    hook.require_token(new);
    t.secret("token", &[("token", new)]).await;
    t.thing("one", "rotating", "bonjour").await;
    t.wait_greeting("one", "bonjour").await;

    let ccs = api(&t.client, "metacontroller.k8s.io/v1alpha1", "CompositeController", None).await;
    let now = ccs.get(&cc.name_any()).await.unwrap();
    assert_eq!(now.metadata.generation, cc.metadata.generation, "the controller spec was not changed");
    let refused = reqwest::Client::new()
        .post(hook.url("http"))
        .header("Authorization", format!("Bearer {old}"))
        .json(&json!({"parent": {"metadata": {"name": "x"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401, "the hook refuses the old token");
    assert_nowhere(&[old, new], &t.events().await);
    t.finish().await;
}

#[tokio::test]
async fn etag_304_reuses_the_cached_response_and_is_counted() {
    let hook = Hook::start(json!({"etag": true})).await;
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = metahook::ops::config::Config { metrics_address: format!("127.0.0.1:{metrics_port}"), ..config() };
    let t = Setup::new("etag", config).await;
    let etag = json!({"enabled": true, "cacheTimeoutSeconds": 600, "cacheCleanupSeconds": 60});
    t.controller("cached", json!({"url": hook.url("http"), "etag": etag}), json!({"resyncPeriodSeconds": 1})).await;
    t.thing("one", "cached", "hello").await;
    t.wait_greeting("one", "hello").await;

    // Resyncs send the ETag back; the hook answers 304 with no body and the hub applies the cached
    // answer: the child stays, the status stays, and nothing fails.
    eventually(WAIT, || async {
        let answered = hook.requests().into_iter().filter(|r| r["status"] == 304).count();
        (answered >= 2).then_some(())
    })
    .await;
    assert!(hook.requests().iter().filter(|r| r["status"] == 304).all(|r| r["ifNoneMatch"].is_string()));
    assert_eq!(t.greeting("one").await.as_deref(), Some("hello"));
    let things = api(&t.client, "test.metahook.dev/v1", "Thing", Some(&t.ns.name)).await;
    assert_eq!(things.get("one").await.unwrap().data["status"]["greeting"], "hello");
    let failures = warnings_for(&t.client, &t.ns.name, "one").await;
    assert!(failures.is_empty(), "{failures:?}");

    let metrics = eventually(WAIT, || async {
        let text = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics")).await.ok()?.text().await.ok()?;
        text.contains("result=\"hit\"").then_some(text)
    })
    .await;
    let labels = format!("kind=\"CompositeController\",controller=\"{}-cached\",hook=\"sync\"", t.label);
    assert!(metrics.contains(&format!("metahook_hook_etag_cache_total{{{labels},result=\"miss\"}} 1")), "{metrics}");
    assert!(metrics.contains(&format!("metahook_hook_requests_total{{{labels},code=\"304\"}}")), "{metrics}");
    assert!(metrics.contains(&format!("metahook_hook_request_duration_seconds_count{{{labels}}}")), "{metrics}");

    // A changed parent gets a full answer again.
    t.thing("one", "cached", "bonjour").await;
    t.wait_greeting("one", "bonjour").await;
    t.finish().await;
}

#[tokio::test]
async fn service_form_hook_is_reached_through_hook_hosts_and_verified_by_its_own_name() {
    let pki = Pki::new();
    // The certificate names only greeter.hooks, not the 127.0.0.1 the connection goes to.
    let hook = Hook::start(json!({"tls": {"cert": pki.path("greeter.crt"), "key": pki.path("greeter.key")}})).await;
    let hosts = [("greeter.hooks:8443".to_owned(), format!("127.0.0.1:{}", hook.port))].into();
    let t = Setup::new("service-hook-hosts", metahook::ops::config::Config { hook_hosts: hosts, ..config() }).await;
    let webhook = json!({
        "service": {"name": "greeter", "namespace": "hooks", "port": 8443, "protocol": "https"},
        "path": "/sync",
        "caBundle": {"inline": pki.pem("ca.crt")},
    });
    t.controller("service", webhook, json!({})).await;
    t.thing("one", "service", "hello").await;
    t.wait_greeting("one", "hello").await;
    t.finish().await;
}

#[tokio::test]
async fn http2_is_negotiated_with_a_hook_that_offers_it() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    let mut child = tokio::process::Command::new("node")
        .arg(support::repo_root().join("tests/hooks/h2_hook.mjs"))
        .args([pki.path("server.crt"), pki.path("server.key"), log.to_string_lossy().into_owned()])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting node h2_hook.mjs");
    let port = support::port_line(&mut child).await;
    let t = Setup::new("http2", config()).await;
    let webhook = json!({"url": format!("https://127.0.0.1:{port}/sync"), "caBundle": {"inline": pki.pem("ca.crt")}});
    t.controller("h2", webhook, json!({})).await;
    t.thing("one", "h2", "hello").await;
    t.wait_greeting("one", "hello").await;
    let versions = std::fs::read_to_string(&log).unwrap();
    assert!(versions.lines().all(|l| l.contains("\"2.0\"")), "{versions}");
    t.finish().await;
}

#[tokio::test]
async fn settings_metacontroller_refuses_keep_the_controller_from_starting_with_a_reason() {
    let t = Setup::new("invalid-hook-settings", config()).await;
    let secret = json!({"name": "s", "namespace": t.ns.name, "key": "token"});
    let webhook = json!({"url": "https://127.0.0.1:1/sync", "authorization": {"secretRef": secret},
                         "basicAuth": {"secretRef": {"name": "s", "namespace": t.ns.name}}});
    let cc = t.controller("both", webhook, json!({})).await;
    let ccs = api(&t.client, "metacontroller.k8s.io/v1alpha1", "CompositeController", None).await;
    let ready = eventually(WAIT, || async {
        let cc = ccs.get(&cc.name_any()).await.ok()?;
        let conditions = cc.data["status"]["conditions"].as_array()?.clone();
        conditions.into_iter().find(|c| c["type"] == "Ready")
    })
    .await;
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "InvalidHookSetting");
    assert_eq!(ready["message"], "hooks.sync.webhook: authorization and basicAuth are mutually exclusive");
    t.finish().await;
}

/// A hook server made exactly as Metacontroller's `webhook-auth` example makes its own
/// (`examples/webhook-auth/manifest/sync.py`): `http.server.HTTPServer` behind `ssl.wrap_socket`,
/// requiring a client certificate and a bearer token, answering HTTP/1.0 without `Content-Length` and
/// closing the connection without TLS's `close_notify`. `/cut` sends half of its answer that way.
const WEBHOOK_AUTH_HOOK: &str = r#"
import json, ssl, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

CERT, KEY, CLIENT_CA, TOKEN = sys.argv[1:5]

class Controller(BaseHTTPRequestHandler):
    def do_POST(self):
        if self.headers.get("Authorization", "") != "Bearer " + TOKEN:
            self.send_response(401)
            self.end_headers()
            return
        body = self.rfile.read(int(self.headers.get("content-length")))
        parent = json.loads(body)["parent"]
        response = {"status": {"working": "fine"},
                    "children": [{"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": parent["metadata"]["name"] + "-cm"},
                                  "data": {"greeting": parent["spec"]["greeting"]}}]}
        data = json.dumps(response).encode("utf-8")
        if self.path == "/cut":
            data = data[: len(data) // 2]
        self.send_response(200)
        self.send_header("Content-type", "application/json")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass

ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(CERT, KEY)
ctx.load_verify_locations(CLIENT_CA)
ctx.verify_mode = ssl.CERT_REQUIRED
server = HTTPServer(("127.0.0.1", 0), Controller)
server.socket = ctx.wrap_socket(server.socket, server_side=True)
print("PORT %d" % server.server_address[1], flush=True)
server.serve_forever()
"#;

/// Corner 11 of the promises issue: a hook Metacontroller can read, the hub can read. Metacontroller's
/// `webhook-auth` hook (CA bundle, bearer token and an X.509 v1 client certificate, all from
/// `endpointConfigs`) ends each answer by closing the connection without `close_notify`, which Go's
/// client takes as the end of the body. The hub reads it the same way — and an answer cut short that
/// way is refused whole: its child is left as it was.
#[tokio::test]
async fn metacontrollers_webhook_auth_hook_is_read_to_its_close_and_a_cut_answer_is_refused() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("sync.py");
    std::fs::write(&script, WEBHOOK_AUTH_HOOK).unwrap();
    let token = "webhook-auth-token-3c9e1f";
    let mut child = tokio::process::Command::new("python3")
        .arg(&script)
        .args([pki.path("server.crt"), pki.path("server.key"), pki.path("client-ca.crt"), token.to_owned()])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting the webhook-auth hook");
    let port = support::port_line(&mut child).await;
    let t = Setup::new("webhook-auth", config()).await;
    t.secret("client-cert", &[("tls.crt", &pki.pem("v1-client.crt")), ("tls.key", &pki.pem("v1-client.key"))]).await;
    t.secret("token", &[("token", token)]).await;
    t.ca_config_map("hook-ca", &pki.pem("ca.crt")).await;
    let endpoint = json!([{"host": format!("127.0.0.1:{port}"),
        "caBundle": {"configMapRef": {"name": "hook-ca", "namespace": t.ns.name}},
        "authorization": t.token_in("token"),
        "clientTLS": {"secretRef": {"name": "client-cert", "namespace": t.ns.name}}}]);
    let extra = json!({"endpointConfigs": endpoint});
    t.controller("whole", json!({"url": format!("https://127.0.0.1:{port}/sync")}), extra.clone()).await;
    t.controller("cut", json!({"url": format!("https://127.0.0.1:{port}/cut")}), extra).await;
    t.thing("one", "whole", "hello").await;
    t.wait_greeting("one", "hello").await;
    t.thing("one", "whole", "bonjour").await;
    t.wait_greeting("one", "bonjour").await;
    assert!(warnings_for(&t.client, &t.ns.name, "one").await.is_empty());

    t.thing("two", "cut", "hello").await;
    let error = t.sync_error("two").await;
    assert!(error.contains("not valid JSON"), "{error}");
    assert_eq!(t.greeting("two").await, None, "nothing of a cut answer is written");
    assert_nowhere(&[token], &t.events().await);
    t.finish().await;
}
