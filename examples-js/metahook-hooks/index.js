/**
 * metahook-hooks: write metahook (or Metacontroller) hooks as plain functions of JSON objects.
 *
 *   import { childrenOf, compositeResponse, serve } from "metahook-hooks";
 *   const sync = (request) => compositeResponse({ children: [], status: { pods: childrenOf(request, "Pod.v1").length } });
 *   await serve({ "/sync": sync }, { port: 8080 });
 *
 * No dependencies. Types are in index.d.ts; see README.md for the whole API.
 */

export {
  attachment,
  attachmentsOf,
  child,
  childrenOf,
  objectKey,
  parentOf,
  related,
  relatedOf,
  typeKey,
} from "./src/objects.js";
export { compositeResponse, customizeResponse, decoratorResponse, event, relatedRule } from "./src/responses.js";
export { RetryLater, createHookServer, serve } from "./src/server.js";
export { fixtureRequest, loadObjects, runHookOnFixtures } from "./src/fixtures.js";
