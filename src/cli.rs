//! Command line: `metahook run`, `metahook version`, `metahook crds`.
//!
//! This is the only place that uses `anyhow`: everything below it returns typed errors.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tracing::{error, info};

use crate::config::{Config, ConfigOverrides};

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
    Render(crate::render::RenderArgs),
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Kubeconfig file. Without it: `KUBECONFIG`, then `~/.kube/config`, then in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Configuration file (YAML); see `config/metahook.yaml` for every setting and its default.
    #[arg(long, env = "METAHOOK_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    overrides: ConfigOverrides,
}

/// Entry point of the binary.
#[must_use]
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("metahook {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Crds => {
            print!("{}", crate::crds::all_yaml());
            ExitCode::SUCCESS
        }
        Command::Render(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            let result = match runtime {
                Ok(rt) => rt.block_on(crate::render::render(&args)),
                Err(e) => Err(crate::render::RenderError::Setup(e.to_string())),
            };
            match result {
                Ok(report) => {
                    print!("{report}");
                    ExitCode::SUCCESS
                }
                Err(err @ crate::render::RenderError::Invalid(_)) => {
                    eprintln!("metahook render: {err}");
                    ExitCode::from(1)
                }
                Err(err) => {
                    eprintln!("metahook render: {err}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Run(args) => {
            init_tracing();
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build();
            let result = runtime.context("starting the async runtime").and_then(|rt| rt.block_on(run(args)));
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    error!("{err:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("METAHOOK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_target(false).init();
}

/// Builds a client from an explicit kubeconfig path, or infers one (env, home, in-cluster).
pub async fn client_for(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context("inferring Kubernetes config")?,
    };
    Client::try_from(config).context("building Kubernetes client")
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref(), &args.overrides)?;
    let client = client_for(args.kubeconfig.as_deref()).await?;
    let version = client.apiserver_version().await.context("asking the API server for its version")?;
    info!(server = %version.git_version, platform = %version.platform, "connected to Kubernetes");
    crate::manager::run(client, config).await?;
    Ok(())
}
