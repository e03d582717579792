//! Per-call overhead of the hook client, with and without keep-alive, over HTTP and HTTPS, against a
//! real Python hook (`tests/hooks/transport_hook.py`, HTTP/1.1, Python's `ssl`). Run with
//! `make bench-hooks`; prints calls/s and p50/p99 latency per call. Nothing is asserted: figures are for
//! reading (and for the notes that quote them).
//!
//! Calls are sequential, each one a full `sync` request/response as a controller makes it (a parent,
//! an empty children map), so the figures are what one worker sees per call.

#[path = "../support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use metahook::api::Hook;
use metahook::hooks::{CompositeRequest, HookClient, HookClientConfig, HookKind, HookLabels, ObjectMaps};
use serde_json::{Value, json};

/// Calls per case, unless [`BUDGET`] runs out first (a slow case still gets enough calls for a p99).
const CALLS: usize = 2000;
const BUDGET: Duration = Duration::from_secs(10);
const WARMUP: usize = 20;

/// Starts the Python hook with `config`; returns the process (killed on drop) and its port.
async fn start_hook(config: &Value, dir: &std::path::Path) -> (tokio::process::Child, u16) {
    let file = dir.join(format!("hook-{}-{}.json", config["tls"].is_object(), config["nagle"] == true));
    std::fs::write(&file, config.to_string()).unwrap();
    support::start_transport_hook(&file).await
}

struct Figures {
    calls: usize,
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

async fn measure(hook: &Hook, keep_alive: bool) -> Figures {
    let config = HookClientConfig { keep_alive, ..HookClientConfig::default() };
    let labels = HookLabels { kind: "CompositeController".into(), controller: "bench".into(), hook: HookKind::Sync };
    let endpoint = HookClient::new(&config, None).endpoint(hook, &[], labels).expect("a valid hook");
    let parent = json!({"apiVersion": "test.metahook.dev/v1", "kind": "Thing",
                        "metadata": {"name": "one", "namespace": "bench", "uid": "0000"},
                        "spec": {"greeting": "hello"}});
    let (controller, maps) = (json!({}), ObjectMaps::new());
    let request = CompositeRequest {
        controller: &controller,
        parent: &parent,
        children: &maps,
        related: &maps,
        finalizing: false,
    };
    for _ in 0..WARMUP {
        endpoint.composite(&request).await.expect("hook call");
    }
    let mut took = Vec::with_capacity(CALLS);
    let started = Instant::now();
    while took.len() < CALLS && (took.len() < 100 || started.elapsed() < BUDGET) {
        let call = Instant::now();
        endpoint.composite(&request).await.expect("hook call");
        took.push(call.elapsed());
    }
    let total = started.elapsed();
    took.sort();
    let n = took.len();
    #[allow(clippy::cast_precision_loss)]
    let per_second = n as f64 / total.as_secs_f64();
    Figures { calls: n, per_second, p50: took[n / 2], p99: took[n * 99 / 100] }
}

fn hook(url: String, ca: Option<String>) -> Hook {
    let mut webhook = json!({"url": url});
    if let Some(pem) = ca {
        webhook["caBundle"] = json!({"inline": pem});
    }
    serde_json::from_value(json!({"webhook": webhook})).unwrap()
}

#[tokio::main]
async fn main() {
    let pki = support::Pki::new();
    let tls = json!({"cert": pki.path("server.crt"), "key": pki.path("server.key")});
    let hooks = [
        start_hook(&json!({}), pki.dir()).await,
        start_hook(&json!({"tls": tls}), pki.dir()).await,
        start_hook(&json!({"nagle": true}), pki.dir()).await,
        start_hook(&json!({"tls": tls, "nagle": true}), pki.dir()).await,
    ];
    let ca = pki.pem("ca.crt");
    let url = |i: usize, scheme: &str| format!("{scheme}://127.0.0.1:{}/sync", hooks[i].1);

    println!("hook client per-call overhead: up to {CALLS} sequential sync calls per case (at most {BUDGET:?}),");
    println!("after {WARMUP} warm-up calls, against tests/hooks/transport_hook.py on 127.0.0.1");
    println!("(Python http.server, HTTP/1.1; 'nagle': the hook leaves Nagle's algorithm on, as http.server does)\n");
    println!(
        "{:<8} {:<7} {:<11} {:>6} {:>9} {:>9} {:>9}",
        "scheme", "hook", "keep-alive", "calls", "calls/s", "p50 ms", "p99 ms"
    );
    let cases = [
        ("http", "nodelay", hook(url(0, "http"), None)),
        ("https", "nodelay", hook(url(1, "https"), Some(ca.clone()))),
        ("http", "nagle", hook(url(2, "http"), None)),
        ("https", "nagle", hook(url(3, "https"), Some(ca))),
    ];
    for (scheme, server, hook) in &cases {
        for keep_alive in [true, false] {
            let f = measure(hook, keep_alive).await;
            println!(
                "{scheme:<8} {server:<7} {:<11} {:>6} {:>9.0} {:>9.3} {:>9.3}",
                if keep_alive { "yes" } else { "no" },
                f.calls,
                f.per_second,
                f.p50.as_secs_f64() * 1000.0,
                f.p99.as_secs_f64() * 1000.0
            );
        }
    }
}
