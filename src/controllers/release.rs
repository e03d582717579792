//! Letting go of what a controller holds — its finalizer on the objects it synced, its records of
//! children elsewhere, and the hub's own finalizer on the controller object — when the controller is
//! deleted, removed from the files, leaves this hub's selector, or stops syncing a parent type.
//!
//! One rule for every such wait: **what cannot exist is released**. A parent type whose CRD was deleted
//! (the API answers 404), whose version is no longer served (404 or 410), or that never existed has no
//! object left that could carry the finalizer, so there is nothing to wait for; the same holds for a
//! record type that is not installed and for an object that is gone. `kubectl delete -k` of a whole
//! controller deletes its parent CRD beside the controller, and would otherwise wait on a list that can
//! never succeed ([`cannot_exist`] decides it, in one place, for every caller).
//!
//! A release that really failed (the API server refused, timed out, a discovery error) is waited on:
//! [`Waiting`] says what for, and [`Release::run`] tries again with backoff in seconds, never only at
//! the controller's next event or relist, saying each new cause in the log, in an Event and in the
//! controller's `Ready` condition (reason `Releasing`), so `kubectl get` shows why it is still there.
//!
//! The same functions serve `metahook release` ([`crate::tools::release`]), which does what a hub start
//! would release, then exits, for a cluster where no hub runs any more.

use std::fmt;
use std::time::Duration;

use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::ClusterResourceScope;
use kube::{Client, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::{info, warn};

use crate::cache::discovery::{Discovery, DiscoveryError};
use crate::engine::sync::api_for;

/// The finalizer on every controller object of the API the hub runs: a deleted controller stays until a
/// hub has taken the controller's own finalizer off every object it synced.
pub const CONTROLLER_FINALIZER: &str = "metahook.dev/release-objects";

/// The `Ready` condition's reason while a deleted controller waits for its release.
pub const RELEASING: &str = "Releasing";

pub use crate::cache::discovery::cannot_exist;

/// Where a release looks: the API, its discovery, and the namespaces the hub is limited to (empty: the
/// whole cluster; a hub limited to some may list nothing else).
#[derive(Clone)]
pub struct Scope {
    pub client: Client,
    pub discovery: Discovery,
    pub namespaces: Vec<String>,
}

/// What one controller holds, to be let go of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holdings {
    /// The controller's name, for the log and its records.
    pub controller: String,
    /// The finalizer it puts on the objects it syncs.
    pub finalizer: String,
    /// The types (apiVersion, plural) that finalizer may be on.
    pub types: Vec<(String, String)>,
    /// Whether its records of children elsewhere are released too.
    pub records: bool,
}

/// What a release still waits for: one cause per type or object that could not be dealt with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Waiting(pub Vec<String>);

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("; "))
    }
}

/// What one attempt at a release did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// How many objects (and records) were let go of.
    pub released: usize,
    /// What is still waited for (empty: all done).
    pub waiting: Waiting,
}

impl Outcome {
    /// Whether nothing is waited for any more.
    #[must_use]
    pub fn done(&self) -> bool {
        self.waiting.0.is_empty()
    }
}

/// Lets go of `holdings` once: every object of its types that carries its finalizer loses it, and its
/// records are released. What could be done is done, whatever else failed.
pub async fn release(scope: &Scope, holdings: &Holdings) -> Outcome {
    let mut outcome = Outcome::default();
    // A hub limited to namespaces refuses `crossNamespace` controllers (it never wrote their records) and
    // may not list records across the cluster: a hub that may does it.
    if holdings.records && scope.namespaces.is_empty() {
        match crate::write::record_migration::release_all(&scope.client, &holdings.controller).await {
            Ok(n) => outcome.released += n,
            Err(crate::write::records::RecordError::Read { source, .. }) if cannot_exist(&source) => {}
            Err(err) => outcome.waiting.0.push(format!("its records of children elsewhere: {err}")),
        }
    }
    for (api_version, resource) in &holdings.types {
        release_type(scope, &holdings.finalizer, api_version, resource, &mut outcome).await;
    }
    outcome
}

/// Takes `finalizer` off every object of one type (in the scope's namespaces) that carries it.
async fn release_type(scope: &Scope, finalizer: &str, api_version: &str, resource: &str, outcome: &mut Outcome) {
    let what = format!("{resource}.{api_version}");
    let resolved = match scope.discovery.resolve(api_version, resource).await {
        Ok(resolved) => resolved,
        // Not served: no object of it can carry the finalizer.
        Err(DiscoveryError::NotFound { .. } | DiscoveryError::BadApiVersion { .. }) => return,
        Err(DiscoveryError::Api { source, .. }) if cannot_exist(&source) => return,
        Err(err) => return outcome.waiting.0.push(format!("{what}: {err}")),
    };
    let apis: Vec<Api<kube::api::DynamicObject>> = match scope.namespaces.as_slice() {
        namespaces if resolved.namespaced && !namespaces.is_empty() => {
            namespaces.iter().map(|ns| Api::namespaced_with(scope.client.clone(), ns, &resolved.api_resource)).collect()
        }
        _ => vec![Api::all_with(scope.client.clone(), &resolved.api_resource)],
    };
    let mut items = Vec::new();
    for api in apis {
        match api.list(&ListParams::default()).await {
            Ok(list) => items.extend(list.items),
            // The CRD was deleted since discovery answered (its objects with it), or the version is
            // no longer served, or the namespace is gone.
            Err(err) if cannot_exist(&err) => {}
            Err(err) => outcome.waiting.0.push(format!("listing {what}: {err}")),
        }
    }
    for item in items.iter().filter(|o| crate::engine::finalizer::has_finalizer(o, finalizer)) {
        let api = api_for(&scope.client, &resolved, item);
        match remove_finalizer(&api, item, finalizer).await {
            Ok(()) => {
                outcome.released += 1;
                info!(object = %item.name_any(), namespace = ?item.namespace(), finalizer, "removed finalizer of a controller that let go");
            }
            Err(err) => outcome.waiting.0.push(format!("{} {}: {err}", resolved.kind(), describe(item))),
        }
    }
}

/// Takes `finalizer` off `obj` with a JSON patch that tests the object's UID and that one entry, then
/// removes it: no `resourceVersion` precondition, so others' writes to the object (a tenant writing its
/// own parent hundreds of times a second) cannot make it conflict for ever. Only a changed finalizer list
/// (the test fails) reads the object again.
async fn remove_finalizer(
    api: &Api<kube::api::DynamicObject>,
    obj: &kube::api::DynamicObject,
    finalizer: &str,
) -> Result<(), kube::Error> {
    let name = obj.name_any();
    let mut current = std::borrow::Cow::Borrowed(obj);
    for _ in 0..5 {
        let Some(index) = current.metadata.finalizers.iter().flatten().position(|f| f == finalizer) else {
            return Ok(());
        };
        let at = format!("/metadata/finalizers/{index}");
        let ops: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/uid", "value": obj.metadata.uid},
            {"op": "test", "path": at, "value": finalizer},
            {"op": "remove", "path": at},
        ]))
        .map_err(kube::Error::SerdeError)?;
        match api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(ops)).await {
            Ok(_) => return Ok(()),
            Err(err) if cannot_exist(&err) => return Ok(()),
            // A test failed: the list (or the object) changed since it was read.
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 422 => {}
            Err(err) => return Err(err),
        }
        match api.get_opt(&name).await? {
            Some(live) if live.metadata.uid == obj.metadata.uid => current = std::borrow::Cow::Owned(live),
            _ => return Ok(()),
        }
    }
    let message = format!("the finalizers of {name} kept changing while {finalizer} was taken off");
    Err(kube::Error::Api(Box::new(kube::core::Status::failure(&message, "Conflict").with_code(409))))
}

fn describe(obj: &kube::api::DynamicObject) -> String {
    match obj.namespace() {
        Some(ns) => format!("{ns}/{}", obj.name_any()),
        None => obj.name_any(),
    }
}

/// Takes the hub's finalizer off controller object `name` of kind `K`, read afresh (a conflict reads it
/// again); a controller that is gone, or made again under its name (another UID), needs nothing.
pub async fn remove_controller_finalizer<K>(client: &Client, name: &str, uid: Option<&str>) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = (), Scope = ClusterResourceScope> + Clone + DeserializeOwned + fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    for _ in 0..5 {
        let Some(current) = api.get_opt(name).await? else { return Ok(()) };
        if uid.is_some() && current.meta().uid.as_deref() != uid {
            return Ok(());
        }
        let finalizers: Vec<&String> =
            current.meta().finalizers.iter().flatten().filter(|f| *f != CONTROLLER_FINALIZER).collect();
        if finalizers.len() == current.meta().finalizers.as_ref().map_or(0, Vec::len) {
            return Ok(());
        }
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": current.meta().resource_version}});
        match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(err) if cannot_exist(&err) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(err) => return Err(err),
        }
    }
    let message = format!("{name} kept changing while its finalizer was taken off");
    Err(kube::Error::Api(Box::new(kube::core::Status::failure(&message, "Conflict").with_code(409))))
}

/// The backoff between two attempts at a release that waits: 1 s, doubling, at most 30 s.
#[must_use]
pub fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.min(5)).min(Duration::from_secs(30))
}

/// What is said while a release waits: called with each new cause (not again while it stays the same).
pub trait Report: Send + Sync {
    /// The release waits for `waiting`; the next attempt is in `retry`.
    fn waiting(&self, waiting: &Waiting, retry: Duration) -> impl Future<Output = ()> + Send;
}

/// One release of a controller's holdings, retried until done.
pub struct Release {
    pub scope: Scope,
    pub holdings: Holdings,
}

impl Release {
    /// Releases, retrying with [`backoff`] until nothing is waited for; returns how many objects were
    /// let go of over all attempts. Runs until done: the caller cancels it (a hub that stops, a
    /// controller that comes back) by dropping or aborting the task.
    pub async fn run(&self, report: &impl Report) -> usize {
        let mut attempt = 0;
        let mut total = 0;
        let mut said = Waiting::default();
        loop {
            let outcome = release(&self.scope, &self.holdings).await;
            total += outcome.released;
            if outcome.done() {
                return total;
            }
            let retry = backoff(attempt);
            if outcome.waiting != said {
                warn!(controller = %self.holdings.controller, "waiting to let go of the controller's objects (retrying in {retry:?}): {}", outcome.waiting);
                report.waiting(&outcome.waiting, retry).await;
                said = outcome.waiting;
            }
            tokio::time::sleep(retry).await;
            attempt += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status::failure("x", "x").with_code(code)))
    }

    #[test]
    fn a_type_or_object_that_cannot_exist_is_not_waited_for_and_a_real_failure_is() {
        assert!(cannot_exist(&api_error(404)));
        assert!(cannot_exist(&api_error(410)));
        for code in [403, 409, 422, 429, 500, 503, 504] {
            assert!(!cannot_exist(&api_error(code)), "{code}");
        }
    }

    #[test]
    fn the_backoff_is_in_seconds_and_bounded() {
        let waits: Vec<u64> = (0..8).map(|a| backoff(a).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
    }

    #[test]
    fn waiting_says_every_cause() {
        let w = Waiting(vec!["a.v1: timed out".into(), "ns/x: refused".into()]);
        assert_eq!(w.to_string(), "a.v1: timed out; ns/x: refused");
    }
}
