//! JSON text exactly as Go's `encoding/json` writes it, for hashes that must come out the same in the
//! hub and in Metacontroller (revision names) and across hub versions (the applied-state annotation).

use std::fmt::Write as _;

use serde_json::Value;

/// The JSON text Go's `encoding/json` writes for the same value, which Metacontroller hashes into
/// revision names (so a parent patch gets the same name on both hubs, and a switch starts no needless
/// revision): object keys sorted byte-wise; `<`, `>`, `&`, U+2028 and U+2029 escaped as `\u003c` etc.
/// (Go's HTML-safe default); numbers as Go prints the `int64` or `float64` the API machinery decodes
/// them to (an integer beyond `int64` becomes a float, `1e21` is written `1e+21`).
#[must_use]
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_go_json(&mut out, value);
    out
}

fn write_go_json(out: &mut String, value: &Value) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_go_string(out, key);
                out.push(':');
                write_go_json(out, &map[key]);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_go_json(out, item);
            }
            out.push(']');
        }
        Value::String(text) => write_go_string(out, text),
        Value::Number(number) => match (number.as_i64(), number.as_u64(), number.as_f64()) {
            (Some(int), _, _) => {
                let _ = write!(out, "{int}");
            }
            #[allow(clippy::cast_precision_loss)] // Go decodes such an integer to float64 too
            (None, Some(big), _) => write_go_float(out, big as f64),
            (None, None, Some(float)) => write_go_float(out, float),
            (None, None, None) => out.push_str(&number.to_string()),
        },
        other => out.push_str(&other.to_string()),
    }
}

/// A string as Go's `encoding/json` escapes it (with `SetEscapeHTML(true)`, its default).
fn write_go_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' | '\u{0}'..='\u{1f}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float64 as Go's `encoding/json` prints it: the shortest text that reads back the same, plain
/// between 1e-6 and 1e21, else with an exponent carrying its sign (`1e+21`, `1.5e-7`).
fn write_go_float(out: &mut String, float: f64) {
    let magnitude = float.abs();
    if magnitude != 0.0 && !(1e-6..1e21).contains(&magnitude) {
        let text = format!("{float:e}");
        match text.split_once('e') {
            Some((mantissa, exponent)) if !exponent.starts_with('-') => {
                let _ = write!(out, "{mantissa}e+{exponent}");
            }
            _ => out.push_str(&text),
        }
    } else {
        let _ = write!(out, "{float}");
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn keys_are_sorted_and_html_characters_escaped_as_go_does() {
        let value = json!({"b": [1, 2.5, 1e21], "a": "<&>"});
        assert_eq!(canonical_json(&value), r#"{"a":"\u003c\u0026\u003e","b":[1,2.5,1e+21]}"#);
    }
}
