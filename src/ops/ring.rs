//! Sharding's ring: who its members are (each replica's own Lease), and the coordinator that assigns
//! parents to them (see [`crate::cache::shard`] for the labels and the hashing).
//!
//! # Membership
//! Every replica holds a Lease of its own, `<ring>-<member>`, in the leader-election namespace, labelled
//! with the ring and its member name, renewed by the same [`Elector`](crate::ops::leader::Elector) as the
//! leader Lease and gating the replica's writes the same way: a replica stops writing (and its
//! controllers stop) `renewDeadline` after its last successful renewal. The coordinator counts a member
//! live while its Lease has a holder and its record changed within `leaseDuration` of the coordinator's
//! own clock (the leader module's timing argument, [`crate::ops::leader`]): so by the time the
//! coordinator moves an expired member's parents, that member has stopped writing for
//! `leaseDuration − renewDeadline` at least. A Lease released on shutdown (no holder) leaves at once:
//! its replica stopped its controllers and saw its writes land first.
//!
//! # Assignment
//! The coordinator (the replica holding the leader Lease) lists each parent type — metadata only, a page
//! at a time, nothing kept — and compares every parent's shard label with [`assign`] over the live
//! members:
//! - unlabelled: labelled with its member at once (nobody syncs an unlabelled parent);
//! - owned by a live member that is no longer its member: marked with the drain label; the owner hands
//!   it over ([`crate::engine::handover`]);
//! - owned by a member that left: moved without drain, children first (the coordinator relabels the
//!   children that member's label still names), then the parent.
//!
//! Every write carries the resourceVersion (parents) or UID (children) it was decided on.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt as _, stream};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::api::{CompositeController, DecoratorController};
use crate::cache::discovery::{Discovery, ResolvedResource};
use crate::cache::informers::controller_uid;
use crate::cache::selector::server_side;
use crate::cache::shard::{
    DRAIN_REQUESTED_ANNOTATION, MEMBER_LABEL, MOVED_FROM_ANNOTATION, RING_LABEL, Shard, assign, drain_label,
    shard_label,
};

/// Writes the coordinator sends at once when it labels many parents (or children).
const WRITES_AT_ONCE: usize = 32;

/// How many ticks the coordinator uses the parent types it read before reading them again.
const TYPES_EVERY_TICKS: u32 = 5;

/// Errors of one pass of the coordinator (it retries at its next pass).
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("reading the members of ring {ring}: {source}")]
    Members { ring: String, source: Box<kube::Error> },
    #[error("reading the controllers: {0}")]
    Controllers(#[source] Box<kube::Error>),
    #[error("listing {resource}: {source}")]
    List { resource: String, source: Box<kube::Error> },
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

/// The ring's members as the coordinator last read them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Roster {
    /// Members whose Lease is held and unexpired, sorted.
    pub live: Vec<String>,
    /// Members with a Lease that expired or was released (their parents move without drain).
    pub gone: BTreeSet<String>,
    /// When the first live member expires unless it renews (on this process's clock): the coordinator
    /// looks again then, so a dead member's parents wait no longer than they must.
    pub next_expiry: Option<Instant>,
}

/// Reads the members' Leases and tells live ones from expired ones by when each record last changed
/// on this process's clock.
pub struct Members {
    api: Api<Lease>,
    ring: String,
    lease_duration: Duration,
    /// Lease name → (resourceVersion, the instant it was first seen at that version).
    seen: HashMap<String, (String, Instant)>,
}

impl Members {
    #[must_use]
    pub fn new(client: Client, namespace: &str, ring: &str, lease_duration: Duration) -> Self {
        Self { api: Api::namespaced(client, namespace), ring: ring.to_owned(), lease_duration, seen: HashMap::new() }
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
            let version = lease.metadata.resource_version.clone().unwrap_or_default();
            let seen = match self.seen.get(&name) {
                Some((v, at)) if *v == version => *at,
                _ => {
                    self.seen.insert(name.clone(), (version, now));
                    now
                }
            };
            let spec = lease.spec.clone().unwrap_or_default();
            let held = spec.holder_identity.is_some_and(|h| !h.is_empty());
            let duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(self.lease_duration, Duration::from_secs);
            if held && now.duration_since(seen) < duration {
                roster.live.push(member);
                let expiry = seen + duration;
                roster.next_expiry = Some(roster.next_expiry.map_or(expiry, |e| e.min(expiry)));
            } else {
                roster.gone.insert(member);
            }
        }
        self.seen.retain(|name, _| names.contains(name));
        roster.live.sort();
        roster.gone.retain(|m| !roster.live.contains(m));
        Ok(roster)
    }

    /// Deletes the Lease of `member`, gone and owning nothing any more.
    async fn forget(&self, member: &str) {
        let shard = Shard { ring: self.ring.clone(), member: member.to_owned() };
        let name = member_lease_name(&shard);
        match self.api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => info!(member, "removed the lease of a member that left the ring"),
            Err(err) => debug!(member, "could not remove a gone member's lease: {err}"),
        }
    }
}

/// Per parent type (apiVersion, resource): its controllers' parent selectors and child types.
type Wanted = (BTreeSet<String>, BTreeSet<(String, String)>);

/// One parent type, the label selectors its controllers choose parents with, and the child (or
/// attachment) types they write.
struct ParentType {
    parent: Arc<ResolvedResource>,
    /// Server-side forms of the controllers' parent selectors ("" = every object of the type).
    selectors: BTreeSet<String>,
    children: Vec<Arc<ResolvedResource>>,
}

/// `a` and `b` together (either may be empty).
fn both(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_owned(),
        (_, true) => a.to_owned(),
        _ => format!("{a},{b}"),
    }
}

/// What one parent looks like to the coordinator.
struct Parent {
    name: String,
    namespace: Option<String>,
    uid: String,
    version: Option<String>,
    owner: Option<String>,
    drain: Option<String>,
}

/// What a pass found still under way: drains requested and not yet handed over, parents on gone members.
#[derive(Default)]
struct Pending {
    drains: usize,
    /// Gone members some parent is still labelled with.
    owning: BTreeSet<String>,
}

/// The ring's coordinator: assigns parents to live members (see the module doc). Runs only while this
/// replica holds the leader Lease, on a client whose writes stop when it may have lost it.
pub struct Coordinator {
    client: Client,
    discovery: Discovery,
    ring: String,
    /// Only controllers whose labels match it (`targetLabelSelector`), as the hub runs them.
    controllers: String,
    members: Members,
    /// How often a full pass runs when nothing is pending.
    rebalance: Duration,
    /// How often unlabelled parents are looked for (and a full pass runs while something is pending).
    tick: Duration,
    /// The parent types as last read, and when: read again every few ticks, but not when a member just
    /// left (its parents wait for nothing else).
    types: Option<(Instant, Arc<Vec<ParentType>>)>,
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
            rebalance: config.sharding.rebalance_interval,
            tick: election.retry_period,
            types: None,
        }
    }

    /// Coordinates until `cancel` fires.
    pub async fn run(mut self, cancel: CancellationToken) {
        info!(ring = %self.ring, "coordinating the ring");
        let mut last_roster: Option<Roster> = None;
        let mut last_full = Instant::now();
        let mut pending = true;
        loop {
            match self.pass(&mut last_roster, &mut last_full, pending).await {
                Ok(still) => pending = still,
                Err(err) => warn!(ring = %self.ring, "coordinating the ring (retrying): {err}"),
            }
            let mut wake = Instant::now() + self.tick;
            if let Some(expiry) = last_roster.as_ref().and_then(|r| r.next_expiry) {
                // Just after the moment a member would expire, not up to a tick later.
                wake = wake.min(expiry + Duration::from_millis(50));
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// One pass: a full one when the members changed, something is pending or the rebalance interval
    /// passed; otherwise only unlabelled parents. Returns whether something is pending.
    async fn pass(
        &mut self,
        last_roster: &mut Option<Roster>,
        last_full: &mut Instant,
        pending: bool,
    ) -> Result<bool, RingError> {
        let roster = self.members.read().await?;
        if roster.live.is_empty() {
            return Ok(true);
        }
        let changed = last_roster.as_ref().is_none_or(|last| last.live != roster.live || last.gone != roster.gone);
        if changed {
            info!(ring = %self.ring, live = ?roster.live, gone = ?roster.gone, "ring members");
        }
        let types = match &self.types {
            Some((read, types)) if changed || read.elapsed() < self.tick * TYPES_EVERY_TICKS => Arc::clone(types),
            _ => {
                let types = Arc::new(self.parent_types().await?);
                self.types = Some((Instant::now(), Arc::clone(&types)));
                types
            }
        };
        let full = changed || pending || last_full.elapsed() >= self.rebalance;
        let mut found = Pending::default();
        for parent_type in types.iter() {
            if full {
                self.rebalance_type(parent_type, &roster, &mut found).await?;
            } else {
                self.assign_unlabelled(parent_type, &roster).await?;
            }
        }
        if full {
            *last_full = Instant::now();
            for member in roster.gone.difference(&found.owning) {
                self.members.forget(member).await;
            }
        }
        *last_roster = Some(roster);
        Ok(found.drains > 0 || !found.owning.is_empty())
    }

    /// Every parent type of the hub's controllers, with the types its controllers write.
    async fn parent_types(&self) -> Result<Vec<ParentType>, RingError> {
        let err = |e| RingError::Controllers(Box::new(e));
        let params = ListParams::default().labels(&self.controllers);
        let composites = Api::<CompositeController>::all(self.client.clone()).list(&params).await.map_err(err)?;
        let decorators = Api::<DecoratorController>::all(self.client.clone()).list(&params).await.map_err(err)?;
        let mut wanted: BTreeMap<(String, String), Wanted> = BTreeMap::new();
        for cc in &composites.items {
            let rule = &cc.spec.parent_resource;
            let (selectors, children) = wanted.entry((rule.api_version.clone(), rule.resource.clone())).or_default();
            selectors.insert(server_side(rule.label_selector.as_ref()));
            children.extend(cc.spec.child_resources.iter().map(|c| (c.api_version.clone(), c.resource.clone())));
        }
        for dc in &decorators.items {
            for rule in &dc.spec.resources {
                let (selectors, children) =
                    wanted.entry((rule.api_version.clone(), rule.resource.clone())).or_default();
                selectors.insert(server_side(rule.label_selector.as_ref()));
                children.extend(dc.spec.attachments.iter().map(|c| (c.api_version.clone(), c.resource.clone())));
            }
        }
        let mut types = Vec::new();
        for ((api_version, resource), (selectors, children)) in wanted {
            let Ok(parent) = self.discovery.resolve(&api_version, &resource).await else { continue };
            let mut resolved = Vec::new();
            for (api_version, resource) in children {
                if let Ok(child) = self.discovery.resolve(&api_version, &resource).await {
                    resolved.push(child);
                }
            }
            types.push(ParentType { parent, selectors, children: resolved });
        }
        Ok(types)
    }

    /// Lists `resource`'s objects (metadata only) that `selector` matches, a page at a time.
    async fn list(&self, resource: &ResolvedResource, selector: &str) -> Result<Vec<ObjectMeta>, RingError> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource.api_resource);
        let mut params = ListParams::default().labels(selector).limit(500);
        let mut items = Vec::new();
        loop {
            let page = api.list_metadata(&params).await.map_err(|source| RingError::List {
                resource: resource.api_resource.plural.clone(),
                source: Box::new(source),
            })?;
            items.extend(page.items.into_iter().map(|o| o.metadata));
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => return Ok(items),
            }
        }
    }

    fn parent_of(&self, meta: ObjectMeta) -> Parent {
        let label = |key: &str| meta.labels.as_ref().and_then(|l| l.get(key)).cloned();
        Parent {
            owner: label(&shard_label(&self.ring)),
            drain: label(&drain_label(&self.ring)),
            name: meta.name.unwrap_or_default(),
            namespace: meta.namespace,
            uid: meta.uid.unwrap_or_default(),
            version: meta.resource_version,
        }
    }

    fn api(&self, resource: &ResolvedResource, namespace: Option<&str>) -> Api<DynamicObject> {
        match namespace.filter(|_| resource.namespaced) {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource.api_resource),
            None => Api::all_with(self.client.clone(), &resource.api_resource),
        }
    }

    /// Merge-patches a parent's metadata under a compare-and-swap on the version it was decided on; a
    /// conflict or a parent gone is left to the next pass.
    async fn patch_parent(&self, resource: &ResolvedResource, parent: &Parent, metadata: serde_json::Value) {
        let mut patch = json!({"metadata": metadata});
        patch["metadata"]["resourceVersion"] = json!(parent.version);
        let api = self.api(resource, parent.namespace.as_deref());
        match api.patch(&parent.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                debug!(parent = %parent.name, "parent changed since the coordinator looked; next pass");
            }
            Err(err) => warn!(parent = %parent.name, "coordinator could not label the parent: {err}"),
        }
    }

    /// [`Coordinator::patch_parent`] for each of `patches`, several at once: a rebalance moves a share
    /// of every parent, and one at a time would hold a gone member's parents for seconds more.
    async fn patch_parents(&self, resource: &ResolvedResource, patches: Vec<(&Parent, serde_json::Value)>) {
        stream::iter(patches)
            .for_each_concurrent(WRITES_AT_ONCE, |(parent, metadata)| self.patch_parent(resource, parent, metadata))
            .await;
    }

    /// Moves `parent` of a gone member to `target`: its `children` first, then the parent (left where it
    /// is if a child could not be relabelled: it would be invisible to the new owner).
    async fn move_parent(
        &self,
        resource: &ResolvedResource,
        parent: &Parent,
        target: &str,
        children: &[(&Arc<ResolvedResource>, ObjectMeta)],
    ) {
        let (label, drain) = (shard_label(&self.ring), drain_label(&self.ring));
        for (child_type, child) in children {
            let patch = json!({"metadata": {"uid": child.uid, "labels": {&label: target}}});
            let api = self.api(child_type, child.namespace.as_deref());
            let name = child.name.clone().unwrap_or_default();
            if let Err(err) = api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                warn!(child = %name, "coordinator could not relabel the child of a gone member's parent: {err}");
                return;
            }
        }
        let from = parent.owner.clone().unwrap_or_default();
        let metadata = json!({
            "labels": {&label: target, &drain: null},
            "annotations": {MOVED_FROM_ANNOTATION: from, DRAIN_REQUESTED_ANNOTATION: null},
        });
        self.patch_parent(resource, parent, metadata).await;
    }

    /// Labels the unlabelled parents of `parent_type` with their member.
    async fn assign_unlabelled(&self, parent_type: &ParentType, roster: &Roster) -> Result<(), RingError> {
        let mut unlabelled = Vec::new();
        for selector in &parent_type.selectors {
            let unassigned = both(selector, &format!("!{}", shard_label(&self.ring)));
            unlabelled.extend(self.list(&parent_type.parent, &unassigned).await?);
        }
        let parents: Vec<Parent> = unlabelled.into_iter().map(|meta| self.parent_of(meta)).collect();
        let label = shard_label(&self.ring);
        let patches = parents
            .iter()
            .filter_map(|parent| Some((parent, json!({"labels": {&label: assign(&parent.uid, &roster.live)?}}))))
            .collect();
        self.patch_parents(&parent_type.parent, patches).await;
        Ok(())
    }

    /// Checks every parent of `parent_type` against the assignment (see the module doc).
    async fn rebalance_type(
        &self,
        parent_type: &ParentType,
        roster: &Roster,
        found: &mut Pending,
    ) -> Result<(), RingError> {
        let label = shard_label(&self.ring);
        let drain = drain_label(&self.ring);
        let mut metas = Vec::new();
        for selector in &parent_type.selectors {
            metas.extend(self.list(&parent_type.parent, selector).await?);
        }
        let parents: Vec<Parent> = metas.into_iter().map(|meta| self.parent_of(meta)).collect();
        let mut patches = Vec::new();
        let mut orphaned: Vec<(&Parent, String)> = Vec::new();
        for parent in &parents {
            let Some(target) = assign(&parent.uid, &roster.live).map(str::to_owned) else { continue };
            match parent.owner.as_deref() {
                Some(owner) if owner == target => {
                    if parent.drain.is_some() {
                        // Asked to move, then the members changed back: it stays.
                        let metadata =
                            json!({"labels": {&drain: null}, "annotations": {DRAIN_REQUESTED_ANNOTATION: null}});
                        patches.push((parent, metadata));
                    }
                }
                None => patches.push((parent, json!({"labels": {&label: target}}))),
                Some(owner) if roster.live.iter().any(|m| m == owner) => {
                    found.drains += 1;
                    if parent.drain.as_deref() != Some(target.as_str()) {
                        let now = k8s_openapi::jiff::Timestamp::now().to_string();
                        let metadata =
                            json!({"labels": {&drain: target}, "annotations": {DRAIN_REQUESTED_ANNOTATION: now}});
                        patches.push((parent, metadata));
                    }
                }
                Some(owner) => {
                    found.owning.insert(owner.to_owned());
                    orphaned.push((parent, target));
                }
            }
        }
        self.patch_parents(&parent_type.parent, patches).await;
        if orphaned.is_empty() {
            return Ok(());
        }
        // Children first: by the time the new owner sees the parent, its children are in its watch.
        let gone: BTreeSet<&str> = orphaned.iter().filter_map(|(p, _)| p.owner.as_deref()).collect();
        let selector = format!("{label} in ({})", gone.iter().copied().collect::<Vec<_>>().join(","));
        let targets: HashMap<&str, &str> = orphaned.iter().map(|(p, t)| (p.uid.as_str(), t.as_str())).collect();
        let mut children: HashMap<String, Vec<(&Arc<ResolvedResource>, ObjectMeta)>> = HashMap::new();
        for child_type in &parent_type.children {
            for child in self.list(child_type, &selector).await? {
                let Some(owner) = controller_uid_of(&child).filter(|uid| targets.contains_key(uid.as_str())) else {
                    continue;
                };
                children.entry(owner).or_default().push((child_type, child));
            }
        }
        // Parent by parent, several at once: each one's children first, then the parent, so its new
        // owner can start on it while the others are still being moved.
        let moves: Vec<_> = orphaned
            .iter()
            .map(|(parent, target)| {
                let theirs = children.get(&parent.uid).map(Vec::as_slice).unwrap_or_default();
                self.move_parent(&parent_type.parent, parent, target, theirs)
            })
            .collect();
        stream::iter(moves).buffer_unordered(WRITES_AT_ONCE).for_each(|()| async {}).await;
        info!(parents = orphaned.len(), resource = %parent_type.parent.api_resource.plural, "moved the parents of members that left");
        Ok(())
    }
}

/// The controller owner's UID in `meta`.
fn controller_uid_of(meta: &ObjectMeta) -> Option<String> {
    let obj = DynamicObject { types: None, metadata: meta.clone(), data: serde_json::Value::Null };
    controller_uid(&obj).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_leases_are_named_and_labelled_for_their_ring() {
        let shard = Shard { ring: "web_1".into(), member: "hub-0-1a2b3c4d".into() };
        assert_eq!(member_lease_name(&shard), "web-1-hub-0-1a2b3c4d");
        let labels = member_lease_labels(&shard);
        assert_eq!(labels[RING_LABEL], "web_1");
        assert_eq!(labels[MEMBER_LABEL], "hub-0-1a2b3c4d");
    }

    #[test]
    fn parent_selectors_are_written_as_the_api_server_reads_them() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
        let selector: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "legacy", "operator": "DoesNotExist"},
                {"key": "team", "operator": "Exists"},
            ],
        }))
        .unwrap();
        assert_eq!(server_side(Some(&selector)), "app=web,tier in (a,b),!legacy,team");
        assert_eq!(server_side(None), "");
        assert_eq!(both("", "!x"), "!x");
        assert_eq!(both("a=b", "!x"), "a=b,!x");
    }
}
