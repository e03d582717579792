//! One running DecoratorController: for every object of its target types that matches its selectors,
//! the hook's labels and annotations are merged in, its status replaced, and its attachments managed.
//! The engine ([`crate::engine::sync`]) does the sync; this module says what is a decorator's own: which
//! objects are its targets and attachments, and how its hook is asked ([`Ask`]).
//!
//! Attachments are owned by their target (controller ownerRef) and marked with the
//! `metacontroller.k8s.io/decorator-controller` annotation; only objects carrying both count as observed,
//! so two decorators of one target never see (or delete) each other's attachments.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::api::{DecoratorController, DecoratorResourceRule, UpdateMethod, labels_of};
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::{Informer, ObjectKey, PARENT_ANNOTATION, PARENT_UID_LABEL};
use crate::cache::selector::{Selector, SelectorError};
use crate::cache::shard::Role;
use crate::engine::error::{StartError, SyncError};
use crate::engine::hub::Hub;
use crate::engine::sync::{
    Call, Core, CoreSettings, Decision, Kind, Observation, Observed, child_types, controller_hooks,
};
use crate::engine::worker::resync_after;
use crate::hooks::{ControllerHooks, DecoratorRequest, DecoratorResponse, Endpoint};
use crate::write::children::{ChildMap, ChildRole, ChildRules, ChildType, Claim, Ignored, desired_children};

pub use crate::api::DECORATOR_ANNOTATION;

/// Whether `obj` is one of `controller`'s attachments of the target whose UID is `target_uid`: controlled by
/// the target and marked with the controller's annotation. The engine and `metahook render` both use it.
#[must_use]
pub fn is_attachment_of(obj: &DynamicObject, target_uid: &str, controller: &str) -> bool {
    crate::cache::informers::controller_uid(obj) == Some(target_uid)
        && obj.metadata.annotations.as_ref().and_then(|a| a.get(DECORATOR_ANNOTATION)).map(String::as_str)
            == Some(controller)
}

/// How a DecoratorController asks its hook: the one way the engine, `metahook render` and
/// `metahook migrate --dry-run` all build the request, call the hook and judge its answer.
pub struct Ask<'a> {
    /// The controller object's name (the annotation its attachments carry).
    pub name: &'a str,
    /// The controller object as hooks receive it (`request.controller`).
    pub controller: &'a Value,
    pub attachment_resources: &'a [Arc<ResolvedResource>],
}

impl Ask<'_> {
    /// Asks `endpoint` about `target` (of type `resource`) and validates the answer whole.
    pub async fn ask(
        &self,
        endpoint: &Endpoint,
        target: &DynamicObject,
        resource: &ResolvedResource,
        observed: impl Into<Observed<'_>>,
    ) -> Result<(Answer, DecoratorResponse), SyncError> {
        let observed = observed.into();
        let object = crate::hooks::for_hooks(target);
        let request = DecoratorRequest {
            controller: self.controller,
            object: &object,
            attachments: observed.children,
            related: observed.related,
            finalizing: observed.finalizing,
        };
        let response = endpoint.decorator(&request).await?;
        let answer = validate_response(self.name, self.attachment_resources, target, resource, &response)?;
        Ok((answer, response))
    }
}

/// A decorator hook's answer, validated whole: nothing is written unless all of it is acceptable.
#[derive(Debug)]
pub struct Answer {
    /// Desired attachments by declared type, annotated with the controller's name and owned by the target.
    pub desired: Vec<ChildMap<Value>>,
    /// The status to write; `None` leaves the target's status alone.
    pub status: Option<Value>,
    /// Labels and annotations to merge into the target; `None` when it has them already.
    pub metadata_patch: Option<Value>,
}

/// Validates a decorator sync/finalize response for `target`.
pub fn validate_response(
    controller: &str,
    attachment_resources: &[Arc<ResolvedResource>],
    target: &DynamicObject,
    resource: &ResolvedResource,
    response: &DecoratorResponse,
) -> Result<Answer, SyncError> {
    let annotations = BTreeMap::from([(DECORATOR_ANNOTATION.to_owned(), controller.to_owned())]);
    let rules = ChildRules {
        default_labels: None,
        annotations: Some(&annotations),
        selector: None,
        cross_namespace: &[],
        role: ChildRole::Attachment,
    };
    let desired = desired_children(attachment_resources, target, resource, &response.attachments, rules)
        .map_err(SyncError::InvalidResponse)?;
    let status = match &response.status {
        None | Some(Value::Null) => None,
        Some(Value::Object(map)) => Some(Value::Object(map.clone())),
        Some(other) => return Err(SyncError::InvalidResponse(format!("status must be an object, got {other}"))),
    };
    let metadata_patch =
        metadata_patch(target, &response.labels, &response.annotations).map_err(SyncError::InvalidResponse)?;
    Ok(Answer { desired, status, metadata_patch })
}

impl Answer {
    /// What the engine writes for this answer (`response`: the hook's, for resync, finalized, Events).
    pub(crate) fn into_decision(self, response: DecoratorResponse) -> Decision<()> {
        let Self { desired, status, metadata_patch } = self;
        let resync = resync_after(response.resync_after_seconds);
        Decision::whole(desired, status, metadata_patch, resync, response.finalized, response.events)
    }
}

/// The attachments of `target` (of type `resource`) by declared type, from the attachment types'
/// caches: what [`is_attachment_of`] says is `controller`'s, in the target's namespace when it has one.
/// A decorator adopts nothing. The engine's observe phase and `metahook diff` both read them so.
#[must_use]
pub fn attachments(
    types: &[ChildType],
    target: &DynamicObject,
    resource: &ResolvedResource,
    controller: &str,
) -> Vec<ChildMap<Arc<DynamicObject>>> {
    let uid = target.metadata.uid.as_deref().unwrap_or_default();
    types
        .iter()
        .map(|attachment| {
            attachment
                .informer
                .controlled_by(uid)
                .into_iter()
                .filter(|obj| !resource.namespaced || obj.metadata.namespace == target.metadata.namespace)
                .filter(|obj| is_attachment_of(obj, uid, controller))
                .map(|obj| (ObjectKey::of(&obj), obj))
                .collect()
        })
        .collect()
}

/// Finalizer a DecoratorController puts on its targets when it has a finalize hook.
#[must_use]
pub fn finalizer_name(controller: &str) -> String {
    format!("metacontroller.io/decoratorcontroller-{controller}")
}

/// A target object: its type (index into the controller's distinct target types) and namespace/name.
///
/// Keyed by object, not by rule: two `resources[]` rules of one type that both select an object must
/// not sync it twice at once (nor let one rule finalize what the other still selects).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TargetKey {
    pub target_type: usize,
    pub key: ObjectKey,
}

/// A target's flow is its namespace (or, cluster-scoped, itself): fair service across namespaces.
impl crate::engine::queue::Flowing for TargetKey {
    fn flow(&self) -> &str {
        self.key.flow()
    }
}

impl fmt::Display for TargetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.key)
    }
}

/// One `resources[]` rule's selectors, compiled: which objects of its type are targets. The engine and
/// `metahook diff` both select targets with it.
pub struct Rule {
    labels: Selector,
    annotations: Selector,
    ignore_status_changes: bool,
}

impl Rule {
    /// Compiles `rule`'s label and annotation selectors (absent: everything).
    pub fn new(rule: &DecoratorResourceRule) -> Result<Self, SelectorError> {
        Ok(Self {
            labels: rule.label_selector.as_ref().map(Selector::from_label_selector).transpose()?.unwrap_or_default(),
            annotations: rule
                .annotation_selector
                .as_ref()
                .map(|a| Selector::from_label_selector(&a.as_label_selector()))
                .transpose()?
                .unwrap_or_default(),
            ignore_status_changes: rule.ignore_status_changes == Some(true),
        })
    }

    /// Whether both selectors match `obj`.
    #[must_use]
    pub fn selects(&self, obj: &DynamicObject) -> bool {
        self.labels.matches(&labels_of(&obj.metadata))
            && self.annotations.matches(&obj.metadata.annotations.clone().unwrap_or_default())
    }
}

/// The update method of an attachment type: decorators have no revisions, so rolling methods act like
/// their non-rolling forms (as in Metacontroller).
#[must_use]
pub fn attachment_method(method: UpdateMethod) -> UpdateMethod {
    match method {
        UpdateMethod::RollingRecreate => UpdateMethod::Recreate,
        UpdateMethod::RollingInPlace => UpdateMethod::InPlace,
        other => other,
    }
}

/// One target type with every rule that names it.
struct Target {
    informer: Informer,
    rules: Vec<Rule>,
}

impl Target {
    /// Selected = any rule of the type matches.
    fn selects(&self, obj: &DynamicObject) -> bool {
        self.rules.iter().any(|r| r.selects(obj))
    }

    /// Whether status-only changes of `obj` are ignored: every rule that selects it says so (or, when
    /// none selects it, every rule of the type).
    fn ignores_status_changes(&self, obj: &DynamicObject) -> bool {
        let selecting: Vec<&Rule> = self.rules.iter().filter(|r| r.selects(obj)).collect();
        let relevant = if selecting.is_empty() { self.rules.iter().collect() } else { selecting };
        relevant.iter().all(|r| r.ignore_status_changes)
    }
}

/// A DecoratorController whose types are resolved and whose caches are synced.
pub struct Controller {
    core: Core<TargetKey>,
    dc: Arc<DecoratorController>,
    dc_json: Value,
    targets: Vec<Target>,
    /// The hooks, ready to call (the engine's related objects hold the `customize` one).
    endpoints: ControllerHooks,
}

impl Controller {
    /// What whoever may create a target can make the customize hook read through the hub (`None`: no
    /// customize hook).
    #[must_use]
    pub fn related_reach(&self) -> Option<crate::engine::related::Reach> {
        let hooks = &self.dc.spec.hooks;
        hooks.customize.as_ref()?;
        let version = crate::engine::related::related_version(hooks.sync.as_ref(), hooks.finalize.as_ref());
        let namespaced = self.targets.iter().any(|t| t.informer.resource().namespaced);
        Some(crate::engine::related::Reach::of(version, namespaced, self.dc.spec.related_limit.as_ref()))
    }

    /// Resolves target and attachment types and waits for their caches.
    pub async fn start(hub: &Hub, dc: Arc<DecoratorController>) -> Result<Arc<Self>, StartError> {
        let spec = &dc.spec;
        let name = dc.metadata.name.clone().unwrap_or_default();
        let hooks = &spec.hooks;
        let each = [hooks.sync.as_ref(), hooks.finalize.as_ref(), hooks.customize.as_ref()];
        let endpoints = controller_hooks(hub, "DecoratorController", &name, Some(each), &spec.endpoint_configs)?;
        let mut targets: Vec<Target> = Vec::new();
        for rule in &spec.resources {
            let resource = hub
                .discovery
                .resolve(&rule.api_version, &rule.resource)
                .await
                .map_err(|source| StartError::NotFound { role: "target", source })?;
            crate::engine::sync::within_namespaces(hub, "target", &resource)?;
            let compiled = Rule::new(rule)?;
            match targets.iter_mut().find(|t| *t.informer.resource() == resource) {
                Some(target) => target.rules.push(compiled),
                None => {
                    targets
                        .push(Target { informer: hub.informers.get(&resource, Role::Parent), rules: vec![compiled] });
                }
            }
        }
        if spec.attachments.iter().any(crate::api::ChildResourceRule::cross_namespace) {
            return Err(StartError::CrossNamespace(
                "crossNamespace is for a CompositeController's children, not a DecoratorController's attachments"
                    .into(),
            ));
        }
        let attachments = child_types(hub, &spec.attachments, "attachment", attachment_method).await?;
        for informer in targets.iter().map(|t| &t.informer).chain(attachments.iter().map(|a| &a.informer)) {
            informer.wait_synced(hub.settings.cache_sync_timeout).await?;
        }
        let dc_json = serde_json::to_value(&*dc).unwrap_or(Value::Null);
        let core = Core::new(
            hub,
            CoreSettings {
                kind: "DecoratorController",
                finalizer: finalizer_name(&name),
                name,
                annotations: dc.metadata.annotations.as_ref(),
                children: attachments,
                customize: endpoints.customize.clone(),
                controller: dc_json.clone(),
                sync_hook: dc.spec.hooks.sync.clone(),
                endpoint_configs: dc.spec.endpoint_configs.clone(),
                records: None,
                related_limit: dc.spec.related_limit.clone(),
            },
        )
        .map_err(StartError::Annotation)?;
        Ok(Arc::new(Self { core, dc, dc_json, targets, endpoints }))
    }

    /// Runs watches-to-queue mapping and the workers, and follows the hook's versions
    /// ([`crate::engine::rollout`]) and its canary ([`crate::engine::canary`]), until `cancel` fires.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let versions = crate::engine::rollout::run(Arc::clone(&self), cancel.clone());
        let canary = crate::engine::canary::run(Arc::clone(&self), cancel.clone());
        tokio::join!(crate::engine::sync::run(self, cancel), versions, canary);
    }

    /// Queues every selected target now (a sync requested on the controller object); returns how many.
    pub fn resync_all(&self) -> usize {
        crate::engine::sync::resync_all(self)
    }

    /// Takes the settings of the controller object's annotations (`metahook.dev/sync-on-own-writes`, the
    /// safe-delete guard) from now on, live; an invalid value is refused and the settings stay as they were.
    pub fn configure(&self, annotations: Option<&std::collections::BTreeMap<String, String>>) -> Result<(), String> {
        self.core.configure(annotations)
    }

    fn ask(&self) -> Ask<'_> {
        Ask { name: &self.core.name, controller: &self.dc_json, attachment_resources: &self.core.child_resources }
    }

    /// Whether an attachment carries this controller's annotation.
    fn is_ours(&self, obj: &DynamicObject) -> bool {
        obj.metadata.annotations.as_ref().and_then(|a| a.get(DECORATOR_ANNOTATION)) == Some(&self.core.name)
    }
}

impl Kind for Controller {
    type Key = TargetKey;
    type Before = ();
    type Claimed = ();
    const OBJECT: &'static str = "target";
    const STATUS_IS_THE_HOOKS: bool = false;
    const SETS_OBSERVED_GENERATION: bool = false;

    fn core(&self) -> &Core<TargetKey> {
        &self.core
    }

    fn object_informers(&self) -> Vec<&Informer> {
        self.targets.iter().map(|t| &t.informer).collect()
    }

    fn key_of(&self, target_type: usize, obj: &DynamicObject) -> TargetKey {
        TargetKey { target_type, key: ObjectKey::of(obj) }
    }

    fn type_of(&self, key: &TargetKey) -> usize {
        key.target_type
    }

    fn object(&self, key: &TargetKey) -> Option<(Arc<DynamicObject>, Arc<ResolvedResource>)> {
        let informer = &self.targets.get(key.target_type)?.informer;
        informer.get(&key.key).map(|target| (target, Arc::clone(informer.resource())))
    }

    fn contains(&self, key: &TargetKey) -> bool {
        self.targets.get(key.target_type).is_some_and(|t| t.informer.contains(&key.key))
    }

    fn holds(&self, key: &TargetKey, version: &str) -> bool {
        self.targets.get(key.target_type).is_some_and(|t| t.informer.holds(&key.key, version))
    }

    fn selects(&self, target_type: usize, obj: &DynamicObject) -> bool {
        self.targets[target_type].selects(obj)
    }

    fn ignores_status_changes(&self, target_type: usize, obj: &DynamicObject) -> bool {
        self.targets[target_type].ignores_status_changes(obj)
    }

    /// The target an attachment of ours belongs to, if it is still there with the same UID.
    fn owners(&self, attachment: &DynamicObject, _: bool) -> Vec<TargetKey> {
        let Some(owner) = attachment.metadata.owner_references.iter().flatten().find(|r| r.controller == Some(true))
        else {
            return Vec::new();
        };
        if !self.is_ours(attachment) {
            return Vec::new();
        }
        self.targets
            .iter()
            .enumerate()
            .find_map(|(target_type, target)| {
                let resource = target.informer.resource();
                if resource.kind() != owner.kind || resource.api_version() != owner.api_version {
                    return None;
                }
                let namespace = if resource.namespaced { attachment.metadata.namespace.clone() } else { None };
                let key = ObjectKey { namespace, name: owner.name.clone() };
                target
                    .informer
                    .get(&key)
                    .filter(|t| t.metadata.uid.as_deref() == Some(owner.uid.as_str()))
                    .map(|_| TargetKey { target_type, key })
            })
            .into_iter()
            .collect()
    }

    fn hook(&self, finalizing: bool) -> Option<&Endpoint> {
        if finalizing { self.endpoints.finalize.as_ref() } else { self.endpoints.sync.as_ref() }
    }

    fn hook_versions(&self) -> &crate::hooks::HookVersions {
        &self.endpoints.versions
    }

    fn has_finalize_hook(&self) -> bool {
        self.dc.spec.hooks.finalize.is_some()
    }

    fn resync_period_seconds(&self) -> Option<i32> {
        self.dc.spec.resync_period_seconds
    }

    /// Attachments of `target` that are ours: controlled by it and carrying our annotation. A decorator
    /// adopts nothing.
    async fn observe(
        &self,
        target: &DynamicObject,
        resource: &ResolvedResource,
    ) -> Result<Option<Observation<()>>, SyncError> {
        let observed = attachments(&self.core.children, target, resource, &self.core.name);
        Ok(Some((observed, ())))
    }

    async fn decide(
        &self,
        target: &DynamicObject,
        resource: &ResolvedResource,
        call: Call<'_>,
        (): &(),
    ) -> Result<Decision<()>, SyncError> {
        let (answer, response) = self.ask().ask(call.endpoint, target, resource, call).await?;
        Ok(answer.into_decision(response))
    }

    fn whose(&self, target: &DynamicObject, child: &DynamicObject) -> Claim {
        attachment_claim(child, target.metadata.uid.as_deref().unwrap_or_default(), &self.core.name)
    }
}

/// What `obj`, found under the name of a desired attachment, is to the target of UID `target_uid`:
/// [`is_attachment_of`]'s answer as a claim, for the sync and `metahook diff` alike.
#[must_use]
pub fn attachment_claim(obj: &DynamicObject, target_uid: &str, controller: &str) -> Claim {
    if is_attachment_of(obj, target_uid, controller) { Claim::Owned } else { Claim::Ignore(Ignored::OtherController) }
}

/// A merge patch for the labels and annotations the hook wants changed (`None` = delete), or `None`
/// when the object already has them: no write for a no-op. The patch names the object's UID, so it is
/// refused rather than applied to a new object of the same name. New values must be valid labels and
/// annotations, or the whole response is refused.
fn metadata_patch(
    obj: &DynamicObject,
    labels: &BTreeMap<String, Option<String>>,
    annotations: &BTreeMap<String, Option<String>>,
) -> Result<Option<Value>, String> {
    fn changes(
        current: Option<&BTreeMap<String, String>>,
        wanted: &BTreeMap<String, Option<String>>,
    ) -> Map<String, Value> {
        wanted
            .iter()
            .filter(|(k, v)| current.and_then(|c| c.get(*k)) != v.as_ref())
            .map(|(k, v)| (k.clone(), v.clone().map_or(Value::Null, Value::String)))
            .collect()
    }
    let set = |wanted: &BTreeMap<String, Option<String>>| -> Value {
        wanted.iter().filter_map(|(k, v)| v.clone().map(|v| (k.clone(), Value::String(v)))).collect()
    };
    let proposed: Map<String, Value> =
        [("labels".to_owned(), set(labels)), ("annotations".to_owned(), set(annotations))].into_iter().collect();
    crate::api::validation::check_metadata_maps(&proposed)?;
    // The parent marks say whose child an object is: a decorator setting (or clearing) them would make
    // its target some composite parent's child, which that parent's sync then deletes.
    if labels.contains_key(PARENT_UID_LABEL) {
        return Err(format!("the label {PARENT_UID_LABEL} is the hub's to set (it makes an object a parent's child)"));
    }
    if annotations.contains_key(PARENT_ANNOTATION) {
        return Err(format!("the annotation {PARENT_ANNOTATION} is the hub's to set (it names an object's parent)"));
    }
    let labels = changes(obj.metadata.labels.as_ref(), labels);
    let annotations = changes(obj.metadata.annotations.as_ref(), annotations);
    if labels.is_empty() && annotations.is_empty() {
        return Ok(None);
    }
    let mut meta = Map::new();
    meta.insert("uid".into(), json!(obj.metadata.uid));
    if !labels.is_empty() {
        meta.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        meta.insert("annotations".into(), Value::Object(annotations));
    }
    Ok(Some(json!({ "metadata": meta })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(labels: &Value, annotations: &Value) -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "labels": labels, "annotations": annotations}}))
        .unwrap()
    }

    #[test]
    fn metadata_patch_sets_changes_deletes_with_null_and_skips_no_ops() {
        let obj = object(&json!({"keep": "1", "same": "v", "gone": "x"}), &json!({}));
        let labels = BTreeMap::from([
            ("same".to_owned(), Some("v".to_owned())),
            ("new".to_owned(), Some("n".to_owned())),
            ("gone".to_owned(), None),
            ("never-there".to_owned(), None),
        ]);
        let patch = metadata_patch(&obj, &labels, &BTreeMap::new()).unwrap().unwrap();
        assert_eq!(patch, json!({"metadata": {"uid": null, "labels": {"new": "n", "gone": null}}}));
    }

    #[test]
    fn metadata_patch_is_none_when_nothing_changes() {
        let obj = object(&json!({"a": "1"}), &json!({"b": "2"}));
        let labels = BTreeMap::from([("a".to_owned(), Some("1".to_owned()))]);
        let annotations = BTreeMap::from([("b".to_owned(), Some("2".to_owned())), ("c".to_owned(), None)]);
        assert_eq!(metadata_patch(&obj, &labels, &annotations), Ok(None));
    }

    #[test]
    fn a_decorator_may_not_set_or_clear_the_parent_marks() {
        let obj = object(&json!({}), &json!({}));
        for value in [Some("u-1".to_owned()), None] {
            let labels = BTreeMap::from([(PARENT_UID_LABEL.to_owned(), value.clone())]);
            assert!(metadata_patch(&obj, &labels, &BTreeMap::new()).unwrap_err().contains(PARENT_UID_LABEL));
            let annotations = BTreeMap::from([(PARENT_ANNOTATION.to_owned(), value)]);
            assert!(metadata_patch(&obj, &BTreeMap::new(), &annotations).unwrap_err().contains(PARENT_ANNOTATION));
        }
    }

    #[test]
    fn metadata_patch_refuses_invalid_label_values() {
        let obj = object(&json!({}), &json!({}));
        let labels = BTreeMap::from([("app".to_owned(), Some("not a valid value".to_owned()))]);
        assert!(metadata_patch(&obj, &labels, &BTreeMap::new()).unwrap_err().contains("invalid value"));
    }
}
