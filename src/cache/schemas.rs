//! What each type's schema declares, as the API server publishes it: the `OpenAPI` v3 document of each
//! group-version (`/openapi/v3/api/v1`, `/openapi/v3/apis/<group>/<version>`), which holds built-in
//! types and custom resources' structural schemas alike, each type found by its
//! `x-kubernetes-group-version-kind`.
//!
//! This is how the hub knows which fields of a child its type declares (see
//! [`crate::write::unknown_fields`]): from the schema itself, never from the words of a refusal, which
//! repeat field names that whoever wrote the object chose.
//!
//! A document is read the first time one of its types is asked for and kept. The index of documents
//! (`/openapi/v3`) names each with a hash of its content, so it says when a document changed — a CRD
//! that started (or stopped) declaring a field: it is read again at most once per interval (the hub's
//! `discoveryInterval`), or sooner when a write is refused ([`Schemas::refreshed`]), and a changed
//! document is read again. A document that cannot be read is not asked for again before the interval is
//! over either; meanwhile nothing is known of its types, and nothing is dropped from them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Client;
use serde_json::Value;

/// How soon after the last reading of the index a refused write may have it read again.
const REFRESH_AFTER: Duration = Duration::from_secs(1);

/// Why a schema could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("reading the OpenAPI document {url}: {source}")]
    Fetch { url: String, source: kube::Error },
    #[error("the OpenAPI document {url} is not what the API server publishes: {source}")]
    Parse { url: String, source: serde_json::Error },
}

/// The `OpenAPI` v3 documents of the group-versions of the types asked for, read lazily and kept.
#[derive(Clone)]
pub struct Schemas {
    client: Client,
    ttl: Duration,
    state: Arc<Mutex<State>>,
    /// One reading of the API server at a time: the documents are large, and many writes of one type
    /// that start together want the same one.
    reading: Arc<tokio::sync::Mutex<()>>,
}

#[derive(Default)]
struct State {
    index: Option<Index>,
    /// By group-version path (`api/v1`, `apis/apps/v1`).
    documents: HashMap<String, Arc<Document>>,
}

/// A document the index names as current.
enum Held {
    Current(Arc<Document>),
    /// The index names no document for the group-version.
    Unpublished,
}

impl Held {
    fn document(self) -> Option<Arc<Document>> {
        match self {
            Held::Current(document) => Some(document),
            Held::Unpublished => None,
        }
    }
}

/// The index of documents: the URL of each group-version's, with its content hash in it.
struct Index {
    urls: HashMap<String, String>,
    read: Instant,
}

/// `/openapi/v3`, as the API server publishes it.
#[derive(serde::Deserialize)]
struct IndexWire {
    #[serde(default)]
    paths: HashMap<String, PathWire>,
}

#[derive(serde::Deserialize)]
struct PathWire {
    #[serde(rename = "serverRelativeURL")]
    server_relative_url: String,
}

/// One group-version's document, as the API server publishes it (the part read here).
#[derive(serde::Deserialize)]
struct DocumentWire {
    #[serde(default)]
    components: ComponentsWire,
}

#[derive(serde::Deserialize, Default)]
struct ComponentsWire {
    #[serde(default)]
    schemas: serde_json::Map<String, Value>,
}

/// One group-version's schemas.
#[derive(Debug)]
pub struct Document {
    /// Where it was read (its content hash in it): what changes when a schema in it changes.
    url: String,
    schemas: serde_json::Map<String, Value>,
    /// The schema of each (group, version, kind), by name; a kind that several schemas claim is left
    /// out (nothing is known of it).
    kinds: HashMap<(String, String, String), String>,
}

impl Document {
    fn new(url: String, schemas: serde_json::Map<String, Value>) -> Self {
        let mut kinds: HashMap<(String, String, String), Option<String>> = HashMap::new();
        for (name, schema) in &schemas {
            let claimed = schema.get("x-kubernetes-group-version-kind").and_then(Value::as_array);
            for gvk in claimed.into_iter().flatten() {
                let part = |field: &str| gvk.get(field).and_then(Value::as_str).unwrap_or_default().to_owned();
                let key = (part("group"), part("version"), part("kind"));
                kinds.entry(key).and_modify(|held| *held = None).or_insert_with(|| Some(name.clone()));
            }
        }
        let kinds = kinds.into_iter().filter_map(|(key, name)| Some((key, name?))).collect();
        Self { url, schemas, kinds }
    }
}

/// One type's schema, in the document of its group-version.
#[derive(Debug, Clone)]
pub struct TypeSchema {
    document: Arc<Document>,
    name: String,
}

impl TypeSchema {
    /// The schema of `kind` in `document` (a group-version's, as published), for tests and tools that
    /// hold a document of their own; `None` when no schema (or more than one) is of that kind.
    #[must_use]
    pub fn from_document(document: &Value, api_version: &str, kind: &str) -> Option<Self> {
        let wire: DocumentWire = serde_json::from_value(document.clone()).ok()?;
        let document = Arc::new(Document::new(String::new(), wire.components.schemas));
        Self::of(&document, api_version, kind)
    }

    fn of(document: &Arc<Document>, api_version: &str, kind: &str) -> Option<Self> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let name = document.kinds.get(&(group.to_owned(), version.to_owned(), kind.to_owned()))?;
        Some(Self { document: Arc::clone(document), name: name.clone() })
    }

    /// The type's own schema.
    #[must_use]
    pub fn root(&self) -> &Value {
        &self.document.schemas[&self.name]
    }

    /// The schema a `$ref` names (`#/components/schemas/<name>`), if it is in the document.
    #[must_use]
    pub fn resolve(&self, reference: &str) -> Option<&Value> {
        self.document.schemas.get(reference.strip_prefix("#/components/schemas/")?)
    }

    /// Which reading of the document this is: another value once the API server's changed.
    #[must_use]
    pub fn version(&self) -> &str {
        &self.document.url
    }
}

/// The path of a group-version's document in the index: `api/v1`, `apis/<group>/<version>`.
fn document_path(api_version: &str) -> String {
    if api_version.contains('/') { format!("apis/{api_version}") } else { format!("api/{api_version}") }
}

impl Schemas {
    /// Schemas read on `client`, whose index is read again every `ttl` at most.
    #[must_use]
    pub fn new(client: Client, ttl: Duration) -> Self {
        Self { client, ttl, state: Arc::default(), reading: Arc::default() }
    }

    /// The schema of `kind` in `api_version` as last read, without asking the API server; `None` when
    /// its document was never read, or has no schema of that kind.
    #[must_use]
    pub fn cached(&self, api_version: &str, kind: &str) -> Option<TypeSchema> {
        let state = self.state.lock().expect("schemas lock");
        TypeSchema::of(state.documents.get(&document_path(api_version))?, api_version, kind)
    }

    /// The schema of `kind` in `api_version`, reading its document if it was never read or the index
    /// (read again once its interval is over) says it changed. `Ok(None)`: the API server publishes no
    /// schema of that type.
    pub async fn schema(&self, api_version: &str, kind: &str) -> Result<Option<TypeSchema>, SchemaError> {
        let document = self.document(&document_path(api_version)).await?;
        Ok(document.and_then(|document| TypeSchema::of(&document, api_version, kind)))
    }

    /// Asked when a write of a `kind` object was refused: the index is read again (unless it was
    /// read within the last second), and the type's schema returned if its document changed since it
    /// was last read — the refusal may be for a field the schema held here declares and the API
    /// server's no longer does. The refusal itself is not read.
    pub async fn refreshed(&self, api_version: &str, kind: &str) -> Option<TypeSchema> {
        let path = document_path(api_version);
        let before = {
            let mut state = self.state.lock().expect("schemas lock");
            if state.index.as_ref().is_some_and(|index| index.read.elapsed() >= REFRESH_AFTER) {
                state.index = None;
            }
            state.documents.get(&path).map(|document| document.url.clone())
        };
        match self.document(&path).await {
            Ok(Some(document)) if Some(&document.url) != before.as_ref() => {
                TypeSchema::of(&document, api_version, kind)
            }
            Ok(_) => None,
            Err(error) => {
                tracing::warn!(api_version, kind, "reading the schema again after a refusal: {error}");
                None
            }
        }
    }

    /// The document at `path`, current as the index (read at most once per interval) says.
    async fn document(&self, path: &str) -> Result<Option<Arc<Document>>, SchemaError> {
        if let Some(held) = self.current(path) {
            return Ok(held.document());
        }
        let _reading = self.reading.lock().await;
        // Another task may have read it while this one waited.
        if let Some(held) = self.current(path) {
            return Ok(held.document());
        }
        let fresh =
            self.state.lock().expect("schemas lock").index.as_ref().is_some_and(|i| i.read.elapsed() < self.ttl);
        if !fresh {
            let read = self.read_index().await;
            let urls = read.as_ref().map(Clone::clone).unwrap_or_default();
            // A failed reading, too, is not repeated before the interval is over.
            self.state.lock().expect("schemas lock").index = Some(Index { urls, read: Instant::now() });
            read?;
            if let Some(held) = self.current(path) {
                return Ok(held.document());
            }
        }
        let Some(url) = self.url_of(path) else { return Ok(None) };
        // Read at its plain address: the one with the hash is answered with a redirect, and no
        // document, once the document has changed again since the index was read (any CRD of the
        // group). What is read is then newer than `url` says, and read again at the next look.
        let wire: DocumentWire = match self.get(&format!("/openapi/v3/{path}")).await {
            Ok(wire) => wire,
            Err(error) => {
                // Not asked for again before the index is read again.
                if let Some(index) = self.state.lock().expect("schemas lock").index.as_mut() {
                    index.urls.remove(path);
                }
                return Err(error);
            }
        };
        let document = Arc::new(Document::new(url, wire.components.schemas));
        self.state.lock().expect("schemas lock").documents.insert(path.to_owned(), Arc::clone(&document));
        Ok(Some(document))
    }

    /// What the index, if within its interval, says of the document at `path`: the one held, or none
    /// at all; `None` when the index or the document must be read first.
    fn current(&self, path: &str) -> Option<Held> {
        let state = self.state.lock().expect("schemas lock");
        let index = state.index.as_ref().filter(|index| index.read.elapsed() < self.ttl)?;
        let Some(url) = index.urls.get(path) else { return Some(Held::Unpublished) };
        state.documents.get(path).filter(|held| &held.url == url).map(|held| Held::Current(Arc::clone(held)))
    }

    fn url_of(&self, path: &str) -> Option<String> {
        self.state.lock().expect("schemas lock").index.as_ref()?.urls.get(path).cloned()
    }

    async fn read_index(&self) -> Result<HashMap<String, String>, SchemaError> {
        let index: IndexWire = self.get("/openapi/v3").await?;
        Ok(index.paths.into_iter().map(|(path, at)| (path, at.server_relative_url)).collect())
    }

    async fn get<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, SchemaError> {
        let fetch = |source| SchemaError::Fetch { url: url.to_owned(), source };
        let request = http::Request::get(url).body(Vec::new()).map_err(|e| fetch(kube::Error::HttpError(e)))?;
        let text = self.client.request_text(request).await.map_err(fetch)?;
        serde_json::from_str(&text).map_err(|source| SchemaError::Parse { url: url.to_owned(), source })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_type_is_found_by_its_group_version_and_kind() {
        let document = json!({"components": {"schemas": {
            "io.k8s.api.apps.v1.StatefulSet": {"type": "object",
                "x-kubernetes-group-version-kind": [{"group": "apps", "version": "v1", "kind": "StatefulSet"}]},
            "io.k8s.api.core.v1.ConfigMap": {"type": "object",
                "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "ConfigMap"}]},
            "a.Twice": {"x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "Twice"}]},
            "b.Twice": {"x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "Twice"}]},
        }}});
        let set = TypeSchema::from_document(&document, "apps/v1", "StatefulSet").unwrap();
        assert_eq!(set.root()["x-kubernetes-group-version-kind"][0]["kind"], "StatefulSet");
        assert!(TypeSchema::from_document(&document, "v1", "ConfigMap").is_some());
        assert!(TypeSchema::from_document(&document, "apps/v2", "StatefulSet").is_none());
        assert!(TypeSchema::from_document(&document, "v1", "Twice").is_none(), "claimed twice: unknown");
        assert_eq!(
            set.resolve("#/components/schemas/io.k8s.api.core.v1.ConfigMap").map(|s| &s["type"]),
            Some(&json!("object"))
        );
        assert!(set.resolve("#/definitions/io.k8s.api.core.v1.ConfigMap").is_none());
        assert_eq!(document_path("v1"), "api/v1");
        assert_eq!(document_path("apps/v1"), "apis/apps/v1");
    }
}
