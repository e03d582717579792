// The blue-green sync hook: a BlueGreenDeployment owns two ReplicaSets, <name>-blue and <name>-green,
// and a Service <name> that selects the Pods of one of them: the active color.
//
// A rollout is a sequence of syncs, each deciding only from what it observes:
//   Stable      the active ReplicaSet runs the current template; the other color is kept at 0 Pods
//   Preparing   the template changed, but the inactive ReplicaSet still has Pods: it takes the new
//               template at 0 replicas until they are gone (a ReplicaSet does not replace its Pods
//               when its template changes)
//   RollingOut  the inactive ReplicaSet runs the new template and scales up
//   Switching   all its Pods are Ready: the Service switches to it; the next sync finds the new color
//               active and stable, and scales the old color to 0
// Which color is active is read back from the observed Service, so the hook keeps no state.
//
// No dependencies. Listens on $HOST:$PORT (default 0.0.0.0:8080).

import { createHash } from "node:crypto";
import { pathToFileURL } from "node:url";

import { child, compositeResponse, event, parentOf, serve } from "../metahook-hooks/index.js";

/**
 * The types this hook reads: `tsc --strict` checks the hook against them (`make test`).
 * @typedef {import("../metahook-hooks/index.js").KubeObject} KubeObject
 * @typedef {Record<string, any>} PodTemplate
 * @typedef {{ matchLabels: Record<string, string> }} Selector
 * @typedef {{ name?: string, port: number, targetPort?: number | string, protocol?: string }} ServicePort
 * @typedef {import("../metahook-hooks/index.js").Resource<
 *   { replicas?: number, selector: Selector, template: PodTemplate, ports?: ServicePort[] }>} BlueGreenDeployment
 * @typedef {import("../metahook-hooks/index.js").Resource<
 *   { replicas: number, selector: Selector, template: PodTemplate },
 *   { observedGeneration?: number, replicas?: number, readyReplicas?: number }>} ReplicaSet
 * @typedef {import("../metahook-hooks/index.js").Resource<{ selector?: Record<string, string> }>} Service
 * @typedef {import("../metahook-hooks/index.js").Request<
 *   BlueGreenDeployment, { "ReplicaSet.apps/v1": ReplicaSet, "Service.v1": Service }>} BlueGreenRequest
 */

export const COLOR_LABEL = "js.examples.metahook.dev/color";
export const HASH_ANNOTATION = "js.examples.metahook.dev/template-hash";
const COLORS = ["blue", "green"];
const DEFAULT_PORTS = [{ name: "http", port: 80, targetPort: 80 }];

/**
 * A short digest of a Pod template, independent of key order.
 * @param {unknown} template
 */
export function templateHash(template) {
  return createHash("sha256").update(canonicalJson(template ?? {})).digest("hex").slice(0, 10);
}

/**
 * @param {unknown} value
 * @returns {string}
 */
function canonicalJson(value) {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const object = /** @type {Record<string, unknown>} */ (value);
    const keys = Object.keys(object).sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(object[k])}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

/** @param {string} color */
const otherColor = (color) => (color === "blue" ? "green" : "blue");
/** @param {ReplicaSet | undefined} rs */
const hashOf = (rs) => rs?.metadata?.annotations?.[HASH_ANNOTATION];

/**
 * The ReplicaSet controller has seen the latest spec and owns exactly `replicas` Pods, all Ready.
 * @param {ReplicaSet | undefined} rs
 * @param {number} replicas
 */
function settledAt(rs, replicas) {
  const status = rs?.status ?? {};
  return (
    rs !== undefined &&
    (status.observedGeneration ?? 0) >= (rs.metadata.generation ?? 0) &&
    rs.spec.replicas === replicas &&
    (status.replicas ?? 0) === replicas &&
    (status.readyReplicas ?? 0) === replicas
  );
}

/**
 * @param {BlueGreenRequest} request
 * @returns {import("../metahook-hooks/index.js").CompositeResponse}
 */
export function sync(request) {
  const bgd = parentOf(request);
  const { name } = bgd.metadata;
  const { replicas = 1, selector, template } = bgd.spec;
  const hash = templateHash(template);
  /** @type {Record<string, ReplicaSet | undefined>} */
  const observed = Object.fromEntries(
    COLORS.map((color) => [color, child(request, "ReplicaSet.apps/v1", `${name}-${color}`)]),
  );
  const service = child(request, "Service.v1", name);
  const selected = service?.spec?.selector?.[COLOR_LABEL];
  const active = selected !== undefined && COLORS.includes(selected) ? selected : "blue";
  const inactive = otherColor(active);

  /**
   * @param {string} color
   * @param {PodTemplate} podTemplate
   * @param {string | undefined} templateHashValue
   * @param {number} count
   * @returns {ReplicaSet}
   */
  const replicaSet = (color, podTemplate, templateHashValue, count) => ({
    apiVersion: "apps/v1",
    kind: "ReplicaSet",
    metadata: {
      name: `${name}-${color}`,
      labels: { ...selector.matchLabels, [COLOR_LABEL]: color },
      annotations: templateHashValue === undefined ? {} : { [HASH_ANNOTATION]: templateHashValue },
    },
    spec: {
      replicas: count,
      selector: { matchLabels: { ...selector.matchLabels, [COLOR_LABEL]: color } },
      template: {
        ...podTemplate,
        metadata: {
          ...podTemplate.metadata,
          labels: { ...podTemplate.metadata?.labels, ...selector.matchLabels, [COLOR_LABEL]: color },
        },
      },
    },
  });
  // A color that is not rolled out keeps its template (scaled to 0), so rolling back is a scale-up.
  /**
   * @param {string} color
   * @param {number} count
   * @returns {ReplicaSet[]}
   */
  const keep = (color, count) => {
    const rs = observed[color];
    return rs ? [replicaSet(color, rs.spec.template, hashOf(rs), count)] : [];
  };

  let phase;
  let serving = active;
  /** @type {KubeObject[]} */
  const children = [];
  const events = [];
  if (!observed[active] || hashOf(observed[active]) === hash) {
    phase = "Stable";
    children.push(replicaSet(active, template, hash, replicas));
    children.push(...keep(inactive, 0));
  } else {
    children.push(...keep(active, replicas));
    const next = observed[inactive];
    let count = replicas;
    if (next && !settledAt(next, 0) && (hashOf(next) !== hash || next.spec.replicas === 0)) {
      // It still has Pods of another template (changing a ReplicaSet's template does not replace
      // its Pods) or is scaling down: let them go first, so that every Pod it then starts is new.
      count = 0;
      phase = "Preparing";
    } else if (hashOf(next) === hash && settledAt(next, replicas)) {
      serving = inactive;
      phase = "Switching";
      events.push(event("Normal", "Switched", `Service ${name} now selects ${inactive} (template ${hash})`));
    } else {
      phase = "RollingOut";
    }
    children.push(replicaSet(inactive, template, hash, count));
  }
  children.push({
    apiVersion: "v1",
    kind: "Service",
    metadata: { name, labels: { ...selector.matchLabels } },
    spec: {
      selector: { ...selector.matchLabels, [COLOR_LABEL]: serving },
      ports: (bgd.spec.ports ?? DEFAULT_PORTS).map((port) => ({ protocol: "TCP", ...port })),
    },
  });

  /** @param {string} color */
  const colorStatus = (color) => {
    const rs = observed[color];
    if (!rs) return null;
    return {
      replicas: rs.status?.replicas ?? 0,
      readyReplicas: rs.status?.readyReplicas ?? 0,
      templateHash: hashOf(rs) ?? null,
    };
  };
  const status = {
    activeColor: serving,
    phase,
    templateHash: hash,
    readyReplicas: colorStatus(serving)?.readyReplicas ?? 0,
    blue: colorStatus("blue"),
    green: colorStatus("green"),
  };
  return compositeResponse({ children, status, events });
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  await serve({ "/sync": sync });
}
