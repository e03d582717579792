//! The preview of a DecoratorController: each target its resource rules select (any rule of the type,
//! its label and annotation selectors both matching), its attachments read as the decorator claims
//! them, its related objects gathered, the candidate asked and its answer checked and planned, as a
//! sync would — attachments to create, update and delete, and the target's labels, annotations and
//! status as the decorator would write them.

use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::Value;

use super::args::{DiffArgs, DiffError};
use super::live::{Live, Namespaces};
use super::related::Related;
use super::report::{ParentReport, Report};
use super::{candidate, candidate_hook, record_plan, shard};
use crate::api::{DecoratorController, HookVersion, labels_of};
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::ObjectKey;
use crate::cache::selector::Selector;
use crate::controllers::decorator::{self, Rule, attachment_method, attachments};
use crate::engine::error::with_causes;
use crate::engine::related::ParentScope;
use crate::engine::status::{StatusWrite, status_to_write};
use crate::engine::sync::{Observed, children_count, plan};
use crate::hooks::{Endpoint, HookKind};
use crate::write::apply::Applier;
use crate::write::children::{ChildType, DeletionGuard, request_map, resources};

/// The preview of `dc`: each selected target asked and planned as a sync would.
pub(super) async fn diff(
    live: &Live,
    dc: &DecoratorController,
    selector: Option<&Selector>,
    args: &DiffArgs,
) -> Result<Report, DiffError> {
    let spec = &dc.spec;
    let name = dc.metadata.name.clone().unwrap_or_default();
    let hook = spec.hooks.sync.as_ref().ok_or_else(|| DiffError::Controller("has no sync hook".into()))?;
    // One cache per target type, whatever the number of rules naming it; a target is selected when
    // any rule of its type selects it (as the engine's targets are).
    let mut types: Vec<(Arc<ResolvedResource>, Vec<Rule>)> = Vec::new();
    for rule in &spec.resources {
        let resource = live.resolve("target", &rule.api_version, &rule.resource).await?;
        let compiled = Rule::new(rule).map_err(|e| DiffError::Controller(with_causes(&e)))?;
        match types.iter_mut().find(|(r, _)| *r == resource) {
            Some((_, rules)) => rules.push(compiled),
            None => types.push((resource, vec![compiled])),
        }
    }
    let mut targets: Vec<(Arc<DynamicObject>, Arc<ResolvedResource>)> = Vec::new();
    for (resource, rules) in &types {
        let cache = live.cache(resource, &Namespaces::Anywhere).await?;
        targets.extend(
            cache
                .list(None)
                .into_iter()
                .filter(|t| rules.iter().any(|r| r.selects(t)))
                .filter(|t| selector.is_none_or(|s| s.matches(&labels_of(&t.metadata))))
                .map(|t| (t, Arc::clone(resource))),
        );
    }
    // In a stable order (by type, then object), so two previews compare line by line.
    targets.sort_by_key(|(t, r)| (types.iter().position(|(x, _)| x == r), ObjectKey::of(t)));
    let namespaces = Namespaces::of_all(targets.iter().map(|(t, r)| (t, r.namespaced)));
    let attachment_types = if targets.is_empty() {
        Vec::new()
    } else {
        live.child_types(&spec.attachments, "attachment", attachment_method, &namespaces).await?
    };
    let attachment_resources = resources(&attachment_types);

    let dc_json = serde_json::to_value(dc).unwrap_or(Value::Null);
    let (hook, _server) = candidate_hook(hook, args).await?;
    let endpoint = live.endpoint(&hook, &spec.endpoint_configs, "DecoratorController", &name, HookKind::Sync)?;
    let customize = spec.hooks.customize.as_ref();
    let customize =
        live.endpoint_if(customize, &spec.endpoint_configs, "DecoratorController", &name, HookKind::Customize)?;
    let mut related = Related::new(live, customize, &dc_json, dc.spec.related_limit.as_ref());
    let applier = live.applier();
    let guard = DeletionGuard::from_annotations(dc.metadata.annotations.as_ref()).map_err(DiffError::Controller)?;
    let ask = decorator::Ask { name: &name, controller: &dc_json, attachment_resources: &attachment_resources };

    let preview = Preview { ask: &ask, types: &attachment_types, endpoint: &endpoint, applier: &applier, guard };
    let mut reports = Vec::with_capacity(targets.len());
    for (target, resource) in &targets {
        reports.push(preview.target(target, resource, hook.version(), &mut related).await?);
    }
    Ok(Report { kind: "DecoratorController", controller: name, candidate: candidate(args), parents: reports })
}

/// One controller's preview inputs, the same for every target.
struct Preview<'a> {
    ask: &'a decorator::Ask<'a>,
    types: &'a [ChildType],
    endpoint: &'a Endpoint,
    applier: &'a Applier,
    guard: Option<DeletionGuard>,
}

impl Preview<'_> {
    /// What a sync of `target` (of type `resource`) would do with the candidate's answer: its writes,
    /// or why it is refused.
    async fn target(
        &self,
        target: &DynamicObject,
        resource: &ResolvedResource,
        version: HookVersion,
        related: &mut Related<'_>,
    ) -> Result<ParentReport, DiffError> {
        let mut report = ParentReport::of(target);
        if target.metadata.deletion_timestamp.is_some() {
            report.skipped = Some("being deleted: the finalize hook is asked then, not previewed".into());
            return Ok(report);
        }
        // A decorator adopts and releases nothing: its attachments are what it made, marked with its name.
        let observed = attachments(self.types, target, resource, self.ask.name);
        let namespace = resource.namespaced.then_some(target.metadata.namespace.as_deref()).flatten();
        let related = match related.gather(target, ParentScope { namespace, version }).await? {
            Ok(related) => related,
            Err(e) => return Ok(report.refuse(&e)),
        };
        report.related(&related);
        let children = request_map(self.ask.attachment_resources, version, namespace, &observed);
        let call = Observed { children: &children, related: &related, finalizing: false };
        let mut answer = match self.ask.ask(self.endpoint, target, resource, call).await {
            Ok((answer, _)) => answer,
            Err(e) => return Ok(report.refuse(&e)),
        };
        shard::stamp_as_live(&mut answer.desired, &observed, target.metadata.uid.as_deref().unwrap_or_default());
        let uid = target.metadata.uid.as_deref().unwrap_or_default();
        let ours = |child: &DynamicObject| decorator::attachment_claim(child, uid, self.ask.name);
        let adopts = |_: &DynamicObject| false;
        let total = children_count(&observed);
        let plan = match plan(self.types, &observed, &answer.desired, target, self.guard, total, ours, &adopts) {
            Ok(plan) => plan,
            Err(e) => return Ok(report.refuse(&e)),
        };
        record_plan(&mut report, &plan, self.types, &observed, &answer.desired, self.applier);
        let how = StatusWrite { subresource: resource.has_status, observed_generation: false };
        if let Some(status) = answer.status.and_then(|status| status_to_write(target, status, how)) {
            report.status(target, &status);
        }
        if let Some(patch) = &answer.metadata_patch {
            report.metadata(target, patch);
        }
        Ok(report)
    }
}
