//! An operator's ordinary lifecycle of a controller, on the real control plane (issue 66): a whole
//! controller — its parents' CRD, the controller object and its hook — deleted together with `kubectl
//! delete -f`, in file order, reversed, and the CRD alone first, returns within the bound and leaves
//! nothing (Metacontroller's own examples tear down this way, and 4 of its 12 hung here before: the hub
//! waited on a list of a type whose CRD had gone with it). With no hub running, a deleted controller
//! waits for one, and `metahook release` lets it go at once.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use support::teardown::{self, BOUND, kubectl_delete};
use support::{World, api, apply_value, eventually, unique_suffix};

const WAIT: Duration = Duration::from_secs(60);
const CONTROLLER_FINALIZER: &str = "metahook.dev/release-objects";

/// Each parent gets one ConfigMap; the finalize hook lets go at once.
const HOOK: &str = r#"
def sync(request):
    name = request["parent"]["metadata"]["name"]
    return {"children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name + "-child"},
                          "data": {"v": "1"}}],
            "status": {"ok": True}}

def finalize(request):
    return {"children": [], "finalized": True}
"#;

/// A whole controller as one directory of manifests: its parents' CRD (a group of its own) and the
/// controller object; `finalize`: whether its parents carry the controller's finalizer.
struct Whole {
    group: String,
    crd: Value,
    controller: Value,
}

impl Whole {
    fn new(w: &World, name: &str, finalize: bool) -> Self {
        let group = format!("{name}.lc{}.example.com", unique_suffix());
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("widgets.{group}")},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
                     "versions": [{"name": "v1", "served": true, "storage": true,
                                   "subresources": {"status": {}},
                                   "schema": {"openAPIV3Schema": {"type": "object",
                                              "x-kubernetes-preserve-unknown-fields": true}}}]}});
        let mut hooks = json!({"sync": {"webhook": {"url": w.hook.url("/sync")}}});
        if finalize {
            hooks["finalize"] = json!({"webhook": {"url": w.hook.url("/finalize")}});
        }
        let controller = json!({
            "apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
            "metadata": {"name": format!("{}-{name}", w.label), "labels": {"metahook-test": w.label}},
            "spec": {"generateSelector": true,
                     "parentResource": {"apiVersion": format!("{group}/v1"), "resource": "widgets"},
                     "childResources": [{"apiVersion": "v1", "resource": "configmaps",
                                         "updateStrategy": {"method": "InPlace"}}],
                     "hooks": hooks}});
        Self { group, crd, controller }
    }

    fn controller_name(&self) -> String {
        self.controller["metadata"]["name"].as_str().unwrap().to_owned()
    }

    /// The finalizer the controller puts on its parents (with a finalize hook).
    fn finalizer(&self) -> String {
        format!("metacontroller.io/compositecontroller-{}", self.controller_name())
    }

    /// Makes Widget `name` in `namespace`, a parent of this type.
    async fn make_widget(&self, w: &World, namespace: &str, name: &str) {
        let widget = json!({"apiVersion": format!("{}/v1", self.group), "kind": "Widget",
                            "metadata": {"name": name, "namespace": namespace}, "spec": {}});
        apply_value(&w.client, &widget).await;
    }

    /// Installs the CRD and the controller, makes `parents` Widgets and waits for each one's child (and
    /// for the controller's finalizer on it, with a finalize hook).
    async fn install(&self, w: &World, parents: &[&str]) {
        support::install_crds(&w.client, &serde_json::to_string(&self.crd).unwrap()).await;
        apply_value(&w.client, &self.controller).await;
        let widgets = self.widgets(w).await;
        for name in parents {
            self.make_widget(w, &w.ns.name, name).await;
        }
        let finalizes = self.controller["spec"]["hooks"].get("finalize").is_some();
        let finalizer = self.finalizer();
        for name in parents {
            eventually(WAIT, || async { w.config_map(&format!("{name}-child")).await }).await;
            if finalizes {
                eventually(WAIT, || async {
                    let widget = widgets.get(name).await.unwrap();
                    widget.metadata.finalizers.filter(|f| f.contains(&finalizer))
                })
                .await;
            }
        }
        let controllers = w.controllers("CompositeController").await;
        eventually(WAIT, || async {
            let c = controllers.get(&self.controller_name()).await.unwrap();
            c.metadata.finalizers.filter(|f| f.iter().any(|f| f == CONTROLLER_FINALIZER))
        })
        .await;
    }

    async fn widgets(&self, w: &World) -> Api<DynamicObject> {
        api(&w.client, &format!("{}/v1", self.group), "Widget", Some(&w.ns.name)).await
    }

    /// Whether nothing of it is left: no controller object, no CRD.
    async fn gone(&self, w: &World) -> bool {
        let controllers = w.controllers("CompositeController").await;
        let crds: Api<CustomResourceDefinition> = Api::all(w.client.clone());
        controllers.get_opt(&self.controller_name()).await.unwrap().is_none()
            && crds.get_opt(&format!("widgets.{}", self.group)).await.unwrap().is_none()
    }
}

/// Issue 66, item 1: Metacontroller's examples' teardown, `kubectl delete -k` of the whole directory,
/// in each order the files can come, with and without the controller's finalizer on the parents. Each
/// returns within the bound and leaves nothing. Before: the ones whose CRD went before the hub's
/// release listed it waited for the hub's next relist (30 minutes here).
#[tokio::test]
async fn a_whole_controller_deleted_with_kubectl_returns_within_the_bound_in_any_order() {
    let w = World::new("lc-whole", HOOK).await;
    for (case, finalize) in [("crd-first", false), ("reversed", false), ("crd-alone", false), ("crd-first-fin", true)] {
        let whole = Whole::new(&w, case, finalize);
        // Parents (and children) named for the case: the previous case's children are the garbage
        // collector's, and may still be there.
        let (a, b) = (format!("{case}-a"), format!("{case}-b"));
        whole.install(&w, &[&a, &b]).await;
        let took = match case {
            "reversed" => kubectl_delete(&[&whole.controller, &whole.crd], false).await,
            "crd-alone" => {
                let first = kubectl_delete(&[&whole.crd], false).await;
                first + kubectl_delete(&[&whole.controller], false).await
            }
            _ => kubectl_delete(&[&whole.crd, &whole.controller], false).await,
        };
        assert!(took < BOUND, "{case}: kubectl delete took {took:?}");
        assert!(whole.gone(&w).await, "{case}: something is left");
        // The parents went with their CRD. Their children are the garbage collector's, which watches a
        // new CRD only from its next discovery pass (30 s): when the CRD goes before (or with) the
        // controller, the hub's release sees it go and deletes them; when the controller goes first,
        // the hub has let go before the parents went.
        if case != "reversed" {
            let namespaces = [w.ns.name.clone()];
            teardown::assert_nothing_left(&w.client, std::slice::from_ref(&whole.controller), &namespaces, &w.label)
                .await;
        }
        eprintln!("{case}: kubectl delete returned in {took:?}");
    }
    w.finish("CompositeController").await;
}

/// With no hub running a deleted controller waits for one, by design; `metahook release` does what a
/// hub start would, and exits: the parents lose the controller's finalizer (and can go), the controller
/// goes. And for a controller whose parent type was deleted meanwhile, there is nothing to wait for.
#[tokio::test]
async fn metahook_release_lets_deleted_controllers_go_with_no_hub_running() {
    let mut w = World::new("lc-release", HOOK).await;
    let kept = Whole::new(&w, "kept-type", true);
    kept.install(&w, &["a"]).await;
    let dropped = Whole::new(&w, "gone-type", false);
    dropped.install(&w, &["b"]).await;
    w.stop_hub().await;

    let controllers = w.controllers("CompositeController").await;
    for whole in [&kept, &dropped] {
        controllers.delete(&whole.controller_name(), &DeleteParams::default()).await.unwrap();
    }
    let crds: Api<CustomResourceDefinition> = Api::all(w.client.clone());
    crds.delete(&format!("widgets.{}", dropped.group), &DeleteParams::default()).await.unwrap();
    eventually(WAIT, || async {
        crds.get_opt(&format!("widgets.{}", dropped.group)).await.unwrap().is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for whole in [&kept, &dropped] {
        assert!(controllers.get_opt(&whole.controller_name()).await.unwrap().is_some(), "waits for a hub");
    }

    let names = [kept.controller_name(), dropped.controller_name()];
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
        .env("KUBECONFIG", support::kubeconfig_path())
        .arg("release")
        .args(&names)
        .output()
        .await
        .expect("running metahook release");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "metahook release: {:?}\n{said}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for name in &names {
        assert!(said.contains(&format!("CompositeController {name}: released")), "{said}");
        assert!(controllers.get_opt(name).await.unwrap().is_none(), "{name} is gone");
    }
    // The kept type's parent lost the controller's finalizer: it goes at once when deleted.
    let widgets = kept.widgets(&w).await;
    let widget = widgets.get("a").await.unwrap();
    assert!(widget.metadata.finalizers.iter().flatten().all(|f| !f.contains("compositecontroller")), "{widget:?}");
    widgets.delete("a", &DeleteParams::default()).await.unwrap();
    eventually(BOUND, || async { widgets.get_opt("a").await.unwrap().is_none().then_some(()) }).await;

    // Nothing left to do: it says so and exits 0.
    let again = tokio::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
        .env("KUBECONFIG", support::kubeconfig_path())
        .args(["release", "-l", &format!("metahook-test={}", w.label)])
        .output()
        .await
        .unwrap();
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("no controller waits for a hub"));
    let _ = crds.delete(&format!("widgets.{}", kept.group), &DeleteParams::default()).await;
    w.start_hub();
    w.finish("CompositeController").await;
}

/// A controller relabelled out of the hub's `targetLabelSelector` is let go of as if deleted: its
/// finalizer comes off its parents and the hub's comes off it; labelled back, the hub takes it on again
/// and its parents get its finalizer back (the release does not race the controller that runs again).
/// And a changed parent type, changed back, keeps the type's finalizers: what runs again is held.
#[tokio::test]
async fn a_controller_deselected_and_selected_again_is_let_go_of_then_held_again() {
    let w = World::new("lc-select", HOOK).await;
    let whole = Whole::new(&w, "sel", true);
    whole.install(&w, &["a"]).await;
    let name = whole.controller_name();
    let finalizer = whole.finalizer();
    let widgets = whole.widgets(&w).await;
    let controllers = w.controllers("CompositeController").await;
    let holds = |obj: &DynamicObject, f: &str| obj.metadata.finalizers.iter().flatten().any(|x| x == f);

    let mut deselected = whole.controller.clone();
    deselected["metadata"]["labels"]["metahook-test"] = json!("someone-else");
    apply_value(&w.client, &deselected).await;
    eventually(BOUND, || async {
        let widget = widgets.get("a").await.unwrap();
        let controller = controllers.get(&name).await.unwrap();
        (!holds(&widget, &finalizer) && !holds(&controller, CONTROLLER_FINALIZER)).then_some(())
    })
    .await;

    apply_value(&w.client, &whole.controller).await;
    eventually(BOUND, || async {
        let widget = widgets.get("a").await.unwrap();
        let controller = controllers.get(&name).await.unwrap();
        (holds(&widget, &finalizer) && holds(&controller, CONTROLLER_FINALIZER)).then_some(())
    })
    .await;
    // It stays held: nothing of a release is left running against it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(holds(&widgets.get("a").await.unwrap(), &finalizer), "the parent keeps the finalizer");

    // Its parent type changed to another and back: the first type's parents keep (or get back) the
    // controller's finalizer once it syncs them again.
    let mut retyped = whole.controller.clone();
    retyped["spec"]["parentResource"]["resource"] = json!("nothings");
    apply_value(&w.client, &retyped).await;
    apply_value(&w.client, &whole.controller).await;
    eventually(BOUND, || async { holds(&widgets.get("a").await.unwrap(), &finalizer).then_some(()) }).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(holds(&widgets.get("a").await.unwrap(), &finalizer), "the parent keeps the finalizer");

    let took = kubectl_delete(&[&whole.crd, &whole.controller], false).await;
    assert!(took < BOUND, "kubectl delete took {took:?}");
    assert!(whole.gone(&w).await);
    w.finish("CompositeController").await;
}

/// Others' writes to a parent do not hold a deleted controller's release: its finalizer comes off with a
/// patch that tests that one entry, not the object's `resourceVersion`, so a parent written without a
/// pause (a tenant can write its own parents as fast as it likes) still lets the controller go (a review
/// found the release held for as long as such a loop ran).
#[tokio::test]
async fn a_parent_written_without_a_pause_does_not_hold_a_deleted_controllers_release() {
    let w = World::new("lc-flood", HOOK).await;
    let whole = Whole::new(&w, "flood", true);
    whole.install(&w, &["a"]).await;
    let widgets = whole.widgets(&w).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (widgets, stop) = (widgets.clone(), stop.clone());
        tokio::spawn(async move {
            let mut writes = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let patch = json!({"metadata": {"annotations": {"n": writes.to_string()}}});
                if widgets
                    .patch("a", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
                    .await
                    .is_ok()
                {
                    writes += 1;
                }
            }
            writes
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let controllers = w.controllers("CompositeController").await;
    let name = whole.controller_name();
    controllers.delete(&name, &DeleteParams::default()).await.unwrap();
    eventually(BOUND, || async { controllers.get_opt(&name).await.unwrap().is_none().then_some(()) }).await;
    let widget = widgets.get("a").await.unwrap();
    assert!(widget.metadata.finalizers.iter().flatten().all(|f| !f.contains("compositecontroller")), "{widget:?}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let writes = writer.await.unwrap();
    assert!(writes > 20, "the parent was written throughout ({writes} writes)");
    eprintln!("released under {writes} writes to the parent");
    let _ = kubectl_delete(&[&whole.crd], false).await;
    w.finish("CompositeController").await;
}

/// Each parent gets one Gadget (a type of its own group, next to the parents'); the finalize hook lets
/// go at once.
const GADGET_HOOK: &str = r#"
def sync(request):
    parent = request["parent"]
    name = parent["metadata"]["name"]
    return {"children": [{"apiVersion": parent["apiVersion"], "kind": "Gadget",
                          "metadata": {"name": name + "-gadget"}, "spec": {}}]}

def finalize(request):
    return {"children": [], "finalized": True}
"#;

/// Issue 66, the matrix: a child type's CRD deleted while parents exist (the children go with it). A
/// parent deleted afterwards, and the whole controller deleted with `kubectl delete -f`, each go within
/// the bound: the release and the finalizing sync have nothing of the missing type to wait for.
#[tokio::test]
async fn a_child_types_crd_deleted_while_parents_exist_holds_no_delete() {
    let w = World::new("lc-childcrd", GADGET_HOOK).await;
    let mut whole = Whole::new(&w, "childcrd", true);
    let gadgets = format!("gadgets.{}", whole.group);
    whole.controller["spec"]["childResources"] = json!([{"apiVersion": format!("{}/v1", whole.group),
        "resource": "gadgets", "updateStrategy": {"method": "InPlace"}}]);
    let mut gadget_crd = whole.crd.clone();
    gadget_crd["metadata"]["name"] = json!(gadgets);
    gadget_crd["spec"]["names"] = json!({"kind": "Gadget", "plural": "gadgets", "singular": "gadget"});
    support::install_crds(&w.client, &serde_json::to_string(&gadget_crd).unwrap()).await;
    support::install_crds(&w.client, &serde_json::to_string(&whole.crd).unwrap()).await;
    apply_value(&w.client, &whole.controller).await;
    let widgets = whole.widgets(&w).await;
    let children = api(&w.client, &format!("{}/v1", whole.group), "Gadget", Some(&w.ns.name)).await;
    let finalizer = whole.finalizer();
    for name in ["a", "b"] {
        whole.make_widget(&w, &w.ns.name, name).await;
    }
    for name in ["a", "b"] {
        eventually(WAIT, || async { children.get_opt(&format!("{name}-gadget")).await.unwrap() }).await;
        eventually(WAIT, || async {
            widgets.get(name).await.unwrap().metadata.finalizers.filter(|f| f.contains(&finalizer))
        })
        .await;
    }

    let crds: Api<CustomResourceDefinition> = Api::all(w.client.clone());
    crds.delete(&gadgets, &DeleteParams::default()).await.unwrap();
    eventually(WAIT, || async { crds.get_opt(&gadgets).await.unwrap().is_none().then_some(()) }).await;

    let started = Instant::now();
    widgets.delete("b", &DeleteParams::default()).await.unwrap();
    eventually(BOUND, || async { widgets.get_opt("b").await.unwrap().is_none().then_some(()) }).await;
    eprintln!("a parent whose child type is gone was deleted in {:?}", started.elapsed());

    let took = kubectl_delete(&[&whole.crd, &whole.controller], false).await;
    assert!(took < BOUND, "kubectl delete took {took:?}");
    assert!(whole.gone(&w).await, "something is left");
    w.finish("CompositeController").await;
}

/// A finalize hook that keeps its parent's child while it finalizes (as a hook that cleans up before it
/// lets go does), and lets go at once.
const KEEPING_HOOK: &str = r#"
def sync(request):
    name = request["parent"]["metadata"]["name"]
    return {"children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name + "-child"},
                          "data": {"v": "1"}}]}

def finalize(request):
    answer = sync(request)
    answer["finalized"] = True
    return answer
"#;

/// Issue 66, the lifecycle matrix: a namespace deleted that holds parents whose finalize hook keeps their
/// child. The namespace's deletion deletes the child; the finalizing sync would create it again, which
/// the API server refuses in a namespace being deleted (`NamespaceTerminating`). What cannot exist is
/// not waited for: the namespace goes within the bound.
#[tokio::test]
async fn a_namespace_deleted_under_a_finalize_hook_that_keeps_its_children_goes_within_the_bound() {
    let w = World::new("lc-nsterm", KEEPING_HOOK).await;
    let whole = Whole::new(&w, "nsterm", true);
    whole.install(&w, &[]).await;
    let doomed = support::TestNamespace::create(&w.client, "lc-nsterm-c").await;
    let widgets = api(&w.client, &format!("{}/v1", whole.group), "Widget", Some(&doomed.name)).await;
    let finalizer = whole.finalizer();
    for name in ["a", "b"] {
        whole.make_widget(&w, &doomed.name, name).await;
    }
    let config_maps = api(&w.client, "v1", "ConfigMap", Some(&doomed.name)).await;
    for name in ["a", "b"] {
        eventually(WAIT, || async { config_maps.get_opt(&format!("{name}-child")).await.unwrap() }).await;
        eventually(WAIT, || async {
            widgets.get(name).await.unwrap().metadata.finalizers.filter(|f| f.contains(&finalizer))
        })
        .await;
    }
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(w.client.clone());
    let started = Instant::now();
    namespaces.delete(&doomed.name, &DeleteParams::default()).await.unwrap();
    eventually(BOUND, || async { namespaces.get_opt(&doomed.name).await.unwrap().is_none().then_some(()) }).await;
    eprintln!("the namespace went in {:?}", started.elapsed());
    let took = kubectl_delete(&[&whole.crd, &whole.controller], false).await;
    assert!(took < BOUND, "kubectl delete took {took:?}");
    assert!(whole.gone(&w).await, "something is left");
    w.finish("CompositeController").await;
}

/// The types `status.finalizedTypes` of controller `name` records, as `group/version resource`.
async fn recorded_types(w: &World, name: &str) -> Vec<String> {
    let controllers = w.controllers("CompositeController").await;
    let c = controllers.get(name).await.unwrap();
    c.data["status"]["finalizedTypes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| format!("{} {}", t["apiVersion"].as_str().unwrap_or(""), t["resource"].as_str().unwrap_or("")))
        .collect()
}

fn holds_finalizer(obj: &DynamicObject, finalizer: &str) -> bool {
    obj.metadata.finalizers.iter().flatten().any(|f| f == finalizer)
}

/// Issue 66, the matrix with the hub down: a controller's parent type changed while no hub ran. The old
/// type's parents carry the controller's finalizer, and nothing in the new spec names their type: only
/// the controller's status (`status.finalizedTypes`, written before any finalizer was put on) says it was
/// held. A hub that starts lets go of it (the old parent can be deleted again), and so does `metahook
/// release` for a type changed back while the hub was down again; the record follows. Before, the old
/// type's parents kept the finalizer for good, and a delete of one hung.
#[tokio::test]
async fn a_parent_type_changed_while_no_hub_ran_is_let_go_of_by_the_next_start_and_by_metahook_release() {
    let mut w = World::new("lc-retype", HOOK).await;
    let old = Whole::new(&w, "retype", true);
    old.install(&w, &["a"]).await;
    let name = old.controller_name();
    let finalizer = old.finalizer();
    let new = Whole::new(&w, "retype-new", true);
    support::install_crds(&w.client, &serde_json::to_string(&new.crd).unwrap()).await;
    let (old_type, new_type) = (format!("{}/v1 widgets", old.group), format!("{}/v1 widgets", new.group));
    assert_eq!(recorded_types(&w, &name).await, vec![old_type.clone()], "recorded before the first finalizer");

    // Retyped while no hub runs.
    w.stop_hub().await;
    let mut retyped = old.controller.clone();
    retyped["spec"]["parentResource"]["apiVersion"] = json!(format!("{}/v1", new.group));
    apply_value(&w.client, &retyped).await;
    let new_widgets = new.widgets(&w).await;
    new.make_widget(&w, &w.ns.name, "n").await;
    w.start_hub();
    let old_widgets = old.widgets(&w).await;
    let started = Instant::now();
    eventually(BOUND, || async {
        let a = old_widgets.get("a").await.unwrap();
        let n = new_widgets.get("n").await.unwrap();
        (!holds_finalizer(&a, &finalizer) && holds_finalizer(&n, &finalizer)).then_some(())
    })
    .await;
    eventually(BOUND, || async { (recorded_types(&w, &name).await == vec![new_type.clone()]).then_some(()) }).await;
    eprintln!("the old type was let go of {:?} after the hub started", started.elapsed());
    eventually(WAIT, || async { w.config_map("n-child").await }).await;
    old_widgets.delete("a", &DeleteParams::default()).await.unwrap();
    eventually(BOUND, || async { old_widgets.get_opt("a").await.unwrap().is_none().then_some(()) }).await;

    // Changed back while the hub is down again: `metahook release` lets go of the new type at once. A
    // release limited to some namespaces lets go of them there, and keeps the record: the objects of
    // the type elsewhere may still hold the finalizer.
    w.stop_hub().await;
    apply_value(&w.client, &old.controller).await;
    let release = |args: Vec<String>| async move {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
            .env("KUBECONFIG", support::kubeconfig_path())
            .arg("release")
            .args(&args)
            .output()
            .await
            .expect("running metahook release");
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "metahook release: {:?}\n{said}\n{err}", out.status);
        said
    };
    let elsewhere = support::TestNamespace::create(&w.client, "lc-retype-x").await;
    let said = release(vec!["--namespaces".into(), elsewhere.name.clone(), name.clone()]).await;
    assert!(said.contains(&format!("CompositeController {name}: released (0 objects")), "{said}");
    assert_eq!(
        recorded_types(&w, &name).await,
        vec![new_type.clone()],
        "a release in some namespaces keeps the record"
    );
    assert!(holds_finalizer(&new_widgets.get("n").await.unwrap(), &finalizer), "n is not in those namespaces");
    elsewhere.delete().await;
    let said = release(vec![name.clone()]).await;
    assert!(said.contains(&format!("CompositeController {name}: released (1 objects")), "{said}");
    assert!(!holds_finalizer(&new_widgets.get("n").await.unwrap(), &finalizer), "the new type was let go of");
    assert!(recorded_types(&w, &name).await.is_empty(), "nothing left recorded: the old type is not held yet");
    assert!(w.controllers("CompositeController").await.get_opt(&name).await.unwrap().is_some(), "it runs on");

    // The hub holds the old type again, records it, and everything goes with `kubectl delete`.
    w.start_hub();
    eventually(BOUND, || async { (recorded_types(&w, &name).await == vec![old_type.clone()]).then_some(()) }).await;
    let took = kubectl_delete(&[&old.crd, &old.controller, &new.crd], false).await;
    assert!(took < BOUND, "kubectl delete took {took:?}");
    assert!(old.gone(&w).await && new.gone(&w).await, "something is left");
    w.finish("CompositeController").await;
}

/// A hook that follows its controller's spec: a Secret beside the ConfigMap once the controller declares
/// Secrets; `sync2` answers with another value.
const FOLLOWING_HOOK: &str = r#"
def children(request, v):
    name = request["parent"]["metadata"]["name"]
    out = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name + "-child"}, "data": {"v": v}}]
    types = [c["resource"] for c in request["controller"]["spec"].get("childResources", [])]
    if "secrets" in types:
        out.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name + "-secret"},
                    "stringData": {"v": v}})
    return {"children": out}

def sync(request):
    return children(request, "1")

def sync2(request):
    return children(request, "2")

def finalize(request):
    return {"children": [], "finalized": True}
"#;

/// Issue 66, the matrix with a hub running: a child type added, the sync hook changed, a `relatedLimit`
/// added. Each edit restarts the controller and takes effect within the bound; none lets go of anything
/// (the parent keeps the controller's finalizer, the controller keeps the hub's, its status records its
/// one parent type, and puts it back when someone wipes it), and the whole controller still goes with
/// `kubectl delete` within the bound.
#[tokio::test]
async fn a_running_controllers_child_types_hooks_and_related_limit_changed_hold_on_and_leave_nothing() {
    let w = World::new("lc-edit", FOLLOWING_HOOK).await;
    let mut whole = Whole::new(&w, "edit", true);
    whole.install(&w, &["a"]).await;
    let name = whole.controller_name();
    let finalizer = whole.finalizer();
    let widgets = whole.widgets(&w).await;
    let controllers = w.controllers("CompositeController").await;
    let parent_type = format!("{}/v1 widgets", whole.group);
    let secrets = api(&w.client, "v1", "Secret", Some(&w.ns.name)).await;

    type Edit = fn(&mut Value, &World);
    let edits: [(&str, Edit); 3] = [
        ("a child type added", |c, _| {
            c["spec"]["childResources"]
                .as_array_mut()
                .unwrap()
                .push(json!({"apiVersion": "v1", "resource": "secrets", "updateStrategy": {"method": "InPlace"}}));
        }),
        ("the sync hook changed", |c, w| {
            c["spec"]["hooks"]["sync"] = json!({"webhook": {"url": w.hook.url("/sync2")}})
        }),
        ("a relatedLimit added", |c, _| c["spec"]["relatedLimit"] = json!({"namespaces": [], "resources": []})),
    ];
    for (what, edit) in edits {
        edit(&mut whole.controller, &w);
        apply_value(&w.client, &whole.controller).await;
        let generation = controllers.get(&name).await.unwrap().metadata.generation;
        let started = Instant::now();
        eventually(BOUND, || async {
            let c = controllers.get(&name).await.unwrap();
            let ready = c.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            (ready && c.data["status"]["observedGeneration"].as_i64() == generation).then_some(())
        })
        .await;
        match what {
            "a child type added" => {
                eventually(BOUND, || async { secrets.get_opt("a-secret").await.unwrap() }).await;
            }
            "the sync hook changed" => {
                eventually(BOUND, || async {
                    let cm = w.config_map("a-child").await?;
                    let secret = secrets.get_opt("a-secret").await.unwrap()?;
                    (cm.data["data"]["v"] == "2" && secret.data["data"]["v"] == "Mg==").then_some(())
                })
                .await;
            }
            _ => {}
        }
        eprintln!("{what}: in effect after {:?}", started.elapsed());
        // Nothing was let go of, then or since.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (parent, controller) = (widgets.get("a").await.unwrap(), controllers.get(&name).await.unwrap());
        assert!(holds_finalizer(&parent, &finalizer), "{what}: the parent keeps the controller's finalizer");
        assert!(holds_finalizer(&controller, CONTROLLER_FINALIZER), "{what}: the controller keeps the hub's");
        assert_eq!(recorded_types(&w, &name).await, vec![parent_type.clone()], "{what}");
    }
    // The record wiped by someone else (a restore that drops status) is put back while the controller
    // runs: a type change while no hub runs afterwards would otherwise leave its parents held.
    let wipe = json!({"status": {"finalizedTypes": null}});
    let wiped = controllers.patch_status(&name, &PatchParams::default(), &Patch::Merge(&wipe)).await.unwrap();
    assert!(wiped.data["status"]["finalizedTypes"].is_null(), "wiped: {:?}", wiped.data["status"]);
    eventually(BOUND, || async { (recorded_types(&w, &name).await == vec![parent_type.clone()]).then_some(()) }).await;

    let took = kubectl_delete(&[&whole.crd, &whole.controller], false).await;
    assert!(took < BOUND, "kubectl delete took {took:?}");
    assert!(whole.gone(&w).await, "something is left");
    w.finish("CompositeController").await;
}

/// `metahook rbac --base` output for `controllers`, as an operator applies it.
fn printed_roles(controllers: &[&Value]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("controllers.yaml");
    let docs: Vec<String> = controllers.iter().map(|c| serde_json::to_string(c).unwrap()).collect();
    std::fs::write(&file, docs.join("\n---\n")).unwrap();
    support::metahook_rbac(&["--base", "-f", file.to_str().unwrap()])
}

/// What a release still lets go of is recorded until it is done, whoever wipes the status meanwhile
/// (helper-11's attack: the status put back named only what the spec holds, and a hub stopped during the
/// release left the old type's objects held for good). Made deterministic with the hub's rights, as an
/// operator changes them: the controller's parent type changed together with the new `metahook rbac`
/// output, which no longer grants the old type, so the release of the old type waits (`Releasing`).
#[tokio::test]
async fn what_a_release_still_lets_go_of_stays_recorded_when_the_status_is_wiped_and_the_hub_stops() {
    let mut w = World::new("lc-inflight", HOOK).await;
    w.stop_hub().await;
    let old = Whole::new(&w, "inflight", true);
    let new = Whole::new(&w, "inflight-new", true);
    support::install_crds(&w.client, &serde_json::to_string(&new.crd).unwrap()).await;
    let name = old.controller_name();
    let finalizer = old.finalizer();
    let mut retyped = old.controller.clone();
    retyped["spec"]["parentResource"]["apiVersion"] = json!(format!("{}/v1", new.group));
    let mut renamed = retyped.clone();
    renamed["metadata"]["name"] = json!(format!("{name}-b"));
    let (old_type, new_type) = (format!("{}/v1 widgets", old.group), format!("{}/v1 widgets", new.group));

    // The hub runs as a ServiceAccount with exactly the printed roles, for the controller on either type.
    let mut account = support::HubAccount::create(&w.client, &w.ns.name, &w.label).await;
    account.grant(&printed_roles(&[&old.controller, &renamed])).await;
    let hub = support::Hub::start(&account.client, &w.label);
    old.install(&w, &["a"]).await;
    let old_widgets = old.widgets(&w).await;

    // Retyped, with the roles printed for the new spec: the old type may no longer be patched.
    account.grant(&printed_roles(&[&retyped])).await;
    apply_value(&w.client, &retyped).await;
    let controllers = w.controllers("CompositeController").await;
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let both = sorted(vec![old_type.clone(), new_type.clone()]);
    eventually(BOUND, || async { (sorted(recorded_types(&w, &name).await) == both).then_some(()) }).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(holds_finalizer(&old_widgets.get("a").await.unwrap(), &finalizer), "the release waits");

    // Someone wipes the status: what the spec holds and what the release still lets go of come back.
    let wipe = json!({"status": {"finalizedTypes": null}});
    controllers.patch_status(&name, &PatchParams::default(), &Patch::Merge(&wipe)).await.unwrap();
    eventually(BOUND, || async { (sorted(recorded_types(&w, &name).await) == both).then_some(()) }).await;

    // The hub stops mid-release; the rights come back; the next start lets go of the old type.
    hub.stop().await;
    account.grant(&printed_roles(&[&old.controller, &renamed])).await;
    let hub = support::Hub::start(&account.client, &w.label);
    eventually(BOUND, || async {
        let a = old_widgets.get("a").await.unwrap();
        (!holds_finalizer(&a, &finalizer) && recorded_types(&w, &name).await == vec![new_type.clone()]).then_some(())
    })
    .await;

    hub.stop().await;
    w.start_hub();
    let took = kubectl_delete(&[&old.crd, &retyped, &new.crd], false).await;
    assert!(took < BOUND, "kubectl delete took {took:?}");
    assert!(old.gone(&w).await && new.gone(&w).await, "something is left");
    account.delete().await;
    w.finish("CompositeController").await;
}

/// A CRD of `group` whose kind is `kind` (plural: lowercase + `s`), served.
fn sibling_crd(group: &str, kind: &str) -> Value {
    let plural = format!("{}s", kind.to_lowercase());
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": format!("{plural}.{group}")},
           "spec": {"group": group, "scope": "Namespaced",
                    "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase()},
                    "versions": [{"name": "v1", "served": true, "storage": true,
                                  "schema": {"openAPIV3Schema": {"type": "object",
                                             "x-kubernetes-preserve-unknown-fields": true}}}]}})
}

/// A ConfigMap `name` in the test's namespace whose controlling owner is `owner`.
async fn owned_config_map(w: &World, name: &str, owner: &DynamicObject) {
    let types = owner.types.clone().unwrap();
    let reference = json!({"apiVersion": types.api_version, "kind": types.kind, "name": owner.metadata.name,
                           "uid": owner.metadata.uid, "controller": true});
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": w.ns.name, "ownerReferences": [reference]}});
    apply_value(&w.client, &cm).await;
}

/// Attack review of the release's sweep (issue 66): it deletes the children a deleted parent CRD's
/// objects left, and must look at owners of exactly that type. Run by a hub holding exactly the roles
/// `metahook rbac` prints. Before: any kind of the deleted CRD's group counted: a sibling CRD's object
/// whose kind is not served any more (it still exists) lost its child; a sibling kind the hub may not
/// read (403) held the controller's delete for good; and a decorator over a built-in type of a dotted
/// group (`networking.k8s.io`, taken for a deleted CRD) held its delete on an Ingress's child.
#[tokio::test]
async fn the_release_sweeps_only_children_of_the_deleted_parent_type_and_waits_on_no_other_kind() {
    let hooks = format!("{HOOK}\ndef decorate(request):\n    return {{'attachments': []}}\n");
    let mut w = World::new("lc-sweep-kinds", &hooks).await;
    w.stop_hub().await;
    let whole = Whole::new(&w, "sweep", false);
    let decorator = json!({
        "apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "DecoratorController",
        "metadata": {"name": format!("{}-np", w.label), "labels": {"metahook-test": w.label}},
        "spec": {"resources": [{"apiVersion": "networking.k8s.io/v1", "resource": "networkpolicies",
                                "labelSelector": {"matchLabels": {"metahook-test": w.label}}}],
                 "attachments": [{"apiVersion": "v1", "resource": "configmaps"}],
                 "hooks": {"sync": {"webhook": {"url": w.hook.url("/decorate")}}}}});
    let mut account = support::HubAccount::create(&w.client, &w.ns.name, &w.label).await;
    account.grant(&printed_roles(&[&whole.controller, &decorator])).await;
    let hub = support::Hub::start(&account.client, &w.label);

    // The controller's parent (its child made by the hub), and two other kinds of the same group with
    // an object each that owns a ConfigMap: Gizmo, whose version is then no longer served, and
    // Doohickey, which the hub may not read.
    whole.install(&w, &["p"]).await;
    let mut kept = Vec::new();
    for kind in ["Gizmo", "Doohickey"] {
        let crd = sibling_crd(&whole.group, kind);
        support::install_crds(&w.client, &serde_json::to_string(&crd).unwrap()).await;
        let object = json!({"apiVersion": format!("{}/v1", whole.group), "kind": kind,
                            "metadata": {"name": "o", "namespace": w.ns.name}});
        let owner = apply_value(&w.client, &object).await;
        let child = format!("{}-owned", kind.to_lowercase());
        owned_config_map(&w, &child, &owner).await;
        kept.push((crd, child));
    }
    let crds: Api<CustomResourceDefinition> = Api::all(w.client.clone());
    let unserve = json!([{"op": "replace", "path": "/spec/versions/0/served", "value": false}]);
    let unserve: json_patch::Patch = serde_json::from_value(unserve).unwrap();
    let gizmos = kept[0].0["metadata"]["name"].as_str().unwrap().to_owned();
    crds.patch(&gizmos, &PatchParams::default(), &Patch::Json::<()>(unserve)).await.unwrap();
    // An Ingress's child beside the decorator's attachments (no NetworkPolicy is decorated).
    apply_value(&w.client, &decorator).await;
    let ingress = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                         "metadata": {"name": "ing", "namespace": w.ns.name},
                         "spec": {"defaultBackend": {"service": {"name": "s", "port": {"number": 80}}}}});
    let ingress = apply_value(&w.client, &ingress).await;
    owned_config_map(&w, "ingress-owned", &ingress).await;
    let decorators = w.controllers("DecoratorController").await;
    eventually(WAIT, || async {
        let d = decorators.get(decorator["metadata"]["name"].as_str().unwrap()).await.unwrap();
        d.metadata.finalizers.filter(|f| f.iter().any(|f| f == CONTROLLER_FINALIZER))
    })
    .await;

    let took = kubectl_delete(&[&whole.crd, &whole.controller, &decorator], false).await;
    assert!(took < BOUND, "kubectl delete took {took:?}");
    assert!(whole.gone(&w).await, "something is left");
    assert!(w.config_map("p-child").await.is_none(), "the deleted parent type's child is swept");
    for child in ["gizmo-owned", "doohickey-owned", "ingress-owned"] {
        assert!(w.config_map(child).await.is_some(), "{child}: another kind's child was deleted");
    }
    hub.stop().await;
    account.delete().await;
    for (crd, _) in &kept {
        let _ = crds.delete(crd["metadata"]["name"].as_str().unwrap(), &DeleteParams::default()).await;
    }
    w.start_hub();
    w.finish("CompositeController").await;
}

/// Attack review of the sweep (helper-14): a parent held in its deletion by someone's finalizer while
/// its CRD is being deleted still exists, and may need its children meanwhile (another controller's
/// finalizer, a backup tool): the controller's delete sweeps no child of it, and does not wait for it.
#[tokio::test]
async fn a_parent_held_by_someones_finalizer_keeps_its_children_when_its_crd_and_controller_go() {
    let w = World::new("lc-held-parent", HOOK).await;
    let whole = Whole::new(&w, "held", false);
    whole.install(&w, &["h"]).await;
    let widgets = whole.widgets(&w).await;
    let hold = json!({"metadata": {"finalizers": ["example.com/hold"]}});
    widgets.patch("h", &PatchParams::default(), &Patch::Merge(&hold)).await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(w.client.clone());
    let crd = format!("widgets.{}", whole.group);
    crds.delete(&crd, &DeleteParams::default()).await.unwrap();
    eventually(WAIT, || async { widgets.get("h").await.unwrap().metadata.deletion_timestamp }).await;

    let controllers = w.controllers("CompositeController").await;
    let started = Instant::now();
    controllers.delete(&whole.controller_name(), &DeleteParams::default()).await.unwrap();
    eventually(BOUND, || async {
        controllers.get_opt(&whole.controller_name()).await.unwrap().is_none().then_some(())
    })
    .await;
    eprintln!("the controller went in {:?}", started.elapsed());
    assert!(w.config_map("h-child").await.is_some(), "the held parent's child was swept");

    let release = json!({"metadata": {"finalizers": null}});
    widgets.patch("h", &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
    eventually(WAIT, || async { crds.get_opt(&crd).await.unwrap().is_none().then_some(()) }).await;
    w.finish("CompositeController").await;
}
