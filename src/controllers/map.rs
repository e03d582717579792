//! One running MapController (Metacontroller's design, never built there): for every input object a
//! parent selects, one `map` hook call says which outputs the parent owns for it. The engine
//! ([`crate::engine::sync`]) syncs one parent at a time; this module says what is a MapController's own:
//! which objects are a parent's inputs, how its outputs are grouped by input, which inputs are asked,
//! what becomes of the outputs of an input that is gone, and the status the hub writes for it.
//!
//! **Why one sync per parent, with a call per input inside it.** The parent owns every output and its
//! status counts them all, the finalizer, the safe-delete guard and the sharding are per parent: all of
//! that is the engine's per-parent sync already. What is per input is the hook call and its identity:
//! each input is asked only when what its request shows changed (the parent, the input, the outputs
//! tagged with its key — see [`crate::engine::answered`]), or when the sync came back by its delay
//! (a resync, a retry). Calls for different inputs run concurrently, at most [`CALLS_PER_PARENT`] at a
//! time; the hub's hook client bounds its connections as a whole.
//!
//! **The tag.** Each output carries its input's map key, the input's UID, in the [`MAP_KEY_LABEL`]
//! label — a label, not an annotation, so a group is found by a selector (`kubectl get -l`, the hub's
//! own grouping) and a UID (36 characters of hex and dashes) is always a valid label value. The UID and
//! not the name, because an input deleted and created again under the same name is another object: the
//! outputs of the first are detached, not silently handed to the second. A human-readable
//! [`MAP_INPUT_ANNOTATION`] says which input that was. The hub sets both on every desired output; a hook
//! that sets another map key on an output is refused (it would move an output to another input).
//!
//! **All or nothing, per input.** An input's answer is checked whole before anything is written: an
//! output of another input, of another owner, or named twice refuses that input's answer. A refused
//! answer (or a failed call) leaves that input's outputs exactly as they are; the other inputs' answers
//! are written, and the sync then fails with what was refused ([`SyncError::Parts`]), retried with
//! backoff. An output of the parent that carries no map key is the parent's but no input's: the hub
//! never writes nor deletes it.
//!
//! **Detached outputs.** Outputs whose map key names no current input (it was deleted, or the parent
//! no longer selects it) are deleted, unless the controller has a `tombstone` hook: then that hook says
//! which of them to keep, and the others are deleted. Kept outputs are not written, nor handed to
//! another input: an input whose answer names one (an input deleted and created again under the same
//! name, say) waits, with nothing of its answer written, until that output is gone (`MapSync::waits`).
//! Nothing is detached by a reading that may be partial: inputs are read from a synced watch cache,
//! never from a failed list.
//!
//! **Status.** The map hook returns no status (it sees one input); the hub writes the parent's status:
//! per input type `{total}`, per output type `{total}` and, for every condition type some output
//! has, how many have it `True` (`Ready` → `ready`), and `observedGeneration`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::DynamicObject;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::api::{HookVersion, MapController, labels_of};
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::{Change, Event, Informer, ObjectKey, controller_uid};
use crate::cache::selector::{Selector, SelectorIndex};
use crate::cache::shard::Role;
use crate::engine::answered::{Answered, RequestId, content_version};
use crate::engine::error::{ParentSelectorError, RefusedParts, StartError, SyncError};
use crate::engine::hub::Hub;
use crate::engine::sync::{Call, Core, CoreSettings, Decision, Kind, Observation, child_types, within_namespaces};
use crate::engine::worker::resync_after;
use crate::hooks::{
    Endpoint, HookEvent, HookKind, HookVersions, MapFinalizeRequest, MapRequest, ObjectMaps, TombstoneRequest,
    WireObject, for_hooks,
};
use crate::write::apply::holder;
use crate::write::children::{
    ChildMap, ChildRole, ChildRules, ChildType, Claim, Ignored, desired_children, request_map,
};

/// The label on every output naming its input's map key (the input's UID).
pub const MAP_KEY_LABEL: &str = "metahook.dev/map-key";

/// The annotation on every output naming its input for people (`v1/PersistentVolumeClaim ns/name`).
pub const MAP_INPUT_ANNOTATION: &str = "metahook.dev/map-input";

/// Map (and tombstone) calls of one parent's sync in flight at once.
pub const CALLS_PER_PARENT: usize = 16;

/// The finalizer a MapController puts on its parents when it has a finalize hook.
#[must_use]
pub fn finalizer_name(controller: &str) -> String {
    format!("metacontroller.io/mapcontroller-{controller}")
}

/// A MapController whose types are resolved and whose caches are synced.
pub struct Controller {
    core: Core<ObjectKey>,
    mc: Arc<MapController>,
    /// The controller object as hooks receive it (`request.controller`).
    mc_json: Value,
    parent: Informer,
    parent_selector: Selector,
    /// The input types' caches, in the spec's order.
    inputs: Vec<Informer>,
    map: Endpoint,
    tombstone: Option<Endpoint>,
    finalize: Option<Endpoint>,
    versions: HookVersions,
    /// Every parent's input selector, found by an input's labels.
    selectors: Mutex<SelectorIndex<ObjectKey>>,
    /// Per parent and map key: the last map (or tombstone) request, and whether its answer was written.
    answered: Mutex<HashMap<ObjectKey, Arc<Answered<String>>>>,
    /// Per parent: the map keys whose answers its running sync accepted, marked answered in full once
    /// the sync's writes all succeeded ([`Kind::applied`]).
    accepted: Mutex<HashMap<ObjectKey, Vec<(String, RequestId)>>>,
}

impl Controller {
    /// Resolves the parent, input and output types, refuses specs it cannot honour, and waits for
    /// caches.
    pub async fn start(hub: &Hub, mc: Arc<MapController>) -> Result<Arc<Self>, StartError> {
        let spec = &mc.spec;
        let name = mc.metadata.name.clone().unwrap_or_default();
        let map_hook = spec.hooks.map.as_ref().ok_or(StartError::NoHooks)?;
        let versions = HookVersions::default();
        let endpoint = |hook, which| {
            hub.hooks.controller_endpoint(("MapController", &name), hook, which, &spec.endpoint_configs, &versions)
        };
        let map = endpoint(map_hook, HookKind::Map)?;
        let tombstone = spec.hooks.tombstone.as_ref().map(|h| endpoint(h, HookKind::Tombstone)).transpose()?;
        let finalize = spec.hooks.finalize.as_ref().map(|h| endpoint(h, HookKind::Finalize)).transpose()?;
        let parent_rule = &spec.parent_resource;
        let parent_resource = hub
            .discovery
            .resolve(&parent_rule.api_version, &parent_rule.resource)
            .await
            .map_err(|source| StartError::NotFound { role: "parent", source })?;
        within_namespaces(hub, "parent", &parent_resource)?;
        let parent_selector = match &parent_rule.label_selector {
            Some(s) => Selector::from_label_selector(s)?,
            None => Selector::everything(),
        };
        if spec.input_resources.is_empty() {
            return Err(StartError::Map("inputResources must name at least one type".into()));
        }
        let mut inputs = Vec::with_capacity(spec.input_resources.len());
        for rule in &spec.input_resources {
            let resource = hub
                .discovery
                .resolve(&rule.api_version, &rule.resource)
                .await
                .map_err(|source| StartError::NotFound { role: "input", source })?;
            within_namespaces(hub, "input", &resource)?;
            if parent_resource.namespaced && !resource.namespaced {
                // A namespaced parent's inputs are in its namespace: whoever may create such a parent
                // must not make the hub read cluster-wide objects for it.
                return Err(StartError::Map(format!(
                    "input {} is cluster-scoped: a namespaced parent's inputs are in its own namespace",
                    rule.resource
                )));
            }
            // Inputs are read, never written: every replica of a sharded hub sees them all.
            inputs.push(hub.informers.get_unsharded(&resource));
        }
        let rules: Vec<_> = spec.output_resources.iter().map(crate::api::OutputResourceRule::as_child_rule).collect();
        if rules.iter().any(|r| r.method().is_rolling()) {
            return Err(StartError::Map("an output type cannot roll (RollingUpdate, RollingRecreate)".into()));
        }
        let children = child_types(hub, &rules, "output", |method| method).await?;
        let parent = hub.informers.get(&parent_resource, Role::Parent);
        parent.wait_synced(hub.settings.cache_sync_timeout).await?;
        for informer in &inputs {
            informer.wait_synced(hub.settings.cache_sync_timeout).await?;
        }
        for child in &children {
            child.informer.wait_synced(hub.settings.cache_sync_timeout).await?;
        }
        let mc_json = serde_json::to_value(&*mc).unwrap_or(Value::Null);
        let core = Core::new(
            hub,
            CoreSettings {
                kind: "MapController",
                finalizer: finalizer_name(&name),
                name,
                annotations: mc.metadata.annotations.as_ref(),
                children,
                customize: None,
                controller: mc_json.clone(),
                sync_hook: None,
                endpoint_configs: spec.endpoint_configs.clone(),
                records: None,
                related_limit: None,
            },
        )
        .map_err(StartError::Annotation)?;
        Ok(Arc::new(Self {
            core,
            mc_json,
            parent,
            parent_selector,
            inputs,
            map,
            tombstone,
            finalize,
            versions,
            selectors: Mutex::default(),
            answered: Mutex::default(),
            accepted: Mutex::default(),
            mc,
        }))
    }

    /// Runs watches-to-queue mapping and the workers, and follows the hooks' versions
    /// ([`crate::engine::rollout`]), until `cancel` fires.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let versions = crate::engine::rollout::run(Arc::clone(&self), cancel.clone());
        tokio::join!(crate::engine::sync::run(self, cancel), versions);
    }

    /// Queues every parent it selects (or still finalizes); returns how many.
    pub fn resync_all(&self) -> usize {
        crate::engine::sync::resync_all(self)
    }

    /// Takes the settings of the controller object's annotations from now on.
    pub fn configure(&self, annotations: Option<&BTreeMap<String, String>>) -> Result<(), String> {
        self.core.configure(annotations)
    }

    /// The namespace a parent's inputs are in (`None`: any, for a cluster-scoped parent).
    fn scope<'p>(&self, parent: &'p DynamicObject) -> Option<&'p str> {
        if self.parent.resource().namespaced { parent.metadata.namespace.as_deref() } else { None }
    }

    /// `parent`'s input selector, compiled once per parent version.
    fn selector_of(&self, parent: &DynamicObject) -> Result<Arc<Selector>, SyncError> {
        let version = format!(
            "{}/{}",
            parent.metadata.uid.as_deref().unwrap_or_default(),
            parent.metadata.generation.unwrap_or_default()
        );
        self.selectors.lock().expect("selectors lock").get_or_compile(
            &ObjectKey::of(parent),
            &version,
            self.scope(parent),
            || input_selector(parent),
        )
    }

    /// The inputs of `parent`, by input type: the objects its selector selects where its inputs are,
    /// except those it controls itself.
    fn inputs_of(&self, parent: &DynamicObject) -> Result<Vec<Vec<Arc<DynamicObject>>>, SyncError> {
        let selector = self.selector_of(parent)?;
        let uid = parent.metadata.uid.as_deref();
        Ok(self
            .inputs
            .iter()
            .map(|informer| {
                let namespace = self.scope(parent).map(Some);
                let mut found: Vec<_> = informer
                    .list_selected(namespace, &selector)
                    .into_iter()
                    .filter(|input| controller_uid(input) != uid)
                    .collect();
                found.sort_by_key(|input| ObjectKey::of(input));
                found
            })
            .collect())
    }

    /// The requests of the parent `key`, by map key.
    fn answered_of(&self, key: &ObjectKey) -> Arc<Answered<String>> {
        Arc::clone(self.answered.lock().expect("answered lock").entry(key.clone()).or_default())
    }

    /// How this controller asks its hooks.
    fn ask(&self) -> Ask<'_> {
        Ask {
            controller: &self.mc_json,
            parent_resource: self.parent.resource(),
            output_resources: &self.core.child_resources,
            input_resources: self.inputs.iter().map(Informer::resource).collect(),
        }
    }
}

/// A parent's input selector: its `spec.selector` (a `LabelSelector`); absent or empty selects every
/// object where the parent's inputs are.
pub fn input_selector(parent: &DynamicObject) -> Result<Selector, SyncError> {
    let raw = parent.data.pointer("/spec/selector").cloned().unwrap_or(Value::Null);
    if raw.is_null() {
        return Ok(Selector::everything());
    }
    let selector: LabelSelector =
        serde_json::from_value(raw).map_err(|e| SyncError::ParentSelector(ParentSelectorError::Decode(e)))?;
    Selector::from_label_selector(&selector).map_err(|e| SyncError::ParentSelector(ParentSelectorError::Invalid(e)))
}

/// The map key of an output (its [`MAP_KEY_LABEL`]), if it has one.
#[must_use]
pub fn map_key_of(output: &DynamicObject) -> Option<&str> {
    output.metadata.labels.as_ref()?.get(MAP_KEY_LABEL).map(String::as_str)
}

/// The parent as a MapController's hooks see it: without its `status` and `metadata.resourceVersion`.
/// The status is the hub's own count, not the hook's; shown, every status write would change every
/// input's request, and each would be asked again after each write of the counts (a loop, N calls per
/// sync). Hiding it is what makes a change of one input ask only that input (one call, and one more for
/// the echo of its output's write, as for every kind); the identity of a request then covers exactly
/// what it shows (see [`content_version`]).
#[must_use]
pub fn parent_for_hooks(parent: &DynamicObject) -> Value {
    let mut shown = for_hooks(parent);
    if let Some(fields) = shown.as_object_mut() {
        fields.remove("status");
    }
    if let Some(metadata) = shown.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("resourceVersion");
    }
    shown
}

/// The outputs of a parent by map key, each by output type.
type Groups = BTreeMap<String, Vec<ChildMap<Arc<DynamicObject>>>>;

/// Groups `observed` (a parent's outputs by type) by their map keys; outputs without one are no group's.
#[must_use]
fn groups(observed: &[ChildMap<Arc<DynamicObject>>]) -> Groups {
    let mut groups = Groups::new();
    for (index, outputs) in observed.iter().enumerate() {
        for (key, output) in outputs {
            if let Some(map_key) = map_key_of(output) {
                let group = groups.entry(map_key.to_owned()).or_insert_with(|| vec![ChildMap::new(); observed.len()]);
                group[index].insert(key.clone(), Arc::clone(output));
            }
        }
    }
    groups
}

/// How a MapController asks its hooks and judges their answers: the one way the engine and
/// `metahook render` do it.
pub struct Ask<'a> {
    pub controller: &'a Value,
    pub parent_resource: &'a Arc<ResolvedResource>,
    pub output_resources: &'a [Arc<ResolvedResource>],
    pub input_resources: Vec<&'a Arc<ResolvedResource>>,
}

/// One input as a map call sees it.
pub struct Input<'a> {
    /// Index of its type among `inputResources`.
    pub type_index: usize,
    pub object: &'a Arc<DynamicObject>,
}

impl Input<'_> {
    /// Its map key: its UID.
    #[must_use]
    pub fn map_key(&self) -> &str {
        self.object.metadata.uid.as_deref().unwrap_or_default()
    }
}

/// One input's answer, checked: its desired outputs by type, and what else the hook said.
pub struct Mapped {
    pub desired: Vec<ChildMap<Value>>,
    pub resync: Option<std::time::Duration>,
    pub events: Vec<HookEvent>,
}

impl Ask<'_> {
    /// The request map of outputs (by type key and object key) for hook `version`.
    #[must_use]
    pub fn outputs_map(
        &self,
        version: HookVersion,
        parent: &DynamicObject,
        outputs: &[ChildMap<Arc<DynamicObject>>],
    ) -> ObjectMaps {
        let namespace = self.parent_resource.namespaced.then_some(parent.metadata.namespace.as_deref()).flatten();
        request_map(self.output_resources, version, namespace, outputs)
    }

    /// The identity of the map request for `input` (see [`crate::engine::answered`]).
    /// `parent_version` is [`content_version`] of the parent as the request shows it
    /// ([`parent_for_hooks`]).
    #[must_use]
    pub fn request_id(
        &self,
        endpoint: &Endpoint,
        parent: &DynamicObject,
        parent_version: &str,
        input: &Input<'_>,
        outputs: &ObjectMaps,
    ) -> RequestId {
        let shown = ObjectMaps::from([(
            "input".to_owned(),
            BTreeMap::from([(input.map_key().to_owned(), WireObject(Arc::clone(input.object)))]),
        )]);
        let uid = parent.metadata.uid.as_deref().unwrap_or_default();
        RequestId::of_version(endpoint.url(), uid, parent_version, false, outputs, &shown)
    }

    /// Asks `endpoint` what `input`'s outputs should be and checks the answer whole: each output of a
    /// declared type, valid, owned by the parent, tagged with the input's map key.
    pub async fn map(
        &self,
        endpoint: &Endpoint,
        parent: &DynamicObject,
        parent_json: &Value,
        input: &Input<'_>,
        outputs: &ObjectMaps,
    ) -> Result<Mapped, SyncError> {
        let input_json = for_hooks(input.object);
        let request = MapRequest {
            controller: self.controller,
            parent: parent_json,
            map_key: input.map_key(),
            input: &input_json,
            outputs,
        };
        let response = endpoint.map(&request).await?;
        let desired = self.check(parent, input, &response.outputs).map_err(SyncError::InvalidResponse)?;
        Ok(Mapped { desired, resync: resync_after(response.resync_after_seconds), events: response.events })
    }

    /// The outputs a map answer asks for, as they will be applied: tagged with the input, owned by the
    /// parent; or why the answer is refused.
    pub fn check(
        &self,
        parent: &DynamicObject,
        input: &Input<'_>,
        items: &[Value],
    ) -> Result<Vec<ChildMap<Value>>, String> {
        let resource = self.input_resources.get(input.type_index).map(|r| format!("{}/{}", r.api_version(), r.kind()));
        let annotations = BTreeMap::from([(
            MAP_INPUT_ANNOTATION.to_owned(),
            format!("{} {}", resource.unwrap_or_default(), ObjectKey::of(input.object)),
        )]);
        let rules = ChildRules {
            default_labels: None,
            annotations: Some(&annotations),
            selector: None,
            cross_namespace: &[],
            role: ChildRole::Output,
        };
        let mut desired = desired_children(self.output_resources, parent, self.parent_resource, items, rules)?;
        let map_key = input.map_key();
        for outputs in &mut desired {
            for (key, output) in outputs.iter_mut() {
                let labels = output
                    .pointer_mut("/metadata")
                    .and_then(Value::as_object_mut)
                    .map(|meta| meta.entry("labels").or_insert_with(|| json!({})))
                    .and_then(Value::as_object_mut)
                    .ok_or_else(|| format!("{key}: metadata.labels is not an object"))?;
                match labels.get(MAP_KEY_LABEL) {
                    Some(Value::String(set)) if set != map_key => {
                        return Err(format!(
                            "{key}: its {MAP_KEY_LABEL} label is the hub's (the input's map key {map_key}), not {set}"
                        ));
                    }
                    _ => {
                        labels.insert(MAP_KEY_LABEL.to_owned(), Value::String(map_key.to_owned()));
                    }
                }
            }
        }
        Ok(desired)
    }

    /// Asks `endpoint` which of the detached outputs of `map_key` to keep: the set of them to keep,
    /// by type index and key.
    pub async fn tombstone(
        &self,
        endpoint: &Endpoint,
        parent_json: &Value,
        map_key: &str,
        outputs: &ObjectMaps,
    ) -> Result<(BTreeSet<(usize, ObjectKey)>, Option<std::time::Duration>), SyncError> {
        let request = TombstoneRequest { controller: self.controller, parent: parent_json, map_key, outputs };
        let response = endpoint.tombstone(&request).await?;
        let mut keep = BTreeSet::new();
        for (position, item) in response.outputs.iter().enumerate() {
            let text = |field: &str| item.pointer(field).and_then(Value::as_str).unwrap_or_default();
            let (api_version, kind, name) = (text("/apiVersion"), text("/kind"), text("/metadata/name"));
            let index = self
                .output_resources
                .iter()
                .position(|r| r.api_version() == api_version && r.kind() == kind)
                .ok_or_else(|| {
                SyncError::InvalidResponse(format!(
                    "tombstone outputs[{position}]: {api_version}/{kind} is not a declared output type"
                ))
            })?;
            let namespace = self.output_resources[index].namespaced.then(|| text("/metadata/namespace").to_owned());
            keep.insert((index, ObjectKey { namespace: namespace.filter(|n| !n.is_empty()), name: name.to_owned() }));
        }
        Ok((keep, resync_after(response.resync_after_seconds)))
    }
}

/// The status the hub writes for a parent: what it counts of its inputs and, after the sync's writes,
/// of its outputs (`outputs`: every output the parent will have, by type; a new one has no conditions yet).
#[must_use]
pub fn aggregate(
    input_resources: &[&Arc<ResolvedResource>],
    inputs: &[Vec<Arc<DynamicObject>>],
    output_resources: &[Arc<ResolvedResource>],
    outputs: &[Vec<Option<&DynamicObject>>],
) -> Value {
    let name = |resources: Vec<&ResolvedResource>, index: usize| {
        let plural = &resources[index].api_resource.plural;
        let repeated = resources.iter().filter(|r| &r.api_resource.plural == plural).count() > 1;
        if repeated { format!("{plural}.{}", resources[index].api_resource.group) } else { plural.clone() }
    };
    let input_list: Vec<&ResolvedResource> = input_resources.iter().map(AsRef::as_ref).collect();
    let output_list: Vec<&ResolvedResource> = output_resources.iter().map(AsRef::as_ref).collect();
    let mut input_status = Map::new();
    for (index, objects) in inputs.iter().enumerate() {
        input_status.insert(name(input_list.clone(), index), json!({"total": objects.len()}));
    }
    let mut output_status = Map::new();
    for (index, objects) in outputs.iter().enumerate() {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for object in objects.iter().flatten() {
            let conditions = object.data.pointer("/status/conditions").and_then(Value::as_array);
            for condition in conditions.into_iter().flatten() {
                let (Some(kind), Some("True")) =
                    (condition.get("type").and_then(Value::as_str), condition.get("status").and_then(Value::as_str))
                else {
                    continue;
                };
                let mut chars = kind.chars();
                let Some(first) = chars.next() else { continue };
                let key: String = first.to_lowercase().chain(chars).collect();
                if key != "total" {
                    *counts.entry(key).or_default() += 1;
                }
            }
        }
        let mut entry = Map::new();
        entry.insert("total".into(), json!(objects.len()));
        for (key, count) in counts {
            entry.insert(key, json!(count));
        }
        output_status.insert(name(output_list.clone(), index), Value::Object(entry));
    }
    json!({"inputs": input_status, "outputs": output_status})
}

impl Kind for Controller {
    type Key = ObjectKey;
    type Before = ();
    /// The parent's inputs, by input type.
    type Claimed = Vec<Vec<Arc<DynamicObject>>>;
    const OBJECT: &'static str = "parent";
    const STATUS_IS_THE_HOOKS: bool = true;
    const SETS_OBSERVED_GENERATION: bool = true;

    fn core(&self) -> &Core<ObjectKey> {
        &self.core
    }

    fn object_informers(&self) -> Vec<&Informer> {
        vec![&self.parent]
    }

    fn key_of(&self, _: usize, obj: &DynamicObject) -> ObjectKey {
        ObjectKey::of(obj)
    }

    fn type_of(&self, _: &ObjectKey) -> usize {
        0
    }

    fn object(&self, key: &ObjectKey) -> Option<(Arc<DynamicObject>, Arc<ResolvedResource>)> {
        self.parent.get(key).map(|parent| (parent, Arc::clone(self.parent.resource())))
    }

    fn contains(&self, key: &ObjectKey) -> bool {
        self.parent.contains(key)
    }

    fn holds(&self, key: &ObjectKey, version: &str) -> bool {
        self.parent.holds(key, version)
    }

    fn selects(&self, _: usize, obj: &DynamicObject) -> bool {
        self.parent_selector.matches(&labels_of(&obj.metadata))
    }

    fn ignores_status_changes(&self, _: usize, _: &DynamicObject) -> bool {
        self.mc.spec.parent_resource.ignore_status_changes == Some(true)
    }

    /// Keeps the index of input selectors current, and forgets the requests of a parent that is gone.
    fn noticed(&self, event: &Event) {
        match &event.change {
            Change::Deleted(obj) => {
                let key = ObjectKey::of(obj);
                self.selectors.lock().expect("selectors lock").remove(&key);
                self.answered.lock().expect("answered lock").remove(&key);
                self.accepted.lock().expect("accepted lock").remove(&key);
            }
            Change::Applied { new, .. } => {
                let _ = self.selector_of(new);
            }
        }
    }

    /// The parent controlling `output` (an output's owner is its parent; nothing is adopted).
    fn owners(&self, output: &DynamicObject, _adopt: bool) -> Vec<ObjectKey> {
        let resource = self.parent.resource();
        let Some(owner) = output.metadata.owner_references.iter().flatten().find(|r| r.controller == Some(true)) else {
            return Vec::new();
        };
        if owner.api_version != resource.api_version() || owner.kind != resource.kind() {
            return Vec::new();
        }
        let namespace = if resource.namespaced { output.metadata.namespace.clone() } else { None };
        let key = ObjectKey { namespace, name: owner.name.clone() };
        let current = self.parent.get(&key).is_some_and(|p| p.metadata.uid.as_deref() == Some(owner.uid.as_str()));
        if current { vec![key] } else { Vec::new() }
    }

    fn hook(&self, finalizing: bool) -> Option<&Endpoint> {
        if finalizing { self.finalize.as_ref() } else { Some(&self.map) }
    }

    fn hook_versions(&self) -> &HookVersions {
        &self.versions
    }

    fn has_finalize_hook(&self) -> bool {
        self.finalize.is_some()
    }

    fn resync_period_seconds(&self) -> Option<i32> {
        self.mc.spec.resync_period_seconds
    }

    /// The parent's outputs (controlled by it; nothing adopted, nothing released) and its inputs.
    async fn observe(
        &self,
        parent: &DynamicObject,
        resource: &ResolvedResource,
    ) -> Result<Option<Observation<Self::Claimed>>, SyncError> {
        let uid = parent.metadata.uid.as_deref().unwrap_or_default();
        let outputs = self
            .core
            .children
            .iter()
            .map(|output| {
                output
                    .informer
                    .controlled_by(uid)
                    .into_iter()
                    .filter(|obj| !resource.namespaced || obj.metadata.namespace == parent.metadata.namespace)
                    .map(|obj| (ObjectKey::of(&obj), obj))
                    .collect()
            })
            .collect();
        Ok(Some((outputs, self.inputs_of(parent)?)))
    }

    /// Each input's request identity decides whether it is asked; the engine's identity of the whole
    /// request would not tell which.
    fn identifies_requests(&self) -> bool {
        false
    }

    async fn decide(
        &self,
        parent: &DynamicObject,
        _: &ResolvedResource,
        call: Call<'_>,
        inputs: &Self::Claimed,
    ) -> Result<Decision<()>, SyncError> {
        let parent_json = parent_for_hooks(parent);
        let types = self.core.children.len();
        if call.finalizing {
            // Nothing is written to the outputs: the garbage collector deletes them with the parent.
            let request = MapFinalizeRequest {
                controller: &self.mc_json,
                parent: &parent_json,
                outputs: call.children,
                finalizing: true,
            };
            let response = call.endpoint.map_finalize(&request).await?;
            return Ok(Decision {
                desired: vec![ChildMap::new(); types],
                status: None,
                metadata: None,
                resync: resync_after(response.resync_after_seconds),
                finalized: response.finalized,
                events: response.events,
                before: None,
                scope: Some(vec![ChildMap::new(); types]),
                refused: None,
            });
        }
        let key = ObjectKey::of(parent);
        let groups = groups(call.observed);
        let all_inputs: Vec<Input<'_>> = inputs
            .iter()
            .enumerate()
            .flat_map(|(type_index, objects)| objects.iter().map(move |object| Input { type_index, object }))
            .collect();
        let live: BTreeSet<&str> = all_inputs.iter().map(Input::map_key).collect();
        // Forget what was asked for map keys that are neither an input nor a group any more.
        let answered = self.answered_of(&key);
        answered.retain(|k| live.contains(k.as_str()) || groups.contains_key(k));
        // Every input and group asked again on a resync or a requested sync, but not on the retry of a
        // failed sync (its failed parts are asked again anyway: their answers were not written).
        let ask_all = call.asks_again && !call.retrying;
        let parent_version = content_version(&parent_json);
        let sync = MapSync {
            controller: self,
            ask: self.ask(),
            parent,
            parent_json: &parent_json,
            parent_version,
            answered,
            call,
            ask_all,
        };
        let mut parts = Parts::new(types);
        // Detached outputs first: an input asking for one of them waits until it is gone, and whether it
        // goes in this sync (deleted) or stays (kept by the tombstone hook) is said differently.
        let tombstones = sync.detached(&groups, &live, &mut parts).await;
        sync.map_inputs(&all_inputs, &groups, &live, &mut parts).await;

        // The outputs after this sync's writes, for the status.
        let Parts { desired, scope, accepted, failed_inputs, failed_groups, resync, events } = parts;
        let after: Vec<Vec<Option<&DynamicObject>>> = (0..types)
            .map(|index| {
                let kept = call.observed[index]
                    .iter()
                    .filter(|(k, _)| !scope[index].contains_key(*k) || desired[index].contains_key(*k))
                    .map(|(_, v)| Some(v.as_ref()));
                let created = desired[index].keys().filter(|k| !call.observed[index].contains_key(*k)).map(|_| None);
                kept.chain(created).collect()
            })
            .collect();
        let mut status = aggregate(&sync.ask.input_resources, inputs, &self.core.child_resources, &after);
        status["observedGeneration"] = parent.metadata.generation.unwrap_or(0).into();
        self.accepted.lock().expect("accepted lock").insert(key, accepted);
        let refused = refused((all_inputs.len(), failed_inputs), (tombstones, failed_groups));
        Ok(Decision {
            desired,
            status: Some(status),
            metadata: None,
            resync,
            finalized: false,
            events,
            before: None,
            scope: Some(scope),
            refused,
        })
    }

    fn whose(&self, parent: &DynamicObject, child: &DynamicObject) -> Claim {
        output_claim(child, parent.metadata.uid.as_deref())
    }

    fn input_informers(&self) -> Vec<&Informer> {
        self.inputs.iter().collect()
    }

    /// The parents whose input selector selects `input` where their inputs are.
    fn readers(&self, _: usize, input: &DynamicObject) -> Vec<ObjectKey> {
        let labels = labels_of(&input.metadata);
        self.selectors.lock().expect("selectors lock").selecting(input.metadata.namespace.as_deref(), &labels)
    }

    fn applied(&self, key: &ObjectKey) {
        let accepted = self.accepted.lock().expect("accepted lock").remove(key).unwrap_or_default();
        let answered = self.answered_of(key);
        for (map_key, id) in accepted {
            if answered.seen(&map_key, id).is_some() {
                answered.applied(&map_key);
            }
        }
    }
}

/// Refuses an input's desired outputs (`wanted`, by type) that are another's: an output of another
/// input of this parent (`observed`, or asked for by an input `accepted` before in this sync), an output
/// of the parent that is no input's, or an object of someone else (in `types`' caches). The engine and
/// `metahook diff` both check answers so.
pub fn claims_nothing_of_others(
    types: &[ChildType],
    parent: &DynamicObject,
    map_key: &str,
    wanted: &[ChildMap<Value>],
    observed: &[ChildMap<Arc<DynamicObject>>],
    accepted: &[ChildMap<Value>],
) -> Result<(), String> {
    for (index, outputs) in wanted.iter().enumerate() {
        let kind = types[index].resource().kind();
        for key in outputs.keys() {
            if let Some(existing) = observed[index].get(key) {
                match map_key_of(existing) {
                    Some(k) if k == map_key => continue,
                    Some(other) => return Err(format!("{kind} {key} is the output of another input ({other})")),
                    None => {
                        return Err(format!("{kind} {key} is the parent's but no input's; it was left untouched"));
                    }
                }
            }
            if accepted[index].contains_key(key) {
                return Err(format!("{kind} {key} is asked for by another input too"));
            }
            if let Some(existing) = types[index].informer.get(key)
                && controller_uid(&existing) != parent.metadata.uid.as_deref()
            {
                return Err(format!(
                    "{kind} {key} already exists and is not controlled by this parent ({}); it was left untouched",
                    holder(&existing)
                ));
            }
        }
    }
    Ok(())
}

/// What a sync (or a preview) of a parent whose parts were refused fails with: of `inputs` (how many,
/// and those refused with why) and of the groups of detached outputs asked of the tombstone hook
/// (`groups`, likewise), each counted apart — a group of detached outputs is no input. `None` when
/// nothing was refused.
#[must_use]
pub fn refused(inputs: (usize, Vec<String>), groups: (usize, Vec<String>)) -> Option<SyncError> {
    let parts: Vec<RefusedParts> = [
        RefusedParts { what: "inputs", total: inputs.0, left: "nothing written for them", failed: inputs.1 },
        RefusedParts {
            what: "groups of detached outputs",
            total: groups.0,
            left: "left as they are",
            failed: groups.1,
        },
    ]
    .into_iter()
    .filter(|part| !part.failed.is_empty())
    .collect();
    (!parts.is_empty()).then_some(SyncError::Parts(parts))
}

/// The first output an input's answer (`wanted`, by output type) asks for that is an output of a
/// former input — its map key names no current input (`live` says which do) — by type index, with that
/// map key. Such an output keeps its name for the former input: the input waits until it is gone (see
/// `MapSync::waits`). The engine and `metahook diff` both ask it so.
#[must_use]
pub fn former_inputs_output<'o>(
    wanted: &[ChildMap<Value>],
    observed: &'o [ChildMap<Arc<DynamicObject>>],
    live: impl Fn(&str) -> bool,
) -> Option<(usize, &'o ObjectKey, &'o str)> {
    wanted.iter().enumerate().find_map(|(index, outputs)| {
        outputs.keys().find_map(|key| {
            let (key, existing) = observed[index].get_key_value(key)?;
            map_key_of(existing).filter(|k| !live(k)).map(|former| (index, key, former))
        })
    })
}

/// What one sync of a parent decides, part by part (an input's answer, a group of detached outputs).
struct Parts {
    /// The desired outputs of the parts accepted, by output type.
    desired: Vec<ChildMap<Value>>,
    /// The observed outputs the decision is about (see [`Decision::scope`]).
    scope: Vec<ChildMap<Arc<DynamicObject>>>,
    /// The map keys whose answers were accepted, with their requests.
    accepted: Vec<(String, RequestId)>,
    /// The inputs whose answers were refused, each with why.
    failed_inputs: Vec<String>,
    /// The groups of detached outputs whose tombstone call failed, each with why.
    failed_groups: Vec<String>,
    resync: Option<std::time::Duration>,
    events: Vec<HookEvent>,
}

impl Parts {
    fn new(types: usize) -> Self {
        Self {
            desired: vec![ChildMap::new(); types],
            scope: vec![ChildMap::new(); types],
            accepted: Vec::new(),
            failed_inputs: Vec::new(),
            failed_groups: Vec::new(),
            resync: None,
            events: Vec::new(),
        }
    }

    /// Puts `outputs` (observed, by type) in the decision's scope, except those `keep` says.
    fn take_in(&mut self, outputs: &[ChildMap<Arc<DynamicObject>>], keep: impl Fn(usize, &ObjectKey) -> bool) {
        for (index, outputs) in outputs.iter().enumerate() {
            let taken = outputs.iter().filter(|(k, _)| !keep(index, k));
            self.scope[index].extend(taken.map(|(k, v)| (k.clone(), Arc::clone(v))));
        }
    }
}

/// One sync of one parent, deciding.
struct MapSync<'a> {
    controller: &'a Controller,
    ask: Ask<'a>,
    parent: &'a DynamicObject,
    parent_json: &'a Value,
    /// [`content_version`] of `parent_json`: the parent's part of every request's identity.
    parent_version: String,
    /// The parent's requests, by map key.
    answered: Arc<Answered<String>>,
    call: Call<'a>,
    /// Ask every input and group, even one whose request was answered in full.
    ask_all: bool,
}

impl MapSync<'_> {
    /// Whether the request `id` of `map_key` is to be asked (and then records it as asked).
    fn asks(&self, map_key: &str, id: RequestId) -> bool {
        let map_key = map_key.to_owned();
        if !self.ask_all && self.answered.seen(&map_key, id) == Some(true) {
            self.controller.core.metrics.hook_call_saved(crate::engine::metrics::Saved::IdenticalRequest);
            return false;
        }
        self.answered.asked(&map_key, id);
        true
    }

    /// Asks the inputs whose requests changed, concurrently, and takes in each answer the hub accepts.
    /// An answer asking for an output of a former input (a detached output, its map key not `live`)
    /// waits, written for nothing, until that output is gone (see [`MapSync::waits`]).
    async fn map_inputs(&self, inputs: &[Input<'_>], groups: &Groups, live: &BTreeSet<&str>, parts: &mut Parts) {
        let empty = vec![ChildMap::new(); parts.desired.len()];
        let version = self.call.endpoint.version();
        let mut calls: Vec<MapCall<'_>> = Vec::new();
        for (position, input) in inputs.iter().enumerate() {
            let outputs = groups.get(input.map_key()).unwrap_or(&empty);
            let shown = self.ask.outputs_map(version, self.parent, outputs);
            let id = self.ask.request_id(self.call.endpoint, self.parent, &self.parent_version, input, &shown);
            if !self.asks(input.map_key(), id) {
                continue;
            }
            calls.push(Box::pin(async move {
                let answer = self.ask.map(self.call.endpoint, self.parent, self.parent_json, input, &shown).await;
                (position, id, answer)
            }));
        }
        let answers: Vec<_> = futures::stream::iter(calls).buffered(CALLS_PER_PARENT).collect().await;
        for (position, id, answer) in answers {
            let input = &inputs[position];
            let describe = || {
                let kind = self.ask.input_resources.get(input.type_index).map_or("", |r| r.kind());
                format!("{kind} {}", ObjectKey::of(input.object))
            };
            let map_key = input.map_key();
            let mapped = match answer {
                Ok(mapped) => mapped,
                Err(e) => {
                    parts.failed_inputs.push(format!("{}: {}", describe(), crate::engine::error::with_causes(&e)));
                    continue;
                }
            };
            let observed = self.call.observed;
            if self.waits(&describe(), &mapped.desired, live, parts) {
                continue;
            }
            if let Err(why) = claims_nothing_of_others(
                &self.controller.core.children,
                self.parent,
                map_key,
                &mapped.desired,
                observed,
                &parts.desired,
            ) {
                parts.failed_inputs.push(format!("{}: {why}", describe()));
                continue;
            }
            for (index, desired) in mapped.desired.into_iter().enumerate() {
                parts.desired[index].extend(desired);
            }
            parts.take_in(groups.get(map_key).unwrap_or(&empty), |_, _| false);
            parts.resync = earliest(parts.resync, mapped.resync);
            parts.events.extend(mapped.events);
            parts.accepted.push((map_key.to_owned(), id));
        }
    }

    /// Whether the answer of the input `input` (`wanted`, by output type) asks for an output of a former
    /// input — its map key names no input in `live`, as after an input is deleted and created again
    /// under the same name (a new UID: a new input). Such an output is never handed to the new input:
    /// the tombstone hook decided to keep it as the former input's, and may not have it edited (the
    /// design's rule). So the input waits: nothing of its answer is written, it is not refused (no
    /// retry with backoff, which cannot help), and it is asked again on the parent's next sync — the
    /// output's deletion queues one, whether the tombstone hook stops keeping it or someone deletes
    /// it. An output being deleted in this very sync (no tombstone hook, or one that keeps it no
    /// longer) is waited for quietly; a kept one is said in a Warning Event `OutputKept` on the parent.
    fn waits(&self, input: &str, wanted: &[ChildMap<Value>], live: &BTreeSet<&str>, parts: &mut Parts) -> bool {
        let in_the_way = former_inputs_output(wanted, self.call.observed, |k| live.contains(k));
        let Some((index, key, former)) = in_the_way else { return false };
        let kind = self.controller.core.children[index].resource().kind();
        let going = parts.scope[index].contains_key(key) && !parts.desired[index].contains_key(key);
        if going {
            tracing::debug!("{input} waits for {kind} {key}, a former input's output being deleted");
        } else {
            parts.events.push(HookEvent {
                type_: "Warning".into(),
                reason: "OutputKept".into(),
                message: format!(
                    "{input} asks for {kind} {key}, which the tombstone hook keeps as the output of a former \
                     input ({former}): nothing is written for {input} until {key} is gone (the tombstone hook no \
                     longer keeps it, or it is deleted); a kept output is never handed to another input"
                ),
            });
        }
        true
    }

    /// The detached outputs (their map key names no input in `live`): deleted, or asked of the
    /// tombstone hook, group by group. Returns how many groups were the tombstone hook's.
    async fn detached(&self, groups: &Groups, live: &BTreeSet<&str>, parts: &mut Parts) -> usize {
        let mut tombstones = 0;
        for (map_key, outputs) in groups.iter().filter(|(k, _)| !live.contains(k.as_str())) {
            let Some(endpoint) = &self.controller.tombstone else {
                parts.take_in(outputs, |_, _| false);
                continue;
            };
            tombstones += 1;
            let shown = self.ask.outputs_map(endpoint.version(), self.parent, outputs);
            let uid = self.parent.metadata.uid.as_deref().unwrap_or_default();
            let id =
                RequestId::of_version(endpoint.url(), uid, &self.parent_version, false, &shown, &ObjectMaps::new());
            if !self.asks(map_key, id) {
                continue;
            }
            match self.ask.tombstone(endpoint, self.parent_json, map_key, &shown).await {
                Ok((keep, after)) => {
                    parts.take_in(outputs, |index, key| keep.contains(&(index, key.clone())));
                    parts.resync = earliest(parts.resync, after);
                    parts.accepted.push((map_key.clone(), id));
                }
                Err(e) => {
                    let why = crate::engine::error::with_causes(&e);
                    parts.failed_groups.push(format!("detached outputs of {map_key}: {why}"));
                }
            }
        }
        tombstones
    }
}

/// One map call of a sync: the input's position, its request's identity, and the answer.
type MapCall<'a> = std::pin::Pin<Box<dyn Future<Output = (usize, RequestId, Result<Mapped, SyncError>)> + Send + 'a>>;

/// The earlier of two optional delays.
fn earliest(a: Option<std::time::Duration>, b: Option<std::time::Duration>) -> Option<std::time::Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What `child`, found under the name of a desired output, is to the parent of UID `parent_uid`: its
/// own when the parent is its controller, for the sync and `metahook diff` alike.
#[must_use]
pub fn output_claim(child: &DynamicObject, parent_uid: Option<&str>) -> Claim {
    if parent_uid.is_some() && controller_uid(child) == parent_uid {
        Claim::Owned
    } else {
        Claim::Ignore(Ignored::OtherController)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(name: &str, map_key: &str) -> (ObjectKey, Arc<DynamicObject>) {
        let obj = serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "n", "labels": {MAP_KEY_LABEL: map_key}}}))
        .unwrap();
        (ObjectKey { namespace: Some("n".into()), name: name.into() }, Arc::new(obj))
    }

    #[test]
    fn an_answer_naming_a_former_inputs_output_is_found_and_a_live_ones_is_not() {
        let observed = vec![ChildMap::from([output("x-keep", "old-uid"), output("y-copy", "y-uid")])];
        let wanted = |name: &str| {
            vec![ChildMap::from([(ObjectKey { namespace: Some("n".into()), name: name.into() }, json!({}))])]
        };
        let live = |k: &str| k == "y-uid" || k == "new-uid";
        let found = former_inputs_output(&wanted("x-keep"), &observed, live);
        assert_eq!(found.map(|(i, k, former)| (i, k.name.as_str(), former)), Some((0, "x-keep", "old-uid")));
        assert!(former_inputs_output(&wanted("y-copy"), &observed, live).is_none(), "a live input's: a conflict");
        assert!(former_inputs_output(&wanted("x-new"), &observed, live).is_none(), "no one's");
    }

    #[test]
    fn refused_groups_of_detached_outputs_are_counted_apart_from_inputs() {
        let both = refused((2, vec!["ConfigMap n/a: bad".into()]), (1, vec!["detached outputs of u: 500".into()]));
        assert_eq!(
            both.unwrap().to_string(),
            "1 of 2 inputs refused, nothing written for them: ConfigMap n/a: bad; \
             1 of 1 groups of detached outputs refused, left as they are: detached outputs of u: 500"
        );
        let group = refused((2, Vec::new()), (1, vec!["detached outputs of u: 500".into()])).unwrap();
        assert!(!group.to_string().contains("inputs"), "{group}");
        assert!(refused((2, Vec::new()), (0, Vec::new())).is_none());
    }
}
