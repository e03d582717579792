//! Traces that cross into the hook: a `metahook run` exporting to an OTLP/HTTP collector that lives in
//! the test, a real Python hook, and the control plane. One sync is one trace, and the hook is called
//! with that trace's context; a hub without a collector sends none.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use prost::Message as _;
use serde_json::{Value, json};
use support::{HubProcess, World, eventually};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const WAIT: Duration = Duration::from_secs(60);

/// A span as the collector received it; ids in lower-case hex, as `traceparent` writes them.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    trace_id: String,
    span_id: String,
    /// Empty for a root span.
    parent: String,
    name: String,
    attributes: BTreeMap<String, String>,
}

/// An OTLP/HTTP collector: takes `POST /v1/traces` (protobuf) on loopback and keeps every span.
struct Collector {
    endpoint: String,
    spans: Arc<Mutex<Vec<Received>>>,
}

impl Collector {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&spans);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, Arc::clone(&kept)));
            }
        });
        Self { endpoint, spans }
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }
}

/// One connection's requests (the exporter keeps its connection alive), each answered 200 and empty:
/// an `ExportTraceServiceResponse` with nothing rejected.
async fn serve(mut stream: tokio::net::TcpStream, spans: Arc<Mutex<Vec<Received>>>) {
    let mut buffer = Vec::new();
    loop {
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let mut chunk = [0_u8; 8192];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_lowercase();
        assert!(head.starts_with("post /v1/traces "), "the exporter posts to /v1/traces: {head}");
        assert!(head.contains("content-type: application/x-protobuf"), "{head}");
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|v| v.trim().parse().unwrap())
            .expect("a Content-Length");
        while buffer.len() < head_end + length {
            let mut chunk = [0_u8; 8192];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buffer.drain(..head_end + length).skip(head_end).collect();
        let request = ExportTraceServiceRequest::decode(body.as_slice()).expect("an OTLP protobuf export");
        spans.lock().unwrap().extend(received(request));
        let answer = "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n";
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn received(request: ExportTraceServiceRequest) -> Vec<Received> {
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = attributes(&resource_spans.resource.map(|r| r.attributes).unwrap_or_default());
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
            out.push(Received {
                service: service.clone(),
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent: hex(&span.parent_span_id),
                name: span.name,
                attributes: attributes(&span.attributes),
            });
        }
    }
    out
}

fn attributes(list: &[KeyValue]) -> BTreeMap<String, String> {
    let text = |value: &Option<AnyValue>| match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    };
    list.iter().map(|kv| (kv.key.clone(), text(&kv.value))).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One ConfigMap per parent; the status counts the ConfigMaps observed.
const GREETER: &str = r#"
def sync(req):
    parent = req["parent"]
    cms = req["children"]["ConfigMap.v1"]
    return {
        "status": {"configMaps": len(cms)},
        "children": [{"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": parent["metadata"]["name"] + "-cm"},
                      "data": {"greeting": "hi"}}],
    }
"#;

/// The `traceparent` of each `/sync` request the hook got about the parent `name` (`None`: none sent).
fn traceparents(w: &World, name: &str) -> Vec<Option<String>> {
    w.hook
        .requests_with_headers("/sync")
        .iter()
        .filter(|r| r["request"]["parent"]["metadata"]["name"] == name)
        .map(|r| r["headers"].get("traceparent").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn one_sync_is_one_trace_and_the_hook_is_called_in_it() {
    let collector = Collector::start().await;
    let mut w = World::new("tracing", GREETER).await;
    w.composite(json!({
        "generateSelector": true,
        "parentResource": {"apiVersion": "test.metahook.dev/v1", "resource": "things"},
        "childResources": [{"apiVersion": "v1", "resource": "configmaps"}],
        "hooks": {"sync": {"webhook": {"url": w.hook.url("/sync")}}},
    }))
    .await;

    // The test's own hub exports no traces: its hook requests carry no trace context.
    w.thing("untraced", json!({})).await;
    eventually(WAIT, || async { w.config_map("untraced-cm").await }).await;
    let sent = traceparents(&w, "untraced");
    assert!(!sent.is_empty() && sent.iter().all(Option::is_none), "traces off, yet: {sent:?}");
    w.stop_hub().await;

    // A `metahook run` exporting to the collector, in batches of 100 ms.
    let tracing = format!("tracing:\n  otlpEndpoint: \"{}\"\n", collector.endpoint);
    let hub = HubProcess::start_with(&w.label, &tracing, &[("OTEL_BSP_SCHEDULE_DELAY", "100")]);
    w.thing("traced", json!({})).await;
    let object = format!("{}/traced", w.ns.name);
    // The parent's first sync: it observes, asks the hook, creates the ConfigMap and writes the status.
    let (root, trace) = eventually(WAIT, || async {
        let spans = collector.spans();
        spans.iter().filter(|s| s.name == "sync" && s.attributes.get("object") == Some(&object)).find_map(|root| {
            let trace: Vec<Received> = spans.iter().filter(|s| s.trace_id == root.trace_id).cloned().collect();
            let has = |name: &str| trace.iter().any(|s| s.name == name);
            (has("observe") && has("hook") && has("write") && has("status")).then(|| (root.clone(), trace))
        })
    })
    .await;

    assert_eq!(root.parent, "", "the sync span is the root of its trace");
    assert_eq!(root.service, "metahook");
    assert_eq!(root.attributes["controller"], w.label);
    assert_eq!(root.attributes["kind"], "CompositeController");
    assert!(root.attributes["sync_id"].parse::<u64>().is_ok(), "{root:?}");
    let names: Vec<&str> = trace.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names.iter().filter(|n| **n == "sync").count(), 1, "one sync, one trace: {names:?}");
    for span in trace.iter().filter(|s| s.name != "sync") {
        assert_eq!(span.parent, root.span_id, "{} is a child of the sync: {span:?}", span.name);
    }
    let one = |name: &str| {
        let found: Vec<&Received> = trace.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "one {name} span: {names:?}");
        found[0].clone()
    };
    one("observe");
    one("status");
    let hook = one("hook");
    assert_eq!(hook.attributes["url.path"], "/sync");
    assert_eq!(hook.attributes["server.address"], "127.0.0.1");
    assert_eq!(hook.attributes["hook.name"], "sync");
    assert_eq!(hook.attributes["hook.version"], "v1");
    assert_eq!(hook.attributes["http.response.status_code"], "200");
    let write = one("write");
    assert_eq!(write.attributes["verb"], "create");
    assert_eq!(write.attributes["kind"], "ConfigMap");
    assert_eq!(write.attributes["name"], format!("{}/traced-cm", w.ns.name));
    assert_eq!(write.attributes["outcome"], "created");

    // The hook was called in that trace, as the child of that `hook` span.
    let expected = format!("00-{}-{}-01", root.trace_id, hook.span_id);
    let sent = traceparents(&w, "traced");
    assert!(sent.contains(&Some(expected.clone())), "the hook got {sent:?}, not {expected}");
    assert!(sent.iter().all(Option::is_some), "every call of the traced hub carries one: {sent:?}");

    hub.kill();
    w.finish("CompositeController").await;
}
