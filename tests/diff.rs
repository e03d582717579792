//! `metahook diff` on the real control plane (issue 43, part 1): a candidate hook previewed against
//! live parents and children, read-only. What it predicts is what the hub then writes when the
//! controller is switched to the candidate; a candidate whose answer a check refuses is reported as
//! refused; one that changes nothing exits 0; and the API server's audit log shows no write of it.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use support::{AUDITED_NAMESPACE, HubAccount, World, eventually};

const WAIT: Duration = Duration::from_secs(90);

/// `sync` is the running hook: two ConfigMaps per Thing, `v: "1"`. `candidate` changes `t1-a`'s data,
/// drops `t1-b` and adds `t2-c`. `refuse` answers `t1` with a Secret (not a declared child type).
/// `malformed` answers `t2` with a ConfigMap without a name. `same` answers as `sync` does.
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
    w.composite(controller(&w, "/sync")).await;
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

/// The controller's spec with its sync hook at `path` of the test's hook server.
fn controller(w: &World, path: &str) -> Value {
    json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url(path)}}},
    })
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

/// The names of a parent's children listed under `what` (`create`, `update`, `delete`).
fn names(report: &Value, parent: &str, what: &str) -> Vec<String> {
    let parent = report["parents"].as_array().unwrap().iter().find(|p| p["parent"] == parent).unwrap();
    let mut names: Vec<String> =
        parent[what].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap().to_owned()).collect();
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
    w.composite(controller(&w, "/candidate")).await;
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

    // A DecoratorController is not previewed yet: said so, exit code 1.
    let name = format!("{}-decorator", w.label);
    w.controller(
        "DecoratorController",
        &name,
        json!({
            "resources": [{"apiVersion": "test.metahook.dev/v1", "resource": "things",
                           "labelSelector": {"matchLabels": {"metahook-test": "nobody"}}}],
            "hooks": {"sync": {"webhook": {"url": w.hook.url("/same")}}},
        }),
    )
    .await;
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_metahook"))
        .args(["diff", &name])
        .env("KUBECONFIG", support::kubeconfig_path())
        .output()
        .await
        .expect("running metahook diff");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not previewed yet: DecoratorControllers"), "{stderr}");
    let decorators = w.controllers("DecoratorController").await;
    decorators.delete(&name, &Default::default()).await.unwrap();
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
    let user = account.user();
    let records = eventually(WAIT, || async {
        let records = support::audit_records(&user);
        records.iter().any(|r| r["verb"] == "list" && r["objectRef"]["resource"] == "configmaps").then_some(records)
    })
    .await;
    let writes: Vec<&Value> =
        records.iter().filter(|r| !matches!(r["verb"].as_str(), Some("get" | "list" | "watch"))).collect();
    assert!(writes.is_empty(), "diff only reads: {writes:#?}");
    account.delete().await;
    w.finish("CompositeController").await;
}
