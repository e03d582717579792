//! Fields of a desired object that its type's schema does not declare: read from the API server's
//! refusal of an apply, and dropped from the object, so that an answer Metacontroller accepts is
//! accepted (issue 62).
//!
//! Server-side apply refuses an object with a field its schema does not declare, whole, whatever
//! `fieldValidation` says (`failed to create typed patch object (…): .spec.type: field not declared in
//! schema`, a 500). Metacontroller's default apply strategy creates children with a plain create, which
//! drops such a field, and the object is made: a hook that puts `type: RollingUpdate` at a `StatefulSet`'s
//! `spec.type` (a slip, it belongs under `updateStrategy`) works there for years, and its children are
//! never made here. So by default the hub drops what the refusal names and applies again; each field
//! dropped is said in a Warning Event on the parent. [`UnknownFields::Strict`] keeps the refusal.
//!
//! The refusal names each field by its structured-merge-diff path: `.spec.type`, a list item by its
//! keys (`.spec.template.spec.containers[name="app"].bogus`), by value (`[=x]`) or by index (`[0]`).
//! A path that cannot be followed in the object is not dropped, and the refusal stands.

use serde_json::Value;

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

/// What an apply refusal says of undeclared fields.
const NOT_DECLARED: &str = ": field not declared in schema";

/// The paths of the fields an apply was refused for because the schema does not declare them; empty
/// when the refusal is about anything else. Refusals of other kinds among them do not matter here: once
/// these are dropped, the next apply says what else is wrong.
#[must_use]
pub fn undeclared(status: &kube::core::Status) -> Vec<String> {
    if !status.message.contains(NOT_DECLARED) {
        return Vec::new();
    }
    status
        .message
        .lines()
        .filter_map(|line| {
            let line = line.trim().strip_suffix(NOT_DECLARED)?;
            // The one-error form says it after the object: `…, Kind=StatefulSet): .spec.type`.
            let path = line.rfind("): ").map_or(line, |at| &line[at + 3..]);
            path.starts_with(['.', '[']).then(|| path.to_owned())
        })
        .collect()
}

/// One step of a path.
#[derive(Debug, PartialEq)]
enum Step {
    Field(String),
    /// A list item whose fields have these values.
    Keys(Vec<(String, Value)>),
    /// A list item of this value (a set).
    Value(Value),
    Index(usize),
}

/// The steps of a structured-merge-diff path; `None` for one not understood.
fn steps(path: &str) -> Option<Vec<Step>> {
    let mut steps = Vec::new();
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            if end == 0 {
                return None;
            }
            steps.push(Step::Field(after[..end].to_owned()));
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let (inside, after) = bracketed(after)?;
            steps.push(if let Some(value) = inside.strip_prefix('=') {
                Step::Value(serde_json::from_str(value).ok()?)
            } else if let Ok(index) = inside.parse() {
                Step::Index(index)
            } else {
                Step::Keys(keys(inside)?)
            });
            rest = after;
        } else {
            return None;
        }
    }
    Some(steps)
}

/// What is inside `[…]` (the `[` already taken) and what follows it, minding quoted values.
fn bracketed(text: &str) -> Option<(&str, &str)> {
    let mut quoted = false;
    let mut escaped = false;
    for (at, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ']' if !quoted => return Some((&text[..at], &text[at + 1..])),
            _ => {}
        }
    }
    None
}

/// `name="app",port=80` as (field, value) pairs.
fn keys(text: &str) -> Option<Vec<(String, Value)>> {
    let mut pairs = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (name, after) = rest.split_once('=')?;
        // The value is JSON: read one, and what follows must be a comma or the end.
        let mut values = serde_json::Deserializer::from_str(after).into_iter::<Value>();
        let value = values.next()?.ok()?;
        let used = values.byte_offset();
        pairs.push((name.to_owned(), value));
        rest = after[used..].strip_prefix(',').unwrap_or(&after[used..]);
    }
    Some(pairs)
}

/// Removes the field at `path` from `object`; whether it was there to remove.
#[must_use]
pub fn drop_field(object: &mut Value, path: &str) -> bool {
    let Some(mut steps) = steps(path) else { return false };
    let Some(Step::Field(last)) = steps.pop() else { return false };
    let mut at = object;
    for step in steps {
        let next = match (step, at) {
            (Step::Field(name), Value::Object(fields)) => fields.get_mut(&name),
            (Step::Index(index), Value::Array(items)) => items.get_mut(index),
            (Step::Value(value), Value::Array(items)) => items.iter_mut().find(|item| **item == value),
            (Step::Keys(keys), Value::Array(items)) => {
                items.iter_mut().find(|item| keys.iter().all(|(k, v)| item.get(k).is_some_and(|have| have == v)))
            }
            _ => None,
        };
        let Some(next) = next else { return false };
        at = next;
    }
    at.as_object_mut().is_some_and(|fields| fields.remove(&last).is_some())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn refusal(message: &str) -> kube::core::Status {
        kube::core::Status { code: 500, message: message.into(), ..kube::core::Status::default() }
    }

    /// The API server's words, as a 1.36 kube-apiserver says them (one field, and several).
    #[test]
    fn the_refusal_names_every_undeclared_field() {
        let one = refusal(
            "failed to create typed patch object (exp1/w; apps/v1, Kind=StatefulSet): .spec.type: field not declared in schema",
        );
        assert_eq!(undeclared(&one), [".spec.type"]);
        let several = refusal(
            "failed to create typed patch object (exp1/w; apps/v1, Kind=StatefulSet): errors:\n  \
             .spec.template.spec.containers[name=\"c\"].bogus: field not declared in schema\n  \
             .spec.type: field not declared in schema",
        );
        assert_eq!(undeclared(&several), [".spec.template.spec.containers[name=\"c\"].bogus", ".spec.type"]);
        assert!(undeclared(&refusal("the object has been modified")).is_empty());
    }

    #[test]
    fn a_named_field_is_dropped_wherever_its_path_leads() {
        let mut sts = json!({"spec": {"type": "RollingUpdate", "replicas": 2, "template": {"spec": {"containers": [
            {"name": "a", "image": "x"}, {"name": "c", "image": "y", "bogus": 1}],
            "ports": [{"containerPort": 80, "protocol": "TCP", "extra": true}]}},
            "finalizers": ["x", {"odd": 1}]}});
        assert!(drop_field(&mut sts, ".spec.type"));
        assert!(drop_field(&mut sts, ".spec.template.spec.containers[name=\"c\"].bogus"));
        assert!(drop_field(&mut sts, ".spec.template.spec.ports[containerPort=80,protocol=\"TCP\"].extra"));
        assert!(drop_field(&mut sts, ".spec.finalizers[1].odd"));
        assert_eq!(
            sts,
            json!({"spec": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": "a", "image": "x"}, {"name": "c", "image": "y"}],
                "ports": [{"containerPort": 80, "protocol": "TCP"}]}}, "finalizers": ["x", {}]}})
        );
        for unknown in [".spec.type", ".spec.template.spec.containers[name=\"zz\"].bogus", "spec", ".spec[", ""] {
            assert!(!drop_field(&mut sts, unknown), "{unknown}");
        }
    }

    #[test]
    fn list_keys_are_json_values() {
        assert_eq!(
            steps("[name=\"a]b\",port=8080][=\"x\"][3]"),
            Some(vec![
                Step::Keys(vec![("name".into(), json!("a]b")), ("port".into(), json!(8080))]),
                Step::Value(json!("x")),
                Step::Index(3),
            ])
        );
        assert_eq!(steps(".a..b"), None);
    }
}
