//! An operator's teardown, the way Metacontroller's examples end (`kubectl delete -k` of the example's
//! whole directory: the parents' CRD, the controller, the samples, together), and the check that it
//! left nothing of the hub's behind (issue 66): no object still holding a deleted controller's
//! finalizer, no record of its parents, no child whose parent went.

use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersion};
use kube::discovery::Scope;
use kube::{Client, ResourceExt as _};
use serde_json::Value;

/// What an operator's delete of a whole controller may take with a hub running (the bound);
/// the hub needs about a second.
pub const BOUND: Duration = Duration::from_secs(30);

/// `kubectl delete -f` of `docs` (one file of them, in this order), as an operator tears a controller
/// down; returns how long it took (kubectl waits until every object is gone). `ignore_missing`: objects
/// the test deleted already are no error. A process of its own, awaited: the test's hub runs on this
/// thread.
pub async fn kubectl_delete(docs: &[&Value], ignore_missing: bool) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("all.yaml");
    let text: Vec<String> = docs.iter().map(|d| serde_json::to_string(d).unwrap()).collect();
    std::fs::write(&file, text.join("\n---\n")).unwrap();
    let started = Instant::now();
    let mut kubectl = tokio::process::Command::new(super::repo_root().join("tests/cluster/bin/kubectl"));
    kubectl.env("KUBECONFIG", super::kubeconfig_path()).args(["delete", "--timeout=120s"]);
    if ignore_missing {
        kubectl.arg("--ignore-not-found");
    }
    let out = kubectl.arg("-f").arg(&file).output().await.expect("running kubectl");
    let took = started.elapsed();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kubectl delete -f failed ({}) after {took:?}: {said}", out.status);
    took
}

/// The finalizer a controller of `kind` called `name` puts on its parents.
pub fn finalizer_of(kind: &str, name: &str) -> String {
    format!("metacontroller.io/{}-{name}", kind.to_lowercase())
}

/// What the deleted `controllers` (their manifests) left in `namespaces`, and on cluster-scoped objects
/// whose name starts with `prefix`: objects of their parent and child types that still hold one of
/// their finalizers, children whose controlling owner is gone (the garbage collector's to delete),
/// `ChildRecord`s of theirs. Empty: nothing.
pub async fn left_behind(client: &Client, controllers: &[Value], namespaces: &[String], prefix: &str) -> Vec<String> {
    let finalizers: Vec<String> = controllers
        .iter()
        .map(|c| {
            finalizer_of(c["kind"].as_str().unwrap_or_default(), c["metadata"]["name"].as_str().unwrap_or_default())
        })
        .collect();
    let names: Vec<&str> = controllers.iter().filter_map(|c| c["metadata"]["name"].as_str()).collect();
    let mut left = Vec::new();
    for (rule, is_child) in types_of(controllers) {
        let (Some(api_version), Some(resource)) = (rule["apiVersion"].as_str(), rule["resource"].as_str()) else {
            continue;
        };
        // A type no longer served (its CRD went with the controller) has no objects left.
        let Some((ar, scope)) = served(client, api_version, resource).await else { continue };
        for object in objects(client, &ar, &scope, namespaces, prefix).await {
            let at = format!("{} {}/{}", ar.kind, object.namespace().unwrap_or_default(), object.name_any());
            for held in object.finalizers().iter().filter(|f| finalizers.contains(f)) {
                left.push(format!("{at} still holds {held}"));
            }
            if is_child && let Some(owner) = gone_owner(client, &object).await {
                left.push(format!("{at}: its owner {owner} is gone, and it is still here"));
            }
        }
    }
    let records = ApiResource::erase::<metahook::api::record::ChildRecord>(&());
    for record in objects(client, &records, &Scope::Namespaced, namespaces, prefix).await {
        if record.data["spec"]["controller"].as_str().is_some_and(|c| names.contains(&c)) {
            left.push(format!("ChildRecord {}/{}", record.namespace().unwrap_or_default(), record.name_any()));
        }
    }
    left
}

/// Waits (up to [`BOUND`]) until [`left_behind`] finds nothing; panics with what it found last.
pub async fn assert_nothing_left(client: &Client, controllers: &[Value], namespaces: &[String], prefix: &str) {
    let started = Instant::now();
    loop {
        let left = left_behind(client, controllers, namespaces, prefix).await;
        if left.is_empty() {
            return;
        }
        assert!(started.elapsed() < BOUND, "left behind after {BOUND:?}: {left:#?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The controllers' parent types (false) and child types (true), as their specs name them.
fn types_of(controllers: &[Value]) -> Vec<(Value, bool)> {
    let mut types = Vec::new();
    for spec in controllers.iter().map(|c| &c["spec"]) {
        types.push((spec["parentResource"].clone(), false));
        for rule in spec["resources"].as_array().into_iter().flatten() {
            types.push((rule.clone(), false));
        }
        for key in ["childResources", "attachments"] {
            for rule in spec[key].as_array().into_iter().flatten() {
                types.push((rule.clone(), true));
            }
        }
    }
    types
}

/// The type `resource` of `api_version`, if the API server serves it now (no retry: a type whose CRD
/// was just deleted is not waited for).
async fn served(client: &Client, api_version: &str, resource: &str) -> Option<(ApiResource, Scope)> {
    let gv: GroupVersion = api_version.parse().ok()?;
    let group = kube::discovery::oneshot::pinned_group(client, &gv).await.ok()?;
    group
        .versioned_resources(&gv.version)
        .into_iter()
        .find(|(ar, _)| ar.plural == resource)
        .map(|(ar, caps)| (ar, caps.scope))
}

/// The objects of a type in `namespaces` (namespaced) or named `prefix…` (cluster-scoped).
async fn objects(
    client: &Client,
    ar: &ApiResource,
    scope: &Scope,
    namespaces: &[String],
    prefix: &str,
) -> Vec<DynamicObject> {
    let mut found = Vec::new();
    match scope {
        Scope::Namespaced => {
            for ns in namespaces {
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, ar);
                found.extend(api.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default());
            }
        }
        Scope::Cluster => {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
            let all = api.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
            found.extend(all.into_iter().filter(|o| o.name_any().starts_with(prefix)));
        }
    }
    found
}

/// The object's controlling owner, described, when it no longer exists (its type not served, no
/// object of that name, or one with another UID).
async fn gone_owner(client: &Client, object: &DynamicObject) -> Option<String> {
    let owner = object.owner_references().iter().find(|o| o.controller == Some(true))?;
    let said = format!("{} {} ({})", owner.kind, owner.name, owner.uid);
    let gv: GroupVersion = owner.api_version.parse().ok()?;
    let Ok(group) = kube::discovery::oneshot::pinned_group(client, &gv).await else { return Some(said) };
    let Some((ar, caps)) = group.versioned_resources(&gv.version).into_iter().find(|(ar, _)| ar.kind == owner.kind)
    else {
        return Some(said);
    };
    let api: Api<DynamicObject> = match (caps.scope, object.namespace()) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), &ns, &ar),
        _ => Api::all_with(client.clone(), &ar),
    };
    match api.get_opt(&owner.name).await {
        Ok(Some(found)) if found.uid().as_deref() == Some(owner.uid.as_str()) => None,
        Ok(_) => Some(said),
        Err(_) => None,
    }
}
