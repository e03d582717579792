//! Hook call metrics: requests by controller, hook and HTTP status; latency; calls in flight; ETag
//! cache hits and misses.
//!
//! Metacontroller exports `metacontroller_<hook>_requests_total{code,method}` and friends with the URL
//! as a constant label; metahook keeps one family per measurement and labels it with the controller
//! (`kind`, `controller`) and the hook (`sync`, `finalize`, `customize`), the labels the hub's other
//! metrics use.

use std::fmt;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Which hook of a controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HookKind {
    Sync,
    Finalize,
    Customize,
    /// A MapController's per-input hook.
    Map,
    /// A MapController's hook for the outputs of a gone input.
    Tombstone,
    /// The candidate of a canary (`metahook.dev/canary`), called instead of `sync` for its share.
    Canary,
}

impl HookKind {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sync => "sync",
            Self::Finalize => "finalize",
            Self::Customize => "customize",
            Self::Map => "map",
            Self::Tombstone => "tombstone",
            Self::Canary => "canary",
        }
    }
}

impl fmt::Display for HookKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl EncodeLabelValue for HookKind {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

/// The hook a call is made for: controller kind and name, and which of its hooks.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct HookLabels {
    /// `CompositeController` or `DecoratorController`.
    pub kind: String,
    pub controller: String,
    pub hook: HookKind,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    #[prometheus(flatten)]
    hook: HookLabels,
    /// The HTTP status, or `error` when no answer came (connection, TLS, timeout, credentials).
    code: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EtagLabels {
    #[prometheus(flatten)]
    hook: HookLabels,
    /// `hit`: a 304/412 answered from the cache; `miss`: the hook sent a full answer.
    result: &'static str,
}

type HistogramFamily = Family<HookLabels, Histogram, fn() -> Histogram>;

/// Every hook metric of a hub. Cheap to share (`Arc`), registered once with [`HookMetrics::register`].
#[derive(Debug)]
pub struct HookMetrics {
    requests: Family<RequestLabels, Counter>,
    duration: HistogramFamily,
    in_flight: Family<HookLabels, Gauge>,
    etag: Family<EtagLabels, Counter>,
}

impl Default for HookMetrics {
    fn default() -> Self {
        fn latency() -> Histogram {
            // 1 ms … 16 s: a local hook answers in about a millisecond, the default timeout is 10 s.
            Histogram::new(exponential_buckets(0.001, 2.0, 15))
        }
        Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(latency),
            in_flight: Family::default(),
            etag: Family::default(),
        }
    }
}

impl HookMetrics {
    /// Adds the hook metric families to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "metahook_hook_requests",
            "Hook calls by controller, hook and HTTP status code (error: no HTTP answer)",
            self.requests.clone(),
        );
        registry.register(
            "metahook_hook_request_duration_seconds",
            "Hook call latency, from the first byte sent to the last byte read",
            self.duration.clone(),
        );
        registry.register("metahook_hook_in_flight_requests", "Hook calls in progress", self.in_flight.clone());
        registry.register(
            "metahook_hook_etag_cache",
            "ETag-enabled hook calls answered from the cache (hit: 304/412) or in full (miss)",
            self.etag.clone(),
        );
    }

    /// Counts a call as in flight until the returned guard is dropped.
    #[must_use]
    pub fn start(&self, hook: &HookLabels) -> InFlight<'_> {
        self.in_flight.get_or_create(hook).inc();
        InFlight { metrics: self, hook: hook.clone() }
    }

    /// Records a finished call: its status code (`None`: no HTTP answer) and how long it took.
    pub fn finish(&self, hook: &HookLabels, code: Option<u16>, took: Duration) {
        let code = code.map_or_else(|| "error".to_owned(), |c| c.to_string());
        self.requests.get_or_create(&RequestLabels { hook: hook.clone(), code }).inc();
        self.duration.get_or_create(hook).observe(took.as_secs_f64());
    }

    /// Counts an ETag cache hit or miss.
    pub fn etag(&self, hook: &HookLabels, hit: bool) {
        let result = if hit { "hit" } else { "miss" };
        self.etag.get_or_create(&EtagLabels { hook: hook.clone(), result }).inc();
    }
}

/// Decrements the in-flight gauge when the call ends, however it ends (also when cancelled).
pub struct InFlight<'a> {
    metrics: &'a HookMetrics,
    hook: HookLabels,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.metrics.in_flight.get_or_create(&self.hook).dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_counted_by_controller_hook_and_code() {
        let metrics = HookMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let hook = HookLabels { kind: "CompositeController".into(), controller: "web".into(), hook: HookKind::Sync };
        {
            let _call = metrics.start(&hook);
            let mut text = String::new();
            prometheus_client::encoding::text::encode_registry(&mut text, &registry).unwrap();
            assert!(text.contains(
                "metahook_hook_in_flight_requests{kind=\"CompositeController\",controller=\"web\",hook=\"sync\"} 1"
            ));
        }
        metrics.finish(&hook, Some(200), Duration::from_millis(3));
        metrics.finish(&hook, None, Duration::from_millis(3));
        metrics.etag(&hook, true);
        let mut text = String::new();
        prometheus_client::encoding::text::encode_registry(&mut text, &registry).unwrap();
        for line in [
            "metahook_hook_requests_total{kind=\"CompositeController\",controller=\"web\",hook=\"sync\",code=\"200\"} 1",
            "metahook_hook_requests_total{kind=\"CompositeController\",controller=\"web\",hook=\"sync\",code=\"error\"} 1",
            "metahook_hook_in_flight_requests{kind=\"CompositeController\",controller=\"web\",hook=\"sync\"} 0",
            "metahook_hook_request_duration_seconds_count{kind=\"CompositeController\",controller=\"web\",hook=\"sync\"} 2",
            "metahook_hook_etag_cache_total{kind=\"CompositeController\",controller=\"web\",hook=\"sync\",result=\"hit\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}
