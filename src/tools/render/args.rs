//! What `metahook render` is given (its arguments) and how it fails.

use std::path::{Path, PathBuf};

/// Arguments of `metahook render`.
#[derive(Debug, Clone, clap::Args)]
pub struct RenderArgs {
    /// The CompositeController, DecoratorController or MapController (YAML).
    #[arg(long)]
    pub controller: PathBuf,
    /// The parent object (YAML); for a DecoratorController, the object it decorates.
    #[arg(long, visible_alias = "target")]
    pub parent: PathBuf,
    /// Objects in the cluster of the declared child (attachment, output) types: YAML files, several
    /// documents or a `List` each. The hub's claim rules decide which of them the hook sees.
    #[arg(long, visible_alias = "attachments", num_args = 1..)]
    pub children: Vec<PathBuf>,
    /// For a MapController: the input object the map hook is asked about (one render, one input).
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// Related objects, as a customize hook would have selected them.
    #[arg(long, num_args = 1..)]
    pub related: Vec<PathBuf>,
    /// URL of a running hook (overrides the controller's URL).
    #[arg(long, conflicts_with = "hook_cmd")]
    pub hook: Option<String>,
    /// Command that starts the hook server; it gets a free port in `PORT` (and `HOST=127.0.0.1`), its
    /// output goes to stderr, and it is stopped afterwards.
    #[arg(long)]
    pub hook_cmd: Option<String>,
    /// Call the finalize hook with `finalizing: true` instead of sync.
    #[arg(long)]
    pub finalizing: bool,
    /// The parent type is cluster-scoped (built-in cluster-scoped kinds are recognised without it;
    /// otherwise a parent without a namespace is in `default`).
    #[arg(long)]
    pub cluster_scoped_parent: bool,
    /// Kind of a child resource that has no fixture object, e.g. `--kind widgets=Widget`.
    #[arg(long, value_parser = parse_kind)]
    pub kind: Vec<(String, String)>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Yaml)]
    pub output: Format,
}

/// How the report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// YAML documents with `#` comments saying what the hub would do, and a diff for updates.
    Yaml,
    /// One JSON object, for scripts and CI checks.
    Json,
}

pub(super) fn parse_kind(text: &str) -> Result<(String, String), String> {
    text.split_once('=').map(|(r, k)| (r.to_owned(), k.to_owned())).ok_or_else(|| "expected RESOURCE=Kind".into())
}

/// Why rendering failed. [`RenderError::Invalid`] is the hook's fault (exit code 1); the rest are the
/// caller's (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("reading {path}: {reason}")]
    Input { path: PathBuf, reason: String },
    #[error("{0}")]
    Setup(String),
    #[error("{0}")]
    Invalid(String),
}

/// The caller's input at `path` is unusable.
pub(super) fn input(path: &Path, reason: &str) -> RenderError {
    RenderError::Input { path: path.to_owned(), reason: reason.to_owned() }
}
