//! Leader election on a `coordination.k8s.io/v1` Lease, and the write gate that makes it safe: only the
//! holder runs controllers, and a hub that may have lost the Lease sends no write at all.
//!
//! # Why our own module
//! `kube-lease-manager` (0.13, the maintained crate that fits kube 5) was the first choice, but it
//! decides expiry by comparing the Lease's `renewTime` (the holder's wall clock) with the local wall
//! clock, so it needs synchronised clocks; and when a renewal *fails* it keeps reporting "leader" while
//! it retries with up to 30 s backoff, without telling the caller when the last renewal succeeded. A
//! leader cut off from the API server would keep writing after its Lease expired. Both are what the
//! timing argument below rests on, so this module follows client-go's `leaderelection` instead.
//!
//! # The timing argument
//! Times are each process's own monotonic clock; only clock *rates* are assumed to agree (as in
//! client-go), never wall clocks.
//! - A standby records the local instant `seen` at which it observed the Lease record (its
//!   resourceVersion) change. It may take over only when the record is still the same after
//!   `leaseDuration` (`now ≥ seen + leaseDuration`), and only with a compare-and-swap on that
//!   resourceVersion, so a renewal that lands meanwhile makes its update fail with a conflict.
//! - The leader notes the instant `sent` *before* sending each renewal. A renewal that succeeds was
//!   written after `sent`, so every standby that saw it has `seen ≥ sent`. The leader's writes are
//!   allowed only while `now < sent + renewDeadline` of its last successful renewal (the [`Gate`]).
//! - Hence a standby's first write comes at or after `sent + leaseDuration`, and the old leader's gate
//!   closed at `sent + renewDeadline`: `leaseDuration − renewDeadline` (5 s by default) earlier. That
//!   margin must cover a write already in flight when the gate closed, and clock-rate drift.
//! - The gate is checked on every mutating request of the hub's client (the [`gated`] client), not only
//!   by cancelling controllers: cancellation takes effect at the next await point, the gate at once.
//!   What no client-side scheme can fence (client-go neither) is a process paused for longer than the
//!   margin between its gate check and the request reaching the server.
//! - On loss (deadline passed, or the Lease found held by another) controllers are cancelled; on a
//!   graceful shutdown they are stopped first and the Lease is then released (holder cleared), so a
//!   standby — which watches the Lease — takes over at once instead of after `leaseDuration`.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::LeaderElection;

/// Errors of the election itself (the Lease could not be read or written).
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("lease {lease}: {source}")]
    Api { lease: String, source: Box<kube::Error> },
}

/// Whether this hub may write, and who leads. Shared by the elector, the gated client and `/readyz`.
#[derive(Clone, Debug)]
pub struct Leadership {
    inner: Arc<Mutex<LeaderState>>,
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
}

impl Leadership {
    #[must_use]
    pub fn new(identity: String, lease: String) -> Self {
        Self { inner: Arc::default(), identity, lease }
    }

    /// Whether a write sent now is safe: we hold the Lease and renewed it less than `renewDeadline` ago.
    #[must_use]
    pub fn may_write(&self) -> bool {
        self.state().writes_until.is_some_and(|until| Instant::now() < until)
    }

    /// The holder of the Lease as last seen (this process's identity while it leads).
    #[must_use]
    pub fn holder(&self) -> Option<String> {
        self.state().holder.clone()
    }

    fn open_until(&self, until: Instant) {
        let mut state = self.state();
        state.writes_until = Some(until);
        state.holder = Some(self.identity.clone());
    }

    fn close(&self, holder: Option<String>) {
        let mut state = self.state();
        state.writes_until = None;
        state.holder = holder;
    }

    fn deadline(&self) -> Option<Instant> {
        self.state().writes_until
    }

    fn state(&self) -> std::sync::MutexGuard<'_, LeaderState> {
        self.inner.lock().expect("leadership lock")
    }
}

/// The error a gated client returns instead of sending a write while not leading.
#[derive(Debug, thiserror::Error)]
#[error("not the leader of lease {lease} (or its renew deadline passed): write refused")]
pub struct NotLeader {
    pub lease: String,
}

/// A client that sends reads always and writes only while `leadership` allows them.
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

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let reads = matches!(*request.method(), http::Method::GET | http::Method::HEAD | http::Method::OPTIONS);
        if !reads && !self.leadership.may_write() {
            let refused = NotLeader { lease: self.leadership.lease.clone() };
            return Box::pin(async move { Err(refused.into()) });
        }
        let client = self.client.clone();
        Box::pin(async move { client.send(request).await.map_err(Into::into) })
    }
}

/// Why a term ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lost {
    /// No successful renewal within `renewDeadline`.
    RenewDeadline,
    /// Someone else holds the Lease.
    TakenBy(Option<String>),
}

/// Runs the election for one hub process.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    settings: LeaderElection,
    leadership: Leadership,
    /// The Lease record last seen (resourceVersion) and the local instant it was first seen.
    observed: Option<(String, Instant)>,
    /// The Lease as last read or written by us (for the next compare-and-swap).
    current: Option<Lease>,
    changed: Arc<Notify>,
    watch: tokio::task::JoinHandle<()>,
}

impl Drop for Elector {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

impl Elector {
    /// An elector for the Lease `settings.leaseName` in `namespace`. Starts watching the Lease, so a
    /// release is seen at once.
    #[must_use]
    pub fn new(client: Client, namespace: &str, settings: LeaderElection, identity: String) -> Self {
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let name = settings.lease_name.clone();
        let leadership = Leadership::new(identity, format!("{namespace}/{name}"));
        let changed = Arc::new(Notify::new());
        let watch = tokio::spawn(watch_lease(api.clone(), name.clone(), Arc::clone(&changed)));
        Self { api, name, settings, leadership, observed: None, current: None, changed, watch }
    }

    #[must_use]
    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }

    /// Waits until this hub holds the Lease (`true`), or `cancel` fires (`false`).
    pub async fn acquire(&mut self, cancel: &CancellationToken) -> bool {
        loop {
            match self.try_acquire().await {
                Ok(true) => {
                    info!(lease = %self.leadership.lease, identity = %self.leadership.identity, "became leader");
                    return true;
                }
                Ok(false) => {}
                Err(err) => warn!("leader election (retrying): {err}"),
            }
            let mut wake = Instant::now() + self.settings.retry_period;
            if let Some((_, seen)) = &self.observed {
                wake = wake.min(*seen + self.lease_duration());
            }
            tokio::select! {
                () = cancel.cancelled() => return false,
                () = tokio::time::sleep_until(wake) => {}
                () = self.changed.notified() => {}
            }
        }
    }

    /// Renews the Lease every `retryPeriod` until the term is lost; writes stop (the gate closes) at the
    /// renew deadline even while a renewal is still in flight.
    pub async fn hold(&mut self) -> Lost {
        loop {
            let Some(deadline) = self.leadership.deadline() else { return Lost::RenewDeadline };
            let next = Instant::now() + self.settings.retry_period;
            if tokio::time::timeout_at(deadline, tokio::time::sleep_until(next)).await.is_err() {
                return self.lose(Lost::RenewDeadline);
            }
            let sent = Instant::now();
            match tokio::time::timeout_at(deadline, self.renew()).await {
                Err(_) => return self.lose(Lost::RenewDeadline),
                Ok(Ok(())) => self.leadership.open_until(sent + self.settings.renew_deadline),
                Ok(Err(Renewal::TakenBy(holder))) => return self.lose(Lost::TakenBy(holder)),
                Ok(Err(Renewal::Failed(err))) => warn!("renewing leader lease (retrying until the deadline): {err}"),
            }
        }
    }

    /// Gives the Lease up (after the controllers stopped), so a standby takes over at once.
    pub async fn release(&mut self) {
        let holding = self.leadership.may_write();
        self.leadership.close(None);
        if !holding {
            return;
        }
        let Some(mut lease) = self.current.clone() else { return };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.leadership.identity.as_str()) {
            return;
        }
        // client-go's release: no holder, a 1 s duration, so anyone may acquire at once.
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => info!(lease = %self.leadership.lease, "released leader lease"),
            Err(err) => warn!(lease = %self.leadership.lease, "could not release leader lease: {err}"),
        }
    }

    fn lose(&mut self, why: Lost) -> Lost {
        let holder = match &why {
            Lost::TakenBy(holder) => holder.clone(),
            Lost::RenewDeadline => None,
        };
        self.leadership.close(holder);
        warn!(lease = %self.leadership.lease, reason = ?why, "lost leadership; every write stops");
        why
    }

    fn lease_duration(&self) -> Duration {
        self.settings.lease_duration
    }

    fn error(&self, source: kube::Error) -> LeaderError {
        LeaderError::Api { lease: self.leadership.lease.clone(), source: Box::new(source) }
    }

    /// Notes when the Lease record (resourceVersion) last changed, by our own clock.
    fn observe(&mut self, lease: &Lease) {
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        if self.observed.as_ref().is_none_or(|(seen, _)| *seen != version) {
            self.observed = Some((version, Instant::now()));
        }
        self.current = Some(lease.clone());
        let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone()).filter(|h| !h.is_empty());
        if holder.as_deref() != Some(self.leadership.identity.as_str()) {
            self.leadership.close(holder);
        }
    }

    /// One attempt: create the Lease, or take it over when it is free, ours, or expired.
    async fn try_acquire(&mut self) -> Result<bool, LeaderError> {
        let sent = Instant::now();
        let existing = self.api.get_opt(&self.name).await.map_err(|e| self.error(e))?;
        let Some(lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.name.clone()), ..ObjectMeta::default() },
                spec: Some(self.record(None)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => Ok(self.won(&created, sent)),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(self.error(e)),
            };
        };
        self.observe(&lease);
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.lease_duration(), Duration::from_secs);
        let expired = self.observed.as_ref().is_some_and(|(_, seen)| seen.elapsed() >= duration);
        let ours = holder.as_deref() == Some(self.leadership.identity.as_str());
        if holder.is_some() && !ours && !expired {
            debug!(holder = ?holder, "lease held by another hub");
            return Ok(false);
        }
        let mut taken = lease.clone();
        taken.spec = Some(self.record(Some(&spec)));
        let sent = if ours { sent } else { Instant::now() };
        match self.api.replace(&self.name, &PostParams::default(), &taken).await {
            Ok(written) => Ok(self.won(&written, sent)),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(self.error(e)),
        }
    }

    fn won(&mut self, lease: &Lease, sent: Instant) -> bool {
        self.observe(lease);
        self.leadership.open_until(sent + self.settings.renew_deadline);
        true
    }

    /// Our record: holder, duration and renew time; acquire time and transitions move on a change of holder.
    fn record(&self, previous: Option<&LeaseSpec>) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        let previous_holder = previous.and_then(|p| p.holder_identity.as_deref());
        let same_holder = previous_holder == Some(self.leadership.identity.as_str());
        let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.leadership.identity.clone()),
            lease_duration_seconds: Some(i32::try_from(self.lease_duration().as_secs()).unwrap_or(i32::MAX)),
            acquire_time: if same_holder { previous.and_then(|p| p.acquire_time.clone()) } else { Some(now.clone()) },
            renew_time: Some(now),
            lease_transitions: Some(if same_holder || previous.is_none() { transitions } else { transitions + 1 }),
            ..previous.cloned().unwrap_or_default()
        }
    }

    async fn renew(&mut self) -> Result<(), Renewal> {
        let current = match self.current.clone() {
            Some(lease) => lease,
            None => self.api.get(&self.name).await.map_err(|e| Renewal::Failed(self.error(e)))?,
        };
        let mut renewed = current.clone();
        renewed.spec = Some(self.record(current.spec.as_ref()));
        match self.api.replace(&self.name, &PostParams::default(), &renewed).await {
            Ok(written) => {
                self.observe(&written);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Someone wrote the Lease since we did: read who holds it now.
                let fresh = self.api.get(&self.name).await.map_err(|e| Renewal::Failed(self.error(e)))?;
                self.observe(&fresh);
                let holder = fresh.spec.and_then(|s| s.holder_identity).filter(|h| !h.is_empty());
                if holder.as_deref() == Some(self.leadership.identity.as_str()) {
                    Err(Renewal::Failed(LeaderError::Api {
                        lease: self.leadership.lease.clone(),
                        source: Box::new(kube::Error::Api(s)),
                    }))
                } else {
                    Err(Renewal::TakenBy(holder))
                }
            }
            Err(e) => Err(Renewal::Failed(self.error(e))),
        }
    }
}

enum Renewal {
    TakenBy(Option<String>),
    Failed(LeaderError),
}

/// Wakes the elector on every change of the Lease (a release is then taken over at once).
async fn watch_lease(api: Api<Lease>, name: String, changed: Arc<Notify>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(_) => changed.notify_one(),
            Err(err) => debug!("watching the leader lease (retrying): {err}"),
        }
    }
}

/// This process's identity: `POD_NAME` (or the host name) plus a random suffix, as client-go does, so
/// a restarted container never mistakes its predecessor's Lease for its own.
#[must_use]
pub fn identity() -> String {
    let base = std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_owned()))
        .unwrap_or_else(|| "metahook".to_owned());
    format!("{base}_{}", random_suffix())
}

fn random_suffix() -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    hasher.write_u32(std::process::id());
    format!("{:08x}", hasher.finish() & 0xffff_ffff)
}

/// The Lease's namespace: configured, else `POD_NAMESPACE`, else the client's default namespace.
#[must_use]
pub fn namespace(settings: &LeaderElection, client: &Client) -> String {
    if !settings.lease_namespace.is_empty() {
        return settings.lease_namespace.clone();
    }
    std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| client.default_namespace().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn writes_are_allowed_only_until_the_renew_deadline() {
        let leadership = Leadership::new("a_1".into(), "ns/metahook".into());
        assert!(!leadership.may_write(), "a standby never writes");
        leadership.open_until(Instant::now() + Duration::from_secs(10));
        assert!(leadership.may_write());
        assert_eq!(leadership.holder().as_deref(), Some("a_1"));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(!leadership.may_write(), "the gate closes at the deadline by itself");
        leadership.close(Some("b_2".into()));
        assert_eq!(leadership.holder().as_deref(), Some("b_2"));
    }

    #[test]
    fn identities_are_unique_per_process_start() {
        let (a, b) = (identity(), identity());
        assert_ne!(a, b);
        assert!(a.rsplit_once('_').is_some_and(|(_, suffix)| suffix.len() == 8), "{a}");
    }
}
