//! `metahook diff` on the real control plane (issue 43, part 1): a candidate hook previewed against
//! live parents and children, read-only. What it predicts is what the hub then writes when the
//! controller is switched to the candidate, for a CompositeController and a DecoratorController; the
//! customize hook's related objects reach the candidate; adoption and release are shown; a candidate
//! whose answer a check (or the safe-delete guard) refuses is reported as refused; one that changes
//! nothing exits 0; and the API server's audit log shows no write of it.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use support::{AUDITED_NAMESPACE, HubAccount, World, apply_value, eventually};

const WAIT: Duration = Duration::from_secs(90);

/// `sync` is the running hook: two ConfigMaps per Thing, `v: "1"`. `candidate` changes `t1-a`'s data,
/// drops `t1-b` and adds `t2-c`. `refuse` answers `t1` with a Secret (not a declared child type).
/// `malformed` answers `t2` with a ConfigMap without a name. `same` answers as `sync` does. `claimed`
/// answers with the children the request shows. `customize` and `decorate` are a decorator's hooks.
const HOOK: &str = r#"
def children(name, extra):
    cms = {s: {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name + "-" + s}, "data": {"v": "1"}}
           for s in ("a", "b")}
    extra(name, cms)
    return {"children": list(cms.values()), "status": {"children": len(cms)}}

def sync(req):
    return children(req["parent"]["metadata"]["name"], lambda n, cms: None)

def same(req):
    return sync(req)

def candidate_change(name, cms):
    if name == "t1":
        cms["a"]["data"]["v"] = "2"
        del cms["b"]
    if name == "t2":
        cms["c"] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name + "-c"}, "data": {"v": "1"}}

def candidate(req):
    return children(req["parent"]["metadata"]["name"], candidate_change)

def refuse(req):
    answer = sync(req)
    if req["parent"]["metadata"]["name"] == "t1":
        answer["children"].append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "t1-s"}})
    return answer

def claimed(req):
    # Exactly the children the request shows, so the request itself says what claiming decided.
    shown = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": c["metadata"]["name"]},
              "data": c.get("data", {})} for c in req["children"]["ConfigMap.v1"].values()]
    return {"children": shown, "status": {"children": len(shown)}}

def customize(req):
    return {"relatedResources": [{"apiVersion": "v1", "resource": "configmaps",
                                  "labelSelector": {"matchLabels": {"related": "yes"}}}]}

def decorate(req):
    # A decorator's candidate: a label counting the related objects, and one attachment.
    name = req["object"]["metadata"]["name"]
    return {"labels": {"related": str(len(req["related"].get("ConfigMap.v1", {})))},
            "attachments": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name + "-dec"}}]}

def malformed(req):
    answer = sync(req)
    if req["parent"]["metadata"]["name"] == "t2":
        answer["children"].append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}})
    return answer
"#;

/// The test's world: a hub running `sync` for Things `t1` and `t2`, once both have their children
/// and their status.
async fn world(test: &str) -> World {
    let w = World::new(test, HOOK).await;
    w.composite(w.in_place_spec("/sync")).await;
    for name in ["t1", "t2"] {
        w.thing(name, json!({})).await;
    }
    for name in ["t1-a", "t1-b", "t2-a", "t2-b"] {
        eventually(WAIT, || async { w.config_map(name).await }).await;
    }
    for name in ["t1", "t2"] {
        eventually(WAIT, || async {
            let thing = w.things().await.get(name).await.unwrap();
            (thing.data["status"]["children"] == 2).then_some(())
        })
        .await;
    }
    w
}

/// `metahook diff <controller> -o json --hook-url <path> ARGS...` with `kubeconfig`: its exit code and
/// report.
async fn diff(w: &World, path: &str, kubeconfig: &std::path::Path, args: &[&str]) -> (i32, Value) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
        .args(["diff", &w.label, "-o", "json", "--hook-url", &w.hook.url(path)])
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("METAHOOK_LOG")
        .output()
        .await
        .expect("running metahook diff");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("metahook diff printed no JSON ({e}): {stdout}\nstderr: {}", String::from_utf8_lossy(&output.stderr))
    });
    (output.status.code().expect("metahook diff exited"), report)
}

/// Each ConfigMap in the test's namespace by name: its resourceVersion.
async fn versions(w: &World) -> BTreeMap<String, String> {
    let list = w.config_maps().await.list(&Default::default()).await.unwrap();
    list.items
        .into_iter()
        .filter(|cm| cm.metadata.name.as_deref() != Some("kube-root-ca.crt"))
        .map(|cm| (cm.metadata.name.unwrap(), cm.metadata.resource_version.unwrap()))
        .collect()
}

/// The report of `parent` (`namespace/name`).
fn parent_report<'a>(report: &'a Value, parent: &str) -> &'a Value {
    report["parents"].as_array().unwrap().iter().find(|p| p["parent"] == parent).unwrap()
}

/// The names of a parent's children listed under `what` (`create`, `update`, `delete`, `adopt`,
/// `release`, `related`).
fn names(report: &Value, parent: &str, what: &str) -> Vec<String> {
    let parent = parent_report(report, parent);
    let listed = parent.get(what).and_then(Value::as_array).cloned().unwrap_or_default();
    let mut names: Vec<String> = listed.iter().map(|c| c["name"].as_str().unwrap().to_owned()).collect();
    names.sort();
    names
}

#[tokio::test]
async fn diff_predicts_exactly_the_writes_the_hub_then_makes() {
    let w = world("diff-predicts").await;
    let t1 = format!("{}/t1", w.ns.name);
    let t2 = format!("{}/t2", w.ns.name);
    let before = versions(&w).await;

    let (code, report) = diff(&w, "/candidate", &support::kubeconfig_path(), &["--qps", "0"]).await;
    assert_eq!(code, 2, "a delete is risky: {report:#}");
    assert_eq!(report["summary"]["parents"], 2, "{report:#}");
    assert_eq!(report["summary"]["create"], 1, "{report:#}");
    assert_eq!(report["summary"]["update"], 1, "{report:#}");
    assert_eq!(report["summary"]["delete"], 1, "{report:#}");
    assert_eq!(report["summary"]["refused"], 0, "{report:#}");
    assert_eq!(names(&report, &t1, "update"), ["t1-a"]);
    assert_eq!(names(&report, &t1, "delete"), ["t1-b"]);
    assert!(names(&report, &t1, "create").is_empty());
    assert_eq!(names(&report, &t2, "create"), ["t2-c"]);
    assert!(names(&report, &t2, "update").is_empty());
    assert!(names(&report, &t2, "delete").is_empty());
    let t1_report = report["parents"].as_array().unwrap().iter().find(|p| p["parent"] == t1.as_str()).unwrap();
    assert_eq!(t1_report["update"][0]["fields"], json!([{"path": "/data/v", "old": "1", "new": "2"}]));
    assert_eq!(t1_report["status"], json!([{"path": "/status/children", "old": 2, "new": 1}]));
    // The same candidate started by diff itself (`--hook-cmd`, asked on the controller's path).
    let dir = tempfile::tempdir().unwrap();
    let handlers = dir.path().join("candidate.py");
    std::fs::write(&handlers, format!("{HOOK}\nsync = candidate\n")).unwrap();
    let server = support::repo_root().join("tests/hooks/hookserver.py");
    let cmd = format!("env HOOK_PORT=$PORT python3 {} {}", server.display(), handlers.display());
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
        .args(["diff", &w.label, "-o", "json", "--qps", "0", "--hook-cmd", &cmd])
        .env("KUBECONFIG", support::kubeconfig_path())
        .output()
        .await
        .expect("running metahook diff");
    let started: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", String::from_utf8_lossy(&output.stderr)));
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(started["summary"], report["summary"], "{started:#}");
    assert_eq!(started["parents"], report["parents"], "{started:#}");

    // The same preview for a terminal: the summary first, then each change on a line of its own.
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
        .args(["diff", &w.label, "--qps", "0", "--hook-url", &w.hook.url("/candidate")])
        .env("KUBECONFIG", support::kubeconfig_path())
        .output()
        .await
        .expect("running metahook diff");
    assert_eq!(output.status.code(), Some(2));
    let text = String::from_utf8_lossy(&output.stdout);
    let ns = &w.ns.name;
    let expected = [
        "2 parents: 1 create, 1 update (0 recreate), 1 delete, 0 adopt, 0 release, 2 status changes, 0 refused, \
         0 skipped"
            .to_owned(),
        format!(
            "parent {ns}/t1\n  ~ update ConfigMap {ns}/t1-a\n      /data/v: \"1\" → \"2\"\n  - delete ConfigMap {ns}/t1-b\n  ~ status\n      /status/children: 2 → 1\n"
        ),
        format!("parent {ns}/t2\n  + create ConfigMap {ns}/t2-c\n  ~ status\n      /status/children: 2 → 3\n"),
    ];
    for line in &expected {
        assert!(text.contains(line.as_str()), "{line:?} in:\n{text}");
    }
    assert_eq!(versions(&w).await, before, "diff wrote nothing: every child's resourceVersion is unchanged");

    // The hub, switched to the candidate, writes what diff predicted, no more.
    w.composite(w.in_place_spec("/candidate")).await;
    eventually(WAIT, || async {
        let now = versions(&w).await;
        (now.contains_key("t2-c") && !now.contains_key("t1-b") && now.get("t1-a") != before.get("t1-a")).then_some(())
    })
    .await;
    eventually(WAIT, || async {
        let thing = w.things().await.get("t2").await.unwrap();
        (thing.data["status"]["children"] == 3).then_some(())
    })
    .await;
    let after = versions(&w).await;
    let created: Vec<&String> = after.keys().filter(|k| !before.contains_key(*k)).collect();
    let deleted: Vec<&String> = before.keys().filter(|k| !after.contains_key(*k)).collect();
    let updated: Vec<&String> = after.keys().filter(|k| before.get(*k).is_some_and(|v| v != &after[*k])).collect();
    assert_eq!(created, ["t2-c"], "{before:?} → {after:?}");
    assert_eq!(deleted, ["t1-b"], "{before:?} → {after:?}");
    assert_eq!(updated, ["t1-a"], "{before:?} → {after:?}");
    w.finish("CompositeController").await;
}

#[tokio::test]
async fn a_refused_answer_is_risky_and_an_unchanged_one_is_safe() {
    let w = world("diff-refused").await;
    let t1 = format!("{}/t1", w.ns.name);
    let before = versions(&w).await;

    let (code, report) = diff(&w, "/refuse", &support::kubeconfig_path(), &["--qps", "0"]).await;
    assert_eq!(code, 2, "a refused answer is risky: {report:#}");
    assert_eq!(report["summary"]["refused"], 1, "{report:#}");
    let refused: Vec<&Value> =
        report["parents"].as_array().unwrap().iter().filter(|p| p.get("refused").is_some()).collect();
    assert_eq!(refused.len(), 1, "{report:#}");
    assert_eq!(refused[0]["parent"], t1.as_str(), "{report:#}");
    assert!(refused[0]["refused"].as_str().unwrap().contains("Secret"), "names the undeclared type: {report:#}");

    let (code, report) = diff(&w, "/malformed", &support::kubeconfig_path(), &["--qps", "0"]).await;
    assert_eq!(code, 2, "a malformed child is refused: {report:#}");
    let refused: Vec<&Value> =
        report["parents"].as_array().unwrap().iter().filter(|p| p.get("refused").is_some()).collect();
    assert_eq!(refused.len(), 1, "{report:#}");
    assert_eq!(refused[0]["parent"], format!("{}/t2", w.ns.name), "{report:#}");

    let (code, report) = diff(&w, "/same", &support::kubeconfig_path(), &[]).await;
    assert_eq!(code, 0, "nothing changes: {report:#}");
    let summary = &report["summary"];
    for what in ["create", "update", "delete", "adopt", "release", "statusChanged", "refused", "skipped"] {
        assert_eq!(summary[what], 0, "{what}: {report:#}");
    }
    assert_eq!(summary["parents"], 2, "{report:#}");

    // `-l` narrows the parents.
    let (_, report) = diff(&w, "/candidate", &support::kubeconfig_path(), &["-l", "metahook-test=nobody"]).await;
    assert_eq!(report["summary"]["parents"], 0, "{report:#}");
    assert_eq!(versions(&w).await, before);

    w.finish("CompositeController").await;
}

#[tokio::test]
async fn diff_makes_no_write_the_audit_log_would_show() {
    let w = world("diff-audited").await;
    support::audited_namespace(&w.client).await;
    let name = format!("diff-{}", support::unique_suffix());
    let mut account = HubAccount::create_named(&w.client, AUDITED_NAMESPACE, &name, &name).await;
    let reader = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
    "metadata": {"name": "reader"},
    "rules": [
        {"apiGroups": ["metacontroller.k8s.io"], "resources": ["compositecontrollers", "decoratorcontrollers"],
         "verbs": ["get", "list"]},
        {"apiGroups": ["test.metahook.dev"], "resources": ["things"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]},
    ]});
    account.grant(&[reader]).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = account.kubeconfig(dir.path());

    let (code, report) = diff(&w, "/candidate", &kubeconfig, &["--qps", "20"]).await;
    assert_eq!(code, 2, "{report:#}");
    assert_eq!(report["summary"]["parents"], 2, "the account read the parents: {report:#}");

    // A DecoratorController with a customize hook, previewed by the same account (labelled for no hub,
    // so nothing runs it): targets, attachments and related objects are all read, nothing written.
    apply_value(
        &w.client,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "related", "namespace": w.ns.name, "labels": {"related": "yes"}}}),
    )
    .await;
    let decorator = format!("{}-dec", w.label);
    apply_value(
        &w.client,
        &json!({"apiVersion": support::CONTROLLERS, "kind": "DecoratorController",
                "metadata": {"name": decorator, "labels": {"metahook-test": "nobody"}},
                "spec": {"resources": [{"apiVersion": "test.metahook.dev/v1", "resource": "things",
                                        "labelSelector": {"matchLabels": {"metahook-test": w.label}}}],
                         "attachments": [{"apiVersion": "v1", "resource": "configmaps"}],
                         "hooks": {"sync": {"webhook": {"url": w.hook.url("/decorate")}},
                                   "customize": {"webhook": {"url": w.hook.url("/customize")}}}}}),
    )
    .await;
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
        .args(["diff", &decorator, "-o", "json", "--qps", "20"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .await
        .expect("running metahook diff");
    let decorated: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", String::from_utf8_lossy(&output.stderr)));
    assert_eq!(output.status.code(), Some(0), "{decorated:#}");
    assert_eq!(decorated["summary"]["parents"], 2, "{decorated:#}");
    assert_eq!(decorated["summary"]["create"], 2, "an attachment per target: {decorated:#}");
    let t1 = parent_report(&decorated, &format!("{}/t1", w.ns.name));
    assert_eq!(t1["related"][0]["name"], "related", "{decorated:#}");
    assert_eq!(t1["metadata"], json!([{"path": "/metadata/labels/related", "old": null, "new": "1"}]));
    let decorators = w.controllers("DecoratorController").await;
    decorators.delete(&decorator, &Default::default()).await.unwrap();

    let user = account.user();
    let records = eventually(WAIT, || async {
        let records = support::audit_records(&user);
        let listed = |resource: &str| {
            records.iter().filter(|r| r["verb"] == "list" && r["objectRef"]["resource"] == resource).count()
        };
        // Composite: the children; decorator: the attachments and the related objects.
        (listed("configmaps") >= 3 && listed("things") >= 2).then_some(records)
    })
    .await;
    let writes: Vec<&Value> =
        records.iter().filter(|r| !matches!(r["verb"].as_str(), Some("get" | "list" | "watch"))).collect();
    assert!(writes.is_empty(), "diff only reads: {writes:#?}");
    account.delete().await;
    w.finish("CompositeController").await;
}

/// The guard of `metahook.dev/max-deletions-per-sync` on the controller refuses, in the preview as in
/// a sync, a parent whose answer deletes more than it allows; the other parent is previewed as usual.
#[tokio::test]
async fn the_safe_delete_guard_refuses_a_parent_in_the_report() {
    let w = world("diff-guard").await;
    let (t1, t2) = (format!("{}/t1", w.ns.name), format!("{}/t2", w.ns.name));
    w.composite_annotated(json!({"metahook.dev/max-deletions-per-sync": "0"}), w.in_place_spec("/sync")).await;
    let before = versions(&w).await;

    let (code, report) = diff(&w, "/candidate", &support::kubeconfig_path(), &["--qps", "0"]).await;
    assert_eq!(code, 2, "a refused parent is risky: {report:#}");
    assert_eq!(report["summary"]["refused"], 1, "{report:#}");
    assert_eq!(report["summary"]["delete"], 0, "the refused parent deletes nothing: {report:#}");
    let refused = parent_report(&report, &t1)["refused"].as_str().unwrap_or_default().to_owned();
    assert!(refused.contains("metahook.dev/max-deletions-per-sync"), "names the guard: {refused}");
    assert!(refused.contains("t1-b"), "names the child it would delete: {refused}");
    assert!(parent_report(&report, &t2).get("refused").is_none(), "{report:#}");
    assert_eq!(names(&report, &t2, "create"), ["t2-c"], "{report:#}");
    assert_eq!(versions(&w).await, before);
    w.finish("CompositeController").await;
}

/// An orphan the parent's selector selects is adopted (`<`) and shown to the candidate as a child; a
/// child the selector no longer selects is released (`>`) and not shown; the hub, switched to the
/// candidate, does the same.
#[tokio::test]
async fn adoption_and_release_are_previewed_as_the_hub_then_claims() {
    let mut w = world("diff-claims").await;
    let t1 = format!("{}/t1", w.ns.name);
    // With the hub stopped, an orphan carrying t1's selector label appears and t1-a leaves t1's selector.
    w.stop_hub().await;
    let uid = w.things().await.get("t1").await.unwrap().metadata.uid.unwrap();
    apply_value(
        &w.client,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "orphan", "namespace": w.ns.name, "labels": {"controller-uid": uid}},
                "data": {"v": "o"}}),
    )
    .await;
    let patch = json!({"metadata": {"labels": {"controller-uid": "someone-else"}}});
    w.config_maps().await.patch("t1-a", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
    let before = versions(&w).await;
    let requests = w.hook.requests("/claimed").len();

    let (code, report) = diff(&w, "/claimed", &support::kubeconfig_path(), &["--qps", "0"]).await;
    assert_eq!(code, 0, "adoption and release are not risky: {report:#}");
    assert_eq!(names(&report, &t1, "adopt"), ["orphan"], "{report:#}");
    assert_eq!(names(&report, &t1, "release"), ["t1-a"], "{report:#}");
    assert_eq!(report["summary"]["adopt"], 1, "{report:#}");
    assert_eq!(report["summary"]["release"], 1, "{report:#}");
    let asked = w.hook.requests("/claimed");
    let t1_request = asked[requests..]
        .iter()
        .find(|r| r["parent"]["metadata"]["name"] == "t1")
        .expect("the candidate was asked about t1");
    let shown: Vec<&String> = t1_request["children"]["ConfigMap.v1"].as_object().unwrap().keys().collect();
    assert_eq!(shown, ["orphan", "t1-b"], "the adopted orphan is shown, the released child is not");
    let orphan = &t1_request["children"]["ConfigMap.v1"]["orphan"];
    assert_eq!(orphan["metadata"]["ownerReferences"][0]["uid"], uid.as_str(), "shown as t1's: {orphan:#}");
    let text = tokio::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
        .args(["diff", &w.label, "--qps", "0", "--hook-url", &w.hook.url("/claimed")])
        .env("KUBECONFIG", support::kubeconfig_path())
        .output()
        .await
        .expect("running metahook diff");
    let text = String::from_utf8_lossy(&text.stdout);
    let ns = &w.ns.name;
    for line in [format!("  < adopt ConfigMap {ns}/orphan\n"), format!("  > release ConfigMap {ns}/t1-a\n")] {
        assert!(text.contains(&line), "{line:?} in:\n{text}");
    }
    assert_eq!(versions(&w).await, before, "diff adopted and released nothing itself");

    // The hub, switched to the candidate, adopts and releases the same.
    w.composite(w.in_place_spec("/claimed")).await;
    w.start_hub();
    let cms = w.config_maps().await;
    let controller_of = |cm: &kube::api::DynamicObject| {
        cm.metadata.owner_references.iter().flatten().find(|r| r.controller == Some(true)).map(|r| r.uid.clone())
    };
    eventually(WAIT, || async {
        let orphan = cms.get("orphan").await.unwrap();
        let released = cms.get("t1-a").await.unwrap();
        (controller_of(&orphan).as_deref() == Some(uid.as_str()) && controller_of(&released).is_none()).then_some(())
    })
    .await;
    w.finish("CompositeController").await;
}

/// A customize hook names the ConfigMap `source` (in the parent's namespace); `sync` ignores related
/// objects, `copy` copies the source's data into the parent's child `<name>-copy`.
const RELATED: &str = r#"
def customize(req):
    return {"relatedResources": [{"apiVersion": "v1", "resource": "configmaps", "names": ["source"]}]}

def answer(req, data):
    name = req["parent"]["metadata"]["name"]
    child = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name + "-copy"}, "data": data}
    return {"children": [child], "status": {"copied": data.get("v", "")}}

def sync(req):
    return answer(req, {"v": "none"})

def copy(req):
    sources = list(req["related"].get("ConfigMap.v1", {}).values())
    return answer(req, sources[0].get("data", {}) if sources else {"v": "missing"})
"#;

/// The controller's own customize hook is asked, the related object it names reaches the candidate
/// in the request (keyed as the hook version keys it), the report lists it and shows the change it
/// makes; the hub, switched to the candidate, writes that change.
#[tokio::test]
async fn a_customize_hooks_related_object_reaches_the_candidate() {
    let w = World::new("diff-related", RELATED).await;
    let ns = w.ns.name.clone();
    apply_value(
        &w.client,
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "source", "namespace": ns},
                "data": {"v": "from-source"}}),
    )
    .await;
    let spec = |path: &str| {
        json!({
            "generateSelector": true,
            "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
            "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
            "hooks": {"sync": {"webhook": {"url": w.hook.url(path)}},
                      "customize": {"webhook": {"url": w.hook.url("/customize")}}},
        })
    };
    w.composite(spec("/sync")).await;
    w.thing("t1", json!({})).await;
    eventually(WAIT, || async { w.config_map("t1-copy").await.filter(|c| c.data["data"]["v"] == "none") }).await;
    let before = versions(&w).await;
    let customized = w.hook.requests("/customize").len();

    let (code, report) = diff(&w, "/copy", &support::kubeconfig_path(), &["--qps", "0"]).await;
    assert_eq!(code, 0, "{report:#}");
    let t1 = format!("{ns}/t1");
    assert!(w.hook.requests("/customize").len() > customized, "diff asked the controller's customize hook");
    let asked = w.hook.requests("/copy");
    let request = asked.last().expect("the candidate was asked");
    assert_eq!(
        request["related"]["ConfigMap.v1"]["source"]["data"],
        json!({"v": "from-source"}),
        "the related object reached the candidate, keyed by name (v1): {request:#}"
    );
    assert_eq!(names(&report, &t1, "related"), ["source"], "{report:#}");
    assert_eq!(parent_report(&report, &t1)["related"][0]["kind"], "ConfigMap", "{report:#}");
    assert_eq!(names(&report, &t1, "update"), ["t1-copy"], "{report:#}");
    assert_eq!(
        parent_report(&report, &t1)["update"][0]["fields"],
        json!([{"path": "/data/v", "old": "none", "new": "from-source"}]),
        "{report:#}"
    );
    assert_eq!(versions(&w).await, before);

    w.composite(spec("/copy")).await;
    eventually(WAIT, || async { w.config_map("t1-copy").await.filter(|c| c.data["data"]["v"] == "from-source") }).await;
    w.finish("CompositeController").await;
}

/// A decorator of Things: `decorate` labels and annotates its target, sets its status and keeps two
/// attachments; `redecorate` changes a label, adds one, removes the annotation, changes the status,
/// updates one attachment, drops the other and adds a third.
const DECORATE: &str = r#"
def attachment(name, suffix, v):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name + "-" + suffix}, "data": {"v": v}}

def decorate(req):
    name = req["object"]["metadata"]["name"]
    return {"labels": {"decorated": "1"}, "annotations": {"note": "a"}, "status": {"n": 1},
            "attachments": [attachment(name, "att", "1"), attachment(name, "gone", "1")]}

def redecorate(req):
    name = req["object"]["metadata"]["name"]
    return {"labels": {"decorated": "2", "extra": "x"}, "annotations": {"note": None}, "status": {"n": 2},
            "attachments": [attachment(name, "att", "2"), attachment(name, "new", "1")]}
"#;

/// A DecoratorController previewed: the attachments to create, update and delete, the target's label,
/// annotation and status changes — and then exactly what the hub writes once switched to the candidate.
#[tokio::test]
async fn a_decorator_preview_is_what_the_hub_then_writes() {
    let w = World::new("diff-decorator", DECORATE).await;
    let ns = w.ns.name.clone();
    let spec = |path: &str| {
        json!({
            "resources": [{"apiVersion": "test.metahook.dev/v1", "resource": "things"}],
            "attachments": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
            "hooks": {"sync": {"webhook": {"url": w.hook.url(path)}}},
        })
    };
    w.decorator(spec("/decorate")).await;
    w.thing("t", json!({})).await;
    // Not a target: outside the decorator's label selector.
    apply_value(
        &w.client,
        &json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing",
                "metadata": {"name": "other", "namespace": ns, "labels": {"metahook-test": "nobody"}}}),
    )
    .await;
    let things = w.things().await;
    eventually(WAIT, || async {
        let t = things.get("t").await.ok()?;
        (t.data["status"]["n"] == 1 && t.metadata.annotations.as_ref()?.get("note").is_some()).then_some(())
    })
    .await;
    for name in ["t-att", "t-gone"] {
        eventually(WAIT, || async { w.config_map(name).await }).await;
    }
    let before = versions(&w).await;
    let target_before = things.get("t").await.unwrap();

    let (code, report) = diff(&w, "/redecorate", &support::kubeconfig_path(), &["--qps", "0"]).await;
    assert_eq!(code, 2, "an attachment is deleted: {report:#}");
    assert_eq!(report["kind"], "DecoratorController", "{report:#}");
    assert_eq!(report["summary"]["parents"], 1, "only the selected target: {report:#}");
    let t = format!("{ns}/t");
    assert_eq!(names(&report, &t, "create"), ["t-new"], "{report:#}");
    assert_eq!(names(&report, &t, "update"), ["t-att"], "{report:#}");
    assert_eq!(names(&report, &t, "delete"), ["t-gone"], "{report:#}");
    let target = parent_report(&report, &t);
    assert_eq!(target["update"][0]["fields"], json!([{"path": "/data/v", "old": "1", "new": "2"}]), "{report:#}");
    assert_eq!(target["status"], json!([{"path": "/status/n", "old": 1, "new": 2}]), "{report:#}");
    let mut metadata = target["metadata"].as_array().unwrap().clone();
    metadata.sort_by_key(|f| f["path"].as_str().unwrap().to_owned());
    assert_eq!(
        metadata,
        [
            json!({"path": "/metadata/annotations/note", "old": "a", "new": null}),
            json!({"path": "/metadata/labels/decorated", "old": "1", "new": "2"}),
            json!({"path": "/metadata/labels/extra", "old": null, "new": "x"}),
        ],
        "{report:#}"
    );
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
        .args(["diff", &w.label, "--qps", "0", "--hook-url", &w.hook.url("/redecorate")])
        .env("KUBECONFIG", support::kubeconfig_path())
        .output()
        .await
        .expect("running metahook diff");
    let text = String::from_utf8_lossy(&output.stdout);
    for line in [
        format!("DecoratorController {} with", w.label),
        "1 targets: 1 create, 1 update (0 recreate), 1 delete, 0 adopt, 0 release, 1 status changes, 1 label/annotation \
         changes, 0 refused, 0 skipped"
            .to_owned(),
        format!("target {ns}/t\n"),
        "  ~ labels and annotations\n      /metadata/labels/decorated: \"1\" → \"2\"\n".to_owned(),
    ] {
        assert!(text.contains(&line), "{line:?} in:\n{text}");
    }
    assert_eq!(versions(&w).await, before, "diff wrote no attachment");
    assert_eq!(things.get("t").await.unwrap().metadata.resource_version, target_before.metadata.resource_version);

    // The hub, switched to the candidate, writes what diff predicted.
    w.decorator(spec("/redecorate")).await;
    let decorated = eventually(WAIT, || async {
        let t = things.get("t").await.ok()?;
        (t.data["status"]["n"] == 2 && t.metadata.labels.as_ref()?.get("extra").is_some()).then_some(t)
    })
    .await;
    eventually(WAIT, || async {
        let now = versions(&w).await;
        (now.contains_key("t-new") && !now.contains_key("t-gone") && now.get("t-att") != before.get("t-att"))
            .then_some(())
    })
    .await;
    let labels = decorated.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("decorated").map(String::as_str), Some("2"));
    assert!(!decorated.metadata.annotations.unwrap_or_default().contains_key("note"));
    let after = versions(&w).await;
    let created: Vec<&String> = after.keys().filter(|k| !before.contains_key(*k)).collect();
    let deleted: Vec<&String> = before.keys().filter(|k| !after.contains_key(*k)).collect();
    let updated: Vec<&String> = after.keys().filter(|k| before.get(*k).is_some_and(|v| v != &after[*k])).collect();
    assert_eq!(created, ["t-new"], "{before:?} → {after:?}");
    assert_eq!(deleted, ["t-gone"], "{before:?} → {after:?}");
    assert_eq!(updated, ["t-att"], "{before:?} → {after:?}");
    w.finish("DecoratorController").await;
}

/// Three ConfigMaps per Thing with the Thing's `spec.v`, rolled one at a time (`RollingInPlace`) and
/// gated on a `Ready` condition ConfigMaps never have: after a change of `spec`, each sync moves at
/// most one child, and the rollout then waits.
const ROLLING: &str = r#"
def rolling(req):
    p = req["parent"]
    children = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "%s-%d" % (p["metadata"]["name"], i)},
                 "data": {"v": str(p["spec"]["v"])}} for i in range(3)]
    return {"children": children, "status": {"v": p["spec"]["v"]}}
"#;

/// With rolling child updates, the preview is the rollout's next step: the first sync after a change of
/// the parent moves one child to the new revision and writes the revisions; the hub then does exactly
/// that, and no more.
#[tokio::test]
async fn a_rolling_update_is_previewed_as_its_next_step() {
    let mut w = World::new("diff-rolling", ROLLING).await;
    let spec = json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things",
                           "revisionHistory": {"fieldPaths": ["spec"]}},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps",
                            "updateStrategy": {"method": "RollingInPlace",
                                               "statusChecks": {"conditions": [{"type": "Ready", "status": "True"}]}}}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/rolling")}}},
    });
    w.composite(spec).await;
    w.thing("t1", json!({"v": 1})).await;
    for name in ["t1-0", "t1-1", "t1-2"] {
        eventually(WAIT, || async { w.config_map(name).await }).await;
    }
    let revisions_api =
        support::api(&w.client, "metacontroller.k8s.io/v1alpha1", "ControllerRevision", Some(&w.ns.name)).await;
    let revision_names = || async {
        let list = revisions_api.list(&Default::default()).await.unwrap();
        list.items.into_iter().map(|r| r.metadata.name.unwrap()).collect::<std::collections::BTreeSet<_>>()
    };
    let first = eventually(WAIT, || async { Some(revision_names().await).filter(|r| r.len() == 1) }).await;
    // The parent changes while no hub runs: its rollout has not started.
    w.stop_hub().await;
    w.thing("t1", json!({"v": 2})).await;
    let before = versions(&w).await;

    let (code, report) = diff(&w, "/rolling", &support::kubeconfig_path(), &["--qps", "0"]).await;
    assert_eq!(code, 0, "one child updated in place is not risky: {report:#}");
    let t1 = format!("{}/t1", w.ns.name);
    let moved = names(&report, &t1, "update");
    assert_eq!(moved.len(), 1, "one child moves to the new revision: {report:#}");
    assert!(names(&report, &t1, "create").is_empty() && names(&report, &t1, "delete").is_empty(), "{report:#}");
    let parent = parent_report(&report, &t1);
    assert_eq!(parent["update"][0]["fields"], json!([{"path": "/data/v", "old": "1", "new": "2"}]), "{report:#}");
    let revisions = parent["revisions"].as_array().unwrap();
    let created: Vec<&str> =
        revisions.iter().filter(|r| r["write"] == "create").map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(created.len(), 1, "the new revision is created: {report:#}");
    assert!(!first.contains(created[0]), "{report:#}");
    let updated: Vec<&str> =
        revisions.iter().filter(|r| r["write"] == "update").map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(updated, first.iter().map(String::as_str).collect::<Vec<_>>(), "the old one gives up a child");
    let condition = parent["status"].as_array().unwrap().iter().find(|f| f["path"] == "/status/conditions").cloned();
    assert!(
        condition.is_some_and(|c| c["new"].to_string().contains("RolloutProgressing")),
        "the status says the rollout progresses: {report:#}"
    );
    assert_eq!(versions(&w).await, before, "diff wrote nothing");
    assert_eq!(revision_names().await, first, "diff wrote no revision");

    // The hub does that step, and waits there (the moved ConfigMap never reports Ready).
    w.start_hub();
    eventually(WAIT, || async {
        let now = versions(&w).await;
        now.iter().any(|(name, version)| before.get(name) != Some(version)).then_some(())
    })
    .await;
    let names_now = eventually(WAIT, || async { Some(revision_names().await).filter(|r| r.len() == 2) }).await;
    assert!(names_now.contains(created[0]), "the revision diff named: {names_now:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = versions(&w).await;
    let changed: Vec<&String> = after.keys().filter(|k| before.get(*k) != after.get(*k)).collect();
    assert_eq!(changed, moved.iter().collect::<Vec<_>>(), "{before:?} → {after:?}");
    w.finish("CompositeController").await;
}

/// A parent type without a `/status` subresource: the hub's status write is a change of the parent
/// that counts in its generation, so the status it writes says the generation after the write. The
/// preview shows that value, and the hub then writes exactly the status the preview shows.
#[tokio::test]
async fn a_status_written_without_a_subresource_is_previewed_as_the_hub_writes_it() {
    let w = World::new("diff-statusless", HOOK).await;
    let mut spec = w.in_place_spec("/sync");
    spec["parentResource"]["resource"] = json!("statuslessthings");
    w.composite(spec.clone()).await;
    let things = support::api(&w.client, "test.metahook.dev/v1", "StatuslessThing", Some(&w.ns.name)).await;
    apply_value(
        &w.client,
        &json!({"apiVersion": "test.metahook.dev/v1", "kind": "StatuslessThing",
                "metadata": {"name": "t2", "namespace": w.ns.name, "labels": {"metahook-test": w.label}}}),
    )
    .await;
    let settled = eventually(WAIT, || async {
        let thing = things.get("t2").await.ok()?;
        (thing.data["status"]["children"] == 2).then_some(thing)
    })
    .await;

    let (code, report) = diff(&w, "/candidate", &support::kubeconfig_path(), &["--qps", "0"]).await;
    assert_eq!(code, 0, "{report:#}");
    let t2 = format!("{}/t2", w.ns.name);
    let status = parent_report(&report, &t2)["status"].clone();
    let generation = settled.metadata.generation.unwrap();
    let mut expected = vec![json!({"path": "/status/children", "old": 2, "new": 3})];
    expected.push(json!({"path": "/status/observedGeneration", "old": generation, "new": generation + 1}));
    assert_eq!(status, json!(expected), "{report:#}");

    spec["hooks"]["sync"]["webhook"]["url"] = json!(w.hook.url("/candidate"));
    w.composite(spec).await;
    let written = eventually(WAIT, || async {
        let thing = things.get("t2").await.ok()?;
        (thing.data["status"]["children"] == 3).then_some(thing)
    })
    .await;
    assert_eq!(written.data["status"], json!({"children": 3, "observedGeneration": generation + 1}));
    w.finish("CompositeController").await;
}

/// A MapController's running hook copies each input ConfigMap into `<name>-copy` (`v: "1"`); the
/// candidate writes `v: "2"` for input `a` only and drops `b`'s copy.
const MAP: &str = r#"
def copy(req, v):
    name = req["input"]["metadata"]["name"]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name + "-copy"}, "data": {"v": v}}

def map(req):
    return {"outputs": [copy(req, "1")]}

def remap(req):
    name = req["input"]["metadata"]["name"]
    return {"outputs": [] if name == "b" else [copy(req, "2" if name == "a" else "1")]}
"#;

#[tokio::test]
async fn a_map_controller_preview_is_what_the_hub_then_writes() {
    let w = World::new("diff-map", MAP).await;
    let ns = w.ns.name.clone();
    let spec = |path: &str| {
        json!({
            "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things",
                               "labelSelector": {"matchLabels": {"metahook-test": w.label}}},
            "inputResources": [{"apiVersion": "v1", "resource": "configmaps"}],
            "outputResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
            "hooks": {"map": {"webhook": {"url": w.hook.url(path)}}},
        })
    };
    w.controller("MapController", &w.label, spec("/map")).await;
    for name in ["a", "b", "c"] {
        apply_value(
            &w.client,
            &json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": ns, "labels": {"input": "yes"}}}),
        )
        .await;
    }
    w.thing("p", json!({"selector": {"matchLabels": {"input": "yes"}}})).await;
    for name in ["a-copy", "b-copy", "c-copy"] {
        eventually(WAIT, || async { w.config_map(name).await }).await;
    }
    let things = w.things().await;
    eventually(WAIT, || async {
        let p = things.get("p").await.ok()?;
        (p.data["status"]["outputs"]["configmaps"]["total"] == 3).then_some(())
    })
    .await;
    let before = versions(&w).await;
    let (code, report) = diff(&w, "/remap", &support::kubeconfig_path(), &["--qps", "0"]).await;
    assert_eq!(code, 2, "an output is deleted: {report:#}");
    assert_eq!(report["kind"], "MapController", "{report:#}");
    let p = format!("{ns}/p");
    assert_eq!(names(&report, &p, "create"), Vec::<String>::new(), "{report:#}");
    assert_eq!(names(&report, &p, "update"), ["a-copy"], "{report:#}");
    assert_eq!(names(&report, &p, "delete"), ["b-copy"], "{report:#}");
    let parent = parent_report(&report, &p);
    assert_eq!(
        parent["status"],
        json!([{"path": "/status/outputs/configmaps/total", "old": 3, "new": 2}]),
        "{report:#}"
    );
    assert_eq!(versions(&w).await, before, "diff wrote nothing");

    w.controller("MapController", &w.label, spec("/remap")).await;
    eventually(WAIT, || async {
        let now = versions(&w).await;
        (!now.contains_key("b-copy") && now.get("a-copy") != before.get("a-copy")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = versions(&w).await;
    let updated: Vec<&String> = after.keys().filter(|k| before.get(*k).is_some_and(|v| v != &after[*k])).collect();
    assert_eq!(updated, ["a-copy"], "{before:?} → {after:?}");
    assert!(after.keys().all(|k| before.contains_key(k)), "nothing created: {before:?} → {after:?}");
    w.finish("MapController").await;
}
