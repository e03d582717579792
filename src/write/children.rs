//! Children of one parent: claiming them (adopt matching orphans, release non-matching ones) and
//! making them match the desired set (delete what is no longer wanted, apply the rest).
//!
//! Claiming follows Kubernetes' `ControllerRefManager`: an adoption is preceded by a live read of
//! the parent, so a parent that was deleted and recreated under the same name never adopts its
//! predecessor's children; every ownerRef patch carries UID and resourceVersion tests.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::{StreamExt as _, stream};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use crate::api::record::RecordedChild;
use crate::api::validation;
use crate::api::{HookVersion, UpdateMethod, labels_of};
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::{Informer, ObjectKey, PARENT_ANNOTATION, PARENT_UID_LABEL, controller_uid};
use crate::cache::selector::Selector;
use crate::hooks::{ObjectMaps, WireObject, group_version_kind_key, object_key};
use crate::write::apply::{Adopts, Applied, Applier, ApplyError, DroppedFields, holder, strip_server_fields};
use crate::write::records::{Record, RecordError, Records, entry};

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
    /// Children may live outside the namespaced parent's namespace, tracked by [`PARENT_UID_LABEL`]
    /// there (`crossNamespace`).
    pub cross_namespace: bool,
    /// Selected orphans outside the parent's namespace are adopted too (`adoptAcrossNamespaces`, which
    /// the controller's author sets): without it a parent adopts only in its own namespace, so a parent's
    /// selector (written by whoever may create a parent) reaches no other namespace.
    pub adopt_elsewhere: bool,
}

impl ChildType {
    /// The type `rule` declares, cached by `informer`, updated by `method`.
    #[must_use]
    pub fn new(rule: &crate::api::ChildResourceRule, method: UpdateMethod, informer: Informer) -> Self {
        Self {
            method,
            informer,
            cross_namespace: rule.cross_namespace(),
            adopt_elsewhere: rule.adopts_across_namespaces(),
        }
    }

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
    #[error("checking that parent {parent} is still there: {source}")]
    ParentCheck { parent: ObjectKey, source: kube::Error },
    #[error("{0}")]
    Record(#[source] Box<RecordError>),
    /// An orphan elsewhere to adopt, and no record of the parent's children elsewhere to enter it in.
    #[error("parent {parent} has no record of its children elsewhere yet; retrying")]
    NoRecord { parent: ObjectKey },
    #[error("{action} {kind} {key}: {source}")]
    Patch { action: &'static str, kind: String, key: ObjectKey, source: kube::Error },
}

impl ClaimError {
    /// Whether a retry with a fresh cache resolves it: a record of children elsewhere read before the
    /// hub's own last write of it showed in the cache, or not made yet.
    #[must_use]
    pub fn is_stale(&self) -> bool {
        matches!(self, Self::Record(e) if matches!(**e, RecordError::Stale { .. }))
            || matches!(self, Self::NoRecord { .. })
    }
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
    /// An orphan being deleted (or the parent is): not adopted.
    Deleting,
    /// Controlled by the parent, no longer selected, and being deleted (or the parent is): not released
    /// — whoever deletes it holds it, and a desired child of its name waits for it to go.
    Leaving,
    /// Outside the parent's namespace, labelled as its child, but not listed by its record: only says it
    /// is the parent's (anyone who writes that namespace can write the label).
    Unlisted,
}

impl std::fmt::Display for Ignored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::OtherController => "controlled by another owner",
            Self::NotSelected => "no controller, and the parent's selector does not match its labels",
            Self::OtherNamespace => "not in the parent's namespace",
            Self::Deleting => "being deleted",
            Self::Leaving => "the parent's, no longer selected, and being deleted",
            Self::Unlisted => "says it is the parent's, but the parent's record of children elsewhere does not list it",
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
        Some(uid) if uid == parent_uid && deleting => Claim::Ignore(Ignored::Leaving),
        Some(uid) if uid == parent_uid => Claim::Release,
        Some(_) => Claim::Ignore(Ignored::OtherController),
        None if deleting => Claim::Ignore(Ignored::Deleting),
        None if !selected => Claim::Ignore(Ignored::NotSelected),
        None => Claim::Adopt,
    }
}

/// What claiming decides for one parent from the caches, before any write: by type, the children it
/// owns, and the objects it releases and adopts (each `(type index, object)`). Each decision is
/// [`claim_of`]'s; [`claim`] carries it out, and `metahook diff` shows it without writing.
#[derive(Debug, Default)]
pub struct Claims {
    /// Owned, selected children, by type.
    pub owned: Vec<ChildMap<Arc<DynamicObject>>>,
    /// Controlled by the parent, but no longer selected: their ownerReference goes.
    pub release: Vec<(usize, Arc<DynamicObject>)>,
    /// Selected orphans: the parent becomes their controller.
    pub adopt: Vec<(usize, Arc<DynamicObject>)>,
}

/// Which of a parent's labelled objects outside its namespace are its children (`crossNamespace`): the
/// label alone can be written by whoever may write that namespace, so the parent's side must say so too
/// (see [`crate::write::records`]).
#[derive(Clone, Copy, Debug)]
pub enum Elsewhere<'a> {
    /// Those its record lists.
    Listed(&'a Record),
    /// Every labelled one: a parent a hub from before records synced, whose record is being made from
    /// what it finds (the labels are trusted once, as that hub trusted them).
    Labels,
    /// None: the parent has no record (none of its children is elsewhere, or none may be).
    Nothing,
}

impl Elsewhere<'_> {
    /// Whether `child`, of type `resource`, outside the parent's namespace and labelled with its UID, is
    /// the parent's.
    #[must_use]
    pub fn claims(&self, resource: &ResolvedResource, child: &ObjectKey) -> bool {
        match self {
            Self::Listed(record) => record.lists(resource, child),
            Self::Labels => true,
            Self::Nothing => false,
        }
    }

    /// [`Elsewhere::claims`] of a cached object, whose type it carries.
    #[must_use]
    pub fn claims_object(&self, child: &DynamicObject) -> bool {
        match self {
            Self::Listed(record) => record.lists_object(child),
            Self::Labels => true,
            Self::Nothing => false,
        }
    }
}

/// Whether `obj` is outside the namespace of `parent` (namespaced): whatever says it is the parent's
/// there — its label, or a controller `ownerReference`, which anyone who writes that namespace can write
/// too (and which the garbage collector does not even honour across namespaces) — the record must say
/// so too.
fn outside(obj: &DynamicObject, parent: &DynamicObject, parent_resource: &ResolvedResource) -> bool {
    by_label(parent, parent_resource, obj.metadata.namespace.as_deref())
}

/// Whose `obj`, of one of `parent`'s child types, is — the one answer to "is this the parent's child",
/// which observation ([`claims`]), the namespace narrowing and the plan ([`narrow`], [`Plan::new`],
/// through [`in_the_way`]) and `metahook diff` all take: [`claim_of`]'s (within `scope`, the namespace
/// the type's children are claimed in, `None` for anywhere), after the rule for children elsewhere —
/// outside the parent's namespace, an object that says it is the parent's counts only where its record
/// lists it (`elsewhere`), else it is [`Ignored::Unlisted`].
#[must_use]
pub fn whose_child(
    obj: &DynamicObject,
    parent: &DynamicObject,
    parent_resource: &ResolvedResource,
    scope: Option<&str>,
    selector: &Selector,
    elsewhere: Elsewhere<'_>,
) -> Claim {
    let says_ours = controller_uid(obj).is_some() && controller_uid(obj) == parent.metadata.uid.as_deref();
    if says_ours && outside(obj, parent, parent_resource) && !elsewhere.claims_object(obj) {
        return Claim::Ignore(Ignored::Unlisted);
    }
    claim_of(obj, parent, scope, selector)
}

/// What an object of the cache refuses, found under the name of a desired child that is not among the
/// parent's observed children (`claim`: [`whose_child`]'s, or a kind's own rule): the parent's own,
/// appeared since the children were observed, is [`PlanError::Stale`] (a quiet retry); the parent's,
/// held in its deletion by someone, is [`PlanError::Leaving`] (its namespace waits); anything else is
/// someone else's, [`PlanError::NotOurs`]. Narrowing and planning both read it here.
#[must_use]
pub fn in_the_way(kind: &str, key: &ObjectKey, existing: &DynamicObject, claim: Claim) -> PlanError {
    let (kind, key) = (kind.to_owned(), key.clone());
    match claim {
        Claim::Owned | Claim::Release => PlanError::Stale { kind, key },
        Claim::Ignore(Ignored::Leaving) => {
            let held_by = existing.metadata.finalizers.iter().flatten().cloned().collect::<Vec<_>>().join(", ");
            PlanError::Leaving { kind, key, held_by }
        }
        Claim::Adopt | Claim::Ignore(_) => PlanError::NotOurs { kind, key, holder: holder(existing) },
    }
}

/// What claiming `parent`'s children of `types` decides, from the types' caches (see [`Claims`]); a
/// labelled object outside the parent's namespace counts only where `elsewhere` says so.
#[must_use]
pub fn claims(
    parent: &DynamicObject,
    parent_resource: &ResolvedResource,
    selector: &Selector,
    types: &[ChildType],
    elsewhere: Elsewhere<'_>,
) -> Claims {
    let parent_uid = parent.metadata.uid.as_deref().unwrap_or_default();
    let parent_ns = parent_resource.namespaced.then_some(parent.metadata.namespace.as_deref()).flatten();
    let mut claims = Claims::default();
    for (index, child_type) in types.iter().enumerate() {
        // A type whose children may be anywhere is claimed anywhere; its orphans are adopted anywhere
        // only when the controller says so (`adoptAcrossNamespaces`), never on a parent's word alone.
        let owned_ns = if child_type.cross_namespace { None } else { parent_ns };
        let adopt_ns = if child_type.adopt_elsewhere { None } else { parent_ns };
        let mut owned = ChildMap::new();
        for obj in child_type.informer.controlled_by(parent_uid) {
            // Someone else's object that only says it is the parent's is `Unlisted`: none of its business.
            match whose_child(&obj, parent, parent_resource, owned_ns, selector, elsewhere) {
                Claim::Owned => {
                    owned.insert(ObjectKey::of(&obj), obj);
                }
                Claim::Release => claims.release.push((index, obj)),
                Claim::Adopt | Claim::Ignore(_) => {}
            }
        }
        let orphans = orphans_to_adopt(&child_type.informer, parent, adopt_ns, selector);
        claims.adopt.extend(orphans.into_iter().map(|obj| (index, obj)));
        claims.owned.push(owned);
    }
    claims
}

/// The orphans of `informer`'s type that `parent` adopts: none while it is being deleted. What
/// [`adopt_orphans`] adopts, and what `metahook diff` reports as adopted.
#[must_use]
pub fn orphans_to_adopt(
    informer: &Informer,
    parent: &DynamicObject,
    parent_ns: Option<&str>,
    selector: &Selector,
) -> Vec<Arc<DynamicObject>> {
    if parent.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    // The index narrows the candidates to selected orphans; claim_of still decides.
    let candidates = informer.orphans_selected(parent_ns.map(Some), selector);
    candidates.into_iter().filter(|obj| claim_of(obj, parent, parent_ns, selector) == Claim::Adopt).collect()
}

/// Claims the children of `parent` for each type: owned-and-matching objects, plus adopted orphans.
/// Owned objects that no longer match `selector` are released. What to do is [`claims`]'s decision;
/// an adoption is preceded by one live read of the parent. Returns no maps at all when the parent
/// turned out gone or being deleted.
///
/// `record`: the parent's record of children elsewhere, when it may have some (`None`: it may not, or it
/// is one a hub from before records synced, whose labelled children count, see [`Elsewhere::Labels`]).
/// An orphan adopted elsewhere is entered in the record before it is labelled; a child released there
/// leaves the record after its label is gone.
pub async fn claim(
    client: &Client,
    parent: &DynamicObject,
    parent_resource: &ResolvedResource,
    selector: &Selector,
    types: &[ChildType],
    record: Option<(&Records, Elsewhere<'_>)>,
) -> Result<Vec<ChildMap<Arc<DynamicObject>>>, ClaimError> {
    let parent_uid = parent.metadata.uid.as_deref().unwrap_or_default();
    let elsewhere = record.map_or(Elsewhere::Nothing, |(_, e)| e);
    let Claims { mut owned, release: released, adopt: adopted } =
        claims(parent, parent_resource, selector, types, elsewhere);
    let mut current = match (record, elsewhere) {
        (Some((records, _)), Elsewhere::Listed(listed)) => Some((records, Arc::new(listed.clone()))),
        _ => None,
    };
    let mut left_elsewhere = BTreeSet::new();
    for (index, obj) in released {
        release(client, types[index].resource(), &obj, parent_uid, parent_resource).await?;
        if outside(&obj, parent, parent_resource) {
            left_elsewhere.insert(entry(types[index].resource(), &ObjectKey::of(&obj)));
        }
    }
    if let Some((records, listed)) = current.as_mut().filter(|_| !left_elsewhere.is_empty()) {
        let kept = listed.children.difference(&left_elsewhere).cloned().collect();
        *listed = records.write(listed, kept).await.map_err(|e| ClaimError::Record(Box::new(e)))?;
    }
    if !adopted.is_empty() {
        let live = live_parent(client, parent_resource, parent).await?;
        if live.is_none_or(|p| p.metadata.deletion_timestamp.is_some()) {
            return Ok(Vec::new());
        }
    }
    let adopted_elsewhere: BTreeSet<RecordedChild> = adopted
        .iter()
        .filter(|(_, obj)| by_label(parent, parent_resource, obj.metadata.namespace.as_deref()))
        .map(|(index, obj)| entry(types[*index].resource(), &ObjectKey::of(obj)))
        .collect();
    if !adopted_elsewhere.is_empty() {
        // The parent's side of the claim comes first: a label written without it would make nobody's child.
        let Some((records, listed)) = current.as_mut() else {
            return Err(ClaimError::NoRecord { parent: ObjectKey::of(parent) });
        };
        let more = listed.children.union(&adopted_elsewhere).cloned().collect();
        *listed = records.write(listed, more).await.map_err(|e| ClaimError::Record(Box::new(e)))?;
    }
    for (index, obj) in adopted {
        let resource = types[index].resource();
        let obj = if by_label(parent, parent_resource, obj.metadata.namespace.as_deref()) {
            label(client, resource, &obj, Some(parent), "adopting").await?
        } else {
            adopt(client, resource, &obj, owner_reference(parent, parent_resource)).await?
        };
        owned[index].insert(ObjectKey::of(&obj), Arc::new(obj));
    }
    Ok(owned)
}

/// Adopts the orphans of `informer`'s type that `selector` selects, as [`claim`] adopts children: none
/// while the parent is being deleted, and a live read of the parent before the first adoption. Returns
/// them as adopted; `None` when the parent turned out gone or being deleted. For objects a parent owns
/// besides its children (a rollout's `ControllerRevision`s).
pub async fn adopt_orphans(
    client: &Client,
    parent: &DynamicObject,
    parent_resource: &ResolvedResource,
    selector: &Selector,
    informer: &Informer,
) -> Result<Option<Vec<DynamicObject>>, ClaimError> {
    let parent_ns = parent_resource.namespaced.then_some(parent.metadata.namespace.as_deref()).flatten();
    Adopter { client, parent, parent_resource, parent_ns, selector }.adopt(informer, &mut false).await
}

/// One parent adopting orphans.
struct Adopter<'a> {
    client: &'a Client,
    parent: &'a DynamicObject,
    parent_resource: &'a ResolvedResource,
    /// The parent's namespace when it is namespaced: orphans elsewhere are not its.
    parent_ns: Option<&'a str>,
    selector: &'a Selector,
}

impl Adopter<'_> {
    /// Adopts the selected orphans of `informer`'s type; `parent_checked`: whether the live read of the
    /// parent was done already (once per claim, however many types).
    async fn adopt(
        &self,
        informer: &Informer,
        parent_checked: &mut bool,
    ) -> Result<Option<Vec<DynamicObject>>, ClaimError> {
        let mut adopted = Vec::new();
        for obj in orphans_to_adopt(informer, self.parent, self.parent_ns, self.selector) {
            if !*parent_checked {
                let live = live_parent(self.client, self.parent_resource, self.parent).await?;
                if live.is_none_or(|p| p.metadata.deletion_timestamp.is_some()) {
                    return Ok(None);
                }
                *parent_checked = true;
            }
            let owner = owner_reference(self.parent, self.parent_resource);
            adopted.push(adopt(self.client, informer.resource(), &obj, owner).await?);
        }
        Ok(Some(adopted))
    }
}

/// Uncached read of the parent: the live object if it is still the one synced (same UID), `None` when
/// it is gone or was replaced by a new object of the same name.
pub async fn live_parent(
    client: &Client,
    resource: &ResolvedResource,
    parent: &DynamicObject,
) -> Result<Option<DynamicObject>, ClaimError> {
    let key = ObjectKey::of(parent);
    let api: Api<DynamicObject> = match &key.namespace {
        Some(ns) if resource.namespaced => Api::namespaced_with(client.clone(), ns, &resource.api_resource),
        _ => Api::all_with(client.clone(), &resource.api_resource),
    };
    let live = api.get_opt(&key.name).await.map_err(|source| ClaimError::ParentCheck { parent: key, source })?;
    Ok(live.filter(|p| p.metadata.uid == parent.metadata.uid))
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

/// An `Api` for objects of `resource` where `key` is (its namespace, or cluster-wide).
fn api_at(client: &Client, resource: &ResolvedResource, key: &ObjectKey) -> Api<DynamicObject> {
    match &key.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource.api_resource),
        None => Api::all_with(client.clone(), &resource.api_resource),
    }
}

/// Whether a child of `parent` in `namespace` is tracked by [`PARENT_UID_LABEL`] rather than an
/// `ownerReference`: a namespaced parent's child elsewhere (another namespace, or cluster-scoped), which
/// no `ownerReference` can point from.
#[must_use]
pub fn by_label(parent: &DynamicObject, parent_resource: &ResolvedResource, namespace: Option<&str>) -> bool {
    parent_resource.namespaced && namespace != parent.metadata.namespace.as_deref()
}

/// The labels and annotations that make an object `parent`'s child by label ([`by_label`]).
#[must_use]
pub fn parent_marks(parent: &DynamicObject) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let uid = parent.metadata.uid.clone().unwrap_or_default();
    let namespace = parent.metadata.namespace.as_deref().unwrap_or_default();
    let name = parent.metadata.name.as_deref().unwrap_or_default();
    (
        BTreeMap::from([(PARENT_UID_LABEL.to_owned(), uid)]),
        BTreeMap::from([(PARENT_ANNOTATION.to_owned(), format!("{namespace}/{name}"))]),
    )
}

/// Puts `parent`'s marks on `obj` (adopting it), or with `None` takes them off (releasing it), if it is
/// still the object looked at: the patch names its UID and resourceVersion.
pub async fn label(
    client: &Client,
    resource: &ResolvedResource,
    obj: &DynamicObject,
    parent: Option<&DynamicObject>,
    action: &'static str,
) -> Result<DynamicObject, ClaimError> {
    let key = ObjectKey::of(obj);
    let api = api_at(client, resource, &key);
    let (labels, annotations) = match parent {
        Some(parent) => {
            let (labels, annotations) = parent_marks(parent);
            (json!(labels), json!(annotations))
        }
        None => (json!({(PARENT_UID_LABEL): null}), json!({(PARENT_ANNOTATION): null})),
    };
    let patch = json!({"metadata": {
        "uid": obj.metadata.uid, "resourceVersion": obj.metadata.resource_version,
        "labels": labels, "annotations": annotations,
    }});
    api.patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(|source| ClaimError::Patch {
        action,
        kind: resource.kind().to_owned(),
        key,
        source,
    })
}

async fn release(
    client: &Client,
    resource: &ResolvedResource,
    obj: &DynamicObject,
    parent_uid: &str,
    parent_resource: &ResolvedResource,
) -> Result<(), ClaimError> {
    if controller_uid(obj) != Some(parent_uid) {
        return Ok(());
    }
    let owned_by_reference = obj.metadata.owner_references.iter().flatten().any(|r| r.controller == Some(true));
    if !owned_by_reference && parent_resource.namespaced {
        return label(client, resource, obj, None, "releasing").await.map(drop);
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
    let api = api_at(client, resource, &key);
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

/// What a sync will write to children, decided (and refused, when it must be) before the first write.
pub struct Plan<'a> {
    types: &'a [ChildType],
    observed: &'a [ChildMap<Arc<DynamicObject>>],
    desired: &'a [ChildMap<Value>],
    /// Observed children that are no longer desired and not already going away, by type index.
    deletions: Vec<(usize, Arc<DynamicObject>)>,
    /// Which orphans the parent adopts (see [`Applier::apply`]).
    adopts: Adopts<'a>,
    /// The parent's namespace, when it is namespaced: a write that fails in another namespace holds back
    /// only that namespace's deletions (see [`Plan::execute`]). `None`: any failure holds them all.
    home: Option<String>,
}

/// Why a plan is refused before anything is written.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A desired child that is not among the parent's children has the name of an existing object.
    #[error("{kind} {key} already exists and is not controlled by this parent ({holder}); it was left untouched")]
    NotOurs { kind: String, key: ObjectKey, holder: String },
    /// A desired child appeared in the cache, as the parent's own, after the children were observed
    /// (typically the echo of this parent's previous sync): retried quietly with the fresh state.
    #[error("{kind} {key} appeared since the children were observed; retrying")]
    Stale { kind: String, key: ObjectKey },
    /// A desired child's name is held by the parent's own object that someone is deleting (and keeps
    /// with a finalizer of theirs) after taking it out of the parent's selector: it is neither the
    /// parent's child nor free. What whoever may write that namespace can do stops that namespace only;
    /// the parent says so until the object is gone.
    #[error(
        "{kind} {key} is being deleted (finalizers: {held_by}) and is no longer selected by this parent; \
         nothing is written in its namespace until it is gone"
    )]
    Leaving { kind: String, key: ObjectKey, held_by: String },
    /// The controller's safe-delete guard refused the deletions.
    #[error(
        "sync would delete {count} of {total} children ({list}), more than {limit} allows \
         ({annotation}); nothing was written. If this is intended, annotate the parent: \
         {ack}={token}"
    )]
    DeletionGuard {
        count: usize,
        total: usize,
        list: String,
        limit: String,
        annotation: &'static str,
        ack: &'static str,
        token: String,
    },
}

/// An answer with the namespaces where a desired child's name is taken by someone else's object left out
/// (see [`narrow`]).
pub struct Narrowed {
    pub observed: Vec<ChildMap<Arc<DynamicObject>>>,
    pub desired: Vec<ChildMap<Value>>,
    /// Why each left-out namespace was refused.
    pub refused: Vec<PlanError>,
}

/// Leaves out of an answer each namespace other than the parent's where a desired child's name is taken
/// by an object that is not the parent's, or held by one of its own that someone is deleting
/// ([`PlanError::Leaving`]): nothing of the answer is written or deleted there, and the rest of it is
/// (`Ok(Some)`). Whoever may write in one namespace can take a name there, and must not
/// thereby stop what the hub does for a parent in another. A name taken in the parent's own namespace
/// (or under a cluster-scoped parent) refuses the whole answer, as in Metacontroller (`Err`); so does a
/// child of the parent's own that turned up in the cache since it was observed ([`PlanError::Stale`], a
/// quiet retry). `Ok(None)`: no name is taken, the answer is written whole.
pub fn narrow(
    types: &[ChildType],
    observed: &[ChildMap<Arc<DynamicObject>>],
    desired: &[ChildMap<Value>],
    parent: &DynamicObject,
    parent_resource: &ResolvedResource,
    whose: impl Fn(&DynamicObject) -> Claim,
) -> Result<Option<Narrowed>, PlanError> {
    let mut refused: BTreeMap<Option<String>, PlanError> = BTreeMap::new();
    for ((child_type, observed), desired) in types.iter().zip(observed).zip(desired) {
        for key in desired.keys().filter(|key| !observed.contains_key(*key)) {
            let Some(existing) = child_type.informer.get(key) else { continue };
            let error = in_the_way(child_type.resource().kind(), key, &existing, whose(&existing));
            if matches!(error, PlanError::Stale { .. }) || !by_label(parent, parent_resource, key.namespace.as_deref())
            {
                return Err(error);
            }
            refused.entry(key.namespace.clone()).or_insert(error);
        }
    }
    if refused.is_empty() {
        return Ok(None);
    }
    let kept = |key: &ObjectKey| !refused.contains_key(&key.namespace);
    let observed = observed
        .iter()
        .map(|m| m.iter().filter(|(k, _)| kept(k)).map(|(k, v)| (k.clone(), Arc::clone(v))).collect())
        .collect();
    let desired = desired
        .iter()
        .map(|m| m.iter().filter(|(k, _)| kept(k)).map(|(k, v)| (k.clone(), v.clone())).collect())
        .collect();
    Ok(Some(Narrowed { observed, desired, refused: refused.into_values().collect() }))
}

impl<'a> Plan<'a> {
    /// Plans the writes that make `observed` match `desired`, refusing to take over an existing object
    /// that is not one of the parent's children (it is in the type's cache but was not claimed). `whose`
    /// says what such an object is to the parent (see [`in_the_way`]: a child that turns up in the cache
    /// after the children were observed is not someone else's); `adopts`, which orphans the parent adopts.
    pub fn new(
        types: &'a [ChildType],
        observed: &'a [ChildMap<Arc<DynamicObject>>],
        desired: &'a [ChildMap<Value>],
        whose: impl Fn(&DynamicObject) -> Claim,
        adopts: Adopts<'a>,
    ) -> Result<Self, PlanError> {
        let mut deletions = Vec::new();
        for (index, ((child_type, observed), desired)) in types.iter().zip(observed).zip(desired).enumerate() {
            for key in desired.keys().filter(|key| !observed.contains_key(*key)) {
                if let Some(existing) = child_type.informer.get(key) {
                    return Err(in_the_way(child_type.resource().kind(), key, &existing, whose(&existing)));
                }
            }
            let gone = observed
                .iter()
                .filter(|(key, obj)| !desired.contains_key(*key) && obj.metadata.deletion_timestamp.is_none());
            deletions.extend(gone.map(|(_, obj)| (index, Arc::clone(obj))));
        }
        Ok(Self { types, observed, desired, deletions, adopts, home: None })
    }

    /// Marks the plan as a namespaced parent's in `home`: its children in other namespaces
    /// (`crossNamespace`) are its answer's parts there, and a write failing in one of those namespaces
    /// — something whoever writes that namespace can cause, an `immutable: true` say — holds back only
    /// that namespace's deletions, as a name taken there refuses only that namespace.
    #[must_use]
    pub fn at_home(mut self, home: Option<&str>) -> Self {
        self.home = home.map(str::to_owned);
        self
    }

    /// Refuses the plan when its deletions exceed what `guard` allows, unless the parent acknowledges
    /// exactly this set of deletions.
    ///
    /// `total` is how many children the parent has, all of them: the guard's share is of the parent's
    /// children, whatever part of them this plan is about (a MapController's one input, an answer with a
    /// namespace left out).
    pub fn check_guard(
        &self,
        guard: Option<DeletionGuard>,
        parent: &DynamicObject,
        total: usize,
    ) -> Result<(), PlanError> {
        let Some(guard) = guard else { return Ok(()) };
        let count = self.deletions.len();
        if count == 0 || guard.allows(count, total) {
            return Ok(());
        }
        let mut keys: Vec<String> = self
            .deletions
            .iter()
            .map(|(t, obj)| format!("{} {}", self.types[*t].resource().kind(), ObjectKey::of(obj)))
            .collect();
        keys.sort();
        let token = deletion_token(&keys);
        let acknowledged = parent.metadata.annotations.as_ref().and_then(|a| a.get(CONFIRM_DELETIONS_ANNOTATION));
        if acknowledged == Some(&token) {
            return Ok(());
        }
        let mut list: Vec<String> = keys.iter().take(5).cloned().collect();
        if keys.len() > 5 {
            list.push(format!("and {} more", keys.len() - 5));
        }
        Err(PlanError::DeletionGuard {
            count,
            total,
            list: list.join(", "),
            limit: guard.to_string(),
            annotation: MAX_DELETIONS_ANNOTATION,
            ack: CONFIRM_DELETIONS_ANNOTATION,
            token,
        })
    }

    /// Reads the schema of each child type, if its interval says so ([`Applier::read_schema`]), before
    /// [`Plan::writes`] judges which children are current: against a schema a CRD has changed since, a
    /// child would be judged current without the field the CRD now declares, and never written.
    pub async fn read_schemas(&self, applier: &Applier) {
        for child_type in self.types {
            applier.read_schema(child_type.resource()).await;
        }
    }

    /// What carrying out the plan writes (creates, changes or deletes), with `observer` saying which
    /// children the cache shows behind the hub's own writes; in one look at the children, as whether
    /// the parent must be read first depends on the same writes.
    #[must_use]
    pub fn writes(&self, applier: &Applier, observer: &dyn WriteObserver) -> Writes {
        let mut writes = Writes::Nothing;
        for write in self.planned_seen_by(applier, observer) {
            let unguarded = match write {
                PlannedWrite::Delete(..) => true,
                PlannedWrite::Create(index, _) => self.types[index].cross_namespace,
                PlannedWrite::Update(index, _) => {
                    self.types[index].cross_namespace || self.types[index].method.recreates()
                }
            };
            if unguarded {
                return Writes::NeedParentRead;
            }
            writes = Writes::Guarded;
        }
        writes
    }

    /// The writes carrying out the plan makes, one per child: deletions first, then each desired child
    /// that is missing or not current (by [`Applier::is_current`]). What `metahook diff` reports, so a
    /// preview names exactly the children a sync of a cache that is not behind writes.
    pub fn planned<'s>(&'s self, applier: &'s Applier) -> impl Iterator<Item = PlannedWrite> + 's {
        self.planned_seen_by(applier, &CURRENT_CACHE)
    }

    /// [`Plan::planned`], with `observer` saying which children the cache shows behind the hub's own
    /// writes (as [`Plan::execute`] decides, by [`Applier::known_current`]).
    fn planned_seen_by<'s>(
        &'s self,
        applier: &'s Applier,
        observer: &'s dyn WriteObserver,
    ) -> impl Iterator<Item = PlannedWrite> + 's {
        let deletes = self.deletions.iter().map(|(index, obj)| PlannedWrite::Delete(*index, Arc::clone(obj)));
        let writes = self.types.iter().zip(self.observed).zip(self.desired).enumerate().flat_map(
            move |(index, ((child_type, observed), desired))| {
                desired.iter().filter_map(move |(key, obj)| match observed.get(key) {
                    None => Some(PlannedWrite::Create(index, key.clone())),
                    Some(current)
                        if !applier.known_current(child_type.resource(), obj, current, child_type.method, || {
                            observer.behind(index, key)
                        }) =>
                    {
                        Some(PlannedWrite::Update(index, key.clone()))
                    }
                    Some(_) => None,
                })
            },
        );
        deletes.chain(writes)
    }

    /// Carries out the plan in the order that cannot lose data: every create and update first; the
    /// deletions of children no longer desired only when all of those succeeded (a failed apply leaves
    /// the old children in place). `Recreate`'s delete-then-create of one child happens in its apply.
    /// Within each step the writes of this one parent go out concurrently, at most
    /// [`WRITES_PER_PARENT`] at a time (the hub bounds its requests in flight as a whole).
    pub async fn execute(&self, applier: &Applier, observer: &dyn WriteObserver) -> Executed {
        let mut writes: Vec<Write<'_>> = Vec::new();
        for (index, ((child_type, observed), desired)) in
            self.types.iter().zip(self.observed).zip(self.desired).enumerate()
        {
            for (key, obj) in desired {
                let current = observed.get(key).map(AsRef::as_ref);
                writes.push(Box::pin(async move {
                    observer.started(index, key);
                    let (resource, method) = (child_type.resource(), child_type.method);
                    // Asked only of a child the applier does not know to be current by itself.
                    let behind = || observer.behind(index, key);
                    let result = applier.apply(resource, obj, current, method, self.adopts, behind).await;
                    let version = match &result {
                        Ok(Applied::Created { version, .. } | Applied::Updated { version, .. }) => {
                            Some(version.clone())
                        }
                        Ok(Applied::Deleted { uid }) => Some(deleted_version(uid)),
                        Ok(Applied::Unchanged) | Err(_) => None,
                    };
                    observer.finished(index, key, version.as_deref());
                    (index, key.clone(), result)
                }));
            }
        }
        let results: Vec<_> = stream::iter(writes).buffer_unordered(WRITES_PER_PARENT).collect().await;
        let mut executed = Executed::default();
        let mut failed_namespaces = Vec::new();
        for (index, key, result) in results {
            let kind = self.types[index].resource().kind();
            if result.is_err() {
                failed_namespaces.push(key.namespace.clone());
            }
            match result {
                Ok(Applied::Created { version, dropped } | Applied::Updated { version, dropped }) => {
                    tracing::info!(kind, child = %key, "child written");
                    if !dropped.is_empty() {
                        let (kind, key) = (kind.to_owned(), key.clone());
                        executed.dropped.push(DroppedFields { kind, key, fields: dropped });
                    }
                    executed.writes.push(Written { type_index: index, key, version, recreate: false });
                }
                Ok(Applied::Deleted { uid }) => {
                    tracing::info!(kind, child = %key, "child deleted to be recreated");
                    let version = deleted_version(&uid);
                    executed.writes.push(Written { type_index: index, key, version, recreate: true });
                }
                Ok(Applied::Unchanged) => {}
                Err(e) => executed.errors.push(e),
            }
        }
        // Deletions wait for the writes: all of them when one failed in the parent's own namespace (or
        // under a cluster-scoped parent), those of a namespace where one failed otherwise.
        let failed: std::collections::BTreeSet<Option<String>> = failed_namespaces.into_iter().collect();
        let home = self.home.as_ref().map(|home| Some(home.clone()));
        if !failed.is_empty() && home.as_ref().is_none_or(|home| failed.contains(home)) {
            return executed;
        }
        let deletes: Vec<Delete<'_>> = self
            .deletions
            .iter()
            .filter(|(_, obj)| !failed.contains(&obj.metadata.namespace))
            .map(|(index, obj)| -> Delete<'_> {
                Box::pin(async move {
                    let key = ObjectKey::of(obj);
                    observer.started(*index, &key);
                    let result = applier.delete(self.types[*index].resource(), obj).await;
                    // Only a delete this call did has an echo; one that found the child gone already must
                    // not take someone else's deletion (the garbage collector's) for ours.
                    let version = matches!(result, Ok(true))
                        .then(|| deleted_version(obj.metadata.uid.as_deref().unwrap_or_default()));
                    observer.finished(*index, &key, version.as_deref());
                    (*index, obj, result)
                })
            })
            .collect();
        let deletes: Vec<_> = stream::iter(deletes).buffer_unordered(WRITES_PER_PARENT).collect().await;
        for (index, obj, result) in deletes {
            match result {
                Ok(false) => {
                    tracing::debug!(kind = self.types[index].resource().kind(), child = %ObjectKey::of(obj), "child gone already");
                }
                Ok(true) => {
                    let key = ObjectKey::of(obj);
                    tracing::info!(kind = self.types[index].resource().kind(), child = %key, "child deleted");
                    let uid = obj.metadata.uid.clone().unwrap_or_default();
                    let version = deleted_version(&uid);
                    executed.writes.push(Written { type_index: index, key, version, recreate: false });
                }
                Err(e) => executed.errors.push(e),
            }
        }
        executed
    }
}

/// What a plan writes ([`Plan::writes`]), as far as reading its parent first goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writes {
    Nothing,
    /// Creates and updates that guard themselves: a create carries an owner reference with the
    /// parent's UID (the garbage collector deletes a child whose owner is gone), an update the child's
    /// observed resourceVersion (refused if the collector orphaned it since; see
    /// [`crate::write::apply`]).
    Guarded,
    /// A deletion (of a child no longer desired, or one an update `Recreate`s), or a write of a
    /// `crossNamespace` type (a child in another namespace carries only a label): the parent must be
    /// read from the API server first.
    NeedParentRead,
}

/// One child write of a plan ([`Plan::planned`]), with the index of the child's declared type.
#[derive(Debug, Clone)]
pub enum PlannedWrite {
    /// A desired child that does not exist yet.
    Create(usize, ObjectKey),
    /// A desired child that exists but is not as desired (under `Recreate`, deleted and created again).
    Update(usize, ObjectKey),
    /// An observed child that is no longer desired.
    Delete(usize, Arc<DynamicObject>),
}

/// Told about every write of [`Plan::execute`] as it starts and ends (`version`: what it left behind, or
/// `None` when it failed or wrote nothing), so its echo in the watch can be recognised.
pub trait WriteObserver: Sync {
    fn started(&self, type_index: usize, key: &ObjectKey);
    fn finished(&self, type_index: usize, key: &ObjectKey, version: Option<&str>);
    /// Whether the cache shows the child older than a write of it whose echo has not come yet (so an
    /// apply of what that write applied would change nothing; see [`crate::write::apply`]). A write
    /// announced with `started` and not finished is not one of those.
    fn behind(&self, type_index: usize, key: &ObjectKey) -> bool;
}

/// An observer of no writes, whose cache is never behind: for plans only previewed.
struct CurrentCache;

impl WriteObserver for CurrentCache {
    fn started(&self, _: usize, _: &ObjectKey) {}
    fn finished(&self, _: usize, _: &ObjectKey, _: Option<&str>) {}
    fn behind(&self, _: usize, _: &ObjectKey) -> bool {
        false
    }
}

/// The one [`CurrentCache`].
const CURRENT_CACHE: CurrentCache = CurrentCache;

/// One apply of [`Plan::execute`], boxed so the writes of one parent can run side by side.
type Write<'f> = futures::future::BoxFuture<'f, (usize, ObjectKey, Result<Applied, ApplyError>)>;
/// One delete of [`Plan::execute`].
type Delete<'f> = futures::future::BoxFuture<'f, (usize, &'f Arc<DynamicObject>, Result<bool, ApplyError>)>;

/// How many writes of one parent's children are in flight at once.
pub const WRITES_PER_PARENT: usize = 8;

/// What carrying out a plan did.
#[derive(Debug, Default)]
pub struct Executed {
    pub errors: Vec<ApplyError>,
    /// Every successful write, for telling its echo from others' changes.
    pub writes: Vec<Written>,
    /// The writes that left out fields their schema does not declare (a Warning Event each).
    pub dropped: Vec<DroppedFields>,
}

/// One write of a sync: the child (by type index) and the version it left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub type_index: usize,
    pub key: ObjectKey,
    /// The resourceVersion after a create or update; [`deleted_version`] of the UID after a delete.
    pub version: String,
    /// A delete of a child that its update method recreates: the next sync creates it again.
    pub recreate: bool,
}

/// What [`deleted_version`] puts before the UID; no resourceVersion starts with it.
pub const DELETED_PREFIX: &str = "deleted:";

/// The version a delete leaves behind, as [`Written::version`]: the deleted object's UID.
#[must_use]
pub fn deleted_version(uid: &str) -> String {
    format!("{DELETED_PREFIX}{uid}")
}

/// Annotation on a CompositeController or DecoratorController that turns on the safe-delete guard: the
/// most children one sync may delete, as a count (`"5"`) or a share of the parent's children (`"50%"`).
pub const MAX_DELETIONS_ANNOTATION: &str = "metahook.dev/max-deletions-per-sync";
/// Annotation on a parent that lets one refused set of deletions through; its value is the token the
/// refusal's Event names (it changes with the set, so an acknowledgement is never reused by accident).
pub const CONFIRM_DELETIONS_ANNOTATION: &str = "metahook.dev/confirm-deletions";

/// The safe-delete guard (a metahook extension): how many of a parent's children one sync may delete.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DeletionGuard {
    Count(usize),
    /// A share in percent of the parent's children.
    Percent(f64),
}

impl DeletionGuard {
    /// Parses the annotation's value (`"3"`, `"50%"`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let bad =
            || format!("{MAX_DELETIONS_ANNOTATION}: {text:?} is neither a count (\"5\") nor a percentage (\"50%\")");
        match text.strip_suffix('%') {
            Some(p) => {
                let p: f64 = p.trim().parse().map_err(|_| bad())?;
                if (0.0..=100.0).contains(&p) { Ok(Self::Percent(p)) } else { Err(bad()) }
            }
            None => text.parse().map(Self::Count).map_err(|_| bad()),
        }
    }

    /// Reads the guard from a controller object's annotations (absent = off).
    pub fn from_annotations(annotations: Option<&BTreeMap<String, String>>) -> Result<Option<Self>, String> {
        annotations.and_then(|a| a.get(MAX_DELETIONS_ANNOTATION)).map(|v| Self::parse(v)).transpose()
    }

    fn allows(self, count: usize, total: usize) -> bool {
        match self {
            Self::Count(limit) => count <= limit,
            #[allow(clippy::cast_precision_loss)] // child counts are far below 2^52
            Self::Percent(share) => (count as f64) <= (total as f64) * share / 100.0,
        }
    }
}

impl std::fmt::Display for DeletionGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Count(n) => write!(f, "{n} per sync"),
            Self::Percent(p) => write!(f, "{p}% per sync"),
        }
    }
}

/// A short, stable name for a set of deletions.
fn deletion_token(sorted_keys: &[String]) -> String {
    use sha1::Digest as _;
    let digest = sha1::Sha1::digest(sorted_keys.join("\n").as_bytes());
    digest.iter().take(5).fold(String::new(), |mut hex, b| {
        use std::fmt::Write as _;
        let _ = write!(hex, "{b:02x}");
        hex
    })
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
            // v1 cannot name a child outside a namespaced parent's namespace (Metacontroller has none):
            // a `crossNamespace` child is keyed `namespace/name`, as a cluster-scoped parent's are.
            let k =
                object_key(version, parent_ns, key.namespace.as_deref(), &key.name).unwrap_or_else(|| key.to_string());
            entry.insert(k, WireObject(Arc::clone(obj)));
        }
    }
    maps
}

/// What a controller kind requires of each of its desired children, beyond what every child must be.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChildRules<'a> {
    /// Labels given to a child that does not set them (`controller-uid` under `generateSelector`).
    pub default_labels: Option<&'a BTreeMap<String, String>>,
    /// Annotations set on every child (a decorator's name).
    pub annotations: Option<&'a BTreeMap<String, String>>,
    /// The selector every child's labels must match (the parent's child selector).
    pub selector: Option<&'a Selector>,
    /// By type index: whether the type's children may be outside the parent's namespace
    /// (`crossNamespace`); a type not listed may not.
    pub cross_namespace: &'a [bool],
    /// What the controller kind calls the objects (for its refusals: a MapController's are outputs).
    pub role: ChildRole,
}

/// What a controller kind calls the objects it writes for a parent: children, a decorator's
/// attachments, a MapController's outputs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ChildRole {
    #[default]
    Child,
    Attachment,
    Output,
}

impl ChildRole {
    /// The word for one of them.
    #[must_use]
    pub fn noun(self) -> &'static str {
        match self {
            Self::Child => "child",
            Self::Attachment => "attachment",
            Self::Output => "output",
        }
    }
}

impl ChildRules<'_> {
    /// Applies the rules to one child's metadata, or says why the child is refused.
    fn apply(&self, meta: &mut serde_json::Map<String, Value>) -> Result<(), String> {
        if let Some(defaults) = self.default_labels.filter(|d| !d.is_empty()) {
            let labels = meta.entry("labels").or_insert_with(|| json!({}));
            let labels = labels.as_object_mut().ok_or("metadata.labels is not an object")?;
            for (key, value) in defaults {
                labels.entry(key.clone()).or_insert_with(|| Value::String(value.clone()));
            }
        }
        if let Some(wanted) = self.annotations.filter(|a| !a.is_empty()) {
            let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
            let annotations = annotations.as_object_mut().ok_or("metadata.annotations is not an object")?;
            for (key, value) in wanted {
                annotations.insert(key.clone(), Value::String(value.clone()));
            }
        }
        if let Some(selector) = self.selector {
            let labels: BTreeMap<String, String> =
                serde_json::from_value(meta.get("labels").cloned().unwrap_or(json!({})))
                    .map_err(|e| format!("labels: {e}"))?;
            if !selector.matches(&labels) {
                return Err("labels on desired child don't match parent selector".into());
            }
        }
        Ok(())
    }
}

/// Turns a hook's desired objects into complete objects to apply, by declared type. Each must have
/// apiVersion, kind and a valid name, be of a declared type, land in a namespace the parent may own, carry
/// valid labels and annotations, fit in the API server's store, and leave ownership to the hub; `rules`
/// add what the controller kind requires (labels, annotations) or reject the object.
/// Any problem rejects the whole list: a partial apply could delete children the hook meant to keep.
///
/// Ownership: the hub makes every child controlled by its parent. References to the parent itself (a
/// hook echoing an observed child back) are accepted; any other `ownerReferences` entry is refused,
/// not silently dropped: a second owner keeps the child alive after its parent is gone (the garbage
/// collector deletes an object only when every owner is gone), and a second controller is refused by the
/// API server anyway. Refusing says so to the hook's author, where dropping would write something else
/// than the hook asked for.
pub fn desired_children(
    types: &[Arc<ResolvedResource>],
    parent: &DynamicObject,
    parent_resource: &ResolvedResource,
    items: &[Value],
    rules: ChildRules<'_>,
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
        let index = types.iter().position(|t| t.api_version() == api_version && t.kind() == kind).ok_or_else(|| {
            format!("{kind} {name}: {api_version}/{kind} is not a declared {} resource", rules.role.noun())
        })?;
        let resource = &types[index];
        let invalid = |reason: String| format!("{kind} {name}: {reason}");
        validation::check_name(validation::name_rule(&resource.api_resource.group, kind), name).map_err(invalid)?;
        let mut obj = strip_server_fields(item.clone());
        let meta = obj
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| invalid("metadata is not an object".into()))?;
        let requested = meta.get("namespace").and_then(Value::as_str);
        let anywhere = rules.cross_namespace.get(index).copied().unwrap_or(false);
        let namespace = resolve_namespace(resource, parent_ns.as_deref(), requested, anywhere).map_err(invalid)?;
        match &namespace {
            Some(ns) => {
                validation::check_namespace(ns).map_err(invalid)?;
                meta.insert("namespace".into(), Value::String(ns.clone()));
            }
            None => {
                meta.remove("namespace");
            }
        }
        rules.apply(meta).map_err(invalid)?;
        validation::check_metadata_maps(meta).map_err(invalid)?;
        let refs = meta.get("ownerReferences").map_or(Ok(Vec::new()), |refs| {
            serde_json::from_value::<Vec<OwnerReference>>(refs.clone())
                .map_err(|e| invalid(format!("metadata.ownerReferences: {e}")))
        })?;
        if let Some(foreign) = refs.iter().find(|r| r.uid != parent_uid) {
            return Err(invalid(format!(
                "metadata.ownerReferences names {} {} ({}); the hub alone sets a child's owner (its parent), \
                 a second owner would keep the child alive after its parent is gone",
                foreign.kind, foreign.name, foreign.uid
            )));
        }
        let labelled = meta.get("labels").and_then(|l| l.get(PARENT_UID_LABEL)).and_then(Value::as_str);
        if labelled.is_some_and(|uid| uid != parent_uid) {
            return Err(invalid(format!("the label {PARENT_UID_LABEL} is the hub's to set (the parent's UID)")));
        }
        if by_label(parent, parent_resource, namespace.as_deref()) {
            // No ownerReference can point from here: the parent's marks say whose child it is.
            meta.remove("ownerReferences");
            let (labels, annotations) = parent_marks(parent);
            for (field, marks) in [("labels", labels), ("annotations", annotations)] {
                let map = meta.entry(field).or_insert_with(|| json!({}));
                let map = map.as_object_mut().ok_or_else(|| invalid(format!("metadata.{field} is not an object")))?;
                map.extend(marks.into_iter().map(|(k, v)| (k, Value::String(v))));
            }
        } else {
            meta.insert("ownerReferences".into(), Value::Array(vec![owner.clone()]));
        }
        validation::check_size(&obj).map_err(invalid)?;
        let key = ObjectKey { namespace, name: name.to_owned() };
        if desired[index].insert(key.clone(), obj).is_some() {
            return Err(format!("{kind} {key} appears more than once"));
        }
    }
    Ok(desired)
}

/// Namespace a desired child lands in. Namespaced children default to the parent's namespace and must
/// stay in it unless their type is declared `crossNamespace` (`anywhere`); under a cluster-scoped parent
/// they must name one.
fn resolve_namespace(
    resource: &ResolvedResource,
    parent_ns: Option<&str>,
    requested: Option<&str>,
    anywhere: bool,
) -> Result<Option<String>, String> {
    match (resource.namespaced, parent_ns, requested) {
        (false, None, _) => Ok(None),
        (false, Some(_), _) if anywhere => Ok(None),
        (true, Some(_), Some(r)) if anywhere && !r.is_empty() => Ok(Some(r.to_owned())),
        (false, Some(_), _) => {
            Err("cluster-scoped children of a namespaced parent need the child type declared crossNamespace".into())
        }
        (true, Some(p), None) => Ok(Some(p.to_owned())),
        (true, Some(p), Some(r)) if r == p || r.is_empty() => Ok(Some(p.to_owned())),
        (true, Some(p), Some(r)) => Err(format!(
            "namespace {r} differs from the parent's namespace {p} (a child type declared crossNamespace may \
             have children elsewhere)"
        )),
        (true, None, Some(r)) if !r.is_empty() => Ok(Some(r.to_owned())),
        (true, None, _) => Err("a namespaced child of a cluster-scoped parent must set metadata.namespace".into()),
    }
}

#[cfg(test)]
mod tests {
    use kube::core::ApiResource;
    use serde_json::json;

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
        assert_eq!(resolve_namespace(&r, Some("a"), None, false).unwrap().as_deref(), Some("a"));
        assert_eq!(resolve_namespace(&r, Some("a"), Some("a"), false).unwrap().as_deref(), Some("a"));
        assert!(resolve_namespace(&r, Some("a"), Some("b"), false).unwrap_err().contains("differs"));
    }

    fn parent() -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "p", "namespace": "a", "uid": "parent-uid"}}))
        .unwrap()
    }

    fn desired(items: &[Value]) -> Result<Vec<ChildMap<Value>>, String> {
        let types = vec![Arc::new(resource(true))];
        desired_children(&types, &parent(), &resource(true), items, ChildRules::default())
    }

    fn cm(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})
    }

    #[test]
    fn desired_children_get_exactly_one_owner_the_parent() {
        let mut echoed = cm("a");
        echoed["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "p",
            "uid": "parent-uid", "controller": true}]);
        let maps = desired(&[echoed]).unwrap();
        let refs = &maps[0].values().next().unwrap()["metadata"]["ownerReferences"];
        assert_eq!(refs.as_array().unwrap().len(), 1);
        assert_eq!(refs[0]["uid"], "parent-uid");
        let mut foreign = cm("b");
        foreign["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "v1", "kind": "Secret", "name": "s", "uid": "other", "controller": false}]);
        assert!(desired(&[cm("a"), foreign]).unwrap_err().contains("Secret s"));
    }

    #[test]
    fn a_child_labelled_with_another_parents_uid_is_refused() {
        let mut claimed = cm("a");
        claimed["metadata"]["labels"] = json!({(PARENT_UID_LABEL): "another-parent"});
        assert!(desired(&[claimed]).unwrap_err().contains(PARENT_UID_LABEL));
        let mut own = cm("b");
        own["metadata"]["labels"] = json!({(PARENT_UID_LABEL): "parent-uid"});
        assert!(desired(&[own]).is_ok(), "its own parent's UID is what the hub sets anyway");
    }

    #[test]
    fn one_invalid_child_refuses_the_whole_list() {
        assert!(desired(&[cm("good"), cm("Bad")]).unwrap_err().contains("ConfigMap Bad"));
        assert!(desired(&[cm("good"), cm(&"x".repeat(300))]).is_err());
        let mut bad_label = cm("c");
        bad_label["metadata"]["labels"] = json!({"app": "has spaces"});
        assert!(desired(&[bad_label]).is_err());
        let mut huge = cm("d");
        huge["data"] = json!({"k": "x".repeat(2 * 1024 * 1024)});
        assert!(desired(&[huge]).unwrap_err().contains("bytes"));
        assert!(desired(&[cm("dup"), cm("dup")]).unwrap_err().contains("more than once"));
    }

    #[test]
    fn deletion_guard_parses_counts_and_shares() {
        assert_eq!(DeletionGuard::parse("3"), Ok(DeletionGuard::Count(3)));
        assert_eq!(DeletionGuard::parse(" 50% "), Ok(DeletionGuard::Percent(50.0)));
        assert!(DeletionGuard::parse("lots").is_err());
        assert!(DeletionGuard::parse("150%").is_err());
        assert!(DeletionGuard::Percent(50.0).allows(5, 10));
        assert!(!DeletionGuard::Percent(50.0).allows(6, 10));
        assert!(DeletionGuard::Count(2).allows(2, 100));
        assert!(!DeletionGuard::Count(2).allows(3, 3));
    }

    #[test]
    fn deletion_tokens_name_the_set() {
        let a = deletion_token(&["ConfigMap a/x".into(), "ConfigMap a/y".into()]);
        assert_eq!(a.len(), 10);
        assert_eq!(a, deletion_token(&["ConfigMap a/x".into(), "ConfigMap a/y".into()]));
        assert_ne!(a, deletion_token(&["ConfigMap a/x".into()]));
    }

    #[test]
    fn cross_namespace_types_may_have_children_anywhere() {
        let r = resource(true);
        assert_eq!(resolve_namespace(&r, Some("a"), Some("b"), true).unwrap().as_deref(), Some("b"));
        assert_eq!(resolve_namespace(&r, Some("a"), None, true).unwrap().as_deref(), Some("a"));
        assert_eq!(resolve_namespace(&resource(false), Some("a"), None, true).unwrap(), None);
        let err = resolve_namespace(&r, Some("a"), Some("b"), false).unwrap_err();
        assert!(err.contains("crossNamespace"), "{err}");
    }

    #[test]
    fn cluster_parents_need_explicit_child_namespaces() {
        assert_eq!(resolve_namespace(&resource(true), None, Some("b"), false).unwrap().as_deref(), Some("b"));
        assert!(resolve_namespace(&resource(true), None, None, false).is_err());
        assert_eq!(resolve_namespace(&resource(false), None, None, false).unwrap(), None);
        assert!(resolve_namespace(&resource(false), Some("a"), None, false).is_err());
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
        assert_eq!(claim(&object("a", &no, Some("parent"), true)), Claim::Ignore(Ignored::Leaving));
        assert_eq!(claim(&object("a", &yes, Some("parent"), true)), Claim::Owned, "still a child while it goes");
        // A cluster-scoped parent claims across namespaces.
        assert_eq!(claim_of(&object("b", &yes, None, false), &parent, None, &selector), Claim::Adopt);
        // A parent being deleted adopts and releases nothing.
        let mut dying = parent.clone();
        dying.metadata.deletion_timestamp = object("a", &yes, None, true).metadata.deletion_timestamp;
        let claim = |obj: &DynamicObject| claim_of(obj, &dying, Some("a"), &selector);
        assert_eq!(claim(&object("a", &yes, None, false)), Claim::Ignore(Ignored::Deleting));
        assert_eq!(claim(&object("a", &no, Some("parent"), false)), Claim::Ignore(Ignored::Leaving));
    }

    /// A `ConfigMap` `namespace/name` labelled as the child elsewhere of the parent of UID `uid`.
    fn labelled(namespace: &str, name: &str, uid: &str) -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "uid": format!("{namespace}-{name}"),
                         "labels": {PARENT_UID_LABEL: uid, "controller-uid": uid}}}))
        .unwrap()
    }

    /// A `crossNamespace` `ConfigMap` type cached with `objects`.
    fn cross_type(objects: Vec<DynamicObject>) -> ChildType {
        let rule = crate::api::ChildResourceRule {
            api_version: "v1".into(),
            resource: "configmaps".into(),
            update_strategy: None,
            cross_namespace: Some(true),
            adopt_across_namespaces: None,
        };
        ChildType::new(&rule, UpdateMethod::InPlace, Informer::listed(&Arc::new(resource(true)), objects))
    }

    fn record(children: &[(&str, &str)]) -> Record {
        Record {
            key: ObjectKey { namespace: Some("a".into()), name: "r".into() },
            uid: None,
            version: None,
            parent: crate::api::record::RecordedParent::default(),
            children: children.iter().map(|(ns, name)| entry(&resource(true), &key(Some(ns), name))).collect(),
            owned_by: Some("parent-uid".into()),
            finalized: true,
            deleting: false,
        }
    }

    fn key(namespace: Option<&str>, name: &str) -> ObjectKey {
        ObjectKey { namespace: namespace.map(str::to_owned), name: name.into() }
    }

    #[test]
    fn a_labelled_object_elsewhere_is_a_child_only_if_the_parents_record_lists_it() {
        let selector = Selector::from_labels(&BTreeMap::from([("controller-uid".to_owned(), "parent-uid".to_owned())]));
        let types = vec![cross_type(vec![labelled("b", "real", "parent-uid"), labelled("b", "decoy", "parent-uid")])];
        let listed = record(&[("b", "real")]);
        let owned = |elsewhere| {
            let Claims { owned, .. } = claims(&parent(), &resource(true), &selector, &types, elsewhere);
            owned[0].keys().map(|k| k.name.clone()).collect::<Vec<_>>()
        };
        assert_eq!(owned(Elsewhere::Listed(&listed)), ["real"], "the decoy carries the label alone");
        assert_eq!(owned(Elsewhere::Nothing), Vec::<String>::new(), "no record: nothing elsewhere is the parent's");
        assert_eq!(owned(Elsewhere::Labels), ["decoy", "real"], "a parent from before records: its labels, once");
    }

    #[test]
    fn a_name_taken_in_another_namespace_leaves_that_namespace_out_and_in_the_parents_refuses_all() {
        let types = vec![cross_type(vec![
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "taken", "namespace": "b", "uid": "theirs"}}))
            .unwrap(),
        ])];
        let observed = vec![ChildMap::from([(key(Some("b"), "old"), Arc::new(labelled("b", "old", "parent-uid")))])];
        let desired =
            |keys: &[ObjectKey]| vec![keys.iter().map(|k| (k.clone(), json!({}))).collect::<ChildMap<Value>>()];
        let ours = |_: &DynamicObject| Claim::Ignore(Ignored::OtherController);
        let wanted = desired(&[key(Some("a"), "mine"), key(Some("b"), "taken"), key(Some("c"), "there")]);
        let narrowed = narrow(&types, &observed, &wanted, &parent(), &resource(true), ours).unwrap().unwrap();
        let kept: Vec<&ObjectKey> = narrowed.desired[0].keys().collect();
        assert_eq!(kept, [&key(Some("a"), "mine"), &key(Some("c"), "there")]);
        assert!(narrowed.observed[0].is_empty(), "nothing of b is deleted either");
        assert_eq!(narrowed.refused.len(), 1);
        assert!(matches!(&narrowed.refused[0], PlanError::NotOurs { key, .. } if key.name == "taken"));
        // Nothing taken: written whole, nothing copied.
        let free = desired(&[key(Some("a"), "mine"), key(Some("c"), "there")]);
        assert!(narrow(&types, &observed, &free, &parent(), &resource(true), ours).unwrap().is_none());
        // Taken in the parent's own namespace: the whole answer, as Metacontroller refuses it.
        let home = vec![cross_type(vec![
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "taken", "namespace": "a", "uid": "theirs"}}))
            .unwrap(),
        ])];
        let at_home = desired(&[key(Some("a"), "taken"), key(Some("c"), "there")]);
        assert!(matches!(
            narrow(&home, &observed, &at_home, &parent(), &resource(true), ours),
            Err(PlanError::NotOurs { .. })
        ));
    }

    /// Issue 67 item 2: the parent's own copy elsewhere, taken out of its selector and held in its
    /// deletion by a finalizer of the tenant's, is what one function says everywhere: not observed, and
    /// in the way of the desired child of its name in that namespace only — never "stale" for the whole
    /// answer, which retried quietly for ever.
    #[test]
    fn the_parents_copy_held_in_deletion_elsewhere_stops_its_namespace_only() {
        let selector = Selector::from_labels(&BTreeMap::from([("controller-uid".to_owned(), "parent-uid".to_owned())]));
        let mut held: Value = serde_json::to_value(labelled("b", "copy", "parent-uid")).unwrap();
        held["metadata"]["labels"].as_object_mut().unwrap().remove("controller-uid");
        held["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        held["metadata"]["finalizers"] = json!(["tenant.example/hold"]);
        let held: DynamicObject = serde_json::from_value(held).unwrap();
        let listed = record(&[("b", "copy")]);
        let whose = |obj: &DynamicObject| {
            whose_child(obj, &parent(), &resource(true), None, &selector, Elsewhere::Listed(&listed))
        };
        assert_eq!(whose(&held), Claim::Ignore(Ignored::Leaving));
        let unlisted = labelled("b", "decoy", "parent-uid");
        assert_eq!(whose(&unlisted), Claim::Ignore(Ignored::Unlisted), "a label alone elsewhere is nobody's word");
        assert_eq!(whose(&labelled("b", "copy", "parent-uid")), Claim::Owned);

        let types = vec![cross_type(vec![held.clone()])];
        let Claims { owned, release, .. } =
            claims(&parent(), &resource(true), &selector, &types, Elsewhere::Listed(&listed));
        assert!(owned[0].is_empty() && release.is_empty(), "neither observed nor released");
        let observed = vec![ChildMap::new()];
        let wanted = vec![ChildMap::from([(key(Some("b"), "copy"), json!({})), (key(Some("c"), "copy"), json!({}))])];
        let narrowed = narrow(&types, &observed, &wanted, &parent(), &resource(true), whose).unwrap().unwrap();
        assert_eq!(narrowed.desired[0].keys().collect::<Vec<_>>(), [&key(Some("c"), "copy")]);
        assert!(
            matches!(&narrowed.refused[..], [PlanError::Leaving { held_by, .. }] if held_by == "tenant.example/hold"),
            "{:?}",
            narrowed.refused
        );
        // The same object in the way of the plan (no narrowing: a MapController's, a decorator's) says so.
        let planned = Plan::new(&types, &observed, &wanted, whose, &|_| false).err();
        assert!(matches!(planned, Some(PlanError::Leaving { .. })), "{planned:?}");
        // The parent's own, selected, appeared since it was observed: the quiet retry, for the whole answer.
        let appeared = vec![cross_type(vec![labelled("b", "copy", "parent-uid")])];
        let stale = narrow(&appeared, &observed, &wanted, &parent(), &resource(true), whose).err();
        assert!(matches!(stale, Some(PlanError::Stale { .. })), "{stale:?}");
    }

    #[test]
    fn a_guards_share_is_of_every_child_the_parent_has() {
        let types = vec![cross_type(Vec::new())];
        let observed = vec![ChildMap::from([(key(Some("a"), "x"), Arc::new(labelled("a", "x", "parent-uid")))])];
        let desired = vec![ChildMap::<Value>::new()];
        let plan = Plan::new(&types, &observed, &desired, |_| Claim::Owned, &|_| false).unwrap();
        let half = Some(DeletionGuard::Percent(50.0));
        assert!(plan.check_guard(half, &parent(), 1).is_err(), "1 of 1");
        assert!(plan.check_guard(half, &parent(), 10).is_ok(), "1 of the parent's 10, whatever this plan is about");
    }

    #[test]
    fn child_rules_add_labels_and_annotations_and_hold_children_to_the_selector() {
        let types = vec![Arc::new(resource(true))];
        let defaults = BTreeMap::from([("controller-uid".to_owned(), "u-1".to_owned())]);
        let annotations = BTreeMap::from([("by".to_owned(), "me".to_owned())]);
        let selector = Selector::from_labels(&defaults);
        let rules = ChildRules {
            default_labels: Some(&defaults),
            annotations: Some(&annotations),
            selector: Some(&selector),
            cross_namespace: &[],
            role: ChildRole::Child,
        };
        let item = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "labels": {"x": "y"}}});
        let desired = desired_children(&types, &parent(), &resource(true), &[item], rules).unwrap();
        let meta = &desired[0].values().next().unwrap()["metadata"];
        assert_eq!(meta["labels"], json!({"x": "y", "controller-uid": "u-1"}));
        assert_eq!(meta["annotations"], json!({"by": "me"}));
        let other = json!({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "b", "labels": {"controller-uid": "someone-else"}}});
        let refused = desired_children(&types, &parent(), &resource(true), &[other], rules).unwrap_err();
        assert!(refused.contains("don't match parent selector"), "{refused}");
    }
}
