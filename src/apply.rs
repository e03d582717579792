//! Makes one object match its desired state with server-side apply, honouring the child update method.
//!
//! A fingerprint of what was last applied (desired-state hash + the object's UID and generation, or
//! resourceVersion for kinds without generation, Metacontroller #1177) lets a resync skip objects
//! nobody touched: no API call, no write. Any change by someone else moves generation/resourceVersion
//! and the next sync applies again, which reverts drift under `InPlace`.

use std::collections::HashMap;
use std::hash::{Hash as _, Hasher as _};
use std::sync::{Arc, Mutex};

use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions, PropagationPolicy};
use serde_json::Value;

use crate::api::UpdateMethod;
use crate::discovery::ResolvedResource;
use crate::informers::ObjectKey;

/// What applying did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Created,
    Updated,
    /// Deleted because it differed under `Recreate`; the next sync creates it again.
    Deleted,
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
}

/// Last applied fingerprint by (apiVersion, kind, namespace/name).
type AppliedCache = HashMap<(String, String, ObjectKey), Fingerprint>;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    desired: u64,
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
}

impl Applier {
    #[must_use]
    pub fn new(client: Client, field_manager: String) -> Self {
        Self { client, field_manager, applied: Arc::default(), metrics: crate::metrics::ApplyMetrics::default() }
    }

    /// Counts every apply in `metrics` (`metahook_apply_total`).
    #[must_use]
    pub fn with_metrics(self, metrics: crate::metrics::ApplyMetrics) -> Self {
        Self { metrics, ..self }
    }

    fn api(&self, resource: &ResolvedResource, namespace: Option<&str>) -> Api<DynamicObject> {
        match namespace {
            Some(ns) if resource.namespaced => Api::namespaced_with(self.client.clone(), ns, &resource.api_resource),
            _ => Api::all_with(self.client.clone(), &resource.api_resource),
        }
    }

    /// Brings `observed` (if any) to `desired`. `desired` must be a complete object with name,
    /// namespace (for namespaced kinds) and ownership already set.
    pub async fn apply(
        &self,
        resource: &ResolvedResource,
        desired: &Value,
        observed: Option<&DynamicObject>,
        method: UpdateMethod,
    ) -> Result<Applied, ApplyError> {
        let result = self.apply_unmetered(resource, desired, observed, method).await;
        let label = match &result {
            Ok(Applied::Created) => "created",
            Ok(Applied::Updated) => "updated",
            Ok(Applied::Deleted) => "deleted",
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
        let err = |source| ApplyError::Apply { kind: resource.kind().to_owned(), key: key.clone(), source };

        if let Some(observed) = observed {
            if observed.metadata.deletion_timestamp.is_some() || method == UpdateMethod::OnDelete {
                return Ok(Applied::Unchanged);
            }
            let current = fingerprint(desired_hash, observed);
            if self.applied.lock().expect("applied lock").get(&cache_key) == Some(&current) {
                return Ok(Applied::Unchanged);
            }
            if matches!(method, UpdateMethod::Recreate | UpdateMethod::RollingRecreate) {
                // Only recreate when applying would really change the object: a dry run shows the result
                // including defaults, so fields set by others or by defaulting don't trigger a delete.
                let params = self.params().dry_run();
                match api.patch(&key.name, &params, &Patch::Apply(desired)).await {
                    Ok(result) if sanitized(&result) == sanitized(observed) => {
                        self.applied.lock().expect("applied lock").insert(cache_key, current);
                        return Ok(Applied::Unchanged);
                    }
                    Ok(_) => {}
                    // The change touches immutable fields (e.g. most of a Pod's spec): it can only be
                    // had by recreating, which is exactly what this method is for.
                    Err(kube::Error::Api(status)) if status.code == 422 => {}
                    Err(e) => return Err(err(e)),
                }
                self.delete(resource, observed).await?;
                return Ok(Applied::Deleted);
            }
        }
        let result = api.patch(&key.name, &self.params(), &Patch::Apply(desired)).await.map_err(err)?;
        let outcome = match observed {
            None => Applied::Created,
            Some(o) if o.metadata.resource_version == result.metadata.resource_version => Applied::Unchanged,
            Some(_) => Applied::Updated,
        };
        self.applied.lock().expect("applied lock").insert(cache_key, fingerprint(desired_hash, &result));
        Ok(outcome)
    }

    /// Deletes `obj` in the background, only if it is still the same object (UID precondition).
    pub async fn delete(&self, resource: &ResolvedResource, obj: &DynamicObject) -> Result<(), ApplyError> {
        let key = ObjectKey::of(obj);
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: Some(Preconditions { uid: obj.metadata.uid.clone(), resource_version: None }),
            ..DeleteParams::default()
        };
        match self.api(resource, key.namespace.as_deref()).delete(&key.name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
            Err(source) => Err(ApplyError::Delete { kind: resource.kind().to_owned(), key, source }),
        }
    }

    fn params(&self) -> PatchParams {
        PatchParams::apply(&self.field_manager).force()
    }
}

fn key_of(obj: &Value) -> ObjectKey {
    let meta = &obj["metadata"];
    ObjectKey {
        namespace: meta["namespace"].as_str().map(str::to_owned),
        name: meta["name"].as_str().unwrap_or_default().to_owned(),
    }
}

fn hash(value: &Value) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.to_string().hash(&mut hasher);
    hasher.finish()
}

fn fingerprint(desired: u64, obj: &DynamicObject) -> Fingerprint {
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

    #[test]
    fn fingerprint_uses_generation_when_present_else_resource_version() {
        let mut obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "uid": "u", "resourceVersion": "7"}
        }))
        .unwrap();
        assert_eq!(fingerprint(1, &obj).version, "rv7");
        obj.metadata.generation = Some(3);
        assert_eq!(fingerprint(1, &obj).version, "g3");
    }
}
