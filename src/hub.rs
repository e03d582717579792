//! The hub: the services every controller shares (one client, discovery, one watch per type, one hook
//! client, one applier, one event recorder, metrics).
//!
//! It depends on nothing above it: controllers take a [`Hub`], and [`crate::manager`] builds one and
//! runs them.

use kube::Client;

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
            hooks: HookClient::new(config.hook_response_limit),
            applier: Applier::new(client.clone(), config.field_manager.clone())
                .taking_over_from(config.take_over_field_managers.clone()),
            events: Events::new(client.clone()),
            metrics: crate::metrics::Metrics::default(),
            client,
            config,
        }
    }
}
