//! Bucket labels on parents: every parent of a sharded ring carries `shard.metahook.dev/<ring>:
//! <bucket>`, so that each member's caches select the buckets it holds on the server (see
//! [`crate::cache::shard`]).
//!
//! The label is a function of the parent's UID, so whoever writes it writes the same value, and the
//! write needs no owner. Each member labels the unlabelled parents of the buckets it holds, as its
//! watch of unlabelled parents reports them and as buckets arrive, and each `rebalanceInterval` puts
//! back a label someone changed that its caches show ([`Labeller`]); the coordinator puts back labels
//! that name no bucket ([`crate::ops::ring::Coordinator`], with [`label_parents`]).
//!
//! Why the members and not the coordinator alone: a parent is synced only once it is labelled, so
//! with the coordinator alone every parent created after it died waited for the next one to be
//! elected (a leader Lease's duration and more), and a backlog was labelled by one writer rather than
//! N. Why only the buckets it holds: every member sees every unlabelled parent; the split makes each
//! label one write, not one per member (all but the first of which would conflict).
//!
//! Children carry their parent's bucket too: the hub stamps it on what it writes, and the coordinator
//! labels the children written before the ring existed ([`label_children`]). A former child that has
//! no controller any more is moved to [`ORPHANS`] by the member whose caches show it, each
//! `rebalanceInterval`, so that any member's parent can adopt it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt as _, Stream, StreamExt as _, stream};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::Client;
use kube::api::{Api, DynamicObject, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::api::{AnnotationSelector, ChildResourceRule, CompositeController, DecoratorController};
use crate::cache::discovery::{Discovery, ResolvedResource};
use crate::cache::informers::Informers;
use crate::cache::selector::{Selector, parse_selector_string, server_side};
use crate::cache::shard::{Held, ORPHANS, Role, bucket, parent_shard_label, shard_label};

/// Label writes sent at once.
const WRITES_AT_ONCE: usize = 32;

/// Watch events taken in one go before their parents are labelled (a burst of new parents is labelled
/// in batches written concurrently, not one write per event).
const EVENTS_AT_ONCE: usize = 500;

/// How many ticks the parent types are used before they are read again.
pub const TYPES_EVERY_TICKS: u32 = 5;

/// Errors of reading what to label (each retries at its next pass).
#[derive(Debug, thiserror::Error)]
pub enum LabelError {
    #[error("reading the controllers: {0}")]
    Controllers(#[source] Box<kube::Error>),
    #[error("listing {resource}: {source}")]
    List { resource: String, source: Box<kube::Error> },
}

/// One parent type, and the label selectors its controllers choose parents with.
pub struct ParentType {
    pub parent: Arc<ResolvedResource>,
    /// Server-side forms of the controllers' parent selectors ("" = every object of the type).
    pub selectors: BTreeSet<String>,
}

impl ParentType {
    /// What tells two readings of the types apart.
    fn key(&self) -> (String, String, BTreeSet<String>) {
        let resource = &self.parent.api_resource;
        (resource.api_version.clone(), resource.plural.clone(), self.selectors.clone())
    }
}

/// The composite and decorator controllers whose labels match `controllers` (the hub's
/// `targetLabelSelector`), MapControllers among the composites.
async fn read_controllers(
    client: &Client,
    controllers: &str,
) -> Result<(Vec<CompositeController>, Vec<DecoratorController>), LabelError> {
    let err = |e| LabelError::Controllers(Box::new(e));
    let params = kube::api::ListParams::default().labels(controllers);
    let composites = Api::<CompositeController>::all(client.clone()).list(&params).await.map_err(err)?;
    let decorators = Api::<DecoratorController>::all(client.clone()).list(&params).await.map_err(err)?;
    let mut composites = composites.items;
    // A MapController's parents and outputs carry bucket labels as a composite's parents and children
    // do: read here as the composite it is shaped like. Without its CRD (404) there are none.
    match Api::<crate::api::MapController>::all(client.clone()).list(&params).await {
        Ok(maps) => composites.extend(maps.items.iter().map(shaped_as_composite)),
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(e) => return Err(err(e)),
    }
    Ok((composites, decorators.items))
}

/// A MapController as the composite of the same parent type, whose children are its outputs: what
/// labelling needs of it.
fn shaped_as_composite(mc: &crate::api::MapController) -> CompositeController {
    let parent = &mc.spec.parent_resource;
    let spec = crate::api::CompositeControllerSpec {
        parent_resource: crate::api::ParentResourceRule {
            api_version: parent.api_version.clone(),
            resource: parent.resource.clone(),
            revision_history: None,
            label_selector: parent.label_selector.clone(),
            ignore_status_changes: None,
        },
        child_resources: mc.spec.output_resources.iter().map(crate::api::OutputResourceRule::as_child_rule).collect(),
        hooks: None,
        endpoint_configs: Vec::new(),
        resync_period_seconds: None,
        generate_selector: None,
        related_limit: None,
    };
    CompositeController::new(&mc.metadata.name.clone().unwrap_or_default(), spec)
}

/// From one reading of the controllers whose labels match `controllers` (the hub's
/// `targetLabelSelector`): every parent type of the composites and target type of the decorators, and
/// every child type of the composites and attachment type of the decorators, each with how those
/// controllers select their parents.
pub async fn types(
    client: &Client,
    discovery: &Discovery,
    controllers: &str,
) -> Result<(Vec<ParentType>, Vec<ChildType>), LabelError> {
    let (composites, decorators) = read_controllers(client, controllers).await?;
    let parents = parent_types_of(discovery, &composites, &decorators).await;
    Ok((parents, child_types_of(discovery, &composites, &decorators).await))
}

async fn parent_types_of(
    discovery: &Discovery,
    composites: &[CompositeController],
    decorators: &[DecoratorController],
) -> Vec<ParentType> {
    let mut wanted: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    let rules = controller_rules(composites, decorators).flat_map(|(parents, _)| parents);
    for (api_version, resource, selector, _) in rules {
        let selectors = wanted.entry((api_version.clone(), resource.clone())).or_default();
        selectors.insert(server_side(selector));
    }
    let mut types = Vec::new();
    for ((api_version, resource), selectors) in wanted {
        let Ok(parent) = discovery.resolve(&api_version, &resource).await else { continue };
        types.push(ParentType { parent, selectors });
    }
    types
}

/// What tells two readings of a [`ChildType`] apart: its `apiVersion` and plural, and its parent rules.
pub type ChildTypeKey = (String, String, BTreeSet<String>);

/// How one controller selects the parents of a child type: their type, the server-side label selector
/// ("" = every object of the type) and, for a decorator, the annotation selector (checked here).
pub struct ParentRule {
    pub parent: Arc<ResolvedResource>,
    pub labels: String,
    pub annotations: Option<AnnotationSelector>,
}

impl ParentRule {
    fn key(&self) -> String {
        let resource = &self.parent.api_resource;
        let annotations = self.annotations.as_ref().map(|a| serde_json::to_string(a).unwrap_or_default());
        format!("{}/{}?{}?{}", resource.api_version, resource.plural, self.labels, annotations.unwrap_or_default())
    }

    /// Whether the annotation selector (if any) selects `meta`.
    fn selects(&self, meta: &ObjectMeta) -> bool {
        let Some(annotations) = &self.annotations else { return true };
        Selector::from_label_selector(&annotations.as_label_selector())
            .is_ok_and(|s| s.matches(meta.annotations.as_ref().unwrap_or(&BTreeMap::new())))
    }
}

/// One type of the objects the hub writes for parents (a composite's child type, a decorator's
/// attachment type), and how the controllers with that type select their parents.
pub struct ChildType {
    pub child: Arc<ResolvedResource>,
    pub parents: Vec<ParentRule>,
}

impl ChildType {
    /// What tells two readings of the types apart.
    #[must_use]
    pub fn key(&self) -> ChildTypeKey {
        let resource = &self.child.api_resource;
        let rules = self.parents.iter().map(ParentRule::key).collect();
        (resource.api_version.clone(), resource.plural.clone(), rules)
    }

    /// The UID of `meta`'s controller, when that controller is of a parent type of this type's (whether
    /// a controller selects that very parent is for [`label_children`] to find out).
    #[must_use]
    pub fn controller<'m>(&self, meta: &'m ObjectMeta) -> Option<&'m str> {
        let controller = meta.owner_references.iter().flatten().find(|r| r.controller == Some(true))?;
        let group = controller.api_version.rsplit_once('/').map_or("", |(group, _)| group);
        let of_owner = |rule: &ParentRule| {
            let parent = &rule.parent.api_resource;
            parent.group == group && parent.kind == controller.kind
        };
        self.parents.iter().any(of_owner).then_some(controller.uid.as_str())
    }
}

/// One controller's parent rule, as written: `apiVersion`, resource, label and annotation selectors.
type Rule<'a> = (&'a String, &'a String, Option<&'a LabelSelector>, Option<&'a AnnotationSelector>);

/// Each controller's parent rules (a composite's one, a decorator's `resources`) and the types it
/// writes for its parents (child resources, attachments).
fn controller_rules<'a>(
    composites: &'a [CompositeController],
    decorators: &'a [DecoratorController],
) -> impl Iterator<Item = (Vec<Rule<'a>>, &'a [ChildResourceRule])> {
    let composites = composites.iter().map(|cc| {
        let parent = &cc.spec.parent_resource;
        let rules: Vec<Rule<'a>> = vec![(&parent.api_version, &parent.resource, parent.label_selector.as_ref(), None)];
        (rules, cc.spec.child_resources.as_slice())
    });
    let decorators = decorators.iter().map(|dc| {
        let rules = dc
            .spec
            .resources
            .iter()
            .map(|r| (&r.api_version, &r.resource, r.label_selector.as_ref(), r.annotation_selector.as_ref()))
            .collect();
        (rules, dc.spec.attachments.as_slice())
    });
    composites.chain(decorators)
}

async fn child_types_of(
    discovery: &Discovery,
    composites: &[CompositeController],
    decorators: &[DecoratorController],
) -> Vec<ChildType> {
    let mut wanted: BTreeMap<(String, String), Vec<ParentRule>> = BTreeMap::new();
    for (parents, children) in controller_rules(composites, decorators) {
        for child in children {
            for &(api_version, resource, labels, annotations) in &parents {
                let Ok(parent) = discovery.resolve(api_version, resource).await else { continue };
                let rule = ParentRule { parent, labels: server_side(labels), annotations: annotations.cloned() };
                wanted.entry((child.api_version.clone(), child.resource.clone())).or_default().push(rule);
            }
        }
    }
    let mut types = Vec::new();
    for ((api_version, resource), parents) in wanted {
        let Ok(child) = discovery.resolve(&api_version, &resource).await else { continue };
        if !parents.is_empty() {
            types.push(ChildType { child, parents });
        }
    }
    types
}

/// `a` and `b` together (either may be empty).
#[must_use]
pub fn both(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_owned(),
        (_, true) => a.to_owned(),
        _ => format!("{a},{b}"),
    }
}

/// Where objects of `resource` are listed and watched: in each of `namespaces` for a namespaced type
/// of a namespaced hub (`namespaces:`), otherwise cluster-wide.
#[must_use]
pub fn scopes<K>(client: &Client, resource: &ResolvedResource, namespaces: &[String]) -> Vec<Api<K>>
where
    K: kube::Resource<DynamicType = kube::api::ApiResource, Scope = kube::core::DynamicResourceScope>,
{
    if resource.namespaced && !namespaces.is_empty() {
        namespaces.iter().map(|ns| Api::namespaced_with(client.clone(), ns, &resource.api_resource)).collect()
    } else {
        vec![Api::all_with(client.clone(), &resource.api_resource)]
    }
}

/// One parent, as much of it as labelling needs.
pub struct Parent {
    pub name: String,
    pub namespace: Option<String>,
    uid: String,
    version: Option<String>,
    /// Its bucket label's value now, if it has one.
    pub label: Option<String>,
}

impl Parent {
    /// The parent `meta` describes; `label` is the ring's label key.
    #[must_use]
    pub fn of(meta: ObjectMeta, label: &str) -> Self {
        Self {
            label: meta.labels.as_ref().and_then(|l| l.get(label)).cloned(),
            name: meta.name.unwrap_or_default(),
            namespace: meta.namespace,
            uid: meta.uid.unwrap_or_default(),
            version: meta.resource_version,
        }
    }

    /// Its bucket.
    #[must_use]
    pub fn bucket(&self) -> u16 {
        bucket(&self.uid)
    }

    /// Whether its label is its bucket.
    #[must_use]
    pub fn labelled(&self) -> bool {
        self.label.as_deref() == Some(self.bucket().to_string().as_str())
    }
}

/// What became of one label write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// The label is on the parent.
    Labelled,
    /// The parent changed or went since it was read: whoever reads it next labels it.
    Stale,
    /// Refused for another reason (logged): worth sending again later.
    Failed,
}

/// Labels each of `parents` (objects of `resource`) with its bucket in `ring`, several at once, each
/// under a compare-and-swap on the version it was read at: a parent replaced under the same name since
/// has another UID, so another bucket, and is left to whoever reads it next (as is one gone). Returns
/// what became of each, in their order.
pub async fn label_parents<'a>(
    client: &Client,
    ring: &str,
    resource: &ResolvedResource,
    parents: impl IntoIterator<Item = &'a Parent>,
) -> Vec<Written> {
    let writes = parents.into_iter().map(|parent| Label {
        name: parent.name.clone(),
        namespace: parent.namespace.clone(),
        version: parent.version.clone(),
        value: parent.bucket().to_string(),
    });
    write_labels(client, &shard_label(ring), resource, writes).await
}

/// One bucket label to write on an object of a known type.
pub struct Label {
    pub name: String,
    pub namespace: Option<String>,
    /// The resourceVersion it was read at: the write is refused if the object changed since.
    pub version: Option<String>,
    /// A bucket, or [`ORPHANS`].
    pub value: String,
}

impl Label {
    /// `value` for the object `meta` describes, at the version it was read at; `None` without a name.
    fn of(meta: &ObjectMeta, value: String) -> Option<Self> {
        Some(Self {
            name: meta.name.clone()?,
            namespace: meta.namespace.clone(),
            version: meta.resource_version.clone(),
            value,
        })
    }
}

/// Writes each of `labels` on its object of `resource` as label `key` (see [`label_parents`]).
async fn write_labels(
    client: &Client,
    key: &str,
    resource: &ResolvedResource,
    labels: impl IntoIterator<Item = Label>,
) -> Vec<Written> {
    // Owned before the writes start: the futures borrow nothing of the caller's.
    let writes: Vec<(Api<DynamicObject>, String, serde_json::Value)> = labels
        .into_iter()
        .map(|label| {
            let patch = json!({"metadata": {"resourceVersion": label.version, "labels": {key: label.value}}});
            let api = match label.namespace.as_deref().filter(|_| resource.namespaced) {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &resource.api_resource),
                None => Api::all_with(client.clone(), &resource.api_resource),
            };
            (api, label.name, patch)
        })
        .collect();
    stream::iter(writes)
        .map(|(api, name, patch)| async move {
            match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => Written::Labelled,
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                    debug!(object = %name, "object changed since it was read; labelled when read again");
                    Written::Stale
                }
                Err(err) => {
                    warn!(object = %name, "could not label the object with its bucket: {err}");
                    Written::Failed
                }
            }
        })
        .buffered(WRITES_AT_ONCE)
        .collect()
        .await
}

/// Labels the objects of `child_type` (in `namespaces`, as [`scopes`] says) that carry no parent's bucket
/// label of `ring` (`parent.shard.metahook.dev/<ring>`) and whose controller is a parent one of the
/// controllers selects, each with its controller's bucket: a page of 500 at a time (metadata only, the label's absence selected by the
/// server), each page labelled before the next is read. Returns how many were labelled.
///
/// Why: the hub stamps the bucket on every child it writes, but children written before the ring
/// existed (by an unsharded hub, or by Metacontroller before the switch) carry none, and a member's
/// caches select children by their bucket: their parents' syncs would not see them — a child the hook
/// still wants would be refused as "taken" on every sync, one it no longer wants would never be deleted.
/// Only children of parents these controllers select are the hub's: another controller's parents may
/// be of the same type (another hub, another `targetLabelSelector`), so the UIDs of the selected
/// parents are listed (metadata, once per call, and only when some object is a candidate).
pub async fn label_children(
    client: &Client,
    ring: &str,
    child_type: &ChildType,
    namespaces: &[String],
) -> Result<usize, LabelError> {
    let resource = &child_type.child;
    // Children elsewhere (`crossNamespace`) are their parent's by its record and their label: only those
    // a record lists are labelled (an object that only carries the label is nobody's, and not written).
    let recorded = recorded_children(client).await?;
    let by_record = |meta: &ObjectMeta| -> Option<String> {
        let uid = meta.labels.as_ref()?.get(crate::cache::informers::PARENT_UID_LABEL)?;
        let key = (
            resource.api_resource.group.clone(),
            resource.api_resource.kind.clone(),
            meta.namespace.clone(),
            meta.name.clone().unwrap_or_default(),
        );
        (recorded.get(&key) == Some(uid)).then(|| uid.clone())
    };
    let list_error = |resource: &ResolvedResource| {
        let plural = resource.api_resource.plural.clone();
        move |source| LabelError::List { resource: plural, source: Box::new(source) }
    };
    let mut selected: Option<HashSet<String>> = None;
    let mut labelled = 0;
    for api in scopes::<DynamicObject>(client, resource, namespaces) {
        let key = parent_shard_label(ring);
        let mut params = kube::api::ListParams::default().labels(&format!("!{key}")).limit(500);
        loop {
            let page = api.list_metadata(&params).await.map_err(list_error(resource))?;
            let candidates: Vec<_> = page
                .items
                .into_iter()
                .filter_map(|object| {
                    let uid = child_type
                        .controller(&object.metadata)
                        .map(str::to_owned)
                        .or_else(|| by_record(&object.metadata))?;
                    Some((uid, object.metadata))
                })
                .collect();
            if !candidates.is_empty() && selected.is_none() {
                selected = Some(selected_parents(client, child_type, namespaces).await?);
            }
            let selected = selected.as_ref();
            let labels: Vec<Label> = candidates
                .into_iter()
                .filter(|(uid, _)| selected.is_some_and(|s| s.contains(uid)))
                .filter_map(|(uid, meta)| Label::of(&meta, bucket(&uid).to_string()))
                .collect();
            let written = write_labels(client, &key, resource, labels).await;
            labelled += written.iter().filter(|w| **w == Written::Labelled).count();
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => break,
            }
        }
    }
    Ok(labelled)
}

/// Every child elsewhere the parents' records list, (group, kind, namespace, name), with the UID of
/// the parent whose record lists it; empty where the `ChildRecord` CRD is not installed.
async fn recorded_children(
    client: &Client,
) -> Result<HashMap<(String, String, Option<String>, String), String>, LabelError> {
    let api: Api<crate::api::record::ChildRecord> = Api::all(client.clone());
    let mut recorded = HashMap::new();
    let mut params = kube::api::ListParams::default().limit(500);
    loop {
        let page = match api.list(&params).await {
            Ok(page) => page,
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(recorded),
            Err(source) => return Err(LabelError::List { resource: "childrecords".into(), source: Box::new(source) }),
        };
        for record in &page.items {
            for child in &record.spec.children {
                let key = (child.api_group.clone(), child.kind.clone(), child.namespace.clone(), child.name.clone());
                recorded.insert(key, record.spec.parent.uid.clone());
            }
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(recorded),
        }
    }
}

/// Labels the parents' records of their children elsewhere written before the ring existed with their
/// parents' buckets (they are cached, sharded, like children); returns how many. Nothing where the
/// `ChildRecord` CRD is not installed.
pub async fn label_records(client: &Client, ring: &str, discovery: &Discovery) -> Result<usize, LabelError> {
    let Ok(resource) = discovery.resolve(crate::api::OWN_GROUP_VERSION, "childrecords").await else { return Ok(0) };
    let api: Api<crate::api::record::ChildRecord> = Api::all(client.clone());
    let key = parent_shard_label(ring);
    let mut labelled = 0;
    let mut params = kube::api::ListParams::default().labels(&format!("!{key}")).limit(500);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|source| LabelError::List { resource: "childrecords".into(), source: Box::new(source) })?;
        let labels: Vec<Label> = page
            .items
            .iter()
            .filter_map(|record| Label::of(&record.metadata, bucket(&record.spec.parent.uid).to_string()))
            .collect();
        let written = write_labels(client, &key, &resource, labels).await;
        labelled += written.iter().filter(|w| **w == Written::Labelled).count();
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(labelled),
        }
    }
}

/// The UIDs of the parents `child_type`'s controllers select (paged metadata lists).
async fn selected_parents(
    client: &Client,
    child_type: &ChildType,
    namespaces: &[String],
) -> Result<HashSet<String>, LabelError> {
    let mut uids = HashSet::new();
    for rule in &child_type.parents {
        for api in scopes::<DynamicObject>(client, &rule.parent, namespaces) {
            let mut params = kube::api::ListParams::default().labels(&rule.labels).limit(500);
            loop {
                let page = api.list_metadata(&params).await.map_err(|source| LabelError::List {
                    resource: rule.parent.api_resource.plural.clone(),
                    source: Box::new(source),
                })?;
                let chosen = page.items.into_iter().filter(|p| rule.selects(&p.metadata));
                uids.extend(chosen.filter_map(|p| p.metadata.uid));
                match page.metadata.continue_ {
                    Some(token) if !token.is_empty() => params = params.continue_token(&token),
                    _ => break,
                }
            }
        }
    }
    Ok(uids)
}

/// A parent waiting for its label, and what became of the write sent since it was last seen changed
/// (`None`: none sent yet). One that was written or found stale waits for the watch to report it.
struct Waiting {
    parent: Parent,
    sent: Option<Written>,
}

type Key = (Option<String>, String);

/// The unlabelled parents one watch reports (a parent type, one of its selectors, one scope).
struct Unlabelled {
    resource: Arc<ResolvedResource>,
    parents: HashMap<Key, Waiting>,
    /// A list in progress: what it found so far (it replaces `parents` when done).
    listing: Option<HashMap<Key, Waiting>>,
}

type Events = Pin<
    Box<dyn Stream<Item = (usize, Result<watcher::Event<PartialObjectMeta<DynamicObject>>, watcher::Error>)> + Send>,
>;

impl Unlabelled {
    fn note(&mut self, event: watcher::Event<PartialObjectMeta<DynamicObject>>, label: &str) {
        let waiting = |object: PartialObjectMeta<DynamicObject>| {
            let parent = Parent::of(object.metadata, label);
            ((parent.namespace.clone(), parent.name.clone()), Waiting { parent, sent: None })
        };
        match event {
            watcher::Event::Init => self.listing = Some(HashMap::new()),
            watcher::Event::InitApply(object) => {
                let (key, waiting) = waiting(object);
                self.listing.get_or_insert_with(HashMap::new).insert(key, waiting);
            }
            watcher::Event::InitDone => {
                if let Some(listed) = self.listing.take() {
                    self.parents = listed;
                }
            }
            watcher::Event::Apply(object) => {
                let (key, waiting) = waiting(object);
                self.parents.insert(key, waiting);
            }
            watcher::Event::Delete(object) => {
                let (key, _) = waiting(object);
                self.parents.remove(&key);
                shrink_when_sparse(&mut self.parents);
            }
        }
    }
}

/// Gives a map's table back once it is mostly empty. Every member sees every unlabelled parent, and a
/// backlog of them passes through this map once: a hash table keeps its largest size otherwise (at
/// 10,000 parents about 3 MiB on every member, for good, which does not divide by the members).
/// Shrinking at a quarter full keeps each removal amortised O(1).
fn shrink_when_sparse<K: Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() < map.capacity() / 4 {
        map.shrink_to_fit();
    }
}

/// Labels the unlabelled parents of the buckets its member holds (see the module doc), for one term of
/// the member's membership.
pub struct Labeller {
    /// The member's client: its writes stop when the member's Lease may have been lost.
    client: Client,
    discovery: Discovery,
    ring: String,
    /// Only controllers whose labels match it (`targetLabelSelector`), as the hub runs them.
    controllers: String,
    namespaces: Vec<String>,
    held: Arc<Held>,
    /// The member's caches: its parents' labels are checked there.
    informers: Informers,
    /// How often a write that failed is sent again.
    tick: Duration,
    /// How often the labels of the cached parents are checked.
    check: Duration,
}

impl Labeller {
    /// The labeller of the member whose buckets are `held`, writing with the member's `hub` client.
    #[must_use]
    pub fn new(config: &crate::ops::config::Config, hub: &crate::engine::hub::Hub, held: Arc<Held>) -> Self {
        Self {
            client: hub.client.clone(),
            discovery: hub.discovery.clone(),
            ring: config.sharding.ring.clone(),
            controllers: config.target_label_selector.clone(),
            namespaces: config.namespaces.clone(),
            held,
            informers: hub.informers.clone(),
            tick: config.leader_election.retry_period,
            check: config.sharding.rebalance_interval,
        }
    }

    /// Labels until `cancel` fires.
    pub async fn run(self, cancel: CancellationToken) {
        let label = shard_label(&self.ring);
        let mut selection = self.held.selection();
        let mut types: Option<Vec<(String, String, BTreeSet<String>)>> = None;
        let mut read: Vec<ParentType> = Vec::new();
        let mut children: Vec<ChildType> = Vec::new();
        let mut checked = Instant::now();
        let mut watches: Vec<Unlabelled> = Vec::new();
        let mut events: stream::SelectAll<Events> = stream::SelectAll::new();
        let mut tick = tokio::time::interval(self.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks: u32 = 0;
        loop {
            let retry = tokio::select! {
                biased;
                () = cancel.cancelled() => return,
                Some((index, event)) = events.next(), if !events.is_empty() => {
                    self.note(&mut watches, index, event, &label);
                    // What else has arrived, so a burst is labelled in concurrent batches.
                    for _ in 1..EVENTS_AT_ONCE {
                        match events.next().now_or_never() {
                            Some(Some((index, event))) => self.note(&mut watches, index, event, &label),
                            _ => break,
                        }
                    }
                    false
                }
                changed = selection.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    false
                }
                _ = tick.tick() => {
                    if ticks.is_multiple_of(TYPES_EVERY_TICKS) {
                        match self::types(&self.client, &self.discovery, &self.controllers).await {
                            Ok((now, child_types)) => {
                                let key: Vec<_> = now.iter().map(ParentType::key).collect();
                                if types.as_ref() != Some(&key) {
                                    (watches, events) = self.watch(&now, &label);
                                    types = Some(key);
                                }
                                read = now;
                                children = child_types;
                            }
                            Err(err) => warn!(ring = %self.ring, "reading the parent types to label (retrying): {err}"),
                        }
                    }
                    ticks = ticks.wrapping_add(1);
                    if checked.elapsed() >= self.check {
                        self.put_back(&read, &label).await;
                        self.route_orphans(&children, &parent_shard_label(&self.ring)).await;
                        checked = Instant::now();
                    }
                    true
                }
            };
            self.label(&mut watches, retry).await;
        }
    }

    /// One metadata watch of the unlabelled parents per parent type, selector and scope.
    fn watch(&self, types: &[ParentType], label: &str) -> (Vec<Unlabelled>, stream::SelectAll<Events>) {
        let mut watches = Vec::new();
        let mut events = stream::SelectAll::new();
        for parent_type in types {
            for selector in &parent_type.selectors {
                let config = watcher::Config::default().labels(&both(selector, &format!("!{label}")));
                for api in
                    scopes::<PartialObjectMeta<DynamicObject>>(&self.client, &parent_type.parent, &self.namespaces)
                {
                    let index = watches.len();
                    let stream: Events =
                        watcher(api, config.clone()).default_backoff().map(move |e| (index, e)).boxed();
                    events.push(stream);
                    watches.push(Unlabelled {
                        resource: Arc::clone(&parent_type.parent),
                        parents: HashMap::new(),
                        listing: None,
                    });
                }
            }
        }
        (watches, events)
    }

    fn note(
        &self,
        watches: &mut [Unlabelled],
        index: usize,
        event: Result<watcher::Event<PartialObjectMeta<DynamicObject>>, watcher::Error>,
        label: &str,
    ) {
        match event {
            Ok(event) => {
                if let Some(watch) = watches.get_mut(index) {
                    watch.note(event, label);
                }
            }
            Err(err) => debug!(ring = %self.ring, "watching unlabelled parents (retrying): {err}"),
        }
    }

    /// Puts back the bucket label of every cached parent whose label names another bucket than its
    /// UID's (someone changed it, or copied it from another object). Such a parent is in this member's
    /// cache because its label names a bucket held here, and is synced by nobody (a sync enters the
    /// bucket of the UID), so nothing is in flight to drain; the write moves it to the holder of its
    /// own bucket. Read from the caches, not listed: the check costs no request, and no memory but the
    /// wrong ones.
    async fn put_back(&self, types: &[ParentType], label: &str) {
        for parent_type in types {
            let Some(informer) = self.informers.running(&parent_type.parent, Role::Parent) else { continue };
            let selectors: Vec<Selector> =
                parent_type.selectors.iter().filter_map(|text| parse_selector_string(text).ok()).collect();
            let wrong: Vec<Parent> = informer
                .list(None)
                .iter()
                .filter(|obj| {
                    let labels = obj.metadata.labels.as_ref();
                    let uid = obj.metadata.uid.as_deref().unwrap_or_default();
                    labels.and_then(|l| l.get(label)).is_some_and(|value| *value != bucket(uid).to_string())
                        && selectors.iter().any(|s| s.matches(labels.unwrap_or(&BTreeMap::new())))
                })
                .map(|obj| Parent::of(obj.metadata.clone(), label))
                .collect();
            if wrong.is_empty() {
                continue;
            }
            warn!(ring = %self.ring, parents = wrong.len(), resource = %parent_type.parent.api_resource.plural, "putting back bucket labels someone else changed");
            label_parents(&self.client, &self.ring, &parent_type.parent, &wrong).await;
        }
    }

    /// Moves the orphans its caches show (former children without a controller now, still labelled
    /// with a bucket this member holds) to [`ORPHANS`], which every member's caches select: a parent
    /// that would adopt one may be any member's (an unsharded hub sees every orphan, and Metacontroller
    /// adopts those its parents select). Nothing else carries the label, so nothing else is written.
    async fn route_orphans(&self, child_types: &[ChildType], label: &str) {
        for child_type in child_types {
            let Some(informer) = self.informers.running(&child_type.child, Role::Child) else { continue };
            let orphans: Vec<Label> = informer
                .orphans()
                .iter()
                .filter(|obj| obj.metadata.labels.as_ref().and_then(|l| l.get(label)).is_some_and(|v| v != ORPHANS))
                .filter_map(|obj| Label::of(&obj.metadata, ORPHANS.to_owned()))
                .collect();
            if !orphans.is_empty() {
                info!(ring = %self.ring, orphans = orphans.len(), resource = %child_type.child.api_resource.plural, "moving orphans where every member sees them");
                write_labels(&self.client, label, &child_type.child, orphans).await;
            }
        }
    }

    /// Labels the waiting parents of held buckets not written since they last changed, and with
    /// `retry` those whose write failed.
    async fn label(&self, watches: &mut [Unlabelled], retry: bool) {
        if watches.iter().all(|w| w.parents.is_empty()) {
            return;
        }
        let held = self.held.claimed().await;
        for watch in watches.iter_mut() {
            let mut due: Vec<&mut Waiting> = watch
                .parents
                .values_mut()
                .filter(|w| match w.sent {
                    None => true,
                    Some(Written::Failed) => retry,
                    Some(Written::Labelled | Written::Stale) => false,
                })
                .filter(|w| held.contains(&w.parent.bucket()))
                .collect();
            if due.is_empty() {
                continue;
            }
            let mut parents = Vec::with_capacity(due.len());
            for waiting in &due {
                parents.push(&waiting.parent);
            }
            let written = label_parents(&self.client, &self.ring, &watch.resource, parents).await;
            for (waiting, written) in due.iter_mut().zip(&written) {
                waiting.sent = Some(*written);
            }
            debug!(ring = %self.ring, parents = written.len(), resource = %watch.resource.api_resource.plural, "labelled parents of held buckets");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str, uid: &str, labels: &[(&str, &str)]) -> PartialObjectMeta<DynamicObject> {
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        serde_json::from_value(json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": "1", "labels": labels},
        }))
        .unwrap()
    }

    fn unlabelled() -> Unlabelled {
        let resource = ResolvedResource {
            api_resource: kube::api::ApiResource {
                group: "test.metahook.dev".into(),
                version: "v1".into(),
                api_version: "test.metahook.dev/v1".into(),
                kind: "Thing".into(),
                plural: "things".into(),
            },
            namespaced: true,
            has_status: true,
        };
        Unlabelled { resource: Arc::new(resource), parents: HashMap::new(), listing: None }
    }

    #[test]
    fn the_unlabelled_parents_table_shrinks_once_they_are_labelled() {
        let mut watch = unlabelled();
        let parents: Vec<_> = (0..10_000).map(|i| meta(&format!("p{i}"), &format!("u{i}"), &[])).collect();
        for parent in &parents {
            watch.note(watcher::Event::Apply(parent.clone()), "shard.metahook.dev/r");
        }
        let full = watch.parents.capacity();
        assert!(full >= 10_000);
        for parent in &parents[..9_990] {
            watch.note(watcher::Event::Delete(parent.clone()), "shard.metahook.dev/r");
        }
        assert_eq!(watch.parents.len(), 10);
        assert!(watch.parents.capacity() <= 64, "still {} of {full} slots for 10 parents", watch.parents.capacity());
    }

    #[test]
    fn a_child_is_a_candidate_only_when_its_controller_is_of_a_parent_type() {
        let resource = |api_resource| Arc::new(ResolvedResource { api_resource, namespaced: true, has_status: false });
        let thing = kube::core::ApiResource {
            group: "test.metahook.dev".into(),
            version: "v1".into(),
            api_version: "test.metahook.dev/v1".into(),
            kind: "Thing".into(),
            plural: "things".into(),
        };
        let child_type = ChildType {
            child: resource(kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&())),
            parents: vec![
                ParentRule { parent: resource(thing), labels: String::new(), annotations: None },
                ParentRule {
                    parent: resource(kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&())),
                    labels: "app=a".into(),
                    annotations: None,
                },
            ],
        };
        let owned = |api_version: &str, kind: &str, controller: Option<bool>| ObjectMeta {
            owner_references: Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: "p".into(),
                uid: "u-1".into(),
                controller,
                ..Default::default()
            }]),
            ..ObjectMeta::default()
        };
        let controller = |meta: ObjectMeta| child_type.controller(&meta).map(str::to_owned);
        assert_eq!(controller(owned("test.metahook.dev/v1", "Thing", Some(true))).as_deref(), Some("u-1"));
        assert_eq!(controller(owned("test.metahook.dev/v2", "Thing", Some(true))).as_deref(), Some("u-1"));
        assert_eq!(controller(owned("v1", "Pod", Some(true))).as_deref(), Some("u-1"));
        assert_eq!(controller(owned("other.dev/v1", "Thing", Some(true))), None, "another group");
        assert_eq!(controller(owned("apps/v1", "Deployment", Some(true))), None, "another kind");
        assert_eq!(controller(owned("test.metahook.dev/v1", "Thing", None)), None, "not its controller");
        assert_eq!(controller(ObjectMeta::default()), None, "no owner");
    }

    #[test]
    fn a_decorators_annotation_selector_is_checked_on_the_parent() {
        let rule = |annotations: Option<AnnotationSelector>| ParentRule {
            parent: Arc::new(ResolvedResource {
                api_resource: kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&()),
                namespaced: true,
                has_status: false,
            }),
            labels: String::new(),
            annotations,
        };
        let wanted = AnnotationSelector {
            match_annotations: Some([("decorate".to_owned(), "yes".to_owned())].into()),
            match_expressions: None,
        };
        let annotated = |value: &str| ObjectMeta {
            annotations: Some([("decorate".to_owned(), value.to_owned())].into()),
            ..ObjectMeta::default()
        };
        assert!(rule(Some(wanted.clone())).selects(&annotated("yes")));
        assert!(!rule(Some(wanted.clone())).selects(&annotated("no")));
        assert!(!rule(Some(wanted)).selects(&ObjectMeta::default()));
        assert!(rule(None).selects(&ObjectMeta::default()));
    }

    #[test]
    fn a_parent_is_labelled_with_its_own_bucket_only() {
        let label = shard_label("ring");
        let b = bucket("u1").to_string();
        assert!(Parent::of(meta("a", "u1", &[(&label, &b)]).metadata, &label).labelled());
        assert!(!Parent::of(meta("a", "u1", &[]).metadata, &label).labelled());
        let other = ((bucket("u1") + 1) % 1024).to_string();
        assert!(!Parent::of(meta("a", "u1", &[(&label, &other)]).metadata, &label).labelled());
    }

    #[test]
    fn the_waiting_parents_follow_the_watch_and_a_relist_replaces_them() {
        let label = shard_label("ring");
        let mut watch = unlabelled();
        watch.note(watcher::Event::Apply(meta("a", "u1", &[])), &label);
        watch.note(watcher::Event::Apply(meta("b", "u2", &[])), &label);
        watch.parents.values_mut().for_each(|w| w.sent = Some(Written::Labelled));
        // A change is a parent to try again; a delete (or the label arriving) ends its wait.
        watch.note(watcher::Event::Apply(meta("a", "u1", &[])), &label);
        assert_eq!(watch.parents[&(Some("ns".into()), "a".into())].sent, None);
        watch.note(watcher::Event::Delete(meta("b", "u2", &[])), &label);
        assert_eq!(watch.parents.len(), 1);
        // A relist: what it did not find is no longer waiting; until it is done, the old set stands.
        watch.note(watcher::Event::Init, &label);
        watch.note(watcher::Event::InitApply(meta("c", "u3", &[])), &label);
        assert!(watch.parents.contains_key(&(Some("ns".into()), "a".into())));
        watch.note(watcher::Event::InitDone, &label);
        let names: BTreeSet<&str> = watch.parents.keys().map(|(_, n)| n.as_str()).collect();
        assert_eq!(names, BTreeSet::from(["c"]));
    }

    #[test]
    fn parent_selectors_are_written_as_the_api_server_reads_them() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
        let selector: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "legacy", "operator": "DoesNotExist"},
                {"key": "team", "operator": "Exists"},
            ],
        }))
        .unwrap();
        assert_eq!(server_side(Some(&selector)), "app=web,tier in (a,b),!legacy,team");
        assert_eq!(server_side(None), "");
        assert_eq!(both("", "!x"), "!x");
        assert_eq!(both("a=b", "!x"), "a=b,!x");
    }
}
