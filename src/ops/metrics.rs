//! `/metrics`, `/healthz` and `/readyz` on `metricsAddress` (the probes on `healthProbeAddress` instead,
//! when that is set, as Metacontroller serves them): one registry for every stage's families
//! (each stage owns its own and registers them with one call, see [`registry`]), gauges computed when
//! scraped (caches, controllers, leadership), and the readiness a rolling update waits for.
//!
//! Names follow the conventions dashboards already know (see [`crate::engine::metrics`]), plus
//! client-go's `leader_election_master_status` and `rest_client_*` ([`crate::ops::client_metrics`]) and
//! the `process_*` every Prometheus client exports ([`crate::ops::process`]). With `metricsAuth:
//! kubernetes`, `/metrics` answers only whom the API server allows ([`crate::ops::metrics_auth`]); the
//! probes stay open, as the kubelet calls them without a token. A whole HTTP framework for three GET
//! routes would outweigh the rest of the hub's dependencies, so the responder is a small hand-written one.

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
use crate::ops::metrics_auth::{MetricsAccess, Verdict};

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

/// The most of a request the responder reads: its head, with room for a `ServiceAccount` token (about
/// 1 KiB, more with many audiences) in its `Authorization` header.
const HEAD_LIMIT: usize = 16 * 1024;

/// How long a client may take to send its request head; a connection that sends nothing is dropped
/// rather than kept open for ever.
const HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads a request's head (up to the blank line, at most [`HEAD_LIMIT`] bytes, within [`HEAD_TIMEOUT`]).
async fn read_head(stream: &mut tokio::net::TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut buffer = [0_u8; 2048];
    let reading = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < HEAD_LIMIT {
            let read = stream.read(&mut buffer).await.ok()?;
            if read == 0 {
                break;
            }
            head.extend_from_slice(&buffer[..read]);
        }
        Some(())
    };
    tokio::time::timeout(HEAD_TIMEOUT, reading).await.ok()??;
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// The value of header `name` in a request head.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// Serves `routes` on `listener` until the task is dropped; `/metrics` to whom `access` allows.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    ready: Readiness,
    routes: Routes,
    access: MetricsAccess,
) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { continue };
        let registry = Arc::clone(&registry);
        let ready = ready.clone();
        let access = access.clone();
        tokio::spawn(async move {
            let Some(request) = read_head(&mut stream).await else { return };
            let path = request.split_whitespace().nth(1).unwrap_or("/");
            let text = "text/plain; charset=utf-8";
            let (status, content_type, body) = match path {
                "/metrics" if routes.metrics => match access.check(header(&request, "authorization"), path).await {
                    Ok(Verdict::Allowed) => {
                        ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", render(&registry))
                    }
                    Ok(Verdict::Unauthenticated) => ("401 Unauthorized", text, "Unauthorized\n".to_owned()),
                    Ok(Verdict::Forbidden) => ("403 Forbidden", text, "Forbidden\n".to_owned()),
                    Err(err) => {
                        warn!("refusing a scrape: {err}");
                        ("500 Internal Server Error", text, "Authentication or authorization failed\n".to_owned())
                    }
                },
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

/// Binds `address` (empty = disabled, see [`bind`]) and serves `routes` on it in the background,
/// `/metrics` to whom `access` allows.
pub async fn start(
    address: &str,
    registry: Arc<Registry>,
    ready: Readiness,
    routes: Routes,
    access: MetricsAccess,
) -> Option<tokio::task::JoinHandle<()>> {
    if address.is_empty() {
        return None;
    }
    match bind(address).await {
        Ok(listener) => {
            if let Ok(local) = listener.local_addr() {
                info!(address = %local, "serving {}", routes.describe());
            }
            Some(tokio::spawn(serve(listener, registry, ready, routes, access)))
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
        let probes =
            tokio::spawn(serve(listener, Arc::new(Registry::default()), ready, Routes::PROBES, MetricsAccess::Anyone));
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

    /// With access reviewed, `/metrics` wants a bearer token (a `ServiceAccount` token is longer than
    /// one read of the socket) and the probes do not. The reviewer here cannot reach an API server, so
    /// a token it was given to review answers 500, not 401: the header was read.
    #[tokio::test]
    async fn reviewed_metrics_want_a_token_and_the_probes_do_not() {
        let listener = bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let access = MetricsAccess::Reviewed(Arc::new(crate::ops::metrics_auth::Reviewer::new(client)));
        let ready = Readiness { health: Health::default(), leadership: None };
        let server = tokio::spawn(serve(listener, Arc::new(Registry::default()), ready, Routes::ALL, access));
        let get = |path: &'static str, authorization: Option<String>| async move {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            let header = authorization.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
            stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: hub\r\n{header}\r\n").as_bytes()).await.unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).await.unwrap();
            response.split_whitespace().nth(1).unwrap().to_owned()
        };
        assert_eq!(get("/metrics", None).await, "401");
        assert_eq!(get("/metrics", Some("Basic dXNlcjpwdw==".into())).await, "401");
        let token = "x".repeat(3000);
        assert_eq!(get("/metrics", Some(format!("Bearer {token}"))).await, "500", "the review was attempted");
        assert_eq!(get("/healthz", None).await, "200");
        server.abort();
    }

    #[test]
    fn headers_are_found_in_any_case() {
        let head = "GET /metrics HTTP/1.1\r\nHost: hub\r\nauthorization:  Bearer t0k\r\n\r\n";
        assert_eq!(header(head, "Authorization"), Some("Bearer t0k"));
        assert_eq!(header(head, "Cookie"), None);
        assert_eq!(header("GET /authorization:x HTTP/1.1\r\n\r\n", "authorization"), None, "not the request line");
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
