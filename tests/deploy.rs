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
use std::time::Duration;

use metahook::ops::config::{Config, ConfigOverrides};
use metahook::ops::yaml;
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
    yaml::from_documents(&text).expect("valid YAML")
}

fn one<'a>(objs: &'a [Value], kind: &str) -> &'a Value {
    let mut found = objs.iter().filter(|o| o["kind"] == kind);
    let obj = found.next().unwrap_or_else(|| panic!("no {kind} rendered"));
    assert!(found.next().is_none(), "more than one {kind} rendered");
    obj
}

/// The name kustomize's configMapGenerator gives the hub's config (the content hash appended), as Helm
/// names it.
fn unhashed(name: &str) -> &str {
    if name.strip_prefix("metahook-config-").is_some_and(|hash| hash.len() == 10) { "metahook-config" } else { name }
}

/// An object as both installers must render it, once what legitimately differs is taken out: the labels
/// only Helm sets (`helm.sh/chart`, `app.kubernetes.io/managed-by`, `app.kubernetes.io/version`), the
/// CRDs' labels (Helm installs `crds/` untemplated), the config checksum that rolls Helm's Pods (kustomize
/// rolls them by the hash in the ConfigMap's name, cut off here) and the config file's text (kustomize
/// copies config/metahook.yaml with its comments, Helm renders `config` as YAML: compared as data).
fn normalised(mut obj: Value) -> Value {
    let kind = obj["kind"].as_str().unwrap_or_default().to_owned();
    let metadata = obj["metadata"].as_object_mut().expect("metadata");
    if let Some(labels) = metadata.get_mut("labels").and_then(Value::as_object_mut) {
        for helm_only in ["helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/version"] {
            labels.remove(helm_only);
        }
    }
    if kind == "CustomResourceDefinition" {
        metadata.remove("labels");
    }
    let name = unhashed(metadata["name"].as_str().unwrap()).to_owned();
    metadata.insert("name".into(), Value::String(name));
    if kind == "ConfigMap"
        && let Some(file) = obj["data"].get_mut("metahook.yaml")
    {
        *file = yaml::from_str(file.as_str().unwrap()).expect("the config file is YAML");
    }
    if kind == "Deployment" {
        let template = &mut obj["spec"]["template"];
        if let Some(annotations) = template["metadata"].get_mut("annotations").and_then(Value::as_object_mut) {
            annotations.remove("checksum/config");
            if annotations.is_empty() {
                template["metadata"].as_object_mut().unwrap().remove("annotations");
            }
        }
        for volume in template["spec"]["volumes"].as_array_mut().into_iter().flatten() {
            if let Some(name) = volume["configMap"]["name"].as_str() {
                volume["configMap"]["name"] = Value::String(unhashed(name).to_owned());
            }
        }
    }
    obj
}

/// Where `a` and `b` first differ, as a JSON pointer, with both values there.
fn first_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                first_difference(
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    &format!("{at}/{k}"),
                )
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (p, q))| first_difference(p, q, &format!("{at}/{i}")))
        }
        _ if a == b => None,
        _ => Some(format!("{at}: kustomize {a}, helm {b}")),
    }
}

/// The kustomization and the chart install the same objects, field by field (see [`normalised`]).
fn assert_same_objects(kustomize: &[Value], helm: &[Value], what: &str) {
    let by_identity = |objs: &[Value]| -> std::collections::BTreeMap<(String, String), Value> {
        objs.iter()
            .filter(|o| o["kind"] != "Namespace") // Helm: --create-namespace
            .map(|o| normalised(o.clone()))
            .map(|o| ((o["kind"].as_str().unwrap().to_owned(), o["metadata"]["name"].as_str().unwrap().to_owned()), o))
            .collect()
    };
    let (k, h) = (by_identity(kustomize), by_identity(helm));
    assert_eq!(
        k.keys().collect::<Vec<_>>(),
        h.keys().collect::<Vec<_>>(),
        "{what}: kustomize and helm install the same objects"
    );
    for (identity, object) in &k {
        if let Some(difference) = first_difference(object, &h[identity], "") {
            panic!("{what}: {identity:?} differs between kustomize and helm at {difference}");
        }
    }
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
    let configmap = objs
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == volume["configMap"]["name"])
        .expect("the Deployment mounts a rendered ConfigMap");

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
        check_spread(deployment, what);
        let service = one(objs, "Service");
        assert_eq!(service["spec"]["ports"][0]["port"], 9999, "{what}: metrics Service");
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["readinessProbe"]["httpGet"]["port"], "metrics", "{what}: probes beside /metrics");
        assert!(
            objs.iter().all(|o| !o["metadata"]["name"].as_str().unwrap_or_default().ends_with("cluster-admin-like"))
        );
    }
    assert_same_objects(&kustomize, &helm, "default");
    assert_same_objects(
        &objects(&out.path().join("kustomize-all.yaml")),
        &objects(&out.path().join("helm-all.yaml")),
        "every component and the values adding the same objects",
    );
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
    // Standalone mode: the ConfigMap named and the chart's own, mounted where controllersFrom reads.
    assert_eq!(config.controllers_from, ["/etc/metahook-controllers/configmap", "/etc/metahook-controllers/chart"]);
    let pod = &one(&overrides, "Deployment")["spec"]["template"]["spec"];
    let volume = |name: &str| pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == name).cloned();
    assert_eq!(volume("controllers-configmap").unwrap()["configMap"]["name"], "team-controllers");
    assert_eq!(volume("controllers-chart").unwrap()["configMap"]["name"], "hub-controllers");
    let mounts: Vec<&str> =
        container["volumeMounts"].as_array().unwrap().iter().filter_map(|m| m["mountPath"].as_str()).collect();
    assert!(
        mounts.contains(&"/etc/metahook-controllers/configmap") && mounts.contains(&"/etc/metahook-controllers/chart")
    );
    let rendered = overrides
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "hub-controllers")
        .expect("the controllers value renders a ConfigMap");
    let text = rendered["data"]["controllers.yaml"].as_str().unwrap().to_owned();
    let read = metahook::ops::files::parse(&[("controllers.yaml".to_owned(), text)])
        .expect("the hub reads what the chart renders");
    assert_eq!((read.composites.len(), read.decorators.len()), (1, 1));
    assert!(container["env"].as_array().unwrap().iter().any(|e| e["name"] == "POD_UID"), "Events name the Pod by UID");
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
    let admin_binding = overrides
        .iter()
        .find(|o| o["kind"] == "ClusterRoleBinding" && o["roleRef"]["name"] == "hub-cluster-admin-like")
        .expect("rbac.mode=cluster-admin-like binds its */*/* role");
    assert_eq!(admin_binding["subjects"][0]["kind"], "ServiceAccount");
    assert_eq!(admin["rules"], serde_json::json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]));
    check_leader_election(&overrides, "helm overrides");
    // The optional objects the overrides enable, as given.
    let policy = one(&overrides, "NetworkPolicy");
    assert_eq!(policy["spec"]["policyTypes"], serde_json::json!(["Ingress", "Egress"]), "egress rules restrict egress");
    assert_eq!(policy["spec"]["egress"].as_array().unwrap().len(), 2);
    assert_eq!(policy["spec"]["ingress"][0]["ports"], serde_json::json!([{"port": "metrics"}]));
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"],
        one(&overrides, "Deployment")["spec"]["selector"]["matchLabels"],
        "the policy is the hub's"
    );
    let dashboard = overrides
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "hub-grafana-dashboard")
        .expect("metrics.grafanaDashboard.enabled ships the dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1", "the label Grafana's sidecar looks for");
    assert_eq!(dashboard["metadata"]["annotations"]["grafana_folder"], "Kubernetes");
    let shipped: Value = serde_json::from_str(dashboard["data"]["metahook.json"].as_str().unwrap()).unwrap();
    let source = std::fs::read_to_string(support::repo_root().join("deploy/grafana/metahook.json")).unwrap();
    assert_eq!(shipped, serde_json::from_str::<Value>(&source).unwrap(), "the dashboard of deploy/grafana/");
    let spread = &one(&overrides, "Deployment")["spec"]["template"]["spec"]["topologySpreadConstraints"];
    assert_eq!(spread.as_array().unwrap().len(), 1, "the value replaces the default constraints");
    assert_eq!(spread[0]["whenUnsatisfiable"], "DoNotSchedule");
    assert_eq!(spread[0]["labelSelector"]["matchLabels"]["app.kubernetes.io/component"], "hub", "filled in");
}

/// Replicas spread over nodes and zones, softly, each constraint counting exactly the hub's Pods.
fn check_spread(deployment: &Value, what: &str) {
    let pod = &deployment["spec"]["template"];
    let constraints = pod["spec"]["topologySpreadConstraints"].as_array().expect("topologySpreadConstraints");
    let keys: Vec<&str> = constraints.iter().map(|c| c["topologyKey"].as_str().unwrap()).collect();
    assert_eq!(keys, ["kubernetes.io/hostname", "topology.kubernetes.io/zone"], "{what}");
    for constraint in constraints {
        assert_eq!(constraint["whenUnsatisfiable"], "ScheduleAnyway", "{what}: a small cluster still runs both");
        assert_eq!(constraint["labelSelector"]["matchLabels"], deployment["spec"]["selector"]["matchLabels"], "{what}");
    }
    let selector = deployment["spec"]["selector"]["matchLabels"].as_object().unwrap();
    assert!(selector.iter().all(|(k, v)| pod["metadata"]["labels"][k] == *v), "{what}: the selector selects the Pods");
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

/// The hub's ClusterRole aggregates by label, and the shipped base role is `metahook rbac --base`'s,
/// bound directly: no role the release ships is aggregated (an aggregated role deleted with a role it
/// selects can be re-created by Kubernetes' aggregation controller, and outlive the release).
fn check_least_privilege(objs: &[Value], what: &str) {
    let roles: Vec<&Value> = objs.iter().filter(|o| o["kind"] == "ClusterRole").collect();
    let bindings: Vec<&Value> = objs.iter().filter(|o| o["kind"] == "ClusterRoleBinding").collect();
    let bound = |suffix: &str| {
        bindings
            .iter()
            .find(|b| b["roleRef"]["name"].as_str().is_some_and(|n| n.ends_with(suffix)))
            .unwrap_or_else(|| panic!("{what}: no binding of a ClusterRole named *{suffix}"))
    };
    let binding = bindings
        .iter()
        .find(|b| {
            roles.iter().any(|r| r["metadata"]["name"] == b["roleRef"]["name"] && r.get("aggregationRule").is_some())
        })
        .expect("the binding of the hub's aggregated ClusterRole");
    let hub =
        roles.iter().find(|r| r["metadata"]["name"] == binding["roleRef"]["name"]).expect("the bound ClusterRole");
    for role in &roles {
        assert!(
            role["metadata"]["labels"].get(metahook::tools::rbac::AGGREGATE_LABEL).is_none(),
            "{what}: {} is aggregated into the hub's role; the release binds its own roles directly",
            role["metadata"]["name"]
        );
    }
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
    assert_eq!(bound("-base")["subjects"], binding["subjects"], "{what}: the base role is bound to the hub");
    assert_eq!(base["rules"], serde_json::to_value(metahook::tools::rbac::base_rules()).unwrap(), "{what}: base rules");
}

/// Aggregation operators, which take their operand after a `by (...)`/`without (...)` clause as well as
/// right away, and PromQL's keywords: never metric names.
const PROMQL_WORDS: [&str; 25] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
];

/// The metric names a PromQL expression reads: identifiers followed by `{`, `[` or used bare; not
/// functions (followed by `(`), aggregations, keywords, the label lists of `by`/`without`/`on`/
/// `ignoring`/`group_left`/`group_right`, or anything inside a string, a label matcher `{...}`, a range or
/// subquery `[...]` or a comment.
fn promql_metrics(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    // The index after the string starting at `i` (its quote), or after the bracketed group `open`…`close`.
    let skip_string = |mut i: usize| {
        let quote = chars[i];
        i += 1;
        while i < chars.len() && chars[i] != quote {
            i += if chars[i] == '\\' && quote != '`' { 2 } else { 1 };
        }
        i + 1
    };
    let skip_group = |mut i: usize, close: char| {
        i += 1;
        while i < chars.len() && chars[i] != close {
            i = if matches!(chars[i], '"' | '\'' | '`') { skip_string(i) } else { i + 1 };
        }
        i + 1
    };
    let next_char = |mut i: usize| {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        (i, chars.get(i).copied())
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => i = skip_string(i),
            '{' => i = skip_group(i, '}'),
            '[' => i = skip_group(i, ']'),
            '#' => i = chars[i..].iter().position(|&c| c == '\n').map_or(chars.len(), |n| i + n),
            '0'..='9' | '.' => {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let (after, next) = next_char(i);
                if ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&word.as_str())
                    && next == Some('(')
                {
                    i = skip_group(after, ')'); // label names
                } else if next != Some('(')
                    && !PROMQL_WORDS.contains(&word.as_str())
                    && !["inf", "nan"].contains(&word.to_ascii_lowercase().as_str())
                {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[test]
fn the_promql_tokenizer_finds_exactly_the_metrics() {
    let expr = r#"sum by (controller, le) (rate(a_bucket{job=~"$job", x="}{[b]"}[$__rate_interval]))
        / on (job) group_left (pod) b_total or absent(c) > 0.5 offset 5m and sum without(x)(d[5m:1m])
        # e_in_a_comment
        unless topk(3, f) * inf"#;
    let found: Vec<String> = promql_metrics(expr).into_iter().collect();
    assert_eq!(found, ["a_bucket", "b_total", "c", "d", "f"]);
}

/// Every PromQL expression of the dashboard (panels, nested in rows too, and the variables' queries) and
/// of the alert rules, with where it is.
fn promql_expressions() -> Vec<(String, String)> {
    fn panels(list: &Value, out: &mut Vec<(String, String)>) {
        for panel in list.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push((format!("dashboard panel {:?}", panel["title"]), expr.to_owned()));
                }
            }
            panels(&panel["panels"], out);
        }
    }
    let root = support::repo_root();
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("deploy/grafana/metahook.json")).unwrap()).unwrap();
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        // Grafana's label_values(<selector>, <label>): the selector is PromQL.
        if let Some(args) = variable["query"].as_str().and_then(|q| q.strip_prefix("label_values(")) {
            let selector = args.rsplit_once(',').map_or("", |(selector, _label)| selector);
            out.push((format!("dashboard variable {}", variable["name"]), selector.to_owned()));
        }
    }
    for (group, rule) in alert_rules() {
        out.push((format!("rule group {group} alert {}", rule["alert"]), rule["expr"].as_str().unwrap().to_owned()));
    }
    out
}

/// (group name, rule) of every rule in deploy/prometheus/metahook.rules.yaml.
fn alert_rules() -> Vec<(String, Value)> {
    let text = std::fs::read_to_string(support::repo_root().join("deploy/prometheus/metahook.rules.yaml")).unwrap();
    let file: Value = yaml::from_str(&text).unwrap();
    file["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| {
            g["rules"].as_array().unwrap().iter().map(|r| (g["name"].as_str().unwrap().to_owned(), r.clone()))
        })
        .collect()
}

/// The sample names a `/metrics` page has or declares: every sample's, and those its `# TYPE` lines
/// promise (a counter `x` is sampled as `x_total`, a histogram as `x_bucket`, `x_sum`, `x_count`).
fn served_names(page: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in page.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let mut words = declared.split_whitespace();
            let (Some(family), Some(kind)) = (words.next(), words.next()) else { continue };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["", "_sum", "_count"],
                "info" => &["_info"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{family}{s}")));
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

/// The dashboard and the alerts read only metrics a running hub serves: a hub with leader election and
/// one controller that has synced a parent through its hook (so labelled families have samples), scraped.
#[tokio::test]
async fn dashboard_and_alerts_use_only_metrics_a_running_hub_serves() {
    let expressions = promql_expressions();
    let mut used: Vec<(String, String)> = Vec::new();
    for (place, expr) in &expressions {
        let names = promql_metrics(expr);
        assert!(!names.is_empty(), "{place}: no metric found in {expr}");
        used.extend(names.into_iter().map(|n| (n, place.clone())));
    }

    let mut w = support::World::new("deploy_metrics", GREETER).await;
    w.stop_hub().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let address = format!("127.0.0.1:{port}");
    let config = Config {
        metrics_address: address.clone(),
        leader_election: metahook::ops::config::LeaderElection {
            enabled: true,
            lease_name: w.label.clone(),
            lease_namespace: w.ns.name.clone(),
            ..Config::default().leader_election
        },
        ..Config::default()
    };
    // The hub's client as `metahook run` builds it, so its API requests are counted (rest_client_*).
    let client = metahook::ops::client::connect(support::config().await).unwrap();
    w.start_hub_with(&client, config);
    w.composite(serde_json::json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    }))
    .await;
    w.thing("scraped", serde_json::json!({})).await;
    support::eventually(Duration::from_secs(60), || async { w.config_map("scraped-cm").await }).await;
    let page = support::eventually(Duration::from_secs(30), || async {
        let (_, page) = support::http_get(&address, "/metrics").await?;
        (page.contains("leader_election_master_status{") && page.contains("_bucket{")).then_some(page)
    })
    .await;
    w.finish("CompositeController").await;

    let served = served_names(&page);
    let missing: Vec<String> = used
        .iter()
        .filter(|(name, _)| !served.contains(name))
        .map(|(name, place)| format!("{name} ({place})"))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert!(missing.is_empty(), "not served by a running hub:\n  {}\n--- /metrics ---\n{page}", missing.join("\n  "));
}

const GREETER: &str = r#"
def sync(req):
    parent = req["parent"]
    return {"status": {}, "children": [{"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": parent["metadata"]["name"] + "-cm"}, "data": {"greeting": "hi"}}]}
"#;

/// GitHub's (and mdBook's) anchor of a Markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c.to_ascii_lowercase()),
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

/// Every alert says what broke and why it matters, and points to a runbook that exists: a section of a
/// page of the book, by its anchor (tests/docs.rs checks the book's own links, not these URLs).
#[test]
fn every_alert_has_a_summary_a_description_and_a_runbook_that_exists() {
    let rules = alert_rules();
    let alerts: BTreeSet<&str> = rules.iter().filter_map(|(_, r)| r["alert"].as_str()).collect();
    for wanted in ["MetahookNoLeader", "MetahookHookErrorRatioHigh", "MetahookWorkQueueStuck", "MetahookSyncAgeHigh"] {
        assert!(alerts.contains(wanted), "no alert {wanted}: {alerts:?}");
    }
    for (_, rule) in &rules {
        let alert = rule["alert"].as_str().expect("only alerting rules");
        let annotations = &rule["annotations"];
        for key in ["summary", "description"] {
            assert!(annotations[key].as_str().is_some_and(|t| t.len() > 20), "{alert}: no {key}");
        }
        assert!(rule["for"].is_string(), "{alert}: fires only after a while (for:)");
        assert!(["warning", "critical"].contains(&rule["labels"]["severity"].as_str().unwrap_or_default()), "{alert}");
        let url = annotations["runbook_url"].as_str().unwrap_or_else(|| panic!("{alert}: no runbook_url"));
        let (page, fragment) = url
            .strip_prefix("https://github.com/metahook/metahook/blob/main/")
            .and_then(|rest| rest.split_once('#'))
            .unwrap_or_else(|| panic!("{alert}: runbook_url {url} is not a section of a file in this repository"));
        let text = std::fs::read_to_string(support::repo_root().join(page))
            .unwrap_or_else(|e| panic!("{alert}: runbook page {page}: {e}"));
        let anchors: BTreeSet<String> =
            text.lines().filter(|l| l.starts_with('#')).map(|l| anchor(l.trim_start_matches('#'))).collect();
        assert!(anchors.contains(fragment), "{alert}: {page} has no section #{fragment}: {anchors:?}");
        assert_eq!(fragment, alert.to_ascii_lowercase(), "{alert}: its runbook is the section named after it");
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

/// One key of values.yaml: its dotted path, the comment block just above it (or, for a key right below a
/// sibling without a blank line between, that sibling's: `backoffBase`/`backoffMax`), and its keys.
#[derive(Debug, Default)]
struct ValueKey {
    path: String,
    doc: String,
    children: Vec<ValueKey>,
}

/// The keys of a values.yaml with their comments, read line by line (a YAML reader drops comments).
fn value_keys(text: &str) -> Vec<ValueKey> {
    // (indent, key) for every key line, with its doc.
    let mut flat: Vec<(usize, String, String)> = Vec::new();
    let mut comment: Vec<String> = Vec::new();
    // The doc of the previous key line, and its indent, while no blank line came since.
    let mut previous: Option<(usize, String)> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.is_empty() {
            comment.clear();
            previous = None;
        } else if let Some(text) = trimmed.strip_prefix('#') {
            comment.push(text.strip_prefix(' ').unwrap_or(text).to_owned());
        } else if let Some((key, _)) = trimmed.split_once(':').filter(|(k, _)| !k.starts_with('-') && !k.contains(' '))
        {
            let doc = if comment.is_empty() {
                previous.as_ref().filter(|(i, _)| *i == indent).map(|(_, d)| d.clone()).unwrap_or_default()
            } else {
                comment.join(" ")
            };
            comment.clear();
            previous = Some((indent, doc.clone()));
            flat.push((indent, key.trim_matches('"').to_owned(), doc));
        } else {
            comment.clear(); // a list item or a continued value
        }
    }
    fn nest(flat: &[(usize, String, String)], i: &mut usize, indent: usize, prefix: &str) -> Vec<ValueKey> {
        let mut keys = Vec::new();
        while *i < flat.len() && flat[*i].0 == indent {
            let (_, key, doc) = &flat[*i];
            let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
            *i += 1;
            let children = match flat.get(*i) {
                Some((deeper, ..)) if *deeper > indent => nest(flat, i, *deeper, &path),
                _ => Vec::new(),
            };
            keys.push(ValueKey { path, doc: doc.clone(), children });
        }
        keys
    }
    nest(&flat, &mut 0, 0, "")
}

/// The Markdown table of the chart README: a row per value (a documented map whose keys have no comments
/// of their own is one row, its default the whole map), each with its default from values.yaml and its
/// comment. Panics naming the values without a comment.
fn values_table(text: &str) -> String {
    fn rows(keys: &[ValueKey], defaults: &Value, out: &mut Vec<String>, undocumented: &mut Vec<String>) {
        for key in keys {
            let documented_children = key.children.iter().any(|c| !c.doc.is_empty());
            if !key.children.is_empty() && (documented_children || key.doc.is_empty()) {
                rows(&key.children, defaults, out, undocumented);
                continue;
            }
            if key.doc.is_empty() {
                undocumented.push(key.path.clone());
            }
            let pointer = format!("/{}", key.path.replace('.', "/"));
            let default = serde_json::to_string(defaults.pointer(&pointer).unwrap_or(&Value::Null)).unwrap();
            let cell = |s: &str| s.replace('|', "\\|");
            let text = cell(&key.doc).replace('<', "&lt;").replace('>', "&gt;"); // `<name>` is not a tag
            out.push(format!("| `{}` | `{}` | {text} |", key.path, cell(&default)));
        }
    }
    let defaults: Value = yaml::from_str(text).expect("values.yaml is YAML");
    let mut out = vec!["| Key | Default | Description |".to_owned(), "|---|---|---|".to_owned()];
    let mut undocumented = Vec::new();
    rows(&value_keys(text), &defaults, &mut out, &mut undocumented);
    assert!(undocumented.is_empty(), "values.yaml: no comment above {undocumented:?}");
    out.join("\n") + "\n"
}

#[test]
fn the_values_table_reads_every_key_and_its_comment() {
    let values = "# Header, not a key's.\n\n# How many.\nreplicas: 2\n# The image.\nimage:\n  # Where.\n  repository: r\n  \
                  tag: \"\"\n# Opaque.\nresources:\n  limits:\n    cpu: \"1\"\nlist:\n  # Items.\n  items:\n  - a\n";
    assert_eq!(
        values_table(values),
        "| Key | Default | Description |\n|---|---|---|\n| `replicas` | `2` | How many. |\n\
         | `image.repository` | `\"r\"` | Where. |\n| `image.tag` | `\"\"` | Where. |\n\
         | `resources` | `{\"limits\":{\"cpu\":\"1\"}}` | Opaque. |\n| `list.items` | `[\"a\"]` | Items. |\n"
    );
    let undocumented = std::panic::catch_unwind(|| values_table("# Documented.\na: 1\n\nb: 2\n"));
    assert!(undocumented.is_err(), "a value without a comment is refused");
}

const README_BEGIN: &str = "<!-- BEGIN generated from values.yaml by tests/deploy.rs (make chart-readme); edit the comments in values.yaml, not this table. -->\n";
const README_END: &str = "<!-- END generated from values.yaml -->\n";

/// deploy/helm/metahook/README.md lists every value of the chart with its default and comment, as
/// generated from values.yaml; `METAHOOK_UPDATE_CHART_README=1` (`make chart-readme`) rewrites it.
#[test]
fn chart_readme_lists_every_value_as_values_yaml_says() {
    let chart = support::repo_root().join("deploy/helm/metahook");
    let table = values_table(&std::fs::read_to_string(chart.join("values.yaml")).unwrap());
    let path = chart.join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let (head, rest) = readme.split_once(README_BEGIN).expect("the README's BEGIN marker");
    let (current, tail) = rest.split_once(README_END).expect("the README's END marker");
    if current == table {
        return;
    }
    if std::env::var_os("METAHOOK_UPDATE_CHART_README").is_some() {
        std::fs::write(&path, format!("{head}{README_BEGIN}{table}{README_END}{tail}")).unwrap();
        return;
    }
    panic!("{} is stale: run `make chart-readme`\n--- generated ---\n{table}", path.display());
}
