/**
 * Builders for hook responses, so a hook returns the exact JSON field names the hub expects.
 *
 * Builders only emit the fields they are given (`events` only when there are some), so a response
 * built here is also accepted by Metacontroller, whose v2 hooks reject unknown fields.
 */

const EVENT_TYPES = ["Normal", "Warning"];

/**
 * An Event for the hub to record on the parent (metahook extension), e.g.
 * `event("Warning", "QuotaLow", "3 of 4 volumes used")`. `reason` is a CamelCase word.
 */
export function event(type, reason, message = "") {
  if (!EVENT_TYPES.includes(type)) throw new TypeError(`event type must be "Normal" or "Warning", not ${JSON.stringify(type)}`);
  if (!reason) throw new TypeError("event reason must not be empty");
  return { type, reason, message };
}

/**
 * Answer to a CompositeController sync/finalize. `children` is required because it is the complete
 * desired set: a child left out is deleted. `status` replaces the parent's status.
 */
export function compositeResponse({ children, status, resyncAfterSeconds, finalized = false, events = [] }) {
  if (children === undefined) {
    throw new TypeError("compositeResponse needs `children`: the whole desired set (a child left out is deleted)");
  }
  return withCommon({ children: checkObjects("children", children) }, { status, resyncAfterSeconds, finalized, events });
}

/**
 * Answer to a DecoratorController sync/finalize. `labels`/`annotations` merge into the target (a
 * `null` value deletes the key); no `status` leaves the target's status alone; `attachments` is the
 * complete desired set, like composite children.
 */
export function decoratorResponse({
  labels,
  annotations,
  status,
  attachments = [],
  resyncAfterSeconds,
  finalized = false,
  events = [],
} = {}) {
  const response = { attachments: checkObjects("attachments", attachments) };
  for (const [field, values] of [["labels", labels], ["annotations", annotations]]) {
    if (values === undefined || values === null) continue;
    const bad = Object.keys(values).filter((key) => values[key] !== null && typeof values[key] !== "string");
    if (bad.length) throw new TypeError(`${field} values must be strings or null (to delete); not for ${bad.join(", ")}`);
    response[field] = { ...values };
  }
  return withCommon(response, { status, resyncAfterSeconds, finalized, events });
}

/**
 * Answer to a MapController `map` call. `outputs` is required because it is the complete desired set
 * of this input's outputs: one left out is deleted. No `status`: the hub aggregates the parent's.
 */
export function mapResponse({ outputs, resyncAfterSeconds, events = [] } = {}) {
  if (outputs === undefined) {
    throw new TypeError(
      "mapResponse needs `outputs`: the whole desired set for this input (an output of it left out is deleted)",
    );
  }
  return withCommon({ outputs: checkObjects("outputs", outputs) }, { resyncAfterSeconds, events });
}

/**
 * Answer to a MapController `tombstone` call: the detached outputs to keep (the others are deleted),
 * each reduced to the reference the hub reads (`apiVersion`, `kind`, `metadata.name` and `namespace`),
 * so an observed output can be passed as it is. No `events`: the tombstone answer has none.
 */
export function tombstoneResponse({ keep = [], resyncAfterSeconds } = {}) {
  const refs = checkObjects("keep", keep).map(({ apiVersion, kind, metadata }) => {
    const ref = { apiVersion, kind, metadata: { name: metadata.name } };
    if (metadata.namespace) ref.metadata.namespace = metadata.namespace;
    return ref;
  });
  return withCommon({ outputs: refs }, { resyncAfterSeconds });
}

/**
 * Answer to a MapController `finalize` call (the parent is being deleted): `finalized: true` lets it go.
 * Only the fields given are emitted, `finalized` only when true.
 */
export function mapFinalizeResponse({ finalized = false, resyncAfterSeconds, events = [] } = {}) {
  return withCommon({}, { resyncAfterSeconds, finalized, events });
}

/** One RelatedResourceRule, checked against the combinations the hub refuses (§2.5). */
export function relatedRule(apiVersion, resource, { labelSelector, namespaceSelector, namespace, names } = {}) {
  if (names !== undefined && (labelSelector !== undefined || namespaceSelector !== undefined)) {
    throw new TypeError("related rule: names cannot be combined with a label or namespace selector");
  }
  if (namespace !== undefined && namespaceSelector !== undefined) {
    throw new TypeError("related rule: namespace cannot be combined with namespaceSelector");
  }
  const rule = { apiVersion, resource };
  if (labelSelector !== undefined) rule.labelSelector = labelSelector;
  if (namespaceSelector !== undefined) rule.namespaceSelector = namespaceSelector;
  if (namespace !== undefined) rule.namespace = namespace;
  if (names !== undefined) rule.names = [...names];
  return rule;
}

/** Answer to a customize hook: which related objects the sync hook should receive. */
export function customizeResponse(relatedResources = []) {
  return { relatedResources: [...relatedResources] };
}

/** "null", "an array", "string", ...: what a value is, for error messages. */
export function describe(value) {
  if (value === null) return "null";
  return Array.isArray(value) ? "an array" : typeof value;
}

function checkObjects(field, objects) {
  // The hub would refuse these too, but with a message about the whole response; naming the
  // index here points at the bug.
  const list = [...objects];
  list.forEach((obj, i) => {
    if (obj === null || typeof obj !== "object" || Array.isArray(obj)) {
      throw new TypeError(`${field}[${i}] is ${describe(obj)}, not an object`);
    }
    const missing = ["apiVersion", "kind"].filter((f) => !obj[f]);
    if (!obj.metadata?.name) missing.push("metadata.name");
    if (missing.length) throw new TypeError(`${field}[${i}] has no ${missing.join(", ")}`);
  });
  return list;
}

function withCommon(response, { status, resyncAfterSeconds, finalized = false, events = [] }) {
  if (status !== undefined && status !== null) response.status = { ...status };
  if (resyncAfterSeconds !== undefined) {
    if (typeof resyncAfterSeconds !== "number" || !(resyncAfterSeconds >= 0)) {
      throw new RangeError(`resyncAfterSeconds must be a number >= 0, got ${resyncAfterSeconds}`);
    }
    response.resyncAfterSeconds = resyncAfterSeconds;
  }
  if (finalized) response.finalized = true;
  const list = [...events];
  list.forEach((e, i) => {
    if (!EVENT_TYPES.includes(e.type ?? "Normal") || !e.reason) {
      throw new TypeError(`events[${i}] needs type "Normal" or "Warning" and a reason; build it with event()`);
    }
  });
  if (list.length) response.events = list;
  return response;
}
