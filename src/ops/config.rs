//! The hub's settings: defaults, overlaid by a YAML file, overlaid by flags and environment variables.
//!
//! `config/metahook.yaml` documents every field with its default; a test keeps that file and
//! [`Config::default`] in agreement.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Errors loading the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("parsing config file {path}: {source}")]
    Parse { path: PathBuf, source: crate::ops::yaml::Error },
    /// The file's keys, put over the current settings key by key, are no settings (an unknown key, a value
    /// of the wrong type): found once merged, so without a position in the file.
    #[error("parsing config file {path}: {source}")]
    Overlay { path: PathBuf, source: serde_json::Error },
    #[error("invalid setting {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

/// Settings of one hub process.
///
/// The doc comments of its fields are what users read: the configuration reference of the book is
/// generated from them (through [`schemars::JsonSchema`], by `tools::reference::config`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Config {
    /// Concurrent syncs per controller (each parent is still synced by one worker at a time).
    pub workers: usize,
    /// How often API discovery is refreshed, so newly installed CRDs become usable, and the child types'
    /// schemas, so a field a CRD starts (or stops) declaring is followed.
    #[serde(with = "secs")]
    #[schemars(with = "u64", extend("x-unit" = "seconds"))]
    pub discovery_interval: Duration,
    /// Server-side apply field manager for children and attachments. One per hub, so that two
    /// controllers writing the same object show up as a conflict instead of silently fighting.
    pub field_manager: String,
    /// Only run CompositeControllers whose labels match this selector (`key=value,key2!=v`); empty = all.
    pub target_label_selector: String,
    /// Base delay of the per-parent exponential backoff after a failed sync.
    #[serde(with = "millis")]
    #[schemars(with = "u64", extend("x-unit" = "milliseconds"))]
    pub backoff_base: Duration,
    /// Cap of the per-parent exponential backoff.
    #[serde(with = "secs")]
    #[schemars(with = "u64", extend("x-unit" = "seconds"))]
    pub backoff_max: Duration,
    /// Where `/metrics` is served (`host:port`, or Go's `:port` for every address); empty disables it.
    /// `/healthz` and `/readyz` are served there too unless `healthProbeAddress` is set.
    pub metrics_address: String,
    /// Who may read `/metrics`: `none`, whoever reaches `metricsAddress`; or `kubernetes`, a request
    /// with `Authorization: Bearer <token>` whose user the API server allows to `get` the non-resource
    /// URL `/metrics` (a `TokenReview`, then a `SubjectAccessReview`, as controller-runtime's metrics filter
    /// asks; the hub needs `create` on `tokenreviews` and `subjectaccessreviews`, which its base role
    /// grants). Answers are remembered for up to a minute. `/healthz` and `/readyz` stay open. Without
    /// `metricsCertDir` the token crosses the network in plain HTTP, so set both together.
    pub metrics_auth: MetricsAuth,
    /// A directory holding `tls.crt` (the chain, PEM) and `tls.key` (its private key, PEM), as a mounted
    /// `kubernetes.io/tls` Secret lays them out: `metricsAddress` then serves HTTPS (TLS 1.2 and 1.3),
    /// probes included when they share it. The files are read again every few seconds and a new pair
    /// is served from the next connection on (a renewed certificate needs no restart); a pair that
    /// does not load keeps the last good one and is logged. Empty: plain HTTP.
    pub metrics_cert_dir: String,
    /// Where `/healthz` and `/readyz` are served, on a listener of their own (`host:port` or `:port`; as
    /// Metacontroller's `--health-probe-bind-address`); empty disables them. Unset (`null`): on
    /// `metricsAddress`, beside `/metrics`.
    pub health_probe_address: Option<String>,
    /// Where CPU and heap profiles are served in pprof's format (`/debug/pprof/profile`,
    /// `/debug/pprof/heap`); empty disables it. Meant to be on only while gathering a profile.
    pub pprof_address: String,
    /// Largest hook response body accepted, in bytes; a larger one fails the sync unread.
    pub hook_response_limit: usize,
    /// How long a starting controller waits for its caches before it reports `Ready=False` with the
    /// last watch error and is retried (a type the hub may not list or watch never syncs).
    #[serde(with = "secs")]
    #[schemars(with = "u64", extend("x-unit" = "seconds"))]
    pub cache_sync_timeout: Duration,
    /// Leader election among replicas of the hub (off for a single process).
    pub leader_election: LeaderElection,
    /// Sharding: every replica syncs its own share of the parents, instead of one leader syncing all.
    pub sharding: Sharding,
    /// Where to connect for a hook server instead of where its name leads: key = the server as the hook
    /// URL names it (`greeter.hooks:8080`; without a port, the URL scheme's default), value = the
    /// `host:port` to open the TCP connection to. Only the destination changes: the URL, `Host` header
    /// and TLS name checks keep the hook's own name. For hubs outside the cluster calling
    /// Service-form hooks (the demo, tests, a laptop with port-forwards).
    pub hook_hosts: BTreeMap<String, String>,
    /// Client-side rate limit on API requests, per second on average; 0 = none (the default: the API
    /// server's priority and fairness protects it, and a client-side limit is what starved
    /// Metacontroller's controllers on busy clusters, Metacontroller #686).
    #[serde(rename = "apiQPS")]
    pub api_qps: f64,
    /// Requests that may go at once above `apiQPS` (with a rate limit set).
    pub api_burst: u32,
    /// Events the hub records per object per second on average, as Metacontroller's event correlator
    /// limits them (`--events-qps`, 1 per 5 minutes); 0 = no limit. Events over it are dropped.
    #[serde(rename = "eventsQPS")]
    pub events_qps: f64,
    /// Events per object that may go at once above `eventsQPS` (with a limit set).
    pub events_burst: u32,
    /// When a controller's hook answers with a `Metahook-Hook-Version` it has not reported before,
    /// every parent is synced again at this many per second, behind the changes; 0 = not at all.
    /// Without the header nothing is re-synced (Metacontroller's behaviour).
    #[serde(rename = "hookChangeResyncQPS")]
    pub hook_change_resync_qps: f64,
    /// How often a controller whose hook names its version asks it again about one of its parents (in
    /// turn), so that a new version is noticed while nothing changes; 0 = only as syncs happen.
    #[serde(with = "secs")]
    #[schemars(with = "u64", extend("x-unit" = "seconds"))]
    pub hook_version_probe_interval: Duration,
    /// API requests open at once, for the whole hub.
    pub max_requests_in_flight: usize,
    /// Field managers whose ownership of children and attachments the hub takes over on its first
    /// write to them (Metacontroller's); empty turns taking over off.
    pub take_over_field_managers: Vec<String>,
    /// A field of a child, attachment or output that its type's schema does not declare (a hook's slip,
    /// such as `type` at a `StatefulSet`'s `spec`): `Drop` leaves it out, as Metacontroller's create does,
    /// and says so in a Warning Event `UnknownFieldsDropped` on the parent; `Strict` refuses the object
    /// whole, as server-side apply does (a `SyncError` naming the field).
    pub child_unknown_fields: crate::write::unknown_fields::UnknownFields,
    /// How often every watched type is listed again (Metacontroller's `--cache-flush-interval`): the
    /// objects that differ from the cache are synced, the safety net against a watch event the hub
    /// never received. 0 turns it off.
    #[serde(with = "secs")]
    #[schemars(with = "u64", extend("x-unit" = "seconds"))]
    pub cache_flush_interval: Duration,
    /// How long a customize hook's answer is used before the hook is asked again, even though the
    /// parent's generation did not change (Metacontroller: 20 minutes): for customize hooks that read
    /// more than the parent's spec.
    #[serde(with = "secs")]
    #[schemars(with = "u64", extend("x-unit" = "seconds"))]
    pub customize_cache_timeout: Duration,
    /// Traces of the syncs, for an OpenTelemetry collector (off unless an endpoint is set).
    pub tracing: Tracing,
    /// The namespaces the hub may read and write (`[a, b]`); empty (the default) = the whole cluster.
    /// Every list and watch of a namespaced type (parents, children, attachments, related objects,
    /// `ControllerRevisions`) then goes to each of these namespaces, never cluster-wide, so the hub can run
    /// on Roles in them (`metahook rbac --namespaces a,b`) where a cluster grants no more. The
    /// controller objects (cluster-scoped CRDs) are still watched cluster-wide; a controller whose
    /// parent, child or attachment type is cluster-scoped is refused (`Ready=False`,
    /// `ClusterScopedResource`): namespaced RBAC cannot grant it.
    pub namespaces: Vec<String>,
    /// Controllers read from files besides the CompositeController and DecoratorController objects of
    /// the API (standalone mode, for clusters where the controller CRDs may not be installed): paths of
    /// files, or of directories whose `*.yaml`, `*.yml` and `*.json` files are read (a mounted
    /// `ConfigMap`). Each holds YAML documents (`---`), every one a controller as you would apply it,
    /// checked as the API server and the controller's start check one. The files are read again every 2
    /// seconds: a changed controller restarts, a removed one stops; a reading with an error keeps the
    /// last good set running and says why (log, an Event on the hub's Pod,
    /// `metahook_controllers_file_errors`). A name a controller object of the same kind has too runs the
    /// object, and the file's is refused. With files, missing controller CRDs are no error. Not with
    /// `sharding`.
    pub controllers_from: Vec<String>,
}

/// Traces: one per sync, with a span for its observe phase, each hook call, each child write and the
/// status write; every hook request carries the sync's W3C `traceparent`, so a hook's own spans join
/// the trace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Tracing {
    /// Base URL of an OTLP/HTTP collector (`http://otel-collector.monitoring:4318`): spans go to its
    /// `/v1/traces` as protobuf, as `service.name` `metahook`. Empty (the default) turns traces off,
    /// and hook requests then carry no `traceparent`.
    pub otlp_endpoint: String,
}

impl Tracing {
    /// Whether traces are exported (and hook requests carry the trace context).
    #[must_use]
    pub fn enabled(&self) -> bool {
        !self.otlp_endpoint.is_empty()
    }
}

/// Who may read `/metrics` (`metricsAuth`; [`crate::ops::metrics_auth`] does the checking).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum MetricsAuth {
    // Whoever reaches the address.
    #[default]
    None,
    // A bearer token of a user the API server allows to `get` `/metrics`.
    Kubernetes,
}

/// Sharding the parents over replicas (see [`crate::ops::ring`]). Each replica holds a Lease of its own
/// in the leader-election namespace, labelled with the ring, renewed with `leaderElection`'s timings; a
/// replica whose Lease expired (or was released) leaves the ring. Every parent falls in one of 1024
/// buckets by a hash of its UID, written once as the label `shard.metahook.dev/<ring>: <bucket>` by the
/// replicas that hold the buckets (the coordinator, holding the leader Lease `leaderElection.leaseName`,
/// puts back labels that name no bucket); every child and attachment the hub writes carries its
/// parent's bucket as `parent.shard.metahook.dev/<ring>: <bucket>`. The buckets are assigned to the live
/// members by consistent hashing; each replica claims the buckets it holds in its Lease, takes one only when no
/// other live member claims it, lets one go only when no sync of it is in flight, and watches parents
/// and children with a label selector for its buckets, so its caches hold about 1/N of the objects.
/// Moving a bucket writes nothing to its parents or children. Hook requests carry the replica's identity
/// in the `Metahook-Replica` header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Sharding {
    /// Shard the parents over every replica (the `--sharding` flag sets it). Replaces `leaderElection.enabled`:
    /// the leader Lease then elects only the coordinator.
    pub enabled: bool,
    /// Name of the ring: the suffix of the bucket labels, and the label value of the members' Leases.
    /// Hubs with different rings (or different field managers) never share parents.
    pub ring: String,
    /// How often bucket labels someone else changed are put back: each replica checks the parents in its
    /// caches, the coordinator lists those whose label names no bucket (a new parent is labelled by the
    /// replica holding its bucket as soon as that replica's watch sees it, whatever this is).
    #[serde(with = "secs")]
    #[schemars(with = "u64", extend("x-unit" = "seconds"))]
    pub rebalance_interval: Duration,
}

impl Default for Sharding {
    fn default() -> Self {
        Self { enabled: false, ring: "metahook".to_owned(), rebalance_interval: Duration::from_secs(30) }
    }
}

impl Sharding {
    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason: &str| Err(ConfigError::Invalid { field, reason: reason.to_owned() });
        let name_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        let ends_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        let ring = &self.ring;
        if ring.is_empty()
            || ring.len() > 63
            || !ring.chars().all(name_ok)
            || !ends_ok(ring.chars().next())
            || !ends_ok(ring.chars().last())
        {
            return invalid(
                "sharding.ring",
                "must be a label name: 1 to 63 of [A-Za-z0-9-_.], alphanumeric at both ends",
            );
        }
        if self.rebalance_interval.is_zero() {
            return invalid("sharding.rebalanceInterval", "must be at least 1 second");
        }
        Ok(())
    }
}

/// Leader election on a `coordination.k8s.io/v1` Lease: only the holder runs controllers.
/// See [`crate::ops::leader`] for why `renewDeadline < leaseDuration` keeps two hubs from writing at once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct LeaderElection {
    /// Run controllers only while holding the Lease (the `--leader-elect` flag sets it).
    pub enabled: bool,
    /// Name of the Lease.
    pub lease_name: String,
    /// Namespace of the Lease; empty = the hub's own (`POD_NAMESPACE`, else the client's default namespace).
    pub lease_namespace: String,
    /// How long a Lease stays valid after its last renewal; a standby takes over only after that.
    #[serde(with = "secs")]
    #[schemars(with = "u64", extend("x-unit" = "seconds"))]
    pub lease_duration: Duration,
    /// The leader stops every write when it has not renewed for this long. Must be below `leaseDuration`.
    #[serde(with = "secs")]
    #[schemars(with = "u64", extend("x-unit" = "seconds"))]
    pub renew_deadline: Duration,
    /// Time between renewals (leader) and between tries to acquire (standby).
    #[serde(with = "secs")]
    #[schemars(with = "u64", extend("x-unit" = "seconds"))]
    pub retry_period: Duration,
}

impl Default for LeaderElection {
    /// client-go's defaults (15 s / 10 s / 2 s), as Metacontroller and kube-controller-manager use.
    fn default() -> Self {
        Self {
            enabled: false,
            lease_name: "metahook".to_owned(),
            lease_namespace: String::new(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            workers: 5,
            discovery_interval: Duration::from_secs(30),
            field_manager: "metahook".to_owned(),
            target_label_selector: String::new(),
            backoff_base: Duration::from_millis(5),
            backoff_max: Duration::from_secs(1000),
            metrics_address: "0.0.0.0:9999".to_owned(),
            metrics_auth: MetricsAuth::None,
            metrics_cert_dir: String::new(),
            health_probe_address: None,
            pprof_address: String::new(),
            hook_response_limit: crate::hooks::DEFAULT_RESPONSE_LIMIT,
            cache_sync_timeout: Duration::from_secs(60),
            leader_election: LeaderElection::default(),
            sharding: Sharding::default(),
            hook_hosts: BTreeMap::new(),
            api_qps: 0.0,
            api_burst: 100,
            events_qps: 0.0,
            events_burst: 25,
            hook_change_resync_qps: 20.0,
            hook_version_probe_interval: Duration::from_secs(30),
            max_requests_in_flight: 64,
            take_over_field_managers: vec![crate::write::take_over::METACONTROLLER_MANAGER.to_owned()],
            child_unknown_fields: crate::write::unknown_fields::UnknownFields::Drop,
            cache_flush_interval: Duration::from_secs(30 * 60),
            customize_cache_timeout: Duration::from_secs(20 * 60),
            tracing: Tracing::default(),
            namespaces: Vec::new(),
            controllers_from: Vec::new(),
        }
    }
}

/// Command-line / environment overrides; each `None` leaves the file's (or default) value.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ConfigOverrides {
    /// Concurrent syncs per controller.
    #[arg(long, env = "METAHOOK_WORKERS")]
    pub workers: Option<usize>,
    /// Discovery refresh interval in seconds.
    #[arg(long, env = "METAHOOK_DISCOVERY_INTERVAL_SECONDS")]
    pub discovery_interval_seconds: Option<u64>,
    /// Server-side apply field manager.
    #[arg(long, env = "METAHOOK_FIELD_MANAGER")]
    pub field_manager: Option<String>,
    /// Only run controllers whose labels match this selector.
    #[arg(long, env = "METAHOOK_TARGET_LABEL_SELECTOR")]
    pub target_label_selector: Option<String>,
    /// Address of the metrics and health endpoints; empty disables them.
    #[arg(long, env = "METAHOOK_METRICS_ADDRESS")]
    pub metrics_address: Option<String>,
    /// Who may read /metrics: none, or kubernetes (a bearer token whose user may get /metrics).
    #[arg(long, env = "METAHOOK_METRICS_AUTH", value_enum)]
    pub metrics_auth: Option<MetricsAuth>,
    /// Serve the metrics address over HTTPS with tls.crt and tls.key from this directory (reloaded when they change).
    #[arg(long, env = "METAHOOK_METRICS_CERT_DIR")]
    pub metrics_cert_dir: Option<String>,
    /// Run controllers only while holding the leader Lease (for several replicas).
    #[arg(long, env = "METAHOOK_LEADER_ELECT", num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: Option<bool>,
    /// Shard the parents over every replica (each its own Lease; the leader Lease elects the coordinator).
    #[arg(long, env = "METAHOOK_SHARDING", num_args = 0..=1, default_missing_value = "true")]
    pub sharding: Option<bool>,
    /// Name of the sharding ring.
    #[arg(long, env = "METAHOOK_SHARD_RING")]
    pub shard_ring: Option<String>,
    /// Name of the leader Lease.
    #[arg(long, env = "METAHOOK_LEADER_ELECT_LEASE_NAME")]
    pub leader_elect_lease_name: Option<String>,
    /// Namespace of the leader Lease (default: the hub's own).
    #[arg(long, env = "METAHOOK_LEADER_ELECT_NAMESPACE")]
    pub leader_elect_namespace: Option<String>,
    /// Lease duration in seconds.
    #[arg(long, env = "METAHOOK_LEASE_DURATION_SECONDS")]
    pub lease_duration_seconds: Option<u64>,
    /// Renew deadline in seconds.
    #[arg(long, env = "METAHOOK_RENEW_DEADLINE_SECONDS")]
    pub renew_deadline_seconds: Option<u64>,
    /// Retry period in seconds.
    #[arg(long, env = "METAHOOK_RETRY_PERIOD_SECONDS")]
    pub retry_period_seconds: Option<u64>,
    /// Base URL of an OTLP/HTTP collector to send traces to (`http://collector:4318`); empty: none.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Parents re-synced per second when a hook reports a new Metahook-Hook-Version; 0 = none.
    #[arg(long, env = "METAHOOK_HOOK_CHANGE_RESYNC_QPS")]
    pub hook_change_resync_qps: Option<f64>,
    /// Watch and write only in these namespaces (`a,b`); empty: the whole cluster.
    #[arg(long, env = "METAHOOK_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Option<Vec<String>>,
    /// Also run the controllers of these files or directories (repeat it, or `a,b`); reloaded as they change.
    #[arg(long, env = "METAHOOK_CONTROLLERS_FROM", value_delimiter = ',')]
    pub controllers_from: Option<Vec<String>>,
}

impl Config {
    /// Defaults, then `file` (if any), then `overrides`.
    pub fn load(file: Option<&Path>, overrides: &ConfigOverrides) -> Result<Self, ConfigError> {
        let mut config = match file {
            Some(path) => Self::from_file(path)?,
            None => Self::default(),
        };
        if let Some(workers) = overrides.workers {
            config.workers = workers;
        }
        if let Some(secs) = overrides.discovery_interval_seconds {
            config.discovery_interval = Duration::from_secs(secs);
        }
        if let Some(manager) = &overrides.field_manager {
            config.field_manager.clone_from(manager);
        }
        if let Some(selector) = &overrides.target_label_selector {
            config.target_label_selector.clone_from(selector);
        }
        if let Some(address) = &overrides.metrics_address {
            config.metrics_address.clone_from(address);
        }
        if let Some(endpoint) = &overrides.otlp_endpoint {
            config.tracing.otlp_endpoint.clone_from(endpoint);
        }
        if let Some(qps) = overrides.hook_change_resync_qps {
            config.hook_change_resync_qps = qps;
        }
        if let Some(auth) = overrides.metrics_auth {
            config.metrics_auth = auth;
        }
        if let Some(dir) = &overrides.metrics_cert_dir {
            config.metrics_cert_dir.clone_from(dir);
        }
        if let Some(namespaces) = &overrides.namespaces {
            // `--namespaces ""` (an empty list item) means the whole cluster, as the file's `[]` does.
            config.namespaces = namespaces.iter().filter(|n| !n.is_empty()).cloned().collect();
        }
        if let Some(paths) = &overrides.controllers_from {
            // As `--namespaces`: an empty item is nothing, so `--controllers-from ""` turns files off.
            config.controllers_from = paths.iter().filter(|p| !p.is_empty()).cloned().collect();
        }
        if let Some(enabled) = overrides.sharding {
            config.sharding.enabled = enabled;
        }
        if let Some(ring) = &overrides.shard_ring {
            config.sharding.ring.clone_from(ring);
        }
        let election = &mut config.leader_election;
        if let Some(enabled) = overrides.leader_elect {
            election.enabled = enabled;
        }
        if let Some(name) = &overrides.leader_elect_lease_name {
            election.lease_name.clone_from(name);
        }
        if let Some(namespace) = &overrides.leader_elect_namespace {
            election.lease_namespace.clone_from(namespace);
        }
        for (value, field) in [
            (overrides.lease_duration_seconds, &mut election.lease_duration),
            (overrides.renew_deadline_seconds, &mut election.renew_deadline),
            (overrides.retry_period_seconds, &mut election.retry_period),
        ] {
            if let Some(secs) = value {
                *field = Duration::from_secs(secs);
            }
        }
        config.validate()?;
        Ok(config)
    }

    /// How controllers run.
    #[must_use]
    pub fn engine_settings(&self) -> crate::engine::hub::Settings {
        crate::engine::hub::Settings {
            workers: self.workers,
            cache_sync_timeout: self.cache_sync_timeout,
            backoff: crate::engine::queue::Backoff { base: self.backoff_base, max: self.backoff_max },
            customize_cache_timeout: self.customize_cache_timeout,
            hook_change_resync_interval: (self.hook_change_resync_qps > 0.0)
                .then(|| Duration::from_secs_f64(1.0 / self.hook_change_resync_qps)),
            hook_version_probe_interval: (!self.hook_version_probe_interval.is_zero())
                .then_some(self.hook_version_probe_interval),
        }
    }

    /// The per-object limit on the hub's Events (`eventsQPS`, `eventsBurst`); `None` without one.
    #[must_use]
    pub fn events_limit(&self) -> Option<crate::engine::events::Limit> {
        (self.events_qps > 0.0)
            .then_some(crate::engine::events::Limit { qps: self.events_qps, burst: self.events_burst })
    }

    /// The limits of the hub's API client.
    #[must_use]
    pub fn client_limits(&self) -> crate::ops::client::Limits {
        crate::ops::client::Limits { qps: self.api_qps, burst: self.api_burst, in_flight: self.max_requests_in_flight }
    }

    /// How the hub's hook client is set up.
    #[must_use]
    pub fn hook_client(&self) -> crate::hooks::HookClientConfig {
        crate::hooks::HookClientConfig {
            response_limit: self.hook_response_limit,
            hook_hosts: self.hook_hosts.clone(),
            keep_alive: true,
            trace_context: self.tracing.enabled(),
            replica: None,
        }
    }

    fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        crate::ops::yaml::from_str(&text).map_err(|source| ConfigError::Parse { path: path.to_owned(), source })
    }

    /// These settings with those the file at `path` sets put over them: keys the file leaves out keep
    /// their value here rather than the built-in default (how Metacontroller's defaults and a
    /// `METAHOOK_CONFIG` file combine). Not validated.
    pub fn overlaid_with_file(&self, path: &Path) -> Result<Self, ConfigError> {
        fn overlay(base: &mut serde_json::Value, over: serde_json::Value) {
            match (base, over) {
                (serde_json::Value::Object(base), serde_json::Value::Object(over)) => {
                    for (key, value) in over {
                        match base.get_mut(&key) {
                            Some(slot) => overlay(slot, value),
                            None => drop(base.insert(key, value)),
                        }
                    }
                }
                (slot, value) => *slot = value,
            }
        }
        let merge = |source| ConfigError::Overlay { path: path.to_owned(), source };
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let mut merged = serde_json::to_value(self).map_err(merge)?;
        let over: serde_json::Value =
            crate::ops::yaml::from_str(&text).map_err(|source| ConfigError::Parse { path: path.to_owned(), source })?;
        if !over.is_null() {
            overlay(&mut merged, over);
        }
        serde_json::from_value(merged).map_err(merge)
    }

    /// Checks the settings together; the error names the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.workers == 0 {
            return Err(ConfigError::Invalid { field: "workers", reason: "must be at least 1".into() });
        }
        if self.field_manager.is_empty() {
            return Err(ConfigError::Invalid { field: "fieldManager", reason: "must not be empty".into() });
        }
        if self.hook_response_limit == 0 {
            return Err(ConfigError::Invalid { field: "hookResponseLimit", reason: "must be at least 1 byte".into() });
        }
        if self.backoff_base > self.backoff_max {
            return Err(ConfigError::Invalid {
                field: "backoffBase",
                reason: "must not exceed backoffMaxSeconds".into(),
            });
        }
        if !(self.api_qps >= 0.0 && self.api_qps.is_finite()) {
            return Err(ConfigError::Invalid { field: "apiQPS", reason: "must be a number, 0 or more".into() });
        }
        if self.max_requests_in_flight == 0 {
            return Err(ConfigError::Invalid { field: "maxRequestsInFlight", reason: "must be at least 1".into() });
        }
        if self.customize_cache_timeout.is_zero() {
            return Err(ConfigError::Invalid {
                field: "customizeCacheTimeout",
                reason: "must be at least 1 second".into(),
            });
        }
        if !(self.hook_change_resync_qps >= 0.0 && self.hook_change_resync_qps.is_finite()) {
            return Err(ConfigError::Invalid {
                field: "hookChangeResyncQPS",
                reason: "must be a finite number, 0 or more".into(),
            });
        }
        if !(self.events_qps >= 0.0 && self.events_qps.is_finite()) {
            return Err(ConfigError::Invalid { field: "eventsQPS", reason: "must be a number, 0 or more".into() });
        }
        if self.events_qps > 0.0 && self.events_burst == 0 {
            return Err(ConfigError::Invalid {
                field: "eventsBurst",
                reason: "must be at least 1 with eventsQPS set".into(),
            });
        }
        if self.discovery_interval.is_zero() {
            return Err(ConfigError::Invalid { field: "discoveryInterval", reason: "must be more than 0".into() });
        }
        if self.cache_sync_timeout.is_zero() {
            return Err(ConfigError::Invalid { field: "cacheSyncTimeout", reason: "must be at least 1 second".into() });
        }
        self.leader_election.validate()?;
        if let Some(bad) = self.namespaces.iter().find(|n| !is_dns_label(n)) {
            return Err(ConfigError::Invalid {
                field: "namespaces",
                reason: format!("{bad:?} is not a namespace name (a DNS label: a-z, 0-9, '-', at most 63)"),
            });
        }
        self.sharding.validate()?;
        if self.sharding.enabled && !self.controllers_from.is_empty() {
            // The ring's coordinator and labeller find the parent types in the controller objects of the API.
            return Err(ConfigError::Invalid {
                field: "controllersFrom",
                reason: "is not supported with sharding (sharding.enabled) yet".into(),
            });
        }
        if self.tracing.enabled() {
            crate::ops::traces::collector_url(&self.tracing.otlp_endpoint)
                .map_err(|reason| ConfigError::Invalid { field: "tracing.otlpEndpoint", reason })?;
        }
        crate::hooks::dial::check_hook_hosts(&self.hook_hosts)
            .map_err(|reason| ConfigError::Invalid { field: "hookHosts", reason })?;
        crate::cache::selector::parse_selector_string(&self.target_label_selector)
            .map_err(|e| ConfigError::Invalid { field: "targetLabelSelector", reason: e.to_string() })?;
        Ok(())
    }
}

/// Whether `name` can name a namespace (an RFC 1123 label): a typo here would otherwise make a hub that
/// watches nothing and says nothing.
fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

impl LeaderElection {
    /// client-go's rule: `leaseDuration > renewDeadline > retryPeriod`, all positive. The first
    /// inequality is what keeps an old leader from writing after a new one took over ([`crate::ops::leader`]).
    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason: &str| Err(ConfigError::Invalid { field, reason: reason.to_owned() });
        if self.lease_name.is_empty() {
            return invalid("leaderElection.leaseName", "must not be empty");
        }
        if self.retry_period.is_zero() {
            return invalid("leaderElection.retryPeriod", "must be at least 1 second");
        }
        if self.renew_deadline <= self.retry_period {
            return invalid("leaderElection.renewDeadline", "must be greater than retryPeriod");
        }
        if self.lease_duration <= self.renew_deadline {
            return invalid("leaderElection.leaseDuration", "must be greater than renewDeadline");
        }
        Ok(())
    }
}

mod secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::yaml;

    #[test]
    fn documented_default_file_matches_built_in_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/metahook.yaml");
        let from_file = Config::from_file(&path).expect("config/metahook.yaml parses");
        assert_eq!(from_file, Config::default());
    }

    #[test]
    fn overrides_win_over_file_values() {
        let overrides = ConfigOverrides { workers: Some(9), ..ConfigOverrides::default() };
        let config = Config::load(None, &overrides).unwrap();
        assert_eq!(config.workers, 9);
        assert_eq!(config.field_manager, "metahook");
    }

    #[test]
    fn zero_workers_is_rejected() {
        let overrides = ConfigOverrides { workers: Some(0), ..ConfigOverrides::default() };
        let err = Config::load(None, &overrides).unwrap_err();
        assert!(err.to_string().contains("workers"), "{err}");
    }

    #[test]
    fn hook_hosts_are_read_and_checked() {
        let config: Config = yaml::from_str("hookHosts: {\"greeter.hooks:8080\": \"127.0.0.1:41234\"}").unwrap();
        assert_eq!(config.hook_hosts["greeter.hooks:8080"], "127.0.0.1:41234");
        assert!(config.validate().is_ok());
        let config: Config = yaml::from_str("hookHosts: {\"greeter.hooks\": \"127.0.0.1\"}").unwrap();
        let err = config.validate().unwrap_err();
        assert!(err.to_string().contains("hookHosts"), "{err}");
    }

    #[test]
    fn leader_election_timings_must_leave_a_margin() {
        let overrides = ConfigOverrides {
            leader_elect: Some(true),
            lease_duration_seconds: Some(10),
            renew_deadline_seconds: Some(10),
            ..ConfigOverrides::default()
        };
        let err = Config::load(None, &overrides).unwrap_err();
        assert!(err.to_string().contains("leaseDuration"), "{err}");
        let overrides = ConfigOverrides { retry_period_seconds: Some(10), ..ConfigOverrides::default() };
        assert!(Config::load(None, &overrides).unwrap_err().to_string().contains("renewDeadline"));
        let overrides = ConfigOverrides { leader_elect: Some(true), ..ConfigOverrides::default() };
        assert!(Config::load(None, &overrides).unwrap().leader_election.enabled);
    }

    #[test]
    fn a_file_overlays_the_settings_it_is_given_key_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metahook.yaml");
        std::fs::write(&path, "workers: 7\nleaderElection: {leaseNamespace: hub}\nhealthProbeAddress: \":8081\"\n")
            .unwrap();
        let base = Config {
            api_qps: 5.0,
            leader_election: LeaderElection { lease_name: "metacontroller".into(), ..LeaderElection::default() },
            ..Config::default()
        };
        let config = base.overlaid_with_file(&path).unwrap();
        assert_eq!(config.workers, 7);
        assert_eq!(config.health_probe_address.as_deref(), Some(":8081"));
        assert!((config.api_qps - 5.0).abs() < f64::EPSILON, "a key the file leaves out keeps the base's value");
        assert_eq!(config.leader_election.lease_name, "metacontroller", "nested keys merge too");
        assert_eq!(config.leader_election.lease_namespace, "hub");
        std::fs::write(&path, "wrkers: 1\n").unwrap();
        let err = base.overlaid_with_file(&path).unwrap_err();
        assert!(err.to_string().contains("wrkers"), "{err}");
        std::fs::write(&path, "").unwrap();
        assert_eq!(base.overlaid_with_file(&path).unwrap(), base, "an empty file changes nothing");
    }

    #[test]
    fn events_are_limited_only_when_configured() {
        assert_eq!(Config::default().events_limit(), None, "metahook run records every Event, as before");
        let config: Config = yaml::from_str("eventsQPS: 0.5\neventsBurst: 3").unwrap();
        assert_eq!(config.events_limit(), Some(crate::engine::events::Limit { qps: 0.5, burst: 3 }));
        let config: Config = yaml::from_str("eventsQPS: 1\neventsBurst: 0").unwrap();
        assert!(config.validate().unwrap_err().to_string().contains("eventsBurst"));
        let config: Config = yaml::from_str("eventsQPS: -1").unwrap();
        assert!(config.validate().unwrap_err().to_string().contains("eventsQPS"));
    }

    #[test]
    fn metrics_auth_is_read_from_the_file_and_overridden_by_its_flag() {
        let config: Config = yaml::from_str("metricsAuth: kubernetes").unwrap();
        assert_eq!(config.metrics_auth, MetricsAuth::Kubernetes);
        assert!(yaml::from_str::<Config>("metricsAuth: tls").is_err(), "only the values it knows");
        let overrides = ConfigOverrides { metrics_auth: Some(MetricsAuth::Kubernetes), ..ConfigOverrides::default() };
        assert_eq!(Config::load(None, &overrides).unwrap().metrics_auth, MetricsAuth::Kubernetes);
        assert_eq!(Config::default().metrics_auth, MetricsAuth::None, "open by default, as Metacontroller's");
    }

    #[test]
    fn namespaces_come_from_the_file_or_a_comma_separated_flag_and_must_be_names() {
        assert!(Config::default().namespaces.is_empty(), "the whole cluster by default");
        let config: Config = yaml::from_str("namespaces: [team-a, team-b]").unwrap();
        assert_eq!(config.namespaces, ["team-a", "team-b"]);
        let overrides =
            ConfigOverrides { namespaces: Some(vec!["a".into(), "b".into()]), ..ConfigOverrides::default() };
        assert_eq!(Config::load(None, &overrides).unwrap().namespaces, ["a", "b"]);
        let overrides = ConfigOverrides { namespaces: Some(vec![String::new()]), ..ConfigOverrides::default() };
        assert!(Config::load(None, &overrides).unwrap().namespaces.is_empty(), "an empty flag: the whole cluster");
        for bad in ["Team", "a b", "-a", "a.b"] {
            let config = Config { namespaces: vec![bad.into()], ..Config::default() };
            assert!(config.validate().unwrap_err().to_string().contains("namespaces"), "{bad}");
        }
    }

    #[test]
    fn sharding_is_read_and_its_ring_must_be_a_label_name() {
        let config: Config = yaml::from_str("sharding: {enabled: true, ring: web}").unwrap();
        assert!(config.sharding.enabled);
        assert_eq!(config.sharding.ring, "web");
        assert!(config.validate().is_ok());
        for bad in ["", "-web", "we/b", &"r".repeat(64)] {
            let config =
                Config { sharding: Sharding { ring: bad.to_owned(), ..Sharding::default() }, ..Config::default() };
            assert!(config.validate().unwrap_err().to_string().contains("sharding.ring"), "{bad:?}");
        }
        let overrides =
            ConfigOverrides { sharding: Some(true), shard_ring: Some("r2".into()), ..ConfigOverrides::default() };
        let config = Config::load(None, &overrides).unwrap();
        assert!(config.sharding.enabled);
        assert_eq!(config.sharding.ring, "r2");
    }

    #[test]
    fn controllers_from_comes_from_the_file_or_a_repeatable_comma_separated_flag() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, "controllersFrom: [/etc/metahook/controllers]\n").unwrap();
        let config = Config::load(Some(&path), &ConfigOverrides::default()).unwrap();
        assert_eq!(config.controllers_from, ["/etc/metahook/controllers"]);
        let overrides = ConfigOverrides {
            controllers_from: Some(vec!["a.yaml".into(), "dir".into()]),
            ..ConfigOverrides::default()
        };
        assert_eq!(Config::load(Some(&path), &overrides).unwrap().controllers_from, ["a.yaml", "dir"]);
        let overrides = ConfigOverrides { controllers_from: Some(vec![String::new()]), ..ConfigOverrides::default() };
        assert!(Config::load(Some(&path), &overrides).unwrap().controllers_from.is_empty());
        let overrides = ConfigOverrides { sharding: Some(true), ..ConfigOverrides::default() };
        let err = Config::load(Some(&path), &overrides).unwrap_err().to_string();
        assert!(err.contains("controllersFrom"), "{err}");
    }

    #[test]
    fn unknown_keys_in_file_are_rejected() {
        let err = yaml::from_str::<Config>("workerz: 3").unwrap_err();
        assert!(err.to_string().contains("workerz"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metahook.yaml");
        std::fs::write(&path, "workers: 3\nleaderElection:\n  leaseNme: x\n").unwrap();
        let err = Config::load(Some(&path), &ConfigOverrides::default()).unwrap_err().to_string();
        assert!(err.contains("leaseNme") && err.ends_with("at line 3, column 3"), "the key and where it is: {err}");
    }
}
