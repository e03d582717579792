//! Sharding's ring: who its members are (each replica's own Lease), which buckets each holds (the
//! [`Keeper`] of every member), and the coordinator that checks parents' bucket labels (see
//! [`crate::cache::shard`] for the buckets and the hashing).
//!
//! # Membership
//! Every replica holds a Lease of its own, `<ring>-<member>`, in the leader-election namespace, labelled
//! with the ring and its member name, renewed by the same [`Elector`](crate::ops::leader::Elector) as the
//! leader Lease and gating the replica's writes the same way: a replica stops writing (and its
//! controllers stop) `renewDeadline` after its last successful renewal. A replica counts another live
//! while its Lease has a holder and its record changed within `leaseDuration` of the observer's own
//! clock (the leader module's timing argument, [`crate::ops::leader`]): so by the time a member takes
//! the buckets of one that expired, that one has stopped writing for `leaseDuration − renewDeadline` at
//! least. A Lease released on shutdown (no holder) leaves at once: its replica stopped its controllers
//! and saw its writes land first.
//!
//! # Buckets
//! Every member computes the same assignment of buckets from the live members it reads, and its
//! [`Keeper`] moves its own holding towards it, writing what it holds as a claim in its Lease
//! ([`BUCKETS_ANNOTATION`]), with the renewals its liveness is judged by:
//! - a bucket it holds and no longer owns is let go first — the sync gate ([`crate::cache::shard::Held`])
//!   waits for the syncs in flight and starts no other — and only then dropped from its claim;
//! - a bucket it owns is taken only when no other live member claims it: it is claimed first, the
//!   claims are read again, and a bucket another member claims too is withdrawn (of two members that
//!   claim at once, at least one reads the other's claim: both wrote before they read). Then the caches
//!   list it, and its parents are synced once they have.
//!
//! A member that joins thus waits for each bucket's owner to let it go; the buckets of a member that
//! dies are free once its Lease expires. Nothing is relabelled on a move.
//!
//! # Labels
//! Each member labels the new parents of the buckets it holds and, each `rebalanceInterval`, puts back
//! a label its caches show naming another bucket than its parent's ([`crate::ops::labels`]). What no
//! member's cache or watch can see is a label whose value is no bucket at all: the coordinator (the
//! replica holding the leader Lease) lists just those each `rebalanceInterval` (the server filters
//! them; normally none) and puts them back. It used to list every parent (a paged metadata list): at
//! 10,000 parents that left its replica 5-7 MiB larger than the others and peaked 14 MiB above them.
//!
//! Children written before the ring existed (by an unsharded hub, or by Metacontroller before the
//! switch) carry no bucket label, so no member's cache shows them to their parents' syncs. The
//! coordinator labels them once per term and child type, as it takes office and for a child type that
//! appears later (a paged metadata list of the type's objects without the label, the server filtering;
//! [`crate::ops::labels::label_children`]); a sync that finds such a child in the way of a create
//! labels it there and then ([`crate::write::apply`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cache::discovery::{Discovery, ResolvedResource};
use crate::cache::informers::Informers;
use crate::cache::shard::{
    BUCKETS, BUCKETS_ANNOTATION, MEMBER_LABEL, RING_LABEL, Shard, decode, encode, shard_label, share,
};
use crate::engine::metrics::ShardMetrics;
use crate::ops::labels::{
    ChildType, ChildTypeKey, LabelError, Parent, both, label_children, label_parents, scopes, types,
};
use crate::ops::leader::LeaseNotes;

/// Errors of one pass of the coordinator or a keeper (each retries at its next pass).
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("reading the members of ring {ring}: {source}")]
    Members { ring: String, source: Box<kube::Error> },
    #[error(transparent)]
    Labels(#[from] LabelError),
}

/// The name of `shard`'s member Lease: `<ring>-<member>` (a DNS subdomain: lower case, `_` → `-`).
#[must_use]
pub fn member_lease_name(shard: &Shard) -> String {
    format!("{}-{}", shard.ring, shard.member).to_ascii_lowercase().replace('_', "-")
}

/// The labels of `shard`'s member Lease: the ring (to list the members) and the member name.
#[must_use]
pub fn member_lease_labels(shard: &Shard) -> BTreeMap<String, String> {
    BTreeMap::from([(RING_LABEL.to_owned(), shard.ring.clone()), (MEMBER_LABEL.to_owned(), shard.member.clone())])
}

/// The annotations of a member's Lease that claim `buckets`.
#[must_use]
pub fn claim_notes(buckets: &BTreeSet<u16>) -> BTreeMap<String, String> {
    BTreeMap::from([(BUCKETS_ANNOTATION.to_owned(), encode(buckets))])
}

/// The ring's members as last read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Roster {
    /// Members whose Lease is held and unexpired, sorted.
    pub live: Vec<String>,
    /// Members with a Lease that expired or was released.
    pub gone: BTreeSet<String>,
    /// The buckets each live member claims.
    pub claims: BTreeMap<String, BTreeSet<u16>>,
    /// The buckets members that left still claim in their Leases (nobody holds them).
    pub left_behind: BTreeSet<u16>,
    /// When the first live member expires unless it renews (on this process's clock): look again
    /// then, so a dead member's buckets wait no longer than they must.
    pub next_expiry: Option<Instant>,
}

impl Roster {
    /// The buckets live members other than `member` claim.
    #[must_use]
    pub fn claimed_by_others(&self, member: &str) -> BTreeSet<u16> {
        self.claims.iter().filter(|(m, _)| *m != member).flat_map(|(_, claim)| claim.iter().copied()).collect()
    }
}

/// Reads the members' Leases and tells live ones from expired ones by when each record last changed
/// on this process's clock.
///
/// The instants come from a watch of the ring's Leases as well as from the reads: a renewal is seen
/// when it happens, not up to a read period later, so a member that died is known gone
/// `leaseDuration` after its last renewal rather than a period after that. The roster itself is always
/// a fresh list (a claim must be read after it was written, which a watch's cache does not promise).
pub struct Members {
    api: Api<Lease>,
    ring: String,
    lease_duration: Duration,
    /// Lease name → (resourceVersion, the instant it was first seen at that version).
    seen: Arc<Mutex<HashMap<String, (String, Instant)>>>,
    watch: tokio::task::AbortHandle,
}

impl Drop for Members {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

/// Notes when `lease`'s record was first seen at its version.
fn note(seen: &Mutex<HashMap<String, (String, Instant)>>, lease: &Lease, now: Instant) -> Instant {
    let name = lease.metadata.name.clone().unwrap_or_default();
    let version = lease.metadata.resource_version.clone().unwrap_or_default();
    let mut seen = seen.lock().expect("seen lock");
    match seen.get(&name) {
        Some((v, at)) if *v == version => *at,
        _ => {
            seen.insert(name, (version, now));
            now
        }
    }
}

impl Members {
    /// The members of `ring`, whose Leases are in `namespace`. Starts watching them (needs a runtime).
    #[must_use]
    pub fn new(client: Client, namespace: &str, ring: &str, lease_duration: Duration) -> Self {
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let seen: Arc<Mutex<HashMap<String, (String, Instant)>>> = Arc::default();
        let config = watcher::Config::default().labels(&format!("{RING_LABEL}={ring}"));
        let events = watcher(api.clone(), config).default_backoff();
        let noted = Arc::clone(&seen);
        let watch = tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => {
                        note(&noted, &lease, Instant::now());
                    }
                    Ok(_) => {}
                    Err(err) => debug!("watching the ring's leases (retrying): {err}"),
                }
            }
        })
        .abort_handle();
        Self { api, ring: ring.to_owned(), lease_duration, seen, watch }
    }

    /// The current roster.
    pub async fn read(&mut self) -> Result<Roster, RingError> {
        let params = ListParams::default().labels(&format!("{RING_LABEL}={}", self.ring));
        let leases = self
            .api
            .list(&params)
            .await
            .map_err(|source| RingError::Members { ring: self.ring.clone(), source: Box::new(source) })?;
        let now = Instant::now();
        let mut roster = Roster::default();
        let mut names = BTreeSet::new();
        for lease in &leases.items {
            let name = lease.metadata.name.clone().unwrap_or_default();
            names.insert(name.clone());
            let Some(member) = lease.metadata.labels.as_ref().and_then(|l| l.get(MEMBER_LABEL)).cloned() else {
                continue;
            };
            let seen = note(&self.seen, lease, now);
            let spec = lease.spec.clone().unwrap_or_default();
            let held = spec.holder_identity.is_some_and(|h| !h.is_empty());
            let duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(self.lease_duration, Duration::from_secs);
            let claim = lease.metadata.annotations.as_ref().and_then(|a| a.get(BUCKETS_ANNOTATION));
            let claim = claim.and_then(|c| decode(c)).unwrap_or_default();
            if held && now.duration_since(seen) < duration {
                roster.claims.insert(member.clone(), claim);
                roster.live.push(member);
                let expiry = seen + duration;
                roster.next_expiry = Some(roster.next_expiry.map_or(expiry, |e| e.min(expiry)));
            } else {
                roster.left_behind.extend(claim);
                roster.gone.insert(member);
            }
        }
        self.seen.lock().expect("seen lock").retain(|name, _| names.contains(name));
        roster.live.sort();
        roster.gone.retain(|m| !roster.live.contains(m));
        Ok(roster)
    }

    /// Deletes the Lease of `member`, gone and owning nothing any more.
    async fn forget(&self, member: &str) {
        let shard = Shard::new(&self.ring, member);
        let name = member_lease_name(&shard);
        match self.api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => info!(member, "removed the lease of a member that left the ring"),
            Err(err) => debug!(member, "could not remove a gone member's lease: {err}"),
        }
    }
}

/// Moves one member's holding of buckets towards its share of the live members' (see the module doc),
/// for one term of its membership.
pub struct Keeper {
    members: Members,
    shard: Shard,
    notes: LeaseNotes,
    informers: Informers,
    metrics: ShardMetrics,
    /// How often the members are read.
    tick: Duration,
    /// How long a claim may take to be written (the renew deadline: later, the term is over anyway).
    write_timeout: Duration,
    /// How long the caches may take to list the buckets taken before their parents are synced anyway
    /// (a sync with a cache behind is safe: a create of a child it cannot see yet is refused).
    list_timeout: Duration,
}

impl Keeper {
    /// The keeper of `shard` in `config`'s ring, whose Leases are in `namespace`; `notes` are the
    /// annotations its member Lease is written with.
    #[must_use]
    pub fn new(
        client: Client,
        namespace: &str,
        config: &crate::ops::config::Config,
        hub: &crate::engine::hub::Hub,
        shard: Shard,
        notes: LeaseNotes,
    ) -> Self {
        let election = &config.leader_election;
        Self {
            members: Members::new(client, namespace, &shard.ring, election.lease_duration),
            shard,
            notes,
            informers: hub.informers.clone(),
            metrics: hub.metrics.shard.clone(),
            tick: election.retry_period,
            write_timeout: election.renew_deadline,
            list_timeout: config.cache_sync_timeout,
        }
    }

    /// Keeps the buckets until `cancel` fires (the term ends; the caller then clears what is held).
    pub async fn run(mut self, cancel: CancellationToken) {
        // Replicas started together (a new ring, a rollout) see each other's Leases a moment apart: one
        // that claimed at once would see itself alone, take every bucket, list every object of the
        // ring's types, and keep that memory after giving most of them back. A period's wait lets
        // their Leases appear first.
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(self.tick) => {}
        }
        loop {
            let next_expiry = match self.step().await {
                Ok(next_expiry) => next_expiry,
                Err(err) => {
                    warn!(member = %self.shard.member, "keeping the buckets (retrying): {err}");
                    None
                }
            };
            let mut wake = Instant::now() + self.tick;
            if let Some(expiry) = next_expiry {
                // Just after the moment a member would expire, not up to a tick later.
                wake = wake.min(expiry + Duration::from_millis(50));
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// One pass: lets go what is no longer this member's, then takes what is and nobody claims.
    /// Returns when the first live member expires unless it renews.
    async fn step(&mut self) -> Result<Option<Instant>, RingError> {
        let me = self.shard.member.clone();
        let held = Arc::clone(&self.shard.held);
        let roster = self.members.read().await?;
        let mut live = roster.live.clone();
        if !live.contains(&me) {
            live.push(me.clone());
            live.sort();
        }
        let mine = share(&me, &live);
        let claimed = held.claimed().await;
        let surplus: BTreeSet<u16> = claimed.difference(&mine).copied().collect();
        if !surplus.is_empty() {
            let started = std::time::Instant::now();
            held.release(&surplus).await;
            self.metrics.let_go(surplus.len(), started.elapsed());
            let kept = held.claimed().await;
            let written = self.notes.publish(claim_notes(&kept), self.write_timeout).await;
            info!(member = %me, buckets = surplus.len(), held = kept.len(), written, took = ?started.elapsed(), live = ?live, "let buckets go");
        }
        let claimed = held.claimed().await;
        let free: BTreeSet<u16> =
            mine.difference(&claimed).filter(|b| !roster.claimed_by_others(&me).contains(b)).copied().collect();
        if free.is_empty() {
            return Ok(roster.next_expiry);
        }
        let claim: BTreeSet<u16> = claimed.union(&free).copied().collect();
        if !self.notes.publish(claim_notes(&claim), self.write_timeout).await {
            warn!(member = %me, "claiming buckets: the member lease was not written in time; retrying");
            return Ok(roster.next_expiry);
        }
        // Read again after the claim is written: of two members claiming one bucket at once, at least
        // one sees the other's claim here, and withdraws.
        let after = self.members.read().await?;
        let others = after.claimed_by_others(&me);
        let (contested, won): (BTreeSet<u16>, BTreeSet<u16>) = free.iter().partition(|b| others.contains(b));
        if !contested.is_empty() {
            let kept: BTreeSet<u16> = claimed.union(&won).copied().collect();
            self.notes.set(claim_notes(&kept));
            info!(member = %me, buckets = contested.len(), "buckets claimed by another member at once: withdrawn");
        }
        if won.is_empty() {
            return Ok(after.next_expiry);
        }
        let started = std::time::Instant::now();
        let from_gone = won.intersection(&roster.left_behind).count();
        let selector = held.take(&won).await;
        let listed = self.informers.wait_listed(&selector, self.list_timeout).await;
        if !listed {
            warn!(member = %me, "the caches did not list the buckets taken in time: syncing their parents anyway");
        }
        held.settle().await;
        self.metrics.took(won.len(), held.claimed().await.len());
        info!(member = %me, buckets = won.len(), left_behind = from_gone, held = claim.len() - contested.len(), took = ?started.elapsed(), live = ?live, "took buckets");
        Ok(after.next_expiry)
    }
}

/// The ring's coordinator: checks every parent's bucket label each `rebalanceInterval` (the members
/// label new parents, [`crate::ops::labels`]) and removes the Leases of members that left. Runs only
/// while this replica holds the leader Lease, on a client whose writes stop when it may have lost it.
pub struct Coordinator {
    client: Client,
    discovery: Discovery,
    ring: String,
    /// Only controllers whose labels match it (`targetLabelSelector`), as the hub runs them.
    controllers: String,
    namespaces: Vec<String>,
    members: Members,
    /// How often every parent's label is checked.
    rebalance: Duration,
    /// How often the members are read.
    tick: Duration,
    /// The child types whose unlabelled children were labelled this term (see the module doc), by
    /// [`crate::ops::labels::ChildType::key`]; `None` before the first look.
    children_labelled: Option<BTreeSet<ChildTypeKey>>,
}

impl Coordinator {
    /// A coordinator of `config`'s ring, whose members' Leases are in `namespace`.
    #[must_use]
    pub fn new(client: Client, namespace: &str, config: &crate::ops::config::Config) -> Self {
        let election = &config.leader_election;
        let ring = &config.sharding.ring;
        Self {
            discovery: Discovery::new(client.clone(), config.discovery_interval),
            members: Members::new(client.clone(), namespace, ring, election.lease_duration),
            client,
            ring: ring.clone(),
            controllers: config.target_label_selector.clone(),
            namespaces: config.namespaces.clone(),
            rebalance: config.sharding.rebalance_interval,
            tick: election.retry_period,
            children_labelled: None,
        }
    }

    /// Coordinates until `cancel` fires.
    pub async fn run(mut self, cancel: CancellationToken) {
        info!(ring = %self.ring, "coordinating the ring");
        // The first full check a rebalance interval after the election, not at once: a coordinator
        // that changes hands often would otherwise read every parent each time.
        let mut last_full = Instant::now();
        let mut last_roster: Option<Roster> = None;
        loop {
            if let Err(err) = self.pass(&mut last_full, &mut last_roster).await {
                warn!(ring = %self.ring, "coordinating the ring (retrying): {err}");
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.tick) => {}
            }
        }
    }

    /// One pass: the Leases of members that left are removed, and the labels that name no bucket are
    /// put back when the rebalance interval has passed.
    async fn pass(&mut self, last_full: &mut Instant, last_roster: &mut Option<Roster>) -> Result<(), RingError> {
        let roster = self.members.read().await?;
        if last_roster.as_ref().is_none_or(|last| last.live != roster.live || last.gone != roster.gone) {
            info!(ring = %self.ring, live = ?roster.live, gone = ?roster.gone, "ring members");
        }
        for member in &roster.gone {
            self.members.forget(member).await;
        }
        *last_roster = Some(roster);
        let due = last_full.elapsed() >= self.rebalance;
        if !due && self.children_labelled.is_some() {
            return Ok(());
        }
        let (parent_types, child_types) = types(&self.client, &self.discovery, &self.controllers).await?;
        self.label_children(&child_types).await?;
        if !due {
            return Ok(());
        }
        for parent_type in parent_types {
            for selector in &parent_type.selectors {
                for api in scopes::<DynamicObject>(&self.client, &parent_type.parent, &self.namespaces) {
                    self.label_type(&parent_type.parent, &api, selector).await?;
                }
            }
        }
        *last_full = Instant::now();
        Ok(())
    }

    /// Labels the unlabelled children of each child type not done yet this term (see the module doc).
    async fn label_children(&mut self, child_types: &[ChildType]) -> Result<(), RingError> {
        if self.children_labelled.is_none() {
            // The parents' records of their children elsewhere, once per term as the children.
            let labelled = crate::ops::labels::label_records(&self.client, &self.ring, &self.discovery).await?;
            if labelled > 0 {
                info!(ring = %self.ring, records = labelled, "labelled the records of children elsewhere with their parents' buckets");
            }
        }
        let done = self.children_labelled.get_or_insert_with(BTreeSet::new);
        for child_type in child_types {
            let key = child_type.key();
            if done.contains(&key) {
                continue;
            }
            let labelled = label_children(&self.client, &self.ring, child_type, &self.namespaces).await?;
            if labelled > 0 {
                info!(ring = %self.ring, children = labelled, resource = %child_type.child.api_resource.plural, "labelled children written before the ring with their parents' buckets");
            }
            done.insert(key);
        }
        Ok(())
    }

    /// Labels every object `api` lists with `selector` whose label is there but names no bucket: a page
    /// of 500 at a time (metadata only), labelled before the next is read.
    async fn label_type(
        &self,
        resource: &ResolvedResource,
        api: &Api<DynamicObject>,
        selector: &str,
    ) -> Result<(), RingError> {
        let label = shard_label(&self.ring);
        let mut params = ListParams::default().labels(&both(selector, &no_bucket(&label))).limit(500);
        loop {
            let page = api.list_metadata(&params).await.map_err(|source| LabelError::List {
                resource: resource.api_resource.plural.clone(),
                source: Box::new(source),
            })?;
            // The server selected only labels that name no bucket: every one listed is wrong.
            let wrong: Vec<Parent> = page.items.into_iter().map(|o| Parent::of(o.metadata, &label)).collect();
            if !wrong.is_empty() {
                warn!(ring = %self.ring, parents = wrong.len(), resource = %resource.api_resource.plural, "putting back bucket labels someone else changed");
            }
            label_parents(&self.client, &self.ring, resource, &wrong).await;
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => return Ok(()),
            }
        }
    }
}

/// The selector of objects whose `label` names no bucket: it is there, and its value is none of them.
fn no_bucket(label: &str) -> String {
    let buckets: Vec<String> = (0..BUCKETS).map(|b| b.to_string()).collect();
    format!("{label},{label} notin ({})", buckets.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coordinator_lists_only_labels_that_name_no_bucket() {
        let selector = crate::cache::selector::parse_selector_string(&no_bucket("shard.metahook.dev/web")).unwrap();
        let labelled = |value: Option<&str>| {
            let labels: BTreeMap<String, String> =
                value.map(|v| ("shard.metahook.dev/web".to_owned(), v.to_owned())).into_iter().collect();
            selector.matches(&labels)
        };
        assert!(labelled(Some("elsewhere")));
        assert!(labelled(Some("1024")));
        assert!(labelled(Some("007")));
        assert!(!labelled(Some("0")));
        assert!(!labelled(Some("1023")));
        assert!(!labelled(None), "unlabelled parents are the members' to label");
    }

    #[test]
    fn member_leases_are_named_and_labelled_for_their_ring() {
        let shard = Shard::new("web_1", "hub-0-1a2b3c4d");
        assert_eq!(member_lease_name(&shard), "web-1-hub-0-1a2b3c4d");
        let labels = member_lease_labels(&shard);
        assert_eq!(labels[RING_LABEL], "web_1");
        assert_eq!(labels[MEMBER_LABEL], "hub-0-1a2b3c4d");
    }
}
