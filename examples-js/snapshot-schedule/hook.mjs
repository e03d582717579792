// The snapshot-schedule hooks (MapController): a SnapshotSchedule keeps a snapshot record for every
// PersistentVolumeClaim its selector picks, a ConfigMap standing in for the VolumeSnapshots a real one makes.
//
//   /map        once per selected claim: that claim's record, `<claim>-snapshots` in the schedule's
//               namespace, saying which claim (name and UID), what it asks for, and the schedule
//   /tombstone  for the records of a claim that is gone (deleted, or no longer selected): keeps those
//               younger than `spec.retainDetachedSeconds`, and asks to be called again when the first
//               of them is due to go
//
// The map answer depends only on the schedule and the claim, never on the clock: an answer that changed
// at every call would rewrite the record at every call. Time enters through the tombstone answer's
// `resyncAfterSeconds` instead. The hub tags every record with its claim's UID (the `metahook.dev/map-key`
// label), owns it by the schedule, and writes the schedule's status (claims and records counted).
//
// No dependencies. Listens on $HOST:$PORT (default 0.0.0.0:8080).

import { pathToFileURL } from "node:url";

import { inputOf, mapResponse, outputsOf, parentOf, serve, tombstoneResponse } from "../metahook-hooks/index.js";

/** The annotation naming, on a record, the claim it is for (a name may be too long for a label value). */
export const CLAIM_ANNOTATION = "js.examples.metahook.dev/claim";
/** The annotation naming the schedule a record belongs to. */
export const SCHEDULE_ANNOTATION = "js.examples.metahook.dev/snapshot-schedule";
const DAY = 86400;

/**
 * The types this hook reads: `tsc --strict` checks the hook against them (`make test`).
 * @typedef {import("../metahook-hooks/index.js").Resource<{
 *   selector?: import("../metahook-hooks/index.js").LabelSelector,
 *   intervalSeconds?: number, retainDetachedSeconds?: number }>} SnapshotSchedule
 * @typedef {import("../metahook-hooks/index.js").Resource<{
 *   storageClassName?: string, accessModes?: string[], resources?: { requests?: { storage?: string } } },
 *   { phase?: string }>} Claim
 * @typedef {import("../metahook-hooks/index.js").KubeObject & { data?: Record<string, string> }} ConfigMap
 * @typedef {{ "ConfigMap.v1": ConfigMap }} Outputs
 */

/**
 * One claim's snapshot record.
 * @param {import("../metahook-hooks/index.js").MapRequest<SnapshotSchedule, Claim, Outputs>} request
 * @returns {import("../metahook-hooks/index.js").MapResponse}
 */
export function map(request) {
  const schedule = parentOf(request);
  const claim = inputOf(request);
  const { name, uid = "" } = claim.metadata;
  const record = {
    apiVersion: "v1",
    kind: "ConfigMap",
    metadata: {
      name: `${name}-snapshots`,
      namespace: schedule.metadata.namespace,
      annotations: { [CLAIM_ANNOTATION]: name, [SCHEDULE_ANNOTATION]: schedule.metadata.name },
    },
    data: {
      claim: name,
      // The UID tells this claim from one deleted and made again under the same name (a new input).
      claimUID: uid,
      storageClassName: claim.spec.storageClassName ?? "",
      requestedStorage: claim.spec.resources?.requests?.storage ?? "",
      intervalSeconds: String(schedule.spec.intervalSeconds ?? DAY),
    },
  };
  return mapResponse({ outputs: [record] });
}

/**
 * The records of a claim that is gone: keep those younger than `spec.retainDetachedSeconds` (counted from
 * when each was made, its `creationTimestamp`), and be asked again when the first kept one is due to go.
 * @param {import("../metahook-hooks/index.js").TombstoneRequest<SnapshotSchedule, Outputs>} request
 * @returns {import("../metahook-hooks/index.js").TombstoneResponse}
 */
export function tombstone(request) {
  const retain = parentOf(request).spec.retainDetachedSeconds ?? 0;
  const now = Date.now();
  /** @type {ConfigMap[]} */
  const keep = [];
  let due = Infinity;
  for (const record of outputsOf(request, "ConfigMap.v1")) {
    const taken = Date.parse(String(record.metadata.creationTimestamp ?? ""));
    // A record without a readable creation time is kept: deleting is the step that cannot be undone.
    const left = Number.isNaN(taken) ? retain : retain - (now - taken) / 1000;
    if (left > 0) {
      keep.push(record);
      due = Math.min(due, left);
    }
  }
  // One second late rather than early: asked too early, the record would only be kept again.
  return tombstoneResponse({ keep, resyncAfterSeconds: keep.length ? Math.ceil(due) + 1 : undefined });
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  await serve({ "/map": map, "/tombstone": tombstone });
}
