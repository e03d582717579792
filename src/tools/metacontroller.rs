//! Metacontroller's command line, so that its Helm chart and its production manifest run metahook
//! with only the image changed: the hub started as `metacontroller` (the image has the binary at
//! `/usr/bin/metacontroller`, the chart's `command`), or with flags and no subcommand, reads the flags
//! of Metacontroller's `main.go` (and controller-runtime's `--kubeconfig` and `--zap-*`) with Go's
//! syntax ([`super::goflag`]) and Metacontroller's defaults, and maps each onto the hub's [`Config`]
//! and logging.
//!
//! Where Metacontroller's defaults differ from `metahook run`'s, its own apply here: client-side rate
//! limit 5/s, burst 10 (raising them is advised: the limit starved Metacontroller's controllers on
//! busy clusters, #686); Events limited per object (1 per 5 minutes, burst 25); probes on `:8081`,
//! metrics on `:9999`; the leader Lease called `metacontroller`; JSON logs with RFC 3339 times.
//!
//! A `METAHOOK_CONFIG` file, if set, goes over Metacontroller's defaults, and the flags over it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ops::config::{Config, ConfigError};
use crate::tools::goflag::{self, FlagError, FlagKind, Given};
use crate::tools::logs::{LogFormat, Logging, TimeFormat};

/// The flags: name, whether it takes a value, and what it does (for `-help`).
const FLAGS: &[(&str, FlagKind, &str)] = &[
    (
        "discovery-interval",
        FlagKind::Value,
        "How often to refresh discovery to pick up newly installed resources (Go duration, default 30s)",
    ),
    (
        "cache-flush-interval",
        FlagKind::Value,
        "How often to flush local caches and relist objects from the API server (default 30m)",
    ),
    ("metrics-address", FlagKind::Value, "Address of /metrics (default \":9999\"; \"0\" disables it)"),
    (
        "health-probe-bind-address",
        FlagKind::Value,
        "Address of /healthz and /readyz (default \":8081\"; \"0\" disables them)",
    ),
    ("client-go-qps", FlagKind::Value, "API requests per second (default 5; 0 means 5, negative means no limit)"),
    ("client-go-burst", FlagKind::Value, "API requests at once above the rate (default 10; 0 means 10)"),
    ("workers", FlagKind::Value, "Concurrent syncs per controller (default 5)"),
    (
        "events-qps",
        FlagKind::Value,
        "Events per object per second (default 1/300: one per 5 minutes; 0 means the default)",
    ),
    ("events-burst", FlagKind::Value, "Events per object at once above the rate (default 25; 0 means 25)"),
    ("pprof-address", FlagKind::Value, "Address of /debug/pprof (CPU and heap profiles; default \"0\": off)"),
    ("leader-election", FlagKind::Bool, "Run controllers only while holding the leader Lease (default false)"),
    ("leader-election-resource-lock", FlagKind::Value, "Kind of lock (default \"leases\", the only one supported)"),
    ("leader-election-namespace", FlagKind::Value, "Namespace of the Lease (default: the hub's own)"),
    ("leader-election-id", FlagKind::Value, "Name of the Lease (default \"metacontroller\")"),
    (
        "target-label-selector",
        FlagKind::Value,
        "Only run CompositeControllers and DecoratorControllers whose labels match",
    ),
    (
        "apply-strategy",
        FlagKind::Value,
        "dynamic-apply (default) or server-side-apply: metahook always uses server-side apply",
    ),
    (
        "apply-strategy-ssa-field-manager",
        FlagKind::Value,
        "Metacontroller's server-side-apply field manager, whose fields metahook takes over (default \"metacontroller\")",
    ),
    ("kubeconfig", FlagKind::Value, "Kubeconfig file (default: KUBECONFIG, ~/.kube/config, then in-cluster)"),
    ("zap-devel", FlagKind::Bool, "Development defaults: text logs at debug level"),
    ("zap-encoder", FlagKind::Value, "Log encoding: json or console"),
    ("zap-log-level", FlagKind::Value, "debug, info, error, panic, or an integer > 0 (1-4: debug, 5 or more: trace)"),
    (
        "zap-stacktrace-level",
        FlagKind::Value,
        "info, error or panic (accepted; log lines carry their span fields instead of a stack trace)",
    ),
    ("zap-time-encoding", FlagKind::Value, "epoch, millis, nano, iso8601, rfc3339 (default) or rfc3339nano"),
];

/// What the command line asks for.
#[derive(Debug, PartialEq)]
pub struct Invocation {
    pub config: Config,
    pub kubeconfig: Option<PathBuf>,
    pub logging: Logging,
    /// Lines to log once logging is up: what a flag means here when it differs from Metacontroller.
    pub notes: Vec<String>,
    /// Each setting as Metacontroller logs it at start (`Configuration information`).
    pub summary: Vec<(&'static str, String)>,
}

/// Why the command line was refused (exit status 2).
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error(transparent)]
    Flag(#[from] FlagError),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Whether the process runs Metacontroller's command line: started as `metacontroller`, or given flags
/// and no subcommand (`metahook --zap-log-level=4 ...`). `metahook --help` and `--version` stay clap's.
#[must_use]
pub fn wanted(args: &[std::ffi::OsString]) -> bool {
    let program = args.first().map(Path::new).and_then(Path::file_name);
    if program.is_some_and(|name| name == "metacontroller") {
        return true;
    }
    let Some(first) = args.get(1).and_then(|a| a.to_str()) else { return false };
    let clap_own = ["-h", "--help", "-V", "--version"];
    first.starts_with('-') && !clap_own.contains(&first)
}

/// Metacontroller's defaults, as settings of the hub.
#[must_use]
pub fn defaults() -> Config {
    let mut config = Config {
        metrics_address: ":9999".to_owned(),
        health_probe_address: Some(":8081".to_owned()),
        api_qps: 5.0,
        api_burst: 10,
        events_qps: 1.0 / 300.0,
        events_burst: 25,
        ..Config::default()
    };
    "metacontroller".clone_into(&mut config.leader_election.lease_name);
    config
}

/// Reads `args` (without the program name) over Metacontroller's defaults, and over `file` (a
/// `METAHOOK_CONFIG` file) if given.
pub fn parse(args: &[String], file: Option<&Path>) -> Result<Invocation, Refused> {
    let given = goflag::parse(args, |name| FLAGS.iter().find(|(n, _, _)| *n == name).map(|(_, kind, _)| *kind))?;
    let mut config = match file {
        Some(path) => defaults().overlaid_with_file(path)?,
        None => defaults(),
    };
    let mut kubeconfig = None;
    let mut notes = Vec::new();
    let mut zap = Zap::default();
    let mut dynamic_apply = true;
    for flag in &given {
        let value = flag.value.as_str();
        match flag.name.as_str() {
            "discovery-interval" => config.discovery_interval = positive_duration(flag)?,
            "cache-flush-interval" => config.cache_flush_interval = positive_duration(flag)?,
            "metrics-address" => config.metrics_address = address(value),
            "health-probe-bind-address" => config.health_probe_address = Some(address(value)),
            "pprof-address" => config.pprof_address = address(value),
            "client-go-qps" => {
                // client-go: 0 is its default, 5; a negative rate turns the limit off.
                let qps = float(flag)?;
                config.api_qps = if qps == 0.0 { 5.0 } else { qps.max(0.0) };
            }
            "client-go-burst" => config.api_burst = nonzero_or(count(flag)?, 10),
            "workers" => config.workers = usize::try_from(count(flag)?).unwrap_or(usize::MAX),
            "events-qps" => {
                // client-go's event correlator: 0 is its default, one per 5 minutes.
                let qps = float(flag)?;
                if qps < 0.0 {
                    return Err(flag.invalid("must not be negative").into());
                }
                config.events_qps = if qps == 0.0 { 1.0 / 300.0 } else { qps };
            }
            "events-burst" => config.events_burst = nonzero_or(count(flag)?, 25),
            "leader-election" => config.leader_election.enabled = value == "true",
            "leader-election-resource-lock" => {
                if value != "leases" {
                    return Err(flag
                        .invalid(
                            "only \"leases\" is supported: metahook's leader lock is a coordination.k8s.io/v1 Lease",
                        )
                        .into());
                }
            }
            "leader-election-namespace" => value.clone_into(&mut config.leader_election.lease_namespace),
            "leader-election-id" => {
                if value.is_empty() {
                    return Err(flag.invalid("must not be empty").into());
                }
                value.clone_into(&mut config.leader_election.lease_name);
            }
            "target-label-selector" => {
                crate::cache::selector::parse_selector_string(value).map_err(|e| flag.invalid(e.to_string()))?;
                value.clone_into(&mut config.target_label_selector);
            }
            "apply-strategy" => {
                dynamic_apply = match value {
                    "dynamic-apply" => true,
                    "server-side-apply" => false,
                    _ => return Err(flag.invalid("must be \"dynamic-apply\" or \"server-side-apply\"").into()),
                };
            }
            "apply-strategy-ssa-field-manager" => {
                if value.is_empty() {
                    return Err(flag.invalid("must not be empty").into());
                }
                // Metacontroller's manager, whose fields metahook takes over; metahook's own stays.
                if !config.take_over_field_managers.iter().any(|m| m == value) {
                    config.take_over_field_managers.push(value.to_owned());
                }
            }
            "kubeconfig" => kubeconfig = (!value.is_empty()).then(|| PathBuf::from(value)),
            _ => zap.set(flag)?,
        }
    }
    // Metacontroller's default too, so said whether the flag was given or not.
    if dynamic_apply {
        notes.push(
            "apply strategy dynamic-apply: metahook applies children with server-side apply instead, and on its \
             first write to each takes over the fields Metacontroller's dynamic apply or server-side apply left \
             (takeOverFieldManagers)"
                .to_owned(),
        );
    }
    if zap.stacktrace_level.is_some() {
        notes.push(
            "--zap-stacktrace-level has no effect: metahook's log lines carry their span fields (controller, object, \
             sync id) instead of a stack trace"
                .to_owned(),
        );
    }
    config.validate()?;
    let summary = summary(&config, zap.stacktrace_level.as_deref());
    Ok(Invocation { config, kubeconfig, logging: zap.logging(), notes, summary })
}

/// Go's `:port` stays as it is (the listener binds every address); `0` is off (empty).
fn address(value: &str) -> String {
    if value == "0" { String::new() } else { value.to_owned() }
}

fn positive_duration(flag: &Given) -> Result<Duration, FlagError> {
    match goflag::parse_duration(&flag.value) {
        Ok(d) if d.is_zero() => Err(flag.invalid("must be more than 0")),
        Ok(d) => Ok(d),
        Err(reason) => Err(flag.invalid(reason)),
    }
}

fn float(flag: &Given) -> Result<f64, FlagError> {
    match flag.value.parse::<f64>() {
        Ok(f) if f.is_finite() => Ok(f),
        Ok(_) => Err(flag.invalid("must be a finite number")),
        Err(e) => Err(flag.invalid(e.to_string())),
    }
}

fn count(flag: &Given) -> Result<u32, FlagError> {
    flag.value.parse::<u32>().map_err(|e| flag.invalid(format!("must be a whole number, 0 or more ({e})")))
}

fn nonzero_or(value: u32, default: u32) -> u32 {
    if value == 0 { default } else { value }
}

/// controller-runtime's zap flags.
#[derive(Debug, Default)]
struct Zap {
    devel: bool,
    encoder: Option<LogFormat>,
    /// An `EnvFilter` directive.
    level: Option<String>,
    stacktrace_level: Option<String>,
    time: Option<TimeFormat>,
}

impl Zap {
    fn set(&mut self, flag: &Given) -> Result<(), FlagError> {
        let lower = flag.value.to_ascii_lowercase();
        match flag.name.as_str() {
            "zap-devel" => self.devel = flag.value == "true",
            "zap-encoder" => {
                self.encoder = Some(match lower.as_str() {
                    "json" => LogFormat::Json,
                    "console" => LogFormat::Text,
                    _ => return Err(flag.invalid("must be json or console")),
                });
            }
            "zap-log-level" => {
                let filter = level_filter(&lower)
                    .ok_or_else(|| flag.invalid("must be debug, info, error, panic or an integer > 0"))?;
                self.level = Some(filter);
            }
            "zap-stacktrace-level" => {
                if !["info", "error", "panic"].contains(&lower.as_str()) {
                    return Err(flag.invalid("must be info, error or panic"));
                }
                self.stacktrace_level = Some(lower);
            }
            "zap-time-encoding" => {
                self.time = Some(match lower.as_str() {
                    "epoch" => TimeFormat::Epoch,
                    "millis" => TimeFormat::Millis,
                    "nano" | "nanos" => TimeFormat::Nanos,
                    "iso8601" => TimeFormat::Iso8601,
                    "rfc3339" => TimeFormat::Rfc3339,
                    "rfc3339nano" => TimeFormat::Rfc3339Nano,
                    _ => return Err(flag.invalid("must be epoch, millis, nano, iso8601, rfc3339 or rfc3339nano")),
                });
            }
            other => unreachable!("flag {other} is in FLAGS but not handled"),
        }
        Ok(())
    }

    /// controller-runtime's defaults: JSON at info level, or with `--zap-devel` text at debug level;
    /// RFC 3339 times. Without `--zap-log-level` (and not `--zap-devel`), `METAHOOK_LOG` still applies.
    fn logging(&self) -> Logging {
        let format = self.encoder.unwrap_or(if self.devel { LogFormat::Text } else { LogFormat::Json });
        let filter = self.level.clone().or_else(|| self.devel.then(|| "info,metahook=debug".to_owned()));
        Logging { format, filter, time: Some(self.time.unwrap_or(TimeFormat::Rfc3339)) }
    }
}

/// zap's level (Metacontroller logs API actions at 4, diffs at 5, hook bodies at 6) as a filter of
/// metahook's lines: debug holds what it does per sync and per API request, trace the finer detail.
/// Other crates' lines stay at info, as client-go's stay at klog's own verbosity in Metacontroller.
fn level_filter(level: &str) -> Option<String> {
    let filter = match level {
        "debug" => "info,metahook=debug",
        "info" => "info",
        "error" | "panic" => "error",
        number => match number.parse::<u32>().ok()? {
            0 => return None,
            1..=4 => "info,metahook=debug",
            _ => "info,metahook=trace",
        },
    };
    Some(filter.to_owned())
}

fn summary(config: &Config, stacktrace_level: Option<&str>) -> Vec<(&'static str, String)> {
    let election = &config.leader_election;
    let mut summary = vec![
        ("discovery-interval", goflag::format_duration(config.discovery_interval)),
        ("cache-flush-interval", goflag::format_duration(config.cache_flush_interval)),
        ("metrics-address", config.metrics_address.clone()),
        ("health-probe-bind-address", config.health_probe_address.clone().unwrap_or_default()),
        ("client-go-qps", config.api_qps.to_string()),
        ("client-go-burst", config.api_burst.to_string()),
        ("workers", config.workers.to_string()),
        ("events-qps", config.events_qps.to_string()),
        ("events-burst", config.events_burst.to_string()),
        ("pprof-address", config.pprof_address.clone()),
        ("leader-election", election.enabled.to_string()),
        ("leader-election-namespace", election.lease_namespace.clone()),
        ("leader-election-id", election.lease_name.clone()),
        ("target-label-selector", config.target_label_selector.clone()),
        ("take-over-field-managers", config.take_over_field_managers.join(",")),
    ];
    if let Some(level) = stacktrace_level {
        summary.push(("zap-stacktrace-level", level.to_owned()));
    }
    summary
}

/// `-help`: the flags, as Go's `flag` lists them.
#[must_use]
pub fn usage() -> String {
    let mut out = String::from(
        "Usage of metacontroller (metahook running Metacontroller's command line; `metahook --help` for its own):\n",
    );
    for (name, kind, help) in FLAGS {
        let value = if *kind == FlagKind::Value { " value" } else { "" };
        let _ = writeln!(out, "  -{name}{value}\n    \t{help}");
    }
    out
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // The rates compared are parsed or set exactly, not computed.
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn ok(list: &[&str]) -> Invocation {
        parse(&args(list), None).unwrap_or_else(|e| panic!("{list:?}: {e}"))
    }

    fn refused(list: &[&str]) -> String {
        match parse(&args(list), None) {
            Ok(_) => panic!("{list:?} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_charts_default_arguments_run_with_metacontrollers_defaults() {
        // deploy/helm/metacontroller values.yaml `commandArgs` (reference §7).
        let run = ok(&[
            "--zap-log-level=4",
            "--discovery-interval=20s",
            "--cache-flush-interval=30m",
            "--health-probe-bind-address=:8081",
        ]);
        let c = &run.config;
        assert_eq!(c.discovery_interval, Duration::from_secs(20));
        assert_eq!(c.cache_flush_interval, Duration::from_secs(1800));
        assert_eq!(c.health_probe_address.as_deref(), Some(":8081"));
        assert_eq!(c.metrics_address, ":9999");
        assert_eq!((c.api_qps, c.api_burst), (5.0, 10));
        assert_eq!(c.events_limit(), Some(crate::engine::events::Limit { qps: 1.0 / 300.0, burst: 25 }));
        assert_eq!(c.workers, 5);
        assert!(!c.leader_election.enabled);
        assert_eq!(c.leader_election.lease_name, "metacontroller");
        assert_eq!(c.take_over_field_managers, ["metacontroller"]);
        assert_eq!(c.field_manager, "metahook", "metahook's own field manager is unchanged");
        assert_eq!(
            run.logging,
            Logging {
                format: LogFormat::Json,
                filter: Some("info,metahook=debug".into()),
                time: Some(TimeFormat::Rfc3339)
            }
        );
        assert_eq!(run.kubeconfig, None);
        assert_eq!(run.notes.len(), 1, "{:?}", run.notes);
        assert!(run.notes[0].starts_with("apply strategy dynamic-apply"), "Metacontroller's default: {:?}", run.notes);
        assert!(run.summary.contains(&("discovery-interval", "20s".to_owned())), "{:?}", run.summary);
        assert!(run.summary.contains(&("cache-flush-interval", "30m0s".to_owned())), "{:?}", run.summary);
    }

    #[test]
    fn every_flag_lands_in_its_setting() {
        let run = ok(&[
            "-metrics-address=0",
            "--health-probe-bind-address",
            "127.0.0.1:18081",
            "--pprof-address=:6060",
            "--client-go-qps=50",
            "--client-go-burst=100",
            "--workers",
            "9",
            "--events-qps=2",
            "--events-burst=3",
            "--leader-election",
            "--leader-election-resource-lock=leases",
            "--leader-election-namespace=mc",
            "--leader-election-id=mc-lock",
            "--target-label-selector=shard=a",
            "--apply-strategy=server-side-apply",
            "--apply-strategy-ssa-field-manager=mc-ssa",
            "--kubeconfig=/k",
            "--zap-encoder=console",
            "--zap-time-encoding=epoch",
            "--zap-log-level=6",
        ]);
        let c = &run.config;
        assert_eq!(c.metrics_address, "", "0 turns metrics off");
        assert_eq!(c.health_probe_address.as_deref(), Some("127.0.0.1:18081"));
        assert_eq!(c.pprof_address, ":6060");
        assert_eq!((c.api_qps, c.api_burst, c.workers), (50.0, 100, 9));
        assert_eq!((c.events_qps, c.events_burst), (2.0, 3));
        let election = &c.leader_election;
        assert!(election.enabled);
        assert_eq!((election.lease_namespace.as_str(), election.lease_name.as_str()), ("mc", "mc-lock"));
        assert_eq!(c.target_label_selector, "shard=a");
        assert_eq!(c.take_over_field_managers, ["metacontroller", "mc-ssa"]);
        assert_eq!(run.kubeconfig, Some(PathBuf::from("/k")));
        assert_eq!(
            run.logging,
            Logging {
                format: LogFormat::Text,
                filter: Some("info,metahook=trace".into()),
                time: Some(TimeFormat::Epoch)
            }
        );
        assert!(run.notes.is_empty(), "server-side-apply needs no note: {:?}", run.notes);
    }

    #[test]
    fn client_go_and_correlator_zeros_mean_their_defaults() {
        let c = ok(&[
            "--client-go-qps=0",
            "--client-go-burst=0",
            "--events-qps=0",
            "--events-burst=0",
            "--health-probe-bind-address=0",
        ])
        .config;
        assert_eq!((c.api_qps, c.api_burst), (5.0, 10));
        assert_eq!((c.events_qps, c.events_burst), (1.0 / 300.0, 25));
        assert_eq!(c.health_probe_address.as_deref(), Some(""), "0 turns the probes off");
        let c = ok(&["--client-go-qps=-1"]).config;
        assert_eq!(c.client_limits().qps, 0.0, "a negative rate is client-go's way to turn the limit off");
    }

    #[test]
    fn logging_follows_controller_runtimes_defaults() {
        assert_eq!(ok(&[]).logging, Logging { format: LogFormat::Json, filter: None, time: Some(TimeFormat::Rfc3339) });
        let devel = ok(&["--zap-devel"]).logging;
        assert_eq!((devel.format, devel.filter.as_deref()), (LogFormat::Text, Some("info,metahook=debug")));
        let devel_json = ok(&["--zap-devel", "--zap-encoder=JSON", "--zap-log-level=info"]).logging;
        assert_eq!((devel_json.format, devel_json.filter.as_deref()), (LogFormat::Json, Some("info")));
        for (level, filter) in [
            ("debug", "info,metahook=debug"),
            ("1", "info,metahook=debug"),
            ("5", "info,metahook=trace"),
            ("error", "error"),
            ("panic", "error"),
        ] {
            assert_eq!(ok(&[&format!("--zap-log-level={level}")]).logging.filter.as_deref(), Some(filter), "{level}");
        }
        for (encoding, time) in [
            ("millis", TimeFormat::Millis),
            ("nanos", TimeFormat::Nanos),
            ("iso8601", TimeFormat::Iso8601),
            ("RFC3339Nano", TimeFormat::Rfc3339Nano),
        ] {
            assert_eq!(ok(&[&format!("--zap-time-encoding={encoding}")]).logging.time, Some(time));
        }
        let run = ok(&["--zap-stacktrace-level=error", "--apply-strategy=server-side-apply"]);
        assert_eq!(run.notes.len(), 1);
        assert!(run.notes[0].contains("--zap-stacktrace-level has no effect"), "{:?}", run.notes);
    }

    #[test]
    fn dynamic_apply_is_accepted_with_a_note() {
        let run = ok(&["--apply-strategy=server-side-apply", "--apply-strategy=dynamic-apply"]);
        assert_eq!(run.notes.len(), 1, "the last one given counts, as in Go");
        assert!(run.notes[0].contains("server-side apply") && run.notes[0].contains("takes over"), "{:?}", run.notes);
    }

    #[test]
    fn refusals_name_the_flag_and_the_value() {
        for (list, words) in [
            (&["--zap-log-level=4", "--no-such-flag"][..], &["--no-such-flag", "not defined"][..]),
            (
                &["--leader-election-resource-lock=configmapsleases"],
                &["--leader-election-resource-lock", "configmapsleases", "leases"],
            ),
            (&["--apply-strategy=client-side"], &["--apply-strategy", "client-side"]),
            (&["--discovery-interval=20"], &["--discovery-interval", "missing unit"]),
            (&["--discovery-interval=0s"], &["--discovery-interval", "more than 0"]),
            (&["--cache-flush-interval=-1m"], &["--cache-flush-interval", "negative"]),
            (&["--workers=-1"], &["--workers", "-1"]),
            (&["--workers=0"], &["workers", "at least 1"]),
            (&["--client-go-qps=fast"], &["--client-go-qps", "fast"]),
            (&["--events-qps=-1"], &["--events-qps", "negative"]),
            (&["--events-qps=NaN"], &["--events-qps", "finite"]),
            (&["--zap-log-level=0"], &["--zap-log-level", "\"0\""]),
            (&["--zap-log-level=verbose"], &["--zap-log-level", "verbose"]),
            (&["--zap-encoder=yaml"], &["--zap-encoder", "yaml"]),
            (&["--zap-stacktrace-level=debug"], &["--zap-stacktrace-level", "debug"]),
            (&["--zap-time-encoding=unix"], &["--zap-time-encoding", "unix"]),
            (&["--target-label-selector=a in b"], &["--target-label-selector", "a in b"]),
            (&["--leader-election-id="], &["--leader-election-id", "empty"]),
            (&["--leader-election=maybe"], &["--leader-election", "maybe"]),
            (&["--apply-strategy-ssa-field-manager="], &["--apply-strategy-ssa-field-manager", "empty"]),
            (&["--workers"], &["--workers", "needs an argument"]),
            (&["run"], &["\"run\"", "only flags"]),
        ] {
            let message = refused(list);
            for word in words {
                assert!(message.contains(word), "{list:?}: {message:?} does not say {word:?}");
            }
        }
        assert!(matches!(parse(&args(&["-help"]), None), Err(Refused::Flag(FlagError::Help))));
    }

    #[test]
    fn a_config_file_goes_between_metacontrollers_defaults_and_the_flags() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("metahook.yaml");
        std::fs::write(&file, "apiQPS: 100\nworkers: 3\nhookHosts: {\"a.b:80\": \"127.0.0.1:1\"}\n").unwrap();
        let c = parse(&args(&["--workers=4"]), Some(&file)).unwrap().config;
        assert_eq!(c.api_qps, 100.0, "the file's value");
        assert_eq!(c.api_burst, 10, "Metacontroller's default, which the file leaves");
        assert_eq!(c.workers, 4, "the flag wins");
        assert_eq!(c.hook_hosts.len(), 1);
    }

    #[test]
    fn started_as_metacontroller_or_with_flags_only() {
        let os = |list: &[&str]| list.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        assert!(wanted(&os(&["/usr/bin/metacontroller"])));
        assert!(wanted(&os(&["metacontroller", "--zap-log-level=4"])));
        assert!(wanted(&os(&["/metahook", "--zap-log-level=4"])));
        assert!(wanted(&os(&["/metahook", "-discovery-interval", "20s"])));
        assert!(!wanted(&os(&["/metahook", "run", "--workers=2"])));
        assert!(!wanted(&os(&["/metahook"])));
        assert!(!wanted(&os(&["/metahook", "--help"])));
        assert!(!wanted(&os(&["/metahook", "-V"])));
        assert!(!wanted(&os(&["/usr/bin/metacontroller-x", "render"])));
    }

    #[test]
    fn usage_lists_every_flag() {
        let usage = usage();
        for (name, _, _) in FLAGS {
            assert!(usage.contains(&format!("-{name}")), "{name}");
        }
    }
}
