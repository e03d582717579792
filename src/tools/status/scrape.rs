//! Reading one source's `/metrics` into samples: a URL directly, over HTTP or HTTPS, or a Pod through
//! the API server's proxy with the kubeconfig's client.
//!
//! A direct HTTPS scrape verifies the hub's certificate against `--metrics-ca` (else the system's
//! roots), for the name `--metrics-server-name` gives (else the URL's host: a port-forward to
//! `127.0.0.1` needs the name, since the certificate names the Service), and sends the token of
//! `--metrics-token-file` as `Authorization: Bearer`, as Prometheus does for `metricsAuth: kubernetes`.
//! Through the proxy none of that applies: the API server verifies nothing of the Pod's certificate and
//! forwards no token ([`super::sources`]).

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, StatusCode, Uri};
use http_body_util::BodyExt as _;
use hyper_rustls::{FixedServerNameResolver, HttpsConnector};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use kube::Client;
use rustls::pki_types::ServerName;

use super::exposition::{self, ExpositionError, Sample};
use super::sources::Source;

/// How long one scrape of `/metrics` may take.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why one source gave no samples; the report shows it as that source's error.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("not a URL: {0}")]
    Url(#[source] http::uri::InvalidUri),
    #[error("only http:// and https:// URLs")]
    Scheme,
    #[error("{0}")]
    Unreachable(String),
    #[error("{0}")]
    Request(#[source] hyper_util::client::legacy::Error),
    #[error("through the API server: {0}")]
    Proxy(#[source] kube::Error),
    #[error("reading the answer: {0}")]
    Body(String),
    #[error("answered {status}{hint}")]
    Status { status: StatusCode, hint: &'static str },
    #[error("no answer within {}s", SCRAPE_TIMEOUT.as_secs())]
    Timeout,
    #[error("the answer is not UTF-8 text")]
    NotText,
    #[error("the answer is not the exposition format: {0}")]
    Exposition(#[source] ExpositionError),
}

/// Why the scraper could not be set up: its files are read before anything is scraped.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("--metrics-ca {path}: {reason}")]
    Ca { path: String, reason: String },
    #[error("--metrics-token-file {path}: {reason}")]
    Token { path: String, reason: String },
    #[error("--metrics-server-name {name:?}: {reason}")]
    ServerName { name: String, reason: String },
    #[error("TLS: {0}")]
    Tls(String),
}

/// How to reach the sources: one HTTP(S) client for the URLs, the kube client for the Pods.
pub struct Scraper {
    http: HttpClient<HttpsConnector<HttpConnector>, http_body_util::Empty<Bytes>>,
    /// `Bearer <token>`, marked sensitive.
    authorization: Option<HeaderValue>,
    kube: Client,
}

impl Scraper {
    /// A scraper trusting the CA file `ca` (else the system's roots), verifying `server_name` (else each
    /// URL's host) and sending the token in `token_file`, if given.
    pub fn new(
        kube: Client,
        ca: Option<&Path>,
        server_name: Option<&str>,
        token_file: Option<&Path>,
    ) -> Result<Self, SetupError> {
        use crate::hooks::identity;
        let roots = match ca {
            Some(path) => {
                let failed = |reason: String| SetupError::Ca { path: path.display().to_string(), reason };
                let pem = std::fs::read(path).map_err(|e| failed(e.to_string()))?;
                std::sync::Arc::new(identity::roots_from_pem(&pem).map_err(failed)?)
            }
            None => identity::system_roots(),
        };
        let tls = identity::tls_config(roots, None).map_err(SetupError::Tls)?;
        let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http();
        let builder = match server_name {
            Some(name) => {
                let parsed = ServerName::try_from(name.to_owned())
                    .map_err(|e| SetupError::ServerName { name: name.to_owned(), reason: e.to_string() })?;
                builder.with_server_name_resolver(FixedServerNameResolver::new(parsed))
            }
            None => builder,
        };
        let connector = builder.enable_http1().build();
        let http = HttpClient::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
        let authorization = token_file.map(bearer).transpose()?;
        Ok(Self { http, authorization, kube })
    }

    /// Every sample `source` serves now.
    pub async fn scrape(&self, source: &Source) -> Result<Vec<Sample>, ScrapeError> {
        let fetch = async {
            match source {
                Source::Url(url) => self.get(url).await,
                Source::Pod { path, .. } => self.through_proxy(path).await,
                Source::Unreachable { reason, .. } => Err(ScrapeError::Unreachable(reason.clone())),
            }
        };
        let text = tokio::time::timeout(SCRAPE_TIMEOUT, fetch).await.map_err(|_| ScrapeError::Timeout)??;
        exposition::parse(&text).map_err(ScrapeError::Exposition)
    }

    async fn get(&self, url: &str) -> Result<String, ScrapeError> {
        let uri: Uri = url.parse().map_err(ScrapeError::Url)?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return Err(ScrapeError::Scheme);
        }
        let mut request = http::Request::get(uri);
        if let Some(value) = &self.authorization {
            request = request.header(http::header::AUTHORIZATION, value.clone());
        }
        let request = request.body(http_body_util::Empty::new()).map_err(|e| ScrapeError::Body(e.to_string()))?;
        let response = self.http.request(request).await.map_err(ScrapeError::Request)?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| ScrapeError::Body(e.to_string()))?.to_bytes();
        if !status.is_success() {
            let hint = match (status, self.authorization.is_some()) {
                (StatusCode::UNAUTHORIZED, false) => {
                    ": the hub wants a token (metricsAuth: kubernetes), give one with --metrics-token-file"
                }
                (StatusCode::UNAUTHORIZED, true) => ": the API server does not accept the token",
                (StatusCode::FORBIDDEN, _) => ": the token's user may not get /metrics",
                _ => "",
            };
            return Err(ScrapeError::Status { status, hint });
        }
        String::from_utf8(body.to_vec()).map_err(|_| ScrapeError::NotText)
    }

    /// GET `path` on the API server, which forwards it to the Pod.
    async fn through_proxy(&self, path: &str) -> Result<String, ScrapeError> {
        let request =
            http::Request::get(path).body(kube::client::Body::empty()).map_err(|e| ScrapeError::Body(e.to_string()))?;
        let response = self.kube.send(request).await.map_err(ScrapeError::Proxy)?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| ScrapeError::Body(e.to_string()))?.to_bytes();
        if !status.is_success() {
            let hint = match status {
                StatusCode::UNAUTHORIZED => {
                    ": the hub wants a token (metricsAuth: kubernetes), which the API server's proxy does not \
                     forward; use --metrics-url with --metrics-token-file"
                }
                StatusCode::FORBIDDEN => ": may you get pods/proxy in that namespace?",
                _ => "",
            };
            return Err(ScrapeError::Status { status, hint });
        }
        String::from_utf8(body.to_vec()).map_err(|_| ScrapeError::NotText)
    }
}

/// `Bearer <the file's token>`, the file's surrounding whitespace (a trailing newline) left out.
fn bearer(path: &Path) -> Result<HeaderValue, SetupError> {
    let failed = |reason: String| SetupError::Token { path: path.display().to_string(), reason };
    let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(failed("empty".to_owned()));
    }
    let mut value = HeaderValue::try_from(format!("Bearer {token}"))
        .map_err(|_| failed("not a token: bytes a header cannot carry".to_owned()))?;
    value.set_sensitive(true);
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_file_becomes_a_sensitive_bearer_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "abc.def\n").unwrap();
        let value = bearer(&path).unwrap();
        assert_eq!(value, "Bearer abc.def");
        assert!(value.is_sensitive());
        std::fs::write(&path, "\n").unwrap();
        assert!(bearer(&path).unwrap_err().to_string().ends_with(": empty"));
        assert!(bearer(&dir.path().join("absent")).is_err());
    }
}
