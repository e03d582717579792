//! Stage 7, tools: the command line ([`cli`]; Go's command-line syntax, [`goflag`]) and what it runs besides the hub — `metahook render`
//! ([`render`]), `metahook migrate --dry-run` ([`migrate`]), the CRDs ([`crds`]) and least-privilege roles
//! ([`rbac`]).
//!
//! May import: anything.

pub mod cli;
pub mod crds;
pub mod goflag;
pub mod migrate;
pub mod rbac;
pub mod render;
