//! Fields of a desired object that its type's schema does not declare, dropped before the object is
//! written, so that an answer Metacontroller accepts is accepted (issue 62), and known from the schema
//! itself (issue 67).
//!
//! Server-side apply refuses an object with a field its schema does not declare, whole, whatever
//! `fieldValidation` says (`failed to create typed patch object (…): .spec.type: field not declared in
//! schema`, a 500). Metacontroller's default apply strategy creates children with a plain create, which
//! drops such a field, and the object is made: a hook that puts `type: RollingUpdate` at a `StatefulSet`'s
//! `spec.type` (a slip, it belongs under `updateStrategy`) works there for years, and its children are
//! never made here. So by default the hub prunes each object against its type's schema before writing
//! it ([`prune`]), as the API server prunes a create; each field dropped is said in a Warning Event on the
//! parent. [`UnknownFields::Strict`] drops nothing and keeps the refusal.
//!
//! The schema is the one the API server publishes ([`crate::cache::schemas`]). Which fields were
//! dropped is never read from a refusal: its text repeats field names as whoever wrote the object chose
//! them, unescaped, and a field named `x): .data` made a refusal that read as if `.data` were undeclared.
//! Nothing is learnt from one object's write for another's: each object is pruned on its own, against
//! its type's schema alone.
//!
//! What is kept, as the API server keeps it: every field the schema declares (`properties`, followed
//! through `$ref`, `allOf`, `anyOf` and `oneOf`); every key of a map (`additionalProperties`), each value
//! pruned against its schema; everything under `x-kubernetes-preserve-unknown-fields: true` (the fields
//! it declares still pruned); an embedded resource's `apiVersion`, `kind` and `metadata`
//! (`x-kubernetes-embedded-resource`); the object's own `apiVersion`, `kind` and `metadata`, always. An
//! object whose schema declares no field and no map (`type: object` alone) is free-form, as server-side
//! apply takes it, and kept whole; so is one whose schema cannot be followed (a `$ref` not in the
//! document): when in doubt, nothing is dropped, and the API server says what it refuses.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::Value;

use crate::cache::schemas::TypeSchema;

/// What the hub does with a field of a child (attachment, output) that its schema does not declare
/// (the hub's `childUnknownFields`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub enum UnknownFields {
    // (Plain comments: doc comments would make the config schema a `oneOf`, which the reference page
    // shows as "any" rather than a string.)
    // Dropped, as Metacontroller's create drops it, and named in a Warning Event on the parent.
    #[default]
    Drop,
    // The child is refused whole, as server-side apply refuses it (a `SyncError` naming the field).
    Strict,
}

/// How deep a chain of references (`$ref`, `allOf`…) is followed for one value before the hub gives up
/// and keeps the value whole: far more than any published schema needs, and a bound on a cycle.
const MAX_SCHEMAS: usize = 256;

/// How much of a field's name a dropped field's path shows.
const SHOWN_NAME: usize = 64;

/// Removes from `object` every field its type's `schema` does not declare (see the module doc); the
/// paths of the fields removed, in the order they are in the object, each as `.name` or, for a name of
/// other characters than letters, digits, `-` and `_` (or longer than 64), as a JSON string in brackets
/// (`["x): .data"]`, at most 64 characters of it); a list item is `[index]`.
#[must_use]
pub fn prune(object: &mut Value, schema: &TypeSchema) -> Vec<String> {
    let mut pruner = Pruner { schema, dropped: Vec::new() };
    pruner.walk(object, &[schema.root()], &mut String::new(), true);
    pruner.dropped
}

struct Pruner<'s> {
    schema: &'s TypeSchema,
    dropped: Vec<String>,
}

/// What the schemas of one value say of it, all taken together: a field any of them keeps is kept.
#[derive(Default)]
struct Shape<'s> {
    properties: HashMap<&'s str, Vec<&'s Value>>,
    /// `additionalProperties`: schemas of a map's values.
    values: Vec<&'s Value>,
    /// `additionalProperties: true`: any key, any value.
    any_values: bool,
    items: Vec<&'s Value>,
    /// `x-kubernetes-preserve-unknown-fields`, `x-kubernetes-embedded-resource`.
    keeps: Keeps,
    /// A reference not in the document, or too many of them: nothing is known.
    unknown: bool,
}

/// What a schema keeps besides the fields it declares.
#[derive(Default, Clone, Copy)]
struct Keeps {
    /// Every field (`x-kubernetes-preserve-unknown-fields: true`).
    unknown_fields: bool,
    /// `apiVersion`, `kind` and `metadata` (`x-kubernetes-embedded-resource: true`).
    resource: bool,
}

impl<'s> Shape<'s> {
    fn of(schema: &'s TypeSchema, nodes: &[&'s Value]) -> Self {
        let mut shape = Shape::default();
        let mut pending = nodes.to_vec();
        let mut seen = 0;
        while let Some(node) = pending.pop() {
            seen += 1;
            if seen > MAX_SCHEMAS {
                shape.unknown = true;
                break;
            }
            let Some(node) = node.as_object() else { continue };
            if let Some(reference) = node.get("$ref") {
                match reference.as_str().and_then(|r| schema.resolve(r)) {
                    Some(target) => pending.push(target),
                    None => shape.unknown = true,
                }
            }
            for combined in ["allOf", "anyOf", "oneOf"] {
                pending.extend(node.get(combined).and_then(Value::as_array).into_iter().flatten());
            }
            for (name, property) in node.get("properties").and_then(Value::as_object).into_iter().flatten() {
                shape.properties.entry(name.as_str()).or_default().push(property);
            }
            match node.get("additionalProperties") {
                Some(Value::Bool(true)) => shape.any_values = true,
                Some(values @ Value::Object(_)) => shape.values.push(values),
                _ => {}
            }
            match node.get("items") {
                Some(items @ Value::Object(_)) => shape.items.push(items),
                Some(Value::Array(tuple)) => shape.items.extend(tuple),
                _ => {}
            }
            let flag = |name: &str| node.get(name) == Some(&Value::Bool(true));
            shape.keeps.unknown_fields |= flag("x-kubernetes-preserve-unknown-fields");
            shape.keeps.resource |= flag("x-kubernetes-embedded-resource");
        }
        shape
    }

    /// Whether every field of an object of this shape is kept as it is: nothing is known of it, or it
    /// is free-form (no field and no map declared).
    fn kept_whole(&self) -> bool {
        self.unknown
            || (self.properties.is_empty() && self.values.is_empty() && !self.any_values && !self.keeps.unknown_fields)
    }
}

impl<'s> Pruner<'s> {
    fn walk(&mut self, value: &mut Value, nodes: &[&'s Value], path: &mut String, root: bool) {
        let shape = Shape::of(self.schema, nodes);
        match value {
            Value::Object(fields) => {
                if shape.kept_whole() {
                    return;
                }
                let mut gone = Vec::new();
                for (name, field) in fields.iter_mut() {
                    if (root || shape.keeps.resource) && matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
                        continue;
                    }
                    let at = path.len();
                    push_field(path, name);
                    if let Some(declared) = shape.properties.get(name.as_str()) {
                        self.walk(field, declared, path, false);
                    } else if !shape.values.is_empty() {
                        self.walk(field, &shape.values, path, false);
                    } else if !shape.any_values && !shape.keeps.unknown_fields {
                        gone.push(name.clone());
                        self.dropped.push(path.clone());
                    }
                    path.truncate(at);
                }
                for name in gone {
                    fields.remove(&name);
                }
            }
            Value::Array(items) if !shape.unknown && !shape.items.is_empty() => {
                for (index, item) in items.iter_mut().enumerate() {
                    let at = path.len();
                    let _ = write!(path, "[{index}]");
                    self.walk(item, &shape.items, path, false);
                    path.truncate(at);
                }
            }
            _ => {}
        }
    }
}

/// `path` followed by the field `name`, shown so that no name reads as another path (see [`prune`]).
fn push_field(path: &mut String, name: &str) {
    let plain = (1..=SHOWN_NAME).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if plain {
        path.push('.');
        path.push_str(name);
        return;
    }
    let shown: String = name.chars().take(SHOWN_NAME).collect();
    let quoted = serde_json::to_string(&shown).unwrap_or_default();
    if shown.len() < name.len() {
        // The closing quote after what is left out says the name goes on.
        let _ = write!(path, "[{}…\"]", &quoted[..quoted.len() - 1]);
    } else {
        let _ = write!(path, "[{quoted}]");
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A group-version's document as a 1.36 API server publishes it (the parts that matter here): a
    /// `ConfigMap`, a `StatefulSet` down to its containers, and `ObjectMeta`.
    fn built_in() -> Value {
        let reference =
            |name: &str| json!({"allOf": [{"$ref": format!("#/components/schemas/{name}")}], "default": {}});
        let gvk = |group: &str, kind: &str| json!([{"group": group, "version": "v1", "kind": kind}]);
        json!({"components": {"schemas": {
            "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {"type": "object", "properties": {
                "name": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string", "default": ""}}}},
            "io.k8s.api.core.v1.ConfigMap": {"type": "object", "x-kubernetes-group-version-kind": gvk("", "ConfigMap"),
                "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                    "metadata": reference("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
                    "data": {"type": "object", "additionalProperties": {"type": "string", "default": ""}},
                    "immutable": {"type": "boolean"}}},
            "io.k8s.api.apps.v1.StatefulSet": {"type": "object", "x-kubernetes-group-version-kind": gvk("apps", "StatefulSet"),
                "properties": {"metadata": reference("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
                    "spec": reference("io.k8s.api.apps.v1.StatefulSetSpec")}},
            "io.k8s.api.apps.v1.StatefulSetSpec": {"type": "object", "properties": {
                "replicas": {"type": "integer"},
                "template": reference("io.k8s.api.core.v1.PodTemplateSpec")}},
            "io.k8s.api.core.v1.PodTemplateSpec": {"type": "object", "properties": {
                "metadata": reference("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
                "spec": {"$ref": "#/components/schemas/io.k8s.api.core.v1.PodSpec"}}},
            "io.k8s.api.core.v1.PodSpec": {"type": "object", "properties": {
                "containers": {"type": "array", "items": reference("io.k8s.api.core.v1.Container")}}},
            "io.k8s.api.core.v1.Container": {"type": "object", "properties": {
                "name": {"type": "string"}, "image": {"type": "string"},
                "args": {"type": "array", "items": {"type": "string"}}}},
        }}})
    }

    fn schema(document: &Value, api_version: &str, kind: &str) -> TypeSchema {
        TypeSchema::from_document(document, api_version, kind).unwrap()
    }

    /// The SKA telescope's MPI operator's worker set: `spec.type` is not a `StatefulSet`'s.
    #[test]
    fn an_undeclared_field_is_dropped_wherever_it_is_and_the_rest_kept() {
        let mut set = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "w", "labels": {"a": "b"}, "annotations": {"c": "d"}},
            "spec": {"type": "RollingUpdate", "replicas": 2, "template": {"metadata": {"labels": {"x": "y"}, "odd": 1},
                "spec": {"containers": [{"name": "a", "image": "x", "args": ["1", {"not": "a string"}]},
                                        {"name": "c", "image": "y", "bogus": 1}]}}}});
        let dropped = prune(&mut set, &schema(&built_in(), "apps/v1", "StatefulSet"));
        assert_eq!(dropped, [".spec.template.metadata.odd", ".spec.template.spec.containers[1].bogus", ".spec.type"]);
        assert_eq!(
            set,
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": "w", "labels": {"a": "b"}, "annotations": {"c": "d"}},
                "spec": {"replicas": 2, "template": {"metadata": {"labels": {"x": "y"}},
                    "spec": {"containers": [{"name": "a", "image": "x", "args": ["1", {"not": "a string"}]},
                                            {"name": "c", "image": "y"}]}}}}),
            "the object's own metadata is kept whole; a value of the wrong type is the API server's to refuse"
        );
        let mut fine = set.clone();
        assert!(prune(&mut fine, &schema(&built_in(), "apps/v1", "StatefulSet")).is_empty());
        assert_eq!(fine, set);
    }

    /// Names a tenant chooses for the fields its parent makes a hook echo: each is dropped as the one
    /// field it is, shown so that it cannot read as another path, and nothing declared goes with it.
    #[test]
    fn hostile_field_names_drop_only_themselves() {
        let long = "z".repeat(300);
        let names = [
            "x): .data",
            ".data",
            "data.",
            "a.b",
            "c/d",
            "~e",
            "\"q\"",
            "[0]",
            "[name=\"v\"]",
            "l\nm",
            "ünï ✓",
            "",
            &long,
        ];
        let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "t-cm"}, "data": {}});
        for name in names {
            cm[name] = json!("boom");
            // As keys of a map, the same names are data, and kept.
            cm["data"][name] = json!("kept");
        }
        let before_data = cm["data"].clone();
        let dropped = prune(&mut cm, &schema(&built_in(), "v1", "ConfigMap"));
        assert_eq!(cm["data"], before_data);
        assert_eq!(cm.as_object().unwrap().keys().collect::<Vec<_>>(), ["apiVersion", "data", "kind", "metadata"]);
        assert_eq!(dropped.len(), names.len(), "{dropped:#?}");
        for path in &dropped {
            assert!(path.starts_with("[\"") && path.ends_with("\"]"), "one bracketed name: {path}");
            assert!(!path.contains('\n'), "{path}");
        }
        assert!(dropped.contains(&r#"["x): .data"]"#.to_owned()), "{dropped:#?}");
        assert!(dropped.contains(&r#"["l\nm"]"#.to_owned()), "{dropped:#?}");
        assert!(dropped.contains(&r#"["\"q\""]"#.to_owned()), "{dropped:#?}");
        assert!(dropped.contains(&format!("[\"{}…\"]", "z".repeat(64))), "{dropped:#?}");
        // Named elsewhere in the object, the same names are dropped there alone.
        let mut set = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "w"},
            "spec": {"replicas": 1, "x): .replicas": 2, "template": {"spec": {"containers": [{"name": "a", ": .name": 1}]}}}});
        let dropped = prune(&mut set, &schema(&built_in(), "apps/v1", "StatefulSet"));
        assert_eq!(dropped, [r#".spec.template.spec.containers[0][": .name"]"#, r#".spec["x): .replicas"]"#]);
        assert_eq!(set["spec"]["replicas"], 1);
        assert_eq!(set["spec"]["template"]["spec"]["containers"][0], json!({"name": "a"}));
    }

    /// A CRD's structural schema as the API server publishes it.
    fn custom() -> Value {
        let spec = json!({"type": "object", "properties": {
            "size": {"type": "integer"},
            "open": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                     "properties": {"inner": {"type": "object", "properties": {"a": {"type": "string"}}}}},
            "free": {"type": "object"},
            "byName": {"type": "object", "additionalProperties": {"type": "object", "properties": {"n": {"type": "integer"}}}},
            "anything": {"type": "object", "additionalProperties": true},
            "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                         "properties": {"spec": {"type": "object", "properties": {"b": {"type": "string"}}}}},
            "elsewhere": {"$ref": "#/components/schemas/not.in.this.Document"},
            "loop": {"$ref": "#/components/schemas/test.Loop"},
            "either": {"anyOf": [{"properties": {"one": {"type": "string"}}}, {"properties": {"two": {"type": "string"}}}]},
        }});
        json!({"components": {"schemas": {
            "test.Loop": {"$ref": "#/components/schemas/test.Loop"},
            "dev.metahook.test.v1.Growth": {"type": "object",
                "x-kubernetes-group-version-kind": [{"group": "test.metahook.dev", "version": "v1", "kind": "Growth"}],
                "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                               "metadata": {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
                               "spec": spec}},
        }}})
    }

    #[test]
    fn what_the_api_server_keeps_of_a_custom_resource_is_kept() {
        let mut growth = json!({"apiVersion": "test.metahook.dev/v1", "kind": "Growth", "metadata": {"name": "g", "odd": 1},
            "status": {"x": 1},
            "spec": {"size": 1, "colour": "red",
                "open": {"mine": {"deep": 1}, "inner": {"a": "x", "b": "y"}},
                "free": {"whatever": {"deep": 1}},
                "byName": {"x): .size": {"n": 1, "m": 2}},
                "anything": {"k": {"deep": [1]}},
                "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "odd": 1},
                             "spec": {"b": "x", "c": "y"}, "status": {}},
                "elsewhere": {"kept": 1},
                "loop": {"kept": 1},
                "either": {"one": "1", "two": "2", "three": "3"}}});
        let dropped = prune(&mut growth, &schema(&custom(), "test.metahook.dev/v1", "Growth"));
        assert_eq!(
            dropped,
            [
                r#".spec.byName["x): .size"].m"#,
                ".spec.colour",
                ".spec.either.three",
                ".spec.open.inner.b",
                ".spec.template.spec.c",
                ".spec.template.status",
                ".status",
            ]
        );
        assert_eq!(growth["metadata"], json!({"name": "g", "odd": 1}), "the object's metadata is the API server's");
        assert_eq!(growth["spec"]["open"], json!({"mine": {"deep": 1}, "inner": {"a": "x"}}));
        assert_eq!(growth["spec"]["free"], json!({"whatever": {"deep": 1}}), "free-form: kept whole");
        assert_eq!(growth["spec"]["byName"], json!({"x): .size": {"n": 1}}));
        assert_eq!(growth["spec"]["anything"], json!({"k": {"deep": [1]}}));
        assert_eq!(
            growth["spec"]["template"],
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "odd": 1}, "spec": {"b": "x"}})
        );
        assert_eq!(growth["spec"]["elsewhere"], json!({"kept": 1}), "a schema not followed: nothing dropped");
        assert_eq!(growth["spec"]["loop"], json!({"kept": 1}), "a cycle of references: nothing dropped");
        assert_eq!(growth["spec"]["either"], json!({"one": "1", "two": "2"}));
    }
}
