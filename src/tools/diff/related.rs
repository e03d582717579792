//! The `related` objects of a parent (or target), gathered as the engine gathers them
//! ([`crate::engine::related`]): the controller's own customize hook is asked — the candidate replaces
//! only the sync hook — each rule of its answer is validated by the engine's [`Selection`] and selects
//! from caches filled by one LIST per type and namespace, and the request's map is keyed in the
//! candidate's hook version by the engine's [`related_map`].
//!
//! The engine keeps a customize answer per parent generation; diff asks once per parent, which is
//! what a hub asks after a restart or for a changed parent.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::Value;

use super::args::DiffError;
use super::live::Live;
use crate::cache::informers::Informer;
use crate::engine::error::SyncError;
use crate::engine::related::{ParentScope, Selection, related_map};
use crate::hooks::{CustomizeRequest, Endpoint, ObjectMaps};

/// The customize hook of one controller and the caches its rules have needed so far.
pub(super) struct Related<'a> {
    live: &'a Live,
    /// The controller's customize hook; `None`: no related objects.
    hook: Option<Endpoint>,
    /// The controller object as hooks receive it.
    controller: &'a Value,
    /// The controller's `relatedLimit`.
    limit: Option<&'a crate::api::RelatedLimit>,
    /// Caches by type id and namespace (`None`: everywhere), each listed once.
    listed: BTreeMap<(String, Option<String>), Informer>,
}

impl<'a> Related<'a> {
    pub(super) fn new(
        live: &'a Live,
        hook: Option<Endpoint>,
        controller: &'a Value,
        limit: Option<&'a crate::api::RelatedLimit>,
    ) -> Self {
        Self { live, hook, controller, limit, listed: BTreeMap::new() }
    }

    /// The `related` map of `parent` (in `scope`) as a sync would send it. The inner error is why a
    /// sync would be refused (the customize hook failing, a rule refused or naming a type not served);
    /// the outer one, that the cluster could not be read.
    pub(super) async fn gather(
        &mut self,
        parent: &DynamicObject,
        scope: ParentScope<'_>,
    ) -> Result<Result<ObjectMaps, SyncError>, DiffError> {
        let Some(hook) = &self.hook else { return Ok(Ok(ObjectMaps::new())) };
        let parent_json = crate::hooks::for_hooks(parent);
        let request = CustomizeRequest { controller: self.controller, parent: &parent_json };
        let response = match hook.customize(&request).await {
            Ok(response) => response,
            Err(e) => return Ok(Err(SyncError::Hook(e))),
        };
        let mut rules = Vec::with_capacity(response.related_resources.len());
        let mut reads_namespaces = false;
        for raw in &response.related_resources {
            if let Err(e) = Selection::check(raw) {
                return Ok(Err(e));
            }
            let resource = match self.live.discovery.resolve(&raw.api_version, &raw.resource).await {
                Ok(resource) => resource,
                Err(source) => {
                    let rule = format!("{}.{}", raw.resource, raw.api_version);
                    return Ok(Err(SyncError::RelatedType { rule, source }));
                }
            };
            let selection = match Selection::new(raw, &resource, scope, self.limit) {
                Ok(selection) => selection,
                Err(e) => return Ok(Err(e)),
            };
            let informer = self.live.cached(&mut self.listed, &resource, selection.namespace()).await?;
            reads_namespaces |= selection.reads_namespaces();
            rules.push((selection, informer));
        }
        let namespaces = if reads_namespaces { Some(self.namespaces().await?) } else { None };
        Ok(Ok(related_map(rules.iter().map(|(s, i)| (s, i)), namespaces.as_ref(), scope)))
    }

    /// The Namespaces, whose labels `namespaceSelector` rules read.
    async fn namespaces(&mut self) -> Result<Informer, DiffError> {
        let resource: Arc<_> = self.live.resolve("related", "v1", "namespaces").await?;
        self.live.cached(&mut self.listed, &resource, None).await
    }
}
