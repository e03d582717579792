//! The bucket labels a sharded hub puts on the children it writes, put on the candidate's desired
//! children before they are judged: a sharded hub stamps every desired child with its parent's bucket
//! ([`Shard::stamp`](crate::cache::shard::Shard::stamp)) before it plans, and its applier judges a
//! child current by the hash of that stamped object. Unstamped, every child of a sharded hub would
//! look out of date. diff has no ring of its own: the rings are those the parent's children carry.

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::Value;

use crate::cache::shard::{PARENT_SHARD_LABEL_PREFIX, bucket, parent_shard_label};
use crate::write::children::ChildMap;

/// Stamps every child of `desired` as a sharded hub would for the parent `parent_uid`, for each ring
/// whose parent-bucket label a child in `observed` carries (none: the hub is not sharded).
pub(super) fn stamp_as_live(
    desired: &mut [ChildMap<Value>],
    observed: &[ChildMap<Arc<DynamicObject>>],
    parent_uid: &str,
) {
    let rings: BTreeSet<&str> = observed
        .iter()
        .flat_map(|children| children.values())
        .flat_map(|child| child.metadata.labels.iter().flatten())
        .filter_map(|(key, _)| key.strip_prefix(PARENT_SHARD_LABEL_PREFIX))
        .collect();
    if rings.is_empty() {
        return;
    }
    let value = Value::String(bucket(parent_uid).to_string());
    for child in desired.iter_mut().flat_map(|children| children.values_mut()) {
        let Some(metadata) = child.get_mut("metadata").and_then(Value::as_object_mut) else { continue };
        let labels = metadata.entry("labels").or_insert_with(|| Value::Object(serde_json::Map::new()));
        if !labels.is_object() {
            *labels = Value::Object(serde_json::Map::new());
        }
        if let Some(labels) = labels.as_object_mut() {
            for ring in &rings {
                labels.insert(parent_shard_label(ring), value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cache::informers::ObjectKey;

    fn child(labels: &Value) -> Arc<DynamicObject> {
        Arc::new(
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c", "namespace": "n", "labels": labels.clone()}}))
            .unwrap(),
        )
    }

    fn desired() -> Vec<ChildMap<Value>> {
        let key = ObjectKey { namespace: Some("n".into()), name: "c".into() };
        vec![ChildMap::from([(key, json!({"metadata": {"name": "c"}}))])]
    }

    #[test]
    fn desired_children_get_the_parent_bucket_of_each_ring_the_live_children_carry() {
        let label = parent_shard_label("main");
        let observed = vec![ChildMap::from([(ObjectKey::of(&child(&json!({}))), child(&json!({label.clone(): "7"})))])];
        let mut want = desired();
        stamp_as_live(&mut want, &observed, "uid-1");
        let stamped = want[0].values().next().unwrap();
        assert_eq!(stamped["metadata"]["labels"][&label], json!(bucket("uid-1").to_string()));
    }

    #[test]
    fn without_sharded_children_nothing_is_stamped() {
        let observed = vec![ChildMap::from([(ObjectKey::of(&child(&json!({}))), child(&json!({"app": "x"})))])];
        let mut want = desired();
        stamp_as_live(&mut want, &observed, "uid-1");
        assert_eq!(want, desired());
    }
}
