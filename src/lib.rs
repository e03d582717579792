//! metahook: a Kubernetes controller hub that runs Metacontroller-compatible controllers whose logic lives
//! in small HTTP hooks.
//!
//! Data flows one way: watch → cache ([`informers`]) → [`queue`] → sync (observe → [`hooks`] → [`apply`] →
//! status), with [`composite`] as the consumer of the shared pieces.
#![deny(clippy::all)]
#![warn(clippy::pedantic)]
#![allow(clippy::module_name_repetitions, clippy::missing_errors_doc, clippy::missing_panics_doc)]

pub mod answered;
pub mod api;
pub mod apply;
pub mod children;
pub mod cli;
pub mod client;
pub mod composite;
pub mod config;
pub mod crds;
pub mod decorator;
pub mod discovery;
pub mod echoes;
pub mod events;
pub mod hooks;
pub mod hub;
pub mod informers;
pub mod leader;
pub mod manager;
pub mod metrics;
pub mod migrate;
pub mod queue;
pub mod rbac;
pub mod related;
pub mod render;
pub mod revisions;
pub mod selector;
pub mod sync;
pub mod trigger;
pub mod validation;

pub use hub::Hub;
pub use manager::{HubError, run, run_until};
