//! What a replica's metrics say about one controller: syncs per minute and errors (from the reconcile
//! counter), and its hooks' latency quantiles (from the hook request-duration histogram).
//!
//! A counter says how many since the replica started, so a rate needs two scrapes some time apart; with
//! one, the rates are unknown. The latency quantiles are over the replica's lifetime (the histogram's
//! buckets as served), estimated as Prometheus' `histogram_quantile` does.
//!
//! Several replicas ([`total`]) — a sharded ring, where each syncs its share of the parents — add up as
//! Prometheus' `sum` would: counts and rates are summed, and the latency histograms are summed bucket by
//! bucket before the quantiles are taken (quantiles of quantiles would mean nothing).

use std::collections::BTreeMap;
use std::time::Duration;

use super::exposition::{Sample, number};

/// The reconcile counter as controller-runtime names it: `controller` is `<kind in lower case>/<name>`.
const RECONCILE: &str = "controller_runtime_reconcile_total";
/// The reconcile counter of hubs before it took controller-runtime's name, labelled `kind`, `controller`.
const RECONCILE_BEFORE: &str = "metahook_reconcile_total";
/// Buckets of the hook request-duration histogram ([`crate::hooks::metrics`]), labelled `kind`,
/// `controller`, `hook`, `le`.
const HOOK_BUCKETS: &str = "metahook_hook_request_duration_seconds_bucket";
/// 1 on the replica that holds the leader Lease (and so runs the controllers, or, sharded, coordinates
/// the ring).
const LEADER: &str = "leader_election_master_status";
/// The buckets of parents a sharded replica holds (of 1024); not served without sharding.
const SHARD_BUCKETS: &str = "metahook_shard_buckets";
/// Each controller a replica read from a file, with its `Ready` (1 or 0) and reason.
pub const FILE_READY: &str = "metahook_file_controller_ready";

/// A controller as the metrics label it.
#[derive(Clone, Copy, Debug)]
pub struct Controller<'a> {
    /// `CompositeController` or `DecoratorController`.
    pub kind: &'a str,
    pub name: &'a str,
}

/// One scrape of `/metrics`, and how long after the first one it was taken.
#[derive(Debug, Default)]
pub struct Scrape {
    pub samples: Vec<Sample>,
    pub after: Duration,
}

impl Scrape {
    /// Whether the replica leads: `None` when it runs without leader election.
    #[must_use]
    pub fn leader(&self) -> Option<bool> {
        self.samples.iter().find(|s| s.name == LEADER).map(|s| s.value >= 1.0)
    }

    /// Syncs finished by result (`success`, `error`, `requeue`, `requeue_after`), or `None` when the
    /// replica has no series for the controller (it does not run it). Read from controller-runtime's
    /// name when the replica serves it, else from the name before.
    fn reconciles(&self, controller: Controller<'_>) -> Option<BTreeMap<String, f64>> {
        let current = format!("{}/{}", controller.kind.to_ascii_lowercase(), controller.name);
        let renamed = self.samples.iter().any(|s| s.name == RECONCILE);
        let ours = |s: &&Sample| {
            if renamed {
                s.name == RECONCILE && s.label("controller") == Some(current.as_str())
            } else {
                s.name == RECONCILE_BEFORE
                    && s.label("kind") == Some(controller.kind)
                    && s.label("controller") == Some(controller.name)
            }
        };
        let mut by_result = BTreeMap::new();
        for sample in self.samples.iter().filter(ours) {
            *by_result.entry(sample.label("result").unwrap_or_default().to_owned()).or_insert(0.0) += sample.value;
        }
        (!by_result.is_empty()).then_some(by_result)
    }

    /// Whether the replica is a member of a sharded ring, and how many of the ring's buckets it holds.
    #[must_use]
    pub fn shard_buckets(&self) -> Option<u64> {
        self.samples.iter().find(|s| s.name == SHARD_BUCKETS).map(|s| count(s.value))
    }

    /// The controller's hook latency histogram, every hook's buckets added: (upper bound, calls at or
    /// below it), by bound.
    fn hook_buckets(&self, controller: Controller<'_>) -> Vec<(f64, f64)> {
        let mut by_bound: Vec<(f64, f64)> = Vec::new();
        let ours = self.samples.iter().filter(|s| {
            s.name == HOOK_BUCKETS
                && s.label("kind") == Some(controller.kind)
                && s.label("controller") == Some(controller.name)
        });
        for sample in ours {
            let Some(le) = sample.label("le").and_then(number) else { continue };
            // Every hook's histogram has the same buckets, written alike: bounds compare exactly.
            match by_bound.iter_mut().find(|(b, _)| b.total_cmp(&le).is_eq()) {
                Some((_, count)) => *count += sample.value,
                None => by_bound.push((le, sample.value)),
            }
        }
        by_bound.sort_by(|a, b| a.0.total_cmp(&b.0));
        by_bound
    }
}

/// Keys of one flow (a namespace) a controller's queue holds, as the hub's per-flow gauges say.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FlowWait {
    /// The namespace (or cluster-scoped parent), or `(others)` for the flows beyond the busiest.
    pub flow: String,
    pub waiting: u64,
    /// Seconds its key queued longest has waited.
    pub oldest_seconds: f64,
    /// The same, for each line with keys waiting, in the order a flow's lines are served (empty from a
    /// hub that does not say).
    pub lines: Vec<LineWait>,
    /// Workers syncing one of its keys now.
    pub workers: u64,
}

/// How long the key of a flow queued longest in one line ([`crate::engine::queue::Lane::name`]) has
/// waited.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LineWait {
    pub line: String,
    pub oldest_seconds: f64,
}

/// The per-flow gauges of a queue ([`crate::engine::queue::FlowFigures`]), labelled `name`, `flow`.
const FLOW_DEPTH: &str = "metahook_queue_flow_depth";
const FLOW_OLDEST: &str = "metahook_queue_flow_oldest_seconds";
const FLOW_WORKERS: &str = "metahook_queue_flow_workers";

/// Who waits behind whom in `controller`'s queue over every replica: keys and workers summed by flow,
/// the longest wait the longest of any, busiest first.
#[must_use]
pub fn waiting(replicas: &[Replica<'_>], controller: Controller<'_>) -> Vec<FlowWait> {
    let name = format!("{}/{}", controller.kind.to_ascii_lowercase(), controller.name);
    let mut by_flow: BTreeMap<String, FlowWait> = BTreeMap::new();
    for sample in replicas.iter().flat_map(|r| &r.last.samples) {
        if sample.label("name") != Some(name.as_str()) {
            continue;
        }
        let Some(flow) = sample.label("flow") else { continue };
        let entry =
            by_flow.entry(flow.to_owned()).or_insert_with(|| FlowWait { flow: flow.to_owned(), ..FlowWait::default() });
        match sample.name.as_str() {
            FLOW_DEPTH => entry.waiting += count(sample.value),
            FLOW_WORKERS => entry.workers += count(sample.value),
            FLOW_OLDEST => {
                entry.oldest_seconds = entry.oldest_seconds.max(sample.value);
                if let Some(line) = sample.label("line") {
                    match entry.lines.iter_mut().find(|l| l.line == line) {
                        Some(known) => known.oldest_seconds = known.oldest_seconds.max(sample.value),
                        None => entry.lines.push(LineWait { line: line.to_owned(), oldest_seconds: sample.value }),
                    }
                }
            }
            _ => {}
        }
    }
    let served = |line: &LineWait| crate::engine::queue::LANES.iter().position(|lane| lane.name() == line.line);
    for flow in by_flow.values_mut() {
        flow.lines.sort_by_key(|line| served(line).unwrap_or(usize::MAX));
    }
    let mut flows: Vec<FlowWait> = by_flow.into_values().filter(|f| f.waiting > 0 || f.workers > 0).collect();
    flows.sort_by(|a, b| (b.waiting, b.workers).cmp(&(a.waiting, a.workers)).then_with(|| a.flow.cmp(&b.flow)));
    flows
}

/// The figures of one controller.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    /// Syncs finished per minute between the two scrapes.
    pub syncs_per_minute: Option<f64>,
    /// Syncs that ended in an error since the replica started.
    pub errors: Option<u64>,
    /// Syncs that ended in an error per minute between the two scrapes.
    pub errors_per_minute: Option<f64>,
    /// Hook call latency, median and 99th percentile, in seconds.
    pub hook_p50: Option<f64>,
    pub hook_p99: Option<f64>,
}

/// The figures of `controller` from `last`, with rates against `first` (taken before it) when given.
#[must_use]
pub fn figures(first: Option<&Scrape>, last: &Scrape, controller: Controller<'_>) -> Figures {
    let now = last.reconciles(controller);
    let before = first.and_then(|f| f.reconciles(controller).map(|r| (f.after, r)));
    let per_minute = |pick: &dyn Fn(&BTreeMap<String, f64>) -> f64| -> Option<f64> {
        let (at, before) = before.as_ref()?;
        let now = now.as_ref()?;
        let seconds = last.after.checked_sub(*at)?.as_secs_f64();
        if seconds <= 0.0 {
            return None;
        }
        let (then, now) = (pick(before), pick(now));
        // A counter that went down was reset (the replica restarted): all of it is new.
        let increase = if now >= then { now - then } else { now };
        Some(increase * 60.0 / seconds)
    };
    let all = |r: &BTreeMap<String, f64>| r.values().sum();
    let errors = |r: &BTreeMap<String, f64>| r.get("error").copied().unwrap_or(0.0);
    let buckets = last.hook_buckets(controller);
    Figures {
        syncs_per_minute: per_minute(&all),
        errors: now.as_ref().map(|r| count(errors(r))),
        errors_per_minute: per_minute(&errors),
        hook_p50: quantile(0.5, &buckets),
        hook_p99: quantile(0.99, &buckets),
    }
}

/// The two scrapes of one replica: `first` (for the rates) and `last`.
#[derive(Clone, Copy, Debug)]
pub struct Replica<'a> {
    pub first: Option<&'a Scrape>,
    pub last: &'a Scrape,
}

/// The figures of `controller` over every replica in `replicas`: each figure summed over the replicas
/// that have it (`None` when none has), the hook latency from their histograms summed by bucket.
#[must_use]
pub fn total(replicas: &[Replica<'_>], controller: Controller<'_>) -> Figures {
    let each: Vec<Figures> = replicas.iter().map(|r| figures(r.first, r.last, controller)).collect();
    let sum = |pick: fn(&Figures) -> Option<f64>| -> Option<f64> {
        each.iter().filter_map(pick).fold(None, |total, value| Some(total.unwrap_or(0.0) + value))
    };
    let histograms: Vec<Vec<(f64, f64)>> = replicas.iter().map(|r| r.last.hook_buckets(controller)).collect();
    let buckets = merge(&histograms);
    Figures {
        syncs_per_minute: sum(|f| f.syncs_per_minute),
        errors: each.iter().filter_map(|f| f.errors).fold(None, |total, n| Some(total.unwrap_or(0) + n)),
        errors_per_minute: sum(|f| f.errors_per_minute),
        hook_p50: quantile(0.5, &buckets),
        hook_p99: quantile(0.99, &buckets),
    }
}

/// Cumulative histograms (each sorted by bound) added into one, as `sum by (le)` does. Replicas of one
/// version serve the same bounds, and then this is a plain sum per bound; should two versions differ,
/// each histogram counts at a bound it lacks what it has at its nearest bound below (what it knows to
/// be at or below it), so the sum stays cumulative and never overstates a bucket.
#[must_use]
pub fn merge(histograms: &[Vec<(f64, f64)>]) -> Vec<(f64, f64)> {
    let mut bounds: Vec<f64> = histograms.iter().flatten().map(|(bound, _)| *bound).collect();
    bounds.sort_by(f64::total_cmp);
    bounds.dedup_by(|a, b| a.total_cmp(b).is_eq());
    bounds
        .into_iter()
        .map(|bound| {
            let at = histograms
                .iter()
                .map(|h| h.iter().take_while(|(b, _)| *b <= bound).last().map_or(0.0, |(_, count)| *count))
                .sum();
            (bound, at)
        })
        .collect()
}

/// A counter's value as a count (counters hold whole numbers; a float is how the format carries them).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn count(value: f64) -> u64 {
    value.max(0.0).round() as u64
}

/// The `q` quantile of a cumulative histogram (upper bound, count at or below it; sorted, `+Inf`
/// last), interpolating linearly inside the bucket it falls in, as Prometheus' `histogram_quantile`:
/// `None` without observations; the highest finite bound when it falls in the `+Inf` bucket.
#[must_use]
pub fn quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let total = buckets.last().map(|(_, count)| *count).filter(|c| *c > 0.0)?;
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(upper, count) in buckets {
        if count >= rank {
            if upper.is_infinite() {
                return Some(lower.0);
            }
            if count <= lower.1 {
                return Some(upper);
            }
            return Some(lower.0 + (upper - lower.0) * (rank - lower.1) / (count - lower.1));
        }
        lower = (upper, count);
    }
    Some(lower.0)
}

#[cfg(test)]
mod tests {
    use super::super::exposition::parse;
    use super::*;

    /// A leader's `/metrics` as the hub serves it, trimmed: two controllers, one hook each plus a
    /// customize hook for `web`.
    const FIXTURE: &str = include_str!("fixtures/metrics.txt");

    fn scrape(text: &str, after: u64) -> Scrape {
        Scrape { samples: parse(text).unwrap(), after: Duration::from_secs(after) }
    }

    const WEB: Controller<'static> = Controller { kind: "CompositeController", name: "web" };

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    #[test]
    fn one_scrape_gives_error_totals_and_latency_but_no_rates() {
        let last = scrape(FIXTURE, 0);
        assert_eq!(last.leader(), Some(true));
        let figures = figures(None, &last, WEB);
        assert_eq!(figures.errors, Some(4));
        assert_eq!((figures.syncs_per_minute, figures.errors_per_minute), (None, None));
        // sync and customize buckets added: 100 calls, 50th at 50 → inside (0.004, 0.008], 40 below it.
        assert!(close(figures.hook_p50, 0.004 + 0.004 * (50.0 - 40.0) / (90.0 - 40.0)), "{figures:?}");
        // 99th at 99 → inside (0.016, 0.032], 96 below it, 100 at its top.
        assert!(close(figures.hook_p99, 0.016 + 0.016 * (99.0 - 96.0) / (100.0 - 96.0)), "{figures:?}");
    }

    #[test]
    fn who_waits_behind_whom_adds_up_the_replicas_flows_busiest_first() {
        let one = "metahook_queue_flow_depth{name=\"compositecontroller/web\",flow=\"flood\"} 9000\n\
                   metahook_queue_flow_oldest_seconds{name=\"compositecontroller/web\",flow=\"flood\",line=\"delay\"} 41\n\
                   metahook_queue_flow_oldest_seconds{name=\"compositecontroller/web\",flow=\"flood\",line=\"change\"} 2\n\
                   metahook_queue_flow_workers{name=\"compositecontroller/web\",flow=\"flood\"} 4\n\
                   metahook_queue_flow_depth{name=\"compositecontroller/web\",flow=\"team-a\"} 1\n\
                   metahook_queue_flow_oldest_seconds{name=\"compositecontroller/web\",flow=\"team-a\"} 0.1\n\
                   metahook_queue_flow_depth{name=\"compositecontroller/other\",flow=\"x\"} 5\n";
        let two = "metahook_queue_flow_depth{name=\"compositecontroller/web\",flow=\"flood\"} 812\n\
                   metahook_queue_flow_oldest_seconds{name=\"compositecontroller/web\",flow=\"flood\",line=\"change\"} 50\n";
        let (a, b) = (scrape(one, 0), scrape(two, 0));
        let replicas = [Replica { first: None, last: &a }, Replica { first: None, last: &b }];
        let flows = waiting(&replicas, WEB);
        let seen: Vec<(&str, u64, u64)> = flows.iter().map(|f| (f.flow.as_str(), f.waiting, f.workers)).collect();
        assert_eq!(seen, [("flood", 9812, 4), ("team-a", 1, 0)], "the other controller's flows are its own");
        assert!(close(Some(flows[0].oldest_seconds), 50.0), "{flows:?}");
        let lines: Vec<(&str, f64)> = flows[0].lines.iter().map(|l| (l.line.as_str(), l.oldest_seconds)).collect();
        assert_eq!(lines, [("change", 50.0), ("delay", 41.0)], "by line, longest of any replica, in service order");
        assert!(flows[1].lines.is_empty(), "a hub that does not say by line: {flows:?}");
    }

    #[test]
    fn two_scrapes_give_rates_per_minute_from_the_renamed_counter() {
        let first = scrape(FIXTURE, 0);
        let later = FIXTURE
            .replace(
                "controller=\"compositecontroller/web\",result=\"success\"} 20",
                "controller=\"compositecontroller/web\",result=\"success\"} 35",
            )
            .replace(
                "controller=\"compositecontroller/web\",result=\"error\"} 4",
                "controller=\"compositecontroller/web\",result=\"error\"} 9",
            );
        let last = scrape(&later, 10);
        let figures = figures(Some(&first), &last, WEB);
        assert!(close(figures.syncs_per_minute, 20.0 * 6.0), "15 + 5 syncs in 10 s: {figures:?}");
        assert!(close(figures.errors_per_minute, 5.0 * 6.0), "{figures:?}");
        assert_eq!(figures.errors, Some(9));
    }

    #[test]
    fn the_counter_before_the_rename_is_read_when_the_replica_serves_no_other() {
        let old = "metahook_reconcile_total{kind=\"DecoratorController\",controller=\"labels\",result=\"success\"} 7\n\
                   metahook_reconcile_total{kind=\"DecoratorController\",controller=\"labels\",result=\"error\"} 2\n\
                   metahook_reconcile_total{kind=\"CompositeController\",controller=\"labels\",result=\"error\"} 50\n";
        let labels = Controller { kind: "DecoratorController", name: "labels" };
        let first = scrape(old, 0);
        let last = scrape(&old.replace("} 7", "} 13"), 30);
        let figures = figures(Some(&first), &last, labels);
        assert_eq!(figures.errors, Some(2), "another kind's controller of the same name is not counted");
        assert!(close(figures.syncs_per_minute, 12.0), "{figures:?}");
        assert_eq!(last.leader(), None);
    }

    #[test]
    fn a_controller_the_replica_does_not_run_has_no_figures() {
        let last = scrape(FIXTURE, 10);
        let other = Controller { kind: "CompositeController", name: "elsewhere" };
        assert_eq!(figures(Some(&scrape(FIXTURE, 0)), &last, other), Figures::default());
    }

    #[test]
    fn a_counter_reset_between_scrapes_counts_from_zero() {
        let first = scrape(FIXTURE, 0);
        let restarted = FIXTURE
            .replace("result=\"success\"} 20", "result=\"success\"} 2")
            .replace("result=\"error\"} 4", "result=\"error\"} 1");
        let figures = figures(Some(&first), &scrape(&restarted, 60), WEB);
        assert!(close(figures.errors_per_minute, 1.0), "{figures:?}");
    }

    #[test]
    fn replicas_add_up_their_rates_errors_and_histograms() {
        let first = scrape(FIXTURE, 0);
        let later = FIXTURE.replace(
            "controller=\"compositecontroller/web\",result=\"success\"} 20",
            "controller=\"compositecontroller/web\",result=\"success\"} 35",
        );
        let last = scrape(&later, 10);
        let alone = figures(Some(&first), &last, WEB);
        let (other_first, other_last) = (scrape(FIXTURE, 1), scrape(FIXTURE, 11));
        let standby = scrape("leader_election_master_status{name=\"metahook\"} 0\n", 10);
        let replicas = [
            Replica { first: Some(&first), last: &last },
            Replica { first: Some(&other_first), last: &other_last },
            Replica { first: None, last: &standby },
        ];
        let total = total(&replicas, WEB);
        assert!(close(total.syncs_per_minute, 15.0 * 6.0), "the second replica synced none: {total:?}");
        assert_eq!(total.errors, Some(8), "4 on each replica that runs it");
        // The same histogram twice: the same quantiles as one of them alone.
        assert!(close(total.hook_p50, alone.hook_p50.unwrap()), "{total:?}");
        assert!(close(total.hook_p99, alone.hook_p99.unwrap()), "{total:?}");
        let nobody = Controller { kind: "CompositeController", name: "elsewhere" };
        assert_eq!(super::total(&replicas, nobody), Figures::default(), "no replica runs it: unknown, not 0");
    }

    #[test]
    fn histograms_are_summed_bucket_by_bucket() {
        let a = vec![(0.1, 1.0), (0.2, 3.0), (f64::INFINITY, 4.0)];
        let b = vec![(0.1, 0.0), (0.2, 10.0), (f64::INFINITY, 10.0)];
        assert_eq!(merge(&[a.clone(), b]), vec![(0.1, 1.0), (0.2, 13.0), (f64::INFINITY, 14.0)]);
        // Other bounds: a bound one lacks counts what it has below it.
        let c = vec![(0.15, 2.0), (f64::INFINITY, 2.0)];
        assert_eq!(merge(&[a, c]), vec![(0.1, 1.0), (0.15, 3.0), (0.2, 5.0), (f64::INFINITY, 6.0)]);
        assert_eq!(merge(&[]), Vec::<(f64, f64)>::new());
    }

    #[test]
    fn quantiles_follow_histogram_quantile() {
        let buckets = [(0.1, 0.0), (0.2, 10.0), (0.4, 10.0), (f64::INFINITY, 20.0)];
        assert!(close(quantile(0.25, &buckets), 0.15));
        assert!(close(quantile(0.5, &buckets), 0.2), "the rank is reached at a bucket's top");
        assert!(close(quantile(0.99, &buckets), 0.4), "in +Inf: the highest finite bound");
        assert_eq!(quantile(0.5, &[(0.1, 0.0), (f64::INFINITY, 0.0)]), None);
        assert_eq!(quantile(0.5, &[]), None);
    }
}
