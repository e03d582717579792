//! End-to-end tests of the Node examples in `examples-js/`: each example's own `hook.mjs`, its YAML as
//! shipped, an in-process hub, and the real local control plane doing the rest (`ReplicaSets`, Pods,
//! Services, RBAC).
//!
//! Tests share the cluster with other tests: controllers are renamed per run, decorators of built-in
//! types are narrowed to objects labelled for this test, and everything else lives in the test's
//! namespace or has a name made from it.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, Pod};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{Example, api, apply_docs, apply_value, events_on, eventually, unique_suffix, warnings_for};

const WAIT: Duration = Duration::from_secs(60);

impl Example {
    /// The example `examples-js/<name>`, its own `hook.mjs` running.
    async fn node(name: &str) -> Self {
        Self::start(&format!("js-{name}"), &format!("examples-js/{name}"), "node", &["hook.mjs"]).await
    }

    /// Applies the example's `crd.yaml`, if it has one.
    async fn install_crd(&self) {
        self.apply(&self.docs("crd.yaml")).await;
    }

    /// Applies the example's `controller.yaml` with each controller renamed for this run, after `narrow`
    /// has had a chance to restrict it to this test's objects. Returns the new names by the old ones.
    async fn apply_controllers(&mut self, narrow: impl Fn(&mut Value)) -> BTreeMap<String, String> {
        let mut names = BTreeMap::new();
        let mut docs = self.docs("controller.yaml");
        for doc in &mut docs {
            let old = doc["metadata"]["name"].as_str().unwrap().to_owned();
            let new = format!("{old}-{}", unique_suffix());
            doc["metadata"]["name"] = json!(new);
            narrow(doc);
            self.controllers.push((doc["kind"].as_str().unwrap().to_owned(), new.clone()));
            names.insert(old, new);
        }
        self.apply(&docs).await;
        names
    }

    /// Fails the test if anything recorded a Warning Event (e.g. a `SyncError`) on the object `name`.
    async fn assert_no_warnings(&self, name: &str) {
        let warnings = warnings_for(&self.client, &self.ns.name, name).await;
        assert!(warnings.is_empty(), "warnings on {name}: {warnings:?}");
    }
}

/// Reasons of the Events recorded on the object `name` in `namespace`.
async fn event_reasons(client: &Client, namespace: &str, name: &str) -> Vec<String> {
    events_on(client, namespace, name).await.into_iter().filter_map(|e| e.reason).collect()
}

fn label<'a>(obj: &'a DynamicObject, key: &str) -> Option<&'a str> {
    obj.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn annotation<'a>(obj: &'a DynamicObject, key: &str) -> Option<&'a str> {
    obj.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The object's `metadata.uid` (objects read back from the API server always have one).
fn uid(obj: &DynamicObject) -> &str {
    obj.metadata.uid.as_deref().unwrap()
}

// ---- blue-green ---------------------------------------------------------------------------------

const COLOR: &str = "js.examples.metahook.dev/color";

/// The `ReplicaSet` has `n` Pods, all Ready, for its latest spec.
fn replica_set_ready(rs: &DynamicObject, n: i64) -> bool {
    let status = &rs.data["status"];
    rs.data["spec"]["replicas"] == n
        && status["replicas"].as_i64().unwrap_or(0) == n
        && status["readyReplicas"].as_i64().unwrap_or(0) == n
        && status["observedGeneration"].as_i64() >= rs.metadata.generation
}

#[tokio::test]
async fn blue_green_switches_the_service_only_once_the_new_color_is_ready() {
    let mut ex = Example::node("blue-green").await;
    ex.install_crd().await;
    ex.apply_controllers(|_| {}).await;
    let mut sample = ex.docs("bluegreen.yaml");
    ex.apply(&sample).await;
    let bgds = ex.api("js.examples.metahook.dev/v1", "BlueGreenDeployment").await;
    let replica_sets = ex.api("apps/v1", "ReplicaSet").await;
    let services = ex.api("v1", "Service").await;
    let status = |wanted: &'static str| {
        let bgds = bgds.clone();
        move || {
            let bgds = bgds.clone();
            async move {
                let status = bgds.get("web").await.ok()?.data["status"].clone();
                (status["activeColor"] == wanted && status["phase"] == "Stable" && status["readyReplicas"] == 2)
                    .then_some(status)
            }
        }
    };

    // First rollout: straight to blue, two Ready Pods behind the Service.
    let first = eventually(WAIT, status("blue")).await;
    assert_eq!(first["green"], Value::Null, "no second color before the first template change");
    let blue = replica_sets.get("web-blue").await.unwrap();
    assert!(replica_set_ready(&blue, 2));
    assert_eq!(label(&blue, "app"), Some("web"), "children carry the parent's selector labels");
    let service = services.get("web").await.unwrap();
    assert_eq!(service.data["spec"]["selector"], json!({"app": "web", COLOR: "blue"}));
    assert_eq!(service.data["spec"]["ports"][0]["port"], 80);

    // A template change rolls out to green; the Service switches only when green is all Ready.
    sample[0]["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.28");
    ex.apply(&sample).await;
    eventually(WAIT, || async {
        let service = services.get("web").await.ok()?;
        (service.data["spec"]["selector"][COLOR] == "green").then_some(())
    })
    .await;
    let green = replica_sets.get("web-green").await.unwrap();
    assert!(replica_set_ready(&green, 2), "the Service switched to a color that was not Ready: {:?}", green.data);
    assert_eq!(green.data["spec"]["template"]["spec"]["containers"][0]["image"], "nginx:1.28");

    // Then blue scales to 0 but stays, keeping its template for a quick rollback.
    let second = eventually(WAIT, status("green")).await;
    let blue_after =
        eventually(WAIT, || async { replica_sets.get("web-blue").await.ok().filter(|rs| replica_set_ready(rs, 0)) })
            .await;
    assert_eq!(uid(&blue_after), uid(&blue));
    assert_eq!(blue_after.data["spec"]["template"]["spec"]["containers"][0]["image"], "nginx:1.27");
    assert_eq!(second["blue"]["templateHash"], first["templateHash"]);
    assert_ne!(second["templateHash"], first["templateHash"]);
    let pods = ex.api("v1", "Pod").await;
    let green_pods = pods.list(&ListParams::default().labels(&format!("app=web,{COLOR}=green"))).await.unwrap();
    assert_eq!(green_pods.items.len(), 2);
    assert!(event_reasons(&ex.client, &ex.ns.name, "web").await.iter().any(|r| r == "Switched"));

    // Rolling back to the first template scales blue up again and switches back.
    sample[0]["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.27");
    ex.apply(&sample).await;
    eventually(WAIT, status("blue")).await;
    assert_eq!(uid(&replica_sets.get("web-blue").await.unwrap()), uid(&blue), "the old ReplicaSet was reused");
    eventually(WAIT, || async { replica_sets.get("web-green").await.ok().filter(|rs| replica_set_ready(rs, 0)) }).await;

    // A template whose Pods cannot be scheduled never gets traffic...
    let containers = sample[0]["spec"]["template"]["spec"]["containers"].clone();
    sample[0]["spec"]["template"]["spec"] =
        json!({"containers": containers, "nodeSelector": {"js.examples.metahook.dev/no-such-node": "true"}});
    ex.apply(&sample).await;
    let rolling_out = tokio::time::timeout(
        WAIT,
        eventually(WAIT * 2, || async {
            let status = bgds.get("web").await.ok()?.data["status"].clone();
            (status["phase"] == "RollingOut" && status["green"]["replicas"] == 2).then_some(())
        }),
    )
    .await;
    if rolling_out.is_err() {
        // Which side stopped: the ReplicaSet controller (green's own status) or the hub (the parent's).
        let parent = bgds.get("web").await.map(|p| p.data["status"].clone());
        let green = replica_sets.get("web-green").await.map(|rs| (rs.metadata.generation, rs.data["status"].clone()));
        panic!("never RollingOut with 2 green replicas within {WAIT:?}: parent status {parent:?}; web-green {green:?}");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stuck = bgds.get("web").await.unwrap().data["status"].clone();
    assert_eq!((&stuck["activeColor"], &stuck["phase"]), (&json!("blue"), &json!("RollingOut")), "{stuck}");
    assert_eq!(services.get("web").await.unwrap().data["spec"]["selector"][COLOR], "blue");

    // ...and fixing it replaces those Pending Pods before green is switched to (Preparing, then RollingOut).
    sample[0]["spec"]["template"]["spec"] = json!({"containers": containers});
    sample[0]["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.29");
    ex.apply(&sample).await;
    eventually(WAIT, status("green")).await;
    let green_pods = pods.list(&ListParams::default().labels(&format!("app=web,{COLOR}=green"))).await.unwrap();
    let images: Vec<&Value> = green_pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| &p.data["spec"]["containers"][0]["image"])
        .collect();
    assert_eq!(images, [&json!("nginx:1.29"), &json!("nginx:1.29")], "no Pod of the broken template is left");
    eventually(WAIT, || async { replica_sets.get("web-blue").await.ok().filter(|rs| replica_set_ready(rs, 0)) }).await;
    ex.assert_no_warnings("web").await;
    ex.finish().await;
}

// ---- service-per-pod ----------------------------------------------------------------------------

/// Restricts every target rule of a DecoratorController to objects labelled for this test: decorators of
/// built-in types (`StatefulSets`, Pods, CRDs) would otherwise act on other tests' objects too.
fn only_this_test(label: &str) -> impl Fn(&mut Value) + use<> {
    let label = label.to_owned();
    move |controller| {
        for rule in controller["spec"]["resources"].as_array_mut().unwrap() {
            rule["labelSelector"] = json!({"matchLabels": {"metahook-test": label}});
        }
    }
}

#[tokio::test]
async fn service_per_pod_gives_each_pod_a_label_and_a_service_that_follow_the_scale() {
    let mut ex = Example::node("service-per-pod").await;
    let names = ex.apply_controllers(only_this_test(&ex.label)).await;
    let mut sample = ex.docs("statefulset.yaml");
    let set = sample.iter_mut().find(|d| d["kind"] == "StatefulSet").unwrap();
    set["metadata"]["labels"]["metahook-test"] = json!(ex.label);
    set["spec"]["template"]["metadata"]["labels"]["metahook-test"] = json!(ex.label);
    ex.apply(&sample).await;
    let pods = ex.api("v1", "Pod").await;
    let services = ex.api("v1", "Service").await;
    let slices = ex.api("discovery.k8s.io/v1", "EndpointSlice").await;
    let stateful_sets = ex.api("apps/v1", "StatefulSet").await;
    let owner = stateful_sets.get("web").await.unwrap();

    // Each Pod is labelled with its own name, and its Service routes to it alone.
    let check_pod = |pod_name: String| {
        let (pods, services, slices) = (pods.clone(), services.clone(), slices.clone());
        let (owner_uid, decorator) = (uid(&owner).to_owned(), names["js-service-per-pod"].clone());
        async move {
            eventually(WAIT, || async {
                pods.get(&pod_name).await.ok().filter(|p| label(p, "pod-name") == Some(pod_name.as_str()))
            })
            .await;
            let service = eventually(WAIT, || async { services.get_opt(&pod_name).await.unwrap() }).await;
            assert_eq!(service.data["spec"]["selector"], json!({"pod-name": pod_name}));
            assert_eq!(
                service.data["spec"]["ports"],
                json!([{"name": "port-80", "port": 80, "targetPort": 8080, "protocol": "TCP"}])
            );
            let owners = service.metadata.owner_references.clone().unwrap_or_default();
            assert_eq!(owners.iter().map(|o| o.uid.as_str()).collect::<Vec<_>>(), [owner_uid.as_str()]);
            assert_eq!(annotation(&service, "metacontroller.k8s.io/decorator-controller"), Some(decorator.as_str()));
            // The endpoints controller agrees: the Service has exactly this Pod behind it.
            let by_service = ListParams::default().labels(&format!("kubernetes.io/service-name={pod_name}"));
            eventually(WAIT, || async {
                let targets: Vec<Value> = slices
                    .list(&by_service)
                    .await
                    .ok()?
                    .items
                    .iter()
                    .flat_map(|s| s.data["endpoints"].as_array().cloned().unwrap_or_default())
                    .map(|e| e["targetRef"]["name"].clone())
                    .collect();
                (targets == [json!(pod_name)]).then_some(())
            })
            .await;
        }
    };
    for pod in ["web-0", "web-1"] {
        check_pod(pod.to_owned()).await;
    }

    // Scaling up adds a Service; scaling down removes the extra ones.
    let set = sample.iter_mut().find(|d| d["kind"] == "StatefulSet").unwrap();
    set["spec"]["replicas"] = json!(3);
    ex.apply(&sample).await;
    check_pod("web-2".to_owned()).await;
    let set = sample.iter_mut().find(|d| d["kind"] == "StatefulSet").unwrap();
    set["spec"]["replicas"] = json!(1);
    ex.apply(&sample).await;
    eventually(WAIT, || async {
        let gone =
            services.get_opt("web-1").await.unwrap().is_none() && services.get_opt("web-2").await.unwrap().is_none();
        gone.then_some(())
    })
    .await;
    assert!(services.get_opt("web-0").await.unwrap().is_some());
    assert!(services.get_opt("web").await.unwrap().is_some(), "the headless Service is not the decorator's");
    ex.assert_no_warnings("web").await;
    ex.finish().await;
}

// ---- crd-roles ----------------------------------------------------------------------------------

/// Whether `user` may `verb` the `resource` of `group` in any namespace, as the API server's RBAC
/// authorizer decides it.
async fn may(client: &Client, user: &str, verb: &str, group: &str, resource: &str) -> bool {
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {"user": user, "resourceAttributes": {"verb": verb, "group": group, "resource": resource}},
    }))
    .unwrap();
    let answer = Api::<SubjectAccessReview>::all(client.clone()).create(&PostParams::default(), &review).await.unwrap();
    answer.status.is_some_and(|s| s.allowed)
}

#[tokio::test]
async fn crd_roles_attach_a_reader_cluster_role_that_grants_exactly_read_access() {
    let mut ex = Example::node("crd-roles").await;
    let names = ex.apply_controllers(only_this_test(&ex.label)).await;
    let decorator = names["js-crd-roles"].clone();
    let client = ex.client.clone();
    // A CRD of this test's own, shaped like the example's gadgets-crd.yaml.
    let group = format!("{}.roles.test.metahook.dev", ex.ns.name);
    let crd_name = format!("gadgets.{group}");
    let role_name = format!("{crd_name}-reader");
    let mut crd = ex.docs("gadgets-crd.yaml").remove(0);
    crd["metadata"]["name"] = json!(crd_name);
    crd["metadata"]["labels"] = json!({"metahook-test": ex.label});
    crd["spec"]["group"] = json!(group);
    crd["spec"]["versions"][0]["subresources"] = json!({"status": {}});
    apply_docs(&client, &[crd]).await;
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let created = crds.get(&crd_name).await.unwrap();

    // The role: owned by the CRD, read-only rules for exactly its resources.
    let roles = Api::<ClusterRole>::all(client.clone());
    let role = eventually(WAIT, || async { roles.get_opt(&role_name).await.unwrap() }).await;
    assert_eq!(
        serde_json::to_value(&role.rules).unwrap(),
        json!([{"apiGroups": [group], "resources": ["gadgets", "gadgets/status"], "verbs": ["get", "list", "watch"]}])
    );
    let owner = &role.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("CustomResourceDefinition", created.metadata.uid.as_deref().unwrap(), Some(true))
    );
    assert_eq!(
        role.metadata.annotations.as_ref().unwrap().get("metacontroller.k8s.io/decorator-controller"),
        Some(&decorator)
    );
    let finalizer = format!("metacontroller.io/decoratorcontroller-{decorator}");
    eventually(WAIT, || async {
        crds.get(&crd_name).await.unwrap().metadata.finalizers.filter(|f| f.contains(&finalizer))
    })
    .await;

    // Bound to a user, it lets them read gadgets and nothing else.
    let user = format!("{}-user", ex.ns.name);
    let binding = format!("{}-reader", ex.ns.name);
    apply_value(
        &client,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": binding},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}),
    )
    .await;
    eventually(WAIT, || async { may(&client, &user, "list", &group, "gadgets").await.then_some(()) }).await;
    assert!(may(&client, &user, "watch", &group, "gadgets").await);
    assert!(!may(&client, &user, "delete", &group, "gadgets").await);
    assert!(!may(&client, &user, "create", &group, "gadgets").await);
    assert!(!may(&client, &user, "list", "", "secrets").await);

    // Opting out runs the finalize hook: the role goes, and so does the finalizer.
    let opt = |enabled: &str| {
        Patch::Merge(json!({"metadata": {"annotations": {"roles.js.examples.metahook.dev/enabled": enabled}}}))
    };
    crds.patch(&crd_name, &PatchParams::default(), &opt("false")).await.unwrap();
    eventually(WAIT, || async {
        let crd = crds.get(&crd_name).await.unwrap();
        let released = !crd.metadata.finalizers.is_some_and(|f| f.contains(&finalizer));
        (released && roles.get_opt(&role_name).await.unwrap().is_none()).then_some(())
    })
    .await;
    eventually(WAIT, || async { (!may(&client, &user, "list", &group, "gadgets").await).then_some(()) }).await;

    // Opting in again brings it back; deleting the CRD is finalized by the hook and takes the role along.
    crds.patch(&crd_name, &PatchParams::default(), &opt("true")).await.unwrap();
    eventually(WAIT, || async { roles.get_opt(&role_name).await.unwrap() }).await;
    eventually(WAIT, || async {
        crds.get(&crd_name).await.unwrap().metadata.finalizers.filter(|f| f.contains(&finalizer))
    })
    .await;
    crds.delete(&crd_name, &DeleteParams::default()).await.unwrap();
    eventually(WAIT, || async {
        let gone =
            crds.get_opt(&crd_name).await.unwrap().is_none() && roles.get_opt(&role_name).await.unwrap().is_none();
        gone.then_some(())
    })
    .await;
    // Events about cluster-scoped targets are recorded in `default`. The hub adds its finalizer with a
    // resourceVersion precondition taken from its cache, and reports the Conflict it meets while the API
    // server is still writing the new CRD's status as a SyncError (then retries and succeeds);
    // Metacontroller retries such conflicts quietly. Anything else is a real failure.
    let warnings: Vec<String> = warnings_for(&client, "default", &crd_name)
        .await
        .into_iter()
        .filter(|w| !(w.starts_with("SyncError: Sync error: updating finalizers") && w.contains("Conflict")))
        .collect();
    assert!(warnings.is_empty(), "{warnings:?}");
    let _ = Api::<ClusterRoleBinding>::all(client.clone()).delete(&binding, &DeleteParams::default()).await;
    ex.finish().await;
}

// ---- cross-namespace-config ---------------------------------------------------------------------

#[tokio::test]
async fn cross_namespace_config_merges_sources_from_another_namespace_and_its_namespace_labels() {
    let mut ex = Example::node("cross-namespace-config").await;
    ex.install_crd().await;
    ex.apply_controllers(|_| {}).await;
    let client = ex.client.clone();
    let namespaces = Api::<Namespace>::all(client.clone());
    let label_namespace = |team: &str| {
        let patch = Patch::Merge(json!({"metadata": {"labels": {"team": team}}}));
        let (namespaces, ns) = (namespaces.clone(), ex.ns.name.clone());
        async move { namespaces.patch(&ns, &PatchParams::default(), &patch).await.unwrap() }
    };
    label_namespace("payments").await;
    // The sample's source namespace, renamed for this test.
    let shared = format!("{}-shared", ex.ns.name);
    let text = serde_json::to_string(&ex.docs("mergedconfig.yaml"))
        .unwrap()
        .replace("\"shared-config\"", &format!("\"{shared}\""));
    let sample: Vec<Value> = serde_json::from_str(&text).unwrap();
    apply_docs(&client, &sample).await;
    let merged_configs = ex.api("js.examples.metahook.dev/v1", "MergedConfig").await;
    let config_maps = ex.api("v1", "ConfigMap").await;
    let sources = api(&client, "v1", "ConfigMap", Some(&shared)).await;
    let merged_data = |wanted: Value| {
        let config_maps = config_maps.clone();
        async move {
            eventually(WAIT, || async {
                config_maps.get_opt("app-config").await.unwrap().filter(|c| c.data["data"] == wanted)
            })
            .await
        }
    };

    // Labelled sources merge in name order ("overrides" wins), then the Namespace's `team` label.
    let merged = merged_data(json!({"log-level": "debug", "timeout": "30s", "team": "payments"})).await;
    let parent = merged_configs.get("app-config").await.unwrap();
    assert_eq!(merged.metadata.owner_references.as_ref().unwrap()[0].uid, uid(&parent));
    let (defaults, overrides) = (format!("{shared}/defaults"), format!("{shared}/overrides"));
    assert_eq!(
        annotation(&merged, "js.examples.metahook.dev/sources"),
        Some(format!("{defaults},{overrides}").as_str())
    );
    let status = eventually(WAIT, || async {
        let status = merged_configs.get("app-config").await.unwrap().data["status"].clone();
        (status["keyCount"] == 3).then_some(status)
    })
    .await;
    // v2 keys: namespace/name for the ConfigMaps of another namespace, the bare name for the Namespace.
    assert_eq!(status["read"], json!({"ConfigMap.v1": [defaults, overrides], "Namespace.v1": [ex.ns.name]}));
    assert_eq!(status["conflicts"], json!(["log-level"]));
    assert_eq!(status["setBy"]["team"], json!(ex.ns.name));
    assert_eq!(status["observedGeneration"], json!(parent.metadata.generation));

    // Changes to the related objects, in the other namespace or cluster-scoped, flow through.
    sources
        .patch("defaults", &PatchParams::default(), &Patch::Merge(json!({"data": {"timeout": "60s"}})))
        .await
        .unwrap();
    merged_data(json!({"log-level": "debug", "timeout": "60s", "team": "payments"})).await;
    sources
        .patch(
            "unrelated",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"merge-into": "app-config"}}})),
        )
        .await
        .unwrap();
    sources
        .patch(
            "overrides",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"merge-into": null}}})),
        )
        .await
        .unwrap();
    merged_data(json!({"log-level": "info", "timeout": "60s", "not-for-app-config": "true", "team": "payments"})).await;
    label_namespace("checkout").await;
    merged_data(json!({"log-level": "info", "timeout": "60s", "not-for-app-config": "true", "team": "checkout"})).await;
    let status = eventually(WAIT, || async {
        let status = merged_configs.get("app-config").await.unwrap().data["status"].clone();
        (status["keyCount"] == 4).then_some(status)
    })
    .await;
    assert_eq!(status["read"]["ConfigMap.v1"], json!([defaults, format!("{shared}/unrelated")]));
    assert_eq!(status["conflicts"], json!([]));
    ex.assert_no_warnings("app-config").await;
    let _ = namespaces.delete(&shared, &DeleteParams::default()).await;
    ex.finish().await;
}

// ---- catset -------------------------------------------------------------------------------------

fn pod_ready(pod: &DynamicObject) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.data["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

fn image(pod: &DynamicObject) -> &str {
    pod.data["spec"]["containers"][0]["image"].as_str().unwrap_or_default()
}

/// The catset example with its controller narrowed to this test's CatSets, and its sample CatSet
/// (labelled for the test) applied; returns the sample for the test to change.
async fn start_catset() -> (Example, Vec<Value>) {
    let mut ex = Example::node("catset").await;
    ex.install_crd().await;
    let label = ex.label.clone();
    ex.apply_controllers(move |cc| {
        cc["spec"]["parentResource"]["labelSelector"] = json!({"matchLabels": {"metahook-test": label}});
    })
    .await;
    let mut sample = ex.docs("catset.yaml");
    sample[0]["metadata"]["labels"] = json!({"metahook-test": ex.label});
    ex.apply(&sample).await;
    (ex, sample)
}

#[tokio::test]
async fn catset_rolls_the_pod_template_one_pod_at_a_time() {
    let (ex, mut sample) = start_catset().await;
    let pods = ex.api("v1", "Pod").await;
    let catsets = ex.api("js.examples.metahook.dev/v1", "CatSet").await;
    let names = ["nginx-0", "nginx-1", "nginx-2"];
    let snapshot = || async {
        let list = pods.list(&ListParams::default().labels("app=nginx")).await.unwrap().items;
        list.into_iter().map(|p| (p.metadata.name.clone().unwrap(), p)).collect::<BTreeMap<_, _>>()
    };
    let all_ready_on = |pods: &BTreeMap<String, DynamicObject>, want: &str| {
        pods.len() == 3 && names.iter().all(|n| pods.get(*n).is_some_and(|p| pod_ready(p) && image(p) == want))
    };
    eventually(WAIT, || async { all_ready_on(&snapshot().await, "nginx:1.27").then_some(()) }).await;
    let claims = ex.api("v1", "PersistentVolumeClaim").await;
    let claim_uids: Vec<String> =
        claims.list(&ListParams::default()).await.unwrap().items.iter().map(|c| uid(c).to_owned()).collect();
    assert_eq!(claim_uids.len(), 3, "a PVC per Pod");

    // Change the template: Pods are replaced one at a time, never more than one unavailable.
    sample[0]["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.28");
    ex.apply(&sample).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let now = snapshot().await;
        let unavailable = names.iter().filter(|n| !now.get(**n).is_some_and(pod_ready)).count();
        assert!(unavailable <= 1, "{unavailable} Pods unavailable at once");
        if all_ready_on(&now, "nginx:1.28") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the rollout did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = eventually(WAIT, || async {
        let status = catsets.get("nginx").await.ok()?.data["status"].clone();
        let updated = status["conditions"].as_array()?.iter().find(|c| c["type"] == "Updated")?.clone();
        (updated["reason"] == "OnLatestRevision" && status["readyReplicas"] == 3).then_some(status)
    })
    .await;
    assert_eq!(status["replicas"], 3);
    let after: Vec<String> =
        claims.list(&ListParams::default()).await.unwrap().items.iter().map(|c| uid(c).to_owned()).collect();
    assert_eq!(after, claim_uids, "PVCs (OnDelete) survive the rollout");
    ex.assert_no_warnings("nginx").await;
    // The finalize hook lets the CatSet go (while the hub still runs, or its finalizer would stay).
    catsets.delete("nginx", &DeleteParams::default()).await.unwrap();
    eventually(WAIT, || async { catsets.get_opt("nginx").await.unwrap().is_none().then_some(()) }).await;
    ex.finish().await;
}

/// The Pods' ordinals (`nginx-<i>`) in order.
async fn ordinals(pods: &Api<DynamicObject>) -> Vec<u32> {
    let list = pods.list(&ListParams::default().labels("app=nginx")).await.unwrap().items;
    let mut ordinals: Vec<u32> =
        list.iter().filter_map(|p| p.metadata.name.as_deref()?.strip_prefix("nginx-")?.parse().ok()).collect();
    ordinals.sort_unstable();
    ordinals
}

/// Polls until the CatSet's Pods are `nginx-0..n-1`, all Ready, and its status says so, checking at every
/// poll that the Pods are `0..k` for some k: a Pod never exists while one below it is missing.
async fn scale_to(ex: &Example, n: u32) {
    let pods = ex.api("v1", "Pod").await;
    let catsets = ex.api("js.examples.metahook.dev/v1", "CatSet").await;
    eventually(WAIT, || async {
        let now = ordinals(&pods).await;
        assert!(now.iter().copied().eq(0..u32::try_from(now.len()).unwrap()), "Pods out of order: {now:?}");
        let ready = pods.list(&ListParams::default().labels("app=nginx")).await.ok()?.items.iter().all(pod_ready);
        let status = catsets.get("nginx").await.ok()?.data["status"].clone();
        (now.len() == n as usize && ready && status["replicas"] == n && status["readyReplicas"] == n).then_some(())
    })
    .await;
}

/// The claims in the test's namespace by name, with their phase.
async fn claim_phases(ex: &Example) -> BTreeMap<String, String> {
    let claims = ex.api("v1", "PersistentVolumeClaim").await;
    let list = claims.list(&ListParams::default()).await.unwrap().items;
    list.into_iter()
        .map(|c| (c.metadata.name.clone().unwrap(), c.data["status"]["phase"].as_str().unwrap_or_default().to_owned()))
        .collect()
}

fn bound(names: std::ops::Range<u32>) -> BTreeMap<String, String> {
    names.map(|i| (format!("www-nginx-{i}"), "Bound".to_owned())).collect()
}

#[tokio::test]
async fn catset_with_claims_scales_in_order_and_its_finalize_hook_scales_to_zero() {
    // As shipped: one claim template `www`, which the cluster's default StorageClass provisions.
    let (ex, mut sample) = start_catset().await;
    scale_to(&ex, 3).await;
    assert_eq!(claim_phases(&ex).await, bound(0..3), "a bound claim per Pod");
    let pods = ex.api("v1", "Pod").await;
    let pod = pods.get("nginx-2").await.unwrap();
    let volumes = pod.data["spec"]["volumes"].as_array().unwrap();
    let www = volumes.iter().find(|v| v["name"] == "www").expect("the claim template's volume");
    assert_eq!(www["persistentVolumeClaim"], json!({"claimName": "www-nginx-2"}));
    // Ordered scale-up: each Pod was created no earlier than the one below it became Ready.
    let typed: Api<Pod> = Api::namespaced(ex.client.clone(), &ex.ns.name);
    for i in 1..3 {
        let below = typed.get(&format!("nginx-{}", i - 1)).await.unwrap();
        let conditions = below.status.and_then(|s| s.conditions).unwrap_or_default();
        let ready_since = conditions.into_iter().find(|c| c.type_ == "Ready").and_then(|c| c.last_transition_time);
        let created = typed.get(&format!("nginx-{i}")).await.unwrap().metadata.creation_timestamp;
        assert!(created >= Some(ready_since.unwrap()), "nginx-{i} was created before nginx-{} was Ready", i - 1);
    }

    sample[0]["spec"]["replicas"] = json!(4);
    ex.apply(&sample).await;
    scale_to(&ex, 4).await;
    eventually(WAIT, || async { (claim_phases(&ex).await == bound(0..4)).then_some(()) }).await;

    sample[0]["spec"]["replicas"] = json!(2);
    ex.apply(&sample).await;
    scale_to(&ex, 2).await;
    assert_eq!(claim_phases(&ex).await, bound(0..4), "claims stay after a scale-down, as a StatefulSet's");

    // Deleting it runs the finalize hook, which scales to zero (in order) before the CatSet goes. A
    // finalizer of the test's own keeps the CatSet readable once the hub has removed its own.
    let catsets = ex.api("js.examples.metahook.dev/v1", "CatSet").await;
    let hold = "metahook.dev/test-hold";
    let live = catsets.get("nginx").await.unwrap();
    let mut finalizers = live.metadata.finalizers.clone().unwrap_or_default();
    finalizers.push(hold.to_owned());
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": live.metadata.resource_version}});
    catsets.patch("nginx", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
    catsets.delete("nginx", &DeleteParams::default()).await.unwrap();
    let finalized = eventually(WAIT, || async {
        let now = ordinals(&pods).await;
        assert!(now.iter().copied().eq(0..u32::try_from(now.len()).unwrap()), "Pods out of order: {now:?}");
        let catset = catsets.get("nginx").await.ok()?;
        let only_ours = catset.metadata.finalizers.as_deref() == Some(&[hold.to_owned()][..]);
        (now.is_empty() && only_ours).then_some(catset)
    })
    .await;
    assert_eq!(finalized.data["spec"]["replicas"], 2, "the spec was left alone");
    assert_eq!(finalized.data["status"]["replicas"], 0, "the finalize hook scaled to zero");
    assert_eq!(finalized.data["status"]["readyReplicas"], 0);

    // Once the CatSet is gone, its claims go with it, and so do their volumes (reclaim policy Delete).
    catsets
        .patch("nginx", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
        .await
        .unwrap();
    let volumes: Api<PersistentVolume> = Api::all(ex.client.clone());
    let ns = ex.ns.name.clone();
    eventually(WAIT, || async {
        let claims_left = claim_phases(&ex).await.len();
        let volumes_left = volumes.list(&ListParams::default()).await.ok()?.items.into_iter().filter(|v| {
            v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| r.namespace.as_deref()) == Some(&ns)
        });
        (catsets.get_opt("nginx").await.ok()?.is_none() && claims_left == 0 && volumes_left.count() == 0).then_some(())
    })
    .await;
    ex.assert_no_warnings("nginx").await;
    ex.finish().await;
}

/// `mtls`: the hub calls the library's HTTPS server, which requires the hub's client certificate; the
/// hub takes the CA and that certificate from the Secrets the controller names. The hook's permanent
/// error (a key no ConfigMap can have) and its `ctx.log.warn` reach the Memo as Events.
#[tokio::test]
async fn mtls_example_is_called_over_mutual_tls_with_certificates_from_secrets() {
    let pki = support::Pki::new();
    let mut ex = Example::start_with_env("js-mtls", "examples-js/mtls", "node", &["hook.mjs"], &pki.hook_env()).await;
    ex.install_crd().await;
    let namespace = ex.ns.name.clone();
    let (ca, cert, key) = (pki.pem("ca.crt"), pki.pem("client.crt"), pki.pem("client.key"));
    let secrets = support::hook_tls_secrets(&mut ex.docs("controller.yaml"), &namespace, &ca, &cert, &key);
    assert_eq!(secrets.len(), 2, "the controller names a CA bundle and a client certificate");
    ex.apply(&secrets).await;
    ex.apply_controllers(|doc| drop(support::hook_tls_secrets(std::slice::from_mut(doc), &namespace, "", "", "")))
        .await;
    ex.apply(&ex.docs("memo.yaml")).await;

    let memos = ex.api("js.examples.metahook.dev/v1", "Memo").await;
    let config_maps = ex.api("v1", "ConfigMap").await;
    let stored = eventually(WAIT, || async { config_maps.get_opt("hello-memo").await.unwrap() }).await;
    assert!(stored.data["data"]["note.txt"].as_str().unwrap().contains("memos do not"), "{:?}", stored.data);
    ex.assert_no_warnings("hello").await;

    // A key no ConfigMap can have: a permanent error, said as an Event and a condition; nothing written.
    let merge = |patch: Value| {
        let memos = memos.clone();
        async move { memos.patch("hello", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap() }
    };
    merge(json!({"spec": {"key": "../escape"}})).await;
    let condition = eventually(WAIT, || async {
        let status = memos.get("hello").await.unwrap().data["status"].clone();
        status["conditions"].as_array()?.iter().find(|c| c["type"] == "Synced").cloned()
    })
    .await;
    assert_eq!(condition["reason"], "HookPermanentError");
    assert!(condition["message"].as_str().unwrap().contains("spec.key must be a ConfigMap key"), "{condition}");
    assert!(event_reasons(&ex.client, &namespace, "hello").await.contains(&"HookPermanentError".to_owned()));
    let kept = config_maps.get("hello-memo").await.unwrap();
    assert_eq!(kept.metadata.resource_version, stored.metadata.resource_version, "the child is left alone");

    // An empty text is stored, with the hook's warning as an Event.
    merge(json!({"spec": {"key": "note.txt", "text": " "}})).await;
    eventually(WAIT, || async {
        let cm = config_maps.get("hello-memo").await.unwrap();
        (cm.data["data"]["note.txt"] == " ").then_some(())
    })
    .await;
    let warnings = eventually(WAIT, || async {
        let warnings = warnings_for(&ex.client, &namespace, "hello").await;
        warnings.iter().any(|w| w.starts_with("EmptyMemo: ")).then_some(warnings)
    })
    .await;
    assert!(warnings.iter().any(|w| w.contains("spec.text is empty")), "{warnings:?}");
    memos.delete("hello", &DeleteParams::default()).await.unwrap();
    ex.finish().await;
}

// ---- snapshot-schedule --------------------------------------------------------------------------

/// The label the hub tags every output of a MapController with: its input's UID.
const MAP_KEY: &str = "metahook.dev/map-key";

/// The snapshot records (the ConfigMaps the hub tagged with a map key) in the test's namespace, by name.
async fn snapshot_records(config_maps: &Api<DynamicObject>) -> BTreeMap<String, DynamicObject> {
    let list = config_maps.list(&ListParams::default().labels(MAP_KEY)).await.unwrap();
    list.items.into_iter().map(|c| (c.metadata.name.clone().unwrap(), c)).collect()
}

/// The schedule's status once the hub has counted `claims` selected claims and `records` records.
async fn schedule_counts(schedules: &Api<DynamicObject>, claims: i64, records: i64) -> Value {
    eventually(WAIT, || async {
        let status = schedules.get("nightly").await.ok()?.data["status"].clone();
        (status["inputs"]["persistentvolumeclaims"]["total"] == claims
            && status["outputs"]["configmaps"]["total"] == records)
            .then_some(status)
    })
    .await
}

#[tokio::test]
async fn snapshot_schedule_keeps_a_record_per_selected_claim_and_retains_those_of_claims_gone() {
    let mut ex = Example::node("snapshot-schedule").await;
    ex.install_crd().await;
    ex.apply_controllers(|_| {}).await;
    // The sample as shipped, its claims given a StorageClass that does not exist: they stay Pending, and
    // no volume is provisioned for them. It retains the records of a claim that is gone for a week.
    let mut sample = ex.docs("snapshotschedule.yaml");
    for claim in sample.iter_mut().filter(|d| d["kind"] == "PersistentVolumeClaim") {
        claim["spec"]["storageClassName"] = json!("js-examples-no-such-class");
    }
    ex.apply(&sample).await;
    let schedules = ex.api("js.examples.metahook.dev/v1", "SnapshotSchedule").await;
    let claims = ex.api("v1", "PersistentVolumeClaim").await;
    let config_maps = ex.api("v1", "ConfigMap").await;
    let (db0, db1) = ("data-db-0-snapshots", "data-db-1-snapshots");

    // A record per claim labelled `app: db`, none for `scratch`; owned by the schedule, tagged with the
    // claim's UID; the status counted by the hub.
    let status = schedule_counts(&schedules, 2, 2).await;
    let schedule = schedules.get("nightly").await.unwrap();
    assert_eq!(status["observedGeneration"], json!(schedule.metadata.generation), "{status}");
    let records = snapshot_records(&config_maps).await;
    assert_eq!(records.keys().collect::<Vec<_>>(), [db0, db1], "exactly one record per selected claim");
    for claim_name in ["data-db-0", "data-db-1"] {
        let claim = claims.get(claim_name).await.unwrap();
        let record = &records[&format!("{claim_name}-snapshots")];
        let owners = record.metadata.owner_references.as_deref().unwrap_or_default();
        assert_eq!(owners.len(), 1, "{owners:?}");
        assert_eq!((owners[0].kind.as_str(), owners[0].uid.as_str()), ("SnapshotSchedule", uid(&schedule)));
        assert_eq!(owners[0].controller, Some(true), "the schedule controls its records");
        assert_eq!(label(record, MAP_KEY), Some(uid(&claim)), "a record is tagged with its claim's UID");
        assert_eq!(annotation(record, "js.examples.metahook.dev/claim"), Some(claim_name));
        assert_eq!(
            record.data["data"],
            json!({"claim": claim_name, "claimUID": uid(&claim), "storageClassName": "js-examples-no-such-class",
                   "requestedStorage": "1Gi", "intervalSeconds": "86400"})
        );
    }

    // `data-db-0` no longer selected: its record is detached, and the tombstone hook keeps it (a week's
    // retention) as it was; a hub without that answer would delete it in this sync.
    let relabel = Patch::Merge(json!({"metadata": {"labels": {"app": "archived"}}}));
    claims.patch("data-db-0", &PatchParams::default(), &relabel).await.unwrap();
    let status = eventually(WAIT, || async {
        let status = schedules.get("nightly").await.ok()?.data["status"].clone();
        (status["inputs"]["persistentvolumeclaims"]["total"] == 1).then_some(status)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let kept = config_maps.get(db0).await.unwrap();
    assert_eq!(kept.metadata.resource_version, records[db0].metadata.resource_version, "kept as it was");
    assert_eq!(label(&kept, MAP_KEY), label(&records[db0], MAP_KEY), "and still tagged with its claim");
    assert_eq!(status["outputs"]["configmaps"]["total"], 2, "a kept record is still the schedule's: {status}");

    // Retention shortened to end 5 s from now: the hook keeps the record and asks to be called again when
    // it is due (`resyncAfterSeconds`); then it goes, by that call alone. The attached record stays.
    let created = kept.metadata.creation_timestamp.as_ref().unwrap().0.as_second();
    let age = k8s_openapi::jiff::Timestamp::now().as_second() - created;
    let retain = |seconds: i64| Patch::Merge(json!({"spec": {"retainDetachedSeconds": seconds}}));
    let shortened = tokio::time::Instant::now();
    schedules.patch("nightly", &PatchParams::default(), &retain(age + 5)).await.unwrap();
    eventually(WAIT, || async { config_maps.get_opt(db0).await.unwrap().is_none().then_some(()) }).await;
    let waited = shortened.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "the record went {waited:?} after the change, before its retention ended"
    );
    schedule_counts(&schedules, 1, 1).await;
    assert_eq!(config_maps.get(db1).await.unwrap().metadata.uid, records[db1].metadata.uid);

    // Retention off: the record of a deleted claim goes with it.
    schedules.patch("nightly", &PatchParams::default(), &retain(0)).await.unwrap();
    claims.delete("data-db-1", &DeleteParams::default()).await.unwrap();
    schedule_counts(&schedules, 0, 0).await;
    assert!(snapshot_records(&config_maps).await.is_empty(), "no record is left");
    assert!(claims.get_opt("scratch").await.unwrap().is_some(), "the unselected claim was never touched");
    ex.assert_no_warnings("nightly").await;
    ex.finish().await;
}
