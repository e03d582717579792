//! The local control plane is the real thing: CRDs with status, the scheduler and fake nodes running
//! Pods, the garbage collector cascading deletes through ownerReferences, and a default StorageClass
//! whose provisioner binds the claims of StatefulSet-style workloads.

mod support;

use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::json;
use support::{TestNamespace, api, apply_value, eventually, install_crds};

const WAIT: Duration = Duration::from_secs(90);

#[tokio::test]
async fn crd_with_status_subresource_is_watched_through_kube_rs() {
    let client = support::client().await;
    install_crds(&client, include_str!("fixtures/test-crds.yaml")).await;
    let ns = TestNamespace::create(&client, "crd-watch").await;
    let things = api(&client, "test.metahook.dev/v1", "Thing", Some(&ns.name)).await;
    let mut seen = watcher(things.clone(), watcher::Config::default()).applied_objects().boxed();

    apply_value(
        &client,
        &json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing",
        "metadata": {"name": "w", "namespace": ns.name}, "spec": {"n": 1}}),
    )
    .await;
    let first = tokio::time::timeout(WAIT, seen.next()).await.expect("watch event").unwrap().unwrap();
    assert_eq!(first.metadata.name.as_deref(), Some("w"));

    let status = json!({"status": {"ok": true}});
    things.patch_status("w", &Default::default(), &kube::api::Patch::Merge(&status)).await.unwrap();
    let updated = tokio::time::timeout(WAIT, async {
        loop {
            let obj = seen.next().await.unwrap().unwrap();
            if obj.data["status"]["ok"] == true {
                return obj;
            }
        }
    })
    .await
    .expect("status change seen through the watch");
    assert_eq!(updated.data["spec"]["n"], 1, "status write left spec alone");
    ns.delete().await;
}

#[tokio::test]
async fn deployment_pods_become_ready_and_are_garbage_collected() {
    let client = support::client().await;
    let ns = TestNamespace::create(&client, "deploy-gc").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns.name);
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": "registry.invalid/web:1"}]}}}
    }))
    .unwrap();
    deployments.create(&PostParams::default(), &deployment).await.unwrap();

    let ready = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    eventually(WAIT, || async {
        let list = pods.list(&ListParams::default().labels("app=web")).await.ok()?;
        (list.items.len() == 2 && list.items.iter().all(ready)).then_some(())
    })
    .await;
    let nodes: std::collections::BTreeSet<String> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.spec.and_then(|s| s.node_name))
        .collect();
    assert!(!nodes.is_empty(), "the scheduler bound the Pods to fake nodes");

    deployments.delete("web", &DeleteParams::default()).await.unwrap();
    eventually(WAIT, || async {
        let rs = replica_sets.list(&ListParams::default()).await.ok()?.items.len();
        let p = pods.list(&ListParams::default()).await.ok()?.items.len();
        (rs == 0 && p == 0).then_some(())
    })
    .await;
    ns.delete().await;
}

#[tokio::test]
async fn statefulset_claims_are_provisioned_and_its_pods_become_ready() {
    let client = support::client().await;
    let ns = TestNamespace::create(&client, "sts-claims").await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns.name);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns.name);
    let set: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {"replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                 "template": {"metadata": {"labels": {"app": "db"}},
                              "spec": {"containers": [{"name": "db", "image": "registry.invalid/db:1",
                                                       "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}},
                 "volumeClaimTemplates": [{"metadata": {"name": "data"},
                                           "spec": {"accessModes": ["ReadWriteOnce"],
                                                    "resources": {"requests": {"storage": "1Gi"}}}}]}
    }))
    .unwrap();
    sets.create(&PostParams::default(), &set).await.unwrap();

    // No storageClassName: the default class's provisioner makes a volume for each claim.
    eventually(WAIT, || async {
        let status = sets.get("db").await.ok()?.status?;
        (status.ready_replicas == Some(2) && status.replicas == 2).then_some(())
    })
    .await;
    let bound = claims.list(&ListParams::default()).await.unwrap().items;
    let names: Vec<_> = bound.iter().filter_map(|c| c.metadata.name.as_deref()).collect();
    assert_eq!(names, ["data-db-0", "data-db-1"]);
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let mut directories = Vec::new();
    for claim in &bound {
        assert_eq!(claim.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Bound"));
        let spec = claim.spec.as_ref().unwrap();
        assert_eq!(spec.storage_class_name.as_deref(), Some("standard"), "the default StorageClass was filled in");
        let volume = volumes.get(spec.volume_name.as_deref().unwrap()).await.unwrap();
        let source = volume.spec.unwrap().host_path.expect("a host-path volume").path;
        assert!(source.starts_with("/tmp/hostpath_pv/"), "provisioned by kube-controller-manager: {source}");
        assert!(std::path::Path::new(&source).is_dir(), "kube-controller-manager made {source}");
        directories.push(source);
    }

    // Deleting the claims (Pods gone first) deletes their volumes and directories: reclaim policy Delete.
    sets.delete("db", &DeleteParams::default()).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    eventually(WAIT, || async { pods.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(()) }).await;
    claims.delete_collection(&DeleteParams::default(), &ListParams::default()).await.unwrap();
    let volume_names: Vec<String> = bound.iter().filter_map(|c| c.spec.as_ref()?.volume_name.clone()).collect();
    eventually(WAIT, || async {
        let left = volumes.list(&ListParams::default()).await.ok()?.items;
        let gone = !left.iter().any(|v| v.metadata.name.as_ref().is_some_and(|n| volume_names.contains(n)));
        (gone && directories.iter().all(|d| !std::path::Path::new(d).exists())).then_some(())
    })
    .await;
    ns.delete().await;
}
