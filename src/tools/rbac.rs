//! Least-privilege RBAC: the hub's own base permissions, and what each controller needs
//! (`metahook rbac -f controller.yaml`): a ClusterRole aggregated into the hub's by a label, and Roles
//! for the Secrets and ConfigMaps its hook settings name.
//!
//! Which types the hub touches is decided by the controllers users create, so Metacontroller grants
//! `*/*/*`. Here the hub's ClusterRole instead aggregates every ClusterRole labelled
//! [`AGGREGATE_LABEL`]: one role per controller, derived from its spec ([`controller_rules`]). A
//! controller whose role is missing gets `Ready=False`/`Forbidden` (its caches cannot fill) instead of a
//! hub with power over the whole cluster. The base role ([`base_rules`]) is printed labelled too, for a
//! hub whose roles are assembled by hand; `deploy/` binds its copy directly (an aggregated role deleted
//! together with one it selects can be re-created by Kubernetes' aggregation controller).
//!
//! Hook credentials (`caBundle`, `clientTLS`, `authorization`, `basicAuth`) are single named objects,
//! which the hub watches one by one with a `metadata.name` field selector
//! ([`crate::hooks::credentials`]). So they are granted by name ([`credential_roles`]): a Role per
//! namespace with `resourceNames`, bound to the hub's ServiceAccount, rather than read on every Secret
//! of the cluster. A Role cannot be aggregated into a ClusterRole, hence the RoleBinding.
// Kubernetes kind names (ClusterRole, ControllerRevision) read better in prose without backticks.
#![allow(clippy::doc_markdown)]

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::ObjectMeta;

use crate::api::{
    Authorization, BasicAuth, CaBundle, ClientTls, CompositeController, DecoratorController, Hook, MapController,
};
use crate::ops::yaml;

/// The label that aggregates a ClusterRole into the hub's.
pub const AGGREGATE_LABEL: &str = "metahook.dev/aggregate-to-hub";

/// The hub's ServiceAccount as `deploy/` installs it (kustomize; Helm's too, for a release named
/// `metahook`): what credential Roles are bound to unless told otherwise.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "metahook/metahook";

const READ: &[&str] = &["get", "list", "watch"];
/// A parent's verbs without a finalize hook: read, and patch. The hub patches a parent for its finalizer
/// (children in other namespaces, `crossNamespace`), for the record of a `--cascade=orphan` deletion and,
/// for a type without a `/status` subresource, for its status. `metahook rbac` reads no cluster, so it
/// cannot tell which parent types have that subresource: the patch is granted for all.
const PARENT_PATCH: &[&str] = &["get", "list", "watch", "patch"];
const MANAGE: &[&str] = &["get", "list", "watch", "create", "update", "patch", "delete"];
/// A controller object's verbs: read, and patch for the hub's finalizer on it.
const CONTROLLER: &[&str] = &["get", "list", "watch", "patch"];
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
    Parse { path: String, source: yaml::Error },
    /// A controller object that is no controller (a field of the wrong type): found in the document read,
    /// so without a position in the file.
    #[error("{path}: {source}")]
    Controller { path: String, source: serde_json::Error },
    #[error("{path}: no CompositeController, DecoratorController or MapController in it")]
    NoController { path: String },
    #[error("--related {0}: expected apiVersion/resource, e.g. v1/configmaps or apps/v1/deployments")]
    Related(String),
    #[error("--service-account {0}: expected namespace/name, e.g. metahook/metahook")]
    ServiceAccount(String),
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
    for resource in ["compositecontrollers", "decoratorcontrollers", "mapcontrollers"] {
        // `patch`: the hub's finalizer on each controller object, which holds a deleted controller until
        // a hub has taken the controller's finalizer off its parents.
        grants.add(crate::api::GROUP_VERSION, resource, CONTROLLER);
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

/// The hooks the hub calls (sync, finalize, customize; Metacontroller declares `preUpdateChild` and
/// `postUpdateChild` but calls neither, and neither does the hub).
fn called_hooks(controller: &ControllerObject) -> Vec<&Hook> {
    match controller {
        ControllerObject::Composite(cc) => cc
            .spec
            .hooks
            .iter()
            .flat_map(|h| [h.sync.as_ref(), h.finalize.as_ref(), h.customize.as_ref()])
            .flatten()
            .collect(),
        ControllerObject::Decorator(dc) => {
            let h = &dc.spec.hooks;
            [h.sync.as_ref(), h.finalize.as_ref(), h.customize.as_ref()].into_iter().flatten().collect()
        }
        ControllerObject::Map(mc) => {
            let h = &mc.spec.hooks;
            [h.map.as_ref(), h.tombstone.as_ref(), h.finalize.as_ref()].into_iter().flatten().collect()
        }
    }
}

/// The Secrets and ConfigMaps of one namespace that a controller's hook settings name.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CredentialObjects {
    pub secrets: BTreeSet<String>,
    pub config_maps: BTreeSet<String>,
}

impl CredentialObjects {
    /// `get`, `list` and `watch` on exactly these objects: `list` and `watch` are allowed by
    /// `resourceNames` because the hub's watch selects `metadata.name=<name>`.
    fn rules(&self) -> Vec<PolicyRule> {
        [("secrets", &self.secrets), ("configmaps", &self.config_maps)]
            .into_iter()
            .filter(|(_, names)| !names.is_empty())
            .map(|(resource, names)| PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec![resource.to_owned()]),
                resource_names: Some(names.iter().cloned().collect()),
                verbs: READ.iter().map(|v| (*v).to_owned()).collect(),
                ..PolicyRule::default()
            })
            .collect()
    }
}

/// Every Secret and ConfigMap a controller's hooks and `endpointConfigs` name, by namespace.
///
/// An `endpointConfigs` entry is counted whether or not a hook's host matches it today: the role is a
/// function of the spec alone, and editing a hook's URL then needs no new role. An inline `caBundle`
/// names nothing.
#[must_use]
pub fn credential_objects(controller: &ControllerObject) -> BTreeMap<String, CredentialObjects> {
    let endpoint_configs = match controller {
        ControllerObject::Composite(cc) => &cc.spec.endpoint_configs,
        ControllerObject::Decorator(dc) => &dc.spec.endpoint_configs,
        ControllerObject::Map(mc) => &mc.spec.endpoint_configs,
    };
    let mut found: BTreeMap<String, CredentialObjects> = BTreeMap::new();
    let mut add =
        |ca: Option<&CaBundle>, tls: Option<&ClientTls>, auth: Option<&Authorization>, basic: Option<&BasicAuth>| {
            let mut secret = |namespace: &str, name: &str| {
                found.entry(namespace.to_owned()).or_default().secrets.insert(name.to_owned());
            };
            if let Some(r) = ca.and_then(|c| c.secret_ref.as_ref()) {
                secret(&r.namespace, &r.name);
            }
            if let Some(t) = tls {
                secret(&t.secret_ref.namespace, &t.secret_ref.name);
            }
            if let Some(a) = auth {
                secret(&a.secret_ref.namespace, &a.secret_ref.name);
            }
            if let Some(b) = basic {
                secret(&b.secret_ref.namespace, &b.secret_ref.name);
            }
            if let Some(r) = ca.and_then(|c| c.config_map_ref.as_ref()) {
                found.entry(r.namespace.clone()).or_default().config_maps.insert(r.name.clone());
            }
        };
    for webhook in called_hooks(controller).into_iter().map(|h| &h.webhook) {
        add(
            webhook.ca_bundle.as_ref(),
            webhook.client_tls.as_ref(),
            webhook.authorization.as_ref(),
            webhook.basic_auth.as_ref(),
        );
    }
    for config in endpoint_configs {
        add(
            config.ca_bundle.as_ref(),
            config.client_tls.as_ref(),
            config.authorization.as_ref(),
            config.basic_auth.as_ref(),
        );
    }
    found
}

/// The ServiceAccount the hub runs as, which credential Roles are bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceAccount {
    pub namespace: String,
    pub name: String,
}

impl std::str::FromStr for ServiceAccount {
    type Err = RbacError;

    /// `namespace/name`.
    fn from_str(text: &str) -> Result<Self, RbacError> {
        match text.split_once('/') {
            Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self { namespace: namespace.to_owned(), name: name.to_owned() })
            }
            _ => Err(RbacError::ServiceAccount(text.to_owned())),
        }
    }
}

/// For each namespace whose Secrets or ConfigMaps the controller's hook settings name, a Role
/// `<name>` granting read on exactly those objects, and a RoleBinding `<name>` of it to `hub`.
#[must_use]
pub fn credential_roles(controller: &ControllerObject, name: &str, hub: &ServiceAccount) -> Vec<(Role, RoleBinding)> {
    credential_objects(controller)
        .into_iter()
        .map(|(namespace, objects)| bound_role(name, &namespace, objects.rules(), hub))
        .collect()
}

/// For a hub limited to `namespaces` (`metahook rbac --namespaces`), what [`controller_rules`] grants,
/// as a Role `<name>` in each namespace with a RoleBinding `<name>` to `hub`, instead of a ClusterRole:
/// such a hub lists and watches the controller's types in those namespaces only
/// ([`crate::cache::informers`]), and a cluster that allows it no more can grant this.
#[must_use]
pub fn namespaced_roles(
    name: &str,
    rules: &[PolicyRule],
    namespaces: &[String],
    hub: &ServiceAccount,
) -> Vec<(Role, RoleBinding)> {
    namespaces.iter().map(|namespace| bound_role(name, namespace, rules.to_vec(), hub)).collect()
}

/// A Role `name` in `namespace` with `rules`, and a RoleBinding of the same name binding it to `hub`.
fn bound_role(name: &str, namespace: &str, rules: Vec<PolicyRule>, hub: &ServiceAccount) -> (Role, RoleBinding) {
    let metadata =
        ObjectMeta { name: Some(name.to_owned()), namespace: Some(namespace.to_owned()), ..ObjectMeta::default() };
    let role = Role { metadata: metadata.clone(), rules: Some(rules) };
    let binding = RoleBinding {
        metadata,
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: name.to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: hub.name.clone(),
            namespace: Some(hub.namespace.clone()),
            ..Subject::default()
        }]),
    };
    (role, binding)
}

/// A controller object, as `metahook rbac` reads them.
pub enum ControllerObject {
    Composite(Box<CompositeController>),
    Decorator(Box<DecoratorController>),
    Map(Box<MapController>),
}

impl ControllerObject {
    /// Its `relatedLimit` (a MapController has no customize hook).
    fn related_limit(&self) -> Option<&crate::api::RelatedLimit> {
        match self {
            Self::Composite(c) => c.spec.related_limit.as_ref(),
            Self::Decorator(d) => d.spec.related_limit.as_ref(),
            Self::Map(_) => None,
        }
    }

    fn name(&self) -> String {
        match self {
            Self::Composite(c) => c.metadata.name.clone(),
            Self::Decorator(d) => d.metadata.name.clone(),
            Self::Map(m) => m.metadata.name.clone(),
        }
        .unwrap_or_default()
    }
}

/// What one controller needs: its parent/target types read and patched (see `PARENT_PATCH`), their
/// status and finalizers written (and — with a finalize hook, or for a decorator's labels — the objects
/// updated), its child/attachment types managed, ControllerRevisions for rolling updates, and `related`
/// (`apiVersion`, `resource`) types read.
#[must_use]
pub fn controller_rules(controller: &ControllerObject, related: &[(String, String)]) -> Vec<PolicyRule> {
    let mut grants = Grants::default();
    let owner = |grants: &mut Grants, api_version: &str, resource: &str, writes: bool| {
        grants.add(
            api_version,
            resource,
            if writes { &["get", "list", "watch", "update", "patch"] } else { PARENT_PATCH },
        );
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
            if spec.child_resources.iter().any(crate::api::ChildResourceRule::cross_namespace) {
                // The parents' records of their children elsewhere (`crate::write::records`).
                grants.add(crate::api::OWN_GROUP_VERSION, "childrecords", MANAGE);
                // Records kept in Metacontroller's group by hubs before issue 66, moved from there
                // (`crate::write::record_migration`; goes with it).
                grants.add(crate::write::record_migration::OLD_GROUP_VERSION, "childrecords", MANAGE);
            }
            recreating(&mut grants, &spec.child_resources);
        }
        ControllerObject::Decorator(dc) => {
            // A decorator merges labels and annotations into its targets: always a write.
            for target in &dc.spec.resources {
                owner(&mut grants, &target.api_version, &target.resource, true);
            }
            for attachment in &dc.spec.attachments {
                grants.add(&attachment.api_version, &attachment.resource, MANAGE);
            }
            recreating(&mut grants, &dc.spec.attachments);
        }
        ControllerObject::Map(mc) => {
            // A MapController writes its parents' status; its inputs are only read.
            let spec = &mc.spec;
            let finalize = spec.hooks.finalize.is_some();
            owner(&mut grants, &spec.parent_resource.api_version, &spec.parent_resource.resource, finalize);
            for input in &spec.input_resources {
                grants.add(&input.api_version, &input.resource, READ);
            }
            let outputs: Vec<_> =
                spec.output_resources.iter().map(crate::api::OutputResourceRule::as_child_rule).collect();
            for output in &outputs {
                grants.add(&output.api_version, &output.resource, MANAGE);
            }
            recreating(&mut grants, &outputs);
        }
    }
    for (api_version, resource) in related {
        grants.add(api_version, resource, READ);
    }
    // The types a `relatedLimit` lists are all its customize hook's rules may select: read them.
    for related in controller.related_limit().and_then(|l| l.resources.as_ref()).into_iter().flatten() {
        grants.add(&related.api_version, &related.resource, READ);
    }
    let mut rules = grants.rules();
    rules.extend(parent_crd_rule(controller));
    rules
}

fn is_crd_rule(rule: &PolicyRule) -> bool {
    rule.resources.as_deref() == Some(&["customresourcedefinitions".to_owned()][..])
}

/// `get` on the CRDs of the controller's parent types, by name: when a release meets a parent type
/// whose CRD is deleted, the hub reads the CRD to know that every parent of it went, and deletes the
/// children the garbage collector may never see go ([`crate::controllers::release`]). `None` when no
/// parent type can be a CRD (a CRD's group has a dot; the built-in groups without one are not CRDs).
fn parent_crd_rule(controller: &ControllerObject) -> Option<PolicyRule> {
    let types: Vec<(&str, &str)> = match controller {
        ControllerObject::Composite(cc) => {
            vec![(cc.spec.parent_resource.api_version.as_str(), cc.spec.parent_resource.resource.as_str())]
        }
        ControllerObject::Decorator(dc) => {
            dc.spec.resources.iter().map(|r| (r.api_version.as_str(), r.resource.as_str())).collect()
        }
        ControllerObject::Map(mc) => {
            vec![(mc.spec.parent_resource.api_version.as_str(), mc.spec.parent_resource.resource.as_str())]
        }
    };
    let names: BTreeSet<String> =
        types.into_iter().filter_map(|(v, r)| crate::controllers::release::crd_name(v, r)).collect();
    (!names.is_empty()).then(|| PolicyRule {
        api_groups: Some(vec!["apiextensions.k8s.io".to_owned()]),
        resources: Some(vec!["customresourcedefinitions".to_owned()]),
        resource_names: Some(names.into_iter().collect()),
        verbs: vec!["get".to_owned()],
        ..PolicyRule::default()
    })
}

/// What whoever may create a controller's parents can make its customize hook read through the hub,
/// as a comment for `metahook rbac`'s output (`None`: no customize hook). `metahook rbac` reads no
/// cluster: the parents are taken to be namespaced, the wider reach under a v1 hook.
#[must_use]
pub fn related_note(controller: &ControllerObject) -> Option<String> {
    let version = match controller {
        ControllerObject::Composite(cc) => {
            let hooks = cc.spec.hooks.as_ref()?;
            hooks.customize.as_ref()?;
            crate::engine::related::related_version(hooks.sync.as_ref(), hooks.finalize.as_ref())
        }
        ControllerObject::Decorator(dc) => {
            let hooks = &dc.spec.hooks;
            hooks.customize.as_ref()?;
            crate::engine::related::related_version(hooks.sync.as_ref(), hooks.finalize.as_ref())
        }
        ControllerObject::Map(_) => return None,
    };
    let reach = crate::engine::related::Reach::of(version, true, controller.related_limit());
    let advice = if reach.unbounded() { "; declare spec.relatedLimit to bound it" } else { "" };
    Some(format!(
        "# {}: whoever may create a parent can make its customize hook read {reach} through the hub{advice}\n",
        controller.name()
    ))
}

/// With a child type that is recreated, the namespace's `ResourceQuota`s and `LimitRange`s are listed to
/// tell whether a replacement refused by a quota fits once the original is gone
/// ([`crate::write::quota`]).
fn recreating(grants: &mut Grants, rules: &[crate::api::ChildResourceRule]) {
    if rules.iter().any(|rule| rule.method().recreates()) {
        grants.add("v1", "resourcequotas", &["list"]);
        grants.add("v1", "limitranges", &["list"]);
    }
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

/// Every controller object in a multi-document YAML file, `-` for standard input. Other kinds are
/// skipped, so a whole example manifest can be passed; a `List` is read item by item, so can
/// `kubectl get compositecontrollers,decoratorcontrollers -o yaml` (a cluster's controllers, when switching
/// from Metacontroller).
pub fn read_controllers(path: &str) -> Result<Vec<ControllerObject>, RbacError> {
    let read = |source| RbacError::Read { path: path.to_owned(), source };
    let text = if path == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(read)?
    } else {
        std::fs::read_to_string(path).map_err(read)?
    };
    let docs: Vec<serde_json::Value> =
        yaml::from_documents(&text).map_err(|source| RbacError::Parse { path: path.to_owned(), source })?;
    let mut found = Vec::new();
    for value in docs {
        collect_controllers(value, &mut found)
            .map_err(|source| RbacError::Controller { path: path.to_owned(), source })?;
    }
    if found.is_empty() {
        return Err(RbacError::NoController { path: path.to_owned() });
    }
    Ok(found)
}

/// The controller objects in one YAML document: itself, or the items of a `List`.
fn collect_controllers(value: serde_json::Value, found: &mut Vec<ControllerObject>) -> Result<(), serde_json::Error> {
    match value.get("kind").and_then(serde_json::Value::as_str) {
        Some("CompositeController") => {
            found.push(ControllerObject::Composite(Box::new(serde_json::from_value(value)?)));
        }
        Some("DecoratorController") => {
            found.push(ControllerObject::Decorator(Box::new(serde_json::from_value(value)?)));
        }
        Some("MapController") => {
            found.push(ControllerObject::Map(Box::new(serde_json::from_value(value)?)));
        }
        Some(kind) if kind.ends_with("List") => {
            if let Some(serde_json::Value::Array(items)) = value.get("items") {
                for item in items.clone() {
                    collect_controllers(item, found)?;
                }
            }
        }
        _ => {}
    }
    Ok(())
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

/// What `metahook rbac` prints; `namespaces` empty: for a hub that watches the whole cluster.
#[derive(Clone, Debug, Default)]
pub struct RbacRequest {
    /// Controller files (`-f`).
    pub files: Vec<String>,
    /// Related types (`--related`, `apiVersion/resource`).
    pub related: Vec<String>,
    /// Print the hub's base ClusterRole too (`--base`).
    pub base: bool,
    /// The hub's ServiceAccount, which the RoleBindings name.
    pub hub: Option<ServiceAccount>,
    /// The namespaces a hub started with `--namespaces` is limited to (`--namespaces`).
    pub namespaces: Vec<String>,
}

/// `metahook rbac`: the YAML of, per controller in `files`, one aggregated ClusterRole — or, with
/// `namespaces`, a Role and a RoleBinding to the hub in each of them — and, per namespace its hook
/// credentials are in, a Role and a RoleBinding to the hub (with `base`, the hub's own base ClusterRole
/// first: its CRDs are cluster-scoped, discovery is no resource, and it records Events on controller
/// objects, which go to `default`; none of that can be a Role).
pub fn render(request: &RbacRequest) -> Result<String, RbacError> {
    let related = request.related.iter().map(|r| parse_related(r)).collect::<Result<Vec<_>, _>>()?;
    let default_hub = || DEFAULT_SERVICE_ACCOUNT.parse::<ServiceAccount>();
    let hub = match &request.hub {
        Some(hub) => hub.clone(),
        None => default_hub()?,
    };
    let mut docs = Vec::new();
    if request.base {
        docs.push(typed(&aggregated_role("metahook-base", base_rules())));
    }
    for file in &request.files {
        for controller in read_controllers(file)? {
            let name = format!("metahook-controller-{}", controller.name());
            let rules = controller_rules(&controller, &related);
            if request.namespaces.is_empty() {
                docs.push(typed(&aggregated_role(&name, rules)));
            } else {
                // A CRD is cluster-scoped, which a Role cannot grant, and a hub limited to namespaces
                // holds nothing cluster-wide but its base role: it leaves the children a deleted
                // parent CRD's objects leave to the garbage collector (its sweep says so in the log).
                let rules: Vec<_> = rules.into_iter().filter(|r| !is_crd_rule(r)).collect();
                for (role, binding) in namespaced_roles(&name, &rules, &request.namespaces, &hub) {
                    docs.push(typed(&role));
                    docs.push(typed(&binding));
                }
            }
            for (role, binding) in credential_roles(&controller, &format!("{name}-credentials"), &hub) {
                docs.push(typed(&role));
                docs.push(typed(&binding));
            }
        }
    }
    let docs: Vec<String> = docs.iter().map(|d| yaml::to_string(d).unwrap_or_default()).collect();
    let mut notes = String::new();
    for file in &request.files {
        for controller in read_controllers(file)? {
            notes.extend(related_note(&controller));
        }
    }
    Ok(notes + &docs.join("---\n"))
}

/// An object as YAML wants it: with apiVersion and kind (k8s-openapi's types leave them out).
fn typed<K: k8s_openapi::Resource + serde::Serialize>(object: &K) -> serde_json::Value {
    let mut value = serde_json::to_value(object).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.insert("apiVersion".into(), K::API_VERSION.into());
        map.insert("kind".into(), K::KIND.into());
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn composite(yaml: &str) -> ControllerObject {
        ControllerObject::Composite(Box::new(yaml::from_str(yaml).unwrap()))
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
    fn a_recreated_child_type_lets_the_hub_list_the_quotas_that_may_refuse_its_replacement() {
        let with = |method: &str| {
            composite(&format!(
                "metadata: {{name: web}}\nspec:\n  parentResource: {{apiVersion: example.com/v1, resource: webs}}\n  childResources:\n  - {{apiVersion: v1, resource: pods, updateStrategy: {{method: {method}}}}}\n  hooks: {{sync: {{webhook: {{url: 'http://h/sync'}}}}}}\n"
            ))
        };
        for method in ["Recreate", "RollingRecreate"] {
            let rules = controller_rules(&with(method), &[]);
            assert_eq!(verbs(&rules, "", "resourcequotas"), ["list"], "{method}");
            assert_eq!(verbs(&rules, "", "limitranges"), ["list"], "{method}");
        }
        assert!(verbs(&controller_rules(&with("InPlace"), &[]), "", "resourcequotas").is_empty());
    }

    #[test]
    fn a_composite_controller_gets_read_on_its_parent_and_full_verbs_on_its_children() {
        let cc = composite(
            "metadata: {name: web}\nspec:\n  parentResource: {apiVersion: example.com/v1, resource: webs}\n  childResources:\n  - {apiVersion: v1, resource: configmaps}\n  - {apiVersion: apps/v1, resource: deployments, updateStrategy: {method: RollingInPlace}}\n  hooks: {sync: {webhook: {url: 'http://h/sync'}}}\n",
        );
        let rules = controller_rules(&cc, &[("v1".into(), "secrets".into())]);
        assert_eq!(
            verbs(&rules, "example.com", "webs"),
            ["get", "list", "watch", "patch"],
            "no finalize hook: only patches (a status without a subresource, a finalizer, the orphan record)"
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
        // `patch`: the hub's finalizer on the controller object (issue 61 item 5).
        assert_eq!(verbs(&rules, "metacontroller.k8s.io", "compositecontrollers"), ["get", "list", "watch", "patch"]);
        assert_eq!(verbs(&rules, "metacontroller.k8s.io", "decoratorcontrollers/status"), ["get", "update", "patch"]);
        assert_eq!(verbs(&rules, "events.k8s.io", "events"), ["create", "patch"]);
        assert_eq!(verbs(&rules, "authentication.k8s.io", "tokenreviews"), ["create"], "metricsAuth: kubernetes");
        assert_eq!(verbs(&rules, "authorization.k8s.io", "subjectaccessreviews"), ["create"]);
        assert!(rules.iter().all(|r| !r.verbs.contains(&"*".to_owned())));
        assert!(rules.iter().flat_map(|r| r.resources.iter().flatten()).all(|r| r != "*"));
    }

    fn names(rules: &[PolicyRule], resource: &str) -> Vec<String> {
        let rule = rules.iter().find(|r| r.resources.as_deref() == Some(&[resource.to_owned()]));
        let rule = rule.unwrap_or_else(|| panic!("no rule for {resource}: {rules:?}"));
        assert_eq!(rule.api_groups.as_deref(), Some(&[String::new()][..]));
        assert_eq!(rule.verbs, ["get", "list", "watch"]);
        rule.resource_names.clone().unwrap_or_default()
    }

    fn hub() -> ServiceAccount {
        "metahook/hub".parse().unwrap()
    }

    #[test]
    fn a_parent_types_crd_is_readable_by_name_only_and_a_built_in_parent_type_asks_for_none() {
        let cc =
            composite("metadata: {name: web}\nspec:\n  parentResource: {apiVersion: example.com/v1, resource: webs}\n");
        let rules = controller_rules(&cc, &[]);
        let crd = rules.iter().find(|r| r.resources.as_deref() == Some(&["customresourcedefinitions".to_owned()][..]));
        let crd = crd.unwrap_or_else(|| panic!("no rule for the parent's CRD: {rules:?}"));
        assert_eq!(crd.api_groups.as_deref(), Some(&["apiextensions.k8s.io".to_owned()][..]));
        assert_eq!(crd.resource_names.as_deref(), Some(&["webs.example.com".to_owned()][..]));
        assert_eq!(crd.verbs, ["get"]);
        for parent in ["v1, resource: configmaps", "apps/v1, resource: statefulsets"] {
            let cc = composite(&format!("metadata: {{name: c}}\nspec:\n  parentResource: {{apiVersion: {parent}}}\n"));
            let rules = controller_rules(&cc, &[]);
            assert!(
                rules.iter().all(|r| r.api_groups.as_deref() != Some(&["apiextensions.k8s.io".to_owned()][..])),
                "{rules:?}"
            );
        }
    }

    #[test]
    fn hook_credentials_are_granted_by_name_in_each_namespace_and_bound_to_the_hub() {
        let cc = composite(
            r"
metadata: {name: web}
spec:
  parentResource: {apiVersion: example.com/v1, resource: webs}
  endpointConfigs:
  - host: other.example.com
    basicAuth: {secretRef: {name: basic, namespace: ops}}
    caBundle: {configMapRef: {name: ca-bundle, namespace: ops}}
  hooks:
    sync:
      webhook:
        url: https://hooks.example.com/sync
        caBundle: {secretRef: {name: hook-ca, namespace: hooks}}
        clientTLS: {secretRef: {name: hub-cert, namespace: hooks}}
    customize:
      webhook:
        url: https://hooks.example.com/customize
        authorization: {secretRef: {name: token, namespace: ops, key: token}}
    preUpdateChild:
      webhook: {url: 'https://x', authorization: {secretRef: {name: never-called, namespace: ops, key: k}}}
",
        );
        let roles = credential_roles(&cc, "metahook-controller-web-credentials", &hub());
        let namespaces: Vec<_> = roles.iter().map(|(role, _)| role.metadata.namespace.clone().unwrap()).collect();
        assert_eq!(namespaces, ["hooks", "ops"]);
        for (role, binding) in &roles {
            assert_eq!(role.metadata.name.as_deref(), Some("metahook-controller-web-credentials"));
            assert_eq!(binding.metadata, role.metadata, "the binding sits beside its Role");
            assert_eq!(
                (binding.role_ref.kind.as_str(), binding.role_ref.name.as_str()),
                ("Role", "metahook-controller-web-credentials")
            );
            let subject = &binding.subjects.as_ref().unwrap()[0];
            assert_eq!(
                (subject.kind.as_str(), subject.name.as_str(), subject.namespace.as_deref()),
                ("ServiceAccount", "hub", Some("metahook"))
            );
        }
        let hooks = roles[0].0.rules.as_ref().unwrap();
        assert_eq!(hooks.len(), 1, "no ConfigMaps named in hooks: {hooks:?}");
        assert_eq!(names(hooks, "secrets"), ["hook-ca", "hub-cert"]);
        let ops = roles[1].0.rules.as_ref().unwrap();
        assert_eq!(
            names(ops, "secrets"),
            ["basic", "token"],
            "an endpointConfig counts; preUpdateChild is never called"
        );
        assert_eq!(names(ops, "configmaps"), ["ca-bundle"]);
    }

    #[test]
    fn a_decorators_hook_credentials_are_granted_too_and_an_inline_ca_names_nothing() {
        let dc = ControllerObject::Decorator(Box::new(
            yaml::from_str(
                r"
metadata: {name: labeller}
spec:
  resources: [{apiVersion: v1, resource: configmaps}]
  hooks:
    sync:
      webhook:
        url: https://h/sync
        caBundle: {inline: pem}
    finalize:
      webhook:
        url: https://h/finalize
        basicAuth: {secretRef: {name: finalizer-login, namespace: ops}}
",
            )
            .unwrap(),
        ));
        let roles = credential_roles(&dc, "r", &hub());
        assert_eq!(roles.len(), 1);
        assert_eq!(names(roles[0].0.rules.as_ref().unwrap(), "secrets"), ["finalizer-login"]);
        let plain = composite(
            "metadata: {name: web}\nspec:\n  parentResource: {apiVersion: v1, resource: namespaces}\n  hooks: {sync: {webhook: {url: 'http://h/s', caBundle: {inline: pem}}}}\n",
        );
        assert!(credential_roles(&plain, "r", &hub()).is_empty(), "nothing to read, no Role");
    }

    #[test]
    fn rbac_prints_the_credential_roles_after_the_controllers_cluster_role() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("controller.yaml");
        std::fs::write(
            &file,
            "kind: CompositeController\nmetadata: {name: web}\nspec:\n  parentResource: {apiVersion: v1, resource: namespaces}\n  hooks: {sync: {webhook: {url: 'https://h/s', clientTLS: {secretRef: {name: cert, namespace: ops}}}}}\n",
        )
        .unwrap();
        let request = RbacRequest {
            files: vec![file.display().to_string()],
            base: true,
            hub: Some(hub()),
            ..RbacRequest::default()
        };
        let yaml = render(&request).unwrap();
        let docs: Vec<serde_json::Value> = yaml::from_documents(&yaml).unwrap();
        let kinds: Vec<_> = docs
            .iter()
            .map(|d| format!("{} {}", d["kind"].as_str().unwrap(), d["metadata"]["name"].as_str().unwrap()))
            .collect();
        assert_eq!(
            kinds,
            [
                "ClusterRole metahook-base",
                "ClusterRole metahook-controller-web",
                "Role metahook-controller-web-credentials",
                "RoleBinding metahook-controller-web-credentials"
            ]
        );
        assert!(docs.iter().all(|d| d["apiVersion"] == "rbac.authorization.k8s.io/v1"));
    }

    #[test]
    fn with_namespaces_a_controller_gets_a_bound_role_in_each_and_no_cluster_role() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("controller.yaml");
        std::fs::write(
            &file,
            "kind: CompositeController\nmetadata: {name: web}\nspec:\n  parentResource: {apiVersion: example.com/v1, resource: webs}\n  childResources: [{apiVersion: v1, resource: configmaps}]\n  hooks: {sync: {webhook: {url: 'https://h/s'}}}\n",
        )
        .unwrap();
        let request = RbacRequest {
            files: vec![file.display().to_string()],
            base: true,
            hub: Some(hub()),
            namespaces: vec!["a".into(), "b".into()],
            ..RbacRequest::default()
        };
        let yaml = render(&request).unwrap();
        let docs: Vec<serde_json::Value> = yaml::from_documents(&yaml).unwrap();
        let kinds: Vec<String> = docs
            .iter()
            .map(|d| {
                let ns = d["metadata"]["namespace"].as_str().map(|ns| format!(" in {ns}")).unwrap_or_default();
                format!("{} {}{ns}", d["kind"].as_str().unwrap(), d["metadata"]["name"].as_str().unwrap())
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "ClusterRole metahook-base",
                "Role metahook-controller-web in a",
                "RoleBinding metahook-controller-web in a",
                "Role metahook-controller-web in b",
                "RoleBinding metahook-controller-web in b",
            ],
            "only the base (CRDs, discovery, Events) stays cluster-wide"
        );
        let rules: Vec<PolicyRule> = serde_json::from_value(docs[1]["rules"].clone()).unwrap();
        assert_eq!(verbs(&rules, "example.com", "webs"), PARENT_PATCH);
        assert_eq!(verbs(&rules, "", "configmaps"), MANAGE);
        assert_eq!(
            docs[2]["roleRef"],
            serde_json::json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "metahook-controller-web"})
        );
        assert_eq!(docs[2]["subjects"][0]["name"], "hub");
    }

    #[test]
    fn controllers_are_read_from_a_list_as_kubectl_get_prints_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("controllers.yaml");
        std::fs::write(
            &file,
            r"
apiVersion: v1
kind: List
items:
- apiVersion: metacontroller.k8s.io/v1alpha1
  kind: CompositeController
  metadata: {name: web, uid: u-1}
  spec: {parentResource: {apiVersion: v1, resource: namespaces}}
  status: {conditions: [{type: Ready, status: 'True', reason: Running, message: '', lastTransitionTime: '2026-01-01T00:00:00Z'}]}
- apiVersion: metacontroller.k8s.io/v1alpha1
  kind: DecoratorController
  metadata: {name: labeller}
  spec: {resources: [{apiVersion: v1, resource: configmaps}], hooks: {}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: skipped}
",
        )
        .unwrap();
        let names: Vec<String> =
            read_controllers(file.to_str().unwrap()).unwrap().iter().map(ControllerObject::name).collect();
        assert_eq!(names, ["web", "labeller"]);
        std::fs::write(&file, "apiVersion: v1\nkind: List\nitems: []\n").unwrap();
        assert!(matches!(read_controllers(file.to_str().unwrap()), Err(RbacError::NoController { .. })));
    }

    #[test]
    fn the_service_account_is_namespace_slash_name() {
        assert_eq!(
            DEFAULT_SERVICE_ACCOUNT.parse::<ServiceAccount>().unwrap(),
            ServiceAccount { namespace: "metahook".into(), name: "metahook".into() }
        );
        for bad in ["metahook", "/metahook", "metahook/", "a/b/c"] {
            assert!(bad.parse::<ServiceAccount>().is_err(), "{bad}");
        }
    }

    #[test]
    fn related_types_must_name_an_api_version_and_a_resource() {
        assert_eq!(parse_related("apps/v1/deployments").unwrap(), ("apps/v1".into(), "deployments".into()));
        assert!(parse_related("configmaps").is_err());
    }
}
