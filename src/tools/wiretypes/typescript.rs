//! The wire types as TypeScript declarations (`metahook-hooks/wire.d.ts`).
//!
//! A record is an interface whose optional keys are `?:`; doc comments become `/** */` comments. The
//! loose types a hook refines for itself (`KubeObject` with its typed `metadata`, `ObjectMap` over
//! declared child types) are written by hand in `index.d.ts` and imported from it; a field the Rust
//! types mark with a type parameter takes one, so `CompositeRequest<Greeting, { "Pod.v1": Pod }>` types
//! the parent and the children.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::WireTypesError;
use super::model::{Definition, Field, Shape, Ty};

/// A type `index.d.ts` declares by hand: its name, and the bound and spelling of a type parameter
/// `P` over it (`P extends KubeObject = KubeObject`, the field typed `P`).
struct HandWritten {
    name: &'static str,
    bound: &'static str,
    /// The field's type for parameter `{P}`.
    spelt: &'static str,
}

const HAND_WRITTEN: &[HandWritten] = &[
    HandWritten { name: "KubeObject", bound: "KubeObject", spelt: "{P}" },
    HandWritten { name: "ObjectMap", bound: "ObjectTypes", spelt: "ObjectMap<{P}>" },
];

/// The declarations: `header` (comment lines), the file's doc comment `doc`, the import of the
/// hand-written types from `from`, then every definition not written by hand.
pub fn module(header: &str, doc: &str, from: &str, definitions: &[Definition]) -> Result<String, WireTypesError> {
    let mut imports = BTreeSet::new();
    let mut body = String::new();
    for definition in definitions {
        if HAND_WRITTEN.iter().any(|h| h.name == definition.name) {
            continue;
        }
        body.push('\n');
        if let Some(doc) = &definition.doc {
            body.push_str(&jsdoc(doc, ""));
        }
        match &definition.shape {
            Shape::Alias(ty) => {
                let _ = writeln!(body, "export type {} = {};", definition.name, spell(ty, &mut imports));
            }
            Shape::Record(fields) => body.push_str(&interface(&definition.name, fields, &mut imports)?),
        }
    }
    let mut out = String::new();
    for line in header.lines() {
        let _ = writeln!(out, "// {line}");
    }
    out.push('\n');
    out.push_str(&jsdoc(doc, ""));
    if !imports.is_empty() {
        let names: Vec<&str> = imports.into_iter().collect();
        let _ = writeln!(out, "import type {{ {} }} from \"{from}\";", names.join(", "));
    }
    out.push_str(&body);
    Ok(out)
}

fn interface(name: &str, fields: &[Field], imports: &mut BTreeSet<&'static str>) -> Result<String, WireTypesError> {
    let mut parameters = Vec::new();
    let mut members = String::new();
    for field in fields {
        if let Some(doc) = &field.doc {
            members.push_str(&jsdoc(doc, "  "));
        }
        let spelt = match &field.type_parameter {
            None => spell(&field.ty, imports),
            Some(parameter) => {
                let hand = match &field.ty {
                    Ty::Named(named) => HAND_WRITTEN.iter().find(|h| h.name == named),
                    _ => None,
                };
                let hand =
                    hand.ok_or_else(|| WireTypesError::TypeParameter { at: format!("{name}.{}", field.name) })?;
                imports.insert(hand.name);
                imports.insert(hand.bound);
                parameters.push(format!("{parameter} extends {} = {}", hand.bound, hand.bound));
                hand.spelt.replace("{P}", parameter)
            }
        };
        let optional = if field.required { "" } else { "?" };
        let _ = writeln!(members, "  {}{optional}: {spelt};", field.name);
    }
    let parameters = match parameters.as_slice() {
        [] => String::new(),
        [one] => format!("<{one}>"),
        many => format!("<\n  {},\n>", many.join(",\n  ")),
    };
    Ok(format!("export interface {name}{parameters} {{\n{members}}}\n"))
}

/// How TypeScript spells `ty`; hand-written types it names are added to `imports`.
fn spell(ty: &Ty, imports: &mut BTreeSet<&'static str>) -> String {
    match ty {
        Ty::Any => "unknown".to_owned(),
        Ty::Boolean => "boolean".to_owned(),
        Ty::Integer | Ty::Number => "number".to_owned(),
        Ty::String => "string".to_owned(),
        Ty::Literals(values) => values.iter().map(|v| format!("{v:?}")).collect::<Vec<_>>().join(" | "),
        Ty::List(inner) => match **inner {
            Ty::Literals(_) | Ty::Nullable(_) => format!("({})[]", spell(inner, imports)),
            _ => format!("{}[]", spell(inner, imports)),
        },
        Ty::Map(inner) => format!("Record<string, {}>", spell(inner, imports)),
        Ty::OpenObject => "Record<string, unknown>".to_owned(),
        Ty::Named(name) => {
            if let Some(hand) = HAND_WRITTEN.iter().find(|h| h.name == name) {
                imports.insert(hand.name);
            }
            name.clone()
        }
        Ty::Nullable(inner) => format!("{} | null", spell(inner, imports)),
    }
}

/// `doc` as a `/** */` comment indented by `indent`.
fn jsdoc(doc: &str, indent: &str) -> String {
    let doc = doc.replace("*/", "*\\/");
    if !doc.contains('\n') {
        return format!("{indent}/** {doc} */\n");
    }
    let mut out = format!("{indent}/**\n");
    for line in doc.lines() {
        if line.is_empty() {
            let _ = writeln!(out, "{indent} *");
        } else {
            let _ = writeln!(out, "{indent} * {line}");
        }
    }
    let _ = writeln!(out, "{indent} */");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(name: &str, ty: Ty, required: bool, parameter: Option<&str>) -> Field {
        Field { name: name.into(), doc: None, ty, required, type_parameter: parameter.map(Into::into) }
    }

    #[test]
    fn type_parameters_range_over_the_hand_written_types_and_are_imported() {
        let request = Definition {
            name: "Request".into(),
            doc: Some("A request.\nSecond line.".into()),
            shape: Shape::Record(vec![
                field("controller", Ty::Named("KubeObject".into()), true, None),
                field("parent", Ty::Named("KubeObject".into()), true, Some("Parent")),
                field("children", Ty::Named("ObjectMap".into()), true, Some("Children")),
                field("resyncAfterSeconds", Ty::Number, false, None),
            ]),
        };
        let text = module("generated", "Doc.", "./index.js", &[request]).unwrap();
        assert!(
            text.starts_with(
                "// generated\n\n/** Doc. */\nimport type { KubeObject, ObjectMap, ObjectTypes } from \"./index.js\";\n"
            ),
            "{text}"
        );
        assert!(text.contains("/**\n * A request.\n * Second line.\n */\nexport interface Request<\n  Parent extends KubeObject = KubeObject,\n  Children extends ObjectTypes = ObjectTypes,\n> {\n"), "{text}");
        assert!(
            text.contains("  parent: Parent;\n  children: ObjectMap<Children>;\n  resyncAfterSeconds?: number;\n}\n"),
            "{text}"
        );
    }

    #[test]
    fn a_type_parameter_over_anything_else_is_refused() {
        let bad = Definition {
            name: "R".into(),
            doc: None,
            shape: Shape::Record(vec![field("n", Ty::Number, true, Some("N"))]),
        };
        assert!(matches!(module("", "", "./index.js", &[bad]), Err(WireTypesError::TypeParameter { .. })));
    }

    #[test]
    fn lists_of_unions_are_parenthesised() {
        let ty = Ty::List(Box::new(Ty::Literals(vec!["a".into(), "b".into()])));
        assert_eq!(spell(&ty, &mut BTreeSet::new()), "(\"a\" | \"b\")[]");
    }
}
