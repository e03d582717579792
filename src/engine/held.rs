//! Objects whose hook answered a permanent error (`Metahook-Error: permanent`): what each was told, so
//! the error is reported once — one Event, one status condition — however often the object is synced
//! again (a resync, its own status write's echo) and the hook says the same.
//!
//! What was told belongs to the object, not to its name: a record names the object's UID, so a parent
//! deleted and created again under the same name is told again, and the record goes with the object's
//! deletion (the map does not grow with deleted parents).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

/// The last permanent error reported per object, until a sync of it gets an answer.
#[derive(Debug)]
pub(crate) struct Held<K> {
    /// Key → (UID of the object told, message it was told).
    messages: Mutex<HashMap<K, (String, String)>>,
}

impl<K> Default for Held<K> {
    fn default() -> Self {
        Self { messages: Mutex::new(HashMap::new()) }
    }
}

impl<K: Clone + Eq + Hash> Held<K> {
    /// Records `message` for the object `uid` under `key`; whether it is news (not what was last
    /// reported to that very object).
    pub fn note(&self, key: &K, uid: &str, message: &str) -> bool {
        let mut messages = self.messages.lock().expect("held lock");
        if messages.get(key).is_some_and(|(told, m)| told == uid && m == message) {
            return false;
        }
        messages.insert(key.clone(), (uid.to_owned(), message.to_owned()));
        true
    }

    /// The hook answered for `key`, or the object is gone: a later permanent error is news again.
    pub fn clear(&self, key: &K) {
        self.messages.lock().expect("held lock").remove(key);
    }

    /// How many objects are held (for tests of what deletions leave behind).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.messages.lock().expect("held lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_message_is_news_once_until_an_answer_clears_it() {
        let held = Held::default();
        assert!(held.note(&"a", "u1", "spec.size must be positive"));
        assert!(!held.note(&"a", "u1", "spec.size must be positive"), "said already");
        assert!(held.note(&"b", "u2", "spec.size must be positive"), "another object");
        assert!(held.note(&"a", "u1", "spec.size is too large"), "another message");
        held.clear(&"a");
        assert!(held.note(&"a", "u1", "spec.size is too large"), "after an answer, news again");
    }

    #[test]
    fn an_object_created_again_under_the_same_name_is_told_again() {
        let held = Held::default();
        assert!(held.note(&"ns/a", "uid-1", "spec.size must be positive"));
        assert!(held.note(&"ns/a", "uid-2", "spec.size must be positive"), "another object of that name");
        assert!(!held.note(&"ns/a", "uid-2", "spec.size must be positive"));
        held.clear(&"ns/a");
        assert_eq!(held.len(), 0, "a deleted object leaves nothing behind");
    }
}
