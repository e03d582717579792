//! The rollout rule, pure and tested beside the code: which revision claims each child, and the one
//! child per sync that moves to the latest revision once the children already there are up to date and
//! pass their status checks (and the `Updated` condition that says where the rollout stands).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::{Value, json};

use crate::api::{ChildResourceRule, StatusConditionCheck, UpdateMethod};
use crate::cache::discovery::ResolvedResource;
use crate::cache::informers::ObjectKey;
use crate::write::children::ChildMap;

/// Children one revision claims, by child type (index into the controller's child types).
pub type Claims = BTreeMap<(usize, ObjectKey), usize>;

/// Why the rollout is where it is: the `Updated` condition injected into the parent's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rollout {
    /// Every rolling child is on the latest revision.
    OnLatest { revision: String },
    /// This child is being moved to the latest revision now.
    Progressing { kind: String, name: String },
    /// A child on the latest revision is not ready yet; nothing moves.
    Waiting { reason: String },
}

impl Rollout {
    /// The condition, in Metacontroller's shape.
    #[must_use]
    pub fn condition(&self) -> Value {
        let (status, reason, message) = match self {
            Self::OnLatest { revision } => {
                ("True", "OnLatestRevision", format!("latest ControllerRevision: {revision}"))
            }
            Self::Progressing { kind, name } => ("False", "RolloutProgressing", format!("updating {kind} {name}")),
            Self::Waiting { reason } => ("False", "RolloutWaiting", reason.clone()),
        };
        json!({"type": "Updated", "status": status, "reason": reason, "message": message})
    }
}

/// What one child type needs for the rollout decision.
pub struct TypeInfo<'a> {
    pub kind: &'a str,
    pub method: UpdateMethod,
    pub checks: &'a [StatusConditionCheck],
}

/// Decides which revision each child belongs to after this sync, moving at most one child.
///
/// `claims` are the stored claims (revision 0 = latest); `desired_types` the children the latest
/// revision wants; `order` the latest response's child order; `up_to_date(child)` whether the observed
/// child already matches the latest desired state.
pub fn roll(
    mut claims: Claims,
    types: &[TypeInfo<'_>],
    desired_types: &BTreeSet<(usize, ObjectKey)>,
    order: &[(usize, ObjectKey)],
    observed: &BTreeMap<(usize, ObjectKey), Arc<DynamicObject>>,
    up_to_date: impl Fn(&(usize, ObjectKey)) -> bool,
) -> (Claims, Rollout) {
    // Children the latest revision no longer wants lose their claims (they will be deleted).
    claims.retain(|child, _| desired_types.contains(child));
    for child in desired_types {
        claims.entry(child.clone()).or_insert(0);
    }
    // Non-rolling types always follow the latest revision; so does a child already matching it.
    for (child, revision) in &mut claims {
        if *revision != 0 && (!types[child.0].method.is_rolling() || up_to_date(child)) {
            *revision = 0;
        }
    }
    let pending: Vec<&(usize, ObjectKey)> =
        order.iter().filter(|c| claims.get(*c).is_some_and(|r| *r != 0) && types[c.0].method.is_rolling()).collect();
    let Some(next) = pending.first() else {
        return (claims, Rollout::OnLatest { revision: String::new() });
    };
    // Every rolling child already on the latest revision must be there and healthy first.
    for child in order.iter().filter(|c| claims.get(*c) == Some(&0) && types[c.0].method.is_rolling()) {
        let info = &types[child.0];
        let Some(obj) = observed.get(child) else {
            return (
                claims,
                Rollout::Waiting { reason: format!("waiting for {} {} to be created", info.kind, child.1.name) },
            );
        };
        if !up_to_date(child) {
            return (
                claims,
                Rollout::Waiting { reason: format!("waiting for {} {} to be updated", info.kind, child.1.name) },
            );
        }
        if let Some(reason) = not_ready(obj, info) {
            return (claims, Rollout::Waiting { reason: format!("{} {} {reason}", info.kind, child.1.name) });
        }
    }
    let next = (*next).clone();
    claims.insert(next.clone(), 0);
    (claims, Rollout::Progressing { kind: types[next.0].kind.to_owned(), name: next.1.name })
}

/// Why an updated child may not count as done yet, if it may not.
pub(crate) fn not_ready(obj: &DynamicObject, info: &TypeInfo<'_>) -> Option<String> {
    let status = obj.data.get("status");
    if info.method == UpdateMethod::RollingInPlace {
        // Only a child that reports an observedGeneration (> 0) is held to it: 0 is what a controller
        // that does not track generations leaves (Go's zero value), as absent is. Metacontroller's
        // rolling_update.go: `if observedGeneration, _, err := GetObservedGeneration(...);
        // observedGeneration > 0 { ... if observedGeneration < child.GetGeneration() ...`.
        let observed = status.and_then(|s| s.get("observedGeneration")).and_then(Value::as_i64);
        if let (Some(seen), Some(generation)) = (observed, obj.metadata.generation)
            && seen > 0
            && seen < generation
        {
            return Some(format!("has observedGeneration {seen} < generation {generation}"));
        }
    }
    let conditions = status.and_then(|s| s.get("conditions")).and_then(Value::as_array);
    for check in info.checks {
        let found =
            conditions.into_iter().flatten().find(|c| c.get("type").and_then(Value::as_str) == Some(&check.type_));
        let Some(found) = found else { return Some(format!("has no {} condition", check.type_)) };
        let field = |k: &str| found.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
        if let Some(want) = &check.status
            && field("status") != *want
        {
            return Some(format!("has condition {}={} (want {want})", check.type_, field("status")));
        }
        if let Some(want) = &check.reason
            && field("reason") != *want
        {
            return Some(format!("has condition {} reason {} (want {want})", check.type_, field("reason")));
        }
    }
    None
}

/// Whether applying `desired` to `observed` would change nothing: every field the desired object sets
/// has that value already (ownership and status aside). A list of objects keyed by one of
/// [`LIST_MAP_KEYS`] is compared item by item by key, so items others added (the API server's
/// service-account token volume and its mount in every Pod) are no difference; other lists must match
/// whole.
#[must_use]
pub fn is_subset(desired: &Value, observed: &Value) -> bool {
    match (desired, observed) {
        (Value::Object(d), Value::Object(o)) => {
            d.iter().all(|(k, v)| o.get(k).map_or_else(|| is_zero(v), |ov| is_subset(v, ov)))
        }
        (Value::Array(d), Value::Array(o)) => match list_map_key(d, o) {
            Some(key) => d.iter().all(|item| o.iter().any(|have| have[key] == item[key] && is_subset(item, have))),
            None => d.len() == o.len() && d.iter().zip(o).all(|(a, b)| is_subset(a, b)),
        },
        (d, o) => d == o,
    }
}

/// Keys that make a list of objects a map, in the order Metacontroller's `dynamic-apply` tries them
/// when it merges lists (`containers` and `volumes` by `name`, `volumeMounts` by `mountPath`, ...).
pub const LIST_MAP_KEYS: [&str; 7] = ["containerPort", "port", "mountPath", "name", "uid", "ip", "path"];

/// The first of [`LIST_MAP_KEYS`] that every item of both lists has, if all items are objects.
pub(crate) fn list_map_key(desired: &[Value], observed: &[Value]) -> Option<&'static str> {
    let items = || desired.iter().chain(observed);
    if desired.is_empty() || !items().all(Value::is_object) {
        return None;
    }
    LIST_MAP_KEYS.into_iter().find(|key| items().all(|item| item.get(key).is_some()))
}

/// Values the API server drops when stored (`omitempty`), so their absence is no difference.
pub(crate) fn is_zero(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// The desired object without what the hub adds (ownership), for [`is_subset`] against an observed one.
#[must_use]
pub fn comparable(desired: &Value) -> Value {
    let mut desired = desired.clone();
    if let Some(meta) = desired.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("ownerReferences");
    }
    desired
}

/// Puts the `Updated` condition into a status object (replacing an older one).
pub fn set_condition(status: &mut Value, condition: Value) {
    let Some(map) = status.as_object_mut() else { return };
    let conditions = map.entry("conditions").or_insert_with(|| json!([]));
    if let Some(list) = conditions.as_array_mut() {
        list.retain(|c| c.get("type") != condition.get("type"));
        list.push(condition);
    } else {
        *conditions = json!([condition]);
    }
}

/// What the rollout rule needs to know of each child type.
pub(crate) fn type_infos<'a>(rules: &'a [ChildResourceRule], types: &'a [Arc<ResolvedResource>]) -> Vec<TypeInfo<'a>> {
    rules
        .iter()
        .zip(types)
        .map(|(rule, resource)| TypeInfo {
            kind: resource.kind(),
            method: rule.method(),
            checks: rule.update_strategy.as_ref().and_then(|s| s.status_checks.as_ref()).map_or(&[], |c| &c.conditions),
        })
        .collect()
}

/// The children to apply: what the latest revision wants, each in the state of the revision claiming it.
pub(crate) fn claimed_desired(desired_by_revision: &[Vec<ChildMap<Value>>], claims: &Claims) -> Vec<ChildMap<Value>> {
    desired_by_revision[0]
        .iter()
        .enumerate()
        .map(|(t, children)| {
            children
                .iter()
                .map(|(key, latest)| {
                    let revision = claims.get(&(t, key.clone())).copied().unwrap_or(0);
                    let chosen = desired_by_revision[revision][t].get(key).unwrap_or(latest);
                    (key.clone(), chosen.clone())
                })
                .collect()
        })
        .collect()
}

/// The latest response's children as (type, key), in the order the hook listed them.
pub(crate) fn response_order(
    children: &[Value],
    types: &[Arc<ResolvedResource>],
    namespace: &str,
) -> Vec<(usize, ObjectKey)> {
    children
        .iter()
        .filter_map(|c| {
            let text = |p: &str| c.pointer(p).and_then(Value::as_str).unwrap_or_default();
            let t = types.iter().position(|r| r.api_version() == text("/apiVersion") && r.kind() == text("/kind"))?;
            let name = text("/metadata/name").to_owned();
            Some((t, ObjectKey { namespace: Some(namespace.to_owned()), name }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    fn key(name: &str) -> (usize, ObjectKey) {
        (0, ObjectKey { namespace: Some("ns".into()), name: name.into() })
    }

    fn pod(name: &str, ready: bool) -> Arc<DynamicObject> {
        Arc::new(
            serde_json::from_value(
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
                "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}}),
            )
            .unwrap(),
        )
    }

    fn ready_check() -> Vec<StatusConditionCheck> {
        vec![StatusConditionCheck { type_: "Ready".into(), status: Some("True".into()), reason: None }]
    }

    fn rolling_types(checks: &[StatusConditionCheck]) -> Vec<TypeInfo<'_>> {
        vec![TypeInfo { kind: "Pod", method: UpdateMethod::RollingRecreate, checks }]
    }

    #[test]
    fn moves_one_child_at_a_time_in_response_order_when_latest_children_are_ready() {
        let checks = ready_check();
        let types = rolling_types(&checks);
        let order = vec![key("a"), key("b"), key("c")];
        let desired: BTreeSet<_> = order.iter().cloned().collect();
        let claims: Claims = order.iter().map(|k| (k.clone(), 1)).collect();
        let observed: BTreeMap<_, _> = order.iter().map(|k| (k.clone(), pod(&k.1.name, true))).collect();
        let (claims, rollout) = roll(claims, &types, &desired, &order, &observed, |_| false);
        assert_eq!(rollout, Rollout::Progressing { kind: "Pod".into(), name: "a".into() });
        assert_eq!(claims[&key("a")], 0);
        assert_eq!((claims[&key("b")], claims[&key("c")]), (1, 1));
    }

    #[test]
    fn waits_while_an_updated_child_is_missing_stale_or_not_ready() {
        let checks = ready_check();
        let types = rolling_types(&checks);
        let order = vec![key("a"), key("b")];
        let desired: BTreeSet<_> = order.iter().cloned().collect();
        let claims: Claims = [(key("a"), 0), (key("b"), 1)].into_iter().collect();
        let mut observed = BTreeMap::new();
        let (_, rollout) = roll(claims.clone(), &types, &desired, &order, &observed, |_| false);
        assert_eq!(rollout, Rollout::Waiting { reason: "waiting for Pod a to be created".into() });
        observed.insert(key("a"), pod("a", false));
        observed.insert(key("b"), pod("b", true));
        let up_to_date = |c: &(usize, ObjectKey)| c.1.name == "a";
        let (after, rollout) = roll(claims, &types, &desired, &order, &observed, up_to_date);
        assert_eq!(rollout, Rollout::Waiting { reason: "Pod a has condition Ready=False (want True)".into() });
        assert_eq!(after[&key("b")], 1, "nothing moves while waiting");
    }

    #[test]
    fn new_children_join_latest_and_unwanted_ones_lose_their_claims() {
        let checks = ready_check();
        let types = rolling_types(&checks);
        let order = vec![key("a"), key("new")];
        let desired: BTreeSet<_> = order.iter().cloned().collect();
        let claims: Claims = [(key("a"), 1), (key("gone"), 1)].into_iter().collect();
        let observed: BTreeMap<_, _> = [(key("a"), pod("a", true))].into_iter().collect();
        let (claims, _) = roll(claims, &types, &desired, &order, &observed, |c| c.1.name == "a");
        assert_eq!(claims.get(&key("new")), Some(&0));
        assert_eq!(claims.get(&key("a")), Some(&0), "already matching the latest state: moves at once");
        assert!(!claims.contains_key(&key("gone")));
    }

    #[test]
    fn rolling_in_place_holds_a_child_to_its_observed_generation_only_when_it_reports_one() {
        let child = |generation: i64, observed: Value| -> DynamicObject {
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Thing",
                "metadata": {"name": "c", "namespace": "ns", "generation": generation},
                "status": {"observedGeneration": observed}}))
            .unwrap()
        };
        let info = |method| TypeInfo { kind: "Thing", method, checks: &[] };
        let in_place = info(UpdateMethod::RollingInPlace);
        assert_eq!(
            not_ready(&child(3, json!(2)), &in_place).as_deref(),
            Some("has observedGeneration 2 < generation 3")
        );
        assert_eq!(not_ready(&child(3, json!(3)), &in_place), None);
        assert_eq!(not_ready(&child(3, json!(0)), &in_place), None, "0: the child does not report one");
        assert_eq!(not_ready(&child(3, Value::Null), &in_place), None, "absent: likewise");
        assert_eq!(not_ready(&child(3, json!(2)), &info(UpdateMethod::RollingRecreate)), None, "only RollingInPlace");
    }

    #[test]
    fn subset_means_applying_would_change_nothing() {
        let observed = json!({"spec": {"containers": [{"name": "c", "image": "v1", "imagePullPolicy": "Always"}]}});
        assert!(is_subset(&json!({"spec": {"containers": [{"name": "c", "image": "v1"}]}}), &observed));
        assert!(!is_subset(&json!({"spec": {"containers": [{"name": "c", "image": "v2"}]}}), &observed));
        let pod = json!({"metadata": {"name": "p"}, "spec": {"hostNetwork": true}});
        assert!(is_subset(&json!({"metadata": {"name": "p", "annotations": {}}, "spec": {"hostNetwork": true}}), &pod));
        assert!(
            !is_subset(&json!({"metadata": {"annotations": {"a": "b"}}}), &pod),
            "a missing non-empty field differs"
        );
    }

    #[test]
    fn items_others_added_to_a_keyed_list_are_no_difference() {
        // What the API server stores for a Pod that mounts a claim: ServiceAccount admission added a volume
        // and a volumeMount. Before, a rolling child with `volumes` never counted as updated.
        let observed = json!({"spec": {
            "containers": [{"name": "c", "image": "v1", "volumeMounts": [
                {"name": "www", "mountPath": "/www"},
                {"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
            "volumes": [
                {"name": "www", "persistentVolumeClaim": {"claimName": "www-0"}},
                {"name": "kube-api-access-x", "projected": {"sources": []}}]}});
        let desired = |claim: &str, image: &str| {
            json!({"spec": {
                "containers": [{"name": "c", "image": image, "volumeMounts": [{"name": "www", "mountPath": "/www"}]}],
                "volumes": [{"name": "www", "persistentVolumeClaim": {"claimName": claim}}]}})
        };
        assert!(is_subset(&desired("www-0", "v1"), &observed));
        assert!(!is_subset(&desired("www-1", "v1"), &observed), "a keyed item's own fields still count");
        assert!(!is_subset(&desired("www-0", "v2"), &observed));
        let other = json!({"spec": {"volumes": [{"name": "cache", "emptyDir": {}}]}});
        assert!(!is_subset(&other, &observed), "a desired item missing from the observed list differs");
        // Lists without a key still compare whole.
        assert!(!is_subset(&json!({"args": ["a"]}), &json!({"args": ["a", "b"]})));
        assert!(!is_subset(&json!({"l": [{"x": 1}]}), &json!({"l": [{"x": 1}, {"x": 2}]})));
    }

    #[test]
    fn updated_condition_replaces_an_older_one() {
        let mut status = json!({"conditions": [{"type": "Updated", "status": "False"}, {"type": "Other"}]});
        set_condition(&mut status, Rollout::OnLatest { revision: "r".into() }.condition());
        let conditions = status["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 2);
        assert_eq!(conditions[1]["reason"], "OnLatestRevision");
    }
}
