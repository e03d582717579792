//! The Prometheus text exposition format, read into samples: what a hub replica's `/metrics` serves
//! (the `OpenMetrics` text format, a superset for what is read here), so `metahook status` can read it without a
//! Prometheus server.
//!
//! Only sample lines matter: `# HELP`, `# TYPE`, `# EOF` and other comments are skipped, and so are a
//! sample's timestamp and an `OpenMetrics` exemplar after its value.

use std::collections::BTreeMap;

/// One sample line: `name{label="value",...} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, if the sample has it.
    #[must_use]
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
}

/// A line that is not a sample, a comment or blank.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct ExpositionError {
    /// 1-based.
    pub line: usize,
    pub reason: &'static str,
}

/// Every sample in `text`, in order.
pub fn parse(text: &str) -> Result<Vec<Sample>, ExpositionError> {
    let mut samples = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        samples.push(sample(line).map_err(|reason| ExpositionError { line: index + 1, reason })?);
    }
    Ok(samples)
}

fn sample(line: &str) -> Result<Sample, &'static str> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace()).ok_or("no value")?;
    let name = &line[..name_end];
    if name.is_empty() {
        return Err("no metric name");
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(inside) = rest.strip_prefix('{') {
        rest = label_set(inside, &mut labels)?;
    }
    let value = rest.split_whitespace().next().ok_or("no value")?;
    Ok(Sample { name: name.to_owned(), labels, value: number(value).ok_or("the value is not a number")? })
}

/// Reads `key="value",...}` into `labels`; returns what follows the `}`.
fn label_set<'a>(mut rest: &'a str, labels: &mut BTreeMap<String, String>) -> Result<&'a str, &'static str> {
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('}') {
            return Ok(after);
        }
        let (key, after_key) = rest.split_once('=').ok_or("a label without '='")?;
        let key = key.trim();
        if key.is_empty() {
            return Err("a label without a name");
        }
        let quoted = after_key.trim_start().strip_prefix('"').ok_or("a label value without quotes")?;
        let mut chars = quoted.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return Err("an unterminated label value"),
                },
                Some((_, c)) => value.push(c),
                None => return Err("an unterminated label value"),
            }
        };
        labels.insert(key.to_owned(), value);
        rest = quoted[end + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

/// A sample value or a bucket's upper bound (`le`): a float, or `+Inf`, `-Inf`, `NaN` as the format
/// spells them.
#[must_use]
pub fn number(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => text.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_read_with_their_labels_and_comments_are_skipped() {
        let text = "# HELP a_total Things.\n# TYPE a_total counter\na_total{kind=\"CompositeController\",controller=\"web\",result=\"success\"} 3\n\nplain 1.5e3\n# EOF\n";
        let samples = parse(text).unwrap();
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].name, "a_total");
        assert_eq!(samples[0].label("controller"), Some("web"));
        assert_eq!(samples[0].label("result"), Some("success"));
        assert!((samples[0].value - 3.0).abs() < f64::EPSILON);
        assert_eq!(samples[1], Sample { name: "plain".into(), labels: BTreeMap::new(), value: 1500.0 });
    }

    #[test]
    fn escaped_label_values_commas_inside_quotes_and_infinities_are_read() {
        let text = r#"x_bucket{note="a \"quoted\", back\\slash\nline",le="+Inf",} 7 1700000000000"#;
        let sample = &parse(text).unwrap()[0];
        assert_eq!(sample.label("note"), Some("a \"quoted\", back\\slash\nline"));
        assert_eq!(sample.label("le"), Some("+Inf"));
        assert_eq!(number(sample.label("le").unwrap()), Some(f64::INFINITY));
        assert!((sample.value - 7.0).abs() < f64::EPSILON, "the timestamp is not the value");
        let exemplar = parse("y_total 2 # {trace_id=\"abc\"} 1.0").unwrap();
        assert!((exemplar[0].value - 2.0).abs() < f64::EPSILON);
    }

    #[test]
    fn a_broken_line_is_reported_with_its_number() {
        assert_eq!(parse("ok 1\nbroken{a=\"x\" 2\n").unwrap_err().line, 2);
        assert_eq!(parse("novalue\n").unwrap_err().reason, "no value");
        assert_eq!(parse("x{a=unquoted} 1\n").unwrap_err().reason, "a label value without quotes");
        assert_eq!(
            parse("x 1\ny notanumber\n").unwrap_err(),
            ExpositionError { line: 2, reason: "the value is not a number" }
        );
    }
}
