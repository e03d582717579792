//! What `metahook status` reports, and its two renderings: an aligned table for a terminal, and a JSON
//! document (`-o json`) whose fields are always present (`null` when unknown), so scripts can rely on
//! its shape.

use std::fmt::Write as _;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

/// The whole report.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// CompositeControllers, then DecoratorControllers, each by name.
    pub controllers: Vec<ControllerReport>,
    /// Where the figures come from; `None` without `--metrics-url`.
    pub metrics: Option<MetricsSource>,
}

/// The replica whose `/metrics` were read.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MetricsSource {
    pub url: String,
    /// Seconds between the two scrapes the rates are measured over; `None`: one scrape, no rates.
    pub interval_seconds: Option<f64>,
    /// Whether the replica holds the leader Lease (only the leader runs controllers); `None` when it
    /// runs without leader election.
    pub leader: Option<bool>,
}

/// One controller.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerReport {
    /// `CompositeController` or `DecoratorController`.
    pub kind: String,
    pub name: String,
    pub ready: Ready,
    /// Parents (a DecoratorController's targets) its selectors select now; `None` when they could not
    /// be listed (see `problems`).
    pub parents: Option<usize>,
    pub syncs_per_minute: Option<f64>,
    /// Syncs that ended in an error since the replica started.
    pub errors: Option<u64>,
    pub errors_per_minute: Option<f64>,
    /// Over the replica's lifetime, every hook of the controller together.
    pub hook_latency_seconds: Latency,
    /// The latest Warning Event on one of its parents.
    pub last_error: Option<LastError>,
    /// What could not be read about it.
    pub problems: Vec<String>,
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
            rows.push([
                format!("{}/{}", c.kind.to_ascii_lowercase(), c.name),
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
            return "No --metrics-url: syncs/min, errors and hook latency unknown.\n".to_owned();
        };
        let rates = metrics
            .interval_seconds
            .map_or_else(|| "one scrape, no rates".to_owned(), |s| format!("syncs/min over {s:.0}s"));
        let leader = match metrics.leader {
            Some(true) => "; the leader",
            Some(false) => "; NOT the leader: it runs no controllers, point --metrics-url at the leader",
            None => "",
        };
        format!(
            "Metrics from {} ({rates}{leader}); errors since it started, hook latency over its lifetime.\n",
            metrics.url
        )
    }
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
            kind: "CompositeController".into(),
            name: "web".into(),
            ready: Ready { status: "True".into(), reason: "Running".into(), message: String::new() },
            parents: Some(3),
            syncs_per_minute: Some(12.0),
            errors: Some(4),
            errors_per_minute: Some(0.5),
            hook_latency_seconds: Latency { p50: Some(0.0042), p99: Some(0.035) },
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
            problems: Vec::new(),
        };
        let labels = ControllerReport {
            kind: "DecoratorController".into(),
            name: "labels".into(),
            ready: Ready { status: "False".into(), reason: "Forbidden".into(), message: "cannot list".into() },
            parents: None,
            syncs_per_minute: None,
            errors: None,
            errors_per_minute: None,
            hook_latency_seconds: Latency::default(),
            last_error: None,
            problems: vec!["cannot list its parents: listing v1/secrets: forbidden".into()],
        };
        Report {
            controllers: vec![web, labels],
            metrics: Some(MetricsSource {
                url: "http://127.0.0.1:9999/metrics".into(),
                interval_seconds: Some(10.0),
                leader: Some(true),
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
                "lastError": {"reason": "SyncError", "note": "Sync error: hook answered 500,\nbody: boom",
                              "parent": {"apiVersion": "example.com/v1", "kind": "Web", "namespace": "shop", "name": "front"},
                              "time": "2026-01-01T11:57:00Z"},
                "problems": []
            })
        );
        let labels = &json["controllers"][1];
        for field in ["parents", "syncsPerMinute", "errors", "errorsPerMinute", "lastError"] {
            assert!(labels.get(field).is_some_and(serde_json::Value::is_null), "{field}: {labels}");
        }
        assert_eq!(labels["hookLatencySeconds"], serde_json::json!({"p50": null, "p99": null}));
        assert_eq!(
            json["metrics"],
            serde_json::json!({"url": "http://127.0.0.1:9999/metrics", "intervalSeconds": 10.0, "leader": true})
        );
    }

    #[test]
    fn without_metrics_the_footer_says_so_and_a_follower_is_named() {
        let mut report = report();
        report.metrics = None;
        assert!(
            report.table(Timestamp::now()).ends_with("No --metrics-url: syncs/min, errors and hook latency unknown.\n")
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&report.json()).unwrap()["metrics"],
            serde_json::Value::Null
        );
        report.metrics = Some(MetricsSource { url: "u".into(), interval_seconds: None, leader: Some(false) });
        let footer = report.source();
        assert!(footer.contains("one scrape, no rates") && footer.contains("NOT the leader"), "{footer}");
    }

    #[test]
    fn latencies_and_ages_read_as_a_person_would_write_them() {
        assert_eq!([0.00085, 0.0042, 0.035, 1.25].map(seconds), ["850µs", "4.2ms", "35ms", "1.25s"]);
        assert_eq!([42, 300, 3 * 3600, 3 * 86400, -5].map(age), ["42s", "5m", "3h", "3d", "0s"]);
    }
}
