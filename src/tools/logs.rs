//! How the hub's log lines are written: the format (`metahook run --log-format`, Metacontroller's
//! `--zap-encoder`), the level filter (`METAHOOK_LOG`, Metacontroller's `--zap-log-level`) and the
//! timestamp (Metacontroller's `--zap-time-encoding`); and, beside them in the process's one
//! subscriber, the trace exporter ([`crate::ops::traces`]) when there is one.

use std::fmt::Write as _;
use std::io::IsTerminal as _;

use k8s_openapi::jiff::Timestamp;
use tracing::Subscriber;
use tracing_subscriber::Layer as _;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::ops::traces::Traces;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event, with the span fields (controller, object, sync id) in front.
    #[default]
    Text,
    /// One JSON object per line, with the current span's fields and the span list.
    Json,
}

/// How a line's time is written: zap's time encoders, by the names `--zap-time-encoding` gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeFormat {
    /// Seconds since the Unix epoch, with a fraction (`1700000000.123456`).
    Epoch,
    /// Milliseconds since the Unix epoch, with a fraction.
    Millis,
    /// Nanoseconds since the Unix epoch.
    Nanos,
    /// ISO 8601 with milliseconds and the offset (`2023-11-14T22:13:20.123+0000`).
    Iso8601,
    /// RFC 3339 to the second (`2023-11-14T22:13:20Z`).
    Rfc3339,
    /// RFC 3339 with nanoseconds, trailing zeros dropped.
    Rfc3339Nano,
}

impl TimeFormat {
    /// `time` as this format writes it.
    #[must_use]
    pub fn render(self, time: Timestamp) -> String {
        let nanos = time.as_nanosecond();
        match self {
            Self::Epoch => seconds_with_fraction(nanos, 1_000_000_000),
            Self::Millis => seconds_with_fraction(nanos, 1_000_000),
            Self::Nanos => nanos.to_string(),
            Self::Iso8601 => time.strftime("%Y-%m-%dT%H:%M:%S%.3f%z").to_string(),
            Self::Rfc3339 => time.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            Self::Rfc3339Nano => time.to_string(),
        }
    }
}

/// `nanos / unit` as a decimal, to the nanosecond, trailing zeros dropped.
fn seconds_with_fraction(nanos: i128, unit: i128) -> String {
    let (whole, fraction) = (nanos.div_euclid(unit), nanos.rem_euclid(unit));
    let mut out = whole.to_string();
    if fraction != 0 {
        let width = unit.to_string().len() - 1;
        let _ = write!(out, ".{}", format!("{fraction:0width$}").trim_end_matches('0'));
    }
    out
}

/// The log settings of one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Logging {
    pub format: LogFormat,
    /// An `EnvFilter` directive (`info`, `info,metahook=debug`); `None`: `METAHOOK_LOG`, else `info`.
    pub filter: Option<String>,
    /// `None`: tracing's own (RFC 3339 with microseconds).
    pub time: Option<TimeFormat>,
}

struct Timer(Option<TimeFormat>);

impl FormatTime for Timer {
    fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
        match self.0 {
            Some(format) => w.write_str(&format.render(Timestamp::now())),
            None => tracing_subscriber::fmt::time::SystemTime.format_time(w),
        }
    }
}

/// Installs the process's subscriber: the log writer (to stdout) and, with `traces`, the trace
/// exporter beside it.
pub fn init(logging: &Logging, traces: Option<&Traces>) {
    subscriber(
        logging,
        traces,
        colours(std::io::stdout().is_terminal(), std::env::var_os("NO_COLOR")),
        std::io::stdout,
    )
    .init();
}

/// Whether text lines get the terminal's colour codes: only for a person at a terminal who has not
/// set `NO_COLOR` (no-color.org). In a Pod (`kubectl logs`), a file or a pipe, the codes would sit
/// between every field's name and its value, and `grep 'controller=greeter'` would find nothing.
fn colours(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// The log writer as `logging` sets it up, writing to `writer`, with the trace exporter's layer when
/// there is one. The log writer leaves out the spans only traces need ([`crate::TRACE_SPANS`]), so a
/// line's span (the JSON log's `span`) stays the sync's, whatever call or write it happened in.
fn subscriber<W>(
    logging: &Logging,
    traces: Option<&Traces>,
    ansi: bool,
    writer: W,
) -> impl Subscriber + Send + Sync + use<W>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = match &logging.filter {
        Some(directive) => tracing_subscriber::EnvFilter::new(directive),
        None => tracing_subscriber::EnvFilter::try_from_env("METAHOOK_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    let trace_only = format!("{}=off", crate::TRACE_SPANS).parse().expect("a well-formed directive");
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi)
        .with_target(false)
        .with_timer(Timer(logging.time));
    let layer = match logging.format {
        LogFormat::Text => layer.boxed(),
        LogFormat::Json => layer.json().with_current_span(true).with_span_list(false).flatten_event(true).boxed(),
    };
    tracing_subscriber::registry()
        .with(layer.with_filter(filter.add_directive(trace_only)))
        .with(traces.map(Traces::layer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_written_as_zap_writes_them() {
        let time = Timestamp::new(1_700_000_000, 123_456_000).unwrap();
        assert_eq!(TimeFormat::Epoch.render(time), "1700000000.123456");
        assert_eq!(TimeFormat::Millis.render(time), "1700000000123.456");
        assert_eq!(TimeFormat::Nanos.render(time), "1700000000123456000");
        assert_eq!(TimeFormat::Iso8601.render(time), "2023-11-14T22:13:20.123+0000");
        assert_eq!(TimeFormat::Rfc3339.render(time), "2023-11-14T22:13:20Z");
        assert_eq!(TimeFormat::Rfc3339Nano.render(time), "2023-11-14T22:13:20.123456Z");
        let whole = Timestamp::new(1_700_000_000, 0).unwrap();
        assert_eq!(TimeFormat::Epoch.render(whole), "1700000000");
        assert_eq!(TimeFormat::Rfc3339Nano.render(whole), "2023-11-14T22:13:20Z");
    }

    /// Where a test's log lines go.
    #[derive(Clone, Default)]
    struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What `format` writes for a line logged inside a hook call's trace-only span inside a sync.
    fn line_in_a_hook_call(format: LogFormat, ansi: bool) -> String {
        let lines = Lines::default();
        let writer = lines.clone();
        let logging = Logging { format, filter: Some("info".into()), time: None };
        tracing::subscriber::with_default(subscriber(&logging, None, ansi, move || writer.clone()), || {
            let sync = tracing::info_span!("sync", controller = "greeter", sync_id = 7);
            let _sync = sync.enter();
            let hook = tracing::info_span!(target: crate::TRACE_SPANS, "hook", url.path = "/sync");
            let _hook = hook.enter();
            tracing::info!("inside");
        });
        String::from_utf8(lines.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn a_log_line_names_its_sync_not_the_trace_only_span_it_is_in() {
        let text = line_in_a_hook_call(LogFormat::Text, false);
        assert!(text.contains("sync{controller=\"greeter\" sync_id=7}: inside"), "{text}");
        assert!(!text.contains("hook"), "{text}");
        let json: serde_json::Value = serde_json::from_str(line_in_a_hook_call(LogFormat::Json, false).trim()).unwrap();
        assert_eq!(json["span"]["name"], "sync", "{json}");
        assert_eq!(json["span"]["sync_id"], 7, "{json}");
    }

    #[test]
    fn colours_only_at_a_terminal_without_no_color() {
        assert!(colours(true, None));
        assert!(colours(true, Some("".into())), "an empty NO_COLOR is unset (no-color.org)");
        assert!(!colours(true, Some("1".into())));
        assert!(!colours(false, None), "a Pod's log, a file, a pipe");
        // Colours are what the choice switches: codes between a field's name and its value, or none.
        let coloured = line_in_a_hook_call(LogFormat::Text, true);
        assert!(coloured.contains('\x1b'), "{coloured:?}");
        let plain = line_in_a_hook_call(LogFormat::Text, false);
        assert!(!plain.contains('\x1b') && plain.contains("sync_id=7"), "{plain:?}");
    }
}
