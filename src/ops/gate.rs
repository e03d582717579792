//! The write gate: a hub that may have lost its Lease sends no write at all, not even the retry of one it
//! sent while leading. [`Leadership`] is the one owner of the gate (writes allowed until the renew
//! deadline of the last successful renewal, see [`crate::ops::leader`] for the timing argument) and of
//! the count of writes on the wire; [`gated`] marks a client's writes, and [`WriteGateLayer`], at the
//! bottom of the stack [`crate::ops::client::connect`] builds, admits or refuses each attempt.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use kube::Client;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument as _;

/// Whether this hub may write, who leads, and which writes are on the wire. Shared by the elector, the
/// gated client and `/readyz`.
#[derive(Clone, Debug)]
pub struct Leadership {
    /// One owner for the gate and the writes it let through: admitting a write and closing the gate
    /// are each one step on this state, so a release that closed the gate and then counts no write in
    /// flight cannot miss one admitted meanwhile. A `watch` so that a release can wait for the count to
    /// fall to zero.
    state: Arc<watch::Sender<LeaderState>>,
    /// This process's identity in the Lease.
    pub identity: String,
    /// `namespace/name` of the Lease.
    pub lease: String,
}

#[derive(Debug, Default)]
struct LeaderState {
    /// Writes are allowed before this instant (the renew deadline of the last successful renewal).
    writes_until: Option<Instant>,
    /// Holder of the Lease as last seen.
    holder: Option<String>,
    /// Write attempts the gate let through whose response has not come back yet.
    writes_in_flight: usize,
}

impl LeaderState {
    fn may_write(&self, now: Instant) -> bool {
        self.writes_until.is_some_and(|until| now < until)
    }
}

impl Leadership {
    #[must_use]
    pub fn new(identity: String, lease: String) -> Self {
        Self { state: Arc::new(watch::Sender::new(LeaderState::default())), identity, lease }
    }

    /// Whether a write sent now is safe: we hold the Lease and renewed it less than `renewDeadline` ago.
    #[must_use]
    pub fn may_write(&self) -> bool {
        self.state.borrow().may_write(Instant::now())
    }

    /// The holder of the Lease as last seen (this process's identity while it leads).
    #[must_use]
    pub fn holder(&self) -> Option<String> {
        self.state.borrow().holder.clone()
    }

    /// Lets one write attempt through the gate if a write sent now is safe, and counts it as in flight
    /// until the returned token is dropped (when its response has come back).
    ///
    /// # Errors
    /// [`NotLeader`] when the gate is closed: not leading, or the renew deadline passed.
    pub fn admit_write(&self) -> Result<WriteInFlight, NotLeader> {
        let mut admitted = false;
        // A rising count wakes nobody: only a release waits, and only for the count to reach zero.
        self.state.send_if_modified(|state| {
            admitted = state.may_write(Instant::now());
            state.writes_in_flight += usize::from(admitted);
            false
        });
        if admitted {
            Ok(WriteInFlight { state: Arc::clone(&self.state) })
        } else {
            Err(NotLeader { lease: self.lease.clone() })
        }
    }

    /// Write attempts the gate let through whose response has not come back yet.
    #[must_use]
    pub fn writes_in_flight(&self) -> usize {
        self.state.borrow().writes_in_flight
    }

    /// Waits until no admitted write is in flight, but not past `until`; whether none is.
    pub async fn writes_landed_by(&self, until: Instant) -> bool {
        let mut state = self.state.subscribe();
        let landed = state.wait_for(|state| state.writes_in_flight == 0);
        tokio::time::timeout_at(until, landed).await.is_ok_and(|waited| waited.is_ok())
    }

    /// Opens the gate until `until` (the elector, after a successful renewal; tests of the client stack).
    pub(crate) fn open_until(&self, until: Instant) {
        self.state.send_modify(|state| {
            state.writes_until = Some(until);
            state.holder = Some(self.identity.clone());
        });
    }

    pub(crate) fn close(&self, holder: Option<String>) {
        self.state.send_modify(|state| {
            state.writes_until = None;
            state.holder = holder;
        });
    }

    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.state.borrow().writes_until
    }
}

/// A write attempt the gate let through; it counts as in flight until this is dropped.
#[derive(Debug)]
#[must_use = "the write counts as in flight only while this is held"]
pub struct WriteInFlight {
    state: Arc<watch::Sender<LeaderState>>,
}

impl Drop for WriteInFlight {
    fn drop(&mut self) {
        self.state.send_if_modified(|state| {
            state.writes_in_flight -= 1;
            state.writes_in_flight == 0
        });
    }
}

/// The error a gated client returns instead of sending a write while not leading.
#[derive(Debug, thiserror::Error)]
#[error("not the leader of lease {lease} (or its renew deadline passed): write refused")]
pub struct NotLeader {
    pub lease: String,
}

/// A client that sends reads always and writes only while `leadership` allows them.
///
/// Each write is refused here at once if the gate is closed, and otherwise marked ([`GatedBy`]) so that
/// every attempt of it — the first and each retry — is admitted again by the [`WriteGateLayer`] at the
/// bottom of `client`'s stack and counted as in flight. `client` must therefore come from
/// [`crate::ops::client::connect`], which places that layer below its retry; another client (a test's
/// `Client::try_from`) gets the check here only, on the first attempt.
#[must_use]
pub fn gated(client: Client, leadership: Leadership) -> Client {
    let namespace = client.default_namespace().to_owned();
    Client::new(Gated { client, leadership }, namespace)
}

#[derive(Clone)]
struct Gated {
    client: Client,
    leadership: Leadership,
}

impl tower_service::Service<http::Request<kube::client::Body>> for Gated {
    type Response = http::Response<kube::client::Body>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<kube::client::Body>) -> Self::Future {
        let reads = matches!(*request.method(), http::Method::GET | http::Method::HEAD | http::Method::OPTIONS);
        if !reads {
            if !self.leadership.may_write() {
                let refused = NotLeader { lease: self.leadership.lease.clone() };
                return Box::pin(async move { Err(refused.into()) });
            }
            request.extensions_mut().insert(GatedBy(self.leadership.clone()));
        }
        let client = self.client.clone();
        Box::pin(async move { client.send(request).await.map_err(Into::into) })
    }
}

/// Marks a request (an `http` extension) as a write that may go to the API server only while this
/// leadership allows writes. kube's retry policy copies extensions to each retry, so every attempt
/// carries it down to the [`WriteGateLayer`].
#[derive(Clone, Debug)]
pub struct GatedBy(pub Leadership);

/// Checks every attempt of a write marked [`GatedBy`] against the gate, just before it goes to the
/// connection pool; unmarked requests (reads, and the elector's own Lease writes) pass untouched.
///
/// It must sit *below* any retry layer: a retry re-enters the stack under the retry layer, so only a
/// check down here sees it (see the module doc). An admitted attempt runs to its response in a task of
/// its own: a caller that gives up (a controller stopped mid-write) does not recall bytes already on
/// the wire, so the attempt stays counted as in flight — and a graceful release keeps waiting for it —
/// until the API server has answered.
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteGateLayer;

impl<S> tower::Layer<S> for WriteGateLayer {
    type Service = WriteGate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WriteGate { inner }
    }
}

/// The service of [`WriteGateLayer`].
#[derive(Clone, Debug)]
pub struct WriteGate<S> {
    inner: S,
}

impl<S, B> tower_service::Service<http::Request<B>> for WriteGate<S>
where
    S: tower_service::Service<http::Request<B>>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<tower::BoxError> + Send + 'static,
{
    type Response = S::Response;
    type Error = tower::BoxError;
    type Future = BoxFuture<'static, Result<S::Response, tower::BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let Some(GatedBy(leadership)) = request.extensions().get::<GatedBy>() else {
            let attempt = self.inner.call(request);
            return Box::pin(async move { attempt.await.map_err(Into::into) });
        };
        let admitted = match leadership.admit_write() {
            Ok(admitted) => admitted,
            Err(refused) => return Box::pin(async move { Err(refused.into()) }),
        };
        let attempt = self.inner.call(request);
        let attempt = tokio::spawn(
            async move {
                let response = attempt.await;
                drop(admitted);
                response
            }
            .in_current_span(),
        );
        Box::pin(async move { attempt.await?.map_err(Into::into) })
    }
}
