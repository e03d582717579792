//! The hub's manners towards the API server: a user agent that names it, a bound on its requests in
//! flight, and an optional client-side rate limit (`apiQPS`, `apiBurst`).
//!
//! The API server protects itself with priority and fairness (APF), which classifies requests by user
//! and user agent; requests from `metahook/<version>` can be given a flow schema of their own. A
//! client-side limit on top of that is what starved Metacontroller's controllers on busy clusters
//! (QPS 5, burst 10, Metacontroller #686), so it is off by default and there for clusters without APF
//! or for sharing a cluster politely. What is always on is the in-flight bound: however many
//! controllers sync at once, the hub never has more than `maxRequestsInFlight` requests open (watches
//! count only until their response starts streaming).
//!
//! The client itself ([`connect`]) is kube's stack with three changes: its sockets set `TCP_NODELAY`,
//! each attempt of a leader's write — retries included — passes the leader's write gate
//! ([`crate::ops::gate::WriteGateLayer`]), and each attempt is counted in client-go's `rest_client_*`
//! metrics ([`crate::ops::client_metrics`]).

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::Client;
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder, ConfigExt as _};
use tokio::sync::{Mutex, Semaphore};
use tokio::time::Instant;
use tower::ServiceBuilder;
use tower::buffer::BufferLayer;
use tower::retry::RetryLayer;
use tower_http::trace::TraceLayer;

use crate::ops::client_metrics::ClientMetricsLayer;
use crate::ops::gate::WriteGateLayer;

/// The user agent of every request the hub makes.
pub const USER_AGENT: &str = concat!("metahook/", env!("CARGO_PKG_VERSION"));

/// A client for `config`, built as kube's `ClientBuilder` builds it (TLS, timeouts, retry of 429/503/504,
/// auth, extra headers, a debug span per request) except that its sockets set `TCP_NODELAY` and that
/// the leader's write gate and the request metrics sit at the bottom of the stack.
///
/// The metrics ([`ClientMetricsLayer`], into [`crate::ops::client_metrics::process`]) are below the gate
/// and the retry for the same reason as the gate: each attempt that goes out is counted, so a 429 that
/// kube retries shows as a 429 and a write the gate refused, which never reached the server, not at all.
///
/// The gate ([`WriteGateLayer`]) checks every attempt of a write that [`crate::ops::gate::gated`] marked,
/// just before it goes to the connection pool. It must be below the retry layer: kube retries a 429,
/// 503 or 504 after the server's `Retry-After` (up to 1000 s) inside this stack, and a retry that went
/// out unchecked could land long after the leader's renew deadline, beside the new leader's writes.
/// Below auth too, so that a slow credential refresh comes before the check, not between it and the
/// wire. Unmarked requests (reads, the elector's Lease writes, a hub without leader election) pass
/// through it untouched.
///
/// kube-client opens them with Nagle's algorithm on. On a resumed TLS session rustls writes the
/// handshake's `Finished` and the first request separately, so the request waits for the API server's
/// delayed ACK: 40 ms on every connection after the first. A hub starting a controller opens several
/// at once (the controller lists, discovery, the caches' lists, the first writes), and each waited
/// (strace of a start: of two lists sent at once, the one on the new connection answered after 45 ms, the
/// other after 4 ms; 10 ms with this connector).
/// The hook client sets the same option for the same reason (`hooks::dial`).
///
/// One thing of kube's builder is left out: the expiry of a client certificate from an exec plugin
/// (`Client::valid_until`), which the hub never reads. With a proxy configured this is kube's own
/// builder (proxies are its business) with its retry moved above the gate (and a buffer, as kube's
/// retry needs a service it can clone).
pub fn connect(mut config: kube::Config) -> Result<Client, kube::Error> {
    let metered = ClientMetricsLayer::new(crate::ops::client_metrics::process().clone(), &config.cluster_url);
    if config.proxy_url.is_some() {
        let retry = std::mem::replace(&mut config.default_retry, false);
        return Ok(ClientBuilder::try_from(config)?
            .with_layer(&metered)
            .with_layer(&WriteGateLayer)
            .with_layer(&BufferLayer::new(1024))
            .with_layer(&tower::util::option_layer(retry.then(|| RetryLayer::new(RetryPolicy::server_retry()))))
            .build());
    }
    let https = config.rustls_https_connector_with_connector(api_connector())?;
    let mut timed = hyper_timeout::TimeoutConnector::new(https);
    timed.set_connect_timeout(config.connect_timeout);
    timed.set_read_timeout(config.read_timeout);
    timed.set_write_timeout(config.write_timeout);
    timed.set_reset_reader_on_write(config.reset_reader_on_write);
    let http: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Builder::new(TokioExecutor::new()).build(timed);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| RetryLayer::new(RetryPolicy::server_retry())))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|request: &http::Request<Body>| {
                    tracing::debug_span!("HTTP", http.method = %request.method(), http.url = %request.uri(),
                        http.status_code = tracing::field::Empty)
                })
                .on_request(|_: &http::Request<Body>, _: &tracing::Span| tracing::debug!("requesting"))
                .on_response(|response: &http::Response<_>, _: Duration, span: &tracing::Span| {
                    span.record("http.status_code", response.status().as_u16());
                })
                .on_eos(|_: Option<&http::HeaderMap>, _: Duration, _: &tracing::Span| tracing::debug!("stream closed")),
        )
        .layer(WriteGateLayer)
        .layer(metered)
        .map_err(tower::BoxError::from)
        .service(http);
    Ok(Client::new(service, config.default_namespace))
}

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("reading kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        path: std::path::PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("inferring Kubernetes config: {0}")]
    Infer(#[source] kube::config::InferConfigError),
    #[error("building Kubernetes client: {0}")]
    Client(#[source] kube::Error),
}

/// A client ([`connect`]) from an explicit kubeconfig path, or from the inferred config (environment,
/// home directory, in-cluster).
pub async fn client_for(kubeconfig: Option<&std::path::Path>) -> Result<Client, ConnectError> {
    let config = match kubeconfig {
        Some(path) => {
            let failed = |source| ConnectError::Kubeconfig { path: path.to_owned(), source };
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(failed)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(failed)?
        }
        None => kube::Config::infer().await.map_err(ConnectError::Infer)?,
    };
    connect(config).map_err(ConnectError::Client)
}

/// The TCP connector under the API client's TLS: Nagle off (see [`connect`]); `https` URLs pass
/// through to the TLS layer.
fn api_connector() -> HttpConnector {
    let mut tcp = HttpConnector::new();
    tcp.set_nodelay(true);
    tcp.enforce_http(false);
    tcp
}

/// How the hub's client behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Requests per second on average; 0 = no client-side rate limit.
    pub qps: f64,
    /// Requests that may go at once above the average (at least 1 when `qps` is set).
    pub burst: u32,
    /// Requests open at once.
    pub in_flight: usize,
}

/// `client` with the hub's user agent, in-flight bound and rate limit.
#[must_use]
pub fn limited(client: Client, limits: Limits) -> Client {
    limited_as(client, limits, USER_AGENT)
}

/// [`limited`] under another user agent: a tool that reads the cluster (`metahook diff`) names itself,
/// so the API server's audit log and priority and fairness tell its requests from the hub's.
#[must_use]
pub fn limited_as(client: Client, limits: Limits, user_agent: &'static str) -> Client {
    let namespace = client.default_namespace().to_owned();
    let bucket = (limits.qps > 0.0).then(|| Arc::new(Mutex::new(Bucket::new(limits.qps, limits.burst.max(1)))));
    let in_flight = Arc::new(Semaphore::new(limits.in_flight.max(1)));
    let user_agent = http::HeaderValue::from_static(user_agent);
    Client::new(Limited { client, in_flight, bucket, user_agent }, namespace)
}

#[derive(Clone)]
struct Limited {
    client: Client,
    in_flight: Arc<Semaphore>,
    bucket: Option<Arc<Mutex<Bucket>>>,
    user_agent: http::HeaderValue,
}

impl tower_service::Service<http::Request<kube::client::Body>> for Limited {
    type Response = http::Response<kube::client::Body>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<kube::client::Body>) -> Self::Future {
        request.headers_mut().insert(http::header::USER_AGENT, self.user_agent.clone());
        let (client, in_flight, bucket) = (self.client.clone(), Arc::clone(&self.in_flight), self.bucket.clone());
        Box::pin(async move {
            if let Some(bucket) = bucket {
                let wait = bucket.lock().await.take(Instant::now());
                tokio::time::sleep(wait).await;
            }
            // Held until the response starts: a watch's stream does not keep a slot.
            let _permit = in_flight.acquire_owned().await?;
            client.send(request).await.map_err(Into::into)
        })
    }
}

/// A token bucket: `burst` tokens, refilled at `qps` per second.
#[derive(Debug)]
struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst);
        Self { qps, burst, tokens: burst, at: Instant::now() }
    }

    /// Takes a token; returns how long to wait before the request may go (zero when one was there).
    /// A request that must wait takes its token ahead of time, so waiters go out in order.
    fn take(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.at = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-self.tokens / self.qps) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn api_connections_are_opened_without_nagles_delay() {
        use tower_service::Service as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: http::Uri = format!("http://{}", listener.local_addr().unwrap()).parse().unwrap();
        let connection = api_connector().call(uri.clone()).await.unwrap();
        assert!(connection.inner().nodelay().unwrap(), "TCP_NODELAY not set on the API server connection");
        // A bare connector leaves it off: the check tells the two apart.
        let bare = HttpConnector::new().call(uri).await.unwrap();
        assert!(!bare.inner().nodelay().unwrap());
    }

    /// A stand-in API server on loopback: answers the first request 503 with `Retry-After: 1` and every
    /// later one 200 `{}`. Returns its URL and the number of requests it received.
    async fn serve_unavailable_once() -> (http::Uri, Arc<std::sync::atomic::AtomicUsize>) {
        serve_refusing_once("503 Service Unavailable").await
    }

    /// [`serve_unavailable_once`], answering the first request with `status` (and `Retry-After: 1`).
    async fn serve_refusing_once(status: &'static str) -> (http::Uri, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap()).parse().unwrap();
        let received = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&received);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let mut stream = tokio::io::BufReader::new(stream);
                    // One request per connection (`Connection: close`): the head, then its body.
                    let mut length = 0;
                    loop {
                        let mut line = String::new();
                        if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        if let Some((name, value)) = line.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap();
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; length];
                    stream.read_exact(&mut body).await.unwrap();
                    let answer = if counter.fetch_add(1, Ordering::SeqCst) == 0 {
                        format!("HTTP/1.1 {status}\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    } else {
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
                            .to_owned()
                    };
                    let _ = stream.write_all(answer.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        (uri, received)
    }

    fn create_config_map() -> http::Request<Body> {
        http::Request::post("/api/v1/namespaces/default/configmaps")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(br#"{"apiVersion":"v1","kind":"ConfigMap"}"#.to_vec()))
            .unwrap()
    }

    /// The stack `connect` builds checks the gate below its retry: a write whose retry comes due after
    /// the renew deadline is refused then, and the API server sees only the first attempt. Real time
    /// (a real socket and kube's real retry, `Retry-After: 1`), so about a second.
    #[tokio::test]
    async fn connect_checks_each_retry_of_a_gated_write_against_the_gate() {
        use std::sync::atomic::Ordering;
        let (uri, received) = serve_unavailable_once().await;
        let leadership = crate::ops::gate::Leadership::new("a_1".into(), "ns/metahook".into());
        let client = crate::ops::gate::gated(connect(kube::Config::new(uri)).unwrap(), leadership.clone());
        // Half a second for the first attempt on loopback, well before the retry comes due.
        let started = Instant::now();
        leadership.open_until(started + Duration::from_millis(500));
        let err = client.send(create_config_map()).await.expect_err("the retry falls after the deadline");
        assert!(err.to_string().contains("write refused"), "{err:?}");
        assert_eq!(received.load(Ordering::SeqCst), 1, "the retry was not sent");
        assert!(started.elapsed() >= Duration::from_secs(1), "refused when the retry came due, after Retry-After");
        assert!(!leadership.may_write());
    }

    /// The same with the gate open throughout: the retry is sent and answered, so the refusal above is
    /// the gate's doing and `connect` still retries as kube does.
    #[tokio::test]
    async fn connect_retries_a_gated_write_while_the_gate_is_open() {
        use std::sync::atomic::Ordering;
        let (uri, received) = serve_unavailable_once().await;
        let leadership = crate::ops::gate::Leadership::new("a_1".into(), "ns/metahook".into());
        let client = crate::ops::gate::gated(connect(kube::Config::new(uri)).unwrap(), leadership.clone());
        leadership.open_until(Instant::now() + Duration::from_secs(30));
        let response = client.send(create_config_map()).await.expect("retried after the 503");
        assert_eq!(response.status(), http::StatusCode::OK);
        assert_eq!(received.load(Ordering::SeqCst), 2);
    }

    /// The API server's priority and fairness answers 429 when it sheds load; kube retries after
    /// `Retry-After`, and both attempts are in `rest_client_requests_total`, so the 429 is visible even
    /// though the request succeeded. About a second (a real retry).
    #[tokio::test]
    async fn connect_counts_a_429_it_retried_and_the_answer_after_it() {
        let (uri, _) = serve_refusing_once("429 Too Many Requests").await;
        let host = uri.authority().unwrap().to_string();
        let client = connect(kube::Config::new(uri)).unwrap();
        let response = client.send(create_config_map()).await.expect("retried after the 429");
        assert_eq!(response.status(), http::StatusCode::OK);
        let mut registry = prometheus_client::registry::Registry::default();
        crate::ops::client_metrics::process().register(&mut registry);
        let text = crate::ops::metrics::render(&registry);
        for code in ["429", "200"] {
            let line = format!("rest_client_requests_total{{code=\"{code}\",method=\"POST\",host=\"{host}\"}} 1");
            assert!(text.contains(&line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn a_bucket_lets_a_burst_through_then_spaces_requests_at_the_rate() {
        let start = Instant::now();
        let mut bucket = Bucket::new(10.0, 3);
        let waits: Vec<Duration> = (0..5).map(|_| bucket.take(start)).collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3]);
        assert_eq!(waits[3], Duration::from_millis(100));
        assert_eq!(waits[4], Duration::from_millis(200));
        // A second later the bucket has refilled (up to its burst).
        let later = start + Duration::from_secs(2);
        assert_eq!(bucket.take(later), Duration::ZERO);
    }
}
