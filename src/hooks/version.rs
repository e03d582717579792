//! The versions a hook reports of itself: the `Metahook-Hook-Version` response header.
//!
//! A hook's next version answers for every parent at once, but a level-triggered hub only asks it again
//! when something changes or a resync period ends (Metacontroller #1050): until then the cluster shows
//! what the old version asked for. A hook that names its version in each answer lets the hub notice a
//! new one and ask again about every parent (the engine's `rollout` paces that). Without the header
//! nothing here happens, as in Metacontroller.
//!
//! What counts is a change of the version parents should be answered by (the *newest*): a version not
//! reported before, or one reported before that answers again after the newest has answered nothing
//! for [`RETURN_AFTER`] — a rollback, the most important rollout of all. While a rolling update of the
//! hook's Deployment answers some calls with the old version and some with the new, the new one keeps
//! answering, so each version starts one round, not one per flip. Each object's last answering version
//! is kept, so the engine can tell which parents were last answered by an older version (a round that
//! met an old replica) and how far the newest version has got.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::etag::RootKey;

/// The response header a hook names its version in.
pub const HOOK_VERSION_HEADER: &str = "metahook-hook-version";

/// The longest version taken; a longer header is ignored (it goes into the controller's status).
const MAX_VERSION_LEN: usize = 128;

/// How long the newest version must have answered nothing before a version reported before takes over
/// again (a rollback). Shorter than the gaps between a rolling update's answers of the new version
/// would ever be while it serves, as long as calls come at all: on a quiet cluster the hub's probe
/// (`hookVersionProbeInterval`) is the only call, and an old replica it meets starts a round, which the
/// next probe that meets the new version undoes — paced rounds, and the answers end where the hook does.
pub const RETURN_AFTER: Duration = Duration::from_secs(5);

/// The versions one controller's hooks reported; clones share them.
#[derive(Clone, Debug)]
pub struct HookVersions {
    state: Arc<Mutex<State>>,
    /// Counts the versions reported for the first time (the first one included).
    rounds: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct State {
    seen: BTreeSet<String>,
    /// The version parents should be answered by: the one reported last for the first time, or the one
    /// that took over again after the newest fell silent.
    newest: Option<String>,
    /// When the newest version last answered.
    newest_answered: Option<Instant>,
    /// Each object's last answering version.
    by_object: HashMap<RootKey, String>,
}

impl Default for HookVersions {
    fn default() -> Self {
        Self { state: Arc::default(), rounds: watch::Sender::new(0) }
    }
}

impl HookVersions {
    /// Records that `version` answered for `object`. Returns whether it starts a round: a version not
    /// reported before, after some other version was (the first version a hub sees needs none, since
    /// every parent is synced when a controller starts anyway), or one reported before that answers
    /// after the newest has been silent for [`RETURN_AFTER`] (a rollback).
    #[must_use = "whether a round starts, worth a log line"]
    pub fn observe(&self, object: RootKey, version: &str) -> bool {
        self.observe_at(object, version, Instant::now())
    }

    /// [`HookVersions::observe`] at `now`.
    fn observe_at(&self, object: RootKey, version: &str, now: Instant) -> bool {
        let version = version.trim();
        if version.is_empty() || version.len() > MAX_VERSION_LEN {
            return false;
        }
        let mut state = self.state.lock().expect("hook versions lock");
        if state.by_object.get(&object).is_none_or(|v| v != version) {
            state.by_object.insert(object, version.to_owned());
        }
        if state.newest.as_deref() == Some(version) {
            state.newest_answered = Some(now);
            return false;
        }
        let returning = state.seen.contains(version);
        let silent = state.newest_answered.is_none_or(|at| now.saturating_duration_since(at) >= RETURN_AFTER);
        if returning && !silent {
            return false;
        }
        state.seen.insert(version.to_owned());
        let first = state.newest.replace(version.to_owned()).is_none();
        state.newest_answered = Some(now);
        drop(state);
        self.rounds.send_modify(|n| *n += 1);
        !first
    }

    /// Forgets what answered for `object` (it is gone).
    pub fn forget(&self, object: &RootKey) {
        self.state.lock().expect("hook versions lock").by_object.remove(object);
    }

    /// Forgets what answered for every object but those `keep` says are still there.
    pub fn retain(&self, keep: impl Fn(&RootKey) -> bool) {
        self.state.lock().expect("hook versions lock").by_object.retain(|object, _| keep(object));
    }

    /// The version parents should be answered by, once any was reported.
    #[must_use]
    pub fn newest(&self) -> Option<String> {
        self.state.lock().expect("hook versions lock").newest.clone()
    }

    /// Whether `object`'s last answer came from the newest version (`false` when it has had none that
    /// named a version).
    #[must_use]
    pub fn is_current(&self, object: &RootKey) -> bool {
        let state = self.state.lock().expect("hook versions lock");
        state.newest.as_ref().is_some_and(|newest| state.by_object.get(object) == Some(newest))
    }

    /// Wakes on every version reported for the first time, the first one included (which starts no
    /// round: see [`HookVersions::observe`]).
    #[must_use]
    pub fn rounds(&self) -> watch::Receiver<u64> {
        self.rounds.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> RootKey {
        RootKey::new("Thing", "ns", name)
    }

    #[test]
    fn the_first_version_starts_no_round_and_each_new_one_starts_one() {
        let versions = HookVersions::default();
        let rounds = versions.rounds();
        assert!(!versions.observe(key("a"), "v1"), "the first version seen");
        assert!(!versions.observe(key("b"), "v1"));
        assert_eq!((*rounds.borrow(), versions.newest().as_deref()), (1, Some("v1")));
        assert!(versions.observe(key("a"), "v2"));
        assert_eq!((*rounds.borrow(), versions.newest().as_deref()), (2, Some("v2")));
        // An old replica answering during the hook's rolling update starts nothing more.
        assert!(!versions.observe(key("b"), "v1"));
        assert!(!versions.observe(key("a"), "v2"));
        assert_eq!(*rounds.borrow(), 2);
        assert!(versions.is_current(&key("a")) && !versions.is_current(&key("b")));
        assert!(versions.observe(key("b"), "v3"));
        assert_eq!(*rounds.borrow(), 3);
    }

    #[test]
    fn a_version_reported_before_takes_over_again_once_the_newest_fell_silent() {
        let versions = HookVersions::default();
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        assert!(!versions.observe_at(key("a"), "v1", at(0)));
        assert!(versions.observe_at(key("a"), "v2", at(1)));
        // The rolling update's old replica, while v2 answers too: no round.
        assert!(!versions.observe_at(key("b"), "v1", at(2)));
        assert!(!versions.observe_at(key("a"), "v2", at(3)));
        assert!(!versions.observe_at(key("b"), "v1", at(3 + RETURN_AFTER.as_secs() - 1)));
        assert_eq!(versions.newest().as_deref(), Some("v2"));
        // Rolled back: v2 silent for RETURN_AFTER, v1 answers: a round, v1 the newest again.
        assert!(versions.observe_at(key("b"), "v1", at(3 + RETURN_AFTER.as_secs())));
        assert_eq!(versions.newest().as_deref(), Some("v1"));
        assert!(versions.is_current(&key("b")) && !versions.is_current(&key("a")));
        assert!(!versions.observe_at(key("a"), "v1", at(20)));
        // And forward again the same way.
        assert!(versions.observe_at(key("a"), "v2", at(40)));
        assert_eq!(*versions.rounds().borrow(), 4);
    }

    #[test]
    fn empty_and_overlong_versions_are_ignored() {
        let versions = HookVersions::default();
        assert!(!versions.observe(key("a"), "  "));
        assert!(!versions.observe(key("a"), &"x".repeat(MAX_VERSION_LEN + 1)));
        assert_eq!(versions.newest(), None);
        assert!(!versions.is_current(&key("a")));
        assert!(!versions.observe(key("a"), " v1 "));
        assert_eq!(versions.newest().as_deref(), Some("v1"));
        versions.forget(&key("a"));
        assert!(!versions.is_current(&key("a")));
        assert!(!versions.observe(key("b"), "v1"));
        versions.retain(|k| *k != key("b"));
        assert!(!versions.is_current(&key("b")));
    }
}
