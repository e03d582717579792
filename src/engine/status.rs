//! Writing what a hook says about the object itself: its status (guarded by UID, skipped when equal)
//! and the Events it asked for.

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use crate::engine::error::SyncError;
use crate::engine::events::{Events, reference};
use crate::hooks::HookEvent;

/// Replaces `.status` (through `/status` when the type has that subresource), unless it already is
/// `status`. Guarded by UID, so a recreated object of the same name is never written. Returns the
/// resourceVersion the write left behind, if it wrote.
pub(crate) async fn replace_status(
    api: &Api<DynamicObject>,
    obj: &DynamicObject,
    status: Value,
    subresource: bool,
) -> Result<Option<String>, SyncError> {
    if obj.data.get("status") == Some(&status) {
        return Ok(None);
    }
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/uid", "value": obj.metadata.uid},
        {"op": "add", "path": "/status", "value": status},
    ]))
    .expect("a well-formed JSON patch");
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    let patch = Patch::<()>::Json(patch);
    let written = if subresource {
        api.patch_status(name, &PatchParams::default(), &patch).await
    } else {
        api.patch(name, &PatchParams::default(), &patch).await
    };
    match written {
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
