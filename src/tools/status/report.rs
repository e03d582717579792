//! What `metahook status` reports, and its two renderings: an aligned table for a terminal, and a JSON
//! document (`-o json`) whose fields are always present (`null` when unknown), so scripts can rely on
//! its shape.

use std::fmt::Write as _;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::cache::shard::BUCKETS;

/// The whole report.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// CompositeControllers, then DecoratorControllers, each by name.
    pub controllers: Vec<ControllerReport>,
    /// Where the figures come from; `None` without `--metrics-url` or `--metrics-pods`.
    pub metrics: Option<Metrics>,
}

/// The replicas whose `/metrics` were read; every controller's figures are summed over those that
/// answered.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metrics {
    pub sources: Vec<MetricsSource>,
}

/// One replica's `/metrics`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MetricsSource {
    /// The URL given, or the API server path a Pod was read through (`--metrics-pods`).
    pub url: String,
    /// `namespace/name` of the Pod, when read through the API server.
    pub pod: Option<String>,
    /// Whether every scrape of it answered; when not, its figures count nowhere and `error` says why.
    pub answered: bool,
    pub error: Option<String>,
    /// Seconds between the two scrapes the rates are measured over; `None`: one scrape, no rates.
    pub interval_seconds: Option<f64>,
    /// Whether the replica holds the leader Lease (unsharded, only the leader runs controllers;
    /// sharded, it coordinates the ring); `None` when it runs without leader election.
    pub leader: Option<bool>,
    /// With sharding, the buckets of parents the replica holds (of 1024): its share of the syncs.
    pub shard_buckets: Option<u64>,
}

impl MetricsSource {
    /// A replica whose scrape did not answer.
    #[must_use]
    pub fn failed(url: String, pod: Option<String>, error: String) -> Self {
        Self {
            url,
            pod,
            answered: false,
            error: Some(error),
            interval_seconds: None,
            leader: None,
            shard_buckets: None,
        }
    }
}

/// One controller.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerReport {
    /// `CompositeController` or `DecoratorController`.
    pub kind: String,
    pub name: String,
    /// For a controller read from a file (`controllersFrom`) and not in the API: where, `<path> document
    /// <n>`, as the hub's metrics say (its `ready` is theirs too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    pub ready: Ready,
    /// Parents (a DecoratorController's targets) its selectors select now; `None` when they could not
    /// be listed (see `problems`), and for a controller read from a file.
    pub parents: Option<usize>,
    /// Summed over the replicas that answered, as are the errors.
    pub syncs_per_minute: Option<f64>,
    /// Syncs that ended in an error since each replica started.
    pub errors: Option<u64>,
    pub errors_per_minute: Option<f64>,
    /// Over the replicas' lifetimes, every hook of the controller together (their histograms summed).
    pub hook_latency_seconds: Latency,
    /// The share of each replica that runs it (has its series), by source `url`: with sharding, each
    /// syncs its own parents.
    pub by_source: Vec<SourceFigures>,
    /// The latest Warning Event on one of its parents.
    pub last_error: Option<LastError>,
    /// What whoever may create a parent can make its customize hook read through the hub (`None`: it
    /// has none, or it was read from a file).
    pub related: Option<String>,
    /// Who waits behind whom in its queue, by flow (the parents' namespaces), busiest first; empty when
    /// nothing waits or the metrics were not read.
    pub waiting: Vec<super::figures::FlowWait>,
    /// What could not be read about it.
    pub problems: Vec<String>,
}

/// One replica's share of a controller's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceFigures {
    pub url: String,
    pub syncs_per_minute: Option<f64>,
    pub errors: Option<u64>,
}

/// The controller's `Ready` condition as the hub last wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Ready {
    /// `True`, `False`, or `Unknown` when no hub has written the condition.
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// Hook call latency quantiles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Latency {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

/// A Warning Event on a parent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LastError {
    pub reason: String,
    pub note: String,
    pub parent: ParentRef,
    /// When it was last seen (RFC 3339).
    pub time: Option<String>,
}

/// A parent (or target) object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    pub api_version: String,
    pub kind: String,
    /// `None` for a cluster-scoped parent.
    pub namespace: Option<String>,
    pub name: String,
}

/// The longest note the table shows; JSON has it whole.
const NOTE_WIDTH: usize = 100;

#[cfg(test)]
impl ControllerReport {
    /// A controller in the tests' reports: `ready` and nothing measured, listed or said yet.
    pub(crate) fn bare(kind: &str, name: &str, ready: Ready) -> Self {
        Self {
            kind: kind.to_owned(),
            name: name.to_owned(),
            file: None,
            ready,
            parents: None,
            syncs_per_minute: None,
            errors: None,
            errors_per_minute: None,
            hook_latency_seconds: Latency::default(),
            by_source: Vec::new(),
            last_error: None,
            related: None,
            waiting: Vec::new(),
            problems: Vec::new(),
        }
    }
}

impl Report {
    /// The JSON document, pretty-printed.
    #[must_use]
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// The table: one line per controller, then what could not be read, then where the figures come
    /// from. Ages are counted to `now`.
    #[must_use]
    pub fn table(&self, now: Timestamp) -> String {
        let header = ["CONTROLLER", "READY", "PARENTS", "SYNCS/MIN", "ERRORS", "HOOK P50", "HOOK P99", "LAST ERROR"];
        let mut rows: Vec<[String; 8]> = vec![header.map(str::to_owned)];
        for c in &self.controllers {
            let ready = if c.ready.reason.is_empty() {
                c.ready.status.clone()
            } else {
                format!("{} ({})", c.ready.status, c.ready.reason)
            };
            let file = c.file.as_ref().map_or_else(String::new, |f| format!(" ({f})"));
            rows.push([
                format!("{}/{}{file}", c.kind.to_ascii_lowercase(), c.name),
                ready,
                c.parents.map_or_else(unknown, |n| n.to_string()),
                c.syncs_per_minute.map_or_else(unknown, |r| format!("{r:.1}")),
                c.errors.map_or_else(unknown, |n| n.to_string()),
                c.hook_latency_seconds.p50.map_or_else(unknown, seconds),
                c.hook_latency_seconds.p99.map_or_else(unknown, seconds),
                c.last_error.as_ref().map_or_else(unknown, |e| last_error(e, now)),
            ]);
        }
        let mut widths = [0; 8];
        for row in &rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in &rows {
            let mut line = String::new();
            for (i, (cell, width)) in row.iter().zip(widths).enumerate() {
                if i + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    let _ = write!(line, "{cell:width$}   ");
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        for c in &self.controllers {
            if !c.waiting.is_empty() {
                let flows: Vec<String> = c
                    .waiting
                    .iter()
                    .map(|f| {
                        let workers = if f.workers > 0 { format!(", {} syncing", f.workers) } else { String::new() };
                        let lines: Vec<String> =
                            f.lines.iter().map(|l| format!("{} {}", l.line, seconds(l.oldest_seconds))).collect();
                        let oldest = if lines.is_empty() { seconds(f.oldest_seconds) } else { lines.join(", ") };
                        format!("{} {} (oldest {oldest}{workers})", f.flow, f.waiting)
                    })
                    .collect();
                let _ = writeln!(out, "{}/{}: waiting: {}", c.kind.to_ascii_lowercase(), c.name, flows.join(", "));
            }
            if let Some(related) = &c.related {
                let _ = writeln!(
                    out,
                    "{}/{}: parents' authors may read {related} through its customize hook",
                    c.kind.to_ascii_lowercase(),
                    c.name
                );
            }
            for problem in &c.problems {
                let _ = writeln!(out, "{}/{}: {problem}", c.kind.to_ascii_lowercase(), c.name);
            }
        }
        out.push_str(&self.source());
        out
    }

    /// The footer that says where SYNCS/MIN, ERRORS and the latencies come from.
    fn source(&self) -> String {
        let Some(metrics) = &self.metrics else {
            return "No --metrics-url or --metrics-pods: syncs/min, errors and hook latency unknown.\n".to_owned();
        };
        let answered: Vec<&MetricsSource> = metrics.sources.iter().filter(|s| s.answered).collect();
        let rates = answered
            .iter()
            .filter_map(|s| s.interval_seconds)
            .reduce(f64::min)
            .map_or_else(|| "one scrape, no rates".to_owned(), |s| format!("syncs/min over {s:.0}s"));
        let mut out = String::new();
        if let [only] = metrics.sources.as_slice()
            && only.answered
        {
            let role = match (only.leader, only.shard_buckets) {
                (_, Some(held)) if held >= u64::from(BUCKETS) => "; holds every bucket of the ring".to_owned(),
                (_, Some(held)) => format!(
                    "; holds {held} of {BUCKETS} buckets: only its share of the syncs, give every replica's \
                     --metrics-url or --metrics-pods"
                ),
                (Some(true), None) => "; the leader".to_owned(),
                (Some(false), None) => {
                    "; NOT the leader: it runs no controllers, point --metrics-url at the leader".to_owned()
                }
                (None, None) => String::new(),
            };
            let _ = writeln!(
                out,
                "Metrics from {} ({rates}{role}); errors since it started, hook latency over its lifetime.",
                only.url
            );
            return out;
        }
        let _ = writeln!(
            out,
            "Metrics summed over the {} of {} replicas that answered ({rates}); errors since each started, hook \
             latency over their lifetimes:",
            answered.len(),
            metrics.sources.len()
        );
        let width = metrics.sources.iter().map(|s| s.url.chars().count()).max().unwrap_or(0);
        for s in &metrics.sources {
            let _ = writeln!(out, "  {:width$}   {}", s.url, role(s).trim_end());
        }
        let sharded: Vec<u64> = answered.iter().filter_map(|s| s.shard_buckets).collect();
        let held: u64 = sharded.iter().sum();
        if !sharded.is_empty() && held < u64::from(BUCKETS) {
            let _ = writeln!(
                out,
                "The replicas that answered hold {held} of {BUCKETS} buckets: the syncs of the others are missing."
            );
        } else if sharded.is_empty() && !answered.is_empty() && answered.iter().all(|s| s.leader == Some(false)) {
            out.push_str("None of them is the leader: a standby runs no controllers.\n");
        }
        out
    }
}

/// What one source is in the footer: its role, or why it did not answer.
fn role(source: &MetricsSource) -> String {
    if let Some(error) = &source.error {
        return format!("DID NOT ANSWER: {error}");
    }
    let pod = source.pod.as_ref().map(|p| format!("pod {p}; ")).unwrap_or_default();
    let role = match (source.leader, source.shard_buckets) {
        (Some(true), Some(held)) => format!("the leader, holds {held} buckets"),
        (_, Some(held)) => format!("holds {held} buckets"),
        (Some(true), None) => "the leader".to_owned(),
        (Some(false), None) => "a standby: runs no controllers".to_owned(),
        (None, None) => "no leader election".to_owned(),
    };
    pod + &role
}

fn unknown() -> String {
    "-".to_owned()
}

/// `850µs`, `4.2ms`, `35ms`, `1.25s`.
fn seconds(value: f64) -> String {
    if value < 0.001 {
        format!("{:.0}µs", value * 1e6)
    } else if value < 0.01 {
        format!("{:.1}ms", value * 1e3)
    } else if value < 1.0 {
        format!("{:.0}ms", value * 1e3)
    } else {
        format!("{value:.2}s")
    }
}

/// `SyncError on ns/name 3m ago: note`, the note on one line and cut at [`NOTE_WIDTH`].
fn last_error(e: &LastError, now: Timestamp) -> String {
    let parent = match &e.parent.namespace {
        Some(ns) => format!("{ns}/{}", e.parent.name),
        None => e.parent.name.clone(),
    };
    let age = e
        .time
        .as_deref()
        .and_then(|t| t.parse::<Timestamp>().ok())
        .map(|t| format!(" {} ago", age(now.duration_since(t).as_secs())))
        .unwrap_or_default();
    let note: String = e.note.split_whitespace().collect::<Vec<_>>().join(" ");
    let note = if note.chars().count() > NOTE_WIDTH {
        format!("{}…", note.chars().take(NOTE_WIDTH - 1).collect::<String>())
    } else {
        note
    };
    format!("{} on {parent}{age}: {note}", e.reason)
}

/// `42s`, `5m`, `3h`, `2d`, as kubectl shows ages.
fn age(seconds: i64) -> String {
    match seconds.max(0) {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let web = ControllerReport {
            file: None,
            kind: "CompositeController".into(),
            name: "web".into(),
            ready: Ready { status: "True".into(), reason: "Running".into(), message: String::new() },
            parents: Some(3),
            syncs_per_minute: Some(12.0),
            errors: Some(4),
            errors_per_minute: Some(0.5),
            hook_latency_seconds: Latency { p50: Some(0.0042), p99: Some(0.035) },
            by_source: vec![SourceFigures {
                url: "http://127.0.0.1:9999/metrics".into(),
                syncs_per_minute: Some(12.0),
                errors: Some(4),
            }],
            last_error: Some(LastError {
                reason: "SyncError".into(),
                note: "Sync error: hook answered 500,\nbody: boom".into(),
                parent: ParentRef {
                    api_version: "example.com/v1".into(),
                    kind: "Web".into(),
                    namespace: Some("shop".into()),
                    name: "front".into(),
                },
                time: Some("2026-01-01T11:57:00Z".into()),
            }),
            related: None,
            waiting: Vec::new(),
            problems: Vec::new(),
        };
        let ready = Ready { status: "False".into(), reason: "Forbidden".into(), message: "cannot list".into() };
        let labels = ControllerReport {
            problems: vec!["cannot list its parents: listing v1/secrets: forbidden".into()],
            ..ControllerReport::bare("DecoratorController", "labels", ready)
        };
        Report {
            controllers: vec![web, labels],
            metrics: Some(Metrics {
                sources: vec![MetricsSource {
                    url: "http://127.0.0.1:9999/metrics".into(),
                    pod: None,
                    answered: true,
                    error: None,
                    interval_seconds: Some(10.0),
                    leader: Some(true),
                    shard_buckets: None,
                }],
            }),
        }
    }

    #[test]
    fn the_table_aligns_columns_and_shows_unknowns_as_dashes() {
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let table = report().table(now);
        let expected = "\
CONTROLLER                   READY               PARENTS   SYNCS/MIN   ERRORS   HOOK P50   HOOK P99   LAST ERROR
compositecontroller/web      True (Running)      3         12.0        4        4.2ms      35ms       SyncError on shop/front 3m ago: Sync error: hook answered 500, body: boom
decoratorcontroller/labels   False (Forbidden)   -         -           -        -          -          -
decoratorcontroller/labels: cannot list its parents: listing v1/secrets: forbidden
Metrics from http://127.0.0.1:9999/metrics (syncs/min over 10s; the leader); errors since it started, hook latency over its lifetime.
";
        assert_eq!(table, expected, "\n{table}");
    }

    #[test]
    fn the_waiting_line_says_each_flows_oldest_wait_line_by_line() {
        use crate::tools::status::figures::{FlowWait, LineWait};
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let mut report = report();
        let line = |line: &str, oldest_seconds: f64| LineWait { line: line.into(), oldest_seconds };
        let lines = vec![line("change", 50.0), line("delay", 2.5)];
        report.controllers[0].waiting = vec![
            FlowWait { flow: "flood".into(), waiting: 9812, oldest_seconds: 50.0, lines, workers: 4 },
            FlowWait { flow: "team-a".into(), waiting: 1, oldest_seconds: 0.1, lines: Vec::new(), workers: 0 },
        ];
        let table = report.table(now);
        let expected = "compositecontroller/web: waiting: flood 9812 (oldest change 50.00s, delay 2.50s, 4 syncing), \
                        team-a 1 (oldest 100ms)\n";
        assert!(table.contains(expected), "a hub that says by line, and one that does not:\n{table}");
    }

    #[test]
    fn long_notes_are_cut_in_the_table_and_whole_in_json() {
        let mut report = report();
        let long = "x".repeat(300);
        report.controllers[0].last_error.as_mut().unwrap().note.clone_from(&long);
        let table = report.table("2026-01-01T12:00:00Z".parse().unwrap());
        assert!(table.contains(&format!(": {}…\n", "x".repeat(NOTE_WIDTH - 1))), "{table}");
        let json: serde_json::Value = serde_json::from_str(&report.json()).unwrap();
        assert_eq!(json["controllers"][0]["lastError"]["note"], long);
    }

    #[test]
    fn json_has_every_field_with_nulls_for_what_is_unknown() {
        let json: serde_json::Value = serde_json::from_str(&report().json()).unwrap();
        assert_eq!(
            json["controllers"][0],
            serde_json::json!({
                "kind": "CompositeController", "name": "web",
                "ready": {"status": "True", "reason": "Running", "message": ""},
                "parents": 3, "syncsPerMinute": 12.0, "errors": 4, "errorsPerMinute": 0.5,
                "hookLatencySeconds": {"p50": 0.0042, "p99": 0.035},
                "bySource": [{"url": "http://127.0.0.1:9999/metrics", "syncsPerMinute": 12.0, "errors": 4}],
                "lastError": {"reason": "SyncError", "note": "Sync error: hook answered 500,\nbody: boom",
                              "parent": {"apiVersion": "example.com/v1", "kind": "Web", "namespace": "shop", "name": "front"},
                              "time": "2026-01-01T11:57:00Z"},
                "related": null,
                "waiting": [],
                "problems": []
            })
        );
        let labels = &json["controllers"][1];
        for field in ["parents", "syncsPerMinute", "errors", "errorsPerMinute", "lastError", "related"] {
            assert!(labels.get(field).is_some_and(serde_json::Value::is_null), "{field}: {labels}");
        }
        assert_eq!(labels["hookLatencySeconds"], serde_json::json!({"p50": null, "p99": null}));
        assert_eq!(
            json["metrics"],
            serde_json::json!({"sources": [{"url": "http://127.0.0.1:9999/metrics", "pod": null, "answered": true,
                                            "error": null, "intervalSeconds": 10.0, "leader": true,
                                            "shardBuckets": null}]})
        );
    }

    #[test]
    fn without_metrics_the_footer_says_so_and_a_follower_is_named() {
        let mut report = report();
        report.metrics = None;
        assert!(
            report
                .table(Timestamp::now())
                .ends_with("No --metrics-url or --metrics-pods: syncs/min, errors and hook latency unknown.\n")
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&report.json()).unwrap()["metrics"],
            serde_json::Value::Null
        );
        let source = MetricsSource {
            url: "u".into(),
            pod: None,
            answered: true,
            error: None,
            interval_seconds: None,
            leader: Some(false),
            shard_buckets: None,
        };
        report.metrics = Some(Metrics { sources: vec![source] });
        let footer = report.source();
        assert!(footer.contains("one scrape, no rates") && footer.contains("NOT the leader"), "{footer}");
    }

    #[test]
    fn several_replicas_are_listed_with_their_roles_and_the_one_that_did_not_answer() {
        let mut report = report();
        let replica = |url: &str, leader: bool, held: u64| MetricsSource {
            url: url.into(),
            pod: None,
            answered: true,
            error: None,
            interval_seconds: Some(10.2),
            leader: Some(leader),
            shard_buckets: Some(held),
        };
        let down = MetricsSource::failed("http://c:9999/metrics".into(), None, "connection refused".into());
        report.metrics = Some(Metrics {
            sources: vec![
                replica("http://a:9999/metrics", true, 341),
                replica("http://b:9999/metrics", false, 342),
                down,
            ],
        });
        assert_eq!(
            report.source(),
            "\
Metrics summed over the 2 of 3 replicas that answered (syncs/min over 10s); errors since each started, hook latency over their lifetimes:
  http://a:9999/metrics   the leader, holds 341 buckets
  http://b:9999/metrics   holds 342 buckets
  http://c:9999/metrics   DID NOT ANSWER: connection refused
The replicas that answered hold 683 of 1024 buckets: the syncs of the others are missing.
"
        );
        // One sharded replica alone: its share only.
        report.metrics = Some(Metrics { sources: vec![replica("http://a:9999/metrics", false, 341)] });
        assert!(report.source().contains("; holds 341 of 1024 buckets: only its share"), "{}", report.source());
        // Unsharded standbys only.
        let mut standby = replica("http://b:9999/metrics", false, 0);
        standby.shard_buckets = None;
        report.metrics = Some(Metrics { sources: vec![standby.clone(), standby] });
        assert!(report.source().ends_with("None of them is the leader: a standby runs no controllers.\n"));
    }

    #[test]
    fn latencies_and_ages_read_as_a_person_would_write_them() {
        assert_eq!([0.00085, 0.0042, 0.035, 1.25].map(seconds), ["850µs", "4.2ms", "35ms", "1.25s"]);
        assert_eq!([42, 300, 3 * 3600, 3 * 86400, -5].map(age), ["42s", "5m", "3h", "3d", "0s"]);
    }
}
