//! Which replica owns which parent when the hub runs sharded: the shard labels, and the assignment of
//! parents to the live members of a ring.
//!
//! Ownership lives in the API, never in a protocol of our own: the ring's coordinator writes the
//! owning member as a label on each parent (`shard.metahook.dev/<ring>: <member>`), the owner stamps
//! the same label on every child and attachment it writes, and each replica watches with a server-side
//! label selector for its own member, so its cache holds about 1/N of the objects. A parent that is to
//! move carries the drain label (`drain.shard.metahook.dev/<ring>: <new member>`) until its old owner
//! has handed it over (see `crate::engine::handover`).
//!
//! The assignment is rendezvous hashing (highest random weight): each parent goes to the member whose
//! hash with the parent's UID is highest. It needs no ring of virtual nodes, balances as well as the
//! hash mixes, and when a member joins only the parents it now wins move (to it), when one leaves only
//! its own parents move: the fewest moves any assignment can make.

use std::collections::BTreeMap;

use serde_json::Value;

/// The prefix of the label that names a parent's (or child's) owning member, per ring.
pub const SHARD_LABEL_PREFIX: &str = "shard.metahook.dev/";

/// The prefix of the label that asks a parent's owner to hand it over to the member it names.
pub const DRAIN_LABEL_PREFIX: &str = "drain.shard.metahook.dev/";

/// The label on a member's Lease that names its ring.
pub const RING_LABEL: &str = "shard.metahook.dev/ring";

/// The label on a member's Lease that names the member (the value its parents are labelled with).
pub const MEMBER_LABEL: &str = "shard.metahook.dev/member";

/// The annotation a moved parent carries: the member it came from (for the audit, and the new owner's
/// count of parents moved in).
pub const MOVED_FROM_ANNOTATION: &str = "shard.metahook.dev/moved-from";

/// The annotation the coordinator puts beside the drain label: when it asked for the move (RFC 3339),
/// for the old owner's drain time metric. Only a metric reads it: wall clocks may differ.
pub const DRAIN_REQUESTED_ANNOTATION: &str = "shard.metahook.dev/drain-requested-at";

/// One replica's place in a ring: the ring's name and this replica's member name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    pub ring: String,
    pub member: String,
}

impl Shard {
    /// The shard label's key of this ring.
    #[must_use]
    pub fn label(&self) -> String {
        shard_label(&self.ring)
    }

    /// The drain label's key of this ring.
    #[must_use]
    pub fn drain_label(&self) -> String {
        drain_label(&self.ring)
    }

    /// The server-side label selector of this member's objects.
    #[must_use]
    pub fn selector(&self) -> String {
        format!("{}={}", self.label(), self.member)
    }

    /// Where the parent `labels` are to move, if its owner must hand it over: a drain label naming
    /// another member than this one.
    #[must_use]
    pub fn drain_target<'a>(&self, labels: Option<&'a BTreeMap<String, String>>) -> Option<&'a str> {
        let target = labels?.get(&self.drain_label())?;
        (target != &self.member).then_some(target.as_str())
    }

    /// Puts this member's shard label on a desired object (a child or attachment the hub writes), so
    /// the object stays in this member's watch and moves with its parent.
    pub fn stamp(&self, desired: &mut Value) {
        let Some(metadata) = desired.as_object_mut().and_then(|o| o.get_mut("metadata")).and_then(Value::as_object_mut)
        else {
            return;
        };
        let labels = metadata.entry("labels").or_insert_with(|| Value::Object(serde_json::Map::new()));
        if !labels.is_object() {
            *labels = Value::Object(serde_json::Map::new());
        }
        if let Some(labels) = labels.as_object_mut() {
            labels.insert(self.label(), Value::String(self.member.clone()));
        }
    }
}

/// The shard label's key of `ring`.
#[must_use]
pub fn shard_label(ring: &str) -> String {
    format!("{SHARD_LABEL_PREFIX}{ring}")
}

/// The drain label's key of `ring`.
#[must_use]
pub fn drain_label(ring: &str) -> String {
    format!("{DRAIN_LABEL_PREFIX}{ring}")
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

/// The member that owns the parent with `uid` among `members` (rendezvous hashing); `None` without
/// members. Every replica computes the same answer from the same members, in any order.
#[must_use]
pub fn assign<'m>(uid: &str, members: &'m [String]) -> Option<&'m str> {
    members.iter().max_by_key(|member| (score(member, uid), member.as_str())).map(String::as_str)
}

/// The weight of `member` for `uid`: FNV-1a of both, finished with splitmix64's mixer (FNV alone
/// leaves similar keys' high bits alike, which skews the maximum). Stable across processes and builds,
/// unlike `std`'s hasher.
fn score(member: &str, uid: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in member.bytes().chain([0]).chain(uid.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("6f1c2a3b-{i:04x}-4e5f-8a9b-{:012x}", i * 7919)).collect()
    }

    fn members(names: &[&str]) -> Vec<String> {
        names.iter().map(|&n| n.to_owned()).collect()
    }

    fn counts(uids: &[String], members: &[String]) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for uid in uids {
            *counts.entry(assign(uid, members).unwrap().to_owned()).or_default() += 1;
        }
        counts
    }

    #[test]
    fn parents_are_spread_evenly_over_the_members() {
        let uids = uids(3000);
        let three = members(&["hub-a-1f2e3d4c", "hub-b-5a6b7c8d", "hub-c-9e0f1a2b"]);
        let counts = counts(&uids, &three);
        assert_eq!(counts.len(), 3, "{counts:?}");
        for (member, n) in &counts {
            assert!((900..=1100).contains(n), "{member} owns {n} of 3000: {counts:?}");
        }
    }

    #[test]
    fn a_joining_member_takes_only_its_share_and_only_for_itself() {
        let uids = uids(3000);
        let three = members(&["hub-a-1f2e3d4c", "hub-b-5a6b7c8d", "hub-c-9e0f1a2b"]);
        let mut four = three.clone();
        four.push("hub-d-3c4d5e6f".to_owned());
        let moved: Vec<&String> = uids.iter().filter(|u| assign(u, &three) != assign(u, &four)).collect();
        assert!((600..=900).contains(&moved.len()), "about a quarter moves: {}", moved.len());
        for uid in moved {
            assert_eq!(assign(uid, &four), Some("hub-d-3c4d5e6f"), "a parent moves only to the new member");
        }
    }

    #[test]
    fn a_leaving_member_gives_up_only_its_own_parents() {
        let uids = uids(3000);
        let three = members(&["hub-a-1f2e3d4c", "hub-b-5a6b7c8d", "hub-c-9e0f1a2b"]);
        let two = members(&["hub-a-1f2e3d4c", "hub-c-9e0f1a2b"]);
        for uid in &uids {
            let before = assign(uid, &three).unwrap();
            if before != "hub-b-5a6b7c8d" {
                assert_eq!(assign(uid, &two), Some(before), "{uid} belonged to a member that stayed");
            }
        }
    }

    #[test]
    fn the_assignment_does_not_depend_on_the_order_of_members() {
        let a = members(&["x", "y", "z"]);
        let b = members(&["z", "x", "y"]);
        for uid in uids(200) {
            assert_eq!(assign(&uid, &a), assign(&uid, &b));
        }
        assert_eq!(assign("u", &[]), None);
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
    fn stamping_adds_the_shard_label_and_keeps_the_others() {
        let shard = Shard { ring: "r".into(), member: "m1".into() };
        let mut desired = serde_json::json!({"metadata": {"name": "c", "labels": {"app": "x"}}});
        shard.stamp(&mut desired);
        assert_eq!(desired["metadata"]["labels"], serde_json::json!({"app": "x", "shard.metahook.dev/r": "m1"}));
        let mut bare = serde_json::json!({"metadata": {"name": "c"}});
        shard.stamp(&mut bare);
        assert_eq!(bare["metadata"]["labels"]["shard.metahook.dev/r"], "m1");
        assert_eq!(shard.selector(), "shard.metahook.dev/r=m1");
    }

    #[test]
    fn only_a_drain_label_naming_another_member_asks_for_a_hand_over() {
        let shard = Shard { ring: "r".into(), member: "m1".into() };
        let labels = |v: &str| BTreeMap::from([("drain.shard.metahook.dev/r".to_owned(), v.to_owned())]);
        assert_eq!(shard.drain_target(Some(&labels("m2"))), Some("m2"));
        assert_eq!(shard.drain_target(Some(&labels("m1"))), None);
        assert_eq!(shard.drain_target(None), None);
    }
}
