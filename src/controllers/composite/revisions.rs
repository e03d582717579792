//! Rolling updates: parent revisions kept as Metacontroller `ControllerRevision`s, and the rule that
//! moves children to the latest revision one at a time.
//!
//! A revision records the parent's rolled fields (`parentPatch`, `revisionHistory.fieldPaths`, default
//! `spec`) and which children it claims. Every live revision's parent is sent to the hook; a child keeps
//! the desired state of the revision that claims it. Revisions are written before any child is touched,
//! so a restarted hub resumes a rollout where it stopped instead of replacing children again.
//!
//! [`Rollouts::sync`] runs one rolling sync (every revision's hook call, the claims, persisting); the
//! pieces it is made of are pure and tested beside the code.

use super::ask::{Answer, CONTROLLER_UID_LABEL};
use crate::api::json::canonical_json;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::DynamicObject;
use serde_json::{Map, Value, json};
use sha1::{Digest as _, Sha1};

use crate::api::{ChildResourceRule, CompositeControllerSpec, StatusConditionCheck, UpdateMethod};
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::{Informer, ObjectKey};
use crate::engine::error::SyncError;
use crate::hooks::CompositeResponse;
use crate::write::apply::{Applier, ApplyError};
use crate::write::children::{ChildMap, owner_reference};

/// Labels Metacontroller puts on revisions, so revisions it wrote are recognised.
pub const API_GROUP_LABEL: &str = "metacontroller.k8s.io/apiGroup";
pub const RESOURCE_LABEL: &str = "metacontroller.k8s.io/resource";

/// The `ControllerRevision` CRD (no `spec`: `parentPatch` and `children` are top-level, as in Metacontroller).
#[must_use]
pub fn crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "controllerrevisions.metacontroller.k8s.io"},
        "spec": {
            "group": "metacontroller.k8s.io",
            "names": {"kind": "ControllerRevision", "listKind": "ControllerRevisionList",
                      "plural": "controllerrevisions", "singular": "controllerrevision"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {
                    "description": "A parent revision of a CompositeController with rolling child updates.",
                    "type": "object",
                    "required": ["metadata", "parentPatch"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "parentPatch": {
                            "description": "The parent's fields listed in revisionHistory.fieldPaths, as of this revision.",
                            "type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "children": {
                            "description": "Children that belong to this revision.",
                            "type": "array",
                            "items": {"type": "object", "required": ["apiGroup", "kind", "names"], "properties": {
                                "apiGroup": {"type": "string"},
                                "kind": {"type": "string"},
                                "names": {"type": "array", "items": {"type": "string"}}}}},
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                    }
                }}
            }]
        }
    }))
    .expect("a well-formed CRD")
}

/// Children one revision claims, by child type (index into the controller's child types).
pub type Claims = BTreeMap<(usize, ObjectKey), usize>;

/// The parent's fields at `field_paths` (dotted, e.g. `spec.template`), as a sparse object.
#[must_use]
pub fn parent_patch(parent: &Value, field_paths: &[String]) -> Value {
    let mut patch = Value::Object(Map::new());
    for path in field_paths {
        let segments: Vec<&str> = path.split('.').collect();
        if let Some(value) = lookup(parent, &segments) {
            set(&mut patch, &segments, Some(value.clone()));
        }
    }
    patch
}

/// `parent` with the fields at `field_paths` taken from `patch` (absent there = removed).
#[must_use]
pub fn apply_patch(parent: &Value, patch: &Value, field_paths: &[String]) -> Value {
    let mut result = parent.clone();
    for path in field_paths {
        let segments: Vec<&str> = path.split('.').collect();
        set(&mut result, &segments, lookup(patch, &segments).cloned());
    }
    result
}

fn lookup<'a>(value: &'a Value, segments: &[&str]) -> Option<&'a Value> {
    segments.iter().try_fold(value, |v, s| v.get(s))
}

fn set(value: &mut Value, segments: &[&str], new: Option<Value>) {
    let Some((last, parents)) = segments.split_last() else { return };
    let mut cursor = value;
    for segment in parents {
        let Some(map) = cursor.as_object_mut() else { return };
        cursor = map.entry(*segment).or_insert_with(|| Value::Object(Map::new()));
    }
    if let Some(map) = cursor.as_object_mut() {
        match new {
            Some(v) => map.insert((*last).to_owned(), v),
            None => map.remove(*last),
        };
    }
}

/// `<plural>.<group|core>-<sha1(parentUID + parentPatch)>`, Metacontroller's revision name.
#[must_use]
pub fn revision_name(parent_resource: &ResolvedResource, parent_uid: &str, patch: &Value) -> String {
    let group =
        if parent_resource.api_resource.group.is_empty() { "core" } else { &parent_resource.api_resource.group };
    let mut prefix = format!("{}.{group}", parent_resource.api_resource.plural);
    prefix.truncate(212);
    let mut hasher = Sha1::new();
    hasher.update(parent_uid.as_bytes());
    hasher.update(canonical_json(patch).as_bytes());
    let digest = hasher.finalize().iter().fold(String::with_capacity(40), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    });
    format!("{prefix}-{digest}")
}

/// A revision as read from the cluster (or about to be created).
#[derive(Debug, Clone)]
pub struct Revision {
    pub name: String,
    pub patch: Value,
    /// `(apiGroup, kind)` → child names.
    pub children: BTreeMap<(String, String), Vec<String>>,
    /// The stored object; `None` for a revision not yet created.
    pub stored: Option<Arc<DynamicObject>>,
}

impl Revision {
    /// Reads a stored ControllerRevision.
    #[must_use]
    pub fn from_object(obj: Arc<DynamicObject>) -> Self {
        let mut children: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for entry in obj.data.get("children").and_then(Value::as_array).into_iter().flatten() {
            let text = |k: &str| entry.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
            let names = entry.get("names").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str);
            children.entry((text("apiGroup"), text("kind"))).or_default().extend(names.map(str::to_owned));
        }
        Self {
            name: obj.metadata.name.clone().unwrap_or_default(),
            patch: obj.data.get("parentPatch").cloned().unwrap_or_else(|| json!({})),
            children,
            stored: Some(obj),
        }
    }
}

/// Why the rollout is where it is: the `Updated` condition injected into the parent's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rollout {
    /// Every rolling child is on the latest revision.
    OnLatest { revision: String },
    /// This child is being moved to the latest revision now.
    Progressing { kind: String, name: String },
    /// A child on the latest revision is not ready yet; nothing moves.
    Waiting { reason: String },
}

impl Rollout {
    /// The condition, in Metacontroller's shape.
    #[must_use]
    pub fn condition(&self) -> Value {
        let (status, reason, message) = match self {
            Self::OnLatest { revision } => {
                ("True", "OnLatestRevision", format!("latest ControllerRevision: {revision}"))
            }
            Self::Progressing { kind, name } => ("False", "RolloutProgressing", format!("updating {kind} {name}")),
            Self::Waiting { reason } => ("False", "RolloutWaiting", reason.clone()),
        };
        json!({"type": "Updated", "status": status, "reason": reason, "message": message})
    }
}

/// What one child type needs for the rollout decision.
pub struct TypeInfo<'a> {
    pub kind: &'a str,
    pub method: UpdateMethod,
    pub checks: &'a [StatusConditionCheck],
}

/// Decides which revision each child belongs to after this sync, moving at most one child.
///
/// `claims` are the stored claims (revision 0 = latest); `desired_types` the children the latest
/// revision wants; `order` the latest response's child order; `up_to_date(child)` whether the observed
/// child already matches the latest desired state.
pub fn roll(
    mut claims: Claims,
    types: &[TypeInfo<'_>],
    desired_types: &BTreeSet<(usize, ObjectKey)>,
    order: &[(usize, ObjectKey)],
    observed: &BTreeMap<(usize, ObjectKey), Arc<DynamicObject>>,
    up_to_date: impl Fn(&(usize, ObjectKey)) -> bool,
) -> (Claims, Rollout) {
    // Children the latest revision no longer wants lose their claims (they will be deleted).
    claims.retain(|child, _| desired_types.contains(child));
    for child in desired_types {
        claims.entry(child.clone()).or_insert(0);
    }
    // Non-rolling types always follow the latest revision; so does a child already matching it.
    for (child, revision) in &mut claims {
        if *revision != 0 && (!types[child.0].method.is_rolling() || up_to_date(child)) {
            *revision = 0;
        }
    }
    let pending: Vec<&(usize, ObjectKey)> =
        order.iter().filter(|c| claims.get(*c).is_some_and(|r| *r != 0) && types[c.0].method.is_rolling()).collect();
    let Some(next) = pending.first() else {
        return (claims, Rollout::OnLatest { revision: String::new() });
    };
    // Every rolling child already on the latest revision must be there and healthy first.
    for child in order.iter().filter(|c| claims.get(*c) == Some(&0) && types[c.0].method.is_rolling()) {
        let info = &types[child.0];
        let Some(obj) = observed.get(child) else {
            return (
                claims,
                Rollout::Waiting { reason: format!("waiting for {} {} to be created", info.kind, child.1.name) },
            );
        };
        if !up_to_date(child) {
            return (
                claims,
                Rollout::Waiting { reason: format!("waiting for {} {} to be updated", info.kind, child.1.name) },
            );
        }
        if let Some(reason) = not_ready(obj, info) {
            return (claims, Rollout::Waiting { reason: format!("{} {} {reason}", info.kind, child.1.name) });
        }
    }
    let next = (*next).clone();
    claims.insert(next.clone(), 0);
    (claims, Rollout::Progressing { kind: types[next.0].kind.to_owned(), name: next.1.name })
}

/// Why an updated child may not count as done yet, if it may not.
fn not_ready(obj: &DynamicObject, info: &TypeInfo<'_>) -> Option<String> {
    let status = obj.data.get("status");
    if info.method == UpdateMethod::RollingInPlace {
        let observed = status.and_then(|s| s.get("observedGeneration")).and_then(Value::as_i64);
        if let (Some(seen), Some(generation)) = (observed, obj.metadata.generation)
            && seen < generation
        {
            return Some(format!("has observedGeneration {seen} < generation {generation}"));
        }
    }
    let conditions = status.and_then(|s| s.get("conditions")).and_then(Value::as_array);
    for check in info.checks {
        let found =
            conditions.into_iter().flatten().find(|c| c.get("type").and_then(Value::as_str) == Some(&check.type_));
        let Some(found) = found else { return Some(format!("has no {} condition", check.type_)) };
        let field = |k: &str| found.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
        if let Some(want) = &check.status
            && field("status") != *want
        {
            return Some(format!("has condition {}={} (want {want})", check.type_, field("status")));
        }
        if let Some(want) = &check.reason
            && field("reason") != *want
        {
            return Some(format!("has condition {} reason {} (want {want})", check.type_, field("reason")));
        }
    }
    None
}

/// Whether applying `desired` to `observed` would change nothing: every field the desired object sets
/// has that value already (ownership and status aside). A list of objects keyed by one of
/// [`LIST_MAP_KEYS`] is compared item by item by key, so items others added (the API server's
/// service-account token volume and its mount in every Pod) are no difference; other lists must match
/// whole.
#[must_use]
pub fn is_subset(desired: &Value, observed: &Value) -> bool {
    match (desired, observed) {
        (Value::Object(d), Value::Object(o)) => {
            d.iter().all(|(k, v)| o.get(k).map_or_else(|| is_zero(v), |ov| is_subset(v, ov)))
        }
        (Value::Array(d), Value::Array(o)) => match list_map_key(d, o) {
            Some(key) => d.iter().all(|item| o.iter().any(|have| have[key] == item[key] && is_subset(item, have))),
            None => d.len() == o.len() && d.iter().zip(o).all(|(a, b)| is_subset(a, b)),
        },
        (d, o) => d == o,
    }
}

/// Keys that make a list of objects a map, in the order Metacontroller's `dynamic-apply` tries them
/// when it merges lists (`containers` and `volumes` by `name`, `volumeMounts` by `mountPath`, ...).
pub const LIST_MAP_KEYS: [&str; 7] = ["containerPort", "port", "mountPath", "name", "uid", "ip", "path"];

/// The first of [`LIST_MAP_KEYS`] that every item of both lists has, if all items are objects.
fn list_map_key(desired: &[Value], observed: &[Value]) -> Option<&'static str> {
    let items = || desired.iter().chain(observed);
    if desired.is_empty() || !items().all(Value::is_object) {
        return None;
    }
    LIST_MAP_KEYS.into_iter().find(|key| items().all(|item| item.get(key).is_some()))
}

/// Values the API server drops when stored (`omitempty`), so their absence is no difference.
fn is_zero(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// The desired object without what the hub adds (ownership), for [`is_subset`] against an observed one.
#[must_use]
pub fn comparable(desired: &Value) -> Value {
    let mut desired = desired.clone();
    if let Some(meta) = desired.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("ownerReferences");
    }
    desired
}

/// Writes revisions: the latest (created if new) and every other one with its current claims; deletes
/// non-latest revisions that claim nothing. Done before children change, so a restart resumes here.
pub async fn persist(
    applier: &Applier,
    resource: &ResolvedResource,
    revisions: &[Revision],
    objects: &[Value],
) -> Result<(), ApplyError> {
    for (index, (revision, desired)) in revisions.iter().zip(objects).enumerate() {
        if index != 0 && revision.children.values().all(Vec::is_empty) {
            if let Some(stored) = &revision.stored {
                applier.delete(resource, stored).await?;
            }
            continue;
        }
        applier.apply(resource, desired, revision.stored.as_deref(), UpdateMethod::InPlace).await?;
    }
    Ok(())
}

/// The ControllerRevision object for `revision`.
#[must_use]
pub fn revision_object(
    revision: &Revision,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
) -> Value {
    let children: Vec<Value> = revision
        .children
        .iter()
        .filter(|(_, names)| !names.is_empty())
        .map(|((group, kind), names)| json!({"apiGroup": group, "kind": kind, "names": names}))
        .collect();
    json!({
        "apiVersion": "metacontroller.k8s.io/v1alpha1",
        "kind": "ControllerRevision",
        "metadata": {"name": revision.name, "namespace": namespace, "labels": labels, "ownerReferences": [owner]},
        "parentPatch": revision.patch,
        "children": children,
    })
}

/// Puts the `Updated` condition into a status object (replacing an older one).
pub fn set_condition(status: &mut Value, condition: Value) {
    let Some(map) = status.as_object_mut() else { return };
    let conditions = map.entry("conditions").or_insert_with(|| json!([]));
    if let Some(list) = conditions.as_array_mut() {
        list.retain(|c| c.get("type") != condition.get("type"));
        list.push(condition);
    } else {
        *conditions = json!([condition]);
    }
}

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

impl Pending {
    /// Whether persisting writes anything.
    pub fn writes(&self, applier: &Applier) -> bool {
        self.revisions.iter().zip(&self.objects).enumerate().any(|(index, (revision, object))| match &revision.stored {
            None => index == 0 || !revision.children.values().all(Vec::is_empty),
            Some(_) if index != 0 && revision.children.values().all(Vec::is_empty) => true,
            Some(stored) => !applier.is_current(&self.resource, object, stored, UpdateMethod::InPlace),
        })
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

    /// One rolling sync: `answer` is called for every live revision's parent (concurrently; any failure
    /// aborts the whole sync unchanged), children are kept on the revision that claims them and at most
    /// one moves to the latest. Nothing is written here: the caller persists [`Decision::pending`] before
    /// any child changes, once it knows the whole sync can be written.
    pub async fn sync<F, Fut>(
        &self,
        parent: &DynamicObject,
        parent_json: &Value,
        observed: &[ChildMap<Arc<DynamicObject>>],
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
        let mut all = live_revisions(&self.informer, &uid, &namespace, &latest_name, latest_patch);

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
            Rollout::OnLatest { .. } => Rollout::OnLatest { revision: latest_name },
            other => other,
        };
        let mut status = latest_status;
        set_condition(&mut status, rollout.condition());
        let pending = Pending { resource: Arc::clone(self.informer.resource()), revisions: all, objects };
        Ok(Decision { desired: claimed_desired(&desired_by_revision, &claims), status, responses, pending })
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

/// The latest revision first (stored, or new with no children), then the other stored ones.
fn live_revisions(
    informer: &Informer,
    uid: &str,
    namespace: &str,
    latest_name: &str,
    latest_patch: Value,
) -> Vec<Revision> {
    let mut stored: Vec<Revision> = informer
        .controlled_by(uid)
        .into_iter()
        .filter(|r| r.metadata.namespace.as_deref() == Some(namespace))
        .map(Revision::from_object)
        .collect();
    stored.sort_by(|a, b| a.name.cmp(&b.name));
    let latest = match stored.iter().position(|r| r.name == latest_name) {
        Some(i) => stored.remove(i),
        None => Revision { name: latest_name.to_owned(), patch: latest_patch, children: BTreeMap::new(), stored: None },
    };
    let mut all = vec![latest];
    all.extend(stored);
    all
}

/// What the rollout rule needs to know of each child type.
fn type_infos<'a>(rules: &'a [ChildResourceRule], types: &'a [Arc<ResolvedResource>]) -> Vec<TypeInfo<'a>> {
    rules
        .iter()
        .zip(types)
        .map(|(rule, resource)| TypeInfo {
            kind: resource.kind(),
            method: rule.method(),
            checks: rule.update_strategy.as_ref().and_then(|s| s.status_checks.as_ref()).map_or(&[], |c| &c.conditions),
        })
        .collect()
}

/// Claims recorded in stored revisions; where two claim a child, the latest (index 0) wins.
fn stored_claims(revisions: &[Revision], types: &[Arc<ResolvedResource>], namespace: &str) -> Claims {
    let mut claims = Claims::new();
    for (index, revision) in revisions.iter().enumerate().rev() {
        for ((group, kind), names) in &revision.children {
            let Some(t) = types.iter().position(|r| r.api_resource.group == *group && r.kind() == kind) else {
                continue;
            };
            for name in names {
                claims.insert((t, ObjectKey { namespace: Some(namespace.to_owned()), name: name.clone() }), index);
            }
        }
    }
    claims
}

/// The children to apply: what the latest revision wants, each in the state of the revision claiming it.
fn claimed_desired(desired_by_revision: &[Vec<ChildMap<Value>>], claims: &Claims) -> Vec<ChildMap<Value>> {
    desired_by_revision[0]
        .iter()
        .enumerate()
        .map(|(t, children)| {
            children
                .iter()
                .map(|(key, latest)| {
                    let revision = claims.get(&(t, key.clone())).copied().unwrap_or(0);
                    let chosen = desired_by_revision[revision][t].get(key).unwrap_or(latest);
                    (key.clone(), chosen.clone())
                })
                .collect()
        })
        .collect()
}

/// The latest response's children as (type, key), in the order the hook listed them.
fn response_order(children: &[Value], types: &[Arc<ResolvedResource>], namespace: &str) -> Vec<(usize, ObjectKey)> {
    children
        .iter()
        .filter_map(|c| {
            let text = |p: &str| c.pointer(p).and_then(Value::as_str).unwrap_or_default();
            let t = types.iter().position(|r| r.api_version() == text("/apiVersion") && r.kind() == text("/kind"))?;
            let name = text("/metadata/name").to_owned();
            Some((t, ObjectKey { namespace: Some(namespace.to_owned()), name }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> (usize, ObjectKey) {
        (0, ObjectKey { namespace: Some("ns".into()), name: name.into() })
    }

    fn pod(name: &str, ready: bool) -> Arc<DynamicObject> {
        Arc::new(
            serde_json::from_value(
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
                "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}}),
            )
            .unwrap(),
        )
    }

    fn ready_check() -> Vec<StatusConditionCheck> {
        vec![StatusConditionCheck { type_: "Ready".into(), status: Some("True".into()), reason: None }]
    }

    #[test]
    fn patches_keep_only_rolled_fields_and_apply_back() {
        let parent = json!({"metadata": {"name": "p"}, "spec": {"replicas": 3, "template": {"image": "v2"}}});
        let paths = vec!["spec.template".to_owned()];
        let patch = parent_patch(&parent, &paths);
        assert_eq!(patch, json!({"spec": {"template": {"image": "v2"}}}));
        let old = json!({"spec": {"template": {"image": "v1"}}});
        let rebuilt = apply_patch(&parent, &old, &paths);
        assert_eq!(rebuilt["spec"], json!({"replicas": 3, "template": {"image": "v1"}}), "replicas apply at once");
    }

    /// The expected text and hash were computed by Go 1.26's `encoding/json` (what Metacontroller's
    /// `controllerRevisionHash` uses, via `k8s.io/apimachinery/pkg/util/json`): a tiny program decoded
    /// this patch as the API machinery does (`UseNumber`, then int64 when the literal fits, else float64),
    /// printed `json.Marshal(patch)` and `hex(sha1("uid-1" + that))`.
    #[test]
    fn revision_json_is_byte_for_byte_what_go_writes() {
        let patch: Value = serde_json::from_str(
            r#"{"spec":{"cmd":"a<b && c>d","sep":"x\u2028y\u2029z","ctl":"\u0001\b\f\n\r\t\u001f\u007f",
                "uni":"caf\u00e9 \ud83d\ude00 /","<k>":[1,-2,1.0,2.5,1.5e-7,1e21,1e20,0.000001,
                18446744073709551615,12345678901234567890.5,true,null,{}],"b":{"z":1,"a":[]}}}"#,
        )
        .unwrap();
        let go = "{\"spec\":{\"\\u003ck\\u003e\":[1,-2,1,2.5,1.5e-7,1e+21,100000000000000000000,0.000001,\
                  18446744073709552000,12345678901234567000,true,null,{}],\"b\":{\"a\":[],\"z\":1},\
                  \"cmd\":\"a\\u003cb \\u0026\\u0026 c\\u003ed\",\"ctl\":\"\\u0001\\b\\f\\n\\r\\t\\u001f\u{7f}\",\
                  \"sep\":\"x\\u2028y\\u2029z\",\"uni\":\"café 😀 /\"}}";
        assert_eq!(canonical_json(&patch), go);
        let resource = ResolvedResource {
            api_resource: kube::core::ApiResource {
                group: "ctl.example.com".into(),
                version: "v1".into(),
                api_version: "ctl.example.com/v1".into(),
                kind: "CatSet".into(),
                plural: "catsets".into(),
            },
            namespaced: true,
            has_status: true,
        };
        assert_eq!(
            revision_name(&resource, "uid-1", &patch),
            "catsets.ctl.example.com-dfbc2bd0f5cd086ca1b55f473e07d583ca11c56a"
        );
    }

    #[test]
    fn revision_names_are_stable_and_depend_on_uid_and_patch() {
        let resource = ResolvedResource {
            api_resource: kube::core::ApiResource {
                group: "ctl.example.com".into(),
                version: "v1".into(),
                api_version: "ctl.example.com/v1".into(),
                kind: "CatSet".into(),
                plural: "catsets".into(),
            },
            namespaced: true,
            has_status: true,
        };
        let a = revision_name(&resource, "uid-1", &json!({"spec": {"b": 1, "a": 2}}));
        assert!(a.starts_with("catsets.ctl.example.com-") && a.len() == "catsets.ctl.example.com-".len() + 40);
        assert_eq!(a, revision_name(&resource, "uid-1", &json!({"spec": {"a": 2, "b": 1}})), "key order is irrelevant");
        assert_ne!(a, revision_name(&resource, "uid-2", &json!({"spec": {"b": 1, "a": 2}})));
        assert_ne!(a, revision_name(&resource, "uid-1", &json!({"spec": {"b": 1, "a": 3}})));
    }

    fn rolling_types(checks: &[StatusConditionCheck]) -> Vec<TypeInfo<'_>> {
        vec![TypeInfo { kind: "Pod", method: UpdateMethod::RollingRecreate, checks }]
    }

    #[test]
    fn moves_one_child_at_a_time_in_response_order_when_latest_children_are_ready() {
        let checks = ready_check();
        let types = rolling_types(&checks);
        let order = vec![key("a"), key("b"), key("c")];
        let desired: BTreeSet<_> = order.iter().cloned().collect();
        let claims: Claims = order.iter().map(|k| (k.clone(), 1)).collect();
        let observed: BTreeMap<_, _> = order.iter().map(|k| (k.clone(), pod(&k.1.name, true))).collect();
        let (claims, rollout) = roll(claims, &types, &desired, &order, &observed, |_| false);
        assert_eq!(rollout, Rollout::Progressing { kind: "Pod".into(), name: "a".into() });
        assert_eq!(claims[&key("a")], 0);
        assert_eq!((claims[&key("b")], claims[&key("c")]), (1, 1));
    }

    #[test]
    fn waits_while_an_updated_child_is_missing_stale_or_not_ready() {
        let checks = ready_check();
        let types = rolling_types(&checks);
        let order = vec![key("a"), key("b")];
        let desired: BTreeSet<_> = order.iter().cloned().collect();
        let claims: Claims = [(key("a"), 0), (key("b"), 1)].into_iter().collect();
        let mut observed = BTreeMap::new();
        let (_, rollout) = roll(claims.clone(), &types, &desired, &order, &observed, |_| false);
        assert_eq!(rollout, Rollout::Waiting { reason: "waiting for Pod a to be created".into() });
        observed.insert(key("a"), pod("a", false));
        observed.insert(key("b"), pod("b", true));
        let up_to_date = |c: &(usize, ObjectKey)| c.1.name == "a";
        let (after, rollout) = roll(claims, &types, &desired, &order, &observed, up_to_date);
        assert_eq!(rollout, Rollout::Waiting { reason: "Pod a has condition Ready=False (want True)".into() });
        assert_eq!(after[&key("b")], 1, "nothing moves while waiting");
    }

    #[test]
    fn new_children_join_latest_and_unwanted_ones_lose_their_claims() {
        let checks = ready_check();
        let types = rolling_types(&checks);
        let order = vec![key("a"), key("new")];
        let desired: BTreeSet<_> = order.iter().cloned().collect();
        let claims: Claims = [(key("a"), 1), (key("gone"), 1)].into_iter().collect();
        let observed: BTreeMap<_, _> = [(key("a"), pod("a", true))].into_iter().collect();
        let (claims, _) = roll(claims, &types, &desired, &order, &observed, |c| c.1.name == "a");
        assert_eq!(claims.get(&key("new")), Some(&0));
        assert_eq!(claims.get(&key("a")), Some(&0), "already matching the latest state: moves at once");
        assert!(!claims.contains_key(&key("gone")));
    }

    #[test]
    fn subset_means_applying_would_change_nothing() {
        let observed = json!({"spec": {"containers": [{"name": "c", "image": "v1", "imagePullPolicy": "Always"}]}});
        assert!(is_subset(&json!({"spec": {"containers": [{"name": "c", "image": "v1"}]}}), &observed));
        assert!(!is_subset(&json!({"spec": {"containers": [{"name": "c", "image": "v2"}]}}), &observed));
        let pod = json!({"metadata": {"name": "p"}, "spec": {"hostNetwork": true}});
        assert!(is_subset(&json!({"metadata": {"name": "p", "annotations": {}}, "spec": {"hostNetwork": true}}), &pod));
        assert!(
            !is_subset(&json!({"metadata": {"annotations": {"a": "b"}}}), &pod),
            "a missing non-empty field differs"
        );
    }

    #[test]
    fn items_others_added_to_a_keyed_list_are_no_difference() {
        // What the API server stores for a Pod that mounts a claim: ServiceAccount admission added a volume
        // and a volumeMount. Before, a rolling child with `volumes` never counted as updated.
        let observed = json!({"spec": {
            "containers": [{"name": "c", "image": "v1", "volumeMounts": [
                {"name": "www", "mountPath": "/www"},
                {"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
            "volumes": [
                {"name": "www", "persistentVolumeClaim": {"claimName": "www-0"}},
                {"name": "kube-api-access-x", "projected": {"sources": []}}]}});
        let desired = |claim: &str, image: &str| {
            json!({"spec": {
                "containers": [{"name": "c", "image": image, "volumeMounts": [{"name": "www", "mountPath": "/www"}]}],
                "volumes": [{"name": "www", "persistentVolumeClaim": {"claimName": claim}}]}})
        };
        assert!(is_subset(&desired("www-0", "v1"), &observed));
        assert!(!is_subset(&desired("www-1", "v1"), &observed), "a keyed item's own fields still count");
        assert!(!is_subset(&desired("www-0", "v2"), &observed));
        let other = json!({"spec": {"volumes": [{"name": "cache", "emptyDir": {}}]}});
        assert!(!is_subset(&other, &observed), "a desired item missing from the observed list differs");
        // Lists without a key still compare whole.
        assert!(!is_subset(&json!({"args": ["a"]}), &json!({"args": ["a", "b"]})));
        assert!(!is_subset(&json!({"l": [{"x": 1}]}), &json!({"l": [{"x": 1}, {"x": 2}]})));
    }

    #[test]
    fn updated_condition_replaces_an_older_one() {
        let mut status = json!({"conditions": [{"type": "Updated", "status": "False"}, {"type": "Other"}]});
        set_condition(&mut status, Rollout::OnLatest { revision: "r".into() }.condition());
        let conditions = status["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 2);
        assert_eq!(conditions[1]["reason"], "OnLatestRevision");
    }
}
