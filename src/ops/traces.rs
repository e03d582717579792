//! Traces of the hub's syncs for an OpenTelemetry collector: the `tracing` spans of a sync — the
//! `sync` span and the spans only traces need under it ([`crate::TRACE_SPANS`]: `observe`, `hook`,
//! `write`, `status`) — become OpenTelemetry spans, batched and sent over OTLP/HTTP as protobuf.
//!
//! Off unless `tracing.otlpEndpoint` is set: then no exporter exists, no subscriber wants the
//! trace-only spans (creating one is a cached check), and hook requests carry no `traceparent`.
//!
//! Spans go out through hyper, which the hub has for its hooks anyway, rather than the exporter's
//! default blocking `reqwest` client (a second HTTP stack). hyper needs a Tokio runtime, so the
//! exporter runs in the SDK's batch processor that runs on one; [`Traces::start`] must be called
//! inside the runtime.

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;

/// Where OTLP/HTTP collectors take traces, under their base URL (the OTLP specification's path, which
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is completed with too).
const TRACES_PATH: &str = "/v1/traces";

/// How long one export may take (the OTLP exporters' default, `OTEL_EXPORTER_OTLP_TIMEOUT`).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why traces could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    /// The collector's URL is not usable.
    #[error("tracing.otlpEndpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    /// The TLS setup for an `https` collector failed.
    #[error("TLS for the OTLP collector {endpoint}: {reason}")]
    Tls { endpoint: String, reason: String },
    /// The exporter refused its settings.
    #[error("setting up the OTLP exporter for {endpoint}: {source}")]
    Exporter {
        endpoint: String,
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// The URL spans are posted to, for a collector's base URL (`http://collector:4318` →
/// `http://collector:4318/v1/traces`). `http` or `https`, with a host; the reason otherwise.
pub fn collector_url(endpoint: &str) -> Result<http::Uri, String> {
    let base: http::Uri = endpoint.parse().map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(base.scheme_str(), Some("http" | "https")) {
        return Err("must be an http:// or https:// URL".to_owned());
    }
    if base.host().is_none_or(str::is_empty) {
        return Err("names no host".to_owned());
    }
    if base.query().is_some() {
        return Err("must have no query: it is a base URL, completed with /v1/traces".to_owned());
    }
    format!("{}{TRACES_PATH}", endpoint.trim_end_matches('/')).parse().map_err(|e| format!("not a URL: {e}"))
}

/// The hub's trace exporter, while it runs.
#[derive(Debug)]
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Starts exporting to the collector at `endpoint` (`tracing.otlpEndpoint`, its base URL). Inside a
    /// Tokio runtime: the batch processor is a task on it.
    pub fn start(endpoint: &str) -> Result<Self, TracesError> {
        let endpoint = endpoint.to_owned();
        let url =
            collector_url(&endpoint).map_err(|reason| TracesError::Endpoint { endpoint: endpoint.clone(), reason })?;
        // https collectors are verified against the system's roots, as hooks without a caBundle are.
        let tls = crate::hooks::identity::tls_config(crate::hooks::identity::system_roots(), None)
            .map_err(|reason| TracesError::Tls { endpoint: endpoint.clone(), reason })?;
        let connector =
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http().enable_http1().build();
        let client = opentelemetry_http::hyper::HyperClient::new(connector, EXPORT_TIMEOUT, None);
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url.to_string())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|source| TracesError::Exporter { endpoint, source })?;
        // Batched as the OTEL_BSP_* variables say (a batch every 5 s by default).
        let processor = BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
        let resource = Resource::builder()
            .with_service_name("metahook")
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder().with_span_processor(processor).with_resource(resource).build();
        Ok(Self { provider })
    }

    /// The subscriber layer that turns the hub's spans into OpenTelemetry spans: its own (`metahook`)
    /// spans at `info` and above, with the log lines in them as span events; nothing of its libraries.
    #[must_use]
    pub fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: Subscriber + for<'span> LookupSpan<'span>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("metahook"))
            .with_threads(false)
            .with_filter(Targets::new().with_target("metahook", tracing::Level::INFO))
    }

    /// Sends the spans still batched, then stops exporting. Waits on a blocking thread: the batch
    /// processor answers from its task on the runtime.
    pub async fn shutdown(self) {
        let provider = self.provider;
        match tokio::task::spawn_blocking(move || provider.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("sending the last spans: {e}"),
            Err(e) => tracing::warn!("sending the last spans: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_collector_url_is_the_base_url_with_the_traces_path() {
        assert_eq!(collector_url("http://collector:4318").unwrap(), "http://collector:4318/v1/traces");
        assert_eq!(collector_url("https://otel.example/").unwrap(), "https://otel.example/v1/traces");
        assert_eq!(collector_url("http://gateway/otlp").unwrap(), "http://gateway/otlp/v1/traces");
        for (bad, reason) in [
            ("collector:4318", "http:// or https://"),
            ("grpc://collector:4317", "http:// or https://"),
            ("http://", "URL"),
            ("http://collector:4318?x=1", "no query"),
            ("not a url", "URL"),
        ] {
            let err = collector_url(bad).unwrap_err();
            assert!(err.contains(reason), "{bad}: {err}");
        }
    }
}
