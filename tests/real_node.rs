//! The add-on on a real node (`tests/cluster/node-up.sh`: kubelet, containerd, runc, CNI, kube-proxy and
//! CoreDNS beside the fake kwok nodes): the hub installed from its Helm chart and from the kustomization,
//! running as Pods under its ServiceAccount, found through Services and DNS; the example hooks as
//! Deployments behind Services, called by `service:` references; the Pods hooks ask for really running.
//! Nothing here is a process on the host but the node itself.
//!
//! Every namespace of these tests is annotated for the PodNodeSelector and PodTolerationRestriction
//! admission plugins (the API server runs them), so all its Pods — the hub's, the hooks', and those a
//! hook asks for, none of which say so — go to the real node and nowhere else; the node's taint keeps
//! every other test's Pods off it. Images are built here from the test build's binary and Debian
//! packages, and imported into the node's containerd: a Pod whose image is missing fails the test with
//! the image's name at once.
//!
//! The chart's hub runs in `metahook-node`, whose ServiceAccounts the API server audits
//! (`tests/cluster/audit-policy.yaml`): the failover and upgrade steps count the hub's writes there.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use metahook::ops::yaml;
use serde_json::{Value, json};

/// The namespace of the chart's release (audited).
const RELEASE_NS: &str = "metahook-node";
const RELEASE: &str = "metahook-node";
/// The taint and label of the real node (node-up.sh).
const NODE_KEY: &str = "metahook.dev/real-node";

// ---- the node and the tools ---------------------------------------------------------------------

struct Node {
    containerd_sock: String,
    name: String,
}

/// The real node, started once per test binary (node-up.sh reuses a running one), and helm built.
fn node() -> &'static Node {
    static NODE: OnceLock<Node> = OnceLock::new();
    NODE.get_or_init(|| {
        support::kubeconfig_path();
        let root = support::repo_root();
        let status = Command::new("bash").arg(root.join("tests/cluster/node-up.sh")).status().expect("node-up.sh");
        assert!(status.success(), "tests/cluster/node-up.sh failed; see .cluster/logs/");
        let status = Command::new("bash").arg(root.join("deploy/helm/tools/build.sh")).status().expect("helm build");
        assert!(status.success(), "deploy/helm/tools/build.sh failed");
        let env = std::fs::read_to_string(root.join(".cluster/node/env")).expect(".cluster/node/env");
        let env: BTreeMap<&str, &str> = env.lines().filter_map(|l| l.split_once('=')).collect();
        Node { containerd_sock: env["NODE_CONTAINERD_SOCK"].to_owned(), name: env["NODE_NAME"].to_owned() }
    })
}

fn bin(name: &str) -> PathBuf {
    support::repo_root().join("tests/cluster/bin").join(name)
}

/// Runs a command, returning its stdout; panics with its stderr when it fails.
fn run(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn kubectl(args: &[&str]) -> String {
    run(Command::new(bin("kubectl")).env("KUBECONFIG", support::kubeconfig_path()).args(args))
}

fn kubectl_json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&kubectl(&all)).unwrap()
}

/// A stream of documents for kubectl's stdin: JSON documents separated by `---` (not a `List`, which
/// kubectl validates on the client, against its own older idea of a CRD's schema).
fn stream(docs: &[Value]) -> String {
    docs.iter().map(Value::to_string).collect::<Vec<_>>().join("\n---\n")
}

/// `kubectl apply --server-side` of documents.
fn apply(docs: &[Value]) {
    let mut child = Command::new(bin("kubectl"))
        .env("KUBECONFIG", support::kubeconfig_path())
        .args(["apply", "--server-side", "--force-conflicts", "--field-manager=real-node-test", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stream(docs).as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "kubectl apply: {}", String::from_utf8_lossy(&output.stderr));
}

fn helm(args: &[&str]) -> String {
    run(Command::new(bin("helm")).env("KUBECONFIG", support::kubeconfig_path()).args(args))
}

fn yaml_docs(text: &str) -> Vec<Value> {
    yaml::from_documents(text).expect("valid YAML")
}

/// Polls `check` every half second until it gives a value; panics naming `what` after `timeout`.
fn wait<T>(timeout: Duration, what: &str, check: impl FnMut() -> Option<T>) -> T {
    wait_or_explain(timeout, what, String::new, check)
}

/// [`wait`], and on a timeout the panic carries what `explain` says of the state that was waited on.
fn wait_or_explain<T>(
    timeout: Duration,
    what: &str,
    explain: impl FnOnce() -> String,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}\n{}", explain());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// What went on in `namespace` and in the hub that should have acted there, for a failure's message:
/// the namespace's objects and Events, the controllers' status, the hub's last log lines, and the
/// kubelet's lines about `pod`. Best effort: a command that fails says so in place.
fn explain(namespace: &str, hub_namespace: &str, hub_selector: &str, pod: &str) -> String {
    let show = |args: &[&str]| -> String {
        match Command::new(bin("kubectl")).env("KUBECONFIG", support::kubeconfig_path()).args(args).output() {
            Ok(out) => format!(
                "$ kubectl {}\n{}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(err) => format!("$ kubectl {}: {err}\n", args.join(" ")),
        }
    };
    let mut text = String::new();
    text += &show(&["get", "all", "-n", namespace, "-o", "wide"]);
    text += &show(&["get", "pod", "-n", namespace, pod, "-o", "yaml"]);
    text += &show(&["get", "events", "-n", namespace, "--sort-by=.lastTimestamp"]);
    text += &show(&["get", "endpointslices", "-n", namespace, "-o", "wide"]);
    text += &show(&["logs", "-n", namespace, "-l", "app.kubernetes.io/name=hello-world-hook", "--prefix", "--tail=40"]);
    text +=
        &show(&["get", "compositecontrollers", "-o", "custom-columns=NAME:.metadata.name,READY:.status.conditions"]);
    text += &show(&["get", "pods", "-n", hub_namespace, "-l", hub_selector, "-o", "wide"]);
    text += &show(&["logs", "-n", hub_namespace, "-l", hub_selector, "--prefix", "--tail=80"]);
    // A fresh connection to the hook's Service from a Pod on the node, beside the hub's pooled ones.
    let probe = format!("probe-{}", support::unique_suffix());
    let url = format!("http://hello-world.{namespace}:8080/sync");
    let script = format!("nslookup hello-world.{namespace}; wget -S -O- --post-data='{{}}' {url} 2>&1; true");
    apply(&[json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": probe, "namespace": namespace},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "run", "image": "busybox", "command": ["sh", "-c", script]}]},
    })]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline
        && !matches!(
            kubectl_json(&["get", "pod", "-n", namespace, &probe])["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        )
    {
        std::thread::sleep(Duration::from_millis(500));
    }
    text += &show(&["logs", "-n", namespace, &probe]);
    // kube-proxy's rules for the namespace's Services (it runs in the host's network namespace).
    match Command::new("iptables-save").args(["-t", "nat"]).output() {
        Ok(out) => {
            let rules = String::from_utf8_lossy(&out.stdout);
            text += &format!("iptables-save -t nat, lines naming {namespace}:\n");
            for line in rules.lines().filter(|l| l.contains(namespace)) {
                text += line;
                text += "\n";
            }
        }
        Err(err) => text += &format!("iptables-save: {err}\n"),
    }
    let kubelet = support::repo_root().join(".cluster/logs/kubelet.log");
    let lines = std::fs::read_to_string(&kubelet).unwrap_or_default();
    let about: Vec<&str> = lines.lines().filter(|l| l.contains(pod) && l.contains(namespace)).collect();
    text += &format!("kubelet.log, lines about {namespace}/{pod} (last 30):\n");
    for line in &about[about.len().saturating_sub(30)..] {
        text += line;
        text += "\n";
    }
    text
}

/// The hub's image, `ghcr.io/metahook/metahook:<tag>`, built from this test build's binary by
/// `deploy/image/build.sh` and imported into the node's containerd. `epoch` is the image's time: two
/// tags with two epochs are two images (different digests), as two releases are.
fn hub_image(tag: &str, epoch: u64) -> String {
    static BUILT: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let reference = format!("ghcr.io/metahook/metahook:{tag}");
    let mut built = BUILT.lock().unwrap();
    if built.contains(tag) {
        return reference;
    }
    let root = support::repo_root();
    let archive = root.join(format!("target/real-node/metahook-{tag}.tar"));
    run(Command::new("bash")
        .arg(root.join("deploy/image/build.sh"))
        .arg(env!("CARGO_BIN_EXE_metahook"))
        .arg(&archive)
        .env("IMAGE", &reference)
        .env("SOURCE_DATE_EPOCH", epoch.to_string()));
    run(Command::new(bin("ctr"))
        .args(["--address", &node().containerd_sock, "--namespace", "k8s.io", "images", "import"])
        .arg(&archive));
    built.insert(tag.to_owned());
    reference
}

/// The images the example hooks run on (deploy/image/node-images.sh), in place of the stock ones.
fn hook_image(language: &str) -> String {
    let version = std::fs::read_to_string(support::repo_root().join("Cargo.toml"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("version = \"").map(|v| v.trim_end_matches('"').to_owned()))
        .unwrap();
    format!("metahook.local/hooks-{language}:{version}")
}

// ---- namespaces and Pods --------------------------------------------------------------------------

/// A namespace whose Pods all go to the real node (the admission plugins add the node selector and
/// the toleration of its taint).
fn real_node_namespace(name: &str) {
    apply(&[json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "annotations": {
            "scheduler.alpha.kubernetes.io/node-selector": format!("{NODE_KEY}=true"),
            "scheduler.alpha.kubernetes.io/defaultTolerations":
                json!([{"key": NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}]).to_string(),
        }},
    })]);
}

fn delete_namespace(name: &str) {
    kubectl(&["delete", "namespace", name, "--ignore-not-found", "--wait=true", "--timeout=120s"]);
}

/// Fails at once, naming the image, when a Pod of `pods` cannot get its image (nothing is pulled from
/// the internet here: a missing image is a build or import that did not happen).
fn no_missing_images(pods: &[Value]) {
    for pod in pods {
        for status in pod["status"]["containerStatuses"].as_array().into_iter().flatten() {
            let reason = status["state"]["waiting"]["reason"].as_str().unwrap_or_default();
            assert!(
                !matches!(reason, "ErrImagePull" | "ImagePullBackOff" | "ErrImageNeverPull" | "InvalidImageName"),
                "Pod {} cannot get image {}: {reason}: {}",
                pod["metadata"]["name"],
                status["image"],
                status["state"]["waiting"]["message"]
            );
        }
    }
}

fn pods(namespace: &str, selector: &str) -> Vec<Value> {
    kubectl_json(&["get", "pods", "-n", namespace, "-l", selector])["items"].as_array().unwrap().clone()
}

fn ready(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && pod["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

/// Waits for exactly `count` Ready Pods matching `selector`, all on the real node; returns them.
fn ready_pods(namespace: &str, selector: &str, count: usize) -> Vec<Value> {
    wait(Duration::from_secs(180), &format!("{count} Ready Pods {selector} in {namespace}"), || {
        let pods = pods(namespace, selector);
        no_missing_images(&pods);
        let live: Vec<Value> = pods.into_iter().filter(|p| p["metadata"]["deletionTimestamp"].is_null()).collect();
        (live.len() == count && live.iter().all(ready)).then_some(live)
    })
    .into_iter()
    .inspect(|pod| {
        assert_eq!(pod["spec"]["nodeName"], node().name.as_str(), "{} is not on the real node", pod["metadata"]["name"])
    })
    .collect()
}

/// Runs `command` in a busybox Pod on the real node and returns what it printed (`kubectl logs`).
fn busybox(namespace: &str, name: &str, command: &[&str]) -> String {
    apply(&[json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "run", "image": "busybox", "command": command}]},
    })]);
    let phase = wait(Duration::from_secs(120), &format!("Pod {name} to finish"), || {
        let pod = kubectl_json(&["get", "pod", "-n", namespace, name]);
        no_missing_images(std::slice::from_ref(&pod));
        let phase = pod["status"]["phase"].as_str().unwrap_or_default().to_owned();
        matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
    });
    let logs = kubectl(&["logs", "-n", namespace, name]);
    assert_eq!(phase, "Succeeded", "{command:?} in Pod {name} failed:\n{logs}");
    kubectl(&["delete", "pod", "-n", namespace, name, "--wait=false"]);
    logs
}

// ---- the hooks in the cluster ----------------------------------------------------------------------

/// An in-cluster example (examples-*/in-cluster) as the README deploys it, moved to `namespace`, its
/// controller renamed and labelled for the test's hub, its runtime image replaced by ours.
fn in_cluster_example(dir: &str, namespace: &str, label: &str, image: &str) -> (Vec<Value>, String) {
    let rendered = run(Command::new(bin("kubectl"))
        .args(["kustomize", "--load-restrictor", "LoadRestrictionsNone", dir])
        .current_dir(support::repo_root()));
    let mut controller = String::new();
    let mut docs = Vec::new();
    for mut doc in yaml_docs(&rendered) {
        match doc["kind"].as_str().unwrap_or_default() {
            "Namespace" => continue,
            "CustomResourceDefinition" | "ClusterRole" => {}
            "ClusterRoleBinding" | "RoleBinding" => panic!("{dir}: the example binds roles itself"),
            "CompositeController" | "DecoratorController" => {
                controller = format!("{}-{label}", doc["metadata"]["name"].as_str().unwrap());
                doc["metadata"]["name"] = json!(controller);
                doc["metadata"]["labels"] = json!({"metahook-test": label});
                doc["spec"]["parentResource"]["labelSelector"] = json!({"matchLabels": {"metahook-test": label}});
                doc["spec"]["hooks"]["sync"]["webhook"]["service"]["namespace"] = json!(namespace);
            }
            _ => doc["metadata"]["namespace"] = json!(namespace),
        }
        if doc["kind"] == "Deployment" {
            let container = &mut doc["spec"]["template"]["spec"]["containers"][0];
            assert!(container["image"].as_str().unwrap().contains("-slim"), "{dir}: a stock image expected");
            container["image"] = json!(image);
        }
        docs.push(doc);
    }
    (docs, controller)
}

/// The hello-world controller (examples-python/hello-world) with its hook in the cluster: the hook's
/// code in a ConfigMap on the Python hook image, behind a Service, the controller's webhook a `service:`
/// reference, and the role `metahook rbac` generates for it.
fn hello_world(namespace: &str, label: &str) -> String {
    let root = support::repo_root();
    let controller_name = format!("hello-world-{label}");
    let mut docs = yaml_docs(&std::fs::read_to_string(root.join("examples-python/hello-world/crd.yaml")).unwrap());
    let controller_file = root.join("examples-python/hello-world/controller.yaml");
    for role in support::metahook_rbac(&["-f", controller_file.to_str().unwrap()]) {
        docs.push(role);
    }
    let mut controller: Value = yaml::from_str(&std::fs::read_to_string(&controller_file).unwrap()).unwrap();
    controller["metadata"]["name"] = json!(controller_name);
    controller["metadata"]["labels"] = json!({"metahook-test": label});
    controller["spec"]["parentResource"]["labelSelector"] = json!({"matchLabels": {"metahook-test": label}});
    controller["spec"]["hooks"]["sync"]["webhook"] = json!({
        "service": {"name": "hello-world", "namespace": namespace, "port": 8080}, "path": "/sync", "timeout": "5s",
    });
    docs.push(controller);
    let labels = json!({"app.kubernetes.io/name": "hello-world-hook"});
    docs.push(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "hello-world-hook", "namespace": namespace},
        "data": {"hook.py": std::fs::read_to_string(root.join("examples-python/hello-world/hook.py")).unwrap()},
    }));
    docs.push(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "hello-world", "namespace": namespace},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65534, "runAsGroup": 65534},
                "containers": [{
                    "name": "hook", "image": hook_image("python"), "command": ["python3", "/opt/hook/hook.py"],
                    "env": [{"name": "HOST", "value": "0.0.0.0"}, {"name": "PORT", "value": "8080"}],
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 2},
                    "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true},
                    "volumeMounts": [{"name": "hook", "mountPath": "/opt/hook", "readOnly": true}],
                }],
                "volumes": [{"name": "hook", "configMap": {"name": "hello-world-hook"}}],
            },
        }},
    }));
    docs.push(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "hello-world", "namespace": namespace},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": 8080, "targetPort": "http"}]},
    }));
    apply(&docs);
    ready_pods(namespace, "app.kubernetes.io/name=hello-world-hook", 1);
    controller_name
}

/// A HelloWorld parent; its Pods (busybox, `echo` the greeting) really run: their logs say it.
fn hello_world_greets(namespace: &str, label: &str, name: &str, who: &str, hub: (&str, &str)) {
    let mut parent: Value = yaml::from_str(
        &std::fs::read_to_string(support::repo_root().join("examples-python/hello-world/hello.yaml")).unwrap(),
    )
    .unwrap();
    parent["metadata"]["name"] = json!(name);
    parent["metadata"]["namespace"] = json!(namespace);
    parent["metadata"]["labels"] = json!({"metahook-test": label});
    parent["spec"]["who"] = json!(who);
    parent["spec"]["replicas"] = json!(1);
    apply(&[parent]);
    let pod = format!("{name}-0");
    let what = format!("Pod {pod} (hello-world's child) to print");
    let why = || explain(namespace, hub.0, hub.1, &pod);
    let logs = wait_or_explain(Duration::from_secs(180), &what, why, || {
        let found =
            kubectl_json(&["get", "pods", "-n", namespace, "--field-selector", &format!("metadata.name={pod}")]);
        let pods = found["items"].as_array().unwrap().clone();
        no_missing_images(&pods);
        let started = pods.first()?["status"]["containerStatuses"][0]["restartCount"].as_u64()? > 0
            || !pods.first()?["status"]["containerStatuses"][0]["state"]["terminated"].is_null();
        if !started {
            return None;
        }
        let logs = Command::new(bin("kubectl"))
            .env("KUBECONFIG", support::kubeconfig_path())
            .args(["logs", "-n", namespace, &pod])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&logs.stdout).into_owned();
        (!text.is_empty()).then_some(text)
    });
    assert_eq!(logs.trim(), format!("Hello, {who}!"), "what Pod {pod} printed");
    let found = kubectl_json(&["get", "pod", "-n", namespace, &pod]);
    assert_eq!(found["spec"]["nodeName"], node().name.as_str());
    assert_eq!(found["metadata"]["ownerReferences"][0]["name"], name);
}

// ---- Greetings (the in-cluster Python example) ------------------------------------------------------

fn greeting(namespace: &str, label: &str, name: &str, who: &str) -> Value {
    json!({
        "apiVersion": "python.examples.metahook.dev/v1", "kind": "Greeting",
        "metadata": {"name": name, "namespace": namespace, "labels": {"metahook-test": label}},
        "spec": {"who": who},
    })
}

/// Every Greeting `g<i>` has exactly one ConfigMap, saying `Hello, <who(i)>!`.
fn greetings_say(namespace: &str, count: usize, who: impl Fn(usize) -> String, what: &str) {
    wait(Duration::from_secs(120), what, || {
        let maps = kubectl_json(&["get", "configmaps", "-n", namespace, "-l", "python.examples.metahook.dev/greeting"]);
        let mut by_parent: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for cm in maps["items"].as_array().unwrap() {
            let parent = cm["metadata"]["labels"]["python.examples.metahook.dev/greeting"].as_str().unwrap().to_owned();
            by_parent.entry(parent).or_default().push(cm["data"]["message"].as_str().unwrap_or_default().to_owned());
        }
        (0..count).all(|i| by_parent.get(&format!("g{i}")) == Some(&vec![format!("Hello, {}!", who(i))])).then_some(())
    });
}

/// The writes (create, update, patch, delete) the chart's hub made to ConfigMaps in `namespace`, per
/// name, among `records` (the audit log's, from `since` on).
fn config_map_writes(records: &[Value], namespace: &str) -> BTreeMap<String, usize> {
    let mut writes = BTreeMap::new();
    for record in records {
        let verb = record["verb"].as_str().unwrap_or_default();
        if record["stage"] == "ResponseComplete"
            && matches!(verb, "create" | "update" | "patch" | "delete")
            && record["objectRef"]["resource"] == "configmaps"
            && record["objectRef"]["namespace"] == namespace
            && record["responseStatus"]["code"].as_u64().is_some_and(|c| c < 300)
        {
            *writes.entry(record["objectRef"]["name"].as_str().unwrap_or_default().to_owned()).or_default() += 1;
        }
    }
    writes
}

fn hub_user(service_account: &str) -> String {
    format!("system:serviceaccount:{RELEASE_NS}:{service_account}")
}

/// The leader Lease's holder: the Pod name it starts with.
fn leader(lease: &str, pods: &[Value]) -> Option<String> {
    let holder = kubectl_json(&["get", "lease", "-n", RELEASE_NS, lease])["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    pods.iter().map(|p| p["metadata"]["name"].as_str().unwrap().to_owned()).find(|name| holder.starts_with(name))
}

// ---- the tests ----------------------------------------------------------------------------------------

/// The chart, as a platform team installs it, on the real node: two replicas Ready through their real
/// probes, one holding the Lease, running as the chart's ServiceAccount with exactly the chart's and the
/// controllers' generated RBAC; /metrics through the Service; the in-cluster Python and Node examples
/// and hello-world, whose Pods run and print; the leader's Pod deleted while parents change; a
/// `helm upgrade` to another image while parents change; the documented uninstall, leaving no parent
/// on a hub finalizer, with one controller left until after `helm uninstall` (its delete waits for a
/// hub, and `metahook release` finishes it).
#[test]
fn the_chart_runs_the_hub_and_the_hooks_as_pods_on_a_real_node() {
    node();
    let label = format!("node{}", support::unique_suffix());
    let hooks = format!("mh-node-hooks-{}", support::unique_suffix());
    let _ = Command::new(bin("helm"))
        .env("KUBECONFIG", support::kubeconfig_path())
        .args(["uninstall", RELEASE, "-n", RELEASE_NS, "--wait"])
        .output();
    // What an earlier run's uninstall may have left: Kubernetes' ClusterRole aggregation controller
    // force-applies aggregated rules (an upsert), so a labelled role changing at the moment the hub's
    // ClusterRole is deleted can bring it back, without Helm's labels (docs/src/uninstall.md).
    kubectl(&["delete", "clusterrole", RELEASE, "--ignore-not-found"]);
    real_node_namespace(RELEASE_NS);
    real_node_namespace(&hooks);

    // ---- 1. helm install, two replicas ----
    let image_a = hub_image("node-a", 1_700_000_000);
    let values = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        values.path(),
        json!({"replicas": 2, "image": {"tag": "node-a"}, "config": {"targetLabelSelector": format!("metahook-test={label}")}})
            .to_string(),
    )
    .unwrap();
    let chart = support::repo_root().join("deploy/helm/metahook");
    let notes =
        helm(&["install", RELEASE, chart.to_str().unwrap(), "-n", RELEASE_NS, "-f", values.path().to_str().unwrap()]);
    assert!(
        notes.contains("metahook rbac -f controller.yaml | kubectl apply -f -"),
        "NOTES.txt's next steps:\n{notes}"
    );
    let hub_selector = format!("app.kubernetes.io/instance={RELEASE}");
    let hubs = ready_pods(RELEASE_NS, &hub_selector, 2);
    let manifest = yaml_docs(&helm(&["get", "manifest", RELEASE, "-n", RELEASE_NS]));
    let of_kind = |kind: &str| -> Vec<&Value> { manifest.iter().filter(|d| d["kind"] == kind).collect() };
    let deployment = of_kind("Deployment")[0];
    let lease = deployment["metadata"]["name"].as_str().unwrap().to_owned();
    let service_account = of_kind("ServiceAccount")[0]["metadata"]["name"].as_str().unwrap().to_owned();
    for pod in &hubs {
        assert_eq!(pod["spec"]["serviceAccountName"], service_account.as_str());
        assert_eq!(pod["spec"]["containers"][0]["image"], image_a.as_str());
    }
    let first_leader = wait(Duration::from_secs(60), "a replica to hold the leader Lease", || leader(&lease, &hubs));

    // Exactly the chart's RBAC: every binding naming the hub's ServiceAccount is one the chart made.
    let user = hub_user(&service_account);
    let mut bound = BTreeSet::new();
    for kind in ["clusterrolebindings", "rolebindings"] {
        for binding in kubectl_json(&["get", kind, "-A"])["items"].as_array().unwrap() {
            let names_us = binding["subjects"].as_array().into_iter().flatten().any(|s| {
                s["kind"] == "ServiceAccount" && s["name"] == service_account.as_str() && s["namespace"] == RELEASE_NS
            });
            if names_us {
                bound.insert(binding["metadata"]["name"].as_str().unwrap().to_owned());
            }
        }
    }
    let charted: BTreeSet<String> = manifest
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
        .map(|d| d["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(bound, charted, "the bindings of the hub's ServiceAccount are exactly the chart's");
    // `can-i` answers on stdout and says "no" with exit status 1 too.
    let can = Command::new(bin("kubectl"))
        .env("KUBECONFIG", support::kubeconfig_path())
        .args(["auth", "can-i", "create", "secrets", "-n", "kube-system", "--as", &user])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&can.stdout).trim(), "no", "the hub's ServiceAccount is not an administrator");

    // /metrics of every replica, through the Service, by its DNS name, from a Pod on the node.
    let metrics_service = of_kind("Service")[0];
    let url = format!(
        "http://{}.{RELEASE_NS}.svc.cluster.local:{}/metrics",
        metrics_service["metadata"]["name"].as_str().unwrap(),
        metrics_service["spec"]["ports"][0]["port"]
    );
    let scraped = busybox(&hooks, "scrape", &["wget", "-q", "-O", "-", &url]);
    assert!(scraped.contains("metahook_") && scraped.contains("leader_election_master_status"), "{scraped}");

    // ---- 2. the example hooks as Deployments behind Services, called by `service:` ----
    let (python, python_controller) =
        in_cluster_example("examples-python/in-cluster", &hooks, &label, &hook_image("python"));
    let (js, js_controller) = in_cluster_example("examples-js/in-cluster", &hooks, &label, &hook_image("node"));
    // The parents carry a finalizer while the controller has a finalize hook: what the uninstall must
    // leave nobody stuck on.
    // Its role is then what `metahook rbac` prints for that controller (it may patch the parents now).
    let mut python = python;
    for doc in python.iter_mut().filter(|d| d["kind"] == "CompositeController") {
        doc["spec"]["hooks"]["finalize"] = doc["spec"]["hooks"]["sync"].clone();
    }
    let controller_file = tempfile::NamedTempFile::new().unwrap();
    let controller = python.iter().find(|d| d["kind"] == "CompositeController").unwrap();
    std::fs::write(controller_file.path(), controller.to_string()).unwrap();
    python.retain(|d| d["kind"] != "ClusterRole");
    python.extend(support::metahook_rbac(&["-f", controller_file.path().to_str().unwrap()]));
    apply(&python);
    apply(&js);
    ready_pods(&hooks, "app.kubernetes.io/name=greeter-py", 2);
    ready_pods(&hooks, "app.kubernetes.io/name=greeter-js", 2);
    let greetings = 10;
    apply(
        &(0..greetings).map(|i| greeting(&hooks, &label, &format!("g{i}"), &format!("World {i}"))).collect::<Vec<_>>(),
    );
    greetings_say(&hooks, greetings, |i| format!("World {i}"), "every Greeting's ConfigMap (Python hook)");
    let js_greeting: Value = yaml::from_str(
        &std::fs::read_to_string(support::repo_root().join("examples-js/in-cluster/greeting.yaml")).unwrap(),
    )
    .unwrap();
    let js_api = js_greeting["apiVersion"].as_str().unwrap().to_owned();
    let mut js_greeting = js_greeting;
    js_greeting["metadata"]["namespace"] = json!(hooks);
    js_greeting["metadata"]["labels"] = json!({"metahook-test": label});
    apply(&[js_greeting.clone()]);
    let js_name = js_greeting["metadata"]["name"].as_str().unwrap().to_owned();
    wait(Duration::from_secs(120), "the Node hook's child ConfigMap", || {
        let found = kubectl_json(&[
            "get",
            "configmaps",
            "-n",
            &hooks,
            "--field-selector",
            &format!("metadata.name={js_name}-greeting"),
        ]);
        let cm = found["items"].as_array()?.first()?.clone();
        (cm["metadata"]["ownerReferences"][0]["apiVersion"] == js_api.as_str()).then_some(())
    });
    let hello_controller = hello_world(&hooks, &label);
    hello_world_greets(&hooks, &label, "hello", "Real Node", (RELEASE_NS, &hub_selector));
    // The hub's log as `kubectl logs` shows it: plain lines a user can grep for a controller by name,
    // no terminal colour codes between a field's name and its value.
    let hub_log = kubectl(&["logs", "-n", RELEASE_NS, "-l", &hub_selector, "--tail=-1"]);
    assert!(!hub_log.contains('\x1b'), "terminal codes in a Pod's log:\n{hub_log}");
    assert!(hub_log.contains(&format!("controller started controller={hello_controller} ")), "{hub_log}");
    // The hooks' own logs, through the API server and the kubelet: the Python hook logs its calls.
    let hook_logs = kubectl(&["logs", "-n", &hooks, "-l", "app.kubernetes.io/name=greeter-py", "--tail=-1"]);
    assert!(hook_logs.contains("/sync"), "the Python hook logs its calls:\n{hook_logs}");

    // `metahook status --metrics-pods`: both replicas found by label and read through the API server's
    // pod proxy, no port-forward; the leader named, the Python controller's parents counted.
    let status = run(Command::new(env!("CARGO_BIN_EXE_metahook"))
        .env("KUBECONFIG", support::kubeconfig_path())
        .args(["status", "-o", "json", "--interval", "0s", "-l", &format!("metahook-test={label}")])
        .args(["--metrics-pods", &format!("{RELEASE_NS}/{hub_selector}")]));
    let status: Value = serde_json::from_str(&status).unwrap();
    let sources = status["metrics"]["sources"].as_array().unwrap();
    let mut read: Vec<&str> = sources.iter().map(|s| s["pod"].as_str().unwrap()).collect();
    read.sort_unstable();
    let mut expected: Vec<String> =
        hubs.iter().map(|p| format!("{RELEASE_NS}/{}", p["metadata"]["name"].as_str().unwrap())).collect();
    expected.sort();
    assert_eq!(read, expected, "every replica read through its Pod: {status}");
    assert!(sources.iter().all(|s| s["answered"] == true), "{status}");
    let leaders: Vec<&str> =
        sources.iter().filter(|s| s["leader"] == true).map(|s| s["pod"].as_str().unwrap()).collect();
    assert_eq!(leaders, [format!("{RELEASE_NS}/{first_leader}")], "{status}");
    let controllers = status["controllers"].as_array().unwrap();
    let greeter = controllers.iter().find(|c| c["name"] == python_controller.as_str());
    let greeter = greeter.unwrap_or_else(|| panic!("the Python controller is reported: {status}"));
    assert_eq!(greeter["parents"], greetings, "{greeter}");
    assert!(greeter["errors"].as_u64().is_some(), "the leader's figures were read: {greeter}");

    // ---- 3. the leader's Pod deleted while parents change ----
    let since = support::audit_records(&user).len();
    kubectl(&["delete", "pod", "-n", RELEASE_NS, &first_leader, "--wait=false"]);
    apply(
        &(0..greetings)
            .map(|i| greeting(&hooks, &label, &format!("g{i}"), &format!("Failover {i}")))
            .collect::<Vec<_>>(),
    );
    let survivors: Vec<Value> =
        hubs.iter().filter(|p| p["metadata"]["name"] != first_leader.as_str()).cloned().collect();
    let second_leader = wait(Duration::from_secs(90), "the standby to take the Lease", || leader(&lease, &survivors));
    greetings_say(&hooks, greetings, |i| format!("Failover {i}"), "every change made during the failover");
    let writes = config_map_writes(&support::audit_records(&user)[since..], &hooks);
    for i in 0..greetings {
        let name = format!("g{i}-greeting");
        assert_eq!(writes.get(&name), Some(&1), "{name}: one change, one write across the failover ({writes:?})");
    }
    ready_pods(RELEASE_NS, &hub_selector, 2);

    // ---- 4. helm upgrade to another image while parents change ----
    let image_b = hub_image("node-b", 1_700_000_100);
    let since = support::audit_records(&user).len();
    helm(&[
        "upgrade",
        RELEASE,
        chart.to_str().unwrap(),
        "-n",
        RELEASE_NS,
        "--reuse-values",
        "--set",
        "image.tag=node-b",
    ]);
    let rounds = 3;
    for round in 0..rounds {
        apply(
            &(0..greetings)
                .map(|i| greeting(&hooks, &label, &format!("g{i}"), &format!("Upgrade {round} {i}")))
                .collect::<Vec<_>>(),
        );
        std::thread::sleep(Duration::from_secs(3));
    }
    let upgraded = wait(Duration::from_secs(180), "the rollout to the new image", || {
        let pods = pods(RELEASE_NS, &hub_selector);
        no_missing_images(&pods);
        let live: Vec<Value> = pods.into_iter().filter(|p| p["metadata"]["deletionTimestamp"].is_null()).collect();
        (live.len() == 2 && live.iter().all(|p| ready(p) && p["spec"]["containers"][0]["image"] == image_b.as_str()))
            .then_some(live)
    });
    greetings_say(&hooks, greetings, |i| format!("Upgrade {} {i}", rounds - 1), "every change made during the upgrade");
    wait(Duration::from_secs(60), "a new replica to lead", || leader(&lease, &upgraded));
    let writes = config_map_writes(&support::audit_records(&user)[since..], &hooks);
    for i in 0..greetings {
        let name = format!("g{i}-greeting");
        let count = writes.get(&name).copied().unwrap_or_default();
        assert!((1..=rounds).contains(&count), "{name}: {rounds} changes, at most {rounds} writes ({writes:?})");
    }
    assert!(
        writes.keys().all(|name| name.starts_with('g') && name.ends_with("-greeting")),
        "no other ConfigMap written during the upgrade: {writes:?}"
    );
    eprintln!("failover: {first_leader} -> {second_leader}; upgrade writes per child: {writes:?}");

    // ---- 6. the documented uninstall (docs/src/uninstall.md) ----
    let finalized = kubectl_json(&["get", "greetings.python.examples.metahook.dev", "-n", &hooks])["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty()))
        .count();
    assert_eq!(finalized, greetings, "every Greeting carries the hub's finalizer before the uninstall");
    let greeting_finalizers = || -> Vec<Value> {
        let items = kubectl_json(&["get", "greetings.python.examples.metahook.dev", "-n", &hooks])["items"].clone();
        items.as_array().unwrap().iter().map(|g| g["metadata"]["finalizers"].clone()).collect()
    };
    // Step 1: the controllers, while the hub runs (it takes its finalizers off their objects) — all but
    // the Python one, whose parents carry its finalizer: that one is left for after the uninstall, the
    // order the page warns about (issue 66's matrix: `helm uninstall` without deleting the controllers
    // first).
    for controller in [&js_controller, &hello_controller] {
        kubectl(&["delete", "compositecontroller", controller, "--wait=true", "--timeout=30s"]);
    }
    // Step 2: the release.
    helm(&["uninstall", RELEASE, "-n", RELEASE_NS, "--wait"]);
    // With no hub, the controller left behind keeps its finalizer on its parents, and a delete of it
    // waits for a hub (the promise is kept in the API); `metahook release` finishes it within the bound.
    assert!(
        greeting_finalizers().iter().all(|f| f.as_array().is_some_and(|f| !f.is_empty())),
        "the parents of the controller left behind keep its finalizer: {:?}",
        greeting_finalizers()
    );
    kubectl(&["delete", "compositecontroller", &python_controller, "--wait=false"]);
    std::thread::sleep(Duration::from_secs(3));
    let waiting = kubectl_json(&["get", "compositecontroller", &python_controller]);
    assert!(!waiting["metadata"]["deletionTimestamp"].is_null(), "the deleted controller waits for a hub: {waiting}");
    let started = std::time::Instant::now();
    let released = run(Command::new(env!("CARGO_BIN_EXE_metahook"))
        .env("KUBECONFIG", support::kubeconfig_path())
        .args(["release", &python_controller]));
    assert!(released.contains(&format!("CompositeController {python_controller}: released")), "{released}");
    wait(Duration::from_secs(30), "the released controller to go", || {
        let left = kubectl_json(&[
            "get",
            "compositecontrollers",
            "--field-selector",
            &format!("metadata.name={python_controller}"),
        ]);
        left["items"].as_array()?.is_empty().then_some(())
    });
    assert!(
        greeting_finalizers().iter().all(|f| f.as_array().is_none_or(Vec::is_empty)),
        "metahook release took the controller's finalizer off its parents: {:?}",
        greeting_finalizers()
    );
    eprintln!("helm uninstall before a controller's delete: metahook release finished it in {:?}", started.elapsed());
    // Nothing of the release's RBAC comes back: its own roles are bound directly, so deleting them
    // re-aggregates nothing (an aggregated base role brought the release's ClusterRole back, and
    // `helm uninstall --wait` then waited for it in vain).
    std::thread::sleep(Duration::from_secs(3));
    let left: Vec<String> = kubectl_json(&["get", "clusterroles,clusterrolebindings"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
        .filter(|name| name == RELEASE || name.starts_with(&format!("{RELEASE}-")))
        .collect();
    assert!(left.is_empty(), "the release's cluster roles and bindings outlive it: {left:?}");
    // Helm deletes the Deployment; the garbage collector and the kubelet then stop its Pods.
    wait(Duration::from_secs(90), "the hub's Pods to be gone after helm uninstall", || {
        pods(RELEASE_NS, &hub_selector).is_empty().then_some(())
    });
    // Parents and their children are the users' and stay; deleting them now finishes at once.
    let maps = kubectl_json(&["get", "configmaps", "-n", &hooks, "-l", "python.examples.metahook.dev/greeting"]);
    assert_eq!(maps["items"].as_array().unwrap().len(), greetings, "the children outlive the hub");
    kubectl(&[
        "delete",
        "greetings.python.examples.metahook.dev",
        "--all",
        "-n",
        &hooks,
        "--wait=true",
        "--timeout=30s",
    ]);
    delete_namespace(&hooks);
    delete_namespace(RELEASE_NS);
}

/// The kustomization (`deploy/kustomize`), installed once the same way, through an overlay as the book's
/// install section writes one: its replicas Ready, the Lease held, a controller synced through a hook in
/// the cluster, and `kubectl delete -k` after the controllers, as the uninstall page says.
#[test]
fn the_kustomization_runs_the_hub_on_a_real_node() {
    node();
    let label = format!("kust{}", support::unique_suffix());
    // Inside the repository, as a user's overlay sits beside the base: kustomize takes no absolute root.
    let overlay = tempfile::tempdir_in(support::repo_root().join("target")).unwrap();
    let base = support::repo_root().join("deploy/kustomize");
    let namespace = yaml_docs(&std::fs::read_to_string(base.join("namespace.yaml")).unwrap())[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let image = hub_image("node-a", 1_700_000_000);
    let (repository, tag) = image.split_once(':').unwrap();
    // The overlay the install section shows: the image's tag, and the config file replaced by one that
    // runs only this test's controllers; plus the annotations that send the Namespace's Pods to the node.
    let config = std::fs::read_to_string(support::repo_root().join("config/metahook.yaml"))
        .unwrap()
        .replace("\ntargetLabelSelector: \"\"\n", &format!("\ntargetLabelSelector: \"metahook-test={label}\"\n"));
    assert!(config.contains(&label), "config/metahook.yaml has a targetLabelSelector line to replace");
    std::fs::write(overlay.path().join("metahook.yaml"), config).unwrap();
    std::fs::write(
        overlay.path().join("kustomization.yaml"),
        json!({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": ["../../deploy/kustomize"],
            "images": [{"name": repository, "newTag": tag}],
            "configMapGenerator": [{"name": "metahook-config", "behavior": "replace", "files": ["metahook.yaml"]}],
            "patches": [{"target": {"kind": "Namespace", "name": namespace}, "patch": json!([
                {"op": "add", "path": "/metadata/annotations", "value": {
                    "scheduler.alpha.kubernetes.io/node-selector": format!("{NODE_KEY}=true"),
                    "scheduler.alpha.kubernetes.io/defaultTolerations":
                        json!([{"key": NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}]).to_string(),
                }}]).to_string()}],
        })
        .to_string(),
    )
    .unwrap();
    let rendered = run(Command::new(bin("kubectl")).arg("kustomize").arg(overlay.path()));
    let docs = yaml_docs(&rendered);
    apply(&docs);
    let replicas = docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["replicas"].as_u64().unwrap_or(1);
    let selector = docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
        .collect::<Vec<_>>()
        .join(",");
    let hubs = ready_pods(&namespace, &selector, usize::try_from(replicas).unwrap());
    let lease =
        docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["metadata"]["name"].as_str().unwrap().to_owned();
    wait(Duration::from_secs(60), "a replica to hold the Lease", || {
        let holder =
            kubectl_json(&["get", "lease", "-n", &namespace, &lease])["spec"]["holderIdentity"].as_str()?.to_owned();
        hubs.iter().any(|p| holder.starts_with(p["metadata"]["name"].as_str().unwrap())).then_some(())
    });

    let hooks = format!("mh-kust-hooks-{}", support::unique_suffix());
    real_node_namespace(&hooks);
    let controller = hello_world(&hooks, &label);
    hello_world_greets(&hooks, &label, "hello", "Kustomize", (&namespace, &selector));

    kubectl(&["delete", "compositecontroller", &controller, "--wait=true"]);
    // Everything but the CRDs: deleting those deletes every controller in the cluster (the uninstall
    // page says when to do it; other tests' controllers live in this cluster).
    let kept: Vec<Value> = docs.into_iter().filter(|d| d["kind"] != "CustomResourceDefinition").collect();
    let out = Command::new(bin("kubectl"))
        .env("KUBECONFIG", support::kubeconfig_path())
        .args(["delete", "-f", "-", "--wait=true", "--ignore-not-found"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child.stdin.take().unwrap().write_all(stream(&kept).as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success(), "kubectl delete: {}", String::from_utf8_lossy(&out.stderr));
    delete_namespace(&hooks);
}
