//! What the API says about each controller: its `Ready` condition, the parents (a decorator's
//! targets) its selectors select now, and the latest Warning Event recorded on one of them.
//!
//! Read the way the hub reads them — the same discovery ([`Discovery`]) and selectors ([`Selector`]) —
//! but listed once, metadata only and page by page, since this runs once and the hub's caches are not
//! at hand. What cannot be read about one controller (its parent type is not served, the caller may
//! not list it) is a problem of that controller's line, not the end of the report.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, ListParams, ObjectList, PartialObjectMeta};
use kube::{Client, Resource as _};

use super::StatusError;
use super::report::{LastError, ParentRef, Ready};
use crate::api::{CompositeController, DecoratorController, labels_of};
use crate::cache::discovery::{Discovery, ResolvedResource};
use crate::cache::selector::{Selector, SelectorError};

/// Objects per list request.
const PAGE: u32 = 500;

/// One controller as the API shows it.
#[derive(Debug)]
pub struct Observed {
    /// `CompositeController` or `DecoratorController`.
    pub kind: &'static str,
    pub name: String,
    pub ready: Ready,
    /// The parents (targets) selected now, or why they could not be listed.
    pub parents: Result<BTreeSet<ParentRef>, String>,
    pub last_error: Option<LastError>,
    /// What whoever may create a parent can make the customize hook read through the hub (`None`:
    /// the controller has no customize hook).
    pub related: Option<String>,
    /// What could not be read besides the parents.
    pub problems: Vec<String>,
}

/// One type a controller selects objects of, with the selectors an object must match.
struct ParentRule<'a> {
    api_version: &'a str,
    resource: &'a str,
    labels: Result<Selector, SelectorError>,
    annotations: Result<Selector, SelectorError>,
}

/// Every CompositeController and DecoratorController whose labels match `selector`, with its parents
/// and last Warning Event. Fails only when the controllers themselves cannot be listed.
pub async fn observe(client: &Client, selector: &Selector) -> Result<Vec<Observed>, StatusError> {
    let list = |what: &'static str| move |source| StatusError::List { what, source };
    let api = Api::<CompositeController>::all(client.clone());
    let composites = pages(|lp| {
        let api = &api;
        async move { api.list(&lp).await }
    })
    .await
    .or_else(absent)
    .map_err(list("CompositeControllers"))?;
    let api = Api::<DecoratorController>::all(client.clone());
    let decorators = pages(|lp| {
        let api = &api;
        async move { api.list(&lp).await }
    })
    .await
    .or_else(absent)
    .map_err(list("DecoratorControllers"))?;
    let mut parents = Parents::new(client);
    let mut observed = Vec::new();
    for cc in composites.iter().filter(|c| selector.matches(&labels_of(&c.metadata))) {
        let rule = &cc.spec.parent_resource;
        let rules = [ParentRule {
            api_version: &rule.api_version,
            resource: &rule.resource,
            labels: rule.label_selector.as_ref().map_or(Ok(Selector::everything()), Selector::from_label_selector),
            annotations: Ok(Selector::everything()),
        }];
        let conditions = cc.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        let mut controller = parents.observed("CompositeController", cc.meta().name.clone(), conditions, &rules).await;
        if let Some(hooks) = cc.spec.hooks.as_ref().filter(|h| h.customize.is_some()) {
            let namespaced = parents.namespaced(&rule.api_version, &rule.resource).await;
            let version = crate::engine::related::related_version(hooks.sync.as_ref(), hooks.finalize.as_ref());
            controller.related = Some(reach(version, namespaced, cc.spec.related_limit.as_ref()));
        }
        observed.push(controller);
    }
    for dc in decorators.iter().filter(|d| selector.matches(&labels_of(&d.metadata))) {
        let rules: Vec<ParentRule<'_>> = dc
            .spec
            .resources
            .iter()
            .map(|r| ParentRule {
                api_version: &r.api_version,
                resource: &r.resource,
                labels: r.label_selector.as_ref().map_or(Ok(Selector::everything()), Selector::from_label_selector),
                annotations: r
                    .annotation_selector
                    .as_ref()
                    .map_or(Ok(Selector::everything()), |a| Selector::from_label_selector(&a.as_label_selector())),
            })
            .collect();
        let conditions = dc.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        let mut controller = parents.observed("DecoratorController", dc.meta().name.clone(), conditions, &rules).await;
        if dc.spec.hooks.customize.is_some() {
            let hooks = &dc.spec.hooks;
            let version = crate::engine::related::related_version(hooks.sync.as_ref(), hooks.finalize.as_ref());
            let mut namespaced = Some(false);
            for rule in &dc.spec.resources {
                namespaced = match (namespaced, parents.namespaced(&rule.api_version, &rule.resource).await) {
                    (Some(a), Some(b)) => Some(a || b),
                    _ => None,
                };
            }
            controller.related = Some(reach(version, namespaced, dc.spec.related_limit.as_ref()));
        }
        observed.push(controller);
    }
    observed.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
    attach_warnings(client, &mut observed).await;
    Ok(observed)
}

/// What parents' authors may make a customize hook read, under the sync and finalize hooks' `version`
/// (see [`crate::engine::related::related_version`]), for parents that are `namespaced` (not known: said
/// as if they were, the wider reach), under `limit`.
fn reach(
    version: crate::api::HookVersion,
    namespaced: Option<bool>,
    limit: Option<&crate::api::RelatedLimit>,
) -> String {
    let reach = crate::engine::related::Reach::of(version, namespaced.unwrap_or(true), limit);
    let unlimited = match (reach.unbounded(), limit) {
        (false, _) => "",
        (true, None) => " (no relatedLimit)",
        (true, Some(_)) => " (its relatedLimit leaves this open)",
    };
    format!("{reach}{unlimited}")
}

/// Lists each parent type once, however many controllers select from it.
struct Parents {
    client: Client,
    discovery: Discovery,
    /// Metadata of every object of a type, by `apiVersion/resource`.
    listed: HashMap<String, (std::sync::Arc<ResolvedResource>, Vec<PartialObjectMeta<DynamicObject>>)>,
}

impl Parents {
    fn new(client: &Client) -> Self {
        Self {
            client: client.clone(),
            discovery: Discovery::new(client.clone(), Duration::from_secs(600)),
            listed: HashMap::new(),
        }
    }

    async fn observed(
        &mut self,
        kind: &'static str,
        name: Option<String>,
        conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
        rules: &[ParentRule<'_>],
    ) -> Observed {
        let ready = conditions.iter().find(|c| c.type_ == "Ready").map_or_else(
            || Ready { status: "Unknown".to_owned(), reason: String::new(), message: String::new() },
            |c| Ready { status: c.status.clone(), reason: c.reason.clone(), message: c.message.clone() },
        );
        let mut parents = BTreeSet::new();
        let mut failed = None;
        for rule in rules {
            if let Err(reason) = self.select(rule, &mut parents).await {
                failed = Some(reason);
                break;
            }
        }
        Observed {
            kind,
            name: name.unwrap_or_default(),
            ready,
            parents: failed.map_or(Ok(parents), Err),
            last_error: None,
            related: None,
            problems: Vec::new(),
        }
    }

    /// Whether objects of the type are namespaced (`None`: the type is not served).
    async fn namespaced(&self, api_version: &str, resource: &str) -> Option<bool> {
        self.discovery.resolve(api_version, resource).await.ok().map(|r| r.namespaced)
    }

    /// Adds the objects `rule` selects to `into`.
    async fn select(&mut self, rule: &ParentRule<'_>, into: &mut BTreeSet<ParentRef>) -> Result<(), String> {
        let (labels, annotations) = match (&rule.labels, &rule.annotations) {
            (Ok(labels), Ok(annotations)) => (labels, annotations),
            (Err(e), _) | (_, Err(e)) => return Err(format!("invalid selector: {e}")),
        };
        let key = format!("{}/{}", rule.api_version, rule.resource);
        if !self.listed.contains_key(&key) {
            let resource = self.discovery.resolve(rule.api_version, rule.resource).await.map_err(|e| e.to_string())?;
            let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource.api_resource);
            let objects = pages(|lp| {
                let api = &api;
                async move { api.list_metadata(&lp).await }
            })
            .await
            .map_err(|e| format!("listing {key}: {e}"))?;
            self.listed.insert(key.clone(), (resource, objects));
        }
        let (resource, objects) = &self.listed[&key];
        for meta in objects.iter().map(|o| &o.metadata) {
            if labels.matches(&labels_of(meta)) && annotations.matches(&meta.annotations.clone().unwrap_or_default()) {
                into.insert(ParentRef {
                    api_version: resource.api_version().to_owned(),
                    kind: resource.kind().to_owned(),
                    namespace: meta.namespace.clone(),
                    name: meta.name.clone().unwrap_or_default(),
                });
            }
        }
        Ok(())
    }
}

/// Sets each controller's `last_error`: the latest Warning Event about one of its parents. Events are
/// matched to parents by API group, kind, namespace and name (an Event names the version it was
/// recorded with, which need not be the one listed).
async fn attach_warnings(client: &Client, observed: &mut [Observed]) {
    let api: Api<Event> = Api::all(client.clone());
    let warnings = pages(|lp| {
        let api = &api;
        async move { api.list(&lp.fields("type=Warning")).await }
    });
    let events = match warnings.await {
        Ok(events) => events,
        Err(e) => {
            for o in observed.iter_mut() {
                o.problems.push(format!("cannot read Events: {e}"));
            }
            return;
        }
    };
    let mut latest: HashMap<EventKey, (Timestamp, &Event)> = HashMap::new();
    for event in &events {
        let (Some(regarding), Some(seen)) = (&event.regarding, last_seen(event)) else { continue };
        let key = (
            group(regarding.api_version.as_deref().unwrap_or_default()).to_owned(),
            regarding.kind.clone().unwrap_or_default(),
            regarding.namespace.clone(),
            regarding.name.clone().unwrap_or_default(),
        );
        match latest.get(&key) {
            Some((at, _)) if *at >= seen => {}
            _ => {
                latest.insert(key, (seen, event));
            }
        }
    }
    for o in observed.iter_mut() {
        let Ok(parents) = &o.parents else { continue };
        let newest = parents
            .iter()
            .filter_map(|p| {
                let key = (group(&p.api_version).to_owned(), p.kind.clone(), p.namespace.clone(), p.name.clone());
                latest.get(&key).map(|(at, event)| (*at, *event, p))
            })
            .max_by_key(|(at, _, _)| *at);
        o.last_error = newest.map(|(at, event, parent)| LastError {
            reason: event.reason.clone().unwrap_or_default(),
            note: event.note.clone().unwrap_or_default(),
            parent: parent.clone(),
            time: Some(at.to_string()),
        });
    }
}

/// What an Event is about: API group, kind, namespace (none for a cluster-scoped object) and name.
type EventKey = (String, String, Option<String>, String);

/// When an Event was last seen: its series' last observation, else its time, else when it was made.
fn last_seen(event: &Event) -> Option<Timestamp> {
    event
        .series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or(event.event_time.as_ref().map(|t| t.0))
        .or(event.deprecated_last_timestamp.as_ref().map(|t| t.0))
        .or(event.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// The API group of an `apiVersion` (`""` for `v1`).
fn group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// No controllers, when their CRD is not installed: a hub in standalone mode runs controllers from files
/// only, and the metrics show them.
fn absent<T>(err: kube::Error) -> Result<Vec<T>, kube::Error> {
    match err {
        kube::Error::Api(status) if status.code == 404 => Ok(Vec::new()),
        err => Err(err),
    }
}

/// Every item of a list, asked for [`PAGE`] at a time.
async fn pages<T, F, Fut>(mut page: F) -> Result<Vec<T>, kube::Error>
where
    T: Clone,
    F: FnMut(ListParams) -> Fut,
    Fut: Future<Output = Result<ObjectList<T>, kube::Error>>,
{
    let mut items = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().limit(PAGE);
        if let Some(token) = &token {
            lp = lp.continue_token(token);
        }
        let list = page(lp).await?;
        items.extend(list.items);
        token = list.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok(items);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_sighting_of_an_event_counts() {
        let event: Event = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "e", "creationTimestamp": "2026-01-01T10:00:00Z"},
            "eventTime": "2026-01-01T10:00:00.000000Z",
            "series": {"count": 3, "lastObservedTime": "2026-01-01T10:30:00.000000Z"}
        }))
        .unwrap();
        assert_eq!(last_seen(&event), Some("2026-01-01T10:30:00Z".parse().unwrap()));
        let plain: Event =
            serde_json::from_value(serde_json::json!({"metadata": {"creationTimestamp": "2026-01-01T09:00:00Z"}}))
                .unwrap();
        assert_eq!(last_seen(&plain), Some("2026-01-01T09:00:00Z".parse().unwrap()));
        assert_eq!((group("v1"), group("apps/v1")), ("", "apps"));
    }
}
