//! The parent's side of a claim on children elsewhere: each namespaced parent of a controller with a
//! `crossNamespace` child type has one [`ChildRecord`] in its own
//! namespace, listing the children the hub made (or adopted) for it outside that namespace. A child
//! there is the parent's only when the record lists it **and** its `metahook.dev/parent-uid` label
//! names the parent: the label alone can be written by anyone who may write the child's namespace.
//!
//! The record's life, so that it is there whenever a decision needs it:
//! - created (empty) before the parent gets the hub's finalizer, so a parent with that finalizer and no
//!   record is one synced by a hub from before records: its first sync records the labelled children
//!   it finds, trusting the labels once, as that hub did
//!   ([`Elsewhere::Labels`](super::children::Elsewhere::Labels));
//! - a child's entry is written **before** the child is created or adopted, and taken out once it is
//!   deleted or released (a failed write of the record writes no child);
//! - owned by the parent (the garbage collector deletes it with the parent, and orphans it on
//!   `--cascade=orphan`, which is how [`Record::orphaned`] reads that intent when no child is in the
//!   parent's namespace), and held by the hub's finalizer until the hub has dealt with the children, so a
//!   foreground deletion (which deletes dependents first) does not take the list away.
//!
//! Only the hub writes records; they are cached by one shared watch (sharded like children, by the
//! parent's bucket). A record the hub has just written may not be in the cache yet: the version it wrote
//! is kept until the cache shows it, and read instead.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::api::record::{ChildRecord, ChildRecordSpec, RecordedChild, RecordedParent};
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::{Informer, ObjectKey};

/// The finalizer that keeps a record until the hub has dealt with its parent's children elsewhere.
pub const RECORD_FINALIZER: &str = "metahook.dev/children-elsewhere";

/// The label naming the controller a record belongs to (to find a deleted controller's records).
pub const RECORD_CONTROLLER_LABEL: &str = "metahook.dev/record-of";

/// Why a record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("writing the record of children elsewhere {key}: {source}")]
    Write { key: ObjectKey, source: kube::Error },
    #[error("reading the record of children elsewhere {key}: {source}")]
    Read { key: ObjectKey, source: kube::Error },
    /// The record's name is held by an object that is not this parent's record: a deleted parent's of the
    /// same name (gone once the hub has dealt with that one's children), or one somebody else wrote.
    /// Nothing of the parent's is written elsewhere until it is gone.
    #[error("the record of children elsewhere {key} is not this parent's ({holder}); it was left untouched")]
    Taken { key: ObjectKey, holder: String },
    /// The record changed since it was read (another writer, or a cache behind): read again.
    #[error("the record of children elsewhere {key} changed since it was read; retrying")]
    Stale { key: ObjectKey },
}

/// One record, as read.
#[derive(Clone, Debug)]
pub struct Record {
    pub key: ObjectKey,
    pub uid: Option<String>,
    pub version: Option<String>,
    /// The parent it is about (in its namespace): name and UID.
    pub parent: RecordedParent,
    /// The children it lists.
    pub children: BTreeSet<RecordedChild>,
    /// Whether it still has its parent's ownerReference (the garbage collector takes it off on
    /// `--cascade=orphan`).
    pub owned_by: Option<String>,
    pub finalized: bool,
    pub deleting: bool,
}

impl Record {
    /// Reads a cached (or written) record object.
    #[must_use]
    pub fn of(obj: &DynamicObject) -> Self {
        let spec: ChildRecordSpec =
            obj.data.get("spec").cloned().and_then(|s| serde_json::from_value(s).ok()).unwrap_or_default();
        Self {
            key: ObjectKey::of(obj),
            uid: obj.metadata.uid.clone(),
            version: obj.metadata.resource_version.clone(),
            parent: spec.parent,
            children: spec.children.into_iter().collect(),
            owned_by: obj.metadata.owner_references.iter().flatten().map(|r| r.uid.clone()).next(),
            finalized: obj.metadata.finalizers.iter().flatten().any(|f| f == RECORD_FINALIZER),
            deleting: obj.metadata.deletion_timestamp.is_some(),
        }
    }

    /// Whether it is `parent`'s: it names the parent's UID. Only the hub writes records, but whoever may
    /// write in the parent's namespace may be allowed to write them too, and a record left by a deleted
    /// parent of the same name names another UID: neither is this parent's word on its children.
    #[must_use]
    pub fn is_of(&self, parent: &DynamicObject) -> bool {
        !self.parent.uid.is_empty() && parent.metadata.uid.as_deref() == Some(self.parent.uid.as_str())
    }

    /// Whether it lists `child`, of type `resource`.
    #[must_use]
    pub fn lists(&self, resource: &ResolvedResource, child: &ObjectKey) -> bool {
        self.children.contains(&entry(resource, child))
    }

    /// Whether it lists `child`, a cached object (which carries its `apiVersion` and `kind`).
    #[must_use]
    pub fn lists_object(&self, child: &DynamicObject) -> bool {
        let Some(types) = &child.types else { return false };
        let group = types.api_version.rsplit_once('/').map_or("", |(group, _)| group);
        let key = ObjectKey::of(child);
        self.children
            .iter()
            .any(|c| c.api_group == group && c.kind == types.kind && c.namespace == key.namespace && c.name == key.name)
    }

    /// Whether the garbage collector orphaned it: the parent `uid` no longer owns it (`kubectl delete
    /// --cascade=orphan` of the parent; under any other deletion it keeps the reference until the
    /// parent is gone).
    #[must_use]
    pub fn orphaned(&self, uid: &str) -> bool {
        self.owned_by.as_deref() != Some(uid)
    }
}

/// The entry naming `child`, of type `resource`.
#[must_use]
pub fn entry(resource: &ResolvedResource, child: &ObjectKey) -> RecordedChild {
    RecordedChild {
        api_group: resource.api_resource.group.clone(),
        kind: resource.kind().to_owned(),
        namespace: child.namespace.clone(),
        name: child.name.clone(),
    }
}

/// The records of one controller's parents.
pub struct Records {
    client: Client,
    informer: Informer,
    controller: String,
    /// Records this process wrote whose version the cache does not show yet (by record key).
    written: Mutex<HashMap<ObjectKey, Arc<Record>>>,
}

impl Records {
    /// The records of `controller`, cached by `informer` (of the `ChildRecord` type).
    #[must_use]
    pub fn new(client: Client, informer: Informer, controller: &str) -> Self {
        Self { client, informer, controller: controller.to_owned(), written: Mutex::default() }
    }

    /// The cache of records.
    #[must_use]
    pub fn informer(&self) -> &Informer {
        &self.informer
    }

    /// The client records are written with.
    #[must_use]
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Where `parent`'s record is.
    #[must_use]
    pub fn key(&self, parent: &DynamicObject) -> ObjectKey {
        record_key(&self.controller, parent)
    }

    /// `parent`'s record as the hub knows it: the one it last wrote if the cache does not show that one
    /// yet, else the cache's. `None`: there is none, or the object where it would be is not the parent's
    /// ([`Record::is_of`]; [`Records::create`] then says whose it is).
    #[must_use]
    pub fn of(&self, parent: &DynamicObject) -> Option<Arc<Record>> {
        let key = self.key(parent);
        let cached = self.informer.get(&key).map(|obj| Arc::new(Record::of(&obj)));
        let mut written = self.written.lock().expect("records lock");
        let known = match written.get(&key) {
            Some(mine) if cached.as_ref().is_none_or(|c| c.version != mine.version) => Some(Arc::clone(mine)),
            Some(_) => {
                written.remove(&key);
                cached
            }
            None => cached,
        };
        known.filter(|record| record.is_of(parent))
    }

    /// Reads `parent`'s record from the API server (a decision that must not act on a cache behind,
    /// such as whether a deletion orphans). `None`: there is none.
    pub async fn live(&self, parent: &DynamicObject) -> Result<Option<Record>, RecordError> {
        let key = self.key(parent);
        let api = self.api(&key);
        let found = api.get_opt(&key.name).await.map_err(|source| RecordError::Read { key: key.clone(), source })?;
        Ok(found.map(|r| Record::of(&to_dynamic(&r))).filter(|record| record.is_of(parent)))
    }

    /// Creates `parent`'s record listing `children` (empty for a new parent), owned by it and held by
    /// the hub's finalizer; `labels` go on it besides the controller's (the parent's bucket, sharded).
    /// A record that exists already is read and returned as it is when it is the parent's — it names
    /// the parent's UID and the parent owns it; any other object there is [`RecordError::Taken`], never
    /// taken over (its list would be read as the parent's word on what is its child elsewhere).
    pub async fn create(
        &self,
        parent: &DynamicObject,
        parent_resource: &ResolvedResource,
        children: BTreeSet<RecordedChild>,
        labels: std::collections::BTreeMap<String, String>,
    ) -> Result<Arc<Record>, RecordError> {
        let key = self.key(parent);
        let mut all_labels = labels;
        all_labels.insert(RECORD_CONTROLLER_LABEL.to_owned(), label_value(&self.controller));
        let record = ChildRecord {
            metadata: kube::api::ObjectMeta {
                name: Some(key.name.clone()),
                namespace: key.namespace.clone(),
                labels: Some(all_labels),
                finalizers: Some(vec![RECORD_FINALIZER.to_owned()]),
                owner_references: Some(vec![OwnerReference {
                    api_version: parent_resource.api_version().to_owned(),
                    kind: parent_resource.kind().to_owned(),
                    name: parent.metadata.name.clone().unwrap_or_default(),
                    uid: parent.metadata.uid.clone().unwrap_or_default(),
                    controller: Some(true),
                    // The garbage collector need not wait for it in a foreground deletion: the hub's own
                    // finalizer on the parent holds the parent until the record's work is done.
                    block_owner_deletion: Some(false),
                }]),
                ..Default::default()
            },
            spec: ChildRecordSpec {
                controller: self.controller.clone(),
                parent: RecordedParent {
                    name: parent.metadata.name.clone().unwrap_or_default(),
                    uid: parent.metadata.uid.clone().unwrap_or_default(),
                },
                children: children.into_iter().collect(),
            },
        };
        let api = self.api(&key);
        match api.create(&PostParams::default(), &record).await {
            Ok(created) => Ok(self.remember(&created)),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let found =
                    api.get(&key.name).await.map_err(|source| RecordError::Read { key: key.clone(), source })?;
                let theirs = Record::of(&to_dynamic(&found));
                if !theirs.is_of(parent) || theirs.owned_by != parent.metadata.uid {
                    let holder = format!("it names parent UID {:?}", theirs.parent.uid);
                    return Err(RecordError::Taken { key, holder });
                }
                let found = self.remember(&found);
                if found.finalized || found.deleting { Ok(found) } else { self.hold(&found).await }
            }
            Err(source) => Err(RecordError::Write { key, source }),
        }
    }

    /// Merges `patch` (which pins the record's `uid` and `resourceVersion`) into `record`: the record
    /// as written, or [`RecordError::Stale`] when it changed or went since it was read.
    async fn patch_read(&self, record: &Record, patch: &Value) -> Result<Arc<Record>, RecordError> {
        let api = self.api(&record.key);
        match api.patch(&record.key.name, &PatchParams::default(), &Patch::Merge(patch)).await {
            Ok(written) => Ok(self.remember(&written)),
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 || s.code == 422 => {
                self.written.lock().expect("records lock").remove(&record.key);
                Err(RecordError::Stale { key: record.key.clone() })
            }
            Err(source) => Err(RecordError::Write { key: record.key.clone(), source }),
        }
    }

    /// Puts the hub's finalizer back on `record`, if it is still the version read (a conflict is
    /// [`RecordError::Stale`]).
    pub async fn hold(&self, record: &Record) -> Result<Arc<Record>, RecordError> {
        let patch = json!({"metadata": {"uid": record.uid, "resourceVersion": record.version,
                                        "finalizers": [RECORD_FINALIZER]}});
        self.patch_read(record, &patch).await
    }

    /// Replaces the children `record` lists with `children`, if the record is still the version read
    /// (a conflict is [`RecordError::Stale`]). Nothing is written when they are the same.
    pub async fn write(&self, record: &Record, children: BTreeSet<RecordedChild>) -> Result<Arc<Record>, RecordError> {
        if record.children == children {
            return Ok(Arc::new(record.clone()));
        }
        let children: Vec<&RecordedChild> = children.iter().collect();
        let patch = json!({"metadata": {"uid": record.uid, "resourceVersion": record.version},
                           "spec": {"children": children}});
        self.patch_read(record, &patch).await
    }

    /// Takes the hub's finalizer off `record` (see [`release_record`]).
    pub async fn release(&self, record: &Record) -> Result<(), RecordError> {
        self.written.lock().expect("records lock").remove(&record.key);
        release_record(&self.client, record).await
    }

    /// Every cached record of this controller.
    #[must_use]
    pub fn all(&self) -> Vec<Record> {
        let mine = label_value(&self.controller);
        self.informer
            .list(None)
            .into_iter()
            .filter(|obj| obj.metadata.labels.as_ref().and_then(|l| l.get(RECORD_CONTROLLER_LABEL)) == Some(&mine))
            .map(|obj| Record::of(&obj))
            .collect()
    }

    /// Knows `written` (a record written elsewhere, such as one moved from the old group,
    /// [`super::record_migration`]) until the cache shows it.
    pub fn know(&self, written: &ChildRecord) {
        self.remember(written);
    }

    fn remember(&self, written: &ChildRecord) -> Arc<Record> {
        let record = Arc::new(Record::of(&to_dynamic(written)));
        self.written.lock().expect("records lock").insert(record.key.clone(), Arc::clone(&record));
        record
    }

    fn api(&self, key: &ObjectKey) -> Api<ChildRecord> {
        Api::namespaced(self.client.clone(), key.namespace.as_deref().unwrap_or_default())
    }
}

/// Takes the hub's finalizer off `record` (its parent's children elsewhere are dealt with, or no hub
/// deals with them any more): the garbage collector may then delete it with its parent, and a record the
/// collector orphaned is deleted here (nobody else would).
pub async fn release_record(client: &Client, record: &Record) -> Result<(), RecordError> {
    let api: Api<ChildRecord> = Api::namespaced(client.clone(), record.key.namespace.as_deref().unwrap_or_default());
    if record.finalized {
        let patch = json!({"metadata": {"uid": record.uid, "finalizers": null}});
        match api.patch(&record.key.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 422 || s.code == 409 => return Ok(()),
            Err(source) => return Err(RecordError::Write { key: record.key.clone(), source }),
        }
    }
    if record.owned_by.is_none() && !record.deleting {
        let params = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions { uid: record.uid.clone(), resource_version: None }),
            ..Default::default()
        };
        match api.delete(&record.key.name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(source) => return Err(RecordError::Write { key: record.key.clone(), source }),
        }
    }
    Ok(())
}

/// Where the record of `parent`, a parent of `controller`, is: in the parent's namespace, named by the
/// parent's UID (a parent made again under its name is another parent, with a record of its own) and
/// the controller (one record per parent and controller).
#[must_use]
pub fn record_key(controller: &str, parent: &DynamicObject) -> ObjectKey {
    let uid = parent.metadata.uid.as_deref().unwrap_or_default();
    let mut name = format!("{uid}.{controller}");
    if name.len() > 253 {
        name = format!("{uid}.{}", &digest(controller)[..12]);
    }
    ObjectKey { namespace: parent.metadata.namespace.clone(), name }
}

/// A controller's name as a label value: itself when it fits (63 characters), else a digest.
#[must_use]
pub fn label_value(controller: &str) -> String {
    if controller.len() <= 63 {
        return controller.to_owned();
    }
    digest(controller)
}

/// The SHA-1 of `text`, in hex (40 characters).
fn digest(text: &str) -> String {
    use sha1::Digest as _;
    use std::fmt::Write as _;
    sha1::Sha1::digest(text.as_bytes()).iter().fold(String::new(), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    })
}

fn to_dynamic(record: &ChildRecord) -> DynamicObject {
    serde_json::to_value(record).ok().and_then(|v| serde_json::from_value(v).ok()).unwrap_or_else(|| DynamicObject {
        types: None,
        metadata: record.metadata.clone(),
        data: serde_json::Value::Null,
    })
}

/// Releases every record of `controller` in the cluster (read live): the controller is deleted, and no
/// hub will deal with its parents' children elsewhere any more. The records stay with their parents
/// (the children keep their labels: a controller started again over the same parents takes them back),
/// or go, if the collector orphaned them. Returns how many were released. (Callers release those still
/// in the old group with [`super::record_migration::release_all`].)
pub async fn release_all(client: &Client, controller: &str) -> Result<usize, RecordError> {
    let api: Api<ChildRecord> = Api::all(client.clone());
    let selector = format!("{RECORD_CONTROLLER_LABEL}={}", label_value(controller));
    let key = ObjectKey { namespace: None, name: format!("records of {controller}") };
    let listed = api
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .map_err(|source| RecordError::Read { key, source })?;
    let mut released = 0;
    for record in listed.items.iter().filter(|r| r.spec.controller == controller) {
        let record = Record::of(&to_dynamic(record));
        if record.finalized || (record.owned_by.is_none() && !record.deleting) {
            release_record(client, &record).await?;
            released += 1;
        }
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent(uid: &str) -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "p", "namespace": "a", "uid": uid}}))
        .unwrap()
    }

    #[test]
    fn a_record_is_named_by_its_parents_uid_and_controller_within_the_name_limit() {
        let key = record_key("tenants", &parent("6f1c2a3b-0001"));
        assert_eq!((key.namespace.as_deref(), key.name.as_str()), (Some("a"), "6f1c2a3b-0001.tenants"));
        let long = "c".repeat(250);
        let key = record_key(&long, &parent("6f1c2a3b-0001"));
        assert!(key.name.len() <= 253 && key.name.starts_with("6f1c2a3b-0001."), "{}", key.name);
        assert_ne!(record_key(&long, &parent("u1")).name, record_key(&format!("{long}x"), &parent("u1")).name);
        assert_eq!(label_value("short"), "short");
        assert_eq!(label_value(&long).len(), 40);
    }

    #[test]
    fn a_record_the_collector_orphaned_says_so_and_one_it_did_not_does_not() {
        let record: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "metahook.dev/v1alpha1", "kind": "ChildRecord",
            "metadata": {"name": "r", "namespace": "a", "finalizers": [RECORD_FINALIZER],
                         "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "p", "uid": "u1"}]},
            "spec": {"controller": "c", "parent": {"name": "p", "uid": "u1"},
                     "children": [{"apiGroup": "", "kind": "ConfigMap", "namespace": "b", "name": "x"}]}}))
        .unwrap();
        let read = Record::of(&record);
        assert!(!read.orphaned("u1") && read.finalized);
        assert_eq!(read.children.len(), 1);
        let mut orphaned = record;
        orphaned.metadata.owner_references = Some(Vec::new());
        assert!(Record::of(&orphaned).orphaned("u1"));
    }
}
