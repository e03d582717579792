//! Resolves `apiVersion` + plural resource names (as written in controller specs) to API resources.
//!
//! Results are cached for the discovery interval, so a CRD installed after the hub started becomes
//! usable within that interval, while a busy hub does not ask the API server on every sync.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Client;
use kube::core::{ApiResource, GroupVersion};
use kube::discovery::Scope;

/// A resource type the API server serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedResource {
    /// Group, version, kind and plural.
    pub api_resource: ApiResource,
    pub namespaced: bool,
    /// Whether `.status` is a subresource (written through `/status`).
    pub has_status: bool,
}

impl ResolvedResource {
    /// `group/version` or `v1`: what objects of this type carry as `apiVersion`.
    #[must_use]
    pub fn api_version(&self) -> &str {
        &self.api_resource.api_version
    }

    #[must_use]
    pub fn kind(&self) -> &str {
        &self.api_resource.kind
    }
}

/// Whether an API error says the thing asked about cannot exist (any more): its type is not served (404,
/// 410: CRD deleted, version removed, never existed) or the object is gone. Such a thing is released,
/// never waited for, and a list of such a type is empty. The one reading of it, for the release of a
/// controller ([`crate::controllers::release`]) and for a sync's own reads of its children.
#[must_use]
pub fn cannot_exist(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404 || status.code == 410)
}

/// Why a resource could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("invalid apiVersion {api_version:?}: {reason}")]
    BadApiVersion { api_version: String, reason: String },
    #[error("discovery: can't find resource {resource:?} in apiVersion {api_version:?}")]
    NotFound { api_version: String, resource: String },
    #[error("discovery of {api_version} failed: {source}")]
    Api { api_version: String, source: kube::Error },
}

/// Resolved resources by (apiVersion, plural), with when they were resolved.
type ResolvedCache = HashMap<(String, String), (Arc<ResolvedResource>, Instant)>;

/// Cached discovery.
#[derive(Clone)]
pub struct Discovery {
    client: Client,
    ttl: Duration,
    cache: Arc<Mutex<ResolvedCache>>,
}

impl Discovery {
    #[must_use]
    pub fn new(client: Client, ttl: Duration) -> Self {
        Self { client, ttl, cache: Arc::default() }
    }

    /// How long an answer is used before discovery is asked again (`discoveryInterval`).
    #[must_use]
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Resolves `resource` (lowercase plural) in `api_version` (`group/version` or `v1`).
    pub async fn resolve(&self, api_version: &str, resource: &str) -> Result<Arc<ResolvedResource>, DiscoveryError> {
        let key = (api_version.to_owned(), resource.to_owned());
        if let Some((hit, at)) = self.cache.lock().expect("discovery lock").get(&key)
            && at.elapsed() < self.ttl
        {
            return Ok(Arc::clone(hit));
        }
        let gv: GroupVersion = api_version.parse().map_err(|e: kube::core::gvk::ParseGroupVersionError| {
            DiscoveryError::BadApiVersion { api_version: api_version.to_owned(), reason: e.to_string() }
        })?;
        let group = kube::discovery::oneshot::pinned_group(&self.client, &gv).await.map_err(|source| match source {
            kube::Error::Api(ref status) if status.code == 404 => {
                DiscoveryError::NotFound { api_version: api_version.to_owned(), resource: resource.to_owned() }
            }
            source => DiscoveryError::Api { api_version: api_version.to_owned(), source },
        })?;
        let (api_resource, caps) =
            group.versioned_resources(&gv.version).into_iter().find(|(ar, _)| ar.plural == resource).ok_or_else(
                || DiscoveryError::NotFound { api_version: api_version.to_owned(), resource: resource.to_owned() },
            )?;
        let resolved = Arc::new(ResolvedResource {
            api_resource,
            namespaced: caps.scope == Scope::Namespaced,
            has_status: caps.subresources.iter().any(|(sub, _)| sub.plural == "status"),
        });
        self.cache.lock().expect("discovery lock").insert(key, (Arc::clone(&resolved), Instant::now()));
        Ok(resolved)
    }

    /// What `resource` of `api_version` resolved to when it was last asked, however long ago: a type
    /// no longer served (its CRD deleted) is still known here by its kind, to a hub that ran it.
    #[must_use]
    pub fn known(&self, api_version: &str, resource: &str) -> Option<Arc<ResolvedResource>> {
        let key = (api_version.to_owned(), resource.to_owned());
        self.cache.lock().expect("discovery lock").get(&key).map(|(hit, _)| Arc::clone(hit))
    }

    /// Resolves `kind` in `group` (`""`: the core group) at the group's preferred version, as a record
    /// names a type (group and kind, no version): `None` when the API server serves no such type (the
    /// group or the kind is gone), so no object of it can exist. Not cached: it is asked for types a
    /// controller no longer declares, once per deleted parent that still has children of them.
    pub async fn resolve_kind(&self, group: &str, kind: &str) -> Result<Option<ResolvedResource>, kube::Error> {
        let found = match kube::discovery::oneshot::group(&self.client, group).await {
            Ok(found) => found,
            Err(kube::Error::Discovery(kube::error::DiscoveryError::MissingApiGroup(_))) => return Ok(None),
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(None),
            Err(source) => return Err(source),
        };
        Ok(found.recommended_kind(kind).map(|(api_resource, caps)| ResolvedResource {
            api_resource,
            namespaced: caps.scope == Scope::Namespaced,
            has_status: caps.subresources.iter().any(|(sub, _)| sub.plural == "status"),
        }))
    }
}
