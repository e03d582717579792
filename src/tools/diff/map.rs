//! The preview of a MapController: each selected parent's inputs and outputs read as the controller
//! reads them, the candidate map hook asked for every input (a preview saves no call), each answer
//! checked as a sync checks it, detached outputs deleted or asked of the controller's tombstone hook,
//! and the writes planned over the parts the sync would write — with the status the hub would write.
//! A refused input is reported (the preview is then risky) while the others' writes are listed, as a
//! sync writes them.

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::Value;

use super::args::{DiffArgs, DiffError};
use super::live::{Live, Namespaces};
use super::report::{ParentReport, Report};
use super::{candidate, candidate_hook, record_plan, shard};
use crate::api::{MapController, OutputResourceRule};
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::{Informer, ObjectKey, controller_uid};
use crate::cache::selector::Selector;
use crate::controllers::map::{
    Ask, Input, aggregate, claims_nothing_of_others, former_inputs_output, input_selector, map_key_of, refused,
};
use crate::engine::error::with_causes;
use crate::engine::status::{StatusWrite, status_to_write};
use crate::engine::sync::{children_count, plan};
use crate::hooks::{Endpoint, HookKind};
use crate::write::apply::Applier;
use crate::write::children::{ChildMap, ChildType, DeletionGuard, resources};

/// The preview of `mc`: each selected parent's inputs asked and its outputs planned as a sync would.
pub(super) async fn diff(
    live: &Live,
    mc: &MapController,
    selector: Option<&Selector>,
    args: &DiffArgs,
) -> Result<Report, DiffError> {
    let spec = &mc.spec;
    let name = mc.metadata.name.clone().unwrap_or_default();
    let hook = spec.hooks.map.as_ref().ok_or_else(|| DiffError::Controller("has no map hook".into()))?;
    let parent_rule = &spec.parent_resource;
    let (parent_resource, parents) = live
        .parents(&parent_rule.api_version, &parent_rule.resource, parent_rule.label_selector.as_ref(), selector)
        .await?;
    let namespaces = Namespaces::of(&parents, parent_resource.namespaced);
    let mut inputs = Vec::new();
    for rule in &spec.input_resources {
        let resource = live.resolve("input", &rule.api_version, &rule.resource).await?;
        inputs.push(live.cache(&resource, &namespaces).await?);
    }
    let output_rules: Vec<_> = spec.output_resources.iter().map(OutputResourceRule::as_child_rule).collect();
    let types = live.child_types(&output_rules, "output", |method| method, &namespaces).await?;
    let output_resources = resources(&types);
    let mc_json = serde_json::to_value(mc).unwrap_or(Value::Null);
    let (hook, _server) = candidate_hook(hook, args).await?;
    let endpoint = live.endpoint(&hook, &spec.endpoint_configs, "MapController", &name, HookKind::Map)?;
    let tombstone = spec.hooks.tombstone.as_ref();
    let tombstone = live.endpoint_if(tombstone, &spec.endpoint_configs, "MapController", &name, HookKind::Tombstone)?;
    let ask = Ask {
        controller: &mc_json,
        parent_resource: &parent_resource,
        output_resources: &output_resources,
        input_resources: inputs.iter().map(Informer::resource).collect(),
    };
    let guard = DeletionGuard::from_annotations(mc.metadata.annotations.as_ref()).map_err(DiffError::Controller)?;
    let preview = Preview {
        ask: &ask,
        types: &types,
        inputs: &inputs,
        endpoint: &endpoint,
        tombstone: tombstone.as_ref(),
        applier: &live.applier(),
        guard,
    };
    let mut reports = Vec::with_capacity(parents.len());
    for parent in &parents {
        reports.push(preview.parent(parent, &parent_resource).await);
    }
    Ok(Report { kind: "MapController", controller: name, candidate: candidate(args), parents: reports })
}

/// Observed outputs of one type.
type Outputs = ChildMap<Arc<DynamicObject>>;

/// One controller's preview inputs, the same for every parent.
struct Preview<'a> {
    ask: &'a Ask<'a>,
    types: &'a [ChildType],
    inputs: &'a [Informer],
    endpoint: &'a Endpoint,
    tombstone: Option<&'a Endpoint>,
    applier: &'a Applier,
    guard: Option<DeletionGuard>,
}

impl Preview<'_> {
    /// What a sync of `parent` would write with the candidate's answers.
    async fn parent(&self, parent: &DynamicObject, resource: &ResolvedResource) -> ParentReport {
        let mut report = ParentReport::of(parent);
        if parent.metadata.deletion_timestamp.is_some() {
            report.skipped = Some("being deleted: the finalize hook is asked then, not previewed".into());
            return report;
        }
        let selector = match input_selector(parent) {
            Ok(selector) => selector,
            Err(e) => return report.refuse(&e),
        };
        let uid = parent.metadata.uid.as_deref();
        let scope = resource.namespaced.then_some(parent.metadata.namespace.as_deref()).flatten();
        let (inputs, observed) = self.read(parent, scope, &selector);
        let mut desired: Vec<ChildMap<Value>> = vec![ChildMap::new(); self.types.len()];
        let mut in_scope: Vec<ChildMap<Arc<DynamicObject>>> = vec![ChildMap::new(); self.types.len()];
        let (mut failed, mut failed_groups) = (Vec::new(), Vec::new());
        let parent_json = crate::controllers::map::parent_for_hooks(parent);
        let group = |map_key: &str| -> Vec<ChildMap<Arc<DynamicObject>>> {
            observed
                .iter()
                .map(|outputs| {
                    outputs
                        .iter()
                        .filter(|(_, o)| map_key_of(o) == Some(map_key))
                        .map(|(k, o)| (k.clone(), Arc::clone(o)))
                        .collect()
                })
                .collect()
        };
        // The map keys of the inputs (their UIDs, `Input::map_key`).
        let live: BTreeSet<String> = inputs.iter().flatten().filter_map(|o| o.metadata.uid.clone()).collect();
        for (type_index, objects) in inputs.iter().enumerate() {
            for object in objects {
                let input = Input { type_index, object };
                let outputs = group(input.map_key());
                let shown = self.ask.outputs_map(self.endpoint.version(), parent, &outputs);
                let describe = format!("{} {}", self.inputs[type_index].resource().kind(), ObjectKey::of(object));
                let mut mapped = match self.ask.map(self.endpoint, parent, &parent_json, &input, &shown).await {
                    Ok(mapped) => mapped,
                    Err(e) => {
                        failed.push(format!("{describe}: {}", with_causes(&e)));
                        continue;
                    }
                };
                shard::stamp_as_live(&mut mapped.desired, &observed, uid.unwrap_or_default());
                // An output a former input left (kept, or deleted by this sync): the input waits, as a
                // sync's does, and nothing of its answer is written.
                if former_inputs_output(&mapped.desired, &observed, |k| live.contains(k)).is_some() {
                    continue;
                }
                let claims =
                    claims_nothing_of_others(self.types, parent, input.map_key(), &mapped.desired, &observed, &desired);
                if let Err(why) = claims {
                    failed.push(format!("{describe}: {why}"));
                    continue;
                }
                for (index, outputs) in mapped.desired.into_iter().enumerate() {
                    desired[index].extend(outputs);
                }
                for (index, outputs) in outputs.into_iter().enumerate() {
                    in_scope[index].extend(outputs);
                }
            }
        }
        let groups: BTreeSet<String> =
            observed.iter().flat_map(|o| o.values()).filter_map(|o| map_key_of(o).map(str::to_owned)).collect();
        for map_key in groups.iter().filter(|k| !live.contains(*k)) {
            let outputs = group(map_key);
            let keep = match self.tombstone {
                None => BTreeSet::new(),
                Some(endpoint) => {
                    let shown = self.ask.outputs_map(endpoint.version(), parent, &outputs);
                    match self.ask.tombstone(endpoint, &parent_json, map_key, &shown).await {
                        Ok((keep, _)) => keep,
                        Err(e) => {
                            failed_groups.push(format!("detached outputs of {map_key}: {}", with_causes(&e)));
                            continue;
                        }
                    }
                }
            };
            for (index, outputs) in outputs.into_iter().enumerate() {
                in_scope[index].extend(outputs.into_iter().filter(|(k, _)| !keep.contains(&(index, k.clone()))));
            }
        }
        let ours = |child: &DynamicObject| crate::controllers::map::output_claim(child, uid);
        let adopts = |_: &DynamicObject| false;
        // The guard's share is of all the parent's outputs, whatever inputs this sync is about.
        let total = children_count(&observed);
        let planned = match plan(self.types, &in_scope, &desired, parent, self.guard, total, ours, &adopts) {
            Ok(plan) => plan,
            Err(e) => return report.refuse(&e),
        };
        record_plan(&mut report, &planned, self.types, &in_scope, &desired, self.applier);
        self.status(&mut report, (parent, resource), &inputs, (&observed, &in_scope, &desired));
        let groups_asked =
            if self.tombstone.is_some() { groups.iter().filter(|k| !live.contains(*k)).count() } else { 0 };
        let inputs_total = inputs.iter().map(Vec::len).sum::<usize>();
        if let Some(refused) = refused((inputs_total, failed), (groups_asked, failed_groups)) {
            report = report.refuse(&refused);
        }
        report
    }

    /// `parent`'s inputs (by input type) and outputs (by output type), as the controller reads them.
    fn read(
        &self,
        parent: &DynamicObject,
        scope: Option<&str>,
        selector: &Selector,
    ) -> (Vec<Vec<Arc<DynamicObject>>>, Vec<Outputs>) {
        let uid = parent.metadata.uid.as_deref();
        let inputs = self
            .inputs
            .iter()
            .map(|informer| {
                let mut found: Vec<_> = informer
                    .list_selected(scope.map(Some), selector)
                    .into_iter()
                    .filter(|input| controller_uid(input) != uid)
                    .collect();
                found.sort_by_key(|input| ObjectKey::of(input));
                found
            })
            .collect();
        let observed = self
            .types
            .iter()
            .map(|t| {
                let owned = t.informer.controlled_by(uid.unwrap_or_default()).into_iter();
                owned
                    .filter(|o| scope.is_none() || o.metadata.namespace.as_deref() == scope)
                    .map(|o| (ObjectKey::of(&o), o))
                    .collect()
            })
            .collect();
        (inputs, observed)
    }

    /// Records the status the hub would write: counts of `inputs` and of the outputs after the plan
    /// (`observed`, less those in `scope` not `desired`, plus the `desired` ones not there yet).
    fn status(
        &self,
        report: &mut ParentReport,
        (parent, resource): (&DynamicObject, &ResolvedResource),
        inputs: &[Vec<Arc<DynamicObject>>],
        (observed, scope, desired): (&[Outputs], &[Outputs], &[ChildMap<Value>]),
    ) {
        let after: Vec<Vec<Option<&DynamicObject>>> = (0..self.types.len())
            .map(|index| {
                let kept = observed[index]
                    .iter()
                    .filter(|(k, _)| !scope[index].contains_key(*k) || desired[index].contains_key(*k))
                    .map(|(_, v)| Some(v.as_ref()));
                let created = desired[index].keys().filter(|k| !observed[index].contains_key(*k)).map(|_| None);
                kept.chain(created).collect()
            })
            .collect();
        let mut status = aggregate(&self.ask.input_resources, inputs, self.ask.output_resources, &after);
        status["observedGeneration"] = parent.metadata.generation.unwrap_or(0).into();
        let how = StatusWrite { subresource: resource.has_status, observed_generation: true };
        if let Some(status) = status_to_write(parent, status, how) {
            report.status(parent, &status);
        }
    }
}
