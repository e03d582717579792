//! metahook: a Kubernetes controller hub that runs Metacontroller-compatible controllers whose logic lives
//! in small HTTP hooks.
//!
//! The tree is the data path, one folder per stage; a stage imports only from the stages before it:
//!
//! [`api`] (the types users write) → [`cache`] (watch → cache) → [`hooks`] (asking a hook) →
//! [`write`](mod@write) (applying an answer safely) → [`engine`] (queue → sync) → [`controllers`] (composite,
//! decorator) → [`ops`] (configuration, API client, leader election) → [`tools`] (the command line).
//!
//! A reader starts from [`run`] (what `metahook run` does), [`Config`], the [`Hub`] every controller
//! gets, and `engine::sync`, where one sync of either controller kind happens.
#![deny(clippy::all)]
#![warn(clippy::pedantic)]
#![allow(clippy::module_name_repetitions, clippy::missing_errors_doc, clippy::missing_panics_doc)]

pub mod api;
pub mod cache;
pub mod controllers;
pub mod engine;
pub mod hooks;
pub mod ops;
pub mod tools;
pub mod write;

/// The `tracing` target of the spans that exist only for traces (`observe`, `hook`, `write`,
/// `status`): [`ops::traces`] exports them as children of the `sync` span, and the log writer leaves
/// them out, so a log line goes on naming its sync (the JSON log's `span`) rather than the hook call or
/// write it happened in. With traces off no subscriber wants them: creating one is a cached check.
/// Public for embedders that build their own subscriber and want the same.
pub const TRACE_SPANS: &str = "metahook::traces";

pub use engine::hub::Hub;
pub use ops::config::Config;
pub use ops::run::{HubError, run, run_until};
