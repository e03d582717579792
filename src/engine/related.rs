//! The customize hook and the `related` objects it selects (both controller kinds).
//!
//! A parent's rules are cached per (UID, generation), so the hook is called again when the parent's
//! spec changes, or once the answer is older than `customizeCacheTimeout` (Metacontroller: 20 minutes),
//! so a customize hook that reads more than the parent (the time, another system) is asked again now and
//! then. An expired answer is dropped lazily: the parent's next sync asks again; until then its rules
//! still say which related changes queue it. When a related object changes, only parents that have
//! rules for its type are looked at (an index by type), and only those whose rules select the object
//! are queued.
//!
//! What a rule selects is decided by [`Selection`], apart from where the objects are cached, and the
//! request's map is built by [`related_map`]: the engine reads its shared watched caches through them,
//! `metahook diff` reads caches it filled with one LIST per type, so both select the same objects.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::DynamicObject;
use serde_json::Value;
use tokio::time::Instant;

use crate::api::{HookVersion, RelatedLimit, labels_of};
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::{Change, Informer, ObjectKey};
use crate::cache::selector::Selector;
use crate::engine::error::SyncError;
use crate::engine::hub::Hub;
use crate::hooks::{
    CustomizeRequest, Endpoint, ObjectMaps, RelatedResourceRule, WireObject, group_version_kind_key, object_key,
};

/// A rule of the engine: what it selects, and the shared cache of its type.
struct Rule {
    informer: Informer,
    selection: Selection,
}

/// One related rule of a customize answer, validated (Metacontroller's selection rules) for one
/// parent, with its selectors parsed: which objects of its type it selects, from whichever cache holds
/// them.
pub struct Selection {
    names: Vec<String>,
    /// The namespace the rule is confined to (under a v1 hook, a namespaced parent's own).
    namespace: Option<String>,
    labels: Option<Selector>,
    namespaces: Option<Selector>,
    /// The namespaces the controller's `relatedLimit` lets the rule reach (`None`: any).
    allowed: Option<std::collections::BTreeSet<String>>,
}

impl Selection {
    /// The checks of `raw` that need no type: refused combinations of fields.
    pub fn check(raw: &RelatedResourceRule) -> Result<(), SyncError> {
        let has_selector = raw.label_selector.is_some() || raw.namespace_selector.is_some();
        if !raw.names.is_empty() && has_selector {
            return Err(invalid(raw, "names cannot be combined with labelSelector or namespaceSelector".into()));
        }
        if raw.namespace.is_some() && raw.namespace_selector.is_some() {
            return Err(invalid(raw, "namespace cannot be combined with namespaceSelector".into()));
        }
        Ok(())
    }

    /// `raw` (already [`check`](Self::check)ed) for a parent in `scope`, its type being `resource`,
    /// within the controller's `limit` (its `relatedLimit`): a rule for a type it does not list, or
    /// naming a namespace it does not allow, is refused; one that reaches across namespaces selects
    /// only in those it allows.
    pub fn new(
        raw: &RelatedResourceRule,
        resource: &ResolvedResource,
        scope: ParentScope<'_>,
        limit: Option<&RelatedLimit>,
    ) -> Result<Self, SyncError> {
        if raw.namespace_selector.is_some() && !resource.namespaced {
            return Err(invalid(raw, "namespaceSelector applies only to namespaced resources".into()));
        }
        let mut namespace = raw.namespace.clone().filter(|n| !n.is_empty());
        if let Some(limit) = limit
            && !limit.allows_type(resource.api_version(), &resource.api_resource.plural)
        {
            return Err(invalid(raw, "a type the controller's relatedLimit does not list".into()));
        }
        let allowed = limit.and_then(|l| l.namespaces_for(scope.namespace)).filter(|_| resource.namespaced);
        if let (Some(allowed), Some(ns)) = (&allowed, &namespace)
            && !allowed.contains(ns)
        {
            let listed: Vec<&str> = allowed.iter().map(String::as_str).collect();
            return Err(invalid(
                raw,
                format!("namespace {ns} is beyond the controller's relatedLimit (it allows {})", listed.join(", ")),
            ));
        }
        if scope.version == HookVersion::V1
            && let Some(parent_ns) = scope.namespace
        {
            // v1 can only express objects in the parent's own namespace (Metacontroller's rule).
            if raw.namespace_selector.is_some() {
                return Err(invalid(raw, "namespaceSelector needs hook version v2 for a namespaced parent".into()));
            }
            match &namespace {
                Some(ns) if ns != parent_ns => {
                    return Err(invalid(
                        raw,
                        format!(
                            "requested related object namespace {ns} differs from parent object namespace {parent_ns}"
                        ),
                    ));
                }
                _ => namespace = Some(parent_ns.to_owned()),
            }
        }
        let parse = |s: &Option<_>| s.as_ref().map(Selector::from_label_selector).transpose();
        let labels = parse(&raw.label_selector).map_err(|e| invalid(raw, e.to_string()))?;
        let namespaces = parse(&raw.namespace_selector).map_err(|e| invalid(raw, e.to_string()))?;
        Ok(Self {
            names: raw.names.clone(),
            namespace: namespace.filter(|_| resource.namespaced),
            labels,
            namespaces,
            allowed,
        })
    }

    /// The namespace the rule is confined to (`None`: any, or a cluster-scoped type).
    #[must_use]
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// Whether the rule reads Namespaces' labels (`namespaceSelector`).
    #[must_use]
    pub fn reads_namespaces(&self) -> bool {
        self.namespaces.is_some()
    }

    /// The objects of `informer` (the rule's type) that the rule selects; `namespaces`: the Namespaces
    /// cache, read by a `namespaceSelector`.
    #[must_use]
    pub fn select(&self, informer: &Informer, namespaces: Option<&Informer>) -> Vec<Arc<DynamicObject>> {
        let scope = match (&self.namespace, informer.resource().namespaced) {
            (Some(ns), true) => Some(Some(ns.as_str())),
            (_, false) => Some(None),
            (None, true) => None,
        };
        // A label selector is tested on the cached labels first: only what it selects is decoded.
        let candidates = match &self.labels {
            Some(labels) if self.names.is_empty() => informer.list_selected(scope, labels),
            _ => informer.list(scope),
        };
        candidates.into_iter().filter(|obj| self.matches(obj, namespaces)).collect()
    }

    /// Whether the rule selects `obj` (its type already known to match).
    #[must_use]
    pub fn matches(&self, obj: &DynamicObject, namespaces: Option<&Informer>) -> bool {
        if let Some(ns) = &self.namespace
            && obj.metadata.namespace.as_deref() != Some(ns.as_str())
        {
            return false;
        }
        if let Some(allowed) = &self.allowed
            && !obj.metadata.namespace.as_ref().is_some_and(|ns| allowed.contains(ns))
        {
            return false;
        }
        if !self.names.is_empty() {
            return obj.metadata.name.as_ref().is_some_and(|n| self.names.contains(n));
        }
        if let Some(labels) = &self.labels
            && !labels.matches(&labels_of(&obj.metadata))
        {
            return false;
        }
        match &self.namespaces {
            Some(selector) => obj.metadata.namespace.as_deref().is_some_and(|ns| {
                namespaces
                    .and_then(|n| n.get(&ObjectKey { namespace: None, name: ns.to_owned() }))
                    .is_some_and(|ns| selector.matches(&labels_of(&ns.metadata)))
            }),
            None => true,
        }
    }
}

/// What whoever may create a parent can make a controller's `customize` hook read through the hub:
/// its related rules' reach, by the hook's version, the parent's scope and the controller's `limit`
/// (`relatedLimit`). `metahook status` and `metahook rbac` say it; a controller that lets parents'
/// authors read other namespaces without a limit is warned about at its start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reach {
    /// The types a rule may select (`None`: any).
    pub types: Option<Vec<String>>,
    /// The namespaces a rule may select in, besides the parent's own (`None`: any).
    pub namespaces: Option<Vec<String>>,
    /// Whether the parent's own namespace is among them (a namespaced parent's).
    pub own: bool,
}

/// The hook version that governs what related rules may select: the version of the request that shows
/// the related objects (the sync hook's, or the finalize hook's — the customize hook's own version only
/// shapes its answer). The wider of the two: a v2 sync or finalize hook lets a rule reach any namespace.
#[must_use]
pub fn related_version(sync: Option<&crate::api::Hook>, finalize: Option<&crate::api::Hook>) -> HookVersion {
    if [sync, finalize].into_iter().flatten().any(|h| h.version() == HookVersion::V2) {
        HookVersion::V2
    } else {
        HookVersion::V1
    }
}

impl Reach {
    /// The reach of a controller whose customize hook speaks `version`, for parents that are
    /// `namespaced` or not, under `limit`.
    #[must_use]
    pub fn of(version: HookVersion, namespaced: bool, limit: Option<&RelatedLimit>) -> Self {
        let types = limit
            .and_then(|l| l.resources.as_ref())
            .map(|types| types.iter().map(|t| format!("{}.{}", t.resource, t.api_version)).collect());
        let places = match limit.and_then(|l| l.namespaces.clone()) {
            Some(listed) => Some(listed),
            // Metacontroller's v1 rule: a namespaced parent's own namespace only.
            None if namespaced && version == HookVersion::V1 => Some(Vec::new()),
            None => None,
        };
        Self { types, namespaces: places, own: namespaced }
    }

    /// Whether a parent's author can make the rules read where the controller's author did not say:
    /// in namespaces it did not name (no `relatedLimit.namespaces`, and a hook or parent that
    /// Metacontroller lets reach any), or, for a namespaced parent, in any cluster-scoped type (no
    /// `relatedLimit.resources`: a tenant's parent could make the hub read Nodes or cluster roles).
    #[must_use]
    pub fn unbounded(&self) -> bool {
        self.namespaces.is_none() || (self.own && self.types.is_none())
    }
}

impl std::fmt::Display for Reach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.types {
            Some(types) if types.is_empty() => return f.write_str("nothing"),
            Some(types) => write!(f, "{}", types.join(", "))?,
            None => f.write_str("any type")?,
        }
        match &self.namespaces {
            None => f.write_str(" in any namespace"),
            Some(listed) => {
                let mut places: Vec<String> = Vec::new();
                if self.own {
                    places.push("the parent's namespace".into());
                }
                places.extend(listed.iter().cloned());
                let cluster = if self.types.is_none() { ", and any cluster-scoped object" } else { "" };
                if places.is_empty() {
                    write!(f, " in no namespace{cluster}")
                } else {
                    write!(f, " in {}{cluster}", places.join(", "))
                }
            }
        }
    }
}

/// A rule refused for `reason`.
fn invalid(raw: &RelatedResourceRule, reason: String) -> SyncError {
    SyncError::RelatedRule { rule: format!("{}.{}", raw.resource, raw.api_version), reason }
}

/// The request's `related` map: what each rule selects from the cache of its type (`namespaces`: the
/// Namespaces cache, for `namespaceSelector`s), keyed as the hook version of `scope` keys objects.
#[must_use]
pub fn related_map<'a>(
    rules: impl IntoIterator<Item = (&'a Selection, &'a Informer)>,
    namespaces: Option<&Informer>,
    scope: ParentScope<'_>,
) -> ObjectMaps {
    let mut maps = ObjectMaps::new();
    for (selection, informer) in rules {
        let resource = informer.resource();
        let entry = maps.entry(group_version_kind_key(resource.api_version(), resource.kind())).or_default();
        for obj in selection.select(informer, namespaces) {
            let k = ObjectKey::of(&obj);
            if let Some(k) = object_key(scope.version, scope.namespace, k.namespace.as_deref(), &k.name) {
                entry.insert(k, WireObject(obj));
            }
        }
    }
    maps
}

/// Rules of one parent, for the parent generation they were computed for.
struct Cached {
    uid: String,
    generation: i64,
    /// When the hook gave them: they expire `customizeCacheTimeout` later.
    asked: Instant,
    rules: Arc<Vec<Rule>>,
}

impl Cached {
    /// Whether these rules still answer for `parent` (same object and generation) at `now`.
    fn answers(&self, uid: &str, generation: i64, now: Instant, timeout: Duration) -> bool {
        self.uid == uid && self.generation == generation && now.saturating_duration_since(self.asked) < timeout
    }
}

/// Where a parent lives, for rule defaults.
#[derive(Clone, Copy)]
pub struct ParentScope<'a> {
    /// `None` for cluster-scoped parents.
    pub namespace: Option<&'a str>,
    pub version: HookVersion,
}

/// Parents by (related type id, namespace a rule is confined to).
type Interest<K> = HashMap<(String, Option<String>), HashSet<K>>;

/// The related-objects machinery of one controller. `K` is the controller's queue key.
pub struct Related<K> {
    hub: Hub,
    hook: Option<Endpoint>,
    /// The controller's `relatedLimit`: what its rules may reach.
    limit: Option<RelatedLimit>,
    controller: Value,
    enqueue: Arc<dyn Fn(K) + Send + Sync>,
    rules: Mutex<HashMap<K, Cached>>,
    /// Parents with at least one rule on a type, by `apiVersion/resource` and the namespace the rule is
    /// confined to (`None`: any namespace, or a cluster-scoped type). A related change then looks only
    /// at the parents whose rules can see its namespace, not at every parent with rules on its type.
    interest: Mutex<Interest<K>>,
    /// Related informers in use, with the task that maps their changes to parents.
    informers: Mutex<HashMap<String, (Informer, tokio::task::AbortHandle)>>,
}

impl<K> Drop for Related<K> {
    fn drop(&mut self) {
        if let Ok(informers) = self.informers.get_mut() {
            for (_, task) in informers.values() {
                task.abort();
            }
        }
    }
}

/// Type id of Namespaces, whose labels `namespaceSelector` rules read.
const NAMESPACES: &str = "v1/namespaces";

fn type_id(resource: &ResolvedResource) -> String {
    format!("{}/{}", resource.api_version(), resource.api_resource.plural)
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> Related<K> {
    /// `enqueue` is how a related change reaches the controller's queue.
    pub fn new(
        hub: Hub,
        hook: Option<Endpoint>,
        limit: Option<RelatedLimit>,
        controller: Value,
        enqueue: Arc<dyn Fn(K) + Send + Sync>,
    ) -> Arc<Self> {
        Arc::new(Self {
            hub,
            hook,
            limit,
            controller,
            enqueue,
            rules: Mutex::default(),
            interest: Mutex::default(),
            informers: Mutex::default(),
        })
    }

    /// The `related` map for `parent`: calls the customize hook if its cached answer is stale, and
    /// selects objects from (lazily started, shared) caches.
    pub async fn gather(
        self: &Arc<Self>,
        key: &K,
        parent: &DynamicObject,
        scope: ParentScope<'_>,
    ) -> Result<ObjectMaps, SyncError> {
        let Some(hook) = &self.hook else { return Ok(ObjectMaps::new()) };
        let rules = self.rules_for(key, parent, hook, scope).await?;
        if let Some(rule) = rules.iter().find(|rule| !rule.informer.is_synced()) {
            return Err(SyncError::RelatedNotSynced(type_id(rule.informer.resource())));
        }
        let namespaces = self.namespaces();
        Ok(related_map(rules.iter().map(|r| (&r.selection, &r.informer)), namespaces.as_ref(), scope))
    }

    /// Forgets a parent that is gone.
    pub fn forget(&self, key: &K) {
        self.rules.lock().expect("rules lock").remove(key);
        for parents in self.interest.lock().expect("interest lock").values_mut() {
            parents.remove(key);
        }
    }

    async fn rules_for(
        self: &Arc<Self>,
        key: &K,
        parent: &DynamicObject,
        hook: &Endpoint,
        scope: ParentScope<'_>,
    ) -> Result<Arc<Vec<Rule>>, SyncError> {
        let uid = parent.metadata.uid.clone().unwrap_or_default();
        let generation = parent.metadata.generation.unwrap_or(0);
        let timeout = self.hub.settings.customize_cache_timeout;
        if let Some(cached) = self.rules.lock().expect("rules lock").get(key)
            && cached.answers(&uid, generation, Instant::now(), timeout)
        {
            return Ok(Arc::clone(&cached.rules));
        }
        let asked = Instant::now();
        let parent_json = crate::hooks::for_hooks(parent);
        let request = CustomizeRequest { controller: &self.controller, parent: &parent_json };
        let response = hook.customize(&request).await?;
        let mut rules = Vec::with_capacity(response.related_resources.len());
        for raw in &response.related_resources {
            rules.push(self.compile(raw, scope).await?);
        }
        let rules = Arc::new(rules);
        {
            let mut interest = self.interest.lock().expect("interest lock");
            for parents in interest.values_mut() {
                parents.remove(key);
            }
            for rule in rules.iter() {
                let resource = rule.informer.resource();
                let confined = rule.selection.namespace().map(str::to_owned);
                interest.entry((type_id(resource), confined)).or_default().insert(key.clone());
                if rule.selection.reads_namespaces() {
                    interest.entry((NAMESPACES.into(), None)).or_default().insert(key.clone());
                }
            }
            interest.retain(|_, parents| !parents.is_empty());
        }
        self.rules
            .lock()
            .expect("rules lock")
            .insert(key.clone(), Cached { uid, generation, asked, rules: Arc::clone(&rules) });
        Ok(rules)
    }

    /// Validates one rule (Metacontroller's selection rules, [`Selection`]) and resolves its type.
    async fn compile(self: &Arc<Self>, raw: &RelatedResourceRule, scope: ParentScope<'_>) -> Result<Rule, SyncError> {
        Selection::check(raw)?;
        let rule = || format!("{}.{}", raw.resource, raw.api_version);
        let resource = self
            .hub
            .discovery
            .resolve(&raw.api_version, &raw.resource)
            .await
            .map_err(|source| SyncError::RelatedType { rule: rule(), source })?;
        let selection = Selection::new(raw, &resource, scope, self.limit.as_ref())?;
        let namespace = raw.namespace.as_deref().filter(|n| !n.is_empty());
        self.within_namespaces(raw, &resource, namespace).map_err(|reason| invalid(raw, reason))?;
        if selection.reads_namespaces() {
            let namespaces = self
                .hub
                .discovery
                .resolve("v1", "namespaces")
                .await
                .map_err(|source| SyncError::RelatedType { rule: rule(), source })?;
            let namespaces = self.informer(&namespaces);
            if !namespaces.is_synced() {
                return Err(SyncError::RelatedNotSynced(NAMESPACES.into()));
            }
        }
        Ok(Rule { informer: self.informer(&resource), selection })
    }

    /// On a hub limited to some namespaces, a rule may only select what those namespaces' watches see:
    /// no cluster-scoped type, no `namespaceSelector` (it reads Namespaces, cluster-scoped), no other
    /// namespace. Refusing says so in the parent's `SyncError` instead of selecting nothing silently. A
    /// rule without a namespace selects in the hub's namespaces.
    fn within_namespaces(
        &self,
        raw: &RelatedResourceRule,
        resource: &ResolvedResource,
        namespace: Option<&str>,
    ) -> Result<(), String> {
        let informers = &self.hub.informers;
        let limited = || informers.namespaces().join(",");
        if informers.namespaces().is_empty() {
            Ok(())
        } else if !resource.namespaced {
            Err(format!("a cluster-scoped type, but this hub watches only namespaces {}", limited()))
        } else if raw.namespace_selector.is_some() {
            Err(format!("namespaceSelector reads Namespaces, but this hub watches only namespaces {}", limited()))
        } else if let Some(ns) = namespace.filter(|ns| !informers.covers(ns)) {
            Err(format!("namespace {ns} is not one this hub watches ({})", limited()))
        } else {
            Ok(())
        }
    }

    /// The shared informer for a related type; the first use starts mapping its changes to parents.
    fn informer(self: &Arc<Self>, resource: &Arc<ResolvedResource>) -> Informer {
        let id = type_id(resource);
        let mut informers = self.informers.lock().expect("informers lock");
        if let Some((informer, _)) = informers.get(&id) {
            return informer.clone();
        }
        // Related objects are whatever the customize hook names, owned by nobody's shard: a sharded
        // replica sees them all, as an unsharded hub does.
        let informer = self.hub.informers.get_unsharded(resource);
        // Changes from now on only: a parent whose rules name this type reads its related objects from
        // the cache after this (in the same sync), so replaying what is cached would only queue that
        // parent a second time for objects it has just seen.
        let mut changes = informer.subscribe_changes();
        let this = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            while let Some(crate::cache::informers::Event { change, .. }) = changes.recv().await {
                let Some(this) = this.upgrade() else { return };
                if let Change::Applied { old: Some(old), new } = &change {
                    if old.metadata.resource_version == new.metadata.resource_version {
                        continue;
                    }
                    // An object that stops matching a rule matters to that rule's parents too.
                    this.on_change(&id, old);
                }
                this.on_change(&id, change.object());
            }
        });
        informers.insert(type_id(resource), (informer.clone(), task.abort_handle()));
        informer
    }

    /// Queues every parent whose rules select `obj`.
    fn on_change(&self, type_id: &str, obj: &DynamicObject) {
        let interested: HashSet<K> = {
            let interest = self.interest.lock().expect("interest lock");
            let in_namespace = obj.metadata.namespace.clone().map(|ns| (type_id.to_owned(), Some(ns)));
            [Some((type_id.to_owned(), None)), in_namespace]
                .into_iter()
                .flatten()
                .filter_map(|scope| interest.get(&scope))
                .flatten()
                .cloned()
                .collect()
        };
        let namespaces = self.namespaces();
        for key in interested {
            let rules = self.rules.lock().expect("rules lock").get(&key).map(|c| Arc::clone(&c.rules));
            // A namespace's labels decide what namespaceSelector rules select: any change may matter.
            let selects = rules.is_some_and(|rules| {
                rules.iter().any(|r| {
                    (type_id == NAMESPACES && r.selection.reads_namespaces())
                        || (crate::engine::related::type_id(r.informer.resource()) == type_id
                            && r.selection.matches(obj, namespaces.as_ref()))
                })
            });
            if selects {
                (self.enqueue)(key);
            }
        }
    }

    /// The namespaces cache, shared with every other user of `v1/namespaces`.
    fn namespaces(&self) -> Option<Informer> {
        self.informers.lock().expect("informers lock").get(NAMESPACES).map(|(i, _)| i.clone())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A cache of the core type `kind` (`plural`) holding `objects` (namespace, or `""` for a
    /// cluster-scoped type, name, labels).
    fn core(kind: &str, plural: &str, namespaced: bool, objects: &[(&str, &str, Value)]) -> Informer {
        let resource = Arc::new(ResolvedResource {
            api_resource: kube::core::ApiResource {
                group: String::new(),
                version: "v1".into(),
                api_version: "v1".into(),
                kind: kind.into(),
                plural: plural.into(),
            },
            namespaced,
            has_status: false,
        });
        let objects = objects.iter().map(|(ns, name, labels)| {
            let mut obj = json!({"apiVersion": "v1", "kind": kind,
                "metadata": {"name": name, "labels": labels, "uid": format!("{ns}-{name}")}});
            if namespaced {
                obj["metadata"]["namespace"] = json!(ns);
            }
            serde_json::from_value(obj).unwrap()
        });
        Informer::listed(&resource, objects)
    }

    fn config_maps(objects: &[(&str, &str, Value)]) -> Informer {
        core("ConfigMap", "configmaps", true, objects)
    }

    fn rule(value: Value) -> RelatedResourceRule {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_v1_rule_under_a_namespaced_parent_selects_in_the_parents_namespace_only() {
        let informer = config_maps(&[("a", "x", json!({"k": "v"})), ("b", "y", json!({"k": "v"}))]);
        let raw =
            rule(json!({"apiVersion": "v1", "resource": "configmaps", "labelSelector": {"matchLabels": {"k": "v"}}}));
        let v1 = ParentScope { namespace: Some("a"), version: HookVersion::V1 };
        let selection = Selection::new(&raw, informer.resource(), v1, None).unwrap();
        assert_eq!(selection.namespace(), Some("a"));
        let map = related_map([(&selection, &informer)], None, v1);
        let keys: Vec<&String> = map["ConfigMap.v1"].keys().collect();
        assert_eq!(keys, ["x"], "keyed by name under v1");
        let v2 = ParentScope { namespace: Some("a"), version: HookVersion::V2 };
        let selection = Selection::new(&raw, informer.resource(), v2, None).unwrap();
        let map = related_map([(&selection, &informer)], None, v2);
        let keys: Vec<&String> = map["ConfigMap.v1"].keys().collect();
        assert_eq!(keys, ["a/x", "b/y"], "v2 sees every namespace, keyed namespace/name");
        let elsewhere = rule(json!({"apiVersion": "v1", "resource": "configmaps", "namespace": "b"}));
        assert!(Selection::new(&elsewhere, informer.resource(), v1, None).is_err(), "v1 cannot name another namespace");
    }

    /// Issue 69: Metacontroller 4.10.2 gave a v1 hook its namespaced parent's related Namespace, keyed by
    /// name; 4.10.3 on sends `{"Namespace.v1": {}}`. The hub gives it, in v1 and v2 alike.
    #[test]
    fn a_namespaced_parents_cluster_scoped_related_objects_are_keyed_by_name_in_v1_and_v2() {
        let informer = core("Namespace", "namespaces", false, &[("", "a", json!({"team": "x"})), ("", "b", json!({}))]);
        for version in [HookVersion::V1, HookVersion::V2] {
            let scope = ParentScope { namespace: Some("a"), version };
            let by_name = rule(json!({"apiVersion": "v1", "resource": "namespaces", "names": ["a"]}));
            let by_labels = rule(
                json!({"apiVersion": "v1", "resource": "namespaces", "labelSelector": {"matchLabels": {"team": "x"}}}),
            );
            for raw in [by_name, by_labels] {
                let selection = Selection::new(&raw, informer.resource(), scope, None).unwrap();
                assert_eq!(selection.namespace(), None, "a cluster-scoped type is confined to no namespace");
                let map = related_map([(&selection, &informer)], None, scope);
                let keys: Vec<&String> = map["Namespace.v1"].keys().collect();
                assert_eq!(keys, ["a"], "{version:?} {raw:?}");
            }
        }
        let listed = |resource: &str| RelatedLimit {
            namespaces: Some(Vec::new()),
            resources: Some(vec![crate::api::RelatedType { api_version: "v1".into(), resource: resource.into() }]),
        };
        let v1 = ParentScope { namespace: Some("a"), version: HookVersion::V1 };
        let raw = rule(json!({"apiVersion": "v1", "resource": "namespaces", "names": ["a"]}));
        assert!(Selection::new(&raw, informer.resource(), v1, Some(&listed("namespaces"))).is_ok());
        let refused = Selection::new(&raw, informer.resource(), v1, Some(&listed("configmaps"))).err().unwrap();
        assert!(refused.to_string().contains("relatedLimit does not list"), "{refused}");
    }

    #[test]
    fn names_select_by_name_and_refuse_a_selector_beside_them() {
        let informer = config_maps(&[("a", "x", json!({})), ("a", "y", json!({}))]);
        let raw = rule(json!({"apiVersion": "v1", "resource": "configmaps", "names": ["y"]}));
        Selection::check(&raw).unwrap();
        let scope = ParentScope { namespace: Some("a"), version: HookVersion::V1 };
        let selection = Selection::new(&raw, informer.resource(), scope, None).unwrap();
        let selected: Vec<String> =
            selection.select(&informer, None).iter().map(|o| o.metadata.name.clone().unwrap()).collect();
        assert_eq!(selected, ["y"]);
        let both = rule(json!({"apiVersion": "v1", "resource": "configmaps", "names": ["y"],
                               "labelSelector": {"matchLabels": {"k": "v"}}}));
        assert!(Selection::check(&both).is_err());
    }

    #[test]
    fn an_answer_holds_for_its_parent_and_generation_until_it_expires() {
        let asked = Instant::now();
        let cached = Cached { uid: "u1".into(), generation: 3, asked, rules: Arc::default() };
        let timeout = Duration::from_secs(1200);
        assert!(cached.answers("u1", 3, asked, timeout));
        assert!(cached.answers("u1", 3, asked + Duration::from_secs(1199), timeout));
        assert!(!cached.answers("u1", 3, asked + timeout, timeout), "expired: the hook is asked again");
        assert!(!cached.answers("u1", 4, asked, timeout), "a new generation is asked at once");
        assert!(!cached.answers("u2", 3, asked, timeout), "a new object of the same name too");
    }

    #[test]
    fn a_related_limit_refuses_rules_beyond_it_and_confines_those_across_namespaces() {
        let informer = config_maps(&[("a", "x", json!({})), ("b", "x", json!({})), ("shared", "x", json!({}))]);
        let v2 = ParentScope { namespace: Some("a"), version: HookVersion::V2 };
        let limit = RelatedLimit { namespaces: Some(vec!["shared".into()]), resources: None };
        let elsewhere = rule(json!({"apiVersion": "v1", "resource": "configmaps", "namespace": "b"}));
        let refused = Selection::new(&elsewhere, informer.resource(), v2, Some(&limit)).err().unwrap();
        assert!(refused.to_string().contains("beyond the controller's relatedLimit"), "{refused}");
        let anywhere = rule(json!({"apiVersion": "v1", "resource": "configmaps"}));
        let across = Selection::new(&anywhere, informer.resource(), v2, Some(&limit)).unwrap();
        let mut seen: Vec<String> =
            across.select(&informer, None).iter().map(|o| o.metadata.namespace.clone().unwrap()).collect();
        seen.sort();
        assert_eq!(seen, ["a", "shared"], "the parent's namespace and the listed one");
        assert_eq!(Selection::new(&anywhere, informer.resource(), v2, None).unwrap().select(&informer, None).len(), 3);
        let only_secrets = RelatedLimit {
            namespaces: None,
            resources: Some(vec![crate::api::RelatedType { api_version: "v1".into(), resource: "secrets".into() }]),
        };
        assert!(Selection::new(&anywhere, informer.resource(), v2, Some(&only_secrets)).is_err(), "a type not listed");
    }

    #[test]
    fn the_sync_hooks_version_not_the_customize_hooks_decides_the_reach() {
        let hook = |version: Option<HookVersion>| crate::api::Hook {
            version,
            webhook: crate::api::Webhook {
                url: Some("http://h".into()),
                service: None,
                path: None,
                timeout: None,
                etag: None,
                response_unmarshall_mode: None,
                ca_bundle: None,
                client_tls: None,
                authorization: None,
                basic_auth: None,
            },
        };
        let (v1, v2) = (hook(None), hook(Some(HookVersion::V2)));
        assert_eq!(related_version(Some(&v2), None), HookVersion::V2);
        assert_eq!(related_version(Some(&v1), Some(&v2)), HookVersion::V2, "a v2 finalize hook shows related too");
        assert_eq!(related_version(Some(&v1), None), HookVersion::V1);
    }

    #[test]
    fn the_reach_of_related_rules_is_said_as_a_person_would() {
        assert_eq!(Reach::of(HookVersion::V2, true, None).to_string(), "any type in any namespace");
        assert!(Reach::of(HookVersion::V2, true, None).unbounded());
        let v1 = Reach::of(HookVersion::V1, true, None);
        assert_eq!(v1.to_string(), "any type in the parent's namespace, and any cluster-scoped object");
        assert!(v1.unbounded(), "v1: the parent's namespace, but any cluster-scoped type");
        let namespaces_only = RelatedLimit { namespaces: Some(Vec::new()), resources: None };
        assert!(Reach::of(HookVersion::V2, true, Some(&namespaces_only)).unbounded(), "no limit on types");
        let types_only = RelatedLimit {
            namespaces: None,
            resources: Some(vec![crate::api::RelatedType { api_version: "v1".into(), resource: "namespaces".into() }]),
        };
        assert!(!Reach::of(HookVersion::V1, true, Some(&types_only)).unbounded(), "v1 and the types listed");
        assert!(
            !Reach::of(HookVersion::V1, false, Some(&namespaces_only)).unbounded(),
            "whoever may create a cluster-scoped parent is no tenant"
        );
        assert!(Reach::of(HookVersion::V1, false, None).unbounded(), "a cluster-scoped parent's v1 rules too");
        let limit = RelatedLimit {
            namespaces: Some(vec!["shared".into()]),
            resources: Some(vec![crate::api::RelatedType { api_version: "v1".into(), resource: "configmaps".into() }]),
        };
        assert_eq!(
            Reach::of(HookVersion::V2, true, Some(&limit)).to_string(),
            "configmaps.v1 in the parent's namespace, shared"
        );
    }
}
