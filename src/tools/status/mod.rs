//! `metahook status`: a terminal view of every controller for an operator — `Ready`, how many parents,
//! syncs per minute, errors, hook latency, and the last error with its parent.
//!
//! Two sources, each optional in what it adds: the API ([`cluster`]: conditions, parents, Events),
//! and the hub replicas' `/metrics` ([`sources`] says which, [`scrape`] reads them, [`exposition`] the
//! text, [`figures`] the numbers, summed over the replicas; a rate needs two scrapes `--interval`
//! apart). [`report`] renders the result as a table or as JSON.

pub mod cluster;
pub mod exposition;
pub mod figures;
pub mod report;
pub mod scrape;
pub mod sources;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures::future::join_all;
use kube::Client;

use self::figures::{Controller, Replica, Scrape};
use self::report::{ControllerReport, Latency, Metrics, MetricsSource, Ready, Report, SourceFigures};
use self::scrape::Scraper;
use self::sources::{PodSelector, Source};
use crate::cache::selector::parse_selector_string;

/// Exit code when the report was printed but a replica's metrics could not be read: its figures are
/// missing from the sums, which the report says.
pub const EXIT_PARTIAL: u8 = 2;

/// Arguments of `metahook status`.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// Kubeconfig file. Without it: `KUBECONFIG`, then `~/.kube/config`, then in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Only controllers whose labels match, e.g. `team=web` (the form of the hub's `targetLabelSelector`).
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// A hub replica's metrics, `http://HOST:PORT/metrics` or `https://…` (e.g. through `kubectl
    /// port-forward`); once per replica: the figures are summed over them. Unsharded, the leader's are
    /// enough (only it runs controllers); sharded, every replica syncs its share. Without it (or
    /// `--metrics-pods`), syncs/min, errors and hook latency are unknown.
    #[arg(long, value_name = "URL")]
    pub metrics_url: Vec<String>,
    /// The hub's Pods, `NAMESPACE/SELECTOR` (e.g. `metahook/app.kubernetes.io/name=metahook`): each is
    /// scraped through the API server's pod proxy, with the kubeconfig's credentials (`get` on
    /// `pods/proxy`). The proxy forwards no token: a hub with `metricsAuth: kubernetes` refuses it.
    #[arg(long, value_name = "NAMESPACE/SELECTOR", value_parser = sources::pod_selector)]
    pub metrics_pods: Option<PodSelector>,
    /// With `--metrics-pods`: the container port, by name or number.
    #[arg(long, value_name = "PORT", default_value = "metrics")]
    pub metrics_port: String,
    /// With `--metrics-pods`: `https` when the hub serves its metrics in HTTPS (`metricsCertDir`).
    #[arg(long, value_name = "SCHEME", default_value = "http", value_parser = ["http", "https"])]
    pub metrics_scheme: String,
    /// PEM file of the CA that signed the hub's metrics certificate, for `https://` URLs; without it,
    /// the system's roots.
    #[arg(long, value_name = "FILE")]
    pub metrics_ca: Option<PathBuf>,
    /// The name to verify the hub's certificate for, instead of each URL's host (through a
    /// port-forward to 127.0.0.1: the Service name the certificate names).
    #[arg(long, value_name = "NAME")]
    pub metrics_server_name: Option<String>,
    /// File holding a bearer token sent with every `--metrics-url` scrape, for a hub with
    /// `metricsAuth: kubernetes`: e.g. `<(kubectl create token NAME)` for a `ServiceAccount` allowed to
    /// get `/metrics`.
    #[arg(long, value_name = "FILE")]
    pub metrics_token_file: Option<PathBuf>,
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
    #[error("{0}")]
    Scraper(#[source] scrape::SetupError),
}

/// Entry point of `metahook status`: prints the report; exits 1 when it could not be made, and
/// [`EXIT_PARTIAL`] when a replica's metrics could not be read (the report names it).
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
            if report.metrics.iter().flat_map(|m| &m.sources).all(|s| s.answered) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_PARTIAL)
            }
        }
        Err(e) => {
            eprintln!("metahook status: {e}");
            ExitCode::from(1)
        }
    }
}

/// The report on the cluster `client` talks to. The first scrapes are taken before the API is read and
/// the second `interval` after the first, so reading the API does not add to the wait; every source is
/// scraped at once.
pub async fn status(client: &Client, args: &StatusArgs) -> Result<Report, StatusError> {
    let selector =
        parse_selector_string(args.selector.as_deref().unwrap_or_default()).map_err(StatusError::Selector)?;
    let scraper = Scraper::new(
        client.clone(),
        args.metrics_ca.as_deref(),
        args.metrics_server_name.as_deref(),
        args.metrics_token_file.as_deref(),
    )
    .map_err(StatusError::Scraper)?;
    let started = Instant::now();
    let mut sources: Vec<Source> = args.metrics_url.iter().cloned().map(Source::Url).collect();
    if let Some(pods) = &args.metrics_pods {
        sources.extend(sources::pods(client, pods, &args.metrics_scheme, &args.metrics_port).await);
    }
    let two_scrapes = !args.interval.is_zero();
    let first =
        if two_scrapes && !sources.is_empty() { scrape_all(&scraper, &sources, started).await } else { Vec::new() };
    let observed = cluster::observe(client, &selector).await?;
    let last = if sources.is_empty() {
        Vec::new()
    } else {
        tokio::time::sleep_until((started + args.interval).into()).await;
        scrape_all(&scraper, &sources, started).await
    };
    // A replica counts only when every scrape of it answered: half of its figures would mislead.
    let mut answered: Vec<(usize, Replica<'_>)> = Vec::new();
    let mut reports = Vec::new();
    for (index, source) in sources.iter().enumerate() {
        let before = first.get(index);
        let failure = before.and_then(|f| f.as_ref().err()).or_else(|| last[index].as_ref().err());
        let (url, pod) = (source.url().to_owned(), source.pod().map(str::to_owned));
        match (failure, &last[index]) {
            (None, Ok(now)) => {
                let before = before.and_then(|f| f.as_ref().ok());
                reports.push(MetricsSource {
                    url,
                    pod,
                    answered: true,
                    error: None,
                    interval_seconds: before.map(|f| now.after.saturating_sub(f.after).as_secs_f64()),
                    leader: now.leader(),
                    shard_buckets: now.shard_buckets(),
                });
                answered.push((index, Replica { first: before, last: now }));
            }
            (Some(error), _) | (None, Err(error)) => {
                reports.push(MetricsSource::failed(url, pod, error.to_string()));
            }
        }
    }
    let metrics = (!sources.is_empty()).then_some(Metrics { sources: reports });
    let replicas: Vec<Replica<'_>> = answered.iter().map(|(_, r)| *r).collect();
    let controllers = observed
        .into_iter()
        .map(|o| {
            let controller = Controller { kind: o.kind, name: &o.name };
            let figures = figures::total(&replicas, controller);
            let by_source = answered
                .iter()
                .filter_map(|(index, r)| {
                    let own = figures::figures(r.first, r.last, controller);
                    (own != figures::Figures::default()).then(|| SourceFigures {
                        url: sources[*index].url().to_owned(),
                        syncs_per_minute: own.syncs_per_minute,
                        errors: own.errors,
                    })
                })
                .collect();
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
                name: o.name.clone(),
                file: None,
                ready: o.ready,
                parents,
                syncs_per_minute: figures.syncs_per_minute,
                errors: figures.errors,
                errors_per_minute: figures.errors_per_minute,
                hook_latency_seconds: Latency { p50: figures.hook_p50, p99: figures.hook_p99 },
                by_source,
                last_error: o.last_error,
                related: o.related,
                waiting: figures::waiting(&replicas, controller),
                problems,
            }
        })
        .collect::<Vec<_>>();
    let mut controllers = controllers;
    controllers.extend(file_controllers(&replicas, &controllers));
    controllers.sort_by(|a, b| (&a.kind, &a.name).cmp(&(&b.kind, &b.name)));
    Ok(Report { controllers, metrics })
}

/// The controllers the replicas read from files (`metahook_file_controller_ready`) that are not in the
/// API (`listed`): their state is in the metrics only. A file controller refused because an object of
/// its name runs is left out (the object is listed).
fn file_controllers(replicas: &[Replica<'_>], listed: &[ControllerReport]) -> Vec<ControllerReport> {
    let mut found: std::collections::BTreeMap<(String, String), ControllerReport> = std::collections::BTreeMap::new();
    for sample in replicas.iter().flat_map(|r| &r.last.samples).filter(|s| s.name == figures::FILE_READY) {
        let (Some(kind), Some(name)) = (sample.label("kind"), sample.label("controller")) else { continue };
        let reason = sample.label("reason").unwrap_or_default();
        if reason == "NameInUse" || listed.iter().any(|c| c.kind == kind && c.name == name) {
            continue;
        }
        let controller = Controller { kind, name };
        let totals = figures::total(replicas, controller);
        let status = if sample.value >= 1.0 { "True" } else { "False" };
        let ready = Ready { status: status.to_owned(), reason: reason.to_owned(), message: String::new() };
        found.entry((kind.to_owned(), name.to_owned())).or_insert_with(|| ControllerReport {
            kind: kind.to_owned(),
            name: name.to_owned(),
            file: sample.label("file").map(str::to_owned),
            ready,
            parents: None,
            syncs_per_minute: totals.syncs_per_minute,
            errors: totals.errors,
            errors_per_minute: totals.errors_per_minute,
            hook_latency_seconds: Latency { p50: totals.hook_p50, p99: totals.hook_p99 },
            by_source: Vec::new(),
            last_error: None,
            related: None,
            waiting: Vec::new(),
            problems: Vec::new(),
        });
    }
    found.into_values().collect()
}

/// One scrape of every source at once, each timed from `started`.
async fn scrape_all(
    scraper: &Scraper,
    sources: &[Source],
    started: Instant,
) -> Vec<Result<Scrape, scrape::ScrapeError>> {
    join_all(sources.iter().map(|source| async move {
        let after = started.elapsed();
        scraper.scrape(source).await.map(|samples| Scrape { samples, after })
    }))
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(kind: &str, name: &str) -> ControllerReport {
        let ready = Ready { status: "True".into(), reason: String::new(), message: String::new() };
        ControllerReport { parents: Some(0), ..ControllerReport::bare(kind, name, ready) }
    }

    #[test]
    fn file_controllers_come_from_the_metrics_unless_the_api_has_them() {
        let text = "metahook_file_controller_ready{kind=\"CompositeController\",controller=\"web\",file=\"c/web.yaml document 1\",reason=\"Running\"} 1\n\
                    metahook_file_controller_ready{kind=\"CompositeController\",controller=\"db\",file=\"c/db.yaml document 1\",reason=\"ParentResourceNotFound\"} 0\n\
                    metahook_file_controller_ready{kind=\"CompositeController\",controller=\"api\",file=\"c/api.yaml document 1\",reason=\"NameInUse\"} 0\n\
                    metahook_file_controller_ready{kind=\"DecoratorController\",controller=\"listed\",file=\"c/l.yaml document 1\",reason=\"Running\"} 1\n";
        let scrape = Scrape { samples: exposition::parse(text).unwrap(), after: Duration::ZERO };
        let replicas = [Replica { first: None, last: &scrape }];
        let found = file_controllers(&replicas, &[report("DecoratorController", "listed")]);
        let names: Vec<_> =
            found.iter().map(|c| (c.name.as_str(), c.ready.status.as_str(), c.file.as_deref())).collect();
        assert_eq!(
            names,
            [("db", "False", Some("c/db.yaml document 1")), ("web", "True", Some("c/web.yaml document 1"))]
        );
        assert_eq!(found[0].ready.reason, "ParentResourceNotFound");
    }
}
