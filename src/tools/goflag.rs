//! Go's command-line syntax, for a hub started with Metacontroller's arguments ([`super::metacontroller`]):
//! the `flag` package's rules for where a flag and its value are, and `time.ParseDuration`'s durations.
//!
//! Only the syntax is here; which flags exist and what they mean is the caller's [`FlagKind`] lookup.

use std::time::Duration;

/// Whether a flag takes a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagKind {
    /// `-flag` alone means true; a value only as `-flag=false` (never the next argument).
    Bool,
    /// `-flag=value` or `-flag value`.
    Value,
}

/// Why a command line was not accepted. Go's `flag` exits with status 2 for all of them but help
/// (status 0); the messages are Go's, naming the flag.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    #[error("help requested")]
    Help,
    #[error("flag provided but not defined: {0}")]
    Unknown(String),
    #[error("bad flag syntax: {0}")]
    Syntax(String),
    #[error("flag needs an argument: {0}")]
    MissingValue(String),
    #[error("invalid boolean value {value:?} for {flag}")]
    Bool { flag: String, value: String },
    #[error("invalid value {value:?} for flag {flag}: {reason}")]
    Invalid { flag: String, value: String, reason: String },
    #[error("unexpected argument {0:?}: only flags are accepted (Go's flag package would ignore it and all after it)")]
    Positional(String),
}

/// One flag as it was given: its name (without dashes), how it was written (for messages), and its
/// value (`"true"` for a bare boolean flag).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Given {
    pub name: String,
    pub written: String,
    pub value: String,
}

impl Given {
    /// An [`FlagError::Invalid`] for this flag's value.
    #[must_use]
    pub fn invalid(&self, reason: impl Into<String>) -> FlagError {
        FlagError::Invalid { flag: self.written.clone(), value: self.value.clone(), reason: reason.into() }
    }
}

/// Splits `args` (without the program name) into flags as Go's `flag.FlagSet.Parse` does: `-flag` and
/// `--flag` alike, `-flag=value` and `-flag value` for a flag that takes a value (the next argument is
/// its value even when it starts with `-`), `-flag` or `-flag=true|false|1|0|t|f|...` for a boolean.
/// `--` ends the flags. `-h`/`-help` (unless defined) is [`FlagError::Help`].
///
/// Go stops at the first argument that is not a flag and leaves it and the rest to the program,
/// which for Metacontroller means silently ignoring them, flags after it included. That hides
/// mistakes, so an argument that is not a flag is an error here.
pub fn parse(args: &[String], kind_of: impl Fn(&str) -> Option<FlagKind>) -> Result<Vec<Given>, FlagError> {
    let mut given = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            return match rest.next() {
                Some(positional) => Err(FlagError::Positional(positional.clone())),
                None => Ok(given),
            };
        }
        let Some(body) = arg.strip_prefix('-').filter(|_| arg.len() >= 2) else {
            return Err(FlagError::Positional(arg.clone()));
        };
        let body = body.strip_prefix('-').unwrap_or(body);
        if body.is_empty() || body.starts_with('-') || body.starts_with('=') {
            return Err(FlagError::Syntax(arg.clone()));
        }
        let (name, inline) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (body, None),
        };
        let written = arg.split_once('=').map_or(arg.as_str(), |(flag, _)| flag).to_owned();
        let Some(kind) = kind_of(name) else {
            if name == "h" || name == "help" {
                return Err(FlagError::Help);
            }
            return Err(FlagError::Unknown(written));
        };
        let value = match (kind, inline) {
            (FlagKind::Bool, None) => "true".to_owned(),
            (FlagKind::Bool, Some(value)) => match parse_bool(value) {
                Some(b) => b.to_string(),
                None => return Err(FlagError::Bool { flag: written, value: value.to_owned() }),
            },
            (FlagKind::Value, Some(value)) => value.to_owned(),
            (FlagKind::Value, None) => match rest.next() {
                Some(value) => value.clone(),
                None => return Err(FlagError::MissingValue(written)),
            },
        };
        given.push(Given { name: name.to_owned(), written, value });
    }
    Ok(given)
}

/// Go's `strconv.ParseBool`.
#[must_use]
pub fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `time.ParseDuration`, for durations that are not negative: a sequence of decimal numbers, each
/// with an optional fraction and a unit (`ns`, `us`/`µs`/`μs`, `ms`, `s`, `m`, `h`), such as `300ms`,
/// `1.5h` or `2h45m`; `0` needs no unit. Computed in whole nanoseconds as Go does, with Go's bound
/// (about 292 years).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let invalid = || format!("invalid duration {text:?}");
    let negative = text.starts_with('-');
    let mut s = text.strip_prefix(['+', '-']).unwrap_or(text);
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !s.is_empty() {
        let whole_len = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (whole, after) = s.split_at(whole_len);
        let (fraction, after) = match after.strip_prefix('.') {
            Some(after) => after.split_at(after.find(|c: char| !c.is_ascii_digit()).unwrap_or(after.len())),
            None => ("", after),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(invalid());
        }
        let unit_len = after.find(|c: char| c == '.' || c.is_ascii_digit()).unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let nanos_per_unit: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("missing unit in duration {text:?}")),
            other => return Err(format!("unknown unit {other:?} in duration {text:?}")),
        };
        let whole: u128 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| invalid())? };
        let mut part = whole.checked_mul(nanos_per_unit).ok_or_else(invalid)?;
        // Fraction digits past the 18th add less than a nanosecond even to hours; Go drops them too.
        let mut scale = 1_u128;
        let mut digits = 0_u128;
        for d in fraction.bytes().take(18) {
            digits = digits * 10 + u128::from(d - b'0');
            scale *= 10;
        }
        part += digits * nanos_per_unit / scale;
        total = total.checked_add(part).ok_or_else(invalid)?;
        if total > u128::from(i64::MAX.unsigned_abs()) {
            return Err(invalid());
        }
        s = after;
    }
    if negative && total > 0 {
        return Err(format!("invalid duration {text:?}: must not be negative"));
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| invalid())?;
    let nanos = u32::try_from(total % 1_000_000_000).map_err(|_| invalid())?;
    Ok(Duration::new(secs, nanos))
}

/// A duration the way Go prints it (`time.Duration.String`): `20s`, `30m0s`, `1h30m0s`, `500ms`.
#[must_use]
pub fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_owned();
    }
    if d < Duration::from_secs(1) {
        let nanos = d.as_nanos();
        return if nanos < 1_000 {
            format!("{nanos}ns")
        } else if nanos < 1_000_000 {
            format!("{}µs", trim(nanos, 1_000))
        } else {
            format!("{}ms", trim(nanos, 1_000_000))
        };
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let seconds = trim(u128::from(s) * 1_000_000_000 + u128::from(d.subsec_nanos()), 1_000_000_000);
    match (h, m) {
        (0, 0) => format!("{seconds}s"),
        (0, m) => format!("{m}m{seconds}s"),
        (h, m) => format!("{h}h{m}m{seconds}s"),
    }
}

/// `value / unit` with its fraction, trailing zeros dropped: `trim(1_500, 1_000)` = `1.5`.
fn trim(value: u128, unit: u128) -> String {
    let (whole, fraction) = (value / unit, value % unit);
    if fraction == 0 {
        return whole.to_string();
    }
    let width = unit.to_string().len() - 1;
    let fraction = format!("{fraction:0width$}");
    format!("{whole}.{}", fraction.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn kinds(name: &str) -> Option<FlagKind> {
        match name {
            "on" | "leader-election" => Some(FlagKind::Bool),
            "workers" | "address" => Some(FlagKind::Value),
            _ => None,
        }
    }

    fn pairs(given: &[Given]) -> Vec<(&str, &str)> {
        given.iter().map(|g| (g.name.as_str(), g.value.as_str())).collect()
    }

    #[test]
    fn every_spelling_go_accepts_is_accepted() {
        let given =
            parse(&args(&["-workers=3", "--workers", "4", "-workers", "5", "--workers=6", "--address=:8081"]), kinds)
                .unwrap();
        assert_eq!(
            pairs(&given),
            [("workers", "3"), ("workers", "4"), ("workers", "5"), ("workers", "6"), ("address", ":8081")]
        );
    }

    #[test]
    fn booleans_are_bare_or_given_with_equals_only() {
        let given = parse(&args(&["--on", "-leader-election=false", "--on=T", "--on=0"]), kinds).unwrap();
        assert_eq!(pairs(&given), [("on", "true"), ("leader-election", "false"), ("on", "true"), ("on", "false")]);
        let err = parse(&args(&["--on=yes"]), kinds).unwrap_err();
        assert_eq!(err, FlagError::Bool { flag: "--on".into(), value: "yes".into() });
        // `--on false` is the flag and then a positional argument, as in Go.
        assert_eq!(parse(&args(&["--on", "false"]), kinds).unwrap_err(), FlagError::Positional("false".into()));
    }

    #[test]
    fn the_next_argument_is_a_value_even_when_it_starts_with_a_dash() {
        let given = parse(&args(&["--address", "-1"]), kinds).unwrap();
        assert_eq!(pairs(&given), [("address", "-1")]);
        assert_eq!(given[0].written, "--address");
    }

    #[test]
    fn an_unknown_flag_is_named_as_written() {
        let err = parse(&args(&["--workers=2", "--no-such-flag=1"]), kinds).unwrap_err();
        assert_eq!(err, FlagError::Unknown("--no-such-flag".into()));
        assert_eq!(err.to_string(), "flag provided but not defined: --no-such-flag");
        assert_eq!(parse(&args(&["-x"]), kinds).unwrap_err(), FlagError::Unknown("-x".into()));
    }

    #[test]
    fn bad_syntax_missing_values_help_and_positionals_are_errors() {
        assert_eq!(parse(&args(&["---workers=1"]), kinds).unwrap_err(), FlagError::Syntax("---workers=1".into()));
        assert_eq!(parse(&args(&["-=1"]), kinds).unwrap_err(), FlagError::Syntax("-=1".into()));
        assert_eq!(parse(&args(&["--workers"]), kinds).unwrap_err(), FlagError::MissingValue("--workers".into()));
        assert_eq!(parse(&args(&["-h"]), kinds).unwrap_err(), FlagError::Help);
        assert_eq!(parse(&args(&["--help"]), kinds).unwrap_err(), FlagError::Help);
        assert_eq!(parse(&args(&["run", "--on"]), kinds).unwrap_err(), FlagError::Positional("run".into()));
        assert_eq!(parse(&args(&["-"]), kinds).unwrap_err(), FlagError::Positional("-".into()));
        assert_eq!(parse(&args(&["--on", "--", "x"]), kinds).unwrap_err(), FlagError::Positional("x".into()));
        assert_eq!(pairs(&parse(&args(&["--on", "--"]), kinds).unwrap()), [("on", "true")]);
        assert!(parse(&[], kinds).unwrap().is_empty());
    }

    #[test]
    fn durations_are_read_as_go_reads_them() {
        let cases = [
            ("0", Duration::ZERO),
            ("20s", Duration::from_secs(20)),
            ("30m", Duration::from_secs(1800)),
            ("1h30m", Duration::from_secs(5400)),
            ("500ms", Duration::from_millis(500)),
            ("1.5h", Duration::from_secs(5400)),
            (".5s", Duration::from_millis(500)),
            ("1.s", Duration::from_secs(1)),
            ("2h45m10.25s", Duration::from_millis((2 * 3600 + 45 * 60 + 10) * 1000 + 250)),
            ("+5s", Duration::from_secs(5)),
            ("-0", Duration::ZERO),
            ("-0s", Duration::ZERO),
            ("10us", Duration::from_micros(10)),
            ("10µs", Duration::from_micros(10)),
            ("10μs", Duration::from_micros(10)),
            ("7ns", Duration::from_nanos(7)),
            ("1.0000000001s", Duration::new(1, 0)),
            ("0.1ns", Duration::ZERO),
            ("2562047h47m16.854775807s", Duration::new(9_223_372_036, 854_775_807)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn durations_go_refuses_are_refused_with_the_reason() {
        for (text, reason) in [
            ("", "invalid duration"),
            ("20", "missing unit"),
            ("1h30", "missing unit"),
            ("3d", "unknown unit \"d\""),
            ("1.5.5s", "missing unit"),
            (".s", "invalid duration"),
            ("s", "invalid duration"),
            ("-5s", "must not be negative"),
            ("2562047h47m16.854775808s", "invalid duration"),
            ("99999999999999999999999999999999999999999h", "invalid duration"),
        ] {
            let err = parse_duration(text).unwrap_err();
            assert!(err.contains(reason), "{text}: {err}");
        }
    }

    #[test]
    fn durations_print_as_go_prints_them() {
        for (d, want) in [
            (Duration::ZERO, "0s"),
            (Duration::from_secs(20), "20s"),
            (Duration::from_secs(1800), "30m0s"),
            (Duration::from_secs(5400), "1h30m0s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_micros(15), "15µs"),
            (Duration::from_nanos(7), "7ns"),
        ] {
            assert_eq!(format_duration(d), want);
            assert_eq!(parse_duration(want), Ok(d), "round trip of {want}");
        }
    }
}
