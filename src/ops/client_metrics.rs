//! The API client's requests as client-go counts them: `rest_client_requests_total{code,method,host}`
//! and `rest_client_request_duration_seconds{verb,host}`, so the API-server panels every controller
//! dashboard has work for the hub too.
//!
//! Counted per attempt that went to the API server, below kube's retry: a request the server's priority
//! and fairness answered 429, retried after its `Retry-After` and then answered 200, counts once as 429
//! and once as 200, as client-go counts it. Above the retry the 429 would never be seen, and a hub
//! slowed by the API server would look idle. A request is counted when its answer starts (its status
//! line), so a watch counts once, when the server accepts it, however long it then streams.
//!
//! The families are the process's, not a hub's ([`process`]): the client is built from the kubeconfig
//! before any hub exists, and every client the process builds ([`crate::ops::client::connect`]: the
//! hub's, the leader elector's) reports into them, as client-go's process-wide registry does.

use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    /// The HTTP status, or `<error>` when no answer came (client-go's word for it).
    code: String,
    /// The HTTP method (`GET`, `POST`, …).
    method: String,
    /// The API server, `host:port`.
    host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    /// The HTTP method, as client-go's `verb` label has it.
    verb: String,
    host: String,
}

/// client-go's buckets for `rest_client_request_duration_seconds`, so that quantiles line up with other
/// controllers' on one dashboard.
const LATENCY_BUCKETS: [f64; 12] = [0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0];

/// The `rest_client_*` families. Cheap to clone (handles to the same series).
#[derive(Clone, Debug)]
pub struct ClientMetrics {
    requests: Family<RequestLabels, Counter>,
    latency: Family<LatencyLabels, Histogram, fn() -> Histogram>,
}

impl Default for ClientMetrics {
    fn default() -> Self {
        fn latency() -> Histogram {
            Histogram::new(LATENCY_BUCKETS)
        }
        Self { requests: Family::default(), latency: Family::new_with_constructor(latency) }
    }
}

/// The families of this process: every client [`crate::ops::client::connect`] builds counts here.
static PROCESS: LazyLock<ClientMetrics> = LazyLock::new(ClientMetrics::default);

/// The API client metrics of this process.
#[must_use]
pub fn process() -> &'static ClientMetrics {
    &PROCESS
}

impl ClientMetrics {
    /// Registers the families in `registry`. Help texts end without a period: `prometheus-client` adds one.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "rest_client_requests",
            "API requests by status code (`<error>` when no answer came), method and API server, each \
             attempt once (a 429 retried is counted as 429 and again as what the retry got)",
            self.requests.clone(),
        );
        registry.register(
            "rest_client_request_duration_seconds",
            "API request latency by method (verb) and API server, until the answer starts",
            self.latency.clone(),
        );
    }

    /// Records one attempt: its method, the API server, its status code (`None`: no answer) and how
    /// long the answer took to start.
    pub fn record(&self, method: &str, host: &str, code: Option<u16>, took: Duration) {
        let code = code.map_or_else(|| "<error>".to_owned(), |c| c.to_string());
        let (method, host) = (method.to_owned(), host.to_owned());
        self.latency
            .get_or_create(&LatencyLabels { verb: method.clone(), host: host.clone() })
            .observe(took.as_secs_f64());
        self.requests.get_or_create(&RequestLabels { code, method, host }).inc();
    }
}

/// Counts every request that passes into `metrics`, as sent to `host` (the cluster URL's `host:port`:
/// where it sits in the stack the request may still carry only its path).
#[derive(Clone, Debug)]
pub struct ClientMetricsLayer {
    metrics: ClientMetrics,
    host: Arc<str>,
}

impl ClientMetricsLayer {
    /// A layer counting into `metrics` the requests to the API server at `cluster_url`.
    #[must_use]
    pub fn new(metrics: ClientMetrics, cluster_url: &http::Uri) -> Self {
        let host = cluster_url.authority().map_or("", http::uri::Authority::as_str);
        Self { metrics, host: host.into() }
    }
}

impl<S> tower::Layer<S> for ClientMetricsLayer {
    type Service = Metered<S>;

    fn layer(&self, inner: S) -> Metered<S> {
        Metered { inner, metrics: self.metrics.clone(), host: Arc::clone(&self.host) }
    }
}

/// A service whose requests are counted (see [`ClientMetricsLayer`]).
#[derive(Clone, Debug)]
pub struct Metered<S> {
    inner: S,
    metrics: ClientMetrics,
    host: Arc<str>,
}

impl<S, B, RB> tower_service::Service<http::Request<B>> for Metered<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    RB: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.method().clone();
        let metrics = self.metrics.clone();
        let host = Arc::clone(&self.host);
        let started = std::time::Instant::now();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            let code = answer.as_ref().ok().map(|response| response.status().as_u16());
            metrics.record(method.as_str(), &host, code, started.elapsed());
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(metrics: &ClientMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[tokio::test]
    async fn each_attempt_is_counted_by_code_method_and_host_once_answered() {
        use tower::{Layer as _, ServiceExt as _};
        let metrics = ClientMetrics::default();
        let url: http::Uri = "https://10.0.0.1:6443".parse().unwrap();
        let layer = ClientMetricsLayer::new(metrics.clone(), &url);
        let answers = tower::service_fn(|request: http::Request<()>| async move {
            match request.uri().path() {
                "/busy" => Ok(http::Response::builder().status(429).body(()).unwrap()),
                "/broken" => Err("connection reset"),
                _ => Ok(http::Response::new(())),
            }
        });
        let service = layer.layer(answers);
        for (method, path) in [("GET", "/busy"), ("GET", "/ok"), ("POST", "/ok"), ("GET", "/broken")] {
            let request = http::Request::builder().method(method).uri(path).body(()).unwrap();
            let _ = service.clone().oneshot(request).await;
        }
        let text = render(&metrics);
        for line in [
            r#"rest_client_requests_total{code="429",method="GET",host="10.0.0.1:6443"} 1"#,
            r#"rest_client_requests_total{code="200",method="GET",host="10.0.0.1:6443"} 1"#,
            r#"rest_client_requests_total{code="200",method="POST",host="10.0.0.1:6443"} 1"#,
            r#"rest_client_requests_total{code="<error>",method="GET",host="10.0.0.1:6443"} 1"#,
            r#"rest_client_request_duration_seconds_count{verb="GET",host="10.0.0.1:6443"} 3"#,
            r#"rest_client_request_duration_seconds_bucket{le="60.0",verb="POST",host="10.0.0.1:6443"} 1"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}
