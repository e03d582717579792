//! `mc-mix`: Metacontroller's requests for the fanout workload, made by its own loop, as a process of
//! its own (the bench binary started with `--mc-mix`).
//!
//! It stood in for Metacontroller in `make bench` before the bench could run the real one
//! (`metacontroller.rs`, with `MC_SRC=` or `MC_BIN=`), and stays beside it as the explanation of where
//! Metacontroller's requests cost, apart from its client and caches. It makes the requests Metacontroller 4.x (`metacontroller/metacontroller` at
//! 175eac0) makes for a `CompositeController` with `generateSelector`, `InPlace` children and the
//! default `dynamic-apply` strategy, when they are made, and nothing it does not:
//! - watches, from the start: the parent type and the child type cluster-wide, and Metacontroller's
//!   `controllerrevisions` (`pkg/controller/composite/controller.go` 131–157; the revision lister comes
//!   from `mcInformerFactory`, started for every CompositeController);
//! - queues a parent on its every watch event, including the ones its own status writes cause
//!   (`updateParentObject`, 411–436: "We used to ignore our own status updates, but we don't
//!   anymore"), on a child's create/update/delete through the child's controller ownerRef (475–553,
//!   an update only when the resourceVersion changed), and on the informer's resync every
//!   `resyncPeriodSeconds` (281, `AddEventHandlerWithResyncPeriod`); a client-go work queue (a key
//!   queued while it syncs runs again after), 5 workers (`pkg/cmd/metacontroller/main.go` 50);
//! - each sync: the parent and its children from the caches (the children by the controller-owner UID
//!   index and the orphan index its informers keep, `pkg/dynamic/informer/informer.go` 44–80, 144–160,
//!   read by `claimChildren`, `controller.go` 829–850: a lookup, not a scan of every child), the sync
//!   hook (v1 request), then per
//!   desired child a **POST** carrying `metacontroller.k8s.io/last-applied-configuration` and the
//!   controller ownerRef (`pkg/controller/common/manage_children.go` 618–636, `claimOwnership`
//!   507–518, `pkg/dynamic/apply/apply.go` 39–51), or, for an observed child whose three-way merge
//!   differs, a **PUT** of the merged object (558–605); then the status: a **GET** of the parent and,
//!   when the status differs, a **PUT** of the `status` subresource, re-read on conflict
//!   (`controller.go` 879–899, `pkg/dynamic/clientset/clientset.go` 203–233).
//!
//! Not reproduced, because the workload never needs them: deletes of undesired children, adoption
//! (children are always created owned), finalizers, rolling updates, customize hooks. The three-way
//! merge handles maps only (the workload's children have no lists).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use kube::api::{Api, DynamicObject, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt as _};
use serde_json::{Value, json};
use tokio::sync::Notify;

const LAST_APPLIED: &str = "metacontroller.k8s.io/last-applied-configuration";
/// Metacontroller's default `--workers`.
const WORKERS: usize = 5;

/// What the process is told on its command line: `--mc-mix <namespace label value> <hook port> <resync s>`.
pub struct Args {
    pub selector: String,
    pub hook_port: u16,
    pub resync_s: u64,
}

impl Args {
    pub fn from(args: &[String]) -> Option<Self> {
        let at = args.iter().position(|a| a == "--mc-mix")?;
        Some(Self {
            selector: args.get(at + 1)?.clone(),
            hook_port: args.get(at + 2)?.parse().ok()?,
            resync_s: args.get(at + 3)?.parse().ok()?,
        })
    }

    pub fn to_vec(&self) -> Vec<String> {
        vec!["--mc-mix".into(), self.selector.clone(), self.hook_port.to_string(), self.resync_s.to_string()]
    }
}

/// client-go's work queue: a key is queued once however often it is added, and a key added while it
/// is being synced is synced again afterwards (never by two workers at once).
#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    ready: Notify,
}

#[derive(Default)]
struct QueueState {
    order: VecDeque<String>,
    dirty: HashSet<String>,
    processing: HashSet<String>,
}

impl Queue {
    fn add(&self, key: String) {
        let mut s = self.state.lock().unwrap();
        if !s.dirty.insert(key.clone()) || s.processing.contains(&key) {
            return;
        }
        s.order.push_back(key);
        drop(s);
        self.ready.notify_one();
    }

    async fn get(&self) -> String {
        loop {
            let notified = self.ready.notified();
            {
                let mut s = self.state.lock().unwrap();
                if let Some(key) = s.order.pop_front() {
                    s.dirty.remove(&key);
                    s.processing.insert(key.clone());
                    if !s.order.is_empty() {
                        self.ready.notify_one();
                    }
                    return key;
                }
            }
            notified.await;
        }
    }

    fn done(&self, key: &str) {
        let mut s = self.state.lock().unwrap();
        s.processing.remove(key);
        if s.dirty.contains(key) {
            s.order.push_back(key.to_owned());
            drop(s);
            self.ready.notify_one();
        }
    }
}

/// The informers' caches, by `namespace/name`; the children also by their controller owner's UID.
#[derive(Default)]
struct Caches {
    parents: Mutex<HashMap<String, Arc<DynamicObject>>>,
    children: Mutex<Children>,
}

/// The child informer's cache with Metacontroller's `ownerUID` index (the workload has no orphans, so
/// its orphan index would always be empty).
#[derive(Default)]
struct Children {
    objects: HashMap<String, Arc<DynamicObject>>,
    by_owner: HashMap<String, HashSet<String>>,
}

impl Children {
    fn insert(&mut self, key: String, obj: Arc<DynamicObject>) -> Option<Arc<DynamicObject>> {
        let old = self.remove(&key);
        if let Some(uid) = controller_uid(&obj) {
            self.by_owner.entry(uid).or_default().insert(key.clone());
        }
        self.objects.insert(key, obj);
        old
    }

    fn remove(&mut self, key: &str) -> Option<Arc<DynamicObject>> {
        let old = self.objects.remove(key)?;
        if let Some(uid) = controller_uid(&old)
            && let Some(keys) = self.by_owner.get_mut(&uid)
        {
            keys.remove(key);
            if keys.is_empty() {
                self.by_owner.remove(&uid);
            }
        }
        Some(old)
    }

    fn owned_by(&self, uid: &str) -> Vec<Arc<DynamicObject>> {
        let keys = self.by_owner.get(uid).into_iter().flatten();
        keys.filter_map(|key| self.objects.get(key)).cloned().collect()
    }
}

fn controller_uid(obj: &DynamicObject) -> Option<String> {
    obj.owner_references().iter().find(|r| r.controller == Some(true)).map(|r| r.uid.clone())
}

fn key_of(obj: &DynamicObject) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}

/// The `namespace/name` of the parent a child's controller ownerRef names, if it is one of ours.
fn owner_key(child: &DynamicObject) -> Option<String> {
    let owner = child.owner_references().iter().find(|r| r.controller == Some(true) && r.kind == "BenchThing")?;
    Some(format!("{}/{}", child.namespace().unwrap_or_default(), owner.name))
}

pub async fn run(args: Args) {
    let client = crate::support::client().await;
    let caches = Arc::new(Caches::default());
    let queue = Arc::new(Queue::default());
    let parents_api = Api::<DynamicObject>::all_with(client.clone(), &crate::bench_things());
    let cms_api = Api::<DynamicObject>::all_with(
        client.clone(),
        &kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
    );
    let revisions_api = Api::<DynamicObject>::all_with(
        client.clone(),
        &kube::core::ApiResource {
            group: "metacontroller.k8s.io".into(),
            version: "v1alpha1".into(),
            api_version: "metacontroller.k8s.io/v1alpha1".into(),
            kind: "ControllerRevision".into(),
            plural: "controllerrevisions".into(),
        },
    );
    // Parents: every event queues the parent (status changes included).
    let (c, q) = (Arc::clone(&caches), Arc::clone(&queue));
    tokio::spawn(async move {
        let mut events = watcher(parents_api, watcher::Config::default()).default_backoff().boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    let key = key_of(&o);
                    c.parents.lock().unwrap().insert(key.clone(), Arc::new(o));
                    q.add(key);
                }
                Ok(watcher::Event::Delete(o)) => {
                    let key = key_of(&o);
                    c.parents.lock().unwrap().remove(&key);
                    q.add(key);
                }
                _ => {}
            }
        }
    });
    // Children: a change of resourceVersion queues the owner.
    let (c, q) = (Arc::clone(&caches), Arc::clone(&queue));
    tokio::spawn(async move {
        let mut events = watcher(cms_api, watcher::Config::default()).default_backoff().boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    let key = key_of(&o);
                    let old = c.children.lock().unwrap().insert(key, Arc::new(o.clone()));
                    if old.is_some_and(|old| old.resource_version() == o.resource_version()) {
                        continue;
                    }
                    if let Some(parent) = owner_key(&o).filter(|p| c.parents.lock().unwrap().contains_key(p)) {
                        q.add(parent);
                    }
                }
                Ok(watcher::Event::Delete(o)) => {
                    c.children.lock().unwrap().remove(&key_of(&o));
                    if let Some(parent) = owner_key(&o).filter(|p| c.parents.lock().unwrap().contains_key(p)) {
                        q.add(parent);
                    }
                }
                _ => {}
            }
        }
    });
    // Metacontroller's ControllerRevisions: watched and cached, unused by this workload.
    tokio::spawn(async move { watcher(revisions_api, watcher::Config::default()).for_each(|_| async {}).await });
    // The parent informer's resync: every parent, every period.
    let (c, q) = (Arc::clone(&caches), Arc::clone(&queue));
    let period = Duration::from_secs(args.resync_s);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            tick.tick().await;
            let keys: Vec<String> = c.parents.lock().unwrap().keys().cloned().collect();
            for key in keys {
                q.add(key);
            }
        }
    });
    let http = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{}/sync", args.hook_port);
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (c, q, client, http, url, selector) = (
                Arc::clone(&caches),
                Arc::clone(&queue),
                client.clone(),
                http.clone(),
                url.clone(),
                args.selector.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let key = q.get().await;
                    if let Err(e) = sync(&client, &http, &url, &selector, &c, &key).await {
                        eprintln!("[mc-mix] {key}: {e}");
                        q.done(&key);
                        let q = Arc::clone(&q);
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            q.add(key);
                        });
                        continue;
                    }
                    q.done(&key);
                }
            })
        })
        .collect();
    println!("READY");
    futures::future::join_all(workers).await;
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// One sync of one parent, as `syncParentObject` makes its requests.
async fn sync(
    client: &Client,
    http: &reqwest::Client,
    url: &str,
    selector: &str,
    caches: &Caches,
    key: &str,
) -> Result<(), Error> {
    let Some(parent) = caches.parents.lock().unwrap().get(key).cloned() else { return Ok(()) };
    // The CompositeController's parent label selector (`doNotMatchLabels`).
    if parent.labels().get("bench").map(String::as_str) != Some(selector) {
        return Ok(());
    }
    let ns = parent.namespace().unwrap_or_default();
    let uid = parent.uid().unwrap_or_default();
    let owned = caches.children.lock().unwrap().owned_by(&uid);
    let observed: HashMap<String, Arc<DynamicObject>> = owned
        .into_iter()
        .filter(|c| c.namespace().as_deref() == Some(ns.as_str()))
        .map(|c| (c.name_any(), c))
        .collect();
    let children: serde_json::Map<String, Value> =
        observed.iter().map(|(name, c)| (name.clone(), serde_json::to_value(c.as_ref()).unwrap())).collect();
    let request = json!({
        "controller": {"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
                       "metadata": {"name": "mc-mix"}},
        "parent": parent.as_ref(), "children": {"ConfigMap.v1": children}, "related": {}, "finalizing": false,
    });
    let response: Value = http.post(url).json(&request).send().await?.error_for_status()?.json().await?;
    let cms: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
    );
    let owner = json!({"apiVersion": "bench.metahook.dev/v1", "kind": "BenchThing", "name": parent.name_any(),
                       "uid": uid, "controller": true, "blockOwnerDeletion": true});
    for desired in response["children"].as_array().into_iter().flatten() {
        let mut desired = desired.clone();
        let name = desired.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
        // generateSelector: the controller-uid label, added before the last-applied copy is taken.
        desired["metadata"]["namespace"] = json!(ns);
        desired["metadata"]["labels"]["controller-uid"] = json!(uid);
        match observed.get(&name) {
            None => {
                let mut body = desired.clone();
                body["metadata"]["annotations"][LAST_APPLIED] = json!(serde_json::to_string(&desired)?);
                body["metadata"]["ownerReferences"] = json!([owner]);
                let body: DynamicObject = serde_json::from_value(body)?;
                match cms.create(&PostParams::default(), &body).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Some(current) => {
                let current = serde_json::to_value(current.as_ref())?;
                let last: Value = current
                    .pointer(&format!("/metadata/annotations/{}", LAST_APPLIED.replace('/', "~1")))
                    .and_then(Value::as_str)
                    .and_then(|s| serde_json::from_str(s).ok())
                    .unwrap_or(Value::Null);
                let mut merged = current.clone();
                three_way(&mut merged, &last, &desired);
                merged["metadata"]["annotations"][LAST_APPLIED] = json!(serde_json::to_string(&desired)?);
                if merged == current {
                    continue;
                }
                let merged: DynamicObject = serde_json::from_value(merged)?;
                match cms.replace(&name, &PostParams::default(), &merged).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    // The status: a fresh GET every time, a PUT of the subresource when it differs.
    let mut status = response.get("status").cloned().unwrap_or_else(|| json!({}));
    status["observedGeneration"] = json!(parent.metadata.generation.unwrap_or(0));
    let parents: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &crate::bench_things());
    for attempt in 0..5 {
        let mut current = match parents.get(&parent.name_any()).await {
            Ok(current) => current,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if current.uid() != parent.uid() {
            return Ok(());
        }
        if current.data.get("status") == Some(&status) {
            return Ok(());
        }
        current.data["status"] = status.clone();
        match parents.replace_status(&parent.name_any(), &PostParams::default(), &current).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // retry.DefaultBackoff: 10 ms, x5, 4 steps; Metacontroller then drops the conflict.
                tokio::time::sleep(Duration::from_millis(10 * 5u64.pow(attempt))).await;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// `kubectl apply`'s merge for maps: what `desired` sets is set, what `last` set and `desired` no
/// longer does is removed, everything else of `current` is kept.
fn three_way(current: &mut Value, last: &Value, desired: &Value) {
    let (Some(cur), Some(want)) = (current.as_object_mut(), desired.as_object()) else {
        *current = desired.clone();
        return;
    };
    if let Some(last) = last.as_object() {
        for gone in last.keys().filter(|k| !want.contains_key(*k)) {
            cur.remove(gone);
        }
    }
    for (k, v) in want {
        match cur.get_mut(k) {
            Some(existing) if existing.is_object() && v.is_object() => {
                three_way(existing, last.get(k).unwrap_or(&Value::Null), v);
            }
            _ => {
                cur.insert(k.clone(), v.clone());
            }
        }
    }
}
