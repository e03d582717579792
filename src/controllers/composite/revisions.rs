//! Parent revisions kept as Metacontroller `ControllerRevision`s: a revision records the parent's
//! rolled fields (`parentPatch`, `revisionHistory.fieldPaths`, default `spec`) and which children it
//! claims, and is named exactly as Metacontroller names it, so revisions it wrote are reused. Revisions
//! are written before any child is touched, so a restarted hub resumes a rollout where it stopped.

use super::rollout::Claims;
use crate::api::json::canonical_json;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::{Map, Value, json};
use sha1::{Digest as _, Sha1};

use crate::api::UpdateMethod;
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::ObjectKey;
use crate::write::apply::{ADOPTS_NOTHING, Applier, ApplyError};

/// Labels Metacontroller puts on revisions, so revisions it wrote are recognised.
pub const API_GROUP_LABEL: &str = "metacontroller.k8s.io/apiGroup";
pub const RESOURCE_LABEL: &str = "metacontroller.k8s.io/resource";

/// The parent's fields at `field_paths` (dotted, e.g. `spec.template`), as a sparse object.
#[must_use]
pub fn parent_patch(parent: &Value, field_paths: &[String]) -> Value {
    let mut patch = Value::Object(Map::new());
    for path in field_paths {
        let segments: Vec<&str> = path.split('.').collect();
        if let Some(value) = lookup(parent, &segments) {
            set(&mut patch, &segments, Some(value.clone()));
        }
    }
    patch
}

/// `parent` with the fields at `field_paths` taken from `patch` (absent there = removed).
#[must_use]
pub fn apply_patch(parent: &Value, patch: &Value, field_paths: &[String]) -> Value {
    let mut result = parent.clone();
    for path in field_paths {
        let segments: Vec<&str> = path.split('.').collect();
        set(&mut result, &segments, lookup(patch, &segments).cloned());
    }
    result
}

pub(crate) fn lookup<'a>(value: &'a Value, segments: &[&str]) -> Option<&'a Value> {
    segments.iter().try_fold(value, |v, s| v.get(s))
}

pub(crate) fn set(value: &mut Value, segments: &[&str], new: Option<Value>) {
    let Some((last, parents)) = segments.split_last() else { return };
    let mut cursor = value;
    for segment in parents {
        let Some(map) = cursor.as_object_mut() else { return };
        cursor = map.entry(*segment).or_insert_with(|| Value::Object(Map::new()));
    }
    if let Some(map) = cursor.as_object_mut() {
        match new {
            Some(v) => map.insert((*last).to_owned(), v),
            None => map.remove(*last),
        };
    }
}

/// `<plural>.<group|core>-<sha1(parentUID + parentPatch)>`, Metacontroller's revision name.
#[must_use]
pub fn revision_name(parent_resource: &ResolvedResource, parent_uid: &str, patch: &Value) -> String {
    let group =
        if parent_resource.api_resource.group.is_empty() { "core" } else { &parent_resource.api_resource.group };
    let mut prefix = format!("{}.{group}", parent_resource.api_resource.plural);
    prefix.truncate(212);
    let mut hasher = Sha1::new();
    hasher.update(parent_uid.as_bytes());
    hasher.update(canonical_json(patch).as_bytes());
    let digest = hasher.finalize().iter().fold(String::with_capacity(40), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    });
    format!("{prefix}-{digest}")
}

/// A revision as read from the cluster (or about to be created).
#[derive(Debug, Clone)]
pub struct Revision {
    pub name: String,
    pub patch: Value,
    /// `(apiGroup, kind)` → child names.
    pub children: BTreeMap<(String, String), Vec<String>>,
    /// The stored object; `None` for a revision not yet created.
    pub stored: Option<Arc<DynamicObject>>,
}

impl Revision {
    /// Reads a stored ControllerRevision.
    #[must_use]
    pub fn from_object(obj: Arc<DynamicObject>) -> Self {
        let mut children: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for entry in obj.data.get("children").and_then(Value::as_array).into_iter().flatten() {
            let text = |k: &str| entry.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
            let names = entry.get("names").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str);
            children.entry((text("apiGroup"), text("kind"))).or_default().extend(names.map(str::to_owned));
        }
        Self {
            name: obj.metadata.name.clone().unwrap_or_default(),
            patch: obj.data.get("parentPatch").cloned().unwrap_or_else(|| json!({})),
            children,
            stored: Some(obj),
        }
    }
}

/// Writes revisions: the latest (created if new) and every other one with its current claims; deletes
/// non-latest revisions that claim nothing. Done before children change, so a restart resumes here.
pub async fn persist(
    applier: &Applier,
    resource: &ResolvedResource,
    revisions: &[Revision],
    objects: &[Value],
) -> Result<(), ApplyError> {
    for (index, (revision, desired)) in revisions.iter().zip(objects).enumerate() {
        if index != 0 && revision.children.values().all(Vec::is_empty) {
            if let Some(stored) = &revision.stored {
                applier.delete(resource, stored).await?;
            }
            continue;
        }
        // Revisions' writes are not followed by echoes: the cache is never known to be behind here.
        let stored = revision.stored.as_deref();
        applier.apply(resource, desired, stored, UpdateMethod::InPlace, ADOPTS_NOTHING, || false).await?;
    }
    Ok(())
}

/// The ControllerRevision object for `revision`.
#[must_use]
pub fn revision_object(
    revision: &Revision,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
) -> Value {
    let children: Vec<Value> = revision
        .children
        .iter()
        .filter(|(_, names)| !names.is_empty())
        .map(|((group, kind), names)| json!({"apiGroup": group, "kind": kind, "names": names}))
        .collect();
    json!({
        "apiVersion": "metacontroller.k8s.io/v1alpha1",
        "kind": "ControllerRevision",
        "metadata": {"name": revision.name, "namespace": namespace, "labels": labels, "ownerReferences": [owner]},
        "parentPatch": revision.patch,
        "children": children,
    })
}

/// The latest revision first, then the other `stored` ones (the parent's, as claimed). The latest is the
/// stored revision named for the latest patch, else one whose patch is the latest's (an adopted revision,
/// named after the UID of the parent it was orphaned from: Metacontroller's syncRevisions takes any
/// revision whose patch equals the latest as the latest), else a new one with no children.
pub(crate) fn live_revisions(stored: &[Arc<DynamicObject>], latest_name: &str, latest_patch: Value) -> Vec<Revision> {
    let mut stored: Vec<Revision> = stored.iter().cloned().map(Revision::from_object).collect();
    stored.sort_by(|a, b| a.name.cmp(&b.name));
    let found = stored
        .iter()
        .position(|r| r.name == latest_name)
        .or_else(|| stored.iter().position(|r| r.patch == latest_patch));
    let latest = match found {
        Some(i) => stored.remove(i),
        None => Revision { name: latest_name.to_owned(), patch: latest_patch, children: BTreeMap::new(), stored: None },
    };
    let mut all = vec![latest];
    all.extend(stored);
    all
}

/// Claims recorded in stored revisions; where two claim a child, the latest (index 0) wins.
pub(crate) fn stored_claims(revisions: &[Revision], types: &[Arc<ResolvedResource>], namespace: &str) -> Claims {
    let mut claims = Claims::new();
    for (index, revision) in revisions.iter().enumerate().rev() {
        for ((group, kind), names) in &revision.children {
            let Some(t) = types.iter().position(|r| r.api_resource.group == *group && r.kind() == kind) else {
                continue;
            };
            for name in names {
                claims.insert((t, ObjectKey { namespace: Some(namespace.to_owned()), name: name.clone() }), index);
            }
        }
    }
    claims
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn patches_keep_only_rolled_fields_and_apply_back() {
        let parent = json!({"metadata": {"name": "p"}, "spec": {"replicas": 3, "template": {"image": "v2"}}});
        let paths = vec!["spec.template".to_owned()];
        let patch = parent_patch(&parent, &paths);
        assert_eq!(patch, json!({"spec": {"template": {"image": "v2"}}}));
        let old = json!({"spec": {"template": {"image": "v1"}}});
        let rebuilt = apply_patch(&parent, &old, &paths);
        assert_eq!(rebuilt["spec"], json!({"replicas": 3, "template": {"image": "v1"}}), "replicas apply at once");
    }

    /// The expected text and hash were computed by Go 1.26's `encoding/json` (what Metacontroller's
    /// `controllerRevisionHash` uses, via `k8s.io/apimachinery/pkg/util/json`): a tiny program decoded
    /// this patch as the API machinery does (`UseNumber`, then int64 when the literal fits, else float64),
    /// printed `json.Marshal(patch)` and `hex(sha1("uid-1" + that))`.
    #[test]
    fn revision_json_is_byte_for_byte_what_go_writes() {
        let patch: Value = serde_json::from_str(
            r#"{"spec":{"cmd":"a<b && c>d","sep":"x\u2028y\u2029z","ctl":"\u0001\b\f\n\r\t\u001f\u007f",
                "uni":"caf\u00e9 \ud83d\ude00 /","<k>":[1,-2,1.0,2.5,1.5e-7,1e21,1e20,0.000001,
                18446744073709551615,12345678901234567890.5,true,null,{}],"b":{"z":1,"a":[]}}}"#,
        )
        .unwrap();
        let go = "{\"spec\":{\"\\u003ck\\u003e\":[1,-2,1,2.5,1.5e-7,1e+21,100000000000000000000,0.000001,\
                  18446744073709552000,12345678901234567000,true,null,{}],\"b\":{\"a\":[],\"z\":1},\
                  \"cmd\":\"a\\u003cb \\u0026\\u0026 c\\u003ed\",\"ctl\":\"\\u0001\\b\\f\\n\\r\\t\\u001f\u{7f}\",\
                  \"sep\":\"x\\u2028y\\u2029z\",\"uni\":\"café 😀 /\"}}";
        assert_eq!(canonical_json(&patch), go);
        let resource = catsets();
        assert_eq!(
            revision_name(&resource, "uid-1", &patch),
            "catsets.ctl.example.com-dfbc2bd0f5cd086ca1b55f473e07d583ca11c56a"
        );
    }

    /// A parent type whose revisions' names the tests pin: `catsets.ctl.example.com`.
    fn catsets() -> ResolvedResource {
        ResolvedResource {
            api_resource: kube::core::ApiResource {
                group: "ctl.example.com".into(),
                version: "v1".into(),
                api_version: "ctl.example.com/v1".into(),
                kind: "CatSet".into(),
                plural: "catsets".into(),
            },
            namespaced: true,
            has_status: true,
        }
    }

    fn stored(name: &str, patch: &Value) -> Arc<DynamicObject> {
        Arc::new(
            serde_json::from_value(
                json!({"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "ControllerRevision",
                "metadata": {"name": name, "namespace": "ns"}, "parentPatch": patch,
                "children": [{"apiGroup": "", "kind": "Pod", "names": [format!("{name}-pod")]}]}),
            )
            .unwrap(),
        )
    }

    #[test]
    fn the_latest_revision_is_found_by_name_else_by_its_patch() {
        let (v1, v2) = (json!({"spec": {"v": 1}}), json!({"spec": {"v": 2}}));
        // An adopted revision, named after its former parent: its patch makes it the latest.
        let all = live_revisions(&[stored("old-v1", &v1), stored("old-v2", &v2)], "new-v2", v2.clone());
        let names: Vec<&str> = all.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["old-v2", "old-v1"]);
        assert!(all[0].stored.is_some() && all[0].children[&(String::new(), "Pod".into())] == ["old-v2-pod"]);
        // One named for the latest patch wins over another with the same patch.
        let all = live_revisions(&[stored("old-v2", &v2), stored("new-v2", &v2)], "new-v2", v2.clone());
        assert_eq!(all[0].name, "new-v2");
        // None: a new latest revision with no children, the stored ones after it.
        let all = live_revisions(&[stored("old-v1", &v1)], "new-v2", v2.clone());
        assert_eq!((all[0].name.as_str(), all[0].stored.is_none(), all[0].children.is_empty()), ("new-v2", true, true));
        assert_eq!(all[1].name, "old-v1");
    }

    #[test]
    fn revision_names_are_stable_and_depend_on_uid_and_patch() {
        let resource = catsets();
        let a = revision_name(&resource, "uid-1", &json!({"spec": {"b": 1, "a": 2}}));
        assert!(a.starts_with("catsets.ctl.example.com-") && a.len() == "catsets.ctl.example.com-".len() + 40);
        assert_eq!(a, revision_name(&resource, "uid-1", &json!({"spec": {"a": 2, "b": 1}})), "key order is irrelevant");
        assert_ne!(a, revision_name(&resource, "uid-2", &json!({"spec": {"b": 1, "a": 2}})));
        assert_ne!(a, revision_name(&resource, "uid-1", &json!({"spec": {"b": 1, "a": 3}})));
    }
}
