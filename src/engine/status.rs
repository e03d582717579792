//! Writing what a hook says about the object itself: its status (guarded by UID, skipped when equal)
//! and the Events it asked for.

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use tracing::{Instrument as _, info_span};

use crate::engine::error::SyncError;
use crate::engine::events::{Events, reference};
use crate::hooks::HookEvent;
use crate::write::written::{self, Endpoint};

/// How an object's status is written.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StatusWrite {
    /// The type has a `/status` subresource: the status is written there.
    pub subresource: bool,
    /// The status carries `observedGeneration`, which the hub sets to the object's generation.
    pub observed_generation: bool,
}

/// Replaces `.status` (through `/status` when the type has that subresource, else with a patch of the
/// whole object, as Metacontroller updates the whole object), unless it already is `status`. Guarded
/// by UID, so a recreated object of the same name is never written. Returns the resourceVersion the
/// write left behind, if it wrote. A write is traced as a `status` span.
///
/// Without a status subresource, writing `.status` is a change of the object like any other: the API
/// server counts it in `metadata.generation`. A status that says `observedGeneration` would then say
/// the generation before its own write, the echo of the write would find it one behind and write again
/// — Metacontroller's hot loop (#68), which is why it refuses such parents. Here the status says the
/// generation this very write leaves the object at, and the write carries the resourceVersion it was
/// computed from, so a change by someone else meanwhile is a conflict (the sync is retried) rather
/// than a generation the hook never saw; the echo then finds the status as it should be, and writes
/// nothing.
pub(crate) async fn replace_status(
    api: &Api<DynamicObject>,
    obj: &DynamicObject,
    status: Value,
    how: StatusWrite,
) -> Result<Option<String>, SyncError> {
    let Some(status) = status_to_write(obj, status, how) else { return Ok(None) };
    let counted = !how.subresource && how.observed_generation;
    let span = info_span!(target: crate::TRACE_SPANS, "status", otel.status_description = tracing::field::Empty);
    let result = write_status(api, obj, status, how.subresource, counted).instrument(span.clone()).await;
    if let Err(e) = &result {
        span.record("otel.status_description", tracing::field::display(e));
    }
    result
}

/// The status [`replace_status`] writes for `status` on `obj`: `None` when `obj` has it already; without
/// a `/status` subresource, `observedGeneration` is the generation the write leaves `obj` at (see
/// there). `metahook diff` reports the status change from it.
#[must_use]
pub(crate) fn status_to_write(obj: &DynamicObject, mut status: Value, how: StatusWrite) -> Option<Value> {
    if obj.data.get("status") == Some(&status) {
        return None;
    }
    if !how.subresource
        && how.observed_generation
        && let Some(generation) = obj.metadata.generation
    {
        status["observedGeneration"] = json!(generation + 1);
    }
    Some(status)
}

async fn write_status(
    api: &Api<DynamicObject>,
    obj: &DynamicObject,
    status: Value,
    subresource: bool,
    at_version: bool,
) -> Result<Option<String>, SyncError> {
    let mut ops = vec![json!({"op": "test", "path": "/metadata/uid", "value": obj.metadata.uid})];
    if at_version {
        // A resourceVersion in the patched object is a precondition: 409 if it moved on.
        ops.push(json!({"op": "add", "path": "/metadata/resourceVersion", "value": obj.metadata.resource_version}));
    }
    ops.push(json!({"op": "add", "path": "/status", "value": status}));
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).expect("a well-formed JSON patch");
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    let patch = Patch::<()>::Json(patch);
    let endpoint = if subresource { Endpoint::Status } else { Endpoint::Object };
    match written::patch(api, name, &PatchParams::default(), &patch, endpoint).await {
        Ok(written) => Ok(written.metadata.resource_version),
        // Gone: the next event brings the new state.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(SyncError::Conflict("status")),
        // Either the UID test failed (replaced by a new object of the same name, whose own sync follows)
        // or the status itself is refused; only a fresh read tells which.
        Err(kube::Error::Api(s)) if s.code == 422 => match api.get_opt(name).await {
            Ok(Some(live)) if live.metadata.uid == obj.metadata.uid => {
                Err(SyncError::Status { causes: describe(&s), source: Box::new(kube::Error::Api(s)) })
            }
            Ok(_) => Ok(None),
            Err(e) => Err(SyncError::Write { what: "status", source: Box::new(e) }),
        },
        Err(e) => Err(SyncError::Write { what: "status", source: Box::new(e) }),
    }
}

/// An API server refusal with its causes, for messages.
fn describe(status: &kube::core::Status) -> String {
    let causes: Vec<String> = status
        .details
        .iter()
        .flat_map(|d| &d.causes)
        .map(|c| if c.field.is_empty() { c.message.clone() } else { format!("{}: {}", c.field, c.message) })
        .collect();
    if causes.is_empty() { status.message.clone() } else { format!("{} ({})", status.message, causes.join("; ")) }
}

/// The condition type that says a composite parent's hook refused it for good.
pub(crate) const HELD_CONDITION: &str = "Synced";

/// `obj`'s status with a `Synced=False` condition saying the hook's permanent error (other conditions
/// and fields kept). The hook's next answer replaces the whole status, condition included. An existing
/// `Synced=False` keeps its `lastTransitionTime`, so saying a new message is not a transition.
pub(crate) fn held_status(obj: &DynamicObject, message: &str, now: &str) -> Value {
    let mut status = match obj.data.get("status") {
        Some(Value::Object(map)) => Value::Object(map.clone()),
        _ => json!({}),
    };
    let since = status
        .get("conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(HELD_CONDITION))
        .filter(|c| c.get("status").and_then(Value::as_str) == Some("False"))
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(now));
    let mut condition = json!({
        "type": HELD_CONDITION,
        "status": "False",
        "reason": "HookPermanentError",
        "message": message,
        "lastTransitionTime": since,
    });
    if let Some(generation) = obj.metadata.generation {
        condition["observedGeneration"] = json!(generation);
    }
    let map = status.as_object_mut().expect("an object");
    let mut conditions = match map.remove("conditions") {
        Some(Value::Array(list)) => list,
        _ => Vec::new(),
    };
    conditions.retain(|c| c.get("type").and_then(Value::as_str) != Some(HELD_CONDITION));
    conditions.push(condition);
    map.insert("conditions".to_owned(), Value::Array(conditions));
    status
}

/// Records the Events a hook asked for (metahook extension), at most ten per response.
pub(crate) async fn record_hook_events(events: &Events, obj: &DynamicObject, requested: &[HookEvent]) {
    let target = reference(obj);
    for event in requested.iter().take(10) {
        if event.type_ == "Warning" {
            events.warning(&target, &event.reason, event.message.clone()).await;
        } else {
            events.normal(&target, &event.reason, event.message.clone()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent(status: &Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "x.dev/v1", "kind": "P",
            "metadata": {"name": "p", "namespace": "n", "generation": 3},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn the_held_condition_joins_the_others_and_keeps_its_transition_time() {
        let obj = parent(&json!({"ready": 2, "conditions": [{"type": "Ready", "status": "True"}]}));
        let status = held_status(&obj, "spec.size must be positive", "2026-12-02T10:00:00Z");
        assert_eq!(status["ready"], 2, "the hook's fields stay");
        let conditions = status["conditions"].as_array().unwrap();
        assert_eq!(conditions[0]["type"], "Ready");
        assert_eq!(
            conditions[1],
            json!({"type": "Synced", "status": "False", "reason": "HookPermanentError",
                   "message": "spec.size must be positive", "lastTransitionTime": "2026-12-02T10:00:00Z",
                   "observedGeneration": 3})
        );
        let again = held_status(&parent(&status), "spec.size is too large", "2026-12-02T11:00:00Z");
        let conditions = again["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 2, "replaced, not added");
        assert_eq!(conditions[1]["message"], "spec.size is too large");
        assert_eq!(conditions[1]["lastTransitionTime"], "2026-12-02T10:00:00Z", "still False since then");
    }

    #[test]
    fn a_status_is_written_only_when_it_changes_and_counts_its_own_write_without_a_subresource() {
        let obj = parent(&json!({"ready": 2, "observedGeneration": 3}));
        let counted = StatusWrite { subresource: false, observed_generation: true };
        let subresource = StatusWrite { subresource: true, observed_generation: true };
        let same = json!({"ready": 2, "observedGeneration": 3});
        assert_eq!(status_to_write(&obj, same.clone(), counted), None, "equal: no write");
        assert_eq!(status_to_write(&obj, same, subresource), None);
        let changed = json!({"ready": 3, "observedGeneration": 3});
        assert_eq!(
            status_to_write(&obj, changed.clone(), counted),
            Some(json!({"ready": 3, "observedGeneration": 4})),
            "the write itself makes generation 4"
        );
        assert_eq!(status_to_write(&obj, changed.clone(), subresource), Some(changed.clone()));
        let decorator = StatusWrite { subresource: false, observed_generation: false };
        assert_eq!(status_to_write(&obj, changed.clone(), decorator), Some(changed));
    }

    #[test]
    fn a_parent_without_status_gets_one() {
        let obj = parent(&Value::Null);
        let status = held_status(&obj, "no", "t");
        assert_eq!(status["conditions"][0]["reason"], "HookPermanentError");
    }
}
