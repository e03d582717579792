//! The echo of the hub's own writes: telling it from changes made by others.
//!
//! Every write of a sync (a child created, updated or deleted, the parent's status) comes back through
//! the watch. client-go's controllers keep "expectations" of their own writes; here a sync records the
//! resourceVersion (or, for a delete, the UID) each of its writes left behind, and an event that carries
//! exactly that version is known to be the echo. Anything else — another version, an event of an
//! object nobody here wrote, a relist after the watch expired — is a change by someone else.
//!
//! An echo still changes what the hook observes (a status that counts its children must see the
//! children it just asked for), so by default it syncs its parent, as Metacontroller does, and the queue
//! only marks the sync as one for an echo ([`crate::engine::queue::Reason::Echo`]). A controller annotated
//! [`SYNC_ON_OWN_WRITES_ANNOTATION`]` = "false"` declares that its hook's answer depends on the parent
//! alone: then the echoes of its creates, updates and status writes queue nothing. The echo of a delete
//! always does: after `Recreate` deleted a child, the next sync must create it again.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

use crate::cache::informers::ObjectKey;

/// Annotation on a CompositeController or DecoratorController: `"false"` says the hook's answer depends
/// only on the parent, so the echoes of the hub's own creates, updates and status writes need no sync.
pub const SYNC_ON_OWN_WRITES_ANNOTATION: &str = "metahook.dev/sync-on-own-writes";

/// Which write an echo comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Echo {
    /// A child (or attachment) the sync created or updated.
    Write,
    /// A child the sync deleted (no longer desired, or to be recreated).
    Delete,
    /// The parent's own status, labels, annotations or finalizers.
    Parent,
}

impl Echo {
    /// The echo of a child write that left `version` behind ([`crate::write::children::deleted_version`] for
    /// a delete).
    #[must_use]
    pub fn of_child(version: &str) -> Self {
        if version.starts_with(crate::write::children::DELETED_PREFIX) { Self::Delete } else { Self::Write }
    }
}

/// Which echoes sync their parent, from the controller's [`SYNC_ON_OWN_WRITES_ANNOTATION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EchoPolicy {
    /// Whether echoes of creates, updates and status writes sync (the default, as Metacontroller).
    own_writes: bool,
}

impl Default for EchoPolicy {
    fn default() -> Self {
        Self { own_writes: true }
    }
}

impl EchoPolicy {
    /// The policy a controller's annotations ask for; a value other than `"true"` or `"false"` is refused.
    pub fn from_annotations(annotations: Option<&std::collections::BTreeMap<String, String>>) -> Result<Self, String> {
        match annotations.and_then(|a| a.get(SYNC_ON_OWN_WRITES_ANNOTATION)).map(|v| v.trim()) {
            None | Some("true") => Ok(Self::default()),
            Some("false") => Ok(Self { own_writes: false }),
            Some(other) => Err(format!("{SYNC_ON_OWN_WRITES_ANNOTATION}: {other:?} is neither \"true\" nor \"false\"")),
        }
    }

    /// Whether an echo of this kind syncs its parent.
    #[must_use]
    pub fn syncs(self, echo: Echo) -> bool {
        self.own_writes || echo == Echo::Delete
    }
}

/// Watched type of a write: a child type's index, or a synced type's (the parent type is 0; a
/// DecoratorController's target types are numbered in order, so two targets of one name and different
/// types keep apart records).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Watched {
    Child(usize),
    Object(usize),
}

/// What is recorded of the writes of one object whose echo has not come.
struct Record<K> {
    /// The versions the writes left behind, oldest first.
    versions: Vec<String>,
    /// The parent whose sync wrote them.
    parent: K,
    /// A digest of what the last of them said, if it was settled with [`Echoes::settle_saying`].
    said: Option<u64>,
}

/// (type, object) → what is recorded of its writes.
type Written<K> = HashMap<(Watched, ObjectKey), Record<K>>;

/// Writes in flight: (type, object) → (parent whose sync writes it, versions seen meanwhile).
type InFlight<K> = HashMap<(Watched, ObjectKey), (K, Vec<String>)>;

/// What one controller's syncs wrote and have not seen come back yet.
///
/// A write's echo may arrive before the write's own response does, so a write is announced before it is
/// sent ([`Echoes::begin`]): events of that object are held until the write is settled
/// ([`Echoes::finish`]), which tells which of them were its echo and which someone else's change.
///
/// For a write whose content a sync may want to recognise (the parent's status), the record also keeps a
/// digest of what the last write said ([`Echoes::settle_saying`]): it goes with the record.
pub struct Echoes<K> {
    written: Mutex<Written<K>>,
    pending: Mutex<InFlight<K>>,
}

impl<K: Clone + Eq + Hash> Default for Echoes<K> {
    fn default() -> Self {
        Self { written: Mutex::default(), pending: Mutex::default() }
    }
}

impl<K: Clone + Eq + Hash> Echoes<K> {
    /// Announces that `parent`'s sync is about to write `object`.
    pub fn begin(&self, parent: &K, watched: Watched, object: &ObjectKey) {
        self.pending.lock().expect("echoes lock").insert((watched, object.clone()), (parent.clone(), Vec::new()));
    }

    /// Settles a write announced with [`Echoes::begin`]: `version` is what it left behind (`None` if it
    /// failed or wrote nothing). Says whether its echo already came, and whether changes by others came.
    pub fn finish(&self, watched: Watched, object: &ObjectKey, version: Option<&str>) -> Settled<K> {
        let held = self.pending.lock().expect("echoes lock").remove(&(watched, object.clone()));
        let Some((parent, seen)) = held else { return Settled::default() };
        let echoed = version.is_some_and(|v| seen.iter().any(|s| s == v));
        let foreign = seen.iter().any(|s| Some(s.as_str()) != version);
        if let (Some(v), false) = (version, echoed) {
            self.wrote(&parent, watched, object.clone(), v.to_owned());
        } else if version.is_some()
            && let Some(record) = self.written.lock().expect("echoes lock").get_mut(&(watched, object.clone()))
        {
            // Seen already, this write; an earlier one's record must not say what the last write said.
            record.said = None;
        }
        Settled { echo: echoed.then(|| parent.clone()), foreign: foreign.then_some(parent) }
    }

    /// [`Echoes::finish`] for a write that said `digest`: while it is unseen,
    /// [`Echoes::unseen_saying`] gives the digest back.
    pub fn settle_saying(
        &self,
        watched: Watched,
        object: &ObjectKey,
        version: Option<&str>,
        digest: u64,
    ) -> Settled<K> {
        let settled = self.finish(watched, object, version);
        if let (Some(v), Some(record)) =
            (version, self.written.lock().expect("echoes lock").get_mut(&(watched, object.clone())))
            && record.versions.last().map(String::as_str) == Some(v)
        {
            record.said = Some(digest);
        }
        settled
    }

    /// What the last write of `object` said, if it is unseen (the cache shows `object` from before it)
    /// and was settled with [`Echoes::settle_saying`].
    #[must_use]
    pub fn unseen_saying(&self, watched: Watched, object: &ObjectKey) -> Option<u64> {
        self.written.lock().expect("echoes lock").get(&(watched, object.clone()))?.said
    }

    /// What an event of `object` at `version` is: the echo of a recorded write (with the parent that
    /// wrote it), held because a write of it is in flight, or a change by someone else.
    pub fn classify(&self, watched: Watched, object: &ObjectKey, version: &str) -> Seen<K> {
        if let Some((_, seen)) = self.pending.lock().expect("echoes lock").get_mut(&(watched, object.clone())) {
            seen.push(version.to_owned());
            return Seen::Held;
        }
        match self.echo_of(watched, object, version) {
            Some(parent) => Seen::Echo(parent),
            None => Seen::Other,
        }
    }

    /// Remembers that `parent`'s sync left `object` of type `watched` at `version`.
    pub fn wrote(&self, parent: &K, watched: Watched, object: ObjectKey, version: String) {
        let mut written = self.written.lock().expect("echoes lock");
        let record = written.entry((watched, object)).or_insert_with(|| Record {
            versions: Vec::new(),
            parent: parent.clone(),
            said: None,
        });
        record.versions.push(version);
        record.parent = parent.clone();
        record.said = None;
    }

    /// If an event showing `object` at `version` is the echo of a recorded write, the parent that wrote
    /// it. Events come in resourceVersion order, so the echo of a write also settles the writes before
    /// it; an event at any other version (a change by someone else) forgets the object's records.
    pub fn echo_of(&self, watched: Watched, object: &ObjectKey, version: &str) -> Option<K> {
        let mut written = self.written.lock().expect("echoes lock");
        let id = (watched, object.clone());
        let record = written.get_mut(&id)?;
        let Some(position) = record.versions.iter().position(|v| v == version) else {
            written.remove(&id);
            return None;
        };
        record.versions.drain(..=position);
        if record.versions.is_empty() {
            written.remove(&id).map(|record| record.parent)
        } else {
            Some(record.parent.clone())
        }
    }

    /// Whether a write of `object` recorded here has not come back through the watch yet. Events come
    /// in resourceVersion order and a change by someone else forgets the records ([`Echoes::echo_of`]),
    /// as a relist does ([`Echoes::forget_object`]): so while one is recorded, the cache shows the
    /// object as it was before that write.
    #[must_use]
    pub fn unseen(&self, watched: Watched, object: &ObjectKey) -> bool {
        self.written.lock().expect("echoes lock").contains_key(&(watched, object.clone()))
    }

    /// Forgets what is recorded of `object`: an event that is not a plain watch event (a relist after
    /// the watch expired) must never be taken for an echo, nor leave a record a later event could match.
    pub fn forget_object(&self, watched: Watched, object: &ObjectKey) {
        self.written.lock().expect("echoes lock").remove(&(watched, object.clone()));
    }

    /// Forgets a parent that is gone, and the writes it left unseen.
    pub fn forget(&self, parent: &K) {
        self.written.lock().expect("echoes lock").retain(|_, record| record.parent != *parent);
    }
}

/// What [`Echoes::finish`] found held: the parent to sync for the write's echo, and the parent to sync
/// for changes by others that came while the write was in flight.
#[derive(Debug, PartialEq, Eq)]
pub struct Settled<K> {
    pub echo: Option<K>,
    pub foreign: Option<K>,
}

impl<K> Default for Settled<K> {
    fn default() -> Self {
        Self { echo: None, foreign: None }
    }
}

/// What an event is, for [`Echoes::classify`].
#[derive(Debug, PartialEq, Eq)]
pub enum Seen<K> {
    /// The echo of a write of this parent's sync.
    Echo(K),
    /// A write of this object is in flight; the event is settled with it.
    Held,
    /// A change by someone else.
    Other,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey { namespace: Some("ns".into()), name: name.into() }
    }

    #[test]
    fn an_event_at_the_written_version_is_the_echo_and_is_recognised_once() {
        let echoes: Echoes<&str> = Echoes::default();
        echoes.wrote(&"parent", Watched::Child(0), key("c"), "7".into());
        assert_eq!(echoes.echo_of(Watched::Child(1), &key("c"), "7"), None, "another type");
        assert_eq!(echoes.echo_of(Watched::Child(0), &key("c"), "7"), Some("parent"));
        assert_eq!(echoes.echo_of(Watched::Child(0), &key("c"), "7"), None, "only once");
    }

    #[test]
    fn an_echo_that_overtakes_its_write_is_held_and_settled_with_it() {
        let echoes: Echoes<&str> = Echoes::default();
        echoes.begin(&"parent", Watched::Child(0), &key("c"));
        assert_eq!(echoes.classify(Watched::Child(0), &key("c"), "7"), Seen::Held);
        let settled = echoes.finish(Watched::Child(0), &key("c"), Some("7"));
        assert_eq!(settled, Settled { echo: Some("parent"), foreign: None });
        assert_eq!(echoes.classify(Watched::Child(0), &key("c"), "7"), Seen::Other, "settled: nothing recorded");
        // The usual order: the write settles first, its echo comes after.
        echoes.begin(&"parent", Watched::Child(0), &key("d"));
        assert_eq!(echoes.finish(Watched::Child(0), &key("d"), Some("9")), Settled::default());
        assert_eq!(echoes.classify(Watched::Child(0), &key("d"), "9"), Seen::Echo("parent"));
        // Someone else's change while the write was in flight.
        echoes.begin(&"parent", Watched::Object(0), &key("p"));
        assert_eq!(echoes.classify(Watched::Object(0), &key("p"), "11"), Seen::Held);
        let settled = echoes.finish(Watched::Object(0), &key("p"), None);
        assert_eq!(settled, Settled { echo: None, foreign: Some("parent") });
    }

    #[test]
    fn two_writes_of_one_object_have_two_echoes() {
        let echoes: Echoes<&str> = Echoes::default();
        echoes.wrote(&"parent", Watched::Object(0), key("p"), "7".into());
        echoes.wrote(&"parent", Watched::Object(0), key("p"), "8".into());
        assert_eq!(echoes.echo_of(Watched::Object(0), &key("p"), "7"), Some("parent"));
        assert_eq!(echoes.echo_of(Watched::Object(0), &key("p"), "8"), Some("parent"));
        assert_eq!(echoes.echo_of(Watched::Object(0), &key("p"), "8"), None);
    }

    #[test]
    fn a_write_is_unseen_until_its_echo_or_a_newer_change_or_a_relist() {
        let echoes: Echoes<&str> = Echoes::default();
        let child = Watched::Child(0);
        assert!(!echoes.unseen(child, &key("c")), "nothing written");
        echoes.begin(&"parent", child, &key("c"));
        assert_eq!(echoes.finish(child, &key("c"), Some("7")), Settled::default());
        assert!(echoes.unseen(child, &key("c")));
        assert!(!echoes.unseen(Watched::Child(1), &key("c")) && !echoes.unseen(child, &key("d")));
        assert_eq!(echoes.classify(child, &key("c"), "7"), Seen::Echo("parent"));
        assert!(!echoes.unseen(child, &key("c")), "its echo came");
        // An echo that came while the write was in flight: nothing is left unseen.
        echoes.begin(&"parent", child, &key("c"));
        assert_eq!(echoes.classify(child, &key("c"), "8"), Seen::Held);
        echoes.finish(child, &key("c"), Some("8"));
        assert!(!echoes.unseen(child, &key("c")));
        // Someone else's change, or a relist, shows a version after the write: the cache is not behind.
        echoes.wrote(&"parent", child, key("c"), "9".into());
        assert_eq!(echoes.classify(child, &key("c"), "10"), Seen::Other);
        assert!(!echoes.unseen(child, &key("c")));
        echoes.wrote(&"parent", child, key("c"), "11".into());
        echoes.forget_object(child, &key("c"));
        assert!(!echoes.unseen(child, &key("c")));
    }

    #[test]
    fn what_an_unseen_write_said_is_known_until_it_is_seen() {
        let echoes: Echoes<&str> = Echoes::default();
        let parent = Watched::Object(0);
        echoes.begin(&"p", parent, &key("p"));
        echoes.settle_saying(parent, &key("p"), Some("7"), 42);
        assert_eq!(echoes.unseen_saying(parent, &key("p")), Some(42));
        assert_eq!(echoes.unseen_saying(Watched::Child(0), &key("p")), None);
        // A later write that said something else, and one that wrote nothing.
        echoes.begin(&"p", parent, &key("p"));
        echoes.settle_saying(parent, &key("p"), Some("8"), 43);
        assert_eq!(echoes.unseen_saying(parent, &key("p")), Some(43));
        assert_eq!(echoes.classify(parent, &key("p"), "7"), Seen::Echo("p"));
        assert_eq!(echoes.unseen_saying(parent, &key("p")), Some(43), "the echo of the earlier write only");
        assert_eq!(echoes.classify(parent, &key("p"), "8"), Seen::Echo("p"));
        assert_eq!(echoes.unseen_saying(parent, &key("p")), None, "seen");
        // Someone else's change, a relist, a write whose echo came while it was in flight, a failed one.
        echoes.begin(&"p", parent, &key("p"));
        echoes.settle_saying(parent, &key("p"), Some("9"), 44);
        assert_eq!(echoes.classify(parent, &key("p"), "10"), Seen::Other);
        assert_eq!(echoes.unseen_saying(parent, &key("p")), None);
        echoes.begin(&"p", parent, &key("p"));
        echoes.settle_saying(parent, &key("p"), Some("11"), 45);
        echoes.forget_object(parent, &key("p"));
        assert_eq!(echoes.unseen_saying(parent, &key("p")), None);
        echoes.begin(&"p", parent, &key("p"));
        assert_eq!(echoes.classify(parent, &key("p"), "12"), Seen::Held);
        echoes.settle_saying(parent, &key("p"), Some("12"), 46);
        assert_eq!(echoes.unseen_saying(parent, &key("p")), None);
        echoes.begin(&"p", parent, &key("p"));
        echoes.settle_saying(parent, &key("p"), None, 47);
        assert_eq!(echoes.unseen_saying(parent, &key("p")), None);
        // A later write that says nothing of itself (a metadata patch, a permanent error's status).
        echoes.begin(&"p", parent, &key("p"));
        echoes.settle_saying(parent, &key("p"), Some("13"), 48);
        echoes.begin(&"p", parent, &key("p"));
        echoes.finish(parent, &key("p"), Some("14"));
        assert_eq!(echoes.unseen_saying(parent, &key("p")), None, "the last write said something else");
        echoes.forget(&"p");
        // A parent that is gone takes what it said along.
        echoes.begin(&"p", parent, &key("p"));
        echoes.settle_saying(parent, &key("p"), Some("13"), 48);
        echoes.forget(&"p");
        assert_eq!(echoes.unseen_saying(parent, &key("p")), None);
        assert!(echoes.written.lock().unwrap().is_empty());
    }

    #[test]
    fn a_change_by_someone_else_is_not_an_echo_and_clears_the_record() {
        let echoes: Echoes<&str> = Echoes::default();
        echoes.wrote(&"parent", Watched::Object(0), key("p"), "7".into());
        assert_eq!(echoes.echo_of(Watched::Object(0), &key("p"), "9"), None);
        assert_eq!(echoes.echo_of(Watched::Object(0), &key("p"), "7"), None);
    }

    #[test]
    fn a_relisted_object_forgets_its_records() {
        let echoes: Echoes<&str> = Echoes::default();
        echoes.wrote(&"parent", Watched::Child(0), key("c"), "7".into());
        echoes.forget_object(Watched::Child(0), &key("c"));
        assert_eq!(echoes.classify(Watched::Child(0), &key("c"), "7"), Seen::Other);
    }

    #[test]
    fn every_echo_syncs_unless_the_controller_says_its_hook_reads_only_the_parent() {
        let default = EchoPolicy::from_annotations(None).unwrap();
        assert!([Echo::Write, Echo::Delete, Echo::Parent].into_iter().all(|e| default.syncs(e)));
        let annotations =
            |v: &str| std::collections::BTreeMap::from([(SYNC_ON_OWN_WRITES_ANNOTATION.to_owned(), v.to_owned())]);
        assert_eq!(EchoPolicy::from_annotations(Some(&annotations("true"))).unwrap(), default);
        let parent_only = EchoPolicy::from_annotations(Some(&annotations("false"))).unwrap();
        assert!(!parent_only.syncs(Echo::Write) && !parent_only.syncs(Echo::Parent));
        assert!(parent_only.syncs(Echo::Delete), "a deleted child must be created again (Recreate)");
        assert!(EchoPolicy::from_annotations(Some(&annotations("no"))).is_err());
    }

    #[test]
    fn a_delete_leaves_an_echo_of_its_own_kind() {
        assert_eq!(Echo::of_child(&crate::write::children::deleted_version("u-1")), Echo::Delete);
        assert_eq!(Echo::of_child("12345"), Echo::Write);
    }
}
