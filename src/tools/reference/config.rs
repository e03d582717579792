//! The configuration reference: every key of the hub's config file, from the doc comments of
//! [`Config`] (through its JSON schema), with the flag and environment variable that override it.
//!
//! Which flag overrides which key is not written down anywhere but in [`Config::load`], so it is found
//! out by asking it: each flag of [`ConfigOverrides`] is given a value and the one key it changed is the
//! key it overrides. A flag that changes no key, or several, stops the generator.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use clap::{Args as _, FromArgMatches as _};
use serde_json::Value;

use super::markdown::{cell, code, generated_by};
use crate::ops::config::{Config, ConfigOverrides};

/// A setting as the page lists it.
struct Key {
    /// Dotted path in the file (`leaderElection.leaseDuration`).
    path: String,
    type_: String,
    default: Value,
    doc: String,
}

/// The page, `reference/configuration.md`.
///
/// # Panics
/// When a field has no doc comment or no default, or a flag of [`ConfigOverrides`] changes not exactly
/// one key: the page would be missing what a user needs, so it is not written.
#[must_use]
pub fn page() -> String {
    let schema = schemars::schema_for!(Config);
    let schema = schema.as_value();
    let mut keys = Vec::new();
    collect(schema, schema, "", &mut keys);
    let overrides = overrides();
    let mut out = generated_by("the doc comments of `Config` in `src/ops/config.rs`");
    out.push_str(
        "\n# Configuration reference\n\n\
         The hub's settings come from its built-in defaults, then a YAML file (`metahook run --config FILE`, \
         or the environment variable `METAHOOK_CONFIG`), then the flags and environment variables below, \
         each overriding the one before. Every key of the file is optional; a key the hub does not know is \
         refused, and so is a combination it cannot run with (the error names the key). \
         `config/metahook.yaml` in the repository is the default file with a comment on every key (a unit \
         test keeps it equal to the built-in defaults). The file is read once, at start.\n\n\
         Started as `metacontroller` (or with flags and no subcommand), the hub reads Metacontroller's \
         command line instead of these flags; see [Switching from Metacontroller](../switching.md).\n\n\
         | key | type | default | flag, environment variable |\n|---|---|---|---|\n",
    );
    for key in &keys {
        let anchor: String = key.path.chars().filter(char::is_ascii_alphanumeric).collect::<String>().to_lowercase();
        let flag = overrides.get(&key.path).map_or_else(String::new, |(flag, env)| format!("`{flag}`, `{env}`"));
        let _ = writeln!(
            out,
            "| [{}](#{anchor}) | {} | {} | {flag} |",
            code(&key.path),
            cell(&key.type_),
            cell(&code(&default_text(&key.default)))
        );
    }
    for key in &keys {
        let _ = write!(out, "\n## {}\n\n{}\n\n", code(&key.path), key.doc.trim());
        let _ = writeln!(out, "- type: {}\n- default: {}", key.type_, code(&default_text(&key.default)));
        if let Some((flag, env)) = overrides.get(&key.path) {
            let _ = writeln!(out, "- overridden by: `{flag}`, `{env}`");
        }
    }
    out
}

/// The keys of `node`'s properties, depth first; an object that has keys of its own (`leaderElection`)
/// is listed through them.
fn collect(root: &Value, node: &Value, prefix: &str, keys: &mut Vec<Key>) {
    let properties = node["properties"].as_object().expect("an object schema has properties");
    for (name, property) in properties {
        let path = format!("{prefix}{name}");
        let target = resolve(root, property);
        if target.get("properties").is_some() {
            collect(root, target, &format!("{path}."), keys);
            continue;
        }
        let doc = property["description"]
            .as_str()
            .unwrap_or_else(|| panic!("config key {path} has no doc comment; write one in src/ops/config.rs"))
            .to_owned();
        let default = property
            .get("default")
            .cloned()
            .unwrap_or_else(|| panic!("config key {path} has no default in the schema"));
        keys.push(Key { type_: type_name(target), path, default, doc });
    }
}

/// The schema a `$ref` points to, or `node` itself.
fn resolve<'a>(root: &'a Value, node: &'a Value) -> &'a Value {
    match node["$ref"].as_str().and_then(|r| r.strip_prefix("#/$defs/")) {
        Some(name) => &root["$defs"][name],
        None => node,
    }
}

/// How the page names a value's type: JSON schema's words, with the unit of a duration.
fn type_name(node: &Value) -> String {
    let base = match &node["type"] {
        Value::String(t) => one_type(node, t),
        Value::Array(types) => {
            types.iter().filter_map(Value::as_str).map(|t| one_type(node, t)).collect::<Vec<_>>().join(" or ")
        }
        _ => "any".to_owned(),
    };
    match node["x-unit"].as_str() {
        Some(unit) => format!("{base} ({unit})"),
        None => base,
    }
}

fn one_type(node: &Value, t: &str) -> String {
    match t {
        "array" => format!("list of {}", type_name(&node["items"])),
        "object" if node["additionalProperties"].is_object() => {
            format!("map of string to {}", type_name(&node["additionalProperties"]))
        }
        other => other.to_owned(),
    }
}

fn default_text(value: &Value) -> String {
    serde_json::to_string(value).expect("a JSON value serializes")
}

/// Config key → (flag, environment variable) that overrides it, found by trying each flag on
/// [`Config::load`].
fn overrides() -> BTreeMap<String, (String, String)> {
    let command = ConfigOverrides::augment_args(clap::Command::new("run").no_binary_name(true));
    let load = |args: &[String]| -> Option<Value> {
        let matches = command.clone().try_get_matches_from(args).ok()?;
        let overrides = ConfigOverrides::from_arg_matches(&matches).ok()?;
        let config = Config::load(None, &overrides).ok()?;
        Some(serde_json::to_value(config).expect("the config serializes"))
    };
    let baseline = load(&[]).expect("the defaults load");
    let mut found = BTreeMap::new();
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        let env = arg.get_env().map(|e| e.to_string_lossy().into_owned()).unwrap_or_default();
        // Values of each kind a flag takes, one of which every flag accepts and the settings allow.
        let changed = ["true", "11", "1", "shard-a", "kubernetes", "http://collector:4318"].iter().find_map(|value| {
            let config = load(&[format!("--{long}={value}")])?;
            let mut changed = Vec::new();
            changed_keys(&baseline, &config, "", &mut changed);
            (changed.len() == 1).then(|| changed.remove(0))
        });
        let key = changed.unwrap_or_else(|| panic!("--{long} does not change exactly one setting of Config::load"));
        found.insert(key, (format!("--{long}"), env));
    }
    found
}

/// Dotted paths of the leaves that differ between `a` and `b`.
fn changed_keys(a: &Value, b: &Value, prefix: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                changed_keys(value, &b[key], &format!("{prefix}{key}."), out);
            }
        }
        _ if a != b => out.push(prefix.trim_end_matches('.').to_owned()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_of_run_is_listed_with_the_key_it_overrides() {
        let overrides = overrides();
        assert_eq!(overrides["workers"], ("--workers".to_owned(), "METAHOOK_WORKERS".to_owned()));
        assert_eq!(overrides["leaderElection.retryPeriod"].0, "--retry-period-seconds");
        let flags = ConfigOverrides::augment_args(clap::Command::new("run")).get_arguments().count();
        assert_eq!(overrides.len(), flags, "one key per flag: {overrides:?}");
    }

    #[test]
    fn durations_say_their_unit_and_maps_their_value_type() {
        let page = page();
        assert!(page.contains("| [`backoffBase`](#backoffbase) | integer (milliseconds) | `5` |"), "{page}");
        assert!(page.contains("| [`hookHosts`](#hookhosts) | map of string to string | `{}` |"), "{page}");
        assert!(page.contains("## `leaderElection.leaseDuration`"), "nested keys are listed by their path");
    }
}
