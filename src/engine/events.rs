//! Kubernetes Events on the objects metahook works for: how users learn, from `kubectl describe`,
//! that a hook failed or a controller stopped.
//!
//! kube-runtime's `Recorder` folds every event with the same reason on the same object into one series
//! and keeps the *first* note, so a second, different hook error on an object would show the first
//! error's text. Here the note is part of the identity: a repeat of the same message bumps the series
//! count; a new message is a new Event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use tracing::warn;

/// A repeat within this window is counted on the existing Event instead of creating a new one.
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
const COMPONENT: &str = "metahook";

#[derive(Clone, PartialEq, Eq, Hash)]
struct Identity {
    uid: String,
    type_: &'static str,
    reason: String,
    note: String,
}

struct Recorded {
    namespace: String,
    name: String,
    count: i32,
    last: Instant,
}

/// Publishes Events as the `metahook` component. Failures to publish are logged, never propagated:
/// an Event is a courtesy, and must not turn a successful sync into a failed one.
#[derive(Clone)]
pub struct Events {
    client: Client,
    instance: String,
    recorded: Arc<Mutex<HashMap<Identity, Recorded>>>,
}

impl Events {
    #[must_use]
    pub fn new(client: Client) -> Self {
        let instance = std::env::var("POD_NAME").unwrap_or_else(|_| COMPONENT.to_owned());
        Self { client, instance, recorded: Arc::default() }
    }

    /// A Warning Event on `obj`.
    pub async fn warning(&self, obj: &ObjectReference, reason: &str, note: String) {
        self.publish(obj, "Warning", reason, note).await;
    }

    /// A Normal Event on `obj`.
    pub async fn normal(&self, obj: &ObjectReference, reason: &str, note: String) {
        self.publish(obj, "Normal", reason, note).await;
    }

    async fn publish(&self, obj: &ObjectReference, type_: &'static str, reason: &str, note: String) {
        // The API limits notes to 1 kB; hook error bodies can be longer.
        let note: String = note.chars().take(1000).collect();
        let identity = Identity { uid: obj.uid.clone().unwrap_or_default(), type_, reason: reason.to_owned(), note };
        let repeat = {
            let mut recorded = self.recorded.lock().expect("events lock");
            recorded.retain(|_, r| r.last.elapsed() < SERIES_WINDOW);
            recorded.get_mut(&identity).map(|r| {
                r.count += 1;
                r.last = Instant::now();
                (r.namespace.clone(), r.name.clone(), r.count)
            })
        };
        let result = match repeat {
            Some((namespace, name, count)) => self.bump(&namespace, &name, count).await,
            None => self.create(obj, &identity).await,
        };
        if let Err(err) = result {
            warn!(object = ?obj.name, reason, "could not record event: {err}");
        }
    }

    async fn bump(&self, namespace: &str, name: &str, count: i32) -> Result<(), kube::Error> {
        let series = EventSeries { count, last_observed_time: MicroTime(Timestamp::now()) };
        let patch = json!({"series": series});
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(drop)
    }

    async fn create(&self, obj: &ObjectReference, identity: &Identity) -> Result<(), kube::Error> {
        // Events of cluster-scoped objects live in `default`, as with client-go.
        let namespace = obj.namespace.clone().unwrap_or_else(|| "default".to_owned());
        let event = Event {
            metadata: ObjectMeta {
                // client-go's naming: `<object>.<unix nanos in hex>`.
                name: Some(format!("{}.{:x}", obj.name.as_deref().unwrap_or("object"), unix_nanos())),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            action: Some(identity.reason.clone()),
            reason: Some(identity.reason.clone()),
            note: Some(identity.note.clone()),
            type_: Some(identity.type_.to_owned()),
            regarding: Some(obj.clone()),
            reporting_controller: Some(COMPONENT.to_owned()),
            reporting_instance: Some(self.instance.clone()),
            event_time: Some(MicroTime(Timestamp::now())),
            ..Event::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let created = api.create(&PostParams::default(), &event).await?;
        let name = created.metadata.name.unwrap_or_default();
        self.recorded
            .lock()
            .expect("events lock")
            .insert(identity.clone(), Recorded { namespace, name, count: 1, last: Instant::now() });
        Ok(())
    }
}

fn unix_nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
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
        resource_version: None,
        field_path: None,
    }
}
