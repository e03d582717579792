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
    let client = support::client().await;
    support::install_metahook_crds(&client).await;
    let ns = TestNamespace::create(&client, "rbac-credentials").await;
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

    let warning = eventually(WAIT, || async {
        let warnings = support::warnings_for(&client, &ns.name, "release").await;
        warnings.into_iter().find(|w| w.starts_with("SyncError: ") && w.contains("forbidden"))
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
