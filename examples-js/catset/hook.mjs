// The CatSet sync hook: a StatefulSet in ~60 lines. Pods `<name>-<i>` with stable hostnames under a
// headless Service, and a PersistentVolumeClaim per Pod that outlives it.
//
// Scaling up is ordered: Pod i is created only once Pods 0..i-1 are Ready (existing Pods are always kept,
// so the hub can replace them during a rollout). Rolling the Pod template one Pod at a time is not done
// here at all: the controller asks the hub for `RollingRecreate` with a Ready status check, and the hub
// keeps each Pod on its revision until its turn (the `Updated` condition in the status says where it is).
//
// No dependencies. Listens on $HOST:$PORT (default 0.0.0.0:8080).

import { pathToFileURL } from "node:url";

import { childrenOf, compositeResponse, parentOf, serve } from "../metahook-hooks/index.js";

/**
 * The types this hook reads: `tsc --strict` checks the hook against them (`make test`).
 * @typedef {import("../metahook-hooks/index.js").KubeObject} KubeObject
 * @typedef {{ metadata: { labels: Record<string, string>, annotations?: Record<string, string> }, spec: Record<string, unknown> }} PodTemplate
 * @typedef {import("../metahook-hooks/index.js").Resource<
 *   { replicas: number, template: PodTemplate, volumeSize?: string, mountClaims?: boolean }>} CatSet
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
 * @param {CatSetRequest} request
 * @returns {import("../metahook-hooks/index.js").CompositeResponse}
 */
export function sync(request) {
  const catset = parentOf(request);
  const { name } = catset.metadata;
  const { replicas, template, volumeSize = "1Gi", mountClaims = true } = catset.spec;
  const labels = template.metadata.labels;
  const observed = new Map(childrenOf(request, "Pod.v1").map((pod) => [pod.metadata.name, pod]));

  /** @type {KubeObject[]} */
  const pods = [];
  for (let i = 0; i < replicas; i++) {
    const podName = `${name}-${i}`;
    const lowerReady = pods.every((p) => isReady(observed.get(p.metadata.name)));
    if (!observed.has(podName) && !lowerReady) break; // ordered scale-up: wait for the Pods before it
    pods.push({
      apiVersion: "v1",
      kind: "Pod",
      metadata: { name: podName, labels, annotations: template.metadata.annotations ?? {} },
      spec: {
        ...template.spec,
        hostname: podName,
        subdomain: name,
        // A Pod mounting an unbound claim is not scheduled: clusters without a storage provisioner
        // (like the test cluster) set `mountClaims: false`.
        ...(mountClaims ? { volumes: [{ name: "data", persistentVolumeClaim: { claimName: `data-${podName}` } }] } : {}),
      },
    });
  }
  const claims = pods.map((pod) => ({
    apiVersion: "v1",
    kind: "PersistentVolumeClaim",
    metadata: { name: `data-${pod.metadata.name}`, labels },
    spec: { accessModes: ["ReadWriteOnce"], resources: { requests: { storage: volumeSize } } },
  }));
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
  });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  await serve({ "/sync": sync });
}
