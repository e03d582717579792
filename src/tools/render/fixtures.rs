//! Reading the fixtures, and resolving their types offline: kinds from the objects, plurals by
//! kube-core's rules, scope from a table of built-in types and the fixtures themselves.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kube::api::DynamicObject;
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;

use crate::api::{ChildResourceRule, HookVersion};
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::ObjectKey;
use crate::hooks::{ObjectMaps, WireObject, group_version_kind_key, object_key};
use crate::ops::yaml;

use super::args::{RenderArgs, RenderError, input};

fn read_docs(path: &Path) -> Result<Vec<Value>, RenderError> {
    let text = std::fs::read_to_string(path).map_err(|e| input(path, &e.to_string()))?;
    let mut docs = Vec::new();
    for value in yaml::from_documents(&text).map_err(|e| input(path, &e.to_string()))? {
        match value {
            Value::Object(ref map) if map.get("kind").and_then(Value::as_str).is_some_and(|k| k.ends_with("List")) => {
                docs.extend(map.get("items").and_then(Value::as_array).into_iter().flatten().cloned());
            }
            other => docs.push(other),
        }
    }
    Ok(docs)
}

pub(super) fn read_one(path: &Path) -> Result<Value, RenderError> {
    let mut docs = read_docs(path)?;
    match docs.len() {
        1 => Ok(docs.remove(0)),
        n => Err(input(path, &format!("expected one object, found {n}"))),
    }
}

pub(super) fn read_objects(paths: &[PathBuf]) -> Result<Vec<DynamicObject>, RenderError> {
    let mut objects = Vec::new();
    for path in paths {
        for doc in read_docs(path)? {
            objects.push(serde_json::from_value(doc).map_err(|e| input(path, &e.to_string()))?);
        }
    }
    Ok(objects)
}

/// The parent fixture, with what the API server would have given it: a UID, and a namespace unless
/// its type is cluster-scoped. `api_version` is checked against the controller's rule when given.
pub(super) fn read_parent(args: &RenderArgs, api_version: &str) -> Result<DynamicObject, RenderError> {
    let mut parent: DynamicObject =
        serde_json::from_value(read_one(&args.parent)?).map_err(|e| input(&args.parent, &e.to_string()))?;
    let (have, kind) = type_of(&parent);
    let (have, kind) = (have.to_owned(), kind.to_owned());
    if kind.is_empty() {
        return Err(input(&args.parent, "the object has no apiVersion and kind"));
    }
    if !api_version.is_empty() && have != api_version {
        return Err(RenderError::Setup(format!(
            "the parent is {have}, the controller's parentResource is {api_version}"
        )));
    }
    parent.metadata.uid.get_or_insert_with(|| "00000000-0000-0000-0000-000000000000".into());
    let cluster_scoped = args.cluster_scoped_parent || CLUSTER_SCOPED_KINDS.contains(&kind.as_str());
    if !cluster_scoped {
        parent.metadata.namespace.get_or_insert_with(|| "default".into());
    }
    Ok(parent)
}

pub(super) fn type_of(obj: &DynamicObject) -> (&str, &str) {
    obj.types.as_ref().map_or(("", ""), |t| (t.api_version.as_str(), t.kind.as_str()))
}

/// The plural resource name of a kind by kube-core's discovery-free rules (`ApiResource::from_gvk`):
/// `Gateway` → `gateways`, `Box` → `boxes`, `Policy` → `policies`. Right for every built-in type and
/// for CRDs that follow the usual English rules; `--kind` covers the others.
pub(super) fn plural_of(api_version: &str, kind: &str) -> String {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind)).plural
}

pub(super) fn resolved(api_version: &str, kind: &str, plural: &str, namespaced: bool) -> Arc<ResolvedResource> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    Arc::new(ResolvedResource {
        api_resource: ApiResource {
            group: group.to_owned(),
            version: version.to_owned(),
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
        },
        namespaced,
        has_status: true,
    })
}

pub(super) fn resolved_parent(parent: &DynamicObject, plural: &str, cluster_scoped: bool) -> Arc<ResolvedResource> {
    let (api_version, kind) = type_of(parent);
    resolved(api_version, kind, plural, !cluster_scoped && parent.metadata.namespace.is_some())
}

/// Kinds of common built-in resources by group and plural, for child types without fixture objects
/// (a plural cannot be turned back into a kind: `endpoints`, `networkpolicies`), and their scope.
const BUILT_IN: &[(&str, &str, &str, bool)] = &[
    ("", "pods", "Pod", true),
    ("", "services", "Service", true),
    ("", "configmaps", "ConfigMap", true),
    ("", "secrets", "Secret", true),
    ("", "serviceaccounts", "ServiceAccount", true),
    ("", "persistentvolumeclaims", "PersistentVolumeClaim", true),
    ("", "resourcequotas", "ResourceQuota", true),
    ("", "limitranges", "LimitRange", true),
    ("", "namespaces", "Namespace", false),
    ("", "nodes", "Node", false),
    ("", "persistentvolumes", "PersistentVolume", false),
    ("apps", "deployments", "Deployment", true),
    ("apps", "replicasets", "ReplicaSet", true),
    ("apps", "statefulsets", "StatefulSet", true),
    ("apps", "daemonsets", "DaemonSet", true),
    ("batch", "jobs", "Job", true),
    ("batch", "cronjobs", "CronJob", true),
    ("networking.k8s.io", "ingresses", "Ingress", true),
    ("networking.k8s.io", "networkpolicies", "NetworkPolicy", true),
    ("policy", "poddisruptionbudgets", "PodDisruptionBudget", true),
    ("autoscaling", "horizontalpodautoscalers", "HorizontalPodAutoscaler", true),
    ("rbac.authorization.k8s.io", "roles", "Role", true),
    ("rbac.authorization.k8s.io", "rolebindings", "RoleBinding", true),
    ("rbac.authorization.k8s.io", "clusterroles", "ClusterRole", false),
    ("rbac.authorization.k8s.io", "clusterrolebindings", "ClusterRoleBinding", false),
    ("apiextensions.k8s.io", "customresourcedefinitions", "CustomResourceDefinition", false),
];

/// Built-in kinds whose objects have no namespace.
const CLUSTER_SCOPED_KINDS: &[&str] = &[
    "Namespace",
    "Node",
    "PersistentVolume",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "StorageClass",
    "PriorityClass",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "CompositeController",
    "DecoratorController",
];

/// The declared child types, resolved, and the fixture objects with the index of their type (`None`:
/// not a declared type).
pub(super) struct ChildTypes {
    pub(super) resources: Vec<Arc<ResolvedResource>>,
    pub(super) fixtures: Vec<(Option<usize>, DynamicObject)>,
}

impl ChildTypes {
    pub(super) fn len(&self) -> usize {
        self.resources.len()
    }
}

pub(super) fn child_types(
    rules: &[ChildResourceRule],
    fixtures: &[DynamicObject],
    kinds: &[(String, String)],
    parent_ns: Option<&str>,
) -> Result<ChildTypes, RenderError> {
    let mut resources = Vec::new();
    for rule in rules {
        let explicit = kinds.iter().find(|(r, _)| *r == rule.resource).map(|(_, k)| k.clone());
        let group = rule.api_version.rsplit_once('/').map_or("", |(group, _)| group);
        let built_in = BUILT_IN.iter().find(|(g, r, _, _)| *g == group && *r == rule.resource);
        let from_fixture = fixtures.iter().find(|c| {
            let (api_version, kind) = type_of(c);
            api_version == rule.api_version && plural_of(api_version, kind) == rule.resource
        });
        let kind = explicit
            .or_else(|| from_fixture.map(|c| type_of(c).1.to_owned()))
            .or_else(|| built_in.map(|(_, _, k, _)| (*k).to_owned()))
            .ok_or_else(|| {
                RenderError::Setup(format!(
                    "cannot tell the kind of child resource {}: add a fixture object or --kind {}=Kind",
                    rule.resource, rule.resource
                ))
            })?;
        let namespaced = match (built_in, from_fixture) {
            (Some((_, _, _, namespaced)), _) => *namespaced,
            (None, Some(c)) => c.metadata.namespace.is_some() || parent_ns.is_some(),
            (None, None) => !CLUSTER_SCOPED_KINDS.contains(&kind.as_str()),
        };
        resources.push(resolved(&rule.api_version, &kind, &rule.resource, namespaced));
    }
    let fixtures = fixtures
        .iter()
        .map(|obj| {
            let (api_version, kind) = type_of(obj);
            let index = resources.iter().position(|r| r.api_version() == api_version && r.kind() == kind);
            let mut obj = obj.clone();
            // A fixture without a namespace lives in the parent's, as the Python and Node helpers take it.
            if index.is_some_and(|i| resources[i].namespaced) && obj.metadata.namespace.is_none() {
                obj.metadata.namespace = parent_ns.map(str::to_owned);
            }
            (index, obj)
        })
        .collect();
    Ok(ChildTypes { resources, fixtures })
}

pub(super) fn related_map(related: &[DynamicObject], version: HookVersion, parent_ns: Option<&str>) -> ObjectMaps {
    let mut maps = ObjectMaps::new();
    for obj in related {
        let (api_version, kind) = type_of(obj);
        let entry = maps.entry(group_version_kind_key(api_version, kind)).or_default();
        let key = ObjectKey::of(obj);
        if let Some(k) = object_key(version, parent_ns, key.namespace.as_deref(), &key.name) {
            entry.insert(k, WireObject(Arc::new(obj.clone())));
        }
    }
    maps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn plurals_follow_kube_core_not_guesses() {
        assert_eq!(plural_of("v1", "Pod"), "pods");
        assert_eq!(plural_of("networking.k8s.io/v1", "NetworkPolicy"), "networkpolicies");
        assert_eq!(plural_of("networking.k8s.io/v1", "Ingress"), "ingresses");
        assert_eq!(plural_of("gateway.networking.k8s.io/v1", "Gateway"), "gateways");
        assert_eq!(plural_of("example.com/v1", "Box"), "boxes");
        assert_eq!(plural_of("example.com/v1", "Policy"), "policies");
        assert_eq!(plural_of("v1", "Endpoints"), "endpoints");
    }
}
