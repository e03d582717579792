// The CatSet sync and finalize hook: a StatefulSet in one function. Pods `<name>-<i>` with stable hostnames
// under a headless Service, and for each of `spec.volumeClaimTemplates` a PersistentVolumeClaim per Pod
// (`<claim>-<name>-<i>`, mounted as the volume `<claim>`) that outlives the Pod.
//
// Scaling is ordered, as a StatefulSet's: Pod i is created only once Pods 0..i-1 are Ready, and Pods above
// `replicas` go one at a time, highest first, once the ones below are all Ready. Existing Pods are always
// kept, so the hub can replace them during a rollout. Rolling the Pod template one Pod at a time is not
// done here at all: the controller asks the hub for `RollingRecreate` with a Ready status check, and the
// hub keeps each Pod on its revision until its turn (the `Updated` condition in the status says where).
//
// Deleting a CatSet calls the same function as its finalize hook (`request.finalizing`): it scales to zero
// the same ordered way and reports `finalized` once no Pod is left, so Pods never vanish all at once. Claims
// are kept on scale-down (scaling up again finds the same data) and go with the CatSet (ownerReferences).
//
// No dependencies. Listens on $HOST:$PORT (default 0.0.0.0:8080).

import { pathToFileURL } from "node:url";

import { childrenOf, compositeResponse, parentOf, serve } from "../metahook-hooks/index.js";

/**
 * The types this hook reads: `tsc --strict` checks the hook against them (`make test`).
 * @typedef {import("../metahook-hooks/index.js").KubeObject} KubeObject
 * @typedef {{ metadata: { labels: Record<string, string>, annotations?: Record<string, string> },
 *   spec: { volumes?: object[], [key: string]: unknown } }} PodTemplate
 * @typedef {{ metadata: { name: string, labels?: Record<string, string> }, spec: object }} ClaimTemplate
 * @typedef {import("../metahook-hooks/index.js").Resource<
 *   { replicas: number, template: PodTemplate, volumeClaimTemplates?: ClaimTemplate[] }>} CatSet
 * @typedef {import("../metahook-hooks/index.js").Resource<
 *   Record<string, unknown>, { phase?: string, conditions?: { type: string, status: string }[] }>} Pod
 * @typedef {import("../metahook-hooks/index.js").Request<
 *   CatSet, { "Pod.v1": Pod, "PersistentVolumeClaim.v1": KubeObject, "Service.v1": KubeObject }>} CatSetRequest
 */

/** @param {Pod | undefined} pod */
const isReady = (pod) =>
  pod !== undefined &&
  !pod.metadata.deletionTimestamp &&
  (pod.status?.conditions ?? []).some((c) => c.type === "Ready" && c.status === "True");

/**
 * The ordinal `i` of an object named `<base>-<i>`, or undefined for any other name.
 * @param {string} base
 * @param {string} name
 */
function ordinalOf(base, name) {
  const match = /^(.*)-(\d+)$/.exec(name);
  return match && match[1] === base ? Number(match[2]) : undefined;
}

/**
 * @param {CatSetRequest} request
 * @returns {import("../metahook-hooks/index.js").CompositeResponse}
 */
export function sync(request) {
  const catset = parentOf(request);
  const { name } = catset.metadata;
  const { template, volumeClaimTemplates = [] } = catset.spec;
  const replicas = request.finalizing ? 0 : catset.spec.replicas;
  const labels = template.metadata.labels;

  /** @type {Map<number, Pod>} */
  const observed = new Map();
  for (const pod of childrenOf(request, "Pod.v1")) {
    const ordinal = ordinalOf(name, pod.metadata.name);
    if (ordinal !== undefined) observed.set(ordinal, pod);
  }
  // Pods 0..lowerReady-1 are all Ready: the next one may be created, or the highest extra one removed.
  let lowerReady = 0;
  while (lowerReady < replicas && isReady(observed.get(lowerReady))) lowerReady++;
  const ordinals = new Set(observed.keys());
  const extra = [...ordinals].filter((i) => i >= replicas);
  if (lowerReady < replicas) ordinals.add(lowerReady);
  else if (extra.length) ordinals.delete(Math.max(...extra));

  const pods = [...ordinals].sort((a, b) => a - b).map((i) => {
    const podName = `${name}-${i}`;
    const claims = volumeClaimTemplates.map((claim) => ({
      name: claim.metadata.name,
      persistentVolumeClaim: { claimName: `${claim.metadata.name}-${podName}` },
    }));
    return {
      apiVersion: "v1",
      kind: "Pod",
      metadata: { name: podName, labels, annotations: template.metadata.annotations ?? {} },
      spec: {
        ...template.spec,
        hostname: podName,
        subdomain: name,
        ...(claims.length ? { volumes: [...(template.spec.volumes ?? []), ...claims] } : {}),
      },
    };
  });

  // A claim for every ordinal below `replicas`, and every one already made (kept after scale-down).
  const claimNames = new Set(childrenOf(request, "PersistentVolumeClaim.v1").map((c) => c.metadata.name));
  const claims = volumeClaimTemplates.flatMap((claim) => {
    const base = `${claim.metadata.name}-${name}`;
    const wanted = Array.from({ length: replicas }, (_, i) => `${base}-${i}`);
    const kept = [...claimNames].filter((n) => ordinalOf(base, n) !== undefined && !wanted.includes(n));
    return [...wanted, ...kept].map((claimName) => ({
      apiVersion: "v1",
      kind: "PersistentVolumeClaim",
      metadata: { name: claimName, labels: { ...claim.metadata.labels, ...labels } },
      spec: claim.spec,
    }));
  });
  const service = {
    apiVersion: "v1",
    kind: "Service",
    metadata: { name, labels },
    spec: { clusterIP: "None", selector: labels, ports: [{ port: 80, name: "web" }] },
  };
  const ready = [...observed.values()].filter(isReady).length;
  return compositeResponse({
    children: [...pods, ...claims, service],
    status: { replicas: observed.size, readyReplicas: ready },
    finalized: request.finalizing && observed.size === 0,
  });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  await serve({ "/sync": sync, "/finalize": sync });
}
