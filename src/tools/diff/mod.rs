//! `metahook diff`: what a candidate hook would change in the cluster, previewed read-only from live
//! state, before it is rolled out.
//!
//! Every decision is the engine's own: the children of a parent are claimed by
//! [`claims`] from caches filled by one LIST per type
//! (`live`), the request is built by [`request_map`] in the hook's protocol version, the answer is
//! judged by [`composite::Ask`] (the checks a sync makes), and the writes are planned by the engine's
//! `plan` and [`Plan::planned`](crate::write::children::Plan::planned),
//! with [`Applier::is_current`](crate::write::apply::Applier::is_current) judging whether a child is
//! current. So what diff reports is what a sync would write; nothing is written.
//!
//! A sharded hub's bucket labels are put on the desired children as the hub puts them (`shard`).
//!
//! Previewed for now: CompositeControllers without a customize hook and without rolling updates. A
//! DecoratorController, a customize hook or a rolling child type is refused as
//! [`DiffError::Unsupported`] rather than previewed wrongly.

mod args;
mod live;
mod report;
mod shard;

pub use args::{DiffArgs, DiffError, EXIT_ERROR, EXIT_RISKY, EXIT_SAFE, Format};
pub use report::{ChildChange, FieldChange, ParentReport, Report};

use std::process::ExitCode;
use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::Value;

use crate::api::{CompositeController, labels_of};
use crate::cache::selector::{Selector, parse_selector_string};
use crate::controllers::composite::{self, adopts, child_selector, is_child_of};
use crate::engine::error::with_causes;
use crate::engine::sync::{Observed, plan};
use crate::hooks::ObjectMaps;
use crate::ops::client::{Limits, limited_as};
use crate::write::children::{ChildType, Claims, PlannedWrite, claims, owner_reference, request_map, resources};

use self::live::{Controller, Live, Namespaces};

/// The user agent of diff's requests, so the audit log tells them from the hub's.
const USER_AGENT: &str = concat!("metahook-diff/", env!("CARGO_PKG_VERSION"));

/// Entry point of `metahook diff`: prints the report, and exits [`EXIT_RISKY`] when a child would be
/// deleted or recreated or an answer refused, [`EXIT_SAFE`] otherwise, [`EXIT_ERROR`] when no preview
/// could be made.
#[must_use]
pub fn main(args: &DiffArgs) -> ExitCode {
    let result = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(diff(args)),
        Err(e) => Err(DiffError::Connect(e.to_string())),
    };
    match result {
        Ok(report) => {
            match args.output {
                Format::Text => print!("{}", report.text()),
                Format::Json => print!("{}", report.json()),
            }
            ExitCode::from(if report.risky() { EXIT_RISKY } else { EXIT_SAFE })
        }
        Err(e) => {
            eprintln!("metahook diff: {}", with_causes(&e));
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// The preview `args` ask for.
pub async fn diff(args: &DiffArgs) -> Result<Report, DiffError> {
    let selector = args.selector.as_deref().map(parse_selector_string).transpose().map_err(DiffError::Selector)?;
    let client = crate::ops::client::client_for(args.kubeconfig.as_deref())
        .await
        .map_err(|e| DiffError::Connect(with_causes(&e)))?;
    let limits = Limits { qps: args.qps, burst: 1, in_flight: 1 };
    let live = Live::new(limited_as(client, limits, USER_AGENT));
    match live.controller(&args.controller).await? {
        Controller::Composite(cc) => composite_diff(&live, &cc, selector.as_ref(), args).await,
        Controller::Decorator => {
            Err(DiffError::Unsupported("DecoratorControllers (only CompositeControllers are previewed so far)".into()))
        }
    }
}

/// The preview of a CompositeController: each selected parent asked and planned as a sync would.
async fn composite_diff(
    live: &Live,
    cc: &CompositeController,
    selector: Option<&Selector>,
    args: &DiffArgs,
) -> Result<Report, DiffError> {
    let spec = &cc.spec;
    let name = cc.metadata.name.clone().unwrap_or_default();
    if spec.hooks.as_ref().is_some_and(|h| h.customize.is_some()) {
        return Err(DiffError::Unsupported("a customize hook (related objects are not gathered yet)".into()));
    }
    if spec.child_resources.iter().any(|r| r.method().is_rolling()) {
        return Err(DiffError::Unsupported("rolling child updates".into()));
    }
    let hook = spec.hooks.as_ref().and_then(|h| h.sync.as_ref());
    let hook = hook.ok_or_else(|| DiffError::Controller("has no sync hook".into()))?;
    let parent_rule = &spec.parent_resource;
    let parent_resource = live.resolve("parent", &parent_rule.api_version, &parent_rule.resource).await?;
    let parent_selector = match &parent_rule.label_selector {
        Some(s) => Selector::from_label_selector(s).map_err(|e| DiffError::Controller(with_causes(&e)))?,
        None => Selector::everything(),
    };
    let mut parents: Vec<Arc<DynamicObject>> = live
        .cache(&parent_resource, &Namespaces::Anywhere)
        .await?
        .list(None)
        .into_iter()
        .filter(|p| {
            let labels = labels_of(&p.metadata);
            parent_selector.matches(&labels) && selector.is_none_or(|s| s.matches(&labels))
        })
        .collect();
    // In a stable order, so two previews compare line by line.
    parents.sort_by_key(|p| crate::cache::informers::ObjectKey::of(p));
    let namespaces = Namespaces::of(&parents, parent_resource.namespaced);
    let types = if parents.is_empty() {
        Vec::new()
    } else {
        live.child_types(&spec.child_resources, "child", |method| method, &namespaces).await?
    };
    let child_resources = resources(&types);

    let cc_json = serde_json::to_value(cc).unwrap_or(Value::Null);
    let (hook, _server) =
        crate::tools::render::hook::hook_to_call(hook, args.hook_url.as_deref(), args.hook_cmd.as_deref())
            .await
            .map_err(|e| DiffError::Hook(with_causes(&e)))?;
    let endpoint = live.endpoint(&hook, &spec.endpoint_configs, "CompositeController", &name)?;
    let applier = live.applier();
    let guard = crate::write::children::DeletionGuard::from_annotations(cc.metadata.annotations.as_ref())
        .map_err(DiffError::Controller)?;
    let ask = composite::Ask {
        cc,
        controller: &cc_json,
        parent_resource: &parent_resource,
        child_resources: &child_resources,
    };

    let mut reports = Vec::with_capacity(parents.len());
    for parent in &parents {
        let preview = Preview { ask: &ask, types: &types, endpoint: &endpoint, applier: &applier, guard };
        reports.push(preview.parent(parent, hook.version()).await);
    }
    Ok(Report { controller: name, candidate: candidate(args), parents: reports })
}

/// What the report calls the hook it asked.
fn candidate(args: &DiffArgs) -> String {
    match (&args.hook_url, &args.hook_cmd) {
        (Some(url), _) => url.clone(),
        (None, Some(cmd)) => format!("`{cmd}`"),
        (None, None) => "the controller's own sync hook".into(),
    }
}

/// One controller's preview inputs, the same for every parent.
struct Preview<'a> {
    ask: &'a composite::Ask<'a>,
    types: &'a [ChildType],
    endpoint: &'a crate::hooks::Endpoint,
    applier: &'a crate::write::apply::Applier,
    guard: Option<crate::write::children::DeletionGuard>,
}

impl Preview<'_> {
    /// What a sync of `parent` would do with the candidate's answer: its writes, or why it is refused.
    async fn parent(&self, parent: &DynamicObject, version: crate::api::HookVersion) -> ParentReport {
        let mut report = ParentReport::of(parent);
        if parent.metadata.deletion_timestamp.is_some() {
            report.skipped = Some("being deleted: the finalize hook is asked then, not previewed".into());
            return report;
        }
        let resource = self.ask.parent_resource;
        let selector = match child_selector(self.ask.cc, parent) {
            Ok(selector) => selector,
            Err(e) => {
                report.refused = Some(with_causes(&e));
                return report;
            }
        };
        // Claiming, as a sync's observe would carry it out: adopted orphans are shown to the hook with
        // the parent as their controller.
        let Claims { mut owned, release, adopt } = claims(parent, resource, &selector, self.types);
        for (index, obj) in &adopt {
            let mut obj = (**obj).clone();
            obj.metadata.owner_references.get_or_insert_with(Vec::new).push(owner_reference(parent, resource));
            report.adopt.push(ChildChange::named(self.types[*index].resource(), &obj));
            owned[*index].insert(crate::cache::informers::ObjectKey::of(&obj), Arc::new(obj));
        }
        for (index, obj) in &release {
            report.release.push(ChildChange::named(self.types[*index].resource(), obj));
        }
        let namespace = resource.namespaced.then_some(parent.metadata.namespace.as_deref()).flatten();
        let children = request_map(self.ask.child_resources, version, namespace, &owned);
        let related = ObjectMaps::new();
        let parent_json = crate::hooks::for_hooks(parent);
        let observed = Observed { children: &children, related: &related, finalizing: false };
        let mut answer = match self.ask.ask(self.endpoint, parent, &parent_json, observed, &selector).await {
            Ok(answer) => answer,
            Err(e) => {
                report.refused = Some(with_causes(&e));
                return report;
            }
        };
        shard::stamp_as_live(&mut answer.desired, &owned, parent.metadata.uid.as_deref().unwrap_or_default());
        let ours = |child: &DynamicObject| is_child_of(child, parent);
        let adopts = |child: &DynamicObject| adopts(parent, resource, &selector, child);
        let plan = match plan(self.types, &owned, &answer.desired, parent, self.guard, ours, &adopts) {
            Ok(plan) => plan,
            Err(e) => {
                report.refused = Some(with_causes(&e));
                return report;
            }
        };
        for write in plan.planned(self.applier) {
            match write {
                PlannedWrite::Create(index, key) => {
                    let desired = &answer.desired[index][&key];
                    report.create.push(ChildChange::desired(self.types[index].resource(), &key, desired));
                }
                PlannedWrite::Update(index, key) => {
                    let child_type = &self.types[index];
                    let (desired, current) = (&answer.desired[index][&key], &owned[index][&key]);
                    let recreate = child_type.method == crate::api::UpdateMethod::Recreate;
                    report.update.push(ChildChange::update(child_type.resource(), current, desired, recreate));
                }
                PlannedWrite::Delete(index, obj) => {
                    report.delete.push(ChildChange::named(self.types[index].resource(), &obj));
                }
            }
        }
        report.status(parent, &answer.status);
        report
    }
}
