//! Stage 0, api: the `metacontroller.k8s.io/v1alpha1` resources that users write, field for field what
//! Metacontroller accepts, so existing controller YAML applies unchanged; and the API server's own rules
//! for names, labels and sizes ([`validation`]), and the CRDs' schema for controllers that never reach
//! the API server ([`schema`]).
//!
//! May import: nothing of the crate (the ground floor).
//!
//! These are data: defaults and derived facts (hook URL, timeout, update method) live in small methods here;
//! what the engine does with them lives in [`crate::controllers::composite`].

pub mod json;
pub mod record;
pub mod revision;
pub mod schema;
pub mod validation;

/// The annotation that carries the hash of the desired state an object was last applied from (written
/// with every apply; see [`crate::write::apply`]).
pub const APPLIED_ANNOTATION: &str = "metahook.dev/applied";

/// Annotation naming the DecoratorController that manages an attachment (Metacontroller's): with the
/// target's controller reference, what makes an object one decorator's child and not another's.
pub const DECORATOR_ANNOTATION: &str = "metacontroller.k8s.io/decorator-controller";

/// The annotation the hub puts on a controller it read from a file (`controllersFrom`): where it was
/// read, `<path> document <n>`. Such a controller is nowhere in the API, so nothing writes a status or
/// an Event on it. The hub removes it from controller objects it reads from the API, so none can pose
/// as one read from a file.
pub const FROM_FILE_ANNOTATION: &str = "metahook.dev/from-file";

/// Where a controller was read from, if from a file ([`FROM_FILE_ANNOTATION`]).
#[must_use]
pub fn from_file(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<&str> {
    meta.annotations.as_ref()?.get(FROM_FILE_ANNOTATION).map(String::as_str)
}

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of every metahook/Metacontroller resource.
pub const GROUP: &str = "metacontroller.k8s.io";
/// The only version Metacontroller serves.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of every metahook/Metacontroller resource.
pub const GROUP_VERSION: &str = "metacontroller.k8s.io/v1alpha1";
/// `apiVersion` of the hub's own bookkeeping, which is not Metacontroller's API
/// ([`record::ChildRecord`]).
pub const OWN_GROUP_VERSION: &str = "metahook.dev/v1alpha1";

/// A controller whose parent type is `parentResource` and whose children are computed by the `sync` hook.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
// Two printer columns of type string (Ready, Reason) are not a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[kube(
    group = "metacontroller.k8s.io",
    version = "v1alpha1",
    kind = "CompositeController",
    plural = "compositecontrollers",
    shortname = "cc",
    shortname = "cctl",
    status = "ControllerStatus",
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].reason"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct CompositeControllerSpec {
    pub parent_resource: ParentResourceRule,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub child_resources: Vec<ChildResourceRule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<CompositeControllerHooks>,
    /// Per-host TLS/auth defaults for hooks that set none of their own (Metacontroller 4.16).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoint_configs: Vec<EndpointConfig>,
    /// Sync each parent again this many seconds after its own last sync, even when nothing changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync_period_seconds: Option<i32>,
    /// Select children by a `controller-uid: <parent UID>` label the hub adds to them, instead of the
    /// parent's `spec.selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate_selector: Option<bool>,
    /// A metahook extension: what the `customize` hook's related rules may reach (see [`RelatedLimit`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub related_limit: Option<RelatedLimit>,
}

/// A metahook extension: the most a controller's `customize` hook may select as related objects.
/// Whoever may create a parent writes what the hook reads, so a rule whose namespace or name comes
/// from the parent's spec lets them read through the hub (Metacontroller's v2 `sourceNamespace`
/// example reads any namespace): a controller's author bounds that here. Without it, Metacontroller's
/// rules hold (v1: the parent's own namespace for a namespaced parent; v2, or a cluster-scoped parent:
/// any namespace).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelatedLimit {
    /// The namespaces a rule may select objects in besides the parent's own (`[]`: the parent's own
    /// only). A rule naming another namespace is refused; one that selects across namespaces (no
    /// `namespace`, or a `namespaceSelector`) selects only in these. Absent: any namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Vec<String>>,
    /// The types a rule may select; a rule for another type is refused. Absent: any type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Vec<RelatedType>>,
}

impl RelatedLimit {
    /// Whether a rule may select objects of `api_version`'s group and `resource` (the version is not
    /// compared: the same objects are served at each).
    #[must_use]
    pub fn allows_type(&self, api_version: &str, resource: &str) -> bool {
        let group = |v: &str| v.rsplit_once('/').map_or(String::new(), |(g, _)| g.to_owned());
        self.resources.as_ref().is_none_or(|types| {
            types.iter().any(|t| t.resource == resource && group(&t.api_version) == group(api_version))
        })
    }

    /// The namespaces a rule of a parent in `parent_namespace` may reach (`None`: any).
    #[must_use]
    pub fn namespaces_for(&self, parent_namespace: Option<&str>) -> Option<std::collections::BTreeSet<String>> {
        let listed = self.namespaces.as_ref()?;
        Some(listed.iter().cloned().chain(parent_namespace.map(str::to_owned)).collect())
    }
}

/// A type, by `apiVersion` and plural resource name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelatedType {
    /// `group/version`, or `v1` for the core group.
    pub api_version: String,
    /// Lowercase plural resource name, e.g. `configmaps`.
    pub resource: String,
}

/// A controller that adds labels, annotations, status and attachments to existing objects of any type.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
// Two printer columns of type string (Ready, Reason) are not a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[kube(
    group = "metacontroller.k8s.io",
    version = "v1alpha1",
    kind = "DecoratorController",
    plural = "decoratorcontrollers",
    shortname = "dec",
    shortname = "decorators",
    status = "ControllerStatus",
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].reason"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct DecoratorControllerSpec {
    /// The types to decorate; an object is a target if it matches any rule.
    pub resources: Vec<DecoratorResourceRule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<ChildResourceRule>,
    pub hooks: DecoratorControllerHooks,
    /// As [`CompositeControllerSpec::endpoint_configs`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoint_configs: Vec<EndpointConfig>,
    /// Sync each target again this many seconds after its own last sync, even when nothing changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync_period_seconds: Option<i32>,
    /// A metahook extension: what the `customize` hook's related rules may reach (see [`RelatedLimit`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub related_limit: Option<RelatedLimit>,
}

/// A metahook extension of the group, to Metacontroller's own design (its book's "MapController" page,
/// never built there): for every input object the parent's `spec.selector` selects, the `map` hook says
/// which outputs the parent should own for it. One hook call per input, each with only that input and
/// the outputs made for it.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
// Two printer columns of type string (Ready, Reason) are not a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[kube(
    group = "metacontroller.k8s.io",
    version = "v1alpha1",
    kind = "MapController",
    plural = "mapcontrollers",
    shortname = "mapc",
    status = "ControllerStatus",
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].reason"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct MapControllerSpec {
    /// The parent type: each parent owns the outputs made for the inputs it selects, and its status
    /// is the hub's aggregation of them.
    pub parent_resource: MapParentRule,
    /// The input types. A parent's inputs are the objects of these types its `spec.selector` selects
    /// (empty or absent: all), in the parent's namespace (any namespace for a cluster-scoped parent),
    /// except objects the parent itself controls.
    pub input_resources: Vec<InputResourceRule>,
    /// The output types: what the map hook may answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_resources: Vec<OutputResourceRule>,
    pub hooks: MapControllerHooks,
    /// As [`CompositeControllerSpec::endpoint_configs`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoint_configs: Vec<EndpointConfig>,
    /// Sync each parent again this many seconds after its own last sync: every input's map hook and
    /// every tombstone hook is asked again, even when nothing changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync_period_seconds: Option<i32>,
}

/// Which objects are a MapController's parents.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MapParentRule {
    /// `group/version`, or `v1` for the core group.
    pub api_version: String,
    /// Lowercase plural resource name.
    pub resource: String,
    /// Only parents whose labels match are synced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
    /// When true, parent updates that change only `.status` do not trigger a sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_status_changes: Option<bool>,
}

/// One input type of a MapController.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InputResourceRule {
    /// `group/version`, or `v1` for the core group.
    pub api_version: String,
    /// Lowercase plural resource name, e.g. `persistentvolumeclaims`.
    pub resource: String,
}

/// One output type of a MapController.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutputResourceRule {
    /// `group/version`, or `v1` for the core group.
    pub api_version: String,
    /// Lowercase plural resource name, e.g. `configmaps`.
    pub resource: String,
    /// As a CompositeController child type's (`OnDelete` unless set; no rolling methods).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<ChildUpdateStrategy>,
}

impl OutputResourceRule {
    /// The same type as a child type rule (outputs are owned by their parent as children are).
    #[must_use]
    pub fn as_child_rule(&self) -> ChildResourceRule {
        ChildResourceRule {
            api_version: self.api_version.clone(),
            resource: self.resource.clone(),
            update_strategy: self.update_strategy.clone(),
            cross_namespace: None,
            adopt_across_namespaces: None,
        }
    }
}

/// The hooks of a MapController.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MapControllerHooks {
    /// Called once per input: the input's desired outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map: Option<Hook>,
    /// Called for the outputs of an input that is gone (detached outputs): which of them to keep.
    /// Without it, detached outputs are deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tombstone: Option<Hook>,
    /// Called while a parent is being deleted (the hub's finalizer holds it until the hook answers
    /// `finalized: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalize: Option<Hook>,
}

/// One target type of a DecoratorController; both selectors must match (absent = everything).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DecoratorResourceRule {
    /// `group/version`, or `v1` for the core group.
    pub api_version: String,
    /// Lowercase plural resource name, e.g. `statefulsets`.
    pub resource: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotation_selector: Option<AnnotationSelector>,
    /// When true, target updates that change only `.status` do not trigger a sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_status_changes: Option<bool>,
}

/// A label selector evaluated against annotations.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnnotationSelector {
    /// Annotations the object must have, with these values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_annotations: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_expressions: Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement>>,
}

impl AnnotationSelector {
    /// The same requirements as a `LabelSelector`, to evaluate with [`crate::cache::selector::Selector`].
    #[must_use]
    pub fn as_label_selector(&self) -> LabelSelector {
        LabelSelector {
            match_labels: self.match_annotations.clone(),
            match_expressions: self.match_expressions.clone(),
        }
    }
}

/// The hooks of a DecoratorController.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DecoratorControllerHooks {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<Hook>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalize: Option<Hook>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub customize: Option<Hook>,
}

/// Which objects are parents.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParentResourceRule {
    /// `group/version`, or `v1` for the core group.
    pub api_version: String,
    /// Lowercase plural resource name, e.g. `deployments`.
    pub resource: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_history: Option<RevisionHistory>,
    /// Only parents whose labels match are synced; a non-matching parent still carrying our finalizer is finalized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
    /// When true, parent updates that change only `.status` do not trigger a sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_status_changes: Option<bool>,
}

/// Which parent fields roll out gradually (rolling update strategies).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionHistory {
    /// Dotted paths of the parent fields a revision records and rolls out (default `spec`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub field_paths: Vec<String>,
}

/// One child type of a CompositeController.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChildResourceRule {
    /// `group/version`, or `v1` for the core group.
    pub api_version: String,
    /// Lowercase plural resource name, e.g. `configmaps`.
    pub resource: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<ChildUpdateStrategy>,
    /// A metahook extension: children of this type may be in other namespaces than their namespaced
    /// parent's (or cluster-scoped). Those carry the parent's UID in the `metahook.dev/parent-uid` label
    /// instead of an ownerReference, and the hub deletes them when the parent is deleted (its finalizer
    /// holds the parent until then). Not on a cluster-scoped parent, a DecoratorController, or a hub
    /// limited to some namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_namespace: Option<bool>,
    /// A metahook extension, with `crossNamespace` only: a parent adopts the orphans its selector selects
    /// in any namespace, not only in its own. Off by default, because whoever may create a parent writes
    /// its selector: with it on, a parent's author can make the hub adopt (and then delete) matching
    /// objects anywhere. Set it only where the selector is the controller's own (`generateSelector`) or
    /// parents are written by people trusted with every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt_across_namespaces: Option<bool>,
}

impl ChildResourceRule {
    /// The update method, `OnDelete` when unspecified (as in Metacontroller).
    #[must_use]
    pub fn method(&self) -> UpdateMethod {
        self.update_strategy.as_ref().and_then(|s| s.method).unwrap_or_default()
    }

    /// Whether children of this type may live outside the parent's namespace (`crossNamespace`).
    #[must_use]
    pub fn cross_namespace(&self) -> bool {
        self.cross_namespace == Some(true)
    }

    /// Whether a parent adopts selected orphans of this type outside its own namespace
    /// (`crossNamespace` and `adoptAcrossNamespaces` both set).
    #[must_use]
    pub fn adopts_across_namespaces(&self) -> bool {
        self.cross_namespace() && self.adopt_across_namespaces == Some(true)
    }
}

/// How a child that differs from the desired state is brought in line.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChildUpdateStrategy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<UpdateMethod>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_checks: Option<StatusChecks>,
}

/// Child update methods (Metacontroller names).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum UpdateMethod {
    /// Never update an existing child; it is recreated only after someone else deletes it.
    #[default]
    OnDelete,
    /// Delete a differing child; the next sync creates it anew.
    Recreate,
    /// Update a differing child in place.
    InPlace,
    /// Like `Recreate`, one child at a time, gated by status checks.
    RollingRecreate,
    /// Like `InPlace`, one child at a time, gated by status checks.
    RollingInPlace,
}

impl UpdateMethod {
    /// Whether the method moves children between parent revisions one at a time.
    #[must_use]
    pub fn is_rolling(self) -> bool {
        matches!(self, Self::RollingRecreate | Self::RollingInPlace)
    }

    /// Whether the method changes a differing child by deleting it (and creating it anew).
    #[must_use]
    pub fn recreates(self) -> bool {
        matches!(self, Self::Recreate | Self::RollingRecreate)
    }
}

/// Conditions an updated child must report before a rolling update moves on.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusChecks {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<StatusConditionCheck>,
}

/// One required condition of a child.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusConditionCheck {
    /// The condition's `type` in the child's `status.conditions`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The `status` it must have (e.g. `"True"`); any when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// The `reason` it must have; any when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The hooks of a CompositeController.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompositeControllerHooks {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<Hook>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalize: Option<Hook>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub customize: Option<Hook>,
    /// Declared by Metacontroller but never called there either; accepted so existing YAML applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_update_child: Option<Hook>,
    /// Declared by Metacontroller but never called there either; accepted so existing YAML applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_update_child: Option<Hook>,
}

/// One hook: a webhook and the wire protocol version it speaks.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// `v1` unless set (the CRD default, as Metacontroller's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "v1"))]
    pub version: Option<HookVersion>,
    pub webhook: Webhook,
}

impl Hook {
    /// The protocol version; unspecified means `v1`.
    #[must_use]
    pub fn version(&self) -> HookVersion {
        self.version.unwrap_or_default()
    }

    /// How strictly responses are decoded: explicit mode, else `loose` for v1 and `strict` for v2.
    #[must_use]
    pub fn unmarshal_mode(&self) -> UnmarshalMode {
        self.webhook.response_unmarshall_mode.unwrap_or(match self.version() {
            HookVersion::V1 => UnmarshalMode::Loose,
            HookVersion::V2 => UnmarshalMode::Strict,
        })
    }
}

/// Hook wire protocol version: decides how `children`/`related` maps are keyed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum HookVersion {
    /// Keys are `name`, or `namespace/name` under a cluster-scoped parent.
    #[default]
    #[serde(rename = "v1")]
    V1,
    /// Keys are always `namespace/name` for namespaced objects and `name` for cluster-scoped ones.
    #[serde(rename = "v2")]
    V2,
}

/// Whether unknown fields in a hook response are an error.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum UnmarshalMode {
    Loose,
    Strict,
}

/// Where a hook lives: a full `url`, or an in-cluster `service` plus `path`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.url) || (has(self.service) && has(self.path))").message("must specify either a full 'url', or both 'service' and 'path'"))]
pub struct Webhook {
    /// The hook's full URL (`http://` or `https://`; a `user:password@` is sent as basic auth).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceReference>,
    /// The path on the `service`, e.g. `/sync`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Go duration (`10s`, `1m30s`, `500ms`); default 10s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "duration"))]
    pub timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<EtagConfig>,
    #[serde(default, rename = "responseUnMarshallMode", skip_serializing_if = "Option::is_none")]
    pub response_unmarshall_mode: Option<UnmarshalMode>,
    /// CA certificates that verify the hook's server certificate (replacing the system roots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundle>,
    /// A client certificate presented to the hook (mutual TLS).
    #[serde(default, rename = "clientTLS", skip_serializing_if = "Option::is_none")]
    pub client_tls: Option<ClientTls>,
    /// An `Authorization: <type> <credentials>` header from a Secret (not with `basicAuth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization: Option<Authorization>,
    /// An `Authorization: Basic ...` header from a Secret's username and password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<BasicAuth>,
}

/// Default hook timeout, as in Metacontroller.
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(10);

impl Webhook {
    /// The URL to POST to: `url` if set, else `<protocol>://<name>.<namespace>:<port><path>`.
    #[must_use]
    pub fn resolved_url(&self) -> Option<String> {
        if let Some(url) = &self.url {
            return Some(url.clone());
        }
        let (service, path) = (self.service.as_ref()?, self.path.as_ref()?);
        let protocol = service.protocol.as_deref().unwrap_or("http");
        let port = service.port.unwrap_or(80);
        Some(format!("{protocol}://{}.{}:{port}{path}", service.name, service.namespace))
    }

    /// The call timeout; missing, unparsable or non-positive values mean 10s (as in Metacontroller).
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout.as_deref().and_then(parse_go_duration).filter(|d| !d.is_zero()).unwrap_or(DEFAULT_HOOK_TIMEOUT)
    }
}

/// An in-cluster Service that serves a hook.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceReference {
    /// The Service's name.
    pub name: String,
    /// The Service's namespace.
    pub namespace: String,
    /// The port to call; 80 when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// `http` (when unset) or `https`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

/// Response caching by ETag (Metacontroller's `webhook.etag`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtagConfig {
    /// Send the last answer's ETag as `If-None-Match`, and reuse that answer on `304` (or `412`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// How long a cached answer may be reused; never expires when unset or not positive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_timeout_seconds: Option<i32>,
    /// How often expired answers are dropped from the cache; never when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_cleanup_seconds: Option<i32>,
}

/// TLS and auth settings for every hook whose URL has this `host` (and which sets none of its own).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointConfig {
    /// `host` or `host:port`, compared case-insensitively; a missing port means the scheme's default.
    /// For a `service` hook the host is `<name>.<namespace>`.
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundle>,
    #[serde(default, rename = "clientTLS", skip_serializing_if = "Option::is_none")]
    pub client_tls: Option<ClientTls>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization: Option<Authorization>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<BasicAuth>,
}

/// Where CA certificates (PEM) come from: exactly one of the three.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaBundle {
    /// PEM text in the controller spec itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<ResourceKeyRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<ResourceKeyRef>,
}

/// A key of a Secret or `ConfigMap`; `key` defaults to `ca.crt`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceKeyRef {
    /// The object's name.
    pub name: String,
    /// The object's namespace.
    pub namespace: String,
    /// The key holding the PEM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "ca.crt"))]
    pub key: Option<String>,
}

/// A Secret, by name and namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// The Secret's name.
    pub name: String,
    /// The Secret's namespace.
    pub namespace: String,
}

/// A key of a Secret (the key is required).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name.
    pub name: String,
    /// The Secret's namespace.
    pub namespace: String,
    /// The key holding the value.
    pub key: String,
}

/// A client certificate and key from a Secret (`tls.crt` and `tls.key` unless named otherwise).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientTls {
    pub secret_ref: SecretRef,
    /// The key holding the certificate (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "tls.crt"))]
    pub cert_key: Option<String>,
    /// The key holding the private key (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "tls.key"))]
    pub private_key_key: Option<String>,
}

/// `Authorization: <type> <trimmed Secret value>`; `type` defaults to `Bearer` and may not be `Basic`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Authorization {
    /// The scheme in front of the credentials.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "Bearer"))]
    pub type_: Option<String>,
    pub secret_ref: SecretKeyRef,
}

/// HTTP basic authentication from a Secret (`username` and `password` unless named otherwise).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BasicAuth {
    pub secret_ref: SecretRef,
    /// The key holding the user name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "username"))]
    pub username_key: Option<String>,
    /// The key holding the password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "password"))]
    pub password_key: Option<String>,
}

/// What metahook reports about a controller object. Metacontroller's status is empty, so these fields
/// are additions that old clients ignore.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControllerStatus {
    /// `metadata.generation` of the spec the running controller was built from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: whether the controller runs, and if not, why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The newest version its hooks reported (`Metahook-Hook-Version`) and how many of its parents that
    /// version has answered for; absent until a hook names a version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_version: Option<HookVersionStatus>,
    /// The canary of the sync hook named by the `metahook.dev/canary` annotation: its state and what it
    /// and the current hook did side by side; absent without the annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryStatus>,
    /// The types whose objects may carry the controller's finalizer, written by the hub before it puts
    /// the finalizer on any of them and pruned once it took it off a type no longer in the spec: a
    /// parent or target type taken out of the spec while no hub ran is still let go of (kept in the API,
    /// as a promise that must outlive a hub is).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finalized_types: Vec<FinalizedType>,
    /// Whether the hub keeps records of the controller's children in other namespaces (a child type is
    /// `crossNamespace`), each held by a finalizer of the hub's: written before the first record, cleared
    /// once they were released, so a last `crossNamespace` type taken out while no hub ran still has
    /// its records released.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keeps_records: bool,
}

/// A type a controller's finalizer may be on (`status.finalizedTypes`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FinalizedType {
    pub api_version: String,
    /// The plural resource name.
    pub resource: String,
}

/// A canary of the sync hook: a candidate hook answers for the parents of the first `percent` of buckets.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStatus {
    /// The candidate's URL (the `service` form spelled out); empty when the annotation is invalid.
    pub url: String,
    /// The share of parents (by bucket) the candidate answers for while `Running`.
    pub percent: f64,
    /// `Running`, `Halted` (its error ratio passed `maxErrorRatio`: the current hook answers for every
    /// parent again) or `Invalid` (the annotation cannot be used: nothing changed).
    pub state: String,
    /// Why it halted, or what is wrong with the annotation.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The annotation's value this canary was started from. A `Halted` canary is read back from here
    /// when the controller starts again (a restart, a fail-over, a change of its spec): it stays halted
    /// until the annotation changes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub annotation: String,
    /// Syncs of the parents the current hook answered for, since the canary started.
    pub current: CanaryTally,
    /// Syncs of the parents the candidate answered for.
    pub candidate: CanaryTally,
}

/// What the syncs of one side of a canary did.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryTally {
    /// Syncs that asked this side's hook.
    pub syncs: i64,
    /// Of those, syncs that failed: the hook's error, an answer the hub refused, a write the API server
    /// refused.
    pub errors: i64,
    /// Of those, the hook's permanent errors (`Metahook-Error: permanent`).
    pub permanent_errors: i64,
    /// Children created, updated or deleted by those syncs.
    pub writes: i64,
}

/// How far a new hook version has got: parents it answered for, of all the controller's parents.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HookVersionStatus {
    /// The version reported last for the first time (`Metahook-Hook-Version`).
    pub version: String,
    /// Parents whose last hook answer came from that version.
    pub synced: i64,
    /// Parents the controller has (selects or still finalizes).
    pub parents: i64,
}

/// Parses a Go `time.Duration` string such as `10s`, `1m30s`, `1.5h` or `250ms`.
#[must_use]
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    const UNITS: [(&str, f64); 7] =
        [("ns", 1e-9), ("us", 1e-6), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0), ("m", 60.0), ("h", 3600.0)];
    let mut rest = text.trim();
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = 0.0_f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let (unit, scale) =
            UNITS.iter().filter(|(unit, _)| rest.starts_with(unit)).max_by_key(|(unit, _)| unit.len())?;
        rest = &rest[unit.len()..];
        total += number * scale;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// Labels of an object as a map (empty when unset).
#[must_use]
pub fn labels_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> BTreeMap<String, String> {
    meta.labels.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_like_go() {
        assert_eq!(parse_go_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_go_duration("10"), None);
        assert_eq!(parse_go_duration("ten seconds"), None);
    }

    #[test]
    fn webhook_timeout_defaults_to_ten_seconds_when_missing_or_not_positive() {
        let mut hook: Webhook = serde_json::from_value(serde_json::json!({"url": "http://x"})).unwrap();
        assert_eq!(hook.timeout(), DEFAULT_HOOK_TIMEOUT);
        hook.timeout = Some("0s".into());
        assert_eq!(hook.timeout(), DEFAULT_HOOK_TIMEOUT);
        hook.timeout = Some("3s".into());
        assert_eq!(hook.timeout(), Duration::from_secs(3));
    }

    #[test]
    fn service_webhook_resolves_to_cluster_dns_url() {
        let hook: Webhook = serde_json::from_value(serde_json::json!({
            "service": {"name": "hooks", "namespace": "ops"}, "path": "/sync"
        }))
        .unwrap();
        assert_eq!(hook.resolved_url().as_deref(), Some("http://hooks.ops:80/sync"));
    }

    #[test]
    fn unmarshal_mode_follows_version_unless_explicit() {
        let v2: Hook = serde_json::from_value(serde_json::json!({"version": "v2", "webhook": {"url": "u"}})).unwrap();
        assert_eq!(v2.unmarshal_mode(), UnmarshalMode::Strict);
        let v1: Hook = serde_json::from_value(serde_json::json!({"webhook": {"url": "u"}})).unwrap();
        assert_eq!(v1.unmarshal_mode(), UnmarshalMode::Loose);
        let explicit: Hook = serde_json::from_value(
            serde_json::json!({"version": "v2", "webhook": {"url": "u", "responseUnMarshallMode": "loose"}}),
        )
        .unwrap();
        assert_eq!(explicit.unmarshal_mode(), UnmarshalMode::Loose);
    }

    #[test]
    fn hook_tls_and_auth_settings_round_trip_with_metacontroller_field_names() {
        let yaml = r#"
parentResource: {apiVersion: v1, resource: configmaps}
endpointConfigs:
- host: hooks.example.com:8443
  caBundle: {secretRef: {name: hook-tls, namespace: ops}}
  clientTLS: {secretRef: {name: client, namespace: ops}, certKey: cert.pem, privateKeyKey: key.pem}
  basicAuth: {secretRef: {name: basic, namespace: ops}, usernameKey: user, passwordKey: pass}
hooks:
  sync:
    webhook:
      url: https://hooks.example.com:8443/sync
      caBundle: {configMapRef: {name: ca, namespace: ops, key: bundle.pem}}
      authorization: {type: Token, secretRef: {name: token, namespace: ops, key: token}}
      etag: {enabled: true, cacheTimeoutSeconds: 60, cacheCleanupSeconds: 10}
  customize:
    webhook:
      url: https://hooks.example.com/customize
      caBundle: {inline: "-----BEGIN CERTIFICATE-----"}
"#;
        let spec: CompositeControllerSpec = crate::ops::yaml::from_str(yaml).unwrap();
        let sync = &spec.hooks.as_ref().unwrap().sync.as_ref().unwrap().webhook;
        assert_eq!(sync.authorization.as_ref().unwrap().type_.as_deref(), Some("Token"));
        assert_eq!(
            sync.ca_bundle.as_ref().unwrap().config_map_ref.as_ref().unwrap().key.as_deref(),
            Some("bundle.pem")
        );
        assert_eq!(spec.endpoint_configs[0].client_tls.as_ref().unwrap().private_key_key.as_deref(), Some("key.pem"));
        let original: serde_json::Value = crate::ops::yaml::from_str(yaml).unwrap();
        assert_eq!(serde_json::to_value(&spec).unwrap(), original);
    }

    #[test]
    fn metacontroller_yaml_round_trips_without_loss() {
        let yaml = r#"
apiVersion: metacontroller.k8s.io/v1alpha1
kind: CompositeController
metadata:
  name: catset-controller
spec:
  parentResource:
    apiVersion: ctl.enisoc.com/v1
    resource: catsets
    revisionHistory:
      fieldPaths: [spec.template]
  childResources:
  - apiVersion: v1
    resource: pods
    updateStrategy:
      method: RollingRecreate
      statusChecks:
        conditions:
        - type: Ready
          status: "True"
  - apiVersion: v1
    resource: persistentvolumeclaims
  generateSelector: true
  resyncPeriodSeconds: 5
  hooks:
    sync:
      webhook:
        url: http://catset-controller.metacontroller/sync
        timeout: 20s
    finalize:
      version: v2
      webhook:
        service: {name: catset-controller, namespace: metacontroller, port: 8080}
        path: /finalize
"#;
        let cc: CompositeController = crate::ops::yaml::from_str(yaml).unwrap();
        assert_eq!(cc.spec.child_resources[0].method(), UpdateMethod::RollingRecreate);
        assert_eq!(cc.spec.child_resources[1].method(), UpdateMethod::OnDelete);
        let original: serde_json::Value = crate::ops::yaml::from_str(yaml).unwrap();
        let mut back = serde_json::to_value(&cc).unwrap();
        back.as_object_mut().unwrap().remove("status");
        assert_eq!(back["spec"], original["spec"]);
    }
}
