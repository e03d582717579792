//! What a desired object must be before the hub writes anything: the API server's rules for names,
//! labels and annotations, and a size its store accepts.
//!
//! Every object of a hook response is checked before the first write of a sync. Without this, a
//! response whose third child carries an uppercase name is refused by the API server half-way, after
//! the first two children were written: checking here turns that into a refusal of the whole response,
//! with nothing written. The rules mirror apimachinery's `validation` package; where a kind has its own
//! name rule (Services, Namespaces, RBAC objects) it is listed in [`name_rule`], every other kind gets
//! the common one (a DNS-1123 subdomain), which is what custom resources use.

use std::collections::BTreeMap;

use serde_json::Value;

/// Largest object the hub writes, in bytes of JSON: etcd's default request limit (1.5 MiB). A bigger
/// object can never be stored, so it is refused before anything else is written.
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;

/// Total size of all annotations of one object, as the API server limits it.
const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

/// How the API server validates the names of a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// Lowercase alphanumerics, `-` and `.`, at most 253 characters (most kinds, custom resources).
    Subdomain,
    /// Lowercase alphanumerics and `-`, at most 63 characters (Namespaces).
    Label,
    /// Like [`NameRule::Label`], starting with a letter (Services).
    Dns1035Label,
    /// Anything but `.`, `..` and names containing `/` or `%` (RBAC objects, e.g. `system:viewer`).
    PathSegment,
}

/// The name rule of a kind in `group` (`""` for the core group).
#[must_use]
pub fn name_rule(group: &str, kind: &str) -> NameRule {
    match (group, kind) {
        ("", "Service") => NameRule::Dns1035Label,
        ("", "Namespace") => NameRule::Label,
        ("rbac.authorization.k8s.io", _) => NameRule::PathSegment,
        _ => NameRule::Subdomain,
    }
}

/// Checks `name` against `rule`; the error says what is wrong, as the API server would.
pub fn check_name(rule: NameRule, name: &str) -> Result<(), String> {
    let ok = match rule {
        NameRule::Subdomain => is_dns1123_subdomain(name),
        NameRule::Label => is_dns1123_label(name),
        NameRule::Dns1035Label => is_dns1035_label(name),
        NameRule::PathSegment => !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '%']),
    };
    if ok {
        return Ok(());
    }
    let why = match rule {
        NameRule::Subdomain => {
            "must be a lowercase RFC 1123 subdomain (a-z, 0-9, '-' and '.', starting and ending with an \
             alphanumeric character, at most 253 characters)"
        }
        NameRule::Label => {
            "must be a lowercase RFC 1123 label (a-z, 0-9 and '-', starting and ending with an alphanumeric \
             character, at most 63 characters)"
        }
        NameRule::Dns1035Label => {
            "must be a lowercase RFC 1035 label (a-z, 0-9 and '-', starting with a letter and ending with an \
             alphanumeric character, at most 63 characters)"
        }
        NameRule::PathSegment => "may not be '.' or '..' and may not contain '/' or '%'",
    };
    Err(format!("name {:?} is invalid: it {why}", abbreviate(name)))
}

/// Checks a namespace name.
pub fn check_namespace(namespace: &str) -> Result<(), String> {
    if is_dns1123_label(namespace) {
        Ok(())
    } else {
        Err(format!("namespace {:?} is not a valid namespace name", abbreviate(namespace)))
    }
}

/// Checks `metadata.labels` (keys and values) and `metadata.annotations` (keys and total size).
pub fn check_metadata_maps(meta: &serde_json::Map<String, Value>) -> Result<(), String> {
    if let Some(labels) = meta.get("labels") {
        let labels: BTreeMap<String, Value> =
            serde_json::from_value(labels.clone()).map_err(|_| "metadata.labels must be an object".to_owned())?;
        for (key, value) in &labels {
            check_qualified_name(key).map_err(|why| format!("label key {:?} {why}", abbreviate(key)))?;
            let Value::String(value) = value else {
                return Err(format!("label {key:?} must have a string value"));
            };
            if !is_label_value(value) {
                return Err(format!(
                    "label {key:?} has invalid value {:?}: at most 63 characters of alphanumerics, '-', '_' \
                     and '.', starting and ending with an alphanumeric character",
                    abbreviate(value)
                ));
            }
        }
    }
    if let Some(annotations) = meta.get("annotations") {
        let annotations: BTreeMap<String, Value> = serde_json::from_value(annotations.clone())
            .map_err(|_| "metadata.annotations must be an object".to_owned())?;
        let mut total = 0;
        for (key, value) in &annotations {
            check_qualified_name(key).map_err(|why| format!("annotation key {:?} {why}", abbreviate(key)))?;
            let Value::String(value) = value else {
                return Err(format!("annotation {key:?} must have a string value"));
            };
            total += key.len() + value.len();
        }
        if total > MAX_ANNOTATIONS_BYTES {
            return Err(format!("annotations total {total} bytes, more than the {MAX_ANNOTATIONS_BYTES} allowed"));
        }
    }
    Ok(())
}

/// Checks the serialized size of a whole object.
pub fn check_size(obj: &Value) -> Result<(), String> {
    // Counted as it is written, not written out: every desired child of every answer is measured.
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let size = serde_json::to_writer(&mut count, obj).map_or(usize::MAX, |()| count.0);
    if size > MAX_OBJECT_BYTES {
        Err(format!("object is {size} bytes, more than the {MAX_OBJECT_BYTES} the API server can store"))
    } else {
        Ok(())
    }
}

/// A label or annotation key: an optional DNS subdomain prefix and `/`, then a name of at most 63
/// alphanumerics, `-`, `_`, `.` (starting and ending alphanumeric).
fn check_qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns1123_subdomain(prefix)
    {
        return Err("has an invalid prefix (must be a lowercase DNS subdomain)".into());
    }
    if name.is_empty() || name.len() > 63 || !is_label_value(name) {
        return Err("is invalid: the name part must be 1-63 alphanumerics, '-', '_' or '.', starting and \
                    ending with an alphanumeric character"
            .into());
    }
    Ok(())
}

fn is_label_value(value: &str) -> bool {
    if value.is_empty() {
        return true;
    }
    let bytes = value.as_bytes();
    value.len() <= 63
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
}

fn is_dns1123_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

fn is_dns1035_label(value: &str) -> bool {
    is_dns1123_label(value) && value.as_bytes()[0].is_ascii_lowercase()
}

fn is_dns1123_subdomain(value: &str) -> bool {
    value.len() <= 253 && value.split('.').all(is_dns1123_label)
}

/// Long names are cut in messages: a 300-character name would drown the rest of an Event.
fn abbreviate(text: &str) -> String {
    if text.chars().count() <= 80 {
        text.to_owned()
    } else {
        format!("{}…({} characters)", text.chars().take(40).collect::<String>(), text.chars().count())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn most_kinds_take_dns_subdomain_names() {
        let rule = name_rule("", "ConfigMap");
        assert!(check_name(rule, "web-0.config").is_ok());
        assert!(check_name(rule, "Web").unwrap_err().contains("RFC 1123 subdomain"));
        assert!(check_name(rule, &"a".repeat(254)).unwrap_err().contains("(254 characters)"));
        assert!(check_name(rule, &"a".repeat(253)).is_err(), "each dot-separated label is at most 63");
        assert!(check_name(rule, &["a".repeat(63), "b".repeat(63)].join(".")).is_ok());
        assert!(check_name(rule, "-a").is_err());
        assert!(check_name(rule, "a..b").is_err());
        assert!(check_name(name_rule("example.com", "Widget"), "w_1").is_err());
    }

    #[test]
    fn services_namespaces_and_rbac_have_their_own_rules() {
        assert!(check_name(name_rule("", "Service"), "web").is_ok());
        assert!(check_name(name_rule("", "Service"), "0web").is_err(), "DNS-1035 starts with a letter");
        assert!(check_name(name_rule("", "Service"), "web.x").is_err());
        assert!(check_name(name_rule("", "Namespace"), "team-a").is_ok());
        assert!(check_name(name_rule("", "Namespace"), &"a".repeat(64)).is_err());
        let rbac = name_rule("rbac.authorization.k8s.io", "ClusterRole");
        assert!(check_name(rbac, "system:aggregate-to-view").is_ok());
        assert!(check_name(rbac, "a/b").is_err());
        assert!(check_name(rbac, "..").is_err());
    }

    #[test]
    fn labels_and_annotations_follow_the_api_rules() {
        let meta = |v: Value| v.as_object().unwrap().clone();
        assert!(check_metadata_maps(&meta(json!({"labels": {"app": "web", "example.com/tier": ""}}))).is_ok());
        assert!(check_metadata_maps(&meta(json!({"labels": {"app": "Not Valid"}}))).is_err());
        assert!(check_metadata_maps(&meta(json!({"labels": {"app": "x".repeat(64)}}))).is_err());
        assert!(check_metadata_maps(&meta(json!({"labels": {"Bad/x": "v"}}))).is_err());
        assert!(check_metadata_maps(&meta(json!({"labels": {"n": 3}}))).is_err());
        assert!(check_metadata_maps(&meta(json!({"annotations": {"note": "free text, spaces allowed!"}}))).is_ok());
        assert!(check_metadata_maps(&meta(json!({"annotations": {"big": "x".repeat(300 * 1024)}}))).is_err());
        assert!(check_metadata_maps(&meta(json!({"annotations": {"bad key": "v"}}))).is_err());
    }

    #[test]
    fn objects_larger_than_the_store_accepts_are_refused() {
        assert!(check_size(&json!({"data": {"k": "v"}})).is_ok());
        assert!(check_size(&json!({"data": {"k": "x".repeat(MAX_OBJECT_BYTES)}})).is_err());
        // `{"k":"` and `"}` around the value: the limit is the JSON's exact length.
        assert!(check_size(&json!({"k": "x".repeat(MAX_OBJECT_BYTES - 8)})).is_ok());
        assert!(check_size(&json!({"k": "x".repeat(MAX_OBJECT_BYTES - 7)})).is_err());
    }
}
