//! `/metrics`, `/healthz` and `/readyz` on `metricsAddress` (the probes on `healthProbeAddress` instead,
//! when that is set, as Metacontroller serves them): one registry for every stage's families
//! (each stage owns its own and registers them with one call, see [`registry`]), gauges computed when
//! scraped (caches, controllers, leadership), and the readiness a rolling update waits for.
//!
//! Names follow the conventions dashboards already know (see [`crate::engine::metrics`]), plus
//! client-go's `leader_election_master_status`. A whole HTTP framework for three GET routes would
//! outweigh the rest of the hub's dependencies, so the responder is a small hand-written one.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric as _};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use crate::cache::informers::Informers;
use crate::engine::health::Health;
use crate::engine::hub::Hub;
use crate::ops::gate::Leadership;

/// One registry holding every family of the hub: the engine's (syncs, queues; the write stage's
/// applies with them), the hook client's, the API client's and the process's, and the scrape-time gauges.
#[must_use]
pub fn registry(hub: &Hub, ready: &Readiness) -> Registry {
    let mut registry = Registry::default();
    hub.metrics.register(&mut registry);
    hub.hooks.metrics().register(&mut registry);
    crate::ops::client_metrics::process().register(&mut registry);
    registry.register_collector(Box::new(crate::ops::process::ProcessMetrics));
    register_snapshot(&mut registry, ready.health.clone(), ready.leadership.clone(), hub.informers.clone());
    registry
}

/// Scrape-time gauges: controllers by state, informer caches, leadership.
struct Snapshot {
    health: Health,
    leadership: Option<Leadership>,
    informers: Informers,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot").field("health", &self.health).finish_non_exhaustive()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    name: String,
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let caches = self.informers.stats();
        let gauge = ConstGauge::new(i64::try_from(caches.len()).unwrap_or(i64::MAX));
        gauge.encode(encoder.encode_descriptor(
            "metahook_watched_types",
            "Resource types with a shared watch.",
            None,
            gauge.metric_type(),
        )?)?;
        let mut objects = encoder.encode_descriptor(
            "metahook_informer_objects",
            "Objects in the shared cache of a type.",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for cache in &caches {
            let labels = ResourceLabels { resource: cache.resource.clone() };
            ConstGauge::new(i64::try_from(cache.objects).unwrap_or(i64::MAX))
                .encode(objects.encode_family(&labels)?)?;
        }
        let mut synced = encoder.encode_descriptor(
            "metahook_informer_synced",
            "1 once the cache of a type holds its first full list.",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for cache in &caches {
            let labels = ResourceLabels { resource: cache.resource.clone() };
            ConstGauge::new(i64::from(cache.synced)).encode(synced.encode_family(&labels)?)?;
        }
        let by_state = self.health.count_by_state();
        let mut controllers = encoder.encode_descriptor(
            "metahook_controllers",
            "Controllers by state (starting: waiting for caches; failed: see their Ready condition).",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (state, count) in by_state {
            ConstGauge::new(count).encode(controllers.encode_family(&StateLabels { state })?)?;
        }
        if let Some(leadership) = &self.leadership {
            let mut leader = encoder.encode_descriptor(
                "leader_election_master_status",
                "1 while this hub holds the leader Lease and may write.",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            let labels = LeaseLabels { name: leadership.lease.clone() };
            ConstGauge::new(i64::from(leadership.may_write())).encode(leader.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// The families [`register_snapshot`] computes when scraped.
pub const SCRAPE_TIME_FAMILIES: [&str; 5] = [
    "metahook_watched_types",
    "metahook_informer_objects",
    "metahook_informer_synced",
    "metahook_controllers",
    "leader_election_master_status",
];

/// Names of the families in `registry` (as `# TYPE` declares them, without sample suffixes).
#[must_use]
pub fn family_names(registry: &Registry) -> std::collections::BTreeSet<String> {
    render(registry)
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Registers the scrape-time gauges (caches, controllers, leadership).
pub fn register_snapshot(
    registry: &mut Registry,
    health: Health,
    leadership: Option<Leadership>,
    informers: Informers,
) {
    registry.register_collector(Box::new(Snapshot { health, leadership, informers }));
}

/// Ready, and a body saying why (or why not): a standby is ready (it must be, for a rolling update to
/// proceed); the leader, or a hub without election, as its controllers are ([`Health::readiness`]).
#[must_use]
pub fn readiness(health: &Health, leadership: Option<&Leadership>) -> (bool, String) {
    let mut head = String::new();
    if let Some(leadership) = leadership {
        if !leadership.may_write() {
            let holder = leadership.holder().unwrap_or_else(|| "nobody".to_owned());
            return (true, format!("ok: standby (identity {}; leader {holder})\n", leadership.identity));
        }
        head = format!("leader: {} (lease {})\n", leadership.identity, leadership.lease);
    }
    let (ready, body) = health.readiness();
    let verdict = if ready { "ok\n" } else { "not ready\n" };
    (ready, format!("{verdict}{head}{body}"))
}

/// The `OpenMetrics` text of every registered family.
#[must_use]
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(err) = prometheus_client::encoding::text::encode(&mut out, registry) {
        warn!("encoding metrics: {err}");
    }
    out
}

/// What `/readyz` answers from.
#[derive(Clone, Debug)]
pub struct Readiness {
    pub health: Health,
    pub leadership: Option<Leadership>,
}

/// Which endpoints a listener answers; the others are 404.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Routes {
    /// `/metrics`.
    pub metrics: bool,
    /// `/healthz` and `/readyz`.
    pub probes: bool,
}

impl Routes {
    pub const ALL: Self = Self { metrics: true, probes: true };
    pub const METRICS: Self = Self { metrics: true, probes: false };
    pub const PROBES: Self = Self { metrics: false, probes: true };

    fn describe(self) -> &'static str {
        match (self.metrics, self.probes) {
            (true, true) => "/metrics, /healthz and /readyz",
            (true, false) => "/metrics",
            _ => "/healthz and /readyz",
        }
    }
}

/// Binds `address`: `host:port`, or Go's `:port` for every address of the host (IPv6 and IPv4 where
/// the host has IPv6, else IPv4).
pub async fn bind(address: &str) -> std::io::Result<TcpListener> {
    match address.strip_prefix(':') {
        Some(port) => match TcpListener::bind(format!("[::]:{port}")).await {
            Ok(listener) => Ok(listener),
            Err(_) => TcpListener::bind(format!("0.0.0.0:{port}")).await,
        },
        None => TcpListener::bind(address).await,
    }
}

/// Serves `routes` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, registry: Arc<Registry>, ready: Readiness, routes: Routes) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { continue };
        let registry = Arc::clone(&registry);
        let ready = ready.clone();
        tokio::spawn(async move {
            let mut buffer = [0_u8; 1024];
            let Ok(read) = stream.read(&mut buffer).await else { return };
            let request = String::from_utf8_lossy(&buffer[..read]);
            let path = request.split_whitespace().nth(1).unwrap_or("/");
            let text = "text/plain; charset=utf-8";
            let (status, content_type, body) = match path {
                "/metrics" if routes.metrics => {
                    ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", render(&registry))
                }
                "/healthz" if routes.probes => ("200 OK", text, "ok\n".to_owned()),
                "/readyz" if routes.probes => match readiness(&ready.health, ready.leadership.as_ref()) {
                    (true, body) => ("200 OK", text, body),
                    (false, body) => ("503 Service Unavailable", text, body),
                },
                _ => ("404 Not Found", text, "not found\n".to_owned()),
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            if let Err(err) = stream.write_all(response.as_bytes()).await {
                debug!("metrics client went away: {err}");
            }
        });
    }
}

/// Binds `address` (empty = disabled, see [`bind`]) and serves `routes` on it in the background.
pub async fn start(
    address: &str,
    registry: Arc<Registry>,
    ready: Readiness,
    routes: Routes,
) -> Option<tokio::task::JoinHandle<()>> {
    if address.is_empty() {
        return None;
    }
    match bind(address).await {
        Ok(listener) => {
            if let Ok(local) = listener.local_addr() {
                info!(address = %local, "serving {}", routes.describe());
            }
            Some(tokio::spawn(serve(listener, registry, ready, routes)))
        }
        Err(err) => {
            warn!(address, "cannot serve {}: {err}", routes.describe());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_listener_answers_its_own_routes_and_go_addresses_bind() {
        let listener = bind(":0").await.expect("Go's :port form binds every address");
        let port = listener.local_addr().unwrap().port();
        let health = Health::default();
        let ready = Readiness { health, leadership: None };
        let probes = tokio::spawn(serve(listener, Arc::new(Registry::default()), ready, Routes::PROBES));
        let get = |path: &'static str| async move {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            stream.write_all(format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).await.unwrap();
            response.split_whitespace().nth(1).unwrap().to_owned()
        };
        assert_eq!(get("/healthz").await, "200");
        assert_eq!(get("/readyz").await, "503", "no controllers listed yet");
        assert_eq!(get("/metrics").await, "404", "metrics are on their own listener");
        probes.abort();
    }

    #[test]
    fn a_standby_is_ready_and_says_who_leads() {
        let leadership = Leadership::new("b_1".into(), "ns/metahook".into());
        let (ready, body) = readiness(&Health::default(), Some(&leadership));
        assert!(ready, "a standby must be ready, or a rolling update never finishes");
        assert!(body.contains("standby"), "{body}");
    }

    #[test]
    fn without_election_the_hub_is_ready_as_its_controllers_are() {
        let health = Health::default();
        let (ready, body) = readiness(&health, None);
        assert!(!ready && body.starts_with("not ready\n"), "{body}");
        health.listed("CompositeController");
        health.listed("DecoratorController");
        assert_eq!(readiness(&health, None), (true, "ok\n".to_owned()));
    }
}
