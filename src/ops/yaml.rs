//! YAML in and out: the configuration file, controller files and render fixtures users write, and the
//! CRDs, RBAC and render reports metahook prints. One place, so every reader and writer agrees.
//!
//! Through serde-saphyr, which kube-client already uses; `serde_yaml`, used before, is unmaintained
//! (RUSTSEC-2024-0320). Set up to read YAML as `serde_yaml` did, so files that worked keep meaning the
//! same: YAML 1.2 scalars (`yes`, `on`, `0755`, `1_000` are strings), errors on one line that end with
//! the line and column. serde-saphyr has no `Value` of its own: free-form documents are read into
//! [`serde_json::Value`], which is what every caller wanted anyway (objects go to the API as JSON).
//!
//! Two things differ from `serde_yaml`, both towards what kubectl does: merge keys (`<<: *defaults`) are
//! expanded rather than kept as a key named `<<`; and a mapping with a key twice is an error naming its
//! line and column (the API server's strict field validation refuses it too), also where `serde_yaml`
//! read into a [`serde_json::Value`] (`metahook render`'s fixtures) and silently kept the last value.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// An error writing YAML (only for values YAML cannot hold, which metahook's never are).
pub use serde_saphyr::SerializeError;

/// An error reading YAML: what is wrong, then `at line L, column C` when it is about a place.
///
/// serde-saphyr's error in its wording for users: its default wording is for programmers, with advice
/// only they can follow (to set a `DuplicateKeyPolicy`). Boxed, as it is over a hundred bytes, which
/// every `Result` that can carry it would otherwise pay.
#[derive(Debug)]
pub struct Error(Box<serde_saphyr::Error>);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.render_with_formatter(&serde_saphyr::UserMessageFormatter))
    }
}

/// No source: the message above is serde-saphyr's error already, which a chain would only repeat.
impl std::error::Error for Error {}

/// How metahook reads YAML.
fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        // YAML 1.1's `yes`/`no`/`on`/`off`/`y`/`n` are strings, not booleans (the Norway problem).
        strict_booleans: true,
        // `0755` and `1_000` are strings too: YAML 1.2 has neither octal nor digit separators.
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        // `.inf` and `.nan` in a free-form field become null, as JSON has no such numbers, rather than
        // failing the whole file; typed float fields still take them.
        non_finite_float_policy: serde_saphyr::NonFiniteFloatPolicy::PassThrough,
        // One line with the position, not a multi-line source excerpt: errors end up in log lines, in
        // `ConfigError`s and in `metahook rbac`'s and `render`'s one-line messages.
        with_snippet: false,
        // `serde_yaml`'s nesting limit; the other limits (a million events, 1,024 documents) are far above
        // anything a Kubernetes object or a config file needs.
        budget: serde_saphyr::budget! { max_depth: 128 },
    }
}

/// How metahook writes YAML: as `serde_yaml` did, except for double quotes where it used single ones,
/// and quotes around YAML 1.1 words like `yes` too (which kubectl's YAML 1.1 reader would take for a
/// boolean).
fn serializer_options() -> serde_saphyr::SerializerOptions {
    // Long lines stay single lines instead of being folded at 80 columns: CRD descriptions read as they
    // are written, and `metahook render`'s line diff shows a changed string as one changed line.
    serde_saphyr::ser_options! { folded_wrap_chars: usize::MAX }
}

/// One YAML document (an empty one is `null`, which a type whose fields all have defaults also takes).
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    serde_saphyr::from_str_with_options(text, options()).map_err(|e| Error(Box::new(e)))
}

/// Every document of a multi-document YAML stream (`---` between them). Empty and `null` documents are
/// left out, so a stream that starts with `---` or ends with one gives no extra document.
pub fn from_documents<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, Error> {
    serde_saphyr::from_multiple_with_options(text, options()).map_err(|e| Error(Box::new(e)))
}

/// `value` as one YAML document, ending with a newline.
pub fn to_string<T: Serialize>(value: &T) -> Result<String, SerializeError> {
    serde_saphyr::to_string_with_options(value, serializer_options())
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn scalars_are_read_as_yaml_1_2() {
        let value: Value = from_str("a: yes\nb: on\nc: 0755\nd: 1_000\ne: true\nf: 0x10\ng: .inf\nh: ~\n").unwrap();
        assert_eq!(
            value,
            json!({"a": "yes", "b": "on", "c": "0755", "d": "1_000", "e": true, "f": 16, "g": null, "h": null})
        );
    }

    #[test]
    fn documents_leave_out_empty_ones() {
        let docs: Vec<Value> = from_documents("# header\n---\na: 1\n---\n---\nb: 2\n---\n").unwrap();
        assert_eq!(docs, [json!({"a": 1}), json!({"b": 2})]);
        assert!(from_documents::<Value>("").unwrap().is_empty());
    }

    #[test]
    fn errors_are_one_line_with_the_position() {
        let err = from_str::<Value>("a: 1\nb: [1, 2\n").unwrap_err().to_string();
        assert!(!err.contains('\n') && err.ends_with("at line 2, column 4"), "{err}");
        let err = from_str::<Value>("a: 1\na: 2\n").unwrap_err().to_string();
        assert_eq!(err, "duplicate mapping key `a` is not allowed here at line 2, column 1", "in words for users");
    }

    #[test]
    fn merge_keys_are_expanded_as_kubectl_does() {
        let value: Value = from_str("base: &b {x: 1}\nd:\n  <<: *b\n  y: 2\n").unwrap();
        assert_eq!(value["d"], json!({"x": 1, "y": 2}));
    }

    #[test]
    fn written_yaml_reads_back_the_same() {
        let value = json!({
            "long": "x ".repeat(60).trim_end(),
            "lines": "one\ntwo\n",
            "looks_like": ["yes", "on", "true", "1.5", "0755", "", "~", ":8081", "- x", "a: b", "#c"],
            "empty": {},
            "nested": [{"a": [1, 2]}, {"b": {"c": null}}],
        });
        let text = to_string(&value).unwrap();
        assert!(text.contains(&format!("long: {}\n", "x ".repeat(60).trim_end())), "long lines stay whole:\n{text}");
        assert!(text.contains("lines: |\n"), "multi-line strings are literal blocks:\n{text}");
        assert!(text.contains("- \"yes\"\n"), "YAML 1.1 booleans are quoted:\n{text}");
        assert_eq!(from_str::<Value>(&text).unwrap(), value);
    }
}
