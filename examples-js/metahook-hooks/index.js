/**
 * metahook-hooks: write metahook (or Metacontroller) hooks as plain functions of JSON objects.
 *
 *   import { childrenOf, compositeResponse, serve } from "metahook-hooks";
 *   const sync = (request) => compositeResponse({ children: [], status: { pods: childrenOf(request, "Pod.v1").length } });
 *   await serve({ "/sync": sync });   // $PORT (default 8080), GET /healthz, drains on SIGTERM, $TLS_* for HTTPS
 *
 * No dependencies. Types are in index.d.ts; see README.md for the whole API.
 */

export {
  attachment,
  attachmentsOf,
  child,
  childrenOf,
  inputOf,
  objectKey,
  output,
  outputsOf,
  parentOf,
  related,
  relatedOf,
  typeKey,
} from "./src/objects.js";
export {
  compositeResponse,
  customizeResponse,
  decoratorResponse,
  event,
  mapFinalizeResponse,
  mapResponse,
  relatedRule,
  tombstoneResponse,
} from "./src/responses.js";
export {
  DEFAULT_PORT,
  DRAIN_SECONDS,
  HOOK_VERSION_ENV,
  HOOK_VERSION_HEADER,
  PermanentError,
  RetryLater,
  createHookServer,
  listenAddress,
  serve,
} from "./src/server.js";
export { conditionStatus, findCondition, setCondition } from "./src/conditions.js";
export { fixtureRequest, loadObjects, runHookOnFixtures } from "./src/fixtures.js";
export { requestLog } from "./src/log.js";
export { version } from "./src/version.js";
