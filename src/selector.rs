//! Label selectors: the structured `LabelSelector` of the API, and the `a=b,c!=d` string form of flags.
//!
//! Evaluated in-process against cached objects, so claiming children and filtering parents never asks
//! the API server.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// A selector that cannot be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("unknown selector operator {operator:?} for key {key:?}")]
    UnknownOperator { key: String, operator: String },
    #[error("operator {operator} on key {key:?} needs {needs}")]
    BadValues { key: String, operator: String, needs: &'static str },
    #[error("cannot parse selector {text:?}: {reason}")]
    Syntax { text: String, reason: &'static str },
}

/// A parsed, validated selector: all requirements must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Self::Equals(k, v) => labels.get(k) == Some(v),
            Self::NotEquals(k, v) => labels.get(k) != Some(v),
            Self::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Self::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Self::Exists(k) => labels.contains_key(k),
            Self::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

impl Selector {
    /// Matches everything.
    #[must_use]
    pub fn everything() -> Self {
        Self::default()
    }

    /// Whether `labels` satisfy every requirement.
    #[must_use]
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether this selector has no requirements (and so selects everything).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Builds from the structured API form. `matchLabels` and `matchExpressions` are ANDed.
    pub fn from_label_selector(selector: &LabelSelector) -> Result<Self, SelectorError> {
        let mut requirements: Vec<Requirement> =
            selector.match_labels.iter().flatten().map(|(k, v)| Requirement::Equals(k.clone(), v.clone())).collect();
        for expr in selector.match_expressions.iter().flatten() {
            requirements.push(requirement_from_expression(expr)?);
        }
        Ok(Self { requirements })
    }

    /// Builds a selector that requires each `key=value` pair.
    #[must_use]
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Self {
        Self { requirements: labels.iter().map(|(k, v)| Requirement::Equals(k.clone(), v.clone())).collect() }
    }
}

fn requirement_from_expression(expr: &LabelSelectorRequirement) -> Result<Requirement, SelectorError> {
    let key = expr.key.clone();
    let values = expr.values.clone().unwrap_or_default();
    let bad = |needs| SelectorError::BadValues { key: key.clone(), operator: expr.operator.clone(), needs };
    match expr.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => Err(bad("at least one value")),
        "In" => Ok(Requirement::In(key, values)),
        "NotIn" => Ok(Requirement::NotIn(key, values)),
        "Exists" | "DoesNotExist" if !values.is_empty() => Err(bad("no values")),
        "Exists" => Ok(Requirement::Exists(key)),
        "DoesNotExist" => Ok(Requirement::DoesNotExist(key)),
        other => Err(SelectorError::UnknownOperator { key, operator: other.to_owned() }),
    }
}

/// Parses the string form used by `kubectl -l` and `--target-label-selector`:
/// `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`, comma separated. Empty selects everything.
pub fn parse_selector_string(text: &str) -> Result<Selector, SelectorError> {
    let syntax = |reason| SelectorError::Syntax { text: text.to_owned(), reason };
    let mut requirements = Vec::new();
    for term in split_terms(text) {
        let term = term.trim();
        if term.is_empty() {
            continue;
        }
        let requirement = if let Some(key) = term.strip_prefix('!') {
            Requirement::DoesNotExist(key.trim().to_owned())
        } else if let Some((key, values)) = split_set(term, " notin ") {
            Requirement::NotIn(key, values.ok_or_else(|| syntax("set must be (a,b,...)"))?)
        } else if let Some((key, values)) = split_set(term, " in ") {
            Requirement::In(key, values.ok_or_else(|| syntax("set must be (a,b,...)"))?)
        } else if let Some((k, v)) = term.split_once("!=") {
            Requirement::NotEquals(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            Requirement::Equals(k.trim().to_owned(), v.trim().to_owned())
        } else {
            Requirement::Exists(term.to_owned())
        };
        match &requirement {
            Requirement::Equals(k, _)
            | Requirement::NotEquals(k, _)
            | Requirement::Exists(k)
            | Requirement::DoesNotExist(k)
            | Requirement::In(k, _)
            | Requirement::NotIn(k, _)
                if k.is_empty() || k.contains(char::is_whitespace) =>
            {
                return Err(syntax("empty or malformed key"));
            }
            _ => {}
        }
        requirements.push(requirement);
    }
    Ok(Selector { requirements })
}

/// Splits on commas that are not inside `( … )`.
fn split_terms(text: &str) -> Vec<&str> {
    let (mut depth, mut start, mut terms) = (0_i32, 0, Vec::new());
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&text[start..]);
    terms
}

fn split_set(term: &str, op: &str) -> Option<(String, Option<Vec<String>>)> {
    let (key, rest) = term.split_once(op)?;
    let values = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .map(|inner| inner.split(',').map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()).collect());
    Some((key.trim().to_owned(), values))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn match_labels_and_expressions_are_anded() {
        let selector: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]},
                                 {"key": "canary", "operator": "DoesNotExist"}]
        }))
        .unwrap();
        let s = Selector::from_label_selector(&selector).unwrap();
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "a")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "c")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "a"), ("canary", "1")])));
        assert!(!s.matches(&labels(&[("tier", "a")])));
    }

    #[test]
    fn empty_selector_matches_everything() {
        let s = Selector::from_label_selector(&LabelSelector::default()).unwrap();
        assert!(s.matches(&BTreeMap::new()));
    }

    #[test]
    fn unknown_operator_is_an_error_naming_the_key() {
        let selector: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchExpressions": [{"key": "tier", "operator": "Like", "values": ["a"]}]
        }))
        .unwrap();
        let err = Selector::from_label_selector(&selector).unwrap_err();
        assert!(err.to_string().contains("tier"));
    }

    #[test]
    fn string_selectors_parse_every_operator() {
        let s = parse_selector_string("app=web, tier in (a, b),env!=prod,owner,!legacy,x notin (1)").unwrap();
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "b"), ("owner", "me"), ("x", "2")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "b"), ("owner", "me"), ("legacy", "y")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "b"), ("owner", "me"), ("x", "1")])));
        assert!(parse_selector_string("").unwrap().is_empty());
        assert!(parse_selector_string("a in b").is_err());
    }
}
