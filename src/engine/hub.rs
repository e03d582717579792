//! The hub: the services every controller shares (one client, discovery, one watch per type, one hook
//! client, one applier, one event recorder, the controllers' metrics and states) and how controllers run.
//!
//! It is data: [`crate::ops::run`] builds one from the configuration, controllers take it. So it names
//! only what the stages up to the engine provide.

use std::time::Duration;

use kube::Client;

use crate::cache::discovery::Discovery;
use crate::cache::informers::Informers;
use crate::cache::shard::Shard;
use crate::engine::events::Events;
use crate::engine::health::Health;
use crate::engine::metrics::Metrics;
use crate::engine::queue::Backoff;
use crate::hooks::HookClient;
use crate::write::apply::Applier;

/// Shared services handed to every controller. Cheap to clone.
#[derive(Clone)]
pub struct Hub {
    pub client: Client,
    pub settings: Settings,
    pub discovery: Discovery,
    pub informers: Informers,
    pub hooks: HookClient,
    pub applier: Applier,
    pub events: Events,
    pub metrics: Metrics,
    /// How the controllers are doing (what `/readyz` answers from).
    pub health: Health,
    /// With sharding, this replica's member of the ring: its caches hold only the parents and children
    /// of the buckets it holds, every child it writes carries its parent's bucket, and only parents of
    /// held buckets are synced (see [`crate::cache::shard`]). `None`: one hub owns everything.
    pub shard: Option<Shard>,
}

/// How every controller of the hub runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Workers per controller (`workers`).
    pub workers: usize,
    /// How long a starting controller waits for its caches before it reports `WatchFailed`.
    pub cache_sync_timeout: Duration,
    /// Retry backoff per key.
    pub backoff: Backoff,
    /// How long a customize hook's answer is used before the hook is asked again (see
    /// [`crate::engine::related`]).
    pub customize_cache_timeout: Duration,
    /// Time between two parents re-synced for a hook's new version (`hookChangeResyncQPS`); `None`:
    /// no re-sync (see [`crate::engine::rollout`]).
    pub hook_change_resync_interval: Option<Duration>,
    /// How often one parent of a controller whose hook names its version is synced again, in turn, so a
    /// new version is noticed while nothing changes (`hookVersionProbeInterval`); `None`: never.
    pub hook_version_probe_interval: Option<Duration>,
}
