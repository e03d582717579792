//! Children of one parent: claiming them (adopt matching orphans, release non-matching ones) and
//! making them match the desired set (delete what is no longer wanted, apply the rest).
//!
//! Claiming follows Kubernetes' `ControllerRefManager`: an adoption is preceded by a live read of
//! the parent, so a parent that was deleted and recreated under the same name never adopts its
//! predecessor's children; every ownerRef patch carries UID and resourceVersion tests.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use crate::api::{HookVersion, UpdateMethod, labels_of};
use crate::apply::{Applied, Applier, ApplyError, strip_server_fields};
use crate::discovery::ResolvedResource;
use crate::hooks::{ObjectMaps, group_version_kind_key, object_key};
use crate::informers::{Informer, ObjectKey, controller_uid};
use crate::selector::Selector;

/// The resolved types of `types`, in order.
#[must_use]
pub fn resources(types: &[ChildType]) -> Vec<Arc<ResolvedResource>> {
    types.iter().map(|t| Arc::clone(t.resource())).collect()
}

/// One declared child type, resolved and cached.
#[derive(Clone)]
pub struct ChildType {
    pub method: UpdateMethod,
    pub informer: Informer,
}

impl ChildType {
    #[must_use]
    pub fn resource(&self) -> &Arc<ResolvedResource> {
        self.informer.resource()
    }
}

/// Children of one type, by namespace/name.
pub type ChildMap<T> = BTreeMap<ObjectKey, T>;

/// Why children could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("checking parent {parent} before adopting: {source}")]
    ParentCheck { parent: ObjectKey, source: kube::Error },
    #[error("{action} {kind} {key}: {source}")]
    Patch { action: &'static str, kind: String, key: ObjectKey, source: kube::Error },
}

/// The controller ownerRef that marks an object as a child of `parent`.
#[must_use]
pub fn owner_reference(parent: &DynamicObject, parent_resource: &ResolvedResource) -> OwnerReference {
    OwnerReference {
        api_version: parent_resource.api_version().to_owned(),
        kind: parent_resource.kind().to_owned(),
        name: parent.metadata.name.clone().unwrap_or_default(),
        uid: parent.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// What claiming does with one object of a child type, for one parent: Kubernetes' `ControllerRefManager`
/// rules. [`claim`] acts on it; `metahook render` reports it, so both follow the same rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Controlled by the parent and selected: a child.
    Owned,
    /// An orphan the selector matches: adopted (the parent becomes its controller), then a child.
    Adopt,
    /// Controlled by the parent but no longer selected: released (its ownerReference removed), kept.
    Release,
    /// None of the parent's business: the hub neither reads nor writes it for this parent.
    Ignore(Ignored),
}

/// Why an object is not claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ignored {
    /// Another object is its controller.
    OtherController,
    /// An orphan whose labels the parent's selector does not match.
    NotSelected,
    /// In another namespace than the (namespaced) parent.
    OtherNamespace,
    /// Being deleted (or the parent is): not adopted, not released.
    Deleting,
}

impl std::fmt::Display for Ignored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::OtherController => "controlled by another owner",
            Self::NotSelected => "no controller, and the parent's selector does not match its labels",
            Self::OtherNamespace => "not in the parent's namespace",
            Self::Deleting => "being deleted",
        })
    }
}

/// How claiming treats `obj` for `parent` (scoped to `parent_ns` when the parent is namespaced).
#[must_use]
pub fn claim_of(obj: &DynamicObject, parent: &DynamicObject, parent_ns: Option<&str>, selector: &Selector) -> Claim {
    if parent_ns.is_some() && obj.metadata.namespace.as_deref() != parent_ns {
        return Claim::Ignore(Ignored::OtherNamespace);
    }
    let parent_uid = parent.metadata.uid.as_deref().unwrap_or_default();
    let deleting = parent.metadata.deletion_timestamp.is_some() || obj.metadata.deletion_timestamp.is_some();
    let selected = selector.matches(&labels_of(&obj.metadata));
    match controller_uid(obj) {
        Some(uid) if uid == parent_uid && selected => Claim::Owned,
        Some(uid) if uid == parent_uid && deleting => Claim::Ignore(Ignored::Deleting),
        Some(uid) if uid == parent_uid => Claim::Release,
        Some(_) => Claim::Ignore(Ignored::OtherController),
        None if deleting => Claim::Ignore(Ignored::Deleting),
        None if !selected => Claim::Ignore(Ignored::NotSelected),
        None => Claim::Adopt,
    }
}

/// Claims the children of `parent` for each type: owned-and-matching objects, plus adopted orphans.
/// Owned objects that no longer match `selector` are released. Each decision is [`claim_of`]'s.
pub async fn claim(
    client: &Client,
    parent: &DynamicObject,
    parent_resource: &ResolvedResource,
    selector: &Selector,
    types: &[ChildType],
) -> Result<Vec<ChildMap<Arc<DynamicObject>>>, ClaimError> {
    let parent_uid = parent.metadata.uid.as_deref().unwrap_or_default();
    let parent_ns = parent_resource.namespaced.then_some(parent.metadata.namespace.as_deref()).flatten();
    let parent_deleting = parent.metadata.deletion_timestamp.is_some();
    let mut parent_checked = false;
    let mut claimed = Vec::with_capacity(types.len());
    for child_type in types {
        let mut children = ChildMap::new();
        for obj in child_type.informer.controlled_by(parent_uid) {
            match claim_of(&obj, parent, parent_ns, selector) {
                Claim::Owned => {
                    children.insert(ObjectKey::of(&obj), obj);
                }
                Claim::Release => release(client, child_type.resource(), &obj, parent_uid).await?,
                Claim::Adopt | Claim::Ignore(_) => {}
            }
        }
        if !parent_deleting {
            let orphan_scope = parent_ns.map(Some);
            for obj in child_type.informer.orphans(orphan_scope) {
                if claim_of(&obj, parent, parent_ns, selector) != Claim::Adopt {
                    continue;
                }
                if !parent_checked {
                    if !parent_still_current(client, parent, parent_resource).await? {
                        return Ok(Vec::new());
                    }
                    parent_checked = true;
                }
                let owner = owner_reference(parent, parent_resource);
                let adopted = adopt(client, child_type.resource(), &obj, owner).await?;
                children.insert(ObjectKey::of(&adopted), Arc::new(adopted));
            }
        }
        claimed.push(children);
    }
    Ok(claimed)
}

/// Uncached read: is the parent still the same object (UID) and not being deleted?
async fn parent_still_current(
    client: &Client,
    parent: &DynamicObject,
    resource: &ResolvedResource,
) -> Result<bool, ClaimError> {
    let key = ObjectKey::of(parent);
    let api: Api<DynamicObject> = match &key.namespace {
        Some(ns) if resource.namespaced => Api::namespaced_with(client.clone(), ns, &resource.api_resource),
        _ => Api::all_with(client.clone(), &resource.api_resource),
    };
    let live = api.get_opt(&key.name).await.map_err(|source| ClaimError::ParentCheck { parent: key, source })?;
    Ok(live.is_some_and(|p| p.metadata.uid == parent.metadata.uid && p.metadata.deletion_timestamp.is_none()))
}

async fn adopt(
    client: &Client,
    resource: &ResolvedResource,
    obj: &DynamicObject,
    owner: OwnerReference,
) -> Result<DynamicObject, ClaimError> {
    let mut refs: Vec<OwnerReference> =
        obj.metadata.owner_references.iter().flatten().filter(|r| r.uid != owner.uid).cloned().collect();
    refs.push(owner);
    patch_owner_references(client, resource, obj, &refs, "adopting").await
}

async fn release(
    client: &Client,
    resource: &ResolvedResource,
    obj: &DynamicObject,
    parent_uid: &str,
) -> Result<(), ClaimError> {
    if controller_uid(obj) != Some(parent_uid) {
        return Ok(());
    }
    let refs: Vec<OwnerReference> =
        obj.metadata.owner_references.iter().flatten().filter(|r| r.uid != parent_uid).cloned().collect();
    patch_owner_references(client, resource, obj, &refs, "releasing").await.map(drop)
}

/// Replaces `ownerReferences` if the object is still the one we looked at (UID and resourceVersion tests).
async fn patch_owner_references(
    client: &Client,
    resource: &ResolvedResource,
    obj: &DynamicObject,
    refs: &[OwnerReference],
    action: &'static str,
) -> Result<DynamicObject, ClaimError> {
    let key = ObjectKey::of(obj);
    let api: Api<DynamicObject> = match &key.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource.api_resource),
        None => Api::all_with(client.clone(), &resource.api_resource),
    };
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/uid", "value": obj.metadata.uid},
        {"op": "test", "path": "/metadata/resourceVersion", "value": obj.metadata.resource_version},
        {"op": "add", "path": "/metadata/ownerReferences", "value": refs},
    ]))
    .expect("a well-formed JSON patch");
    api.patch(&key.name, &PatchParams::default(), &Patch::<()>::Json(patch)).await.map_err(|source| ClaimError::Patch {
        action,
        kind: resource.kind().to_owned(),
        key,
        source,
    })
}

/// Deletes observed children that are not desired, then applies every desired child.
/// Continues past individual failures and returns them all, so one bad child does not stall the rest.
pub async fn manage(
    applier: &Applier,
    types: &[ChildType],
    observed: &[ChildMap<Arc<DynamicObject>>],
    desired: &[ChildMap<Value>],
) -> Vec<ApplyError> {
    let mut errors = Vec::new();
    for ((child_type, observed), desired) in types.iter().zip(observed).zip(desired) {
        for (key, obj) in observed {
            if !desired.contains_key(key)
                && obj.metadata.deletion_timestamp.is_none()
                && let Err(e) = applier.delete(child_type.resource(), obj).await
            {
                errors.push(e);
            }
        }
    }
    for ((child_type, observed), desired) in types.iter().zip(observed).zip(desired) {
        for (key, obj) in desired {
            let current = observed.get(key).map(AsRef::as_ref);
            match applier.apply(child_type.resource(), obj, current, child_type.method).await {
                Ok(outcome @ (Applied::Created | Applied::Updated | Applied::Deleted)) => {
                    tracing::info!(kind = child_type.resource().kind(), child = %key, ?outcome, "child changed");
                }
                Ok(Applied::Unchanged) => {}
                Err(e) => errors.push(e),
            }
        }
    }
    errors
}

/// The request map of observed objects (`children`, `attachments`): an entry per declared type, even
/// when empty, keyed per the hook version. `parent_ns` is `None` for a cluster-scoped parent.
#[must_use]
pub fn request_map(
    types: &[Arc<ResolvedResource>],
    version: HookVersion,
    parent_ns: Option<&str>,
    observed: &[ChildMap<Arc<DynamicObject>>],
) -> ObjectMaps {
    let mut maps = ObjectMaps::new();
    for (resource, objects) in types.iter().zip(observed) {
        let entry = maps.entry(group_version_kind_key(resource.api_version(), resource.kind())).or_default();
        for (key, obj) in objects {
            if let Some(k) = object_key(version, parent_ns, key.namespace.as_deref(), &key.name) {
                entry.insert(k, serde_json::to_value(&**obj).unwrap_or(Value::Null));
            }
        }
    }
    maps
}

/// Turns a hook's desired objects into complete objects to apply, by declared type. Each must have
/// apiVersion, kind and name, be of a declared type, and land in a namespace the parent may own;
/// `decorate` adds what the controller kind requires (labels, annotations) or rejects the object.
/// Any problem rejects the whole list: a partial apply could delete children the hook meant to keep.
pub fn desired_children(
    types: &[Arc<ResolvedResource>],
    parent: &DynamicObject,
    parent_resource: &ResolvedResource,
    items: &[Value],
    mut decorate: impl FnMut(&mut serde_json::Map<String, Value>) -> Result<(), String>,
) -> Result<Vec<ChildMap<Value>>, String> {
    let parent_ns = parent_resource.namespaced.then(|| parent.metadata.namespace.clone()).flatten();
    let parent_uid = parent.metadata.uid.as_deref().unwrap_or_default();
    let owner = serde_json::to_value(owner_reference(parent, parent_resource)).unwrap_or(Value::Null);
    let mut desired: Vec<ChildMap<Value>> = vec![ChildMap::new(); types.len()];
    for (position, item) in items.iter().enumerate() {
        let text = |field: &str| item.pointer(field).and_then(Value::as_str).unwrap_or_default();
        let (api_version, kind, name) = (text("/apiVersion"), text("/kind"), text("/metadata/name"));
        if !item.is_object() || api_version.is_empty() || kind.is_empty() {
            return Err(format!("item [{position}] must be an object with apiVersion and kind"));
        }
        if name.is_empty() {
            return Err(format!("item [{position}] ({kind}) has no metadata.name"));
        }
        let index = types
            .iter()
            .position(|t| t.api_version() == api_version && t.kind() == kind)
            .ok_or_else(|| format!("{kind} {name}: {api_version}/{kind} is not a declared child resource"))?;
        let mut obj = strip_server_fields(item.clone());
        let meta = obj
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| format!("{kind} {name}: metadata is not an object"))?;
        let requested = meta.get("namespace").and_then(Value::as_str);
        let namespace = resolve_namespace(&types[index], parent_ns.as_deref(), requested)
            .map_err(|reason| format!("{kind} {name}: {reason}"))?;
        match &namespace {
            Some(ns) => meta.insert("namespace".into(), Value::String(ns.clone())),
            None => meta.remove("namespace"),
        };
        decorate(meta).map_err(|reason| format!("{kind} {name}: {reason}"))?;
        let mut refs: Vec<Value> = meta
            .get("ownerReferences")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|r| r.get("uid").and_then(Value::as_str) != Some(parent_uid))
            .cloned()
            .collect();
        refs.push(owner.clone());
        meta.insert("ownerReferences".into(), Value::Array(refs));
        let key = ObjectKey { namespace, name: name.to_owned() };
        if desired[index].insert(key.clone(), obj).is_some() {
            return Err(format!("{kind} {key} appears more than once"));
        }
    }
    Ok(desired)
}

/// Namespace a desired child lands in. Namespaced children default to the parent's namespace and must
/// stay in it; under a cluster-scoped parent they must name one.
fn resolve_namespace(
    resource: &ResolvedResource,
    parent_ns: Option<&str>,
    requested: Option<&str>,
) -> Result<Option<String>, String> {
    match (resource.namespaced, parent_ns, requested) {
        (false, None, _) => Ok(None),
        (false, Some(_), _) => Err("cluster-scoped children of a namespaced parent are not supported".into()),
        (true, Some(p), None) => Ok(Some(p.to_owned())),
        (true, Some(p), Some(r)) if r == p || r.is_empty() => Ok(Some(p.to_owned())),
        (true, Some(p), Some(r)) => Err(format!("namespace {r} differs from the parent's namespace {p}")),
        (true, None, Some(r)) if !r.is_empty() => Ok(Some(r.to_owned())),
        (true, None, _) => Err("a namespaced child of a cluster-scoped parent must set metadata.namespace".into()),
    }
}

#[cfg(test)]
mod tests {
    use kube::core::ApiResource;

    use super::*;

    fn resource(namespaced: bool) -> ResolvedResource {
        ResolvedResource {
            api_resource: ApiResource {
                group: String::new(),
                version: "v1".into(),
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                plural: "configmaps".into(),
            },
            namespaced,
            has_status: false,
        }
    }

    #[test]
    fn namespaced_children_default_to_and_stay_in_the_parent_namespace() {
        let r = resource(true);
        assert_eq!(resolve_namespace(&r, Some("a"), None).unwrap().as_deref(), Some("a"));
        assert_eq!(resolve_namespace(&r, Some("a"), Some("a")).unwrap().as_deref(), Some("a"));
        assert!(resolve_namespace(&r, Some("a"), Some("b")).unwrap_err().contains("differs"));
    }

    #[test]
    fn cluster_parents_need_explicit_child_namespaces() {
        assert_eq!(resolve_namespace(&resource(true), None, Some("b")).unwrap().as_deref(), Some("b"));
        assert!(resolve_namespace(&resource(true), None, None).is_err());
        assert_eq!(resolve_namespace(&resource(false), None, None).unwrap(), None);
        assert!(resolve_namespace(&resource(false), Some("a"), None).is_err());
    }

    fn object(namespace: &str, labels: &Value, owner: Option<&str>, deleting: bool) -> DynamicObject {
        let refs: Vec<Value> = owner
            .map(|uid| json!({"apiVersion": "x/v1", "kind": "P", "name": "p", "uid": uid, "controller": true}))
            .into_iter()
            .collect();
        let mut meta = json!({"name": "o", "namespace": namespace, "labels": labels, "ownerReferences": refs});
        if deleting {
            meta["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        }
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta})).unwrap()
    }

    #[test]
    fn claims_follow_the_controller_ref_manager_rules() {
        let mut parent = object("a", &json!({}), None, false);
        parent.metadata.uid = Some("parent".into());
        let selector = Selector::from_labels(&BTreeMap::from([("app".to_owned(), "x".to_owned())]));
        let (yes, no) = (json!({"app": "x"}), json!({"app": "y"}));
        let claim = |obj: &DynamicObject| claim_of(obj, &parent, Some("a"), &selector);
        assert_eq!(claim(&object("a", &yes, Some("parent"), false)), Claim::Owned);
        assert_eq!(claim(&object("a", &yes, None, false)), Claim::Adopt);
        assert_eq!(claim(&object("a", &no, Some("parent"), false)), Claim::Release);
        assert_eq!(claim(&object("a", &no, None, false)), Claim::Ignore(Ignored::NotSelected));
        assert_eq!(claim(&object("a", &yes, Some("other"), false)), Claim::Ignore(Ignored::OtherController));
        assert_eq!(claim(&object("b", &yes, None, false)), Claim::Ignore(Ignored::OtherNamespace));
        assert_eq!(claim(&object("a", &yes, None, true)), Claim::Ignore(Ignored::Deleting), "no adopting the dying");
        assert_eq!(claim(&object("a", &no, Some("parent"), true)), Claim::Ignore(Ignored::Deleting));
        assert_eq!(claim(&object("a", &yes, Some("parent"), true)), Claim::Owned, "still a child while it goes");
        // A cluster-scoped parent claims across namespaces.
        assert_eq!(claim_of(&object("b", &yes, None, false), &parent, None, &selector), Claim::Adopt);
        // A parent being deleted adopts and releases nothing.
        let mut dying = parent.clone();
        dying.metadata.deletion_timestamp = object("a", &yes, None, true).metadata.deletion_timestamp;
        let claim = |obj: &DynamicObject| claim_of(obj, &dying, Some("a"), &selector);
        assert_eq!(claim(&object("a", &yes, None, false)), Claim::Ignore(Ignored::Deleting));
        assert_eq!(claim(&object("a", &no, Some("parent"), false)), Claim::Ignore(Ignored::Deleting));
    }
}
