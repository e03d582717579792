//! `metahook status`: a terminal view of every controller for an operator — `Ready`, how many parents,
//! syncs per minute, errors, hook latency, and the last error with its parent.
//!
//! Two sources, each optional in what it adds: the API ([`cluster`]: conditions, parents, Events),
//! and a hub replica's `/metrics` ([`exposition`] reads the text, [`figures`] the numbers; a rate needs
//! two scrapes `--interval` apart). [`report`] renders the result as a table or as JSON.

pub mod cluster;
pub mod exposition;
pub mod figures;
pub mod report;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use http_body_util::BodyExt as _;
use kube::Client;

use self::figures::{Controller, Scrape};
use self::report::{ControllerReport, Latency, MetricsSource, Report};
use crate::cache::selector::parse_selector_string;

/// How long one scrape of `/metrics` may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// Arguments of `metahook status`.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// Kubeconfig file. Without it: `KUBECONFIG`, then `~/.kube/config`, then in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Only controllers whose labels match, e.g. `team=web` (the form of the hub's `targetLabelSelector`).
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// A hub replica's metrics, `http://HOST:PORT/metrics` (the leader's: only it runs controllers; e.g.
    /// through `kubectl port-forward`). Without it, syncs/min, errors and hook latency are unknown.
    #[arg(long, value_name = "URL")]
    pub metrics_url: Option<String>,
    /// Time between the two scrapes syncs/min is measured over (a Go duration); `0s` scrapes once, and
    /// the rates are unknown.
    #[arg(long, default_value = "10s", value_parser = interval)]
    pub interval: Duration,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// How the report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// An aligned table.
    Table,
    /// A JSON document.
    Json,
}

fn interval(text: &str) -> Result<Duration, String> {
    crate::api::parse_go_duration(text).ok_or_else(|| format!("{text:?} is not a duration such as 10s or 1m"))
}

/// Why no report could be made.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("--selector: {0}")]
    Selector(#[source] crate::cache::selector::SelectorError),
    #[error("connecting to the cluster: {0}")]
    Connect(String),
    #[error("listing {what}: {source}")]
    List {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("scraping {url}: {reason}")]
    Scrape { url: String, reason: String },
    #[error("reading {url}: {source}")]
    Exposition {
        url: String,
        #[source]
        source: exposition::ExpositionError,
    },
}

/// Entry point of `metahook status`: prints the report, exits 1 when it could not be made.
#[must_use]
pub fn main(args: &StatusArgs) -> ExitCode {
    let run = async {
        let client = crate::ops::client::client_for(args.kubeconfig.as_deref())
            .await
            .map_err(|e| StatusError::Connect(format!("{e:#}")))?;
        status(&client, args).await
    };
    let result = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(run),
        Err(e) => Err(StatusError::Connect(e.to_string())),
    };
    match result {
        Ok(report) => {
            match args.output {
                Format::Table => print!("{}", report.table(k8s_openapi::jiff::Timestamp::now())),
                Format::Json => print!("{}", report.json()),
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("metahook status: {e}");
            ExitCode::from(1)
        }
    }
}

/// The report on the cluster `client` talks to. The first scrape is taken before the API is read and
/// the second `interval` after the first, so reading the API does not add to the wait.
pub async fn status(client: &Client, args: &StatusArgs) -> Result<Report, StatusError> {
    let selector =
        parse_selector_string(args.selector.as_deref().unwrap_or_default()).map_err(StatusError::Selector)?;
    let started = Instant::now();
    let two_scrapes = !args.interval.is_zero();
    let first = match &args.metrics_url {
        Some(url) if two_scrapes => Some(scrape(url, started).await?),
        _ => None,
    };
    let observed = cluster::observe(client, &selector).await?;
    let last = match &args.metrics_url {
        Some(url) => {
            tokio::time::sleep_until((started + args.interval).into()).await;
            Some(scrape(url, started).await?)
        }
        None => None,
    };
    let metrics = args.metrics_url.as_ref().map(|url| MetricsSource {
        url: url.clone(),
        interval_seconds: first.as_ref().zip(last.as_ref()).map(|(f, l)| l.after.saturating_sub(f.after).as_secs_f64()),
        leader: last.as_ref().and_then(Scrape::leader),
    });
    let controllers = observed
        .into_iter()
        .map(|o| {
            let figures = last
                .as_ref()
                .map(|l| figures::figures(first.as_ref(), l, Controller { kind: o.kind, name: &o.name }))
                .unwrap_or_default();
            let mut problems = o.problems;
            let parents = match o.parents {
                Ok(parents) => Some(parents.len()),
                Err(reason) => {
                    problems.insert(0, format!("cannot list its parents: {reason}"));
                    None
                }
            };
            ControllerReport {
                kind: o.kind.to_owned(),
                name: o.name,
                ready: o.ready,
                parents,
                syncs_per_minute: figures.syncs_per_minute,
                errors: figures.errors,
                errors_per_minute: figures.errors_per_minute,
                hook_latency_seconds: Latency { p50: figures.hook_p50, p99: figures.hook_p99 },
                last_error: o.last_error,
                problems,
            }
        })
        .collect();
    Ok(Report { controllers, metrics })
}

/// One scrape of a replica's `/metrics` (plain HTTP, as the hub serves it), timed from `started`.
async fn scrape(url: &str, started: Instant) -> Result<Scrape, StatusError> {
    let failed = |reason: String| StatusError::Scrape { url: url.to_owned(), reason };
    let uri: http::Uri = url.parse().map_err(|e: http::uri::InvalidUri| failed(e.to_string()))?;
    if uri.scheme_str() != Some("http") {
        return Err(failed("only http:// URLs: the hub serves /metrics over plain HTTP".to_owned()));
    }
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let after = started.elapsed();
    let fetch = async {
        let response = client.get(uri).await.map_err(|e| failed(e.to_string()))?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| failed(e.to_string()))?.to_bytes();
        if !status.is_success() {
            return Err(failed(format!("answered {status}")));
        }
        String::from_utf8(body.to_vec()).map_err(|_| failed("the answer is not UTF-8 text".to_owned()))
    };
    let text = tokio::time::timeout(SCRAPE_TIMEOUT, fetch)
        .await
        .map_err(|_| failed(format!("no answer within {}s", SCRAPE_TIMEOUT.as_secs())))??;
    let samples = exposition::parse(&text).map_err(|source| StatusError::Exposition { url: url.to_owned(), source })?;
    Ok(Scrape { samples, after })
}
