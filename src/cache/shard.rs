//! Which replica owns which parent when the hub runs sharded: the bucket labels, the assignment of
//! buckets to the live members of a ring, and the gate that lets a replica sync only its own buckets.
//!
//! Ownership lives in the API, never in a protocol of our own. Every parent falls in one of
//! [`BUCKETS`] buckets by a hash of its UID. Two labels say where an object belongs, because one object
//! can be both a parent (of one controller) and a child (of another): a CompositeController's children
//! that a second controller takes as parents, a composite child that a DecoratorController decorates.
//! - `shard.metahook.dev/<ring>: <bucket>` on an object synced as a parent (or a decorator's target) is
//!   its own bucket, the hash of its own UID: the members label the parents of the buckets they hold
//!   (`crate::ops::labels`), once;
//! - `parent.shard.metahook.dev/<ring>: <bucket>` on an object written for a parent (a child, an
//!   attachment) is that parent's bucket: the hub stamps it on everything a sync writes.
//!
//! Neither changes after it is written (unless someone else changes it, when it is put back): what moves
//! between replicas is whole buckets, by changing who watches them. Each replica watches parents with a
//! server-side selector on the first label for the buckets it holds (`shard.metahook.dev/<ring> in
//! (3,17,…)`) and children with one on the second, so its caches hold about 1/N of the objects, and a
//! move costs no write to any parent or child. A type that is both (the second level of nested
//! controllers) is watched twice, once per role. A former child without a controller (released, or
//! orphaned by the garbage collector) is labelled [`ORPHANS`] instead, which every replica's children
//! watches select: whoever holds a parent that would adopt it sees it.
//!
//! Buckets are assigned by rendezvous hashing (highest random weight) over the live members: each
//! bucket goes to the member whose hash with the bucket is highest. When a member joins only the
//! buckets it now wins move (to it); when one leaves only its own buckets move: the fewest moves any
//! assignment can make. A replica claims the buckets it holds in its member Lease
//! (`shard.metahook.dev/buckets`, see `crate::ops::ring`), and takes a bucket only once no other live
//! member claims it: never two replicas syncing one parent.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::{OwnedRwLockReadGuard, RwLock, watch};

/// How many buckets the parents fall in. Enough that a replica's share is even to about a percent at
/// three replicas (each member's share of buckets varies by √(B·p(1−p))/B); few enough that a selector
/// naming a member's buckets stays a few kilobytes.
pub const BUCKETS: u16 = 1024;

/// The prefix of the label that names an object's own bucket (a parent's, a decorator target's), per
/// ring.
pub const SHARD_LABEL_PREFIX: &str = "shard.metahook.dev/";

/// The prefix of the label that names the bucket of the parent an object was written for (a child's,
/// an attachment's), per ring.
pub const PARENT_SHARD_LABEL_PREFIX: &str = "parent.shard.metahook.dev/";

/// Which of an object's two bucket labels a cache of it selects by (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Objects a controller syncs (parents, a decorator's targets): by their own bucket.
    Parent,
    /// Objects a sync writes for its parent (children, attachments): by their parent's bucket, and the
    /// [`ORPHANS`].
    Child,
}

impl Role {
    /// The label of this role in `ring`.
    #[must_use]
    pub fn label(self, ring: &str) -> String {
        match self {
            Self::Parent => shard_label(ring),
            Self::Child => parent_shard_label(ring),
        }
    }
}

/// The label on a member's Lease that names its ring.
pub const RING_LABEL: &str = "shard.metahook.dev/ring";

/// The label on a member's Lease that names the member.
pub const MEMBER_LABEL: &str = "shard.metahook.dev/member";

/// The annotation on a member's Lease that lists the buckets it claims: a hex bitmap of [`BUCKETS`] bits
/// (see [`encode`]). A member may sync only buckets it claims; others take none of them while its Lease
/// is live.
pub const BUCKETS_ANNOTATION: &str = "shard.metahook.dev/buckets";

/// The bucket label's value on a former child that has no controller now (released, or orphaned by
/// the garbage collector): every member's caches select it, so whichever member holds a parent whose
/// selector would adopt it finds it, as an unsharded hub would. Its old bucket's holder moves it here
/// ([`crate::ops::labels`]); an adoption's next apply stamps the adopter's bucket.
pub const ORPHANS: &str = "orphans";

/// The bucket of the parent with `uid`.
#[must_use]
pub fn bucket(uid: &str) -> u16 {
    u16::try_from(mix(b"", uid.as_bytes()) % u64::from(BUCKETS)).unwrap_or(0)
}

/// The member that owns `bucket` among `members` (rendezvous hashing); `None` without members. Every
/// replica computes the same answer from the same members, in any order.
#[must_use]
pub fn owner(bucket: u16, members: &[String]) -> Option<&str> {
    let key = bucket.to_be_bytes();
    members.iter().max_by_key(|member| (mix(member.as_bytes(), &key), member.as_str())).map(String::as_str)
}

/// The member that owns the parent with `uid` among `members`: the owner of its bucket.
#[must_use]
pub fn assign<'m>(uid: &str, members: &'m [String]) -> Option<&'m str> {
    owner(bucket(uid), members)
}

/// The buckets `member` owns among `members` (which should include it).
#[must_use]
pub fn share(member: &str, members: &[String]) -> BTreeSet<u16> {
    (0..BUCKETS).filter(|b| owner(*b, members) == Some(member)).collect()
}

/// FNV-1a of `a`, a zero byte and `b`, finished with splitmix64's mixer (FNV alone leaves similar keys'
/// high bits alike, which skews a maximum). Stable across processes and builds, unlike `std`'s hasher.
fn mix(a: &[u8], b: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in a.iter().chain(&[0]).chain(b) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

/// `buckets` as the [`BUCKETS_ANNOTATION`] writes them: a bitmap, bucket 0 the high bit of the first of
/// 256 hex digits.
#[must_use]
pub fn encode(buckets: &BTreeSet<u16>) -> String {
    let mut digits = vec![0u8; usize::from(BUCKETS) / 4];
    for &b in buckets.iter().filter(|b| **b < BUCKETS) {
        digits[usize::from(b / 4)] |= 8 >> (b % 4);
    }
    digits.iter().map(|d| char::from_digit(u32::from(*d), 16).unwrap_or('0')).collect()
}

/// The buckets of an [`encode`]d bitmap; `None` if it is not one.
#[must_use]
pub fn decode(text: &str) -> Option<BTreeSet<u16>> {
    if text.len() != usize::from(BUCKETS) / 4 {
        return None;
    }
    let mut buckets = BTreeSet::new();
    for (i, c) in text.chars().enumerate() {
        let digit = c.to_digit(16)?;
        let base = u16::try_from(i * 4).ok()?;
        for bit in 0..4u16 {
            if digit & (8 >> bit) != 0 {
                buckets.insert(base + bit);
            }
        }
    }
    Some(buckets)
}

/// The key of `ring`'s label of an object's own bucket.
#[must_use]
pub fn shard_label(ring: &str) -> String {
    format!("{SHARD_LABEL_PREFIX}{ring}")
}

/// The key of `ring`'s label of the bucket of the parent an object was written for.
#[must_use]
pub fn parent_shard_label(ring: &str) -> String {
    format!("{PARENT_SHARD_LABEL_PREFIX}{ring}")
}

/// The server-side label selector of the objects of `role` in `buckets` of `ring` (children: and the
/// [`ORPHANS`]), in its shorter form: the buckets held (none: nothing but the orphans), or, for more
/// than half of them, the label without the others (all: the label alone, as a replica alone in its
/// ring has). A selector rides in the URL of every list and watch: at most 512 numbers this way, a few
/// kilobytes.
#[must_use]
pub fn selector(ring: &str, role: Role, buckets: &BTreeSet<u16>) -> String {
    let label = role.label(ring);
    let join = |values: Vec<String>| values.join(",");
    if buckets.len() * 2 <= usize::from(BUCKETS) {
        let orphans = (role == Role::Child).then(|| ORPHANS.to_owned());
        let values: Vec<String> = buckets.iter().map(u16::to_string).chain(orphans).collect();
        // A parent cache of no bucket selects nothing: a value no label has (not a number, not "orphans").
        let values = if values.is_empty() { vec!["none".to_owned()] } else { values };
        return format!("{label} in ({})", join(values));
    }
    let others: Vec<String> = (0..BUCKETS).filter(|b| !buckets.contains(b)).map(|b| b.to_string()).collect();
    let others = others.into_iter().chain((role == Role::Parent).then(|| ORPHANS.to_owned())).collect::<Vec<_>>();
    if others.is_empty() { label } else { format!("{label},{label} notin ({})", join(others)) }
}

/// The selectors a replica's caches watch with, one per [`Role`], for the same buckets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    pub parents: String,
    pub children: String,
}

impl Selection {
    /// The selectors of `buckets` in `ring`.
    #[must_use]
    pub fn of(ring: &str, buckets: &BTreeSet<u16>) -> Self {
        Self { parents: selector(ring, Role::Parent, buckets), children: selector(ring, Role::Child, buckets) }
    }

    /// The selector of `role`.
    #[must_use]
    pub fn of_role(&self, role: Role) -> &str {
        match role {
            Role::Parent => &self.parents,
            Role::Child => &self.children,
        }
    }
}

/// One replica's place in a ring: the ring's name, this replica's member name, and the buckets it holds.
#[derive(Clone)]
pub struct Shard {
    pub ring: String,
    pub member: String,
    pub held: Arc<Held>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard").field("ring", &self.ring).field("member", &self.member).finish_non_exhaustive()
    }
}

impl Shard {
    /// `member` of `ring`, holding no bucket yet.
    #[must_use]
    pub fn new(ring: &str, member: &str) -> Self {
        Self { ring: ring.to_owned(), member: member.to_owned(), held: Arc::new(Held::new(ring)) }
    }

    /// The key of this ring's label of `role`.
    #[must_use]
    pub fn label(&self, role: Role) -> String {
        role.label(&self.ring)
    }

    /// Puts the bucket of the parent with `parent_uid` on a desired object (a child or attachment the
    /// hub writes) as its parent's bucket label, so the object is in the children watches of whoever
    /// holds its parent. Its own bucket label, if it is a parent too, is not touched.
    pub fn stamp(&self, desired: &mut Value, parent_uid: &str) {
        let Some(metadata) = desired.as_object_mut().and_then(|o| o.get_mut("metadata")).and_then(Value::as_object_mut)
        else {
            return;
        };
        let labels = metadata.entry("labels").or_insert_with(|| Value::Object(serde_json::Map::new()));
        if !labels.is_object() {
            *labels = Value::Object(serde_json::Map::new());
        }
        if let Some(labels) = labels.as_object_mut() {
            labels.insert(self.label(Role::Child), Value::String(bucket(parent_uid).to_string()));
        }
    }
}

/// The buckets this replica holds, and the gate every sync passes: a sync holds a read guard for as
/// long as it runs, so the keeper of the buckets (`crate::ops::ring::Keeper`) — which changes them under
/// the write lock — knows, once it has the lock, that no sync of a bucket it lets go is in flight and
/// none will start.
#[derive(Debug)]
pub struct Held {
    ring: String,
    state: Arc<RwLock<HeldState>>,
    /// The selectors of the buckets held or arriving: the sharded caches watch with them.
    selection: watch::Sender<Selection>,
    /// Bumped on every change of the buckets: a sync waiting for an arriving bucket looks again.
    changed: watch::Sender<u64>,
}

/// The buckets held (a sync's guard keeps them from changing while it runs).
#[derive(Debug, Default)]
pub struct HeldState {
    mine: BTreeSet<u16>,
    arriving: BTreeSet<u16>,
}

/// What a sync of a parent of this replica's holds while it runs (see [`Held`]).
pub type Entered = OwnedRwLockReadGuard<HeldState>;

impl Held {
    fn new(ring: &str) -> Self {
        let (selection, _) = watch::channel(Selection::of(ring, &BTreeSet::new()));
        Self { ring: ring.to_owned(), state: Arc::default(), selection, changed: watch::channel(0).0 }
    }

    /// The selectors of the buckets this replica watches, as they change.
    #[must_use]
    pub fn selection(&self) -> watch::Receiver<Selection> {
        self.selection.subscribe()
    }

    /// The guard to hold while syncing the parent with `uid`, when its bucket is held; `None` when it
    /// is another replica's (or nobody's yet). A parent of a bucket just taken waits here until the
    /// caches have listed the bucket: its sync would otherwise miss children not listed yet, and a
    /// retry after a delay would queue behind every resync.
    pub async fn enter(&self, uid: &str) -> Option<Entered> {
        let bucket = bucket(uid);
        let mut changes = self.changed.subscribe();
        loop {
            let guard = Arc::clone(&self.state).read_owned().await;
            if guard.mine.contains(&bucket) {
                return Some(guard);
            }
            if !guard.arriving.contains(&bucket) {
                return None;
            }
            drop(guard);
            if changes.changed().await.is_err() {
                return None;
            }
        }
    }

    /// Every bucket held or arriving (what this replica must claim).
    pub async fn claimed(&self) -> BTreeSet<u16> {
        let state = self.state.read().await;
        state.mine.union(&state.arriving).copied().collect()
    }

    /// Lets `buckets` go: returns once no sync of them is in flight, and none will start. The caches
    /// stop watching them.
    pub async fn release(&self, buckets: &BTreeSet<u16>) {
        let mut state = self.state.write().await;
        state.mine.retain(|b| !buckets.contains(b));
        state.arriving.retain(|b| !buckets.contains(b));
        self.select(&state);
        self.bump();
    }

    /// Takes `buckets` (claimed and unclaimed by anyone else): the caches start watching them; syncs of
    /// their parents wait until [`Held::settle`]. Returns the new selectors.
    pub async fn take(&self, buckets: &BTreeSet<u16>) -> Selection {
        let mut state = self.state.write().await;
        let new: Vec<u16> = buckets.iter().filter(|b| !state.mine.contains(b)).copied().collect();
        state.arriving.extend(new);
        self.select(&state)
    }

    /// The arriving buckets are listed in the caches: their parents are synced from now on.
    pub async fn settle(&self) {
        let mut state = self.state.write().await;
        let arrived = std::mem::take(&mut state.arriving);
        state.mine.extend(arrived);
        self.bump();
    }

    /// Nothing held (a term of membership ended: its controllers stopped).
    pub async fn clear(&self) {
        let mut state = self.state.write().await;
        *state = HeldState::default();
        self.select(&state);
        self.bump();
    }

    fn bump(&self) {
        self.changed.send_modify(|g| *g += 1);
    }

    fn select(&self, state: &HeldState) -> Selection {
        let watched: BTreeSet<u16> = state.mine.union(&state.arriving).copied().collect();
        let selector = Selection::of(&self.ring, &watched);
        self.selection.send_if_modified(|current| {
            let changed = *current != selector;
            current.clone_from(&selector);
            changed
        });
        selector
    }
}

/// A member name for a replica `identity` (`pod-name_1a2b3c4d`): a valid label value (at most 63
/// characters of `[a-z0-9-]`, alphanumeric at both ends) that keeps the identity's random suffix, so a
/// restarted replica is a new member and never mistaken for its predecessor.
#[must_use]
pub fn member_name(identity: &str) -> String {
    let cleaned: String =
        identity.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    let tail: String = cleaned.chars().rev().take(63).collect::<Vec<_>>().into_iter().rev().collect();
    let trimmed = tail.trim_matches('-');
    if trimmed.is_empty() { "member".to_owned() } else { trimmed.to_owned() }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;

    fn uids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("6f1c2a3b-{i:04x}-4e5f-8a9b-{:012x}", i * 7919)).collect()
    }

    fn members(names: &[&str]) -> Vec<String> {
        names.iter().map(|&n| n.to_owned()).collect()
    }

    #[test]
    fn buckets_and_parents_are_spread_evenly_over_the_members() {
        let three = members(&["hub-a-1f2e3d4c", "hub-b-5a6b7c8d", "hub-c-9e0f1a2b"]);
        for member in &three {
            let n = share(member, &three).len();
            assert!((300..=383).contains(&n), "{member} holds {n} of 1024 buckets");
        }
        let mut per_bucket = vec![0usize; usize::from(BUCKETS)];
        for uid in uids(30_000) {
            per_bucket[usize::from(bucket(&uid))] += 1;
        }
        assert!(per_bucket.iter().all(|n| (5..=60).contains(n)), "parents per bucket: {per_bucket:?}");
    }

    #[test]
    fn a_joining_member_takes_only_its_share_and_only_for_itself() {
        let three = members(&["hub-a-1f2e3d4c", "hub-b-5a6b7c8d", "hub-c-9e0f1a2b"]);
        let mut four = three.clone();
        four.push("hub-d-3c4d5e6f".to_owned());
        let moved: Vec<u16> = (0..BUCKETS).filter(|b| owner(*b, &three) != owner(*b, &four)).collect();
        assert!((200..=310).contains(&moved.len()), "about a quarter moves: {}", moved.len());
        for b in moved {
            assert_eq!(owner(b, &four), Some("hub-d-3c4d5e6f"), "a bucket moves only to the new member");
        }
    }

    #[test]
    fn a_leaving_member_gives_up_only_its_own_buckets() {
        let three = members(&["hub-a-1f2e3d4c", "hub-b-5a6b7c8d", "hub-c-9e0f1a2b"]);
        let two = members(&["hub-a-1f2e3d4c", "hub-c-9e0f1a2b"]);
        for b in 0..BUCKETS {
            let before = owner(b, &three).unwrap();
            if before != "hub-b-5a6b7c8d" {
                assert_eq!(owner(b, &two), Some(before), "{b} belonged to a member that stayed");
            }
        }
    }

    #[test]
    fn the_assignment_does_not_depend_on_the_order_of_members() {
        let a = members(&["x", "y", "z"]);
        let b = members(&["z", "x", "y"]);
        for uid in uids(200) {
            assert_eq!(assign(&uid, &a), assign(&uid, &b));
            assert_eq!(assign(&uid, &a), owner(bucket(&uid), &a));
        }
        assert_eq!(assign("u", &[]), None);
    }

    #[test]
    fn claims_round_trip_through_the_annotation() {
        let some: BTreeSet<u16> = [0, 1, 5, 511, 1023].into();
        let text = encode(&some);
        assert_eq!(text.len(), 256);
        assert!(text.starts_with("c4"), "{text}");
        assert_eq!(decode(&text), Some(some));
        assert_eq!(decode(&encode(&BTreeSet::new())), Some(BTreeSet::new()));
        let all: BTreeSet<u16> = (0..BUCKETS).collect();
        assert_eq!(decode(&encode(&all)), Some(all));
        assert_eq!(decode("c4"), None, "too short");
        assert_eq!(decode(&"x".repeat(256)), None, "not hex");
    }

    #[test]
    fn member_names_are_label_values_that_keep_the_suffix() {
        assert_eq!(member_name("Hub-0_1a2b3c4d"), "hub-0-1a2b3c4d");
        let long = format!("{}_1a2b3c4d", "p".repeat(80));
        let name = member_name(&long);
        assert!(name.len() <= 63 && name.ends_with("-1a2b3c4d"), "{name}");
        assert_eq!(member_name("__"), "member");
    }

    #[test]
    fn stamping_adds_the_parents_bucket_and_keeps_the_other_labels() {
        let shard = Shard::new("r", "m1");
        let uid = "6f1c2a3b-0001-4e5f-8a9b-000000001eef";
        let mut desired =
            serde_json::json!({"metadata": {"name": "c", "labels": {"app": "x", "shard.metahook.dev/r": "5"}}});
        shard.stamp(&mut desired, uid);
        let value = bucket(uid).to_string();
        assert_eq!(
            desired["metadata"]["labels"],
            serde_json::json!({"app": "x", "shard.metahook.dev/r": "5", "parent.shard.metahook.dev/r": value}),
            "a child that is a parent too keeps its own bucket"
        );
        let mut bare = serde_json::json!({"metadata": {"name": "c"}});
        shard.stamp(&mut bare, uid);
        assert_eq!(bare["metadata"]["labels"]["parent.shard.metahook.dev/r"], value.as_str());
    }

    #[test]
    fn selectors_name_the_buckets_of_their_role_and_only_children_select_the_orphans() {
        let (parents, children) = (Role::Parent, Role::Child);
        assert_eq!(selector("r", children, &[3, 17].into()), "parent.shard.metahook.dev/r in (3,17,orphans)");
        assert_eq!(selector("r", parents, &[3, 17].into()), "shard.metahook.dev/r in (3,17)");
        assert_eq!(selector("r", children, &BTreeSet::new()), "parent.shard.metahook.dev/r in (orphans)");
        assert_eq!(selector("r", parents, &BTreeSet::new()), "shard.metahook.dev/r in (none)", "none: nothing");
        let all: BTreeSet<u16> = (0..BUCKETS).collect();
        assert_eq!(selector("r", children, &all), "parent.shard.metahook.dev/r", "all: the label alone");
        assert_eq!(selector("r", parents, &all), "shard.metahook.dev/r,shard.metahook.dev/r notin (orphans)");
        let but_two: BTreeSet<u16> = (0..BUCKETS).filter(|b| *b != 5 && *b != 9).collect();
        assert_eq!(
            selector("r", children, &but_two),
            "parent.shard.metahook.dev/r,parent.shard.metahook.dev/r notin (5,9)"
        );
        let half: BTreeSet<u16> = (0..BUCKETS / 2).collect();
        assert!(selector("r", parents, &half).contains(" in ("), "half: named");
        let parsed = crate::cache::selector::parse_selector_string(&selector("r", parents, &BTreeSet::new())).unwrap();
        let labelled = |v: &str| BTreeMap::from([("shard.metahook.dev/r".to_owned(), v.to_owned())]);
        assert!(!parsed.matches(&labelled("0")) && !parsed.matches(&labelled("orphans")));
    }

    /// A uid whose bucket is `b`.
    fn uid_in(b: u16) -> String {
        (0..1_000_000).map(|i| format!("uid-{i}")).find(|u| bucket(u) == b).unwrap()
    }

    #[tokio::test]
    async fn a_bucket_is_synced_only_once_settled_and_let_go_only_when_no_sync_of_it_runs() {
        let shard = Shard::new("r", "m1");
        let held = &shard.held;
        let selection = held.selection();
        let uid = uid_in(7);
        assert!(held.enter(&uid).await.is_none(), "not held");
        let selector = held.take(&[7].into()).await;
        assert_eq!(selector.children, "parent.shard.metahook.dev/r in (7,orphans)");
        assert_eq!(selector.parents, "shard.metahook.dev/r in (7)");
        assert_eq!(*selection.borrow(), selector, "the caches watch an arriving bucket");
        let waiting = held.enter(&uid);
        tokio::pin!(waiting);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), &mut waiting).await.is_err(),
            "not synced before its caches listed it"
        );
        held.settle().await;
        let sync = tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().expect("synced once settled");
        assert_eq!(held.claimed().await, [7].into());

        // A release waits for the sync in flight.
        let seven: BTreeSet<u16> = [7].into();
        let releasing = held.release(&seven);
        tokio::pin!(releasing);
        assert!(tokio::time::timeout(Duration::from_millis(100), &mut releasing).await.is_err(), "released mid-sync");
        drop(sync);
        tokio::time::timeout(Duration::from_secs(5), releasing).await.expect("released after the sync");
        assert!(held.enter(&uid).await.is_none(), "let go");
        assert_eq!(selection.borrow().children, "parent.shard.metahook.dev/r in (orphans)");
        // A sync waiting for an arriving bucket is let off when the term ends.
        held.take(&seven).await;
        let waiting = held.enter(&uid);
        tokio::pin!(waiting);
        assert!(tokio::time::timeout(Duration::from_millis(100), &mut waiting).await.is_err());
        held.clear().await;
        assert!(tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().is_none());
        assert!(held.claimed().await.is_empty());
    }
}
