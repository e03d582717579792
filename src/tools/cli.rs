//! Command line: `metahook run`, `version`, `crds`, `render`, `rbac`, `migrate`, `status`, `diff` and `release`; and, started as
//! `metacontroller` or with flags only, Metacontroller's command line ([`crate::tools::metacontroller`]).
//!
//! This is the only place that uses `anyhow`: everything below it returns typed errors.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tracing::{error, info};

use crate::ops::config::{Config, ConfigOverrides};
use crate::ops::traces::Traces;
use crate::tools::goflag::FlagError;
use crate::tools::logs::{LogFormat, Logging};
use crate::tools::metacontroller::{self, Refused};

/// metahook: write Kubernetes controllers as small HTTP hooks in any language.
#[derive(Debug, Parser)]
#[command(name = "metahook", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the hub: watch CompositeControllers and drive every parent through its hooks.
    Run(RunArgs),
    /// Print the version of this binary.
    Version,
    /// Print the CustomResourceDefinitions metahook serves, as YAML.
    Crds,
    /// Run a CompositeController's or DecoratorController's hook on YAML fixtures, without a cluster, and show
    /// what the hub would do.
    Render(crate::tools::render::RenderArgs),
    /// Print the `ClusterRole` each controller in the files needs, labelled to be aggregated into the hub's
    /// (with `--namespaces`, a `Role` + `RoleBinding` in each namespace instead), and per namespace a
    /// `Role` + `RoleBinding` for the Secrets and `ConfigMap`s its hook credentials name.
    Rbac(RbacArgs),
    /// List what switching this cluster from Metacontroller to metahook would change (`--dry-run`).
    Migrate(crate::tools::migrate::MigrateArgs),
    /// Show each controller: Ready, parents, syncs/min, errors, hook latency, and the last error with its
    /// parent (from the API and, with `--metrics-url`, a hub replica's metrics).
    Status(crate::tools::status::StatusArgs),
    /// Preview, read-only, what a candidate hook would change in the cluster: per parent (a decorator's
    /// target), the children a sync would create, update (old → new), delete, adopt and release, the
    /// status (and a decorator's label) changes and refusals. Exit 2 when anything would be deleted,
    /// recreated or refused, 0 otherwise, 1 when no preview could be made.
    Diff(crate::tools::diff::DiffArgs),
    /// Let go of what deleted controllers hold — their finalizers on the objects they synced, their
    /// records of children elsewhere, then the hub's finalizer on them — as a starting hub would, without
    /// starting any controller; for a cluster where no hub runs. Exit 0 when every deleted controller is
    /// released, 1 when something still waits (each cause printed), 2 when it could not run.
    Release(crate::tools::release::ReleaseArgs),
}

#[derive(Debug, clap::Args)]
struct RbacArgs {
    /// YAML file(s) with CompositeControllers / DecoratorControllers (other objects are skipped); `-` reads
    /// standard input, and a `List` (`kubectl get compositecontrollers,decoratorcontrollers -o yaml`) is read
    /// item by item.
    #[arg(short = 'f', long = "filename")]
    files: Vec<String>,
    /// A type the customize hook selects as related (`apiVersion/resource`, e.g. `v1/configmaps`);
    /// repeatable. The hub only reads related objects.
    #[arg(long)]
    related: Vec<String>,
    /// Also print the hub's own base `ClusterRole` (its CRDs, Events, discovery).
    #[arg(long)]
    base: bool,
    /// The hub's service account (`namespace/name`), which the credential `RoleBindings` name. The default
    /// is the one `deploy/` installs.
    #[arg(long, value_name = "NAMESPACE/NAME", default_value = crate::tools::rbac::DEFAULT_SERVICE_ACCOUNT)]
    service_account: crate::tools::rbac::ServiceAccount,
    /// For a hub started with `--namespaces a,b`: each controller's grants as a `Role` + `RoleBinding` in
    /// each of these namespaces instead of a `ClusterRole` (the base role stays a `ClusterRole`).
    #[arg(long, value_delimiter = ',', value_name = "NAMESPACES")]
    namespaces: Vec<String>,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Kubeconfig file. Without it: `KUBECONFIG`, then `~/.kube/config`, then in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Configuration file (YAML); see `config/metahook.yaml` for every setting and its default.
    #[arg(long, env = "METAHOOK_CONFIG")]
    config: Option<PathBuf>,
    /// Log format (`METAHOOK_LOG` sets the level filter, e.g. `debug` or `metahook=debug`).
    #[arg(long, env = "METAHOOK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(flatten)]
    overrides: ConfigOverrides,
}

/// `metahook`'s command line as clap builds it, for the book's command-line reference
/// ([`crate::tools::reference::cli`]), which is generated from it.
#[must_use]
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Entry point of the binary.
#[must_use]
pub fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    if metacontroller::wanted(&args) {
        return metacontroller_main(&args[1..]);
    }
    let cli = Cli::parse_from(args);
    match cli.command {
        Command::Version => {
            println!("metahook {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Crds => {
            print!("{}", crate::tools::crds::all_yaml());
            ExitCode::SUCCESS
        }
        Command::Render(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            let result = match runtime {
                Ok(rt) => rt.block_on(crate::tools::render::render(&args)),
                Err(e) => Err(crate::tools::render::RenderError::Setup(e.to_string())),
            };
            match result {
                Ok(report) => {
                    print!("{report}");
                    ExitCode::SUCCESS
                }
                Err(err @ crate::tools::render::RenderError::Invalid(_)) => {
                    eprintln!("metahook render: {err}");
                    ExitCode::from(1)
                }
                Err(err) => {
                    eprintln!("metahook render: {err}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Rbac(args) => {
            if args.files.is_empty() && !args.base {
                eprintln!("metahook rbac: give -f FILE (controllers) and/or --base");
                return ExitCode::from(2);
            }
            let request = crate::tools::rbac::RbacRequest {
                files: args.files,
                related: args.related,
                base: args.base,
                hub: Some(args.service_account),
                namespaces: args.namespaces.into_iter().filter(|n| !n.is_empty()).collect(),
            };
            match crate::tools::rbac::render(&request) {
                Ok(yaml) => {
                    print!("{yaml}");
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("metahook rbac: {err}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Migrate(args) => crate::tools::migrate::main(&args),
        Command::Status(args) => crate::tools::status::main(&args),
        Command::Diff(args) => crate::tools::diff::main(&args),
        Command::Release(args) => crate::tools::release::main(&args),
        Command::Run(args) => {
            let logging = Logging { format: args.log_format, ..Logging::default() };
            let config = Config::load(args.config.as_deref(), &args.overrides).map_err(anyhow::Error::from);
            run_hub(args.kubeconfig, &logging, config, || {})
        }
    }
}

/// Metacontroller's command line (`args` without the program name): exit status 2 naming the flag when
/// it is refused, as Go's `flag` package exits.
fn metacontroller_main(args: &[OsString]) -> ExitCode {
    let args: Result<Vec<String>, _> = args.iter().map(|a| a.clone().into_string()).collect();
    let Ok(args) = args else {
        eprintln!("metacontroller: arguments must be UTF-8");
        return ExitCode::from(2);
    };
    let file = std::env::var_os("METAHOOK_CONFIG").map(PathBuf::from);
    let invocation = match metacontroller::parse(&args, file.as_deref()) {
        Ok(invocation) => invocation,
        Err(Refused::Flag(FlagError::Help)) => {
            print!("{}", metacontroller::usage());
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            eprintln!("metacontroller: {err}\nRun `metacontroller -help` for the flags it accepts.");
            return ExitCode::from(2);
        }
    };
    let metacontroller::Invocation { config, kubeconfig, logging, notes, summary } = invocation;
    let settings: Vec<String> = summary.iter().map(|(flag, value)| format!("{flag}={value:?}")).collect();
    let started = || {
        info!(
            version = env!("CARGO_PKG_VERSION"),
            "Configuration information (Metacontroller's command line): {}",
            settings.join(" ")
        );
        for note in &notes {
            info!("{note}");
        }
    };
    run_hub(kubeconfig, &logging, Ok(config), started)
}

/// The hub's async runtime. Its worker threads: `TOKIO_WORKER_THREADS` when set (Tokio reads it),
/// otherwise [`default_worker_threads`] of the CPUs this process may use (`available_parallelism`,
/// which counts a container's CPU limit).
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        builder.worker_threads(default_worker_threads(cpus));
    }
    builder.enable_all().build()
}

/// Half the CPUs, at least one (Tokio's own default is one per CPU). The hub's work is messages —
/// API requests, watch events, hook calls — each a few tens of microseconds of CPU, and one thread
/// carries about 700 parents' syncs a second, several times what an API server core takes
/// (`docs/src/sizing.md`). A second thread on a two-CPU node mostly wakes the first: measured on two
/// cores (bench/NOTES.md, 2026-12-04 and 2026-12-06), one thread used 11 % less CPU at the same speed.
/// On bigger nodes half leaves room for the API server or the hooks beside it.
fn default_worker_threads(cpus: usize) -> usize {
    cpus.div_ceil(2).max(1)
}

/// Runs the hub on a multi-threaded runtime until a signal stops it: installs the log writer — with the
/// trace exporter beside it when `config` names a collector — and calls `started` to log what goes
/// first; on the way out, sends the spans still batched. An error is logged and is exit status 1.
fn run_hub(
    kubeconfig: Option<PathBuf>,
    logging: &Logging,
    config: anyhow::Result<Config>,
    started: impl FnOnce(),
) -> ExitCode {
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(e) => {
            crate::tools::logs::init(logging, None);
            error!("starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let traces = {
        // The exporter's batch processor is a task on the runtime.
        let _entered = runtime.enter();
        match &config {
            Ok(config) if config.tracing.enabled() => Traces::start(&config.tracing.otlp_endpoint).map(Some),
            _ => Ok(None),
        }
    };
    let (traces, config) = match traces {
        Ok(traces) => (traces, config),
        Err(e) => (None, Err(e.into())),
    };
    crate::tools::logs::init(logging, traces.as_ref());
    started();
    let result = config.and_then(|config| runtime.block_on(run(kubeconfig, config)));
    if let Some(traces) = traces {
        runtime.block_on(traces.shutdown());
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(kubeconfig: Option<PathBuf>, config: Config) -> anyhow::Result<()> {
    let client = crate::ops::client::client_for(kubeconfig.as_deref()).await?;
    let version = client.apiserver_version().await.context("asking the API server for its version")?;
    info!(server = %version.git_version, platform = %version.platform, "connected to Kubernetes");
    crate::ops::run::run(client, config).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::default_worker_threads;

    #[test]
    fn half_the_cpus_at_least_one_drive_the_hub() {
        let threads: Vec<usize> = [1, 2, 3, 4, 16].into_iter().map(default_worker_threads).collect();
        assert_eq!(threads, [1, 1, 2, 2, 8]);
    }
}
