// The cross-namespace-config hooks (v2): a MergedConfig merges ConfigMaps selected in another namespace,
// plus chosen labels of the Namespace it lives in, into one ConfigMap of the same name beside it.
//
//   /customize  asks for the source ConfigMaps (spec.source: namespace + label selector) and for the
//               MergedConfig's own Namespace, a cluster-scoped object
//   /sync       merges them; the status lists what was read, by the keys the hub used
//
// Both are `version: v2` hooks, so the related maps are keyed uniformly: `namespace/name` for the
// ConfigMaps (whatever namespace they are in) and `name` for the Namespace. The hook reads those keys on
// purpose here, to show them; `relatedOf` from metahook-hooks hides them when you don't care.
// Any change to a source ConfigMap or to the Namespace re-syncs the MergedConfig.
//
// No dependencies. Listens on $HOST:$PORT (default 0.0.0.0:8080).

import { pathToFileURL } from "node:url";

import { compositeResponse, customizeResponse, parentOf, relatedRule, serve } from "../metahook-hooks/index.js";

export const SOURCES_ANNOTATION = "js.examples.metahook.dev/sources";

/**
 * The types this hook reads: `tsc --strict` checks the hook against them (`make test`).
 * @typedef {import("../metahook-hooks/index.js").KubeObject} KubeObject
 * @typedef {import("../metahook-hooks/index.js").LabelSelector} LabelSelector
 * @typedef {import("../metahook-hooks/index.js").Resource<{
 *   source: { namespace: string, selector: LabelSelector }, namespaceLabels?: string[] }>} MergedConfig
 * @typedef {KubeObject & { data?: Record<string, string> }} ConfigMap
 * @typedef {import("../metahook-hooks/index.js").Request<
 *   MergedConfig, { "ConfigMap.v1": ConfigMap }, { "ConfigMap.v1": ConfigMap, "Namespace.v1": KubeObject }>} MergedConfigRequest
 */

/**
 * @param {import("../metahook-hooks/index.js").CustomizeRequest<MergedConfig>} request
 * @returns {import("../metahook-hooks/index.js").CustomizeResponse}
 */
export function customize(request) {
  const parent = parentOf(request);
  const { source } = parent.spec;
  return customizeResponse([
    relatedRule("v1", "configmaps", { namespace: source.namespace, labelSelector: source.selector }),
    relatedRule("v1", "namespaces", { names: [parent.metadata.namespace ?? ""] }),
  ]);
}

/**
 * @param {MergedConfigRequest} request
 * @returns {import("../metahook-hooks/index.js").CompositeResponse}
 */
export function sync(request) {
  const parent = parentOf(request);
  const { name, namespace = "" } = parent.metadata;
  // v2 keys: "shared-config/defaults", ...; sorted, so the merge order does not depend on the hub.
  const sources = Object.entries(request.related["ConfigMap.v1"] ?? {}).sort(([a], [b]) => (a < b ? -1 : 1));
  const namespaces = request.related["Namespace.v1"] ?? {};

  /** @type {Record<string, string>} */
  const data = {};
  /** @type {Record<string, string>} */
  const setBy = {};
  const conflicts = new Set();
  /**
   * @param {string} key
   * @param {string} value
   * @param {string} from
   */
  const put = (key, value, from) => {
    if (key in data && data[key] !== value) conflicts.add(key);
    data[key] = value;
    setBy[key] = from;
  };
  for (const [key, configMap] of sources) {
    for (const [k, v] of Object.entries(configMap.data ?? {})) put(k, v, key);
  }
  // A cluster-scoped related object: keyed by its bare name.
  const ownNamespace = namespaces[namespace];
  for (const label of parent.spec.namespaceLabels ?? []) {
    const value = ownNamespace?.metadata?.labels?.[label];
    if (value !== undefined) put(label, value, namespace);
  }

  const merged = {
    apiVersion: "v1",
    kind: "ConfigMap",
    metadata: { name, annotations: { [SOURCES_ANNOTATION]: sources.map(([key]) => key).join(",") } },
    data,
  };
  const status = {
    // What was read, by type and key, e.g. {"ConfigMap.v1": ["shared-config/defaults"], "Namespace.v1": ["team-a"]}.
    read: Object.fromEntries(
      Object.entries(request.related).map(([type, objects]) => [type, Object.keys(objects).sort()]),
    ),
    sourceCount: sources.length,
    keyCount: Object.keys(data).length,
    setBy,
    conflicts: [...conflicts].sort(),
  };
  return compositeResponse({ children: [merged], status });
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  await serve({ "/customize": customize, "/sync": sync });
}
