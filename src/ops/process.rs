//! The process's own metrics under the names every Prometheus client library gives them
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_virtual_memory_bytes`,
//! `process_open_fds`, `process_max_fds`, `process_start_time_seconds`), read from Linux's `/proc` when
//! scraped.
//!
//! A handful of small files read per scrape cost less than a crate for them, and nothing is kept between
//! scrapes. Elsewhere than on Linux (no `/proc/self`) the families are left out rather than reported
//! as zeros that would look like a measurement.

use std::path::Path;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// The families [`ProcessMetrics`] reports (on Linux).
pub const FAMILIES: [&str; 6] = [
    "process_cpu_seconds",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
];

/// One clock tick of the times in `/proc` (`USER_HZ` = 100 a second): fixed for user space on every
/// architecture Linux containers run on, which is why Prometheus' own `procfs` takes it as a constant too.
const TICK_MS: u64 = 10;

/// `ticks` of `/proc`'s clock as time.
fn ticks(ticks: u64) -> std::time::Duration {
    std::time::Duration::from_millis(ticks.saturating_mul(TICK_MS))
}

/// What `/proc` says of a process at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
struct Sample {
    /// User and system CPU time, seconds.
    cpu_seconds: f64,
    resident_bytes: u64,
    virtual_bytes: u64,
    open_fds: u64,
    /// The soft limit on open files; `None` when unlimited.
    max_fds: Option<u64>,
    /// Seconds since the Unix epoch.
    start_time: f64,
}

/// The `process_*` families, read from `/proc/self` at every scrape.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessMetrics;

impl Collector for ProcessMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(sample) = read(Path::new("/proc"), "self") else { return Ok(()) };
        let cpu = ConstCounter::new(sample.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            MetricType::Counter,
        )?)?;
        let gauges = [
            ("process_resident_memory_bytes", "Resident memory size in bytes.", Some(sample.resident_bytes)),
            ("process_virtual_memory_bytes", "Virtual memory size in bytes.", Some(sample.virtual_bytes)),
            ("process_open_fds", "Number of open file descriptors.", Some(sample.open_fds)),
            ("process_max_fds", "Maximum number of open file descriptors.", sample.max_fds),
        ];
        for (name, help, value) in gauges {
            let Some(value) = value else { continue };
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            gauge.encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
        }
        let start = ConstGauge::new(sample.start_time);
        start.encode(encoder.encode_descriptor(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            None,
            MetricType::Gauge,
        )?)
    }
}

/// Reads process `pid` (`self`, or a number) from the `/proc` at `proc`; `None` where there is none.
fn read(proc: &Path, pid: &str) -> Option<Sample> {
    let dir = proc.join(pid);
    let stat = parse_stat(&std::fs::read_to_string(dir.join("stat")).ok()?)?;
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    let boot = boot_time(&std::fs::read_to_string(proc.join("stat")).ok()?)?;
    let limits = std::fs::read_to_string(dir.join("limits")).ok()?;
    let open_fds = std::fs::read_dir(dir.join("fd")).ok()?.count();
    Some(Sample {
        cpu_seconds: ticks(stat.utime + stat.stime).as_secs_f64(),
        resident_bytes: status_kib(&status, "VmRSS")? * 1024,
        virtual_bytes: status_kib(&status, "VmSize")? * 1024,
        open_fds: u64::try_from(open_fds).unwrap_or(u64::MAX),
        max_fds: max_open_files(&limits),
        start_time: (std::time::Duration::from_secs(boot) + ticks(stat.starttime)).as_secs_f64(),
    })
}

/// The fields of `/proc/<pid>/stat` the families need, in clock ticks.
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    utime: u64,
    stime: u64,
    /// Since boot.
    starttime: u64,
}

/// `/proc/<pid>/stat`: fields 14 (utime), 15 (stime) and 22 (starttime), counted from 1. The command
/// name (field 2) is in parentheses and may hold spaces and parentheses itself, so fields are counted
/// from the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3.
    let field = |n: usize| fields.get(n - 3)?.parse().ok();
    Some(Stat { utime: field(14)?, stime: field(15)?, starttime: field(22)? })
}

/// The `btime` line of `/proc/stat`: when the system booted, seconds since the Unix epoch.
fn boot_time(text: &str) -> Option<u64> {
    text.lines().find_map(|line| line.strip_prefix("btime ")).and_then(|value| value.trim().parse().ok())
}

/// A `Key:   1234 kB` line of `/proc/<pid>/status`, in KiB.
fn status_kib(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|value| value.trim().strip_suffix("kB"))
        .and_then(|value| value.trim().parse().ok())
}

/// The soft limit of the `Max open files` line of `/proc/<pid>/limits`; `None` when unlimited.
fn max_open_files(text: &str) -> Option<u64> {
    let line = text.lines().find_map(|line| line.strip_prefix("Max open files"))?;
    line.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_past_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (metahook (x) y) S 1 4242 4242 0 -1 4194560 2212 0 0 0 250 75 0 0 20 0 9 0 \
                    123456 1052672000 7936 18446744073709551615 1 1 0 0 0 0 0 4096 17003 0 0 0 17 1 0 0";
        assert_eq!(parse_stat(stat), Some(Stat { utime: 250, stime: 75, starttime: 123_456 }));
        assert_eq!(parse_stat("4242 (cut short) S 1"), None);
    }

    #[test]
    fn status_limits_and_boot_time_lines_are_read() {
        let status = "Name:\tmetahook\nVmPeak:\t 1100000 kB\nVmSize:\t 1028000 kB\nVmRSS:\t   31744 kB\n";
        assert_eq!(status_kib(status, "VmRSS"), Some(31_744));
        assert_eq!(status_kib(status, "VmSize"), Some(1_028_000));
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max processes             unlimited            unlimited            processes\n\
                      Max open files            1024                 1048576              files\n";
        assert_eq!(max_open_files(limits), Some(1024));
        assert_eq!(max_open_files(&limits.replace("1024 ", "unlimited ")), None);
        assert_eq!(boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n"), Some(1_700_000_000));
    }

    #[test]
    fn this_process_reads_as_a_running_process() {
        let sample = read(Path::new("/proc"), "self").expect("tests run on Linux, with /proc");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        assert!(sample.start_time <= now + 1.0 && sample.start_time > now - 24.0 * 3600.0, "{sample:?}");
        assert!(sample.resident_bytes > 1 << 20 && sample.virtual_bytes >= sample.resident_bytes, "{sample:?}");
        assert!(sample.open_fds >= 3, "stdin, stdout, stderr at least: {sample:?}");
        assert!(sample.max_fds.is_none_or(|max| max >= sample.open_fds), "{sample:?}");
        assert!(sample.cpu_seconds >= 0.0, "{sample:?}");
    }

    #[test]
    fn every_family_is_encoded_with_one_sample() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessMetrics));
        let text = crate::ops::metrics::render(&registry);
        for family in FAMILIES {
            assert!(text.contains(&format!("# TYPE {family} ")), "{family} missing:\n{text}");
        }
        assert!(text.contains("process_cpu_seconds_total "), "{text}");
    }
}
