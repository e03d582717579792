// memo-js sync hook, served over mutual TLS: every Memo gets a ConfigMap holding its text under the
// key it names.
//
// The hub calls this hook at an https:// URL, checks the hook's certificate against the controller's
// `caBundle` and presents the client certificate of its `clientTLS` (see controller.yaml, README.md).
// `serve()` takes its side of that from the environment:
//   TLS_CERT_FILE, TLS_KEY_FILE   the hook's certificate and key (HTTPS);
//   TLS_CLIENT_CA_FILE            the CA whose certificates clients must present (mutual TLS);
//   PORT, HOST                    where to listen (default 0.0.0.0:8080).
// When the files change (a renewed Secret), new connections get the new certificate. Without
// TLS_CERT_FILE the hook serves plain HTTP, which is what `metahook render --hook-cmd` speaks.
//
// The hook also shows the two ways a hook tells the parent's author something: `ctx.log.warn` for an
// odd but workable spec (the sync succeeds, and the warning becomes an Event on the Memo), and
// `PermanentError` for a spec it cannot act on (the hub reports it once instead of retrying).

import { pathToFileURL } from "node:url";

import { PermanentError, childrenOf, compositeResponse, parentOf, serve, setCondition } from "../metahook-hooks/index.js";

/**
 * @typedef {import("../metahook-hooks/index.js").KubeObject & { data?: Record<string, string> }} ConfigMap
 * @typedef {import("../metahook-hooks/index.js").Resource<
 *   { text: string, key?: string },
 *   { configMap?: string, key?: string, bytes?: number, conditions?: import("../metahook-hooks/index.js").Condition[] }>} Memo
 * @typedef {import("../metahook-hooks/index.js").Request<Memo, { "ConfigMap.v1": ConfigMap }>} MemoRequest
 */

const DEFAULT_KEY = "memo.txt";
/** What the API server accepts as a ConfigMap key (apimachinery's IsConfigMapKey). */
const CONFIG_MAP_KEY = /^[-._a-zA-Z0-9]{1,253}$/;

/**
 * `spec.key`, checked here rather than in the CRD's schema so that the example shows a PermanentError:
 * no later call can succeed until someone edits the Memo.
 * @param {string} key
 */
function checkedKey(key) {
  if (!CONFIG_MAP_KEY.test(key) || key === "." || key.startsWith("..")) {
    throw new PermanentError(
      `spec.key must be a ConfigMap key (1-253 letters, digits, "-", "_" or ".", not "." or starting with ".."), not ${JSON.stringify(key)}`,
    );
  }
  return key;
}

/**
 * @param {MemoRequest} request
 * @param {import("../metahook-hooks/index.js").HookContext} ctx
 * @returns {import("../metahook-hooks/index.js").CompositeResponse}
 */
export function sync(request, ctx) {
  const memo = parentOf(request);
  const { name, generation } = memo.metadata;
  const key = checkedKey(memo.spec.key ?? DEFAULT_KEY);
  const text = memo.spec.text;
  if (text.trim() === "") ctx.log.warn("spec.text is empty: the ConfigMap holds an empty memo", "EmptyMemo");
  /** @type {ConfigMap} */
  const configMap = {
    apiVersion: "v1",
    kind: "ConfigMap",
    metadata: { name: `${name}-memo`, labels: { "js.examples.metahook.dev/memo": name } },
    data: { [key]: text },
  };
  // Ready once the ConfigMap the cluster holds says the current text (the next sync sees it).
  const stored = childrenOf(request, "ConfigMap.v1").some((cm) => cm.data?.[key] === text);
  const conditions = setCondition(memo.status?.conditions, {
    type: "Ready",
    status: stored,
    reason: stored ? "Stored" : "Storing",
    message: stored ? `ConfigMap ${name}-memo holds the memo under ${key}` : "",
    observedGeneration: generation,
  });
  const status = { configMap: `${name}-memo`, key, bytes: Buffer.byteLength(text), conditions };
  return compositeResponse({ children: [configMap], status });
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  await serve({ "/sync": sync });
}
