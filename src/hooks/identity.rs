//! TLS identities (trusted roots, client certificate) and `Authorization` headers, built from the
//! values [`super::credentials`] reads.
//!
//! rustls only, TLS 1.2 and 1.3 (Metacontroller's minimum is 1.2), ring as the crypto provider (the one
//! kube already links). Errors describe what is wrong with a value, never the value.

use std::fmt;
use std::sync::{Arc, OnceLock};

use base64::Engine as _;
use http::HeaderValue;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::{CertifiedKey, SingleCertAndKey};

/// Roots from PEM text: every `CERTIFICATE` block, at least one, all of them valid.
pub fn roots_from_pem(pem: &[u8]) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("not PEM: {e}"))?;
        roots.add(cert).map_err(|e| format!("not a usable CA certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err("no PEM certificates found".to_owned());
    }
    Ok(roots)
}

/// The operating system's roots (Metacontroller uses Go's system pool when no `caBundle` is set),
/// loaded once per process.
pub fn system_roots() -> Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    Arc::clone(ROOTS.get_or_init(|| {
        let mut roots = RootCertStore::empty();
        let loaded = rustls_native_certs::load_native_certs();
        let (added, _) = roots.add_parsable_certificates(loaded.certs);
        if added == 0 {
            tracing::warn!("no system CA certificates found: https hooks without caBundle will fail to verify");
        }
        Arc::new(roots)
    }))
}

/// A client certificate chain with its private key, ready to present.
///
/// The hub presents this certificate; it does not validate it — the hook's server does. So the chain
/// is checked only for what the hub itself needs: PEM that parses, a key the crypto provider can sign
/// with, and a first certificate whose public key is the key's. rustls's own check
/// (`with_client_auth_cert`) parses the certificate with webpki, which reads X.509 v3 only and so
/// refuses a v1 certificate (`UnsupportedCertVersion`) — the kind `openssl x509 -req` without
/// `-extfile` makes, and Go's `tls.X509KeyPair` (Metacontroller) accepts.
#[derive(Clone)]
pub struct ClientCert(Arc<CertifiedKey>);

impl fmt::Debug for ClientCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCert").field("chain", &self.0.cert.len()).finish_non_exhaustive()
    }
}

impl ClientCert {
    /// The chain and its signing key, as rustls takes them (a server presents one the same way).
    #[must_use]
    pub fn certified_key(&self) -> Arc<CertifiedKey> {
        Arc::clone(&self.0)
    }
}

/// Parses a certificate chain (`cert_pem`) and private key (`key_pem`) and checks that they belong
/// together. Errors say which one is wrong, never what it holds.
pub fn client_cert(cert_pem: &[u8], key_pem: &[u8]) -> Result<ClientCert, (&'static str, String)> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| ("certificate", format!("not PEM: {e}")))?;
    let Some(end_entity) = chain.first() else {
        return Err(("certificate", "no PEM certificates found".to_owned()));
    };
    let cert_key =
        subject_public_key_info(end_entity).ok_or_else(|| ("certificate", "not an X.509 certificate".to_owned()))?;
    let key =
        PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| ("private key", format!("not a PEM private key: {e}")))?;
    let key = provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| ("private key", format!("not a usable private key: {e}")))?;
    // A key whose public half the provider cannot say is left to the handshake, as rustls does.
    if key.public_key().is_some_and(|spki| spki.as_ref() != cert_key) {
        return Err(("private key", "does not match the certificate's public key".to_owned()));
    }
    Ok(ClientCert(Arc::new(CertifiedKey::new(chain, key))))
}

/// The `SubjectPublicKeyInfo` (whole, tag and length included) of a DER X.509 certificate of any
/// version: v1 certificates simply lack the `[0]` version field and the extensions.
fn subject_public_key_info(cert: &[u8]) -> Option<&[u8]> {
    const SEQUENCE: u8 = 0x30;
    const INTEGER: u8 = 0x02;
    const VERSION: u8 = 0xa0; // [0] EXPLICIT, constructed
    let certificate = Der::read(cert, SEQUENCE)?;
    let tbs = Der::read(certificate.contents, SEQUENCE)?;
    let mut rest = tbs.contents;
    if let Some(version) = Der::read(rest, VERSION) {
        rest = version.rest;
    }
    // serialNumber, signature, issuer, validity, subject.
    for tag in [INTEGER, SEQUENCE, SEQUENCE, SEQUENCE, SEQUENCE] {
        rest = Der::read(rest, tag)?.rest;
    }
    Some(Der::read(rest, SEQUENCE)?.whole)
}

/// One DER element at the start of some input.
struct Der<'a> {
    /// Tag, length and contents.
    whole: &'a [u8],
    contents: &'a [u8],
    /// The input after this element.
    rest: &'a [u8],
}

impl<'a> Der<'a> {
    /// The element at the start of `input` if it has tag `tag` (single-byte tags only: all that an
    /// X.509 certificate's outer structure uses) and a definite length that fits the input.
    fn read(input: &'a [u8], tag: u8) -> Option<Self> {
        let (&found, after_tag) = input.split_first()?;
        if found != tag {
            return None;
        }
        let (&first, mut after) = after_tag.split_first()?;
        let len = if first < 0x80 {
            usize::from(first)
        } else {
            let count = usize::from(first & 0x7f);
            if count == 0 || count > 4 {
                return None; // indefinite (not DER), or longer than any certificate
            }
            let (bytes, after_len) = after.split_at_checked(count)?;
            after = after_len;
            bytes.iter().fold(0, |len, &b| (len << 8) | usize::from(b))
        };
        let (contents, rest) = after.split_at_checked(len)?;
        let header = input.len() - after.len();
        Some(Self { whole: &input[..header + len], contents, rest })
    }
}

/// ring, the provider kube links, for every TLS configuration the hub makes.
#[must_use]
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls client configuration trusting `roots`, presenting `client` if given. The hook's server
/// certificate is verified against `roots` by webpki as usual.
pub fn tls_config(roots: Arc<RootCertStore>, client: Option<ClientCert>) -> Result<rustls::ClientConfig, String> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    Ok(match client {
        Some(ClientCert(certified)) => builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(certified))),
        None => builder.with_no_client_auth(),
    })
}

/// A value for the `Authorization` header. Marked sensitive (HTTP libraries then never print it) and
/// redacted in `Debug`; it also knows the secret parts it was built from, to scrub them from text a
/// hook sends back (an error page that echoes the token must not carry it into an Event).
#[derive(Clone)]
pub struct AuthHeader {
    value: HeaderValue,
    secrets: Vec<String>,
}

impl fmt::Debug for AuthHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuthHeader(<redacted>)")
    }
}

impl AuthHeader {
    /// `<scheme> <credentials>`, the credentials trimmed of surrounding whitespace.
    pub fn scheme(scheme: &str, credentials: &[u8]) -> Result<Self, String> {
        let credentials = credentials.trim_ascii();
        let mut bytes = Vec::with_capacity(scheme.len() + 1 + credentials.len());
        bytes.extend_from_slice(scheme.as_bytes());
        bytes.push(b' ');
        bytes.extend_from_slice(credentials);
        let secrets = vec![String::from_utf8_lossy(credentials).into_owned()];
        Self::new(&bytes, secrets)
    }

    /// `Basic base64(username:password)`, both trimmed; a `:` in the username is refused because the
    /// server could not tell where the username ends.
    pub fn basic(username: &[u8], password: &[u8]) -> Result<Self, String> {
        let (username, password) = (username.trim_ascii(), password.trim_ascii());
        if username.contains(&b':') {
            return Err("the username must not contain ':'".to_owned());
        }
        Ok(Self::basic_pair(username, password))
    }

    /// `Basic base64(username:password)` from a hook URL's `user:password@`, taken as they are: Go's
    /// HTTP client (and so Metacontroller) sends exactly that, without trimming or refusing anything.
    #[must_use]
    pub fn url_userinfo(username: &[u8], password: &[u8]) -> Self {
        Self::basic_pair(username, password)
    }

    fn basic_pair(username: &[u8], password: &[u8]) -> Self {
        let mut pair = Vec::with_capacity(username.len() + 1 + password.len());
        pair.extend_from_slice(username);
        pair.push(b':');
        pair.extend_from_slice(password);
        let encoded = base64::engine::general_purpose::STANDARD.encode(&pair);
        let secrets = vec![String::from_utf8_lossy(password).into_owned(), encoded.clone()];
        Self::new(format!("Basic {encoded}").as_bytes(), secrets).expect("base64 is a valid header value")
    }

    fn new(bytes: &[u8], secrets: Vec<String>) -> Result<Self, String> {
        let mut value = HeaderValue::from_bytes(bytes)
            .map_err(|_| "contains characters not allowed in an HTTP header".to_owned())?;
        value.set_sensitive(true);
        // Very short secrets would turn scrubbing into mangling; they are not worth hiding anyway.
        let secrets = secrets.into_iter().filter(|s| s.len() >= 4).collect();
        Ok(Self { value, secrets })
    }

    #[must_use]
    pub fn value(&self) -> &HeaderValue {
        &self.value
    }

    /// `text` with every secret part of this header replaced by [`REDACTED`].
    #[must_use]
    pub fn scrub(&self, text: &str) -> String {
        scrub([self], text)
    }
}

/// What a scrubbed secret reads as.
pub const REDACTED: &str = "<redacted>";

/// `text` with every occurrence of a secret part of any of `headers` replaced by [`REDACTED`].
///
/// All occurrences are found in the original text first and overlapping ones merged, so that no
/// replacement can break another secret's match and leave a piece of it behind (the password inside
/// an echoed `user:password`, a token that ends where another begins, `aaaa` in `aaaaa`).
#[must_use]
pub fn scrub<'a>(headers: impl IntoIterator<Item = &'a AuthHeader>, text: &str) -> String {
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for secret in headers.into_iter().flat_map(|h| &h.secrets) {
        let mut from = 0;
        while let Some(at) = text[from..].find(secret.as_str()) {
            let start = from + at;
            spans.push((start, start + secret.len()));
            // The next occurrence may overlap this one: search again from the next character.
            from = start + text[start..].chars().next().map_or(1, char::len_utf8);
        }
    }
    if spans.is_empty() {
        return text.to_owned();
    }
    spans.sort_unstable();
    let mut scrubbed = String::with_capacity(text.len());
    let mut copied = 0; // text[..copied] is done
    let mut spans = spans.into_iter().peekable();
    while let Some((start, mut end)) = spans.next() {
        while let Some(&(next_start, next_end)) = spans.peek()
            && next_start <= end
        {
            end = end.max(next_end);
            spans.next();
        }
        scrubbed.push_str(&text[copied..start]);
        scrubbed.push_str(REDACTED);
        copied = end;
    }
    scrubbed.push_str(&text[copied..]);
    scrubbed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_credentials_are_trimmed_and_the_header_is_redacted_everywhere() {
        let header = AuthHeader::scheme("Bearer", b"  s3cr3t-token\n").unwrap();
        assert_eq!(header.value().to_str().unwrap(), "Bearer s3cr3t-token");
        assert!(header.value().is_sensitive());
        for printed in [format!("{header:?}"), format!("{:?}", header.value())] {
            assert!(!printed.contains("s3cr3t"), "{printed}");
        }
        assert_eq!(header.scrub("bad token s3cr3t-token!"), "bad token <redacted>!");
    }

    #[test]
    fn basic_auth_encodes_trimmed_user_and_password_and_refuses_a_colon_in_the_username() {
        let header = AuthHeader::basic(b"alice\n", b" s3cr3t ").unwrap();
        let expected = base64::engine::general_purpose::STANDARD.encode("alice:s3cr3t");
        assert_eq!(header.value().to_str().unwrap(), format!("Basic {expected}"));
        assert_eq!(header.scrub(&format!("got {expected} for s3cr3t")), "got <redacted> for <redacted>");
        let err = AuthHeader::basic(b"al:ice", b"pw").unwrap_err();
        assert!(err.contains("must not contain ':'"), "{err}");
        assert!(AuthHeader::basic(b"bob", b"pass:with:colons").is_ok());
    }

    #[test]
    fn header_values_with_control_characters_are_refused_without_quoting_them() {
        let err = AuthHeader::scheme("Bearer", b"abc\ndef-secret").unwrap_err();
        assert!(!err.contains("secret"), "{err}");
    }

    /// Runs openssl in `dir`.
    fn openssl(dir: &std::path::Path, args: &[&str]) -> String {
        let out = std::process::Command::new("openssl").args(args).current_dir(dir).output().expect("running openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A CA, and a client key and certificate signed by it exactly as Metacontroller's `webhook-auth`
    /// example signs its client certificate: `openssl x509 -req` without `-extfile`, which OpenSSL 3.0
    /// makes an X.509 v1 certificate. `newkey` is `openssl req -newkey`'s argument.
    fn v1_client(dir: &std::path::Path, newkey: &[&str]) -> (Vec<u8>, Vec<u8>) {
        let req = |extra: &[&str]| openssl(dir, &[&["req", "-newkey"], newkey, &["-nodes"], extra].concat());
        req(&["-x509", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=test-ca"]);
        req(&["-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=metacontroller"]);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "client.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "client.crt",
                "-days",
                "2",
            ],
        );
        let text = openssl(dir, &["x509", "-in", "client.crt", "-noout", "-text"]);
        assert!(text.contains("Version: 1 (0x0)") && !text.contains("X509v3"), "not a v1 certificate:\n{text}");
        (std::fs::read(dir.join("client.crt")).unwrap(), std::fs::read(dir.join("client.key")).unwrap())
    }

    #[test]
    fn an_x509_v1_client_certificate_is_presented_as_go_would() {
        for newkey in [&["ec", "-pkeyopt", "ec_paramgen_curve:P-256"][..], &["rsa:2048"]] {
            let dir = tempfile::tempdir().unwrap();
            let (cert, key) = v1_client(dir.path(), newkey);
            let client = client_cert(&cert, &key).unwrap_or_else(|e| panic!("{newkey:?}: {e:?}"));
            let roots = Arc::new(roots_from_pem(&std::fs::read(dir.path().join("ca.crt")).unwrap()).unwrap());
            let config = tls_config(roots, Some(client)).unwrap();
            assert!(config.client_auth_cert_resolver.has_certs(), "{newkey:?}");
        }
    }

    #[test]
    fn a_private_key_that_is_not_the_certificates_is_refused_without_quoting_either() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, _) = v1_client(dir.path(), &["ec", "-pkeyopt", "ec_paramgen_curve:P-256"]);
        let other = std::fs::read(dir.path().join("ca.key")).unwrap();
        let (part, reason) = client_cert(&cert, &other).unwrap_err();
        assert_eq!((part, reason.as_str()), ("private key", "does not match the certificate's public key"));
        let (part, _) =
            client_cert(&cert, b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").unwrap_err();
        assert_eq!(part, "private key");
    }

    #[test]
    fn the_public_key_is_found_in_v1_and_v3_certificates_and_in_no_truncated_one() {
        let dir = tempfile::tempdir().unwrap();
        let (v1, _) = v1_client(dir.path(), &["ec", "-pkeyopt", "ec_paramgen_curve:P-256"]);
        let v3 = std::fs::read(dir.path().join("ca.crt")).unwrap();
        for pem in [v1, v3] {
            let der = CertificateDer::from_pem_slice(&pem).unwrap();
            let spki = subject_public_key_info(&der).unwrap();
            assert_eq!(spki.first(), Some(&0x30));
            for len in 0..der.len() {
                assert_eq!(subject_public_key_info(&der[..len]), None, "a certificate cut to {len} bytes");
            }
        }
        let (part, reason) =
            client_cert(b"-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n", b"").unwrap_err();
        assert_eq!((part, reason.as_str()), ("certificate", "not an X.509 certificate"));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_are_read_without_panicking(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let _ = subject_public_key_info(&bytes);
            let mut framed = vec![0x30, 0x82, 0x01, 0x00];
            framed.extend_from_slice(&bytes);
            let _ = subject_public_key_info(&framed);
        }
    }

    #[test]
    fn pem_without_certificates_is_not_a_bundle() {
        assert!(roots_from_pem(b"hello").unwrap_err().contains("no PEM certificates"));
        let garbage = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(roots_from_pem(garbage).is_err());
        assert!(client_cert(b"nothing", b"nothing").is_err());
    }
}
