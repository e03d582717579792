//! One rolling sync of a CompositeController (`Rollouts::sync`): every live revision's hook call, the
//! claims, and the revisions to write before any child (`Pending`).

use super::ask::{Answer, CONTROLLER_UID_LABEL};
use super::revisions::{
    API_GROUP_LABEL, RESOURCE_LABEL, Revision, apply_patch, live_revisions, parent_patch, persist, revision_name,
    revision_object, stored_claims,
};
use super::rollout::{
    Rollout, claimed_desired, comparable, is_subset, response_order, roll, set_condition, type_infos,
};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::Value;

use crate::api::{ChildResourceRule, CompositeControllerSpec, UpdateMethod};
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::{Informer, ObjectKey};
use crate::cache::selector::Selector;
use crate::engine::error::SyncError;
use crate::hooks::CompositeResponse;
use crate::write::apply::{Applier, ApplyError};
use crate::write::children::{ChildMap, ClaimError, adopt_orphans, orphans_to_adopt, owner_reference};

/// What a rolling sync decided.
pub(crate) struct Decision {
    /// What the latest revision wants, each child in the state of the revision that claims it.
    pub desired: Vec<ChildMap<Value>>,
    /// The latest revision's status, with the `Updated` condition.
    pub status: Value,
    /// Every revision's response, latest first.
    pub responses: Vec<CompositeResponse>,
    /// The revisions to write before any child changes.
    pub pending: Pending,
}

/// Revisions with their new claims, written before children change so that a restart resumes the
/// rollout where it stopped.
pub(crate) struct Pending {
    resource: Arc<ResolvedResource>,
    revisions: Vec<Revision>,
    objects: Vec<Value>,
}

/// One write of `Pending::persist` (the revisions a rolling sync writes before any child), by revision
/// name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevisionWrite {
    Create(String),
    Update(String),
    /// A revision other than the latest that claims no child any more.
    Delete(String),
}

impl Pending {
    /// Whether persisting writes anything.
    pub fn writes(&self, applier: &Applier) -> bool {
        !self.planned(applier).is_empty()
    }

    /// The writes persisting makes, in its order (what `metahook diff` reports).
    pub fn planned(&self, applier: &Applier) -> Vec<RevisionWrite> {
        let mut writes = Vec::new();
        for (index, (revision, object)) in self.revisions.iter().zip(&self.objects).enumerate() {
            let empty = revision.children.values().all(Vec::is_empty);
            let name = revision.name.clone();
            let write = match &revision.stored {
                None => (index == 0 || !empty).then_some(RevisionWrite::Create(name)),
                Some(_) if index != 0 && empty => Some(RevisionWrite::Delete(name)),
                Some(stored) => (!applier.is_current(&self.resource, object, stored, UpdateMethod::InPlace))
                    .then_some(RevisionWrite::Update(name)),
            };
            writes.extend(write);
        }
        writes
    }

    pub async fn persist(&self, applier: &Applier) -> Result<(), ApplyError> {
        persist(applier, &self.resource, &self.revisions, &self.objects).await
    }
}

/// The rolling-update machinery of one CompositeController.
pub(crate) struct Rollouts {
    /// The `ControllerRevision` cache.
    pub informer: Informer,
    parent_resource: Arc<ResolvedResource>,
    child_resources: Vec<Arc<ResolvedResource>>,
    field_paths: Vec<String>,
    generate_selector: bool,
    rules: Vec<ChildResourceRule>,
}

impl Rollouts {
    pub fn new(
        informer: Informer,
        parent_resource: Arc<ResolvedResource>,
        child_resources: Vec<Arc<ResolvedResource>>,
        spec: &CompositeControllerSpec,
    ) -> Self {
        let paths = spec.parent_resource.revision_history.as_ref().map(|h| h.field_paths.clone());
        Self {
            informer,
            parent_resource,
            child_resources,
            field_paths: paths.filter(|p| !p.is_empty()).unwrap_or_else(|| vec!["spec".to_owned()]),
            generate_selector: spec.generate_selector == Some(true),
            rules: spec.child_resources.clone(),
        }
    }

    /// One rolling sync over the parent's `revisions` (as [`Rollouts::claim`] claimed them): `answer` is
    /// called for every live revision's parent (concurrently; any failure
    /// aborts the whole sync unchanged), children are kept on the revision that claims them and at most
    /// one moves to the latest. Nothing is written here: the caller persists [`Decision::pending`] before
    /// any child changes, once it knows the whole sync can be written.
    pub async fn sync<F, Fut>(
        &self,
        parent: &DynamicObject,
        parent_json: &Value,
        observed: &[ChildMap<Arc<DynamicObject>>],
        revisions: &[Arc<DynamicObject>],
        answer: F,
    ) -> Result<Decision, SyncError>
    where
        F: Fn(Value) -> Fut,
        Fut: Future<Output = Result<Answer, SyncError>>,
    {
        let (parent_resource, child_resources) = (&*self.parent_resource, &self.child_resources[..]);
        let paths = &self.field_paths;
        let uid = parent.metadata.uid.clone().unwrap_or_default();
        let namespace = parent.metadata.namespace.clone().unwrap_or_default();
        let latest_patch = parent_patch(parent_json, paths);
        let latest_name = revision_name(parent_resource, &uid, &latest_patch);
        let mut all = live_revisions(revisions, &latest_name, latest_patch);

        let parents = all
            .iter()
            .enumerate()
            .map(|(i, r)| if i == 0 { parent_json.clone() } else { apply_patch(parent_json, &r.patch, paths) });
        let answers = futures::future::try_join_all(parents.map(answer)).await?;
        let mut desired_by_revision = Vec::with_capacity(answers.len());
        let mut responses = Vec::with_capacity(answers.len());
        let mut latest_status = Value::Null;
        for (i, Answer { desired, status, response }) in answers.into_iter().enumerate() {
            if i == 0 {
                latest_status = status;
            }
            desired_by_revision.push(desired);
            responses.push(response);
        }

        let claims = stored_claims(&all, child_resources, &namespace);
        let latest_desired = &desired_by_revision[0];
        let wanted: BTreeSet<(usize, ObjectKey)> =
            latest_desired.iter().enumerate().flat_map(|(t, m)| m.keys().map(move |k| (t, k.clone()))).collect();
        let order = response_order(&responses[0].children, child_resources, &namespace);
        let observed_by_key: BTreeMap<(usize, ObjectKey), Arc<DynamicObject>> = observed
            .iter()
            .enumerate()
            .flat_map(|(t, m)| m.iter().map(move |(k, o)| ((t, k.clone()), Arc::clone(o))))
            .collect();
        let up_to_date = |child: &(usize, ObjectKey)| {
            let want = latest_desired[child.0].get(&child.1);
            let have = observed_by_key.get(child);
            matches!((want, have), (Some(w), Some(h))
                if is_subset(&comparable(w), &serde_json::to_value(&**h).unwrap_or(Value::Null)))
        };
        let types = type_infos(&self.rules, child_resources);
        let (claims, rollout) = roll(claims, &types, &wanted, &order, &observed_by_key, up_to_date);

        // Persist who owns what before any child changes.
        for revision in &mut all {
            revision.children.clear();
        }
        for ((t, key), index) in &claims {
            let resource = &child_resources[*t];
            let entry = all[*index].children.entry((resource.api_resource.group.clone(), resource.kind().to_owned()));
            entry.or_default().push(key.name.clone());
        }
        let labels = self.labels(parent, parent_resource);
        let owner = owner_reference(parent, parent_resource);
        let objects: Vec<Value> = all.iter().map(|r| revision_object(r, &namespace, &labels, &owner)).collect();

        let rollout = match rollout {
            Rollout::OnLatest { .. } => Rollout::OnLatest { revision: all[0].name.clone() },
            other => other,
        };
        let mut status = latest_status;
        set_condition(&mut status, rollout.condition());
        let pending = Pending { resource: Arc::clone(self.informer.resource()), revisions: all, objects };
        Ok(Decision { desired: claimed_desired(&desired_by_revision, &claims), status, responses, pending })
    }

    /// The parent's revisions: those it controls in its namespace, and the orphans there that its child
    /// selector plus the group and resource labels select, adopted first — Metacontroller's
    /// `claimRevisions` (`composite/controller_revision.go`: `makeSelector(parent, {apiGroup, resource})`,
    /// then `ClaimControllerRevisions`, which adopts with a controller ownerRef after a live read of the
    /// parent, `canAdoptFunc`), done here as children are adopted ([`adopt_orphans`]). `None`: the parent
    /// is gone or being deleted.
    ///
    /// One deliberate difference: a revision the parent controls is kept even when the selector no longer
    /// matches it, where Metacontroller releases it. The hub labels the revisions it writes with the
    /// parent's `spec.template.metadata.labels`, as Metacontroller does, and a parent whose selector does
    /// not match those would release its own revisions on every sync (and then fail to create them again,
    /// Metacontroller #194); kept, its rollout goes on.
    pub async fn claim(
        &self,
        client: &kube::Client,
        parent: &DynamicObject,
        selector: &Selector,
    ) -> Result<Option<Vec<Arc<DynamicObject>>>, ClaimError> {
        let (mut revisions, _) = self.claims(parent, selector);
        let selector = self.revision_selector(selector);
        let Some(adopted) = adopt_orphans(client, parent, &self.parent_resource, &selector, &self.informer).await?
        else {
            return Ok(None);
        };
        if !adopted.is_empty() {
            let names: Vec<&str> = adopted.iter().filter_map(|r| r.metadata.name.as_deref()).collect();
            tracing::info!(parent = %ObjectKey::of(parent), ?names, "adopted orphaned ControllerRevisions");
        }
        revisions.extend(adopted.into_iter().map(Arc::new));
        Ok(Some(revisions))
    }

    /// What [`Rollouts::claim`] decides, without writing: the revisions `parent` controls in its
    /// namespace, and the orphans it would adopt (as they are now, without the parent's ownerReference).
    /// `metahook diff` previews a rolling sync from them.
    pub fn claims(
        &self,
        parent: &DynamicObject,
        selector: &Selector,
    ) -> (Vec<Arc<DynamicObject>>, Vec<Arc<DynamicObject>>) {
        let uid = parent.metadata.uid.as_deref().unwrap_or_default();
        let owned = self
            .informer
            .controlled_by(uid)
            .into_iter()
            .filter(|r| r.metadata.namespace == parent.metadata.namespace)
            .collect();
        let parent_ns = parent.metadata.namespace.as_deref();
        let orphans = orphans_to_adopt(&self.informer, parent, parent_ns, &self.revision_selector(selector));
        (owned, orphans)
    }

    /// The parent's child selector plus the group and resource labels: which revisions are its.
    fn revision_selector(&self, selector: &Selector) -> Selector {
        let group = &self.parent_resource.api_resource.group;
        let type_labels = BTreeMap::from([
            (API_GROUP_LABEL.to_owned(), group.clone()),
            (RESOURCE_LABEL.to_owned(), self.parent_resource.api_resource.plural.clone()),
        ]);
        selector.and_labels(&type_labels)
    }

    /// Labels of a revision: the parent's pod-template labels (or `controller-uid`) plus group/resource.
    fn labels(&self, parent: &DynamicObject, parent_resource: &ResolvedResource) -> BTreeMap<String, String> {
        let mut labels: BTreeMap<String, String> = if self.generate_selector {
            BTreeMap::from([(CONTROLLER_UID_LABEL.to_owned(), parent.metadata.uid.clone().unwrap_or_default())])
        } else {
            parent
                .data
                .pointer("/spec/template/metadata/labels")
                .and_then(|l| serde_json::from_value(l.clone()).ok())
                .unwrap_or_default()
        };
        labels.insert(API_GROUP_LABEL.to_owned(), parent_resource.api_resource.group.clone());
        labels.insert(RESOURCE_LABEL.to_owned(), parent_resource.api_resource.plural.clone());
        labels
    }
}
