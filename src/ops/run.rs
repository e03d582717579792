//! Running the hub: builds the shared [`Hub`] from the configuration, serves `/metrics`, health and
//! profiles, and
//! runs the controllers ([`run_controllers`]) — at once, or with leader election only while this hub
//! holds the Lease, with a client whose writes stop at the renew deadline ([`crate::ops::gate`]), or
//! sharded: every replica runs them for its own parents while it holds its member Lease, and the
//! leader Lease elects the ring's coordinator ([`crate::ops::ring`]).

use std::sync::Arc;

use kube::Client;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cache::discovery::Discovery;
use crate::cache::informers::Informers;
use crate::cache::shard::{Shard, member_name};
use crate::controllers::files::Files;
use crate::controllers::manager::run_controllers;
use crate::engine::events::Events;
use crate::engine::health::Health;
use crate::engine::hub::Hub;
use crate::engine::metrics::Metrics;
use crate::hooks::{HookClient, HookClientConfig};
use crate::ops::config::LeaderElection;
use crate::ops::config::{Config, MetricsAuth};
use crate::ops::files::Reader;
use crate::ops::labels::Labeller;
use crate::ops::leader::{Elector, LeaseNotes, Lost};
use crate::ops::metrics::{self, Readiness, Routes};
use crate::ops::metrics_auth::{MetricsAccess, Reviewer};
use crate::ops::ring::{Coordinator, Keeper, claim_notes, member_lease_labels, member_lease_name};
use crate::ops::serving_cert::{CertError, RELOAD_EVERY, ServingCert};
use crate::write::apply::Applier;

/// Errors that stop the hub.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("waiting for shutdown signal: {0}")]
    Signal(#[from] std::io::Error),
    /// `metricsCertDir` holds no usable pair: the hub does not start rather than serve tokens in clear.
    #[error("metricsCertDir: {0}")]
    MetricsCert(#[from] CertError),
}

/// The hub's shared services for `config`, all on `client` (with the hub's manners: user agent,
/// requests in flight, optional rate limit).
#[must_use]
pub fn build(client: Client, config: &Config) -> Hub {
    build_member(client, config, None)
}

/// [`build`] for one replica of a sharded ring: `member` is its shard and identity. Its caches watch
/// only its own objects, and its hook requests name it.
#[must_use]
pub fn build_member(client: Client, config: &Config, member: Option<(&Shard, &str)>) -> Hub {
    let client = crate::ops::client::limited(client, config.client_limits());
    let metrics = Metrics::default();
    let hook_client =
        HookClientConfig { replica: member.map(|(_, identity)| identity.to_owned()), ..config.hook_client() };
    if member.is_some() {
        metrics.shard.enable();
    }
    Hub {
        discovery: Discovery::new(client.clone(), config.discovery_interval),
        informers: Informers::new(client.clone(), config.cache_flush_interval)
            .in_namespaces(config.namespaces.clone())
            .sharded(member.map(|(shard, _)| shard.held.selection())),
        hooks: HookClient::new(&hook_client, Some(client.clone())),
        shard: member.map(|(shard, _)| shard.clone()),
        applier: Applier::new(client.clone(), config.field_manager.clone())
            .with_metrics(metrics.apply.clone())
            .taking_over_from(config.take_over_field_managers.clone())
            .with_unknown_fields(config.child_unknown_fields)
            .with_schema_interval(config.discovery_interval),
        events: Events::new(client.clone()).limited(config.events_limit()),
        settings: config.engine_settings(),
        metrics,
        health: Health::default(),
        client,
    }
}

/// Runs every CompositeController and DecoratorController until Ctrl-C / SIGTERM.
pub async fn run(client: Client, config: Config) -> Result<(), HubError> {
    if !config.metrics_cert_dir.is_empty() {
        ServingCert::load(&config.metrics_cert_dir)?;
    }
    let cancel = CancellationToken::new();
    let hub = tokio::spawn(run_until(client, config, cancel.clone()));
    shutdown_signal().await?;
    info!("shutting down");
    cancel.cancel();
    let _ = hub.await;
    Ok(())
}

/// Runs every CompositeController and DecoratorController until `cancel` fires (how tests and embedders
/// run a hub). With `leaderElection.enabled`, only while this hub holds the Lease.
pub async fn run_until(client: Client, config: Config, cancel: CancellationToken) {
    if config.sharding.enabled {
        return run_sharded(client, config, cancel).await;
    }
    if config.leader_election.enabled {
        return run_elected(client, config, cancel).await;
    }
    let access = metrics_access(&client, &config);
    let hub = build(client, &config);
    let ready = Readiness { health: hub.health.clone(), leadership: None, coordination: None };
    let servers = serve_endpoints(&config, &hub, ready, access).await;
    let (files, reader) = controller_files(&config, &hub, &cancel).await;
    run_controllers(hub, config.target_label_selector.clone(), files, cancel).await;
    if let Some(reader) = reader {
        let _ = reader.await;
    }
    for server in servers {
        server.abort();
    }
}

/// The controllers of `controllersFrom`, read once, and the task that reads them again until `cancel`
/// (none without `controllersFrom`).
async fn controller_files(
    config: &Config,
    hub: &Hub,
    cancel: &CancellationToken,
) -> (Option<Files>, Option<tokio::task::JoinHandle<()>>) {
    if config.controllers_from.is_empty() {
        return (None, None);
    }
    let (reader, files) = Reader::start(config.controllers_from.clone(), hub.clone()).await;
    (Some(files), Some(tokio::spawn(reader.run(cancel.clone()))))
}

/// Who may read `/metrics` (`metricsAuth`). The reviews go out on `client` as given, with the hub's
/// manners but not through the leader's write gate: they change nothing, and a standby is scraped too.
fn metrics_access(client: &Client, config: &Config) -> MetricsAccess {
    match config.metrics_auth {
        MetricsAuth::None => MetricsAccess::Anyone,
        MetricsAuth::Kubernetes => {
            let client = crate::ops::client::limited(client.clone(), config.client_limits());
            MetricsAccess::Reviewed(Arc::new(Reviewer::new(client)))
        }
    }
}

/// `/metrics` (to whom `access` allows) and the probes on `metricsAddress`, or the probes on
/// `healthProbeAddress` when that is set (both on one listener when the two are the same address);
/// profiles on `pprofAddress`. `metricsAddress` is HTTPS with `metricsCertDir` (and so are the probes
/// when they share it); if its pair does not load, nothing is served there rather than plain HTTP
/// ([`run`] refuses to start first, so only an embedder calling [`run_until`] gets here).
async fn serve_endpoints(
    config: &Config,
    hub: &Hub,
    ready: Readiness,
    access: MetricsAccess,
) -> Vec<tokio::task::JoinHandle<()>> {
    let registry = Arc::new(metrics::registry(hub, &ready));
    let mut metrics_address = config.metrics_address.as_str();
    let mut watcher = None;
    let tls = match config.metrics_cert_dir.as_str() {
        "" => None,
        dir => match ServingCert::load(dir) {
            Ok(cert) => {
                watcher = Some(tokio::spawn(Arc::clone(&cert).watch(RELOAD_EVERY)));
                Some(cert.acceptor())
            }
            Err(err) => {
                tracing::error!(address = metrics_address, "not serving the metrics address: metricsCertDir: {err}");
                metrics_address = "";
                None
            }
        },
    };
    let servers = match config.health_probe_address.as_deref() {
        Some(probes) if probes != config.metrics_address => vec![
            metrics::start(metrics_address, registry.clone(), ready.clone(), Routes::METRICS, access.clone(), tls)
                .await,
            metrics::start(probes, registry, ready, Routes::PROBES, access, None).await,
        ],
        _ => vec![metrics::start(metrics_address, registry, ready, Routes::ALL, access, tls).await],
    };
    let profiles = crate::ops::pprof::start(&config.pprof_address).await;
    servers.into_iter().chain([profiles, watcher]).flatten().collect()
}

/// Terms of leadership, one after the other: acquire the Lease, run the controllers with a client whose
/// writes stop at the renew deadline, and stop them when the term is lost. On `cancel` the controllers
/// stop first and the Lease is released after, once their writes still on the wire have been answered
/// (`Elector::release`), so a standby takes over at once and never beside one of our writes.
async fn run_elected(client: Client, config: Config, cancel: CancellationToken) {
    let settings = config.leader_election.clone();
    let namespace = crate::ops::leader::namespace(&settings, &client);
    let mut elector = Elector::new(client.clone(), &namespace, settings, crate::ops::leader::identity());
    let leadership = elector.leadership().clone();
    let access = metrics_access(&client, &config);
    let hub = build(crate::ops::gate::gated(client, leadership.clone()), &config);
    let ready = Readiness { health: hub.health.clone(), leadership: Some(leadership.clone()), coordination: None };
    let servers = serve_endpoints(&config, &hub, ready, access).await;
    // Read while standing by too: a new leader starts with the files' last good set.
    let (files, reader) = controller_files(&config, &hub, &cancel).await;
    info!(identity = %leadership.identity, lease = %leadership.lease, "waiting to lead");
    while elector.acquire(&cancel).await {
        hub.health.reset();
        let term = CancellationToken::new();
        let controllers = tokio::spawn(run_controllers(
            hub.clone(),
            config.target_label_selector.clone(),
            files.clone(),
            term.clone(),
        ));
        let lost = tokio::select! {
            lost = elector.hold() => Some(lost),
            () = cancel.cancelled() => None,
        };
        term.cancel();
        let _ = controllers.await;
        match lost {
            None => {
                elector.release().await;
                break;
            }
            Some(Lost::TakenBy(holder)) => warn!(?holder, "another hub took the lease; standing by"),
            Some(Lost::RenewDeadline) => warn!("could not renew the lease in time; standing by"),
        }
    }
    if let Some(reader) = reader {
        let _ = reader.await;
    }
    for server in servers {
        server.abort();
    }
}

/// One replica of a sharded ring: holds its member Lease (terms of membership as [`run_elected`]'s terms
/// of leadership: controllers run only while it is renewed, on a client whose writes stop at its renew
/// deadline), and beside it competes for the leader Lease, whose holder coordinates the ring.
async fn run_sharded(client: Client, config: Config, cancel: CancellationToken) {
    let settings = config.leader_election.clone();
    let namespace = crate::ops::leader::namespace(&settings, &client);
    let identity = crate::ops::leader::identity();
    let shard = Shard::new(&config.sharding.ring, &member_name(&identity));
    let member_settings = LeaderElection { lease_name: member_lease_name(&shard), ..settings.clone() };
    let notes = LeaseNotes::default();
    let mut membership = Elector::new(client.clone(), &namespace, member_settings, identity.clone())
        .labelled(member_lease_labels(&shard))
        .noted(notes.clone());
    let leadership = membership.leadership().clone();
    let access = metrics_access(&client, &config);
    let hub =
        build_member(crate::ops::gate::gated(client.clone(), leadership.clone()), &config, Some((&shard, &identity)));
    let elector = Elector::new(client.clone(), &namespace, settings, identity.clone());
    let ready = Readiness {
        health: hub.health.clone(),
        leadership: Some(leadership.clone()),
        coordination: Some(elector.leadership().clone()),
    };
    let servers = serve_endpoints(&config, &hub, ready, access).await;
    let coordinating =
        tokio::spawn(coordinate(elector, client.clone(), config.clone(), namespace.clone(), cancel.clone()));
    info!(%identity, member = %shard.member, ring = %shard.ring, "joining the ring");
    loop {
        // Each term starts claiming nothing: what an earlier term held may have been taken since.
        notes.set(claim_notes(&std::collections::BTreeSet::new()));
        if !membership.acquire(&cancel).await {
            break;
        }
        hub.health.reset();
        let term = CancellationToken::new();
        // No files: `controllersFrom` is refused with sharding (the labeller reads the API's controllers).
        let controllers =
            tokio::spawn(run_controllers(hub.clone(), config.target_label_selector.clone(), None, term.clone()));
        let keeper = Keeper::new(client.clone(), &namespace, &config, &hub, shard.clone(), notes.clone());
        let keeping = tokio::spawn(keeper.run(term.clone()));
        let labelling = tokio::spawn(Labeller::new(&config, &hub, Arc::clone(&shard.held)).run(term.clone()));
        let lost = tokio::select! {
            lost = membership.hold() => Some(lost),
            () = cancel.cancelled() => None,
        };
        term.cancel();
        let _ = controllers.await;
        let _ = keeping.await;
        let _ = labelling.await;
        shard.held.clear().await;
        hub.metrics.shard.cleared();
        match lost {
            None => {
                membership.release().await;
                break;
            }
            Some(lost) => warn!(?lost, "lost the member lease; rejoining"),
        }
    }
    let _ = coordinating.await;
    for server in servers {
        server.abort();
    }
}

/// Coordinates the ring while this replica holds the leader Lease of `elector` (on a client gated by
/// it), until `cancel`.
async fn coordinate(
    mut elector: Elector,
    client: Client,
    config: Config,
    namespace: String,
    cancel: CancellationToken,
) {
    let gated = crate::ops::client::limited(
        crate::ops::gate::gated(client, elector.leadership().clone()),
        config.client_limits(),
    );
    while elector.acquire(&cancel).await {
        let term = CancellationToken::new();
        let coordinator = Coordinator::new(gated.clone(), &namespace, &config);
        let running = tokio::spawn(coordinator.run(term.clone()));
        let lost = tokio::select! {
            lost = elector.hold() => Some(lost),
            () = cancel.cancelled() => None,
        };
        term.cancel();
        let _ = running.await;
        match lost {
            None => {
                elector.release().await;
                break;
            }
            Some(lost) => warn!(?lost, "lost the coordinator lease; standing by"),
        }
    }
}

async fn shutdown_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}
