//! `metahook render`: runs a CompositeController's, DecoratorController's or MapController's hook on
//! YAML fixtures, without a cluster, and shows what the hub would do (for a MapController: the map call
//! of one input, `--input`, and that input's outputs).
//!
//! Everything the hub decides is decided here by the engine's own code: which fixture objects are
//! children ([`claim_of`] for a composite, [`is_attachment_of`] for a decorator), the request
//! ([`request_map`]) and the verdict on the response ([`composite::validate_response`],
//! [`decorator::validate_response`]). So a hook that renders cleanly is accepted by the hub, and an
//! object the hub would never touch is shown as ignored, never as deleted. Types are resolved offline:
//! kinds from the fixtures (or `--kind`), plurals by kube-core's rules, scope from the fixtures.
//!
//! [`composite::validate_response`]: crate::controllers::composite::validate_response
//! [`decorator::validate_response`]: crate::controllers::decorator::validate_response
//!
//! What it is given is in `args`, the fixtures and the offline type table in `fixtures`, starting
//! the hook's process in `hook`, and what is shown in `report`.

mod args;
mod fixtures;
pub(crate) mod hook;
pub(crate) mod report;

pub use args::{Format, RenderArgs, RenderError};

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::Value;

use crate::api::{
    ChildResourceRule, CompositeController, DecoratorController, MapController, OutputResourceRule, UpdateMethod,
};
use crate::cache::informers::ObjectKey;
use crate::controllers::composite::{self, child_selector};
use crate::controllers::decorator::{self, DECORATOR_ANNOTATION, is_attachment_of};
use crate::engine::error::with_causes;
use crate::engine::sync::Observed;
use crate::write::children::{ChildMap, Claim, claim_of, owner_reference, request_map};

use self::args::input;
use self::fixtures::{
    child_types, plural_of, read_objects, read_one, read_parent, related_map, resolved_parent, type_of,
};
use self::hook::{endpoint, hook_to_call};
use self::report::{Action, Change, Report, child_changes, describe};

fn invalid(err: &(dyn std::error::Error + 'static)) -> RenderError {
    RenderError::Invalid(with_causes(err))
}

/// Runs the hook and returns the report in the requested format.
pub async fn render(args: &RenderArgs) -> Result<String, RenderError> {
    let controller = read_one(&args.controller)?;
    let report = match controller.get("kind").and_then(Value::as_str) {
        Some("CompositeController") => render_composite(args, controller).await?,
        Some("DecoratorController") => render_decorator(args, controller).await?,
        Some("MapController") => render_map(args, controller).await?,
        other => {
            return Err(input(
                &args.controller,
                &format!(
                    "expected a CompositeController, a DecoratorController or a MapController, found kind {other:?}"
                ),
            ));
        }
    };
    Ok(match args.output {
        Format::Yaml => report.yaml(),
        Format::Json => report.json(),
    })
}

async fn render_composite(args: &RenderArgs, controller: Value) -> Result<Report, RenderError> {
    let cc: CompositeController = serde_json::from_value(controller.clone())
        .map_err(|e| input(&args.controller, &format!("not a valid CompositeController: {e}")))?;
    let rule = &cc.spec.parent_resource;
    let parent = read_parent(args, &rule.api_version)?;
    let parent_resource = resolved_parent(&parent, &rule.resource, args.cluster_scoped_parent);
    let parent_ns = parent_resource.namespaced.then_some(parent.metadata.namespace.as_deref()).flatten();
    let hooks = cc.spec.hooks.as_ref().ok_or_else(|| RenderError::Setup("the controller defines no hooks".into()))?;
    let hook = if args.finalizing { hooks.finalize.as_ref() } else { hooks.sync.as_ref() };
    let hook = hook.ok_or_else(|| RenderError::Setup("the controller has no hook for this call".into()))?;
    let types = child_types(&cc.spec.child_resources, &read_objects(&args.children)?, &args.kind, parent_ns)?;
    let selector = child_selector(&cc, &parent).map_err(|e| invalid(&e))?;

    // The hub's claim, object by object: owned and adopted ones are the children the hook sees.
    let mut observed = vec![ChildMap::new(); types.len()];
    let mut adopted = BTreeSet::new();
    let mut untouched = Vec::new();
    for (index, obj) in &types.fixtures {
        let Some(index) = *index else {
            untouched.push(Change::ignored(obj, "not of a child type the controller declares".into()));
            continue;
        };
        match claim_of(obj, &parent, parent_ns, &selector) {
            Claim::Owned => {
                observed[index].insert(ObjectKey::of(obj), Arc::new(obj.clone()));
            }
            Claim::Adopt => {
                // The hook sees it as the hub sends it: with the parent as its controller.
                let mut obj = obj.clone();
                let owner = owner_reference(&parent, &parent_resource);
                obj.metadata.owner_references.get_or_insert_with(Vec::new).push(owner);
                adopted.insert((index, ObjectKey::of(&obj)));
                observed[index].insert(ObjectKey::of(&obj), Arc::new(obj));
            }
            Claim::Release => untouched.push(Change::other(
                Action::Release,
                obj,
                "controlled by this parent, but the selector no longer matches its labels: the hub removes its \
                 ownerReference and leaves the object"
                    .into(),
            )),
            Claim::Ignore(why) => untouched.push(Change::ignored(obj, why.to_string())),
        }
    }

    let version = hook.version();
    let request_children = request_map(&types.resources, version, parent_ns, &observed);
    let related = related_map(&read_objects(&args.related)?, version, parent_ns);
    let (hook, _server) = hook_to_call(hook, args.hook.as_deref(), args.hook_cmd.as_deref()).await?;
    let endpoint =
        endpoint(&hook, &cc.spec.endpoint_configs, "CompositeController", cc.metadata.name.as_deref(), args)?;
    let ask = composite::Ask {
        cc: &cc,
        controller: &controller,
        parent_resource: &parent_resource,
        child_resources: &types.resources,
    };
    let parent_json = crate::hooks::for_hooks(&parent);
    let observed_now = Observed { children: &request_children, related: &related, finalizing: args.finalizing };
    let composite::Answer { desired, status, response } =
        ask.ask(&endpoint, &parent, &parent_json, observed_now, &selector).await.map_err(|e| invalid(&e))?;

    let methods: Vec<UpdateMethod> = cc.spec.child_resources.iter().map(ChildResourceRule::method).collect();
    let mut changes = child_changes(&desired, &observed, &adopted, &methods);
    changes.extend(untouched);
    Ok(Report {
        controller: ("CompositeController", cc.metadata.name.clone().unwrap_or_default()),
        parent: describe(&parent),
        status_changed: parent.data.get("status") != Some(&status),
        status: Some(status),
        metadata_patch: None,
        resync_after: response.resync_after_seconds,
        finalized: response.finalized,
        events: response.events,
        objects_field: "children",
        changes,
        notes: Vec::new(),
    })
}

async fn render_decorator(args: &RenderArgs, controller: Value) -> Result<Report, RenderError> {
    let dc: DecoratorController = serde_json::from_value(controller.clone())
        .map_err(|e| input(&args.controller, &format!("not a valid DecoratorController: {e}")))?;
    let name = dc.metadata.name.clone().unwrap_or_default();
    let target = read_parent(args, "")?;
    let (api_version, kind) = type_of(&target);
    let rules: Vec<_> = dc.spec.resources.iter().filter(|r| r.api_version == api_version).collect();
    let rule = match rules.as_slice() {
        [one] => *one,
        several => several.iter().copied().find(|r| r.resource == plural_of(api_version, kind)).ok_or_else(|| {
            RenderError::Setup(format!(
                "the target is a {api_version} {kind}, and no `resources` rule of the controller is for it"
            ))
        })?,
    };
    let resource = resolved_parent(&target, &rule.resource, args.cluster_scoped_parent);
    let target_ns = resource.namespaced.then_some(target.metadata.namespace.as_deref()).flatten();
    let hooks = &dc.spec.hooks;
    let hook = if args.finalizing { hooks.finalize.as_ref() } else { hooks.sync.as_ref() };
    let hook = hook.ok_or_else(|| RenderError::Setup("the controller has no hook for this call".into()))?;
    let types = child_types(&dc.spec.attachments, &read_objects(&args.children)?, &args.kind, target_ns)?;

    let mut notes = Vec::new();
    if !selects(rule, &target)? && !args.finalizing {
        notes.push(
            "the target does not match the controller's label/annotation selectors: the hub would not call \
             the sync hook for it (only the finalize hook, if it carries the controller's finalizer)"
                .to_owned(),
        );
    }
    // A decorator adopts nothing: its attachments are the objects it made, marked with its name.
    let target_uid = target.metadata.uid.clone().unwrap_or_default();
    let mut observed = vec![ChildMap::new(); types.len()];
    let mut untouched = Vec::new();
    for (index, obj) in &types.fixtures {
        let Some(index) = *index else {
            untouched.push(Change::ignored(obj, "not of an attachment type the controller declares".into()));
            continue;
        };
        if target_ns.is_some() && obj.metadata.namespace.as_deref() != target_ns {
            untouched.push(Change::ignored(obj, "not in the target's namespace".into()));
        } else if is_attachment_of(obj, &target_uid, &name) {
            observed[index].insert(ObjectKey::of(obj), Arc::new(obj.clone()));
        } else {
            let why = format!(
                "not an attachment of this target: that needs a controller ownerReference to the target and the \
                 annotation {DECORATOR_ANNOTATION}: {name}"
            );
            untouched.push(Change::ignored(obj, why));
        }
    }

    let version = hook.version();
    let attachments = request_map(&types.resources, version, target_ns, &observed);
    let related = related_map(&read_objects(&args.related)?, version, target_ns);
    let (hook, _server) = hook_to_call(hook, args.hook.as_deref(), args.hook_cmd.as_deref()).await?;
    let endpoint =
        endpoint(&hook, &dc.spec.endpoint_configs, "DecoratorController", dc.metadata.name.as_deref(), args)?;
    let ask = decorator::Ask { name: &name, controller: &controller, attachment_resources: &types.resources };
    let observed_now = Observed { children: &attachments, related: &related, finalizing: args.finalizing };
    let (answer, response) = ask.ask(&endpoint, &target, &resource, observed_now).await.map_err(|e| invalid(&e))?;

    let methods: Vec<UpdateMethod> = dc.spec.attachments.iter().map(ChildResourceRule::method).collect();
    let mut changes = child_changes(&answer.desired, &observed, &BTreeSet::new(), &methods);
    changes.extend(untouched);
    Ok(Report {
        controller: ("DecoratorController", name),
        parent: describe(&target),
        status_changed: answer.status.as_ref().is_some_and(|s| target.data.get("status") != Some(s)),
        status: answer.status,
        metadata_patch: answer.metadata_patch,
        resync_after: response.resync_after_seconds,
        finalized: response.finalized,
        events: response.events,
        objects_field: "attachments",
        changes,
        notes,
    })
}

async fn render_map(args: &RenderArgs, controller: Value) -> Result<Report, RenderError> {
    let mc: MapController = serde_json::from_value(controller.clone())
        .map_err(|e| input(&args.controller, &format!("not a valid MapController: {e}")))?;
    let name = mc.metadata.name.clone().unwrap_or_default();
    let rule = &mc.spec.parent_resource;
    let parent = read_parent(args, &rule.api_version)?;
    let parent_resource = resolved_parent(&parent, &rule.resource, args.cluster_scoped_parent);
    let parent_ns = parent_resource.namespaced.then_some(parent.metadata.namespace.as_deref()).flatten();
    let output_rules: Vec<ChildResourceRule> =
        mc.spec.output_resources.iter().map(OutputResourceRule::as_child_rule).collect();
    let types = child_types(&output_rules, &read_objects(&args.children)?, &args.kind, parent_ns)?;
    let methods: Vec<UpdateMethod> = output_rules.iter().map(ChildResourceRule::method).collect();
    let parent_uid = parent.metadata.uid.clone().unwrap_or_default();
    let parent_json = crate::controllers::map::parent_for_hooks(&parent);
    let owned = |obj: &DynamicObject| crate::cache::informers::controller_uid(obj) == Some(parent_uid.as_str());

    if args.finalizing {
        return render_map_finalize(args, &mc, &controller, (&types, parent_ns), &parent).await;
    }

    let path = args
        .input
        .as_ref()
        .ok_or_else(|| RenderError::Setup("a MapController renders one input: give it with --input".into()))?;
    let mut input_obj: DynamicObject =
        serde_json::from_value(read_one(path)?).map_err(|e| input(path, &e.to_string()))?;
    input_obj.metadata.uid.get_or_insert_with(|| "00000000-0000-0000-0000-00000000000a".into());
    let (input_version, input_kind) = type_of(&input_obj);
    let type_index = mc.spec.input_resources.iter().position(|r| r.api_version == input_version).ok_or_else(|| {
        RenderError::Setup(format!(
            "the input is a {input_version} {input_kind}, and no inputResources entry is for it"
        ))
    })?;
    let input_resource = resolved_parent(
        &input_obj,
        &mc.spec.input_resources[type_index].resource,
        input_obj.metadata.namespace.is_none(),
    );
    let mut notes = Vec::new();
    let selector = crate::controllers::map::input_selector(&parent).map_err(|e| invalid(&e))?;
    if !selector.matches(&crate::api::labels_of(&input_obj.metadata)) || owned(&input_obj) {
        notes.push("the parent does not select this input (its spec.selector, or the input is its own output): the hub would not ask the map hook about it".to_owned());
    }
    let input_ref = Arc::new(input_obj);
    let the_input = crate::controllers::map::Input { type_index, object: &input_ref };
    let map_key = the_input.map_key().to_owned();
    let mut observed = vec![ChildMap::new(); types.len()];
    let mut untouched = Vec::new();
    for (index, obj) in &types.fixtures {
        let Some(index) = *index else {
            untouched.push(Change::ignored(obj, "not of an output type the controller declares".into()));
            continue;
        };
        if !owned(obj) {
            untouched.push(Change::ignored(obj, "not controlled by the parent: never an output".into()));
        } else if crate::controllers::map::map_key_of(obj) != Some(map_key.as_str()) {
            untouched.push(Change::ignored(obj, "an output of another input (its map key is not this input's)".into()));
        } else {
            observed[index].insert(ObjectKey::of(obj), Arc::new(obj.clone()));
        }
    }
    let hook = mc.spec.hooks.map.as_ref().ok_or_else(|| RenderError::Setup("the controller has no map hook".into()))?;
    let outputs = request_map(&types.resources, hook.version(), parent_ns, &observed);
    let (hook, _server) = hook_to_call(hook, args.hook.as_deref(), args.hook_cmd.as_deref()).await?;
    let endpoint = endpoint(&hook, &mc.spec.endpoint_configs, "MapController", Some(&name), args)?;
    let ask = crate::controllers::map::Ask {
        controller: &controller,
        parent_resource: &parent_resource,
        output_resources: &types.resources,
        input_resources: (0..mc.spec.input_resources.len()).map(|_| &input_resource).collect(),
    };
    let mapped = ask.map(&endpoint, &parent, &parent_json, &the_input, &outputs).await.map_err(|e| invalid(&e))?;
    let mut changes = child_changes(&mapped.desired, &observed, &BTreeSet::new(), &methods);
    changes.extend(untouched);
    notes.push("the parent's status is the hub's: counts of inputs and outputs (see the MapController page)".into());
    Ok(Report {
        controller: ("MapController", name),
        parent: describe(&parent),
        status: None,
        status_changed: false,
        metadata_patch: None,
        resync_after: mapped.resync.map(|d| d.as_secs_f64()),
        finalized: false,
        events: mapped.events,
        objects_field: "outputs",
        changes,
        notes,
    })
}

/// `metahook render --finalizing` of a MapController: its finalize hook, with every output the parent
/// controls (`types`: the output types and fixtures); the hub writes no output then.
async fn render_map_finalize(
    args: &RenderArgs,
    mc: &MapController,
    controller: &Value,
    (types, parent_ns): (&self::fixtures::ChildTypes, Option<&str>),
    parent: &DynamicObject,
) -> Result<Report, RenderError> {
    let name = mc.metadata.name.clone().unwrap_or_default();
    let hook = mc.spec.hooks.finalize.as_ref();
    let hook = hook.ok_or_else(|| RenderError::Setup("the controller has no finalize hook".into()))?;
    let parent_uid = parent.metadata.uid.as_deref();
    let mut observed = vec![ChildMap::new(); types.len()];
    for (index, obj) in &types.fixtures {
        if let Some(index) = index.filter(|_| crate::cache::informers::controller_uid(obj) == parent_uid) {
            observed[index].insert(ObjectKey::of(obj), Arc::new(obj.clone()));
        }
    }
    let outputs = request_map(&types.resources, hook.version(), parent_ns, &observed);
    let (hook, _server) = hook_to_call(hook, args.hook.as_deref(), args.hook_cmd.as_deref()).await?;
    let endpoint = endpoint(&hook, &mc.spec.endpoint_configs, "MapController", Some(&name), args)?;
    let parent_json = crate::controllers::map::parent_for_hooks(parent);
    let request =
        crate::hooks::MapFinalizeRequest { controller, parent: &parent_json, outputs: &outputs, finalizing: true };
    let response = endpoint.map_finalize(&request).await.map_err(|e| invalid(&e))?;
    Ok(Report {
        controller: ("MapController", name),
        parent: describe(parent),
        status: None,
        status_changed: false,
        metadata_patch: None,
        resync_after: response.resync_after_seconds,
        finalized: response.finalized,
        events: response.events,
        objects_field: "outputs",
        changes: Vec::new(),
        notes: vec!["finalizing: the hub writes no output; the garbage collector deletes them with the parent".into()],
    })
}

/// Whether a decorator rule's label and annotation selectors match the target (the engine's
/// [`decorator::Rule`]).
pub(crate) fn selects(rule: &crate::api::DecoratorResourceRule, target: &DynamicObject) -> Result<bool, RenderError> {
    let rule = decorator::Rule::new(rule).map_err(|e| RenderError::Setup(format!("the controller's selector: {e}")))?;
    Ok(rule.selects(target))
}
