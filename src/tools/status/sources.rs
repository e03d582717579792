//! Where the metrics come from: the `--metrics-url`s as given, and the hub's Pods found by
//! `--metrics-pods`, each reached through the API server's pod proxy.
//!
//! With sharding every replica syncs its own share of the parents, so the figures of a controller are
//! the sum over all of them; listing the Pods finds every replica without a port-forward each, with the
//! kubeconfig's credentials only (`get` on `pods/proxy`). The proxy drops the caller's `Authorization`
//! header once it has authenticated the caller (`k8s.io/apiserver`'s authentication filter) and sends
//! none of its own, so a hub with `metricsAuth: kubernetes` answers it 401: those are read with
//! `--metrics-url` and a token instead.

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};

/// One place to scrape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A URL, `http://` or `https://`, scraped directly.
    Url(String),
    /// A Pod's metrics port, through the API server: `path` is the proxy path on the API server.
    Pod { pod: String, path: String },
    /// A replica (or a set of them) that cannot be scraped, and why: a Pod without an address, a
    /// selector nothing matches, Pods that could not be listed.
    Unreachable { name: String, reason: String },
}

impl Source {
    /// What the report calls it: the URL, or for a Pod the API server path it was read from.
    #[must_use]
    pub fn url(&self) -> &str {
        match self {
            Self::Url(url) => url,
            Self::Pod { path, .. } => path,
            Self::Unreachable { name, .. } => name,
        }
    }

    /// `namespace/name` of the Pod it reads, if it reads one.
    #[must_use]
    pub fn pod(&self) -> Option<&str> {
        match self {
            Self::Pod { pod, .. } => Some(pod),
            Self::Url(_) | Self::Unreachable { .. } => None,
        }
    }
}

/// `--metrics-pods`: the namespace and label selector of the hub's Pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSelector {
    pub namespace: String,
    pub selector: String,
}

/// Reads `NAMESPACE/SELECTOR`; the selector may itself hold `/` (`app.kubernetes.io/name=metahook`), a
/// namespace cannot.
pub fn pod_selector(text: &str) -> Result<PodSelector, String> {
    match text.split_once('/') {
        Some((namespace, selector)) if !namespace.is_empty() && !selector.is_empty() => {
            Ok(PodSelector { namespace: namespace.to_owned(), selector: selector.to_owned() })
        }
        _ => Err(format!("{text:?} is not NAMESPACE/SELECTOR, e.g. metahook/app.kubernetes.io/name=metahook")),
    }
}

/// The API server path that proxies to `port` of Pod `namespace/name` in `scheme` and asks for
/// `/metrics`: `/api/v1/namespaces/{namespace}/pods/{scheme}:{name}:{port}/proxy/metrics`. The API
/// server connects to the Pod's IP; for `https` it does not verify the Pod's certificate (it connects
/// by IP, which a serving certificate does not name).
#[must_use]
pub fn proxy_path(namespace: &str, name: &str, scheme: &str, port: u16) -> String {
    format!("/api/v1/namespaces/{namespace}/pods/{scheme}:{name}:{port}/proxy/metrics")
}

/// The port of a Pod's container port named `port`, or `port` itself when it is a number.
fn port_number(pod: &Pod, port: &str) -> Option<u16> {
    if let Ok(number) = port.parse() {
        return Some(number);
    }
    let containers = pod.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
    containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(port))
        .and_then(|p| u16::try_from(p.container_port).ok())
}

/// One source per Pod that `pods` selects, by name: a Pod without an IP (not scheduled or not started)
/// or without the port is [`Source::Unreachable`], and so is the whole selector when it matches
/// nothing or the Pods cannot be listed — a replica that is not running is a finding, not a gap.
pub async fn pods(client: &Client, pods: &PodSelector, scheme: &str, port: &str) -> Vec<Source> {
    let name = format!("pods {}/{}", pods.namespace, pods.selector);
    let api: Api<Pod> = Api::namespaced(client.clone(), &pods.namespace);
    let listed = match api.list(&ListParams::default().labels(&pods.selector)).await {
        Ok(list) => list.items,
        Err(e) => return vec![Source::Unreachable { name, reason: format!("cannot list them: {e}") }],
    };
    if listed.is_empty() {
        return vec![Source::Unreachable { name, reason: "no Pod matches".to_owned() }];
    }
    let mut sources: Vec<Source> = listed.iter().map(|pod| pod_source(pod, &pods.namespace, scheme, port)).collect();
    sources.sort_by(|a, b| a.url().cmp(b.url()));
    sources
}

fn pod_source(pod: &Pod, namespace: &str, scheme: &str, port: &str) -> Source {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Unknown");
    let unreachable = |reason: String| Source::Unreachable { name: format!("pod {namespace}/{name}"), reason };
    if pod.metadata.deletion_timestamp.is_some() {
        return unreachable("being deleted".to_owned());
    }
    if status.and_then(|s| s.pod_ip.as_deref()).is_none_or(str::is_empty) {
        return unreachable(format!("{phase}, without an IP"));
    }
    match port_number(pod, port) {
        Some(number) => {
            Source::Pod { pod: format!("{namespace}/{name}"), path: proxy_path(namespace, &name, scheme, number) }
        }
        None => unreachable(format!("no container port named {port:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn the_proxy_path_names_scheme_pod_and_port() {
        assert_eq!(
            proxy_path("metahook", "metahook-7d9c-x2", "https", 9999),
            "/api/v1/namespaces/metahook/pods/https:metahook-7d9c-x2:9999/proxy/metrics"
        );
        assert_eq!(proxy_path("ns", "p", "http", 80), "/api/v1/namespaces/ns/pods/http:p:80/proxy/metrics");
    }

    #[test]
    fn the_selector_is_split_at_the_first_slash() {
        assert_eq!(
            pod_selector("metahook/app.kubernetes.io/name=metahook,app.kubernetes.io/component=hub").unwrap(),
            PodSelector {
                namespace: "metahook".into(),
                selector: "app.kubernetes.io/name=metahook,app.kubernetes.io/component=hub".into()
            }
        );
        for wrong in ["metahook", "/app=x", "metahook/"] {
            assert!(pod_selector(wrong).is_err(), "{wrong}");
        }
    }

    #[test]
    fn a_running_pod_is_reached_by_its_named_port_and_others_are_reported() {
        let running = pod(serde_json::json!({
            "metadata": {"name": "hub-0"},
            "spec": {"containers": [{"name": "hub", "ports": [{"name": "probes", "containerPort": 8081},
                                                                {"name": "metrics", "containerPort": 9999}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.7"}
        }));
        assert_eq!(
            pod_source(&running, "metahook", "https", "metrics"),
            Source::Pod {
                pod: "metahook/hub-0".into(),
                path: "/api/v1/namespaces/metahook/pods/https:hub-0:9999/proxy/metrics".into()
            }
        );
        assert_eq!(
            pod_source(&running, "metahook", "http", "8080").url(),
            proxy_path("metahook", "hub-0", "http", 8080)
        );
        let Source::Unreachable { name, reason } = pod_source(&running, "metahook", "http", "web") else { panic!() };
        assert_eq!((name.as_str(), reason.as_str()), ("pod metahook/hub-0", "no container port named \"web\""));
        let pending = pod(serde_json::json!({"metadata": {"name": "hub-1"}, "status": {"phase": "Pending"}}));
        let Source::Unreachable { reason, .. } = pod_source(&pending, "metahook", "http", "metrics") else { panic!() };
        assert_eq!(reason, "Pending, without an IP");
    }
}
