//! The hook wire types as the generators see them: the JSON schema of [`crate::hooks::wire`], read into
//! a few named definitions of records and aliases over a handful of value types.
//!
//! Only what the wire types use is understood; anything else is a [`WireTypesError::Unsupported`], so a
//! new construct in the Rust types stops the generators rather than coming out as `Any`.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::WireTypesError;

/// A named type of the wire: a record (a JSON object with known keys) or an alias of another type.
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    pub name: String,
    pub doc: Option<String>,
    pub shape: Shape,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// An object with these keys and no others.
    Record(Vec<Field>),
    /// Another name for a type (an open object, a map).
    Alias(Ty),
}

/// A key of a record.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// The JSON name (camelCase included).
    pub name: String,
    pub doc: Option<String>,
    pub ty: Ty,
    /// Whether the key is always there (a request's) or must be (a response's).
    pub required: bool,
    /// The [`crate::hooks::wire::TYPE_PARAMETER`] of the field: a type the hook declares for itself.
    pub type_parameter: Option<String>,
}

/// A value's type.
#[derive(Debug, Clone, PartialEq)]
pub enum Ty {
    Any,
    Boolean,
    Integer,
    Number,
    String,
    /// One of these strings.
    Literals(Vec<String>),
    List(Box<Ty>),
    /// An object of any keys, all values of one type.
    Map(Box<Ty>),
    /// An object with some keys known and any others allowed (a whole Kubernetes object).
    OpenObject,
    Named(String),
    Nullable(Box<Ty>),
}

impl Ty {
    /// The names this type refers to, in order.
    pub fn names(&self, out: &mut Vec<String>) {
        match self {
            Ty::List(inner) | Ty::Map(inner) | Ty::Nullable(inner) => inner.names(out),
            Ty::Named(name) => out.push(name.clone()),
            Ty::Any | Ty::Boolean | Ty::Integer | Ty::Number | Ty::String | Ty::Literals(_) | Ty::OpenObject => {}
        }
    }
}

/// Each record's field names in declaration order ([`super::order`]), by definition name.
pub type FieldOrder = BTreeMap<String, Vec<String>>;

/// The definitions reachable from the `$ref`s of `roots`, each after those it refers to (Python
/// evaluates an alias when it is defined), in the order the roots and their fields name them. Every
/// record's fields are put in the order `order` gives it, which must name exactly its fields.
pub fn definitions(
    roots: &[Value],
    defs: &Map<String, Value>,
    order: &FieldOrder,
) -> Result<Vec<Definition>, WireTypesError> {
    let mut ordered = Vec::new();
    let mut visiting = Vec::new();
    for root in roots {
        let name = ref_name(root).ok_or_else(|| unsupported("a root", root))?;
        visit(&name, defs, order, &mut visiting, &mut ordered)?;
    }
    Ok(ordered)
}

fn visit(
    name: &str,
    defs: &Map<String, Value>,
    order: &FieldOrder,
    visiting: &mut Vec<String>,
    ordered: &mut Vec<Definition>,
) -> Result<(), WireTypesError> {
    if ordered.iter().any(|d| d.name == name) || visiting.iter().any(|n| n == name) {
        return Ok(());
    }
    let schema = defs.get(name).ok_or_else(|| WireTypesError::Missing { name: name.to_owned() })?;
    let mut definition = definition(name, schema)?;
    if let Shape::Record(fields) = &mut definition.shape {
        sort(name, fields, order)?;
    }
    let mut refers = Vec::new();
    match &definition.shape {
        Shape::Record(fields) => fields.iter().for_each(|f| f.ty.names(&mut refers)),
        Shape::Alias(ty) => ty.names(&mut refers),
    }
    visiting.push(name.to_owned());
    for other in &refers {
        visit(other, defs, order, visiting, ordered)?;
    }
    visiting.pop();
    ordered.push(definition);
    Ok(())
}

/// Puts `fields` in declaration order.
fn sort(name: &str, fields: &mut [Field], order: &FieldOrder) -> Result<(), WireTypesError> {
    let declared = order.get(name).ok_or_else(|| WireTypesError::Order { name: name.to_owned() })?;
    let mut names: Vec<&String> = fields.iter().map(|f| &f.name).collect();
    let mut expected: Vec<&String> = declared.iter().collect();
    names.sort();
    expected.sort();
    if names != expected {
        return Err(WireTypesError::Order { name: name.to_owned() });
    }
    fields.sort_by_key(|f| declared.iter().position(|d| *d == f.name));
    Ok(())
}

fn definition(name: &str, schema: &Value) -> Result<Definition, WireTypesError> {
    let doc = description(schema);
    let closed = schema.get("additionalProperties").is_none_or(|extra| extra == false);
    let shape = match schema.get("properties").and_then(Value::as_object) {
        Some(properties) if closed => {
            let required: Vec<&str> =
                schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            let fields = properties
                .iter()
                .map(|(key, property)| {
                    Ok(Field {
                        name: key.clone(),
                        doc: description(property),
                        ty: ty(&format!("{name}.{key}"), property)?,
                        required: required.contains(&key.as_str()),
                        type_parameter: property[crate::hooks::wire::TYPE_PARAMETER].as_str().map(str::to_owned),
                    })
                })
                .collect::<Result<_, WireTypesError>>()?;
            Shape::Record(fields)
        }
        _ => Shape::Alias(ty(name, schema)?),
    };
    Ok(Definition { name: name.to_owned(), doc, shape })
}

fn description(schema: &Value) -> Option<String> {
    schema["description"].as_str().map(|d| d.trim().to_owned())
}

fn ref_name(schema: &Value) -> Option<String> {
    schema["$ref"].as_str()?.strip_prefix("#/$defs/").map(str::to_owned)
}

fn unsupported(at: &str, schema: &Value) -> WireTypesError {
    WireTypesError::Unsupported { at: at.to_owned(), schema: schema.to_string() }
}

/// The type of the value `schema` describes; `at` names it in errors.
fn ty(at: &str, schema: &Value) -> Result<Ty, WireTypesError> {
    if schema == &Value::Bool(true) || schema.as_object().is_some_and(Map::is_empty) {
        return Ok(Ty::Any);
    }
    if let Some(name) = ref_name(schema) {
        return Ok(Ty::Named(name));
    }
    if let Some(choices) = schema["anyOf"].as_array() {
        // `Option<T>` of a named `T`: T, or null.
        let (nulls, others): (Vec<&Value>, Vec<&Value>) = choices.iter().partition(|c| c["type"] == "null");
        return match (nulls.len(), others.as_slice()) {
            (1, [one]) => Ok(Ty::Nullable(Box::new(ty(at, one)?))),
            _ => Err(unsupported(at, schema)),
        };
    }
    if let Some(values) = schema["enum"].as_array() {
        let literals: Option<Vec<String>> = values.iter().map(|v| v.as_str().map(str::to_owned)).collect();
        return literals.map(Ty::Literals).ok_or_else(|| unsupported(at, schema));
    }
    match &schema["type"] {
        Value::String(single) => one_type(at, schema, single),
        Value::Array(types) => match types.as_slice() {
            [Value::String(t), null] | [null, Value::String(t)] if null == "null" => {
                Ok(Ty::Nullable(Box::new(one_type(at, schema, t)?)))
            }
            _ => Err(unsupported(at, schema)),
        },
        _ => Err(unsupported(at, schema)),
    }
}

fn one_type(at: &str, schema: &Value, t: &str) -> Result<Ty, WireTypesError> {
    match t {
        "boolean" => Ok(Ty::Boolean),
        "integer" => Ok(Ty::Integer),
        "number" => Ok(Ty::Number),
        "string" => Ok(Ty::String),
        "array" => Ok(Ty::List(Box::new(ty(&format!("{at}[]"), &schema["items"])?))),
        "object" if schema.get("properties").is_some() => {
            if schema["additionalProperties"] == true {
                Ok(Ty::OpenObject)
            } else {
                // A record must be a named definition, so that every language can name it.
                Err(unsupported(at, schema))
            }
        }
        "object" => match schema.get("additionalProperties") {
            None => Ok(Ty::Map(Box::new(Ty::Any))),
            Some(values) => Ok(Ty::Map(Box::new(ty(&format!("{at}{{}}"), values)?))),
        },
        _ => Err(unsupported(at, schema)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn of(schema: &Value) -> Ty {
        ty("t", schema).unwrap()
    }

    #[test]
    fn value_types_read_as_the_schema_says() {
        assert_eq!(of(&json!(true)), Ty::Any);
        assert_eq!(of(&json!({"type": ["number", "null"]})), Ty::Nullable(Box::new(Ty::Number)));
        assert_eq!(of(&json!({"type": "object", "additionalProperties": true})), Ty::Map(Box::new(Ty::Any)));
        assert_eq!(
            of(&json!({"type": "array", "items": {"$ref": "#/$defs/HookEvent"}})),
            Ty::List(Box::new(Ty::Named("HookEvent".into())))
        );
        assert_eq!(
            of(&json!({"type": "string", "enum": ["Normal", "Warning"]})),
            Ty::Literals(vec!["Normal".into(), "Warning".into()])
        );
        assert_eq!(
            of(&json!({"anyOf": [{"$ref": "#/$defs/X"}, {"type": "null"}]})),
            Ty::Nullable(Box::new(Ty::Named("X".into())))
        );
    }

    #[test]
    fn what_the_generators_cannot_name_stops_them() {
        for schema in [
            json!({"type": "object", "properties": {"a": {"type": "string"}}}),
            json!({"oneOf": [{"type": "string"}, {"type": "integer"}]}),
            json!({"type": ["string", "integer"]}),
            json!({"enum": [1, 2]}),
        ] {
            assert!(matches!(ty("t", &schema), Err(WireTypesError::Unsupported { .. })), "{schema}");
        }
    }

    #[test]
    fn definitions_come_after_what_they_refer_to() {
        let defs = json!({
            "A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}, "c": {"$ref": "#/$defs/C"}}, "required": ["b"]},
            "B": {"type": "object", "additionalProperties": {"$ref": "#/$defs/C"}},
            "C": {"type": "object", "properties": {"x": {"type": "integer"}}},
        });
        let order = FieldOrder::from([
            ("A".to_owned(), vec!["c".to_owned(), "b".to_owned()]),
            ("C".to_owned(), vec!["x".to_owned()]),
        ]);
        let found = definitions(&[json!({"$ref": "#/$defs/A"})], defs.as_object().unwrap(), &order).unwrap();
        let names: Vec<&str> = found.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["C", "B", "A"]);
        let Shape::Record(fields) = &found[2].shape else { panic!("A is a record") };
        assert_eq!((fields[0].name.as_str(), fields[0].required), ("c", false), "declaration order");
        assert!(fields[1].required);
        let wrong = FieldOrder::from([("A".to_owned(), vec!["b".to_owned()]), ("C".to_owned(), vec!["x".to_owned()])]);
        let err = definitions(&[json!({"$ref": "#/$defs/A"})], defs.as_object().unwrap(), &wrong);
        assert!(matches!(err, Err(WireTypesError::Order { name }) if name == "A"));
    }
}
