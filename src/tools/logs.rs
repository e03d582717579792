//! How the hub's log lines are written: the format (`metahook run --log-format`, Metacontroller's
//! `--zap-encoder`), the level filter (`METAHOOK_LOG`, Metacontroller's `--zap-log-level`) and the
//! timestamp (Metacontroller's `--zap-time-encoding`).

use std::fmt::Write as _;

use k8s_openapi::jiff::Timestamp;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;

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

/// Installs the process's log subscriber.
pub fn init(logging: &Logging) {
    let filter = match &logging.filter {
        Some(directive) => tracing_subscriber::EnvFilter::new(directive),
        None => tracing_subscriber::EnvFilter::try_from_env("METAHOOK_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false).with_timer(Timer(logging.time));
    match logging.format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(false).flatten_event(true).init(),
    }
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
}
