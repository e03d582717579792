//! `metahook release`: what a hub start would let go of, done once, then exit.
//!
//! A deleted controller object stays until a hub has taken its finalizer off every object it synced
//! (and released its records of children elsewhere): that promise must outlive a hub that is down, so it
//! is kept in the API ([`crate::controllers::release::CONTROLLER_FINALIZER`]). Where no hub will run
//! again (the hub uninstalled before its controllers, a cluster being taken down), deleted controllers
//! would wait for ever. This command does for them what a starting hub does — the same
//! [`crate::controllers::release::release`], under the same roles (`metahook rbac --base` and each
//! controller's) — without starting any controller, then exits: 0 when every deleted controller is gone,
//! 1 when something still waits (each cause printed), 2 when it could not run.

use std::path::PathBuf;
use std::process::ExitCode;

use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt as _};

use crate::api::{CompositeController, DecoratorController, MapController};
use crate::cache::discovery::Discovery;
use crate::controllers::manager::{Managed, forget_types, left_in_status};
use crate::controllers::release::{
    CONTROLLER_FINALIZER, Holdings, Scope, cannot_exist, release, remove_controller_finalizer,
};

/// Arguments of `metahook release`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReleaseArgs {
    /// Kubeconfig file. Without it: `KUBECONFIG`, then `~/.kube/config`, then in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Only controllers whose labels match, e.g. `team=web` (the hub's `targetLabelSelector`).
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// For a hub that was limited to namespaces (`--namespaces a,b`): look for its objects there only.
    #[arg(long, value_delimiter = ',', value_name = "NAMESPACES")]
    pub namespaces: Vec<String>,
    /// Only the deleted controllers of these names (of any kind); without: every deleted controller.
    pub names: Vec<String>,
}

/// What happened to one deleted controller (or a live one whose spec lost a type while no hub ran).
#[derive(Debug, PartialEq, Eq)]
pub struct Line {
    pub kind: String,
    pub name: String,
    /// How many objects (and records) were let go of.
    pub released: usize,
    /// What still waits (empty: the controller is gone, or going).
    pub waiting: Option<String>,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.waiting {
            None => write!(f, "{} {}: released ({} objects let go of)", self.kind, self.name, self.released),
            Some(why) => write!(f, "{} {}: still waiting: {why}", self.kind, self.name),
        }
    }
}

/// Entry point of `metahook release`.
#[must_use]
pub fn main(args: &ReleaseArgs) -> ExitCode {
    let run = async {
        let client = crate::ops::client::client_for(args.kubeconfig.as_deref()).await.map_err(|e| format!("{e:#}"))?;
        release_deleted(&client, args).await
    };
    let result = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(run),
        Err(e) => Err(e.to_string()),
    };
    match result {
        Ok(lines) => {
            if lines.is_empty() {
                println!("no controller waits for a hub");
            }
            for line in &lines {
                println!("{line}");
            }
            if lines.iter().all(|l| l.waiting.is_none()) { ExitCode::SUCCESS } else { ExitCode::from(1) }
        }
        Err(e) => {
            eprintln!("metahook release: {e}");
            ExitCode::from(2)
        }
    }
}

/// Releases every deleted controller (of `args`' selection) that carries the hub's finalizer.
pub async fn release_deleted(client: &Client, args: &ReleaseArgs) -> Result<Vec<Line>, String> {
    let scope = Scope {
        client: client.clone(),
        discovery: Discovery::new(client.clone(), std::time::Duration::from_secs(30)),
        namespaces: args.namespaces.iter().filter(|n| !n.is_empty()).cloned().collect(),
    };
    let mut lines = release_kind::<CompositeController>(&scope, args).await?;
    lines.extend(release_kind::<DecoratorController>(&scope, args).await?);
    lines.extend(release_kind::<MapController>(&scope, args).await?);
    Ok(lines)
}

async fn release_kind<K: Managed>(scope: &Scope, args: &ReleaseArgs) -> Result<Vec<Line>, String> {
    let kind = K::kind(&()).into_owned();
    let api: Api<K> = Api::all(scope.client.clone());
    let mut params = ListParams::default();
    if let Some(selector) = &args.selector {
        params = params.labels(selector);
    }
    let listed = match api.list(&params).await {
        Ok(list) => list.items,
        // The kind's CRD is not installed: none of it can wait.
        Err(err) if cannot_exist(&err) => return Ok(Vec::new()),
        Err(err) => return Err(format!("listing {kind}s: {err}")),
    };
    let mut lines = Vec::new();
    let waits = |obj: &K| {
        obj.meta().deletion_timestamp.is_some()
            && obj.meta().finalizers.iter().flatten().any(|f| f == CONTROLLER_FINALIZER)
            && (args.names.is_empty() || args.names.contains(&obj.name_any()))
    };
    for obj in listed.iter().filter(|o| waits(o)) {
        let name = obj.name_any();
        let outcome = release(scope, &obj.holdings()).await;
        let mut waiting = (!outcome.done()).then(|| outcome.waiting.to_string());
        if waiting.is_none()
            && let Err(err) = remove_controller_finalizer::<K>(&scope.client, &name, obj.meta().uid.as_deref()).await
        {
            waiting = Some(format!("removing the hub's finalizer: {err}"));
        }
        lines.push(Line { kind: kind.clone(), name, released: outcome.released, waiting });
    }
    // A live controller whose spec lost a type (or its last `crossNamespace` type) while no hub ran: its
    // status still records it, and a hub start would let go of it (and prune the record) as this does.
    let live = |obj: &K| {
        obj.meta().deletion_timestamp.is_none() && (args.names.is_empty() || args.names.contains(&obj.name_any()))
    };
    for obj in listed.iter().filter(|o| live(o)) {
        let types = left_in_status(obj);
        let records = obj.recorded_records() && !obj.keeps_records();
        if types.is_empty() && !records {
            continue;
        }
        let holdings = Holdings { types, records, ..obj.holdings() };
        let outcome = release(scope, &holdings).await;
        let mut waiting = (!outcome.done()).then(|| outcome.waiting.to_string());
        if waiting.is_none()
            && let Err(err) = forget_types(scope, obj, &holdings).await
        {
            waiting = Some(format!("pruning what its status records as held: {err}"));
        }
        lines.push(Line { kind: kind.clone(), name: obj.name_any(), released: outcome.released, waiting });
    }
    Ok(lines)
}
