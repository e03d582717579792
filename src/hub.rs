//! The hub: the pieces every controller shares (one client, discovery, one watch per type, one hook
//! client, one applier, one event recorder), and the top-level run loop.

use kube::Client;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::api::{CompositeController, DecoratorController};
use crate::apply::Applier;
use crate::config::Config;
use crate::discovery::Discovery;
use crate::events::Events;
use crate::hooks::HookClient;
use crate::informers::Informers;

/// Shared services handed to every controller. Cheap to clone.
#[derive(Clone)]
pub struct Hub {
    pub client: Client,
    pub config: Config,
    pub discovery: Discovery,
    pub informers: Informers,
    pub hooks: HookClient,
    pub applier: Applier,
    pub events: Events,
    pub metrics: crate::metrics::Metrics,
}

impl Hub {
    #[must_use]
    pub fn new(client: Client, config: Config) -> Self {
        Self {
            discovery: Discovery::new(client.clone(), config.discovery_interval),
            informers: Informers::new(client.clone()),
            hooks: HookClient::new(),
            applier: Applier::new(client.clone(), config.field_manager.clone()),
            events: Events::new(client.clone()),
            metrics: crate::metrics::Metrics::default(),
            client,
            config,
        }
    }
}

/// Errors that stop the hub.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("waiting for shutdown signal: {0}")]
    Signal(#[from] std::io::Error),
}

/// Runs every CompositeController and DecoratorController until Ctrl-C / SIGTERM.
pub async fn run(client: Client, config: Config) -> Result<(), HubError> {
    let cancel = CancellationToken::new();
    let hub = tokio::spawn(run_until(client, config, cancel.clone()));
    shutdown_signal().await?;
    info!("shutting down");
    cancel.cancel();
    let _ = hub.await;
    Ok(())
}

/// Runs every CompositeController and DecoratorController until `cancel` fires (how tests and embedders run a hub).
pub async fn run_until(client: Client, config: Config, cancel: CancellationToken) {
    let hub = Hub::new(client, config);
    let server = crate::metrics::start(&hub.config.metrics_address, hub.metrics.clone(), hub.informers.clone()).await;
    let composites = Box::pin(crate::manager::run::<CompositeController>(hub.clone(), cancel.clone()));
    let decorators = Box::pin(crate::manager::run::<DecoratorController>(hub, cancel));
    tokio::join!(composites, decorators);
    if let Some(server) = server {
        server.abort();
    }
}

async fn shutdown_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}
