//! The metrics reference: every family on `/metrics`, read from the registry the hub serves — built by
//! [`crate::ops::metrics::registry`] from a hub as [`crate::ops::run::build`] makes it — with its type,
//! labels, help text and histogram buckets.
//!
//! A family shows its labels only once it has a sample, so the generator gives each one a sample, as a
//! controller's first sync would. A family it cannot see stops the generator: a new family needs its
//! sample here, and then it is on the page.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use super::markdown::{cell, code, generated_by};
use crate::cache::discovery::ResolvedResource;
use crate::engine::metrics::{Cause, Outcome, Saved};
use crate::hooks::{HookKind, HookLabels};
use crate::ops::config::Config;
use crate::ops::gate::Leadership;
use crate::ops::metrics::Readiness;

/// One family as `/metrics` declares it.
#[derive(Debug, Default)]
struct Family {
    type_: String,
    help: String,
    /// Label names of its samples, in their order (`le` of a histogram's buckets left out).
    labels: Vec<String>,
    /// Upper bounds of a histogram's buckets, as written (`+Inf` last).
    buckets: Vec<String>,
    samples: usize,
}

/// The page, `reference/metrics.md`.
///
/// # Panics
/// When a registered family has no sample (its labels would be missing from the page), or the hub's
/// parts cannot be built.
#[must_use]
pub fn page() -> String {
    let text = exposition();
    let families = parse(&text);
    let mut out = generated_by(
        "the metrics registry the hub serves (`src/ops/metrics.rs`, with the families of `src/engine/metrics.rs`, \
         `src/write/apply.rs`, `src/hooks/metrics.rs` and `src/ops/client_metrics.rs`)",
    );
    out.push_str(
        "\n# Metrics reference\n\n\
         The hub serves these on `/metrics` at `metricsAddress` (default `0.0.0.0:9999`; see the \
         [configuration reference](configuration.md#metricsaddress)), in the OpenMetrics text format. \
         In the `metahook_*` families `kind` is `CompositeController` or `DecoratorController` and \
         `controller` the controller object's name; controller-runtime's `controller_runtime_*` families \
         name a controller in their `controller` label, and client-go's `workqueue_*` in their `name` label, \
         as `<kind in lower case>/<name>` (`compositecontroller/web`). A counter is queried with its \
         `_total` suffix, a histogram through `_bucket`, `_sum` and `_count`. \
         `leader_election_master_status` is there only with leader election on. A controller's series go \
         away when it is deleted.\n\n\
         | metric | type | labels | help |\n|---|---|---|---|\n",
    );
    for (name, family) in &families {
        assert!(
            family.samples > 0,
            "metric family {name} has no sample, so its labels are unknown: give it one in exposition()"
        );
        let shown = if family.type_ == "counter" { format!("{name}_total") } else { name.clone() };
        let labels: Vec<String> = family.labels.iter().map(|l| code(l)).collect();
        let _ =
            writeln!(out, "| {} | {} | {} | {} |", code(&shown), family.type_, labels.join(", "), cell(&family.help));
    }
    let histograms: Vec<_> = families.iter().filter(|(_, f)| f.type_ == "histogram").collect();
    if !histograms.is_empty() {
        out.push_str("\nHistogram buckets (upper bounds, in seconds):\n\n");
        for (name, family) in histograms {
            let _ = writeln!(out, "- {}: {}", code(name), family.buckets.join(", "));
        }
    }
    out
}

/// The text of `/metrics` of a hub whose every family has a sample: one controller that synced once,
/// called its hook, left a call out, wrote a child, and one watched type. The hub's parts spawn tasks
/// (the API client's buffer, a watch), so they are built on a runtime of their own.
fn exposition() -> String {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    let _entered = runtime.enter();
    // Nothing listens on port 9 of the loopback: the parts are built, nothing is asked of a cluster.
    let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URI"));
    let client = kube::Client::try_from(config).expect("a client needs no connection to be built");
    let hub = crate::ops::run::build(client, &Config::default());
    // The sharding families, as a sharded replica serves them.
    hub.metrics.shard.enable();
    let member = Leadership::new("metahook-0".to_owned(), "metahook/metahook-0".to_owned());
    let leader = Leadership::new("metahook-0".to_owned(), "metahook/metahook".to_owned());
    let ready = Readiness { health: hub.health.clone(), leadership: Some(member), coordination: Some(leader) };
    let registry = crate::ops::metrics::registry(&hub, &ready);

    let (kind, name) = ("CompositeController", "example");
    let controller = hub.metrics.controller(kind, name);
    controller.record(Duration::ZERO, Outcome::Success);
    controller.hook_sync(Cause::Change);
    controller.hook_call_saved(Saved::IdenticalRequest);
    controller.deletion_guard_refused();
    controller.canary_sync("candidate", "ok", 1);
    controller.canary_state(10.0, false);
    // A key waiting, so the per-flow families have a sample.
    let queue = crate::engine::queue::WorkQueue::with_stats(
        crate::engine::queue::Backoff::default(),
        hub.metrics.queue(kind, name),
    );
    queue.add("example-namespace");
    hub.metrics.apply.record("ConfigMap", "created");
    hub.metrics.shard.parent_arrived();
    hub.metrics.shard.took(1, 1);
    hub.metrics.shard.let_go(1, Duration::ZERO);
    hub.metrics.files.read(0);
    hub.metrics.files.refused(kind, 0);
    hub.metrics.files.ready(kind, name, "/etc/metahook/controllers/example.yaml document 1", true, "Running");
    crate::ops::client_metrics::process().record("GET", "10.0.0.1:6443", Some(200), Duration::ZERO);
    let hook = HookLabels { kind: kind.to_owned(), controller: name.to_owned(), hook: HookKind::Sync };
    let hooks = hub.hooks.metrics();
    let _in_flight = hooks.start(&hook);
    hooks.finish(&hook, Some(200), Duration::ZERO);
    hooks.etag(&hook, true);
    let config_maps = Arc::new(ResolvedResource {
        api_resource: kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
        namespaced: true,
        has_status: false,
    });
    let _informer = hub.informers.get(&config_maps, crate::cache::shard::Role::Child);
    let text = crate::ops::metrics::render(&registry);
    drop(queue);
    text
}

/// The families of an `OpenMetrics` text, by name.
fn parse(text: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, type_) = rest.split_once(' ').unwrap_or((rest, ""));
            type_.clone_into(&mut families.entry(name.to_owned()).or_default().type_);
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            help.clone_into(&mut families.entry(name.to_owned()).or_default().help);
        } else if !line.starts_with('#') && !line.is_empty() {
            // The value follows the series; a label value may hold spaces (`file="a.yaml document 1"`).
            let series = match line.rfind('}') {
                Some(end) => &line[..=end],
                None => line.split_once(' ').map_or(line, |(series, _)| series),
            };
            let (metric, labels) = series.split_once('{').unwrap_or((series, ""));
            let labels = label_pairs(labels.trim_end_matches('}'));
            let Some((_, family)) = families.iter_mut().rev().find(|(name, _)| metric.starts_with(name.as_str()))
            else {
                continue;
            };
            family.samples += 1;
            for (label, value) in labels {
                if label == "le" {
                    if !family.buckets.contains(&value) {
                        family.buckets.push(value);
                    }
                } else if !family.labels.contains(&label) {
                    family.labels.push(label);
                }
            }
        }
    }
    families
}

/// Label pairs (`a="x",b="y\"z"`) as names and values.
fn label_pairs(text: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut chars = text.chars().peekable();
    while chars.peek().is_some() {
        let name: String = chars.by_ref().take_while(|&c| c != '=').collect();
        let mut value = String::new();
        if chars.next() == Some('"') {
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        }
        if chars.peek() == Some(&',') {
            chars.next();
        }
        pairs.push((name.trim().to_owned(), value));
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_the_hub_serves_is_listed_with_its_labels() {
        let page = page();
        for family in crate::ops::metrics::SCRAPE_TIME_FAMILIES {
            assert!(page.contains(&format!("`{family}`")), "{family} missing from\n{page}");
        }
        for row in [
            "| `controller_runtime_reconcile_total` | counter | `controller`, `result` |",
            "| `workqueue_unfinished_work_seconds` | gauge | `name` |",
            "| `metahook_hook_requests_total` | counter | `kind`, `controller`, `hook`, `code` |",
            "| `workqueue_depth` | gauge | `name` |",
            "| `metahook_queue_flow_depth` | gauge | `name`, `flow` |",
            "| `metahook_informer_objects` | gauge | `resource` |",
        ] {
            assert!(page.contains(row), "missing {row} in\n{page}");
        }
        assert!(page.contains("- `controller_runtime_reconcile_time_seconds`: 0.005, 0.01,"), "{page}");
    }

    #[test]
    fn help_texts_end_in_one_period() {
        for (name, family) in parse(&exposition()) {
            assert!(family.help.ends_with('.') && !family.help.ends_with(".."), "{name}: {:?}", family.help);
        }
    }

    #[test]
    fn label_values_may_hold_commas_and_quotes() {
        let pairs = label_pairs(r#"a="x,y",b="say \"hi\"""#);
        assert_eq!(pairs, [("a".into(), "x,y".into()), ("b".into(), "say \"hi\"".into())]);
    }
}
