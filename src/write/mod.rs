//! Stage 3, write: turning a validated answer into API writes that cannot destroy what the hub does not
//! own. Claiming children ([`children`]: adopt, release, plan, carry out in a safe order), applying one
//! object ([`apply`]; whether a `Recreate`'s replacement fits the namespace's quotas, [`quota`]), and taking over what Metacontroller wrote ([`take_over`], [`fields`]); a field a child's schema does
//! not declare, dropped as Metacontroller's create drops it ([`unknown_fields`]); a write's answer read
//! for its version alone ([`written`]); the record of a parent's children in other namespaces, which the
//! hub alone writes ([`records`]), and their move out of Metacontroller's API group
//! ([`record_migration`]).
//!
//! May import: [`crate::api`], [`crate::cache`], [`crate::hooks`].

pub mod apply;
pub mod children;
pub mod fields;
pub mod quota;
pub mod record_migration;
pub mod records;
pub mod take_over;
pub mod unknown_fields;
pub mod written;
