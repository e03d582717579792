/**
 * Status conditions (`status.conditions[]`) the way Kubernetes keeps them.
 *
 * A hook's `status` replaces the parent's whole status, so a hook that reports conditions must carry
 * the observed ones forward and change only what changed. `setCondition` does that with the rules of
 * `meta.SetStatusCondition` in apimachinery: a condition whose `status` changes gets a new
 * `lastTransitionTime`; one whose status stays keeps its time, even if its reason or message change.
 */

// apimachinery's validation of `reason` (metav1.Condition): CamelCase, no spaces.
const REASON = /^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$/;
const STATUSES = ["True", "False", "Unknown"];

/**
 * The conditions with `condition.type` set (added, or replaced in place); the others are kept as
 * they are. `conditions` are usually the observed ones (`parent.status?.conditions`). `status` is
 * `true`/`false` or `"True"`/`"False"`/`"Unknown"`. `lastTransitionTime` is `now` (default: the
 * current time, to the second) when the status changes or the condition is new.
 */
export function setCondition(conditions, { type, status, reason, message = "", observedGeneration }, now = new Date()) {
  if (!type) throw new TypeError("condition type must not be empty");
  if (!REASON.test(reason ?? "")) {
    throw new TypeError(`condition reason must be a CamelCase word (e.g. "AllReplicasReady"), not ${JSON.stringify(reason)}`);
  }
  const text = typeof status === "boolean" ? (status ? "True" : "False") : status;
  if (!STATUSES.includes(text)) {
    throw new TypeError(`condition status must be True, False or Unknown, not ${JSON.stringify(status)}`);
  }
  const stamp = `${now.toISOString().slice(0, 19)}Z`;
  const build = (since) => {
    const condition = { type, status: text, reason, message, lastTransitionTime: since };
    if (observedGeneration !== undefined) condition.observedGeneration = observedGeneration;
    return condition;
  };
  let found = false;
  const result = [...(conditions ?? [])].map((old) => {
    if (old.type !== type) return { ...old };
    found = true;
    const changed = old.status !== text || !old.lastTransitionTime;
    return build(changed ? stamp : old.lastTransitionTime);
  });
  if (!found) result.push(build(stamp));
  return result;
}

/** The condition of that type, or `undefined`. */
export function findCondition(conditions, type) {
  const found = [...(conditions ?? [])].find((c) => c.type === type);
  return found && { ...found };
}

/** `"True"`, `"False"`, `"Unknown"`, or `undefined` when there is no condition of that type. */
export function conditionStatus(conditions, type) {
  return findCondition(conditions, type)?.status;
}
