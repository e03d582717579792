// The crd-roles hooks: a DecoratorController on CustomResourceDefinitions that gives each opted-in CRD a
// default ClusterRole, `<crd name>-reader`, allowed to get, list and watch its resources (and read their
// status subresource when the CRD has one).
//
//   /sync      the CRD is annotated roles.js.examples.metahook.dev/enabled: "true": desire the role
//   /finalize  the CRD is being deleted or no longer opted in: desire no role; done once it is gone
//
// The ClusterRole is an attachment: the hub creates it with the CRD as its controller owner, keeps it
// as desired (InPlace: a changed plural or group updates the rules), and deletes it when the hook stops
// listing it. Nothing is written on the CRD itself (no labels, no status): its status belongs to the
// API server.
//
// No dependencies. Listens on $HOST:$PORT (default 0.0.0.0:8080).

import { pathToFileURL } from "node:url";

import { attachmentsOf, decoratorResponse, parentOf, serve } from "../metahook-hooks/index.js";

const READ = ["get", "list", "watch"];

/**
 * The types this hook reads: `tsc --strict` checks the hook against them (`make test`).
 * @typedef {import("../metahook-hooks/index.js").Resource<{
 *   group: string, names: { plural: string }, versions?: { name: string, subresources?: { status?: object } }[] }>} CustomResourceDefinition
 * @typedef {import("../metahook-hooks/index.js").DecoratorRequest<
 *   CustomResourceDefinition, { "ClusterRole.rbac.authorization.k8s.io/v1": import("../metahook-hooks/index.js").KubeObject }>} CrdRequest
 * @typedef {import("../metahook-hooks/index.js").DecoratorResponse} DecoratorResponse
 */

/**
 * The reader ClusterRole for a CRD.
 * @param {CustomResourceDefinition} crd
 */
export function readerRole(crd) {
  const { group, names, versions = [] } = crd.spec;
  const resources = [names.plural];
  if (versions.some((v) => v.subresources?.status)) resources.push(`${names.plural}/status`);
  return {
    apiVersion: "rbac.authorization.k8s.io/v1",
    kind: "ClusterRole",
    metadata: {
      name: `${crd.metadata.name}-reader`,
      annotations: { "roles.js.examples.metahook.dev/for": crd.metadata.name },
    },
    rules: [{ apiGroups: [group], resources, verbs: READ }],
  };
}

/**
 * @param {CrdRequest} request
 * @returns {DecoratorResponse}
 */
export function sync(request) {
  return decoratorResponse({ attachments: [readerRole(parentOf(request))] });
}

/**
 * @param {CrdRequest} request
 * @returns {DecoratorResponse}
 */
export function finalize(request) {
  // Finished once the hub reports the role gone, not merely asked for: the next call (the deletion
  // of the attachment re-syncs its target) confirms it.
  const left = attachmentsOf(request, "ClusterRole.rbac.authorization.k8s.io/v1");
  return decoratorResponse({ attachments: [], finalized: left.length === 0 });
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  await serve({ "/sync": sync, "/finalize": finalize });
}
