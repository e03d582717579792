//! What `metahook diff` shows: per parent (a decorator's target), the children (attachments) a sync
//! would create, update (each changed field, old → new), delete, adopt and release, the status change,
//! a decorator's label and annotation changes, and refusals; summary first. The JSON also lists the
//! related objects each request carried.

use std::fmt::Write as _;

use kube::api::DynamicObject;
use serde::Serialize;
use serde_json::{Value, json};

use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::ObjectKey;
use crate::controllers::composite::rollouts::RevisionWrite;
use crate::tools::render::report::comparable;

/// The whole preview.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `CompositeController` or `DecoratorController`.
    pub kind: &'static str,
    pub controller: String,
    /// The hook asked: its URL, its command, or the controller's own.
    pub candidate: String,
    pub parents: Vec<ParentReport>,
}

/// What a sync of one parent would do with the candidate's answer.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentReport {
    /// `namespace/name` (a decorator's target).
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
    /// A decorator's target: the labels and annotations that change (`/metadata/labels/<key>`), old →
    /// new (`null`: removed).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub metadata: Vec<FieldChange>,
    /// With rolling child updates: the parent's `ControllerRevision`s the sync writes before any child
    /// (the latest created, claims moved, emptied ones deleted) — the rollout's bookkeeping, not risky.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub revisions: Vec<RevisionChange>,
    /// The related objects the request carried (what the customize hook's rules selected).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub related: Vec<ChildChange>,
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

/// One `ControllerRevision` a rolling sync writes.
#[derive(Debug, Serialize)]
pub struct RevisionChange {
    /// `create`, `update` or `delete`.
    pub write: &'static str,
    pub name: String,
}

impl From<RevisionWrite> for RevisionChange {
    fn from(write: RevisionWrite) -> Self {
        match write {
            RevisionWrite::Create(name) => Self { write: "create", name },
            RevisionWrite::Update(name) => Self { write: "update", name },
            RevisionWrite::Delete(name) => Self { write: "delete", name },
        }
    }
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

    /// Records that the sync would be refused for `error`; returns the report.
    pub(super) fn refuse(mut self, error: &(dyn std::error::Error + 'static)) -> Self {
        self.refused = Some(crate::engine::error::with_causes(error));
        self
    }

    /// Records the related objects of the request (`related`: its map).
    pub(super) fn related(&mut self, related: &crate::hooks::ObjectMaps) {
        for (type_key, objects) in related {
            // Keys are `<Kind>.<apiVersion>`.
            let kind = type_key.split_once('.').map_or(type_key.as_str(), |(kind, _)| kind);
            for object in objects.values() {
                let key = ObjectKey::of(&object.0);
                let (namespace, name) = (key.namespace, key.name);
                self.related.push(ChildChange {
                    kind: kind.to_owned(),
                    namespace,
                    name,
                    fields: Vec::new(),
                    recreate: false,
                });
            }
        }
    }

    /// Records the labels and annotations a decorator's merge `patch` changes on `target`.
    pub(super) fn metadata(&mut self, target: &DynamicObject, merge_patch: &Value) {
        for (field, current) in [("labels", &target.metadata.labels), ("annotations", &target.metadata.annotations)] {
            let Some(changes) = merge_patch["metadata"][field].as_object() else { continue };
            for (key, new) in changes {
                let old = current.as_ref().and_then(|m| m.get(key)).map_or(Value::Null, |v| Value::String(v.clone()));
                let path = format!("/metadata/{field}/{}", key.replace('~', "~0").replace('/', "~1"));
                self.metadata.push(FieldChange { path, old, new: new.clone() });
            }
        }
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
            "metadataChanged": self.count(|p| usize::from(!p.metadata.is_empty())),
            "refused": self.count(|p| usize::from(p.refused.is_some())),
            "skipped": self.count(|p| usize::from(p.skipped.is_some())),
        })
    }

    /// The report as one JSON document: `summary`, then `parents`.
    #[must_use]
    pub fn json(&self) -> String {
        let report = json!({
            "kind": self.kind,
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
        let _ = writeln!(out, "{} {} with {}", self.kind, self.controller, self.candidate);
        let decorator = self.kind == "DecoratorController";
        let (objects, object) = if decorator { ("targets", "target") } else { ("parents", "parent") };
        // A composite parent's labels are never written: its summary keeps to what can change.
        let metadata =
            if decorator { format!("{} label/annotation changes, ", s["metadataChanged"]) } else { String::new() };
        let _ = writeln!(
            out,
            "{} {objects}: {} create, {} update ({} recreate), {} delete, {} adopt, {} release, {} status changes, \
             {metadata}{} refused, {} skipped",
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
            lines.extend(parent.revisions.iter().map(|r| format!("  ~ {} ControllerRevision {}", r.write, r.name)));
            if !parent.status.is_empty() {
                lines.push("  ~ status".into());
                lines.extend(parent.status.iter().map(|f| format!("      {}: {} → {}", f.path, f.old, f.new)));
            }
            if !parent.metadata.is_empty() {
                lines.push("  ~ labels and annotations".into());
                lines.extend(parent.metadata.iter().map(|f| format!("      {}: {} → {}", f.path, f.old, f.new)));
            }
            if !lines.is_empty() {
                let _ = writeln!(out, "\n{object} {}", parent.parent);
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
