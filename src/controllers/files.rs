//! The controllers read from files (`controllersFrom`, standalone mode), as the [`manager`] runs them
//! beside those of the API: the last good set ([`FileControllers`]), handed over on a `watch` channel by
//! the reader ([`crate::ops::files`]) each time it changes.
//!
//! A file controller runs as an API object of the same spec would; what differs is that it exists
//! nowhere in the API, so its status (`Ready`, `observedGeneration`, `hookVersion`) goes to the log and
//! to `metahook_file_controller_ready` instead, and its Events to the hub's own Pod when the hub runs
//! in one. A name that both a file and a controller object use (same kind) runs the API object: the
//! file's is refused while the object exists (so adding a file can never take a running controller
//! away from its object), and starts once the object is deleted.
//!
//! [`manager`]: crate::controllers::manager

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use tokio::sync::watch;

use crate::api::{CompositeController, DecoratorController, MapController};

/// The controllers of the files, by kind and name, each with where it was read
/// (`controllers/web.yaml document 2`, also its [`crate::api::FROM_FILE_ANNOTATION`]).
#[derive(Clone, Debug, Default)]
pub struct FileControllers {
    pub composites: BTreeMap<String, (String, Arc<CompositeController>)>,
    pub decorators: BTreeMap<String, (String, Arc<DecoratorController>)>,
    pub maps: BTreeMap<String, (String, Arc<MapController>)>,
}

impl FileControllers {
    /// Whether there is no controller at all.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.composites.is_empty() && self.decorators.is_empty() && self.maps.is_empty()
    }

    /// The controllers of `self` that `next` no longer has, as `Kind name`.
    #[must_use]
    pub fn removed_in(&self, next: &Self) -> Vec<String> {
        let composites = self.composites.keys().filter(|n| !next.composites.contains_key(*n));
        let decorators = self.decorators.keys().filter(|n| !next.decorators.contains_key(*n));
        let maps = self.maps.keys().filter(|n| !next.maps.contains_key(*n));
        composites
            .map(|n| format!("CompositeController {n}"))
            .chain(decorators.map(|n| format!("DecoratorController {n}")))
            .chain(maps.map(|n| format!("MapController {n}")))
            .collect()
    }
}

/// What the manager is given to run file controllers.
#[derive(Clone, Debug)]
pub struct Files {
    /// The last good set; a reading that fails keeps the one before.
    pub set: watch::Receiver<Arc<FileControllers>>,
    /// Where Events about file controllers go: the hub's own Pod (`POD_NAME`, `POD_NAMESPACE`), if it
    /// runs in one; else they are only logged.
    pub pod: Option<ObjectReference>,
}
