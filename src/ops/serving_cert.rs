//! HTTPS for the metrics port from certificate files that change under the hub (`metricsCertDir`), as
//! controller-runtime's secure metrics serving and its certificate watcher do.
//!
//! A certificate on a Pod comes from a mounted `kubernetes.io/tls` Secret that cert-manager (or a
//! person) renews in place: the kubelet swaps the volume's files while the hub runs. So the pair is not
//! read once: [`ServingCert`] is rustls's certificate resolver, handing every new connection the pair
//! loaded last, and [`ServingCert::watch`] reads the files again every [`RELOAD_EVERY`] and swaps in a
//! pair that changed and loads. A pair that does not load — a half-written renewal (the certificate is
//! new, the key not yet), a key that does not match — keeps the last good one, with a warning naming
//! the file and what is wrong, never the contents. The files are compared whole rather than by
//! modification time: they are a few kilobytes, and a Secret volume's atomic swap may keep the times.
//!
//! Written here rather than taken from a crate: the parsing and key checks are the ones the hub
//! already makes for a hook's client certificate ([`crate::hooks::identity::client_cert`]), and what is
//! left — a resolver over a swappable pair and a polling task — is a few lines.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

/// How often the files are read again.
pub const RELOAD_EVERY: Duration = Duration::from_secs(2);

/// The certificate file's name in the directory (a `kubernetes.io/tls` Secret's key).
pub const CERT_FILE: &str = "tls.crt";
/// The private key file's name in the directory.
pub const KEY_FILE: &str = "tls.key";

/// Why a certificate pair could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file was read but is not what it should be (which part and why; never its contents).
    #[error("{path}: {part}: {reason}")]
    Invalid { path: PathBuf, part: &'static str, reason: String },
}

/// The certificate pair served on new connections, reloaded from `dir` by [`ServingCert::watch`].
pub struct ServingCert {
    dir: PathBuf,
    state: RwLock<Loaded>,
}

/// The pair being served and the file contents it came from (to notice a change).
struct Loaded {
    key: Arc<CertifiedKey>,
    files: (Vec<u8>, Vec<u8>),
    /// The last failure reported, so a pair that stays broken warns once, not every poll.
    failing: Option<String>,
}

impl fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServingCert").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl ServingCert {
    /// Loads `dir/tls.crt` and `dir/tls.key`; an error if they are missing, unreadable or no pair.
    pub fn load(dir: impl Into<PathBuf>) -> Result<Arc<Self>, CertError> {
        let dir = dir.into();
        let files = read_pair(&dir)?;
        let key = parse_pair(&dir, &files)?;
        Ok(Arc::new(Self { dir, state: RwLock::new(Loaded { key, files, failing: None }) }))
    }

    /// Reads the files again: `Ok(true)` when a changed pair was loaded and is served from now on,
    /// `Ok(false)` when nothing changed, an error (the last good pair still served) otherwise.
    pub fn reload(&self) -> Result<bool, CertError> {
        let files = read_pair(&self.dir)?;
        if self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner).files == files {
            return Ok(false);
        }
        let key = parse_pair(&self.dir, &files)?;
        let mut state = self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        *state = Loaded { key, files, failing: None };
        Ok(true)
    }

    /// Reloads every `every` until the task is dropped, logging a new pair and (once per distinct
    /// failure) a pair that does not load.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            match self.reload() {
                Ok(true) => info!(dir = %self.dir.display(), "serving the renewed metrics certificate"),
                Ok(false) => {}
                Err(err) => {
                    let reason = err.to_string();
                    let mut state = self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                    if state.failing.as_ref() != Some(&reason) {
                        warn!(dir = %self.dir.display(), "keeping the last metrics certificate: {reason}");
                        state.failing = Some(reason);
                    }
                }
            }
        }
    }

    /// A TLS acceptor presenting the current pair: TLS 1.3 and 1.2, HTTP/1.1 by ALPN.
    #[must_use]
    pub fn acceptor(self: &Arc<Self>) -> tokio_rustls::TlsAcceptor {
        let mut config = rustls::ServerConfig::builder_with_provider(crate::hooks::identity::provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .expect("ring supports TLS 1.2 and 1.3")
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner).key))
    }
}

fn read_pair(dir: &Path) -> Result<(Vec<u8>, Vec<u8>), CertError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|source| CertError::Read { path, source })
    };
    Ok((read(CERT_FILE)?, read(KEY_FILE)?))
}

fn parse_pair(dir: &Path, (cert, key): &(Vec<u8>, Vec<u8>)) -> Result<Arc<CertifiedKey>, CertError> {
    crate::hooks::identity::client_cert(cert, key).map(|pair| pair.certified_key()).map_err(|(part, reason)| {
        let file = if part == "certificate" { CERT_FILE } else { KEY_FILE };
        CertError::Invalid { path: dir.join(file), part, reason }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed pair made by `openssl` (in the test environment, as in the integration tests).
    fn pair(dir: &Path, name: &str) -> bool {
        std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
            .args(["-subj", &format!("/CN={name}"), "-addext", "subjectAltName=IP:127.0.0.1"])
            .arg("-keyout")
            .arg(dir.join(KEY_FILE))
            .arg("-out")
            .arg(dir.join(CERT_FILE))
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn subject(cert: &ServingCert) -> Vec<u8> {
        cert.state.read().unwrap().key.cert[0].as_ref().to_vec()
    }

    #[test]
    fn a_renewed_pair_is_served_and_a_broken_one_keeps_the_last() {
        let dir = tempfile::tempdir().unwrap();
        assert!(pair(dir.path(), "first"), "openssl makes a pair");
        let cert = ServingCert::load(dir.path()).unwrap();
        let first = subject(&cert);
        assert!(!cert.reload().unwrap(), "unchanged files are not a new pair");

        // Half a renewal: a new certificate beside the old key.
        let old_key = std::fs::read(dir.path().join(KEY_FILE)).unwrap();
        assert!(pair(dir.path(), "second"));
        let new_key = std::fs::read(dir.path().join(KEY_FILE)).unwrap();
        std::fs::write(dir.path().join(KEY_FILE), &old_key).unwrap();
        let err = cert.reload().unwrap_err().to_string();
        assert!(err.contains("tls.key") && err.contains("does not match"), "{err}");
        assert_eq!(subject(&cert), first, "the last good pair is still served");

        std::fs::write(dir.path().join(KEY_FILE), &new_key).unwrap();
        assert!(cert.reload().unwrap());
        assert_ne!(subject(&cert), first, "the renewed pair is served");

        std::fs::remove_file(dir.path().join(CERT_FILE)).unwrap();
        assert!(matches!(cert.reload(), Err(CertError::Read { .. })));
        assert!(ServingCert::load(dir.path()).is_err(), "no pair, no start");
    }
}
