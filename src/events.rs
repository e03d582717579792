//! Kubernetes Events on the objects metahook works for: how users learn, from `kubectl describe`,
//! that a hook failed or a controller stopped.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::DynamicObject;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::warn;

/// Publishes Events as the `metahook` component. Failures to publish are logged, never propagated:
/// an Event is a courtesy, and must not turn a successful sync into a failed one.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl Events {
    #[must_use]
    pub fn new(client: Client) -> Self {
        let reporter = Reporter { controller: "metahook".into(), instance: std::env::var("POD_NAME").ok() };
        Self { recorder: Recorder::new(client, reporter) }
    }

    /// A Warning Event on `obj`.
    pub async fn warning(&self, obj: &ObjectReference, reason: &str, note: String) {
        self.publish(obj, EventType::Warning, reason, note).await;
    }

    /// A Normal Event on `obj`.
    pub async fn normal(&self, obj: &ObjectReference, reason: &str, note: String) {
        self.publish(obj, EventType::Normal, reason, note).await;
    }

    async fn publish(&self, obj: &ObjectReference, type_: EventType, reason: &str, note: String) {
        // The API limits notes to 1 kB; hook error bodies can be longer.
        let note: String = note.chars().take(1000).collect();
        let event =
            Event { type_, reason: reason.to_owned(), note: Some(note), action: reason.to_owned(), secondary: None };
        if let Err(err) = self.recorder.publish(&event, obj).await {
            warn!(object = ?obj.name, reason, "could not record event: {err}");
        }
    }
}

/// A reference to a cached object, for Events.
#[must_use]
pub fn reference(obj: &DynamicObject) -> ObjectReference {
    let types = obj.types.clone().unwrap_or_default();
    ObjectReference {
        api_version: Some(types.api_version),
        kind: Some(types.kind),
        name: obj.metadata.name.clone(),
        namespace: obj.metadata.namespace.clone(),
        uid: obj.metadata.uid.clone(),
        resource_version: obj.metadata.resource_version.clone(),
        field_path: None,
    }
}
