//! Stage 6, operations: running the hub as a cluster add-on. Its configuration ([`config`]) and the
//! controllers it reads from files ([`files`]), its manners
//! towards the API server ([`client`]) and the count of its requests ([`client_metrics`]), leader
//! election ([`leader`]) and the write gate that makes it safe ([`gate`]), sharding's members and
//! coordinator ([`ring`]) and the parents' bucket labels ([`labels`]), `/metrics` and health
//! ([`metrics`]; the process's own from [`process`]; who may read them, [`metrics_auth`]; HTTPS from
//! renewed certificate files, [`serving_cert`]), profiles ([`pprof`], the heap's from [`heap`]), the HTTP
//! serving under both ([`http`]), traces for an OpenTelemetry collector ([`traces`]), the YAML users write
//! and metahook prints ([`yaml`]), and running it all ([`run`]).
//!
//! May import: every stage below (api, cache, hooks, write, engine, controllers).

pub mod client;
pub mod client_metrics;
pub mod config;
pub mod files;
pub mod gate;
pub mod heap;
pub mod http;
pub mod labels;
pub mod leader;
pub mod metrics;
pub mod metrics_auth;
pub mod pprof;
pub mod process;
pub mod ring;
pub mod run;
pub mod serving_cert;
pub mod traces;
pub mod yaml;
