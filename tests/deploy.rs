//! The cluster add-on in `deploy/`: `deploy/verify.sh` renders the kustomization and the Helm chart and
//! has the real API server validate every object (server-side dry-run, nothing is created); this file
//! runs it and then checks what only the hub's own types can check: the rendered config files parse as
//! the hub's `Config`, the Deployment points `--config` at the mounted file, and the chart's values
//! schema knows exactly the hub's config keys.
//!
//! The first run on a fresh clone builds helm from the Go module proxy (about 3 minutes, see
//! deploy/README.md); later runs take a few seconds.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use metahook::ops::config::{Config, ConfigOverrides};
use serde_json::Value;

fn kubeconfig() -> PathBuf {
    std::env::var_os("METAHOOK_TEST_KUBECONFIG")
        .map_or_else(|| support::repo_root().join(".cluster/kubeconfig"), PathBuf::from)
}

/// Runs `deploy/verify.sh` with its renderings kept in `out`, failing with its output if it fails.
fn run_verify(out: &Path) {
    let script = support::repo_root().join("deploy/verify.sh");
    let output = Command::new("bash")
        .arg(&script)
        .env("KUBECONFIG", kubeconfig())
        .env("VERIFY_OUT", out)
        .output()
        .expect("running deploy/verify.sh");
    assert!(
        output.status.success(),
        "deploy/verify.sh failed ({})\n--- stdout ---\n{}\n--- stderr ---\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
}

/// Every object of a multi-document YAML rendering.
fn objects(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("valid YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn one<'a>(objs: &'a [Value], kind: &str) -> &'a Value {
    let mut found = objs.iter().filter(|o| o["kind"] == kind);
    let obj = found.next().unwrap_or_else(|| panic!("no {kind} rendered"));
    assert!(found.next().is_none(), "more than one {kind} rendered");
    obj
}

/// (kind, name) of every object but the Namespace; `hashed`: cut off the hash suffix kustomize's
/// configMapGenerator appends to the ConfigMap's name.
fn identities(objs: &[Value], hashed: bool) -> BTreeSet<(String, String)> {
    objs.iter()
        .filter(|o| o["kind"] != "Namespace")
        .map(|o| {
            let kind = o["kind"].as_str().unwrap().to_owned();
            let mut name = o["metadata"]["name"].as_str().unwrap().to_owned();
            if hashed
                && kind == "ConfigMap"
                && let Some((base, _hash)) = name.rsplit_once('-')
            {
                name = base.to_owned();
            }
            (kind, name)
        })
        .collect()
}

/// Checks the Deployment reads the rendered ConfigMap's file, and returns the hub `Config` it holds
/// (loaded exactly as `metahook run --config` loads it, validation included).
fn deployed_config(objs: &[Value], dir: &Path) -> Config {
    let deployment = one(objs, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(args[..3], ["run", "--config", "/etc/metahook/metahook.yaml"], "args: {args:?}");

    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/etc/metahook")
        .expect("a volume mounted at /etc/metahook");
    let volume =
        pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == mount["name"]).expect("the mounted volume");
    let configmap = one(objs, "ConfigMap");
    assert_eq!(volume["configMap"]["name"], configmap["metadata"]["name"], "the Deployment mounts the ConfigMap");

    let text = configmap["data"]["metahook.yaml"].as_str().expect("ConfigMap key metahook.yaml");
    let file = dir.join("metahook.yaml");
    std::fs::write(&file, text).unwrap();
    Config::load(Some(&file), &ConfigOverrides::default())
        .unwrap_or_else(|e| panic!("the rendered config does not load: {e}\n{text}"))
}

fn check_hardened(objs: &[Value], what: &str) {
    let pod = &one(objs, "Deployment")["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{what}: runAsNonRoot");
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true, "{what}: readOnlyRootFilesystem");
    assert_eq!(container["securityContext"]["allowPrivilegeEscalation"], false, "{what}: allowPrivilegeEscalation");
    assert_eq!(container["securityContext"]["capabilities"]["drop"], serde_json::json!(["ALL"]), "{what}: caps");
    assert!(container["resources"]["requests"].is_object() && container["resources"]["limits"].is_object());
    let env = container["env"].as_array().unwrap();
    assert!(
        env.iter().any(|e| e["name"] == "POD_NAME" && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"),
        "{what}: POD_NAME from the downward API"
    );
}

#[tokio::test]
async fn kustomization_and_chart_render_and_pass_server_side_dry_run() {
    // Starts the local control plane if it is not up; verify.sh only talks to it through kubectl.
    let _client = support::client().await;
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().to_owned();
    tokio::task::spawn_blocking(move || run_verify(&dir)).await.unwrap();

    let image = format!("ghcr.io/metahook/metahook:{}", env!("CARGO_PKG_VERSION"));
    let kustomize = objects(&out.path().join("kustomize.yaml"));
    let helm = objects(&out.path().join("helm-default.yaml"));
    let overrides = objects(&out.path().join("helm-overrides.yaml"));

    // Both defaults ship the documented default config, the same image and the same objects.
    for (what, objs) in [("kustomize", &kustomize), ("helm", &helm)] {
        assert_eq!(deployed_config(objs, out.path()), Config::default(), "{what}: config");
        check_hardened(objs, what);
        let deployment = one(objs, "Deployment");
        assert_eq!(deployment["spec"]["replicas"], 2, "{what}: replicas");
        assert_eq!(deployment["spec"]["strategy"]["type"], "RollingUpdate", "{what}: strategy");
        assert_eq!(deployment["spec"]["template"]["spec"]["containers"][0]["image"], image.as_str(), "{what}: image");
        check_leader_election(objs, what);
        check_least_privilege(objs, what);
        assert_eq!(one(objs, "PodDisruptionBudget")["spec"]["maxUnavailable"], 1, "{what}: PDB");
        let service = one(objs, "Service");
        assert_eq!(service["spec"]["ports"][0]["port"], 9999, "{what}: metrics Service");
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["readinessProbe"]["httpGet"]["port"], "metrics", "{what}: probes beside /metrics");
        assert!(
            objs.iter().all(|o| !o["metadata"]["name"].as_str().unwrap_or_default().ends_with("cluster-admin-like"))
        );
    }
    assert_eq!(identities(&kustomize, true), identities(&helm, false), "kustomize and helm install the same objects");
    let namespace = one(&kustomize, "Namespace");
    assert_eq!(namespace["metadata"]["name"], "metahook");

    // The overrides reach the hub: config map values, extra args and env, image.
    let config = deployed_config(&overrides, out.path());
    assert_eq!(config.workers, 10);
    assert_eq!(config.discovery_interval.as_secs(), 15);
    assert_eq!(config.target_label_selector, "shard=a");
    assert_eq!(config.field_manager, "metahook-shard-a");
    assert_eq!(config.backoff_max, Config::default().backoff_max, "unset keys keep their defaults");
    check_hardened(&overrides, "helm overrides");
    let container = &one(&overrides, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "registry.example.com/mirror/metahook:0.1.0-custom");
    assert_eq!(container["args"].as_array().unwrap().last().unwrap(), "--workers=8");
    assert!(container["env"].as_array().unwrap().iter().any(|e| e["name"] == "METAHOOK_LOG"));
    assert_eq!(config.leader_election.lease_duration.as_secs(), 30);
    assert_eq!(config.leader_election.renew_deadline.as_secs(), 20);
    assert_eq!(one(&overrides, "Deployment")["spec"]["replicas"], 3);
    // healthProbeAddress puts the probes on their own port, and the chart points them there.
    assert_eq!(config.health_probe_address.as_deref(), Some(":8081"));
    let ports: Vec<(&str, i64)> = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["containerPort"].as_i64().unwrap()))
        .collect();
    assert_eq!(ports, [("metrics", 9999), ("probes", 8081)]);
    assert_eq!(container["livenessProbe"]["httpGet"]["port"], "probes");
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], "probes");
    let admin = overrides
        .iter()
        .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == "hub-cluster-admin-like")
        .expect("rbac.mode=cluster-admin-like ships a */*/* role");
    assert_eq!(admin["metadata"]["labels"][metahook::tools::rbac::AGGREGATE_LABEL], "true");
    assert_eq!(admin["rules"], serde_json::json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]));
    check_leader_election(&overrides, "helm overrides");
}

/// Every replica elects: `--leader-elect`, the Lease in the Pod's namespace, and a Role for exactly that Lease.
fn check_leader_election(objs: &[Value], what: &str) {
    let pod = &one(objs, "Deployment")["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(args.contains(&"--leader-elect"), "{what}: {args:?}");
    let lease = args
        .iter()
        .find_map(|a| a.strip_prefix("--leader-elect-lease-name="))
        .map_or_else(|| Config::default().leader_election.lease_name, str::to_owned);
    let env = container["env"].as_array().unwrap();
    assert!(
        env.iter()
            .any(|e| e["name"] == "POD_NAMESPACE" && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"),
        "{what}: POD_NAMESPACE from the downward API"
    );
    let role = one(objs, "Role");
    let rules = serde_json::to_value(metahook::tools::rbac::lease_rules(&lease)).unwrap();
    assert_eq!(role["rules"], rules, "{what}: the Lease Role is what metahook::tools::rbac::lease_rules says");
    let binding = one(objs, "RoleBinding");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"], "{what}: RoleBinding");
    assert_eq!(binding["subjects"][0]["name"], pod["serviceAccountName"], "{what}: bound to the hub's ServiceAccount");
}

/// The hub's ClusterRole aggregates by label, and the shipped base role is `metahook rbac --base`'s.
fn check_least_privilege(objs: &[Value], what: &str) {
    let roles: Vec<&Value> = objs.iter().filter(|o| o["kind"] == "ClusterRole").collect();
    let binding = one(objs, "ClusterRoleBinding");
    let hub =
        roles.iter().find(|r| r["metadata"]["name"] == binding["roleRef"]["name"]).expect("the bound ClusterRole");
    assert_eq!(
        hub["aggregationRule"]["clusterRoleSelectors"][0]["matchLabels"][metahook::tools::rbac::AGGREGATE_LABEL],
        "true",
        "{what}: the hub's ClusterRole aggregates labelled roles"
    );
    assert!(hub.get("rules").is_none_or(Value::is_null), "{what}: no rules of its own");
    let base = roles
        .iter()
        .find(|r| r["metadata"]["name"].as_str().is_some_and(|n| n.ends_with("-base")))
        .expect("the base role");
    assert_eq!(base["metadata"]["labels"][metahook::tools::rbac::AGGREGATE_LABEL], "true");
    assert_eq!(base["rules"], serde_json::to_value(metahook::tools::rbac::base_rules()).unwrap(), "{what}: base rules");
}

/// The Grafana dashboard in deploy/ queries only metrics the hub exports.
#[test]
fn grafana_dashboard_queries_only_exported_metrics() {
    let path = support::repo_root().join("deploy/grafana/metahook.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let metrics = metahook::engine::metrics::Metrics::default();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    // Families render once they have a sample.
    metrics
        .controller("CompositeController", "c")
        .record(std::time::Duration::ZERO, metahook::engine::metrics::Outcome::Success);
    let _queue = metrics.queue("CompositeController", "c");
    metrics.apply.record("Pod", "created");
    let mut families = metahook::ops::metrics::family_names(&registry);
    families.extend(metahook::ops::metrics::SCRAPE_TIME_FAMILIES.iter().map(|f| (*f).to_owned()));
    let mut queried = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("metahook_")
                    || word.starts_with("controller_runtime_")
                    || word.starts_with("workqueue_")
                    || word.starts_with("leader_election")
                {
                    queried.insert(word.to_owned());
                }
            }
        }
    }
    assert!(!queried.is_empty());
    for name in &queried {
        let base =
            ["_bucket", "_count", "_sum", "_total"].iter().fold(name.as_str(), |n, s| n.strip_suffix(s).unwrap_or(n));
        assert!(families.contains(base), "the dashboard queries {name}, which the hub does not export: {families:?}");
    }
}

/// values.schema.json rejects unknown `config` keys at install time, so it must know every key the hub
/// reads, and no other.
#[test]
fn chart_values_schema_knows_exactly_the_hub_config_keys() {
    let path = support::repo_root().join("deploy/helm/metahook/values.schema.json");
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let config = &schema["properties"]["config"];
    assert_eq!(config["additionalProperties"], false);
    let in_schema: BTreeSet<&str> = config["properties"].as_object().unwrap().keys().map(String::as_str).collect();
    let hub = serde_json::to_value(Config::default()).unwrap();
    let in_hub: BTreeSet<&str> = hub.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(in_schema, in_hub, "deploy/helm/metahook/values.schema.json vs metahook::ops::config::Config");
}
