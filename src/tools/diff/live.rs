//! Reading the cluster as the hub's caches would hold it, read-only and paced: the controller, its
//! parents (a decorator's targets), and their children of each declared type — each type listed once
//! per namespace it is needed in, into [`Informer::listed`] caches, so the engine's own functions
//! (claiming, planning, selecting related objects) read them exactly as they read the hub's watched
//! caches.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, Resource as _};

use super::args::DiffError;
use crate::api::{
    ChildResourceRule, CompositeController, DecoratorController, EndpointConfig, Hook, MapController, UpdateMethod,
    labels_of,
};
use crate::cache::discovery::{Discovery, ResolvedResource};
use crate::cache::informers::{Informer, ObjectKey};
use crate::cache::selector::Selector;
use crate::engine::error::with_causes;
use crate::hooks::{Endpoint, HookClient, HookClientConfig, HookKind, HookLabels};
use crate::write::apply::Applier;
use crate::write::children::ChildType;

/// Objects per LIST request.
const PAGE: u32 = 500;

/// The controller to preview.
pub(super) enum Controller {
    Composite(Box<CompositeController>),
    Decorator(Box<DecoratorController>),
    Map(Box<MapController>),
}

/// The cluster, through one paced, read-only client.
pub(super) struct Live {
    client: Client,
    /// The API server's types (the related types a customize hook names are resolved here too).
    pub(super) discovery: Discovery,
}

impl Live {
    pub(super) fn new(client: Client) -> Self {
        Self { discovery: Discovery::new(client.clone(), Duration::from_secs(600)), client }
    }

    /// The CompositeController, DecoratorController or MapController called `name`.
    pub(super) async fn controller(&self, name: &str) -> Result<Controller, DiffError> {
        let read = |what: &str| {
            let what = format!("{what} {name}");
            move |source| DiffError::Read { what, source }
        };
        let composite = Api::<CompositeController>::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(read("CompositeController"))?;
        let decorator = Api::<DecoratorController>::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(read("DecoratorController"))?;
        // A cluster without the MapController CRD answers 404 for the type: none of that kind.
        let map = Api::<MapController>::all(self.client.clone()).get_opt(name).await.ok().flatten();
        match (composite, decorator, map) {
            (Some(cc), None, None) => Ok(Controller::Composite(Box::new(cc))),
            (None, Some(dc), None) => Ok(Controller::Decorator(Box::new(dc))),
            (None, None, Some(mc)) => Ok(Controller::Map(Box::new(mc))),
            (None, None, None) => Err(DiffError::NotFound(name.to_owned())),
            _ => Err(DiffError::Ambiguous(name.to_owned())),
        }
    }

    /// The type `api_version`/`resource` as discovery serves it; `role` names it in the error.
    pub(super) async fn resolve(
        &self,
        role: &'static str,
        api_version: &str,
        resource: &str,
    ) -> Result<Arc<ResolvedResource>, DiffError> {
        self.discovery.resolve(api_version, resource).await.map_err(|source| DiffError::Resolve {
            role,
            resource: format!("{resource}.{api_version}"),
            source: Box::new(source),
        })
    }

    /// The parents to preview: the objects of `api_version`/`resource` that both the controller's
    /// `label_selector` and the command's `selector` select, with their type. In a stable order, so two
    /// previews compare line by line.
    pub(super) async fn parents(
        &self,
        api_version: &str,
        resource: &str,
        label_selector: Option<&LabelSelector>,
        selector: Option<&Selector>,
    ) -> Result<(Arc<ResolvedResource>, Vec<Arc<DynamicObject>>), DiffError> {
        let parent_resource = self.resolve("parent", api_version, resource).await?;
        let parent_selector = match label_selector {
            Some(s) => Selector::from_label_selector(s).map_err(|e| DiffError::Controller(with_causes(&e)))?,
            None => Selector::everything(),
        };
        let mut parents: Vec<Arc<DynamicObject>> = self
            .cache(&parent_resource, &Namespaces::Anywhere)
            .await?
            .list(None)
            .into_iter()
            .filter(|p| {
                let labels = labels_of(&p.metadata);
                parent_selector.matches(&labels) && selector.is_none_or(|s| s.matches(&labels))
            })
            .collect();
        parents.sort_by_key(|p| ObjectKey::of(p));
        Ok((parent_resource, parents))
    }

    /// Every object of `resource` in `namespace` (`None`: everywhere), page by page, as a cache holds
    /// them.
    pub(super) async fn cache(
        &self,
        resource: &Arc<ResolvedResource>,
        namespaces: &Namespaces,
    ) -> Result<Informer, DiffError> {
        let mut objects = Vec::new();
        let scopes: Vec<Option<&str>> = match namespaces {
            Namespaces::Each(names) if resource.namespaced => names.iter().map(|n| Some(n.as_str())).collect(),
            _ => vec![None],
        };
        for namespace in scopes {
            objects.extend(self.list(resource, namespace).await?);
        }
        Ok(Informer::listed(resource, objects))
    }

    async fn list(
        &self,
        resource: &ResolvedResource,
        namespace: Option<&str>,
    ) -> Result<Vec<DynamicObject>, DiffError> {
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource.api_resource),
            None => Api::all_with(self.client.clone(), &resource.api_resource),
        };
        let what = || {
            let plural = &resource.api_resource.plural;
            namespace.map_or_else(|| plural.clone(), |ns| format!("{plural} in {ns}"))
        };
        let mut objects = Vec::new();
        let mut params = ListParams::default().limit(PAGE);
        loop {
            let page = api.list(&params).await.map_err(|source| DiffError::Read { what: what(), source })?;
            objects.extend(page.items);
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(objects),
            }
        }
    }

    /// The declared child (attachment) types, each cached from the namespaces `namespaces` names, with
    /// the update method `method` gives it (as the engine's `child_types` gives it).
    pub(super) async fn child_types(
        &self,
        rules: &[ChildResourceRule],
        role: &'static str,
        method: impl Fn(UpdateMethod) -> UpdateMethod,
        namespaces: &Namespaces,
    ) -> Result<Vec<ChildType>, DiffError> {
        let mut types = Vec::with_capacity(rules.len());
        for rule in rules {
            let resource = self.resolve(role, &rule.api_version, &rule.resource).await?;
            let informer = self.cache(&resource, namespaces).await?;
            types.push(ChildType::new(rule, method(rule.method()), informer));
        }
        Ok(types)
    }

    /// The endpoint of `hook` (the candidate, or the controller's customize hook: `role`) with the
    /// TLS/auth settings the controller gives it (Secrets and `ConfigMap`s they name are read from the
    /// cluster, as the hub reads them).
    pub(super) fn endpoint(
        &self,
        hook: &Hook,
        endpoint_configs: &[EndpointConfig],
        kind: &str,
        name: &str,
        role: HookKind,
    ) -> Result<Endpoint, DiffError> {
        let labels = HookLabels { kind: kind.to_owned(), controller: name.to_owned(), hook: role };
        HookClient::new(&HookClientConfig::default(), Some(self.client.clone()))
            .endpoint(hook, endpoint_configs, labels)
            .map_err(|e| DiffError::Hook(crate::engine::error::with_causes(&e)))
    }

    /// [`Live::endpoint`] of a hook the controller may leave out (its customize or tombstone hook).
    pub(super) fn endpoint_if(
        &self,
        hook: Option<&Hook>,
        endpoint_configs: &[EndpointConfig],
        kind: &str,
        name: &str,
        role: HookKind,
    ) -> Result<Option<Endpoint>, DiffError> {
        hook.map(|hook| self.endpoint(hook, endpoint_configs, kind, name, role)).transpose()
    }

    /// An applier that is only asked whether a child is current ([`Applier::is_current`]), never to
    /// write: with the hub's default field manager, it judges as the hub's does.
    pub(super) fn applier(&self) -> Applier {
        Applier::new(self.client.clone(), crate::ops::config::Config::default().field_manager)
    }

    /// The objects of `resource` in `namespace` (`None`: everywhere) as a cache holds them, listed once
    /// per type and namespace whatever the number of parents asking (`listed` keeps them): a namespace
    /// already covered by a listing everywhere is not listed again.
    pub(super) async fn cached(
        &self,
        listed: &mut BTreeMap<(String, Option<String>), Informer>,
        resource: &Arc<ResolvedResource>,
        namespace: Option<&str>,
    ) -> Result<Informer, DiffError> {
        let id = format!("{}/{}", resource.api_version(), resource.api_resource.plural);
        let namespace = namespace.filter(|_| resource.namespaced);
        for key in [(id.clone(), None), (id.clone(), namespace.map(str::to_owned))] {
            if let Some(informer) = listed.get(&key) {
                return Ok(informer.clone());
            }
        }
        let scope = match namespace {
            Some(ns) => Namespaces::Each(BTreeSet::from([ns.to_owned()])),
            None => Namespaces::Anywhere,
        };
        let informer = self.cache(resource, &scope).await?;
        listed.insert((id, namespace.map(str::to_owned)), informer.clone());
        Ok(informer)
    }
}

/// Where the children of the previewed parents can be: in each of their namespaces, or anywhere
/// (cluster-scoped parents).
pub(super) enum Namespaces {
    Each(BTreeSet<String>),
    Anywhere,
}

impl Namespaces {
    /// The namespaces of `parents`, or anywhere when they are cluster-scoped.
    pub(super) fn of(parents: &[Arc<DynamicObject>], namespaced: bool) -> Self {
        if namespaced {
            Self::Each(parents.iter().filter_map(|p| p.meta().namespace.clone()).collect())
        } else {
            Self::Anywhere
        }
    }

    /// The namespaces of objects of several types (`namespaced` for each): anywhere as soon as one type
    /// is cluster-scoped.
    pub(super) fn of_all<'a>(objects: impl IntoIterator<Item = (&'a Arc<DynamicObject>, bool)>) -> Self {
        let mut each = BTreeSet::new();
        for (obj, namespaced) in objects {
            if !namespaced {
                return Self::Anywhere;
            }
            each.extend(obj.meta().namespace.clone());
        }
        Self::Each(each)
    }
}
