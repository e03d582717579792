//! `make bench-map`: what a change of one input costs a MapController, against the same controller
//! written as a CompositeController with a customize hook — measured side by side in one run.
//!
//! Workload: one namespaced parent selecting N input ConfigMaps (labelled `bench-map-input: "yes"`,
//! N=1,000 at full size); for each input, one output ConfigMap `<input>-out` carrying the input's
//! `data.value`. The hook (`map-hook.mjs`, Node) answers at once and counts its calls and the bytes of
//! their requests. Systems, each on a control plane started anew for it at full size (`FRESH=0` keeps
//! one), in a namespace of its own, with an in-process hub:
//! - `map`: a MapController (input and output type `configmaps`; the outputs are never inputs: the
//!   parent controls them);
//! - `map own-writes=false`: the same, annotated `metahook.dev/sync-on-own-writes: "false"`, so the echo
//!   of its own output write does not ask that input again;
//! - `composite+customize`: a CompositeController whose customize hook asks for every input as a related
//!   object and whose sync hook answers every output.
//!
//! Phases: converge (all N outputs written); a first change of one input, reported on its own (with
//! `own-writes=false` it is the sync that first shows every input its outputs, which the default does
//! on the echoes while converging); then `CHANGES` times (10 at full size), one input's `data.value`
//! changed and the system left to go quiet. Per change it reports hook calls, request
//! bytes sent to the hook, outputs whose `resourceVersion` moved (read from the API server before and
//! after), ConfigMap writes the API server counted (minus the change itself), and the time from the
//! change to its output showing it. Figures are printed, never asserted (the machine is noisy); what it
//! asserts is that every system converged and followed every change.
//!
//! Run by `cargo test` with no arguments it does a smoke-sized run (N=20, 2 changes, one control plane).

// Only the CRD: the one parent is applied as JSON.
#[allow(dead_code)]
mod kinds;
mod plane;
// Only its hook: the hubs run in process.
#[allow(dead_code)]
mod procs;
mod run;
#[path = "../support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::{StreamExt as _, stream};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use procs::Hook;
use serde_json::{Value, json};

const INPUT_LABEL: &str = "bench-map-input";
const TIMEOUT: Duration = Duration::from_secs(900);
/// How long without a hook call counts as quiet.
const QUIET: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, Debug, PartialEq)]
enum System {
    Map,
    MapQuiet,
    Composite,
}

impl System {
    const ALL: [Self; 3] = [Self::Map, Self::MapQuiet, Self::Composite];

    fn name(self) -> &'static str {
        match self {
            Self::Map => "map",
            Self::MapQuiet => "map own-writes=false",
            Self::Composite => "composite+customize",
        }
    }

    /// The controller object for the hook at `url`, labelled for the test hub `label`.
    fn controller(self, label: &str, url: &str) -> Value {
        // Only this run's parent: a parent left by an interrupted run elsewhere would add its calls.
        let parent = json!({
            "apiVersion": "bench.metahook.dev/v1",
            "resource": "benchmaps",
            "labelSelector": {"matchLabels": {"metahook-test": label}},
        });
        let mut metadata = json!({"name": label, "labels": {"metahook-test": label}});
        let configmaps = json!({"apiVersion": "v1", "resource": "configmaps", "updateStrategy": {"method": "InPlace"}});
        match self {
            Self::Map | Self::MapQuiet => {
                if self == Self::MapQuiet {
                    metadata["annotations"] = json!({"metahook.dev/sync-on-own-writes": "false"});
                }
                json!({
                    "apiVersion": "metacontroller.k8s.io/v1alpha1",
                    "kind": "MapController",
                    "metadata": metadata,
                    "spec": {
                        "parentResource": parent,
                        "inputResources": [{"apiVersion": "v1", "resource": "configmaps"}],
                        "outputResources": [configmaps],
                        "hooks": {"map": {"webhook": {"url": format!("{url}/map")}}},
                    },
                })
            }
            Self::Composite => json!({
                "apiVersion": "metacontroller.k8s.io/v1alpha1",
                "kind": "CompositeController",
                "metadata": metadata,
                "spec": {
                    "parentResource": parent,
                    "generateSelector": true,
                    "childResources": [configmaps],
                    "hooks": {
                        "customize": {"webhook": {"url": format!("{url}/customize")}},
                        "sync": {"webhook": {"url": format!("{url}/sync")}},
                    },
                },
            }),
        }
    }

    /// The hook path whose calls and bytes are this system's work.
    fn paths(self) -> &'static [&'static str] {
        match self {
            Self::Map | Self::MapQuiet => &["/map"],
            Self::Composite => &["/customize", "/sync"],
        }
    }
}

struct Settings {
    n: usize,
    changes: usize,
}

impl Settings {
    fn from_env() -> Self {
        let num = run::number;
        if run::full() {
            Self { n: num("N", 1000), changes: num("CHANGES", 10).max(1) }
        } else {
            Self { n: num("N", 20), changes: num("CHANGES", 2).max(1) }
        }
    }
}

impl Hook {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// (calls, request bytes) so far on `paths`.
    async fn counts(&self, paths: &[&str]) -> (u64, u64) {
        let stats: Value = self.http.get(format!("{}/stats", self.url())).send().await.unwrap().json().await.unwrap();
        paths.iter().fold((0, 0), |(calls, bytes), path| {
            (calls + stats[path]["calls"].as_u64().unwrap_or(0), bytes + stats[path]["bytes"].as_u64().unwrap_or(0))
        })
    }

    /// Waits until no call came for [`QUIET`]; the counts then.
    async fn quiet(&self, paths: &[&str]) -> (u64, u64) {
        let mut last = self.counts(paths).await;
        let mut since = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = self.counts(paths).await;
            if now != last {
                (last, since) = (now, Instant::now());
            } else if since.elapsed() >= QUIET {
                return now;
            }
        }
    }
}

/// ConfigMap writes the API server has counted so far.
async fn configmap_writes(client: &Client) -> u64 {
    let totals = plane::request_totals(client).await.into_iter();
    totals.filter(|r| r.resource == "configmaps" && r.subresource.is_empty() && r.writes()).map(|r| r.count).sum()
}

/// The outputs' resourceVersions and values, by name.
async fn outputs(configmaps: &Api<DynamicObject>) -> BTreeMap<String, (String, String)> {
    let list = configmaps.list(&ListParams::default()).await.unwrap();
    list.items
        .into_iter()
        .filter_map(|cm| {
            let name = cm.metadata.name.clone()?;
            name.ends_with("-out").then(|| {
                let value = cm.data["data"]["value"].as_str().unwrap_or_default().to_owned();
                (name, (cm.metadata.resource_version.clone().unwrap_or_default(), value))
            })
        })
        .collect()
}

/// A fresh control plane (the repository's own, started anew), or the running one.
async fn control_plane(system: System) -> Client {
    if run::fresh() {
        eprintln!("[bench-map] {}: a fresh control plane", system.name());
        plane::restart().await;
    }
    let client = Client::try_from(support::config().await).expect("a client for the control plane");
    support::install_crds(&client, &kinds::crd("BenchMap")).await;
    support::install_metahook_crds(&client).await;
    client
}

/// What one system did.
#[derive(Default)]
struct Figures {
    converge_s: f64,
    converge_calls: u64,
    converge_kib: f64,
    first_change_calls: u64,
    first_change_ms: f64,
    calls_per_change: f64,
    kib_per_change: f64,
    outputs_written_per_change: f64,
    writes_per_change: f64,
    latency_ms: Vec<f64>,
}

async fn run(settings: &Settings, hook: &Hook, system: System) -> Figures {
    let client = control_plane(system).await;
    let ns = support::TestNamespace::create(&client, "bench-map").await;
    let configmaps: Api<DynamicObject> = support::api(&client, "v1", "ConfigMap", Some(&ns.name)).await;
    eprintln!("[bench-map] {}: {} inputs", system.name(), settings.n);
    stream::iter(0..settings.n)
        .for_each_concurrent(16, |i| {
            let configmaps = configmaps.clone();
            async move {
                let input: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("in-{i:05}"), "labels": {INPUT_LABEL: "yes"}},
                    "data": {"value": "0"},
                }))
                .unwrap();
                configmaps.create(&PostParams::default(), &input).await.unwrap();
            }
        })
        .await;
    let hub = support::Hub::start(&client, &ns.name);
    let paths = system.paths();
    let (calls0, bytes0) = hook.counts(paths).await;
    let started = Instant::now();
    support::apply_value(&client, &system.controller(&ns.name, &hook.url())).await;
    let parent = json!({
        "apiVersion": "bench.metahook.dev/v1", "kind": "BenchMap",
        "metadata": {"name": "all", "namespace": ns.name, "labels": {"metahook-test": ns.name}},
        // A map parent's selector picks its inputs; a composite's picks its children (the hub
        // generates one), its inputs being asked for by the customize hook.
        "spec": if system == System::Composite { json!({}) } else { json!({"selector": {"matchLabels": {INPUT_LABEL: "yes"}}}) },
    });
    support::apply_value(&client, &parent).await;
    let mut figures = Figures::default();
    wait_until(|| async { (outputs(&configmaps).await.len() == settings.n).then_some(()) }).await;
    figures.converge_s = started.elapsed().as_secs_f64();
    eprintln!("[bench-map] {}: converged in {:.1} s", system.name(), figures.converge_s);
    let (calls1, bytes1) = hook.quiet(paths).await;
    (figures.converge_calls, figures.converge_kib) = (calls1 - calls0, (bytes1 - bytes0) as f64 / 1024.0);

    // A first change, counted on its own: with `own-writes=false` it is the sync that shows every
    // input its outputs for the first time (the calls the default makes at once, on the echoes).
    let first = change_one(&configmaps, hook, paths, settings.n, 0).await;
    (figures.first_change_calls, figures.first_change_ms) = (first.0 - calls1, first.1);
    let calls1 = first.0;
    let bytes1 = hook.counts(paths).await.1;
    let before = outputs(&configmaps).await;
    let writes0 = configmap_writes(&client).await;
    for change in 1..=settings.changes {
        let (_, latency) = change_one(&configmaps, hook, paths, settings.n, change).await;
        figures.latency_ms.push(latency);
        eprintln!("[bench-map] {}: change {change} followed in {latency:.0} ms", system.name());
    }
    let (calls2, bytes2) = hook.counts(paths).await;
    let writes = configmap_writes(&client).await - writes0 - settings.changes as u64;
    let after = outputs(&configmaps).await;
    let moved = after.iter().filter(|(name, (rv, _))| before.get(*name).is_none_or(|(old, _)| old != rv)).count();
    let changes = settings.changes as f64;
    figures.calls_per_change = (calls2 - calls1) as f64 / changes;
    figures.kib_per_change = (bytes2 - bytes1) as f64 / 1024.0 / changes;
    figures.outputs_written_per_change = moved as f64 / changes;
    figures.writes_per_change = writes as f64 / changes;
    hub.stop().await;
    let controllers = support::api(&client, "metacontroller.k8s.io/v1alpha1", kind_of(system), None).await;
    let _ = controllers.delete(&ns.name, &Default::default()).await;
    ns.delete().await;
    figures
}

/// Changes one input's value (the `change`-th change) and waits for its output to show it, then for
/// the hook to go quiet: the hook's calls then, and the time from the change to the output (ms).
async fn change_one(
    configmaps: &Api<DynamicObject>,
    hook: &Hook,
    paths: &[&str],
    n: usize,
    change: usize,
) -> (u64, f64) {
    let input = format!("in-{:05}", (change * 37) % n);
    let value = format!("{}", change + 1);
    let changed_at = Instant::now();
    let patch = json!({"data": {"value": value}});
    configmaps.patch(&input, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let output = format!("{input}-out");
    wait_until(|| async {
        let cm = configmaps.get_opt(&output).await.ok()??;
        (cm.data["data"]["value"] == value.as_str()).then_some(())
    })
    .await;
    let latency = changed_at.elapsed().as_secs_f64() * 1000.0;
    (hook.quiet(paths).await.0, latency)
}

fn kind_of(system: System) -> &'static str {
    if system == System::Composite { "CompositeController" } else { "MapController" }
}

async fn wait_until<F, Fut>(mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<()>>,
{
    let deadline = Instant::now() + TIMEOUT;
    while check().await.is_none() {
        assert!(Instant::now() < deadline, "the system did not converge in {TIMEOUT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A row of the table: its name, and its figure of a system.
type Row = (&'static str, fn(&Figures) -> String);

fn table(settings: &Settings, results: &[(System, Figures)]) -> String {
    let mut out = format!(
        "\n### MapController vs CompositeController+customize: 1 parent, {} inputs, {} single-input changes\n\n| figure |",
        settings.n, settings.changes
    );
    for (system, _) in results {
        out += &format!(" {} |", system.name());
    }
    out += &format!("\n|---|{}\n", "---|".repeat(results.len()));
    let rows: [Row; 10] = [
        ("converge (s)", |f| format!("{:.1}", f.converge_s)),
        ("hook calls to converge", |f| f.converge_calls.to_string()),
        ("KiB sent to the hook to converge", |f| format!("{:.0}", f.converge_kib)),
        ("hook calls of the first change after that", |f| f.first_change_calls.to_string()),
        ("the first change → its output (ms)", |f| format!("{:.0}", f.first_change_ms)),
        ("hook calls per change", |f| format!("{:.1}", f.calls_per_change)),
        ("KiB sent to the hook per change", |f| format!("{:.1}", f.kib_per_change)),
        ("outputs written per change", |f| format!("{:.1}", f.outputs_written_per_change)),
        ("ConfigMap writes per change (API server's count)", |f| format!("{:.1}", f.writes_per_change)),
        ("change → output, median (ms)", |f| format!("{:.0}", median(&f.latency_ms))),
    ];
    for (name, figure) in rows {
        out += &format!("| {name} |");
        for (_, figures) in results {
            out += &format!(" {} |", figure(figures));
        }
        out.push('\n');
    }
    out
}

#[tokio::main]
async fn main() {
    let settings = Settings::from_env();
    // The in-process hubs' warnings (a failing sync shows here); `BENCH_HUB_LOG=debug` for more.
    let filter = std::env::var("BENCH_HUB_LOG").unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    let hook = Hook::start("map-hook.mjs").await;
    let mut results = Vec::new();
    // `SYSTEMS=map,composite+customize`: only those.
    let only = std::env::var("SYSTEMS").ok().filter(|s| !s.is_empty());
    for system in System::ALL {
        if only.as_ref().is_some_and(|only| !only.split(',').any(|s| s == system.name())) {
            continue;
        }
        let figures = run(&settings, &hook, system).await;
        results.push((system, figures));
    }
    run::report("map", settings.n, &table(&settings, &results));
}
