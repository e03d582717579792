//! Prometheus metrics and health endpoints: `/metrics`, `/healthz`, `/readyz` on `metricsAddress`.
//!
//! kube-runtime exports no controller metrics, and a whole HTTP framework for three GET routes would
//! outweigh the rest of the hub's dependencies, so this is a small hand-written responder. Counters are
//! atomics updated by the worker loop; queue depth is read when scraped.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tracing::{debug, warn};

/// Counters of one running controller.
#[derive(Default)]
pub struct ControllerMetrics {
    pub syncs: AtomicU64,
    pub errors: AtomicU64,
    /// Total time spent in syncs, in microseconds.
    pub sync_micros: AtomicU64,
    /// Syncs refused by the safe-delete guard.
    pub guard_refusals: AtomicU64,
    depth: Mutex<Option<Box<dyn Fn() -> usize + Send + Sync>>>,
}

impl ControllerMetrics {
    /// Records one finished sync.
    pub fn record(&self, took: Duration, failed: bool) {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.sync_micros.fetch_add(u64::try_from(took.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// How to read the controller's queue depth when scraped.
    pub fn set_depth(&self, depth: impl Fn() -> usize + Send + Sync + 'static) {
        *self.depth.lock().expect("metrics lock") = Some(Box::new(depth));
    }
}

/// Counters by (controller kind, controller name).
type ByController = BTreeMap<(String, String), Arc<ControllerMetrics>>;

/// All metrics of a hub. Cheap to clone.
#[derive(Clone, Default)]
pub struct Metrics {
    controllers: Arc<Mutex<ByController>>,
}

impl Metrics {
    /// The counters of controller `kind`/`name`, created on first use and kept until [`Metrics::remove`].
    #[must_use]
    pub fn controller(&self, kind: &str, name: &str) -> Arc<ControllerMetrics> {
        let mut controllers = self.controllers.lock().expect("metrics lock");
        Arc::clone(controllers.entry((kind.to_owned(), name.to_owned())).or_default())
    }

    /// Forgets a controller that was deleted.
    pub fn remove(&self, kind: &str, name: &str) {
        self.controllers.lock().expect("metrics lock").remove(&(kind.to_owned(), name.to_owned()));
    }

    /// The Prometheus text exposition of every metric.
    #[must_use]
    pub fn render(&self, watched_types: usize) -> String {
        let controllers = self.controllers.lock().expect("metrics lock");
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, value: &dyn Fn(&ControllerMetrics) -> String| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for ((controller_kind, controller), metrics) in controllers.iter() {
                let _ = writeln!(
                    out,
                    "{name}{{kind=\"{controller_kind}\",controller=\"{controller}\"}} {}",
                    value(metrics)
                );
            }
        };
        family("metahook_syncs_total", "counter", "Syncs finished, successful or not.", &|m| {
            m.syncs.load(Ordering::Relaxed).to_string()
        });
        family("metahook_sync_errors_total", "counter", "Syncs that failed (and were retried with backoff).", &|m| {
            m.errors.load(Ordering::Relaxed).to_string()
        });
        family("metahook_sync_duration_seconds_total", "counter", "Time spent syncing.", &|m| {
            format!("{:.6}", Duration::from_micros(m.sync_micros.load(Ordering::Relaxed)).as_secs_f64())
        });
        family(
            "metahook_deletion_guard_refusals_total",
            "counter",
            "Syncs refused because they would delete more children than the controller's safe-delete guard allows.",
            &|m| m.guard_refusals.load(Ordering::Relaxed).to_string(),
        );
        family("metahook_queue_depth", "gauge", "Objects waiting to be synced.", &|m| {
            m.depth.lock().expect("metrics lock").as_ref().map_or(0, |d| d()).to_string()
        });
        let _ = writeln!(
            out,
            "# HELP metahook_watched_types Resource types with a shared watch.\n# TYPE metahook_watched_types gauge\nmetahook_watched_types {watched_types}"
        );
        out
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Metrics, informers: crate::informers::Informers) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { continue };
        let metrics = metrics.clone();
        let informers = informers.clone();
        tokio::spawn(async move {
            let mut buffer = [0_u8; 1024];
            let Ok(read) = stream.read(&mut buffer).await else { return };
            let request = String::from_utf8_lossy(&buffer[..read]);
            let path = request.split_whitespace().nth(1).unwrap_or("/");
            let (status, body) = match path {
                "/metrics" => ("200 OK", metrics.render(informers.watched_types())),
                "/healthz" | "/readyz" => ("200 OK", "ok\n".to_owned()),
                _ => ("404 Not Found", "not found\n".to_owned()),
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            if let Err(err) = stream.write_all(response.as_bytes()).await {
                debug!("metrics client went away: {err}");
            }
        });
    }
}

/// Binds `address` (empty = disabled) and serves on it in the background.
pub async fn start(
    address: &str,
    metrics: Metrics,
    informers: crate::informers::Informers,
) -> Option<tokio::task::JoinHandle<()>> {
    if address.is_empty() {
        return None;
    }
    match TcpListener::bind(address).await {
        Ok(listener) => Some(tokio::spawn(serve(listener, metrics, informers))),
        Err(err) => {
            warn!(address, "cannot serve metrics and health endpoints: {err}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text_per_controller() {
        let metrics = Metrics::default();
        let web = metrics.controller("CompositeController", "web");
        web.record(Duration::from_millis(1500), false);
        web.record(Duration::from_millis(500), true);
        web.set_depth(|| 7);
        let text = metrics.render(3);
        assert!(text.contains("metahook_syncs_total{kind=\"CompositeController\",controller=\"web\"} 2"), "{text}");
        assert!(text.contains("metahook_sync_errors_total{kind=\"CompositeController\",controller=\"web\"} 1"));
        assert!(text.contains(
            "metahook_sync_duration_seconds_total{kind=\"CompositeController\",controller=\"web\"} 2.000000"
        ));
        assert!(text.contains("metahook_queue_depth{kind=\"CompositeController\",controller=\"web\"} 7"));
        assert!(text.contains("metahook_watched_types 3"));
        metrics.remove("CompositeController", "web");
        assert!(!metrics.render(0).contains("controller=\"web\""));
    }
}
