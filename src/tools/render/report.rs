//! What `metahook render` shows: each child's fate (create, update, delete, adopt, release, leave
//! alone) with a diff, the status, and a one-line summary, as YAML or JSON.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::{Value, json};

use crate::api::UpdateMethod;
use crate::cache::informers::ObjectKey;
use crate::hooks::HookEvent;
use crate::write::children::ChildMap;

use super::fixtures::type_of;

/// What the hub would do with one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Action {
    Create,
    Update,
    Unchanged,
    Delete,
    Release,
    Ignore,
}

impl Action {
    pub(super) fn word(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Update => "update",
            Self::Unchanged => "unchanged",
            Self::Delete => "delete",
            Self::Release => "release",
            Self::Ignore => "ignore",
        }
    }
}

/// One object of the report.
pub(super) struct Change {
    pub(super) action: Action,
    /// Adopted by the parent before anything else (an orphan its selector matches).
    pub(super) adopted: bool,
    pub(super) kind: String,
    pub(super) api_version: String,
    pub(super) key: ObjectKey,
    /// Why, when the action alone does not say it.
    pub(super) reason: Option<String>,
    /// The desired object (create, update, unchanged).
    pub(super) desired: Option<Value>,
    /// Observed → desired, line by line (update, or unchanged under `OnDelete`).
    pub(super) diff: Option<String>,
}

impl Change {
    pub(super) fn other(action: Action, obj: &DynamicObject, reason: String) -> Self {
        let (api_version, kind) = type_of(obj);
        Self {
            action,
            adopted: false,
            kind: kind.to_owned(),
            api_version: api_version.to_owned(),
            key: ObjectKey::of(obj),
            reason: Some(reason),
            desired: None,
            diff: None,
        }
    }

    pub(super) fn ignored(obj: &DynamicObject, reason: String) -> Self {
        Self::other(Action::Ignore, obj, reason)
    }

    pub(super) fn comment(&self) -> String {
        let mut why: Vec<String> = Vec::new();
        if self.adopted {
            why.push("adopted first: an orphan the selector matches".into());
        }
        why.extend(self.reason.clone());
        let why = if why.is_empty() { String::new() } else { format!(" ({})", why.join("; ")) };
        format!("# {} {} {}{why}", self.action.word(), self.kind, self.key)
    }
}

/// Creates, updates and deletes, per the update method of each type, as `children::manage` and
/// `apply` would do them.
pub(super) fn child_changes(
    desired: &[ChildMap<Value>],
    observed: &[ChildMap<Arc<DynamicObject>>],
    adopted: &BTreeSet<(usize, ObjectKey)>,
    methods: &[UpdateMethod],
) -> Vec<Change> {
    let mut changes = Vec::new();
    for (index, (desired, observed)) in desired.iter().zip(observed).enumerate() {
        let method = methods.get(index).copied().unwrap_or_default();
        for (key, obj) in desired {
            let text = |field: &str| obj[field].as_str().unwrap_or_default().to_owned();
            let mut change = Change {
                action: Action::Create,
                adopted: adopted.contains(&(index, key.clone())),
                kind: text("kind"),
                api_version: text("apiVersion"),
                key: key.clone(),
                reason: None,
                desired: Some(obj.clone()),
                diff: None,
            };
            if let Some(current) = observed.get(key) {
                // Ownership is the hub's business, not the hook's: leave it out of the comparison.
                let mut wanted = obj.clone();
                if let Some(meta) = wanted.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.remove("ownerReferences");
                }
                let (have, want) = (yaml(&comparable(current, &wanted)), yaml(&wanted));
                change.action = Action::Unchanged;
                if current.metadata.deletion_timestamp.is_some() {
                    change.reason = Some("being deleted: the hub waits until it is gone".into());
                } else if have != want {
                    change.diff = Some(diff(&have, &want));
                    (change.action, change.reason) = match method {
                        UpdateMethod::OnDelete => (
                            Action::Unchanged,
                            Some("OnDelete: the hub updates it only by recreating it once deleted".into()),
                        ),
                        UpdateMethod::Recreate | UpdateMethod::RollingRecreate => {
                            (Action::Update, Some("Recreate: deleted, then created again".into()))
                        }
                        UpdateMethod::InPlace | UpdateMethod::RollingInPlace => (Action::Update, None),
                    };
                }
            }
            changes.push(change);
        }
        for (key, obj) in observed.iter().filter(|(k, _)| !desired.contains_key(*k)) {
            let mut change = Change::other(Action::Delete, obj, String::new());
            change.reason = obj.metadata.deletion_timestamp.is_some().then(|| "already being deleted".into());
            change.adopted = adopted.contains(&(index, key.clone()));
            changes.push(change);
        }
    }
    changes
}

/// Everything `render` found out, printed as YAML or JSON.
pub(super) struct Report {
    pub(super) controller: (&'static str, String),
    pub(super) parent: String,
    /// The status the hub would write (`None`: a decorator leaving it alone).
    pub(super) status: Option<Value>,
    pub(super) status_changed: bool,
    /// Labels and annotations a decorator merges into its target.
    pub(super) metadata_patch: Option<Value>,
    pub(super) resync_after: Option<f64>,
    pub(super) finalized: bool,
    pub(super) events: Vec<HookEvent>,
    /// `children` or `attachments`.
    pub(super) objects_field: &'static str,
    pub(super) changes: Vec<Change>,
    pub(super) notes: Vec<String>,
}

impl Report {
    pub(super) fn count(&self, action: Action) -> usize {
        self.changes.iter().filter(|c| c.action == action).count()
    }

    /// `2 created, 1 updated, 0 deleted, status changed`, plus what was adopted, released or ignored.
    pub(super) fn summary(&self) -> String {
        let mut text = format!(
            "{} created, {} updated, {} deleted",
            self.count(Action::Create),
            self.count(Action::Update),
            self.count(Action::Delete)
        );
        let adopted = self.changes.iter().filter(|c| c.adopted).count();
        for (n, word) in
            [(adopted, "adopted"), (self.count(Action::Release), "released"), (self.count(Action::Ignore), "ignored")]
        {
            if n > 0 {
                let _ = write!(text, ", {n} {word}");
            }
        }
        text.push_str(if self.status_changed { ", status changed" } else { ", status unchanged" });
        if self.metadata_patch.is_some() {
            text.push_str(", labels/annotations changed");
        }
        text
    }

    pub(super) fn yaml(&self) -> String {
        let mut out = String::new();
        for note in &self.notes {
            let _ = writeln!(out, "# note: {note}");
        }
        match &self.status {
            Some(status) => {
                let _ = writeln!(out, "# status{}", if self.status_changed { "" } else { " (unchanged)" });
                out.push_str(&yaml(&json!({ "status": status })));
            }
            None => {
                let _ = writeln!(out, "# status: left alone (the hook returned none)");
            }
        }
        if let Some(patch) = &self.metadata_patch {
            let _ = writeln!(out, "# merged into {} (null deletes)", self.parent);
            out.push_str(&yaml(patch));
        }
        if let Some(after) = self.resync_after.filter(|s| *s > 0.0) {
            let _ = writeln!(out, "# resync after {after}s");
        }
        if self.finalized {
            let _ = writeln!(out, "# finalized: the hub removes its finalizer");
        }
        for event in &self.events {
            let _ = writeln!(out, "# event {} {}: {}", event.type_, event.reason, event.message);
        }
        for change in &self.changes {
            let _ = writeln!(out, "---\n{}", change.comment());
            match (change.action, &change.diff, &change.desired) {
                (_, Some(diff), _) => out.push_str(diff),
                (Action::Create, None, Some(desired)) => out.push_str(&yaml(desired)),
                _ => {}
            }
        }
        let _ = writeln!(out, "---\n# summary: {}", self.summary());
        out
    }

    pub(super) fn json(&self) -> String {
        let objects: Vec<Value> = self
            .changes
            .iter()
            .map(|c| {
                json!({
                    "action": c.action.word(),
                    "adopted": c.adopted,
                    "apiVersion": c.api_version,
                    "kind": c.kind,
                    "namespace": c.key.namespace,
                    "name": c.key.name,
                    "reason": c.reason,
                    "object": c.desired,
                    "diff": c.diff,
                })
            })
            .collect();
        let mut report = json!({
            "controller": {"kind": self.controller.0, "name": self.controller.1},
            "parent": self.parent,
            "status": self.status,
            "statusChanged": self.status_changed,
            "resyncAfterSeconds": self.resync_after,
            "finalized": self.finalized,
            "events": self.events,
            self.objects_field: objects,
            "notes": self.notes,
            "summary": {
                "created": self.count(Action::Create),
                "updated": self.count(Action::Update),
                "unchanged": self.count(Action::Unchanged),
                "deleted": self.count(Action::Delete),
                "adopted": self.changes.iter().filter(|c| c.adopted).count(),
                "released": self.count(Action::Release),
                "ignored": self.count(Action::Ignore),
                "statusChanged": self.status_changed,
                "text": self.summary(),
            },
        });
        if let Some(patch) = &self.metadata_patch {
            report["metadata"] = patch["metadata"].clone();
        }
        let mut text = serde_json::to_string_pretty(&report).unwrap_or_default();
        text.push('\n');
        text
    }
}

/// `Kind namespace/name`.
pub(super) fn describe(obj: &DynamicObject) -> String {
    format!("{} {}", type_of(obj).1, ObjectKey::of(obj))
}

/// The observed object cut down to the fields the desired one sets, so the diff shows only what
/// applying would change (server-side apply leaves other fields alone).
pub(crate) fn comparable(observed: &DynamicObject, desired: &Value) -> Value {
    pub(super) fn cut(have: &Value, want: &Value) -> Value {
        match (have, want) {
            (Value::Object(h), Value::Object(w)) => {
                Value::Object(w.keys().filter_map(|k| h.get(k).map(|v| (k.clone(), cut(v, &w[k])))).collect())
            }
            _ => have.clone(),
        }
    }
    cut(&serde_json::to_value(observed).unwrap_or(Value::Null), desired)
}

fn yaml(value: &Value) -> String {
    crate::ops::yaml::to_string(value).unwrap_or_default()
}

/// A minimal line diff (longest common subsequence): `-` observed, `+` desired, ` ` both.
fn diff(old: &str, new: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let mut lcs = vec![vec![0_usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            let _ = writeln!(out, "  {}", a[i]);
            (i, j) = (i + 1, j + 1);
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            let _ = writeln!(out, "- {}", a[i]);
            i += 1;
        } else {
            let _ = writeln!(out, "+ {}", b[j]);
            j += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn line_diff_marks_removed_and_added_lines() {
        assert_eq!(diff("a\nb\nc\n", "a\nx\nc\n"), "  a\n- b\n+ x\n  c\n");
        assert_eq!(diff("", "a\n"), "+ a\n");
    }

    #[test]
    pub(super) fn comparable_keeps_only_fields_the_desired_object_sets() {
        let observed: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "uid": "u", "resourceVersion": "1"}, "data": {"k": "v", "other": "x"}
        }))
        .unwrap();
        let desired =
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "v"}});
        assert_eq!(comparable(&observed, &desired), desired);
    }

    pub(super) fn change(action: Action, adopted: bool) -> Change {
        Change {
            action,
            adopted,
            kind: "Pod".into(),
            api_version: "v1".into(),
            key: ObjectKey { namespace: Some("default".into()), name: "p".into() },
            reason: None,
            desired: None,
            diff: None,
        }
    }

    #[test]
    pub(super) fn the_summary_counts_what_the_hub_would_do() {
        let mut report = Report {
            controller: ("CompositeController", "c".into()),
            parent: "P default/p".into(),
            status: Some(json!({})),
            status_changed: true,
            metadata_patch: None,
            resync_after: None,
            finalized: false,
            events: Vec::new(),
            objects_field: "children",
            changes: vec![
                change(Action::Create, false),
                change(Action::Create, false),
                change(Action::Update, true),
                change(Action::Unchanged, false),
            ],
            notes: Vec::new(),
        };
        assert_eq!(report.summary(), "2 created, 1 updated, 0 deleted, 1 adopted, status changed");
        report.changes.push(change(Action::Ignore, false));
        report.status_changed = false;
        assert_eq!(report.summary(), "2 created, 1 updated, 0 deleted, 1 adopted, 1 ignored, status unchanged");
    }
}
