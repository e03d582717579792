//! Label selectors: the structured `LabelSelector` of the API, and the `a=b,c!=d` string form of flags;
//! and [`SelectorIndex`], many selectors found by the labels of an object they may select.
//!
//! Evaluated in-process against cached objects, so claiming children and filtering parents never asks
//! the API server.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::core::{Expression, SelectorExt as _};

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
///
/// Matching is kube-core's (`kube::core::Selector`); this type adds what the hub needs around it: the
/// API server's stricter validation (an `In` without values is an error, as in apimachinery, where
/// kube-core accepts it), the `a=b,c!=d` string form, and the equality requirements the caches index by.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    expressions: Vec<Expression>,
    /// The same expressions, as kube-core evaluates them.
    compiled: kube::core::Selector,
}

impl Selector {
    fn new(expressions: Vec<Expression>) -> Self {
        let compiled = expressions.iter().cloned().collect();
        Self { expressions, compiled }
    }

    /// Matches everything.
    #[must_use]
    pub fn everything() -> Self {
        Self::default()
    }

    /// Whether `labels` satisfy every requirement.
    #[must_use]
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.compiled.matches(labels)
    }

    /// Whether this selector has no requirements (and so selects everything).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.expressions.is_empty()
    }

    /// A `key=value` every matching object must carry, if the selector has one (`matchLabels`, or `In`
    /// with one value): what a label index is looked up by.
    #[must_use]
    pub fn required_label(&self) -> Option<(&str, &str)> {
        self.expressions.iter().find_map(|e| match e {
            Expression::Equal(k, v) => Some((k.as_str(), v.as_str())),
            Expression::In(k, values) if values.len() == 1 => values.first().map(|v| (k.as_str(), v.as_str())),
            _ => None,
        })
    }

    /// Builds from the structured API form. `matchLabels` and `matchExpressions` are ANDed.
    pub fn from_label_selector(selector: &LabelSelector) -> Result<Self, SelectorError> {
        let mut expressions: Vec<Expression> =
            selector.match_labels.iter().flatten().map(|(k, v)| Expression::Equal(k.clone(), v.clone())).collect();
        for expr in selector.match_expressions.iter().flatten() {
            expressions.push(requirement_from_expression(expr)?);
        }
        Ok(Self::new(expressions))
    }

    /// Builds a selector that requires each `key=value` pair.
    #[must_use]
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Self {
        Self::new(labels.iter().map(|(k, v)| Expression::Equal(k.clone(), v.clone())).collect())
    }

    /// This selector, also requiring each `key=value` pair of `labels` (apimachinery's
    /// `AddLabelToSelector`).
    #[must_use]
    pub fn and_labels(&self, labels: &BTreeMap<String, String>) -> Self {
        let mut expressions = self.expressions.clone();
        expressions.extend(labels.iter().map(|(k, v)| Expression::Equal(k.clone(), v.clone())));
        Self::new(expressions)
    }
}

/// The selectors of many parents, each compiled once per version of its parent, found by the labels of
/// an object they may select.
///
/// When an orphan child appears, the parents that would adopt it must be found. Testing every parent's
/// selector is work proportional to the number of parents, per event; here each selector is filed under
/// the `key=value` it requires ([`Selector::required_label`]; `controller-uid=<uid>` under
/// `generateSelector`), so a child's own labels lead to the few parents worth testing. Selectors without
/// such a label are kept aside and always tested (they are rare: a selector of only `Exists`/`NotIn`).
pub struct SelectorIndex<K> {
    /// Per parent: the version it was compiled for (UID and generation), its scope and the selector.
    entries: HashMap<K, Entry>,
    /// Parents whose selector requires (scope, key, value).
    by_label: HashMap<(Option<String>, String, String), HashSet<K>>,
    /// Parents whose selector requires no single label, by scope.
    unindexed: HashMap<Option<String>, HashSet<K>>,
}

struct Entry {
    version: String,
    scope: Option<String>,
    selector: Arc<Selector>,
}

impl<K> Default for SelectorIndex<K> {
    fn default() -> Self {
        Self { entries: HashMap::new(), by_label: HashMap::new(), unindexed: HashMap::new() }
    }
}

impl<K: Clone + Eq + Hash> SelectorIndex<K> {
    /// The selector of `key` at `version`, compiled (and filed) only when that version is new.
    /// `scope` is the namespace the parent's children live in (`None`: any, for a cluster-scoped parent).
    pub fn get_or_compile<E>(
        &mut self,
        key: &K,
        version: &str,
        scope: Option<&str>,
        compile: impl FnOnce() -> Result<Selector, E>,
    ) -> Result<Arc<Selector>, E> {
        if let Some(entry) = self.entries.get(key)
            && entry.version == version
        {
            return Ok(Arc::clone(&entry.selector));
        }
        self.remove(key);
        let selector = Arc::new(compile()?);
        let scope = scope.map(str::to_owned);
        match selector.required_label() {
            Some((k, v)) => {
                self.by_label.entry((scope.clone(), k.to_owned(), v.to_owned())).or_default().insert(key.clone());
            }
            None => {
                self.unindexed.entry(scope.clone()).or_default().insert(key.clone());
            }
        }
        self.entries.insert(key.clone(), Entry { version: version.to_owned(), scope, selector: Arc::clone(&selector) });
        Ok(selector)
    }

    /// Forgets a parent that is gone.
    pub fn remove(&mut self, key: &K) {
        let Some(entry) = self.entries.remove(key) else { return };
        let set = match entry.selector.required_label() {
            Some((k, v)) => self.by_label.get_mut(&(entry.scope.clone(), k.to_owned(), v.to_owned())),
            None => self.unindexed.get_mut(&entry.scope),
        };
        if let Some(set) = set {
            set.remove(key);
        }
    }

    /// Parents whose selectors select an object with `labels` in `namespace`: those filed under one of
    /// its labels (in its namespace, or any namespace), and the unindexed ones, each tested.
    pub fn selecting(&self, namespace: Option<&str>, labels: &BTreeMap<String, String>) -> Vec<K> {
        let scopes = [namespace.map(str::to_owned), None];
        let mut found = Vec::new();
        let mut seen = HashSet::new();
        let filed = scopes.iter().flat_map(|scope| {
            labels.iter().filter_map(move |(k, v)| self.by_label.get(&(scope.clone(), k.clone(), v.clone())))
        });
        let aside = scopes.iter().filter_map(|scope| self.unindexed.get(scope));
        for key in filed.chain(aside).flatten() {
            let selects = self.entries.get(key).is_some_and(|e| e.selector.matches(labels));
            if selects && seen.insert(key.clone()) {
                found.push(key.clone());
            }
        }
        found
    }
}

fn requirement_from_expression(expr: &LabelSelectorRequirement) -> Result<Expression, SelectorError> {
    let key = expr.key.clone();
    let values = expr.values.clone().unwrap_or_default();
    let bad = |needs| SelectorError::BadValues { key: key.clone(), operator: expr.operator.clone(), needs };
    match expr.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => Err(bad("at least one value")),
        "In" => Ok(Expression::In(key, values.into_iter().collect())),
        "NotIn" => Ok(Expression::NotIn(key, values.into_iter().collect())),
        "Exists" | "DoesNotExist" if !values.is_empty() => Err(bad("no values")),
        "Exists" => Ok(Expression::Exists(key)),
        "DoesNotExist" => Ok(Expression::DoesNotExist(key)),
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
            Expression::DoesNotExist(key.trim().to_owned())
        } else if let Some((key, values)) = split_set(term, " notin ") {
            Expression::NotIn(key, values.ok_or_else(|| syntax("set must be (a,b,...)"))?.into_iter().collect())
        } else if let Some((key, values)) = split_set(term, " in ") {
            Expression::In(key, values.ok_or_else(|| syntax("set must be (a,b,...)"))?.into_iter().collect())
        } else if let Some((k, v)) = term.split_once("!=") {
            Expression::NotEqual(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            Expression::Equal(k.trim().to_owned(), v.trim().to_owned())
        } else {
            Expression::Exists(term.to_owned())
        };
        match &requirement {
            Expression::Equal(k, _)
            | Expression::NotEqual(k, _)
            | Expression::Exists(k)
            | Expression::DoesNotExist(k)
            | Expression::In(k, _)
            | Expression::NotIn(k, _)
                if k.is_empty() || k.contains(char::is_whitespace) =>
            {
                return Err(syntax("empty or malformed key"));
            }
            _ => {}
        }
        requirements.push(requirement);
    }
    Ok(Selector::new(requirements))
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

/// `selector` as a server-side label selector string (`app=web,tier in (a,b),!legacy`), for a list
/// or watch the API server filters; `None` selects everything ("").
#[must_use]
pub fn server_side(selector: Option<&LabelSelector>) -> String {
    let Some(selector) = selector else { return String::new() };
    let mut terms: Vec<String> = selector.match_labels.iter().flatten().map(|(k, v)| format!("{k}={v}")).collect();
    for expression in selector.match_expressions.iter().flatten() {
        let values = expression.values.clone().unwrap_or_default().join(",");
        let key = &expression.key;
        terms.push(match expression.operator.as_str() {
            "In" => format!("{key} in ({values})"),
            "NotIn" => format!("{key} notin ({values})"),
            "Exists" => key.clone(),
            _ => format!("!{key}"),
        });
    }
    terms.join(",")
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
        let narrower = s.and_labels(&labels(&[("kind", "revision")]));
        assert!(narrower.matches(&labels(&[("app", "web"), ("tier", "a"), ("kind", "revision")])));
        assert!(!narrower.matches(&labels(&[("app", "web"), ("tier", "a")])), "the added label is required too");
        assert!(!narrower.matches(&labels(&[("tier", "a"), ("kind", "revision")])), "and so is the rest");
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

    #[test]
    fn the_index_finds_the_parents_whose_selectors_select_an_object() {
        let mut index: SelectorIndex<&str> = SelectorIndex::default();
        let compile = |text: &'static str| move || parse_selector_string(text);
        index.get_or_compile(&"web", "uid1/1", Some("a"), compile("app=web")).unwrap();
        index.get_or_compile(&"db", "uid2/1", Some("a"), compile("app=db,tier in (x)")).unwrap();
        index.get_or_compile(&"other-ns", "uid3/1", Some("b"), compile("app=web")).unwrap();
        index.get_or_compile(&"loose", "uid4/1", Some("a"), compile("owner")).unwrap();
        index.get_or_compile(&"cluster", "uid5/1", None, compile("app=web")).unwrap();
        let mut found = index.selecting(Some("a"), &labels(&[("app", "web"), ("owner", "x")]));
        found.sort_unstable();
        assert_eq!(found, ["cluster", "loose", "web"]);
        assert!(index.selecting(Some("a"), &labels(&[("app", "db")])).is_empty(), "tier is missing");
        // A new version recompiles and refiles; removal unfiles.
        index.get_or_compile(&"web", "uid1/2", Some("a"), compile("app=api")).unwrap();
        assert!(!index.selecting(Some("a"), &labels(&[("app", "web")])).contains(&"web"));
        assert_eq!(index.selecting(Some("a"), &labels(&[("app", "api")])), ["web"]);
        index.remove(&"web");
        assert!(index.selecting(Some("a"), &labels(&[("app", "api")])).is_empty());
        let mut calls = 0;
        let _ = index.get_or_compile(&"db", "uid2/1", Some("a"), || {
            calls += 1;
            parse_selector_string("app=db")
        });
        assert_eq!(calls, 0, "the same version is not compiled again");
    }

    #[test]
    fn the_required_label_is_what_an_index_can_look_up() {
        assert_eq!(parse_selector_string("a!=b,app=web").unwrap().required_label(), Some(("app", "web")));
        assert_eq!(parse_selector_string("tier in (x)").unwrap().required_label(), Some(("tier", "x")));
        assert_eq!(parse_selector_string("tier in (x,y),owner").unwrap().required_label(), None);
    }
}
