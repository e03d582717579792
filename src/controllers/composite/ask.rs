//! How a CompositeController asks its hook — the one way the engine, `metahook render` and `metahook
//! migrate --dry-run` all build the request, call the hook and judge its answer, so a hook tested
//! offline or previewed is judged exactly as the hub judges it — and which objects are a parent's
//! children (its selector).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::DynamicObject;
use serde_json::{Value, json};

use crate::api::CompositeController;
use crate::cache::discovery::ResolvedResource;
use crate::cache::selector::Selector;
use crate::engine::error::{ParentSelectorError, SyncError};
use crate::engine::sync::{Decision, Observed};
use crate::engine::worker::resync_after;
use crate::hooks::{CompositeRequest, CompositeResponse, Endpoint};
use crate::write::children::{ChildMap, ChildRole, ChildRules, desired_children};

/// The label `generateSelector` gives a parent's children: the parent's UID.
pub const CONTROLLER_UID_LABEL: &str = "controller-uid";

/// How a CompositeController asks its hook (see the module doc).
pub struct Ask<'a> {
    pub cc: &'a CompositeController,
    /// The controller object as hooks receive it (`request.controller`).
    pub controller: &'a Value,
    pub parent_resource: &'a ResolvedResource,
    pub child_resources: &'a [Arc<ResolvedResource>],
}

/// A composite hook's answer, validated whole.
pub struct Answer {
    /// Desired children by declared type.
    pub desired: Vec<ChildMap<Value>>,
    /// The status to write (with `observedGeneration`).
    pub status: Value,
    pub response: CompositeResponse,
}

impl Answer {
    pub(crate) fn into_decision<B>(self) -> Decision<B> {
        let Self { desired, status, response } = self;
        let resync = resync_after(response.resync_after_seconds);
        Decision::whole(desired, Some(status), None, resync, response.finalized, response.events)
    }
}

impl Ask<'_> {
    /// Asks `endpoint` about `parent` (`parent_json`: as the hook receives it; a revision's parent in a
    /// rollout) and validates the answer whole against `selector`, the parent's child selector.
    pub async fn ask(
        &self,
        endpoint: &Endpoint,
        parent: &DynamicObject,
        parent_json: &Value,
        observed: impl Into<Observed<'_>>,
        selector: &Selector,
    ) -> Result<Answer, SyncError> {
        let observed = observed.into();
        let request = CompositeRequest {
            controller: self.controller,
            parent: parent_json,
            children: observed.children,
            related: observed.related,
            finalizing: observed.finalizing,
        };
        let response = endpoint.composite(&request).await?;
        let (desired, status) =
            validate_response(self.cc, parent, self.parent_resource, self.child_resources, &response, selector)?;
        Ok(Answer { desired, status, response })
    }
}

/// Selector that decides which objects are `parent`'s children: `controller-uid=<uid>` with
/// `generateSelector`, else the parent's `spec.selector`.
pub fn child_selector(cc: &CompositeController, parent: &DynamicObject) -> Result<Selector, SyncError> {
    if cc.spec.generate_selector == Some(true) {
        let uid = parent.metadata.uid.clone().unwrap_or_default();
        return Ok(Selector::from_labels(&BTreeMap::from([(CONTROLLER_UID_LABEL.to_owned(), uid)])));
    }
    let raw = parent.data.pointer("/spec/selector").cloned().unwrap_or(Value::Null);
    let selector: LabelSelector =
        serde_json::from_value(raw).map_err(|e| SyncError::ParentSelector(ParentSelectorError::Decode(e)))?;
    if selector.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
        && selector.match_expressions.as_ref().is_none_or(Vec::is_empty)
    {
        return Err(SyncError::ParentSelector(ParentSelectorError::Empty));
    }
    Selector::from_label_selector(&selector).map_err(|e| SyncError::ParentSelector(ParentSelectorError::Invalid(e)))
}

/// Validates a sync/finalize response whole: the desired children by declared type (each must match
/// the parent's selector; `controller-uid` is added under `generateSelector`) and the status to write.
pub fn validate_response(
    cc: &CompositeController,
    parent: &DynamicObject,
    parent_resource: &ResolvedResource,
    child_resources: &[Arc<ResolvedResource>],
    response: &CompositeResponse,
    selector: &Selector,
) -> Result<(Vec<ChildMap<Value>>, Value), SyncError> {
    let generated = (cc.spec.generate_selector == Some(true))
        .then(|| BTreeMap::from([(CONTROLLER_UID_LABEL.to_owned(), parent.metadata.uid.clone().unwrap_or_default())]));
    // In the order of `child_resources`: the spec's.
    let cross_namespace: Vec<bool> =
        cc.spec.child_resources.iter().map(crate::api::ChildResourceRule::cross_namespace).collect();
    let rules = ChildRules {
        default_labels: generated.as_ref(),
        annotations: None,
        selector: Some(selector),
        cross_namespace: &cross_namespace,
        role: ChildRole::Child,
    };
    let desired = desired_children(child_resources, parent, parent_resource, &response.children, rules)
        .map_err(SyncError::InvalidResponse)?;
    Ok((desired, desired_status(parent, response.status.as_ref())?))
}

/// The status to write: the hook's (an object, or nothing) plus `observedGeneration`.
fn desired_status(parent: &DynamicObject, status: Option<&Value>) -> Result<Value, SyncError> {
    let mut status = match status {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(other) => return Err(SyncError::InvalidResponse(format!("status must be an object, got {other}"))),
    };
    status.insert("observedGeneration".into(), json!(parent.metadata.generation.unwrap_or(0)));
    Ok(Value::Object(status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_gets_observed_generation_and_must_be_an_object() {
        let parent: DynamicObject = serde_json::from_value(
            json!({"apiVersion": "x/v1", "kind": "P", "metadata": {"name": "p", "generation": 4}}),
        )
        .unwrap();
        assert_eq!(desired_status(&parent, None).unwrap(), json!({"observedGeneration": 4}));
        assert_eq!(
            desired_status(&parent, Some(&json!({"ready": 2}))).unwrap(),
            json!({"ready": 2, "observedGeneration": 4})
        );
        assert!(desired_status(&parent, Some(&json!("ok"))).is_err());
    }

    mod responses {
        //! Property: whatever a hook sends, decoding and validating it never panics, and a response is
        //! either accepted whole (every child it lists becomes exactly one desired child, owned by the
        //! parent) or refused whole (an error; nothing to write).
        use proptest::prelude::*;

        use super::*;
        use crate::api::UnmarshalMode;
        use crate::cache::discovery::ResolvedResource;
        use crate::hooks::{COMPOSITE_RESPONSE_FIELDS, decode};

        /// Cases per property; each is a pure function call, so thousands take well under a second.
        const CASES: u32 = 4000;

        fn resource(api_version: &str, kind: &str, plural: &str, namespaced: bool) -> Arc<ResolvedResource> {
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
            Arc::new(ResolvedResource {
                api_resource: kube::core::ApiResource {
                    group: group.into(),
                    version: version.into(),
                    api_version: api_version.into(),
                    kind: kind.into(),
                    plural: plural.into(),
                },
                namespaced,
                has_status: true,
            })
        }

        fn controller() -> CompositeController {
            serde_json::from_value(
                json!({"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
                "metadata": {"name": "cc"},
                "spec": {"generateSelector": true,
                         "parentResource": {"apiVersion": "x.dev/v1", "resource": "things"},
                         "childResources": [{"apiVersion": "v1", "resource": "configmaps"},
                                            {"apiVersion": "v1", "resource": "services"}]}}),
            )
            .unwrap()
        }

        fn parent() -> DynamicObject {
            serde_json::from_value(json!({"apiVersion": "x.dev/v1", "kind": "Thing",
                "metadata": {"name": "p", "namespace": "ns", "uid": "parent-uid", "generation": 2}}))
            .unwrap()
        }

        /// Decodes and validates `body` as the engine does; `Ok(n)` = accepted with `n` desired children.
        fn judge(body: &Value) -> Result<usize, String> {
            let cc = controller();
            let parent = parent();
            let types =
                vec![resource("v1", "ConfigMap", "configmaps", true), resource("v1", "Service", "services", true)];
            let selector = child_selector(&cc, &parent).unwrap();
            for mode in [UnmarshalMode::Loose, UnmarshalMode::Strict] {
                let decoded: Result<CompositeResponse, _> = decode("u", body.clone(), mode, COMPOSITE_RESPONSE_FIELDS);
                let Ok(response) = decoded else { continue };
                let result = validate_response(
                    &cc,
                    &parent,
                    &resource("x.dev/v1", "Thing", "things", true),
                    &types,
                    &response,
                    &selector,
                );
                return match result {
                    Ok((desired, status)) => {
                        let count: usize = desired.iter().map(BTreeMap::len).sum();
                        assert_eq!(count, response.children.len(), "accepted, but not whole: {body}");
                        for child in desired.iter().flat_map(BTreeMap::values) {
                            let refs = child["metadata"]["ownerReferences"].as_array().expect("ownership set");
                            assert_eq!(refs.len(), 1);
                            assert_eq!(refs[0]["uid"], "parent-uid");
                            assert_eq!(child["metadata"]["labels"]["controller-uid"], "parent-uid");
                        }
                        assert_eq!(status["observedGeneration"], 2);
                        Ok(count)
                    }
                    Err(e) => Err(e.to_string()),
                };
            }
            Err("undecodable".into())
        }

        fn text() -> impl Strategy<Value = String> {
            prop_oneof![
                "[a-z0-9-]{1,12}",
                "[A-Za-z0-9_./:% -]{0,20}",
                Just("x".repeat(300)),
                Just(String::new()),
                Just("ns".to_owned()),
                Just("parent-uid".to_owned()),
            ]
        }

        fn key() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("apiVersion"),
                Just("kind"),
                Just("metadata"),
                Just("name"),
                Just("namespace"),
                Just("labels"),
                Just("annotations"),
                Just("ownerReferences"),
                Just("uid"),
                Just("controller"),
                Just("children"),
                Just("status"),
                Just("resyncAfterSeconds"),
                Just("finalized"),
                Just("events"),
                Just("data"),
                Just("spec"),
            ]
            .prop_map(str::to_owned)
        }

        /// Any JSON, biased towards the keys a response has.
        fn any_json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(|n| json!(n)),
                any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
                text().prop_map(Value::String),
            ];
            leaf.prop_recursive(4, 64, 8, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                    prop::collection::btree_map(key(), inner, 0..6)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        fn child(i: usize) -> Value {
            if i.is_multiple_of(2) {
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("cm-{i}")}, "data": {"k": "v"}})
            } else {
                json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": format!("svc-{i}"), "labels": {"app": "a"}},
                       "spec": {"ports": [{"port": 80}]}})
            }
        }

        /// A valid response with a few random edits, each at a random child.
        fn mutated() -> impl Strategy<Value = Value> {
            let edit = (0..12_usize, 0..6_usize, text(), any_json());
            (1..6_usize, prop::collection::vec(edit, 0..4)).prop_map(|(n, edits)| {
                let mut children: Vec<Value> = (0..n).map(child).collect();
                for (what, at, word, junk) in edits {
                    let c = &mut children[at % n];
                    // Indexing a non-object panics in serde_json itself; such a child stays as junk.
                    let editable_meta = c.get("metadata").is_some_and(Value::is_object);
                    if !c.is_object() || (what < 8 && what != 1 && what != 2 && !editable_meta) {
                        continue;
                    }
                    match what {
                        0 => c["metadata"]["name"] = json!(word),
                        1 => c["kind"] = json!(word),
                        2 => c["apiVersion"] = json!(word),
                        3 => c["metadata"]["namespace"] = json!(word),
                        4 => c["metadata"]["labels"] = json!({word.clone(): word}),
                        5 => {
                            c["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "X", "name": word,
                                                                       "uid": word, "controller": true}]);
                        }
                        6 => c["metadata"]["annotations"] = json!({word.clone(): junk}),
                        7 => c["metadata"] = junk,
                        8 => *c = junk,
                        9 => {
                            let copy = c.clone();
                            children.push(copy);
                        }
                        10 if editable_meta => c["metadata"]["labels"] = json!({"controller-uid": word}),
                        _ => c["data"] = junk,
                    }
                }
                json!({"status": {"ready": n}, "children": children})
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

            #[test]
            fn random_json_is_judged_without_panicking(body in any_json()) {
                let _ = judge(&body);
            }

            #[test]
            fn random_responses_are_accepted_or_refused_whole(
                status in any_json(),
                children in prop::collection::vec(any_json(), 0..5),
            ) {
                let _ = judge(&json!({"status": status, "children": children}));
            }

            #[test]
            fn mutated_valid_responses_are_accepted_or_refused_whole(body in mutated()) {
                let _ = judge(&body);
            }
        }

        #[test]
        fn the_unmutated_response_is_accepted_whole() {
            let body = json!({"status": {}, "children": (0..5).map(child).collect::<Vec<_>>()});
            assert_eq!(judge(&body), Ok(5));
        }
    }
}
