//! A controller object checked against its CRD's `OpenAPI` schema as the API server checks it, for
//! controllers that never reach the API server (read from files, `controllersFrom`).
//!
//! The schema is the one [`CompositeController::crd`] and [`DecoratorController::crd`] generate, which
//! is what `crds/` installs; so a file is held to the same rules as `kubectl apply` of the same YAML,
//! and its errors read as the API server's (`spec.parentResource: Required value`). What the API server
//! would check and this does: types (with `nullable` and `x-kubernetes-int-or-string`), required fields,
//! enums, int32 ranges, unknown fields (as kubectl's default strict field validation refuses them), and the
//! CRD's `x-kubernetes-validations` rules. The rules are CEL, which the hub does not evaluate: each rule
//! the CRDs carry has its Rust form in `rule_holds`, and a test fails when a rule has none.
//!
//! Our own because the JSON Schema crates check JSON Schema drafts, not a CRD's structural `OpenAPI`
//! schema as the API server reads it (`nullable`, `x-kubernetes-int-or-string`, unknown fields refused
//! rather than allowed), nor say what is wrong in the API server's words, which the errors must match.

use std::sync::OnceLock;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube::CustomResourceExt as _;
use serde_json::Value;

use crate::api::{CompositeController, DecoratorController, MapController};

/// The `openAPIV3Schema` of `kind`'s CRD (`None` for a kind that is not a controller).
fn schema(kind: &str) -> Option<&'static JSONSchemaProps> {
    static COMPOSITE: OnceLock<Option<JSONSchemaProps>> = OnceLock::new();
    static DECORATOR: OnceLock<Option<JSONSchemaProps>> = OnceLock::new();
    static MAP: OnceLock<Option<JSONSchemaProps>> = OnceLock::new();
    let of = |crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition| {
        crd.spec.versions.into_iter().next().and_then(|v| v.schema).and_then(|s| s.open_api_v3_schema)
    };
    match kind {
        "CompositeController" => COMPOSITE.get_or_init(|| of(CompositeController::crd())).as_ref(),
        "DecoratorController" => DECORATOR.get_or_init(|| of(DecoratorController::crd())).as_ref(),
        "MapController" => MAP.get_or_init(|| of(MapController::crd())).as_ref(),
        _ => None,
    }
}

/// Every way `object` (a whole `kind` object: `apiVersion`, `kind`, `metadata`, `spec`) breaks its CRD's
/// schema, each as the API server words it; empty when it is valid. `metadata` is checked by the caller
/// (the API server checks it by its own rules, not the schema's).
#[must_use]
pub fn check(kind: &str, object: &Value) -> Vec<String> {
    let Some(schema) = schema(kind) else {
        return vec![format!("kind {kind:?} is not a CompositeController, DecoratorController or MapController")];
    };
    let mut errors = Vec::new();
    let Some(fields) = object.as_object() else {
        return vec![type_error("", object, "object")];
    };
    for (key, value) in fields {
        match key.as_str() {
            // `metadata` is the caller's; `status` is what the hub writes, never read from a file (the
            // API server accepts it on create and drops it).
            "apiVersion" | "kind" | "metadata" | "status" => {}
            _ => match schema.properties.as_ref().and_then(|p| p.get(key)) {
                Some(props) => walk(props, value, key, &mut errors),
                None => errors.push(format!("unknown field {key:?}")),
            },
        }
    }
    for required in schema.required.iter().flatten() {
        if !fields.contains_key(required) {
            errors.push(format!("{required}: Required value"));
        }
    }
    errors
}

fn walk(schema: &JSONSchemaProps, value: &Value, path: &str, errors: &mut Vec<String>) {
    if value.is_null() {
        if schema.nullable != Some(true) {
            errors.push(format!("{path}: Invalid value: \"null\": {path} in body must be of type {}", type_of(schema)));
        }
        return;
    }
    if schema.x_kubernetes_int_or_string == Some(true) {
        if !(value.is_string() || value.is_i64() || value.is_u64()) {
            errors.push(format!(
                "{path}: Invalid value: \"{}\": {path} in body must be of type integer,string: {}",
                json_type(value),
                quoted(value)
            ));
        }
        return;
    }
    if let Some(expected) = schema.type_.as_deref()
        && !has_type(value, expected)
    {
        errors.push(type_error(path, value, expected));
        return;
    }
    if let Some(allowed) = &schema.enum_
        && !allowed.iter().any(|a| a.0 == *value)
    {
        let supported: Vec<String> = allowed.iter().map(|a| quoted(&a.0)).collect();
        errors.push(format!(
            "{path}: Unsupported value: {}: supported values: {}",
            quoted(value),
            supported.join(", ")
        ));
    }
    if schema.format.as_deref() == Some("int32")
        && let Some(n) = value.as_i64()
        && i32::try_from(n).is_err()
    {
        errors.push(format!("{path}: Invalid value: {n}: {path} in body should be a 32-bit integer"));
    }
    match value {
        Value::Object(fields) => walk_object(schema, fields, path, errors),
        Value::Array(items) => {
            if let Some(JSONSchemaPropsOrArray::Schema(item)) = &schema.items {
                for (i, value) in items.iter().enumerate() {
                    walk(item, value, &format!("{path}[{i}]"), errors);
                }
            }
        }
        _ => {}
    }
    for rule in schema.x_kubernetes_validations.iter().flatten() {
        match rule_holds(&rule.rule, value) {
            Some(true) => {}
            Some(false) => {
                let message = rule.message.clone().unwrap_or_else(|| format!("failed rule: {}", rule.rule));
                errors.push(format!("{path}: Invalid value: \"{}\": {message}", json_type(value)));
            }
            None => errors.push(format!("{path}: the hub cannot check the rule {:?}", rule.rule)),
        }
    }
}

fn walk_object(
    schema: &JSONSchemaProps,
    fields: &serde_json::Map<String, Value>,
    path: &str,
    errors: &mut Vec<String>,
) {
    let known = schema.properties.as_ref();
    let extra = match &schema.additional_properties {
        Some(JSONSchemaPropsOrBool::Schema(props)) => Some(&**props),
        _ => None,
    };
    let preserve = schema.x_kubernetes_preserve_unknown_fields == Some(true)
        || matches!(schema.additional_properties, Some(JSONSchemaPropsOrBool::Bool(true)));
    for (key, value) in fields {
        let field = format!("{path}.{key}");
        match (known.and_then(|k| k.get(key)), extra) {
            (Some(props), _) | (None, Some(props)) => walk(props, value, &field, errors),
            (None, None) if preserve || known.is_none() && schema.type_.is_none() => {}
            (None, None) => errors.push(format!("unknown field {field:?}")),
        }
    }
    for required in schema.required.iter().flatten() {
        if !fields.contains_key(required) {
            errors.push(format!("{path}.{required}: Required value"));
        }
    }
}

/// The CRDs' CEL rules, in Rust: `Some(holds)`, or `None` for a rule this does not know (a test keeps
/// that from happening with the CRDs the hub generates).
fn rule_holds(rule: &str, value: &Value) -> Option<bool> {
    let has = |field: &str| value.get(field).is_some_and(|v| !v.is_null());
    match rule {
        "has(self.url) || (has(self.service) && has(self.path))" => Some(has("url") || (has("service") && has("path"))),
        _ => None,
    }
}

fn has_type(value: &Value, expected: &str) -> bool {
    match expected {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        _ => true,
    }
}

fn type_of(schema: &JSONSchemaProps) -> &str {
    schema.type_.as_deref().unwrap_or("object")
}

/// The API server's words for a value of the wrong type.
fn type_error(path: &str, value: &Value, expected: &str) -> String {
    let path = if path.is_empty() { "<root>" } else { path };
    format!(
        "{path}: Invalid value: \"{}\": {path} in body must be of type {expected}: {}",
        json_type(value),
        quoted(value)
    )
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn quoted(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Object(_) | Value::Array(_) => format!("\"{}\"", json_type(value)),
        other => format!("\"{other}\""),
    }
}

/// Every `x-kubernetes-validations` rule in `schema`, for the test below.
#[cfg(test)]
fn rules(schema: &JSONSchemaProps, found: &mut std::collections::BTreeSet<String>) {
    for rule in schema.x_kubernetes_validations.iter().flatten() {
        found.insert(rule.rule.clone());
    }
    for props in schema.properties.iter().flat_map(std::collections::BTreeMap::values) {
        rules(props, found);
    }
    if let Some(JSONSchemaPropsOrArray::Schema(item)) = &schema.items {
        rules(item, found);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(props)) = &schema.additional_properties {
        rules(props, found);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn composite(spec: &Value) -> Value {
        json!({"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
               "metadata": {"name": "web"}, "spec": spec})
    }

    #[test]
    fn every_rule_of_the_crds_has_a_rust_form() {
        for kind in ["CompositeController", "DecoratorController"] {
            let mut found = std::collections::BTreeSet::new();
            rules(schema(kind).unwrap(), &mut found);
            assert!(!found.is_empty(), "{kind} has its webhook rule");
            for rule in &found {
                assert!(rule_holds(rule, &json!({})).is_some(), "{kind}: no Rust form for the rule {rule:?}");
            }
        }
    }

    #[test]
    fn a_valid_controller_passes() {
        let object = composite(&json!({
            "parentResource": {"apiVersion": "v1", "resource": "things"},
            "childResources": [{"apiVersion": "v1", "resource": "configmaps",
                                "updateStrategy": {"method": "InPlace"}}],
            "hooks": {"sync": {"webhook": {"url": "http://hook/sync", "timeout": "10s"}}},
            "resyncPeriodSeconds": 30,
        }));
        assert_eq!(check("CompositeController", &object), Vec::<String>::new());
    }

    #[test]
    fn errors_read_as_the_api_servers() {
        let object = composite(&json!({
            "childResources": [{"apiVersion": "v1", "resource": "configmaps",
                                "updateStrategy": {"method": "Sometimes"}}],
            "hooks": {"sync": {"webhook": {"path": "/sync"}}},
            "resyncPeriodSeconds": "often",
            "extra": true,
        }));
        let errors = check("CompositeController", &object);
        for expected in [
            "spec.parentResource: Required value",
            "spec.childResources[0].updateStrategy.method: Unsupported value: \"Sometimes\": supported values: ",
            "spec.hooks.sync.webhook: Invalid value: \"object\": must specify either a full 'url', or both 'service' and 'path'",
            "spec.resyncPeriodSeconds: Invalid value: \"string\": spec.resyncPeriodSeconds in body must be of type integer: \"often\"",
            "unknown field \"spec.extra\"",
        ] {
            assert!(errors.iter().any(|e| e.starts_with(expected)), "{expected:?} not in {errors:#?}");
        }
        assert_eq!(errors.len(), 5, "{errors:#?}");
    }

    #[test]
    fn a_missing_spec_and_an_out_of_range_int32_are_refused() {
        let object = json!({"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "DecoratorController",
                            "metadata": {"name": "d"}});
        assert_eq!(check("DecoratorController", &object), ["spec: Required value"]);
        let object = composite(&json!({"parentResource": {"apiVersion": "v1", "resource": "things"},
                                      "resyncPeriodSeconds": 4_294_967_296_i64}));
        let errors = check("CompositeController", &object);
        assert_eq!(errors.len(), 1, "{errors:#?}");
        assert!(errors[0].contains("32-bit"), "{errors:#?}");
    }
}
