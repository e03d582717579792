//! `make bench-fair`: whether one tenant's flood, a restart's relist or a slow hook makes another
//! tenant's change wait (issue 63), measured side by side in one run.
//!
//! Workload: the fan-out controller of `make bench` (three `InPlace` ConfigMaps per parent, a Node hook
//! answering at once, `fair-hook.mjs`) over `FairThing`s; 20 probe parents, one in each of 20 namespaces
//! of their own. Each system runs on a control plane started anew for it (`FRESH=0` keeps one), as its
//! own process, through three phases:
//! 1. **flood**: N parents (10,000 at full size) created at once in namespace `flood`; while they
//!    drain, every second one probe parent's `spec.version` changes (round robin). Printed: each
//!    change's latency to the hook's call for it (p50, p99, max), the flood's time to converge (every
//!    child written, from a watch), and the hook calls per flood parent by then;
//! 2. **restart**: the process stopped and started again over the N converged parents; the probes go
//!    on while it lists and syncs them all again (its relist). Printed: the probes' latency, and how long
//!    until every flood parent's hook was called again;
//! 3. **slow**: a second controller whose hook takes 5 s per call, with 20 parents of its own; the
//!    probes go on for 30 s beside it. Printed: the probes' latency against the idle figure;
//! 4. **sustained** (`--full` only; issue 68, not measured yet): a tenant changes 20 of the flood's
//!    parents 40 times a second for 60 s while the probes go on, and halfway the process restarts
//!    (the probes changed while it is down are relisted at its start). Printed: the probes' latency
//!    during the sustained flood and around the restart (the latter includes the time the process was
//!    down and listing). Retries and resyncs elsewhere (the phases c and d) are not here yet.
//!
//! Systems: `metahook` (this build, or `HUB_BIN`); `baseline` with `BASELINE_BIN=<another build>` (the
//! queue before, say); `metacontroller` with `MC_BIN=`/`MC_SRC=` (built from its source, tuned as in
//! `make bench`). Figures are printed and written to `target/bench/fair-<N>.md`, never asserted (the
//! machine is noisy); what is asserted is that every phase ended.
//!
//! Run by `cargo test` with no arguments it does a smoke-sized run (N=60, short phases).

mod kinds;
mod metacontroller;
mod procs;
mod run;
// Only its restart: the request counts are for the other benchmarks.
#[allow(dead_code)]
mod plane;
#[path = "../support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::{StreamExt as _, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::watcher;
use metacontroller::Metacontroller;
use procs::Hook;
use serde_json::{Value, json};

const CHILDREN: usize = 3;
const PROBES: usize = 20;
const TIMEOUT: Duration = Duration::from_secs(1800);

fn fair_things() -> kube::core::ApiResource {
    kinds::resource("FairThing")
}

struct Settings {
    n: usize,
    /// How long the slow phase's probes run.
    slow: Duration,
    /// How long the sustained phase's tenant changes its parents (`None`: no such phase).
    sustained: Option<Duration>,
    /// Probe changes at idle, before the flood.
    idle_probes: usize,
}

impl Settings {
    fn from_env() -> Self {
        let num = run::number;
        if run::full() {
            let sustained = Some(Duration::from_secs(60));
            Self { n: num("N", 10_000), slow: Duration::from_secs(30), sustained, idle_probes: 10 }
        } else {
            Self { n: num("N", 60), slow: Duration::from_secs(6), sustained: None, idle_probes: 3 }
        }
    }
}

/// What runs the controllers.
#[derive(Clone)]
enum Program {
    Hub(PathBuf),
    Metacontroller(Metacontroller),
}

/// A running controller process.
struct Running {
    child: tokio::process::Child,
    _dir: tempfile::TempDir,
}

impl Running {
    fn start(program: &Program, label: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = support::kubeconfig_path();
        let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = match program {
            Program::Hub(bin) => {
                let config = dir.path().join("metahook.yaml");
                std::fs::write(
                    &config,
                    format!("targetLabelSelector: \"metahook-test={label}\"\nmetricsAddress: \"\"\n"),
                )
                .unwrap();
                tokio::process::Command::new(bin)
                    .args(["run", "--config"])
                    .arg(&config)
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .env("METAHOOK_LOG", std::env::var("BENCH_HUB_LOG").unwrap_or_else(|_| "warn".into()))
                    .kill_on_drop(true)
                    .spawn()
                    .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()))
            }
            Program::Metacontroller(mc) => tokio::process::Command::new(&mc.bin)
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .args(Metacontroller::args(label, free(), free()))
                .kill_on_drop(true)
                .spawn()
                .unwrap_or_else(|e| panic!("starting {}: {e}", mc.bin.display())),
        };
        Self { child, _dir: dir }
    }

    /// SIGTERM, as a rolling upgrade would, and wait for it to go.
    async fn stop(mut self) {
        procs::terminate(&mut self.child).await;
    }
}

impl Hook {
    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// When the hook was first asked for `namespace/name` at `version` (unix ms).
    async fn seen(&self, namespace: &str, name: &str, version: &str) -> Option<f64> {
        let key = format!("{namespace}/{name}@{version}");
        let answer: Value =
            self.http.get(self.url("/seen")).query(&[("key", key)]).send().await.ok()?.json().await.ok()?;
        answer["at"].as_f64()
    }

    async fn calls(&self, namespace: &str) -> u64 {
        let answer: Value =
            self.http.get(self.url("/calls")).query(&[("ns", namespace)]).send().await.unwrap().json().await.unwrap();
        answer["calls"].as_u64().unwrap_or(0)
    }
}

fn unix_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64() * 1000.0
}

/// A controller object over `FairThing`s labelled `metahook-test=<label>` whose `speed` is `speed`.
fn controller(label: &str, name: &str, speed: &str, url: &str) -> Value {
    json!({"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
        "metadata": {"name": name, "labels": {"metahook-test": label}},
        "spec": {"generateSelector": true,
            "parentResource": {"apiVersion": "bench.metahook.dev/v1", "resource": "fairthings",
                               "labelSelector": {"matchLabels": {"bench-fair": label, "speed": speed}}},
            "childResources": [{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}}],
            "hooks": {"sync": {"webhook": {"url": url}}}}})
}

/// One world: its namespaces and parents.
#[derive(Clone)]
struct World {
    client: Client,
    label: String,
    flood: String,
    probes: Vec<String>,
    slow: String,
}

impl World {
    async fn thing(&self, namespace: &str, name: &str, speed: &str, version: &str) {
        let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, &fair_things());
        let thing = json!({"apiVersion": "bench.metahook.dev/v1", "kind": "FairThing",
            "metadata": {"name": name, "namespace": namespace, "labels": {"bench-fair": self.label, "speed": speed}},
            "spec": {"version": version}});
        for _ in 0..20 {
            if api.patch(name, &PatchParams::apply("bench-fair"), &Patch::Apply(&thing)).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("could not write {namespace}/{name}");
    }
}

/// Latencies (ms) of probe changes made every second by [`Probes::run`], until stopped.
#[derive(Clone, Default)]
struct Probes {
    latencies: Arc<Mutex<Vec<f64>>>,
    missed: Arc<Mutex<usize>>,
    next: Arc<Mutex<usize>>,
}

impl Probes {
    /// Changes one probe parent a second (round robin) until `stop` is set, each change's latency to its
    /// hook call recorded by a task of its own (given up after 10 minutes, counted as missed).
    async fn run(&self, world: &World, hook: &Arc<Hook>, stop: Arc<std::sync::atomic::AtomicBool>, max: Option<usize>) {
        let mut made = 0;
        let mut waiting = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) && max.is_none_or(|m| made < m) {
            let k = {
                let mut next = self.next.lock().unwrap();
                *next += 1;
                *next
            };
            let (ns, version) = (world.probes[k % PROBES].clone(), format!("v{k}"));
            let changed = unix_ms();
            world.thing(&ns, "probe", "fast", &version).await;
            let (hook, probes) = (Arc::clone(hook), self.clone());
            waiting.push(tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(600);
                while Instant::now() < deadline {
                    if let Some(at) = hook.seen(&ns, "probe", &version).await {
                        probes.latencies.lock().unwrap().push((at - changed).max(0.0));
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                *probes.missed.lock().unwrap() += 1;
            }));
            made += 1;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        for task in waiting {
            let _ = task.await;
        }
    }

    fn take(&self) -> Latency {
        let mut all = std::mem::take(&mut *self.latencies.lock().unwrap());
        all.sort_by(f64::total_cmp);
        let missed = std::mem::take(&mut *self.missed.lock().unwrap());
        Latency::of(&all, missed)
    }
}

#[derive(Clone, Debug, Default)]
struct Latency {
    count: usize,
    missed: usize,
    p50: f64,
    p99: f64,
    max: f64,
}

impl Latency {
    fn of(sorted: &[f64], missed: usize) -> Self {
        let at = |q: f64| {
            if sorted.is_empty() {
                return f64::NAN;
            }
            #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
            sorted[index.min(sorted.len() - 1)]
        };
        Self {
            count: sorted.len(),
            missed,
            p50: at(0.5),
            p99: at(0.99),
            max: sorted.last().copied().unwrap_or(f64::NAN),
        }
    }

    fn cell(&self) -> String {
        let missed = if self.missed > 0 { format!(", {} missed", self.missed) } else { String::new() };
        format!(
            "{:.2} / {:.2} / {:.2} s ({}{missed})",
            self.p50 / 1000.0,
            self.p99 / 1000.0,
            self.max / 1000.0,
            self.count
        )
    }
}

/// What one system did.
#[derive(Default)]
struct Figures {
    name: String,
    idle: Latency,
    flood: Latency,
    flood_converged_s: f64,
    calls_per_parent: f64,
    restart: Latency,
    relist_s: f64,
    slow: Latency,
    /// Probes during the sustained flood, before and after its restart (phase 4).
    sustained: Option<(Latency, Latency)>,
}

/// Counts the flood's children written (a watch of its namespace): converged at N × 3.
fn watch_children(client: &Client, namespace: &str) -> (Arc<Mutex<BTreeSet<String>>>, tokio::task::AbortHandle) {
    let children: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let seen = Arc::clone(&children);
    let task = tokio::spawn(async move {
        let mut events = watcher(cms, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) = event {
                seen.lock().unwrap().insert(cm.metadata.name.unwrap_or_default());
            }
        }
    });
    (children, task.abort_handle())
}

async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + TIMEOUT;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {TIMEOUT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run(settings: &Settings, hook: &Arc<Hook>, name: &str, program: &Program) -> Figures {
    if run::fresh() {
        eprintln!("[bench-fair] {name}: a fresh control plane");
        plane::restart().await;
    }
    let client = Client::try_from(support::config().await).expect("a client for the control plane");
    support::install_crds(&client, &kinds::crd("FairThing")).await;
    match program {
        Program::Metacontroller(Metacontroller { crds: Some(crds), .. }) => {
            support::install_crds(&client, &std::fs::read_to_string(crds).unwrap()).await;
        }
        _ => support::install_metahook_crds(&client).await,
    }
    let flood_ns = support::TestNamespace::create(&client, "flood").await;
    let label = flood_ns.name.clone();
    let mut probe_namespaces = Vec::new();
    for k in 0..PROBES {
        probe_namespaces.push(support::TestNamespace::create(&client, &format!("team{k}")).await);
    }
    let slow_ns = support::TestNamespace::create(&client, "slow").await;
    let world = World {
        client: client.clone(),
        label: label.clone(),
        flood: flood_ns.name.clone(),
        probes: probe_namespaces.iter().map(|n| n.name.clone()).collect(),
        slow: slow_ns.name.clone(),
    };
    support::apply_value(&client, &controller(&label, &format!("{label}-fast"), "fast", &hook.url("/sync"))).await;
    let mut running = Running::start(program, &label);
    let mut figures = Figures { name: name.to_owned(), ..Figures::default() };

    // The probes, converged; then a few changes at idle.
    for ns in &world.probes {
        world.thing(ns, "probe", "fast", "v0").await;
    }
    for ns in &world.probes {
        wait_until("a probe parent's first sync", || async { hook.seen(ns, "probe", "v0").await.is_some() }).await;
    }
    let probes = Probes::default();
    probes.run(&world, hook, Arc::default(), Some(settings.idle_probes)).await;
    figures.idle = probes.take();
    eprintln!("[bench-fair] {name}: idle {}", figures.idle.cell());

    // 1. The flood, and the probes while it drains.
    let (children, watch) = watch_children(&client, &world.flood);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let prober = {
        let (probes, stop, hook) = (probes.clone(), Arc::clone(&stop), Arc::clone(hook));
        let world = world.clone();
        tokio::spawn(async move { probes.run(&world, &hook, stop, None).await })
    };
    let started = Instant::now();
    let flood = world.flood.clone();
    stream::iter(0..settings.n)
        .for_each_concurrent(32, |i| {
            let (world, flood) = (&world, flood.clone());
            async move { world.thing(&flood, &format!("p{i}"), "fast", "0").await }
        })
        .await;
    eprintln!("[bench-fair] {name}: {} parents created in {:.1} s", settings.n, started.elapsed().as_secs_f64());
    wait_until("the flood converged", || async { children.lock().unwrap().len() >= settings.n * CHILDREN }).await;
    figures.flood_converged_s = started.elapsed().as_secs_f64();
    #[allow(clippy::cast_precision_loss)]
    let per_parent = hook.calls(&world.flood).await as f64 / settings.n as f64;
    figures.calls_per_parent = per_parent;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = prober.await;
    watch.abort();
    figures.flood = probes.take();
    eprintln!(
        "[bench-fair] {name}: flood converged in {:.1} s ({per_parent:.2} calls per parent); probes {}",
        figures.flood_converged_s,
        figures.flood.cell()
    );

    // 2. A restart over the converged flood: the probes while it relists.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = hook.calls(&world.flood).await;
    running.stop().await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let started = Instant::now();
    running = Running::start(program, &label);
    let prober = {
        let (probes, stop, hook) = (probes.clone(), Arc::clone(&stop), Arc::clone(hook));
        let world = world.clone();
        tokio::spawn(async move { probes.run(&world, &hook, stop, None).await })
    };
    #[allow(clippy::cast_possible_truncation)]
    let n = settings.n as u64;
    wait_until("the restart's relist", || async { hook.calls(&world.flood).await >= before + n }).await;
    figures.relist_s = started.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = prober.await;
    figures.restart = probes.take();
    eprintln!("[bench-fair] {name}: relisted in {:.1} s; probes {}", figures.relist_s, figures.restart.cell());

    // 3. A controller whose hook takes 5 s per call beside the probes' own.
    support::apply_value(&client, &controller(&label, &format!("{label}-slow"), "slow", &hook.url("/slow"))).await;
    for i in 0..PROBES {
        world.thing(&world.slow, &format!("s{i}"), "slow", "0").await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let prober = {
        let (probes, stop, hook) = (probes.clone(), Arc::clone(&stop), Arc::clone(hook));
        let world = world.clone();
        tokio::spawn(async move { probes.run(&world, &hook, stop, None).await })
    };
    tokio::time::sleep(settings.slow).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = prober.await;
    figures.slow = probes.take();
    eprintln!("[bench-fair] {name}: beside a 5 s hook, probes {}", figures.slow.cell());

    // 4. A tenant changing its parents without pause, and a restart in the middle of it.
    if let Some(length) = settings.sustained {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tenant = {
            let (world, stop) = (world.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(25));
                for k in 0_usize.. {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    tick.tick().await;
                    world.thing(&world.flood, &format!("p{}", k % 20), "fast", &format!("t{k}")).await;
                }
            })
        };
        let half = length / 2;
        let probes_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let prober = {
            let (probes, stop, hook) = (probes.clone(), Arc::clone(&probes_stop), Arc::clone(hook));
            let world = world.clone();
            tokio::spawn(async move { probes.run(&world, &hook, stop, None).await })
        };
        tokio::time::sleep(half).await;
        probes_stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = prober.await;
        let during = probes.take();
        running.stop().await;
        let probes_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let prober = {
            let (probes, stop, hook) = (probes.clone(), Arc::clone(&probes_stop), Arc::clone(hook));
            let world = world.clone();
            tokio::spawn(async move { probes.run(&world, &hook, stop, None).await })
        };
        tokio::time::sleep(Duration::from_secs(3)).await;
        running = Running::start(program, &label);
        tokio::time::sleep(half).await;
        probes_stop.store(true, std::sync::atomic::Ordering::Relaxed);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = prober.await;
        let _ = tenant.await;
        let restarted = probes.take();
        eprintln!(
            "[bench-fair] {name}: sustained flood, probes {}; across its restart {}",
            during.cell(),
            restarted.cell()
        );
        figures.sustained = Some((during, restarted));
    }

    running.stop().await;
    if !run::fresh() {
        let controllers = support::api(&client, "metacontroller.k8s.io/v1alpha1", "CompositeController", None).await;
        for suffix in ["fast", "slow"] {
            let name = format!("{label}-{suffix}");
            let _ = controllers.delete(&name, &Default::default()).await;
            let _ = controllers
                .patch(&name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
                .await;
        }
        for ns in probe_namespaces {
            ns.delete().await;
        }
        slow_ns.delete().await;
        flood_ns.delete().await;
    }
    figures
}

fn table(settings: &Settings, results: &[Figures]) -> String {
    let mut out = format!(
        "| N = {} | idle: change → hook call p50 / p99 / max (changes) | during the flood | flood converged | hook calls per flood parent by then | during a restart's relist | relist | beside a 5 s-per-call controller |\n|---|---|---|---|---|---|---|---|\n",
        settings.n
    );
    for f in results {
        out.push_str(&format!(
            "| {} | {} | {} | {:.1} s | {:.2} | {} | {:.1} s | {} |\n",
            f.name,
            f.idle.cell(),
            f.flood.cell(),
            f.flood_converged_s,
            f.calls_per_parent,
            f.restart.cell(),
            f.relist_s,
            f.slow.cell()
        ));
    }
    if results.iter().any(|f| f.sustained.is_some()) {
        out.push_str(&format!(
            "\n| N = {} | during a sustained flood (40 changes/s in one namespace) | across a restart under it (probes made while it was down included) |\n|---|---|---|\n",
            settings.n
        ));
        for f in results {
            let cell = |l: Option<&Latency>| l.map_or_else(|| "not measured".to_owned(), Latency::cell);
            let sustained = f.sustained.as_ref();
            out.push_str(&format!(
                "| {} | {} | {} |\n",
                f.name,
                cell(sustained.map(|s| &s.0)),
                cell(sustained.map(|s| &s.1))
            ));
        }
    }
    out
}

#[tokio::main]
async fn main() {
    let settings = Settings::from_env();
    let hook = Arc::new(Hook::start("fair-hook.mjs").await);
    let hub_bin =
        std::env::var_os("HUB_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_metahook")), PathBuf::from);
    let mut systems = vec![("metahook".to_owned(), Program::Hub(hub_bin))];
    if let Some(baseline) = std::env::var_os("BASELINE_BIN").filter(|b| !b.is_empty()) {
        systems.push(("baseline".to_owned(), Program::Hub(PathBuf::from(baseline))));
    }
    match Metacontroller::from_env(&support::repo_root().join("target")) {
        Some(mc) => systems.push(("metacontroller".to_owned(), Program::Metacontroller(mc))),
        None if run::full() => eprintln!("{}", metacontroller::HOW_TO_GET),
        None => {}
    }
    if let Ok(only) = std::env::var("SYSTEMS") {
        let only: Vec<&str> = only.split(',').collect();
        systems.retain(|(name, _)| only.contains(&name.as_str()));
    }
    let mut results = Vec::new();
    for (name, program) in &systems {
        results.push(run(&settings, &hook, name, program).await);
    }
    run::report("fair", settings.n, &table(&settings, &results));
}
