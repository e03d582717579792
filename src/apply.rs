//! Makes one object match its desired state with server-side apply, honouring the child update method.
//!
//! A fingerprint of what was last applied (desired-state hash + the object's UID and generation, or
//! resourceVersion for kinds without generation, Metacontroller #1177) lets a resync skip objects
//! nobody touched: no API call, no write. Any change by someone else moves generation/resourceVersion
//! and the next sync applies again, which reverts drift under `InPlace`.
//!
//! The fingerprints live in memory, so they also go on the objects: every apply writes the desired
//! state's hash into the `metahook.dev/applied` annotation. After a restart (an empty memory) an object
//! whose annotation matches the desired state, and that no other field manager has written since the
//! hub's last apply (the cache keeps who wrote when, from `managedFields`), is current: a restart of a
//! converged hub writes nothing. Fingerprints are dropped when their object goes away.
//!
//! Server-side apply is an upsert, so every apply carries a precondition that keeps it from writing an
//! object the hub does not own:
//! - an object the hub observed is applied with its `metadata.uid`: if it was deleted (or deleted and
//!   re-created by someone else) since, the API server refuses (409 "uid mismatch", or 422 because a
//!   UID is immutable) instead of creating or overwriting it;
//! - an object the hub did not observe is applied with `metadata.resourceVersion: "1"`. The API server
//!   ignores a resourceVersion when apply creates an object, and treats it as a precondition when the
//!   object exists; no object can be at revision 1 (etcd's first write is revision 2), so an existing
//!   object of that name is answered with 409 and left untouched. Neither field is recorded in
//!   `managedFields`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy};
use kube::core::Status;
use serde_json::Value;

use crate::api::UpdateMethod;
use crate::discovery::ResolvedResource;
use crate::informers::ObjectKey;
use crate::migrate::TakeOver;

/// The annotation that carries the hash of the desired state an object was last applied from.
pub const APPLIED_ANNOTATION: &str = "metahook.dev/applied";

/// What applying did. Writes name the resourceVersion (or, for a delete, the UID) they left behind, so
/// that their echo in the watch can be told from a change by someone else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    Created {
        version: String,
    },
    Updated {
        version: String,
    },
    /// Deleted because it differed under `Recreate`; the next sync creates it again.
    Deleted {
        uid: String,
    },
    /// Nothing to do: up to date, or left alone by `OnDelete`, or terminating.
    Unchanged,
}

/// A failed write, naming the object.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("applying {kind} {key}: {source}")]
    Apply { kind: String, key: ObjectKey, source: kube::Error },
    #[error("deleting {kind} {key}: {source}")]
    Delete { kind: String, key: ObjectKey, source: kube::Error },
    /// An object of that name exists and is not the hub's to write; it was left untouched.
    #[error("{kind} {key} already exists and is not controlled by this parent ({holder}); it was left untouched")]
    NotOurs { kind: String, key: ObjectKey, holder: String },
    /// `Recreate` would delete the child and then fail to create its replacement: the new state is
    /// refused for more than immutable fields. The child stays as it is.
    #[error("not recreating {kind} {key}: the API server refuses its new state: {source}")]
    Unrecreatable { kind: String, key: ObjectKey, source: kube::Error },
    /// The object changed identity or appeared since it was observed (our cache was behind); the sync
    /// is retried quietly with the fresh state.
    #[error("{kind} {key} changed since it was observed; retrying")]
    Stale { kind: String, key: ObjectKey },
}

impl ApplyError {
    /// Whether a quiet retry is the right answer (nothing the user must hear about).
    #[must_use]
    pub fn is_stale(&self) -> bool {
        matches!(self, Self::Stale { .. })
    }
}

/// Last applied fingerprint by (apiVersion, kind, namespace/name).
type AppliedCache = HashMap<(String, String, ObjectKey), Fingerprint>;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    desired: String,
    uid: String,
    version: String,
}

/// Applies and deletes objects; shared by every controller of a hub.
#[derive(Clone)]
pub struct Applier {
    client: Client,
    field_manager: String,
    applied: Arc<Mutex<AppliedCache>>,
    metrics: crate::metrics::ApplyMetrics,
    /// What Metacontroller wrote is taken over on the first write to it (see [`crate::migrate`]).
    take_over: Arc<TakeOver>,
}

impl Applier {
    #[must_use]
    pub fn new(client: Client, field_manager: String) -> Self {
        let take_over = Arc::new(TakeOver::new(&field_manager, vec![crate::migrate::METACONTROLLER_MANAGER.into()]));
        Self {
            client,
            field_manager,
            applied: Arc::default(),
            metrics: crate::metrics::ApplyMetrics::default(),
            take_over,
        }
    }

    /// Counts every apply in `metrics` (`metahook_apply_total`).
    #[must_use]
    pub fn with_metrics(self, metrics: crate::metrics::ApplyMetrics) -> Self {
        Self { metrics, ..self }
    }

    /// Takes over objects written by these field managers (Metacontroller's) instead of the default.
    #[must_use]
    pub fn taking_over_from(mut self, managers: Vec<String>) -> Self {
        self.take_over = Arc::new(TakeOver::new(&self.field_manager, managers));
        self
    }

    fn api(&self, resource: &ResolvedResource, namespace: Option<&str>) -> Api<DynamicObject> {
        match namespace {
            Some(ns) if resource.namespaced => Api::namespaced_with(self.client.clone(), ns, &resource.api_resource),
            _ => Api::all_with(self.client.clone(), &resource.api_resource),
        }
    }

    /// Brings `observed` (if any) to `desired`. `desired` must be a complete object with name,
    /// namespace (for namespaced kinds) and ownership already set. `observed` is the object the hub
    /// claimed as its own; `None` means "create", which never overwrites an existing object.
    pub async fn apply(
        &self,
        resource: &ResolvedResource,
        desired: &Value,
        observed: Option<&DynamicObject>,
        method: UpdateMethod,
    ) -> Result<Applied, ApplyError> {
        let result = self.apply_unmetered(resource, desired, observed, method).await;
        let label = match &result {
            Ok(Applied::Created { .. }) => "created",
            Ok(Applied::Updated { .. }) => "updated",
            Ok(Applied::Deleted { .. }) => "deleted",
            Ok(Applied::Unchanged) => "unchanged",
            Err(_) => "error",
        };
        self.metrics.record(resource.kind(), label);
        result
    }

    async fn apply_unmetered(
        &self,
        resource: &ResolvedResource,
        desired: &Value,
        observed: Option<&DynamicObject>,
        method: UpdateMethod,
    ) -> Result<Applied, ApplyError> {
        let key = key_of(desired);
        let cache_key = (resource.api_version().to_owned(), resource.kind().to_owned(), key.clone());
        let desired_hash = hash(desired);
        let api = self.api(resource, key.namespace.as_deref());
        let kind = || resource.kind().to_owned();

        let Some(observed) = observed else {
            let body = with_precondition_absent(&annotated(desired, &desired_hash));
            return match api.patch(&key.name, &self.params(), &Patch::Apply(body)).await {
                Ok(created) => {
                    let version = created.metadata.resource_version.clone().unwrap_or_default();
                    self.remember(cache_key, fingerprint(desired_hash, &created));
                    Ok(Applied::Created { version })
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    Err(self.taken(&api, resource, desired, key).await)
                }
                Err(source) => Err(ApplyError::Apply { kind: kind(), key, source }),
            };
        };
        if observed.metadata.deletion_timestamp.is_some() || method == UpdateMethod::OnDelete {
            return Ok(Applied::Unchanged);
        }
        if self.is_current(resource, desired, observed, method) {
            return Ok(Applied::Unchanged);
        }
        let body = with_precondition_uid(&annotated(desired, &desired_hash), observed);
        // What Metacontroller wrote is taken over first, once per object (see `crate::migrate`).
        let taken_over;
        let observed = match self.take_over.run_if_needed(&api, observed, &body).await {
            Ok(None) => observed,
            Ok(Some(took)) if !took.apply_needed => {
                let version = took.object.metadata.resource_version.clone().unwrap_or_default();
                self.remember(cache_key, fingerprint(desired_hash, &took.object));
                return Ok(Applied::Updated { version });
            }
            Ok(Some(took)) => {
                taken_over = took.object;
                &taken_over
            }
            Err(e) => return Err(e.into_apply_error(kind(), key)),
        };
        let current = fingerprint(desired_hash.clone(), observed);
        if matches!(method, UpdateMethod::Recreate | UpdateMethod::RollingRecreate) {
            // Only recreate when applying would really change the object: a dry run shows the result
            // including defaults, so fields set by others or by defaulting don't trigger a delete.
            match api.patch(&key.name, &self.params().dry_run(), &Patch::Apply(&body)).await {
                Ok(result) if sanitized(&result) == sanitized(observed) => {
                    self.remember(cache_key, current);
                    return Ok(Applied::Unchanged);
                }
                Ok(_) => {}
                Err(kube::Error::Api(status)) if replaced(&status) => {
                    return Err(ApplyError::Stale { kind: kind(), key });
                }
                // Immutable fields (most of a Pod's spec) can only change by recreating, which is what
                // this method is for; any other refusal means the new object is invalid.
                Err(kube::Error::Api(status)) if status.code == 422 && only_immutability(&status) => {}
                Err(kube::Error::Api(status)) if status.code == 422 => {
                    return Err(ApplyError::Unrecreatable { kind: kind(), key, source: kube::Error::Api(status) });
                }
                Err(source) => return Err(ApplyError::Apply { kind: kind(), key, source }),
            }
            // Deleting is only safe if the replacement will be accepted: ask the API server first.
            self.dry_run_create(&api, desired).await.map_err(|source| ApplyError::Unrecreatable {
                kind: kind(),
                key: key.clone(),
                source,
            })?;
            if !self.delete(resource, observed).await? {
                // Gone already: nothing was written here; the deletion's event syncs the parent again.
                return Ok(Applied::Unchanged);
            }
            return Ok(Applied::Deleted { uid: observed.metadata.uid.clone().unwrap_or_default() });
        }
        let result = match api.patch(&key.name, &self.params(), &Patch::Apply(&body)).await {
            Ok(result) => result,
            Err(kube::Error::Api(status)) if replaced(&status) => return Err(ApplyError::Stale { kind: kind(), key }),
            Err(source) => return Err(ApplyError::Apply { kind: kind(), key, source }),
        };
        let outcome = if observed.metadata.resource_version == result.metadata.resource_version {
            Applied::Unchanged
        } else {
            Applied::Updated { version: result.metadata.resource_version.clone().unwrap_or_default() }
        };
        self.remember(cache_key, fingerprint(desired_hash, &result));
        Ok(outcome)
    }

    /// Whether applying `desired` over `observed` is known to change nothing, so no request is needed:
    /// the child is left alone by its method, or was applied from this very desired state and nobody
    /// changed it since.
    #[must_use]
    pub fn is_current(
        &self,
        resource: &ResolvedResource,
        desired: &Value,
        observed: &DynamicObject,
        method: UpdateMethod,
    ) -> bool {
        if observed.metadata.deletion_timestamp.is_some() || method == UpdateMethod::OnDelete {
            return true;
        }
        let cache_key = (resource.api_version().to_owned(), resource.kind().to_owned(), key_of(desired));
        let current = fingerprint(hash(desired), observed);
        let mut applied = self.applied.lock().expect("applied lock");
        match applied.get(&cache_key) {
            Some(remembered) => *remembered == current,
            // Nothing in memory (a restart): the object itself says what it was applied from, and its
            // managedFields whether anyone else wrote it since.
            None if self.applied_and_untouched(observed, &current.desired) => {
                applied.insert(cache_key, current);
                true
            }
            None => false,
        }
    }

    /// Whether `observed` carries `desired_hash` in its applied annotation and no other field manager
    /// wrote its main resource after the hub's last apply (equal times count as after: the API server
    /// stores seconds).
    fn applied_and_untouched(&self, observed: &DynamicObject, desired_hash: &str) -> bool {
        let annotation = observed.metadata.annotations.as_ref().and_then(|a| a.get(APPLIED_ANNOTATION));
        if annotation.map(String::as_str) != Some(desired_hash) {
            return false;
        }
        let entries = observed.metadata.managed_fields.as_deref().unwrap_or_default();
        let main = |e: &&k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry| {
            e.subresource.as_deref().unwrap_or_default().is_empty()
        };
        let ours = |e: &&k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry| {
            e.manager.as_deref() == Some(self.field_manager.as_str()) && e.operation.as_deref() == Some("Apply")
        };
        let Some(our_time) = entries.iter().filter(main).filter(ours).find_map(|e| e.time.as_ref()) else {
            return false;
        };
        entries.iter().filter(main).filter(|e| !ours(e)).all(|e| e.time.as_ref().is_some_and(|t| t.0 < our_time.0))
    }

    /// Forgets what was applied to an object that is gone.
    pub fn forget(&self, resource: &ResolvedResource, key: &ObjectKey) {
        let cache_key = (resource.api_version().to_owned(), resource.kind().to_owned(), key.clone());
        self.applied.lock().expect("applied lock").remove(&cache_key);
    }

    fn remember(&self, key: (String, String, ObjectKey), fingerprint: Fingerprint) {
        self.applied.lock().expect("applied lock").insert(key, fingerprint);
    }

    /// Explains a refused create: the name belongs to someone else, or to this very parent and the
    /// cache has not seen it yet (then a quiet retry).
    async fn taken(
        &self,
        api: &Api<DynamicObject>,
        resource: &ResolvedResource,
        desired: &Value,
        key: ObjectKey,
    ) -> ApplyError {
        let kind = resource.kind().to_owned();
        let ours = desired
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .and_then(|refs| refs.iter().find(|r| r.get("controller") == Some(&Value::Bool(true))))
            .and_then(|r| r.get("uid"))
            .and_then(Value::as_str);
        match api.get_opt(&key.name).await {
            Ok(Some(existing)) if crate::informers::controller_uid(&existing) == ours => {
                ApplyError::Stale { kind, key }
            }
            Ok(Some(existing)) => ApplyError::NotOurs { kind, key, holder: holder(&existing) },
            Ok(None) => ApplyError::Stale { kind, key },
            Err(source) => ApplyError::Apply { kind, key, source },
        }
    }

    /// Whether the API server would accept `desired` as a new object (under a generated name, so the
    /// existing one is not in the way).
    async fn dry_run_create(&self, api: &Api<DynamicObject>, desired: &Value) -> Result<(), kube::Error> {
        let mut candidate = desired.clone();
        if let Some(meta) = candidate.get_mut("metadata").and_then(Value::as_object_mut) {
            let name = meta.remove("name").and_then(|n| n.as_str().map(str::to_owned)).unwrap_or_default();
            meta.insert("generateName".into(), Value::String(format!("{name}-")));
        }
        let candidate: DynamicObject = serde_json::from_value(candidate).map_err(kube::Error::SerdeError)?;
        let params = PostParams { dry_run: true, field_manager: Some(self.field_manager.clone()) };
        api.create(&params, &candidate).await.map(drop)
    }

    /// Deletes `obj` in the background, only if it is still the same object (UID precondition). `Ok(false)`:
    /// it was gone or replaced already, so this call deleted nothing (and no echo of it will come).
    pub async fn delete(&self, resource: &ResolvedResource, obj: &DynamicObject) -> Result<bool, ApplyError> {
        let key = ObjectKey::of(obj);
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: Some(Preconditions { uid: obj.metadata.uid.clone(), resource_version: None }),
            ..DeleteParams::default()
        };
        match self.api(resource, key.namespace.as_deref()).delete(&key.name, &params).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(false),
            Err(source) => Err(ApplyError::Delete { kind: resource.kind().to_owned(), key, source }),
        }
    }

    fn params(&self) -> PatchParams {
        PatchParams::apply(&self.field_manager).force()
    }
}

/// `desired` with `metadata.uid` of the object it replaces: apply then only writes that very object.
fn with_precondition_uid(desired: &Value, observed: &DynamicObject) -> Value {
    let mut body = desired.clone();
    if let (Some(meta), Some(uid)) = (body.get_mut("metadata").and_then(Value::as_object_mut), &observed.metadata.uid) {
        meta.insert("uid".into(), Value::String(uid.clone()));
    }
    body
}

/// `desired` with a resourceVersion no stored object has: apply then only creates (see the module doc).
fn with_precondition_absent(desired: &Value) -> Value {
    let mut body = desired.clone();
    if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String("1".into()));
    }
    body
}

/// Whether a refused apply means "not the object we observed any more": gone (409 uid mismatch) or
/// replaced by another object of the same name (422 on the immutable `metadata.uid`).
fn replaced(status: &Status) -> bool {
    let uid_cause = || {
        status.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid"))
            || status.message.contains("metadata.uid")
    };
    (status.code == 409 && status.message.contains("uid mismatch")) || (status.code == 422 && uid_cause())
}

/// Whether every cause of a 422 is a refusal to change an immutable field (as opposed to an invalid
/// value, which recreating would not cure).
fn only_immutability(status: &Status) -> bool {
    let immutable = |reason: &str, message: &str| reason == "FieldValueForbidden" || message.contains("immutable");
    match status.details.as_ref().map(|d| &d.causes) {
        Some(causes) if !causes.is_empty() => causes.iter().all(|c| immutable(&c.reason, &c.message)),
        _ => status.message.contains("immutable"),
    }
}

/// Who holds an object, for messages: its controller, or "no controller".
pub(crate) fn holder(obj: &DynamicObject) -> String {
    obj.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map_or_else(|| "it has no controller".to_owned(), |r| format!("controlled by {} {}", r.kind, r.name))
}

fn key_of(obj: &Value) -> ObjectKey {
    let meta = &obj["metadata"];
    ObjectKey {
        namespace: meta["namespace"].as_str().map(str::to_owned),
        name: meta["name"].as_str().unwrap_or_default().to_owned(),
    }
}

/// A stable hash of a desired state (SHA-1 of its canonical JSON, 16 bytes in hex): the same across
/// processes and versions of the hub, as the annotation that carries it must be.
fn hash(value: &Value) -> String {
    use sha1::Digest as _;
    let digest = sha1::Sha1::digest(crate::revisions::canonical_json(value).as_bytes());
    digest.iter().take(16).fold(String::with_capacity(32), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    })
}

/// `desired` with its hash in the applied annotation.
fn annotated(desired: &Value, desired_hash: &str) -> Value {
    let mut body = desired.clone();
    if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta.entry("annotations").or_insert_with(|| Value::Object(serde_json::Map::new()));
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.insert(APPLIED_ANNOTATION.into(), Value::String(desired_hash.to_owned()));
        }
    }
    body
}

fn fingerprint(desired: String, obj: &DynamicObject) -> Fingerprint {
    let version = match obj.metadata.generation {
        Some(g) if g > 0 => format!("g{g}"),
        _ => format!("rv{}", obj.metadata.resource_version.as_deref().unwrap_or_default()),
    };
    Fingerprint { desired, uid: obj.metadata.uid.clone().unwrap_or_default(), version }
}

/// The parts of an object a desired state can change: everything but server bookkeeping and status.
fn sanitized(obj: &DynamicObject) -> Value {
    let mut value = serde_json::to_value(obj).unwrap_or(Value::Null);
    if let Some(map) = value.as_object_mut() {
        map.remove("status");
        if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in ["resourceVersion", "managedFields", "generation", "creationTimestamp", "selfLink"] {
                meta.remove(field);
            }
            // The cache drops the last-applied copies (see informers::prepare), and the applied hash says
            // nothing about the object itself; a dry run's result has them all.
            if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
                annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
                annotations.remove("metacontroller.k8s.io/last-applied-configuration");
                annotations.remove(APPLIED_ANNOTATION);
                if annotations.is_empty() {
                    meta.remove("annotations");
                }
            }
        }
    }
    value
}

/// Removes what a hook must not set on a desired object (server-owned metadata and status).
#[must_use]
pub fn strip_server_fields(mut desired: Value) -> Value {
    if let Some(map) = desired.as_object_mut() {
        map.remove("status");
        if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in [
                "uid",
                "resourceVersion",
                "generation",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
                "selfLink",
            ] {
                meta.remove(field);
            }
            if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
                annotations.remove("metacontroller.k8s.io/last-applied-configuration");
            }
        }
    }
    desired
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_fields_and_status_are_stripped_from_desired_objects() {
        let desired = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "uid": "u", "resourceVersion": "5", "labels": {"x": "y"},
                         "annotations": {"metacontroller.k8s.io/last-applied-configuration": "{}", "keep": "me"}},
            "data": {"k": "v"}, "status": {"phase": "x"}
        });
        let clean = strip_server_fields(desired);
        assert_eq!(
            clean["metadata"],
            serde_json::json!({"name": "a", "labels": {"x": "y"}, "annotations": {"keep": "me"}})
        );
        assert!(clean.get("status").is_none());
        assert_eq!(clean["data"]["k"], "v");
    }

    fn status(code: u16, message: &str, causes: &[(&str, &str, &str)]) -> Status {
        serde_json::from_value(serde_json::json!({
            "code": code, "message": message,
            "details": {"causes": causes.iter().map(|(reason, message, field)|
                serde_json::json!({"reason": reason, "message": message, "field": field})).collect::<Vec<_>>()}
        }))
        .unwrap()
    }

    #[test]
    fn only_refusals_of_immutable_fields_allow_a_recreate() {
        let pod = status(
            422,
            "Pod \"p\" is invalid",
            &[(
                "FieldValueForbidden",
                "Forbidden: pod updates may not change fields other than `spec.containers[*].image`",
                "spec",
            )],
        );
        assert!(only_immutability(&pod));
        let job = status(422, "Job is invalid", &[("FieldValueInvalid", "field is immutable", "spec.template")]);
        assert!(only_immutability(&job));
        let invalid = status(
            422,
            "Pod is invalid",
            &[
                ("FieldValueForbidden", "Forbidden: pod updates may not change fields", "spec"),
                (
                    "FieldValueInvalid",
                    "Invalid value: \"Bad_Name\": a lowercase RFC 1123 label",
                    "spec.containers[0].name",
                ),
            ],
        );
        assert!(!only_immutability(&invalid), "an invalid value would make the new object fail to create");
        assert!(!only_immutability(&status(422, "the server rejected our request", &[])));
    }

    #[test]
    fn uid_refusals_mean_the_object_was_replaced_or_is_gone() {
        let gone = status(
            409,
            "Operation cannot be fulfilled on configmaps \"a\": uid mismatch: the provided object specified uid u, and no existing object was found",
            &[],
        );
        assert!(replaced(&gone));
        let other =
            status(422, "ConfigMap \"a\" is invalid", &[("FieldValueInvalid", "field is immutable", "metadata.uid")]);
        assert!(replaced(&other));
        assert!(!replaced(&status(409, "Apply failed with 1 conflict", &[])));
        assert!(!replaced(&status(422, "invalid", &[("FieldValueInvalid", "bad", "data")])));
    }

    #[test]
    fn preconditions_go_into_the_applied_body_only() {
        let desired = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}});
        assert_eq!(with_precondition_absent(&desired)["metadata"]["resourceVersion"], "1");
        let observed: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "uid": "u-1"}
        }))
        .unwrap();
        assert_eq!(with_precondition_uid(&desired, &observed)["metadata"]["uid"], "u-1");
        assert!(desired["metadata"].get("uid").is_none(), "the desired state itself (and its hash) is unchanged");
    }

    #[test]
    fn fingerprint_uses_generation_when_present_else_resource_version() {
        let mut obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "uid": "u", "resourceVersion": "7"}
        }))
        .unwrap();
        assert_eq!(fingerprint("h".into(), &obj).version, "rv7");
        obj.metadata.generation = Some(3);
        assert_eq!(fingerprint("h".into(), &obj).version, "g3");
    }
}
