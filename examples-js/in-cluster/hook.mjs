// greeter-js sync hook: every Greeting gets a ConfigMap with its message, and a Ready condition.
//
// This is the hook as it runs in the cluster (see README.md): its code is a ConfigMap on the stock
// node:20-slim image, the helper library a second ConfigMap mounted at ../metahook-hooks (so the import
// below is the same in the Pod and in this repository), and `serve()` does what a Pod needs: listens on
// $PORT, answers the probes on GET /healthz, logs one JSON line per call when METAHOOK_LOG_REQUESTS is
// set, and on SIGTERM lets the calls in flight finish before the process exits.

import { pathToFileURL } from "node:url";

import { childrenOf, compositeResponse, parentOf, serve, setCondition } from "../metahook-hooks/index.js";

/**
 * The types this hook reads: `tsc --strict` checks the hook against them (`make test`).
 * @typedef {import("../metahook-hooks/index.js").KubeObject & { data?: Record<string, string> }} ConfigMap
 * @typedef {import("../metahook-hooks/index.js").Resource<
 *   { who: string, greeting?: string },
 *   { message?: string, conditions?: import("../metahook-hooks/index.js").Condition[] }>} Greeting
 * @typedef {import("../metahook-hooks/index.js").Request<Greeting, { "ConfigMap.v1": ConfigMap }>} GreetingRequest
 */

/**
 * @param {GreetingRequest} request
 * @returns {Promise<import("../metahook-hooks/index.js").CompositeResponse>}
 */
export async function sync(request) {
  const greeting = parentOf(request);
  const { name, generation } = greeting.metadata;
  const message = `${greeting.spec.greeting ?? "Hello"}, ${greeting.spec.who}!`;
  /** @type {ConfigMap} */
  const configMap = {
    apiVersion: "v1",
    kind: "ConfigMap",
    metadata: { name: `${name}-greeting`, labels: { "js.examples.metahook.dev/greeting": name } },
    data: { message },
  };
  // Ready once the ConfigMap the cluster holds says the current message (the next sync sees it).
  const published = childrenOf(request, "ConfigMap.v1").some((cm) => cm.data?.message === message);
  const conditions = setCondition(greeting.status?.conditions, {
    type: "Ready",
    status: published,
    reason: published ? "Published" : "Publishing",
    message: published ? `ConfigMap ${name}-greeting holds the message` : "",
    observedGeneration: generation,
  });
  return compositeResponse({ children: [configMap], status: { message, conditions } });
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  await serve({ "/sync": sync });
}
