//! Syncs on demand (Metacontroller #43): setting the annotation `metahook.dev/sync-requested-at` (any
//! new value, conventionally a timestamp) on a parent or target syncs it at once, even under
//! `ignoreStatusChanges`, and a `SyncRequested` Event says when that sync finished. On a
//! CompositeController or DecoratorController the same annotation syncs every object it manages,
//! without restarting it.
//!
//! A hook that depends on state outside the cluster can so be re-run by whoever changes that state,
//! instead of polling with `resyncPeriodSeconds`.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

use kube::api::DynamicObject;

/// The annotation that requests a sync.
pub const SYNC_REQUESTED_AT: &str = "metahook.dev/sync-requested-at";

/// The value of the sync request annotation on an object's metadata, if any.
#[must_use]
pub fn requested_at(meta: &kube::api::ObjectMeta) -> Option<&str> {
    meta.annotations.as_ref().and_then(|a| a.get(SYNC_REQUESTED_AT)).map(String::as_str)
}

/// Requests seen on objects whose requested sync has not succeeded yet, by queue key.
pub struct SyncRequests<K> {
    pending: Mutex<HashMap<K, String>>,
}

impl<K> Default for SyncRequests<K> {
    fn default() -> Self {
        Self { pending: Mutex::default() }
    }
}

impl<K: Eq + Hash + Clone> SyncRequests<K> {
    /// Whether the change `old` → `new` is a new request (the annotation appeared or changed): the caller
    /// then queues the object whatever its other filters say. Objects seen for the first time (a list
    /// after a restart) carry no new request.
    pub fn observe(&self, key: &K, old: Option<&DynamicObject>, new: &DynamicObject) -> bool {
        let Some(old) = old else { return false };
        let requested = requested_at(&new.metadata);
        if requested.is_none() || requested == requested_at(&old.metadata) {
            return false;
        }
        let value = requested.unwrap_or_default().to_owned();
        self.pending.lock().expect("sync requests lock").insert(key.clone(), value);
        true
    }

    /// The request a successful sync of `key` has answered, if one was pending.
    pub fn take(&self, key: &K) -> Option<String> {
        self.pending.lock().expect("sync requests lock").remove(key)
    }

    /// Forgets a deleted object's request.
    pub fn forget(&self, key: &K) {
        self.pending.lock().expect("sync requests lock").remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(annotation: Option<&str>, rv: &str) -> DynamicObject {
        let mut meta = serde_json::json!({"name": "p", "resourceVersion": rv});
        if let Some(value) = annotation {
            meta["annotations"] = serde_json::json!({SYNC_REQUESTED_AT: value});
        }
        serde_json::from_value(serde_json::json!({"apiVersion": "v1", "kind": "X", "metadata": meta})).unwrap()
    }

    #[test]
    fn a_new_or_changed_annotation_is_a_request_until_a_sync_answers_it() {
        let requests = SyncRequests::default();
        let (none, first, second) = (object(None, "1"), object(Some("t1"), "2"), object(Some("t2"), "3"));
        assert!(!requests.observe(&"p", None, &first), "first sight (after a restart) is not a request");
        assert!(requests.observe(&"p", Some(&none), &first));
        assert!(!requests.observe(&"p", Some(&first), &object(Some("t1"), "4")), "same value: no new request");
        assert!(requests.observe(&"p", Some(&first), &second));
        assert_eq!(requests.take(&"p").as_deref(), Some("t2"));
        assert_eq!(requests.take(&"p"), None);
        assert!(!requests.observe(&"p", Some(&second), &none), "removing the annotation requests nothing");
    }
}
