//! The ETag cache of one hook (Metacontroller's `webhook.etag`): the last 200 answer per object, sent
//! back as `If-None-Match`, so a hook whose answer would not change can reply `304 Not Modified` (or
//! `412`) with no body and the hub reuses the cached one.
//!
//! Keyed by the object the hook is called for (kind, namespace, name), as in Metacontroller. Entries
//! expire after `cacheTimeoutSeconds` (never when unset or not positive); every `cacheCleanupSeconds`
//! (not at all when unset) a store also drops expired entries. An expired entry is never sent, swept
//! or not.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;

use crate::api::EtagConfig;

/// The object a call is about: kind, namespace, name of the request's root object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RootKey {
    kind: String,
    namespace: String,
    name: String,
}

impl RootKey {
    /// The key of a request's root object (`parent`, or `object` for decorators).
    #[must_use]
    pub fn of(object: &Value) -> Self {
        let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str).unwrap_or_default().to_owned();
        Self { kind: text("/kind"), namespace: text("/metadata/namespace"), name: text("/metadata/name") }
    }

    /// The key of an object of `kind` (`namespace` empty for a cluster-scoped one).
    #[must_use]
    pub fn new(kind: &str, namespace: &str, name: &str) -> Self {
        Self { kind: kind.to_owned(), namespace: namespace.to_owned(), name: name.to_owned() }
    }
}

struct Entry {
    etag: String,
    body: Bytes,
    stored: Instant,
}

struct Entries {
    by_object: HashMap<RootKey, Entry>,
    swept: Instant,
}

/// One hook's cached answers.
pub struct EtagCache {
    /// How long an entry is valid; `None` = until replaced.
    ttl: Option<Duration>,
    /// How often a store sweeps expired entries out; `None` = never.
    cleanup: Option<Duration>,
    entries: Mutex<Entries>,
}

impl std::fmt::Debug for EtagCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtagCache").field("ttl", &self.ttl).field("cleanup", &self.cleanup).finish_non_exhaustive()
    }
}

fn positive_seconds(seconds: Option<i32>) -> Option<Duration> {
    seconds.and_then(|s| u64::try_from(s).ok()).filter(|s| *s > 0).map(Duration::from_secs)
}

impl EtagCache {
    /// The cache `config` asks for, `None` unless `enabled: true`.
    #[must_use]
    pub fn new(config: Option<&EtagConfig>) -> Option<Self> {
        let config = config.filter(|c| c.enabled == Some(true))?;
        let entries = Entries { by_object: HashMap::new(), swept: Instant::now() };
        Some(Self {
            ttl: positive_seconds(config.cache_timeout_seconds),
            cleanup: positive_seconds(config.cache_cleanup_seconds),
            entries: Mutex::new(entries),
        })
    }

    /// The ETag to send as `If-None-Match` for `key`, if an unexpired answer is cached.
    #[must_use]
    pub fn tag(&self, key: &RootKey) -> Option<String> {
        self.tag_at(key, Instant::now())
    }

    /// The cached body for `key` if it still carries `etag` (the tag the request was sent with).
    #[must_use]
    pub fn body(&self, key: &RootKey, etag: &str) -> Option<Bytes> {
        let entries = self.entries.lock().expect("etag cache lock");
        entries.by_object.get(key).filter(|e| e.etag == etag).map(|e| e.body.clone())
    }

    /// Remembers a 200 answer that came with an `ETag`.
    pub fn store(&self, key: RootKey, etag: String, body: Bytes) {
        self.store_at(key, etag, body, Instant::now());
    }

    fn tag_at(&self, key: &RootKey, now: Instant) -> Option<String> {
        let mut entries = self.entries.lock().expect("etag cache lock");
        let entry = entries.by_object.get(key)?;
        if self.expired(entry, now) {
            entries.by_object.remove(key);
            return None;
        }
        Some(entry.etag.clone())
    }

    fn store_at(&self, key: RootKey, etag: String, body: Bytes, now: Instant) {
        let mut entries = self.entries.lock().expect("etag cache lock");
        if let Some(every) = self.cleanup
            && now.duration_since(entries.swept) >= every
        {
            entries.swept = now;
            entries.by_object.retain(|_, e| !self.expired(e, now));
        }
        entries.by_object.insert(key, Entry { etag, body, stored: now });
    }

    fn expired(&self, entry: &Entry, now: Instant) -> bool {
        self.ttl.is_some_and(|ttl| now.duration_since(entry.stored) >= ttl)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().unwrap().by_object.len()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn config(timeout: Option<i32>, cleanup: Option<i32>) -> EtagConfig {
        EtagConfig { enabled: Some(true), cache_timeout_seconds: timeout, cache_cleanup_seconds: cleanup }
    }

    fn key(name: &str) -> RootKey {
        RootKey::of(&json!({"kind": "Thing", "metadata": {"namespace": "ns", "name": name}}))
    }

    #[test]
    fn only_enabled_configs_make_a_cache() {
        assert!(EtagCache::new(None).is_none());
        let off = EtagConfig { enabled: Some(false), cache_timeout_seconds: None, cache_cleanup_seconds: None };
        assert!(EtagCache::new(Some(&off)).is_none());
        assert!(EtagCache::new(Some(&config(None, None))).is_some());
    }

    #[test]
    fn answers_are_cached_per_object_and_returned_only_for_their_tag() {
        let cache = EtagCache::new(Some(&config(None, None))).unwrap();
        assert_eq!(cache.tag(&key("a")), None);
        cache.store(key("a"), "\"v1\"".into(), Bytes::from_static(b"{}"));
        assert_eq!(cache.tag(&key("a")).as_deref(), Some("\"v1\""));
        assert_eq!(cache.tag(&key("b")), None);
        assert_eq!(cache.body(&key("a"), "\"v1\""), Some(Bytes::from_static(b"{}")));
        assert_eq!(cache.body(&key("a"), "\"v0\""), None);
        assert_ne!(key("a"), RootKey::of(&json!({"kind": "Other", "metadata": {"namespace": "ns", "name": "a"}})));
    }

    #[test]
    fn entries_expire_after_the_timeout_and_are_swept_every_cleanup_interval() {
        let cache = EtagCache::new(Some(&config(Some(10), Some(60)))).unwrap();
        let start = Instant::now();
        cache.store_at(key("a"), "t".into(), Bytes::new(), start);
        assert!(cache.tag_at(&key("a"), start + Duration::from_secs(9)).is_some());
        cache.store_at(key("b"), "t".into(), Bytes::new(), start);
        // Expired entries are not sent, and a store after the cleanup interval drops them.
        assert!(cache.tag_at(&key("a"), start + Duration::from_secs(10)).is_none());
        cache.store_at(key("c"), "t".into(), Bytes::new(), start + Duration::from_secs(30));
        assert_eq!(cache.len(), 2, "b is expired but not swept before the cleanup interval");
        cache.store_at(key("d"), "t".into(), Bytes::new(), start + Duration::from_secs(61));
        assert_eq!(cache.len(), 1, "the sweep kept only the new entry");
    }

    #[test]
    fn without_a_timeout_entries_live_until_replaced() {
        let cache = EtagCache::new(Some(&config(Some(0), Some(1)))).unwrap();
        let start = Instant::now();
        cache.store_at(key("a"), "t1".into(), Bytes::new(), start);
        assert!(cache.tag_at(&key("a"), start + Duration::from_secs(86_400)).is_some());
        cache.store_at(key("a"), "t2".into(), Bytes::new(), start + Duration::from_secs(86_401));
        assert_eq!(cache.tag_at(&key("a"), start + Duration::from_secs(86_402)).as_deref(), Some("t2"));
    }
}
