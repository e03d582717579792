//! `metahook rbac` on the real control plane, for hook credentials: a hub that runs as a ServiceAccount
//! holding only what `metahook rbac --base -f controller.yaml` prints reads the TLS Secrets the
//! controller's hook names, and calls the hook over mutual TLS; without the printed credential Roles it
//! cannot read them, and the parent's `SyncError` says Forbidden.

mod support;

use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams};
use metahook::ops::yaml;
use serde_json::{Value, json};
use support::{ExampleHook, Hub, HubAccount, Pki, TestNamespace, api, apply_docs, apply_value, eventually};

const WAIT: Duration = Duration::from_secs(90);
const EXAMPLE: &str = "examples-python/mtls";

#[tokio::test]
async fn a_hub_reads_its_hooks_tls_secrets_with_the_printed_credential_roles_and_not_without() {
    let (client, ns) = support::with_crds("rbac-credentials").await;
    let label = ns.name.clone();
    let pki = Pki::new();
    let hook = ExampleHook::start_with_env(EXAMPLE, "python3", &["hook.py"], &pki.hook_env()).await;

    // The example's controller, named and scoped for this test, its Secrets moved to the test's namespace.
    let doc = |file: &str| support::example_docs(&format!("{EXAMPLE}/{file}"), hook.port, &label, &ns.name);
    let mut controller = doc("controller.yaml");
    assert_eq!(controller.len(), 1);
    controller[0]["metadata"]["name"] = json!(label);
    controller[0]["spec"]["parentResource"]["labelSelector"] = json!({"matchLabels": {"metahook-test": label}});
    let (ca, cert, key) = (pki.pem("ca.crt"), pki.pem("client.crt"), pki.pem("client.key"));
    let secrets = support::hook_tls_secrets(&mut controller, &ns.name, &ca, &cert, &key);
    assert_eq!(secrets.len(), 2, "the controller names a CA bundle and a client certificate");
    apply_docs(&client, &doc("crd.yaml")).await;
    apply_docs(&client, &secrets).await;

    // What `metahook rbac` prints for it: the base and controller ClusterRoles, and the credentials.
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), yaml::to_string(&controller[0]).unwrap()).unwrap();
    let hub_account = format!("{}/hub", ns.name);
    let printed =
        support::metahook_rbac(&["--base", "-f", file.path().to_str().unwrap(), "--service-account", &hub_account]);
    let (cluster_roles, credentials): (Vec<Value>, Vec<Value>) =
        printed.into_iter().partition(|d| d["kind"] == "ClusterRole");
    let kinds: Vec<&str> = credentials.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["Role", "RoleBinding"], "both Secrets are in one namespace");
    let mut names: Vec<&str> = secrets.iter().map(|s| s["metadata"]["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(credentials[0]["metadata"]["namespace"], json!(ns.name));
    assert_eq!(
        credentials[0]["rules"],
        json!([{"apiGroups": [""], "resources": ["secrets"],
        "resourceNames": names, "verbs": ["get", "list", "watch"]}])
    );

    // The hub as the ServiceAccount, first with the ClusterRoles only.
    let mut account = HubAccount::create(&client, &ns.name, &label).await;
    account.grant(&cluster_roles).await;
    let hub = Hub::start(&account.client, &label);
    apply_value(&client, &controller[0]).await;
    let mut note = doc("note.yaml").remove(0);
    note["metadata"]["labels"] = json!({"metahook-test": label});
    apply_value(&client, &note).await;

    let warning = support::warning_eventually(&client, &ns.name, "release", WAIT, |w| {
        w.starts_with("SyncError: ") && w.contains("forbidden")
    })
    .await;
    assert!(warning.contains(&format!("system:serviceaccount:{}:hub", ns.name)), "{warning}");
    assert!(warning.contains("secrets"), "{warning}");
    let config_maps = api(&client, "v1", "ConfigMap", Some(&ns.name)).await;
    assert!(config_maps.get_opt("release-note").await.unwrap().is_none(), "no child without the hook's answer");

    // The printed credential Roles: the hub reads the Secrets, calls the hook, and the child appears.
    // Syncs are asked for again and again: the failed ones back off, as does the Secrets' watch.
    account.grant(&credentials).await;
    let notes = api(&client, "python.examples.metahook.dev/v1", "Note", Some(&ns.name)).await;
    let mut attempt = 0;
    let child = eventually(WAIT, || {
        attempt += 1;
        let (notes, config_maps) = (notes.clone(), config_maps.clone());
        async move {
            let ask = json!({"metadata": {"annotations": {"metahook.dev/sync-requested-at": attempt.to_string()}}});
            notes.patch("release", &PatchParams::default(), &Patch::Merge(ask)).await.unwrap();
            config_maps.get_opt("release-note").await.unwrap()
        }
    })
    .await;
    assert!(child.data["data"]["note.json"].as_str().unwrap().contains("mutual TLS"), "{:?}", child.data);

    notes.delete("release", &DeleteParams::default()).await.unwrap();
    hub.stop().await;
    let controllers = api(&client, support::CONTROLLERS, "CompositeController", None).await;
    let _ = controllers.delete(&label, &DeleteParams::default()).await;
    account.delete().await;
    ns.delete().await;
}

/// The matrix's hook: children from the parent's `spec.children` (`{"name", "namespace"?}`) and a status
/// counting them; a decorator's answer labels its target; the finalize hook lets go.
const MATRIX_HOOK: &str = r#"
def sync(req):
    if "object" in req:
        return {"labels": {"decorated": "yes"}, "status": {"seen": 0}}
    children = []
    for c in (req["parent"].get("spec") or {}).get("children", []):
        metadata = {"name": c["name"]}
        if c.get("namespace"):
            metadata["namespace"] = c["namespace"]
        children.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"v": "1"}})
    return {"children": children, "status": {"seen": len(children)}}

def finalize(req):
    return {"children": [], "finalized": True}

def map(req):
    name = req["input"]["metadata"]["name"]
    return {"outputs": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name + "-out"}}]}
"#;

/// One feature of the least-privilege matrix.
struct Scenario {
    name: &'static str,
    /// The parent (or target) kind: `Thing`, or `StatuslessThing` (no `/status` subresource).
    kind: &'static str,
    decorator: bool,
    finalize: bool,
    /// A child in another namespace (`crossNamespace`).
    elsewhere: bool,
    /// Children rolled out through `ControllerRevision`s (`RollingInPlace`).
    rolling: bool,
    /// A canary of the sync hook (`metahook.dev/canary`), its status written on the controller.
    canary: bool,
    /// A MapController (with a finalize hook) reading ConfigMaps as inputs, writing ConfigMaps.
    map: bool,
}

/// Issue 53 item 6: every feature runs under exactly the role `metahook rbac --base -f controller.yaml`
/// prints for it (composite, finalize hook, children in other namespaces, a parent without `/status`,
/// decorator, rolling updates, canary, MapController). For each scenario a fresh ServiceAccount (audited) bound to that output runs the hub;
/// the scenario is driven to its end (children and status written, the parent deleted and gone, its
/// children elsewhere with it) and the API server's audit log shows no request of the account refused.
/// Before, the cross-namespace controller could not patch its finalizer onto parents and the
/// statusless parent could not get its status (both `cannot patch resource`).
#[tokio::test]
async fn every_feature_runs_under_exactly_the_role_metahook_rbac_prints_for_it() {
    let plain = Scenario {
        name: "composite",
        kind: "Thing",
        decorator: false,
        finalize: false,
        elsewhere: false,
        rolling: false,
        canary: false,
        map: false,
    };
    let scenarios = [
        Scenario { ..plain },
        Scenario { name: "finalize", finalize: true, ..plain },
        Scenario { name: "cross-namespace", elsewhere: true, ..plain },
        Scenario { name: "no-status", kind: "StatuslessThing", ..plain },
        Scenario { name: "decorator", decorator: true, ..plain },
        Scenario { name: "rolling", rolling: true, ..plain },
        Scenario { name: "canary", canary: true, ..plain },
        Scenario { name: "map", map: true, finalize: true, ..plain },
    ];
    let client = support::client().await;
    support::install_metahook_crds(&client).await;
    support::install_crds(&client, include_str!("fixtures/test-crds.yaml")).await;
    support::audited_namespace(&client).await;
    let hook = support::HookServer::start(MATRIX_HOOK).await;
    let mut refused = Vec::new();
    for scenario in &scenarios {
        let ns = TestNamespace::create(&client, &format!("rbac-{}", scenario.name)).await;
        let other = TestNamespace::create(&client, &format!("rbac-{}-b", scenario.name)).await;
        let label = ns.name.clone();
        let resource = if scenario.kind == "Thing" { "things" } else { "statuslessthings" };
        let selector = json!({"matchLabels": {"metahook-test": label}});
        let (kind, spec) = if scenario.map {
            let spec = json!({
                "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": resource, "labelSelector": selector},
                "inputResources": [{"apiVersion": "v1", "resource": "configmaps"}],
                "outputResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
                "hooks": {"map": {"webhook": {"url": hook.url("/map")}},
                          "finalize": {"webhook": {"url": hook.url("/finalize")}}},
            });
            ("MapController", spec)
        } else if scenario.decorator {
            let spec = json!({
                "resources": [{"apiVersion": "test.metahook.dev/v1", "resource": resource, "labelSelector": selector}],
                "hooks": {"sync": {"webhook": {"url": hook.url("/sync")}}},
            });
            ("DecoratorController", spec)
        } else {
            let mut spec = json!({
                "generateSelector": true,
                "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": resource, "labelSelector": selector},
                "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
                "hooks": {"sync": {"webhook": {"url": hook.url("/sync")}}},
            });
            if scenario.finalize {
                spec["hooks"]["finalize"] = json!({"webhook": {"url": hook.url("/finalize")}});
            }
            if scenario.elsewhere {
                spec["childResources"][0]["crossNamespace"] = json!(true);
            }
            if scenario.rolling {
                spec["childResources"][0]["updateStrategy"] = json!({"method": "RollingInPlace"});
            }
            ("CompositeController", spec)
        };
        let mut controller = json!({"apiVersion": support::CONTROLLERS, "kind": kind,
                                    "metadata": {"name": label, "labels": {"metahook-test": label}}, "spec": spec});
        if scenario.canary {
            let canary = json!({"url": hook.url("/sync"), "percent": 100}).to_string();
            controller["metadata"]["annotations"] = json!({"metahook.dev/canary": canary});
        }
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), yaml::to_string(&controller).unwrap()).unwrap();
        let printed = support::metahook_rbac(&["--base", "-f", file.path().to_str().unwrap()]);
        let mut account = HubAccount::create_named(&client, support::AUDITED_NAMESPACE, &label, &label).await;
        account.grant(&printed).await;
        let hub = Hub::start(&account.client, &label);
        apply_value(&client, &controller).await;

        if scenario.map {
            apply_value(
                &client,
                &json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "in", "namespace": ns.name, "labels": {"role": "input"}}}),
            )
            .await;
        }
        let mut children = vec![json!({"name": "p-a"})];
        if scenario.elsewhere {
            children.push(json!({"name": "p-b", "namespace": other.name}));
        }
        apply_value(
            &client,
            &json!({"apiVersion": "test.metahook.dev/v1", "kind": scenario.kind,
                    "metadata": {"name": "p", "namespace": ns.name, "labels": {"metahook-test": label}},
                    "spec": {"children": children, "selector": {"matchLabels": {"role": "input"}}}}),
        )
        .await;
        let parents = api(&client, "test.metahook.dev/v1", scenario.kind, Some(&ns.name)).await;
        let what = scenario.name;
        eventually(WAIT, || async {
            let parent = parents.get("p").await.ok()?;
            let status = &parent.data["status"];
            let labelled = parent.metadata.labels.as_ref().is_some_and(|l| l.contains_key("decorated"));
            let mapped = status["outputs"]["configmaps"]["total"] == 1;
            ((status["seen"].is_number() || scenario.map && mapped) && (!scenario.decorator || labelled)).then_some(())
        })
        .await;
        let here = api(&client, "v1", "ConfigMap", Some(&ns.name)).await;
        if scenario.map {
            eventually(WAIT, || async { here.get_opt("in-out").await.unwrap() }).await;
        } else if !scenario.decorator {
            eventually(WAIT, || async { here.get_opt("p-a").await.unwrap() }).await;
        }
        let there = api(&client, "v1", "ConfigMap", Some(&other.name)).await;
        if scenario.elsewhere {
            eventually(WAIT, || async { there.get_opt("p-b").await.unwrap() }).await;
        }
        if scenario.rolling {
            let revisions = api(&client, support::CONTROLLERS, "ControllerRevision", Some(&ns.name)).await;
            eventually(WAIT, || async {
                (!revisions.list(&Default::default()).await.ok()?.items.is_empty()).then_some(())
            })
            .await;
        }
        if scenario.canary {
            let controllers = api(&client, support::CONTROLLERS, kind, None).await;
            eventually(WAIT, || async {
                let status = controllers.get(&label).await.ok()?.data["status"]["canary"].clone();
                (status["state"] == "Running" && status["candidate"]["syncs"].as_u64() >= Some(1)).then_some(())
            })
            .await;
        }
        if scenario.finalize || scenario.elsewhere {
            eventually(WAIT, || async {
                parents.get("p").await.ok()?.metadata.finalizers.filter(|f| !f.is_empty()).map(drop)
            })
            .await;
        }
        parents.delete("p", &DeleteParams::default()).await.unwrap();
        support::gone(&parents, "p", WAIT).await;
        if scenario.elsewhere {
            support::gone(&there, "p-b", WAIT).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let denied: Vec<String> = support::audit_records(&account.user())
            .into_iter()
            .filter(|r| r["responseStatus"]["code"] == 403)
            .map(|r| format!("{what}: {} {}", r["verb"], r["requestURI"]))
            .collect();
        eprintln!("{what}: {} refused requests", denied.len());
        refused.extend(denied);

        hub.stop().await;
        let controllers = api(&client, support::CONTROLLERS, kind, None).await;
        let _ = controllers.delete(&label, &DeleteParams::default()).await;
        account.delete().await;
        other.delete().await;
        ns.delete().await;
    }
    assert!(refused.is_empty(), "requests the printed roles refused:\n{}", refused.join("\n"));
}
