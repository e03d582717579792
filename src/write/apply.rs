//! Makes one object match its desired state with server-side apply, honouring the child update method.
//!
//! An apply is left out only when it is known to change nothing, in one of two ways:
//! - the object is at the very resourceVersion the hub's last apply of this desired state left (or
//!   found) it at — a fingerprint in memory of (desired-state hash, UID, resourceVersion). Every change
//!   moves the resourceVersion (labels and `/scale` included, which leave `metadata.generation` alone), so
//!   this is identical work;
//! - otherwise every field the apply would set (the desired state, plus the hash of it in the
//!   `metahook.dev/applied` annotation) already has that value on the object. A field someone changed or
//!   removed, even while no hub ran, is a difference and is put back; a field the hub stopped asking for
//!   changes the hash, and the apply removes it. Lists must match item by item: a list of another length
//!   counts as a difference, and an apply that then changes nothing costs one request (after which the
//!   fingerprint covers it).
//!
//! So a resync of a converged hub, and a restarted hub, write nothing, and any drift of what a hook
//! asked for is reverted on the parent's next sync. Fingerprints are dropped when their object goes away.
//!
//! One more case is known to change nothing: the cache is *behind* the hub's own last write of the
//! object (the caller knows, from the echoes of its writes: that write has not come back through the
//! watch yet, so the cached object is older than it), and that write applied this very desired state
//! to this very object (same hash, same UID). A sync that runs in that gap — the echo of the parent's
//! status write, say, overtaking the child's — would otherwise send an apply that the API server
//! answers without a change. A change by someone else after that write comes through the watch after
//! its echo, and syncs the parent again, so nothing it does goes unseen.
//!
//! Server-side apply is an upsert, so every apply carries a precondition that keeps it from writing an
//! object the hub does not own:
//! - an object the hub observed is applied with its `metadata.uid`: if it was deleted (or deleted and
//!   re-created by someone else) since, the API server refuses (409 "uid mismatch", or 422 because a
//!   UID is immutable) instead of creating or overwriting it. It also carries the observed
//!   `metadata.resourceVersion` (alone it would not do: apply ignores it when it creates), so an object
//!   changed since it was observed is refused (409) and compared again on the next sync — among those
//!   changes the garbage collector's removal of the owner reference after a `--cascade=orphan`, which
//!   an apply planned before it would undo (this is what lets a sync that only creates and updates
//!   skip reading its parent first: see `crate::engine::sync`);
//! - an object the hub did not observe is applied with `metadata.resourceVersion: "1"`. The API server
//!   ignores a resourceVersion when apply creates an object, and treats it as a precondition when the
//!   object exists; no object can be at revision 1 (etcd's first write is revision 2), so an existing
//!   object of that name is answered with 409 and left untouched. Neither field is recorded in
//!   `managedFields`.
//!
//! A field the object's schema does not declare makes the API server refuse the apply whole; unless
//! the hub is told to be strict, every object is pruned against its type's schema, as the API server
//! publishes it, before it is compared and written (see [`crate::write::unknown_fields`]); the hash in
//! the applied annotation is of what is written. A write that dropped fields says which
//! ([`Applied::Created`], [`Applied::Updated`]). A refused write asks for the schema again, and is sent
//! once more if it changed (a CRD that stopped declaring a field); the refusal's words are not read.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use kube::Client;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
};
use kube::core::Status;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tracing::Instrument as _;

use crate::api::APPLIED_ANNOTATION;
use crate::api::UpdateMethod;
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::ObjectKey;
use crate::cache::schemas::Schemas;
use crate::cache::shard::ORPHANS;
use crate::write::take_over::{TakeOver, TakeOverError};
use crate::write::unknown_fields::{UnknownFields, prune};
use crate::write::written::{self, Endpoint, Written, WrittenMeta};

/// What applying did. Writes name the resourceVersion (or, for a delete, the UID) they left behind, so
/// that their echo in the watch can be told from a change by someone else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    Created {
        version: String,
        /// The fields left out because the object's schema does not declare them (see
        /// [`crate::write::unknown_fields`]).
        dropped: Vec<String>,
    },
    Updated {
        version: String,
        /// As for [`Applied::Created`].
        dropped: Vec<String>,
    },
    /// Deleted because it differed under `Recreate`; the next sync creates it again.
    Deleted { uid: String },
    /// Nothing to do: up to date, or left alone by `OnDelete`, or terminating.
    Unchanged,
}

/// A failed write, naming the object.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("applying {kind} {key}: {source}")]
    Apply { kind: String, key: ObjectKey, source: kube::Error },
    #[error("deleting {kind} {key}: {source}")]
    Delete { kind: String, key: ObjectKey, source: kube::Error },
    /// An object of that name exists and is not the hub's to write; it was left untouched.
    #[error("{kind} {key} already exists and is not controlled by this parent ({holder}); it was left untouched")]
    NotOurs { kind: String, key: ObjectKey, holder: String },
    /// `Recreate` would delete the child and then fail to create its replacement: the new state is
    /// refused for more than what the original holds (`why`: what the hub found, when it looked
    /// further than the refusal). The child stays as it is.
    #[error("not recreating {kind} {key}: the API server refuses its new state: {source}{}", why.as_ref().map(|w| format!(" ({w})")).unwrap_or_default())]
    Unrecreatable { kind: String, key: ObjectKey, source: kube::Error, why: Option<String> },
    /// The object changed identity or appeared since it was observed (our cache was behind); the sync
    /// is retried quietly with the fresh state.
    #[error("{kind} {key} changed since it was observed; retrying")]
    Stale { kind: String, key: ObjectKey },
}

/// The applier's error for an object whose take-over failed.
fn taken_over_error(error: TakeOverError, kind: String, key: ObjectKey) -> ApplyError {
    match error {
        TakeOverError::Changed => ApplyError::Stale { kind, key },
        TakeOverError::Api(source) => ApplyError::Apply { kind, key, source },
    }
}

/// Apply results by child kind (`metahook_apply_total`): writes (`created`, `updated`, `deleted`),
/// skips (`unchanged`: nothing to write) and failures (`error`).
#[derive(Clone, Default)]
pub struct ApplyMetrics {
    applied: Family<ApplyLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApplyLabels {
    kind: String,
    result: &'static str,
}

impl ApplyMetrics {
    pub fn record(&self, kind: &str, result: &'static str) {
        self.applied.get_or_create(&ApplyLabels { kind: kind.to_owned(), result }).inc();
    }

    /// Registers `metahook_apply_total` in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register("metahook_apply", "Child and attachment writes and skips, by kind and result", {
            self.applied.clone()
        });
    }
}

impl ApplyError {
    /// Whether a quiet retry is the right answer (nothing the user must hear about).
    #[must_use]
    pub fn is_stale(&self) -> bool {
        matches!(self, Self::Stale { .. })
    }

    /// Whether the write was refused because the object's namespace is being deleted: the API server's
    /// `NamespaceTerminating` cause, read from the answer's details (never from its message). Nothing
    /// can be created in that namespace any more.
    #[must_use]
    pub fn namespace_terminating(&self) -> bool {
        let Self::Apply { source: kube::Error::Api(status), .. } = self else { return false };
        status.code == 403
            && status.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"))
    }
}

/// How often the child types' schemas are read again unless told otherwise
/// ([`Applier::with_schema_interval`]): the hub's default `discoveryInterval`.
const SCHEMAS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

/// Last applied fingerprint by (apiVersion, kind, namespace/name).
type AppliedCache = HashMap<(String, String, ObjectKey), Fingerprint>;

/// A write that dropped fields its object's schema does not declare, for the Warning Event that says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedFields {
    pub kind: String,
    pub key: ObjectKey,
    pub fields: Vec<String>,
}

impl std::fmt::Display for DroppedFields {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} written without {}: its schema does not declare {} (dropped as Metacontroller's create \
             drops it; the hub's childUnknownFields: Strict refuses such a child instead)",
            self.kind,
            self.key,
            self.fields.join(", "),
            if self.fields.len() == 1 { "it" } else { "them" }
        )
    }
}

/// The object at `version` is known to be what applying `desired` (a hash) makes of it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    desired: String,
    uid: String,
    /// The object's resourceVersion: never its generation, which labels, annotations and `/scale`
    /// edits leave alone.
    version: String,
}

/// Applies and deletes objects; shared by every controller of a hub.
#[derive(Clone)]
pub struct Applier {
    client: Client,
    field_manager: String,
    applied: Arc<Mutex<AppliedCache>>,
    metrics: ApplyMetrics,
    /// What Metacontroller wrote is taken over on the first write to it (see [`crate::write::take_over`]).
    take_over: Arc<TakeOver>,
    /// Whether a field a child's schema does not declare is dropped or refuses the child.
    unknown_fields: UnknownFields,
    /// What each child type's schema declares.
    schemas: Schemas,
}

impl Applier {
    #[must_use]
    pub fn new(client: Client, field_manager: String) -> Self {
        let take_over =
            Arc::new(TakeOver::new(&field_manager, vec![crate::write::take_over::METACONTROLLER_MANAGER.into()]));
        Self {
            field_manager,
            applied: Arc::default(),
            metrics: ApplyMetrics::default(),
            take_over,
            unknown_fields: UnknownFields::default(),
            schemas: Schemas::new(client.clone(), SCHEMAS_INTERVAL),
            client,
        }
    }

    /// What a field a child's schema does not declare does (the hub's `childUnknownFields`).
    #[must_use]
    pub fn with_unknown_fields(self, unknown_fields: UnknownFields) -> Self {
        Self { unknown_fields, ..self }
    }

    /// Reads the child types' schemas again as often as `interval` says (the hub's
    /// `discoveryInterval`), so that a CRD that starts or stops declaring a field is followed.
    #[must_use]
    pub fn with_schema_interval(self, interval: std::time::Duration) -> Self {
        Self { schemas: Schemas::new(self.client.clone(), interval), ..self }
    }

    /// Counts every apply in `metrics` (`metahook_apply_total`).
    #[must_use]
    pub fn with_metrics(self, metrics: ApplyMetrics) -> Self {
        Self { metrics, ..self }
    }

    /// Takes over objects written by these field managers (Metacontroller's) instead of the default.
    #[must_use]
    pub fn taking_over_from(mut self, managers: Vec<String>) -> Self {
        self.take_over = Arc::new(TakeOver::new(&self.field_manager, managers));
        self
    }

    fn api(&self, resource: &ResolvedResource, namespace: Option<&str>) -> Api<DynamicObject> {
        match namespace {
            Some(ns) if resource.namespaced => Api::namespaced_with(self.client.clone(), ns, &resource.api_resource),
            _ => Api::all_with(self.client.clone(), &resource.api_resource),
        }
    }

    /// Brings `observed` (if any) to `desired`. `desired` must be a complete object with name,
    /// namespace (for namespaced kinds) and ownership already set. `observed` is the object the hub
    /// claimed as its own; `None` means "create", which never overwrites an existing object. `adopts`:
    /// which orphans the object's parent adopts ([`ADOPTS_NOTHING`] for none); one in the way of a
    /// create that a sharded cache cannot show (it never carried a bucket label) is moved to
    /// [`ORPHANS`], where every replica sees it, and the retry adopts it. `behind`: whether `observed`
    /// is older than the hub's own last write of it, whose echo has not come yet (see the module doc);
    /// asked only of an object not known to be current otherwise.
    pub async fn apply(
        &self,
        resource: &ResolvedResource,
        desired: &Value,
        observed: Option<&DynamicObject>,
        method: UpdateMethod,
        adopts: Adopts<'_>,
        behind: impl FnOnce() -> bool,
    ) -> Result<Applied, ApplyError> {
        self.read_schema(resource).await;
        let result = match observed {
            // Known to change nothing: no request is sent, and there is no write to trace.
            Some(current) if self.known_current(resource, desired, current, method, behind) => Ok(Applied::Unchanged),
            _ => {
                let verb = if observed.is_some() { "update" } else { "create" };
                let span = write_span(verb, resource.kind(), &key_of(desired));
                let result = self.write(resource, desired, observed, method, adopts).instrument(span.clone()).await;
                span.record("outcome", outcome(&result));
                if let Err(e) = &result {
                    span.record("otel.status_description", tracing::field::display(e));
                }
                result
            }
        };
        self.metrics.record(resource.kind(), outcome(&result));
        result
    }

    /// The writes of [`Applier::apply`] for an object not known to be current.
    async fn write(
        &self,
        resource: &ResolvedResource,
        desired: &Value,
        observed: Option<&DynamicObject>,
        method: UpdateMethod,
        adopts: Adopts<'_>,
    ) -> Result<Applied, ApplyError> {
        let key = key_of(desired);
        let cache_key = applied_key(resource, key.clone());
        let (desired, mut dropped) = self.fitted(resource, desired);
        let desired = &*desired;
        let desired_hash = hash(desired);
        let api = self.api(resource, key.namespace.as_deref());
        let kind = || resource.kind().to_owned();
        let params = self.params();
        let send = |body: Value| {
            let (api, name, params) = (&api, &key.name, &params);
            async move { written::patch(api, name, params, &Patch::Apply(body), Endpoint::Object).await }
        };

        let Some(observed) = observed else {
            let body = with_precondition_absent(&annotated(desired, &desired_hash));
            return match self.fitting(resource, body, &mut dropped, send).await {
                Ok(Written { metadata: created }) => {
                    let version = created.resource_version.clone().unwrap_or_default();
                    self.remember(cache_key, written_fingerprint(desired_hash, created));
                    Ok(Applied::Created { version, dropped })
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    Err(self.taken(&api, resource, desired, key, adopts).await)
                }
                Err(source) => Err(ApplyError::Apply { kind: kind(), key, source }),
            };
        };
        let body = with_precondition_uid(&annotated(desired, &desired_hash), observed);
        // What Metacontroller wrote is taken over first, once per object (see `crate::write::take_over`).
        let taken_over;
        let observed = match self.take_over.run_if_needed(&api, observed, &body).await {
            Ok(None) => observed,
            Ok(Some(took)) if !took.apply_needed => {
                let version = took.object.metadata.resource_version.clone().unwrap_or_default();
                self.remember(cache_key, fingerprint(desired_hash, &took.object));
                return Ok(Applied::Updated { version, dropped });
            }
            Ok(Some(took)) => {
                taken_over = took.object;
                &taken_over
            }
            Err(e) => return Err(taken_over_error(e, kind(), key)),
        };
        let current = fingerprint(desired_hash.clone(), observed);
        if method.recreates() {
            // Only recreate when applying would really change the object: a dry run shows the result
            // including defaults, so fields set by others or by defaulting don't trigger a delete. It
            // carries the observed resourceVersion: compared with an object that moved on since (our
            // cache was behind), a difference would say nothing, so that is a quiet retry.
            let exact = with_precondition_version(body, observed);
            let dry_run = self.params().dry_run();
            let try_it = |body: Value| {
                let (api, name, params) = (&api, &key.name, &dry_run);
                async move { api.patch(name, params, &Patch::Apply(body)).await }
            };
            let update_refused = match self.fitting(resource, exact, &mut dropped, try_it).await {
                Ok(result) if sanitized(&result) == sanitized(observed) => {
                    self.remember(cache_key, current);
                    return Ok(Applied::Unchanged);
                }
                Ok(_) => None,
                Err(kube::Error::Api(status)) if replaced(&status) || moved_on(&status) => {
                    return Err(ApplyError::Stale { kind: kind(), key });
                }
                // The update is refused: an immutable field (most of a Pod's spec; a Service's
                // `clusterIP`, which "may not change once set"), which only recreating can change — what
                // this method is for — or a new state that is invalid. The replacement's own dry run
                // below tells which, with this refusal where that dry run cannot see far enough.
                Err(kube::Error::Api(status)) if status.code == 422 => Some(status),
                Err(source) => return Err(ApplyError::Apply { kind: kind(), key, source }),
            };
            // Deleting is only safe if the replacement will be accepted: ask the API server first.
            self.replacement_accepted(&api, resource, desired, observed, update_refused).await.map_err(|refused| {
                ApplyError::Unrecreatable { kind: kind(), key: key.clone(), source: refused.source, why: refused.why }
            })?;
            // The delete, too, only of the object as observed: one changed meanwhile is compared again.
            return match self.delete_observed(resource, observed).await {
                Ok(true) => Ok(Applied::Deleted { uid: observed.metadata.uid.clone().unwrap_or_default() }),
                // Gone already: nothing was written here; the deletion's event syncs the parent again.
                Ok(false) => Ok(Applied::Unchanged),
                Err(kube::Error::Api(status)) if status.code == 409 => Err(ApplyError::Stale { kind: kind(), key }),
                Err(source) => Err(ApplyError::Delete { kind: kind(), key, source }),
            };
        }
        // In place, only over the object as observed (its resourceVersion): the garbage collector
        // takes the owner reference off every child of a parent deleted with `--cascade=orphan`, and an
        // apply planned before that would put it back — on a child the user asked to keep, whose owner
        // is gone, which the collector would then delete. Any change since (that one included) is a
        // quiet retry on what the cache shows next.
        let exact = with_precondition_version(body, observed);
        let result = match self.fitting(resource, exact, &mut dropped, send).await {
            Ok(Written { metadata }) => metadata,
            Err(kube::Error::Api(status)) if replaced(&status) || moved_on(&status) => {
                return Err(ApplyError::Stale { kind: kind(), key });
            }
            Err(source) => return Err(ApplyError::Apply { kind: kind(), key, source }),
        };
        let outcome = if observed.metadata.resource_version == result.resource_version {
            Applied::Unchanged
        } else {
            Applied::Updated { version: result.resource_version.clone().unwrap_or_default(), dropped }
        };
        self.remember(cache_key, written_fingerprint(desired_hash, result));
        Ok(outcome)
    }

    /// Reads the schema of `resource`'s type if it was never read, or its interval is over and the API
    /// server's changed (see [`crate::cache::schemas`]); what is pruned from its objects, and so whether
    /// one is current, follows from it. Nothing to read for a strict hub, which prunes nothing.
    pub async fn read_schema(&self, resource: &ResolvedResource) {
        if self.unknown_fields == UnknownFields::Drop
            && let Err(error) = self.schemas.schema(resource.api_version(), resource.kind()).await
        {
            tracing::warn!(kind = resource.kind(), "{error}: nothing is dropped from it");
        }
    }

    /// Whether applying `desired` to `observed` is known to change nothing, for a caller that cannot
    /// tell whether its cache is behind the hub's own writes (`metahook diff`, a rollout's revisions):
    /// [`Applier::known_current`] with a cache taken as current.
    #[must_use]
    pub fn is_current(
        &self,
        resource: &ResolvedResource,
        desired: &Value,
        observed: &DynamicObject,
        method: UpdateMethod,
    ) -> bool {
        self.known_current(resource, desired, observed, method, || false)
    }

    /// Whether applying `desired` to `observed` is known to change nothing (see the module doc): an
    /// object being deleted or updated only on delete; the very version the last apply of `desired`
    /// left; or, unless the cache is `behind` the hub's own last write of the object, every field the
    /// apply sets already holding its value. A cache behind that write shows the object from before
    /// it, so its fields say nothing of the object now: then only that write having applied `desired`
    /// itself ([`Applier::wrote_last`]) makes the apply a no-op. `behind` is asked only when the
    /// version is not the one the last apply left.
    pub fn known_current(
        &self,
        resource: &ResolvedResource,
        desired: &Value,
        observed: &DynamicObject,
        method: UpdateMethod,
        behind: impl FnOnce() -> bool,
    ) -> bool {
        if observed.metadata.deletion_timestamp.is_some() || method == UpdateMethod::OnDelete {
            return true;
        }
        // Fields the type's schema does not declare are not on the object, nor in what an apply would
        // send; nor in the hash of it, which changes when the schema starts declaring one.
        let (fitted, _) = self.fitted(resource, desired);
        let cache_key = applied_key(resource, key_of(desired));
        let current = fingerprint(hash(&fitted), observed);
        if self.applied.lock().expect("applied lock").get(&cache_key) == Some(&current) {
            return true;
        }
        if behind() {
            return self.wrote_last(resource, desired, observed);
        }
        // What Metacontroller wrote is taken over on the first write, whatever the values say.
        if self.take_over.is_needed(observed) || !holds_applied_state(observed, &annotated(&fitted, &current.desired)) {
            return false;
        }
        self.remember(cache_key, current);
        true
    }

    /// Whether the hub's last write of `observed` applied `desired` to that very object (the same UID),
    /// whatever version the write left: for a cache behind that write (see the module doc).
    #[must_use]
    pub fn wrote_last(&self, resource: &ResolvedResource, desired: &Value, observed: &DynamicObject) -> bool {
        let desired_hash = hash(&self.fitted(resource, desired).0);
        let applied = self.applied.lock().expect("applied lock");
        applied.get(&applied_key(resource, key_of(desired))).is_some_and(|last| {
            Some(last.uid.as_str()) == observed.metadata.uid.as_deref() && last.desired == desired_hash
        })
    }

    /// Forgets what was applied to an object that is gone.
    pub fn forget(&self, resource: &ResolvedResource, key: &ObjectKey) {
        let cache_key = applied_key(resource, key.clone());
        self.applied.lock().expect("applied lock").remove(&cache_key);
    }

    fn remember(&self, key: (String, String, ObjectKey), fingerprint: Fingerprint) {
        self.applied.lock().expect("applied lock").insert(key, fingerprint);
    }

    /// Explains a refused create: the name belongs to someone else, or to this very parent and the
    /// cache has not seen it yet (then a quiet retry). A sharded cache never shows a child of this
    /// parent that lacks the bucket label `desired` carries (one written before the ring existed): it
    /// is labelled here, under a compare-and-swap on the version just read, so the retry sees it. Nor
    /// does it show an orphan in another replica's bucket (a former child of a parent deleted with
    /// `--cascade=orphan`, say): one that carries the ring's label is moved to
    /// [`ORPHANS`](crate::cache::shard::ORPHANS), and the retry adopts it if the parent's selector
    /// says so, or reports the name taken. An object without a controller that never carried the
    /// ring's label (created by a user, or before the ring) is moved there only if `adopts` says this
    /// parent would adopt it, as an unsharded hub that sees it does; anything else is not written.
    async fn taken(
        &self,
        api: &Api<DynamicObject>,
        resource: &ResolvedResource,
        desired: &Value,
        key: ObjectKey,
        adopts: Adopts<'_>,
    ) -> ApplyError {
        let kind = resource.kind().to_owned();
        let ours = desired
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .and_then(|refs| refs.iter().find(|r| r.get("controller") == Some(&Value::Bool(true))))
            .and_then(|r| r.get("uid"))
            .and_then(Value::as_str)
            .or_else(|| {
                // A child by label (in another namespace than its parent): the label names the parent.
                desired
                    .pointer("/metadata/labels")
                    .and_then(|l| l.get(crate::cache::informers::PARENT_UID_LABEL))?
                    .as_str()
            });
        match api.get_opt(&key.name).await {
            Ok(Some(existing)) if crate::cache::informers::controller_uid(&existing) == ours => {
                if ours.is_some() {
                    relabel(api, &existing, &key, shard_labels(desired, &existing, None)).await;
                }
                ApplyError::Stale { kind, key }
            }
            // A former child without a controller, in an old bucket: moved to where every replica sees
            // it, so the parent that would adopt it (if its selector says so) finds it on the retry.
            // One that never had a bucket is moved there only for a parent that adopts it.
            Ok(Some(existing))
                if ours.is_some()
                    && crate::cache::informers::controller_uid(&existing).is_none()
                    && relabel(api, &existing, &key, orphan_labels(desired, &existing, adopts)).await =>
            {
                ApplyError::Stale { kind, key }
            }
            Ok(Some(existing)) => ApplyError::NotOurs { kind, key, holder: holder(&existing) },
            Ok(None) => ApplyError::Stale { kind, key },
            Err(source) => ApplyError::Apply { kind, key, source },
        }
    }

    /// Whether the API server would accept `desired` as the replacement of `observed` once `observed` is
    /// deleted (`update_refused`: the dry-run update's refusal, if it was refused). A dry-run create of
    /// `desired` under its own name runs every check before the one that must fail while the original
    /// exists, `AlreadyExists`: so that refusal alone means yes. Its other refusals are read in the
    /// order the API server checks:
    /// - a quota refusal comes last (allocations, validation and admission all passed): whether the
    ///   replacement fits is decided from the namespace's quotas themselves, their hard and used figures
    ///   with the original's share given back ([`crate::write::quota`]);
    /// - an allocation (a `nodePort` taken, a `clusterIP`) comes first, before validation: such a
    ///   refusal is about what the original holds when the original's own form is refused alike (that
    ///   form is the original restricted to the fields the desired state sets, see [`project`]: what the
    ///   hub asked of it, without what the API server allocated on its own, which would be refused first
    ///   and hide the rest). Validation did not run, so the new state must have passed the dry-run update,
    ///   or been refused there only for fields that cannot change in place ([`only_immutability`]): an
    ///   invalid replacement is never let through by a refusal that hid it.
    async fn replacement_accepted(
        &self,
        api: &Api<DynamicObject>,
        resource: &ResolvedResource,
        desired: &Value,
        observed: &DynamicObject,
        update_refused: Option<Box<Status>>,
    ) -> Result<(), Refused> {
        let refused = match self.dry_run_create(api, desired).await {
            Ok(()) => return Ok(()),
            Err(kube::Error::Api(status)) if already_exists(&status) => return Ok(()),
            Err(kube::Error::Api(status)) => status,
            Err(other) => return Err(Refused { source: other, why: None }),
        };
        let original =
            serde_json::to_value(observed).map_err(|e| Refused { source: kube::Error::SerdeError(e), why: None })?;
        if quota_refusal(&refused) {
            let namespace = observed.metadata.namespace.as_deref().unwrap_or_default();
            let why = match self.quota_verdict(namespace, resource, desired, &original).await {
                Ok(crate::write::quota::Verdict::Fits) => return Ok(()),
                Ok(crate::write::quota::Verdict::DoesNotFit(why)) => {
                    format!("it does not fit even without the original: {why}")
                }
                Ok(crate::write::quota::Verdict::Unknown(why)) => format!("whether it fits cannot be known: {why}"),
                Err(e) => format!("the namespace's quotas could not be read: {e}"),
            };
            return Err(Refused { source: kube::Error::Api(refused), why: Some(why) });
        }
        if let Some(update) = update_refused.filter(|u| !only_immutability(u)) {
            return Err(Refused { source: kube::Error::Api(update), why: None });
        }
        match self.dry_run_create(api, &project(&original, desired)).await {
            Err(kube::Error::Api(status)) if refused_alike(&refused, &status) => Ok(()),
            _ => Err(Refused { source: kube::Error::Api(refused), why: None }),
        }
    }

    /// What the quotas of `namespace` say of `desired` replacing `original` (see [`crate::write::quota`]).
    async fn quota_verdict(
        &self,
        namespace: &str,
        resource: &ResolvedResource,
        desired: &Value,
        original: &Value,
    ) -> Result<crate::write::quota::Verdict, kube::Error> {
        use k8s_openapi::api::core::v1::{LimitRange, ResourceQuota};
        let quotas =
            Api::<ResourceQuota>::namespaced(self.client.clone(), namespace).list(&ListParams::default()).await?;
        let limit_ranges =
            Api::<LimitRange>::namespaced(self.client.clone(), namespace).list(&ListParams::default().limit(1)).await?;
        let quotas: Vec<Value> = quotas.items.iter().filter_map(|q| serde_json::to_value(q).ok()).collect();
        Ok(crate::write::quota::judge(&quotas, !limit_ranges.items.is_empty(), resource, desired, original))
    }

    /// A dry-run create of `object` as it is (name included).
    async fn dry_run_create(&self, api: &Api<DynamicObject>, object: &Value) -> Result<(), kube::Error> {
        let candidate: DynamicObject = serde_json::from_value(object.clone()).map_err(kube::Error::SerdeError)?;
        let params = PostParams { dry_run: true, field_manager: Some(self.field_manager.clone()) };
        api.create(&params, &candidate).await.map(drop)
    }

    /// Deletes `obj` only if it is still exactly as observed (UID and resourceVersion preconditions), for
    /// `Recreate`: `Ok(false)` when it is gone; a conflict (it changed) is the caller's to retry.
    async fn delete_observed(&self, resource: &ResolvedResource, obj: &DynamicObject) -> Result<bool, kube::Error> {
        let key = ObjectKey::of(obj);
        match self.api(resource, key.namespace.as_deref()).delete(&key.name, &as_observed(obj)).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes `obj` in the background, only if it is still the object as observed (UID and
    /// resourceVersion preconditions). `Ok(false)`: it was gone, replaced or changed since, so this call
    /// deleted nothing (and no echo of it will come). Why the version: the decision to delete was made
    /// on what the cache showed, and ownership can change under it — the garbage collector orphaning
    /// the children of a parent deleted with `--cascade=orphan` removes their owner references, and a
    /// finalize hook's empty answer read on a cache that had not seen that yet would delete a child
    /// that is no longer the hub's (seen in `orphan_and_foreground_deletes_are_left_to_the_garbage_collector`).
    /// A change has its own watch event, which syncs the parent again on what is there now.
    pub async fn delete(&self, resource: &ResolvedResource, obj: &DynamicObject) -> Result<bool, ApplyError> {
        let key = ObjectKey::of(obj);
        let span = write_span("delete", resource.kind(), &key);
        let api = self.api(resource, key.namespace.as_deref());
        let result = match api.delete(&key.name, &as_observed(obj)).instrument(span.clone()).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(false),
            Err(source) => Err(ApplyError::Delete { kind: resource.kind().to_owned(), key, source }),
        };
        match &result {
            Ok(deleted) => span.record("outcome", if *deleted { "deleted" } else { "gone" }),
            Err(e) => span.record("otel.status_description", tracing::field::display(e)),
        };
        result
    }

    fn params(&self) -> PatchParams {
        PatchParams::apply(&self.field_manager).force()
    }

    /// A server-side dry run of `desired` as an in-place update of `observed`, with the body
    /// [`Applier::apply`] sends (pruned as it prunes, annotated, UID and version preconditions): nothing
    /// is written or remembered. A canary's shadow asks it of the current hook's answer where the
    /// candidate's write was refused, because only a write shows such a refusal (an `immutable`
    /// `ConfigMap` whose `data` both answers change): refused the same, the failure is the parent's.
    pub async fn dry_run_update(
        &self,
        resource: &ResolvedResource,
        desired: &Value,
        observed: &DynamicObject,
    ) -> Result<(), kube::Error> {
        let key = key_of(desired);
        let (desired, _) = self.fitted(resource, desired);
        let body = with_precondition_uid(&annotated(&desired, &hash(&desired)), observed);
        let body = with_precondition_version(body, observed);
        let api = self.api(resource, key.namespace.as_deref());
        api.patch(&key.name, &self.params().dry_run(), &Patch::Apply(body)).await.map(drop)
    }

    /// `desired` pruned against its type's schema as last read (see [`crate::write::unknown_fields`]),
    /// and the fields dropped from it; as it is when the hub is strict or the schema is not known.
    fn fitted<'d>(
        &self,
        resource: &ResolvedResource,
        desired: &'d Value,
    ) -> (std::borrow::Cow<'d, Value>, Vec<String>) {
        let schema = match self.unknown_fields {
            UnknownFields::Drop => self.schemas.cached(resource.api_version(), resource.kind()),
            UnknownFields::Strict => None,
        };
        let Some(schema) = schema else { return (std::borrow::Cow::Borrowed(desired), Vec::new()) };
        let mut fitted = desired.clone();
        let dropped = prune(&mut fitted, &schema);
        if dropped.is_empty() {
            (std::borrow::Cow::Borrowed(desired), dropped)
        } else {
            (std::borrow::Cow::Owned(fitted), dropped)
        }
    }

    /// Sends `body` (an apply) with `send`. Refused, unless the hub is strict, it asks for the type's
    /// schema again: if the API server's changed since it was read (a CRD that stopped declaring a
    /// field), `body` is pruned against the new one and sent once more, what that drops added to
    /// `dropped`. The refusal's words are not read: they repeat field names as the hook wrote them.
    async fn fitting<T, F>(
        &self,
        resource: &ResolvedResource,
        mut body: Value,
        dropped: &mut Vec<String>,
        send: impl Fn(Value) -> F,
    ) -> Result<T, kube::Error>
    where
        F: std::future::Future<Output = Result<T, kube::Error>>,
    {
        let status = match send(body.clone()).await {
            Err(kube::Error::Api(status))
                if self.unknown_fields == UnknownFields::Drop && !matches!(status.code, 404 | 409) =>
            {
                status
            }
            other => return other,
        };
        let Some(schema) = self.schemas.refreshed(resource.api_version(), resource.kind()).await else {
            return Err(kube::Error::Api(status));
        };
        let removed = prune(&mut body, &schema);
        tracing::debug!(kind = resource.kind(), fields = ?removed, "the type's schema changed; applying again");
        dropped.extend(removed);
        send(body).await
    }
}

/// Whether a sync's parent would adopt an object, were it to see it (see [`Applier::apply`]).
pub type Adopts<'a> = &'a (dyn Fn(&DynamicObject) -> bool + Send + Sync);

/// For objects written without a parent that adopts orphans (a rollout's revisions).
pub const ADOPTS_NOTHING: Adopts<'static> = &|_| false;

/// The parent's bucket labels `desired` carries (`parent.shard.metahook.dev/<ring>`) that `existing`
/// should get: with
/// `value`, only those it already has (then set to `value`), else desired's own; each only where it
/// differs.
fn shard_labels(desired: &Value, existing: &DynamicObject, value: Option<&str>) -> serde_json::Map<String, Value> {
    let have = existing.metadata.labels.as_ref();
    desired
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(label, _)| label.starts_with(crate::cache::shard::PARENT_SHARD_LABEL_PREFIX))
        .filter_map(|(label, wanted)| {
            let now = have.and_then(|l| l.get(label));
            let to = match value {
                Some(value) => now.is_some().then(|| Value::String(value.to_owned()))?,
                None => wanted.clone(),
            };
            (now.map(String::as_str) != to.as_str()).then(|| (label.clone(), to))
        })
        .collect()
}

/// A background delete of `obj` only while it is exactly as observed (UID and resourceVersion).
fn as_observed(obj: &DynamicObject) -> DeleteParams {
    DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        preconditions: Some(Preconditions {
            uid: obj.metadata.uid.clone(),
            resource_version: obj.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    }
}

/// The bucket labels that move `existing`, an object without a controller in the way of `desired`'s
/// create, to [`ORPHANS`]: a former child (it carries a bucket label of the ring) always; one that never
/// carried it only when `adopts` it (the parent's selector selects it); else none.
fn orphan_labels(desired: &Value, existing: &DynamicObject, adopts: Adopts<'_>) -> serde_json::Map<String, Value> {
    let moved = shard_labels(desired, existing, Some(ORPHANS));
    let unlabelled = shard_labels(desired, existing, None);
    let have = existing.metadata.labels.as_ref();
    let never_had_one = unlabelled.keys().all(|label| have.is_none_or(|l| !l.contains_key(label)));
    if !moved.is_empty() || unlabelled.is_empty() || !never_had_one || !adopts(existing) {
        return moved;
    }
    unlabelled.into_iter().map(|(label, _)| (label, Value::String(ORPHANS.to_owned()))).collect()
}

/// Writes `labels` on `existing` under a resourceVersion precondition (see [`Applier::taken`]); whether
/// it did. A write that fails is logged and left to the next retry.
async fn relabel(
    api: &Api<DynamicObject>,
    existing: &DynamicObject,
    key: &ObjectKey,
    labels: serde_json::Map<String, Value>,
) -> bool {
    if labels.is_empty() {
        return false;
    }
    let patch = json!({"metadata": {"resourceVersion": existing.metadata.resource_version, "labels": labels}});
    match api.patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {
            tracing::info!(child = %key, ?labels, "moved a child to the bucket its parent's replica watches");
            true
        }
        Err(err) => {
            tracing::debug!(child = %key, "moving a child to its parent's bucket (retrying): {err}");
            false
        }
    }
}

/// A `write` span (see [`crate::TRACE_SPANS`]) for writing the object `key` of `kind`; `verb`:
/// `create`, `update` (both server-side apply; a recreate's delete is part of its update) or `delete`.
fn write_span(verb: &'static str, kind: &str, key: &ObjectKey) -> tracing::Span {
    tracing::info_span!(
        target: crate::TRACE_SPANS,
        "write",
        verb,
        kind,
        name = %key,
        outcome = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    )
}

/// What an apply did, as `metahook_apply_total`'s `result` label and a `write` span's `outcome` say it.
fn outcome(result: &Result<Applied, ApplyError>) -> &'static str {
    match result {
        Ok(Applied::Created { .. }) => "created",
        Ok(Applied::Updated { .. }) => "updated",
        Ok(Applied::Deleted { .. }) => "deleted",
        Ok(Applied::Unchanged) => "unchanged",
        Err(_) => "error",
    }
}

/// `desired` with `metadata.uid` of the object it replaces: apply then only writes that very object.
fn with_precondition_uid(desired: &Value, observed: &DynamicObject) -> Value {
    let mut body = desired.clone();
    if let (Some(meta), Some(uid)) = (body.get_mut("metadata").and_then(Value::as_object_mut), &observed.metadata.uid) {
        meta.insert("uid".into(), Value::String(uid.clone()));
    }
    body
}

/// `body` with the resourceVersion of `observed`: the API server then refuses it (409) if the object
/// changed since it was observed.
fn with_precondition_version(mut body: Value, observed: &DynamicObject) -> Value {
    if let (Some(meta), Some(version)) =
        (body.get_mut("metadata").and_then(Value::as_object_mut), &observed.metadata.resource_version)
    {
        meta.insert("resourceVersion".into(), Value::String(version.clone()));
    }
    body
}

/// Whether a refused write means the object changed since it was read (a resourceVersion
/// precondition failed).
fn moved_on(status: &Status) -> bool {
    status.code == 409 && status.reason == "Conflict" && status.message.contains("has been modified")
}

/// Whether a refused create means only that an object of that name exists.
fn already_exists(status: &Status) -> bool {
    status.code == 409 && status.reason == "AlreadyExists"
}

/// Whether a refused create is the quota admission's (`403 Forbidden … exceeded quota` or `… must
/// specify …` for a quota's required figures): which check refused is read from the refusal; whether
/// the replacement fits is decided from the quotas' figures, never from this message.
fn quota_refusal(status: &Status) -> bool {
    status.code == 403 && status.reason == "Forbidden" && status.message.contains("quota")
}

/// Why a replacement would not be accepted: the API server's refusal, and what the hub found beyond it.
struct Refused {
    source: kube::Error,
    why: Option<String>,
}

/// Whether `new` (a replacement's refusal) is a refusal the original's own form gets too: the same
/// code and reason, and every cause of `new` (field, reason, message) among the original's — or, with
/// no causes, the same message. Messages name the values (a port, a quota's figures), so a new form
/// that asks for something else than the original is not taken for it.
fn refused_alike(new: &Status, original: &Status) -> bool {
    let causes = |s: &Status| -> Vec<(String, String, String)> {
        s.details
            .iter()
            .flat_map(|d| &d.causes)
            .map(|c| (c.field.clone(), c.reason.clone(), c.message.clone()))
            .collect()
    };
    let (new_causes, original_causes) = (causes(new), causes(original));
    new.code == original.code
        && new.reason == original.reason
        && if new_causes.is_empty() {
            new.message == original.message
        } else {
            new_causes.iter().all(|c| original_causes.contains(c))
        }
}

/// `have` restricted to the fields `shape` has (objects field by field; a list or a value whole, as
/// `have` holds it).
fn project(have: &Value, shape: &Value) -> Value {
    match (have, shape) {
        (Value::Object(have), Value::Object(shape)) => {
            Value::Object(shape.keys().filter_map(|k| Some((k.clone(), project(have.get(k)?, &shape[k])))).collect())
        }
        _ => have.clone(),
    }
}

/// Whether `observed` already holds every value of `applied` (an apply body): a field the body sets
/// is there with that value (objects field by field, lists item by item and of the same length; a
/// `null` matches a missing field). Conservative: whatever it cannot show to be equal is a difference.
fn holds_applied_state(observed: &DynamicObject, applied: &Value) -> bool {
    let Some(fields) = applied.as_object() else { return false };
    fields.iter().all(|(field, want)| match field.as_str() {
        "apiVersion" => observed.types.as_ref().map(|t| t.api_version.as_str()) == want.as_str(),
        "kind" => observed.types.as_ref().map(|t| t.kind.as_str()) == want.as_str(),
        "metadata" => serde_json::to_value(&observed.metadata).is_ok_and(|have| contains(&have, want)),
        other => observed.data.get(other).map_or(want.is_null(), |have| contains(have, want)),
    })
}

/// Whether `have` holds every value of `want` (see [`holds_applied_state`]).
fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(have), Value::Object(want)) => {
            want.iter().all(|(k, w)| have.get(k).map_or(w.is_null(), |h| contains(h, w)))
        }
        (Value::Array(have), Value::Array(want)) => {
            have.len() == want.len() && have.iter().zip(want).all(|(h, w)| contains(h, w))
        }
        _ => have == want,
    }
}

/// `desired` with a resourceVersion no stored object has: apply then only creates (see the module doc).
fn with_precondition_absent(desired: &Value) -> Value {
    let mut body = desired.clone();
    if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String("1".into()));
    }
    body
}

/// Whether a refused apply means "not the object we observed any more": gone (409 uid mismatch) or
/// replaced by another object of the same name (422 on the immutable `metadata.uid`).
fn replaced(status: &Status) -> bool {
    let uid_cause = || {
        status.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid"))
            || status.message.contains("metadata.uid")
    };
    (status.code == 409 && status.message.contains("uid mismatch")) || (status.code == 422 && uid_cause())
}

/// Whether every cause of a refused update is a field that cannot change in place (`field is
/// immutable`, a Service's `may not change once set`, a Pod's `Forbidden: pod updates may not change
/// fields…`), as opposed to an invalid value, which recreating would not cure. Read from the causes'
/// reasons and wording, the only place the API server says it; a wording not known here keeps the
/// original (the safe side).
fn only_immutability(status: &Status) -> bool {
    let immutable = |reason: &str, message: &str| {
        reason == "FieldValueForbidden"
            || ["immutable", "may not change", "may not be changed", "cannot change"]
                .iter()
                .any(|w| message.contains(w))
    };
    match status.details.as_ref().map(|d| &d.causes) {
        Some(causes) if !causes.is_empty() => causes.iter().all(|c| immutable(&c.reason, &c.message)),
        _ => immutable("", &status.message),
    }
}

/// Who holds an object, for messages: its controller, or "no controller".
pub(crate) fn holder(obj: &DynamicObject) -> String {
    if let Some(owner) = obj.metadata.owner_references.iter().flatten().find(|r| r.controller == Some(true)) {
        // Two DecoratorControllers over the same object: the object is controlled by that very target,
        // and what makes it another controller's child is the decorator annotation. Name that one: the
        // owner alone would read as a contradiction.
        let annotations = obj.metadata.annotations.as_ref();
        if let Some(other) = annotations.and_then(|a| a.get(crate::api::DECORATOR_ANNOTATION)) {
            return format!(
                "made for {} {} by DecoratorController {other}, another controller decorating the same object; \
                 only one controller may make a given child: give the child another name in one of the hooks, \
                 or narrow one controller's resources or selectors so they do not decorate the same objects",
                owner.kind, owner.name
            );
        }
        return format!("controlled by {} {}", owner.kind, owner.name);
    }
    // A child by label (`crossNamespace`) of another parent: its annotation says which. Not its UID: the
    // Event goes to whoever wrote this parent, and a UID is what would let them pose as that one's child.
    let labels = obj.metadata.labels.as_ref();
    if labels.is_some_and(|l| l.contains_key(crate::cache::informers::PARENT_UID_LABEL)) {
        let annotations = obj.metadata.annotations.as_ref();
        let parent = annotations.and_then(|a| a.get(crate::cache::informers::PARENT_ANNOTATION));
        return match parent {
            Some(parent) => format!("the child of parent {parent}"),
            None => "the child of another parent".to_owned(),
        };
    }
    "it has no controller".to_owned()
}

fn key_of(obj: &Value) -> ObjectKey {
    let meta = &obj["metadata"];
    ObjectKey {
        namespace: meta["namespace"].as_str().map(str::to_owned),
        name: meta["name"].as_str().unwrap_or_default().to_owned(),
    }
}

/// A stable hash of a desired state (SHA-1 of its canonical JSON, 16 bytes in hex): the same across
/// processes and versions of the hub, as the annotation that carries it must be.
fn hash(value: &Value) -> String {
    use sha1::Digest as _;
    let digest = sha1::Sha1::digest(crate::api::json::canonical_json(value).as_bytes());
    digest.iter().take(16).fold(String::with_capacity(32), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    })
}

/// `desired` with its hash in the applied annotation.
fn annotated(desired: &Value, desired_hash: &str) -> Value {
    let mut body = desired.clone();
    if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta.entry("annotations").or_insert_with(|| Value::Object(serde_json::Map::new()));
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.insert(APPLIED_ANNOTATION.into(), Value::String(desired_hash.to_owned()));
        }
    }
    body
}

/// [`fingerprint`] of what a write answered.
fn written_fingerprint(desired: String, written: WrittenMeta) -> Fingerprint {
    Fingerprint { desired, uid: written.uid.unwrap_or_default(), version: written.resource_version.unwrap_or_default() }
}

fn fingerprint(desired: String, obj: &DynamicObject) -> Fingerprint {
    Fingerprint {
        desired,
        uid: obj.metadata.uid.clone().unwrap_or_default(),
        version: obj.metadata.resource_version.clone().unwrap_or_default(),
    }
}

/// The parts of an object a desired state can change: everything but server bookkeeping and status.
fn sanitized(obj: &DynamicObject) -> Value {
    let mut value = serde_json::to_value(obj).unwrap_or(Value::Null);
    if let Some(map) = value.as_object_mut() {
        map.remove("status");
        if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in ["resourceVersion", "managedFields", "generation", "creationTimestamp", "selfLink"] {
                meta.remove(field);
            }
            // The cache drops kubectl's last-applied copy (see informers::prepare), Metacontroller's is
            // taken over before this compares, and the applied hash says nothing about the object
            // itself; a dry run's result has them all.
            if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
                annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
                annotations.remove("metacontroller.k8s.io/last-applied-configuration");
                annotations.remove(APPLIED_ANNOTATION);
                if annotations.is_empty() {
                    meta.remove("annotations");
                }
            }
        }
    }
    value
}

/// The key of what was applied to `key` of `resource`'s type: its API version, kind and name.
fn applied_key(resource: &ResolvedResource, key: ObjectKey) -> (String, String, ObjectKey) {
    (resource.api_version().to_owned(), resource.kind().to_owned(), key)
}

/// Removes what a hook must not set on a desired object (server-owned metadata and status).
#[must_use]
pub fn strip_server_fields(mut desired: Value) -> Value {
    if let Some(map) = desired.as_object_mut() {
        map.remove("status");
        if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in [
                "uid",
                "resourceVersion",
                "generation",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
                "selfLink",
            ] {
                meta.remove(field);
            }
            if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
                annotations.remove("metacontroller.k8s.io/last-applied-configuration");
            }
        }
    }
    desired
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The API server's answer to a create in a namespace being deleted, as it sends it.
    #[test]
    fn a_refusal_in_a_namespace_being_deleted_is_known_by_its_cause() {
        let answer = |code: u16, cause: &str| -> ApplyError {
            let status: kube::core::Status = serde_json::from_value(json!({
                "status": "Failure", "reason": "Forbidden", "code": code,
                "message": "configmaps \"x\" is forbidden: unable to create new content in namespace n",
                "details": {"name": "x", "kind": "configmaps", "causes": [{"reason": cause, "message": "m", "field": "metadata.namespace"}]},
            }))
            .unwrap();
            ApplyError::Apply {
                kind: "ConfigMap".into(),
                key: ObjectKey { namespace: Some("n".into()), name: "x".into() },
                source: kube::Error::Api(Box::new(status)),
            }
        };
        assert!(answer(403, "NamespaceTerminating").namespace_terminating());
        assert!(!answer(403, "FieldValueForbidden").namespace_terminating(), "another refusal");
        assert!(!answer(422, "NamespaceTerminating").namespace_terminating(), "not a refusal of rights");
    }

    #[test]
    fn a_name_held_by_another_parents_labelled_child_names_that_parent() {
        let labelled: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "namespace": "b", "labels": {"metahook.dev/parent-uid": "u-1"},
                         "annotations": {"metahook.dev/parent": "a/p3"}}}))
        .unwrap();
        assert_eq!(holder(&labelled), "the child of parent a/p3", "named, not its UID");
        let plain: DynamicObject =
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}))
                .unwrap();
        assert_eq!(holder(&plain), "it has no controller");
    }

    #[test]
    fn a_child_another_decorator_made_of_the_same_target_names_that_decorator() {
        let made: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "s", "namespace": "a",
                         "annotations": {"metacontroller.k8s.io/decorator-controller": "shard-1"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                                              "uid": "u-1", "controller": true}]}}))
        .unwrap();
        let said = holder(&made);
        assert!(
            said.starts_with("made for StatefulSet db by DecoratorController shard-1, another controller"),
            "{said}"
        );
        assert!(said.contains("another name"), "says what to do: {said}");
        let owned: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "s", "namespace": "a",
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                                              "uid": "u-1", "controller": true}]}}))
        .unwrap();
        assert_eq!(holder(&owned), "controlled by StatefulSet db");
    }

    /// The `ConfigMap` `ns/c` with `data`, at `version`, with UID `uid`.
    fn stored_config_map(data: &str, version: &str, uid: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "ns", "uid": uid, "resourceVersion": version},
            "data": {"k": data},
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn over_a_cache_behind_its_own_write_of_the_same_state_the_apply_sends_nothing() {
        // Every request fails (nothing listens there): an `Unchanged` is an apply that sent nothing.
        let client = Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let applier = Applier::new(client, "metahook".into());
        let resource = ResolvedResource {
            api_resource: kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            namespaced: true,
            has_status: false,
        };
        let desired = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"},
                             "data": {"k": "new"}});
        // The hub's last write applied `desired` to UID u1 and left version 8; the cache still shows 7.
        let cache_key = ("v1".to_owned(), "ConfigMap".to_owned(), key_of(&desired));
        applier.remember(cache_key, fingerprint(hash(&desired), &stored_config_map("new", "8", "u1")));
        let stale = stored_config_map("old", "7", "u1");
        let apply = |desired: Value, observed: DynamicObject, behind: bool| {
            let (applier, resource) = (&applier, &resource);
            async move {
                let method = UpdateMethod::InPlace;
                applier.apply(resource, &desired, Some(&observed), method, ADOPTS_NOTHING, || behind).await
            }
        };
        assert_eq!(apply(desired.clone(), stale.clone(), true).await.unwrap(), Applied::Unchanged);
        // Not known to be behind: the stale values differ, so it is written (and fails here).
        assert!(apply(desired.clone(), stale.clone(), false).await.is_err());
        // Behind, but the last write applied another state, or to another object of that name.
        let mut other = desired.clone();
        other["data"]["k"] = json!("newer");
        assert!(apply(other, stale, true).await.is_err());
        assert!(apply(desired, stored_config_map("old", "7", "u2"), true).await.is_err());
    }

    /// A desired child `c` in bucket 7 of ring `r`.
    fn in_bucket_7() -> Value {
        json!({"metadata": {"name": "c", "labels": {"app": "a", "parent.shard.metahook.dev/r": "7"}}})
    }

    /// The object `c` that exists, with `labels`.
    fn existing(labels: Value) -> DynamicObject {
        let mut obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
        obj["metadata"]["labels"] = labels;
        serde_json::from_value(obj).unwrap()
    }

    #[test]
    fn a_child_gets_the_bucket_desired_carries_and_an_orphan_only_a_label_it_has() {
        let desired = in_bucket_7();
        let bucket = |labels: Value| shard_labels(&desired, &existing(labels), None);
        let orphaned = |labels: Value| shard_labels(&desired, &existing(labels), Some(ORPHANS));
        assert_eq!(Value::Object(bucket(json!({"app": "a"}))), json!({"parent.shard.metahook.dev/r": "7"}), "missing");
        assert_eq!(
            Value::Object(bucket(json!({"parent.shard.metahook.dev/r": "3"}))),
            json!({"parent.shard.metahook.dev/r": "7"})
        );
        assert!(bucket(json!({"parent.shard.metahook.dev/r": "7"})).is_empty(), "already there");
        assert_eq!(
            Value::Object(orphaned(json!({"parent.shard.metahook.dev/r": "3"}))),
            json!({"parent.shard.metahook.dev/r": "orphans"}),
            "a former child moves to the orphans"
        );
        assert!(orphaned(json!({"app": "a"})).is_empty(), "never the ring's: not written");
        assert!(orphaned(json!({"parent.shard.metahook.dev/r": "orphans"})).is_empty(), "moved already");
        let unsharded = json!({"metadata": {"name": "c", "labels": {"app": "a"}}});
        assert!(shard_labels(&unsharded, &existing(json!({})), None).is_empty(), "no ring: nothing");
    }

    #[test]
    fn an_orphan_that_never_had_a_bucket_is_moved_only_for_a_parent_that_adopts_it() {
        let desired = in_bucket_7();
        let adopts = |obj: &DynamicObject| obj.metadata.labels.as_ref().is_some_and(|l| l.get("app").is_some());
        let moved = |labels: Value| Value::Object(orphan_labels(&desired, &existing(labels), &adopts));
        let to_orphans = json!({"parent.shard.metahook.dev/r": "orphans"});
        assert_eq!(moved(json!({"app": "a"})), to_orphans, "selected, never labelled: moved");
        assert_eq!(moved(json!({"other": "x"})), json!({}), "not selected: not written");
        assert_eq!(moved(json!({"parent.shard.metahook.dev/r": "3"})), to_orphans, "a former child, selected or not");
        assert_eq!(moved(json!({"app": "a", "parent.shard.metahook.dev/r": "orphans"})), json!({}), "moved already");
        let unsharded = json!({"metadata": {"name": "c", "labels": {"app": "a"}}});
        assert!(orphan_labels(&unsharded, &existing(json!({"app": "a"})), &adopts).is_empty(), "no ring: nothing");
    }

    #[test]
    fn server_fields_and_status_are_stripped_from_desired_objects() {
        let desired = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "uid": "u", "resourceVersion": "5", "labels": {"x": "y"},
                         "annotations": {"metacontroller.k8s.io/last-applied-configuration": "{}", "keep": "me"}},
            "data": {"k": "v"}, "status": {"phase": "x"}
        });
        let clean = strip_server_fields(desired);
        assert_eq!(
            clean["metadata"],
            serde_json::json!({"name": "a", "labels": {"x": "y"}, "annotations": {"keep": "me"}})
        );
        assert!(clean.get("status").is_none());
        assert_eq!(clean["data"]["k"], "v");
    }

    fn status(code: u16, message: &str, causes: &[(&str, &str, &str)]) -> Status {
        serde_json::from_value(serde_json::json!({
            "code": code, "message": message,
            "details": {"causes": causes.iter().map(|(reason, message, field)|
                serde_json::json!({"reason": reason, "message": message, "field": field})).collect::<Vec<_>>()}
        }))
        .unwrap()
    }

    #[test]
    fn only_refusals_of_fields_that_cannot_change_allow_a_recreate_past_a_hiding_refusal() {
        let pod = status(
            422,
            "Pod \"p\" is invalid",
            &[(
                "FieldValueForbidden",
                "Forbidden: pod updates may not change fields other than `spec.containers[*].image`",
                "spec",
            )],
        );
        assert!(only_immutability(&pod));
        let job = status(422, "Job is invalid", &[("FieldValueInvalid", "field is immutable", "spec.template")]);
        assert!(only_immutability(&job));
        let cluster_ip = status(
            422,
            "Service \"s\" is invalid",
            &[("FieldValueInvalid", "Invalid value: [\"10.96.77.77\"]: may not change once set", "spec.clusterIPs[0]")],
        );
        assert!(only_immutability(&cluster_ip), "a Service's clusterIP");
        let invalid = status(
            422,
            "Pod is invalid",
            &[
                ("FieldValueForbidden", "Forbidden: pod updates may not change fields", "spec"),
                (
                    "FieldValueInvalid",
                    "Invalid value: \"Bad_Name\": a lowercase RFC 1123 label",
                    "spec.containers[0].name",
                ),
            ],
        );
        assert!(!only_immutability(&invalid), "an invalid value would make the new object fail to create");
        assert!(!only_immutability(&status(422, "the server rejected our request", &[])));
    }

    #[test]
    fn uid_refusals_mean_the_object_was_replaced_or_is_gone() {
        let gone = status(
            409,
            "Operation cannot be fulfilled on configmaps \"a\": uid mismatch: the provided object specified uid u, and no existing object was found",
            &[],
        );
        assert!(replaced(&gone));
        let other =
            status(422, "ConfigMap \"a\" is invalid", &[("FieldValueInvalid", "field is immutable", "metadata.uid")]);
        assert!(replaced(&other));
        assert!(!replaced(&status(409, "Apply failed with 1 conflict", &[])));
        assert!(!replaced(&status(422, "invalid", &[("FieldValueInvalid", "bad", "data")])));
    }

    #[test]
    fn preconditions_go_into_the_applied_body_only() {
        let desired = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}});
        assert_eq!(with_precondition_absent(&desired)["metadata"]["resourceVersion"], "1");
        let observed: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "uid": "u-1"}
        }))
        .unwrap();
        assert_eq!(with_precondition_uid(&desired, &observed)["metadata"]["uid"], "u-1");
        assert!(desired["metadata"].get("uid").is_none(), "the desired state itself (and its hash) is unchanged");
    }

    #[test]
    fn a_fingerprint_is_of_the_resource_version_never_the_generation() {
        let mut obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "a", "uid": "u", "resourceVersion": "7", "generation": 3}
        }))
        .unwrap();
        let before = fingerprint("h".into(), &obj);
        // A label edit moves the resourceVersion, not the generation.
        obj.metadata.resource_version = Some("8".into());
        assert_ne!(fingerprint("h".into(), &obj), before);
    }

    fn config_map(value: serde_json::Value) -> DynamicObject {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn an_object_holds_the_applied_state_only_if_every_value_is_there() {
        let applied = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "namespace": "n", "labels": {"app": "x"},
                         "annotations": {APPLIED_ANNOTATION: "h1"}},
            "data": {"k": "v", "list": "1"}, "binaryData": null
        });
        let live = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "namespace": "n", "uid": "u", "resourceVersion": "9",
                         "labels": {"app": "x", "someone": "else"},
                         "annotations": {APPLIED_ANNOTATION: "h1", "other": "y"}},
            "data": {"k": "v", "list": "1", "extra": "kept by others"}
        });
        assert!(holds_applied_state(&config_map(live.clone()), &applied), "others' fields do not matter");
        let mut edits: Vec<(&str, serde_json::Value)> = Vec::new();
        let mut changed = live.clone();
        changed["data"]["k"] = "w".into();
        edits.push(("a changed value", changed));
        let mut removed = live.clone();
        removed["data"].as_object_mut().unwrap().remove("list");
        edits.push(("a removed key", removed));
        let mut label = live.clone();
        label["metadata"]["labels"]["app"] = "y".into();
        edits.push(("a changed label", label));
        let mut hash = live.clone();
        hash["metadata"]["annotations"][APPLIED_ANNOTATION] = "h0".into();
        edits.push(("applied from another desired state", hash));
        let mut kind = live;
        kind["apiVersion"] = "v2".into();
        edits.push(("another version", kind));
        for (what, edited) in edits {
            assert!(!holds_applied_state(&config_map(edited), &applied), "{what}");
        }
    }

    #[test]
    fn lists_are_held_item_by_item_and_only_at_the_same_length() {
        let want = serde_json::json!([{"name": "c", "image": "i:1"}]);
        assert!(contains(
            &serde_json::json!([{"name": "c", "image": "i:1", "imagePullPolicy": "IfNotPresent"}]),
            &want
        ));
        assert!(!contains(&serde_json::json!([{"name": "c", "image": "i:2"}]), &want));
        assert!(!contains(&serde_json::json!([{"name": "c", "image": "i:1"}, {"name": "d"}]), &want));
        assert!(!contains(&serde_json::json!({}), &serde_json::json!({"k": {}})), "an empty object is not nothing");
        assert!(contains(&serde_json::json!({}), &serde_json::json!({"k": null})));
    }

    #[test]
    fn the_original_form_is_what_the_desired_state_sets_of_it() {
        let original = serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "s", "uid": "u", "labels": {"version": "1", "other": "x"}},
            "spec": {"clusterIP": "10.0.0.9", "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]},
            "status": {}});
        let desired = serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "s", "labels": {"version": "2"}, "annotations": {"a": "b"}},
            "spec": {"ports": [{"port": 80, "nodePort": 30080}]}});
        assert_eq!(
            project(&original, &desired),
            serde_json::json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "s", "labels": {"version": "1"}},
                "spec": {"ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]}})
        );
    }

    fn refusal(code: u16, reason: &str, message: &str, causes: &[(&str, &str, &str)]) -> Status {
        let mut status = status(code, message, causes);
        status.reason = reason.into();
        status
    }

    #[test]
    fn a_replacement_refused_only_for_what_the_original_holds_may_be_recreated() {
        let port =
            ("FieldValueInvalid", "Invalid value: 30080: provided port is already allocated", "spec.ports[0].nodePort");
        let ip =
            ("FieldValueInvalid", "Invalid value: \"10.0.0.9\": provided IP is already allocated", "spec.clusterIPs");
        let new = refusal(422, "Invalid", "Service \"s\" is invalid", &[port]);
        let original = refusal(422, "Invalid", "Service \"s\" is invalid: two causes", &[port, ip]);
        assert!(refused_alike(&new, &original), "the original holds the port (and its IP) itself");
        let bad = (
            "FieldValueInvalid",
            "Invalid value: 99999: must be between 30000-32767, inclusive",
            "spec.ports[0].nodePort",
        );
        let invalid = refusal(422, "Invalid", "Service \"s\" is invalid", &[bad]);
        assert!(!refused_alike(&invalid, &original), "the new form itself is invalid");
        let quota = |requested: &str| {
            refusal(
                403,
                "Forbidden",
                &format!("configmaps \"c\" is forbidden: exceeded quota: q, requested: {requested}"),
                &[],
            )
        };
        assert!(refused_alike(&quota("count/configmaps=1"), &quota("count/configmaps=1")));
        assert!(!refused_alike(&quota("cpu=2"), &quota("cpu=1")), "asking for more than the original had");
        assert!(already_exists(&refusal(409, "AlreadyExists", "configmaps \"c\" already exists", &[])));
        let modified = refusal(
            409,
            "Conflict",
            "Operation cannot be fulfilled on configmaps \"c\": the object has been modified; please apply your changes to the latest version and try again",
            &[],
        );
        assert!(moved_on(&modified) && !replaced(&modified));
    }
}
