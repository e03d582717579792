//! Controllers from files (`controllersFrom`, `--controllers-from`): standalone mode, for clusters where
//! a team may not install the cluster-scoped controller CRDs (Metacontroller #266).
//!
//! Each path is a file, or a directory whose `*.yaml`, `*.yml` and `*.json` files are read (not its
//! subdirectories, nor its hidden entries: a mounted `ConfigMap`'s `..data`). A file holds one or more YAML
//! documents, each a `CompositeController` or `DecoratorController` of `metacontroller.k8s.io/v1alpha1`,
//! checked as the API server and the controller's start would check the same object: its name, the CRD's
//! schema ([`crate::api::schema`]), its hooks and its annotations, with the API server's and the start's
//! own words, after `<path> document <n>:`.
//!
//! The files are read again every [`POLL`], and their content compared with the last reading's: a
//! `ConfigMap` mount changes by swapping a `..data` symlink, under which neither the files' paths nor their
//! symlinks' times change and a watch on the files (inotify) sees nothing, while editors save by
//! renaming a new file over the old. Reading a few small files every two seconds sees every one of
//! those, on any filesystem, and costs nothing measurable.
//!
//! A reading is taken whole or not at all: when any document fails (YAML, a check, two documents with
//! one name), the last good set keeps running and the reading says why, per file and document, in the
//! log, as a Warning Event on the hub's Pod when it runs in one (`POD_NAME`, `POD_NAMESPACE`, `POD_UID`),
//! and in `metahook_controllers_file_errors`. The first reading has no good set before it: until the
//! files are fixed, no file controller runs (the hub does not stop: a restarting hub would stop the
//! controllers of the API too).
//!
//! A reading may also be *partial*, and a partial reading must never be taken for "these controllers
//! were removed": stopping a controller takes its finalizers off every parent, and a parent deleted
//! meanwhile then goes without its finalize hook or its children elsewhere. So these are bad readings
//! too, reported as a parse error is: an entry that cannot be read (a dangling symlink — how a
//! `ConfigMap`'s key looks between the kubelet's `..data` swap and its new links), a file with no
//! document (a file caught while it is written), and a reading with no controller at all after one with
//! some (a directory emptied and refilled). And a good reading that stops a running controller is taken
//! only when the next reading, [`POLL`] later, agrees; one that changes nothing else waits with it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::validation::{NameRule, check_name};
use crate::api::{CompositeController, DecoratorController, FROM_FILE_ANNOTATION, GROUP_VERSION, Hook, MapController};
use crate::controllers::files::{FileControllers, Files};
use crate::engine::error::StartError;
use crate::engine::hub::Hub;
use crate::ops::yaml;

/// How often the files are read again.
pub const POLL: Duration = Duration::from_secs(2);

/// What was wrong with one file or document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{place}: {reason}")]
pub struct FileError {
    /// `<path>`, or `<path> document <n>` (from 1).
    pub place: String,
    pub reason: String,
}

/// The files of `paths`, in order: a file as given, a directory's controller files sorted by name.
fn files(paths: &[String]) -> Result<Vec<PathBuf>, FileError> {
    let mut found = Vec::new();
    for path in paths {
        let fail = |e: std::io::Error| FileError { place: path.clone(), reason: e.to_string() };
        let meta = std::fs::metadata(path).map_err(fail)?;
        if !meta.is_dir() {
            found.push(PathBuf::from(path));
            continue;
        }
        let mut inside = Vec::new();
        for entry in std::fs::read_dir(path).map_err(fail)? {
            let entry = entry.map_err(fail)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let wanted = [".yaml", ".yml", ".json"].iter().any(|ext| name.ends_with(ext));
            if !wanted || name.starts_with('.') {
                continue;
            }
            // `metadata` follows symlinks: a ConfigMap's keys are symlinks into `..data`. One that
            // leads nowhere is a file not readable now, not a file that is gone.
            match std::fs::metadata(entry.path()) {
                Ok(meta) if meta.is_file() => inside.push(entry.path()),
                Ok(_) => {}
                Err(e) => {
                    let place = entry.path().display().to_string();
                    return Err(FileError { place, reason: format!("cannot be read: {e}") });
                }
            }
        }
        inside.sort();
        found.extend(inside);
    }
    Ok(found)
}

/// Reads every file of `paths`: each file's path and content.
fn read(paths: &[String]) -> Result<Vec<(String, String)>, FileError> {
    files(paths)?
        .into_iter()
        .map(|path| {
            let place = path.display().to_string();
            match std::fs::read_to_string(&path) {
                Ok(text) => Ok((place, text)),
                Err(e) => Err(FileError { place, reason: e.to_string() }),
            }
        })
        .collect()
}

/// The controllers of the files' `contents` (path, text), or every error found in them.
pub fn parse(contents: &[(String, String)]) -> Result<FileControllers, Vec<FileError>> {
    let mut set = FileControllers::default();
    let mut errors = Vec::new();
    for (path, text) in contents {
        let documents: Vec<Value> = match yaml::from_documents(text) {
            Ok(documents) if documents.iter().all(Value::is_null) => {
                let reason = "holds no document (taken for a file read while it was being written)".to_owned();
                errors.push(FileError { place: path.clone(), reason });
                continue;
            }
            Ok(documents) => documents,
            Err(e) => {
                errors.push(FileError { place: path.clone(), reason: e.to_string() });
                continue;
            }
        };
        for (i, document) in documents.into_iter().enumerate() {
            let place = format!("{path} document {}", i + 1);
            if let Err(reason) = document_into(&mut set, &place, document) {
                errors.push(FileError { place, reason });
            }
        }
    }
    if errors.is_empty() { Ok(set) } else { Err(errors) }
}

/// Checks one document and adds its controller to `set`, marked with where it was read.
fn document_into(set: &mut FileControllers, place: &str, mut document: Value) -> Result<(), String> {
    let field = |name: &str| document.get(name).and_then(Value::as_str).unwrap_or_default().to_owned();
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    if api_version != GROUP_VERSION
        || !matches!(kind.as_str(), "CompositeController" | "DecoratorController" | "MapController")
    {
        return Err(format!(
            "not a controller: apiVersion {api_version:?} and kind {kind:?}, where {GROUP_VERSION} \
             CompositeController, DecoratorController or MapController is wanted"
        ));
    }
    let name = document.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
    if name.is_empty() {
        return Err("metadata.name: Required value".to_owned());
    }
    check_name(NameRule::Subdomain, &name).map_err(|e| format!("metadata.name: {e}"))?;
    let errors = crate::api::schema::check(&kind, &document);
    if !errors.is_empty() {
        return Err(format!("{kind}.{GROUP_VERSION} {name:?} is invalid: {}", errors.join(", ")));
    }
    // The status is the hub's to write, and for a file controller nobody's.
    if let Some(fields) = document.as_object_mut() {
        fields.remove("status");
    }
    document["metadata"]["annotations"][FROM_FILE_ANNOTATION] = Value::String(place.to_owned());
    let taken = |other: &str| format!("{kind} {name:?} is also in {other}");
    if kind == "CompositeController" {
        let cc: CompositeController = serde_json::from_value(document).map_err(|e| e.to_string())?;
        let hooks = cc.spec.hooks.as_ref().map(|h| [h.sync.as_ref(), h.finalize.as_ref(), h.customize.as_ref()]);
        starts(hooks, cc.metadata.annotations.as_ref())?;
        if let Some((other, _)) = set.composites.get(&name) {
            return Err(taken(other));
        }
        set.composites.insert(name, (place.to_owned(), Arc::new(cc)));
    } else if kind == "MapController" {
        let mc: MapController = serde_json::from_value(document).map_err(|e| e.to_string())?;
        if mc.spec.hooks.map.is_none() {
            return Err("a MapController needs a map hook".to_owned());
        }
        starts(Some([mc.spec.hooks.map.as_ref(), None, None]), mc.metadata.annotations.as_ref())?;
        if let Some((other, _)) = set.maps.get(&name) {
            return Err(taken(other));
        }
        set.maps.insert(name, (place.to_owned(), Arc::new(mc)));
    } else {
        let dc: DecoratorController = serde_json::from_value(document).map_err(|e| e.to_string())?;
        let h = &dc.spec.hooks;
        starts(Some([h.sync.as_ref(), h.finalize.as_ref(), h.customize.as_ref()]), dc.metadata.annotations.as_ref())?;
        if let Some((other, _)) = set.decorators.get(&name) {
            return Err(taken(other));
        }
        set.decorators.insert(name, (place.to_owned(), Arc::new(dc)));
    }
    Ok(())
}

/// The checks of a controller's start that need no cluster, with its words: a sync or a finalize hook,
/// and annotations that are valid settings. (The rest, types served and caches filled, is checked as the
/// controller starts, and retried, as for a controller object.)
fn starts(hooks: Option<[Option<&Hook>; 3]>, annotations: Option<&BTreeMap<String, String>>) -> Result<(), String> {
    crate::engine::sync::check_hooks(hooks).map_err(|e| e.to_string())?;
    crate::engine::sync::Settings::from_annotations(annotations).map_err(|e| StartError::Annotation(e).to_string())?;
    Ok(())
}

/// The hub's Pod, from the downward API (`POD_NAME`, `POD_NAMESPACE`, and `POD_UID`, without which
/// `kubectl describe pod` does not list the Events); `None` outside a Pod.
#[must_use]
pub fn own_pod() -> Option<ObjectReference> {
    let name = std::env::var("POD_NAME").ok().filter(|n| !n.is_empty())?;
    let namespace = std::env::var("POD_NAMESPACE").ok().filter(|n| !n.is_empty())?;
    Some(ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        name: Some(name),
        namespace: Some(namespace),
        uid: std::env::var("POD_UID").ok().filter(|u| !u.is_empty()),
        ..ObjectReference::default()
    })
}

/// Reads `paths` now, and again every [`POLL`] until `cancel`: the manager's [`Files`].
pub struct Reader {
    paths: Vec<String>,
    hub: Hub,
    pod: Option<ObjectReference>,
    sender: watch::Sender<Arc<FileControllers>>,
    /// The content of the last reading, to tell a change.
    last: Option<Result<Vec<(String, String)>, FileError>>,
    /// A good reading that stops a running controller, until the next reading agrees.
    pending: Option<FileControllers>,
}

impl Reader {
    /// A reader of `paths` that has read them once (the first set, or nothing if they fail).
    pub async fn start(paths: Vec<String>, hub: Hub) -> (Self, Files) {
        let (sender, set) = watch::channel(Arc::new(FileControllers::default()));
        let pod = own_pod();
        let mut reader = Self { paths, hub, pod: pod.clone(), sender, last: None, pending: None };
        reader.read().await;
        (reader, Files { set, pod })
    }

    /// Reads the files every [`POLL`] until `cancel`.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut ticks = tokio::time::interval(POLL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.reset();
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = ticks.tick() => self.read().await,
            }
        }
    }

    /// One reading: a new set when the files changed and are good; when they changed and are not, why.
    async fn read(&mut self) {
        let paths = self.paths.clone();
        let contents = tokio::task::spawn_blocking(move || read(&paths))
            .await
            .unwrap_or_else(|e| Err(FileError { place: "controllersFrom".into(), reason: e.to_string() }));
        if self.last.as_ref() == Some(&contents) {
            // The same reading again: a removal held back is confirmed.
            if let Some(set) = self.pending.take() {
                info!(stopped = ?self.sender.borrow().removed_in(&set), "a second reading agrees: controllers removed from the files stop");
                self.take(set);
            }
            return;
        }
        self.last = Some(contents.clone());
        self.pending = None;
        let parsed = contents.map_err(|e| vec![e]).and_then(|contents| parse(&contents));
        let current = Arc::clone(&self.sender.borrow());
        match parsed {
            Ok(set) if set.is_empty() && !current.is_empty() => {
                let reason = format!(
                    "no controller in the files, where {} ran: taken for a partial reading (to stop every file \
                     controller, remove controllersFrom)",
                    current.composites.len() + current.decorators.len() + current.maps.len()
                );
                self.report(vec![FileError { place: "controllersFrom".into(), reason }]).await;
            }
            Ok(set) => {
                self.hub.metrics.files.read(0);
                let removed = current.removed_in(&set);
                if removed.is_empty() {
                    self.take(set);
                } else {
                    info!(?removed, "controllers removed from the files stop when the next reading agrees");
                    self.pending = Some(set);
                }
            }
            Err(errors) => self.report(errors).await,
        }
    }

    /// Runs `set` from now on.
    fn take(&self, set: FileControllers) {
        info!(
            composites = set.composites.len(),
            decorators = set.decorators.len(),
            "read the controllers from files (controllersFrom)"
        );
        self.sender.send_replace(Arc::new(set));
    }

    /// Says why a reading is not taken, as the module doc says; the last good set keeps running.
    async fn report(&self, errors: Vec<FileError>) {
        self.hub.metrics.files.read(errors.len());
        for error in errors {
            warn!(file = %error.place, "controllersFrom: {error}; the last good set of controllers keeps running");
            if let Some(pod) = &self.pod {
                let note = format!("{error}; the last good set of controllers keeps running");
                self.hub.events.warning(pod, "InvalidControllerFile", note).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: metacontroller.k8s.io/v1alpha1
kind: CompositeController
metadata: {name: web}
spec:
  parentResource: {apiVersion: test.metahook.dev/v1, resource: things}
  childResources: [{apiVersion: v1, resource: configmaps}]
  hooks: {sync: {webhook: {url: 'http://127.0.0.1:1/sync'}}}
---
apiVersion: metacontroller.k8s.io/v1alpha1
kind: DecoratorController
metadata: {name: web}
spec:
  resources: [{apiVersion: v1, resource: services}]
  hooks: {sync: {webhook: {url: 'http://127.0.0.1:1/sync'}}}
";

    fn contents(texts: &[(&str, &str)]) -> Vec<(String, String)> {
        texts.iter().map(|(p, t)| ((*p).to_owned(), (*t).to_owned())).collect()
    }

    #[test]
    fn documents_of_both_kinds_are_read_and_marked_with_their_place() {
        let set = parse(&contents(&[("c/web.yaml", GOOD)])).unwrap();
        let (place, cc) = &set.composites["web"];
        assert_eq!(place, "c/web.yaml document 1");
        assert_eq!(crate::api::from_file(&cc.metadata), Some("c/web.yaml document 1"));
        assert_eq!(set.decorators["web"].0, "c/web.yaml document 2", "the same name in another kind is fine");
    }

    #[test]
    fn every_error_names_its_file_and_document() {
        let no_hooks = GOOD.replace("  hooks: {sync: {webhook: {url: 'http://127.0.0.1:1/sync'}}}\n---", "---");
        let errors = parse(&contents(&[("a.yaml", &no_hooks), ("b.yaml", "a: [")])).unwrap_err();
        assert_eq!(errors.len(), 2, "{errors:#?}");
        assert_eq!(errors[0].to_string(), "a.yaml document 1: no hooks defined");
        assert!(errors[1].to_string().starts_with("b.yaml: "), "{}", errors[1]);
        let no_url = GOOD.replace("url: 'http://127.0.0.1:1/sync'", "path: /sync");
        let errors = parse(&contents(&[("a.yaml", &no_url)])).unwrap_err();
        assert_eq!(
            errors[0].to_string(),
            "a.yaml document 1: CompositeController.metacontroller.k8s.io/v1alpha1 \"web\" is invalid: \
             spec.hooks.sync.webhook: Invalid value: \"object\": must specify either a full 'url', or both \
             'service' and 'path'"
        );
        let bad_setting = GOOD.replacen(
            "metadata: {name: web}",
            "metadata: {name: web, annotations: {metahook.dev/sync-on-own-writes: maybe}}",
            1,
        );
        let errors = parse(&contents(&[("a.yaml", &bad_setting)])).unwrap_err();
        assert!(errors[0].reason.contains("sync-on-own-writes"), "{errors:#?}");
    }

    #[test]
    fn a_name_twice_and_other_kinds_are_refused() {
        let errors = parse(&contents(&[("a.yaml", GOOD), ("b.yaml", GOOD)])).unwrap_err();
        assert_eq!(
            errors[0].to_string(),
            "b.yaml document 1: CompositeController \"web\" is also in a.yaml document 1"
        );
        let errors =
            parse(&contents(&[("a.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")])).unwrap_err();
        assert!(errors[0].reason.starts_with("not a controller"), "{errors:#?}");
        let errors = parse(&contents(&[("a.yaml", &GOOD.replacen("name: web", "name: Web", 1))])).unwrap_err();
        assert!(errors[0].reason.starts_with("metadata.name: name \"Web\" is invalid"), "{errors:#?}");
    }

    #[tokio::test]
    async fn a_bad_reading_keeps_the_last_good_set_and_a_fixed_one_is_taken() {
        // Nothing listens on port 9 of the loopback: the hub's parts are built, the cluster never asked.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let hub = crate::ops::run::build(kube::Client::try_from(config).unwrap(), &crate::Config::default());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.yaml");
        std::fs::write(&file, GOOD).unwrap();
        let (mut reader, files) = Reader::start(vec![dir.path().display().to_string()], hub.clone()).await;
        assert_eq!(files.set.borrow().composites.len(), 1);
        let errors = || hub.metrics.files.errors();
        std::fs::write(&file, format!("{GOOD}---\nkind: [\n")).unwrap();
        reader.read().await;
        assert_eq!(files.set.borrow().composites["web"].0, format!("{} document 1", file.display()), "kept");
        assert_eq!(errors(), 1);
        std::fs::write(&file, GOOD.replace("name: web}", "name: api}")).unwrap();
        reader.read().await;
        // `web` is gone from this reading: it is taken when the next one agrees.
        assert_eq!(files.set.borrow().composites.keys().collect::<Vec<_>>(), ["web"]);
        reader.read().await;
        let set = files.set.borrow().clone();
        assert_eq!(set.composites.keys().collect::<Vec<_>>(), ["api"]);
        assert_eq!(set.decorators.keys().collect::<Vec<_>>(), ["api"]);
        assert_eq!(errors(), 0);
        // A reading that loses every controller is taken for a partial one (issue 53 item 2).
        std::fs::remove_file(&file).unwrap();
        reader.read().await;
        assert_eq!(files.set.borrow().composites.keys().collect::<Vec<_>>(), ["api"], "an emptied directory");
        assert_eq!(errors(), 1);
        // So are an empty file and an entry that cannot be read (a dangling symlink).
        std::fs::write(&file, "").unwrap();
        reader.read().await;
        assert_eq!((files.set.borrow().composites.len(), errors()), (1, 1), "an empty file");
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(dir.path().join("..data/c.yaml"), &file).unwrap();
        reader.read().await;
        assert_eq!((files.set.borrow().composites.len(), errors()), (1, 1), "a dangling symlink");
        // A controller removed from the files stops once a second reading agrees.
        std::fs::remove_file(&file).unwrap();
        let decorator_only = GOOD.replace("name: web}", "name: api}").split("---\n").nth(1).unwrap().to_owned();
        std::fs::write(&file, &decorator_only).unwrap();
        reader.read().await;
        assert_eq!(files.set.borrow().composites.len(), 1, "one reading without it: still running");
        assert_eq!(errors(), 0);
        reader.read().await;
        assert!(files.set.borrow().composites.is_empty(), "the next reading agrees: stopped");
        assert_eq!(files.set.borrow().decorators.keys().collect::<Vec<_>>(), ["api"]);
    }

    #[test]
    fn a_directory_gives_its_controller_files_in_order_through_symlinks_and_not_hidden_ones() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("..data");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("b.yaml"), GOOD).unwrap();
        std::os::unix::fs::symlink(data.join("b.yaml"), dir.path().join("b.yaml")).unwrap();
        std::fs::write(dir.path().join("a.json"), "{}").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "").unwrap();
        std::fs::write(dir.path().join(".hidden.yaml"), "").unwrap();
        let found = files(&[dir.path().display().to_string()]).unwrap();
        let names: Vec<_> = found.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["a.json", "b.yaml"]);
        let missing = files(&["/nonexistent/controllers".to_owned()]).unwrap_err();
        assert_eq!(missing.place, "/nonexistent/controllers");
    }
}
