//! The tenant promises as a class (issue 61): a seeded random run of what tenants and operators do, on
//! the real control plane, with invariants checked after every step.
//!
//! The hub runs as its own process (killed with SIGKILL and started again at random), as a
//! ServiceAccount whose every request the API server's audit log records, under exactly the roles
//! `metahook rbac` prints. It runs three controllers: `x`, a CompositeController whose ConfigMap
//! children are `crossNamespace` (a platform parent's hook spreads a copy into every tenant namespace;
//! a tenant's parent keeps its children at home), with a finalize hook and a safe-delete guard; `d`, a
//! DecoratorController read from a controllers file (emptied and restored at random); and `m`, a
//! MapController (ConfigMap inputs, copied). Three tenants, each a ServiceAccount bound to a Role in
//! its own namespace, create, change and delete parents (background, foreground, `--cascade=orphan`)
//! and map inputs; make decoys that copy other parents' UIDs into their labels, some with finalizers
//! of their own; take their copy of a platform child away, or hold it with a finalizer, or hold it and
//! delete it with `controller-uid` taken off (issue 67: the parent's elsewhere, neither selected nor
//! free). The hostile grammar (issue 67): parents whose specs make the hook echo keys from a hostile
//! alphabet (`): `, `.`, `/`, `~`, quotes, brackets, a newline, unicode, 300 characters, other parents'
//! UIDs) into their children as fields the type does not declare, and the annotations the hub reads
//! set to such values on every kind of object a tenant may write. Operators change and delete platform
//! parents, kill the hub, delete and re-apply the controller, and edit it (issue 66: a child type
//! added and taken back, its sync hook moved, a `relatedLimit` added — with the hub up or down).
//!
//! After each step, within a bound:
//! - the hub wrote (or deleted) nothing in a tenant's namespace but what belongs to a parent there, a
//!   platform parent's copy there (the controller's `crossNamespace` opt-in), and the tenant's objects
//!   its decorator selects — never a decoy (the audit log says who wrote what);
//! - every deleted parent is gone, whatever a tenant did;
//! - every parent's children match its spec, whatever another tenant did;
//! - nothing is lost or kept against the delete's options: orphaned children stay, others go;
//! - the controller's `status.finalizedTypes` names its one parent type, whatever was edited;
//! - after a tenant's move, no ConfigMap outside that tenant's namespace differs (labels, annotations,
//!   data, owners, finalizers, deletion) from what it was before the move: one tenant's moves change
//!   nothing the hub does for anyone else.
//!
//! `make test` runs a short fixed seed; `make chaos SEED=… STEPS=…` runs long ones (`TENANT_SEED`,
//! `TENANT_STEPS`). A failure names the seed and the step.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PropagationPolicy};
use serde_json::{Value, json};
use support::{AUDITED_NAMESPACE, HookServer, HubAccount, HubProcess, Tenant, TestNamespace, api, apply_value};

const TENANTS: usize = 3;
/// How long a step's consequences may take: far above what the hub needs, far below a stuck parent.
const BOUND: Duration = Duration::from_secs(40);
const PARENT_UID: &str = "metahook.dev/parent-uid";
const PARENT: &str = "metahook.dev/parent";
const HOLD: &str = "tenant.example/hold";
/// Keys and values a tenant may write that a parser of paths, selectors or names could take for
/// something else.
const HOSTILE: &[&str] =
    &["x): .data", ".data", "data.v", "a/b", "~1", "\"quoted\"", "[0]", "{}", "line\nbreak", "ünïcödé ✓", "orphan", ""];
/// The annotations the hub writes or reads, which a tenant may set on its own objects.
const HUB_ANNOTATIONS: &[&str] = &[
    "metahook.dev/applied",
    "metahook.dev/parent",
    "metahook.dev/cascade",
    "metahook.dev/confirm-deletions",
    "metahook.dev/sync-requested-at",
    "metahook.dev/map-input",
    "metacontroller.k8s.io/decorator-controller",
    "metacontroller.k8s.io/last-applied-configuration",
];

/// `xsync`: `spec.n` ConfigMaps `<parent>-c<i>` at home with `data.v = spec.v`; a parent in the platform
/// namespace also a copy `<parent>-team` in each tenant namespace (the hook decides where, from its
/// own list: the controller's opt-in). `xfinalize` lets go at once. `dsync` labels its targets. `map`
/// copies an input.
const HOOKS: &str = r#"
TENANTS = __TENANTS__
PLATFORM = "__PLATFORM__"

def xsync(request):
    parent = request["parent"]
    spec = parent.get("spec") or {}
    v = str(spec.get("v", 0))
    name = parent["metadata"]["name"]
    # A tenant's fields echoed into its children as top-level fields a ConfigMap does not declare.
    extra = spec.get("extra") or {}
    children = [dict(extra, apiVersion="v1", kind="ConfigMap", metadata={"name": f"{name}-c{i}"}, data={"v": v})
                for i in range(int(spec.get("n", 1)))]
    if parent["metadata"].get("namespace") == PLATFORM:
        for ns in TENANTS:
            children.append({"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": f"{name}-team", "namespace": ns}, "data": {"v": v}})
    return {"children": children, "status": {"v": v}}

def xfinalize(request):
    return {"children": [], "finalized": True}

# The operator's hook edit: the same answers at another path.
xsync2 = xsync

def dsync(request):
    return {"labels": {"decorated": "yes"}}

def map(request):
    cm = request["input"]
    return {"outputs": [{"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": cm["metadata"]["name"] + "-copy"}, "data": cm.get("data") or {}}]}
"#;

/// `value` as one YAML document.
fn yaml_doc(value: &Value) -> String {
    metahook::ops::yaml::to_string(value).unwrap()
}

/// A small seeded generator (xorshift64*): the same seed makes the same run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap()
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// A parent of `x` as the test made it.
#[derive(Clone, Debug)]
struct XParent {
    v: u32,
    n: u32,
}

/// What a parent being deleted must end as.
#[derive(Clone, Debug)]
struct Deleting {
    namespace: String,
    name: String,
    orphan: bool,
    /// Its children when it was deleted (namespace, name), for what the delete's options keep or take.
    children: Vec<(String, String)>,
    /// The `data.v` they held.
    v: u32,
}

/// What the test expects the cluster to hold.
#[derive(Default)]
struct Model {
    /// Live `x` parents by (namespace, name).
    parents: BTreeMap<(String, String), XParent>,
    deleting: Vec<Deleting>,
    /// Children kept by an orphaning delete, with the `data.v` they held: they must stay as they are,
    /// the user's now. A parent made again under the same name does not take them over by name: the
    /// hub refuses its writes in that namespace, and its children there are not expected.
    kept: BTreeMap<(String, String), String>,
    /// Platform copies a tenant took away (label removed) or holds with a finalizer.
    taken: BTreeSet<(String, String)>,
    held: BTreeSet<(String, String)>,
    /// Decoys and the tenants' own (decorated) objects, which nothing but their tenant may write.
    decoys: BTreeSet<(String, String)>,
    own: BTreeSet<(String, String)>,
    /// Map inputs by (namespace, name): their `data.v`; the namespaces with a map parent.
    inputs: BTreeMap<(String, String), u32>,
    map_parents: BTreeSet<String>,
    /// The `x` controller was deleted: once it is gone, its parents must be free of its finalizer, and
    /// it is applied again.
    controller_deleted: bool,
}

/// What a step was, for the invariant of the tenants' moves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Actor {
    /// Tenant `t` moved: nothing outside its namespace may change because of it.
    Tenant(usize),
    /// The operator, or a kill of the hub around a step.
    Operator,
}

/// The run: clients, namespaces, hub, controllers.
struct Chaos {
    admin: kube::Client,
    label: String,
    platform: TestNamespace,
    tenants: Vec<Tenant>,
    hook: HookServer,
    account: HubAccount,
    hub: Option<HubProcess>,
    kubeconfig: std::path::PathBuf,
    dir: tempfile::TempDir,
    controllers_file: std::path::PathBuf,
    model: Model,
    /// Audit records of the hub already checked.
    audited: usize,
    /// Who made the current step's move.
    actor: Actor,
    seed: u64,
    step: usize,
    /// The operator's edits of `x` in force: a child type added (Secrets, which its hook never asks
    /// for), its sync hook moved to another path answering the same, a `relatedLimit` added.
    x_edits: [bool; 3],
}

impl Chaos {
    fn x_controller(&self) -> Value {
        self.x_controller_with(self.x_edits)
    }

    fn x_controller_with(&self, edits: [bool; 3]) -> Value {
        let mut x = json!({"apiVersion": support::CONTROLLERS, "kind": "CompositeController",
               "metadata": {"name": format!("{}-x", self.label), "labels": {"metahook-test": self.label},
                            "annotations": {"metahook.dev/max-deletions-per-sync": "2"}},
               "spec": {
                   "generateSelector": true,
                   "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things",
                                      "labelSelector": {"matchLabels": {"metahook-test": self.label, "role": "x"}}},
                   "childResources": [{"apiVersion": "v1", "resource": "configmaps", "crossNamespace": true,
                                       "updateStrategy": {"method": "InPlace"}}],
                   "hooks": {"sync": {"webhook": {"url": self.hook.url("/xsync")}},
                             "finalize": {"webhook": {"url": self.hook.url("/xfinalize")}}}}});
        if edits[0] {
            x["spec"]["childResources"]
                .as_array_mut()
                .unwrap()
                .push(json!({"apiVersion": "v1", "resource": "secrets", "updateStrategy": {"method": "InPlace"}}));
        }
        if edits[1] {
            x["spec"]["hooks"]["sync"] = json!({"webhook": {"url": self.hook.url("/xsync2")}});
        }
        if edits[2] {
            x["spec"]["relatedLimit"] = json!({"namespaces": [], "resources": []});
        }
        x
    }

    fn d_controller(&self) -> Value {
        json!({"apiVersion": support::CONTROLLERS, "kind": "DecoratorController",
               "metadata": {"name": format!("{}-d", self.label)},
               "spec": {
                   "resources": [{"apiVersion": "v1", "resource": "configmaps",
                                  "labelSelector": {"matchLabels": {"decorate": self.label.as_str()}}}],
                   "hooks": {"sync": {"webhook": {"url": self.hook.url("/dsync")}}}}})
    }

    fn m_controller(&self) -> Value {
        json!({"apiVersion": support::CONTROLLERS, "kind": "MapController",
               "metadata": {"name": format!("{}-m", self.label), "labels": {"metahook-test": self.label}},
               "spec": {
                   "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things",
                                      "labelSelector": {"matchLabels": {"metahook-test": self.label, "role": "map"}}},
                   "inputResources": [{"apiVersion": "v1", "resource": "configmaps"}],
                   "outputResources": [{"apiVersion": "v1", "resource": "configmaps",
                                        "updateStrategy": {"method": "InPlace"}}],
                   "hooks": {"map": {"webhook": {"url": self.hook.url("/map")}}}}})
    }

    fn start_hub(&mut self) {
        let more = format!("controllersFrom:\n- {}\n", self.controllers_file.display());
        self.hub = Some(HubProcess::start_as(&self.label, &more, &[], &self.kubeconfig, &[]));
    }

    fn fail(&self, what: &str) -> ! {
        let log = self.hub.as_ref().and_then(|h| std::fs::read_to_string(&h.log).ok()).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        panic!(
            "tenant chaos, seed {} step {}: {what}\n(run again: make chaos SEED={} STEPS={})\nhub log, last lines:\n{}",
            self.seed,
            self.step,
            self.seed,
            self.step + 1,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }

    fn tenant_ns(&self, t: usize) -> String {
        self.tenants[t].namespace.name.clone()
    }

    async fn things(&self, namespace: &str) -> kube::Api<DynamicObject> {
        api(&self.admin, "test.metahook.dev/v1", "Thing", Some(namespace)).await
    }

    async fn config_maps(&self, namespace: &str) -> kube::Api<DynamicObject> {
        api(&self.admin, "v1", "ConfigMap", Some(namespace)).await
    }

    /// An `x` parent created or changed by whoever `client` is (a tenant, or the platform's admin).
    async fn upsert_parent(&mut self, client: &kube::Client, namespace: &str, name: &str, v: u32, n: u32) {
        self.upsert_parent_with(client, (namespace, name), (v, n), json!({})).await;
    }

    /// [`Chaos::upsert_parent`] with `extra`, fields its hook echoes into its children.
    async fn upsert_parent_with(&mut self, client: &kube::Client, at: (&str, &str), vn: (u32, u32), extra: Value) {
        let ((namespace, name), (v, n)) = (at, vn);
        let thing = json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing",
                           "metadata": {"name": name, "namespace": namespace,
                                        "labels": {"metahook-test": self.label, "role": "x"}},
                           "spec": {"v": v, "n": n, "extra": extra}});
        let things = api(client, "test.metahook.dev/v1", "Thing", Some(namespace)).await;
        match things.patch(name, &PatchParams::apply("chaos").force(), &Patch::Apply(&thing)).await {
            Ok(_) => {
                self.model.parents.insert((namespace.to_owned(), name.to_owned()), XParent { v, n });
            }
            // Still being deleted: the next step may take it again.
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 422 => {}
            Err(e) => self.fail(&format!("writing parent {namespace}/{name}: {e}")),
        }
    }

    /// The children `x` makes for a parent, (namespace, name).
    fn children_of(&self, namespace: &str, name: &str, parent: &XParent) -> Vec<(String, String)> {
        let mut children: Vec<(String, String)> =
            (0..parent.n).map(|i| (namespace.to_owned(), format!("{name}-c{i}"))).collect();
        if namespace == self.platform.name {
            children.extend((0..TENANTS).map(|t| (self.tenant_ns(t), format!("{name}-team"))));
        }
        children
    }

    /// The children of a parent the hub is expected to write: not those in a namespace where one of its
    /// children's names is taken by an object an orphaning delete left (the user's, not taken over by
    /// name: that namespace's writes are refused, whole).
    fn expected_children(&self, namespace: &str, name: &str, parent: &XParent) -> Vec<(String, String)> {
        let children = self.children_of(namespace, name, parent);
        let blocked: BTreeSet<String> =
            children.iter().filter(|c| self.model.kept.contains_key(*c)).map(|(ns, _)| ns.clone()).collect();
        children.into_iter().filter(|(ns, _)| !blocked.contains(ns)).collect()
    }

    async fn delete_parent(&mut self, client: &kube::Client, namespace: &str, name: &str, how: PropagationPolicy) {
        let key = (namespace.to_owned(), name.to_owned());
        let Some(parent) = self.model.parents.remove(&key) else { return };
        let things = api(client, "test.metahook.dev/v1", "Thing", Some(namespace)).await;
        let orphan = matches!(how, PropagationPolicy::Orphan);
        let params = DeleteParams { propagation_policy: Some(how), ..DeleteParams::default() };
        if let Err(e) = things.delete(name, &params).await {
            self.fail(&format!("deleting parent {namespace}/{name}: {e}"));
        }
        let children = self.expected_children(namespace, name, &parent);
        self.model.deleting.push(Deleting {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            orphan,
            children,
            v: parent.v,
        });
    }

    /// A key or value from the hostile alphabet, 300 characters of it, or another parent's UID or name.
    async fn hostile(&self, rng: &mut Rng) -> String {
        match rng.below(4) {
            0 => "k): .data/~[\"\n".repeat(30),
            1 => {
                let live: Vec<&(String, String)> = self.model.parents.keys().collect();
                if live.is_empty() {
                    return HOSTILE[0].to_owned();
                }
                let (pns, pname) = live[rng.below(live.len())].clone();
                match self.things(&pns).await.get_opt(&pname).await.unwrap() {
                    Some(p) if rng.chance(50) => p.metadata.uid.unwrap_or_default(),
                    _ => format!("{pns}/{pname}"),
                }
            }
            _ => HOSTILE[rng.below(HOSTILE.len())].to_owned(),
        }
    }

    /// Every ConfigMap of the run's namespaces, what the hub could change of it, by (namespace, name).
    async fn snapshot(&self) -> BTreeMap<(String, String), Value> {
        let mut all = BTreeMap::new();
        let namespaces = std::iter::once(self.platform.name.clone()).chain((0..TENANTS).map(|t| self.tenant_ns(t)));
        for ns in namespaces {
            for cm in self.config_maps(&ns).await.list(&ListParams::default()).await.unwrap().items {
                let m = &cm.metadata;
                let owners: Vec<&str> = m.owner_references.iter().flatten().map(|r| r.uid.as_str()).collect();
                let content = json!({"labels": m.labels, "annotations": m.annotations, "data": cm.data.get("data"),
                                     "owners": owners, "finalizers": m.finalizers,
                                     "deleting": m.deletion_timestamp.is_some()});
                all.insert((ns.clone(), m.name.clone().unwrap_or_default()), content);
            }
        }
        all
    }

    /// After tenant `t`'s move (`said`): every ConfigMap outside its namespace is as it was `before` the
    /// move (one that was being deleted may have gone), within [`BOUND`].
    async fn unchanged_elsewhere(&self, t: usize, before: &BTreeMap<(String, String), Value>, said: &str) {
        let own = self.tenant_ns(t);
        let start = Instant::now();
        loop {
            let now = self.snapshot().await;
            let changed: Vec<String> = before
                .iter()
                .filter(|((ns, _), _)| *ns != own)
                .filter_map(|(key, was)| match now.get(key) {
                    Some(is) if is == was => None,
                    None if was["deleting"] == true => None,
                    is => Some(format!("{}/{}: {was} -> {}", key.0, key.1, is.map_or("gone".into(), Value::to_string))),
                })
                .chain(
                    now.keys()
                        .filter(|key| key.0 != own && !before.contains_key(*key))
                        .map(|(ns, name)| format!("{ns}/{name}: appeared")),
                )
                .collect();
            if changed.is_empty() {
                return;
            }
            if start.elapsed() > BOUND {
                self.fail(&format!(
                    "after \"{said}\", a move of tenant {t}'s, outside its namespace: {}",
                    changed.join("; ")
                ));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// The name of the tenant's copy (`<parent>-team`) of a platform parent picked at random, if there
    /// is a platform parent.
    fn platform_copy(&self, rng: &mut Rng) -> Option<String> {
        let platform: Vec<&String> =
            self.model.parents.keys().filter(|(n, _)| *n == self.platform.name).map(|(_, p)| p).collect();
        (!platform.is_empty()).then(|| format!("{}-team", platform[rng.below(platform.len())]))
    }

    /// Deletes the parent `namespace/name` with a propagation picked at random; says so, as `doing`
    /// ("tenant 1 deletes parent") with the parent's name and the propagation.
    async fn delete_parent_at_random(
        &mut self,
        rng: &mut Rng,
        client: &kube::Client,
        (namespace, name): (&str, &str),
        doing: &str,
    ) -> String {
        let how = [PropagationPolicy::Background, PropagationPolicy::Foreground, PropagationPolicy::Orphan]
            [rng.below(3)]
        .clone();
        let said = format!("{doing} {name} ({how:?})");
        self.delete_parent(client, namespace, name, how).await;
        said
    }

    /// One random step.
    #[allow(clippy::too_many_lines)]
    async fn step(&mut self, rng: &mut Rng) -> String {
        let t = rng.below(TENANTS);
        let ns = self.tenant_ns(t);
        let tenant_client = self.tenants[t].client.clone();
        self.actor = Actor::Tenant(t);
        match rng.below(20) {
            0..=2 => {
                let name = format!("t{t}-x{}", rng.below(3));
                let (v, n) = (u32::try_from(rng.below(100)).unwrap(), u32::try_from(1 + rng.below(3)).unwrap());
                self.upsert_parent(&tenant_client, &ns, &name, v, n).await;
                format!("tenant {t} writes parent {name} (v {v}, n {n})")
            }
            3 => {
                let name = format!("t{t}-x{}", rng.below(3));
                self.delete_parent_at_random(rng, &tenant_client, (&ns, &name), &format!("tenant {t} deletes parent"))
                    .await
            }
            4 | 5 => {
                // A decoy: one of the tenant's ConfigMaps claiming to be another parent's child.
                // Of a parent in another namespace: one of its own namespace is its own business.
                let live: Vec<(String, String)> =
                    self.model.parents.keys().filter(|(n, _)| *n != ns).cloned().collect();
                if live.is_empty() {
                    return "no parent to make a decoy of".into();
                }
                let (pns, pname) = live[rng.below(live.len())].clone();
                let Ok(parent) = self.things(&pns).await.get(&pname).await else { return "parent gone".into() };
                let uid = parent.metadata.uid.clone().unwrap_or_default();
                let name = format!("decoy-{}", rng.below(1000));
                let finalizers: Vec<&str> = if rng.chance(50) { vec![HOLD] } else { vec![] };
                let decoy = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": ns,
                                 "labels": {PARENT_UID: uid, "controller-uid": uid},
                                 "annotations": {PARENT: format!("{pns}/{pname}")}, "finalizers": finalizers},
                    "data": {"v": "decoy"}});
                let cms = api(&tenant_client, "v1", "ConfigMap", Some(&ns)).await;
                match cms.patch(&name, &PatchParams::apply("chaos").force(), &Patch::Apply(&decoy)).await {
                    Ok(_) => {
                        self.model.decoys.insert((ns.clone(), name.clone()));
                    }
                    Err(e) => self.fail(&format!("tenant {t} making decoy {name}: {e}")),
                }
                format!("tenant {t} makes decoy {name} of {pns}/{pname}")
            }
            6 => {
                // Take the copy of a platform parent away, or hold it with a finalizer.
                let Some(name) = self.platform_copy(rng) else {
                    return "no platform parent".into();
                };
                let cms = api(&tenant_client, "v1", "ConfigMap", Some(&ns)).await;
                let hold = rng.chance(50);
                let patch = if hold {
                    json!({"metadata": {"finalizers": [HOLD]}})
                } else {
                    json!({"metadata": {"labels": {PARENT_UID: null}}})
                };
                match cms.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) if hold => {
                        self.model.held.insert((ns.clone(), name.clone()));
                    }
                    Ok(_) => {
                        self.model.taken.insert((ns.clone(), name.clone()));
                    }
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => self.fail(&format!("tenant {t} taking {name}: {e}")),
                }
                format!("tenant {t} {} {name}", if hold { "holds" } else { "takes away" })
            }
            7 | 8 => {
                // Map inputs, and the tenant's map parent.
                let cms = api(&tenant_client, "v1", "ConfigMap", Some(&ns)).await;
                let name = format!("t{t}-in{}", rng.below(4));
                if !self.model.map_parents.contains(&ns) {
                    let parent = json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing",
                        "metadata": {"name": format!("t{t}-m"), "namespace": ns,
                                     "labels": {"metahook-test": self.label, "role": "map"}},
                        "spec": {"selector": {"matchLabels": {"role": "input"}}}});
                    let things = api(&tenant_client, "test.metahook.dev/v1", "Thing", Some(&ns)).await;
                    if let Err(e) =
                        things.patch(&format!("t{t}-m"), &PatchParams::apply("chaos"), &Patch::Apply(&parent)).await
                    {
                        self.fail(&format!("tenant {t} making its map parent: {e}"));
                    }
                    self.model.map_parents.insert(ns.clone());
                }
                let key = (ns.clone(), name.clone());
                if self.model.inputs.contains_key(&key) && rng.chance(30) {
                    if let Err(e) = cms.delete(&name, &DeleteParams::default()).await {
                        self.fail(&format!("tenant {t} deleting input {name}: {e}"));
                    }
                    self.model.inputs.remove(&key);
                    return format!("tenant {t} deletes input {name}");
                }
                let v = u32::try_from(rng.below(100)).unwrap();
                let input = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": ns, "labels": {"role": "input"}}, "data": {"v": v.to_string()}});
                if let Err(e) = cms.patch(&name, &PatchParams::apply("chaos").force(), &Patch::Apply(&input)).await {
                    self.fail(&format!("tenant {t} writing input {name}: {e}"));
                }
                self.model.inputs.insert(key, v);
                format!("tenant {t} writes input {name} (v {v})")
            }
            9 => {
                let name = format!("own-{}", rng.below(3));
                let own = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": ns, "labels": {"decorate": self.label}}});
                let cms = api(&tenant_client, "v1", "ConfigMap", Some(&ns)).await;
                if let Err(e) = cms.patch(&name, &PatchParams::apply("chaos"), &Patch::Apply(&own)).await {
                    self.fail(&format!("tenant {t} writing {name}: {e}"));
                }
                self.model.own.insert((ns.clone(), name.clone()));
                format!("tenant {t} writes its own {name}, for the decorator")
            }
            10 | 11 => {
                self.actor = Actor::Operator;
                let admin = self.admin.clone();
                let platform = self.platform.name.clone();
                let name = format!("plat-{}", rng.below(2));
                if rng.chance(70) || !self.model.parents.contains_key(&(platform.clone(), name.clone())) {
                    let (v, n) = (u32::try_from(rng.below(100)).unwrap(), u32::try_from(1 + rng.below(2)).unwrap());
                    self.upsert_parent(&admin, &platform, &name, v, n).await;
                    format!("operator writes platform parent {name} (v {v}, n {n})")
                } else {
                    self.delete_parent_at_random(rng, &admin, (&platform, &name), "operator deletes platform parent")
                        .await
                }
            }
            12 | 13 => {
                // The hub killed mid-way: the next step happens while it is down.
                if let Some(hub) = self.hub.take() {
                    hub.kill();
                }
                let said = Box::pin(self.step(rng)).await;
                self.start_hub();
                format!("kill -9 the hub; {said}; start it again")
            }
            14 => {
                // The controller deleted (with the hub down, too): applied again once it is gone.
                self.actor = Actor::Operator;
                let name = format!("{}-x", self.label);
                let controllers = api(&self.admin, support::CONTROLLERS, "CompositeController", None).await;
                if let Err(e) = controllers.delete(&name, &DeleteParams::default()).await {
                    self.fail(&format!("deleting the controller: {e}"));
                }
                self.model.controller_deleted = true;
                "operator deletes the controller".into()
            }
            15 => {
                // The decorator's controllers file emptied (a partial reading), then restored.
                self.actor = Actor::Operator;
                std::fs::write(&self.controllers_file, "").unwrap();
                tokio::time::sleep(Duration::from_secs(3)).await;
                let docs = yaml_doc(&self.d_controller());
                std::fs::write(&self.controllers_file, docs).unwrap();
                "operator empties the controllers file and restores it".into()
            }
            16 => {
                // The hostile grammar: a parent whose spec makes its hook echo hostile keys into its
                // children, as fields a ConfigMap does not declare.
                let name = format!("t{t}-x{}", rng.below(3));
                let (v, n) = (u32::try_from(rng.below(100)).unwrap(), u32::try_from(1 + rng.below(3)).unwrap());
                let mut extra = serde_json::Map::new();
                for _ in 0..=rng.below(3) {
                    extra.insert(self.hostile(rng).await, json!(self.hostile(rng).await));
                }
                let keys: Vec<String> = extra.keys().map(|k| format!("{k:?}")).collect();
                self.upsert_parent_with(&tenant_client, (&ns, &name), (v, n), Value::Object(extra)).await;
                format!("tenant {t} writes parent {name} (v {v}, n {n}) echoing fields {}", keys.join(", "))
            }
            17 => {
                // The annotations the hub reads, at hostile values, on one of the tenant's objects: a
                // parent, or any ConfigMap in its namespace (a child, a decoy, a platform copy, an input).
                let (resource, kind) =
                    if rng.chance(40) { ("test.metahook.dev/v1", "Thing") } else { ("v1", "ConfigMap") };
                let objects = api(&tenant_client, resource, kind, Some(&ns)).await;
                let names: Vec<String> =
                    support::names(&objects).await.into_iter().filter(|n| n != "kube-root-ca.crt").collect();
                if names.is_empty() {
                    return format!("tenant {t} has no {kind} to annotate");
                }
                let name = names[rng.below(names.len())].clone();
                let mut annotations = serde_json::Map::new();
                for _ in 0..=rng.below(2) {
                    let key = HUB_ANNOTATIONS[rng.below(HUB_ANNOTATIONS.len())];
                    annotations.insert(key.to_owned(), json!(self.hostile(rng).await));
                }
                let said = format!("tenant {t} annotates {kind} {name} with {}", Value::Object(annotations.clone()));
                let patch = json!({"metadata": {"annotations": annotations}});
                match objects.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                    Err(e) => self.fail(&format!("{said}: {e}")),
                }
                said
            }
            18 => {
                // The operator edits `x` (issue 66's matrix, at random among the tenants' moves, and
                // while the hub is down when it comes inside a kill): nothing may be let go of, lost
                // or left held.
                self.actor = Actor::Operator;
                let edit = rng.below(3);
                self.x_edits[edit] = !self.x_edits[edit];
                apply_value(&self.admin, &self.x_controller()).await;
                let what = ["a Secret child type", "the sync hook at /xsync2", "a relatedLimit"][edit];
                format!("operator {} {what} to x", if self.x_edits[edit] { "adds" } else { "takes back" })
            }
            _ => {
                // Hold a platform parent's copy in its deletion, not selected any more (issue 67): the
                // copy is the parent's by record and label, but neither its child nor free.
                let Some(name) = self.platform_copy(rng) else {
                    return "no platform parent".into();
                };
                let cms = api(&tenant_client, "v1", "ConfigMap", Some(&ns)).await;
                let patch = json!({"metadata": {"finalizers": [HOLD], "labels": {"controller-uid": null}}});
                match cms.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => {
                        self.model.held.insert((ns.clone(), name.clone()));
                        self.model.taken.insert((ns.clone(), name.clone()));
                    }
                    Err(kube::Error::Api(e)) if e.code == 404 => return format!("tenant {t} finds no {name}"),
                    Err(e) => self.fail(&format!("tenant {t} holding {name}: {e}")),
                }
                match cms.delete(&name, &DeleteParams::default()).await {
                    Ok(_) | Err(kube::Error::Api(_)) => {}
                    Err(e) => self.fail(&format!("tenant {t} deleting {name}: {e}")),
                }
                format!("tenant {t} holds {name} in its deletion, controller-uid taken off")
            }
        }
    }

    /// Every invariant, each waited for within [`BOUND`].
    async fn check(&mut self, said: &str) {
        if self.model.controller_deleted {
            self.reapply(said).await;
        }
        let start = Instant::now();
        loop {
            match self.violations().await {
                Ok(()) => break,
                Err(why) if start.elapsed() > BOUND => self.fail(&format!("after \"{said}\": {why}")),
                Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
            }
        }
        self.audit();
        let done: Vec<Deleting> = std::mem::take(&mut self.model.deleting);
        for d in done {
            if d.orphan {
                // What an orphaning delete kept stays: the user's now.
                for child in d.children.iter().filter(|c| !self.model.taken.contains(*c)) {
                    self.model.kept.entry(child.clone()).or_insert_with(|| d.v.to_string());
                }
            }
        }
    }

    /// Waits for the deleted controller to go (a hub takes its finalizer off once its parents are free of
    /// theirs), checks that they are, and applies it again.
    async fn reapply(&mut self, said: &str) {
        let name = format!("{}-x", self.label);
        let controllers = api(&self.admin, support::CONTROLLERS, "CompositeController", None).await;
        let start = Instant::now();
        while controllers.get_opt(&name).await.unwrap().is_some() {
            if start.elapsed() > BOUND {
                self.fail(&format!(
                    "after \"{said}\": the deleted controller is still there: no hub let its parents go"
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let finalizer = format!("metacontroller.io/compositecontroller-{name}");
        for (pns, pname) in self.model.parents.keys() {
            let thing = self.things(pns).await.get_opt(pname).await.unwrap();
            if thing.is_some_and(|t| t.metadata.finalizers.iter().flatten().any(|f| *f == finalizer)) {
                self.fail(&format!("after \"{said}\": {pns}/{pname} kept the finalizer of a deleted controller"));
            }
        }
        apply_value(&self.admin, &self.x_controller()).await;
        self.model.controller_deleted = false;
    }

    /// The first invariant that does not hold now, if any.
    async fn violations(&self) -> Result<(), String> {
        // What `x`'s finalizer may be on, as its status records it: its one parent type, whatever the
        // operator edited (nothing is left held that no spec names).
        let controllers = api(&self.admin, support::CONTROLLERS, "CompositeController", None).await;
        if let Some(x) = controllers.get_opt(&format!("{}-x", self.label)).await.unwrap() {
            let recorded = &x.data["status"]["finalizedTypes"];
            if x.metadata.deletion_timestamp.is_none()
                && *recorded != json!([{"apiVersion": "test.metahook.dev/v1", "resource": "things"}])
            {
                return Err(format!("x's status.finalizedTypes is {recorded}, not its one parent type"));
            }
        }
        for d in &self.model.deleting {
            if self.things(&d.namespace).await.get_opt(&d.name).await.unwrap().is_some() {
                return Err(format!("parent {}/{} is still there after its delete", d.namespace, d.name));
            }
            for (cns, cname) in &d.children {
                let child = self.config_maps(cns).await.get_opt(cname).await.unwrap();
                let taken = self.model.taken.contains(&(cns.clone(), cname.clone()));
                let replaced = self.model.parents.contains_key(&(d.namespace.clone(), d.name.clone()));
                match child {
                    None if d.orphan && !taken && !replaced => {
                        return Err(format!("{cns}/{cname} was deleted, under --cascade=orphan of its parent"));
                    }
                    Some(c) if !d.orphan && !taken && !replaced && c.metadata.deletion_timestamp.is_none() => {
                        return Err(format!("{cns}/{cname} outlived its parent's delete"));
                    }
                    _ => {}
                }
            }
        }
        for ((ns, name), parent) in &self.model.parents {
            let Some(thing) = self.things(ns).await.get_opt(name).await.unwrap() else {
                return Err(format!("parent {ns}/{name} is gone"));
            };
            if thing.metadata.deletion_timestamp.is_some() {
                return Err(format!("parent {ns}/{name} is still being deleted"));
            }
            for (cns, cname) in self.expected_children(ns, name, parent) {
                if self.model.taken.contains(&(cns.clone(), cname.clone())) {
                    continue;
                }
                let child = self.config_maps(&cns).await.get_opt(&cname).await.unwrap();
                let v = parent.v.to_string();
                match child {
                    // Exactly what the hook asked for: nothing dropped, no field it echoed that the
                    // type does not declare.
                    Some(c)
                        if c.data["data"] == json!({"v": v}) && c.data.as_object().is_some_and(|o| o.len() == 1) => {}
                    Some(c) if c.metadata.deletion_timestamp.is_some() => {}
                    other => {
                        let now = other.map(|c| c.data);
                        return Err(format!("child {cns}/{cname} of {ns}/{name} is {now:?}, not exactly data.v {v}"));
                    }
                }
            }
        }
        for ((ns, name), v) in &self.model.kept {
            let Some(kept) = self.config_maps(ns).await.get_opt(name).await.unwrap() else {
                return Err(format!("{ns}/{name}, kept by --cascade=orphan, is gone"));
            };
            if kept.data["data"]["v"] != v.as_str() {
                let now = &kept.data["data"]["v"];
                return Err(format!("{ns}/{name}, kept by --cascade=orphan with v {v}, was taken over: v {now}"));
            }
        }
        for (ns, name) in &self.model.decoys {
            match self.config_maps(ns).await.get_opt(name).await.unwrap() {
                Some(d) if d.metadata.deletion_timestamp.is_none() && d.data["data"]["v"] == "decoy" => {}
                other => return Err(format!("decoy {ns}/{name} was touched: {:?}", other.map(|d| d.metadata))),
            }
        }
        for (ns, name) in &self.model.own {
            let own = self.config_maps(ns).await.get_opt(name).await.unwrap();
            let decorated = own.as_ref().and_then(|o| o.metadata.labels.as_ref()?.get("decorated").cloned());
            if decorated.as_deref() != Some("yes") {
                return Err(format!("{ns}/{name} is not decorated"));
            }
        }
        for ((ns, name), v) in &self.model.inputs {
            if !self.model.map_parents.contains(ns) {
                continue;
            }
            let copy = self.config_maps(ns).await.get_opt(&format!("{name}-copy")).await.unwrap();
            if copy.as_ref().map(|c| c.data["data"]["v"].clone()) != Some(json!(v.to_string())) {
                return Err(format!("input {ns}/{name} (v {v}) is not mapped"));
            }
        }
        Ok(())
    }

    /// The hub's writes since the last check: in a tenant's namespace, only what belongs to a parent
    /// there, a platform parent's copy there, or a tenant's object its decorator selects; never a decoy.
    fn audit(&mut self) {
        let records = support::audit_records(&self.account.user());
        let new = &records[self.audited.min(records.len())..];
        self.audited = records.len();
        let writes = ["create", "update", "patch", "delete", "deletecollection"];
        for record in new.iter().filter(|r| writes.iter().any(|w| r["verb"] == *w)) {
            let ns = record["objectRef"]["namespace"].as_str().unwrap_or_default();
            let Some(t) = (0..TENANTS).find(|t| self.tenant_ns(*t) == ns) else { continue };
            let name = record["objectRef"]["name"].as_str().unwrap_or_default();
            let resource = record["objectRef"]["resource"].as_str().unwrap_or_default();
            if record["responseStatus"]["code"].as_u64().is_some_and(|c| c >= 400) {
                continue;
            }
            let own = name.starts_with(&format!("t{t}-"))
                || resource == "childrecords"
                || resource == "events"
                || (resource == "configmaps" && name.starts_with("plat-") && name.ends_with("-team"))
                || (resource == "configmaps" && name.starts_with("own-"));
            if !own || name.starts_with("decoy-") {
                self.fail(&format!(
                    "the hub wrote in tenant namespace {ns} what no parent there owns: {} {resource} {name}",
                    record["verb"]
                ));
            }
        }
    }
}

#[tokio::test]
async fn tenants_and_faults_never_stop_freeze_or_reach_another_namespaces_parent() {
    let seed: u64 = std::env::var("TENANT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(61);
    let steps: usize = std::env::var("TENANT_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    let admin = support::client().await;
    support::install_metahook_crds(&admin).await;
    support::install_crds(&admin, include_str!("fixtures/test-crds.yaml")).await;
    support::audited_namespace(&admin).await;
    let platform = TestNamespace::create(&admin, "chaos-platform").await;
    let label = platform.name.clone();
    let mut tenants = Vec::new();
    for t in 0..TENANTS {
        tenants.push(Tenant::create(&admin, &format!("chaos-t{t}")).await);
    }
    let names: Vec<String> = tenants.iter().map(|t| t.namespace.name.clone()).collect();
    let hooks =
        HOOKS.replace("__TENANTS__", &serde_json::to_string(&names).unwrap()).replace("__PLATFORM__", &platform.name);
    let hook = HookServer::start(&hooks).await;
    let dir = tempfile::tempdir().unwrap();
    let controllers_file = dir.path().join("controllers.yaml");
    let user = format!("chaos-{}", &label[label.len().saturating_sub(8)..]);
    let account = HubAccount::create_named(&admin, AUDITED_NAMESPACE, &user, &user).await;
    let kubeconfig = account.kubeconfig(dir.path());
    let mut chaos = Chaos {
        admin: admin.clone(),
        label,
        platform,
        tenants,
        hook,
        account,
        hub: None,
        kubeconfig,
        dir,
        controllers_file,
        model: Model::default(),
        audited: 0,
        actor: Actor::Operator,
        seed,
        step: 0,
        x_edits: [false; 3],
    };
    // Exactly the roles `metahook rbac` prints for the three controllers (and `x` as the operator may
    // edit it).
    let mut edited = chaos.x_controller_with([true; 3]);
    edited["metadata"]["name"] = json!(format!("{}-x-edited", chaos.label));
    let all = [chaos.x_controller(), chaos.d_controller(), chaos.m_controller(), edited];
    let file = chaos.dir.path().join("all.yaml");
    std::fs::write(&file, all.iter().map(yaml_doc).collect::<Vec<_>>().join("---\n")).unwrap();
    let printed = support::metahook_rbac(&["--base", "-f", file.to_str().unwrap()]);
    chaos.account.grant(&printed).await;
    std::fs::write(&chaos.controllers_file, yaml_doc(&chaos.d_controller())).unwrap();
    apply_value(&admin, &chaos.x_controller()).await;
    apply_value(&admin, &chaos.m_controller()).await;
    chaos.start_hub();
    chaos.audited = support::audit_records(&chaos.account.user()).len();

    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    for step in 0..steps {
        chaos.step = step;
        let before = chaos.snapshot().await;
        let said = chaos.step(&mut rng).await;
        eprintln!("tenant chaos seed {seed} step {step}: {said}");
        chaos.check(&said).await;
        if let Actor::Tenant(t) = chaos.actor {
            chaos.unchanged_elsewhere(t, &before, &said).await;
        }
    }
    eprintln!("tenant chaos seed {seed}: {steps} steps, every invariant held");

    // Clean up: the tenants' finalizers off, the controllers and namespaces away.
    for (ns, name) in chaos.model.held.iter().chain(&chaos.model.decoys) {
        let cms = api(&admin, "v1", "ConfigMap", Some(ns)).await;
        let _ =
            cms.patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await;
    }
    let Chaos { hub, account, platform, tenants, label, .. } = chaos;
    drop(hub);
    for (kind, name) in [("CompositeController", format!("{label}-x")), ("MapController", format!("{label}-m"))] {
        let controllers = api(&admin, support::CONTROLLERS, kind, None).await;
        let _ = controllers.delete(&name, &DeleteParams::default()).await;
        let _ = controllers
            .patch(&name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
            .await;
    }
    for tenant in tenants {
        tenant.namespace.delete().await;
    }
    platform.delete().await;
    account.delete().await;
}
