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

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::DynamicObject;
use std::sync::Arc;

use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::ClusterResourceScope;
use kube::{Client, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::{info, warn};

use crate::cache::discovery::{Discovery, DiscoveryError, ResolvedResource};
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
    /// Its child types (apiVersion, plural): where the children of a released parent type whose CRD went
    /// are looked for (`sweep_children`).
    pub children: Vec<(String, String)>,
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
    sweep_children(scope, holdings, &mut outcome).await;
    outcome
}

/// The name of the CRD that would serve `resource` of `api_version` (`<plural>.<group>`); `None` for a
/// group that cannot be a CRD's: the core group, the built-in groups without a dot, and Kubernetes'
/// own `*.k8s.io` groups (`networking.k8s.io`, `rbac.authorization.k8s.io`: a CRD there needs the
/// API approval annotation, and their types are built in).
#[must_use]
pub fn crd_name(api_version: &str, resource: &str) -> Option<String> {
    let (group, _) = api_version.rsplit_once('/')?;
    (group.contains('.') && !group.ends_with(".k8s.io")).then(|| format!("{resource}.{group}"))
}

/// What a parent type's CRD says of its objects, read at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CrdState {
    /// No such CRD: none of its objects exists.
    Gone,
    /// Being deleted: every object of it goes.
    Deleting,
    /// It stays (created again, perhaps): its objects are alive unless found gone one by one.
    Stays,
}

/// Reads the CRD `name`; `None` when the hub may not (a role printed before `metahook rbac` granted
/// it; said in the log): its objects' children are then the garbage collector's.
async fn crd_state(scope: &Scope, name: &str) -> Result<Option<CrdState>, kube::Error> {
    match Api::<CustomResourceDefinition>::all(scope.client.clone()).get_opt(name).await {
        Ok(None) => Ok(Some(CrdState::Gone)),
        Ok(Some(crd)) if crd.metadata.deletion_timestamp.is_some() => Ok(Some(CrdState::Deleting)),
        Ok(Some(_)) => Ok(Some(CrdState::Stays)),
        Err(kube::Error::Api(status)) if status.code == 403 => {
            warn!(crd = %name, "may not read the parent type's CRD: the children its parents leave are the garbage collector's");
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

/// A released parent type whose objects are all gone or going, by its CRD: the only owners a sweep
/// looks at are of exactly this type (group and kind), never another kind of its group (another CRD's,
/// whose objects may exist while not served).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Doomed {
    /// The CRD's name, read again after each list of children (see [`sweep_children`]).
    crd: String,
    /// The type, as the hub resolved it while it ran the controller.
    parent: Arc<ResolvedResource>,
}

impl Doomed {
    fn owns(&self, owner: &OwnerReference) -> bool {
        owner.controller == Some(true)
            && group_of(&owner.api_version) == self.parent.api_resource.group
            && owner.kind == self.parent.api_resource.kind
    }
}

fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// Whether a released parent type's objects are all gone or going: its CRD deleted, and the type no
/// longer served (a type served another way, an aggregated API's, is not a CRD's), or its CRD being
/// deleted. Its kind is the one the hub resolved while it ran the controller ([`Discovery::known`]):
/// a process that never resolved it (a hub started after the CRD went, `metahook release`) cannot
/// tell its children, and leaves them to the garbage collector.
async fn doomed(scope: &Scope, api_version: &str, resource: &str) -> Result<Option<Doomed>, kube::Error> {
    let Some(crd) = crd_name(api_version, resource) else { return Ok(None) };
    match crd_state(scope, &crd).await? {
        None | Some(CrdState::Stays) => return Ok(None),
        Some(CrdState::Deleting) => {}
        Some(CrdState::Gone) => {
            let gv: kube::core::GroupVersion = match api_version.parse() {
                Ok(gv) => gv,
                Err(_) => return Ok(None),
            };
            match kube::discovery::oneshot::pinned_group(&scope.client, &gv).await {
                Ok(group) if group.versioned_resources(&gv.version).iter().any(|(ar, _)| ar.plural == resource) => {
                    return Ok(None);
                }
                Err(err) if !cannot_exist(&err) && !matches!(err, kube::Error::Discovery(_)) => return Err(err),
                _ => {}
            }
        }
    }
    let Some(parent) = scope.discovery.known(api_version, resource) else {
        info!(crd = %crd, "the parent type's CRD went before this process resolved it: the children its parents leave are the garbage collector's");
        return Ok(None);
    };
    Ok(Some(Doomed { crd, parent }))
}

/// Where a child's controlling owner is, for a sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// No object of its name and UID exists: the child is garbage, as the garbage collector says.
    Gone,
    /// It exists and is not going (a CRD created anew), or is held in its deletion by someone's
    /// finalizer (which may need the child meanwhile), or the type cannot be read: the child stays.
    Stays,
    /// Its CRD is being deleted and it has not gone yet, held by nobody: the release looks again.
    Going,
}

/// Where `child`'s controlling `owner`, of a doomed type whose CRD is `now` (read after the child was
/// listed), is. Gone, the CRD took every object of it. Otherwise (being deleted, or created anew), the
/// owner is looked up by name and UID through the type as served now (by group and kind, whatever
/// its version): a parent held by a finalizer of someone's, or a new parent, keeps its child.
async fn owner_of(
    scope: &Scope,
    doom: &Doomed,
    now: &CrdState,
    child: &DynamicObject,
    owner: &OwnerReference,
) -> Result<Owner, kube::Error> {
    if *now == CrdState::Gone {
        return Ok(Owner::Gone);
    }
    let parent = &doom.parent.api_resource;
    let Some(served) = scope.discovery.resolve_kind(&parent.group, &parent.kind).await? else {
        return Ok(Owner::Stays);
    };
    let api: Api<DynamicObject> = match child.namespace() {
        Some(ns) if served.namespaced => Api::namespaced_with(scope.client.clone(), &ns, &served.api_resource),
        _ => Api::all_with(scope.client.clone(), &served.api_resource),
    };
    Ok(match api.get_opt(&owner.name).await? {
        Some(live) if live.uid().as_deref() == Some(owner.uid.as_str()) => match now {
            CrdState::Deleting if live.finalizers().is_empty() => Owner::Going,
            _ => Owner::Stays,
        },
        _ => Owner::Gone,
    })
}

/// Deletes the children whose controlling owner was of a released parent type that can no longer exist.
///
/// Kubernetes' garbage collector deletes a child once its owner is gone, but only for an owner type it
/// watches, and it starts watching a new CRD at its next discovery pass (every 30 s): the children of a
/// parent type whose CRD was created and deleted within that time (a controller installed, tried and
/// torn down with `kubectl delete -k`) are never collected. The hub made them; as the garbage collector
/// would, it deletes them (UID precondition), only once the type's CRD says its objects went or go
/// ([`doomed`]), and only a child whose controlling owner is of exactly that type and is gone by the
/// CRD as read after that child was listed, or by name and UID ([`owner_of`]): a CRD created again
/// meanwhile keeps its new parents' children, and a parent someone's finalizer holds keeps its own
/// until it goes (a parent the CRD's deletion has not reached yet is looked at again).
///
/// A cleanup, not a promise the release waits on: what the API server refuses (403) is said in the log
/// and left to the garbage collector; only what may pass (a timeout, a 5xx) is tried again.
async fn sweep_children(scope: &Scope, holdings: &Holdings, outcome: &mut Outcome) {
    let mut dooms = Vec::new();
    for (api_version, resource) in &holdings.types {
        match doomed(scope, api_version, resource).await {
            Ok(Some(doom)) => dooms.push(doom),
            Ok(None) => {}
            Err(err) => retry_or_log(outcome, &format!("reading the CRD of {resource}.{api_version}"), &err),
        }
    }
    if dooms.is_empty() {
        return;
    }
    for (api_version, resource) in &holdings.children {
        let what = format!("{resource}.{api_version}");
        let resolved = match scope.discovery.resolve(api_version, resource).await {
            Ok(resolved) => resolved,
            Err(DiscoveryError::NotFound { .. } | DiscoveryError::BadApiVersion { .. }) => continue,
            Err(DiscoveryError::Api { source, .. }) => {
                retry_or_log(outcome, &what, &source);
                continue;
            }
        };
        for api in apis(scope, &resolved) {
            let items = match api.list(&ListParams::default()).await {
                Ok(list) => list.items,
                Err(err) if cannot_exist(&err) => continue,
                Err(err) => {
                    retry_or_log(outcome, &format!("listing {what}"), &err);
                    continue;
                }
            };
            for doom in &dooms {
                let orphans: Vec<&DynamicObject> =
                    items.iter().filter(|child| child.owner_references().iter().any(|o| doom.owns(o))).collect();
                if orphans.is_empty() {
                    continue;
                }
                // Read after the list: what it says holds for every child the list showed.
                let now = match crd_state(scope, &doom.crd).await {
                    Ok(Some(now)) => now,
                    Ok(None) => continue,
                    Err(err) => {
                        retry_or_log(outcome, &format!("reading the CRD {}", doom.crd), &err);
                        continue;
                    }
                };
                for child in orphans {
                    let Some(owner) = child.owner_references().iter().find(|o| doom.owns(o)) else { continue };
                    match owner_of(scope, doom, &now, child, owner).await {
                        Ok(Owner::Gone) => {}
                        Ok(Owner::Stays) => continue,
                        Ok(Owner::Going) => {
                            let what = format!("{} {}", resolved.kind(), describe(child));
                            outcome
                                .waiting
                                .0
                                .push(format!("{what} waits for its parent {} to go with its CRD", owner.name));
                            continue;
                        }
                        Err(err) => {
                            retry_or_log(
                                outcome,
                                &format!("the owner of {} {}", resolved.kind(), describe(child)),
                                &err,
                            );
                            continue;
                        }
                    }
                    match delete_child(&api_for(&scope.client, &resolved, child), child).await {
                        Ok(()) => {
                            outcome.released += 1;
                            info!(child = %describe(child), kind = %resolved.kind(), owner = %owner.name, controller = %holdings.controller, "deleted a child whose parent went with its CRD (the garbage collector may never have watched that type)");
                        }
                        Err(err) => {
                            retry_or_log(outcome, &format!("deleting {} {}", resolved.kind(), describe(child)), &err);
                        }
                    }
                }
            }
        }
    }
}

/// A sweep's failure: waited on (the release is tried again) when another try may pass, else said in
/// the log and left (a refusal of the API server's, 403 or 4xx, does not hold a controller's delete).
fn retry_or_log(outcome: &mut Outcome, what: &str, err: &kube::Error) {
    match &err {
        kube::Error::Api(status) if (400..500).contains(&status.code) && status.code != 429 => {
            warn!(what, error = %err, "a child its parent's deleted CRD left is left to the garbage collector");
        }
        _ => outcome.waiting.0.push(format!("{what}: {err}")),
    }
}

/// One `Api` per namespace the scope is limited to (a namespaced type), else one for the whole cluster.
fn apis(scope: &Scope, resolved: &crate::cache::discovery::ResolvedResource) -> Vec<Api<kube::api::DynamicObject>> {
    match scope.namespaces.as_slice() {
        namespaces if resolved.namespaced && !namespaces.is_empty() => {
            namespaces.iter().map(|ns| Api::namespaced_with(scope.client.clone(), ns, &resolved.api_resource)).collect()
        }
        _ => vec![Api::all_with(scope.client.clone(), &resolved.api_resource)],
    }
}

/// Deletes `child` if it is still that object (UID precondition); gone or replaced is done.
async fn delete_child(api: &Api<DynamicObject>, child: &DynamicObject) -> Result<(), kube::Error> {
    let params = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions { uid: child.uid(), resource_version: None }),
        propagation_policy: Some(kube::api::PropagationPolicy::Background),
        ..kube::api::DeleteParams::default()
    };
    match api.delete(&child.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(err) if cannot_exist(&err) => Ok(()),
        // Another object of that name now (the precondition failed): not this child.
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(err) => Err(err),
    }
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
    let mut items = Vec::new();
    for api in apis(scope, &resolved) {
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
    fn a_parent_types_crd_is_named_from_its_plural_and_group_and_a_built_in_group_has_none() {
        assert_eq!(crd_name("example.com/v1", "widgets").as_deref(), Some("widgets.example.com"));
        assert_eq!(crd_name("v1", "configmaps"), None);
        assert_eq!(crd_name("apps/v1", "statefulsets"), None);
        assert_eq!(crd_name("networking.k8s.io/v1", "networkpolicies"), None, "Kubernetes' own groups are built in");
        assert_eq!(crd_name("rbac.authorization.k8s.io/v1", "roles"), None);
    }

    #[test]
    fn a_sweep_looks_only_at_controlling_owners_of_exactly_the_doomed_type() {
        let owner = |api_version: &str, kind: &str, controller: bool| OwnerReference {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            controller: Some(controller),
            ..OwnerReference::default()
        };
        let widgets = kube::core::ApiResource {
            group: "example.com".to_owned(),
            version: "v1".to_owned(),
            api_version: "example.com/v1".to_owned(),
            kind: "Widget".to_owned(),
            plural: "widgets".to_owned(),
        };
        let parent = Arc::new(ResolvedResource { api_resource: widgets, namespaced: true, has_status: true });
        let doom = Doomed { crd: "widgets.example.com".to_owned(), parent };
        assert!(doom.owns(&owner("example.com/v1", "Widget", true)));
        assert!(doom.owns(&owner("example.com/v2", "Widget", true)), "any version of the kind");
        assert!(!doom.owns(&owner("example.com/v1", "Widget", false)), "not the controlling owner");
        assert!(!doom.owns(&owner("example.com/v1", "Gizmo", true)), "another CRD's kind of the group stays");
        assert!(!doom.owns(&owner("other.com/v1", "Widget", true)));
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
