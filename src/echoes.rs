//! The echo of the hub's own writes: telling it from changes made by others, and not paying a second
//! hook call for it when that call has nothing to learn.
//!
//! Every write of a sync (a child created, updated or deleted, the parent's status) comes back through
//! the watch. Metacontroller syncs the parent again for each such echo, so every change costs two hook
//! calls. client-go's controllers keep "expectations" of their own writes; here a sync records the
//! resourceVersion (or, for a delete, the UID) each of its writes left behind, and an event that carries
//! exactly that version is known to be the echo.
//!
//! Whether the echo still deserves a sync depends on the hook, not on the hub: a hook whose status
//! counts its observed children must see the children it just asked for, one whose answer only depends
//! on the parent learns nothing. So each controller finds out, separately for echoes of child writes and
//! of status writes: the first echoes are synced as Metacontroller does, and once [`LEARN_AFTER`] of them
//! in a row changed nothing at all (no write, same status), further echoes of that kind are not synced,
//! except one in [`PROBE_ONE_IN`], which keeps checking that this is still so. An echo sync that does
//! write something sends the controller back to syncing every echo of that kind.
//!
//! The probe is drawn once per parent and kind between two of its syncs (a sync's three child writes
//! come back as three echoes: one draw, not three), and a drawn probe is kept: the sync it queued runs.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::informers::ObjectKey;

/// Echo syncs in a row that changed nothing before echoes of that kind are no longer synced.
pub const LEARN_AFTER: u32 = 3;
/// Once learned, one echo in this many is still synced, to notice a hook that changed its ways.
pub const PROBE_ONE_IN: u32 = 64;

/// Which write an echo comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Echo {
    /// A child (or attachment) the sync created, updated or deleted.
    Child,
    /// The parent's own status or finalizers.
    Parent,
}

/// Watched type of a write: a child type's index, or the parent type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Watched {
    Child(usize),
    Parent,
}

/// (type, object) → (versions the writes left behind, oldest first; parent whose sync wrote them).
type Written<K> = HashMap<(Watched, ObjectKey), (Vec<String>, K)>;

/// Writes in flight: (type, object) → (parent whose sync writes it, versions seen meanwhile).
type InFlight<K> = HashMap<(Watched, ObjectKey), (K, Vec<String>)>;

/// What one controller's syncs wrote and have not seen come back yet, and what it learned about echoes.
///
/// A write's echo may arrive before the write's own response does, so a write is announced before it is
/// sent ([`Echoes::begin`]): events of that object are held until the write is settled
/// ([`Echoes::finish`]), which tells which of them were its echo and which someone else's change.
pub struct Echoes<K> {
    written: Mutex<Written<K>>,
    pending: Mutex<InFlight<K>>,
    marks: Mutex<Marks<K>>,
    child: Learner,
    parent: Learner,
}

impl<K: Clone + Eq + Hash> Default for Echoes<K> {
    fn default() -> Self {
        Self {
            written: Mutex::default(),
            pending: Mutex::default(),
            marks: Mutex::new(Marks { echo_only: HashMap::new(), declined: HashSet::new() }),
            child: Learner::default(),
            parent: Learner::default(),
        }
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
        }
        Settled { echo: echoed.then(|| parent.clone()), foreign: foreign.then_some(parent) }
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
        let entry = written.entry((watched, object)).or_insert_with(|| (Vec::new(), parent.clone()));
        entry.0.push(version);
        entry.1 = parent.clone();
    }

    /// If an event showing `object` at `version` is the echo of a recorded write, the parent that wrote
    /// it. Events come in resourceVersion order, so the echo of a write also settles the writes before
    /// it; an event at any other version (a change by someone else) forgets the object's records.
    pub fn echo_of(&self, watched: Watched, object: &ObjectKey, version: &str) -> Option<K> {
        let mut written = self.written.lock().expect("echoes lock");
        let id = (watched, object.clone());
        let (versions, _) = written.get_mut(&id)?;
        let Some(position) = versions.iter().position(|v| v == version) else {
            written.remove(&id);
            return None;
        };
        versions.drain(..=position);
        if versions.is_empty() {
            written.remove(&id).map(|(_, parent)| parent)
        } else {
            written.get(&id).map(|(_, parent)| parent.clone())
        }
    }

    /// Whether an echo of `kind` should sync its parent. When it should, `queued_already` says whether
    /// the parent is already waiting for a sync for another reason (then the sync is not an echo sync).
    pub fn should_sync(&self, parent: &K, kind: Echo, queued_already: bool) -> bool {
        let learner = self.learner(kind);
        if queued_already {
            // Not an echo sync either way; once learned, the echo does not move the key up the queue.
            return !learner.learned();
        }
        let mut marks = self.marks.lock().expect("echoes lock");
        if let Some((queued, _)) = marks.echo_only.get_mut(parent) {
            if kind == Echo::Child {
                *queued = Echo::Child;
            }
            return true;
        }
        let probe = if learner.learned() {
            // One draw per parent and kind until its next sync: its other echoes follow that draw.
            if marks.declined.contains(&(parent.clone(), kind)) || !learner.draw() {
                marks.declined.insert((parent.clone(), kind));
                return false;
            }
            true
        } else {
            false
        };
        marks.echo_only.insert(parent.clone(), (kind, probe));
        true
    }

    /// A parent was queued for a reason other than an echo: its next sync is not an echo sync. Says
    /// whether an echo alone had queued it until now.
    pub fn queued(&self, parent: &K) -> bool {
        self.marks.lock().expect("echoes lock").echo_only.remove(parent).is_some()
    }

    /// Called as a sync starts: whether (and by which echo) it runs only because of an echo. `Err`: it
    /// does, and what was learned since it was queued says to skip it (in a backlog, every parent's echo
    /// is queued before the first echo sync has run, so the decision is taken again here; a probe,
    /// queued after learning, is not taken again). Its echoes from now on are a new round of draws.
    pub fn take(&self, parent: &K) -> Result<Option<Echo>, Echo> {
        let mut marks = self.marks.lock().expect("echoes lock");
        marks.forget_draws(parent);
        match marks.echo_only.remove(parent) {
            Some((kind, false)) if self.learner(kind).learned() && !self.learner(kind).draw() => Err(kind),
            other => Ok(other.map(|(kind, _)| kind)),
        }
    }

    /// What an echo sync of `kind` did: wrote something (the hook had something to learn) or nothing.
    pub fn learn(&self, kind: Echo, wrote: bool) {
        tracing::debug!(?kind, wrote, "echo sync");
        self.learner(kind).learn(wrote);
    }

    /// Forgets a parent that is gone, and the writes it left unseen.
    pub fn forget(&self, parent: &K) {
        let mut marks = self.marks.lock().expect("echoes lock");
        marks.echo_only.remove(parent);
        marks.forget_draws(parent);
        drop(marks);
        self.written.lock().expect("echoes lock").retain(|_, (_, p)| p != parent);
    }

    fn learner(&self, kind: Echo) -> &Learner {
        match kind {
            Echo::Child => &self.child,
            Echo::Parent => &self.parent,
        }
    }

    /// Parents waiting with an echo-only mark (for tests and metrics).
    #[must_use]
    pub fn echo_only_parents(&self) -> HashSet<K> {
        self.marks.lock().expect("echoes lock").echo_only.keys().cloned().collect()
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

/// Parents queued by echoes only, with the kind of echo (a child echo wins over a parent echo) and
/// whether it was a probe; and the (parent, kind) whose probe was drawn and declined since its last sync.
struct Marks<K> {
    echo_only: HashMap<K, (Echo, bool)>,
    declined: HashSet<(K, Echo)>,
}

impl<K: Clone + Eq + Hash> Marks<K> {
    fn forget_draws(&mut self, parent: &K) {
        for kind in [Echo::Child, Echo::Parent] {
            self.declined.remove(&(parent.clone(), kind));
        }
    }
}

/// Counts echo syncs in a row that changed nothing.
#[derive(Default)]
struct Learner {
    idle_in_a_row: AtomicU32,
    probes: AtomicU32,
}

impl Learner {
    /// Whether enough echo syncs in a row changed nothing.
    fn learned(&self) -> bool {
        self.idle_in_a_row.load(Ordering::Relaxed) >= LEARN_AFTER
    }

    /// One draw: whether this is the one in [`PROBE_ONE_IN`] that is synced anyway.
    fn draw(&self) -> bool {
        (self.probes.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(PROBE_ONE_IN)
    }

    fn learn(&self, wrote: bool) {
        if wrote {
            self.idle_in_a_row.store(0, Ordering::Relaxed);
        } else {
            let _ =
                self.idle_in_a_row.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| Some(n.saturating_add(1)));
        }
    }
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
        echoes.begin(&"parent", Watched::Parent, &key("p"));
        assert_eq!(echoes.classify(Watched::Parent, &key("p"), "11"), Seen::Held);
        let settled = echoes.finish(Watched::Parent, &key("p"), None);
        assert_eq!(settled, Settled { echo: None, foreign: Some("parent") });
    }

    #[test]
    fn two_writes_of_one_object_have_two_echoes() {
        let echoes: Echoes<&str> = Echoes::default();
        echoes.wrote(&"parent", Watched::Parent, key("p"), "7".into());
        echoes.wrote(&"parent", Watched::Parent, key("p"), "8".into());
        assert_eq!(echoes.echo_of(Watched::Parent, &key("p"), "7"), Some("parent"));
        assert_eq!(echoes.echo_of(Watched::Parent, &key("p"), "8"), Some("parent"));
        assert_eq!(echoes.echo_of(Watched::Parent, &key("p"), "8"), None);
    }

    #[test]
    fn a_change_by_someone_else_is_not_an_echo_and_clears_the_record() {
        let echoes: Echoes<&str> = Echoes::default();
        echoes.wrote(&"parent", Watched::Parent, key("p"), "7".into());
        assert_eq!(echoes.echo_of(Watched::Parent, &key("p"), "9"), None);
        assert_eq!(echoes.echo_of(Watched::Parent, &key("p"), "7"), None);
    }

    #[test]
    fn echoes_are_synced_until_enough_of_them_changed_nothing_then_only_probed() {
        let echoes: Echoes<&str> = Echoes::default();
        // A backlog: every echo is queued before the first echo sync runs.
        for parent in ["p1", "p2", "p3", "p4", "p5"] {
            assert!(echoes.should_sync(&parent, Echo::Child, false));
        }
        for parent in ["p1", "p2", "p3"] {
            assert_eq!(echoes.take(&parent), Ok(Some(Echo::Child)));
            echoes.learn(Echo::Child, false);
        }
        assert_eq!(echoes.take(&"p4"), Err(Echo::Child), "learned meanwhile: skipped when it comes up");
        let mut probes = 0;
        for _ in 0..PROBE_ONE_IN * 2 {
            // One sync's three child writes come back as three echoes: one draw.
            let synced = (0..3).filter(|_| echoes.should_sync(&"p", Echo::Child, false)).count();
            assert!(synced == 0 || synced == 3, "the echoes of one sync follow one draw, got {synced} of 3");
            if synced == 3 {
                probes += 1;
                assert_eq!(echoes.take(&"p"), Ok(Some(Echo::Child)), "a drawn probe runs; it is not drawn again");
            } else {
                assert_eq!(echoes.take(&"p"), Ok(None), "declined: nothing queued it");
            }
        }
        assert_eq!(probes, 2, "one probe in {PROBE_ONE_IN} syncs");
        assert!(echoes.should_sync(&"p", Echo::Parent, false), "parent echoes learn on their own");
        assert_eq!(echoes.take(&"p"), Ok(Some(Echo::Parent)));
        echoes.learn(Echo::Child, true);
        assert!(echoes.should_sync(&"p", Echo::Child, false), "an echo sync that wrote resets the learning");
    }

    #[test]
    fn a_parent_queued_for_another_reason_is_not_an_echo_sync() {
        let echoes: Echoes<&str> = Echoes::default();
        assert!(echoes.should_sync(&"p", Echo::Parent, false));
        assert!(echoes.queued(&"p"), "an echo alone had queued it");
        assert!(!echoes.queued(&"p"), "not any more");
        assert_eq!(echoes.take(&"p"), Ok(None));
        assert!(echoes.should_sync(&"q", Echo::Parent, false));
        assert!(echoes.should_sync(&"q", Echo::Child, false));
        assert_eq!(echoes.take(&"q"), Ok(Some(Echo::Child)));
        assert!(echoes.should_sync(&"r", Echo::Child, true));
        assert_eq!(echoes.take(&"r"), Ok(None), "already queued for another reason");
    }
}
