//! Which TLS and auth settings apply to one hook, and where each value is read from.
//!
//! Metacontroller's rules (4.16): a hook that sets any of `caBundle`, `clientTLS`, `authorization` or
//! `basicAuth` uses exactly those; otherwise the first `endpointConfigs[]` entry whose `host` names the
//! hook's server applies. `authorization` and `basicAuth` exclude each other, `caBundle` takes exactly one
//! source, and an `authorization` of type `Basic` is refused. These are checked when a controller starts,
//! so a bad spec is reported once on the controller's `Ready` condition, not on every parent.

use http::Uri;

use super::authority::{Authority, default_port};
use super::credentials::{ObjectKind, ObjectRef, Sensitive};
use crate::api::{Authorization, BasicAuth, CaBundle, ClientTls, EndpointConfig, Webhook};

/// Default key of a CA bundle in a Secret or `ConfigMap`.
const CA_KEY: &str = "ca.crt";
/// Default keys of a client certificate Secret (the `kubernetes.io/tls` layout).
const CERT_KEY: &str = "tls.crt";
const PRIVATE_KEY_KEY: &str = "tls.key";
/// Default keys of a basic-auth Secret (the `kubernetes.io/basic-auth` layout).
const USERNAME_KEY: &str = "username";
const PASSWORD_KEY: &str = "password";

/// One key of a Secret or `ConfigMap`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRef {
    pub object: ObjectRef,
    pub key: String,
}

/// Where the CA certificates that verify the hook's server come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaSource {
    /// PEM from the spec itself (public certificates, already checked to parse).
    Inline(Vec<u8>),
    Key(KeyRef),
}

/// Where a client certificate and its private key come from (one Secret).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientCertSource {
    pub cert: KeyRef,
    pub key: KeyRef,
}

/// Where the `Authorization` header comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthSource {
    /// `Authorization: <scheme> <trimmed value>`.
    Scheme { scheme: String, credentials: KeyRef },
    /// `Authorization: Basic base64(username:password)`.
    Basic { username: KeyRef, password: KeyRef },
}

/// The TLS and auth settings of one hook; all `None` means plain defaults (system roots, no header).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    pub ca: Option<CaSource>,
    pub client_cert: Option<ClientCertSource>,
    pub auth: Option<AuthSource>,
}

/// Why a hook's settings cannot be used. `at` names the spec field (`hooks.sync.webhook`,
/// `endpointConfigs[1]`), so the controller's condition points at what to fix.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{at}: must specify either a full 'url', or both 'service' and 'path'")]
    NoUrl { at: String },
    #[error("{at}: invalid hook URL {url:?}: {reason}")]
    BadUrl { at: String, url: String, reason: String },
    #[error("{at}: authorization and basicAuth are mutually exclusive")]
    AuthorizationAndBasicAuth { at: String },
    #[error("{at}.authorization: type {type_:?} is not supported; use the basicAuth field instead")]
    BasicAuthorizationType { at: String, type_: String },
    #[error("{at}.caBundle: exactly one of inline, secretRef or configMapRef must be set, found {found}")]
    CaBundleSources { at: String, found: usize },
    #[error("{at}.caBundle.inline: {reason}")]
    InlineCa { at: String, reason: String },
}

/// A hook URL's `user:password@` part, percent-decoded as Go's `url.Parse` does. Go's HTTP client
/// sends it as basic auth, and so does the hub; it is never part of the URL dialled or printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Userinfo {
    pub username: Vec<u8>,
    /// Empty when the URL has none (`http://user@host/`): Go then sends `user:`.
    pub password: Sensitive,
}

impl std::fmt::Debug for Userinfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Userinfo(<redacted>)")
    }
}

/// Where a hook is called: its URL without userinfo, and the userinfo it had.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookUrl {
    pub uri: Uri,
    pub userinfo: Option<Userinfo>,
}

/// The URL a hook is called at: `url`, or `<protocol>://<name>.<namespace>:<port><path>` for the
/// `service` form (port 80 and `http` by default), which must be `http` or `https` with a host.
/// Userinfo is taken out of the URL (errors print the URL without it, too).
pub fn hook_url(at: &str, webhook: &Webhook) -> Result<HookUrl, SettingsError> {
    let url = webhook.resolved_url().ok_or_else(|| SettingsError::NoUrl { at: at.to_owned() })?;
    let bad = |reason: String| SettingsError::BadUrl { at: at.to_owned(), url: without_userinfo(&url), reason };
    let uri: Uri = url.parse().map_err(|e: http::uri::InvalidUri| bad(e.to_string()))?;
    match uri.scheme_str() {
        Some(s) if default_port(s).is_some() => {}
        _ => return Err(bad("the scheme must be http or https".into())),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("no host".into()));
    }
    // `http` leaves the port unchecked: in `http://user:pa/ss@h/` the password would pass for one.
    let authority = uri.authority().map_or("", |a| a.as_str());
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Some((_, port)) = host_port.rsplit_once(':').filter(|(_, p)| !p.ends_with(']'))
        && !port.is_empty()
        && port.parse::<u16>().is_err()
    {
        return Err(bad("the port must be a number up to 65535".into()));
    }
    let Some((userinfo, host_port)) = uri.authority().and_then(|a| a.as_str().rsplit_once('@')) else {
        return Ok(HookUrl { uri, userinfo: None });
    };
    // Go splits at the first ':', so the password may hold more of them.
    let (username, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let decode =
        |part: &str| percent_decode(part).ok_or_else(|| bad("invalid percent-encoding in the userinfo".into()));
    let userinfo = Userinfo { username: decode(username)?, password: Sensitive::new(decode(password)?) };
    let authority = host_port.parse().map_err(|e: http::uri::InvalidUri| bad(e.to_string()))?;
    let mut parts = uri.into_parts();
    parts.authority = Some(authority);
    let uri = Uri::from_parts(parts).map_err(|e| bad(e.to_string()))?;
    Ok(HookUrl { uri, userinfo: Some(userinfo) })
}

/// `url` with everything before its last `@` replaced by [`REDACTED`](super::identity::REDACTED), but
/// a leading `scheme:` and its slashes, for messages about a URL that may not even parse: with or without
/// a scheme, with one slash or two (`user:pw@h/sync`, `https:/user:pw@h`), whatever the userinfo holds.
/// Cutting at the last `@` of the whole text over-redacts a URL with `@` in its path, which only costs a
/// less precise message; cutting at the first `/` would print a password that holds a `/`.
fn without_userinfo(url: &str) -> String {
    let Some(at) = url.rfind('@') else { return url.to_owned() };
    // `scheme:` followed by at least one slash is kept; anything else before the `@` may be userinfo.
    let scheme = url
        .find(':')
        .filter(|&colon| {
            let name = &url[..colon];
            name.starts_with(|c: char| c.is_ascii_alphabetic())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
                && url[colon + 1..].starts_with('/')
        })
        .map_or(0, |colon| colon + 1 + url[colon + 1..].chars().take_while(|c| *c == '/').count());
    if at < scheme {
        return url.to_owned();
    }
    format!("{}{}@{}", &url[..scheme], super::identity::REDACTED, &url[at + 1..])
}

/// `%XX` escapes decoded; `None` for a `%` not followed by two hex digits (Go refuses those too).
fn percent_decode(text: &str) -> Option<Vec<u8>> {
    let mut bytes = text.bytes();
    let mut decoded = Vec::with_capacity(text.len());
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = |d: Option<u8>| char::from(d?).to_digit(16);
            let (high, low) = (hex(bytes.next())?, hex(bytes.next())?);
            decoded.push(u8::try_from(high * 16 + low).ok()?);
        } else {
            decoded.push(b);
        }
    }
    Some(decoded)
}

/// The settings that apply to `webhook` (called at `uri`), following Metacontroller's resolution.
pub fn resolve(
    at: &str,
    webhook: &Webhook,
    uri: &Uri,
    endpoint_configs: &[EndpointConfig],
) -> Result<Settings, SettingsError> {
    let own = webhook.ca_bundle.is_some()
        || webhook.client_tls.is_some()
        || webhook.authorization.is_some()
        || webhook.basic_auth.is_some();
    if own {
        return from_fields(
            at,
            webhook.ca_bundle.as_ref(),
            webhook.client_tls.as_ref(),
            webhook.authorization.as_ref(),
            webhook.basic_auth.as_ref(),
        );
    }
    let (Some(authority), Some(scheme)) = (Authority::of(uri), uri.scheme_str()) else {
        return Ok(Settings::default());
    };
    match endpoint_configs.iter().enumerate().find(|(_, c)| authority.matches(&c.host, scheme)) {
        Some((index, c)) => from_fields(
            &format!("endpointConfigs[{index}]"),
            c.ca_bundle.as_ref(),
            c.client_tls.as_ref(),
            c.authorization.as_ref(),
            c.basic_auth.as_ref(),
        ),
        None => Ok(Settings::default()),
    }
}

fn from_fields(
    at: &str,
    ca_bundle: Option<&CaBundle>,
    client_tls: Option<&ClientTls>,
    authorization: Option<&Authorization>,
    basic_auth: Option<&BasicAuth>,
) -> Result<Settings, SettingsError> {
    let auth = match (authorization, basic_auth) {
        (Some(_), Some(_)) => return Err(SettingsError::AuthorizationAndBasicAuth { at: at.to_owned() }),
        (Some(a), None) => Some(scheme_auth(at, a)?),
        (None, Some(b)) => Some(AuthSource::Basic {
            username: secret_key(&b.secret_ref.namespace, &b.secret_ref.name, b.username_key.as_deref(), USERNAME_KEY),
            password: secret_key(&b.secret_ref.namespace, &b.secret_ref.name, b.password_key.as_deref(), PASSWORD_KEY),
        }),
        (None, None) => None,
    };
    let ca = ca_bundle.map(|c| ca_source(at, c)).transpose()?;
    let client_cert = client_tls.map(|c| ClientCertSource {
        cert: secret_key(&c.secret_ref.namespace, &c.secret_ref.name, c.cert_key.as_deref(), CERT_KEY),
        key: secret_key(&c.secret_ref.namespace, &c.secret_ref.name, c.private_key_key.as_deref(), PRIVATE_KEY_KEY),
    });
    Ok(Settings { ca, client_cert, auth })
}

/// `type` is trimmed, empty means `Bearer`, and `Basic` in any case is refused (as in Metacontroller).
fn scheme_auth(at: &str, a: &Authorization) -> Result<AuthSource, SettingsError> {
    let scheme = a.type_.as_deref().map(str::trim).filter(|t| !t.is_empty()).unwrap_or("Bearer");
    if scheme.eq_ignore_ascii_case("basic") {
        return Err(SettingsError::BasicAuthorizationType { at: at.to_owned(), type_: scheme.to_owned() });
    }
    let r = &a.secret_ref;
    Ok(AuthSource::Scheme {
        scheme: scheme.to_owned(),
        credentials: secret_key(&r.namespace, &r.name, Some(&r.key), ""),
    })
}

fn ca_source(at: &str, c: &CaBundle) -> Result<CaSource, SettingsError> {
    let found =
        usize::from(c.inline.is_some()) + usize::from(c.secret_ref.is_some()) + usize::from(c.config_map_ref.is_some());
    if found != 1 {
        return Err(SettingsError::CaBundleSources { at: at.to_owned(), found });
    }
    if let Some(pem) = &c.inline {
        super::identity::roots_from_pem(pem.as_bytes())
            .map_err(|reason| SettingsError::InlineCa { at: at.to_owned(), reason })?;
        return Ok(CaSource::Inline(pem.clone().into_bytes()));
    }
    let (kind, r) = match (&c.secret_ref, &c.config_map_ref) {
        (Some(r), _) => (ObjectKind::Secret, r),
        (None, Some(r)) => (ObjectKind::ConfigMap, r),
        (None, None) => unreachable!("exactly one source was counted"),
    };
    let object = ObjectRef { kind, namespace: r.namespace.clone(), name: r.name.clone() };
    Ok(CaSource::Key(KeyRef { object, key: key_or(r.key.as_deref(), CA_KEY) }))
}

fn secret_key(namespace: &str, name: &str, key: Option<&str>, default: &str) -> KeyRef {
    let object = ObjectRef { kind: ObjectKind::Secret, namespace: namespace.to_owned(), name: name.to_owned() };
    KeyRef { object, key: key_or(key, default) }
}

/// An unset or empty key means the default, as Go's zero-value checks do.
fn key_or(key: Option<&str>, default: &str) -> String {
    key.filter(|k| !k.is_empty()).unwrap_or(default).to_owned()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn webhook(value: serde_json::Value) -> Webhook {
        serde_json::from_value(value).unwrap()
    }

    fn configs(value: serde_json::Value) -> Vec<EndpointConfig> {
        serde_json::from_value(value).unwrap()
    }

    fn settings(hook: serde_json::Value, endpoint_configs: &[EndpointConfig]) -> Result<Settings, SettingsError> {
        let hook = webhook(hook);
        let url = hook_url("hooks.sync.webhook", &hook)?;
        resolve("hooks.sync.webhook", &hook, &url.uri, endpoint_configs)
    }

    const TOKEN: &str = r#"{"secretRef": {"name": "t", "namespace": "ops", "key": "token"}}"#;

    fn token() -> serde_json::Value {
        serde_json::from_str(TOKEN).unwrap()
    }

    #[test]
    fn service_form_defaults_to_http_on_port_80() {
        let uri =
            hook_url("h", &webhook(json!({"service": {"name": "greeter", "namespace": "hooks"}, "path": "/sync"})))
                .unwrap()
                .uri;
        assert_eq!(uri.to_string(), "http://greeter.hooks:80/sync");
        let uri = hook_url(
            "h",
            &webhook(
                json!({"service": {"name": "g", "namespace": "n", "port": 8443, "protocol": "https"}, "path": "/s"}),
            ),
        )
        .unwrap()
        .uri;
        assert_eq!(uri.to_string(), "https://g.n:8443/s");
    }

    #[test]
    fn urls_must_be_http_or_https_with_a_host() {
        assert!(matches!(hook_url("h", &webhook(json!({"path": "/s"}))), Err(SettingsError::NoUrl { .. })));
        let err = hook_url("h", &webhook(json!({"url": "ftp://x/s"}))).unwrap_err();
        assert!(err.to_string().contains("http or https"), "{err}");
        assert!(hook_url("h", &webhook(json!({"url": "/relative"}))).is_err());
        let err = hook_url("h", &webhook(json!({"url": "http://h:http/s"}))).unwrap_err();
        assert!(err.to_string().contains("the port must be a number"), "{err}");
        for url in ["http://[::1]/s", "http://[::1]:8080/s", "http://h:/s"] {
            assert!(hook_url("h", &webhook(json!({"url": url}))).is_ok(), "{url}");
        }
    }

    fn userinfo_of(url: &str) -> (String, Option<(String, String)>) {
        let HookUrl { uri, userinfo } = hook_url("h", &webhook(json!({"url": url}))).unwrap();
        let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
        (uri.to_string(), userinfo.map(|u| (text(&u.username), text(u.password.expose()))))
    }

    #[test]
    fn userinfo_is_taken_out_of_the_url_and_percent_decoded_as_go_does() {
        let pair = |u: &str, p: &str| Some((u.to_owned(), p.to_owned()));
        assert_eq!(
            userinfo_of("http://user:p%40ss@127.0.0.1:8080/sync?x=1"),
            ("http://127.0.0.1:8080/sync?x=1".to_owned(), pair("user", "p@ss"))
        );
        // Go splits user from password at the first ':' and the host off at the last '@'.
        assert_eq!(userinfo_of("https://a:b:c@d@h/s"), ("https://h/s".to_owned(), pair("a", "b:c@d")));
        assert_eq!(userinfo_of("http://us%3Aer@h:81/s"), ("http://h:81/s".to_owned(), pair("us:er", "")));
        assert_eq!(userinfo_of("http://:pw@h/s"), ("http://h/s".to_owned(), pair("", "pw")));
        assert_eq!(userinfo_of("http://h/s"), ("http://h/s".to_owned(), None));
        let url = hook_url("h", &webhook(json!({"url": "http://user:hunter2@h/s"}))).unwrap();
        assert!(!format!("{url:?}").contains("hunter2"), "{url:?}");
    }

    #[test]
    fn a_bad_url_is_reported_without_its_userinfo() {
        for url in ["http://alice:s3cret%zz@h/s", "http://alice:s3cret/x@h:1/s", "ftp://alice:s3cret@h/s"] {
            let err = hook_url("h", &webhook(json!({"url": url}))).unwrap_err();
            assert!(matches!(err, SettingsError::BadUrl { .. }), "{err}");
            let message = err.to_string();
            assert!(!message.contains("s3cret") && !message.contains("alice"), "{message}");
        }
        assert_eq!(without_userinfo("http://h/a@b"), "http://<redacted>@b", "over-redacts rather than risk a leak");
        assert_eq!(without_userinfo("not a url"), "not a url");
    }

    /// Corner 6 of the promises issue: a hook URL's credentials never show, whatever its form — with or
    /// without a scheme, one slash or two, a URL that does not parse at all.
    #[test]
    fn credentials_never_show_whatever_the_form_of_the_url() {
        let cases = [
            ("alice7:pw1secret@127.0.0.1:8080/sync", "<redacted>@127.0.0.1:8080/sync"),
            ("https:/alice7:pw1secret@h/sync", "https:/<redacted>@h/sync"),
            ("http://alice7:pw1secret@h:99999/sync", "http://<redacted>@h:99999/sync"),
            ("http://alice7:pw1secret/x@h:1/s", "http://<redacted>@h:1/s"),
            ("ftp://alice7:pw1secret@h/s", "ftp://<redacted>@h/s"),
            ("http://alice7:pw1secret%zz@h/s", "http://<redacted>@h/s"),
            ("//alice7:pw1secret@h/s", "<redacted>@h/s"),
            ("alice7:pw1secret@", "<redacted>@"),
            (" http://alice7:pw1secret@h/s", "<redacted>@h/s"),
            ("http:alice7:pw1secret@h/s", "<redacted>@h/s"),
        ];
        for (url, shown) in cases {
            assert_eq!(without_userinfo(url), shown, "{url}");
            let Err(err) = hook_url("hooks.sync.webhook", &webhook(json!({"url": url}))) else {
                panic!("{url} was taken as a hook URL");
            };
            let message = err.to_string();
            assert!(!message.contains("pw1secret") && !message.contains("alice7"), "{url}: {message}");
        }
    }

    #[test]
    fn authorization_and_basic_auth_are_mutually_exclusive_on_a_hook() {
        let err = settings(
            json!({"url": "https://h/s", "authorization": token(),
                   "basicAuth": {"secretRef": {"name": "b", "namespace": "ops"}}}),
            &[],
        )
        .unwrap_err();
        assert!(matches!(err, SettingsError::AuthorizationAndBasicAuth { .. }));
        assert_eq!(err.to_string(), "hooks.sync.webhook: authorization and basicAuth are mutually exclusive");
    }

    #[test]
    fn authorization_and_basic_auth_are_mutually_exclusive_on_the_matching_endpoint_config_only() {
        let both = configs(json!([
            {"host": "other", "authorization": token(), "basicAuth": {"secretRef": {"name": "b", "namespace": "ops"}}},
            {"host": "h", "authorization": token()}]));
        // The bad entry is for another host: Metacontroller only resolves the matching one.
        assert!(settings(json!({"url": "https://h/s"}), &both).is_ok());
        let err = settings(json!({"url": "https://other/s"}), &both).unwrap_err();
        assert!(err.to_string().starts_with("endpointConfigs[0]:"), "{err}");
    }

    #[test]
    fn authorization_type_basic_is_refused_in_any_case_and_blank_means_bearer() {
        for type_ in ["Basic", "basic", " BASIC "] {
            let mut a = token();
            a["type"] = json!(type_);
            let err = settings(json!({"url": "https://h/s", "authorization": a}), &[]).unwrap_err();
            assert!(err.to_string().contains("use the basicAuth field instead"), "{err}");
        }
        let mut a = token();
        a["type"] = json!("  ");
        let s = settings(json!({"url": "https://h/s", "authorization": a}), &[]).unwrap();
        assert!(matches!(s.auth, Some(AuthSource::Scheme { ref scheme, .. }) if scheme == "Bearer"));
        let mut a = token();
        a["type"] = json!("Token");
        let s = settings(json!({"url": "https://h/s", "authorization": a}), &[]).unwrap();
        assert!(matches!(s.auth, Some(AuthSource::Scheme { ref scheme, .. }) if scheme == "Token"));
    }

    #[test]
    fn ca_bundle_needs_exactly_one_source_and_defaults_its_key() {
        let err = settings(json!({"url": "https://h/s", "caBundle": {}}), &[]).unwrap_err();
        assert!(matches!(err, SettingsError::CaBundleSources { found: 0, .. }));
        let two =
            json!({"secretRef": {"name": "a", "namespace": "n"}, "configMapRef": {"name": "b", "namespace": "n"}});
        let err = settings(json!({"url": "https://h/s", "caBundle": two}), &[]).unwrap_err();
        assert!(matches!(err, SettingsError::CaBundleSources { found: 2, .. }));
        let s = settings(
            json!({"url": "https://h/s", "caBundle": {"configMapRef": {"name": "ca", "namespace": "n"}}}),
            &[],
        )
        .unwrap();
        let Some(CaSource::Key(key)) = s.ca else { panic!("{s:?}") };
        assert_eq!((key.object.kind, key.key.as_str()), (ObjectKind::ConfigMap, "ca.crt"));
        let err = settings(json!({"url": "https://h/s", "caBundle": {"inline": "not PEM"}}), &[]).unwrap_err();
        assert!(matches!(err, SettingsError::InlineCa { .. }), "{err}");
    }

    #[test]
    fn client_tls_and_basic_auth_keys_default_like_metacontroller() {
        let s = settings(
            json!({"url": "https://h/s", "clientTLS": {"secretRef": {"name": "c", "namespace": "n"}},
                   "basicAuth": {"secretRef": {"name": "b", "namespace": "n"}, "passwordKey": "pw"}}),
            &[],
        )
        .unwrap();
        let c = s.client_cert.as_ref().unwrap();
        assert_eq!((c.cert.key.as_str(), c.key.key.as_str()), ("tls.crt", "tls.key"));
        let Some(AuthSource::Basic { username, password }) = &s.auth else { panic!("{s:?}") };
        assert_eq!((username.key.as_str(), password.key.as_str()), ("username", "pw"));
    }

    #[test]
    fn endpoint_configs_apply_by_host_only_to_hooks_without_settings_of_their_own() {
        let cfgs = configs(json!([
            {"host": "other.example", "authorization": token()},
            {"host": "GREETER.hooks", "basicAuth": {"secretRef": {"name": "b", "namespace": "n"}}},
            {"host": "greeter.hooks", "authorization": token()}]));
        let service = json!({"service": {"name": "greeter", "namespace": "hooks"}, "path": "/sync"});
        let s = settings(service.clone(), &cfgs).unwrap();
        assert!(matches!(s.auth, Some(AuthSource::Basic { .. })), "first match wins: {s:?}");
        let mut own = service;
        own["caBundle"] = json!({"configMapRef": {"name": "ca", "namespace": "n"}});
        let s = settings(own, &cfgs).unwrap();
        assert!(s.auth.is_none() && s.ca.is_some(), "own settings are used exclusively: {s:?}");
        let s = settings(json!({"url": "http://greeter.hooks:8080/sync"}), &cfgs).unwrap();
        assert_eq!(s, Settings::default(), "another port is another server");
    }
}
