//! The wire types as Python `TypedDict`s (`metahook_hooks/wire_gen.py`).
//!
//! A record is a `TypedDict` whose keys are the JSON names; keys a body may leave out are `NotRequired`
//! (or the whole class `total=False` when all are). An open object (a Kubernetes object) is
//! `dict[str, Any]`: a `TypedDict` cannot allow keys it does not name. Doc comments become docstrings,
//! a field's just below it, where editors show them.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::WireTypesError;
use super::model::{Definition, Field, Shape, Ty};

/// Python's keywords, which a class-syntax `TypedDict` cannot use as keys.
const KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue", "def", "del",
    "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is", "lambda", "nonlocal",
    "not", "or", "pass", "raise", "return", "try", "while", "with", "yield",
];

/// The module: `header` (comment lines), the module docstring `doc`, then every definition.
pub fn module(header: &str, doc: &str, definitions: &[Definition]) -> Result<String, WireTypesError> {
    let mut typing = BTreeSet::new();
    let mut body = String::new();
    for definition in definitions {
        body.push_str("\n\n");
        match &definition.shape {
            Shape::Alias(ty) => {
                let _ = writeln!(body, "{} = {}", definition.name, spell(ty, &mut typing));
                if let Some(doc) = &definition.doc {
                    body.push_str(&docstring(&definition.name, doc, "")?);
                }
            }
            Shape::Record(fields) => body.push_str(&record(definition, fields, &mut typing)?),
        }
    }
    let mut out = String::new();
    for line in header.lines() {
        let _ = writeln!(out, "# {line}");
    }
    out.push_str(&docstring("the module", doc, "")?);
    out.push_str("\nfrom __future__ import annotations\n\n");
    let _ = writeln!(out, "from typing import {}", typing.into_iter().collect::<Vec<_>>().join(", "));
    out.push_str(&body);
    Ok(out)
}

fn record(
    definition: &Definition,
    fields: &[Field],
    typing: &mut BTreeSet<&'static str>,
) -> Result<String, WireTypesError> {
    typing.insert("TypedDict");
    let total = fields.iter().any(|f| f.required);
    let mut out = format!("class {}(TypedDict{}):\n", definition.name, if total { "" } else { ", total=False" });
    if let Some(doc) = &definition.doc {
        out.push_str(&docstring(&definition.name, doc, "    ")?);
    }
    for field in fields {
        if KEYWORDS.contains(&field.name.as_str()) {
            return Err(WireTypesError::Keyword { at: format!("{}.{}", definition.name, field.name) });
        }
        let mut spelt = spell(&field.ty, typing);
        if total && !field.required {
            typing.insert("NotRequired");
            spelt = format!("NotRequired[{spelt}]");
        }
        let _ = write!(out, "\n    {}: {spelt}\n", field.name);
        if let Some(doc) = &field.doc {
            out.push_str(&docstring(&format!("{}.{}", definition.name, field.name), doc, "    ")?);
        }
    }
    Ok(out)
}

/// How Python spells `ty`; the `typing` names it needs are added to `typing`.
fn spell(ty: &Ty, typing: &mut BTreeSet<&'static str>) -> String {
    match ty {
        Ty::Any => {
            typing.insert("Any");
            "Any".to_owned()
        }
        Ty::Boolean => "bool".to_owned(),
        Ty::Integer => "int".to_owned(),
        Ty::Number => "float".to_owned(),
        Ty::String => "str".to_owned(),
        Ty::Literals(values) => {
            typing.insert("Literal");
            let values: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
            format!("Literal[{}]", values.join(", "))
        }
        Ty::List(inner) => format!("list[{}]", spell(inner, typing)),
        Ty::Map(inner) => format!("dict[str, {}]", spell(inner, typing)),
        Ty::OpenObject => spell(&Ty::Map(Box::new(Ty::Any)), typing),
        Ty::Named(name) => name.clone(),
        Ty::Nullable(inner) => format!("{} | None", spell(inner, typing)),
    }
}

/// `doc` as a docstring indented by `indent`; `at` names it in errors.
fn docstring(at: &str, doc: &str, indent: &str) -> Result<String, WireTypesError> {
    if doc.contains("\"\"\"") || doc.contains('\\') || doc.ends_with('"') {
        return Err(WireTypesError::Docstring { at: at.to_owned() });
    }
    let mut lines = doc.lines();
    let first = lines.next().unwrap_or_default();
    let rest: Vec<&str> = lines.collect();
    if rest.is_empty() {
        return Ok(format!("{indent}\"\"\"{first}\"\"\"\n"));
    }
    let mut out = format!("{indent}\"\"\"{first}\n");
    for line in rest {
        if line.is_empty() {
            out.push('\n');
        } else {
            let _ = writeln!(out, "{indent}{line}");
        }
    }
    let _ = writeln!(out, "{indent}\"\"\"");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(name: &str, ty: Ty, required: bool) -> Field {
        Field { name: name.into(), doc: None, ty, required, type_parameter: None }
    }

    #[test]
    fn optional_keys_are_not_required_unless_all_are_optional() {
        let some = Definition {
            name: "Event".into(),
            doc: Some("An Event.".into()),
            shape: Shape::Record(vec![
                field("reason", Ty::String, true),
                field("type", Ty::Literals(vec!["Normal".into(), "Warning".into()]), false),
            ]),
        };
        let all = Definition {
            name: "Answer".into(),
            doc: None,
            shape: Shape::Record(vec![field("status", Ty::Nullable(Box::new(Ty::OpenObject)), false)]),
        };
        let text = module("header", "Doc.", &[some, all]).unwrap();
        assert!(text.starts_with("# header\n\"\"\"Doc.\"\"\"\n"), "{text}");
        assert!(text.contains("from typing import Any, Literal, NotRequired, TypedDict\n"), "{text}");
        assert!(text.contains("class Event(TypedDict):\n    \"\"\"An Event.\"\"\"\n\n    reason: str\n"), "{text}");
        assert!(text.contains("    type: NotRequired[Literal[\"Normal\", \"Warning\"]]\n"), "{text}");
        assert!(
            text.contains("class Answer(TypedDict, total=False):\n\n    status: dict[str, Any] | None\n"),
            "{text}"
        );
    }

    #[test]
    fn keywords_and_unquotable_docs_are_refused() {
        let keyword =
            Definition { name: "R".into(), doc: None, shape: Shape::Record(vec![field("from", Ty::Any, true)]) };
        assert!(matches!(module("", "d", &[keyword]), Err(WireTypesError::Keyword { .. })));
        assert!(matches!(docstring("x", "say \"\"\"", ""), Err(WireTypesError::Docstring { .. })));
    }
}
