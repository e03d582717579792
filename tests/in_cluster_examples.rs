//! The in-cluster examples (`examples-python/in-cluster`, `examples-js/in-cluster`): a hook deployed as a
//! Deployment + Service on a stock runtime image, its code and the helper library in ConfigMaps, called
//! by the hub through the controller's `service` webhook.
//!
//! Each step of the README's path from laptop to cluster has a test here or in `tests/render.rs`:
//! the rendered manifests are valid (server-side dry-run, strict field validation) and wired together
//! (Service → Pods → probes → controller webhook, every library module in its ConfigMap); the Pod's
//! program, rebuilt from its ConfigMaps exactly as the volumes lay them out, serves probes and syncs and
//! drains on SIGTERM; and end to end, a hub holding only the example's printed role (and the base role)
//! reaches the hook by its Service name.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use metahook::ops::yaml;
use serde_json::{Value, json};

/// The examples: directory, the library's files the Pod must get, and the controller's name.
const PYTHON: Example = Example { dir: "examples-python/in-cluster", name: "greeter-py" };
const NODE: Example = Example { dir: "examples-js/in-cluster", name: "greeter-js" };

#[derive(Clone, Copy)]
struct Example {
    dir: &'static str,
    name: &'static str,
}

impl Example {
    /// `kubectl kustomize` of the example, as the README deploys it.
    fn render(self) -> Vec<Value> {
        let out = Command::new(kubectl())
            .args(["kustomize", "--load-restrictor", "LoadRestrictionsNone", self.dir])
            .current_dir(support::repo_root())
            .output()
            .expect("running kubectl kustomize");
        assert!(out.status.success(), "kubectl kustomize {}: {}", self.dir, String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        yaml::from_documents(&text).expect("valid YAML")
    }

    /// The library files a Pod must see: every module of the helper library.
    fn library_files(self) -> BTreeSet<String> {
        let root = support::repo_root();
        let list = |dir: &str, keep: &dyn Fn(&str) -> bool| -> Vec<String> {
            std::fs::read_dir(root.join(dir))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|f| keep(f))
                .collect()
        };
        if self.dir.starts_with("examples-python") {
            list("examples-python/metahook-hooks/metahook_hooks", &|f| f.ends_with(".py") || f == "py.typed")
                .into_iter()
                .collect()
        } else {
            let mut files: BTreeSet<String> = ["package.json", "index.js"].map(str::to_owned).into();
            files.extend(
                list("examples-js/metahook-hooks/src", &|f| f.ends_with(".js")).into_iter().map(|f| format!("src/{f}")),
            );
            files
        }
    }
}

fn kubectl() -> PathBuf {
    support::repo_root().join("tests/cluster/bin/kubectl")
}

fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let mut found = docs.iter().filter(|d| d["kind"] == kind);
    let doc = found.next().unwrap_or_else(|| panic!("no {kind} rendered"));
    assert!(found.next().is_none(), "more than one {kind} rendered");
    doc
}

fn config_map<'a>(docs: &'a [Value], name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no ConfigMap {name} rendered"))
}

/// What each file of the Pod's volumes holds, by path inside the container (`/opt/hook/hook.py`).
fn pod_files(docs: &[Value]) -> BTreeMap<String, String> {
    let pod = &one(docs, "Deployment")["spec"]["template"]["spec"];
    let mut files = BTreeMap::new();
    for mount in pod["containers"][0]["volumeMounts"].as_array().unwrap() {
        let volume = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == mount["name"]).unwrap();
        let source = &volume["configMap"];
        let data = config_map(docs, source["name"].as_str().unwrap())["data"].as_object().unwrap();
        let at = mount["mountPath"].as_str().unwrap().trim_end_matches('/');
        match source["items"].as_array() {
            Some(items) => {
                for item in items {
                    let key = item["key"].as_str().unwrap();
                    let content = data.get(key).unwrap_or_else(|| panic!("volume item {key} is not in the ConfigMap"));
                    files.insert(
                        format!("{at}/{}", item["path"].as_str().unwrap()),
                        content.as_str().unwrap().to_owned(),
                    );
                }
            }
            None => {
                for (key, content) in data {
                    files.insert(format!("{at}/{key}"), content.as_str().unwrap().to_owned());
                }
            }
        }
    }
    files
}

/// Renders, checks the wiring, and has the API server validate every object (dry-run: nothing is
/// created but the `hooks` Namespace, which the namespaced objects need to exist to be validated).
async fn check_manifests(example: Example) {
    let client = support::client().await;
    support::install_metahook_crds(&client).await;
    let docs = example.render();

    // Service → Pods: the selector picks the Deployment's Pods, on the port the probes use.
    let deployment = one(&docs, "Deployment");
    let service = one(&docs, "Service");
    let pod = &deployment["spec"]["template"];
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&pod["metadata"]["labels"][key], value, "the Service selects the Deployment's Pods");
    }
    let container = &pod["spec"]["containers"][0];
    let service_port = &service["spec"]["ports"][0];
    let container_port = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == service_port["targetPort"])
        .expect("the Service's targetPort names a container port");
    let env: BTreeMap<&str, &str> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
        .collect();
    assert_eq!(env["PORT"], container_port["containerPort"].to_string(), "serve() listens on the container port");
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(container[probe]["httpGet"]["path"], "/healthz", "{probe}");
        assert_eq!(container[probe]["httpGet"]["port"], service_port["targetPort"], "{probe}");
    }
    assert!(container["image"].as_str().unwrap().ends_with("-slim"), "a stock runtime image, no build");

    // The controller calls that Service by name.
    let controller = one(&docs, "CompositeController");
    assert_eq!(controller["metadata"]["name"], example.name);
    assert_eq!(deployment["metadata"]["name"], example.name);
    let webhook = &controller["spec"]["hooks"]["sync"]["webhook"];
    assert!(webhook.get("url").is_none(), "the service form, not a url");
    assert_eq!(webhook["service"]["name"], service["metadata"]["name"]);
    assert_eq!(webhook["service"]["namespace"], service["metadata"]["namespace"]);
    assert_eq!(webhook["service"]["port"], service_port["port"]);

    // Every module of the helper library reaches the Pod (a new module must be added to the example).
    let files = pod_files(&docs);
    let library_root = if example.dir.starts_with("examples-python") {
        "/opt/metahook-hooks/metahook_hooks"
    } else {
        "/opt/metahook-hooks"
    };
    let shipped: BTreeSet<String> = files
        .keys()
        .filter_map(|path| path.strip_prefix(library_root).map(|p| p.trim_start_matches('/').to_owned()))
        .collect();
    assert_eq!(shipped, example.library_files(), "the library in the Pod is the library in the repository");

    // The hub's rights for the controller are what `metahook rbac` prints for it, no more, no less.
    let controller_file = support::repo_root().join(example.dir).join("controller.yaml");
    let printed = support::metahook_rbac(&["-f", controller_file.to_str().unwrap()]);
    let shipped: Vec<&Value> = docs.iter().filter(|d| d["apiVersion"] == "rbac.authorization.k8s.io/v1").collect();
    assert_eq!(shipped, printed.iter().collect::<Vec<_>>(), "rbac.yaml is stale: print it again");

    // Server-side dry-run of every object, strict field validation. The Namespace and the CRDs are
    // applied for real first (the dry run then checks them as patches): the tests that run the hook
    // create the same CRDs concurrently, and kubectl's dry-run create of an object that appeared
    // after its read fails with AlreadyExists.
    let namespace = one(&docs, "Namespace");
    support::apply_value(&client, namespace).await;
    for crd in docs.iter().filter(|d| d["kind"] == "CustomResourceDefinition") {
        support::apply_value(&client, crd).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let rendered = dir.path().join("rendered.yaml");
    let text: String = docs.iter().map(|d| format!("---\n{}", yaml::to_string(d).unwrap())).collect();
    std::fs::write(&rendered, text).unwrap();
    let out = Command::new(kubectl())
        .args(["apply", "--dry-run=server", "--validate=strict", "-f"])
        .arg(&rendered)
        .env("KUBECONFIG", support::kubeconfig_path())
        .output()
        .expect("running kubectl apply --dry-run=server");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the API server rejected {}: {}{stdout}",
        example.dir,
        String::from_utf8_lossy(&out.stderr)
    );
    let kinds = [
        "deployment.apps",
        "service",
        "compositecontroller.metacontroller.k8s.io",
        "configmap",
        "clusterrole.rbac.authorization.k8s.io",
    ];
    for kind in kinds {
        assert!(stdout.contains(kind) && stdout.contains("(server dry run)"), "{kind} validated: {stdout}");
    }
}

#[tokio::test]
async fn python_manifests_are_wired_together_and_pass_server_side_dry_run() {
    check_manifests(PYTHON).await;
}

#[tokio::test]
async fn node_manifests_are_wired_together_and_pass_server_side_dry_run() {
    check_manifests(NODE).await;
}

/// The Pod's program run here: its ConfigMaps written out as its volumes lay them (under a temporary
/// root standing for `/`), and its command and environment with paths into that root. The local
/// `python3`/`node` stand in for the image's.
struct LocalPod {
    port: u16,
    child: std::process::Child,
    _root: tempfile::TempDir,
}

impl LocalPod {
    fn start(example: Example) -> Self {
        let docs = example.render();
        let root = tempfile::tempdir().unwrap();
        let pod = &one(&docs, "Deployment")["spec"]["template"]["spec"];
        let mounts: Vec<String> = pod["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["mountPath"].as_str().unwrap().trim_end_matches('/').to_owned())
            .collect();
        kubelet_layout(root.path(), &mounts, &pod_files(&docs));
        // An absolute path that exists in the rebuilt file system is taken from it.
        let local = |value: &str| -> String {
            let inside = root.path().join(value.trim_start_matches('/'));
            if value.starts_with('/') && inside.exists() { inside.display().to_string() } else { value.to_owned() }
        };
        let container = &one(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
        let mut command: Vec<String> =
            container["command"].as_array().unwrap().iter().map(|a| local(a.as_str().unwrap())).collect();
        command.extend(container["args"].as_array().into_iter().flatten().map(|a| local(a.as_str().unwrap())));
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut process = Command::new(&command[0]);
        process.args(&command[1..]).env_remove("PYTHONPATH").current_dir(root.path()).stdin(Stdio::null());
        for var in container["env"].as_array().unwrap() {
            process.env(var["name"].as_str().unwrap(), local(var["value"].as_str().unwrap()));
        }
        let child =
            process.env("PORT", port.to_string()).env("HOST", "127.0.0.1").spawn().expect("starting the Pod's command");
        Self { port, child, _root: root }
    }

    /// Polls the readiness probe until it answers 200.
    async fn ready(&mut self) {
        let url = format!("http://127.0.0.1:{}/healthz", self.port);
        let child = &mut self.child;
        support::eventually(Duration::from_secs(30), || {
            let url = url.clone();
            let exited = child.try_wait().unwrap();
            async move {
                assert!(exited.is_none(), "the Pod's command exited: {exited:?}");
                let response = reqwest_get(&url).await?;
                (response == 200).then_some(())
            }
        })
        .await;
    }

    /// SIGTERM, as the kubelet stops a container; the exit code.
    fn terminate(mut self) -> Option<i32> {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        self.child.wait().unwrap().code()
    }
}

/// Writes `files` (by path in the container) under `root` as the kubelet lays out a ConfigMap volume at
/// each of `mounts`: the files in a timestamped directory, `..data` a symlink to it, and each top-level
/// entry a symlink through `..data` (so an update swaps one link). A program that resolves its imports
/// from its real path (Node does, for its main module, unless told `--preserve-symlinks-main`) sees
/// what it sees in the Pod.
fn kubelet_layout(root: &std::path::Path, mounts: &[String], files: &BTreeMap<String, String>) {
    const STAMP: &str = "..2026_01_01_00_00_00.000000001";
    for (path, content) in files {
        let mount = mounts
            .iter()
            .filter(|m| path.starts_with(&format!("{m}/")))
            .max_by_key(|m| m.len())
            .unwrap_or_else(|| panic!("{path} is in no volume"));
        let relative = &path[mount.len() + 1..];
        let dir = root.join(mount.trim_start_matches('/'));
        let file = dir.join(STAMP).join(relative);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, content).unwrap();
        let top = relative.split('/').next().unwrap();
        if !dir.join(top).exists() {
            std::os::unix::fs::symlink(format!("..data/{top}"), dir.join(top)).unwrap();
        }
        if !dir.join("..data").exists() {
            std::os::unix::fs::symlink(STAMP, dir.join("..data")).unwrap();
        }
    }
}

impl Drop for LocalPod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status code of a GET, or None when nothing answers.
async fn reqwest_get(url: &str) -> Option<u16> {
    reqwest::get(url).await.ok().map(|r| r.status().as_u16())
}

/// One sync call, as the hub would make it for the example's sample Greeting.
async fn sync_once(example: Example, port: u16) -> Value {
    let path = support::repo_root().join(example.dir).join("greeting.yaml");
    let mut parent: Value = yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    parent["metadata"]["namespace"] = json!("default");
    parent["metadata"]["generation"] = json!(1);
    let body = json!({"controller": {}, "parent": parent, "children": {"ConfigMap.v1": {}}, "related": {}, "finalizing": false});
    let response = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/sync"))
        .json(&body)
        .send()
        .await
        .expect("calling the hook");
    assert_eq!(response.status().as_u16(), 200);
    response.json().await.unwrap()
}

async fn run_the_pod_locally(example: Example) {
    let mut pod = LocalPod::start(example);
    pod.ready().await;
    let response = sync_once(example, pod.port).await;
    assert_eq!(response["children"][0]["kind"], "ConfigMap");
    assert_eq!(response["children"][0]["metadata"]["name"], "world-greeting");
    assert_eq!(response["children"][0]["data"]["message"], "Hello, World!");
    assert_eq!(response["status"]["conditions"][0]["reason"], "Publishing");
    assert_eq!(pod.terminate(), Some(0), "SIGTERM: drained and exited cleanly");
}

#[tokio::test]
async fn the_python_pod_runs_from_its_configmaps_answers_probes_and_stops_on_sigterm() {
    run_the_pod_locally(PYTHON).await;
}

#[tokio::test]
async fn the_node_pod_runs_from_its_configmaps_answers_probes_and_stops_on_sigterm() {
    run_the_pod_locally(NODE).await;
}

/// End to end: the example's objects applied for real (in the test's namespace), the Pod's program run
/// here (kwok's Pods run no containers), and a hub outside the cluster that reaches the hook by its
/// Service name through `hookHosts`, as the README's step 4 does with `kubectl port-forward`. The hub
/// runs as a ServiceAccount with a token, holding only the base role (`metahook rbac --base`) and the
/// example's `rbac.yaml`, as the add-on's hub does.
async fn hub_calls_the_hook_by_its_service_name(example: Example) {
    let client = support::client().await;
    support::install_metahook_crds(&client).await;
    let ns = support::TestNamespace::create(&client, &format!("{}-e2e", example.name)).await;
    let label = ns.name.clone();
    let mut pod = LocalPod::start(example);
    pod.ready().await;

    let mut docs = Vec::new();
    let mut roles = support::metahook_rbac(&["--base"]);
    for mut doc in example.render() {
        match doc["kind"].as_str().unwrap_or_default() {
            "Namespace" => continue,
            "ClusterRole" => {
                roles.push(doc);
                continue;
            }
            "CustomResourceDefinition" => {}
            "CompositeController" => {
                doc["metadata"]["name"] = json!(label);
                doc["metadata"]["labels"] = json!({"metahook-test": label});
                doc["spec"]["parentResource"]["labelSelector"] = json!({"matchLabels": {"metahook-test": label}});
                doc["spec"]["hooks"]["sync"]["webhook"]["service"]["namespace"] = json!(ns.name);
            }
            _ => doc["metadata"]["namespace"] = json!(ns.name),
        }
        docs.push(doc);
    }
    support::apply_docs(&client, &docs).await;
    let service = one(&docs, "Service");
    let authority = format!(
        "{}.{}:{}",
        service["metadata"]["name"].as_str().unwrap(),
        ns.name,
        service["spec"]["ports"][0]["port"]
    );
    let config = metahook::ops::config::Config {
        hook_hosts: BTreeMap::from([(authority, format!("127.0.0.1:{}", pod.port))]),
        ..metahook::ops::config::Config::default()
    };
    let mut account = support::HubAccount::create(&client, &ns.name, &label).await;
    account.grant(&roles).await;
    let hub = support::Hub::start_with_config(&account.client, &label, config);

    let mut greeting: Value =
        yaml::from_str(&std::fs::read_to_string(support::repo_root().join(example.dir).join("greeting.yaml")).unwrap())
            .unwrap();
    greeting["metadata"]["namespace"] = json!(ns.name);
    greeting["metadata"]["labels"] = json!({"metahook-test": label});
    support::apply_value(&client, &greeting).await;

    let api_version = greeting["apiVersion"].as_str().unwrap().to_owned();
    let greetings = support::api(&client, &api_version, "Greeting", Some(&ns.name)).await;
    let config_maps = support::api(&client, "v1", "ConfigMap", Some(&ns.name)).await;
    let wait = Duration::from_secs(60);
    // The child the hook asked for, and a Ready status once the hook has seen it.
    let child =
        support::eventually(wait, || async { config_maps.get_opt("world-greeting").await.ok().flatten() }).await;
    assert_eq!(child.data["data"]["message"], "Hello, World!");
    let owner = &child.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.controller), ("Greeting", "world", Some(true)));
    let ready = |message: &'static str| {
        let greetings = greetings.clone();
        move || {
            let greetings = greetings.clone();
            async move {
                let status = greetings.get("world").await.ok()?.data["status"].clone();
                let condition = status["conditions"].as_array()?.iter().find(|c| c["type"] == "Ready")?.clone();
                (status["message"] == message && condition["status"] == "True").then_some(condition)
            }
        }
    };
    let condition = support::eventually(wait, ready("Hello, World!")).await;
    assert_eq!(condition["reason"], "Published");

    // A change of the parent reaches the hook again, and the child follows (InPlace).
    greetings
        .patch(
            "world",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"who": "Cluster"}})),
        )
        .await
        .unwrap();
    support::eventually(wait, || async {
        let cm = config_maps.get("world-greeting").await.ok()?;
        (cm.data["data"]["message"] == "Hello, Cluster!").then_some(())
    })
    .await;
    support::eventually(wait, ready("Hello, Cluster!")).await;

    hub.stop().await;
    let controllers = support::api(&client, "metacontroller.k8s.io/v1alpha1", "CompositeController", None).await;
    let _ = controllers.delete(&label, &kube::api::DeleteParams::default()).await;
    account.delete().await;
    ns.delete().await;
    assert_eq!(pod.terminate(), Some(0));
}

#[tokio::test]
async fn python_hook_is_reached_by_its_service_name_through_hook_hosts() {
    hub_calls_the_hook_by_its_service_name(PYTHON).await;
}

#[tokio::test]
async fn node_hook_is_reached_by_its_service_name_through_hook_hosts() {
    hub_calls_the_hook_by_its_service_name(NODE).await;
}
