//! `metahook diff`: what a candidate hook would change in the cluster, previewed read-only from live
//! state, before it is rolled out.
//!
//! Every decision is the engine's own: a composite parent's children are claimed by
//! [`claims`](crate::write::children::claims) and a decorator target's attachments read by
//! [`attachments`](crate::controllers::decorator::attachments), from caches filled by one LIST per type
//! (`live`); the related objects come from the controller's customize hook and the engine's rule
//! matching (`related`); the request is built by
//! [`request_map`](crate::write::children::request_map) in the hook's protocol version, the answer is
//! judged by the kind's `Ask` ([`composite::Ask`](crate::controllers::composite::Ask),
//! [`decorator::Ask`](crate::controllers::decorator::Ask): the checks a sync makes), and the writes are
//! planned by the engine's `plan` and [`Plan::planned`], with
//! [`Applier::is_current`](crate::write::apply::Applier::is_current) judging whether a child is
//! current. So what diff reports is what a sync would write; nothing is written.
//!
//! A sharded hub's bucket labels are put on the desired children as the hub puts them (`shard`).
//!
//! A MapController's preview (`map`) asks the candidate map hook for every input of every parent.
//!
//! With rolling child updates the preview is the rollout's next step (`composite`). Not previewed: the
//! finalize hook — the candidate stands for the sync hook only, so a parent (target) being deleted is
//! listed as skipped.

mod args;
mod composite;
mod decorator;
mod live;
mod map;
mod related;
mod report;
mod shard;

pub use args::{DiffArgs, DiffError, EXIT_ERROR, EXIT_RISKY, EXIT_SAFE, Format};
pub use report::{ChildChange, FieldChange, ParentReport, Report, RevisionChange};

use std::process::ExitCode;
use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::Value;

use crate::api::UpdateMethod;
use crate::cache::selector::parse_selector_string;
use crate::engine::error::with_causes;
use crate::ops::client::{Limits, limited_as};
use crate::write::apply::Applier;
use crate::write::children::{ChildMap, ChildType, Plan, PlannedWrite};

use self::live::{Controller, Live};

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
        Controller::Composite(cc) => composite::diff(&live, &cc, selector.as_ref(), args).await,
        Controller::Decorator(dc) => decorator::diff(&live, &dc, selector.as_ref(), args).await,
        Controller::Map(mc) => map::diff(&live, &mc, selector.as_ref(), args).await,
    }
}

/// The hook the preview asks: the candidate `args` names (`--hook-url`, `--hook-cmd`), else the
/// controller's `hook`; with the server `--hook-cmd` started, kept alive by the handle.
async fn candidate_hook(
    hook: &crate::api::Hook,
    args: &DiffArgs,
) -> Result<(crate::api::Hook, Option<crate::tools::render::hook::HookProcess>), DiffError> {
    crate::tools::render::hook::hook_to_call(hook, args.hook_url.as_deref(), args.hook_cmd.as_deref())
        .await
        .map_err(|e| DiffError::Hook(with_causes(&e)))
}

/// What the report calls the hook it asked.
fn candidate(args: &DiffArgs) -> String {
    match (&args.hook_url, &args.hook_cmd) {
        (Some(url), _) => url.clone(),
        (None, Some(cmd)) => format!("`{cmd}`"),
        (None, None) => "the controller's own sync hook".into(),
    }
}

/// Records in `report` the child writes of `plan` (made of `types`, the `observed` children and the
/// `desired` ones), as [`Plan::planned`] lists them: what the sync would write, in its order.
fn record_plan(
    report: &mut ParentReport,
    plan: &Plan<'_>,
    types: &[ChildType],
    observed: &[ChildMap<Arc<DynamicObject>>],
    desired: &[ChildMap<Value>],
    applier: &Applier,
) {
    for write in plan.planned(applier) {
        match write {
            PlannedWrite::Create(index, key) => {
                report.create.push(ChildChange::desired(types[index].resource(), &key, &desired[index][&key]));
            }
            PlannedWrite::Update(index, key) => {
                let child_type = &types[index];
                let recreate = child_type.method == UpdateMethod::Recreate;
                let (want, current) = (&desired[index][&key], &observed[index][&key]);
                report.update.push(ChildChange::update(child_type.resource(), current, want, recreate));
            }
            PlannedWrite::Delete(index, obj) => {
                report.delete.push(ChildChange::named(types[index].resource(), &obj));
            }
        }
    }
}
