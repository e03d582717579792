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

/// A client certificate chain and its private key, from PEM.
pub struct ClientCert {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl fmt::Debug for ClientCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCert").field("chain", &self.chain.len()).finish_non_exhaustive()
    }
}

impl Clone for ClientCert {
    fn clone(&self) -> Self {
        Self { chain: self.chain.clone(), key: self.key.clone_key() }
    }
}

/// Parses a certificate chain (`cert_pem`) and private key (`key_pem`). Errors say which one is wrong.
pub fn client_cert(cert_pem: &[u8], key_pem: &[u8]) -> Result<ClientCert, (&'static str, String)> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| ("certificate", format!("not PEM: {e}")))?;
    if chain.is_empty() {
        return Err(("certificate", "no PEM certificates found".to_owned()));
    }
    let key =
        PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| ("private key", format!("not a PEM private key: {e}")))?;
    Ok(ClientCert { chain, key })
}

/// A rustls client configuration trusting `roots`, presenting `client` if given.
pub fn tls_config(roots: Arc<RootCertStore>, client: Option<ClientCert>) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    match client {
        Some(ClientCert { chain, key }) => {
            builder.with_client_auth_cert(chain, key).map_err(|e| format!("client certificate and key: {e}"))
        }
        None => Ok(builder.with_no_client_auth()),
    }
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
        let mut pair = Vec::with_capacity(username.len() + 1 + password.len());
        pair.extend_from_slice(username);
        pair.push(b':');
        pair.extend_from_slice(password);
        let encoded = base64::engine::general_purpose::STANDARD.encode(&pair);
        let secrets = vec![String::from_utf8_lossy(password).into_owned(), encoded.clone()];
        Self::new(format!("Basic {encoded}").as_bytes(), secrets)
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

    /// `text` with every secret part of this header replaced by `<redacted>`.
    #[must_use]
    pub fn scrub(&self, text: &str) -> String {
        self.secrets.iter().fold(text.to_owned(), |text, secret| text.replace(secret.as_str(), "<redacted>"))
    }
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

    #[test]
    fn pem_without_certificates_is_not_a_bundle() {
        assert!(roots_from_pem(b"hello").unwrap_err().contains("no PEM certificates"));
        let garbage = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(roots_from_pem(garbage).is_err());
        assert!(client_cert(b"nothing", b"nothing").is_err());
    }
}
