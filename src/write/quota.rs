//! Whether a `Recreate` child's replacement fits the namespace's `ResourceQuota`s once the original is
//! deleted — decided from the quotas' own figures (`status.hard`, `status.used`) against what the
//! original holds of them, never from the wording of a refusal.
//!
//! Why this exists: a dry-run create of the replacement is refused while the original exists whenever
//! the original's share is what leaves no room (a Pod asking for more CPU under a quota it nearly fills).
//! The API server cannot tell us what the namespace would look like without the original, so the hub
//! computes it: for every quota, `used − original + replacement ≤ hard`, for each figure the replacement
//! raises. What it charges an object follows the API server's quota evaluators (`pkg/quota/v1/evaluator`
//! of Kubernetes 1.36): object counts, a Pod's compute requests and limits (containers, init containers
//! and sidecars, overhead, pod-level resources), a Service's node ports and load balancers, a claim's
//! storage and storage-class figures.
//!
//! It is conservative where the evaluators depend on what this module cannot know: a quota figure it
//! does not recognise, a scope it cannot evaluate, a `LimitRange` that could default a container's
//! missing figure, a quota whose `used` is not computed yet. Each of those answers
//! [`Verdict::Unknown`], and the original is kept: a replacement is never created on a guess.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::cache::discovery::ResolvedResource;

/// What the quotas say about a replacement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every quota has room for it once the original's share is given back.
    Fits,
    /// It does not fit even without the original (why, naming the quota and the figure).
    DoesNotFit(String),
    /// The figures cannot be known here (why).
    Unknown(String),
}

/// An amount in billionths (a Kubernetes quantity's finest scale is nano), exact for every quantity a
/// quota compares.
type Amount = i128;

const NANO: Amount = 1_000_000_000;

/// Parses a Kubernetes quantity (`"1"`, `"500m"`, `"1.5Gi"`, `"2e3"`) into billionths, rounding up what
/// is finer. `None` for what is not a quantity or does not fit.
#[must_use]
pub fn parse_quantity(text: &str) -> Option<Amount> {
    let text = text.trim();
    let (sign, text) = match text.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, text.strip_prefix('+').unwrap_or(text)),
    };
    let digits_end = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, suffix) = text.split_at(digits_end);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return None;
    }
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    // The number as an integer and a power of ten: 1.25 → 125 × 10^-2.
    let mut mantissa: Amount = 0;
    for digit in whole.chars().chain(fraction.chars()) {
        mantissa = mantissa.checked_mul(10)?.checked_add(Amount::from(digit.to_digit(10)?))?;
    }
    let mut exponent = -i32::try_from(fraction.len()).ok()?;
    let mut factor: Amount = 1;
    match suffix {
        "" => {}
        "n" => exponent -= 9,
        "u" => exponent -= 6,
        "m" => exponent -= 3,
        "k" => exponent += 3,
        "M" => exponent += 6,
        "G" => exponent += 9,
        "T" => exponent += 12,
        "P" => exponent += 15,
        "E" => exponent += 18,
        "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => {
            let power = match suffix {
                "Ki" => 10,
                "Mi" => 20,
                "Gi" => 30,
                "Ti" => 40,
                "Pi" => 50,
                _ => 60,
            };
            factor = 1 << power;
        }
        other => {
            let power = other.strip_prefix(['e', 'E'])?;
            exponent = exponent.checked_add(power.parse::<i32>().ok()?)?;
        }
    }
    // To billionths: × 10^(exponent + 9), rounding a finer remainder up.
    let scale = exponent.checked_add(9)?;
    let scaled = if scale >= 0 {
        mantissa.checked_mul(10_i128.checked_pow(u32::try_from(scale).ok()?)?)?
    } else {
        let divisor = 10_i128.checked_pow(u32::try_from(-scale).ok()?)?;
        mantissa.div_euclid(divisor) + Amount::from(mantissa.rem_euclid(divisor) != 0)
    };
    scaled.checked_mul(factor).map(|n| n * sign)
}

/// A list of named amounts (a `ResourceList`).
type Resources = BTreeMap<String, Amount>;

/// Reads a `ResourceList` object; `None` if a value is not a quantity.
fn resources(list: Option<&Value>) -> Option<Resources> {
    let Some(list) = list.and_then(Value::as_object) else { return Some(Resources::new()) };
    list.iter()
        .map(|(name, value)| {
            let amount = match value {
                Value::String(text) => parse_quantity(text)?,
                Value::Number(n) => parse_quantity(&n.to_string())?,
                _ => return None,
            };
            Some((name.clone(), amount))
        })
        .collect()
}

fn add(into: &mut Resources, from: &Resources) {
    for (name, amount) in from {
        *into.entry(name.clone()).or_default() += amount;
    }
}

fn max_into(into: &mut Resources, from: &Resources) {
    for (name, amount) in from {
        let entry = into.entry(name.clone()).or_default();
        *entry = (*entry).max(*amount);
    }
}

/// One container's requests and limits. A desired form (not yet stored) gets the API server's
/// defaulting of requests from limits; a stored object has it already.
fn container_resources(container: &Value, stored: bool) -> Option<(Resources, Resources)> {
    let requirements = container.get("resources");
    let mut requests = resources(requirements.and_then(|r| r.get("requests")))?;
    let limits = resources(requirements.and_then(|r| r.get("limits")))?;
    if !stored {
        for (name, limit) in &limits {
            requests.entry(name.clone()).or_insert(*limit);
        }
    }
    Some((requests, limits))
}

/// A Pod's requests or limits as the scheduler and quota count them (`PodRequests`, `PodLimits`):
/// the containers and sidecars together, or the largest init container with the sidecars started
/// before it, whichever is more; pod-level resources where set; plus the overhead.
fn pod_totals(spec: &Value, stored: bool, limits: bool) -> Option<Resources> {
    let pick = |c: &Value| container_resources(c, stored).map(|(r, l)| if limits { l } else { r });
    let list = |key: &str| spec.get(key).and_then(Value::as_array).cloned().unwrap_or_default();
    let mut total = Resources::new();
    for container in list("containers") {
        add(&mut total, &pick(&container)?);
    }
    let mut sidecars = Resources::new();
    let mut init_peak = Resources::new();
    for container in list("initContainers") {
        let own = pick(&container)?;
        let running = if container.get("restartPolicy").and_then(Value::as_str) == Some("Always") {
            add(&mut total, &own);
            add(&mut sidecars, &own);
            sidecars.clone()
        } else {
            let mut with_sidecars = own;
            add(&mut with_sidecars, &sidecars);
            with_sidecars
        };
        max_into(&mut init_peak, &running);
    }
    max_into(&mut total, &init_peak);
    // Pod-level resources (cpu and memory) replace the containers' sums where set.
    if let Some(pod_level) = spec.get("resources") {
        let mut requests = resources(pod_level.get("requests"))?;
        let pod_limits = resources(pod_level.get("limits"))?;
        if !stored {
            for (name, limit) in &pod_limits {
                requests.entry(name.clone()).or_insert(*limit);
            }
        }
        for (name, amount) in if limits { pod_limits } else { requests } {
            if name == "cpu" || name == "memory" {
                total.insert(name, amount);
            }
        }
    }
    if let Some(overhead) = spec.get("overhead") {
        add(&mut total, &resources(Some(overhead))?);
    }
    Some(total)
}

/// What quota figure `name` charges the Pod with `spec` (`stored`: read from the API server, so
/// defaulted; `counted`: not in a terminal phase), as `PodUsageFunc` and `podComputeUsageHelper` charge
/// it. `None` for the figures of dynamic resource allocation, which can reach a Pod through its claims.
fn pod_charge(name: &str, spec: &Value, stored: bool, counted: bool) -> Option<Amount> {
    if name.contains("deviceclass.resource") {
        return None;
    }
    if !counted {
        // A terminal Pod keeps only its object count.
        return Some(0);
    }
    let (limits, resource) = match name {
        "pods" => return Some(NANO),
        "cpu" | "memory" | "ephemeral-storage" => (false, name),
        _ if name.starts_with("hugepages-") => (false, name),
        _ => match name.split_once('.') {
            Some(("limits", r @ ("cpu" | "memory" | "ephemeral-storage"))) => (true, r),
            Some(("requests", r @ ("cpu" | "memory" | "ephemeral-storage"))) => (false, r),
            Some(("requests", r)) if r.starts_with("hugepages-") => (false, r),
            // Extended resources (a domain other than Kubernetes' own) are charged as requests only.
            Some(("requests", r)) if r.contains('/') && !r.contains("kubernetes.io/") => (false, r),
            _ => return Some(0),
        },
    };
    Some(pod_totals(spec, stored, limits)?.get(resource).copied().unwrap_or(0))
}

/// The compute figures of quota `hard` that every container must state (the evaluator's
/// `Constraints`): `must specify …` otherwise. Empty when pod-level resources are set.
fn missing_constraints(spec: &Value, stored: bool, hard: &Resources) -> Vec<String> {
    const VALIDATED: [&str; 6] = ["cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory"];
    if spec.get("resources").is_some_and(|r| r.get("requests").is_some() || r.get("limits").is_some()) {
        return Vec::new();
    }
    let required: Vec<&str> = VALIDATED.into_iter().filter(|r| hard.contains_key(*r)).collect();
    let mut missing = Vec::new();
    let list = |key: &str| spec.get(key).and_then(Value::as_array).cloned().unwrap_or_default();
    for container in list("containers").iter().chain(&list("initContainers")) {
        let Some((requests, limits)) = container_resources(container, stored) else { continue };
        for figure in &required {
            let has = match figure.split_once('.') {
                Some(("limits", r)) => limits.contains_key(r),
                Some((_, r)) => requests.contains_key(r),
                None => requests.contains_key(*figure),
            };
            if !has {
                let name = container.get("name").and_then(Value::as_str).unwrap_or("?");
                missing.push(format!("{figure} for {name}"));
            }
        }
    }
    missing
}

/// Whether a Pod counts for compute quota (`QuotaV1Pod`): not in a terminal phase. (A Pod being
/// deleted is never recreated, so its grace period does not matter here.)
fn pod_counts(pod: &Value) -> bool {
    !matches!(pod.pointer("/status/phase").and_then(Value::as_str), Some("Succeeded" | "Failed"))
}

/// Whether the Pod's `QoS` class is `BestEffort`: no container states a cpu or memory request or limit.
fn best_effort(spec: &Value) -> bool {
    let list = |key: &str| spec.get(key).and_then(Value::as_array).cloned().unwrap_or_default();
    let states = |c: &Value| {
        ["requests", "limits"].iter().any(|kind| {
            c.pointer(&format!("/resources/{kind}"))
                .and_then(Value::as_object)
                .is_some_and(|m| m.contains_key("cpu") || m.contains_key("memory"))
        })
    };
    !list("containers").iter().chain(&list("initContainers")).any(states) && !spec.get("resources").is_some_and(states)
}

/// Whether a quota's scopes select the Pod `pod`; `None` for a scope this module cannot evaluate.
fn pod_in_scope(quota: &Value, pod: &Value) -> Option<bool> {
    let spec = pod.get("spec").unwrap_or(&Value::Null);
    let terminating = spec.get("activeDeadlineSeconds").and_then(Value::as_i64).is_some_and(|s| s >= 0);
    let priority = spec.get("priorityClassName").and_then(Value::as_str).unwrap_or_default();
    let matches = |scope: &str, operator: &str, values: &[String]| -> Option<bool> {
        Some(match scope {
            "Terminating" => terminating,
            "NotTerminating" => !terminating,
            "BestEffort" => best_effort(spec),
            "NotBestEffort" => !best_effort(spec),
            "PriorityClass" => match operator {
                "Exists" => !priority.is_empty(),
                "DoesNotExist" => priority.is_empty(),
                "In" => values.iter().any(|v| v == priority),
                "NotIn" => !values.iter().any(|v| v == priority),
                _ => return None,
            },
            _ => return None,
        })
    };
    let scopes = quota.pointer("/spec/scopes").and_then(Value::as_array).cloned().unwrap_or_default();
    for scope in &scopes {
        if !matches(scope.as_str()?, "Exists", &[])? {
            return Some(false);
        }
    }
    let selector = quota.pointer("/spec/scopeSelector/matchExpressions").and_then(Value::as_array);
    for requirement in selector.into_iter().flatten() {
        let scope = requirement.get("scopeName").and_then(Value::as_str)?;
        let operator = requirement.get("operator").and_then(Value::as_str).unwrap_or("Exists");
        let values: Vec<String> = requirement
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        if !matches(scope, operator, &values)? {
            return Some(false);
        }
    }
    Some(true)
}

/// Whether a quota has scopes at all.
fn scoped(quota: &Value) -> bool {
    quota.pointer("/spec/scopes").and_then(Value::as_array).is_some_and(|s| !s.is_empty())
        || quota.pointer("/spec/scopeSelector").is_some_and(|s| !s.is_null())
}

/// One object of `resource` as quota sees it.
struct Charged<'a> {
    resource: &'a ResolvedResource,
    object: &'a Value,
    /// Read from the API server (defaulted), not a desired form.
    stored: bool,
}

impl Charged<'_> {
    fn is(&self, group: &str, kind: &str) -> bool {
        self.resource.api_resource.group == group && self.resource.api_resource.kind == kind
    }

    /// The object-count figure of its type (`count/<plural>[.<group>]`).
    fn count_name(&self) -> String {
        let api = &self.resource.api_resource;
        if api.group.is_empty() {
            format!("count/{}", api.plural)
        } else {
            format!("count/{}.{}", api.plural, api.group)
        }
    }

    /// What figure `name` charges it (the evaluator of its type, or the object count of any type);
    /// `None` when this module does not know.
    fn charge(&self, name: &str) -> Option<Amount> {
        if name == self.count_name() {
            return Some(NANO);
        }
        let api = &self.resource.api_resource;
        match (api.group.as_str(), api.kind.as_str()) {
            ("", "Pod") => {
                let spec = self.object.get("spec").unwrap_or(&Value::Null);
                pod_charge(name, spec, self.stored, pod_counts(self.object))
            }
            ("", "Service") => Some(self.service_charge(name)),
            ("", "PersistentVolumeClaim") => self.claim_charge(name),
            ("resource.k8s.io", "ResourceClaim") => None,
            (_, kind) => {
                let legacy = [
                    ("configmaps", "ConfigMap"),
                    ("secrets", "Secret"),
                    ("replicationcontrollers", "ReplicationController"),
                    ("resourcequotas", "ResourceQuota"),
                ];
                Some(if legacy.contains(&(name, kind)) { NANO } else { 0 })
            }
        }
    }

    fn service_charge(&self, name: &str) -> Amount {
        let spec = self.object.get("spec").unwrap_or(&Value::Null);
        let kind = spec.get("type").and_then(Value::as_str).unwrap_or("ClusterIP");
        let ports = spec.get("ports").and_then(Value::as_array).cloned().unwrap_or_default();
        let count = |n: usize| Amount::try_from(n).unwrap_or(0) * NANO;
        match name {
            "services" => NANO,
            "services.loadbalancers" if kind == "LoadBalancer" => NANO,
            "services.nodeports" => match kind {
                "LoadBalancer" if spec.get("allocateLoadBalancerNodePorts") == Some(&Value::Bool(false)) => {
                    count(ports.iter().filter(|p| p.get("nodePort").and_then(Value::as_i64).unwrap_or(0) != 0).count())
                }
                "NodePort" | "LoadBalancer" => count(ports.len()),
                _ => 0,
            },
            _ => 0,
        }
    }

    fn claim_charge(&self, name: &str) -> Option<Amount> {
        let spec = self.object.get("spec").unwrap_or(&Value::Null);
        let class = spec.get("storageClassName").and_then(Value::as_str).or_else(|| {
            self.object
                .pointer("/metadata/annotations/volume.beta.kubernetes.io~1storage-class")
                .and_then(Value::as_str)
        });
        let storage = || resources(spec.pointer("/resources/requests"))?.get("storage").copied().or(Some(0));
        if name == "requests.storage" {
            return storage();
        }
        if name == "persistentvolumeclaims" {
            return Some(NANO);
        }
        if let Some((of_class, figure)) = name.split_once(".storageclass.storage.k8s.io/") {
            // A desired claim without a class gets the default one at admission: unknown here.
            let class = class?;
            return match figure {
                _ if of_class != class => Some(0),
                "requests.storage" => storage(),
                "persistentvolumeclaims" => Some(NANO),
                _ => None,
            };
        }
        Some(0)
    }
}

/// Whether `replacement` (a desired form of type `resource`) fits every quota of `quotas` (the
/// namespace's `ResourceQuota` objects as read) once `original` (the stored object it replaces) is
/// deleted. `limit_ranges`: whether the namespace has a `LimitRange`, which may fill in a container's
/// missing requests or limits before quota counts them.
#[must_use]
pub fn judge(
    quotas: &[Value],
    limit_ranges: bool,
    resource: &ResolvedResource,
    replacement: &Value,
    original: &Value,
) -> Verdict {
    let new = Charged { resource, object: replacement, stored: false };
    let old = Charged { resource, object: original, stored: true };
    let pod = new.is("", "Pod");
    for quota in quotas {
        let name = quota.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("?");
        let Some(hard) = resources(quota.pointer("/status/hard").or_else(|| quota.pointer("/spec/hard"))) else {
            return Verdict::Unknown(format!("quota {name}: a figure is not a quantity"));
        };
        let Some(used) = resources(quota.pointer("/status/used")) else {
            return Verdict::Unknown(format!("quota {name}: a figure is not a quantity"));
        };
        let (covers_new, covers_old) = if !scoped(quota) {
            (true, true)
        } else if pod {
            match (pod_in_scope(quota, replacement), pod_in_scope(quota, original)) {
                (Some(n), Some(o)) => (n, o),
                _ => return Verdict::Unknown(format!("quota {name}: a scope this hub cannot evaluate")),
            }
        } else if quota.to_string().contains("VolumeAttributesClass") {
            return Verdict::Unknown(format!("quota {name}: scope VolumeAttributesClass"));
        } else {
            // Every scope but VolumeAttributesClass selects Pods only.
            (false, false)
        };
        if covers_new && pod {
            let spec = replacement.get("spec").unwrap_or(&Value::Null);
            let missing = missing_constraints(spec, false, &hard);
            if !missing.is_empty() && !limit_ranges {
                return Verdict::DoesNotFit(format!("quota {name}: must specify {}", missing.join(", ")));
            }
            if !missing.is_empty() {
                return Verdict::Unknown(format!(
                    "quota {name}: a LimitRange may fill in {}, which the replacement does not state",
                    missing.join(", ")
                ));
            }
        }
        for (figure, limit) in &hard {
            let need = if covers_new {
                match new.charge(figure) {
                    Some(n) => n,
                    None => return Verdict::Unknown(format!("quota {name}: figure {figure} is not known to this hub")),
                }
            } else {
                0
            };
            if need <= 0 {
                continue;
            }
            let freed = if covers_old {
                match old.charge(figure) {
                    Some(n) => n,
                    None => return Verdict::Unknown(format!("quota {name}: figure {figure} is not known to this hub")),
                }
            } else {
                0
            };
            let Some(in_use) = used.get(figure) else {
                return Verdict::Unknown(format!("quota {name}: {figure} has no used figure yet"));
            };
            let room = limit - (in_use - freed);
            if need > room {
                return Verdict::DoesNotFit(format!(
                    "quota {name}: {figure} needs {} where {} is left once the original is deleted ({} of {} used)",
                    show(need),
                    show(room.max(0)),
                    show(*in_use),
                    show(*limit)
                ));
            }
        }
    }
    Verdict::Fits
}

/// An amount as a quantity a reader knows (`1500m`, `2`).
fn show(amount: Amount) -> String {
    if amount % NANO == 0 {
        (amount / NANO).to_string()
    } else if amount % 1_000_000 == 0 {
        format!("{}m", amount / 1_000_000)
    } else {
        format!("{amount}n")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn resource(group: &str, kind: &str, plural: &str) -> ResolvedResource {
        ResolvedResource {
            api_resource: kube::api::ApiResource {
                group: group.into(),
                version: "v1".into(),
                api_version: if group.is_empty() { "v1".into() } else { format!("{group}/v1") },
                kind: kind.into(),
                plural: plural.into(),
            },
            namespaced: true,
            has_status: true,
        }
    }

    fn quota(name: &str, hard: Value, used: Value) -> Value {
        let mut quota = json!({"metadata": {"name": name}, "spec": {}, "status": {}});
        quota["spec"]["hard"] = hard.clone();
        quota["status"]["hard"] = hard;
        quota["status"]["used"] = used;
        quota
    }

    fn pod(cpu: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
               "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu}}}]}})
    }

    #[test]
    fn quantities_are_read_exactly_in_billionths() {
        assert_eq!(parse_quantity("1"), Some(NANO));
        assert_eq!(parse_quantity("1500m"), Some(1_500_000_000));
        assert_eq!(parse_quantity("1.5"), Some(1_500_000_000));
        assert_eq!(parse_quantity("2Ki"), Some(2048 * NANO));
        assert_eq!(parse_quantity("1e3"), Some(1000 * NANO));
        assert_eq!(parse_quantity("1E-3"), Some(1_000_000));
        assert_eq!(parse_quantity("0.5Gi"), Some((1 << 29) * NANO));
        assert_eq!(parse_quantity("1n"), Some(1));
        assert_eq!(parse_quantity("0.1n"), Some(1), "finer than nano rounds up");
        assert_eq!(parse_quantity("-1"), Some(-NANO));
        assert_eq!(parse_quantity("1x"), None);
        assert_eq!(parse_quantity(""), None);
        assert_eq!(parse_quantity("1.2.3"), None);
    }

    /// The case: `requests.cpu: 2`, another Pod holds 0.5, the original 1; a replacement of
    /// 1.5 fits once the original's 1 is given back, one of 2 does not.
    #[test]
    fn a_replacement_fits_when_the_originals_share_makes_the_room() {
        let pods = resource("", "Pod", "pods");
        let quotas = [quota("q", json!({"requests.cpu": "2"}), json!({"requests.cpu": "1500m"}))];
        assert_eq!(judge(&quotas, false, &pods, &pod("1500m"), &pod("1")), Verdict::Fits);
        let Verdict::DoesNotFit(why) = judge(&quotas, false, &pods, &pod("2"), &pod("1")) else { panic!() };
        assert!(why.contains("requests.cpu needs 2 where 1500m is left"), "{why}");
        let terminal = json!({"spec": pod("1")["spec"], "status": {"phase": "Succeeded"}});
        assert!(
            matches!(judge(&quotas, false, &pods, &pod("1500m"), &terminal), Verdict::DoesNotFit(_)),
            "a terminal original frees nothing"
        );
    }

    #[test]
    fn requests_default_to_limits_and_sidecars_add_up_as_the_scheduler_counts() {
        let spec = json!({
            "containers": [{"name": "a", "resources": {"limits": {"cpu": "1"}}},
                           {"name": "b", "resources": {"requests": {"cpu": "250m"}}}],
            "initContainers": [{"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}},
                               {"name": "init", "resources": {"requests": {"cpu": "3"}}}],
            "overhead": {"cpu": "10m"}
        });
        // Containers 1 + 0.25 + sidecar 0.1 = 1.35; the init container 3 + the sidecar before it 0.1.
        assert_eq!(pod_totals(&spec, false, false).unwrap()["cpu"], 3_110_000_000);
        // Stored, a container without a request has none (the API server defaulted what it would).
        let stored_without_default = json!({"containers": [{"name": "a", "resources": {"limits": {"cpu": "1"}}}]});
        assert!(!pod_totals(&stored_without_default, true, false).unwrap().contains_key("cpu"));
        let pod_level = json!({"resources": {"requests": {"cpu": "2"}},
                               "containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}}]});
        assert_eq!(pod_totals(&pod_level, false, false).unwrap()["cpu"], 2 * NANO);
    }

    #[test]
    fn a_container_without_a_quota_figure_does_not_fit_unless_a_limit_range_may_fill_it_in() {
        let pods = resource("", "Pod", "pods");
        let quotas = [quota("q", json!({"requests.memory": "1Gi"}), json!({"requests.memory": "0"}))];
        let bare = json!({"spec": {"containers": [{"name": "c", "image": "i"}]}});
        let Verdict::DoesNotFit(why) = judge(&quotas, false, &pods, &bare, &bare) else { panic!() };
        assert!(why.contains("must specify requests.memory for c"), "{why}");
        assert!(matches!(judge(&quotas, true, &pods, &bare, &bare), Verdict::Unknown(_)));
    }

    #[test]
    fn scopes_select_pods_and_unknown_figures_keep_the_original() {
        let pods = resource("", "Pod", "pods");
        let mut best_effort = quota("be", json!({"pods": "1"}), json!({"pods": "1"}));
        best_effort["spec"]["scopes"] = json!(["BestEffort"]);
        assert_eq!(judge(&[best_effort.clone()], false, &pods, &pod("1"), &pod("1")), Verdict::Fits, "not in scope");
        let bare = json!({"spec": {"containers": [{"name": "c"}]}});
        assert_eq!(judge(&[best_effort], false, &pods, &bare, &bare), Verdict::Fits, "the original's place");
        let mut affinity = quota("x", json!({"pods": "5"}), json!({"pods": "1"}));
        affinity["spec"]["scopes"] = json!(["CrossNamespacePodAffinity"]);
        assert!(matches!(judge(&[affinity], false, &pods, &pod("1"), &pod("1")), Verdict::Unknown(_)));
        let odd = [quota("odd", json!({"example.com/widgets": "1"}), json!({"example.com/widgets": "1"}))];
        assert_eq!(judge(&odd, false, &pods, &pod("1"), &pod("1")), Verdict::Fits, "not a figure Pods are charged");
        let dra = [quota("dra", json!({"gpu.deviceclass.resource.k8s.io/devices": "1"}), json!({}))];
        assert!(matches!(judge(&dra, false, &pods, &pod("1"), &pod("1")), Verdict::Unknown(_)));
        let unused = [quota("new", json!({"requests.cpu": "2"}), json!({}))];
        assert!(matches!(judge(&unused, false, &pods, &pod("1"), &pod("1")), Verdict::Unknown(_)), "not counted yet");
    }

    #[test]
    fn services_and_other_types_are_charged_what_their_evaluators_charge() {
        let services = resource("", "Service", "services");
        let node_port = json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}});
        let quotas = [quota(
            "q",
            json!({"services.nodeports": "1", "services": "1", "requests.cpu": "1", "count/configmaps": "0"}),
            json!({"services.nodeports": "1", "services": "1", "requests.cpu": "1", "count/configmaps": "0"}),
        )];
        assert_eq!(judge(&quotas, false, &services, &node_port, &node_port), Verdict::Fits);
        let two_ports = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}, {"port": 81}]}});
        assert!(matches!(judge(&quotas, false, &services, &two_ports, &node_port), Verdict::DoesNotFit(_)));
        let widgets = resource("example.com", "Widget", "widgets");
        let counted =
            [quota("w", json!({"count/widgets.example.com": "1"}), json!({"count/widgets.example.com": "1"}))];
        assert_eq!(judge(&counted, false, &widgets, &json!({}), &json!({})), Verdict::Fits);
        let claims = resource("", "PersistentVolumeClaim", "persistentvolumeclaims");
        let by_class = [quota(
            "s",
            json!({"fast.storageclass.storage.k8s.io/requests.storage": "10Gi"}),
            json!({"fast.storageclass.storage.k8s.io/requests.storage": "8Gi"}),
        )];
        let claim = |size: &str, class: Option<&str>| {
            let mut c = json!({"spec": {"resources": {"requests": {"storage": size}}}});
            if let Some(class) = class {
                c["spec"]["storageClassName"] = json!(class);
            }
            c
        };
        assert_eq!(
            judge(&by_class, false, &claims, &claim("10Gi", Some("fast")), &claim("8Gi", Some("fast"))),
            Verdict::Fits
        );
        assert!(matches!(
            judge(&by_class, false, &claims, &claim("10Gi", None), &claim("8Gi", Some("fast"))),
            Verdict::Unknown(_)
        ));
    }
}
