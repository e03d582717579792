//! `hookHosts`: where to open the TCP connection to a hook's server when that is not where its name
//! leads — a Service-form hook (`http://greeter.hooks:8080/sync`) called by a hub outside the cluster
//! (the demo, tests, a laptop) through a port-forward or a local process at `127.0.0.1:41234`.
//!
//! Only the TCP destination changes. The URL, the `Host` header, the TLS server name and certificate
//! verification all keep the hook's own name, so a certificate for `greeter.hooks` verifies although the
//! bytes go to 127.0.0.1. That is why this is a connector: rewriting the URL would verify the
//! certificate against `127.0.0.1`, and a DNS override cannot change the port (the URL's explicit port
//! wins over any port a resolver returns).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::authority::Authority;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Opens TCP connections for hook URLs, honouring the `hookHosts` map.
#[derive(Clone, Debug)]
pub struct Dialer {
    /// (`host[:port]` as configured, `host:port` to connect to), in key order.
    hosts: Arc<Vec<(String, String)>>,
    tcp: HttpConnector,
}

impl Dialer {
    /// `hosts` maps a hook server (`host` or `host:port`, as the hook URL names it; without a port it
    /// means the URL scheme's default port) to the `host:port` to connect to instead.
    #[must_use]
    pub fn new(hosts: &BTreeMap<String, String>) -> Self {
        let mut tcp = HttpConnector::new();
        // Hook calls are small request/response exchanges: Nagle's algorithm would only add latency.
        tcp.set_nodelay(true);
        // https URLs arrive here too (TLS is layered on top by the caller).
        tcp.enforce_http(false);
        Self { hosts: Arc::new(hosts.iter().map(|(k, v)| (k.clone(), v.clone())).collect()), tcp }
    }

    /// Where to connect for `uri` instead of its own authority, if `hookHosts` says so.
    #[must_use]
    pub fn target(&self, uri: &Uri) -> Option<&str> {
        let authority = Authority::of(uri)?;
        let scheme = uri.scheme_str()?;
        self.hosts.iter().find(|(key, _)| authority.matches(key, scheme)).map(|(_, target)| target.as_str())
    }
}

impl tower_service::Service<Uri> for Dialer {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.tcp.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let destination = match self.target(&uri) {
            Some(target) => match Uri::builder().scheme("http").authority(target).path_and_query("/").build() {
                Ok(rewritten) => rewritten,
                Err(e) => return Box::pin(async move { Err(e.into()) }),
            },
            None => uri,
        };
        let connecting = self.tcp.call(destination);
        Box::pin(async move { connecting.await.map_err(Into::into) })
    }
}

/// Checks a `hookHosts` map: keys are `host` or `host:port`, values `host:port`.
pub fn check_hook_hosts(hosts: &BTreeMap<String, String>) -> Result<(), String> {
    for (key, target) in hosts {
        if Authority::parse(key, 0).is_none() {
            return Err(format!("key {key:?} is not host or host:port"));
        }
        let has_port = Authority::parse(target, 0).is_some_and(|a| a.port() != 0);
        if !has_port || target.parse::<http::uri::Authority>().is_err() {
            return Err(format!("{key}: target {target:?} is not host:port"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dialer(pairs: &[(&str, &str)]) -> Dialer {
        Dialer::new(&pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect())
    }

    #[test]
    fn hook_hosts_map_the_authority_as_the_url_names_it() {
        let d = dialer(&[("greeter.hooks:8080", "127.0.0.1:41234"), ("plain.hooks", "127.0.0.1:5000")]);
        assert_eq!(d.target(&"http://greeter.hooks:8080/sync".parse().unwrap()), Some("127.0.0.1:41234"));
        assert_eq!(d.target(&"https://Greeter.Hooks:8080/sync".parse().unwrap()), Some("127.0.0.1:41234"));
        assert_eq!(d.target(&"http://greeter.hooks:80/sync".parse().unwrap()), None);
        assert_eq!(d.target(&"http://plain.hooks/sync".parse().unwrap()), Some("127.0.0.1:5000"));
        assert_eq!(d.target(&"http://plain.hooks:80/sync".parse().unwrap()), Some("127.0.0.1:5000"));
        assert_eq!(d.target(&"http://elsewhere/sync".parse().unwrap()), None);
    }

    #[test]
    fn hook_hosts_need_a_port_to_connect_to() {
        let map = |k: &str, v: &str| BTreeMap::from([(k.to_owned(), v.to_owned())]);
        assert!(check_hook_hosts(&map("greeter.hooks:8080", "127.0.0.1:41234")).is_ok());
        assert!(check_hook_hosts(&map("greeter.hooks", "localhost:9000")).is_ok());
        assert!(check_hook_hosts(&map("greeter.hooks", "127.0.0.1")).is_err());
        assert!(check_hook_hosts(&map("greeter.hooks", "http://127.0.0.1:80")).is_err());
        assert!(check_hook_hosts(&map("", "127.0.0.1:80")).is_err());
    }

    #[tokio::test]
    async fn connections_go_to_the_mapped_address() {
        use tower_service::Service as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = listener.local_addr().unwrap().to_string();
        let mut d = dialer(&[("greeter.hooks:8080", &target)]);
        let (connected, accepted) =
            tokio::join!(d.call("http://greeter.hooks:8080/sync".parse().unwrap()), listener.accept());
        assert!(connected.is_ok() && accepted.is_ok());
    }
}
