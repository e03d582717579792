//! What `metahook diff` shows: per parent, the children a sync would create, update (each changed
//! field, old → new), delete, adopt and release, the status change, and refusals; summary first.

use std::fmt::Write as _;

use kube::api::DynamicObject;
use serde::Serialize;
use serde_json::{Value, json};

use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::ObjectKey;
use crate::tools::render::report::comparable;

/// The whole preview.
#[derive(Debug, Serialize)]
pub struct Report {
    pub controller: String,
    /// The hook asked: its URL, its command, or the controller's own.
    pub candidate: String,
    pub parents: Vec<ParentReport>,
}

/// What a sync of one parent would do with the candidate's answer.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentReport {
    /// `namespace/name`.
    pub parent: String,
    pub create: Vec<ChildChange>,
    pub update: Vec<ChildChange>,
    pub delete: Vec<ChildChange>,
    /// Orphans the parent would adopt (claiming writes their ownerReference).
    pub adopt: Vec<ChildChange>,
    /// Children no longer selected (claiming removes their ownerReference).
    pub release: Vec<ChildChange>,
    /// The status fields that change, old → new; empty when the status stays.
    pub status: Vec<FieldChange>,
    /// Why the sync would be refused (a check the answer fails, or the hook call failing): then
    /// nothing of this parent would be written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Why this parent was not previewed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

/// One child a sync would write.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChildChange {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    /// For an update: the fields that change.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldChange>,
    /// An update under `Recreate`: the child is deleted and created again.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub recreate: bool,
}

/// One field that changes: its JSON pointer, the live value and the desired one (`null`: absent).
#[derive(Debug, Serialize, PartialEq)]
pub struct FieldChange {
    pub path: String,
    pub old: Value,
    pub new: Value,
}

impl ChildChange {
    pub(super) fn named(resource: &ResolvedResource, obj: &DynamicObject) -> Self {
        let key = ObjectKey::of(obj);
        Self {
            kind: resource.kind().to_owned(),
            namespace: key.namespace,
            name: key.name,
            fields: Vec::new(),
            recreate: false,
        }
    }

    pub(super) fn desired(resource: &ResolvedResource, key: &ObjectKey, _desired: &Value) -> Self {
        let (namespace, name) = (key.namespace.clone(), key.name.clone());
        Self { kind: resource.kind().to_owned(), namespace, name, fields: Vec::new(), recreate: false }
    }

    /// An update of `current` to `desired`: the fields desired sets that differ (server-side apply
    /// leaves the others alone).
    pub(super) fn update(
        resource: &ResolvedResource,
        current: &DynamicObject,
        desired: &Value,
        recreate: bool,
    ) -> Self {
        let mut change = Self::named(resource, current);
        let mut fields = Vec::new();
        changed_fields("", &comparable(current, desired), desired, &mut fields);
        change.fields = fields;
        change.recreate = recreate;
        change
    }

    fn line(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }
}

/// The leaves where `old` and `new` differ, as JSON pointers under `path`.
fn changed_fields(path: &str, old: &Value, new: &Value, out: &mut Vec<FieldChange>) {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            for (key, value) in n {
                let here = format!("{path}/{}", key.replace('~', "~0").replace('/', "~1"));
                changed_fields(&here, o.get(key).unwrap_or(&Value::Null), value, out);
            }
        }
        _ if old == new => {}
        _ => out.push(FieldChange { path: path.to_owned(), old: old.clone(), new: new.clone() }),
    }
}

impl ParentReport {
    pub(super) fn of(parent: &DynamicObject) -> Self {
        Self { parent: ObjectKey::of(parent).to_string(), ..Self::default() }
    }

    /// Records how the status the sync would write differs from the parent's.
    pub(super) fn status(&mut self, parent: &DynamicObject, status: &Value) {
        let old = parent.data.get("status").cloned().unwrap_or(Value::Null);
        let mut fields = Vec::new();
        changed_fields("/status", &old, status, &mut fields);
        // The engine replaces the status whole: fields it drops change too.
        if let (Value::Object(o), Value::Object(n)) = (&old, status) {
            for (key, value) in o.iter().filter(|(k, _)| !n.contains_key(*k)) {
                fields.push(FieldChange { path: format!("/status/{key}"), old: value.clone(), new: Value::Null });
            }
        }
        self.status = fields;
    }

    /// Whether this parent's sync would delete or recreate a child, or be refused.
    #[must_use]
    pub fn risky(&self) -> bool {
        self.refused.is_some() || !self.delete.is_empty() || self.update.iter().any(|u| u.recreate)
    }
}

impl Report {
    /// Whether anything would be deleted or recreated, or refused: exit code 2.
    #[must_use]
    pub fn risky(&self) -> bool {
        self.parents.iter().any(ParentReport::risky)
    }

    fn count(&self, what: impl Fn(&ParentReport) -> usize) -> usize {
        self.parents.iter().map(what).sum()
    }

    fn summary(&self) -> Value {
        json!({
            "parents": self.parents.len(),
            "create": self.count(|p| p.create.len()),
            "update": self.count(|p| p.update.len()),
            "recreate": self.count(|p| p.update.iter().filter(|u| u.recreate).count()),
            "delete": self.count(|p| p.delete.len()),
            "adopt": self.count(|p| p.adopt.len()),
            "release": self.count(|p| p.release.len()),
            "statusChanged": self.count(|p| usize::from(!p.status.is_empty())),
            "refused": self.count(|p| usize::from(p.refused.is_some())),
            "skipped": self.count(|p| usize::from(p.skipped.is_some())),
        })
    }

    /// The report as one JSON document: `summary`, then `parents`.
    #[must_use]
    pub fn json(&self) -> String {
        let report = json!({
            "controller": self.controller,
            "candidate": self.candidate,
            "summary": self.summary(),
            "risky": self.risky(),
            "parents": self.parents,
        });
        let mut text = serde_json::to_string_pretty(&report).unwrap_or_default();
        text.push('\n');
        text
    }

    /// The report for a terminal: the summary, then each parent with a change, one line per change.
    #[must_use]
    pub fn text(&self) -> String {
        let s = self.summary();
        let mut out = String::new();
        let _ = writeln!(out, "CompositeController {} with {}", self.controller, self.candidate);
        let _ = writeln!(
            out,
            "{} parents: {} create, {} update ({} recreate), {} delete, {} adopt, {} release, {} status changes, \
             {} refused, {} skipped",
            s["parents"],
            s["create"],
            s["update"],
            s["recreate"],
            s["delete"],
            s["adopt"],
            s["release"],
            s["statusChanged"],
            s["refused"],
            s["skipped"]
        );
        for parent in &self.parents {
            let mut lines = Vec::new();
            if let Some(why) = &parent.refused {
                lines.push(format!("  refused: {why}"));
            }
            if let Some(why) = &parent.skipped {
                lines.push(format!("  skipped: {why}"));
            }
            lines.extend(parent.create.iter().map(|c| format!("  + create {}", c.line())));
            for update in &parent.update {
                let verb = if update.recreate { "recreate" } else { "update" };
                lines.push(format!("  ~ {verb} {}", update.line()));
                lines.extend(update.fields.iter().map(|f| format!("      {}: {} → {}", f.path, f.old, f.new)));
            }
            lines.extend(parent.delete.iter().map(|c| format!("  - delete {}", c.line())));
            lines.extend(parent.adopt.iter().map(|c| format!("  < adopt {}", c.line())));
            lines.extend(parent.release.iter().map(|c| format!("  > release {}", c.line())));
            if !parent.status.is_empty() {
                lines.push("  ~ status".into());
                lines.extend(parent.status.iter().map(|f| format!("      {}: {} → {}", f.path, f.old, f.new)));
            }
            if !lines.is_empty() {
                let _ = writeln!(out, "\nparent {}", parent.parent);
                out.push_str(&(lines.join("\n") + "\n"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_fields_names_each_differing_leaf_of_the_desired_object() {
        let mut out = Vec::new();
        let old = json!({"data": {"a": "1", "b": "2"}, "metadata": {"name": "x"}});
        let new = json!({"data": {"a": "1", "b": "3", "c": "4"}, "metadata": {"name": "x"}});
        changed_fields("", &old, &new, &mut out);
        assert_eq!(
            out,
            vec![
                FieldChange { path: "/data/b".into(), old: json!("2"), new: json!("3") },
                FieldChange { path: "/data/c".into(), old: Value::Null, new: json!("4") },
            ]
        );
    }
}
