//! Objects whose hook answered a permanent error (`Metahook-Error: permanent`): what each was told, so
//! the error is reported once — one Event, one status condition — however often the object is synced
//! again (a resync, its own status write's echo) and the hook says the same.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

/// The last permanent error message reported per object, until a sync of it gets an answer.
#[derive(Debug)]
pub(crate) struct Held<K> {
    messages: Mutex<HashMap<K, String>>,
}

impl<K> Default for Held<K> {
    fn default() -> Self {
        Self { messages: Mutex::new(HashMap::new()) }
    }
}

impl<K: Clone + Eq + Hash> Held<K> {
    /// Records `message` for `key`; whether it is news (not what was last reported for it).
    pub fn note(&self, key: &K, message: &str) -> bool {
        let mut messages = self.messages.lock().expect("held lock");
        if messages.get(key).is_some_and(|m| m == message) {
            return false;
        }
        messages.insert(key.clone(), message.to_owned());
        true
    }

    /// The hook answered for `key`: a later permanent error is news again.
    pub fn clear(&self, key: &K) {
        self.messages.lock().expect("held lock").remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_message_is_news_once_until_an_answer_clears_it() {
        let held = Held::default();
        assert!(held.note(&"a", "spec.size must be positive"));
        assert!(!held.note(&"a", "spec.size must be positive"), "said already");
        assert!(held.note(&"b", "spec.size must be positive"), "another object");
        assert!(held.note(&"a", "spec.size is too large"), "another message");
        held.clear(&"a");
        assert!(held.note(&"a", "spec.size is too large"), "after an answer, news again");
    }
}
