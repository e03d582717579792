//! What `metahook diff` is given (its arguments), how it fails, and its exit codes.

use std::path::PathBuf;

/// Arguments of `metahook diff`.
#[derive(Debug, Clone, clap::Args)]
pub struct DiffArgs {
    /// The CompositeController or DecoratorController to preview, by name.
    pub controller: String,
    /// URL of the candidate hook, called instead of the controller's sync hook (a customize hook, if
    /// the controller has one, is the controller's own: it is asked which related objects to send).
    #[arg(long, conflicts_with = "hook_cmd")]
    pub hook_url: Option<String>,
    /// Command that starts the candidate hook server (as `metahook render --hook-cmd` takes it): it gets
    /// a free port in `PORT` (and `HOST=127.0.0.1`), its output goes to stderr, and it is stopped
    /// afterwards. Without `--hook-url` or `--hook-cmd`, the controller's own hook is asked: a preview
    /// of what its next resync would change.
    #[arg(long)]
    pub hook_cmd: Option<String>,
    /// Only parents (a decorator's targets) whose labels match, e.g. `tier=canary` (the form of
    /// `kubectl get -l`), on top of the controller's own selectors.
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// API requests per second at most (a token bucket with a burst of 1); `0` = no limit. Every read
    /// is a LIST or a GET: one per parent (target) type, one per child (attachment) type and parent
    /// namespace, one per related type and namespace the customize hook's rules name.
    #[arg(long, default_value_t = 5.0)]
    pub qps: f64,
    /// Kubeconfig file. Without it: `KUBECONFIG`, then `~/.kube/config`, then in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Text)]
    pub output: Format,
}

/// How the report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The summary, then each parent's changes, one per line, fields as `old → new`.
    Text,
    /// One JSON document, for scripts and CI gates.
    Json,
}

/// Exit code: the candidate changes nothing risky (creates, updates, status changes at most).
pub const EXIT_SAFE: u8 = 0;
/// Exit code: no preview (bad arguments, the controller or the cluster unreadable, an unusable hook
/// setting, a controller the hub would refuse to start). `metahook render` uses 2 for its caller's mistakes; `diff` keeps 2 for "risky", so a CI
/// gate tells "would delete or be refused" from "could not tell".
pub const EXIT_ERROR: u8 = 1;
/// Exit code: the candidate would delete a child (or recreate one, `Recreate`), or a parent's answer
/// would be refused (a check of the hub fails, or the hook call fails).
pub const EXIT_RISKY: u8 = 2;

/// Why no preview could be made (exit code [`EXIT_ERROR`]).
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("--selector: {0}")]
    Selector(#[source] crate::cache::selector::SelectorError),
    #[error("connecting to the cluster: {0}")]
    Connect(String),
    #[error("no CompositeController or DecoratorController named {0}")]
    NotFound(String),
    #[error("both a CompositeController and a DecoratorController are named {0}; this is not supported")]
    Ambiguous(String),
    #[error("reading {what}: {source}")]
    Read {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("resolving {role} type {resource}: {source}")]
    Resolve {
        role: &'static str,
        resource: String,
        #[source]
        source: Box<crate::cache::discovery::DiscoveryError>,
    },
    #[error("the controller's {0}")]
    Controller(String),
    #[error("the candidate hook: {0}")]
    Hook(String),
}
