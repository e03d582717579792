//! The hub: the services every controller shares (one client, discovery, one watch per type, one hook
//! client, one applier, one event recorder, metrics and health).
//!
//! It depends on nothing above it: controllers take a [`Hub`], and [`crate::controllers::manager`] builds one and
//! runs them.

use std::sync::Arc;

use kube::Client;
use prometheus_client::registry::Registry;

use crate::cache::discovery::Discovery;
use crate::cache::informers::Informers;
use crate::engine::events::Events;
use crate::engine::metrics::{Health, Metrics};
use crate::hooks::HookClient;
use crate::ops::config::Config;
use crate::ops::gate::Leadership;
use crate::write::apply::Applier;

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
    pub metrics: Metrics,
    /// What `/readyz` answers from.
    pub health: Health,
    /// Every metric family of the hub, as `/metrics` serves them.
    pub registry: Arc<Registry>,
}

impl Hub {
    #[must_use]
    pub fn new(client: Client, config: Config) -> Self {
        Self::with_leadership(client, config, None)
    }

    /// A hub whose `/readyz` and metrics report `leadership` (when it runs for a Lease).
    #[must_use]
    pub fn with_leadership(client: Client, config: Config, leadership: Option<Leadership>) -> Self {
        let client = crate::ops::client::limited(client, config.client_limits());
        let metrics = Metrics::default();
        let health = Health::new(leadership);
        let informers = Informers::new(client.clone());
        let hooks = HookClient::new(&config.hook_client(), Some(client.clone()));
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        crate::engine::metrics::register_snapshot(&mut registry, health.clone(), informers.clone());
        // Families owned by other parts of the hub register here, one line each.
        hooks.metrics().register(&mut registry);
        Self {
            discovery: Discovery::new(client.clone(), config.discovery_interval),
            applier: Applier::new(client.clone(), config.field_manager.clone())
                .with_metrics(metrics.apply.clone())
                .taking_over_from(config.take_over_field_managers.clone()),
            events: Events::new(client.clone()),
            informers,
            hooks,
            metrics,
            health,
            registry: Arc::new(registry),
            client,
            config,
        }
    }
}
