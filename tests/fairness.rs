//! Fair queues on the real control plane (issues 63, 68), counted in order of service — the order in
//! which the hook received its calls — never timed: a change in another namespace waits for at most a
//! turn of a flood, not for the flood; a restart's relist stands behind a change seen live; a change
//! made while the hub was down, relisted at its start, waits for a turn of a tenant's sustained flood of
//! changes, not for its end; and a controller whose hook is slow holds none of another controller's
//! workers.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::{TestNamespace, World, apply_value, eventually};

const WAIT: Duration = Duration::from_secs(120);

/// The hook of the sustained flood's controller: [`HOOK`]'s `sync`, 0.4 s a call.
const PATH: &str = "/sustained";

/// One ConfigMap per Thing, `data.v` from `spec.v`; each call takes `DELAY` seconds, so that a flood
/// of parents is a backlog the hub takes seconds to drain.
const HOOK: &str = r#"
import os
import time
DELAY = 0.05

def sync(request):
    parent = request["parent"]
    time.sleep(DELAY)
    v = str((parent.get("spec") or {}).get("v", 0))
    return {"children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": parent["metadata"]["name"]},
                          "data": {"v": v}}], "status": {"v": v}}

def sustained(request):
    time.sleep(0.4)
    return sync(request)

RELEASE = None  # set by the test that calls `slow`: a file whose existence lets its calls answer

def slow(request):
    deadline = time.time() + 110
    while not (RELEASE and os.path.exists(RELEASE)) and time.time() < deadline:
        time.sleep(0.05)
    return {"children": [], "status": {}}
"#;

/// A Thing `name` in `namespace`, labelled for the test's controller.
async fn thing(w: &World, namespace: &str, name: &str, v: u32) {
    apply_value(
        &w.client,
        &json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing",
                "metadata": {"name": name, "namespace": namespace, "labels": {"metahook-test": w.label}},
                "spec": {"v": v}}),
    )
    .await;
}

/// The (namespace, name, v) of each parent the hook was called for, in the order it was called.
fn calls(w: &World, path: &str) -> Vec<(String, String, String)> {
    w.hook
        .requests(path)
        .into_iter()
        .map(|r| {
            let meta = &r["parent"]["metadata"];
            let v = r["parent"]["spec"]["v"].to_string();
            (
                meta["namespace"].as_str().unwrap_or_default().to_owned(),
                meta["name"].as_str().unwrap_or_default().to_owned(),
                v,
            )
        })
        .collect()
}

/// How many of `flood`'s calls came between the `since`-th call and the first call for `namespace/name`
/// at `v` after it.
fn flood_calls_before(w: &World, since: usize, flood: &str, (namespace, name, v): (&str, &str, u32)) -> Option<usize> {
    flood_calls_before_on(w, "/sync", since, flood, (namespace, name, v))
}

/// [`flood_calls_before`], for the hook at `path`.
fn flood_calls_before_on(
    w: &World,
    path: &str,
    since: usize,
    flood: &str,
    (namespace, name, v): (&str, &str, u32),
) -> Option<usize> {
    let all = calls(w, path);
    let at = all.iter().skip(since).position(|(ns, n, seen)| ns == namespace && n == name && *seen == v.to_string())?;
    Some(all[since..since + at].iter().filter(|(ns, _, _)| ns == flood).count())
}

/// The world of the flood tests: the controller, over the test's own namespace (the flood's) and
/// `<test>-other`, where the probe parent `probe` is, at version 1.
async fn world_and_probe(test: &str) -> (World, TestNamespace) {
    let w = World::new(test, HOOK).await;
    let other = TestNamespace::create(&w.client, &format!("{test}-other")).await;
    w.composite(w.in_place_spec("/sync")).await;
    thing(&w, &other.name, "probe", 1).await;
    (w, other)
}

/// `n` parents `<prefix><i>` at version 1 in the test's own namespace, created all at once.
async fn flood_of(w: &World, prefix: &str, n: usize) {
    let creates = (0..n).map(|i| async move { thing(w, &w.ns.name, &format!("{prefix}{i}"), 1).await });
    futures::future::join_all(creates).await;
}

#[tokio::test]
async fn a_change_in_another_namespace_waits_for_a_turn_of_a_flood_not_for_the_flood() {
    let (w, other) = world_and_probe("fair-flood").await;
    eventually(WAIT, || async { calls(&w, "/sync").iter().any(|(ns, ..)| *ns == other.name).then_some(()) }).await;

    // 400 parents at once in the flood's namespace, 50 ms a call, 5 workers: a backlog of seconds.
    let flood = w.ns.name.clone();
    flood_of(&w, "f", 400).await;
    // Some of the flood served, most still waiting: then the change.
    eventually(WAIT, || async {
        (calls(&w, "/sync").iter().filter(|(ns, ..)| *ns == flood).count() >= 20).then_some(())
    })
    .await;
    let since = calls(&w, "/sync").len();
    let waiting = 400 - calls(&w, "/sync").iter().filter(|(ns, ..)| *ns == flood).count();
    thing(&w, &other.name, "probe", 2).await;
    let before = eventually(WAIT, || async { flood_calls_before(&w, since, &flood, (&other.name, "probe", 2)) }).await;
    eprintln!("the change was served after {before} calls of the flood, {waiting} of whose parents still waited");
    assert!(waiting > 100, "the flood must still wait when the change comes ({waiting} left)");
    // The flood's calls under way while the change's watch event comes (a few rounds of the 5 workers,
    // 50 ms each) and one turn of it — not the hundreds still waiting.
    assert!(before <= 15, "the change waited for {before} calls of a flood in another namespace");

    other.delete().await;
    w.finish("CompositeController").await;
}

#[tokio::test]
async fn a_restarts_relist_stands_behind_a_change_seen_live() {
    let (mut w, other) = world_and_probe("fair-relist").await;
    let many = w.ns.name.clone();
    flood_of(&w, "r", 300).await;
    let cms = w.config_maps().await;
    eventually(WAIT, || async {
        let listed = cms.list(&Default::default()).await.ok()?;
        (listed.items.len() >= 300).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A restart asks every parent's hook again (nothing was answered in this process): a relist of 301.
    let before_restart = calls(&w, "/sync").len();
    w.restart_hub().await;
    eventually(WAIT, || async { (calls(&w, "/sync").len() >= before_restart + 20).then_some(()) }).await;
    let since = calls(&w, "/sync").len();
    thing(&w, &other.name, "probe", 2).await;
    let before = eventually(WAIT, || async { flood_calls_before(&w, since, &many, (&other.name, "probe", 2)) }).await;
    let relisted = calls(&w, "/sync")[before_restart..since].iter().filter(|(ns, ..)| *ns == many).count();
    eprintln!("the change was served after {before} calls of the relist ({relisted} of 300 relisted before it came)");
    assert!(relisted < 250, "the relist must still be under way when the change comes ({relisted} done)");
    assert!(before <= 15, "the change waited for {before} relisted syncs");
    other.delete().await;
    w.finish("CompositeController").await;
}

/// Issue 68: the lines were served across flows, so while one tenant kept changing its parents, the
/// changes another namespace made while the hub restarted — relisted, not seen live — got no hook call
/// until the flood stopped (the few its first round of workers took aside).
#[tokio::test]
async fn changes_made_while_the_hub_was_down_wait_for_turns_of_a_sustained_flood_not_for_its_end() {
    const PROBES: usize = 10;
    let mut w = World::new("fair-sustained", HOOK).await;
    let other = TestNamespace::create(&w.client, "fair-sustained-other").await;
    w.composite(w.in_place_spec(PATH)).await;
    let flood = w.ns.name.clone();
    for i in 0..20 {
        thing(&w, &flood, &format!("s{i}"), 0).await;
    }
    for i in 0..PROBES {
        thing(&w, &other.name, &format!("p{i}"), 1).await;
    }
    eventually(WAIT, || async {
        let all = calls(&w, PATH);
        let synced = |ns: &str| all.iter().filter(|(n, ..)| n == ns).count();
        (synced(&other.name) >= PROBES && synced(&flood) >= 20).then_some(())
    })
    .await;

    w.stop_hub().await;
    for i in 0..PROBES {
        thing(&w, &other.name, &format!("p{i}"), 2).await;
    }
    // The tenant changes its 20 parents without pause, from four writers: many times faster than 5
    // workers at 0.45 s a call sync them, so its changes never run out. It stops once every probe is
    // served (and 10 calls more), or after 80 of its calls (the old queue served it alone until then).
    let things = support::api(&w.client, "test.metahook.dev/v1", "Thing", Some(&flood)).await;
    let stop = AtomicBool::new(false);
    let writer = |first: u32| {
        let (things, stop) = (&things, &stop);
        async move {
            let (mut v, mut written) = (first, 0);
            while !stop.load(Ordering::Relaxed) {
                let patch = Patch::Merge(json!({"spec": {"v": v}}));
                let name = format!("s{}", v % 20);
                written += usize::from(things.patch(&name, &PatchParams::default(), &patch).await.is_ok());
                v += 4;
            }
            written
        }
    };
    let since = calls(&w, PATH).len();
    // How many of the flood's calls came before each probe's change was served (`None`: not yet).
    let waited = |w: &World| -> Vec<Option<usize>> {
        (0..PROBES).map(|i| flood_calls_before_on(w, PATH, since, &flood, (&other.name, &format!("p{i}"), 2))).collect()
    };
    let watch = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        w.start_hub();
        let flood_calls = || calls(&w, PATH)[since..].iter().filter(|(ns, ..)| *ns == flood).count();
        eventually(WAIT, || async { (flood_calls() >= 80 || waited(&w).iter().all(Option::is_some)).then_some(()) })
            .await;
        // A few more of the flood's calls while it still runs: it was not over when the probes were served.
        let served = flood_calls();
        eventually(WAIT, || async { (flood_calls() >= served + 10).then_some(()) }).await;
        stop.store(true, Ordering::Relaxed);
    };
    let (writes, ()) = tokio::join!(futures::future::join4(writer(0), writer(1), writer(2), writer(3)), watch);
    let written = writes.0 + writes.1 + writes.2 + writes.3;
    let before: Vec<usize> = eventually(WAIT, || async { waited(&w).into_iter().collect::<Option<Vec<_>>>() }).await;
    let last = before.iter().copied().max().unwrap_or_default();
    let all = calls(&w, PATH);
    let flood_calls = all[since..].iter().filter(|(ns, ..)| *ns == flood).count();
    let flood_after = flood_calls - last;
    eprintln!(
        "the relisted changes were served after {before:?} calls of the flood, {flood_after} after the last; \
         {written} changes written for {flood_calls} calls"
    );
    assert!(written >= 2 * flood_calls, "the flood must outpace the hub ({written} changes, {flood_calls} calls)");
    // Turns about alternate between the two namespaces: 10 probes, about as many of the flood's calls,
    // and the 5 under way when the first probe was taken.
    assert!(last <= 20, "the last change made while the hub was down waited for {last} calls of the flood");
    assert!(flood_after >= 10, "the flood must still run when the probes are served ({flood_after} calls after)");

    other.delete().await;
    w.finish("CompositeController").await;
}

#[tokio::test]
async fn a_controller_whose_hook_is_slow_holds_none_of_another_controllers_workers() {
    // The slow hook answers only once this file exists: its calls hold every worker of its controller
    // for as long as the test wants, whatever the machine's load, and counting them is exact.
    let release = std::env::temp_dir().join(format!("metahook-fair-slow-{}-release", std::process::id()));
    let _ = std::fs::remove_file(&release);
    let hook = format!("{HOOK}\nRELEASE = {:?}\n", release.display().to_string());
    let w = World::new("fair-slow", &hook).await;
    let fast_ns = TestNamespace::create(&w.client, "fair-slow-fast").await;
    // The slow controller's parents are labelled `slow`; the fast one's, not. Its calls do not time out
    // while the test holds them, so none of its workers comes back to take another parent.
    let mut slow = w.in_place_spec("/slow");
    slow["parentResource"]["labelSelector"] = json!({"matchLabels": {"metahook-test": w.label, "speed": "slow"}});
    slow["hooks"]["sync"]["webhook"]["timeout"] = json!("115s");
    w.controller("CompositeController", &format!("{}-slow", w.label), slow).await;
    let mut fast = w.in_place_spec("/sync");
    fast["parentResource"]["labelSelector"] = json!({"matchLabels": {"metahook-test": w.label}, "matchExpressions": [{"key": "speed", "operator": "DoesNotExist"}]});
    w.controller("CompositeController", &format!("{}-fast", w.label), fast).await;
    for i in 0..20 {
        apply_value(
            &w.client,
            &json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing",
                    "metadata": {"name": format!("s{i}"), "namespace": w.ns.name,
                                 "labels": {"metahook-test": w.label, "speed": "slow"}}}),
        )
        .await;
    }
    // Every worker of the slow controller busy until the release.
    eventually(WAIT, || async { (w.hook.requests("/slow").len() >= 5).then_some(()) }).await;
    thing(&w, &fast_ns.name, "quick", 1).await;
    eventually(WAIT, || async { calls(&w, "/sync").iter().any(|(ns, ..)| *ns == fast_ns.name).then_some(()) }).await;
    // Served while the slow controller's five calls were all still held: a worker shared between the two
    // controllers would have left the fast change waiting until the release, and this wait would time out.
    let slow_calls = w.hook.requests("/slow").len();
    assert_eq!(slow_calls, 5, "the slow controller has five workers, each held by its hook");
    std::fs::write(&release, b"").unwrap();
    eventually(WAIT, || async { (w.hook.requests("/slow").len() >= 20).then_some(()) }).await;
    let config_maps = support::api(&w.client, "v1", "ConfigMap", Some(&fast_ns.name)).await;
    eventually(WAIT, || async { config_maps.get_opt("quick").await.unwrap() }).await;

    fast_ns.delete().await;
    let controllers = w.controllers("CompositeController").await;
    for name in [format!("{}-slow", w.label), format!("{}-fast", w.label)] {
        let _ = controllers.delete(&name, &Default::default()).await;
        let _ = controllers
            .patch(&name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
            .await;
    }
    let _ = std::fs::remove_file(&release);
    w.finish("CompositeController").await;
}
