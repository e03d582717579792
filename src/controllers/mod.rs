//! Stage 5, controllers: the kinds users declare, each a thin consumer of the engine —
//! [`composite`] (with rolling updates), [`decorator`] and [`map`] (Metacontroller's MapController
//! design) — and the [`manager`] that starts, restarts
//! and stops one controller per controller object, of the API or read from a file ([`files`]), and
//! [`release`], which lets go of what a controller held when it goes.
//!
//! May import: every stage below (api, cache, hooks, write, engine).

pub mod composite;
pub mod decorator;
pub mod files;
pub mod manager;
pub mod map;
pub mod release;
