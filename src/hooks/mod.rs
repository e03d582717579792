//! The hook wire protocol (Metacontroller v1 and v2) and the client that calls hooks.
//!
//! The request and response bodies ([`wire`]) mirror the JSON exactly, and are the source of the helper
//! libraries' Python and TypeScript types; what the engine does with a response (validation, applying)
//! lives in [`crate::controllers::composite`]. Objects travel as `serde_json::Value` because hooks may return any
//! kind, including kinds this binary has never heard of.
//!
//! How a call travels lives in the submodules: [`settings`] decides which TLS/auth settings apply,
//! [`credentials`] keeps the Secrets and `ConfigMap`s they read current, [`identity`] turns those into a
//! TLS identity and an `Authorization` header, [`pool`] keeps one client per TLS identity, [`dial`]
//! the `hookHosts` map and [`close`] a TLS server's close without `close_notify`, [`etag`] caches answers, [`metrics`] counts calls, [`version`] keeps the versions a hook
//! reports of itself, and [`endpoint`] puts them together for one hook.

pub mod authority;
pub mod close;
pub mod credentials;
pub mod dial;
pub mod endpoint;
pub mod etag;
pub mod identity;
pub mod metrics;
pub mod pool;
pub mod settings;
pub mod version;
pub mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::DynamicObject;
use serde::Serialize;
use serde_json::Value;

pub use self::credentials::CredentialError;
use self::credentials::Credentials;
pub use self::endpoint::Endpoint;
pub use self::metrics::{HookKind, HookLabels, HookMetrics};
use self::pool::Pool;
pub use self::settings::SettingsError;
pub use self::version::{HOOK_VERSION_HEADER, HookVersions};
pub(crate) use self::wire::{
    COMPOSITE_RESPONSE_FIELDS, CUSTOMIZE_RESPONSE_FIELDS, DECORATOR_RESPONSE_FIELDS, MAP_FINALIZE_RESPONSE_FIELDS,
    MAP_RESPONSE_FIELDS, TOMBSTONE_RESPONSE_FIELDS,
};
pub use self::wire::{
    CompositeRequest, CompositeResponse, CustomizeRequest, CustomizeResponse, DecoratorRequest, DecoratorResponse,
    HookEvent, MapFinalizeRequest, MapFinalizeResponse, MapRequest, MapResponse, RelatedResourceRule, TombstoneRequest,
    TombstoneResponse,
};
use crate::api::{EndpointConfig, Hook, HookVersion, UnmarshalMode};

/// `children`, `attachments` and `related` maps: `"Kind.group/version"` → object key → object.
pub type ObjectMaps = BTreeMap<String, BTreeMap<String, WireObject>>;

/// An object of a request's maps: a cached object, serialized as hooks receive it ([`ObjectView`]).
#[derive(Debug, Clone)]
pub struct WireObject(pub Arc<DynamicObject>);

impl Serialize for WireObject {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ObjectView(&self.0).serialize(serializer)
    }
}

/// A cached object as hooks receive it: without the managedFields summary the cache keeps. Written
/// straight from the decoded object: going through a `serde_json::Value` first (a map node and a
/// `String` per key) was a tenth of the hub's CPU at idle (`perf`, 3,000 parents resynced every 10 s).
pub struct ObjectView<'a>(pub &'a DynamicObject);

impl Serialize for ObjectView<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let obj = self.0;
        let mut map = serializer.serialize_map(None)?;
        if let Some(types) = &obj.types {
            map.serialize_entry("apiVersion", &types.api_version)?;
            map.serialize_entry("kind", &types.kind)?;
        }
        map.serialize_entry("metadata", &MetadataView(&obj.metadata))?;
        if let Some(data) = obj.data.as_object() {
            for (key, value) in data.iter().filter(|(k, _)| !matches!(k.as_str(), "apiVersion" | "kind" | "metadata")) {
                map.serialize_entry(key, value)?;
            }
        }
        map.end()
    }
}

/// `metadata` without `managedFields`.
struct MetadataView<'a>(&'a ObjectMeta);

impl Serialize for MetadataView<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        fn field<M: SerializeMap, T: Serialize>(map: &mut M, key: &str, value: Option<&T>) -> Result<(), M::Error> {
            value.map_or(Ok(()), |v| map.serialize_entry(key, v))
        }
        // Every field named, so that a field a new k8s-openapi adds fails to compile here instead of
        // silently missing from what hooks see.
        let ObjectMeta {
            annotations,
            creation_timestamp,
            deletion_grace_period_seconds,
            deletion_timestamp,
            finalizers,
            generate_name,
            generation,
            labels,
            managed_fields: _,
            name,
            namespace,
            owner_references,
            resource_version,
            self_link,
            uid,
        } = self.0;
        let mut map = serializer.serialize_map(None)?;
        field(&mut map, "annotations", annotations.as_ref())?;
        field(&mut map, "creationTimestamp", creation_timestamp.as_ref())?;
        field(&mut map, "deletionGracePeriodSeconds", deletion_grace_period_seconds.as_ref())?;
        field(&mut map, "deletionTimestamp", deletion_timestamp.as_ref())?;
        field(&mut map, "finalizers", finalizers.as_ref())?;
        field(&mut map, "generateName", generate_name.as_ref())?;
        field(&mut map, "generation", generation.as_ref())?;
        field(&mut map, "labels", labels.as_ref())?;
        field(&mut map, "name", name.as_ref())?;
        field(&mut map, "namespace", namespace.as_ref())?;
        field(&mut map, "ownerReferences", owner_references.as_ref())?;
        field(&mut map, "resourceVersion", resource_version.as_ref())?;
        field(&mut map, "selfLink", self_link.as_ref())?;
        field(&mut map, "uid", uid.as_ref())?;
        map.end()
    }
}

/// A cached object as hooks receive it, as a JSON value (for requests that carry it beside others
/// built here, such as a revision's parent).
#[must_use]
pub fn for_hooks(obj: &DynamicObject) -> Value {
    serde_json::to_value(ObjectView(obj)).unwrap_or(Value::Null)
}

/// Outer key of an object map: `Kind.version` for the core group, else `Kind.group/version`.
#[must_use]
pub fn group_version_kind_key(api_version: &str, kind: &str) -> String {
    format!("{kind}.{api_version}")
}

/// Inner key of an object map for an object, given the hook version and the parent's namespace
/// (`None` for a cluster-scoped parent). Returns `None` when the v1 protocol cannot express the object:
/// one in another namespace than a namespaced parent's, which Metacontroller drops.
///
/// A cluster-scoped object under a namespaced parent is keyed by its name, as Metacontroller 4.10.2
/// keyed it: its name alone cannot be mistaken for one in the parent's namespace, since one map holds
/// one type. Metacontroller 4.10.3 on drops it too, which leaves a v1 hook that asks for its parent's
/// Namespace with nothing (the map's entry is `{}`); the hub does not.
#[must_use]
pub fn object_key(
    version: HookVersion,
    parent_namespace: Option<&str>,
    namespace: Option<&str>,
    name: &str,
) -> Option<String> {
    let qualified = || match namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_owned(),
    };
    match version {
        HookVersion::V2 => Some(qualified()),
        HookVersion::V1 => match (parent_namespace, namespace) {
            (None, _) => Some(qualified()),
            (Some(p), Some(ns)) if p == ns => Some(name.to_owned()),
            (Some(_), None) => Some(name.to_owned()),
            (Some(_), Some(_)) => None,
        },
    }
}

/// Why a hook call produced no usable response.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("http error calling {url}: {reason}")]
    Http { url: String, reason: String },
    #[error("hook {url} timed out after {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("hook {url} answered unsupported status code {code}, body: {body}")]
    Status { url: String, code: u16, body: String },
    /// HTTP 429: not a failure, the hook asks to be called again later.
    #[error("hook {url} asked to retry after {retry_after:?}")]
    TooManyRequests { url: String, retry_after: Duration },
    /// An error answer marked [`PERMANENT_ERROR_HEADER`]`: permanent`: the hook says calling again with
    /// the same object cannot help (an invalid spec field, say), so the hub does not retry it with
    /// backoff; it asks again when the object or its children change, or at the resync period.
    #[error("hook {url} answered {code}, a permanent error: {message}")]
    Permanent { url: String, code: u16, message: String },
    #[error("hook {url} response is not valid JSON of the expected shape: {source}")]
    Decode { url: String, source: serde_json::Error },
    #[error("hook {url} request could not be encoded: {source}")]
    Encode { url: String, source: serde_json::Error },
    #[error("hook {url} response has unknown fields {fields:?} (strict mode)")]
    UnknownFields { url: String, fields: Vec<String> },
    /// The body is larger than the hub accepts (`hookResponseLimit`); it was not read further.
    #[error("hook {url} response is larger than the limit of {limit} bytes")]
    TooLarge { url: String, limit: usize },
    /// A TLS or auth value the hook's settings name is missing or unusable.
    #[error("hook {url}: {source}")]
    Credentials { url: String, source: Box<CredentialError> },
    /// `304`/`412` to an `If-None-Match`, but the cached answer is gone (expired meanwhile).
    #[error("hook {url} answered {code} but no cached response is left for this object")]
    EtagGone { url: String, code: u16 },
}

/// The response header by which a hook marks an error answer as permanent (value `permanent`).
pub const PERMANENT_ERROR_HEADER: &str = "metahook-error";

impl HookError {
    /// The hook's own message, if it said its error is permanent.
    #[must_use]
    pub fn permanent_message(&self) -> Option<&str> {
        match self {
            Self::Permanent { message, .. } => Some(message),
            _ => None,
        }
    }
}

/// Default cap on a hook response body: far above any sane desired state, far below what would let one
/// hook push the hub's memory around (a 20 MB body took the hub from 21 to 143 MiB when read whole).
pub const DEFAULT_RESPONSE_LIMIT: usize = 8 * 1024 * 1024;

/// How the hub's hook client behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookClientConfig {
    /// Largest response body accepted, in bytes.
    pub response_limit: usize,
    /// `hookHosts`: hook server (`host[:port]` as its URL names it) → `host:port` to connect to.
    pub hook_hosts: BTreeMap<String, String>,
    /// Reuse connections between calls (off only to measure what that saves).
    pub keep_alive: bool,
    /// Send the W3C trace context of the calling span (`traceparent`, `tracestate`) with every call, so
    /// a hook's spans join the sync's trace. On when traces are exported; off, the headers are not
    /// even looked for.
    pub trace_context: bool,
    /// This replica's identity, sent with every call as [`REPLICA_HEADER`] when several replicas share
    /// the work (sharding): a hook's log then says which replica asked, so "never two replicas syncing
    /// one parent at once" can be audited from it.
    pub replica: Option<String>,
}

/// The request header naming the replica that calls a hook (with sharding on).
pub const REPLICA_HEADER: &str = "Metahook-Replica";

impl Default for HookClientConfig {
    fn default() -> Self {
        Self {
            response_limit: DEFAULT_RESPONSE_LIMIT,
            hook_hosts: BTreeMap::new(),
            keep_alive: true,
            trace_context: false,
            replica: None,
        }
    }
}

/// What every hook call of a hub shares.
struct Shared {
    pool: Pool,
    credentials: Credentials,
    metrics: Arc<HookMetrics>,
    /// Largest response body accepted, in bytes.
    limit: usize,
    /// Whether requests carry the caller's trace context ([`HookClientConfig::trace_context`]).
    trace_context: bool,
    /// The [`REPLICA_HEADER`] value, if set (an identity that is no header value is left out).
    replica: Option<http::HeaderValue>,
}

/// The hub's hook client: connection pools, credential watches and metrics. Controllers get an
/// [`Endpoint`] per hook from it. Cheap to clone.
#[derive(Clone)]
pub struct HookClient {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for HookClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookClient").field("limit", &self.shared.limit).finish_non_exhaustive()
    }
}

impl Default for HookClient {
    /// A client with default settings and no cluster: hooks whose settings read Secrets or `ConfigMap`s
    /// fail with a clear error (what `metahook render` uses).
    fn default() -> Self {
        Self::new(&HookClientConfig::default(), None)
    }
}

/// The endpoints of one controller's hooks.
#[derive(Clone, Debug, Default)]
pub struct ControllerHooks {
    pub sync: Option<Endpoint>,
    pub finalize: Option<Endpoint>,
    pub customize: Option<Endpoint>,
    /// The versions all three reported (`Metahook-Hook-Version`), shared.
    pub versions: HookVersions,
}

impl HookClient {
    /// A client for `config`; `cluster` is where referenced Secrets and `ConfigMap`s are watched.
    #[must_use]
    pub fn new(config: &HookClientConfig, cluster: Option<kube::Client>) -> Self {
        let pool = Pool::new(dial::Dialer::new(&config.hook_hosts), config.keep_alive);
        let shared = Shared {
            pool,
            credentials: Credentials::new(cluster),
            metrics: Arc::new(HookMetrics::default()),
            limit: config.response_limit,
            trace_context: config.trace_context,
            replica: config.replica.as_deref().and_then(|r| http::HeaderValue::from_str(r).ok()),
        };
        Self { shared: Arc::new(shared) }
    }

    /// The hook metrics of this client (register them with [`HookMetrics::register`]).
    #[must_use]
    pub fn metrics(&self) -> &Arc<HookMetrics> {
        &self.shared.metrics
    }

    /// An endpoint for `hook`, whose TLS and auth settings are its own or, when it sets none, those of
    /// the `endpoint_configs` entry for its host. Refuses settings Metacontroller refuses.
    pub fn endpoint(
        &self,
        hook: &Hook,
        endpoint_configs: &[EndpointConfig],
        labels: HookLabels,
    ) -> Result<Endpoint, SettingsError> {
        Endpoint::new(Arc::clone(&self.shared), hook, endpoint_configs, labels, HookVersions::default())
    }

    /// The endpoint of one hook of a controller (`which` of them, for its metrics), reporting its
    /// version into `versions`, which the controller's hooks share.
    pub fn controller_endpoint(
        &self,
        (kind, name): (&str, &str),
        hook: &Hook,
        which: HookKind,
        endpoint_configs: &[EndpointConfig],
        versions: &HookVersions,
    ) -> Result<Endpoint, SettingsError> {
        let labels = HookLabels { kind: kind.to_owned(), controller: name.to_owned(), hook: which };
        Endpoint::new(Arc::clone(&self.shared), hook, endpoint_configs, labels, versions.clone())
    }

    /// Endpoints for a controller's `sync`, `finalize` and `customize` hooks.
    pub fn controller_hooks(
        &self,
        kind: &str,
        name: &str,
        hooks: [Option<&Hook>; 3],
        endpoint_configs: &[EndpointConfig],
    ) -> Result<ControllerHooks, SettingsError> {
        let [sync, finalize, customize] = hooks;
        let versions = HookVersions::default();
        let endpoint = |hook: Option<&Hook>, which: HookKind| {
            hook.map(|hook| {
                let labels = HookLabels { kind: kind.to_owned(), controller: name.to_owned(), hook: which };
                Endpoint::new(Arc::clone(&self.shared), hook, endpoint_configs, labels, versions.clone())
            })
            .transpose()
        };
        Ok(ControllerHooks {
            sync: endpoint(sync, HookKind::Sync)?,
            finalize: endpoint(finalize, HookKind::Finalize)?,
            customize: endpoint(customize, HookKind::Customize)?,
            versions,
        })
    }
}

impl Endpoint {
    /// Calls a composite `sync`/`finalize` hook.
    pub async fn composite(&self, request: &CompositeRequest<'_>) -> Result<CompositeResponse, HookError> {
        let value = self.call(request, request.parent).await?;
        decode(self.url(), value, self.mode(), COMPOSITE_RESPONSE_FIELDS)
    }

    /// Calls a decorator `sync`/`finalize` hook.
    pub async fn decorator(&self, request: &DecoratorRequest<'_>) -> Result<DecoratorResponse, HookError> {
        let value = self.call(request, request.object).await?;
        decode(self.url(), value, self.mode(), DECORATOR_RESPONSE_FIELDS)
    }

    /// Calls a MapController `map` hook.
    pub async fn map(&self, request: &MapRequest<'_>) -> Result<MapResponse, HookError> {
        let value = self.call(request, request.parent).await?;
        decode(self.url(), value, self.mode(), MAP_RESPONSE_FIELDS)
    }

    /// Calls a MapController `tombstone` hook.
    pub async fn tombstone(&self, request: &TombstoneRequest<'_>) -> Result<TombstoneResponse, HookError> {
        let value = self.call(request, request.parent).await?;
        decode(self.url(), value, self.mode(), TOMBSTONE_RESPONSE_FIELDS)
    }

    /// Calls a MapController `finalize` hook.
    pub async fn map_finalize(&self, request: &MapFinalizeRequest<'_>) -> Result<MapFinalizeResponse, HookError> {
        let value = self.call(request, request.parent).await?;
        decode(self.url(), value, self.mode(), MAP_FINALIZE_RESPONSE_FIELDS)
    }

    /// Calls a `customize` hook.
    pub async fn customize(&self, request: &CustomizeRequest<'_>) -> Result<CustomizeResponse, HookError> {
        let value = self.call(request, request.parent).await?;
        decode(self.url(), value, self.mode(), CUSTOMIZE_RESPONSE_FIELDS)
    }
}

/// Decodes a response; in strict mode, unknown top-level fields are an error (as `UnmarshalStrict` does).
pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    url: &str,
    value: Value,
    mode: UnmarshalMode,
    known: &[&str],
) -> Result<T, HookError> {
    // serde reads a struct from a JSON array too, its fields by position: `[]` would be an answer with
    // every field left out (no children: delete them all). Every answer is an object.
    if !value.is_object() {
        let what = match &value {
            Value::Array(_) => "an array",
            Value::String(_) => "a string",
            Value::Number(_) => "a number",
            Value::Bool(_) => "a boolean",
            _ => "null",
        };
        let source =
            <serde_json::Error as serde::de::Error>::custom(format!("the answer must be a JSON object, not {what}"));
        return Err(HookError::Decode { url: url.to_owned(), source });
    }
    if mode == UnmarshalMode::Strict
        && let Value::Object(map) = &value
    {
        let fields: Vec<String> = map.keys().filter(|k| !known.contains(&k.as_str())).cloned().collect();
        if !fields.is_empty() {
            return Err(HookError::UnknownFields { url: url.to_owned(), fields });
        }
    }
    serde_json::from_value(value).map_err(|source| HookError::Decode { url: url.to_owned(), source })
}

/// `Retry-After` as integer seconds or an HTTP date.
fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let text = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = httpdate::parse_http_date(text).ok()?;
    Some(when.duration_since(std::time::SystemTime::now()).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body that is not an object is refused, whatever the mode: `[]` read as a struct by position
    /// was an answer with no children, and deleted every child.
    #[test]
    fn an_answer_that_is_not_an_object_is_refused() {
        for body in
            [serde_json::json!([]), serde_json::json!([{}]), serde_json::json!("x"), serde_json::json!(1), Value::Null]
        {
            for mode in [UnmarshalMode::Strict, UnmarshalMode::Loose] {
                let err = decode::<CompositeResponse>("u", body.clone(), mode, COMPOSITE_RESPONSE_FIELDS).unwrap_err();
                assert!(err.to_string().contains("must be a JSON object"), "{body}: {err}");
                assert!(decode::<DecoratorResponse>("u", body.clone(), mode, DECORATOR_RESPONSE_FIELDS).is_err());
                assert!(decode::<CustomizeResponse>("u", body.clone(), mode, CUSTOMIZE_RESPONSE_FIELDS).is_err());
            }
        }
    }

    #[test]
    fn objects_reach_hooks_as_serde_writes_them_without_managed_fields() {
        let full = serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {
                "name": "web", "namespace": "ns", "uid": "u-1", "resourceVersion": "42", "generation": 3,
                "creationTimestamp": "2026-01-02T03:04:05Z", "labels": {"app": "web"},
                "annotations": {"a": "b"}, "finalizers": ["f"], "generateName": "w-",
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "u-0", "controller": true}],
                "managedFields": [{"manager": "metahook", "operation": "Apply"}],
            },
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}},
            "status": {"ready": null, "ratio": 0.5},
        });
        let obj: DynamicObject = serde_json::from_value(full.clone()).unwrap();
        let mut expected = serde_json::to_value(&obj).unwrap();
        assert!(expected["metadata"].as_object_mut().unwrap().remove("managedFields").is_some());
        assert_eq!(for_hooks(&obj), expected);
        let text = serde_json::to_string(&WireObject(Arc::new(obj))).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), expected);
        assert_eq!(text.matches("\"apiVersion\"").count(), 2, "each key once (one more in ownerReferences): {text}");
        // An object that was never given its type (a list item) has no apiVersion or kind to show.
        let untyped = DynamicObject { types: None, ..serde_json::from_value(full).unwrap() };
        assert!(for_hooks(&untyped).get("kind").is_none());
    }

    #[test]
    fn outer_keys_follow_metacontroller() {
        assert_eq!(group_version_kind_key("v1", "Pod"), "Pod.v1");
        assert_eq!(group_version_kind_key("apps/v1", "ReplicaSet"), "ReplicaSet.apps/v1");
    }

    #[test]
    fn v1_keys_are_relative_to_the_parent() {
        let v1 = HookVersion::V1;
        assert_eq!(object_key(v1, Some("default"), Some("default"), "web-0").as_deref(), Some("web-0"));
        assert_eq!(object_key(v1, None, Some("team-a"), "cm").as_deref(), Some("team-a/cm"));
        assert_eq!(object_key(v1, None, None, "node-1").as_deref(), Some("node-1"));
        assert_eq!(object_key(v1, Some("default"), Some("other"), "x"), None);
        assert_eq!(
            object_key(v1, Some("default"), None, "ns-1").as_deref(),
            Some("ns-1"),
            "a cluster-scoped object under a namespaced parent: by name, as Metacontroller 4.10.2"
        );
    }

    #[test]
    fn v2_keys_are_uniform() {
        let v2 = HookVersion::V2;
        assert_eq!(object_key(v2, Some("default"), Some("default"), "web-0").as_deref(), Some("default/web-0"));
        assert_eq!(object_key(v2, Some("default"), None, "node-1").as_deref(), Some("node-1"));
    }

    #[test]
    fn response_decodes_metacontroller_sample() {
        let body = serde_json::json!({
            "status": {"replicas": 1, "readyReplicas": 1},
            "children": [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nginx-backend-1"}}],
            "resyncAfterSeconds": 0.5, "finalized": false
        });
        let r: CompositeResponse = decode("u", body, UnmarshalMode::Strict, COMPOSITE_RESPONSE_FIELDS).unwrap();
        assert_eq!(r.children.len(), 1);
        assert_eq!(r.resync_after_seconds, Some(0.5));
        assert_eq!(r.status.unwrap()["readyReplicas"], 1);
    }

    #[test]
    fn null_children_and_missing_fields_mean_empty() {
        let r: CompositeResponse =
            decode("u", serde_json::json!({"children": null}), UnmarshalMode::Loose, COMPOSITE_RESPONSE_FIELDS)
                .unwrap();
        assert!(r.children.is_empty() && r.status.is_none() && !r.finalized);
    }

    #[test]
    fn strict_mode_rejects_unknown_fields_and_loose_ignores_them() {
        let body = serde_json::json!({"children": [], "attachments": []});
        let err = decode::<CompositeResponse>("u", body.clone(), UnmarshalMode::Strict, COMPOSITE_RESPONSE_FIELDS)
            .unwrap_err();
        assert!(matches!(err, HookError::UnknownFields { ref fields, .. } if fields == &["attachments"]));
        assert!(decode::<CompositeResponse>("u", body, UnmarshalMode::Loose, COMPOSITE_RESPONSE_FIELDS).is_ok());
    }

    #[test]
    fn keys_are_case_sensitive() {
        let body = serde_json::json!({"Children": [{"kind": "Pod"}]});
        let r: CompositeResponse = decode("u", body, UnmarshalMode::Loose, COMPOSITE_RESPONSE_FIELDS).unwrap();
        assert!(r.children.is_empty());
    }

    #[test]
    fn wrong_shape_is_a_decode_error() {
        let err = decode::<CompositeResponse>(
            "u",
            serde_json::json!({"children": {"a": 1}}),
            UnmarshalMode::Loose,
            COMPOSITE_RESPONSE_FIELDS,
        )
        .unwrap_err();
        assert!(matches!(err, HookError::Decode { .. }));
    }

    #[test]
    fn decorator_response_keeps_null_labels_as_deletions() {
        let body = serde_json::json!({"labels": {"keep": "v", "drop": null}, "annotations": null, "status": null});
        let r: DecoratorResponse = decode("u", body, UnmarshalMode::Strict, DECORATOR_RESPONSE_FIELDS).unwrap();
        assert_eq!(r.labels["keep"].as_deref(), Some("v"));
        assert_eq!(r.labels["drop"], None);
        assert!(r.annotations.is_empty() && r.status.is_none());
    }

    #[test]
    fn customize_response_decodes_related_rules() {
        let body = serde_json::json!({"relatedResources": [
            {"apiVersion": "v1", "resource": "configmaps", "namespace": "src", "names": ["a"]},
            {"apiVersion": "v1", "resource": "secrets", "labelSelector": {"matchLabels": {"x": "y"}}}]});
        let r: CustomizeResponse = decode("u", body, UnmarshalMode::Strict, CUSTOMIZE_RESPONSE_FIELDS).unwrap();
        assert_eq!(r.related_resources.len(), 2);
        assert_eq!(r.related_resources[0].names, ["a"]);
    }

    #[test]
    fn retry_after_accepts_seconds_and_dates() {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        let later = std::time::SystemTime::now() + Duration::from_secs(120);
        headers.insert(http::header::RETRY_AFTER, httpdate::fmt_http_date(later).parse().unwrap());
        let d = retry_after(&headers).unwrap();
        assert!(d > Duration::from_secs(100) && d <= Duration::from_secs(120), "{d:?}");
    }

    /// A one-shot HTTP server on loopback that answers with `head` and then `body`, `chunk` bytes every
    /// `every` (a slow-drip hook when `every` is long).
    async fn serve_once(head: String, body: Vec<u8>, chunk: usize, every: Duration) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = [0_u8; 4096];
            let _ = stream.read(&mut request).await;
            let _ = stream.write_all(head.as_bytes()).await;
            for piece in body.chunks(chunk) {
                if stream.write_all(piece).await.is_err() {
                    return;
                }
                tokio::time::sleep(every).await;
            }
        });
        format!("http://127.0.0.1:{port}/sync")
    }

    fn hook(url: &str, timeout: &str) -> Hook {
        serde_json::from_value(serde_json::json!({"webhook": {"url": url, "timeout": timeout}})).unwrap()
    }

    /// An endpoint for `url` on a client that accepts bodies up to `limit` bytes.
    fn endpoint(limit: usize, url: &str, timeout: &str) -> Endpoint {
        let config = HookClientConfig { response_limit: limit, ..HookClientConfig::default() };
        let labels = HookLabels { kind: "CompositeController".into(), controller: "t".into(), hook: HookKind::Sync };
        HookClient::new(&config, None).endpoint(&hook(url, timeout), &[], labels).unwrap()
    }

    fn request() -> (Value, ObjectMaps) {
        (serde_json::json!({}), ObjectMaps::new())
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_refused_unread() {
        let body = format!("{{\"children\": [], \"status\": {{\"pad\": \"{}\"}}}}", "x".repeat(4096));
        // Chunked (no Content-Length): the limit is enforced while reading.
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n".to_owned();
        let url = serve_once(head, body.clone().into_bytes(), 512, Duration::ZERO).await;
        let (v, maps) = request();
        let req = CompositeRequest { controller: &v, parent: &v, children: &maps, related: &maps, finalizing: false };
        let err = endpoint(1024, &url, "5s").composite(&req).await.unwrap_err();
        assert!(matches!(err, HookError::TooLarge { limit: 1024, .. }), "{err}");
        // Declared length over the limit: refused before reading.
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
        let url = serve_once(head, body.clone().into_bytes(), body.len(), Duration::ZERO).await;
        let err = endpoint(1024, &url, "5s").composite(&req).await.unwrap_err();
        assert!(matches!(err, HookError::TooLarge { .. }), "{err}");
        // Under the limit: accepted.
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
        let url = serve_once(head, body.into_bytes(), 512, Duration::ZERO).await;
        assert!(endpoint(1 << 20, &url, "5s").composite(&req).await.is_ok());
    }

    #[tokio::test]
    async fn a_slow_drip_body_hits_the_whole_call_deadline() {
        let body = br#"{"children": [], "status": {}}"#.to_vec();
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
        // One byte every 100 ms: each read is quick, the whole body takes ~3 s.
        let url = serve_once(head, body, 1, Duration::from_millis(100)).await;
        let (v, maps) = request();
        let req = CompositeRequest { controller: &v, parent: &v, children: &maps, related: &maps, finalizing: false };
        let started = std::time::Instant::now();
        let err = endpoint(DEFAULT_RESPONSE_LIMIT, &url, "500ms").composite(&req).await.unwrap_err();
        assert!(matches!(err, HookError::Timeout { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    }
}
