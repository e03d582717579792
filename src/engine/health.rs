//! What the controllers are doing, for `/readyz` and `metahook_controllers`: the manager says when a
//! controller is starting, running or failed, and when the controller objects of each kind were listed.
//! Cheap to clone; [`crate::ops::metrics`] reads it (with leadership) to answer `/readyz`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

/// What a controller is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControllerState {
    /// Resolving types and waiting for caches (bounded by `cacheSyncTimeout`).
    Starting,
    Running,
    /// Could not start; retried with backoff. Its `Ready` condition says why.
    Failed(String),
}

impl ControllerState {
    /// The `state` label of `metahook_controllers`.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Failed(_) => "failed",
        }
    }
}

#[derive(Debug, Default)]
struct HealthState {
    controllers: BTreeMap<(String, String), ControllerState>,
    /// Controller kinds whose objects have been listed since the controllers (re)started.
    listed: Vec<String>,
}

/// The controllers' states and which kinds were listed.
#[derive(Clone, Debug, Default)]
pub struct Health {
    state: Arc<Mutex<HealthState>>,
}

/// The controller kinds the manager lists before the hub is ready.
const KINDS: [&str; 3] = ["CompositeController", "DecoratorController", "MapController"];

impl Health {
    /// Forgets everything (a new leadership term starts its controllers afresh).
    pub fn reset(&self) {
        *self.lock() = HealthState::default();
    }

    pub fn listed(&self, kind: &str) {
        let mut state = self.lock();
        if !state.listed.iter().any(|k| k == kind) {
            state.listed.push(kind.to_owned());
        }
    }

    pub fn set(&self, kind: &str, name: &str, controller: ControllerState) {
        self.lock().controllers.insert((kind.to_owned(), name.to_owned()), controller);
    }

    pub fn remove(&self, kind: &str, name: &str) {
        self.lock().controllers.remove(&(kind.to_owned(), name.to_owned()));
    }

    /// Ready, and a body saying why (or why not): once both controller kinds are listed and no
    /// controller is still waiting for its caches. A controller that failed to start does not hold the
    /// hub back: its own `Ready=False` condition says why.
    #[must_use]
    pub fn readiness(&self) -> (bool, String) {
        let mut body = String::new();
        let state = self.lock();
        let mut ready = true;
        for kind in KINDS {
            if !state.listed.iter().any(|k| k == kind) {
                ready = false;
                let _ = writeln!(body, "{kind}s: not listed yet");
            }
        }
        for ((kind, name), controller) in &state.controllers {
            let line = match controller {
                ControllerState::Starting => {
                    ready = false;
                    "waiting for caches".to_owned()
                }
                ControllerState::Running => "running".to_owned(),
                ControllerState::Failed(reason) => format!("not running: {reason}"),
            };
            let _ = writeln!(body, "{kind}/{name}: {line}");
        }
        (ready, body)
    }

    /// How many controllers are in each state (every state named, zero included).
    #[must_use]
    pub fn count_by_state(&self) -> BTreeMap<&'static str, i64> {
        let mut by_state: BTreeMap<&'static str, i64> =
            [("starting", 0), ("running", 0), ("failed", 0)].into_iter().collect();
        for controller in self.lock().controllers.values() {
            *by_state.entry(controller.label()).or_default() += 1;
        }
        by_state
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.state.lock().expect("health lock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_listed_and_no_controller_is_waiting_for_caches() {
        let health = Health::default();
        assert!(!health.readiness().0, "nothing listed yet");
        health.listed("CompositeController");
        health.listed("DecoratorController");
        health.listed("MapController");
        assert!(health.readiness().0);
        health.set("CompositeController", "web", ControllerState::Starting);
        let (ready, body) = health.readiness();
        assert!(!ready && body.contains("CompositeController/web: waiting for caches"), "{body}");
        assert_eq!(health.count_by_state()["starting"], 1);
        health.set("CompositeController", "web", ControllerState::Failed("Forbidden".into()));
        assert!(health.readiness().0, "a controller that cannot start reports on itself, not on the hub");
        health.set("CompositeController", "web", ControllerState::Running);
        assert!(health.readiness().0);
    }
}
