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

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use kube::Client;
use tokio::sync::{Mutex, Semaphore};
use tokio::time::Instant;

/// The user agent of every request the hub makes.
pub const USER_AGENT: &str = concat!("metahook/", env!("CARGO_PKG_VERSION"));

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
    let namespace = client.default_namespace().to_owned();
    let bucket = (limits.qps > 0.0).then(|| Arc::new(Mutex::new(Bucket::new(limits.qps, limits.burst.max(1)))));
    let service = Limited { client, in_flight: Arc::new(Semaphore::new(limits.in_flight.max(1))), bucket };
    Client::new(service, namespace)
}

#[derive(Clone)]
struct Limited {
    client: Client,
    in_flight: Arc<Semaphore>,
    bucket: Option<Arc<Mutex<Bucket>>>,
}

impl tower_service::Service<http::Request<kube::client::Body>> for Limited {
    type Response = http::Response<kube::client::Body>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<kube::client::Body>) -> Self::Future {
        request.headers_mut().insert(http::header::USER_AGENT, http::HeaderValue::from_static(USER_AGENT));
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
