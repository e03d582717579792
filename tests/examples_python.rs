//! End-to-end tests of the Python examples (`examples-python/*`): each example's own `hook.py`, CRD,
//! controller and sample objects, on the real control plane with an in-process hub.
//!
//! Tests share the cluster (and the examples' CRDs) with every other test, so each one scopes the
//! example to itself: its controller is named after the test and selects only objects carrying the
//! test's `metahook-test` label, and cluster-scoped objects get names that start with the test's.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt as _};
use serde_json::{Value, json};
use support::{Example, eventually};

const WAIT: Duration = Duration::from_secs(60);

impl Example {
    /// The example in `dir`, its own `hook.py` running; whatever controllers it applies are the test's.
    async fn python(test: &str, dir: &str) -> Self {
        let mut ex = Self::start(test, dir, "python3", &["hook.py"]).await;
        for kind in ["CompositeController", "DecoratorController", "MapController"] {
            ex.controllers.push((kind.to_owned(), ex.label.clone()));
        }
        ex
    }

    /// The documents of one of the example's files, scoped to this test (see [`Example::scope`]).
    fn scoped_docs(&self, file: &str) -> Vec<Value> {
        let mut docs = self.docs(file);
        for doc in &mut docs {
            self.scope(doc);
        }
        docs
    }

    /// Applies the example's `files`, in order, scoped to this test.
    async fn apply_files(&self, files: &[&str]) {
        let docs: Vec<Value> = files.iter().flat_map(|file| self.scoped_docs(file)).collect();
        self.apply(&docs).await;
    }

    /// Controllers get the test's name and select only objects labelled for the test; every other
    /// object (but CRDs) gets that label.
    fn scope(&self, doc: &mut Value) {
        let label = json!(self.label);
        match doc["kind"].as_str().unwrap_or_default() {
            "CustomResourceDefinition" => {}
            "CompositeController" => {
                doc["metadata"]["name"] = label.clone();
                doc["spec"]["parentResource"]["labelSelector"]["matchLabels"]["metahook-test"] = label;
            }
            "DecoratorController" => {
                doc["metadata"]["name"] = label.clone();
                for rule in doc["spec"]["resources"].as_array_mut().into_iter().flatten() {
                    rule["labelSelector"]["matchLabels"]["metahook-test"] = label.clone();
                }
            }
            "MapController" => {
                doc["metadata"]["name"] = label.clone();
                doc["spec"]["parentResource"]["labelSelector"]["matchLabels"]["metahook-test"] = label;
            }
            _ => doc["metadata"]["labels"]["metahook-test"] = label,
        }
    }
}

/// Merge-patches an object.
async fn merge(api: &Api<DynamicObject>, name: &str, patch: &Value) -> DynamicObject {
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap_or_else(|e| panic!("patching {name}: {e}"))
}

fn uid(obj: &DynamicObject) -> String {
    obj.metadata.uid.clone().unwrap_or_default()
}

/// The status of `name` once `check` accepts it.
async fn status_where(objects: &Api<DynamicObject>, name: &str, check: impl Fn(&Value) -> bool) -> Option<Value> {
    let obj = objects.get_opt(name).await.unwrap()?;
    check(&obj.data["status"]).then(|| obj.data["status"].clone())
}

#[tokio::test]
async fn hello_world_runs_ready_greeting_pods_and_scales_them() {
    let ex = Example::python("py-hello-world", "examples-python/hello-world").await;
    ex.apply_files(&["crd.yaml", "controller.yaml", "hello.yaml"]).await;
    let worlds = ex.api("example.metahook.dev/v1", "HelloWorld").await;
    let pods = ex.api("v1", "Pod").await;

    let status = eventually(WAIT, || status_where(&worlds, "world", |s| s["readyPods"] == 2)).await;
    assert_eq!(status["message"], "Hello, World!");
    assert_eq!(status["pods"], 2);
    let mut first = Vec::new();
    for name in ["world-0", "world-1"] {
        let pod = pods.get(name).await.unwrap();
        assert_eq!(pod.data["spec"]["containers"][0]["command"], json!(["echo", "Hello, World!"]));
        assert_eq!(pod.labels().get("app").map(String::as_str), Some("hello-world"));
        first.push(uid(&pod));
    }

    // Fewer replicas: the Pods no longer desired are deleted, and the status follows.
    merge(&worlds, "world", &json!({"spec": {"replicas": 1}})).await;
    eventually(WAIT, || async { pods.get_opt("world-1").await.unwrap().is_none().then_some(()) }).await;
    eventually(WAIT, || status_where(&worlds, "world", |s| s["pods"] == 1 && s["readyPods"] == 1)).await;
    assert_eq!(uid(&pods.get("world-0").await.unwrap()), first[0], "the remaining Pod is left alone");
    ex.finish().await;
}

#[tokio::test]
async fn configmap_propagation_copies_the_source_into_selected_namespaces_and_follows_it() {
    let mut ex = Example::python("py-cm-propagation", "examples-python/configmap-propagation").await;
    ex.apply_files(&["crd.yaml", "controller.yaml"]).await;
    // The sample's source moves to the test namespace; its selector picks namespaces labelled for this test.
    let team = ex.label.clone();
    let blue = ex.namespace("blue", &json!({"team": team})).await;
    let other = ex.namespace("other", &json!({})).await;
    let parent = format!("{}-settings", ex.label);
    ex.apply(&propagation_docs(&ex, &parent, &team)).await;

    let propagations = ex.api_in("python.examples.metahook.dev/v1", "ConfigMapPropagation", None).await;
    let in_blue = ex.api_in("v1", "ConfigMap", Some(&blue)).await;
    let in_other = ex.api_in("v1", "ConfigMap", Some(&other)).await;
    let copy = eventually(WAIT, || copy_with_log_level(&in_blue, "info")).await;
    assert_eq!(copy.data["data"], json!({"log-level": "info", "region": "eu-west-1"}));
    assert_eq!(
        copy.annotations().get("python.examples.metahook.dev/copied-from"),
        Some(&format!("{}/team-settings", ex.ns.name))
    );
    let status = eventually(WAIT, || status_where(&propagations, &parent, |s| s["copies"] == 1)).await;
    assert_eq!(status["namespaces"], 1);
    assert_eq!(status["sourceFound"], true);
    assert!(in_other.get_opt("team-settings").await.unwrap().is_none(), "unselected namespaces get no copy");

    // Changing the source updates the copy in place.
    let sources = ex.api("v1", "ConfigMap").await;
    merge(&sources, "team-settings", &json!({"data": {"log-level": "debug"}})).await;
    let updated = eventually(WAIT, || copy_with_log_level(&in_blue, "debug")).await;
    assert_eq!(uid(&updated), uid(&copy), "InPlace keeps the same object");

    // Labelling a namespace brings a copy there; the status counts both.
    let namespaces = Api::<Namespace>::all(ex.client.clone());
    namespaces
        .patch(&other, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"team": team}}})))
        .await
        .unwrap();
    eventually(WAIT, || copy_with_log_level(&in_other, "debug")).await;
    eventually(WAIT, || status_where(&propagations, &parent, |s| s["copies"] == 2 && s["namespaces"] == 2)).await;

    propagations.delete(&parent, &DeleteParams::default()).await.unwrap();
    ex.finish().await;
}

/// The sample `propagation.yaml` of configmap-propagation for this test: its source ConfigMap in the
/// test's namespace, and the ConfigMapPropagation `parent` copying it to namespaces labelled `team=<team>`.
fn propagation_docs(ex: &Example, parent: &str, team: &str) -> Vec<Value> {
    let mut docs = ex.scoped_docs("propagation.yaml");
    for doc in &mut docs {
        if doc["kind"] == "ConfigMap" {
            doc["metadata"]["namespace"] = json!(ex.ns.name);
        } else {
            doc["metadata"].as_object_mut().unwrap().remove("namespace");
            doc["metadata"]["name"] = json!(parent);
            doc["spec"]["source"]["namespace"] = json!(ex.ns.name);
            doc["spec"]["namespaceSelector"] = json!({"matchLabels": {"team": team}});
        }
    }
    docs
}

/// The copy of `team-settings` in that namespace, once it has this log level.
async fn copy_with_log_level(configmaps: &Api<DynamicObject>, log_level: &str) -> Option<DynamicObject> {
    configmaps.get_opt("team-settings").await.unwrap().filter(|c| c.data["data"]["log-level"] == log_level)
}

/// `(type, reason, note)` of the Events recorded on the object with this UID (Events of cluster-scoped
/// objects are in `default`).
async fn events_for(client: &Client, namespace: &str, uid: &str) -> Vec<(String, String, String)> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    events
        .list(&ListParams::default())
        .await
        .map(|list| list.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid))
        .map(|e| (e.type_.unwrap_or_default(), e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn secret_propagation_follows_a_namespace_selector_with_v2_hooks() {
    let mut ex = Example::python("py-secret-propagation", "examples-python/secret-propagation").await;
    ex.apply_files(&["crd.yaml", "controller.yaml"]).await;
    let prod = ex.namespace("prod", &json!({"environment": "production"})).await;
    let dev = ex.namespace("dev", &json!({"environment": "dev"})).await;
    let parent = format!("{}-registry", ex.label);
    let docs = ex.scoped_docs("propagation.yaml");
    let (mut source, mut propagation) = (docs[0].clone(), docs[1].clone());
    source["metadata"]["namespace"] = json!(ex.ns.name);
    propagation["metadata"].as_object_mut().unwrap().remove("namespace");
    propagation["metadata"]["name"] = json!(parent);
    propagation["spec"]["source"]["namespace"] = json!(ex.ns.name);
    // The sample's selector, narrowed to this test's namespaces.
    propagation["spec"]["namespaceSelector"]["matchLabels"] = json!({"metahook-test": ex.label});

    // Without its source, the propagation says so: status and a Warning Event from the hook.
    ex.apply(std::slice::from_ref(&propagation)).await;
    let propagations = ex.api_in("python.examples.metahook.dev/v1", "SecretPropagation", None).await;
    let status = eventually(WAIT, || status_where(&propagations, &parent, |s| s["sourceFound"] == false)).await;
    assert_eq!(status["copies"], 0);
    let parent_uid = uid(&propagations.get(&parent).await.unwrap());
    eventually(WAIT, || async {
        let events = events_for(&ex.client, "default", &parent_uid).await;
        events.iter().any(|(t, reason, _)| t == "Warning" && reason == "SourceNotFound").then_some(())
    })
    .await;

    // With it, a copy in the selected namespace only (matchExpressions: staging or production).
    ex.apply(&[source]).await;
    let in_prod = Api::<Secret>::namespaced(ex.client.clone(), &prod);
    let in_dev = Api::<Secret>::namespaced(ex.client.clone(), &dev);
    let copy = eventually(WAIT, || secret_with_password(&in_prod, "s3cr3t")).await;
    assert_eq!(copy.data.as_ref().unwrap()["username"].0, b"robot");
    assert_eq!(copy.type_.as_deref(), Some("Opaque"));
    assert_eq!(
        copy.annotations().get("python.examples.metahook.dev/copied-from"),
        Some(&format!("{}/registry-credentials", ex.ns.name))
    );
    let status = eventually(WAIT, || status_where(&propagations, &parent, |s| s["copies"] == 1)).await;
    assert_eq!(status["namespaces"], json!([prod]));
    assert!(in_dev.get_opt("registry-credentials").await.unwrap().is_none(), "environment=dev is not selected");
    let events = events_for(&ex.client, "default", &parent_uid).await;
    assert!(
        events.iter().any(|(t, reason, note)| t == "Normal" && reason == "Propagating" && note.contains(&prod)),
        "{events:?}"
    );

    // A new password reaches the copy in place.
    let sources = ex.api("v1", "Secret").await;
    merge(&sources, "registry-credentials", &json!({"stringData": {"password": "rotated"}})).await;
    let rotated = eventually(WAIT, || secret_with_password(&in_prod, "rotated")).await;
    assert_eq!(rotated.metadata.uid, copy.metadata.uid);

    // Namespaces that start or stop matching gain or lose their copy.
    let namespaces = Api::<Namespace>::all(ex.client.clone());
    let relabel = |ns: String, environment: &'static str| {
        let namespaces = namespaces.clone();
        async move {
            let patch = json!({"metadata": {"labels": {"environment": environment}}});
            namespaces.patch(&ns, &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
        }
    };
    relabel(dev.clone(), "staging").await;
    eventually(WAIT, || secret_with_password(&in_dev, "rotated")).await;
    relabel(prod.clone(), "retired").await;
    eventually(WAIT, || async { in_prod.get_opt("registry-credentials").await.unwrap().is_none().then_some(()) }).await;
    let status = eventually(WAIT, || status_where(&propagations, &parent, |s| s["namespaces"] == json!([dev]))).await;
    assert_eq!(status["copies"], 1);

    // No source, no copies.
    sources.delete("registry-credentials", &DeleteParams::default()).await.unwrap();
    eventually(WAIT, || async { in_dev.get_opt("registry-credentials").await.unwrap().is_none().then_some(()) }).await;
    eventually(WAIT, || status_where(&propagations, &parent, |s| s["sourceFound"] == false)).await;

    propagations.delete(&parent, &DeleteParams::default()).await.unwrap();
    ex.finish().await;
}

/// The copy of `registry-credentials` behind this API, once its password is `password`.
async fn secret_with_password(secrets: &Api<Secret>, password: &str) -> Option<Secret> {
    let secret = secrets.get_opt("registry-credentials").await.unwrap()?;
    let data = secret.data.as_ref()?;
    (data.get("password")?.0 == password.as_bytes()).then_some(secret)
}

#[tokio::test]
async fn indexed_job_runs_one_pod_per_index_within_parallelism_until_all_succeed() {
    let ex = Example::python("py-indexed-job", "examples-python/indexed-job").await;
    ex.apply_files(&["crd.yaml", "controller.yaml", "job.yaml"]).await;
    let jobs = ex.api("python.examples.metahook.dev/v1", "IndexedJob").await;
    let pods = ex.api("v1", "Pod").await;

    // Pods complete on the fake nodes thanks to the template's examples.metahook.dev/fake-complete label.
    let most_running = std::cell::Cell::new(0);
    let status = eventually(WAIT, || async {
        let listed = pods.list(&ListParams::default()).await.ok()?;
        let running = listed
            .items
            .iter()
            .filter(|p| matches!(p.data["status"]["phase"].as_str(), Some("Pending" | "Running") | None))
            .count();
        most_running.set(most_running.get().max(running));
        status_where(&jobs, "squares", |s| s["succeeded"] == 5 && s["active"] == 0).await
    })
    .await;
    let most_running = most_running.get();
    assert!(most_running <= 2, "parallelism 2, but {most_running} Pods ran at once");
    assert_eq!(status["completedIndexes"], json!([0, 1, 2, 3, 4]));
    assert_eq!(status["failed"], 0);
    let conditions = status["conditions"].as_array().expect("conditions");
    assert_eq!(conditions.len(), 1, "{conditions:?}");
    assert_eq!((&conditions[0]["type"], &conditions[0]["status"]), (&json!("Complete"), &json!("True")));
    assert_eq!(conditions[0]["reason"], "AllIndexesSucceeded");
    assert!(conditions[0]["lastTransitionTime"].as_str().is_some_and(|t| t.ends_with('Z')), "{conditions:?}");
    for index in 0..5 {
        let pod = pods.get(&format!("squares-{index}")).await.unwrap();
        assert_eq!(pod.data["status"]["phase"], "Succeeded");
        assert_eq!(pod.data["spec"]["restartPolicy"], "Never");
        let env = &pod.data["spec"]["containers"][0]["env"];
        assert_eq!(env, &json!([{"name": "INDEX", "value": index.to_string()}]));
    }
    let job_uid = uid(&jobs.get("squares").await.unwrap());
    eventually(WAIT, || async {
        let events = events_for(&ex.client, &ex.ns.name, &job_uid).await;
        events.iter().any(|(t, reason, _)| t == "Normal" && reason == "Completed").then_some(())
    })
    .await;
    ex.finish().await;
}

#[tokio::test]
async fn namespace_defaults_decorates_opted_in_namespaces_with_a_quota_a_configmap_and_an_annotation() {
    let mut ex = Example::python("py-namespace-defaults", "examples-python/namespace-defaults").await;
    ex.apply_files(&["controller.yaml"]).await;
    let bystander = ex.namespace("bystander", &json!({"defaults.examples.metahook.dev/tier": "large"})).await;
    let mut team = ex.scoped_docs("namespace.yaml").remove(0);
    let name = format!("{}-team-a", ex.label);
    team["metadata"]["name"] = json!(name);
    ex.apply(std::slice::from_ref(&team)).await;
    ex.namespaces.push(name.clone());

    let namespaces = Api::<Namespace>::all(ex.client.clone());
    let quotas = ex.api_in("v1", "ResourceQuota", Some(&name)).await;
    let settings = ex.api_in("v1", "ConfigMap", Some(&name)).await;
    let quota = eventually(WAIT, || quota_with_pods(&quotas, "10")).await;
    assert_eq!(quota.data["spec"]["hard"]["requests.memory"], "4Gi");
    let ns_uid = namespaces.get(&name).await.unwrap().metadata.uid.unwrap();
    let owner = &quota.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Namespace", ns_uid.as_str()));
    let cm = eventually(WAIT, || async { settings.get_opt("namespace-defaults").await.unwrap() }).await;
    assert_eq!(cm.data["data"], json!({"namespace": name, "tier": "small"}));
    eventually(WAIT, || applied_tier(&namespaces, &name, "small")).await;

    // A new tier resizes the quota in place.
    let set_tier = |tier: &'static str| {
        let (namespaces, name) = (namespaces.clone(), name.clone());
        async move {
            let patch = json!({"metadata": {"labels": {"defaults.examples.metahook.dev/tier": tier}}});
            namespaces.patch(&name, &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
        }
    };
    set_tier("large").await;
    let resized = eventually(WAIT, || quota_with_pods(&quotas, "50")).await;
    assert_eq!(uid(&resized), uid(&quota), "InPlace keeps the same ResourceQuota");
    eventually(WAIT, || applied_tier(&namespaces, &name, "large")).await;

    // An unknown tier falls back to the default one, with a Warning Event on the Namespace.
    set_tier("huge").await;
    eventually(WAIT, || applied_tier(&namespaces, &name, "small")).await;
    eventually(WAIT, || async {
        let events = events_for(&ex.client, "default", &ns_uid).await;
        events.iter().any(|(t, reason, _)| t == "Warning" && reason == "UnknownTier").then_some(())
    })
    .await;

    // A namespace that has not opted in is left alone until it does.
    let bystander_quotas = ex.api_in("v1", "ResourceQuota", Some(&bystander)).await;
    assert!(bystander_quotas.get_opt("defaults").await.unwrap().is_none());
    assert!(namespaces.get(&bystander).await.unwrap().annotations().is_empty());
    let patch = json!({"metadata": {"labels": {"defaults.examples.metahook.dev/enabled": "true"}}});
    namespaces.patch(&bystander, &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
    eventually(WAIT, || quota_with_pods(&bystander_quotas, "50")).await;
    ex.finish().await;
}

/// The `defaults` quota behind this API, once it allows this many Pods.
async fn quota_with_pods(quotas: &Api<DynamicObject>, pods: &str) -> Option<DynamicObject> {
    quotas.get_opt("defaults").await.unwrap().filter(|q| q.data["spec"]["hard"]["pods"] == pods)
}

async fn applied_tier(namespaces: &Api<Namespace>, name: &str, tier: &str) -> Option<()> {
    let ns = namespaces.get(name).await.ok()?;
    (ns.annotations().get("defaults.examples.metahook.dev/applied-tier").map(String::as_str) == Some(tier))
        .then_some(())
}

// ---- namespace-policies --------------------------------------------------------------------------

const MAP_KEY: &str = "metahook.dev/map-key";
const PROFILE: &str = "policy.examples.metahook.dev/profile";

/// The `namespace-policy-<policy>` object of `kind` in `namespace`, if there is one.
async fn policy_output(ex: &Example, kind: &str, namespace: &str, policy: &str) -> Option<DynamicObject> {
    let api_version = if kind == "NetworkPolicy" { "networking.k8s.io/v1" } else { "v1" };
    let api = ex.api_in(api_version, kind, Some(namespace)).await;
    api.get_opt(&format!("namespace-policy-{policy}")).await.unwrap()
}

/// The team the NetworkPolicy admits (`None`: only its own Namespace's Pods).
fn admitted_team(policy: &DynamicObject) -> Option<String> {
    let peers = policy.data["spec"]["ingress"][0]["from"].as_array().expect("ingress peers");
    peers.iter().find_map(|p| p["namespaceSelector"]["matchLabels"]["team"].as_str().map(str::to_owned))
}

#[tokio::test]
async fn namespace_policies_map_each_selected_namespace_to_its_own_outputs_and_keep_quotas_on_release() {
    let mut ex = Example::python("py-namespace-policies", "examples-python/namespace-policies").await;
    ex.apply_files(&["crd.yaml", "controller.yaml"]).await;
    let red = ex.namespace("red", &json!({PROFILE: "restricted", "team": "red"})).await;
    let blue = ex.namespace("blue", &json!({PROFILE: "restricted", "team": "blue"})).await;
    let loner = ex.namespace("loner", &json!({PROFILE: "restricted"})).await;
    let other = ex.namespace("other", &json!({"team": "red"})).await;
    // The sample policy, renamed for this run and narrowed to this test's namespaces.
    let mut policy = ex.scoped_docs("policy.yaml").remove(0);
    let name = format!("{}-restricted", ex.label);
    policy["metadata"]["name"] = json!(name);
    policy["spec"]["selector"]["matchLabels"]["metahook-test"] = json!(ex.label);
    ex.apply(std::slice::from_ref(&policy)).await;
    let policies = ex.api_in("policy.examples.metahook.dev/v1", "NamespacePolicy", None).await;
    let policy_uid = uid(&policies.get(&name).await.unwrap());
    let namespaces = Api::<Namespace>::all(ex.client.clone());

    // Each selected Namespace gets its two outputs, owned by the policy and tagged with the Namespace.
    for (ns, team) in [(&red, Some("red")), (&blue, Some("blue")), (&loner, None)] {
        let np = eventually(WAIT, || policy_output(&ex, "NetworkPolicy", ns, &name)).await;
        assert_eq!(admitted_team(&np).as_deref(), team, "{ns}");
        let quota = eventually(WAIT, || policy_output(&ex, "ResourceQuota", ns, &name)).await;
        assert_eq!(quota.data["spec"]["hard"], json!({"pods": "20", "requests.cpu": "4"}));
        let ns_uid = namespaces.get(ns).await.unwrap().metadata.uid.unwrap();
        for output in [&np, &quota] {
            assert_eq!(output.labels().get(MAP_KEY), Some(&ns_uid), "{ns}");
            let owner = &output.metadata.owner_references.as_ref().unwrap()[0];
            assert_eq!(
                (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
                ("NamespacePolicy", policy_uid.as_str(), Some(true))
            );
        }
    }
    assert!(policy_output(&ex, "NetworkPolicy", &other, &name).await.is_none(), "an unselected Namespace gets nothing");
    let counts = |n: usize| json!({"inputs": {"namespaces": {"total": n}}, "outputs": {"networkpolicies": {"total": n}, "resourcequotas": {"total": n}}});
    eventually(WAIT, || {
        status_where(&policies, &name, |s| s["inputs"] == counts(3)["inputs"] && s["outputs"] == counts(3)["outputs"])
    })
    .await;
    // The Namespace without a team is reported on the policy (Events of cluster-scoped objects are in `default`).
    eventually(WAIT, || async {
        let events = events_for(&ex.client, "default", &policy_uid).await;
        events
            .iter()
            .any(|(t, reason, note)| t == "Warning" && reason == "NoTeam" && note.contains(&loner))
            .then_some(())
    })
    .await;

    // An input that changes rewrites its own outputs only.
    let blue_np = policy_output(&ex, "NetworkPolicy", &blue, &name).await.unwrap();
    let relabel = json!({"metadata": {"labels": {"team": "green"}}});
    namespaces.patch(&red, &PatchParams::default(), &Patch::Merge(&relabel)).await.unwrap();
    eventually(WAIT, || async {
        let np = policy_output(&ex, "NetworkPolicy", &red, &name).await?;
        (admitted_team(&np).as_deref() == Some("green")).then_some(())
    })
    .await;
    let blue_after = policy_output(&ex, "NetworkPolicy", &blue, &name).await.unwrap();
    assert_eq!(blue_after.metadata.resource_version, blue_np.metadata.resource_version, "blue's outputs untouched");

    // A Namespace released by the policy: its NetworkPolicy goes, its quota stays (the tombstone answer).
    let release = json!({"metadata": {"labels": {PROFILE: null}}});
    namespaces.patch(&blue, &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
    eventually(WAIT, || async { policy_output(&ex, "NetworkPolicy", &blue, &name).await.is_none().then_some(()) })
        .await;
    eventually(WAIT, || status_where(&policies, &name, |s| s["inputs"]["namespaces"]["total"] == 2)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let kept = policy_output(&ex, "ResourceQuota", &blue, &name).await.expect("the released Namespace's quota is kept");
    assert_eq!(kept.data["spec"]["hard"]["pods"], "20");
    // Kept outputs are the policy's still, but nobody's input's: a policy change no longer writes them.
    merge(&policies, &name, &json!({"spec": {"quota": {"pods": "30", "requests.cpu": "4"}}})).await;
    for ns in [&red, &loner] {
        eventually(WAIT, || async {
            let quota = policy_output(&ex, "ResourceQuota", ns, &name).await?;
            (quota.data["spec"]["hard"]["pods"] == "30").then_some(())
        })
        .await;
    }
    let kept_after = policy_output(&ex, "ResourceQuota", &blue, &name).await.expect("still kept");
    assert_eq!(kept_after.data["spec"]["hard"]["pods"], "20", "a kept output is not written");

    // Without keepQuotaOnRelease, the next release deletes both outputs.
    merge(&policies, &name, &json!({"spec": {"keepQuotaOnRelease": false}})).await;
    namespaces.patch(&loner, &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
    eventually(WAIT, || async { policy_output(&ex, "ResourceQuota", &loner, &name).await.is_none().then_some(()) })
        .await;
    assert!(policy_output(&ex, "NetworkPolicy", &loner, &name).await.is_none());
    eventually(WAIT, || status_where(&policies, &name, |s| s["inputs"]["namespaces"]["total"] == 1)).await;

    // Deleting the policy deletes what it owns, in every Namespace (the garbage collector's work).
    policies.delete(&name, &DeleteParams::default()).await.unwrap();
    eventually(WAIT, || async { policy_output(&ex, "NetworkPolicy", &red, &name).await.is_none().then_some(()) }).await;
    ex.finish().await;
}

#[tokio::test]
async fn update_strategies_show_in_place_recreate_and_on_delete_side_by_side() {
    let ex = Example::python("py-update-strategies", "examples-python/update-strategies").await;
    ex.apply_files(&["crd.yaml", "controller.yaml", "demo.yaml"]).await;
    let demos = ex.api("python.examples.metahook.dev/v1", "UpdateStrategyDemo").await;
    let pods = ex.api("v1", "Pod").await;
    let configmaps = ex.api("v1", "ConfigMap").await;

    let all_say = |message: &'static str| {
        move |s: &Value| ["inPlace", "recreate", "onDelete"].iter().all(|k| s[k]["message"] == message)
    };
    let before = eventually(WAIT, || status_where(&demos, "demo", all_say("first"))).await;
    merge(&demos, "demo", &json!({"spec": {"message": "second"}})).await;

    // InPlace: same object, new content. Recreate: a new object with the new content.
    let after = eventually(WAIT, || {
        status_where(&demos, "demo", |s| s["inPlace"]["message"] == "second" && s["recreate"]["message"] == "second")
    })
    .await;
    assert_eq!(after["inPlace"]["uid"], before["inPlace"]["uid"]);
    assert_ne!(after["recreate"]["uid"], before["recreate"]["uid"]);
    // OnDelete: the Pod still says "first", and the status says it is behind.
    assert_eq!(after["onDelete"]["uid"], before["onDelete"]["uid"]);
    assert_eq!(after["onDelete"]["message"], "first");
    assert_eq!(after["onDelete"]["upToDate"], false);
    let pod = pods.get("demo-ondelete").await.unwrap();
    assert_eq!(pod.data["spec"]["containers"][0]["env"], json!([{"name": "MESSAGE", "value": "first"}]));

    // Hand edits: InPlace puts the content back, Recreate replaces the object, OnDelete keeps the edit.
    let secrets = ex.api("v1", "Secret").await;
    let edit = json!({"metadata": {"annotations": {"python.examples.metahook.dev/message": "edited by hand"}}});
    merge(&pods, "demo-ondelete", &edit).await;
    merge(&secrets, "demo-recreate", &json!({"stringData": {"message": "edited by hand"}})).await;
    merge(&configmaps, "demo-inplace", &json!({"data": {"message": "edited by hand"}})).await;
    eventually(WAIT, || async {
        let cm = configmaps.get("demo-inplace").await.ok()?;
        let status = status_where(&demos, "demo", |s| {
            s["recreate"]["uid"] != after["recreate"]["uid"]
                && s["recreate"]["message"] == "second"
                && s["onDelete"]["message"] == "edited by hand"
        })
        .await?;
        (cm.data["data"]["message"] == "second" && uid(&cm) == after["inPlace"]["uid"]).then_some(status)
    })
    .await;

    // OnDelete: once someone deletes the Pod, it comes back with the new message.
    pods.delete("demo-ondelete", &DeleteParams::default()).await.unwrap();
    let replaced = eventually(WAIT, || status_where(&demos, "demo", all_say("second"))).await;
    assert_ne!(replaced["onDelete"]["uid"], before["onDelete"]["uid"]);
    assert_eq!(replaced["onDelete"]["upToDate"], true);
    ex.finish().await;
}

#[tokio::test]
async fn hello_world_recreates_its_pods_for_a_new_greeting() {
    let ex = Example::python("py-hello-recreate", "examples-python/hello-world").await;
    ex.apply_files(&["crd.yaml", "controller.yaml", "hello.yaml"]).await;
    let worlds = ex.api("example.metahook.dev/v1", "HelloWorld").await;
    let pods = ex.api("v1", "Pod").await;
    eventually(WAIT, || status_where(&worlds, "world", |s| s["readyPods"] == 2)).await;
    let mut first = Vec::new();
    for name in ["world-0", "world-1"] {
        first.push(uid(&pods.get(name).await.unwrap()));
    }

    // Recreate: a new greeting replaces each Pod (a Pod's command cannot change in place).
    merge(&worlds, "world", &json!({"spec": {"greeting": "Howdy"}})).await;
    for (name, old_uid) in ["world-0", "world-1"].into_iter().zip(&first) {
        eventually(WAIT, || async {
            let pod = pods.get_opt(name).await.unwrap()?;
            (uid(&pod) != *old_uid && pod.data["spec"]["containers"][0]["command"][1] == "Howdy, World!").then_some(())
        })
        .await;
    }
    eventually(WAIT, || status_where(&worlds, "world", |s| s["message"] == "Howdy, World!" && s["readyPods"] == 2))
        .await;
    ex.finish().await;
}

#[tokio::test]
async fn configmap_propagation_removes_the_copy_from_a_namespace_that_stops_matching() {
    let mut ex = Example::python("py-cm-unlabel", "examples-python/configmap-propagation").await;
    ex.apply_files(&["crd.yaml", "controller.yaml"]).await;
    let team = ex.label.clone();
    let blue = ex.namespace("blue", &json!({"team": team})).await;
    let parent = format!("{}-settings", ex.label);
    ex.apply(&propagation_docs(&ex, &parent, &team)).await;
    let propagations = ex.api_in("python.examples.metahook.dev/v1", "ConfigMapPropagation", None).await;
    let in_blue = ex.api_in("v1", "ConfigMap", Some(&blue)).await;
    eventually(WAIT, || copy_with_log_level(&in_blue, "info")).await;
    eventually(WAIT, || status_where(&propagations, &parent, |s| s["copies"] == 1)).await;
    tokio::time::sleep(Duration::from_secs(2)).await; // let the syncs that status change caused settle

    // The Namespace no longer matches the related rule: the parent must be synced again.
    Api::<Namespace>::all(ex.client.clone())
        .patch(&blue, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"team": null}}})))
        .await
        .unwrap();
    eventually(WAIT, || async { in_blue.get_opt("team-settings").await.unwrap().is_none().then_some(()) }).await;
    eventually(WAIT, || status_where(&propagations, &parent, |s| s["copies"] == 0 && s["namespaces"] == 0)).await;
    propagations.delete(&parent, &DeleteParams::default()).await.unwrap();
    ex.finish().await;
}

/// `mtls`: the hub calls the library's HTTPS server, which requires the hub's client certificate; the
/// hub takes the CA and that certificate from the Secrets the controller names, made by the example's
/// own `make-certs.sh`. Its permanent error and its request log's warning reach the Note as Events.
#[tokio::test]
async fn mtls_example_is_called_over_mutual_tls_with_certificates_from_secrets() {
    let dir = "examples-python/mtls";
    let certs = support::example_certs(dir);
    let file = |name: &str| certs.path().join(name).to_string_lossy().into_owned();
    let pem = |name: &str| std::fs::read_to_string(certs.path().join(name)).unwrap();
    let env = [("TLS_CERT_FILE", "hook.crt"), ("TLS_KEY_FILE", "hook.key"), ("TLS_CLIENT_CA_FILE", "ca.crt")]
        .map(|(var, name)| (var.to_owned(), file(name)));
    let mut ex = Example::start_with_env("py-mtls", dir, "python3", &["hook.py"], &env).await;
    for kind in ["CompositeController", "DecoratorController"] {
        ex.controllers.push((kind.to_owned(), ex.label.clone()));
    }
    let mut docs = ex.scoped_docs("controller.yaml");
    let secrets = support::hook_tls_secrets(&mut docs, &ex.ns.name, &pem("ca.crt"), &pem("hub.crt"), &pem("hub.key"));
    assert_eq!(secrets.len(), 2, "the controller names a CA bundle and a client certificate");
    ex.apply(&secrets).await;
    ex.apply_files(&["crd.yaml"]).await;
    ex.apply(&docs).await;
    ex.apply_files(&["note.yaml"]).await;

    let notes = ex.api("python.examples.metahook.dev/v1", "Note").await;
    let config_maps = ex.api("v1", "ConfigMap").await;
    let published = eventually(WAIT, || async { config_maps.get_opt("release-note").await.unwrap() }).await;
    let text = published.data["data"]["note.json"].as_str().unwrap().to_owned();
    assert!(text.contains("mutual TLS"), "{text}");

    // Not JSON: a permanent error, said as an Event and a condition; the ConfigMap stays as it was.
    merge(&notes, "release", &json!({"spec": {"text": "{not json"}})).await;
    let condition = eventually(WAIT, || async {
        let status = notes.get("release").await.unwrap().data["status"].clone();
        status["conditions"].as_array()?.iter().find(|c| c["type"] == "Synced").cloned()
    })
    .await;
    assert_eq!(condition["reason"], "HookPermanentError");
    assert!(condition["message"].as_str().unwrap().contains("spec.text is not valid JSON"), "{condition}");
    let warnings = support::warnings_for(&ex.client, &ex.ns.name, "release").await;
    assert!(warnings.iter().any(|w| w.starts_with("HookPermanentError: ")), "{warnings:?}");
    let kept = config_maps.get("release-note").await.unwrap();
    assert_eq!(kept.metadata.resource_version, published.metadata.resource_version, "the child is left alone");

    // Empty text: published, with the request log's warning as an Event; the condition is gone.
    merge(&notes, "release", &json!({"spec": {"format": "text", "text": ""}})).await;
    eventually(WAIT, || async {
        let cm = config_maps.get("release-note").await.unwrap();
        (cm.data["data"]["note.txt"] == "").then_some(())
    })
    .await;
    let warnings = eventually(WAIT, || async {
        let warnings = support::warnings_for(&ex.client, &ex.ns.name, "release").await;
        warnings.iter().any(|w| w.starts_with("EmptyNote: ")).then_some(warnings)
    })
    .await;
    assert!(warnings.iter().any(|w| w.contains("spec.text is empty")), "{warnings:?}");
    let status = notes.get("release").await.unwrap().data["status"].clone();
    assert!(status.get("conditions").is_none(), "the hook's answer replaced the condition: {status}");
    notes.delete("release", &DeleteParams::default()).await.unwrap();
    ex.finish().await;
}
