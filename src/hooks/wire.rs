//! The bodies of the hook wire protocol (Metacontroller v1 and v2, plus metahook's `events`): serde types
//! that mirror the JSON exactly, and the one source of the helper libraries' types.
//!
//! Their JSON schema (schemars) is what `tools::wiretypes` writes the Python `TypedDict`s
//! (`metahook_hooks/wire_gen.py`) and the TypeScript declarations (`metahook-hooks/wire.d.ts`) from,
//! and a test fails when those files differ from what these types say now. So the doc comments of the
//! types and fields below are read by hook authors in three languages: they say what a hook sees or
//! sends, without Rust links.
//!
//! The schema says what a hook should send, which is narrower than what the hub accepts: a `null` where a
//! list, a map or a number is expected counts as empty or absent (Go hooks send `null` for an empty
//! slice), but only the fields where `null` means something of its own (`status`, a label to delete) are
//! typed nullable. Objects are kept loose ([`KubeObject`]): a hook may send any kind, also kinds this
//! binary has never heard of.

use std::borrow::Cow;
use std::collections::BTreeMap;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ObjectMaps;

/// The schema's extension naming a field whose type a hook declares for itself (its parent's kind, its
/// child types): the wire carries any object there, and the TypeScript types take it as a type
/// parameter of this name.
pub const TYPE_PARAMETER: &str = "x-type-parameter";

/// Request body of a CompositeController `sync` or `finalize` call. Sync and finalize share it:
/// `finalizing` tells them apart.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CompositeRequest<'a> {
    /// The CompositeController.
    #[schemars(with = "KubeObject")]
    pub controller: &'a Value,
    /// The parent.
    #[schemars(with = "KubeObject", extend("x-type-parameter" = "Parent"))]
    pub parent: &'a Value,
    /// The parent's children, by type key and object key.
    #[schemars(with = "ObjectMap", extend("x-type-parameter" = "Children"))]
    pub children: &'a ObjectMaps,
    /// The objects the customize hook selected (empty without one).
    #[schemars(with = "ObjectMap", extend("x-type-parameter" = "Related"))]
    pub related: &'a ObjectMaps,
    /// `true` when the finalize hook is called: the parent is being deleted, or no longer selected.
    pub finalizing: bool,
}

/// Response body of a CompositeController `sync` or `finalize` call; every field is optional.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompositeResponse {
    /// Replaces the parent's `.status`; `null` or absent means "no status" (the hub writes only
    /// `observedGeneration`, which it adds in any case).
    #[serde(default)]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub status: Option<Value>,
    /// Every child that should exist; a child of a declared type missing here is deleted.
    #[serde(default, deserialize_with = "null_as_default")]
    #[schemars(with = "Vec<KubeObject>")]
    pub children: Vec<Value>,
    /// Sync this parent again after this many seconds (fractions allowed); `0` or absent: no resync.
    #[serde(default)]
    #[schemars(with = "f64")]
    pub resync_after_seconds: Option<f64>,
    /// With `finalizing: true`: the parent may now go (the hub removes its finalizer).
    #[serde(default)]
    pub finalized: bool,
    /// metahook extension: Events the hub records on the parent (Metacontroller does not know the
    /// field: its v1 hooks ignore it, its v2 hooks read strictly and fail on it).
    #[serde(default, deserialize_with = "null_as_default")]
    #[schemars(with = "Vec<HookEvent>")]
    pub events: Vec<HookEvent>,
}

/// The top-level fields of [`CompositeResponse`], for strict decoding (a test keeps it equal to the schema).
pub(crate) const COMPOSITE_RESPONSE_FIELDS: &[&str] =
    &["status", "children", "resyncAfterSeconds", "finalized", "events"];

/// Request body of a `customize` call, for both controller kinds (a DecoratorController's target is
/// `parent` here too).
#[derive(Debug, Serialize, JsonSchema)]
pub struct CustomizeRequest<'a> {
    /// The CompositeController or DecoratorController.
    #[schemars(with = "KubeObject")]
    pub controller: &'a Value,
    /// The parent (or target).
    #[schemars(with = "KubeObject", extend("x-type-parameter" = "Parent"))]
    pub parent: &'a Value,
}

/// Response body of a `customize` call.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomizeResponse {
    /// What the sync request's `related` map holds; absent: nothing.
    #[serde(default, deserialize_with = "null_as_default")]
    #[schemars(with = "Vec<RelatedResourceRule>")]
    pub related_resources: Vec<RelatedResourceRule>,
}

/// The top-level fields of [`CustomizeResponse`], for strict decoding.
pub(crate) const CUSTOMIZE_RESPONSE_FIELDS: &[&str] = &["relatedResources"];

/// One kind of related object a customize hook asks for. `names` excludes the selectors, and `namespace`
/// excludes `namespaceSelector`.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelatedResourceRule {
    /// The type's API version (`v1`, `apps/v1`).
    pub api_version: String,
    /// The type's plural resource name (`configmaps`).
    pub resource: String,
    /// Only objects whose labels match; without it (and without `names`) every object of the type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "LabelSelector")]
    pub label_selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    /// Only objects in namespaces whose labels match (namespaced types; hook version v2 under a
    /// namespaced parent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "LabelSelector")]
    pub namespace_selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    /// Only objects in this namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub namespace: Option<String>,
    /// Only objects with these names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
}

/// Request body of a DecoratorController `sync` or `finalize` call (the target is `object`).
#[derive(Debug, Serialize, JsonSchema)]
pub struct DecoratorRequest<'a> {
    /// The DecoratorController.
    #[schemars(with = "KubeObject")]
    pub controller: &'a Value,
    /// The target.
    #[schemars(with = "KubeObject", extend("x-type-parameter" = "Target"))]
    pub object: &'a Value,
    /// The target's attachments made by this controller, by type key and object key.
    #[schemars(with = "ObjectMap", extend("x-type-parameter" = "Attachments"))]
    pub attachments: &'a ObjectMaps,
    /// The objects the customize hook selected (empty without one).
    #[schemars(with = "ObjectMap", extend("x-type-parameter" = "Related"))]
    pub related: &'a ObjectMaps,
    /// `true` when the finalize hook is called: the target is being deleted, or no longer selected.
    pub finalizing: bool,
}

/// Response body of a DecoratorController `sync` or `finalize` call; every field is optional.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DecoratorResponse {
    /// Merged into the target's labels; `null` deletes a key, keys not named are left alone.
    #[serde(default, deserialize_with = "null_as_default")]
    pub labels: BTreeMap<String, Option<String>>,
    /// Merged into the target's annotations, as `labels`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub annotations: BTreeMap<String, Option<String>>,
    /// Replaces the target's `.status` when present; `null` or absent leaves it alone.
    #[serde(default)]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub status: Option<Value>,
    /// Every attachment that should exist; one missing here is deleted.
    #[serde(default, deserialize_with = "null_as_default")]
    #[schemars(with = "Vec<KubeObject>")]
    pub attachments: Vec<Value>,
    /// Sync this target again after this many seconds (fractions allowed); `0` or absent: no resync.
    #[serde(default)]
    #[schemars(with = "f64")]
    pub resync_after_seconds: Option<f64>,
    /// With `finalizing: true`: the target may now go (the hub removes its finalizer).
    #[serde(default)]
    pub finalized: bool,
    /// metahook extension: Events the hub records on the target, as for a CompositeController.
    #[serde(default, deserialize_with = "null_as_default")]
    #[schemars(with = "Vec<HookEvent>")]
    pub events: Vec<HookEvent>,
}

/// The top-level fields of [`DecoratorResponse`], for strict decoding.
pub(crate) const DECORATOR_RESPONSE_FIELDS: &[&str] =
    &["labels", "annotations", "status", "attachments", "resyncAfterSeconds", "finalized", "events"];

/// Request body of a MapController `map` call: one input and the outputs made for it.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MapRequest<'a> {
    /// The MapController.
    #[schemars(with = "KubeObject")]
    pub controller: &'a Value,
    /// The parent, without its `status` (the hub's counts) and `metadata.resourceVersion`.
    #[schemars(with = "KubeObject", extend("x-type-parameter" = "Parent"))]
    pub parent: &'a Value,
    /// The input's map key: an opaque string naming the group of outputs made for this input (the
    /// hub tags each of them with it, in the `metahook.dev/map-key` label).
    pub map_key: &'a str,
    /// The input object.
    #[schemars(with = "KubeObject", extend("x-type-parameter" = "Input"))]
    pub input: &'a Value,
    /// The outputs the parent owns for this input, by type key and object key.
    #[schemars(with = "ObjectMap", extend("x-type-parameter" = "Outputs"))]
    pub outputs: &'a ObjectMaps,
}

/// Response body of a MapController `map` call; every field is optional.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MapResponse {
    /// Every output this input should have; one of its outputs missing here is deleted.
    #[serde(default, deserialize_with = "null_as_default")]
    #[schemars(with = "Vec<KubeObject>")]
    pub outputs: Vec<Value>,
    /// Ask again for this input after this many seconds (fractions allowed); `0` or absent: no resync.
    #[serde(default)]
    #[schemars(with = "f64")]
    pub resync_after_seconds: Option<f64>,
    /// Events the hub records on the parent, as for a CompositeController.
    #[serde(default, deserialize_with = "null_as_default")]
    #[schemars(with = "Vec<HookEvent>")]
    pub events: Vec<HookEvent>,
}

/// The top-level fields of [`MapResponse`], for strict decoding.
pub(crate) const MAP_RESPONSE_FIELDS: &[&str] = &["outputs", "resyncAfterSeconds", "events"];

/// Request body of a MapController `tombstone` call: the outputs of an input that is gone (deleted, or
/// no longer selected by the parent).
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TombstoneRequest<'a> {
    /// The MapController.
    #[schemars(with = "KubeObject")]
    pub controller: &'a Value,
    /// The parent, without its `status` (the hub's counts) and `metadata.resourceVersion`.
    #[schemars(with = "KubeObject", extend("x-type-parameter" = "Parent"))]
    pub parent: &'a Value,
    /// The map key the gone input's outputs carry.
    pub map_key: &'a str,
    /// Those outputs, by type key and object key.
    #[schemars(with = "ObjectMap", extend("x-type-parameter" = "Outputs"))]
    pub outputs: &'a ObjectMaps,
}

/// Response body of a MapController `tombstone` call.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TombstoneResponse {
    /// The outputs to keep (each named by `apiVersion`, `kind`, `metadata.name` and, for a namespaced
    /// type, `metadata.namespace`); every other output of this map key is deleted. Kept outputs are
    /// left as they are: the hub does not write them.
    #[serde(default, deserialize_with = "null_as_default")]
    #[schemars(with = "Vec<KubeObject>")]
    pub outputs: Vec<Value>,
    /// Ask again about these outputs after this many seconds (fractions allowed), to let one go later.
    #[serde(default)]
    #[schemars(with = "f64")]
    pub resync_after_seconds: Option<f64>,
}

/// The top-level fields of [`TombstoneResponse`], for strict decoding.
pub(crate) const TOMBSTONE_RESPONSE_FIELDS: &[&str] = &["outputs", "resyncAfterSeconds"];

/// Request body of a MapController `finalize` call: the parent is being deleted.
#[derive(Debug, Serialize, JsonSchema)]
pub struct MapFinalizeRequest<'a> {
    /// The MapController.
    #[schemars(with = "KubeObject")]
    pub controller: &'a Value,
    /// The parent, without its `status` (the hub's counts) and `metadata.resourceVersion`.
    #[schemars(with = "KubeObject", extend("x-type-parameter" = "Parent"))]
    pub parent: &'a Value,
    /// Every output the parent owns, by type key and object key.
    #[schemars(with = "ObjectMap", extend("x-type-parameter" = "Outputs"))]
    pub outputs: &'a ObjectMaps,
    /// Always `true`.
    pub finalizing: bool,
}

/// Response body of a MapController `finalize` call.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MapFinalizeResponse {
    /// The parent may now go (the hub removes its finalizer; the garbage collector then deletes its
    /// outputs, unless the parent was deleted with `--cascade=orphan`).
    #[serde(default)]
    pub finalized: bool,
    /// Ask again after this many seconds (fractions allowed).
    #[serde(default)]
    #[schemars(with = "f64")]
    pub resync_after_seconds: Option<f64>,
    /// Events the hub records on the parent.
    #[serde(default, deserialize_with = "null_as_default")]
    #[schemars(with = "Vec<HookEvent>")]
    pub events: Vec<HookEvent>,
}

/// The top-level fields of [`MapFinalizeResponse`], for strict decoding.
pub(crate) const MAP_FINALIZE_RESPONSE_FIELDS: &[&str] = &["finalized", "resyncAfterSeconds", "events"];

/// An Event a hook asks the hub to record on the object it was called for (metahook extension;
/// Metacontroller ignores it). The hub records at most 10 per answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct HookEvent {
    /// `Normal` (the default) or `Warning`. The hub records any other value as `Normal`, as the
    /// Events API knows only these two.
    #[serde(rename = "type", default = "normal")]
    #[schemars(extend("enum" = ["Normal", "Warning"]))]
    pub type_: String,
    /// Why, in one `CamelCase` word (`Published`).
    pub reason: String,
    /// What happened, for a person; empty when absent.
    #[serde(default)]
    pub message: String,
}

fn normal() -> String {
    "Normal".to_owned()
}

/// Go hooks send `null` for an empty slice or map; it reads as empty, as Metacontroller reads it.
pub(crate) fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

// ---- schema-only types ---------------------------------------------------------------------------

/// A whole Kubernetes object as JSON: `apiVersion`, `kind`, `metadata`, and whatever else its kind
/// has. Schema only (the hub passes objects as `serde_json::Value`): loose on purpose, any kind goes.
pub enum KubeObject {}

impl JsonSchema for KubeObject {
    fn schema_name() -> Cow<'static, str> {
        "KubeObject".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A whole Kubernetes object as JSON: `apiVersion`, `kind`, `metadata`, ...",
            "type": "object",
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"type": "object"},
            },
            "required": ["apiVersion", "kind", "metadata"],
            "additionalProperties": true,
        })
    }
}

/// `children`, `attachments` and `related`: type key → object key → object. Schema only; the hub's own
/// type is [`ObjectMaps`].
pub enum ObjectMap {}

impl JsonSchema for ObjectMap {
    fn schema_name() -> Cow<'static, str> {
        "ObjectMap".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let object = generator.subschema_for::<KubeObject>();
        json_schema!({
            "description": "`children` / `attachments` / `related`: `\"Kind.group/version\"` → object key → object.\n\n\
                The object key is `name` or `namespace/name` depending on the hook version; the libraries'\n\
                accessors hide that.",
            "type": "object",
            "additionalProperties": {"type": "object", "additionalProperties": object},
        })
    }
}

// The two selector types mirror the Kubernetes ones for the schema's sake: k8s-openapi's schema types
// `operator` as any string, where the hub accepts only the four operators below (`cache::selector`).
// The hub itself reads the Kubernetes types (the fields of `RelatedResourceRule`).

/// A label selector: an object is selected when its labels meet all of it; an empty one selects every
/// object.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels an object must have, with these values.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements an object's labels must all meet.
    #[serde(default)]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
pub struct LabelSelectorRequirement {
    /// The label's key.
    pub key: String,
    /// How the label's value is tested: in `values`, not in them, present, absent.
    #[schemars(extend("enum" = ["In", "NotIn", "Exists", "DoesNotExist"]))]
    pub operator: String,
    /// The values of `In` and `NotIn` (at least one); none for `Exists` and `DoesNotExist`.
    #[serde(default)]
    pub values: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn properties<T: JsonSchema>() -> Vec<String> {
        let schema = schemars::schema_for!(T);
        schema.as_value()["properties"].as_object().map(|p| p.keys().cloned().collect()).unwrap_or_default()
    }

    #[test]
    fn strict_decoding_knows_exactly_the_fields_of_the_schema() {
        let sorted = |fields: &[&str]| {
            let mut fields: Vec<String> = fields.iter().map(|&f| f.to_owned()).collect();
            fields.sort();
            fields
        };
        assert_eq!(properties::<CompositeResponse>(), sorted(COMPOSITE_RESPONSE_FIELDS));
        assert_eq!(properties::<DecoratorResponse>(), sorted(DECORATOR_RESPONSE_FIELDS));
        assert_eq!(properties::<MapResponse>(), sorted(MAP_RESPONSE_FIELDS));
        assert_eq!(properties::<TombstoneResponse>(), sorted(TOMBSTONE_RESPONSE_FIELDS));
        assert_eq!(properties::<MapFinalizeResponse>(), sorted(MAP_FINALIZE_RESPONSE_FIELDS));
        assert_eq!(properties::<CustomizeResponse>(), sorted(CUSTOMIZE_RESPONSE_FIELDS));
    }

    #[test]
    fn the_objects_a_hook_declares_for_itself_carry_their_type_parameter() {
        let schema = schemars::schema_for!(CompositeRequest<'static>);
        let properties = &schema.as_value()["properties"];
        assert_eq!(properties["parent"][TYPE_PARAMETER], "Parent");
        assert_eq!(properties["children"][TYPE_PARAMETER], "Children");
        assert!(properties["controller"].get(TYPE_PARAMETER).is_none());
    }

    #[test]
    fn what_a_hook_may_leave_out_is_optional_in_the_schema() {
        let schema = schemars::schema_for!(HookEvent);
        assert_eq!(schema.as_value()["required"], serde_json::json!(["reason"]));
        let event: HookEvent = serde_json::from_value(serde_json::json!({"reason": "Published"})).unwrap();
        assert_eq!((event.type_.as_str(), event.message.as_str()), ("Normal", ""));
        let schema = schemars::schema_for!(CustomizeResponse);
        assert!(schema.as_value().get("required").is_none(), "{schema:?}");
    }
}
