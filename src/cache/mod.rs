//! Stage 1, cache: what the hub knows of the cluster. One shared watch and cache per type
//! ([`informers`]), listed again every flush interval ([`relist`]), the types themselves
//! ([`discovery`]) and the fields each declares ([`schemas`]), and label selectors over cached objects ([`selector`]), and which replica owns which parent when sharded
//! ([`shard`]). Nothing here writes to the
//! API server.
//!
//! May import: [`crate::api`].

pub mod discovery;
pub mod informers;
pub mod relist;
pub mod schemas;
pub mod selector;
pub mod shard;
