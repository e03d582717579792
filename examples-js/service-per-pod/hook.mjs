// The service-per-pod hooks: two DecoratorControllers that give every Pod of a StatefulSet its own Service.
//
//   /sync-statefulset  for a StatefulSet annotated `<prefix>/label: <label>`: one Service `<set>-<ordinal>`
//                      per replica, selecting `<label>: <set>-<ordinal>`; ports from `<prefix>/ports`
//                      ("80:8080,443:8443") or else the template's container ports.
//   /sync-pod          for a Pod annotated `<prefix>/pod-name-label: <label>`: the label `<label>: <pod name>`.
//
// The Services are attachments of the StatefulSet: the hub owns them on its behalf, deletes the ones the
// hook no longer lists (scale down), and the garbage collector removes them with the StatefulSet.
//
// No dependencies. Listens on $HOST:$PORT (default 0.0.0.0:8080).

import { pathToFileURL } from "node:url";

import { decoratorResponse, event, parentOf, serve } from "../metahook-hooks/index.js";

const PREFIX = "service-per-pod.js.examples.metahook.dev";
export const LABEL_ANNOTATION = `${PREFIX}/label`;
export const PORTS_ANNOTATION = `${PREFIX}/ports`;
export const POD_LABEL_ANNOTATION = `${PREFIX}/pod-name-label`;

/**
 * The types these hooks read: `tsc --strict` checks them against these (`make test`).
 * @typedef {import("../metahook-hooks/index.js").KubeObject} KubeObject
 * @typedef {{ containerPort: number, protocol?: string }} ContainerPort
 * @typedef {import("../metahook-hooks/index.js").Resource<{
 *   replicas?: number,
 *   ordinals?: { start?: number },
 *   template: { metadata?: { annotations?: Record<string, string> }, spec?: { containers?: { ports?: ContainerPort[] }[] } },
 * }>} StatefulSet
 * @typedef {import("../metahook-hooks/index.js").DecoratorRequest<StatefulSet, { "Service.v1": KubeObject }>} StatefulSetRequest
 * @typedef {import("../metahook-hooks/index.js").DecoratorRequest} PodRequest
 * @typedef {import("../metahook-hooks/index.js").DecoratorResponse} DecoratorResponse
 */

/**
 * "80:8080,443" → Service ports; a port without ":" targets the same port number.
 * @param {string} text
 */
export function parsePorts(text) {
  return text
    .split(",")
    .map((part) => part.trim())
    .filter(Boolean)
    .map((part) => {
      const [port, target = port] = part.split(":").map((n) => Number(n.trim()));
      if (!Number.isInteger(port) || !Number.isInteger(target)) {
        throw new Error(`${PORTS_ANNOTATION}: "${part}" is not "port" or "port:targetPort"`);
      }
      return { name: `port-${port}`, port, targetPort: target, protocol: "TCP" };
    });
}

/** @param {StatefulSet} statefulSet */
function containerPorts(statefulSet) {
  const containers = statefulSet.spec.template.spec?.containers ?? [];
  return containers
    .flatMap((c) => c.ports ?? [])
    .map((p) => ({
      name: `port-${p.containerPort}`,
      port: p.containerPort,
      targetPort: p.containerPort,
      protocol: p.protocol ?? "TCP",
    }));
}

/**
 * @param {StatefulSetRequest} request
 * @returns {DecoratorResponse}
 */
export function syncStatefulSet(request) {
  const set = parentOf(request);
  const { name, annotations = {} } = set.metadata;
  const label = annotations[LABEL_ANNOTATION];
  const ports = annotations[PORTS_ANNOTATION] ? parsePorts(annotations[PORTS_ANNOTATION]) : containerPorts(set);
  const events = [];
  const podLabel = set.spec.template.metadata?.annotations?.[POD_LABEL_ANNOTATION];
  if (podLabel !== label) {
    // The Services would select nothing: say so where `kubectl describe statefulset` shows it.
    events.push(
      event(
        "Warning",
        "PodsNotLabelled",
        `the Pod template should carry the annotation ${POD_LABEL_ANNOTATION}: ${label} (it has ${podLabel ?? "none"})`,
      ),
    );
  }
  if (ports.length === 0) {
    events.push(event("Warning", "NoPorts", `no ${PORTS_ANNOTATION} annotation and no container ports: no Services`));
    return decoratorResponse({ attachments: [], events });
  }
  const replicas = set.spec.replicas ?? 1;
  const start = set.spec.ordinals?.start ?? 0;
  const services = Array.from({ length: replicas }, (_, i) => {
    const pod = `${name}-${start + i}`;
    return {
      apiVersion: "v1",
      kind: "Service",
      metadata: { name: pod, labels: { [label]: pod } },
      spec: { selector: { [label]: pod }, ports },
    };
  });
  // No status: a decorator's status replaces the target's, and the StatefulSet controller owns that one.
  return decoratorResponse({ attachments: services, events });
}

/**
 * @param {PodRequest} request
 * @returns {DecoratorResponse}
 */
export function syncPod(request) {
  const pod = parentOf(request);
  const label = pod.metadata.annotations?.[POD_LABEL_ANNOTATION];
  return decoratorResponse(label ? { labels: { [label]: pod.metadata.name } } : {});
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  await serve({ "/sync-statefulset": syncStatefulSet, "/sync-pod": syncPod });
}
