//! The last hook request each object's answer was applied in full for, so that a sync about to send the
//! very same request again can leave the call out.
//!
//! This is the one hook call the hub saves, and it saves it only for identical work: a request is
//! identified by the hook asked (its URL: a parent a canary moves to another hook is asked again), the parent, the `finalizing` flag and every child and related object it shows, each by
//! UID and resourceVersion (the API server moves an object's resourceVersion on every change, so equal
//! versions mean equal objects). Any change a hook could see — the echo of the hub's own write included
//! — makes another request, and is asked. Such duplicates come from events that overtake a sync: a
//! change queues its parent again while the running sync already read it from the cache.
//!
//! A sync that came back by its delay (a resync, a retry, `resyncAfterSeconds`) always asks: a hook may
//! read state outside the cluster, and its resync is how it sees that change. Rolling updates always ask
//! too: their requests are built from `ControllerRevisions` as well, which the identity does not cover.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

use kube::api::DynamicObject;
use sha1::Digest as _;

use crate::hooks::ObjectMaps;

/// What identifies one hook request (a hash of the identities of everything it shows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestId([u8; 20]);

impl RequestId {
    /// A request identity of `bytes`, for tests of what keeps identities.
    #[cfg(test)]
    pub(crate) fn from_bytes(bytes: [u8; 20]) -> Self {
        Self(bytes)
    }

    /// The identity of a request to the hook at `hook` showing `parent` with these children (or
    /// attachments) and related objects, as the hook would receive it.
    #[must_use]
    pub fn of(
        hook: &str,
        parent: &DynamicObject,
        finalizing: bool,
        children: &ObjectMaps,
        related: &ObjectMaps,
    ) -> Self {
        let uid = parent.metadata.uid.as_deref().unwrap_or_default();
        let version = parent.metadata.resource_version.as_deref().unwrap_or_default();
        Self::of_version(hook, uid, version, finalizing, children, related)
    }

    /// [`RequestId::of`] for a request that shows the parent with `parent_uid` as `parent_version` says:
    /// its resourceVersion when it shows the whole parent, or [`content_version`] of what it shows when
    /// it shows only part of it (a MapController's hooks see no status).
    #[must_use]
    pub fn of_version(
        hook: &str,
        parent_uid: &str,
        parent_version: &str,
        finalizing: bool,
        children: &ObjectMaps,
        related: &ObjectMaps,
    ) -> Self {
        let mut hash = sha1::Sha1::new();
        let mut field = |text: &str| {
            hash.update(text.as_bytes());
            hash.update([0]);
        };
        field(hook);
        field(parent_uid);
        field(parent_version);
        field(if finalizing { "finalizing" } else { "syncing" });
        for (section, maps) in [("children", children), ("related", related)] {
            field(section);
            for (type_key, objects) in maps {
                field(type_key);
                for (key, object) in objects {
                    field(key);
                    field(object.0.metadata.uid.as_deref().unwrap_or_default());
                    field(object.0.metadata.resource_version.as_deref().unwrap_or_default());
                }
            }
        }
        Self(hash.finalize().into())
    }
}

/// A version of `shown` (a hash of its JSON): equal exactly when the JSON is, for an object a request
/// shows other than as the API server stores it (then its resourceVersion says nothing about it).
#[must_use]
pub fn content_version(shown: &serde_json::Value) -> String {
    let bytes = serde_json::to_vec(shown).unwrap_or_default();
    sha1::Sha1::digest(&bytes).iter().fold(String::with_capacity(40), |mut hex, b| {
        use std::fmt::Write as _;
        let _ = write!(hex, "{b:02x}");
        hex
    })
}

/// Per object: the last request its hook was asked, and whether that answer was applied in full.
pub struct Answered<K> {
    last: Mutex<HashMap<K, (RequestId, bool)>>,
}

impl<K> Default for Answered<K> {
    fn default() -> Self {
        Self { last: Mutex::default() }
    }
}

impl<K: Clone + Eq + Hash> Answered<K> {
    /// What `request` is for `key`: the last request asked (`Some(applied in full?)`), or another.
    #[must_use]
    pub fn seen(&self, key: &K, request: RequestId) -> Option<bool> {
        match self.last.lock().expect("answered lock").get(key) {
            Some((last, applied)) if *last == request => Some(*applied),
            _ => None,
        }
    }

    /// Records that `key`'s hook is being asked `request`; its answer is not applied yet.
    pub fn asked(&self, key: &K, request: RequestId) {
        self.last.lock().expect("answered lock").insert(key.clone(), (request, false));
    }

    /// Records that the answer to `key`'s last request was applied in full: every write succeeded,
    /// status and finalizer included.
    pub fn applied(&self, key: &K) {
        if let Some((_, applied)) = self.last.lock().expect("answered lock").get_mut(key) {
            *applied = true;
        }
    }

    /// Forgets an object that is gone.
    pub fn forget(&self, key: &K) {
        self.last.lock().expect("answered lock").remove(key);
    }

    /// Keeps only the objects `keep` says (what a kind that keys requests finer than by object forgets
    /// when their objects are gone).
    pub fn retain(&self, keep: impl Fn(&K) -> bool) {
        self.last.lock().expect("answered lock").retain(|key, _| keep(key));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::hooks::WireObject;

    fn object(name: &str, uid: &str, rv: &str) -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv}}))
        .unwrap()
    }

    fn maps(objects: &[(&str, &str, &str)]) -> ObjectMaps {
        let mut inner = BTreeMap::new();
        for (name, uid, rv) in objects {
            inner.insert((*name).to_owned(), WireObject(Arc::new(object(name, uid, rv))));
        }
        BTreeMap::from([("ConfigMap.v1".to_owned(), inner)])
    }

    #[test]
    fn any_version_or_object_a_hook_would_see_changes_the_request() {
        let parent = object("p", "u-p", "10");
        let children = maps(&[("a", "u-a", "11"), ("b", "u-b", "12")]);
        let id = RequestId::of("http://h/sync", &parent, false, &children, &ObjectMaps::new());
        assert_eq!(
            id,
            RequestId::of("http://h/sync", &parent, false, &children, &ObjectMaps::new()),
            "the same request"
        );
        let others = [
            RequestId::of("http://h/sync", &object("p", "u-p", "13"), false, &children, &ObjectMaps::new()),
            RequestId::of("http://h/sync", &object("p", "u-q", "10"), false, &children, &ObjectMaps::new()),
            RequestId::of("http://h/sync", &parent, true, &children, &ObjectMaps::new()),
            RequestId::of(
                "http://h/sync",
                &parent,
                false,
                &maps(&[("a", "u-a", "11"), ("b", "u-b", "14")]),
                &ObjectMaps::new(),
            ),
            RequestId::of("http://h/sync", &parent, false, &maps(&[("a", "u-a", "11")]), &ObjectMaps::new()),
            RequestId::of(
                "http://h/sync",
                &parent,
                false,
                &maps(&[("a", "u-a", "11"), ("b", "u-c", "12")]),
                &ObjectMaps::new(),
            ),
            RequestId::of("http://h/sync", &parent, false, &children, &maps(&[("r", "u-r", "1")])),
            RequestId::of("http://h/sync", &parent, false, &ObjectMaps::new(), &children),
            RequestId::of("http://h-v2/sync", &parent, false, &children, &ObjectMaps::new()),
        ];
        for (i, other) in others.iter().enumerate() {
            assert_ne!(*other, id, "case {i}");
        }
    }

    #[test]
    fn a_request_is_known_as_the_last_one_and_whether_its_answer_was_applied_in_full() {
        let answered: Answered<&str> = Answered::default();
        let id =
            RequestId::of("http://h/sync", &object("p", "u-p", "10"), false, &ObjectMaps::new(), &ObjectMaps::new());
        let next =
            RequestId::of("http://h/sync", &object("p", "u-p", "11"), false, &ObjectMaps::new(), &ObjectMaps::new());
        assert_eq!(answered.seen(&"p", id), None);
        answered.asked(&"p", id);
        assert_eq!(answered.seen(&"p", id), Some(false), "asked, its answer not applied (yet)");
        answered.applied(&"p");
        assert_eq!(answered.seen(&"p", id), Some(true));
        assert_eq!(answered.seen(&"q", id), None, "per object");
        answered.asked(&"p", next);
        assert_eq!(answered.seen(&"p", id), None, "only the last request is remembered");
        answered.forget(&"p");
        assert_eq!(answered.seen(&"p", next), None);
    }
}
