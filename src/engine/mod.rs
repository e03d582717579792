//! Stage 4, engine: what every controller kind shares between "something changed" and "the cluster
//! matches". The work [`queue`] and its reasons, the worker loop and the sync's phases ([`sync`]), the
//! echoes of the hub's own writes ([`echoes`]), the last request asked ([`answered`]), permanent hook errors reported ([`held`]), the `customize` hook's [`related`] objects, Events
//! ([`events`]), sync requests ([`trigger`]), re-syncs for a hook's new version ([`rollout`]), a user's `--cascade=orphan` remembered in the API ([`orphaning`]), a candidate hook on a share of the parents
//! ([`canary`]), the
//! controllers' metrics ([`metrics`]) and states ([`health`]), and the services a controller runs with
//! ([`hub`]).
//!
//! May import: [`crate::api`], [`crate::cache`], [`crate::hooks`], [`crate::write`].

pub mod answered;
pub mod canary;
pub mod echoes;
pub mod elsewhere;
pub mod error;
pub mod events;
pub mod finalizer;
pub mod health;
pub mod held;
pub mod hub;
pub mod metrics;
pub mod orphaning;
pub mod queue;
pub mod related;
pub mod rollout;
pub mod status;
pub mod sync;
pub mod trigger;
pub mod worker;
