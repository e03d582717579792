//! The preview of a CompositeController: each selected parent's children claimed, its related objects
//! gathered, the candidate asked and its answer checked and planned, as a sync would. With rolling
//! child updates, the preview is the next step of the rollout — what the first sync after the switch
//! writes: the candidate is asked for every live revision's parent, at most one child moves to the
//! latest revision, and the revisions to write are listed.

use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::Value;

use super::args::{DiffArgs, DiffError};
use super::live::{Live, Namespaces};
use super::related::Related;
use super::report::{ChildChange, ParentReport, Report, RevisionChange};
use super::{candidate, candidate_hook, record_plan, shard};
use crate::api::{CompositeController, HookVersion};
use crate::cache::informers::{Informer, ObjectKey};
use crate::cache::selector::Selector;
use crate::controllers::composite::rollouts::{Pending, Rollouts};
use crate::controllers::composite::{self, Answer, Rolling, adopts, adopts_elsewhere, child_selector};
use crate::engine::error::SyncError;
use crate::engine::related::ParentScope;
use crate::engine::status::{StatusWrite, status_to_write};
use crate::engine::sync::{Decision, Observed, children_count, plan, refused_namespaces};
use crate::hooks::{Endpoint, HookKind};
use crate::write::apply::Applier;
use crate::write::children::{
    ChildType, Claims, DeletionGuard, Elsewhere, claims, narrow, owner_reference, request_map, resources, whose_child,
};
use crate::write::records::Record;

/// The preview of `cc`: each selected parent asked and planned as a sync would.
pub(super) async fn diff(
    live: &Live,
    cc: &CompositeController,
    selector: Option<&Selector>,
    args: &DiffArgs,
) -> Result<Report, DiffError> {
    let spec = &cc.spec;
    let name = cc.metadata.name.clone().unwrap_or_default();
    let hooks = spec.hooks.as_ref();
    let hook = hooks.and_then(|h| h.sync.as_ref()).ok_or_else(|| DiffError::Controller("has no sync hook".into()))?;
    let parent_rule = &spec.parent_resource;
    let (parent_resource, parents) = live
        .parents(&parent_rule.api_version, &parent_rule.resource, parent_rule.label_selector.as_ref(), selector)
        .await?;
    let namespaces = Namespaces::of(&parents, parent_resource.namespaced);
    let types = if parents.is_empty() {
        Vec::new()
    } else {
        live.child_types(&spec.child_resources, "child", |method| method, &namespaces).await?
    };
    let child_resources = resources(&types);
    let rollouts = if spec.child_resources.iter().any(|r| r.method().is_rolling()) {
        if !parent_resource.namespaced {
            return Err(DiffError::Controller("has rolling child updates but a cluster-scoped parent type".into()));
        }
        let resource = live.resolve("controllerrevision", crate::api::GROUP_VERSION, "controllerrevisions").await?;
        let revisions = if parents.is_empty() {
            Informer::listed(&resource, [])
        } else {
            live.cache(&resource, &namespaces).await?
        };
        Some(Rollouts::new(revisions, Arc::clone(&parent_resource), child_resources.clone(), spec))
    } else {
        None
    };
    // The parents' records of their children elsewhere, which say (with the label) what is whose there.
    let records =
        if spec.child_resources.iter().any(crate::api::ChildResourceRule::cross_namespace) && !parents.is_empty() {
            let resource = live.resolve("childrecord", crate::api::OWN_GROUP_VERSION, "childrecords").await?;
            Some(live.cache(&resource, &namespaces).await?)
        } else {
            None
        };

    let cc_json = serde_json::to_value(cc).unwrap_or(Value::Null);
    let (hook, _server) = candidate_hook(hook, args).await?;
    let endpoint = live.endpoint(&hook, &spec.endpoint_configs, "CompositeController", &name, HookKind::Sync)?;
    let customize = hooks.and_then(|h| h.customize.as_ref());
    let customize =
        live.endpoint_if(customize, &spec.endpoint_configs, "CompositeController", &name, HookKind::Customize)?;
    let mut related = Related::new(live, customize, &cc_json, cc.spec.related_limit.as_ref());
    let applier = live.applier();
    let guard = DeletionGuard::from_annotations(cc.metadata.annotations.as_ref()).map_err(DiffError::Controller)?;
    let ask = composite::Ask {
        cc,
        controller: &cc_json,
        parent_resource: &parent_resource,
        child_resources: &child_resources,
    };

    let preview = Preview {
        ask: &ask,
        records: records.as_ref(),
        finalizer: format!("metacontroller.io/compositecontroller-{name}"),
        rollouts: rollouts.as_ref(),
        types: &types,
        endpoint: &endpoint,
        applier: &applier,
        guard,
    };
    let mut reports = Vec::with_capacity(parents.len());
    for parent in &parents {
        reports.push(preview.parent(parent, hook.version(), &mut related).await?);
    }
    Ok(Report { kind: "CompositeController", controller: name, candidate: candidate(args), parents: reports })
}

/// One controller's preview inputs, the same for every parent.
struct Preview<'a> {
    ask: &'a composite::Ask<'a>,
    /// With `crossNamespace` child types: the parents' records of their children elsewhere.
    records: Option<&'a Informer>,
    /// The finalizer the controller puts on its parents.
    finalizer: String,
    /// With rolling child updates: the parents' revisions.
    rollouts: Option<&'a Rollouts>,
    types: &'a [ChildType],
    endpoint: &'a Endpoint,
    applier: &'a Applier,
    guard: Option<DeletionGuard>,
}

impl Preview<'_> {
    /// What a sync of `parent` would do with the candidate's answer: its writes, or why it is refused.
    async fn parent(
        &self,
        parent: &DynamicObject,
        version: HookVersion,
        related: &mut Related<'_>,
    ) -> Result<ParentReport, DiffError> {
        let mut report = ParentReport::of(parent);
        if parent.metadata.deletion_timestamp.is_some() {
            report.skipped = Some("being deleted: the finalize hook is asked then, not previewed".into());
            return Ok(report);
        }
        let resource = self.ask.parent_resource;
        let selector = match child_selector(self.ask.cc, parent) {
            Ok(selector) => selector,
            Err(e) => return Ok(report.refuse(&e)),
        };
        // Claiming, as a sync's observe would carry it out: adopted orphans are shown to the hook with
        // the parent as their controller.
        let record = self.records.and_then(|records| {
            let key = crate::write::records::record_key(&self.ask.cc.metadata.name.clone().unwrap_or_default(), parent);
            records.get(&key).map(|obj| Record::of(&obj))
        });
        let elsewhere = match &record {
            Some(record) => Elsewhere::Listed(record),
            None if crate::engine::finalizer::has_finalizer(parent, &self.finalizer) => Elsewhere::Labels,
            None => Elsewhere::Nothing,
        };
        let Claims { mut owned, release, adopt } = claims(parent, resource, &selector, self.types, elsewhere);
        for (index, obj) in &adopt {
            let mut obj = (**obj).clone();
            obj.metadata.owner_references.get_or_insert_with(Vec::new).push(owner_reference(parent, resource));
            report.adopt.push(ChildChange::named(self.types[*index].resource(), &obj));
            owned[*index].insert(ObjectKey::of(&obj), Arc::new(obj));
        }
        for (index, obj) in &release {
            report.release.push(ChildChange::named(self.types[*index].resource(), obj));
        }
        // A rolling parent's revisions are claimed with its children, before the customize hook is asked.
        let rolling =
            self.rollouts.map(|rollouts| (rollouts, self.revisions(rollouts, parent, &selector, &mut report)));
        let namespace = resource.namespaced.then_some(parent.metadata.namespace.as_deref()).flatten();
        let related = match related.gather(parent, ParentScope { namespace, version }).await? {
            Ok(related) => related,
            Err(e) => return Ok(report.refuse(&e)),
        };
        report.related(&related);
        let children = request_map(self.ask.child_resources, version, namespace, &owned);
        let parent_json = crate::hooks::for_hooks(parent);
        let observed = Observed { children: &children, related: &related, finalizing: false };
        let decided = match &rolling {
            None => {
                self.ask.ask(self.endpoint, parent, &parent_json, observed, &selector).await.map(Answer::into_decision)
            }
            Some((rollouts, revisions)) => {
                let rolling = Rolling { rollouts, ask: self.ask, endpoint: self.endpoint, selector: &selector };
                rolling.decide(parent, observed, &owned, revisions).await
            }
        };
        let mut decision: Decision<Pending> = match decided {
            Ok(decision) => decision,
            Err(e) => return Ok(report.refuse(&e)),
        };
        shard::stamp_as_live(&mut decision.desired, &owned, parent.metadata.uid.as_deref().unwrap_or_default());
        let whose = |child: &DynamicObject| whose_child(child, parent, resource, None, &selector, elsewhere);
        let adopts_anywhere = adopts_elsewhere(self.types);
        let adopts = |child: &DynamicObject| adopts(parent, resource, &selector, child, adopts_anywhere);
        let total = children_count(&owned);
        let narrowed = match narrow(self.types, &owned, &decision.desired, parent, resource, whose) {
            Ok(narrowed) => narrowed,
            Err(e) => return Ok(report.refuse(&SyncError::Plan(e))),
        };
        let (in_scope, desired) = match &narrowed {
            Some(narrowed) => (&narrowed.observed[..], &narrowed.desired[..]),
            None => (&owned[..], &decision.desired[..]),
        };
        let plan = match plan(self.types, in_scope, desired, parent, self.guard, total, whose, &adopts) {
            Ok(plan) => plan,
            Err(e) => return Ok(report.refuse(&e)),
        };
        // Namespaces where a name is taken are left out, the rest written, and the sync then fails.
        let refused = narrowed.as_ref().and_then(|n| refused_namespaces(&n.refused, &decision.desired));
        if let Some(pending) = &decision.before {
            report.revisions = pending.planned(self.applier).into_iter().map(RevisionChange::from).collect();
        }
        record_plan(&mut report, &plan, self.types, in_scope, desired, self.applier);
        // As the engine writes it (`observedGeneration` one ahead where the write itself counts).
        let how = StatusWrite { subresource: resource.has_status, observed_generation: true };
        if let Some(status) = decision.status.and_then(|status| status_to_write(parent, status, how)) {
            report.status(parent, &status);
        }
        if let Some(refused) = refused {
            report = report.refuse(&refused);
        }
        Ok(report)
    }

    /// The parent's revisions as a rolling sync claims them: those it controls, and the orphans it would
    /// adopt (reported as adopted, and shown to the sync with the parent as their controller).
    fn revisions(
        &self,
        rollouts: &Rollouts,
        parent: &DynamicObject,
        selector: &Selector,
        report: &mut ParentReport,
    ) -> Vec<Arc<DynamicObject>> {
        let (mut revisions, orphans) = rollouts.claims(parent, selector);
        for orphan in orphans {
            let mut obj = (*orphan).clone();
            let owner = owner_reference(parent, self.ask.parent_resource);
            obj.metadata.owner_references.get_or_insert_with(Vec::new).push(owner);
            report.adopt.push(ChildChange::named(rollouts.informer.resource(), &obj));
            revisions.push(Arc::new(obj));
        }
        revisions
    }
}
