//! A canary of a sync hook on the real control plane (issue 43, part 3): the `metahook.dev/canary`
//! annotation sends the parents of the first `percent` of buckets to a candidate hook, and only those
//! (each hook's log says which parents it was asked about); the controller's status counts both sides;
//! removing the annotation brings every parent back to the current hook. A candidate that answers
//! errors is halted by itself: its parents are synced by the current hook again, nothing it touched is
//! lost, and the controller says why.
//!
//! What a tenant (namespaced rights only) does to its own parents judges nothing of the candidate's
//! (issue 67): a parent that never reaches a hook is not waited for, and a failure the current hook
//! gives for the same request too is the parent's.
//!
//! Both run after the hub has answered every parent once (its caches warm, every request answered and
//! applied): a parent that changes sides shows the hook the very request it was last asked, and must be
//! asked again all the same.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use metahook::ops::config::Config;
use serde_json::{Value, json};
use support::{HookServer, Tenant, World, eventually};

const WAIT: Duration = Duration::from_secs(120);

/// One ConfigMap per Thing saying which hook answered (the `SIDE` each server's handlers define).
fn hook(side: &str, fails: bool) -> String {
    let answer = if fails {
        "    raise RuntimeError('the candidate is broken')".to_owned()
    } else {
        format!(
            "    name = request['parent']['metadata']['name']\n    return {{'children': [{{'apiVersion': 'v1', \
             'kind': 'ConfigMap', 'metadata': {{'name': name + '-cm'}}, 'data': {{'side': '{side}'}}}}]}}"
        )
    };
    format!("def sync(request):\n{answer}\n")
}

/// The parents (a decorator's targets) a hook was asked about, in the order asked.
fn asked(hook: &HookServer) -> Vec<String> {
    fn name(r: &Value) -> Option<&str> {
        r["parent"]["metadata"]["name"].as_str().or_else(|| r["object"]["metadata"]["name"].as_str())
    }
    hook.requests("/sync").iter().map(|r| name(r).unwrap().to_owned()).collect()
}

/// A world of `parents` Things whose controller's hook is the current one (`w.hook`), every child
/// answered by it; returns the Things' buckets by name.
async fn world(test: &str, parents: usize) -> (World, BTreeMap<String, u16>) {
    let mut w = World::new(test, &hook("current", false)).await;
    let config = Config { hook_change_resync_qps: 100.0, metrics_address: String::new(), ..Config::default() };
    w.restart_hub_with(config).await;
    w.composite(w.in_place_spec("/sync")).await;
    let mut buckets = BTreeMap::new();
    for i in 0..parents {
        let name = format!("t{i}");
        let thing = w.thing(&name, json!({})).await;
        buckets.insert(name, metahook::cache::shard::bucket(thing.metadata.uid.as_deref().unwrap()));
    }
    children_say(&w, buckets.keys(), "current").await;
    (w, buckets)
}

/// Waits until `parent`'s child says `side`.
async fn child_says(w: &World, parent: &str, side: &str) {
    eventually(WAIT, || async {
        w.config_map(&format!("{parent}-cm")).await.filter(|cm| cm.data["data"]["side"] == side)
    })
    .await;
}

/// [`child_says`] for each of `parents`.
async fn children_say<'a>(w: &World, parents: impl IntoIterator<Item = &'a String>, side: &str) {
    for parent in parents {
        child_says(w, parent, side).await;
    }
}

/// Sets (or, with `Null`, removes) the controller's canary annotation.
async fn set_canary(w: &World, canary: Value) {
    let value = if canary.is_null() { Value::Null } else { json!(canary.to_string()) };
    let patch = json!({"metadata": {"annotations": {"metahook.dev/canary": value}}});
    let controllers = w.controllers("CompositeController").await;
    controllers.patch(&w.label, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

async fn controller_status(w: &World) -> Value {
    w.controllers("CompositeController").await.get(&w.label).await.unwrap().data["status"].clone()
}

/// Waits until the controller's `status.canary` passes `check`; returns it.
async fn canary_status(w: &World, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let canary = controller_status(w).await["canary"].clone();
        if check(&canary) {
            return canary;
        }
        assert!(tokio::time::Instant::now() < deadline, "status.canary is still {canary}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The parents of the first `percent` of the 1024 buckets.
fn share(buckets: &BTreeMap<String, u16>, percent: f64) -> BTreeSet<String> {
    let below = (percent / 100.0 * 1024.0).ceil();
    buckets.iter().filter(|(_, b)| f64::from(**b) < below).map(|(name, _)| name.clone()).collect()
}

/// The candidate hook (`hook("candidate", failing)`) and the parents of `buckets` in its `percent`.
async fn candidate(buckets: &BTreeMap<String, u16>, failing: bool, percent: f64) -> (HookServer, BTreeSet<String>) {
    (HookServer::start(&hook("candidate", failing)).await, share(buckets, percent))
}

#[tokio::test]
async fn the_candidate_answers_for_its_tenth_of_the_parents_and_only_those() {
    const PARENTS: usize = 200;
    let (w, buckets) = world("canary-share", PARENTS).await;
    let (candidate, canary) = candidate(&buckets, false, 10.0).await;
    // About 20 of 200 (10.06 % of buckets): far from none and far from all.
    assert!((5..=45).contains(&canary.len()), "{} parents in the canary's buckets", canary.len());

    set_canary(&w, json!({"url": candidate.url("/sync"), "percent": 10})).await;
    for name in buckets.keys() {
        if canary.contains(name) {
            child_says(&w, name, "candidate").await;
        }
    }
    let running =
        canary_status(&w, |c| c["state"] == "Running" && c["candidate"]["syncs"].as_u64() >= Some(canary.len() as u64))
            .await;
    assert_eq!((running["percent"].as_f64(), running["url"].as_str()), (Some(10.0), Some(&*candidate.url("/sync"))));
    // Every parent outside still says what the current hook said, and the candidate was asked about
    // exactly the canary's parents: each once, and once more for the echo of the child it changed.
    for name in buckets.keys().filter(|n| !canary.contains(*n)) {
        let cm = w.config_map(&format!("{name}-cm")).await.unwrap();
        assert_eq!(cm.data["data"]["side"], "current", "{name} is not in the canary's buckets");
    }
    let asked_candidate = asked(&candidate);
    assert_eq!(asked_candidate.iter().cloned().collect::<BTreeSet<_>>(), canary);
    for name in &canary {
        let times = asked_candidate.iter().filter(|n| *n == name).count();
        assert!(times <= 2, "{name} asked {times} times: {asked_candidate:?}");
    }

    // A change of every parent: each side syncs its own, counted side by side.
    for name in buckets.keys() {
        w.thing(name, json!({"round": 2})).await;
    }
    let outside = (PARENTS - canary.len()) as u64;
    let both = canary_status(&w, |c| {
        c["current"]["syncs"].as_u64() >= Some(outside)
            && c["candidate"]["syncs"].as_u64() >= Some(2 * canary.len() as u64)
    })
    .await;
    assert_eq!((both["current"]["errors"].as_u64(), both["candidate"]["errors"].as_u64()), (Some(0), Some(0)));
    assert_eq!(both["candidate"]["writes"].as_u64(), Some(canary.len() as u64), "each canary child rewritten once");
    let asked_candidate: BTreeSet<String> = asked(&candidate).into_iter().collect();
    assert_eq!(asked_candidate, canary, "the change reached no other parent's candidate call");
    eprintln!("{} of {PARENTS} parents in the canary; side by side: {both}", canary.len());

    // The annotation removed: the current hook answers for every parent again, the status is cleared.
    set_canary(&w, Value::Null).await;
    children_say(&w, &canary, "current").await;
    canary_status(&w, Value::is_null).await;
    let before = asked(&candidate).len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(asked(&candidate).len(), before, "the candidate is asked nothing once the canary ended");
    w.finish("CompositeController").await;
}

#[tokio::test]
async fn a_failing_candidate_halts_and_its_parents_go_back_to_the_current_hook_with_nothing_lost() {
    const PARENTS: usize = 60;
    let (w, buckets) = world("canary-halt", PARENTS).await;
    let (candidate, canary) = candidate(&buckets, true, 50.0).await;
    assert!((15..=45).contains(&canary.len()), "{} parents in the canary's buckets", canary.len());
    let children = w.config_maps().await;
    let uids = |list: kube::api::ObjectList<kube::api::DynamicObject>| -> BTreeMap<String, String> {
        list.items
            .into_iter()
            .map(|cm| (cm.metadata.name.clone().unwrap(), cm.metadata.uid.clone().unwrap()))
            .filter(|(name, _)| name.ends_with("-cm"))
            .collect()
    };
    let before = uids(children.list(&Default::default()).await.unwrap());
    assert_eq!(before.len(), PARENTS);
    let current_asked = asked(&w.hook).len();

    set_canary(&w, json!({"url": candidate.url("/sync"), "percent": 50})).await;
    let halted = canary_status(&w, |c| c["state"] == "Halted").await;
    let (syncs, errors) =
        (halted["candidate"]["syncs"].as_u64().unwrap(), halted["candidate"]["errors"].as_u64().unwrap());
    assert!(syncs >= 20, "halted after at least minSyncs syncs: {halted}");
    assert_eq!(errors, syncs, "every candidate sync failed: {halted}");
    assert!(halted["message"].as_str().unwrap().contains("more than maxErrorRatio 0.1"), "{halted}");
    let status = controller_status(&w).await;
    let condition = status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "CanaryHalted").cloned();
    let condition = condition.unwrap_or_else(|| panic!("no CanaryHalted condition: {status}"));
    assert_eq!(
        (condition["status"].as_str(), condition["reason"].as_str()),
        (Some("True"), Some("ErrorRatioExceeded"))
    );
    let ready = status["conditions"].as_array().unwrap().iter().any(|c| c["type"] == "Ready" && c["status"] == "True");
    assert!(ready, "the Ready condition is kept beside it: {status}");

    // Every canary parent is synced by the current hook again, after the halt.
    eventually(WAIT, || async {
        let again: BTreeSet<String> = asked(&w.hook).split_off(current_asked).into_iter().collect();
        canary.is_subset(&again).then_some(())
    })
    .await;
    // Nothing the failing candidate was asked about was lost or changed: the same children, the same
    // objects, as the current hook wrote them.
    let after = uids(children.list(&Default::default()).await.unwrap());
    assert_eq!(after, before, "no child deleted or recreated");
    for name in buckets.keys() {
        let cm = w.config_map(&format!("{name}-cm")).await.unwrap();
        assert_eq!(cm.data["data"]["side"], "current", "{name}");
    }
    // The candidate is asked nothing more: a halted canary stays halted.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let asked_then = asked(&candidate).len();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(asked(&candidate).len(), asked_then, "a halted candidate is not asked");
    let still = canary_status(&w, |c| c["state"] == "Halted").await;
    // Each parent's failure counted once (its retries showed the same request: issue 53 item 4).
    let parents_asked: BTreeSet<String> = asked(&candidate).into_iter().collect();
    assert_eq!(still["candidate"]["syncs"].as_u64(), Some(parents_asked.len() as u64), "{still}");
    assert_eq!(still["candidate"]["errors"], still["candidate"]["syncs"]);
    assert!(still["message"].as_str().unwrap().contains("(an error ratio of 1)"), "{still}");
    eprintln!("{} of {PARENTS} parents in the canary; halted: {still}", canary.len());

    // Issue 53 item 4: the halt outlives the hub. A hub started again reads it back from the status:
    // the candidate is asked nothing, and the status still says Halted, with the same counts.
    let mut w = w;
    w.restart_hub().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(asked(&candidate).len(), asked_then, "a restarted hub does not ask a halted candidate");
    let after_restart = canary_status(&w, |c| c["state"] == "Halted").await;
    assert_eq!(after_restart["candidate"], still["candidate"], "the counts read back: {after_restart}");
    // A new value of the annotation starts a new canary (with new counts).
    set_canary(&w, json!({"url": candidate.url("/sync"), "percent": 50, "minSyncs": 21})).await;
    eventually(WAIT, || async { (asked(&candidate).len() > asked_then).then_some(()) }).await;
    // A canary of a healthy hook (the current one's) after the halts runs, and the last halt's message
    // goes with it (a merge patch kept it under the new state).
    set_canary(&w, json!({"url": w.hook.url("/sync"), "percent": 50, "minSyncs": 22})).await;
    let renewed = canary_status(&w, |c| {
        c["state"] == "Running" && c["annotation"].as_str().is_some_and(|a| a.contains("\"minSyncs\":22"))
    })
    .await;
    assert!(renewed.get("message").is_none_or(|m| m.is_null() || m == ""), "a stale message: {renewed}");
    w.finish("CompositeController").await;
}

/// Attack review (issue 67): a canary's annotation edited without changing its URL or share starts a new
/// canary with new counts; on a side smaller than `minSyncs` its judgment waits for every parent on its
/// side to be asked. The edit queued no parent, so parents nothing changed were never asked, and a
/// candidate failing every parent that was asked stayed Running for as long as the others stayed idle.
/// The new canary's side is asked again now, and judged.
#[tokio::test]
async fn an_edited_canary_asks_its_side_again_and_is_judged_without_waiting_for_idle_parents() {
    let (w, _) = world("canary-renewed", 4).await;
    let candidate = HookServer::start(
        "def sync(request):\n    parent = request['parent']\n    name = parent['metadata']['name']\n    \
         if (parent.get('spec') or {}).get('broken'):\n        raise RuntimeError('broken for ' + name)\n    \
         return {'children': [{'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': name + '-cm'}, \
         'data': {'side': 'candidate'}}]}\n",
    )
    .await;
    set_canary(&w, json!({"url": candidate.url("/sync"), "percent": 100})).await;
    for i in 0..4 {
        child_says(&w, &format!("t{i}"), "candidate").await;
    }
    // The same URL and share, another limit: a new canary, with new counts.
    set_canary(&w, json!({"url": candidate.url("/sync"), "percent": 100, "maxErrorRatio": 0.3})).await;
    canary_status(&w, |c| c["annotation"].as_str().is_some_and(|a| a.contains("maxErrorRatio"))).await;
    for name in ["t0", "t1"] {
        w.thing(name, json!({"broken": true})).await;
    }
    let halted = canary_status(&w, |c| c["state"] == "Halted").await;
    let message = halted["message"].as_str().unwrap();
    assert!(message.contains("the candidate fails 2 of the 4 parents it answered"), "{halted}");
    assert!(message.contains("every parent on its side asked (4,"), "t2 and t3 asked again: {halted}");
    w.finish("CompositeController").await;
}

/// Issue 53 item 4: one parent's quick retries do not halt a canary whose other parents succeed. The
/// candidate fails for `t0` only; `t0` is retried with backoff (its calls counted: a handful in 10 s,
/// not one per echo), and its failure counts once while its request is the same: 1 error in 30 syncs,
/// below `maxErrorRatio` 0.1, where counting every retry halted the canary.
#[tokio::test]
async fn one_parents_retries_do_not_halt_a_canary_whose_other_parents_succeed() {
    const PARENTS: usize = 30;
    let (w, _) = world("canary-retries", PARENTS).await;
    let candidate = HookServer::start(
        "def sync(request):\n    name = request['parent']['metadata']['name']\n    if name == 't0':\n        \
         raise RuntimeError('broken for t0')\n    return {'children': [{'apiVersion': 'v1', 'kind': 'ConfigMap', \
         'metadata': {'name': name + '-cm'}, 'data': {'side': 'candidate'}}]}\n",
    )
    .await;
    set_canary(&w, json!({"url": candidate.url("/sync"), "percent": 100})).await;
    for i in 1..PARENTS {
        child_says(&w, &format!("t{i}"), "candidate").await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let t0_calls = asked(&candidate).iter().filter(|p| *p == "t0").count();
    assert!((2..=20).contains(&t0_calls), "t0 retried with backoff: {t0_calls} calls in about 10 s");
    let status = canary_status(&w, |c| c["candidate"]["syncs"].as_u64() >= Some(PARENTS as u64)).await;
    assert_eq!(status["state"], "Running", "{status}");
    assert_eq!(status["candidate"]["errors"], 1, "t0's failure counted once: {status}");
    child_says(&w, "t0", "current").await;
    w.finish("CompositeController").await;
}

/// The same for a DecoratorController: its targets of the canary's buckets are decorated by the
/// candidate, the others by the current hook, and removing the annotation brings them all back.
#[tokio::test]
async fn a_decorators_canary_decorates_the_targets_of_its_buckets() {
    const TARGETS: usize = 40;
    let label_hook = |side: &str| format!("def sync(request):\n    return {{'labels': {{'side': '{side}'}}}}\n");
    let mut w = World::new("canary-decorator", &label_hook("current")).await;
    w.restart_hub_with(Config { metrics_address: String::new(), ..Config::default() }).await;
    w.decorator(w.things_decorator_spec()).await;
    let mut buckets = BTreeMap::new();
    for i in 0..TARGETS {
        let thing = w.thing(&format!("d{i}"), json!({})).await;
        buckets.insert(format!("d{i}"), metahook::cache::shard::bucket(thing.metadata.uid.as_deref().unwrap()));
    }
    let things = w.things().await;
    let side_of = |name: String| {
        let things = things.clone();
        async move {
            let thing = things.get(&name).await.unwrap();
            thing.metadata.labels.unwrap_or_default().get("side").cloned()
        }
    };
    let all_say = |side: &'static str, which: BTreeSet<String>| {
        let side_of = &side_of;
        async move {
            for name in which {
                eventually(WAIT, || async { (side_of(name.clone()).await.as_deref() == Some(side)).then_some(()) })
                    .await;
            }
        }
    };
    all_say("current", buckets.keys().cloned().collect()).await;

    let candidate = HookServer::start(&label_hook("candidate")).await;
    let canary = share(&buckets, 50.0);
    assert!((5..=35).contains(&canary.len()), "{} targets in the canary's buckets", canary.len());
    let patch = json!({"metadata": {"annotations": {
        "metahook.dev/canary": json!({"url": candidate.url("/sync"), "percent": 50}).to_string()}}});
    let controllers = w.controllers("DecoratorController").await;
    controllers.patch(&w.label, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    all_say("candidate", canary.clone()).await;
    for name in buckets.keys().filter(|n| !canary.contains(*n)) {
        assert_eq!(side_of(name.clone()).await.as_deref(), Some("current"), "{name} is not in the canary's buckets");
    }
    assert_eq!(
        asked(&candidate).into_iter().collect::<BTreeSet<_>>(),
        canary,
        "the candidate was asked about its share only"
    );

    let patch = json!({"metadata": {"annotations": {"metahook.dev/canary": null}}});
    controllers.patch(&w.label, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    all_say("current", canary).await;
    w.finish("DecoratorController").await;
}

/// A hub serving its metrics on a free loopback port, with `world`'s settings otherwise; returns the
/// address.
fn start_hub_with_metrics(w: &mut World) -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let address = format!("127.0.0.1:{port}");
    let client = w.client.clone();
    let config = Config { hook_change_resync_qps: 100.0, metrics_address: address.clone(), ..Config::default() };
    w.start_hub_with(&client, config);
    address
}

/// The syncs the hub retried quietly so far (`controller_runtime_reconcile_total{result="requeue"}`,
/// summed over its controllers).
async fn quiet_retries(metrics: &str) -> u64 {
    let (_, text) = eventually(WAIT, || support::http_get(metrics, "/metrics")).await;
    text.lines()
        .filter(|l| l.starts_with("controller_runtime_reconcile_total{") && l.contains("result=\"requeue\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Another writer of every child: sets `data.side` to something else than either hook says, over and
/// over, each child as fast as the API server takes it, until stopped; the hub puts each back, and its
/// writes, which name the resourceVersion it last saw, meet a newer one now and then (409, a quiet retry).
struct Writer {
    stop: tokio_util::sync::CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<u64>>,
}

impl Writer {
    async fn start(w: &World, parents: usize) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let mut tasks = Vec::new();
        for i in 0..parents {
            let config_maps = w.config_maps().await;
            let token = stop.clone();
            tasks.push(tokio::spawn(async move {
                let mut writes = 0;
                let params = PatchParams { field_manager: Some("another-writer".into()), ..PatchParams::default() };
                while !token.is_cancelled() {
                    let patch = json!({"data": {"side": format!("another-writer-{writes}")}});
                    if config_maps.patch(&format!("t{i}-cm"), &params, &Patch::Merge(&patch)).await.is_ok() {
                        writes += 1;
                    }
                }
                writes
            }));
        }
        Self { stop, tasks }
    }

    /// Stops it; returns how many writes it made.
    async fn stop(self) -> u64 {
        self.stop.cancel();
        let mut writes = 0;
        for task in self.tasks {
            writes += task.await.unwrap();
        }
        writes
    }
}

/// Issue 62 item 1: a canary counts what the hook did, not the hub's own quiet retries. Under another
/// writer's traffic on every child, the hub's writes meet versions newer than its cache showed (409s,
/// retried quietly: counted here from the hub's metrics, and required to have happened); a healthy
/// candidate then stays `Running` with no error on either side. Counting each such retry as the
/// hook's failure halted healthy candidates, while the hub logged no failed sync.
#[tokio::test]
async fn a_healthy_candidate_under_write_traffic_stays_running_with_no_errors() {
    const PARENTS: usize = 40;
    let (mut w, buckets) = world("canary-write-load", PARENTS).await;
    w.stop_hub().await;
    let metrics = start_hub_with_metrics(&mut w);
    let (candidate, canary) = candidate(&buckets, false, 50.0).await;
    assert!((8..=32).contains(&canary.len()), "{} parents in the canary's buckets", canary.len());
    let before = quiet_retries(&metrics).await;

    let writer = Writer::start(&w, PARENTS).await;
    set_canary(&w, json!({"url": candidate.url("/sync"), "percent": 50})).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let written = writer.stop().await;
    let retries = quiet_retries(&metrics).await - before;
    // Let the last figures reach the status (it is written at most every 2 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = canary_status(&w, |c| c["candidate"]["syncs"].as_u64() >= Some(canary.len() as u64)).await;
    eprintln!("another writer wrote {written} times; the hub retried {retries} syncs quietly; canary: {status}");
    assert!(retries > 0, "the hub's writes met newer versions (409) and were retried quietly: {retries}");
    assert_eq!(status["state"], "Running", "{status}");
    assert_eq!(status["candidate"]["errors"], 0, "no quiet retry counted as the candidate's failure: {status}");
    assert_eq!(status["current"]["errors"], 0, "nor as the current hook's: {status}");
    // Every child put back by the side its parent is on.
    for name in buckets.keys() {
        child_says(&w, name, if canary.contains(name) { "candidate" } else { "current" }).await;
    }
    w.finish("CompositeController").await;
}

/// Issue 62 item 1, the other half: under the same traffic, a candidate that answers 500 to every call
/// still halts, and its parents go back to the current hook.
#[tokio::test]
async fn a_failing_candidate_under_write_traffic_halts() {
    const PARENTS: usize = 40;
    let (w, buckets) = world("canary-write-load-fails", PARENTS).await;
    let (candidate, canary) = candidate(&buckets, true, 50.0).await;
    let writer = Writer::start(&w, PARENTS).await;
    set_canary(&w, json!({"url": candidate.url("/sync"), "percent": 50})).await;
    let halted = canary_status(&w, |c| c["state"] == "Halted").await;
    writer.stop().await;
    assert!(halted["message"].as_str().unwrap().contains("more than maxErrorRatio 0.1"), "{halted}");
    assert_eq!(halted["current"]["errors"], 0, "the current hook answered every call: {halted}");
    children_say(&w, &canary, "current").await;
    eprintln!("{} of {PARENTS} parents in the canary; halted under write traffic: {halted}", canary.len());
    w.finish("CompositeController").await;
}

/// The percent whose share is the `n` parents of the lowest buckets, and that share.
fn percent_for(buckets: &BTreeMap<String, u16>, n: usize) -> (f64, BTreeSet<String>) {
    let mut by_bucket: Vec<u16> = buckets.values().copied().collect();
    by_bucket.sort_unstable();
    let percent = f64::from(by_bucket[n - 1] + 1) * 100.0 / 1024.0;
    (percent, share(buckets, percent))
}

/// Issue 62 item 2: a failing candidate on a side of fewer parents than `minSyncs` (20) halts once
/// every parent on its side was asked. Each parent's failure counts once until its request changes,
/// so such a side never reached `minSyncs`, and its parents stayed on a failing hook for good. With
/// `restart`, the halt must outlive the hub: one started again asks the candidate nothing.
async fn a_failing_candidate_halts_on_a_small_fleet(parents: usize, restart: bool) {
    let (mut w, buckets) = world(&format!("canary-small-{parents}"), parents).await;
    let (percent, canary) = percent_for(&buckets, parents.div_ceil(4));
    assert!(!canary.is_empty() && canary.len() < 20, "{} parents on the candidate's side", canary.len());

    // A healthy candidate asked about every parent on its side is not halted by this rule.
    let healthy = HookServer::start(&hook("candidate", false)).await;
    set_canary(&w, json!({"url": healthy.url("/sync"), "percent": percent})).await;
    children_say(&w, &canary, "candidate").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let running = canary_status(&w, |c| c["candidate"]["syncs"].as_u64() >= Some(canary.len() as u64)).await;
    assert_eq!((running["state"].as_str(), running["candidate"]["errors"].as_u64()), (Some("Running"), Some(0)));

    let failing = HookServer::start(&hook("candidate", true)).await;
    set_canary(&w, json!({"url": failing.url("/sync"), "percent": percent})).await;
    let halted = canary_status(&w, |c| c["state"] == "Halted").await;
    let message = halted["message"].as_str().unwrap();
    assert!(message.contains("more than maxErrorRatio 0.1"), "{halted}");
    assert!(message.contains(&format!("every parent on its side asked ({},", canary.len())), "{halted}");
    assert!(halted["candidate"]["syncs"].as_u64() >= Some(canary.len() as u64), "each asked: {halted}");
    children_say(&w, &canary, "current").await;
    eprintln!("{parents} parents, {} on the candidate's side: {halted}", canary.len());
    if restart {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let asked_then = asked(&failing).len();
        let still = canary_status(&w, |c| c["state"] == "Halted").await;
        w.restart_hub().await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(asked(&failing).len(), asked_then, "a restarted hub asks a halted candidate nothing");
        let after_restart = canary_status(&w, |c| c["state"] == "Halted").await;
        assert_eq!(after_restart["candidate"], still["candidate"], "the counts read back: {after_restart}");
    }
    w.finish("CompositeController").await;
}

#[tokio::test]
async fn a_failing_candidate_halts_on_a_fleet_of_2_parents() {
    a_failing_candidate_halts_on_a_small_fleet(2, false).await;
}

#[tokio::test]
async fn a_failing_candidate_halts_on_a_fleet_of_10_parents_and_stays_halted_after_a_restart() {
    a_failing_candidate_halts_on_a_small_fleet(10, true).await;
}

#[tokio::test]
async fn a_failing_candidate_halts_on_a_fleet_of_40_parents() {
    a_failing_candidate_halts_on_a_small_fleet(40, false).await;
}

/// A hook whose Thing names its ConfigMap (`spec.child`, else `<name>-cm`; an invalid name is refused
/// whichever hook answers), labelled with what its `spec.selector` selects, saying `side`; it fails for
/// the parents `fails` names (`*`: all).
fn chosen_child_hook(side: &str, fails: &[&str]) -> String {
    format!(
        "FAILS = {fails:?}\n\
         def sync(request):\n    parent = request['parent']\n    name = parent['metadata']['name']\n    \
         if name in FAILS or '*' in FAILS:\n        raise RuntimeError('broken for ' + name)\n    \
         spec = parent.get('spec') or {{}}\n    labels = (spec.get('selector') or {{}}).get('matchLabels') or {{}}\n    \
         return {{'children': [{{'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {{'name': \
         spec.get('child', name + '-cm'), 'labels': labels}}, 'data': {{'side': '{side}'}}}}]}}\n"
    )
}

/// A world whose controller's Things select their children by their own `spec.selector` (no
/// `generateSelector`), the current hook `w.hook` answering as [`chosen_child_hook`], with a canary of
/// `candidate` for every parent from the start (`canary`: more of the annotation), and a tenant.
async fn tenant_world(test: &str, candidate: &HookServer, canary: Value) -> (World, Tenant) {
    tenant_world_answering(test, &chosen_child_hook("current", &[]), candidate, canary).await
}

/// [`tenant_world`] with the current hook answering as `current` (a hook's handlers).
async fn tenant_world_answering(test: &str, current: &str, candidate: &HookServer, canary: Value) -> (World, Tenant) {
    let w = World::new(test, current).await;
    let tenant = Tenant::create(&w.client, &format!("{test}-t")).await;
    let mut annotation = json!({"url": candidate.url("/sync"), "percent": 100});
    annotation.as_object_mut().unwrap().extend(canary.as_object().cloned().unwrap_or_default());
    w.composite_annotated(
        json!({"metahook.dev/canary": annotation.to_string()}),
        json!({
            "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
            "childResources": [{"apiVersion": "v1", "resource": "configmaps",
                                "updateStrategy": {"method": "InPlace"}}],
            "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
        }),
    )
    .await;
    (w, tenant)
}

/// `spec` of a Thing whose children are those labelled `parent: <name>`.
fn selecting(name: &str, more: Value) -> Value {
    let mut spec = json!({"selector": {"matchLabels": {"parent": name}}});
    spec.as_object_mut().unwrap().extend(more.as_object().cloned().unwrap_or_default());
    spec
}

/// The tenant's Thing `name` in its namespace, labelled for the test's controller, with `spec`, applied
/// as the tenant.
async fn tenant_thing(w: &World, tenant: &Tenant, name: &str, spec: Value) {
    let thing = json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing",
                       "metadata": {"name": name, "labels": {"metahook-test": w.label}}, "spec": spec});
    let things = tenant.api("test.metahook.dev/v1", "Thing").await;
    let params = PatchParams::apply("tenant").force();
    things.patch(name, &params, &Patch::Apply(&thing)).await.unwrap();
}

/// How many times `hook` was asked about `parent`.
fn asked_about(hook: &HookServer, parent: &str) -> usize {
    asked(hook).iter().filter(|p| *p == parent).count()
}

/// Issue 67 item 3: a tenant's parent whose `spec.selector` is `{}` fails before any hook is asked;
/// the small-fleet rule waited for it to be asked, and a candidate that failed every other parent on
/// its side stayed Running until that parent was deleted. It is halted on its own failures now.
#[tokio::test]
async fn a_tenants_parent_that_never_reaches_a_hook_does_not_keep_a_failing_candidate_running() {
    const PARENTS: usize = 5;
    let candidate = HookServer::start(&chosen_child_hook("candidate", &["*"])).await;
    let (w, tenant) = tenant_world("canary-unreached", &candidate, json!({})).await;
    tenant_thing(&w, &tenant, "tp", json!({"selector": {}})).await;
    for i in 0..PARENTS {
        let name = format!("t{i}");
        w.thing(&name, selecting(&name, json!({}))).await;
    }
    let halted = canary_status(&w, |c| c["state"] == "Halted").await;
    let message = halted["message"].as_str().unwrap();
    // Judged once every parent on its side then was asked: the t parents made so far (the judgment
    // may come before the last of them is made), never tp.
    let syncs = halted["candidate"]["syncs"].as_u64().unwrap();
    assert!((1..=PARENTS as u64).contains(&syncs), "{halted}");
    assert!(message.contains(&format!("failed {syncs} of {syncs} syncs")), "{halted}");
    assert!(message.contains(&format!("every parent on its side asked ({syncs},")), "tp not waited for: {halted}");
    // Every parent is on the candidate's side (100 %): tp counted there would be one sync more than the
    // parents asked; counted on the current side it would be an error there (the current side's syncs
    // after the halt are the t parents' own, answered by the current hook again).
    assert_eq!(halted["current"]["errors"], 0, "tp counted on neither side: {halted}");
    for i in 0..PARENTS {
        child_says(&w, &format!("t{i}"), "current").await;
    }
    assert_eq!((asked_about(&candidate, "tp"), asked_about(&w.hook, "tp")), (0, 0), "tp reached no hook");
    tenant.namespace.delete().await;
    w.finish("CompositeController").await;
}

/// Issue 67 item 4: a tenant's parent whose child name is invalid is refused whichever hook answers;
/// each edit of it was a new request and counted again, and three edits halted a healthy candidate.
/// The current hook is asked the same request in the shadow once per request of that parent (not per
/// retry), finds the parent's own failure, and nothing of a shadow answer is written: t0, which only
/// the candidate fails, is counted once and gets no child from the current hook's valid answer.
#[tokio::test]
async fn a_tenants_parent_refused_by_both_hooks_does_not_halt_a_healthy_candidate() {
    const EDITS: usize = 3;
    let candidate = HookServer::start(&chosen_child_hook("candidate", &["t0"])).await;
    // t0's failure, 1 of its side's 6, stays below the limit; t0's and tp's first would not.
    let (w, tenant) = tenant_world("canary-parents-own", &candidate, json!({"maxErrorRatio": 0.2})).await;
    for i in 1..=5 {
        let name = format!("t{i}");
        w.thing(&name, selecting(&name, json!({}))).await;
        child_says(&w, &name, "candidate").await;
    }
    let asked_with = |v: usize| {
        candidate
            .requests("/sync")
            .iter()
            .any(|r| r["parent"]["metadata"]["name"] == "tp" && r["parent"]["spec"]["v"] == v)
    };
    for v in 0..=EDITS {
        tenant_thing(&w, &tenant, "tp", selecting("tp", json!({"child": "Not_A_Valid_Name", "v": v}))).await;
        eventually(WAIT, || async { asked_with(v).then_some(()) }).await;
    }
    w.thing("t0", selecting("t0", json!({}))).await;
    eventually(WAIT, || async { (asked_about(&candidate, "t0") >= 2).then_some(()) }).await;
    tokio::time::sleep(Duration::from_secs(5)).await;

    let status = canary_status(&w, |c| c["candidate"]["syncs"].as_u64() >= Some(6)).await;
    assert_eq!(status["state"], "Running", "{status}");
    assert_eq!(status["candidate"]["errors"], 1, "t0's failure alone, once: {status}");
    assert_eq!(asked_about(&w.hook, "tp"), EDITS + 1, "one shadow call per request of tp, none per retry");
    assert_eq!(asked_about(&w.hook, "t0"), 1, "one shadow call for t0, whose failure counted once");
    let healthy: usize = (1..=5).map(|i| asked_about(&w.hook, &format!("t{i}"))).sum();
    assert_eq!(healthy, 0, "no shadow call for a parent the candidate answered");
    assert!(asked_about(&candidate, "tp") > EDITS, "tp's requests and their retries reached the candidate");
    assert!(w.config_map("t0-cm").await.is_none(), "the current hook's shadow answer for t0 was written");
    let tenant_children = tenant.api("v1", "ConfigMap").await.list(&Default::default()).await.unwrap();
    let of_tp = |cm: &&kube::api::DynamicObject| cm.metadata.labels.as_ref().is_some_and(|l| l.contains_key("parent"));
    let written: Vec<_> = tenant_children.items.iter().filter(of_tp).collect();
    assert!(written.is_empty(), "a child of tp was written: {written:?}");
    for i in 1..=5 {
        child_says(&w, &format!("t{i}"), "candidate").await;
    }
    tenant.namespace.delete().await;
    w.finish("CompositeController").await;
}

/// A hook whose Thing's ConfigMap (`<name>-cm`, labelled with what its `spec.selector` selects) holds
/// the Thing's `spec.v` and says `side`.
fn versioned_child_hook(side: &str) -> String {
    format!(
        "def sync(request):\n    parent = request['parent']\n    spec = parent.get('spec') or {{}}\n    \
         labels = (spec.get('selector') or {{}}).get('matchLabels') or {{}}\n    \
         return {{'children': [{{'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {{'name': \
         parent['metadata']['name'] + '-cm', 'labels': labels}}, \
         'data': {{'side': '{side}', 'v': str(spec.get('v', 0))}}}}]}}\n"
    )
}

/// Issue 67, attack review F2: a tenant makes its own children `immutable`, then edits their parents,
/// so that every update of those children is refused by the API server whichever hook answers.
/// Counted against the candidate, two such parents of six halted a healthy candidate (0.33 of its
/// parents failing, above 0.2). The current hook's answer for the same request, dry-run on the server,
/// is refused alike: those failures are the parents' own, and the candidate runs on with none counted.
#[tokio::test]
async fn a_tenants_immutable_children_do_not_halt_a_healthy_candidate() {
    let candidate = HookServer::start(&versioned_child_hook("candidate")).await;
    let canary = json!({"maxErrorRatio": 0.2});
    let (w, tenant) =
        tenant_world_answering("canary-immutable", &versioned_child_hook("current"), &candidate, canary).await;
    for i in 1..=4 {
        let name = format!("t{i}");
        w.thing(&name, selecting(&name, json!({"v": 0}))).await;
        child_says(&w, &name, "candidate").await;
    }
    let tenant_maps = tenant.api("v1", "ConfigMap").await;
    let frozen = ["tp1", "tp2"];
    for name in frozen {
        tenant_thing(&w, &tenant, name, selecting(name, json!({"v": 0}))).await;
        let child = format!("{name}-cm");
        eventually(WAIT, || async {
            tenant_maps.get_opt(&child).await.unwrap().filter(|cm| cm.data["data"]["v"] == "0")
        })
        .await;
        let patch = Patch::Merge(json!({"immutable": true}));
        tenant_maps.patch(&child, &PatchParams::default(), &patch).await.unwrap();
    }
    let asked_with = |hook: &HookServer, name: &str| {
        hook.requests("/sync").iter().any(|r| r["parent"]["metadata"]["name"] == name && r["parent"]["spec"]["v"] == 1)
    };
    for name in frozen {
        tenant_thing(&w, &tenant, name, selecting(name, json!({"v": 1}))).await;
    }
    // Each edit is asked of the candidate (whose write is refused) and, in the shadow, of the current hook.
    for name in frozen {
        eventually(WAIT, || async { (asked_with(&candidate, name) && asked_with(&w.hook, name)).then_some(()) }).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;

    let status = canary_status(&w, |c| c["candidate"]["syncs"].as_u64() >= Some(6)).await;
    assert_eq!(status["state"], "Running", "{status}");
    assert_eq!(status["candidate"]["errors"], 0, "the refused writes are the parents' own: {status}");
    for name in frozen {
        let child = tenant_maps.get(&format!("{name}-cm")).await.unwrap();
        assert_eq!(child.data["data"], json!({"side": "candidate", "v": "0"}), "the immutable child is as it was");
    }
    for i in 1..=4 {
        child_says(&w, &format!("t{i}"), "candidate").await;
    }
    tenant.namespace.delete().await;
    w.finish("CompositeController").await;
}

/// Issue 67 (attack review): a tenant edits a parent of its own, which the candidate answers well,
/// many times before the candidate meets the other parents, which it fails. Counted per sync, those
/// successes kept the ratio of a candidate failing every other parent below `maxErrorRatio` (5 failures
/// in 36 syncs), and it stayed Running. Each parent counts once, by its last sync: it halts.
#[tokio::test]
async fn a_tenants_flood_of_successes_does_not_keep_a_failing_candidate_running() {
    const EDITS: usize = 30;
    const PARENTS: usize = 5;
    let failing: Vec<String> = (0..PARENTS).map(|i| format!("t{i}")).collect();
    let names: Vec<&str> = failing.iter().map(String::as_str).collect();
    let candidate = HookServer::start(&chosen_child_hook("candidate", &names)).await;
    let (w, tenant) =
        tenant_world("canary-flood", &candidate, json!({"maxErrorRatio": 0.5, "minSyncs": PARENTS})).await;
    let asked_with = |v: usize| {
        candidate
            .requests("/sync")
            .iter()
            .any(|r| r["parent"]["metadata"]["name"] == "tp" && r["parent"]["spec"]["v"] == v)
    };
    for v in 0..EDITS {
        tenant_thing(&w, &tenant, "tp", selecting("tp", json!({"v": v}))).await;
        eventually(WAIT, || async { asked_with(v).then_some(()) }).await;
    }
    let flooded = canary_status(&w, |c| c["candidate"]["syncs"].as_u64() >= Some(EDITS as u64)).await;
    assert_eq!((flooded["state"].as_str(), flooded["candidate"]["errors"].as_u64()), (Some("Running"), Some(0)));
    for name in &failing {
        w.thing(name, selecting(name, json!({}))).await;
    }
    let halted = canary_status(&w, |c| c["state"] == "Halted").await;
    let message = halted["message"].as_str().unwrap();
    assert!(message.contains("parents it answered"), "{halted}");
    let syncs = halted["candidate"]["syncs"].as_u64().unwrap();
    let errors = halted["candidate"]["errors"].as_u64().unwrap();
    assert!(syncs > EDITS as u64 && errors >= 2, "the flood counted, then the failures: {halted}");
    assert!(
        errors * 2 < syncs,
        "counted per sync the ratio is below 0.5, so only the parents' count halts it: {halted}"
    );
    // Nothing lost: the failing parents get the current hook's children, tp keeps the candidate's.
    children_say(&w, &failing, "current").await;
    let tp_child = tenant.api("v1", "ConfigMap").await.get_opt("tp-cm").await.unwrap();
    assert!(tp_child.is_some_and(|cm| cm.data["data"]["side"].is_string()), "tp's child is there");
    tenant.namespace.delete().await;
    w.finish("CompositeController").await;
}

/// The current hook for [`a_tenant_that_makes_the_current_answer_lose_its_namespace_does_not_hide_a_failing_candidate`]:
/// each Thing's `spec.children` lists its ConfigMaps (`{"name", "namespace"?}`), in other namespaces
/// too (`crossNamespace`). The candidate answers the same children with a data key the API server
/// refuses: its every write for the parent fails.
fn cross_namespace_hook(bad_key: bool) -> String {
    let key = if bad_key { "bad key!" } else { "v" };
    format!(
        "def sync(request):\n    spec = request['parent'].get('spec') or {{}}\n    children = []\n    \
         for c in spec.get('children', []):\n        metadata = {{'name': c['name']}}\n        \
         if c.get('namespace'):\n            metadata['namespace'] = c['namespace']\n        \
         children.append({{'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': metadata, 'data': {{'{key}': '1'}}}})\n    \
         return {{'children': children}}\n"
    )
}

/// A world whose controller's ConfigMaps are `crossNamespace`, answered by [`cross_namespace_hook`], a
/// tenant, and a candidate hook (whose writes the API server refuses, with `candidate_fails`).
async fn cross_namespace_world(test: &str, candidate_fails: bool) -> (World, Tenant, HookServer) {
    let w = World::new(test, &cross_namespace_hook(false)).await;
    let tenant = Tenant::create(&w.client, &format!("{test}-t")).await;
    let candidate = HookServer::start(&cross_namespace_hook(candidate_fails)).await;
    w.composite(json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps", "crossNamespace": true,
                            "updateStrategy": {"method": "InPlace"}}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    }))
    .await;
    (w, tenant, candidate)
}

/// Attack review (issue 67): a platform parent has a child in a tenant's namespace; the tenant takes
/// the hub's labels off its copy, so every answer for that parent loses the tenant's namespace (the
/// copy is someone else's now). The current hook, asked in the shadow, was "refused in part", and that
/// excused every failure of the candidate's on the parent — even the API server refusing all its
/// writes in the platform's own namespace — so a candidate failing every platform parent stayed
/// `Running`. A failure in part never excuses a whole one: it halts.
#[tokio::test]
async fn a_tenant_that_makes_the_current_answer_lose_its_namespace_does_not_hide_a_failing_candidate() {
    let (w, tenant, candidate) = cross_namespace_world("canary-partial", true).await;
    let t = tenant.namespace.name.as_str();
    w.thing("p2", json!({"children": [{"name": "p2-home"}, {"name": "p2-in-tenant", "namespace": t}]})).await;
    let copies = tenant.api("v1", "ConfigMap").await;
    let copy = eventually(WAIT, || async { copies.get_opt("p2-in-tenant").await.ok().flatten() }).await;
    let hub_labels: Vec<String> = copy.metadata.labels.unwrap_or_default().into_keys().collect();
    assert!(!hub_labels.is_empty(), "the hub labels its child elsewhere");
    // The tenant, with its namespaced rights only, takes the hub's labels off its copy.
    let stripped: serde_json::Map<String, Value> = hub_labels.iter().map(|k| (k.clone(), Value::Null)).collect();
    copies
        .patch("p2-in-tenant", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"labels": stripped}})))
        .await
        .unwrap();

    set_canary(&w, json!({"url": candidate.url("/sync"), "percent": 100, "minSyncs": 5})).await;
    let halted = canary_status(&w, |c| c["state"] == "Halted").await;
    let message = halted["message"].as_str().unwrap();
    assert!(message.contains("fails 1 of the 1 parents it answered"), "{halted}");
    // Nothing of the candidate's answer landed; the current hook answers again.
    let home = w.config_map("p2-home").await.expect("p2's child at home");
    assert_eq!(home.data["data"], json!({"v": "1"}), "the current hook's child, untouched");
    tenant.namespace.delete().await;
    w.finish("CompositeController").await;
}

/// Attack review of the shadow's dry run (issue 67, helper-14): a platform parent has a child in a
/// tenant's namespace; the tenant changes its copy and makes it `immutable`, so the current hook's
/// update of it is refused too. That one refusal excused the whole parent, even the candidate's own
/// invalid write of the platform's child at home, which the current answer leaves as it is: a candidate
/// failing every platform parent stayed `Running` for minutes. Every refused write of the candidate's
/// must be refused alike to be the parent's: it halts.
#[tokio::test]
async fn a_tenants_immutable_copy_does_not_hide_a_candidates_own_invalid_writes() {
    let (w, tenant, candidate) = cross_namespace_world("canary-frozen-copy", true).await;
    let t = tenant.namespace.name.as_str();
    w.thing("p2", json!({"children": [{"name": "p2-home"}, {"name": "p2-in-tenant", "namespace": t}]})).await;
    let copies = tenant.api("v1", "ConfigMap").await;
    eventually(WAIT, || async { copies.get_opt("p2-in-tenant").await.ok().flatten() }).await;
    // The tenant, with its namespaced rights only, changes its copy and freezes it.
    let freeze = json!({"data": {"v": "tampered"}, "immutable": true});
    copies.patch("p2-in-tenant", &PatchParams::default(), &Patch::Merge(&freeze)).await.unwrap();

    set_canary(&w, json!({"url": candidate.url("/sync"), "percent": 100, "minSyncs": 5})).await;
    let halted = canary_status(&w, |c| c["state"] == "Halted").await;
    let message = halted["message"].as_str().unwrap();
    assert!(message.contains("fails 1 of the 1 parents it answered"), "{halted}");
    let home = w.config_map("p2-home").await.expect("p2's child at home");
    assert_eq!(home.data["data"], json!({"v": "1"}), "the current hook's child, untouched");
    tenant.namespace.delete().await;
    w.finish("CompositeController").await;
}

/// Attack review (issue 67): the shadow is checked against the observation the candidate's sync
/// started from; children that sync has just created are in the cache but not in that observation, and
/// the shadow's plan met them as a stale cache (a quiet retry) — which counted as "the current hook
/// passes", so a failure both hooks give (a name someone else holds in another namespace, refused in
/// part) counted against a healthy candidate and halted it. A shadow that cannot tell waits for the
/// retry, observed afresh: the failure is found to be the parent's, and the canary runs on.
#[tokio::test]
async fn a_failure_both_hooks_give_is_not_counted_because_of_the_candidates_own_new_children() {
    let (w, tenant, candidate) = cross_namespace_world("canary-fresh", false).await;
    // A name held in the platform's namespace by someone else.
    let taken = json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "taken", "namespace": w.ns.name}, "data": {"owner": "someone"}});
    support::apply_value(&w.client, &taken).await;
    for i in 0..4 {
        let name = format!("t{i}");
        let home = format!("{name}-home");
        w.thing(&name, json!({"children": [{"name": home}]})).await;
        eventually(WAIT, || w.config_map(&home)).await;
    }
    set_canary(&w, json!({"url": candidate.url("/sync"), "percent": 100, "minSyncs": 5})).await;
    for i in 0..4 {
        let name = format!("t{i}");
        eventually(WAIT, || async { (asked_about(&candidate, &name) >= 1).then_some(()) }).await;
    }
    // The tenant's parent: two new children at home, and one where the name is someone else's.
    let ns = w.ns.name.clone();
    tenant_thing(
        &w,
        &tenant,
        "tp",
        json!({"children": [{"name": "tp-home"}, {"name": "tp-home2"}, {"name": "taken", "namespace": ns}]}),
    )
    .await;
    let copies = tenant.api("v1", "ConfigMap").await;
    eventually(WAIT, || async { copies.get_opt("tp-home2").await.ok().flatten() }).await;
    // Asked again (its retry), unless the canary halted before that.
    eventually(WAIT, || async {
        let halted = controller_status(&w).await["canary"]["state"] == "Halted";
        (asked_about(&candidate, "tp") >= 2 || halted).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let status = controller_status(&w).await["canary"].clone();
    assert_eq!(status["state"], "Running", "a failure both hooks give halted a healthy candidate: {status}");
    assert_eq!(status["candidate"]["errors"], 0, "{status}");
    let held = w.config_map("taken").await.expect("someone's ConfigMap");
    assert_eq!(held.data["data"], json!({"owner": "someone"}), "left untouched");
    tenant.namespace.delete().await;
    w.finish("CompositeController").await;
}
