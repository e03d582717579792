//! Field sets as the API server records them in `managedFields` (`fieldsV1`): a trie whose keys are
//! path elements (`f:name`, `k:{"name":"a"}` for a list item by key, `v:"x"` for a set item, `i:0`)
//! and whose `"."` key marks a node that is itself a member. A node without children is a member.
//!
//! Only what taking over needs: union, removing one path, and walking a set against an object to find
//! what it no longer sets.

use std::fmt::Write as _;

use serde_json::{Map, Value};

/// Whether this trie node is itself a member of the set.
fn is_member(node: &Value) -> bool {
    node.as_object().is_none_or(|map| map.is_empty() || map.contains_key("."))
}

fn children(node: &Value) -> impl Iterator<Item = (&String, &Value)> {
    node.as_object().into_iter().flat_map(|map| map.iter().filter(|(key, _)| key.as_str() != "."))
}

/// Builds a node from its membership and children in the API server's own shape.
fn node(member: bool, children: Map<String, Value>) -> Value {
    let mut map = children;
    if member && !map.is_empty() {
        map.insert(".".into(), Value::Object(Map::new()));
    }
    Value::Object(map)
}

/// Union of two nodes below the root, where an empty node means "member".
fn union_node(a: &Value, b: &Value) -> Value {
    let mut merged = Map::new();
    for (key, child) in children(a) {
        merged.insert(key.clone(), child.clone());
    }
    for (key, child) in children(b) {
        let joined = match merged.get(key) {
            Some(existing) => union_node(existing, child),
            None => child.clone(),
        };
        merged.insert(key.clone(), joined);
    }
    node(is_member(a) || is_member(b), merged)
}

/// The union of several field sets (roots).
#[must_use]
pub fn union_all<'a>(sets: impl IntoIterator<Item = &'a Value>) -> Value {
    let mut merged = Map::new();
    for set in sets {
        for (key, child) in children(set) {
            let joined = match merged.get(key) {
                Some(existing) => union_node(existing, child),
                None => child.clone(),
            };
            merged.insert(key.clone(), joined);
        }
    }
    Value::Object(merged)
}

/// `set` without the member at `path` (and its descendants). Ancestors it leaves without children
/// go too, members or not: after the annotation is dropped, owning an empty `annotations` map would only
/// make the first apply release it.
#[must_use]
pub fn without(set: &Value, path: &[&str]) -> Value {
    remove(set, path).unwrap_or_else(|| Value::Object(Map::new()))
}

/// `node` without `path` below it; `None` when that removal leaves it with nothing.
fn remove(node: &Value, path: &[&str]) -> Option<Value> {
    let (first, rest) = path.split_first()?;
    let Some(child) = node.get(*first) else { return Some(node.clone()) };
    let mut kids: Map<String, Value> = children(node).map(|(k, v)| (k.clone(), v.clone())).collect();
    match remove(child, rest) {
        Some(kept) => kids.insert((*first).to_owned(), kept),
        None => kids.remove(*first),
    };
    if kids.is_empty() {
        return None;
    }
    Some(self::node(is_member(node), kids))
}

/// Whether `set` holds the node at `path` (as a member or as the parent of members).
#[must_use]
pub fn contains(set: &Value, path: &[String]) -> bool {
    path.iter().try_fold(set, |node, element| node.get(element.as_str())).is_some()
}

/// The highest paths of `set` that `object` does not have: what applying `object` removes when the
/// applier owns `set` alone. Each path is a list of trie keys from the root.
#[must_use]
pub fn missing_from(set: &Value, object: &Value) -> Vec<Vec<String>> {
    fn walk(node: &Value, value: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        for (key, child) in children(node) {
            path.push(key.clone());
            match step(value, key) {
                Some(inner) => walk(child, inner, path, out),
                None => out.push(path.clone()),
            }
            path.pop();
        }
    }
    let mut out = Vec::new();
    walk(set, object, &mut Vec::new(), &mut out);
    out
}

/// Whether `object` has the part at `path` (trie keys from the root).
#[must_use]
pub fn present(object: &Value, path: &[String]) -> bool {
    path.iter().try_fold(object, |value, key| step(value, key)).is_some()
}

/// The part of `value` a trie key names, if present.
fn step<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    let (kind, rest) = key.split_once(':')?;
    match kind {
        "f" => value.as_object()?.get(rest),
        "i" => value.as_array()?.get(rest.parse::<usize>().ok()?),
        "v" => {
            let wanted: Value = serde_json::from_str(rest).ok()?;
            value.as_array()?.iter().find(|item| **item == wanted)
        }
        "k" => {
            let keys: Map<String, Value> = serde_json::from_str(rest).ok()?;
            value.as_array()?.iter().find(|item| keys.iter().all(|(k, v)| item.get(k).is_some_and(|x| same(x, v))))
        }
        _ => None,
    }
}

/// JSON equality that treats `80` and `80.0` alike (keys in a set are written by Go).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// A readable path: `spec.containers[name=app].env[name=DEBUG]`, `data.key`, `finalizers[="x"]`.
#[must_use]
pub fn display(path: &[String]) -> String {
    let mut text = String::new();
    for element in path {
        let Some((kind, rest)) = element.split_once(':') else { continue };
        match kind {
            "f" => {
                if !text.is_empty() {
                    text.push('.');
                }
                text.push_str(rest);
            }
            "k" => {
                let keys: Map<String, Value> = serde_json::from_str(rest).unwrap_or_default();
                let parts: Vec<String> = keys
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().map_or_else(|| v.to_string(), str::to_owned)))
                    .collect();
                let _ = write!(text, "[{}]", parts.join(","));
            }
            "v" => {
                let _ = write!(text, "[={rest}]");
            }
            _ => {
                let _ = write!(text, "[{rest}]");
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn union_keeps_membership_when_a_leaf_meets_a_parent() {
        let a = json!({"f:metadata": {"f:labels": {"f:app": {}}}, "f:data": {"f:a": {}}});
        let b = json!({"f:metadata": {"f:labels": {".": {}, "f:tier": {}}}, "f:data": {"f:b": {}}});
        assert_eq!(
            union_all([&a, &b]),
            json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}, "f:tier": {}}}, "f:data": {"f:a": {}, "f:b": {}}})
        );
        // A member leaf joined with a non-member parent of members is both.
        let leaf = json!({"f:spec": {"f:x": {}}});
        let parent = json!({"f:spec": {"f:x": {"f:y": {}}}});
        assert_eq!(union_all([&leaf, &parent]), json!({"f:spec": {"f:x": {".": {}, "f:y": {}}}}));
    }

    #[test]
    fn removing_the_last_applied_annotation_prunes_what_held_only_it() {
        let leaf = json!({"f:metadata": {"f:annotations": {}}});
        let deeper = ["f:metadata", "f:annotations", "f:x"];
        assert_eq!(without(&leaf, &deeper), leaf, "a member leaf above a path that is not there stays");
        let path = ["f:metadata", "f:annotations", "f:metacontroller.k8s.io/last-applied-configuration"];
        let only = json!({"f:metadata": {"f:annotations": {"f:metacontroller.k8s.io/last-applied-configuration": {}}},
                          "f:data": {"f:k": {}}});
        assert_eq!(without(&only, &path), json!({"f:data": {"f:k": {}}}));
        let map_member = json!({"f:metadata": {"f:annotations": {".": {},
                                "f:metacontroller.k8s.io/last-applied-configuration": {}}}});
        assert_eq!(without(&map_member, &path), json!({}));
        let others = json!({"f:metadata": {"f:annotations": {".": {}, "f:keep": {},
                            "f:metacontroller.k8s.io/last-applied-configuration": {}}}});
        assert_eq!(without(&others, &path), json!({"f:metadata": {"f:annotations": {".": {}, "f:keep": {}}}}));
        assert_eq!(without(&json!({"f:data": {}}), &path), json!({"f:data": {}}), "absent path: unchanged");
    }

    #[test]
    fn missing_paths_are_the_highest_ones_the_object_lacks() {
        let set = json!({
            "f:data": {"f:keep": {}, "f:gone": {}},
            "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:name": {}, "f:env": {
                "k:{\"name\":\"DEBUG\"}": {".": {}, "f:name": {}, "f:value": {}},
                "k:{\"name\":\"MODE\"}": {".": {}, "f:name": {}, "f:value": {}}}},
                "k:{\"name\":\"sidecar\"}": {".": {}, "f:name": {}, "f:image": {}}},
                "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}}},
                "f:finalizers": {"v:\"a\"": {}, "v:\"b\"": {}}}
        });
        let object = json!({
            "data": {"keep": "1"},
            "spec": {"containers": [{"name": "app", "env": [{"name": "MODE", "value": "x"}]}],
                     "ports": [{"containerPort": 80, "protocol": "TCP"}], "finalizers": ["a"]}
        });
        let missing: Vec<String> = missing_from(&set, &object).iter().map(|p| display(p)).collect();
        assert_eq!(
            missing,
            [
                "data.gone",
                "spec.containers[name=app].env[name=DEBUG]",
                "spec.containers[name=sidecar]",
                "spec.finalizers[=\"b\"]",
            ]
        );
        assert!(contains(&set, &["f:data".into(), "f:gone".into()]));
        assert!(!contains(&set, &["f:data".into(), "f:other".into()]));
    }
}
