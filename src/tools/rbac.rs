//! Least-privilege RBAC: the hub's own base permissions, and the ClusterRole each controller needs
//! (`metahook rbac -f controller.yaml`), aggregated into the hub's ClusterRole by a label.
//!
//! Which types the hub touches is decided by the controllers users create, so Metacontroller grants
//! `*/*/*`. Here the hub's ClusterRole instead aggregates every ClusterRole labelled
//! [`AGGREGATE_LABEL`]: the base role ([`base_rules`]) plus one role per controller, derived from its
//! spec ([`controller_rules`]). A controller whose role is missing gets `Ready=False`/`Forbidden` (its
//! caches cannot fill) instead of a hub with power over the whole cluster.
// Kubernetes kind names (ClusterRole, ControllerRevision) read better in prose without backticks.
#![allow(clippy::doc_markdown)]

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use kube::api::ObjectMeta;

use crate::api::{CompositeController, DecoratorController};

/// The label that aggregates a ClusterRole into the hub's.
pub const AGGREGATE_LABEL: &str = "metahook.dev/aggregate-to-hub";

const READ: &[&str] = &["get", "list", "watch"];
const MANAGE: &[&str] = &["get", "list", "watch", "create", "update", "patch", "delete"];
const STATUS: &[&str] = &["get", "update", "patch"];
/// Setting `blockOwnerDeletion` on a child needs `update` on the owner's `finalizers` subresource when
/// the `OwnerReferencesPermissionEnforcement` admission plugin is on.
const FINALIZERS: &[&str] = &["update"];

/// Errors of `metahook rbac`.
#[derive(Debug, thiserror::Error)]
pub enum RbacError {
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: {source}")]
    Parse { path: String, source: serde_yaml::Error },
    #[error("{path}: no CompositeController or DecoratorController in it")]
    NoController { path: String },
    #[error("--related {0}: expected apiVersion/resource, e.g. v1/configmaps or apps/v1/deployments")]
    Related(String),
}

/// Verbs by (API group, resource), merged into compact rules at the end.
#[derive(Default)]
struct Grants(BTreeMap<String, BTreeMap<String, BTreeSet<&'static str>>>);

impl Grants {
    fn add(&mut self, api_version: &str, resource: &str, verbs: &[&'static str]) {
        let group = api_version.rsplit_once('/').map_or("", |(group, _)| group).to_owned();
        self.0.entry(group).or_default().entry(resource.to_owned()).or_default().extend(verbs);
    }

    /// One rule per (group, set of verbs), resources sorted: stable output for review and diffs.
    fn rules(self) -> Vec<PolicyRule> {
        let mut rules = Vec::new();
        for (group, resources) in self.0 {
            let mut by_verbs: BTreeMap<Vec<&str>, Vec<String>> = BTreeMap::new();
            for (resource, verbs) in resources {
                by_verbs.entry(ordered(&verbs)).or_default().push(resource);
            }
            for (verbs, resources) in by_verbs {
                rules.push(PolicyRule {
                    api_groups: Some(vec![group.clone()]),
                    resources: Some(resources),
                    verbs: verbs.into_iter().map(str::to_owned).collect(),
                    ..PolicyRule::default()
                });
            }
        }
        rules
    }
}

/// Verbs in the conventional order (read, then write).
fn ordered<'a>(verbs: &BTreeSet<&'a str>) -> Vec<&'a str> {
    MANAGE
        .iter()
        .copied()
        .filter(|v| verbs.contains(v))
        .chain(verbs.iter().copied().filter(|v| !MANAGE.contains(v)))
        .collect()
}

/// What the hub needs whatever its controllers do: read its controller objects and write their status,
/// record Events (on parents anywhere, and on controller objects in `default`), discovery, and review
/// the tokens of scrapes (`metricsAuth: kubernetes`).
#[must_use]
pub fn base_rules() -> Vec<PolicyRule> {
    let mut grants = Grants::default();
    // `metricsAuth: kubernetes` asks who a scrape's token belongs to, and whether they may get /metrics:
    // what the built-in `system:auth-delegator` role grants. In the base role whether the option is on
    // or not, so that turning it on needs no new role; creating a review changes nothing in the cluster.
    grants.add("authentication.k8s.io/v1", "tokenreviews", &["create"]);
    grants.add("authorization.k8s.io/v1", "subjectaccessreviews", &["create"]);
    for resource in ["compositecontrollers", "decoratorcontrollers"] {
        grants.add(crate::api::GROUP_VERSION, resource, READ);
        grants.add(crate::api::GROUP_VERSION, &format!("{resource}/status"), STATUS);
    }
    grants.add("events.k8s.io/v1", "events", &["create", "patch"]);
    let mut rules = grants.rules();
    rules.push(PolicyRule {
        non_resource_urls: Some(["/api", "/api/*", "/apis", "/apis/*", "/version"].map(str::to_owned).to_vec()),
        verbs: vec!["get".to_owned()],
        ..PolicyRule::default()
    });
    rules
}

/// What leader election needs, in the Lease's namespace only: `create` cannot be limited to a name.
#[must_use]
pub fn lease_rules(lease_name: &str) -> Vec<PolicyRule> {
    let rule = |names: Option<Vec<String>>, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec!["coordination.k8s.io".to_owned()]),
        resources: Some(vec!["leases".to_owned()]),
        resource_names: names,
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    };
    vec![rule(None, &["create", "list", "watch"]), rule(Some(vec![lease_name.to_owned()]), &["get", "update", "patch"])]
}

/// A controller object, as `metahook rbac` reads them.
pub enum ControllerObject {
    Composite(Box<CompositeController>),
    Decorator(Box<DecoratorController>),
}

impl ControllerObject {
    fn name(&self) -> String {
        match self {
            Self::Composite(c) => c.metadata.name.clone(),
            Self::Decorator(d) => d.metadata.name.clone(),
        }
        .unwrap_or_default()
    }
}

/// What one controller needs: its parent/target types read (plus writes of their status, finalizers and —
/// with a finalize hook, or for a decorator's labels — the objects), its child/attachment types managed,
/// ControllerRevisions for rolling updates, and `related` (`apiVersion`, `resource`) types read.
#[must_use]
pub fn controller_rules(controller: &ControllerObject, related: &[(String, String)]) -> Vec<PolicyRule> {
    let mut grants = Grants::default();
    let owner = |grants: &mut Grants, api_version: &str, resource: &str, writes: bool| {
        grants.add(api_version, resource, if writes { &["get", "list", "watch", "update", "patch"] } else { READ });
        grants.add(api_version, &format!("{resource}/status"), STATUS);
        grants.add(api_version, &format!("{resource}/finalizers"), FINALIZERS);
    };
    match controller {
        ControllerObject::Composite(cc) => {
            let spec = &cc.spec;
            let finalize = spec.hooks.as_ref().is_some_and(|h| h.finalize.is_some());
            owner(&mut grants, &spec.parent_resource.api_version, &spec.parent_resource.resource, finalize);
            for child in &spec.child_resources {
                grants.add(&child.api_version, &child.resource, MANAGE);
            }
            if spec.child_resources.iter().any(|c| c.method().is_rolling()) {
                grants.add(crate::api::GROUP_VERSION, "controllerrevisions", MANAGE);
            }
        }
        ControllerObject::Decorator(dc) => {
            // A decorator merges labels and annotations into its targets: always a write.
            for target in &dc.spec.resources {
                owner(&mut grants, &target.api_version, &target.resource, true);
            }
            for attachment in &dc.spec.attachments {
                grants.add(&attachment.api_version, &attachment.resource, MANAGE);
            }
        }
    }
    for (api_version, resource) in related {
        grants.add(api_version, resource, READ);
    }
    grants.rules()
}

/// A ClusterRole aggregated into the hub's (labelled [`AGGREGATE_LABEL`]`: "true"`).
#[must_use]
pub fn aggregated_role(name: &str, rules: Vec<PolicyRule>) -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some([(AGGREGATE_LABEL.to_owned(), "true".to_owned())].into()),
            ..ObjectMeta::default()
        },
        rules: Some(rules),
        aggregation_rule: None,
    }
}

/// The Role for the leader Lease in `namespace`.
#[must_use]
pub fn lease_role(name: &str, namespace: &str, lease_name: &str) -> Role {
    Role {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        rules: Some(lease_rules(lease_name)),
    }
}

/// Every controller object in a multi-document YAML file (other kinds are skipped, so a whole example
/// manifest can be passed).
pub fn read_controllers(path: &str) -> Result<Vec<ControllerObject>, RbacError> {
    let text = std::fs::read_to_string(path).map_err(|source| RbacError::Read { path: path.to_owned(), source })?;
    let parse = |source| RbacError::Parse { path: path.to_owned(), source };
    let mut found = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: serde_yaml::Value = serde::Deserialize::deserialize(doc).map_err(parse)?;
        match value.get("kind").and_then(serde_yaml::Value::as_str) {
            Some("CompositeController") => {
                found.push(ControllerObject::Composite(Box::new(serde_yaml::from_value(value).map_err(parse)?)));
            }
            Some("DecoratorController") => {
                found.push(ControllerObject::Decorator(Box::new(serde_yaml::from_value(value).map_err(parse)?)));
            }
            _ => {}
        }
    }
    if found.is_empty() {
        return Err(RbacError::NoController { path: path.to_owned() });
    }
    Ok(found)
}

/// `apiVersion/resource` (`v1/configmaps`, `apps/v1/deployments`) as a pair.
pub fn parse_related(text: &str) -> Result<(String, String), RbacError> {
    match text.rsplit_once('/') {
        Some((api_version, resource)) if !api_version.is_empty() && !resource.is_empty() => {
            Ok((api_version.to_owned(), resource.to_owned()))
        }
        _ => Err(RbacError::Related(text.to_owned())),
    }
}

/// `metahook rbac`: the YAML of one aggregated ClusterRole per controller in `files` (or, with `base`,
/// the hub's own base ClusterRole).
pub fn render(files: &[String], related: &[String], base: bool) -> Result<String, RbacError> {
    let related = related.iter().map(|r| parse_related(r)).collect::<Result<Vec<_>, _>>()?;
    let mut roles = Vec::new();
    if base {
        roles.push(aggregated_role("metahook-base", base_rules()));
    }
    for file in files {
        for controller in read_controllers(file)? {
            let name = format!("metahook-controller-{}", controller.name());
            roles.push(aggregated_role(&name, controller_rules(&controller, &related)));
        }
    }
    let docs: Vec<String> = roles.iter().map(|r| serde_yaml::to_string(&with_types(r)).unwrap_or_default()).collect();
    Ok(docs.join("---\n"))
}

/// A ClusterRole as YAML wants it: with apiVersion and kind.
fn with_types(role: &ClusterRole) -> serde_json::Value {
    let mut value = serde_json::to_value(role).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.insert("apiVersion".into(), "rbac.authorization.k8s.io/v1".into());
        map.insert("kind".into(), "ClusterRole".into());
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn composite(yaml: &str) -> ControllerObject {
        ControllerObject::Composite(Box::new(serde_yaml::from_str(yaml).unwrap()))
    }

    fn verbs(rules: &[PolicyRule], group: &str, resource: &str) -> Vec<String> {
        rules
            .iter()
            .filter(|r| r.api_groups.as_deref() == Some(&[group.to_owned()]))
            .filter(|r| r.resources.iter().flatten().any(|x| x == resource))
            .flat_map(|r| r.verbs.clone())
            .collect()
    }

    #[test]
    fn a_composite_controller_gets_read_on_its_parent_and_full_verbs_on_its_children() {
        let cc = composite(
            "metadata: {name: web}\nspec:\n  parentResource: {apiVersion: example.com/v1, resource: webs}\n  childResources:\n  - {apiVersion: v1, resource: configmaps}\n  - {apiVersion: apps/v1, resource: deployments, updateStrategy: {method: RollingInPlace}}\n  hooks: {sync: {webhook: {url: 'http://h/sync'}}}\n",
        );
        let rules = controller_rules(&cc, &[("v1".into(), "secrets".into())]);
        assert_eq!(
            verbs(&rules, "example.com", "webs"),
            ["get", "list", "watch"],
            "no finalize hook: no parent writes"
        );
        assert_eq!(verbs(&rules, "example.com", "webs/status"), ["get", "update", "patch"]);
        assert_eq!(verbs(&rules, "example.com", "webs/finalizers"), ["update"]);
        assert_eq!(verbs(&rules, "", "configmaps"), MANAGE);
        assert_eq!(verbs(&rules, "apps", "deployments"), MANAGE);
        assert_eq!(verbs(&rules, "metacontroller.k8s.io", "controllerrevisions"), MANAGE, "rolling updates");
        assert_eq!(verbs(&rules, "", "secrets"), ["get", "list", "watch"], "related: read only");
    }

    #[test]
    fn a_finalize_hook_adds_writes_on_the_parent() {
        let cc = composite(
            "metadata: {name: web}\nspec:\n  parentResource: {apiVersion: v1, resource: namespaces}\n  hooks: {finalize: {webhook: {url: 'http://h/f'}}}\n",
        );
        assert_eq!(verbs(&controller_rules(&cc, &[]), "", "namespaces"), ["get", "list", "watch", "update", "patch"]);
    }

    #[test]
    fn base_rules_cover_the_hubs_own_needs_and_nothing_wider() {
        let rules = base_rules();
        assert_eq!(verbs(&rules, "metacontroller.k8s.io", "compositecontrollers"), ["get", "list", "watch"]);
        assert_eq!(verbs(&rules, "metacontroller.k8s.io", "decoratorcontrollers/status"), ["get", "update", "patch"]);
        assert_eq!(verbs(&rules, "events.k8s.io", "events"), ["create", "patch"]);
        assert_eq!(verbs(&rules, "authentication.k8s.io", "tokenreviews"), ["create"], "metricsAuth: kubernetes");
        assert_eq!(verbs(&rules, "authorization.k8s.io", "subjectaccessreviews"), ["create"]);
        assert!(rules.iter().all(|r| !r.verbs.contains(&"*".to_owned())));
        assert!(rules.iter().flat_map(|r| r.resources.iter().flatten()).all(|r| r != "*"));
    }

    #[test]
    fn related_types_must_name_an_api_version_and_a_resource() {
        assert_eq!(parse_related("apps/v1/deployments").unwrap(), ("apps/v1".into(), "deployments".into()));
        assert!(parse_related("configmaps").is_err());
    }
}
