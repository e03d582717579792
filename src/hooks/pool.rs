//! One pooled HTTP client per TLS identity (trusted roots + client certificate): connections are kept
//! alive and shared by every hook with that identity, and HTTP/2 is used when a TLS hook offers it
//! (ALPN `h2`), HTTP/1.1 otherwise.
//!
//! The `Authorization` header is deliberately not part of the identity: it travels with each request
//! and the server checks it per request, so hooks with different tokens for one server can share
//! connections, and a rotated token needs no new connection. A client lives while some hook holds it;
//! after a CA or client certificate rotation the old one goes with its last user.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use ring::digest;
use rustls::RootCertStore;

use super::close::ClosedIsEnd;
use super::dial::Dialer;
use super::identity::{ClientCert, client_cert, roots_from_pem, system_roots, tls_config};

/// The HTTP client hooks are called with: TLS over the `hookHosts` dialer, a peer's close ending a TLS
/// stream ([`ClosedIsEnd`]).
pub type HttpClient = Client<ClosedIsEnd<HttpsConnector<Dialer>>, Full<Bytes>>;

/// Which part of a TLS identity a problem is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    CaBundle,
    ClientCertificate,
    ClientKey,
}

/// A TLS identity that could not be built: which part, and why (never the material itself).
#[derive(Debug)]
pub struct IdentityError {
    pub part: Part,
    pub reason: String,
}

/// Roots to trust and a certificate to present, with a digest of the material they came from.
pub struct TlsIdentity {
    fingerprint: [u8; 32],
    roots: Arc<RootCertStore>,
    client: Option<ClientCert>,
}

impl TlsIdentity {
    /// `ca`: PEM roots (`None`: the system's); `client`: PEM certificate chain and private key.
    pub fn new(ca: Option<&[u8]>, client: Option<(&[u8], &[u8])>) -> Result<Self, IdentityError> {
        let mut context = digest::Context::new(&digest::SHA256);
        for part in [ca, client.map(|c| c.0), client.map(|c| c.1)] {
            // Length-prefixed, so (ca, cert) boundaries cannot shift between identities.
            match part {
                Some(bytes) => {
                    context.update(&(bytes.len() as u64 + 1).to_be_bytes());
                    context.update(bytes);
                }
                None => context.update(&0_u64.to_be_bytes()),
            }
        }
        let mut fingerprint = [0; 32];
        fingerprint.copy_from_slice(context.finish().as_ref());
        let roots = match ca {
            Some(pem) => {
                Arc::new(roots_from_pem(pem).map_err(|reason| IdentityError { part: Part::CaBundle, reason })?)
            }
            None => system_roots(),
        };
        let client = client
            .map(|(cert, key)| {
                client_cert(cert, key).map_err(|(which, reason)| IdentityError {
                    part: if which == "certificate" { Part::ClientCertificate } else { Part::ClientKey },
                    reason,
                })
            })
            .transpose()?;
        Ok(Self { fingerprint, roots, client })
    }
}

/// The hub's clients by identity.
pub struct Pool {
    dialer: Dialer,
    keep_alive: bool,
    clients: Mutex<HashMap<[u8; 32], Weak<HttpClient>>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("keep_alive", &self.keep_alive).finish_non_exhaustive()
    }
}

impl Pool {
    /// Clients connect through `dialer`; `keep_alive: false` closes every connection after one call
    /// (only useful to measure what keep-alive saves: `make bench-hooks`).
    #[must_use]
    pub fn new(dialer: Dialer, keep_alive: bool) -> Self {
        Self { dialer, keep_alive, clients: Mutex::default() }
    }

    /// The client for `identity`, shared with every other holder of the same identity.
    pub fn client(&self, identity: TlsIdentity) -> Result<Arc<HttpClient>, IdentityError> {
        let mut clients = self.clients.lock().expect("client pool lock");
        if let Some(client) = clients.get(&identity.fingerprint).and_then(Weak::upgrade) {
            return Ok(client);
        }
        clients.retain(|_, c| c.strong_count() > 0);
        let config = tls_config(identity.roots, identity.client)
            .map_err(|reason| IdentityError { part: Part::ClientKey, reason })?;
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_or_http()
            .enable_all_versions()
            .wrap_connector(self.dialer.clone());
        let mut builder = Client::builder(TokioExecutor::new());
        builder.pool_timer(TokioTimer::new()).timer(TokioTimer::new());
        if !self.keep_alive {
            builder.pool_max_idle_per_host(0);
        }
        let client = Arc::new(builder.build(ClosedIsEnd(https)));
        clients.insert(identity.fingerprint, Arc::downgrade(&client));
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[tokio::test]
    async fn one_client_per_identity_while_it_is_held() {
        let pool = Pool::new(Dialer::new(&BTreeMap::new()), true);
        let a = pool.client(TlsIdentity::new(None, None).unwrap()).unwrap();
        let b = pool.client(TlsIdentity::new(None, None).unwrap()).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let weak = Arc::downgrade(&a);
        drop((a, b));
        assert!(weak.upgrade().is_none(), "the pool does not keep clients alive");
    }

    #[test]
    fn bad_material_names_its_part() {
        let err = TlsIdentity::new(Some(b"nope"), None).err().unwrap();
        assert_eq!(err.part, Part::CaBundle);
        let err = TlsIdentity::new(None, Some((b"nope", b"nope"))).err().unwrap();
        assert_eq!(err.part, Part::ClientCertificate);
    }
}
