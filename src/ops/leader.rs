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
//!   allowed only while `now < sent + renewDeadline` of its last successful renewal (the write gate, [`crate::ops::gate`]).
//! - Hence a standby's first write comes at or after `sent + leaseDuration`, and the old leader's gate
//!   closed at `sent + renewDeadline`: `leaseDuration − renewDeadline` (5 s by default) earlier. That
//!   margin must cover a write already in flight when the gate closed, and clock-rate drift.
//! - The gate is checked on every mutating request of the hub's client (the [`crate::ops::gate::gated`] client), not only
//!   by cancelling controllers: cancellation takes effect at the next await point, the gate at once.
//!   What no client-side scheme can fence (client-go neither) is a process paused for longer than the
//!   margin between its gate check and the request reaching the server.
//! - The gate is checked on every *attempt*, not once per request. kube's client retries a 429, 503 or
//!   504 inside its own stack, after the server's `Retry-After` (up to 1000 s, 15 times): a check above
//!   that stack would let a retry go out long after the deadline. So `gated` only marks a write
//!   (`GatedBy`) and `WriteGateLayer`, at the bottom of the stack `client::connect` builds (below the
//!   retry and the auth layer, just above the connection pool), admits or refuses each attempt.
//! - On loss (deadline passed, or the Lease found held by another) controllers are cancelled; on a
//!   graceful shutdown they are stopped first, the gate is closed, the writes still on the wire are
//!   waited for, and only then is the Lease released (holder cleared), so a standby — which watches the
//!   Lease — takes over at once instead of after `leaseDuration`, and never while the old leader's
//!   write is still on its way. Stopping a controller drops its futures, but a dropped write may
//!   already be on the wire: an admitted attempt therefore runs to its response in a task of its own,
//!   and counts as in flight until then ([`crate::ops::gate::Leadership`] owns that count beside the gate).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::ops::config::LeaderElection;
use crate::ops::gate::Leadership;

/// Errors of the election itself (the Lease could not be read or written).
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("lease {lease}: {source}")]
    Api { lease: String, source: Box<kube::Error> },
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
    /// Labels the Lease is created with (a sharding member's Lease names its ring, so members can be listed).
    labels: std::collections::BTreeMap<String, String>,
    /// Annotations the holder publishes with its writes of the Lease (a sharding member's claims).
    notes: Option<LeaseNotes>,
}

/// Annotations a holder publishes on its Lease, written with its next write of it — at once when they
/// change — and which of them have been written. A sharding member's claims on buckets go here: in
/// the record its liveness is judged by, so a claim is never seen without the member being live, and
/// no second writer races the elector's compare-and-swap.
#[derive(Clone, Debug)]
pub struct LeaseNotes {
    /// The annotations to write, and their generation.
    desired: watch::Sender<(u64, std::collections::BTreeMap<String, String>)>,
    /// The generation of the annotations last written.
    written: watch::Sender<u64>,
}

impl Default for LeaseNotes {
    fn default() -> Self {
        Self { desired: watch::channel((0, std::collections::BTreeMap::new())).0, written: watch::channel(0).0 }
    }
}

impl LeaseNotes {
    /// Sets the annotations to publish (written with the next write of the Lease, without waiting).
    pub fn set(&self, notes: std::collections::BTreeMap<String, String>) {
        self.next(notes);
    }

    /// Sets the annotations; returns their generation.
    fn next(&self, notes: std::collections::BTreeMap<String, String>) -> u64 {
        let mut generation = 0;
        self.desired.send_modify(|(g, current)| {
            *g += 1;
            generation = *g;
            *current = notes;
        });
        generation
    }

    /// Sets the annotations and waits until a write of the Lease carrying them (or later ones) succeeded;
    /// `false` if none did within `timeout`.
    pub async fn publish(&self, notes: std::collections::BTreeMap<String, String>, timeout: Duration) -> bool {
        let mut written = self.written.subscribe();
        let generation = self.next(notes);
        tokio::time::timeout(timeout, written.wait_for(|w| *w >= generation)).await.is_ok_and(|r| r.is_ok())
    }

    /// The annotations to write now and their generation.
    fn current(&self) -> (u64, std::collections::BTreeMap<String, String>) {
        self.desired.borrow().clone()
    }

    fn wrote(&self, generation: u64) {
        self.written.send_if_modified(|w| {
            let newer = generation > *w;
            if newer {
                *w = generation;
            }
            newer
        });
    }
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
        Self {
            api,
            name,
            settings,
            leadership,
            observed: None,
            current: None,
            changed,
            watch,
            labels: std::collections::BTreeMap::new(),
            notes: None,
        }
    }

    /// This elector, creating its Lease with `labels`.
    #[must_use]
    pub fn labelled(mut self, labels: std::collections::BTreeMap<String, String>) -> Self {
        self.labels = labels;
        self
    }

    /// This elector, writing `notes`' annotations with every write of its Lease.
    #[must_use]
    pub fn noted(mut self, notes: LeaseNotes) -> Self {
        self.notes = Some(notes);
        self
    }

    /// Puts the notes' annotations on `lease`; returns their generation (0 without notes).
    fn annotate(&self, lease: &mut Lease) -> u64 {
        let Some(notes) = &self.notes else { return 0 };
        let (generation, annotations) = notes.current();
        let current = lease.metadata.annotations.get_or_insert_with(Default::default);
        for (key, value) in annotations {
            current.insert(key, value);
        }
        generation
    }

    /// Records that the notes of `generation` were written.
    fn noted_written(&self, generation: u64) {
        if let Some(notes) = &self.notes {
            notes.wrote(generation);
        }
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
        let mut note_changes = self.notes.as_ref().map(|n| n.desired.subscribe());
        loop {
            let Some(deadline) = self.leadership.deadline() else { return Lost::RenewDeadline };
            let next = Instant::now() + self.settings.retry_period;
            // New notes are written at once (a member waits on its claims), other renewals on schedule.
            let noted = async {
                let Some(changes) = note_changes.as_mut() else { return std::future::pending().await };
                if changes.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            let wait = async {
                tokio::select! {
                    () = tokio::time::sleep_until(next) => {}
                    () = noted => {}
                }
            };
            if tokio::time::timeout_at(deadline, wait).await.is_err() {
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

    /// Gives the Lease up (after the controllers stopped), so a standby takes over at once — but only
    /// once no write of ours is on the wire: the gate closes first, then the writes it let through are
    /// waited for.
    ///
    /// The wait lasts at most until the gate would have closed by itself (the renew deadline). A write
    /// still in flight then is in the case the timing argument covers anyway (as after a crash): the
    /// Lease is left to expire, and the standby takes over `leaseDuration − renewDeadline` after that.
    /// Releasing it instead would let the standby write at once, beside our write.
    pub async fn release(&mut self) {
        let deadline = self.leadership.deadline();
        let holding = self.leadership.may_write();
        self.leadership.close(None);
        let Some(deadline) = deadline.filter(|_| holding) else { return };
        if !self.leadership.writes_landed_by(deadline).await {
            let lease = &self.leadership.lease;
            warn!(%lease, "writes still in flight at the renew deadline: leaving the lease to expire, not releasing it");
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
            let mut lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    labels: Some(self.labels.clone()).filter(|l| !l.is_empty()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.record(None)),
            };
            let generation = self.annotate(&mut lease);
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.noted_written(generation);
                    Ok(self.won(&created, sent))
                }
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
        let generation = self.annotate(&mut taken);
        let sent = if ours { sent } else { Instant::now() };
        match self.api.replace(&self.name, &PostParams::default(), &taken).await {
            Ok(written) => {
                self.noted_written(generation);
                Ok(self.won(&written, sent))
            }
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
        let generation = self.annotate(&mut renewed);
        match self.api.replace(&self.name, &PostParams::default(), &renewed).await {
            Ok(written) => {
                self.observe(&written);
                self.noted_written(generation);
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
    use crate::ops::gate::{GatedBy, NotLeader, WriteGateLayer, gated};

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

    /// A stand-in for the API server below the client stack: records each request (method and path)
    /// and answers from `script` in turn, then with a 200 echoing the request body.
    #[derive(Clone, Default)]
    struct FakeApi {
        requests: Arc<std::sync::Mutex<Vec<(http::Method, String, bytes::Bytes)>>>,
        script: Arc<std::sync::Mutex<std::collections::VecDeque<http::Response<kube::client::Body>>>>,
    }

    impl FakeApi {
        fn answering(script: Vec<http::Response<kube::client::Body>>) -> Self {
            let fake = Self::default();
            fake.script.lock().unwrap().extend(script);
            fake
        }

        fn requests(&self, method: &http::Method) -> Vec<(String, bytes::Bytes)> {
            let requests = self.requests.lock().unwrap();
            requests
                .iter()
                .filter(|(m, _, _)| m == method)
                .map(|(_, path, body)| (path.clone(), body.clone()))
                .collect()
        }

        /// The stack `client::connect` builds, as far as the gate is concerned: kube's retry above the
        /// gate, the API server below.
        fn client(&self) -> Client {
            let fake = self.clone();
            let api = tower::service_fn(move |request: http::Request<kube::client::Body>| {
                let fake = fake.clone();
                async move {
                    use http_body_util::BodyExt as _;
                    let (parts, body) = request.into_parts();
                    let body = body.collect().await?.to_bytes();
                    fake.requests.lock().unwrap().push((parts.method, parts.uri.path().to_owned(), body.clone()));
                    let scripted = fake.script.lock().unwrap().pop_front();
                    Ok::<_, tower::BoxError>(scripted.unwrap_or_else(|| http::Response::new(body.into())))
                }
            });
            let stack = tower::ServiceBuilder::new()
                .layer(tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()))
                .layer(WriteGateLayer)
                .service(api);
            Client::new(stack, "default")
        }
    }

    fn unavailable_retry_after(seconds: u64) -> http::Response<kube::client::Body> {
        http::Response::builder()
            .status(http::StatusCode::SERVICE_UNAVAILABLE)
            .header(http::header::RETRY_AFTER, seconds.to_string())
            .body(kube::client::Body::empty())
            .unwrap()
    }

    fn request(method: http::Method) -> http::Request<kube::client::Body> {
        http::Request::builder()
            .method(method)
            .uri("/api/v1/namespaces/default/configmaps")
            .body(kube::client::Body::from(br#"{"kind":"ConfigMap"}"#.to_vec()))
            .unwrap()
    }

    fn is_not_leader(err: &kube::Error) -> bool {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
        while let Some(err) = cause {
            if err.is::<NotLeader>() {
                return true;
            }
            cause = err.source();
        }
        false
    }

    fn in_flight(leadership: &Leadership) -> usize {
        leadership.writes_in_flight()
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_the_renew_deadline_is_refused_and_never_sent() {
        let api = FakeApi::answering(vec![unavailable_retry_after(2)]);
        let leadership = Leadership::new("a_1".into(), "ns/metahook".into());
        leadership.open_until(Instant::now() + Duration::from_secs(1));
        let client = gated(api.client(), leadership.clone());
        let started = Instant::now();
        let err = client.send(request(http::Method::POST)).await.expect_err("the retry is refused");
        assert!(is_not_leader(&err), "{err:?}");
        assert_eq!(api.requests(&http::Method::POST).len(), 1, "only the attempt made while leading was sent");
        assert_eq!(started.elapsed(), Duration::from_secs(2), "refused when the retry came due (Retry-After)");
        assert_eq!(in_flight(&leadership), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_within_the_renew_deadline_is_sent() {
        // The same retry with the gate open throughout: the refusal above is the gate's, not the stack's.
        let api = FakeApi::answering(vec![unavailable_retry_after(2)]);
        let leadership = Leadership::new("a_1".into(), "ns/metahook".into());
        leadership.open_until(Instant::now() + Duration::from_secs(10));
        let client = gated(api.client(), leadership.clone());
        let response = client.send(request(http::Method::POST)).await.expect("retried and answered");
        assert_eq!(response.status(), http::StatusCode::OK);
        assert_eq!(api.requests(&http::Method::POST).len(), 2, "the 503 was retried");
        assert_eq!(in_flight(&leadership), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn reads_pass_a_closed_gate_and_writes_do_not() {
        let api = FakeApi::default();
        let leadership = Leadership::new("a_1".into(), "ns/metahook".into());
        let client = gated(api.client(), leadership);
        client.send(request(http::Method::GET)).await.expect("a standby reads");
        let err = client.send(request(http::Method::PATCH)).await.expect_err("a standby does not write");
        assert!(is_not_leader(&err), "{err:?}");
        assert_eq!(api.requests(&http::Method::GET).len(), 1);
        assert!(api.requests(&http::Method::PATCH).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_gate_layer_checks_marked_requests_even_when_the_mark_came_from_elsewhere() {
        // The bottom layer refuses on its own, whatever the layers above checked: a write marked while
        // the gate was open and sent after it closed (the retry's case) does not go out.
        let api = FakeApi::default();
        let leadership = Leadership::new("a_1".into(), "ns/metahook".into());
        let mut marked = request(http::Method::PUT);
        marked.extensions_mut().insert(GatedBy(leadership));
        let err = api.client().send(marked).await.expect_err("refused at the bottom of the stack");
        assert!(is_not_leader(&err), "{err:?}");
        assert!(api.requests(&http::Method::PUT).is_empty());
        // An unmarked write (the elector's own Lease write) is not the gate's business.
        api.client().send(request(http::Method::PUT)).await.expect("unmarked writes pass");
        assert_eq!(api.requests(&http::Method::PUT).len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_counts_as_in_flight_until_answered_even_if_its_caller_gives_up() {
        let (answer, answered) = tokio::sync::oneshot::channel::<()>();
        let answered = Arc::new(tokio::sync::Mutex::new(Some(answered)));
        let api = tower::service_fn(move |_: http::Request<kube::client::Body>| {
            let answered = Arc::clone(&answered);
            async move {
                let wait = answered.lock().await.take().expect("one request");
                let _ = wait.await;
                Ok::<_, tower::BoxError>(http::Response::new(kube::client::Body::empty()))
            }
        });
        let leadership = Leadership::new("a_1".into(), "ns/metahook".into());
        leadership.open_until(Instant::now() + Duration::from_secs(10));
        let client = gated(
            Client::new(tower::ServiceBuilder::new().layer(WriteGateLayer).service(api), "default"),
            leadership.clone(),
        );
        let caller = tokio::spawn(async move { client.send(request(http::Method::POST)).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(in_flight(&leadership), 1);
        // The caller is dropped (a controller stopped mid-write); the request may be on the wire still.
        caller.abort();
        assert!(caller.await.unwrap_err().is_cancelled());
        assert!(!leadership.writes_landed_by(Instant::now() + Duration::from_secs(1)).await);
        assert_eq!(in_flight(&leadership), 1, "a write given up by its caller is still in flight");
        answer.send(()).unwrap();
        assert!(leadership.writes_landed_by(Instant::now() + Duration::from_secs(1)).await);
        assert_eq!(in_flight(&leadership), 0);
    }

    fn fast_election() -> LeaderElection {
        LeaderElection {
            enabled: true,
            lease_duration: Duration::from_secs(6),
            renew_deadline: Duration::from_secs(4),
            retry_period: Duration::from_secs(1),
            ..LeaderElection::default()
        }
    }

    /// An elector that holds the Lease `ns/metahook` (as after a renewal just now), on `api`.
    fn holding_elector(api: &FakeApi) -> Elector {
        let mut elector = Elector::new(api.client(), "ns", fast_election(), "a_1".into());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some("metahook".into()),
                resource_version: Some("7".into()),
                ..ObjectMeta::default()
            },
            spec: Some(elector.record(None)),
        };
        elector.observe(&lease);
        elector.leadership.open_until(Instant::now() + elector.settings.renew_deadline);
        elector
    }

    fn lease_holder(body: &[u8]) -> Option<String> {
        let lease: Lease = serde_json::from_slice(body).expect("a Lease");
        lease.spec.and_then(|spec| spec.holder_identity)
    }

    #[tokio::test(start_paused = true)]
    async fn release_closes_the_gate_then_waits_for_the_write_in_flight_before_clearing_the_holder() {
        let api = FakeApi::default();
        let mut elector = holding_elector(&api);
        let leadership = elector.leadership().clone();
        let write = leadership.admit_write().expect("the leader writes");
        let started = Instant::now();
        let release = tokio::spawn(async move { elector.release().await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(leadership.admit_write().is_err(), "no write is let through once the release began");
        assert!(api.requests(&http::Method::PUT).is_empty(), "the holder is cleared only after the write landed");
        drop(write);
        release.await.unwrap();
        let released = api.requests(&http::Method::PUT);
        assert_eq!(released.len(), 1, "released once: {released:?}");
        assert_eq!(released[0].0, "/apis/coordination.k8s.io/v1/namespaces/ns/leases/metahook");
        assert_eq!(lease_holder(&released[0].1), None, "the holder is cleared");
        assert_eq!(started.elapsed(), Duration::from_secs(1), "released as soon as the write landed");
    }

    #[tokio::test(start_paused = true)]
    async fn release_leaves_the_lease_to_expire_when_a_write_outlasts_the_renew_deadline() {
        let api = FakeApi::default();
        let mut elector = holding_elector(&api);
        let leadership = elector.leadership().clone();
        let _write = leadership.admit_write().expect("the leader writes");
        let started = Instant::now();
        elector.release().await;
        assert_eq!(started.elapsed(), Duration::from_secs(4), "waited until the gate would have closed by itself");
        assert!(api.requests(&http::Method::PUT).is_empty(), "a Lease with a write still in flight is not released");
        assert!(!leadership.may_write());
    }

    #[tokio::test(start_paused = true)]
    async fn release_with_no_write_in_flight_does_not_wait() {
        let api = FakeApi::default();
        let mut elector = holding_elector(&api);
        let started = Instant::now();
        elector.release().await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        let released = api.requests(&http::Method::PUT);
        assert_eq!(released.len(), 1);
        assert_eq!(lease_holder(&released[0].1), None);
    }

    #[test]
    fn identities_are_unique_per_process_start() {
        let (a, b) = (identity(), identity());
        assert_ne!(a, b);
        assert!(a.rsplit_once('_').is_some_and(|(_, suffix)| suffix.len() == 8), "{a}");
    }
}
