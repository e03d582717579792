//! One hook of one controller, ready to call: its URL, timeout and decoding mode, the live sources of
//! its TLS identity and `Authorization` header, its ETag cache, its metric labels and the versions it
//! reports of itself ([`super::version`]).
//!
//! A URL with `user:password@` is called as Go's HTTP client (and so Metacontroller) calls it: the
//! userinfo becomes `Authorization: Basic ...` unless the hook's settings supply an `Authorization`
//! header, and it is never part of the URL dialled, nor of any error, Event or log line.
//!
//! Built when the controller starts (bad settings are refused then); credentials are read at call time
//! from the watched Secrets and `ConfigMap`s, so a rotation applies to the next call. The HTTP client is
//! looked up again only when the TLS material it was built from has changed.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Uri, header};
use http_body_util::{BodyExt as _, Full};
use serde::Serialize;
use serde_json::Value;
use tracing::{Instrument as _, info};

use super::credentials::{CredentialError, Sensitive, Watched};
use super::etag::{EtagCache, RootKey};
use super::identity::{self, AuthHeader, REDACTED};
use super::metrics::HookLabels;
use super::pool::{HttpClient, IdentityError, Part, TlsIdentity};
use super::settings::{self, AuthSource, CaSource, Settings, SettingsError};
use super::version::{HOOK_VERSION_HEADER, HookVersions};
use super::{HookError, REPLICA_HEADER, Shared, retry_after};
use crate::api::{EndpointConfig, Hook, HookVersion, UnmarshalMode};

const USER_AGENT: &str = concat!("metahook/", env!("CARGO_PKG_VERSION"));

/// The most of a non-200 body quoted in an error (and so in an Event).
const QUOTED_BODY: usize = 1024;

/// A hook ready to call. Cheap to clone.
#[derive(Clone)]
pub struct Endpoint(Arc<Inner>);

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("url", &self.0.url).field("labels", &self.0.labels).finish_non_exhaustive()
    }
}

struct Inner {
    shared: Arc<Shared>,
    uri: Uri,
    url: String,
    timeout: Duration,
    version: HookVersion,
    mode: UnmarshalMode,
    labels: HookLabels,
    ca: Option<Ca>,
    client_cert: Option<ClientCertSource>,
    auth: Option<Auth>,
    /// Basic auth from the URL's userinfo: sent only when `auth` is `None`, as Go sets the header from
    /// the URL only when the request has none.
    url_auth: Option<AuthHeader>,
    etag: Option<EtagCache>,
    /// The versions the hook reported (shared by a controller's hooks).
    versions: HookVersions,
    /// The client for the TLS material last used, with the versions of the objects it was read from.
    client: Mutex<Option<(Vec<u64>, Arc<HttpClient>)>>,
}

enum Ca {
    Inline(Sensitive),
    Watched { source: Arc<Watched>, key: String },
}

struct ClientCertSource {
    source: Arc<Watched>,
    cert_key: String,
    key_key: String,
}

enum Auth {
    Scheme { scheme: String, source: Arc<Watched>, key: String },
    Basic { source: Arc<Watched>, username_key: String, password_key: String },
}

impl Endpoint {
    /// Resolves `hook`'s URL and settings (its own, or the `endpointConfigs` entry for its host) and
    /// starts watching the objects they read.
    pub(super) fn new(
        shared: Arc<Shared>,
        hook: &Hook,
        endpoint_configs: &[EndpointConfig],
        labels: HookLabels,
        versions: HookVersions,
    ) -> Result<Self, SettingsError> {
        let at = format!("hooks.{}.webhook", labels.hook);
        let settings::HookUrl { uri, userinfo } = settings::hook_url(&at, &hook.webhook)?;
        let url_auth = userinfo.map(|u| AuthHeader::url_userinfo(&u.username, u.password.expose()));
        let Settings { ca, client_cert, auth } = settings::resolve(&at, &hook.webhook, &uri, endpoint_configs)?;
        let credentials = &shared.credentials;
        let ca = ca.map(|ca| match ca {
            CaSource::Inline(pem) => Ca::Inline(Sensitive::new(pem)),
            CaSource::Key(k) => Ca::Watched { source: credentials.watch(&k.object), key: k.key },
        });
        let client_cert = client_cert.map(|c| ClientCertSource {
            source: credentials.watch(&c.cert.object),
            cert_key: c.cert.key,
            key_key: c.key.key,
        });
        let auth = auth.map(|a| match a {
            AuthSource::Scheme { scheme, credentials: k } => {
                Auth::Scheme { scheme, source: credentials.watch(&k.object), key: k.key }
            }
            AuthSource::Basic { username, password } => Auth::Basic {
                source: credentials.watch(&username.object),
                username_key: username.key,
                password_key: password.key,
            },
        });
        Ok(Self(Arc::new(Inner {
            url: uri.to_string(),
            uri,
            timeout: hook.webhook.timeout(),
            version: hook.version(),
            mode: hook.unmarshal_mode(),
            labels,
            ca,
            client_cert,
            auth,
            url_auth,
            etag: EtagCache::new(hook.webhook.etag.as_ref()),
            versions,
            client: Mutex::default(),
            shared,
        })))
    }

    /// The URL called (the `service` form spelled out), without userinfo.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.0.url
    }

    /// The wire protocol version of the hook.
    #[must_use]
    pub fn version(&self) -> HookVersion {
        self.0.version
    }

    pub(super) fn mode(&self) -> UnmarshalMode {
        self.0.mode
    }

    /// POSTs `body` (about object `root`) and returns the JSON answer of a 200, or the cached one of a
    /// 304/412. The timeout bounds the whole call — reading credentials, connecting, the last body
    /// byte — so a hook that drips its answer cannot hold a worker; the body is read up to the hub's
    /// limit and no further. Counted in the hook metrics, however it ends.
    ///
    /// Traced as a `hook` span (a client span: server, path, hook version, status code), whose context
    /// the request carries when the hub exports traces.
    pub(super) async fn call(&self, body: &impl Serialize, root: &Value) -> Result<Value, HookError> {
        let inner = &*self.0;
        let metrics = &inner.shared.metrics;
        let _in_flight = metrics.start(&inner.labels);
        let started = Instant::now();
        let mut code = None;
        let span = tracing::info_span!(
            target: crate::TRACE_SPANS,
            "hook",
            otel.kind = "client",
            hook.name = inner.labels.hook.as_str(),
            hook.version = match inner.version {
                HookVersion::V1 => "v1",
                HookVersion::V2 => "v2",
            },
            server.address = inner.uri.host().unwrap_or_default(),
            url.path = inner.uri.path(),
            http.response.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        let exchange = tokio::time::timeout(inner.timeout, self.exchange(body, root, &mut code));
        let result = match exchange.instrument(span.clone()).await {
            Ok(result) => result,
            Err(_) => Err(HookError::Timeout { url: inner.url.clone(), timeout: inner.timeout }),
        };
        metrics.finish(&inner.labels, code, started.elapsed());
        if let Some(code) = code {
            span.record("http.response.status_code", code);
        }
        if let Err(e) = &result {
            span.record("otel.status_description", tracing::field::display(e));
        }
        result
    }

    async fn exchange(&self, body: &impl Serialize, root: &Value, code: &mut Option<u16>) -> Result<Value, HookError> {
        let inner = &*self.0;
        let url = || inner.url.clone();
        let client = self.client().await?;
        let auth = self.auth().await?;
        let cached = inner.etag.as_ref().map(|cache| {
            let key = RootKey::of(root);
            let tag = cache.tag(&key);
            (cache, key, tag)
        });
        let body = serde_json::to_vec(body).map_err(|source| HookError::Encode { url: url(), source })?;
        let mut request = Request::post(inner.uri.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::USER_AGENT, USER_AGENT);
        if let Some(auth) = auth.as_ref().or(inner.url_auth.as_ref()) {
            request = request.header(header::AUTHORIZATION, auth.value().clone());
        }
        if let Some((_, _, Some(tag))) = &cached {
            request = request.header(header::IF_NONE_MATCH, tag.as_str());
        }
        if let Some(replica) = &inner.shared.replica {
            request = request.header(REPLICA_HEADER, replica.clone());
        }
        if inner.shared.trace_context
            && let Some(headers) = request.headers_mut()
        {
            inject_trace_context(headers);
        }
        let request = request.body(Full::new(Bytes::from(body))).map_err(|e| http_error(&inner.url, &e))?;
        let response = client.request(request).await.map_err(|e| http_error(&inner.url, &e))?;
        let status = response.status().as_u16();
        *code = Some(status);
        if status == 429 {
            let retry_after = retry_after(response.headers()).unwrap_or(Duration::from_secs(1));
            return Err(HookError::TooManyRequests { url: url(), retry_after });
        }
        let (parts, body) = response.into_parts();
        let bytes = read_limited(&inner.url, body, &parts.headers, inner.shared.limit).await?;
        if matches!(status, 200 | 304 | 412)
            && let Some(version) = parts.headers.get(HOOK_VERSION_HEADER).and_then(|v| v.to_str().ok())
            && inner.versions.observe(RootKey::of(root), version)
        {
            info!(url = %inner.url, %version, "the hook reports a new version; its parents are synced again");
        }
        if let Some((cache, key, Some(tag))) = &cached
            && (status == 304 || status == 412)
        {
            let body = cache.body(key, tag).ok_or_else(|| HookError::EtagGone { url: url(), code: status })?;
            inner.shared.metrics.etag(&inner.labels, true);
            return serde_json::from_slice(&body).map_err(|source| HookError::Decode { url: url(), source });
        }
        if status != 200 {
            let body = quoted_body(&bytes, auth.iter().chain(&inner.url_auth));
            if is_permanent(&parts.headers) {
                let message = body.lines().find(|l| !l.trim().is_empty()).unwrap_or_default().trim().to_owned();
                return Err(HookError::Permanent { url: url(), code: status, message });
            }
            return Err(HookError::Status { url: url(), code: status, body });
        }
        let value = serde_json::from_slice(&bytes).map_err(|source| HookError::Decode { url: url(), source })?;
        if let Some((cache, key, _)) = cached {
            inner.shared.metrics.etag(&inner.labels, false);
            if let Some(tag) = parts.headers.get(header::ETAG).and_then(|t| t.to_str().ok()) {
                cache.store(key, tag.to_owned(), Bytes::from(bytes));
            }
        }
        Ok(value)
    }

    /// The pooled client for the current TLS material, rebuilt only after that material changed.
    async fn client(&self) -> Result<Arc<HttpClient>, HookError> {
        let inner = &*self.0;
        let sources = self.tls_sources();
        let seen: Vec<u64> = sources.iter().map(|s| s.version()).collect();
        if let Some((versions, client)) = &*inner.client.lock().expect("endpoint client lock")
            && *versions == seen
            && !seen.contains(&0)
        {
            return Ok(Arc::clone(client));
        }
        let mut versions = Vec::with_capacity(sources.len());
        let ca = match &inner.ca {
            None => None,
            Some(Ca::Inline(pem)) => Some(pem.clone()),
            Some(Ca::Watched { source, key }) => {
                let snapshot = source.current().await;
                versions.push(snapshot.version);
                Some(self.credential(source.value(&snapshot, key))?)
            }
        };
        let client_cert = match &inner.client_cert {
            None => None,
            Some(c) => {
                let snapshot = c.source.current().await;
                versions.push(snapshot.version);
                let cert = self.credential(c.source.value(&snapshot, &c.cert_key))?;
                Some((cert, self.credential(c.source.value(&snapshot, &c.key_key))?))
            }
        };
        let client_pem = client_cert.as_ref().map(|(c, k)| (c.expose(), k.expose()));
        let client = TlsIdentity::new(ca.as_ref().map(Sensitive::expose), client_pem)
            .and_then(|identity| inner.shared.pool.client(identity))
            .map_err(|e| self.identity_error(e))?;
        *inner.client.lock().expect("endpoint client lock") = Some((versions, Arc::clone(&client)));
        Ok(client)
    }

    fn tls_sources(&self) -> Vec<&Arc<Watched>> {
        let inner = &*self.0;
        let ca = match &inner.ca {
            Some(Ca::Watched { source, .. }) => Some(source),
            _ => None,
        };
        ca.into_iter().chain(inner.client_cert.as_ref().map(|c| &c.source)).collect()
    }

    /// The `Authorization` header from the current Secret values.
    async fn auth(&self) -> Result<Option<AuthHeader>, HookError> {
        let header = match &self.0.auth {
            None => return Ok(None),
            Some(Auth::Scheme { scheme, source, key }) => {
                let snapshot = source.current().await;
                let value = self.credential(source.value(&snapshot, key))?;
                AuthHeader::scheme(scheme, value.expose())
                    .map_err(|reason| invalid("authorization", source, key, reason))
            }
            Some(Auth::Basic { source, username_key, password_key }) => {
                let snapshot = source.current().await;
                let username = self.credential(source.value(&snapshot, username_key))?;
                let password = self.credential(source.value(&snapshot, password_key))?;
                AuthHeader::basic(username.expose(), password.expose())
                    .map_err(|reason| invalid("basicAuth username", source, username_key, reason))
            }
        };
        header.map(Some).map_err(|source| HookError::Credentials { url: self.0.url.clone(), source: Box::new(source) })
    }

    fn credential<T>(&self, value: Result<T, CredentialError>) -> Result<T, HookError> {
        value.map_err(|source| HookError::Credentials { url: self.0.url.clone(), source: Box::new(source) })
    }

    fn identity_error(&self, e: IdentityError) -> HookError {
        let inner = &*self.0;
        let source = match (e.part, &inner.ca, &inner.client_cert) {
            (Part::CaBundle, Some(Ca::Watched { source, key }), _) => invalid("caBundle", source, key, e.reason),
            (Part::ClientCertificate, _, Some(c)) => invalid("clientTLS certificate", &c.source, &c.cert_key, e.reason),
            (Part::ClientKey, _, Some(c)) => invalid("clientTLS private key", &c.source, &c.key_key, e.reason),
            // Inline bundles are checked when the controller starts; this is the TLS setup itself.
            _ => CredentialError::Tls { reason: e.reason },
        };
        HookError::Credentials { url: inner.url.clone(), source: Box::new(source) }
    }
}

/// Puts the current span's W3C trace context on a request (`traceparent`, and `tracestate` when the
/// trace has one); nothing when the span is not traced.
fn inject_trace_context(headers: &mut http::HeaderMap) {
    use opentelemetry::propagation::TextMapPropagator as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let context = tracing::Span::current().context();
    opentelemetry_sdk::propagation::TraceContextPropagator::new()
        .inject_context(&context, &mut opentelemetry_http::HeaderInjector(headers));
}

/// A non-200 body as quoted in an error: the credentials sent scrubbed from the whole body first, then
/// cut to [`QUOTED_BODY`] characters. Cutting first could split a secret at the cut, so that it no
/// longer matches and its first part is quoted; the cut keeps whole characters and drops a
/// [`REDACTED`] marker it would split.
/// Whether an error answer carries `Metahook-Error: permanent` (any case, surrounding spaces ignored).
fn is_permanent(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(super::PERMANENT_ERROR_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.trim().eq_ignore_ascii_case("permanent"))
}

fn quoted_body<'a>(bytes: &[u8], sent: impl IntoIterator<Item = &'a AuthHeader>) -> String {
    let scrubbed = identity::scrub(sent, &String::from_utf8_lossy(bytes));
    cut(&scrubbed, QUOTED_BODY).to_owned()
}

/// The first `max_chars` characters of `text`, less a [`REDACTED`] marker the cut would split.
fn cut(text: &str, max_chars: usize) -> &str {
    let Some((end, _)) = text.char_indices().nth(max_chars) else {
        return text;
    };
    // The marker is ASCII: one that straddles `end` starts less than its length before it.
    let split_marker = (end.saturating_sub(REDACTED.len() - 1)..end)
        .find(|&start| text.is_char_boundary(start) && text[start..].starts_with(REDACTED));
    &text[..split_marker.unwrap_or(end)]
}

fn invalid(what: &'static str, source: &Watched, key: &str, reason: String) -> CredentialError {
    CredentialError::Invalid { what, object: source.object().clone(), key: key.to_owned(), reason }
}

/// An HTTP-level failure, with every cause in the chain: hyper's own message ("client error (Connect)")
/// says nothing; the cause ("invalid peer certificate: `UnknownIssuer`") says what to fix.
fn http_error(url: &str, error: &(dyn std::error::Error + 'static)) -> HookError {
    let mut reason = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let text = e.to_string();
        if !reason.contains(&text) {
            reason = format!("{reason}: {text}");
        }
        cause = e.source();
    }
    HookError::Http { url: url.to_owned(), reason }
}

/// Reads a response body, refusing (unread) one whose declared length is over `limit` and stopping
/// as soon as more than `limit` bytes arrived.
async fn read_limited(
    url: &str,
    mut body: hyper::body::Incoming,
    headers: &http::HeaderMap,
    limit: usize,
) -> Result<Vec<u8>, HookError> {
    let too_large = || HookError::TooLarge { url: url.to_owned(), limit };
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| http_error(url, &e))?;
        if let Ok(data) = frame.into_data() {
            if bytes.len() + data.len() > limit {
                return Err(too_large());
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const TOKEN: &str = "s3cr3t-token-0123456789";

    fn bearer() -> AuthHeader {
        AuthHeader::scheme("Bearer", TOKEN.as_bytes()).unwrap()
    }

    #[test]
    fn a_secret_straddling_the_quoting_limit_is_scrubbed_not_half_quoted() {
        // Cut first, the body would end in "s3cr" and the scrub would no longer match the token.
        let body = format!("{}{TOKEN} and more", "a".repeat(QUOTED_BODY - 4));
        let quoted = quoted_body(body.as_bytes(), [&bearer()]);
        assert_eq!(quoted, "a".repeat(QUOTED_BODY - 4), "the split marker is left out whole");
        let body = format!("{}{TOKEN} and more", "a".repeat(QUOTED_BODY - 20));
        let quoted = quoted_body(body.as_bytes(), [&bearer()]);
        assert_eq!(quoted, format!("{}<redacted> and more", "a".repeat(QUOTED_BODY - 20)));
    }

    #[test]
    fn only_an_error_marked_permanent_is_permanent() {
        let mut headers = http::HeaderMap::new();
        assert!(!is_permanent(&headers));
        headers.insert("metahook-error", http::HeaderValue::from_static("temporary"));
        assert!(!is_permanent(&headers));
        headers.append("Metahook-Error", http::HeaderValue::from_static(" Permanent "));
        assert!(is_permanent(&headers), "any of the values, any case");
    }

    #[test]
    fn the_cut_counts_characters_keeps_whole_ones_and_never_splits_a_marker() {
        assert_eq!(cut("héllo", 2), "hé");
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("ab<redacted>cd", 12), "ab<redacted>", "a marker ending at the cut stays");
        for max in 3..12 {
            assert_eq!(cut("ab<redacted>cd", max), "ab", "cut at {max}");
        }
        assert_eq!(cut("éé<redacted>", 5), "éé");
        let long = "é".repeat(QUOTED_BODY * 2);
        assert_eq!(quoted_body(long.as_bytes(), []).chars().count(), QUOTED_BODY);
    }

    #[test]
    fn url_userinfo_and_header_credentials_are_both_scrubbed() {
        let from_url = AuthHeader::url_userinfo(b"user", b"p@ss-w0rd");
        let encoded = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, "user:p@ss-w0rd");
        assert_eq!(from_url.value().to_str().unwrap(), format!("Basic {encoded}"));
        let body = format!("got Bearer {TOKEN}; expected Basic {encoded} (user:p@ss-w0rd)");
        let quoted = quoted_body(body.as_bytes(), [&bearer(), &from_url]);
        assert_eq!(quoted, "got Bearer <redacted>; expected Basic <redacted> (user:<redacted>)");
    }

    /// A loopback hook that answers one call with `{}` and hands over the request's head.
    async fn capture_one() -> (String, tokio::sync::oneshot::Receiver<String>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://127.0.0.1:{}/sync", listener.local_addr().unwrap().port());
        let (head_tx, head_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut received = Vec::new();
            let mut buffer = [0_u8; 4096];
            while !received.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = stream.read(&mut buffer).await.unwrap();
                assert!(n > 0, "the request ended before its head did");
                received.extend_from_slice(&buffer[..n]);
            }
            let response =
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
            stream.write_all(response.as_bytes()).await.unwrap();
            let _ = head_tx.send(String::from_utf8_lossy(&received).to_lowercase());
        });
        (url, head_rx)
    }

    /// A hook call made in a traced `sync` span by a client that sends the trace context or not:
    /// the `traceparent` the hook received (if any), and the sync's trace and span ids.
    async fn traceparent_sent(trace_context: bool) -> (Option<String>, String, String) {
        use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber =
            tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let _default = tracing::subscriber::set_default(subscriber);
        let (url, head) = capture_one().await;
        let config = super::super::HookClientConfig { trace_context, ..super::super::HookClientConfig::default() };
        let labels = HookLabels {
            kind: "CompositeController".into(),
            controller: "t".into(),
            hook: super::super::HookKind::Sync,
        };
        let hook: Hook = serde_json::from_value(serde_json::json!({"webhook": {"url": url}})).unwrap();
        let endpoint = super::super::HookClient::new(&config, None).endpoint(&hook, &[], labels).unwrap();
        let sync = tracing::info_span!("sync");
        let ids = sync.context().span().span_context().clone();
        endpoint.call(&serde_json::json!({}), &serde_json::json!({})).instrument(sync).await.unwrap();
        let head = head.await.unwrap();
        let traceparent = head.lines().find_map(|l| l.strip_prefix("traceparent: ")).map(|v| v.trim().to_owned());
        (traceparent, ids.trace_id().to_string(), ids.span_id().to_string())
    }

    #[tokio::test]
    async fn a_hook_request_carries_the_trace_context_only_when_traces_are_on() {
        let (sent, _, _) = traceparent_sent(false).await;
        assert_eq!(sent, None, "traces off: no traceparent, even inside a traced span");
        let (sent, trace_id, sync_span_id) = traceparent_sent(true).await;
        let sent = sent.expect("traces on: a traceparent");
        let parts: Vec<&str> = sent.split('-').collect();
        assert_eq!(parts.len(), 4, "{sent}");
        assert_eq!(
            (parts[0], parts[1], parts[3]),
            ("00", trace_id.as_str(), "01"),
            "the sync's trace, sampled: {sent}"
        );
        assert_eq!(parts[2].len(), 16, "{sent}");
        assert_ne!(parts[2], sync_span_id, "the parent is the call's own `hook` span, under the sync's");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Wherever the secret sits relative to the limit, no character of it is quoted: the filler
        /// around it is drawn from characters the secret does not have (some of them multi-byte).
        #[test]
        fn no_part_of_a_secret_is_ever_quoted(
            before in "[é· ]{0,1100}",
            after in "[é· ]{0,40}",
            secret in "[a-z0-9]{4,40}",
            copies in 1_usize..3,
        ) {
            let header = AuthHeader::scheme("Bearer", secret.as_bytes()).unwrap();
            let body = format!("{before}{}{after}", secret.repeat(copies));
            let quoted = quoted_body(body.as_bytes(), [&header]);
            prop_assert!(quoted.chars().count() <= QUOTED_BODY);
            prop_assert!(body.starts_with(quoted.split(REDACTED).next().unwrap()));
            let rest = quoted.replace(REDACTED, "");
            prop_assert!(!rest.chars().any(|c| c.is_ascii_alphanumeric()), "{quoted}");
        }
    }
}
