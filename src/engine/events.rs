//! Kubernetes Events on the objects metahook works for: how users learn, from `kubectl describe`,
//! that a hook failed or a controller stopped.
//!
//! kube-runtime's `Recorder` folds every event with the same reason on the same object into one series
//! and keeps the *first* note, so a second, different hook error on an object would show the first
//! error's text. Here the note is part of the identity: a repeat of the same message bumps the series
//! count; a new message is a new Event.
//!
//! With a [`Limit`] (Metacontroller's `--events-qps`/`--events-burst`, `eventsQPS`/`eventsBurst`), each
//! object has a token bucket, as Metacontroller's event correlator gives it (client-go's spam filter):
//! every Event about the object, a repeat too, takes a token, and one that finds none is dropped.

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
use tracing::{debug, warn};

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

/// At most `burst` Events about one object at once, refilled at `qps` per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limit {
    pub qps: f64,
    pub burst: u32,
}

/// One token bucket per object.
struct Buckets {
    limit: Limit,
    by_object: HashMap<String, Bucket>,
    /// The map is pruned of full buckets when it grows past this (then twice what was left).
    prune_at: usize,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Buckets {
    const MIN_PRUNE_AT: usize = 1024;

    fn new(limit: Limit) -> Self {
        Self { limit, by_object: HashMap::new(), prune_at: Self::MIN_PRUNE_AT }
    }

    /// Takes a token for an Event about `object` at `now`, if there is one.
    fn allow(&mut self, object: &str, now: Instant) -> bool {
        let Limit { qps, burst } = self.limit;
        let burst = f64::from(burst);
        let refilled = |b: &Bucket| (b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * qps).min(burst);
        if self.by_object.len() >= self.prune_at {
            // A full bucket is what a new one would be: forgetting it changes nothing.
            self.by_object.retain(|_, b| refilled(b) < burst);
            self.prune_at = (self.by_object.len() * 2).max(Self::MIN_PRUNE_AT);
        }
        let bucket = self.by_object.entry(object.to_owned()).or_insert(Bucket { tokens: burst, at: now });
        bucket.tokens = refilled(bucket);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Publishes Events as the `metahook` component. Failures to publish are logged, never propagated:
/// an Event is a courtesy, and must not turn a successful sync into a failed one.
#[derive(Clone)]
pub struct Events {
    client: Client,
    instance: String,
    recorded: Arc<Mutex<HashMap<Identity, Recorded>>>,
    buckets: Option<Arc<Mutex<Buckets>>>,
}

impl Events {
    #[must_use]
    pub fn new(client: Client) -> Self {
        let instance = std::env::var("POD_NAME").unwrap_or_else(|_| COMPONENT.to_owned());
        Self { client, instance, recorded: Arc::default(), buckets: None }
    }

    /// These Events, at most as many per object as `limit` lets through (`None`: all).
    #[must_use]
    pub fn limited(mut self, limit: Option<Limit>) -> Self {
        self.buckets = limit.map(|limit| Arc::new(Mutex::new(Buckets::new(limit))));
        self
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
        if let Some(buckets) = &self.buckets {
            let object = obj.uid.clone().unwrap_or_else(|| {
                let part = |p: &Option<String>| p.clone().unwrap_or_default();
                format!("{}/{}/{}/{}", part(&obj.api_version), part(&obj.kind), part(&obj.namespace), part(&obj.name))
            });
            if !buckets.lock().expect("events lock").allow(&object, Instant::now()) {
                debug!(object = ?obj.name, reason, "event dropped: over the per-object limit (eventsQPS, eventsBurst)");
                return;
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_object_gets_its_burst_then_one_event_per_refill() {
        // Metacontroller's defaults: 25 at once, then one per 5 minutes.
        let mut buckets = Buckets::new(Limit { qps: 1.0 / 300.0, burst: 25 });
        let start = Instant::now();
        for i in 0..25 {
            assert!(buckets.allow("a", start), "event {i} of the burst");
        }
        assert!(!buckets.allow("a", start), "the 26th at once is dropped");
        assert!(buckets.allow("b", start), "another object has its own bucket");
        assert!(!buckets.allow("a", start + Duration::from_secs(299)), "not refilled before 5 minutes");
        assert!(buckets.allow("a", start + Duration::from_secs(300)), "one token after 5 minutes");
        assert!(!buckets.allow("a", start + Duration::from_secs(301)));
        // Refilling stops at the burst.
        let later = start + Duration::from_secs(100 * 300);
        let allowed = (0..30).filter(|_| buckets.allow("a", later)).count();
        assert_eq!(allowed, 25);
    }

    #[test]
    fn full_buckets_are_forgotten_and_partial_ones_kept() {
        let mut buckets = Buckets::new(Limit { qps: 1.0, burst: 2 });
        let start = Instant::now();
        for i in 0..Buckets::MIN_PRUNE_AT - 1 {
            assert!(buckets.allow(&i.to_string(), start));
        }
        assert!(buckets.allow("0", start) && !buckets.allow("0", start), "object 0 spent its burst");
        // Two seconds on, every bucket is full again; object 0 spends one of its two.
        let later = start + Duration::from_secs(2);
        assert!(buckets.allow("0", later));
        assert!(buckets.allow("new", later));
        assert_eq!(buckets.by_object.len(), Buckets::MIN_PRUNE_AT);
        assert!(buckets.allow("newer", later), "the map is pruned before this one goes in");
        assert_eq!(buckets.by_object.len(), 3, "only the buckets that are not full are left, and the new one");
        assert!(buckets.allow("0", later) && !buckets.allow("0", later), "object 0 kept what it had spent");
    }
}
