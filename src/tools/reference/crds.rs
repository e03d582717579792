//! The CRD reference: every field of `CompositeController`, `DecoratorController` and
//! `ControllerRevision` as their `openAPIV3Schema` declares it — path, type, whether it is required,
//! its default and description — and the rules the API server checks.
//!
//! Read from [`crate::tools::crds::all`], the CRDs `crds/` holds (a test there keeps the files equal to
//! it), so the page describes exactly what `kubectl apply -f crds/` installs.

use serde_json::Value;
use std::fmt::Write as _;

use super::markdown::{cell, code, generated_by};

/// One field of a schema, as a table row.
struct Field {
    /// `spec.hooks.sync.webhook.url`; `[]` marks the items of a list.
    path: String,
    type_: String,
    required: bool,
    default: Option<Value>,
    description: String,
}

/// A CEL rule of `x-kubernetes-validations`, at the path it applies to.
struct Rule {
    path: String,
    expression: String,
    message: String,
}

/// The page, `reference/crds.md`.
///
/// # Panics
/// When a CRD does not have the shape every CRD of the hub has (one version with a schema).
#[must_use]
pub fn page() -> String {
    let mut out = generated_by("the schemas of `crds/` (`make crds` generates them from `src/api/`)");
    out.push_str(
        "\n# CRD reference\n\n\
         The hub serves Metacontroller's API: group `metacontroller.k8s.io`, version `v1alpha1`. Install the \
         CRDs with `kubectl apply -f crds/` (or `metahook crds | kubectl apply -f -`); `deploy/` ships the same \
         files. Objects written for Metacontroller are valid here unchanged.\n\n\
         In the tables, `[]` in a path stands for each item of a list. A default is filled in by the API \
         server when the field is left out.\n",
    );
    for (file, crd) in crate::tools::crds::all() {
        let crd = serde_json::to_value(&crd).expect("a CRD serializes");
        section(&mut out, file, &crd);
    }
    out
}

fn section(out: &mut String, file: &str, crd: &Value) {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let version = &spec["versions"][0];
    let kind = names["kind"].as_str().expect("a CRD names its kind");
    let _ = write!(out, "\n## {kind}\n\n");
    let _ = writeln!(
        out,
        "- API version: `{}/{}`, kind `{kind}`, resource `{}` ({} scoped), file `crds/{file}`",
        spec["group"].as_str().unwrap_or_default(),
        version["name"].as_str().unwrap_or_default(),
        names["plural"].as_str().unwrap_or_default(),
        spec["scope"].as_str().unwrap_or_default().to_lowercase(),
    );
    if let Some(short) = names["shortNames"].as_array() {
        let short: Vec<String> = short.iter().filter_map(Value::as_str).map(code).collect();
        let _ = writeln!(out, "- short names: {}", short.join(", "));
    }
    if version["subresources"]["status"].is_object() {
        out.push_str("- `status` is a subresource (written through `/status`)\n");
    }
    if let Some(columns) = version["additionalPrinterColumns"].as_array() {
        let columns: Vec<String> = columns
            .iter()
            .map(|c| {
                format!(
                    "{} ({})",
                    c["name"].as_str().unwrap_or_default(),
                    code(c["jsonPath"].as_str().unwrap_or_default())
                )
            })
            .collect();
        let _ = writeln!(out, "- `kubectl get` columns: {}", columns.join(", "));
    }
    let schema = &version["schema"]["openAPIV3Schema"];
    assert!(schema.is_object(), "{kind}: no openAPIV3Schema");
    let (mut fields, mut rules) = (Vec::new(), Vec::new());
    walk(schema, "", &mut fields, &mut rules);
    out.push_str("\n| field | type | required | default | description |\n|---|---|---|---|---|\n");
    for field in &fields {
        let default = field.default.as_ref().map_or_else(String::new, |d| code(&d.to_string()));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            cell(&code(&field.path)),
            cell(&field.type_),
            if field.required { "yes" } else { "" },
            cell(&default),
            cell(&field.description)
        );
    }
    if !rules.is_empty() {
        out.push_str("\nRules the API server checks (CEL, `x-kubernetes-validations`):\n\n");
        for rule in &rules {
            let _ = writeln!(out, "- {}: {} — {}", code(&rule.path), rule.message, code(&rule.expression));
        }
    }
}

/// The fields under `node` (at `path`), depth first in the schema's order.
fn walk(node: &Value, path: &str, fields: &mut Vec<Field>, rules: &mut Vec<Rule>) {
    if let Some(validations) = node["x-kubernetes-validations"].as_array() {
        for v in validations {
            rules.push(Rule {
                path: if path.is_empty() { "(the object)".to_owned() } else { path.to_owned() },
                expression: v["rule"].as_str().unwrap_or_default().to_owned(),
                message: v["message"].as_str().unwrap_or_default().to_owned(),
            });
        }
    }
    let required: Vec<&str> =
        node["required"].as_array().map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    if let Some(properties) = node["properties"].as_object() {
        for (name, property) in properties {
            let child = if path.is_empty() { name.clone() } else { format!("{path}.{name}") };
            fields.push(Field {
                path: child.clone(),
                type_: type_name(property),
                required: required.contains(&name.as_str()),
                default: property.get("default").cloned(),
                description: description(property),
            });
            walk(property, &child, fields, rules);
        }
    }
    if node["items"].is_object() {
        walk(&node["items"], &format!("{path}[]"), fields, rules);
    }
    if node["additionalProperties"].is_object() {
        walk(&node["additionalProperties"], &format!("{path}.*"), fields, rules);
    }
}

/// The field's own description, else (for a list) its items'.
fn description(node: &Value) -> String {
    node["description"].as_str().or_else(|| node["items"]["description"].as_str()).unwrap_or_default().to_owned()
}

fn type_name(node: &Value) -> String {
    let mut name = match node["type"].as_str() {
        Some("array") => format!("list of {}", type_name(&node["items"])),
        Some("object") if node["additionalProperties"].is_object() => {
            format!("map of string to {}", type_name(&node["additionalProperties"]))
        }
        Some(t) => t.to_owned(),
        None => "any".to_owned(),
    };
    if let Some(format) = node["format"].as_str() {
        let _ = write!(name, " ({format})");
    }
    if node["x-kubernetes-preserve-unknown-fields"] == true {
        name.push_str(", any fields");
    }
    if let Some(values) = node["enum"].as_array() {
        let values: Vec<String> = values.iter().map(|v| code(v.as_str().map_or(&v.to_string(), |s| s))).collect();
        let _ = write!(name, ": one of {}", values.join(", "));
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_is_listed_with_its_type_requirement_and_default() {
        let page = page();
        for row in [
            "| `spec.parentResource.apiVersion` | string | yes |",
            "| `spec.hooks.sync.version` | string: one of `v1`, `v2` |  | `\"v1\"` |",
            "| `spec.childResources[].updateStrategy.method` | string: one of `OnDelete`,",
            "| `parentPatch` | object, any fields | yes |",
        ] {
            assert!(page.contains(row), "missing {row} in\n{page}");
        }
        assert!(page.contains("must specify either a full 'url', or both 'service' and 'path'"));
    }
}
