//! Secret and `ConfigMap` values that hook calls need, kept current by one watch per referenced object.
//!
//! Metacontroller reads them once when a controller starts, so rotating a CA, a client certificate or a
//! token needs an edit of the controller's spec. Here every referenced object is watched — one small
//! watch per object, a `metadata.name` field selector in its namespace, so RBAC can grant exactly those
//! objects — and the next call after a rotation uses the new value. Watches are shared by every hook
//! that references the object and end when the last of those hooks goes (its controller stops).
//!
//! Values are [`Sensitive`]: their `Debug` shows only a length, so no value reaches a log line, an Event
//! or an error message by way of `{:?}`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, Weak};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::watch;

/// The two kinds of object a hook setting can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    Secret,
    ConfigMap,
}

/// A Secret or `ConfigMap` by kind, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    pub kind: ObjectKind,
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// Bytes read from a Secret or `ConfigMap`. `Debug` prints only the length; the bytes are reachable
/// only through [`Sensitive::expose`], which names the intent at every use.
#[derive(Clone, PartialEq, Eq)]
pub struct Sensitive(Arc<[u8]>);

impl Sensitive {
    #[must_use]
    pub fn new(bytes: impl Into<Arc<[u8]>>) -> Self {
        Self(bytes.into())
    }

    /// The secret bytes themselves.
    #[must_use]
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Sensitive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sensitive(<{} bytes redacted>)", self.0.len())
    }
}

/// An object's data: every key of `data` (and, for `ConfigMap`s, `binaryData`).
pub type Data = BTreeMap<String, Sensitive>;

/// What is known about a watched object.
#[derive(Clone, Debug, PartialEq)]
pub enum Observed {
    /// The first list has not answered yet.
    Pending,
    Missing,
    Present(Arc<Data>),
    /// The watch fails (e.g. Forbidden) and no value was ever read.
    Unreadable(String),
}

/// The latest state of an object and a counter that changes whenever the state does.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub version: u64,
    pub observed: Observed,
}

/// Why a value a hook needs cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("{object} not found")]
    NotFound { object: ObjectRef },
    #[error("cannot read {object}: {reason}")]
    Unreadable { object: ObjectRef, reason: String },
    #[error("{object} has no key {key:?}")]
    MissingKey { object: ObjectRef, key: String },
    /// The value is there but unusable; `reason` never quotes the value.
    #[error("{what} from {object} key {key:?}: {reason}")]
    Invalid { what: &'static str, object: ObjectRef, key: String, reason: String },
    #[error("TLS setup: {reason}")]
    Tls { reason: String },
}

/// One watched object. Dropping the last handle stops its watch.
pub struct Watched {
    object: ObjectRef,
    state: watch::Receiver<Snapshot>,
    task: Option<tokio::task::AbortHandle>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl fmt::Debug for Watched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watched").field("object", &self.object).finish_non_exhaustive()
    }
}

impl Watched {
    /// The latest state, waiting while the first list is in flight (callers bound the wait by the
    /// hook's timeout).
    pub async fn current(&self) -> Snapshot {
        let mut state = self.state.clone();
        let ready = state.wait_for(|s| s.observed != Observed::Pending).await;
        match ready {
            Ok(snapshot) => snapshot.clone(),
            Err(_) => self.state.borrow().clone(),
        }
    }

    /// The version of the latest state, without waiting.
    #[must_use]
    pub fn version(&self) -> u64 {
        self.state.borrow().version
    }

    /// The value of `key` in `snapshot`, or why there is none.
    pub fn value(&self, snapshot: &Snapshot, key: &str) -> Result<Sensitive, CredentialError> {
        let object = || self.object.clone();
        match &snapshot.observed {
            Observed::Present(data) => data
                .get(key)
                .cloned()
                .ok_or_else(|| CredentialError::MissingKey { object: object(), key: key.to_owned() }),
            Observed::Missing => Err(CredentialError::NotFound { object: object() }),
            Observed::Unreadable(reason) => {
                Err(CredentialError::Unreadable { object: object(), reason: reason.clone() })
            }
            Observed::Pending => {
                Err(CredentialError::Unreadable { object: object(), reason: "not listed yet".to_owned() })
            }
        }
    }

    #[must_use]
    pub fn object(&self) -> &ObjectRef {
        &self.object
    }
}

/// The hub's watches of referenced Secrets and `ConfigMap`s, shared by all hooks.
pub struct Credentials {
    /// `None` when there is no cluster (`metahook render`): every referenced value is unreadable.
    client: Option<kube::Client>,
    watches: Mutex<HashMap<ObjectRef, Weak<Watched>>>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials").field("cluster", &self.client.is_some()).finish_non_exhaustive()
    }
}

impl Credentials {
    #[must_use]
    pub fn new(client: Option<kube::Client>) -> Self {
        Self { client, watches: Mutex::default() }
    }

    /// A handle on `object`'s current data, starting its watch unless one is running. Must be called
    /// within a Tokio runtime when there is a cluster.
    pub fn watch(&self, object: &ObjectRef) -> Arc<Watched> {
        let mut watches = self.watches.lock().expect("credential watches lock");
        watches.retain(|_, w| w.strong_count() > 0);
        if let Some(existing) = watches.get(object).and_then(Weak::upgrade) {
            return existing;
        }
        let started = Arc::new(self.start(object));
        watches.insert(object.clone(), Arc::downgrade(&started));
        started
    }

    fn start(&self, object: &ObjectRef) -> Watched {
        let Some(client) = &self.client else {
            let offline = Observed::Unreadable("no cluster to read it from".to_owned());
            let (_, state) = watch::channel(Snapshot { version: 1, observed: offline });
            return Watched { object: object.clone(), state, task: None };
        };
        let (tx, state) = watch::channel(Snapshot { version: 0, observed: Observed::Pending });
        let name = object.name.clone();
        let task = match object.kind {
            ObjectKind::Secret => {
                let api: Api<Secret> = Api::namespaced(client.clone(), &object.namespace);
                tokio::spawn(follow(api, name, tx, secret_data))
            }
            ObjectKind::ConfigMap => {
                let api: Api<ConfigMap> = Api::namespaced(client.clone(), &object.namespace);
                tokio::spawn(follow(api, name, tx, config_map_data))
            }
        };
        Watched { object: object.clone(), state, task: Some(task.abort_handle()) }
    }
}

/// Publishes every change of object `name` to `tx` until the task is aborted.
async fn follow<K>(api: Api<K>, name: String, tx: watch::Sender<Snapshot>, data: fn(K) -> Data)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + fmt::Debug + Send + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut listed: Option<Data> = None;
    while let Some(event) = events.next().await {
        let observed = match event {
            Ok(watcher::Event::Init) => {
                listed = None;
                continue;
            }
            Ok(watcher::Event::InitApply(obj)) => {
                listed = Some(data(obj));
                continue;
            }
            Ok(watcher::Event::InitDone) => listed.take().map_or(Observed::Missing, |d| Observed::Present(Arc::new(d))),
            Ok(watcher::Event::Apply(obj)) => Observed::Present(Arc::new(data(obj))),
            Ok(watcher::Event::Delete(_)) => Observed::Missing,
            // A broken watch keeps serving the last value it read; the error matters only when there is none.
            Err(err) if matches!(tx.borrow().observed, Observed::Pending | Observed::Unreadable(_)) => {
                Observed::Unreadable(err.to_string())
            }
            Err(_) => continue,
        };
        publish(&tx, observed);
    }
}

/// Replaces the state if it changed, bumping its version.
fn publish(tx: &watch::Sender<Snapshot>, observed: Observed) {
    tx.send_if_modified(|snapshot| {
        if snapshot.observed == observed {
            return false;
        }
        snapshot.version += 1;
        snapshot.observed = observed;
        true
    });
}

fn secret_data(secret: Secret) -> Data {
    let mut data: Data = secret.data.unwrap_or_default().into_iter().map(|(k, v)| (k, Sensitive::new(v.0))).collect();
    // `stringData` is write-only in the API; a fresh object may still carry it in a watch event.
    for (k, v) in secret.string_data.unwrap_or_default() {
        data.entry(k).or_insert_with(|| Sensitive::new(v.into_bytes()));
    }
    data
}

fn config_map_data(config_map: ConfigMap) -> Data {
    let text = config_map.data.unwrap_or_default().into_iter().map(|(k, v)| (k, Sensitive::new(v.into_bytes())));
    let binary = config_map.binary_data.unwrap_or_default().into_iter().map(|(k, v)| (k, Sensitive::new(v.0)));
    text.chain(binary).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object() -> ObjectRef {
        ObjectRef { kind: ObjectKind::Secret, namespace: "ops".into(), name: "token".into() }
    }

    #[test]
    fn sensitive_values_never_show_in_debug_output() {
        let value = Sensitive::new(b"hunter2-token".to_vec());
        let data: Data = BTreeMap::from([("token".to_owned(), value.clone())]);
        let printed = format!("{value:?} {data:?} {:?}", Observed::Present(Arc::new(data.clone())));
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(printed.contains("13 bytes redacted"), "{printed}");
        assert_eq!(value.expose(), b"hunter2-token");
    }

    #[test]
    fn secret_and_config_map_data_keep_every_key() {
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s"}, "data": {"token": "c2VjcmV0"}, "stringData": {"extra": "x"}}))
        .unwrap();
        let data = secret_data(secret);
        assert_eq!(data["token"].expose(), b"secret");
        assert_eq!(data["extra"].expose(), b"x");
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c"}, "data": {"ca.crt": "PEM"}, "binaryData": {"bin": "AAE="}}))
        .unwrap();
        let data = config_map_data(cm);
        assert_eq!(data["ca.crt"].expose(), b"PEM");
        assert_eq!(data["bin"].expose(), [0, 1]);
    }

    #[tokio::test]
    async fn values_are_read_from_the_latest_state_and_errors_name_the_object_not_the_value() {
        let (tx, state) = watch::channel(Snapshot { version: 0, observed: Observed::Pending });
        let watched = Watched { object: object(), state, task: None };
        publish(&tx, Observed::Missing);
        let err = watched.value(&watched.current().await, "token").unwrap_err();
        assert_eq!(err.to_string(), "Secret ops/token not found");
        let data = Data::from([("token".to_owned(), Sensitive::new(b"v1".to_vec()))]);
        publish(&tx, Observed::Present(Arc::new(data.clone())));
        let version = watched.version();
        publish(&tx, Observed::Present(Arc::new(data)));
        assert_eq!(watched.version(), version, "an unchanged object keeps its version");
        let snapshot = watched.current().await;
        assert_eq!(watched.value(&snapshot, "token").unwrap().expose(), b"v1");
        let err = watched.value(&snapshot, "other").unwrap_err();
        assert_eq!(err.to_string(), "Secret ops/token has no key \"other\"");
    }

    #[tokio::test]
    async fn offline_credentials_are_unreadable_with_a_reason() {
        let credentials = Credentials::new(None);
        let watched = credentials.watch(&object());
        let err = watched.value(&watched.current().await, "token").unwrap_err();
        assert!(err.to_string().contains("no cluster"), "{err}");
        assert!(Arc::ptr_eq(&watched, &credentials.watch(&object())), "one watch per object");
    }
}
