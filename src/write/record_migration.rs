//! The move of `ChildRecord`s from Metacontroller's API group (`metacontroller.k8s.io`, where hubs up to
//! issue 66 kept them) to the project's own (`metahook.dev`): a controller that keeps records moves its
//! own before it starts ([`migrate`]), and a controller let go of releases the old ones it did not
//! move with the new ones ([`release_all`]).
//!
//! A record is the parent's side of its claim on its children elsewhere: lost, they would be left for
//! good (a parent deleted without it deletes nothing elsewhere). So each old record is copied first —
//! name, namespace, labels, owner and finalizer as they are — and only once the new one exists is the
//! old one let go of (its finalizer taken off, then deleted, both on its UID). A hub stopped at any
//! point leaves either both (the next start finds the new one and lets go of the old) or the new one
//! alone: nothing is lost, and nothing is read from labels.
//!
//! **When to remove this module**: once no cluster can have records in the old group — every
//! installation has run a hub with it at least once with its controllers, or was installed after it —
//! e.g. at the first release after 0.1.0; then the controllers' release calls
//! [`super::records::release_all`] again, and the old group's grant in `metahook rbac`
//! (`crate::tools::rbac`) and the old CRD's removal in the uninstall page go too.

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::records::{RECORD_CONTROLLER_LABEL, RECORD_FINALIZER, RecordError, label_value};
use crate::api::record::{ChildRecord, ChildRecordSpec};
use crate::cache::informers::ObjectKey;

/// The group (and version) records were kept in before: Metacontroller's.
pub const OLD_GROUP_VERSION: &str = "metacontroller.k8s.io/v1alpha1";

/// The old records' type.
fn old_resource() -> ApiResource {
    ApiResource {
        group: "metacontroller.k8s.io".into(),
        version: "v1alpha1".into(),
        api_version: OLD_GROUP_VERSION.into(),
        kind: "ChildRecord".into(),
        plural: "childrecords".into(),
    }
}

/// The old records of `controller` (none where the old CRD is not installed: a 404 of the list).
async fn old_records(client: &Client, controller: &str) -> Result<Vec<DynamicObject>, RecordError> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &old_resource());
    let selector = format!("{RECORD_CONTROLLER_LABEL}={}", label_value(controller));
    match api.list(&ListParams::default().labels(&selector)).await {
        Ok(listed) => {
            Ok(listed.items.into_iter().filter(|r| r.data["spec"]["controller"].as_str() == Some(controller)).collect())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(source) => {
            let key = ObjectKey { namespace: None, name: format!("old records of {controller}") };
            Err(RecordError::Read { key, source })
        }
    }
}

/// Moves `controller`'s records from the old group to the new one: each copied (or found copied by an
/// earlier start), then the old one let go of. Returns the new records, as written or found, so the
/// controller knows them before its cache shows them.
pub async fn migrate(client: &Client, controller: &str) -> Result<Vec<ChildRecord>, RecordError> {
    let mut moved = Vec::new();
    for old in old_records(client, controller).await? {
        let key = ObjectKey::of(&old);
        let namespace = key.namespace.clone().unwrap_or_default();
        let new_api: Api<ChildRecord> = Api::namespaced(client.clone(), &namespace);
        let spec: ChildRecordSpec = serde_json::from_value(old.data["spec"].clone()).unwrap_or_default();
        let copy = ChildRecord {
            metadata: kube::api::ObjectMeta {
                name: Some(key.name.clone()),
                namespace: Some(namespace.clone()),
                labels: old.metadata.labels.clone(),
                owner_references: old.metadata.owner_references.clone(),
                finalizers: Some(old.finalizers().iter().filter(|f| *f == RECORD_FINALIZER).cloned().collect()),
                ..Default::default()
            },
            spec,
        };
        let new = match new_api.create(&PostParams::default(), &copy).await {
            Ok(created) => created,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                new_api.get(&key.name).await.map_err(|source| RecordError::Read { key: key.clone(), source })?
            }
            Err(source) => return Err(RecordError::Write { key, source }),
        };
        tracing::info!(record = %key, "moved a record of children elsewhere to the metahook.dev group");
        let_go(client, &old, true).await?;
        moved.push(new);
    }
    Ok(moved)
}

/// Releases every record of `controller`, in either group (the controller no longer keeps records, or
/// is deleted): the old ones as [`super::records::release_all`] does the new ones, then those. Returns
/// how many.
pub async fn release_all(client: &Client, controller: &str) -> Result<usize, RecordError> {
    let mut released = 0;
    for old in old_records(client, controller).await? {
        let orphaned = old.owner_references().is_empty();
        if old.finalizers().iter().any(|f| f == RECORD_FINALIZER) || orphaned {
            let_go(client, &old, orphaned).await?;
            released += 1;
        }
    }
    Ok(released + super::records::release_all(client, controller).await?)
}

/// Takes the finalizer off `old` and, with `delete`, deletes it (both on its UID; gone is done).
async fn let_go(client: &Client, old: &DynamicObject, delete: bool) -> Result<(), RecordError> {
    let key = ObjectKey::of(old);
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), key.namespace.as_deref().unwrap_or_default(), &old_resource());
    if !old.finalizers().is_empty() {
        let patch = json!({"metadata": {"uid": old.metadata.uid, "finalizers": null}});
        match api.patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 || s.code == 422 => return Ok(()),
            Err(source) => return Err(RecordError::Write { key, source }),
        }
    }
    if delete && old.metadata.deletion_timestamp.is_none() {
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions { uid: old.metadata.uid.clone(), resource_version: None }),
            ..Default::default()
        };
        match api.delete(&key.name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(source) => return Err(RecordError::Write { key, source }),
        }
    }
    Ok(())
}
