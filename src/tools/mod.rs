//! Stage 7, tools: the command line ([`cli`]; Metacontroller's, [`metacontroller`], in Go's syntax,
//! [`goflag`]; its logs, [`logs`]) and what it runs besides the hub — `metahook render`
//! ([`render`]), `metahook migrate --dry-run` ([`migrate`]), the CRDs ([`crds`]) and least-privilege roles
//! ([`rbac`]), an operator's view of the controllers (`metahook status`, [`status`]), a read-only preview of a candidate hook's writes
//! (`metahook diff`, [`diff`]), a deleted controller's release where no hub runs (`metahook release`,
//! [`release`]), the book's
//! generated reference pages ([`reference`](mod@reference)), and the hook libraries' Python and
//! TypeScript wire types, generated from the Rust ones ([`wiretypes`]).
//!
//! May import: anything.

pub mod cli;
pub mod crds;
pub mod diff;
pub mod goflag;
pub mod logs;
pub mod metacontroller;
pub mod migrate;
pub mod rbac;
pub mod reference;
pub mod release;
pub mod render;
pub mod status;
pub mod wiretypes;
