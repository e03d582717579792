//! The hub's own HTTP side (`/metrics` and the probes, the profiles): axum routers served by hyper, one
//! connection task each, kept alive between requests.
//!
//! axum's own `serve` has no setting for how long a client may take to send a request's head, and a
//! scrape port is reachable by whatever reaches the Pod; so connections are served here with
//! hyper-util's builder, which has one ([`HEAD_TIMEOUT`]), and a failing `accept()` (out of file
//! descriptors, say) backs off as Go's `http.Server` does — 5 ms doubling to 1 s — instead of spinning.
//! Everything else is axum's and hyper's: routing with query strings, 405 for other methods (HEAD is a
//! GET without its body), keep-alive, HTTP/1.1 framing. HTTPS, when asked for, is tokio-rustls's
//! acceptor over the same loop, its certificate from [`crate::ops::serving_cert`].

use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tracing::{debug, warn};

/// How long a client may take to send a request's head (slow or idle clients are dropped, not kept).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds `address`: `host:port`, or Go's `:port` for every address of the host (IPv6 and IPv4 where
/// the host has IPv6, else IPv4).
pub async fn bind(address: &str) -> std::io::Result<TcpListener> {
    match address.strip_prefix(':') {
        Some(port) => match TcpListener::bind(format!("[::]:{port}")).await {
            Ok(listener) => Ok(listener),
            Err(_) => TcpListener::bind(format!("0.0.0.0:{port}")).await,
        },
        None => TcpListener::bind(address).await,
    }
}

/// The wait after the `failures`-th accept error in a row: 5 ms doubling, at most 1 s.
#[must_use]
pub fn accept_backoff(failures: u32) -> Duration {
    Duration::from_millis(5_u64.saturating_mul(1_u64 << failures.min(9).saturating_sub(1))).min(Duration::from_secs(1))
}

/// Serves `router` on `listener` until the task is dropped; a request head must arrive within
/// `head_timeout`. With `tls`, every connection is HTTPS (the handshake within `head_timeout` too).
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    head_timeout: Duration,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let mut failures = 0_u32;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                failures = 0;
                stream
            }
            Err(err) => {
                failures = failures.saturating_add(1);
                let wait = accept_backoff(failures);
                warn!("accepting a connection: {err}; retrying in {wait:?}");
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        let service = TowerToHyperService::new(router.clone());
        let tls = tls.clone();
        tokio::spawn(async move {
            let Some(tls) = tls else {
                return serve_connection(stream, service, head_timeout).await;
            };
            match tokio::time::timeout(head_timeout, tls.accept(stream)).await {
                Ok(Ok(stream)) => serve_connection(stream, service, head_timeout).await,
                Ok(Err(err)) => debug!("TLS handshake failed: {err}"),
                Err(_) => debug!("TLS handshake not finished in {head_timeout:?}"),
            }
        });
    }
}

async fn serve_connection<I>(io: I, service: TowerToHyperService<axum::Router>, head_timeout: Duration)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(head_timeout);
    if let Err(err) = builder.serve_connection(TokioIo::new(io), service).await {
        debug!("HTTP connection ended: {err}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_back_off_as_go_does() {
        let waits: Vec<u64> = (1..=10).map(|n| u64::try_from(accept_backoff(n).as_millis()).unwrap()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
    }
}
