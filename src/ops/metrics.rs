//! `/metrics`, `/healthz` and `/readyz` on `metricsAddress` (the probes on `healthProbeAddress` instead,
//! when that is set, as Metacontroller serves them): one registry for every stage's families
//! (each stage owns its own and registers them with one call, see [`registry`]), gauges computed when
//! scraped (caches, controllers, leadership), and the readiness a rolling update waits for.
//!
//! Names follow the conventions dashboards already know (see [`crate::engine::metrics`]), plus
//! client-go's `leader_election_master_status` and `rest_client_*` ([`crate::ops::client_metrics`]) and
//! the `process_*` every Prometheus client exports ([`crate::ops::process`]). With `metricsAuth:
//! kubernetes`, `/metrics` answers only whom the API server allows ([`crate::ops::metrics_auth`]); the
//! probes stay open, as the kubelet calls them without a token. Served by axum on hyper
//! ([`crate::ops::http`]); `/metrics` is `OpenMetrics` text to a scraper that asks for it (`Accept:
//! application/openmetrics-text`, as Prometheus does) and the Prometheus text format 0.0.4 to anyone
//! else, as `client_golang`'s handler negotiates.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric as _};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::{info, warn};

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
    register_snapshot(&mut registry, ready.clone(), hub.informers.clone());
    registry
}

/// Scrape-time gauges: controllers by state, informer caches, leadership.
struct Snapshot {
    ready: Readiness,
    informers: Informers,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot").field("ready", &self.ready).finish_non_exhaustive()
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
        let by_state = self.ready.health.count_by_state();
        let mut controllers = encoder.encode_descriptor(
            "metahook_controllers",
            "Controllers by state (starting: waiting for caches; failed: see their Ready condition).",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (state, count) in by_state {
            ConstGauge::new(count).encode(controllers.encode_family(&StateLabels { state })?)?;
        }
        if let Some(leadership) = self.ready.leader_lease() {
            let mut leader = encoder.encode_descriptor(
                "leader_election_master_status",
                "1 while this hub holds the leader Lease (sharded: coordinates the ring).",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            let labels = LeaseLabels { name: leadership.lease.clone() };
            ConstGauge::new(i64::from(leadership.may_write())).encode(leader.encode_family(&labels)?)?;
        }
        if let (Some(member), Some(_)) = (&self.ready.leadership, &self.ready.coordination) {
            let mut held = encoder.encode_descriptor(
                "metahook_shard_member",
                "1 while this replica holds its member Lease of the ring and may write.",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            let labels = LeaseLabels { name: member.lease.clone() };
            ConstGauge::new(i64::from(member.may_write())).encode(held.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// The families [`register_snapshot`] computes when scraped.
pub const SCRAPE_TIME_FAMILIES: [&str; 6] = [
    "metahook_watched_types",
    "metahook_informer_objects",
    "metahook_informer_synced",
    "metahook_controllers",
    "leader_election_master_status",
    "metahook_shard_member",
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
pub fn register_snapshot(registry: &mut Registry, ready: Readiness, informers: Informers) {
    registry.register_collector(Box::new(Snapshot { ready, informers }));
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

/// What `/readyz` answers from, and the leases `/metrics` reports.
#[derive(Clone, Debug)]
pub struct Readiness {
    pub health: Health,
    /// The Lease that gates this replica's writes: the leader Lease, or with sharding its member Lease.
    pub leadership: Option<Leadership>,
    /// With sharding, the leader Lease, whose holder coordinates the ring (it gates no sync).
    pub coordination: Option<Leadership>,
}

impl Readiness {
    /// The leader Lease, which `leader_election_master_status` reports: with sharding the
    /// coordinator's, so that the family means the same thing whether the hub is sharded or not (one
    /// replica at 1), and each member Lease goes to `metahook_shard_member`.
    #[must_use]
    pub fn leader_lease(&self) -> Option<&Leadership> {
        self.coordination.as_ref().or(self.leadership.as_ref())
    }
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

/// How long a request may take, head to answer (a scrape renders in milliseconds; a token review is
/// one API call).
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The `OpenMetrics` media type, and the Prometheus text format's.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Clone)]
struct Served {
    registry: Arc<Registry>,
    ready: Readiness,
    access: MetricsAccess,
}

/// The router of a listener answering `routes` (anything else is 404, another method 405).
pub fn router(registry: Arc<Registry>, ready: Readiness, routes: Routes, access: MetricsAccess) -> axum::Router {
    let mut app = axum::Router::new();
    if routes.metrics {
        app = app.route("/metrics", get(metrics));
    }
    if routes.probes {
        app = app
            .route("/healthz", get(|| async { text(StatusCode::OK, "ok\n".to_owned()) }))
            .route("/readyz", get(readyz));
    }
    app.fallback(|| async { text(StatusCode::NOT_FOUND, "not found\n".to_owned()) })
        .with_state(Served { registry, ready, access })
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, REQUEST_TIMEOUT))
}

fn text(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"))], body).into_response()
}

async fn readyz(State(served): State<Served>) -> Response {
    match readiness(&served.ready.health, served.ready.leadership.as_ref()) {
        (true, body) => text(StatusCode::OK, body),
        (false, body) => text(StatusCode::SERVICE_UNAVAILABLE, body),
    }
}

async fn metrics(State(served): State<Served>, headers: HeaderMap) -> Response {
    let authorization = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    match served.access.check(authorization, "/metrics").await {
        Ok(Verdict::Allowed) => {
            let body = render(&served.registry);
            let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
            if wants_openmetrics(accept) {
                ([(header::CONTENT_TYPE, OPENMETRICS)], body).into_response()
            } else {
                ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], prometheus_text(&body)).into_response()
            }
        }
        Ok(Verdict::Unauthenticated) => text(StatusCode::UNAUTHORIZED, "Unauthorized\n".to_owned()),
        Ok(Verdict::Forbidden) => text(StatusCode::FORBIDDEN, "Forbidden\n".to_owned()),
        Err(err) => {
            warn!("refusing a scrape: {err}");
            text(StatusCode::INTERNAL_SERVER_ERROR, "Authentication or authorization failed\n".to_owned())
        }
    }
}

/// Whether an `Accept` header asks for `OpenMetrics` (listed without `q=0`).
fn wants_openmetrics(accept: &str) -> bool {
    accept.split(',').any(|range| {
        let mut parts = range.split(';').map(str::trim);
        parts.next().is_some_and(|media| media.eq_ignore_ascii_case("application/openmetrics-text"))
            && !parts.any(|p| p.strip_prefix("q=").is_some_and(|q| q.parse::<f64>().is_ok_and(|q| q <= 0.0)))
    })
}

/// `OpenMetrics` text in the Prometheus text format 0.0.4: the families a counter declares are named
/// as its samples are (`x_total`), an info family is a gauge `x_info`, `_created` samples, units,
/// exemplars and `# EOF` — which that format has not — are left out, other types are untyped.
#[must_use]
pub fn prometheus_text(openmetrics: &str) -> String {
    use std::fmt::Write as _;
    // The encoder writes a family's HELP before its TYPE: know every family's type first.
    let types: std::collections::HashMap<&str, &str> =
        openmetrics.lines().filter_map(|line| line.strip_prefix("# TYPE ")?.split_once(' ')).collect();
    let renamed = |family: &str| match types.get(family).copied() {
        Some("counter") => (format!("{family}_total"), "counter"),
        Some("info") => (format!("{family}_info"), "gauge"),
        Some(kind @ ("gauge" | "histogram" | "summary")) => (family.to_owned(), kind),
        _ => (family.to_owned(), "untyped"),
    };
    let is_created = |sample: &str| {
        sample.strip_suffix("_created").is_some_and(|family| {
            matches!(types.get(family).copied(), Some("counter" | "histogram" | "summary" | "gaugehistogram"))
        })
    };
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = renamed(rest.split_once(' ').map_or(rest, |(family, _)| family));
            let _ = writeln!(out, "# TYPE {name} {kind}");
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (family, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let _ = writeln!(out, "# HELP {} {help}", renamed(family).0);
        } else if line.starts_with('#') || is_created(line.split(['{', ' ']).next().unwrap_or_default()) {
            // `# EOF`, `# UNIT`, and the creation times of counters and histograms.
        } else {
            out.push_str(line.split(" # ").next().unwrap_or(line));
            out.push('\n');
        }
    }
    out
}

/// Serves `routes` on `listener` until the task is dropped; `/metrics` to whom `access` allows.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    ready: Readiness,
    routes: Routes,
    access: MetricsAccess,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    crate::ops::http::serve(listener, router(registry, ready, routes, access), crate::ops::http::HEAD_TIMEOUT, tls)
        .await;
}

/// Binds `address` (empty = disabled, see [`crate::ops::http::bind`]) and serves `routes` on it in the background,
/// `/metrics` to whom `access` allows, over HTTPS with `tls`.
pub async fn start(
    address: &str,
    registry: Arc<Registry>,
    ready: Readiness,
    routes: Routes,
    access: MetricsAccess,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> Option<tokio::task::JoinHandle<()>> {
    if address.is_empty() {
        return None;
    }
    match crate::ops::http::bind(address).await {
        Ok(listener) => {
            if let Ok(local) = listener.local_addr() {
                let scheme = if tls.is_some() { "https" } else { "http" };
                info!(address = %local, scheme, "serving {}", routes.describe());
            }
            Some(tokio::spawn(serve(listener, registry, ready, routes, access, tls)))
        }
        Err(err) => {
            warn!(address, "cannot serve {}: {err}", routes.describe());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    #[tokio::test]
    async fn each_listener_answers_its_own_routes_and_go_addresses_bind() {
        let listener = crate::ops::http::bind(":0").await.expect("Go's :port form binds every address");
        let port = listener.local_addr().unwrap().port();
        let health = Health::default();
        let ready = Readiness { health, leadership: None, coordination: None };
        let probes = tokio::spawn(serve(
            listener,
            Arc::new(Registry::default()),
            ready,
            Routes::PROBES,
            MetricsAccess::Anyone,
            None,
        ));
        let get = |path: &'static str| async move {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            let request = format!("GET {path} HTTP/1.1\r\nHost: hub\r\nConnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await.unwrap();
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
        let listener = crate::ops::http::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let access = MetricsAccess::Reviewed(Arc::new(crate::ops::metrics_auth::Reviewer::new(client)));
        let ready = Readiness { health: Health::default(), leadership: None, coordination: None };
        let server = tokio::spawn(serve(listener, Arc::new(Registry::default()), ready, Routes::ALL, access, None));
        let get = |path: &'static str, authorization: Option<String>| async move {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            let header = authorization.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
            let request = format!("GET {path} HTTP/1.1\r\nHost: hub\r\nConnection: close\r\n{header}\r\n");
            stream.write_all(request.as_bytes()).await.unwrap();
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

    /// What the hand-written responder got wrong: a query string made a route 404, every method was
    /// a GET, every connection closed after one answer, and `/metrics` was `OpenMetrics` whatever the
    /// scraper asked for.
    #[tokio::test]
    async fn routes_take_queries_other_methods_are_refused_connections_stay_open_and_accept_is_heeded() {
        use tokio::io::AsyncBufReadExt as _;
        let listener = crate::ops::http::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut registry = Registry::default();
        let requests = prometheus_client::metrics::counter::Counter::<u64>::default();
        requests.inc();
        registry.register("things", "Things done", requests);
        let health = Health::default();
        health.listed("CompositeController");
        health.listed("DecoratorController");
        health.listed("MapController");
        let ready = Readiness { health, leadership: None, coordination: None };
        let server = tokio::spawn(serve(listener, Arc::new(registry), ready, Routes::ALL, MetricsAccess::Anyone, None));

        // One connection, several requests: each answer is read by its Content-Length.
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (read, mut write) = stream.into_split();
        let mut read = tokio::io::BufReader::new(read);
        let mut ask = async |method: &str, path: &str, accept: &str| -> (u16, String, String) {
            let accept = if accept.is_empty() { String::new() } else { format!("Accept: {accept}\r\n") };
            let request = format!("{method} {path} HTTP/1.1\r\nHost: hub\r\n{accept}\r\n");
            write.write_all(request.as_bytes()).await.unwrap();
            let mut status = String::new();
            read.read_line(&mut status).await.unwrap();
            let (mut length, mut content_type) = (0, String::new());
            loop {
                let mut line = String::new();
                read.read_line(&mut line).await.unwrap();
                let line = line.trim_end();
                if line.is_empty() {
                    break;
                }
                let (name, value) = line.split_once(':').unwrap();
                match name.to_ascii_lowercase().as_str() {
                    "content-length" => length = value.trim().parse().unwrap(),
                    "content-type" => content_type = value.trim().to_owned(),
                    _ => {}
                }
            }
            let mut body = vec![0; if method == "HEAD" { 0 } else { length }];
            read.read_exact(&mut body).await.unwrap();
            (status.split_whitespace().nth(1).unwrap().parse().unwrap(), content_type, String::from_utf8(body).unwrap())
        };
        assert_eq!(ask("GET", "/readyz?verbose", "").await.0, 200);
        assert_eq!(ask("GET", "/healthz?x=1", "").await.0, 200);
        assert_eq!(ask("POST", "/healthz", "").await.0, 405);
        assert_eq!(ask("HEAD", "/healthz", "").await.0, 200);
        assert_eq!(ask("GET", "/nothing", "").await.0, 404);

        let (code, content_type, body) = ask("GET", "/metrics?name[]=x", "").await;
        assert_eq!((code, content_type.as_str()), (200, PROMETHEUS_TEXT), "{body}");
        assert!(body.contains("# TYPE things_total counter\nthings_total 1\n"), "{body}");
        assert!(!body.contains("# EOF") && !body.contains("_created"), "{body}");
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;\
                          q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        let (code, content_type, body) = ask("GET", "/metrics", prometheus).await;
        assert_eq!((code, content_type.as_str()), (200, OPENMETRICS));
        assert!(body.contains("# TYPE things counter\n") && body.ends_with("# EOF\n"), "{body}");
        let refused = "application/openmetrics-text; q=0, text/plain";
        assert_eq!(ask("GET", "/metrics", refused).await.1, PROMETHEUS_TEXT);
        server.abort();
    }

    /// A client that starts a request and never finishes its head is dropped after the head timeout.
    #[tokio::test]
    async fn a_client_that_never_finishes_its_request_is_dropped() {
        let listener = crate::ops::http::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let ready = Readiness { health: Health::default(), leadership: None, coordination: None };
        let router = router(Arc::new(Registry::default()), ready, Routes::ALL, MetricsAccess::Anyone);
        let timeout = std::time::Duration::from_millis(300);
        let server = tokio::spawn(crate::ops::http::serve(listener, router, timeout, None));
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: hub\r\n").await.unwrap();
        let started = std::time::Instant::now();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "the connection was closed");
        assert!(started.elapsed() >= timeout, "not before the head timeout");
        server.abort();
    }

    #[test]
    fn openmetrics_becomes_the_prometheus_text_format() {
        let openmetrics = "# HELP a Things.\n# TYPE a counter\na_total{x=\"1\"} 3 # {trace_id=\"t\"} 1.0\n\
                           a_created{x=\"1\"} 1.7e9\n# HELP up Up.\n# TYPE up gauge\nup 1\n# HELP b Build.\n\
                           # TYPE b info\nb_info{v=\"1\"} 1\n# HELP d_created A gauge so named.\n\
                           # TYPE d_created gauge\nd_created 2\n# HELP s Seconds.\n# TYPE s histogram\n# UNIT s seconds\n\
                           s_bucket{le=\"+Inf\"} 1\ns_sum 0.5\ns_count 1\ns_created 1.7e9\n# EOF\n";
        let text = "# HELP a_total Things.\n# TYPE a_total counter\na_total{x=\"1\"} 3\n\
                    # HELP up Up.\n# TYPE up gauge\nup 1\n# HELP b_info Build.\n# TYPE b_info gauge\nb_info{v=\"1\"} 1\n\
                    # HELP d_created A gauge so named.\n# TYPE d_created gauge\nd_created 2\n\
                    # HELP s Seconds.\n# TYPE s histogram\ns_bucket{le=\"+Inf\"} 1\ns_sum 0.5\ns_count 1\n";
        assert_eq!(prometheus_text(openmetrics), text);
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
        health.listed("MapController");
        assert_eq!(readiness(&health, None), (true, "ok\n".to_owned()));
    }
}
