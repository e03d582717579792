// Builders emit the wire field names, only the fields given, and refuse what the hub would.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  compositeResponse,
  customizeResponse,
  decoratorResponse,
  event,
  mapFinalizeResponse,
  mapResponse,
  relatedRule,
  tombstoneResponse,
} from "../index.js";

const POD = { apiVersion: "v1", kind: "Pod", metadata: { name: "a" } };

test("compositeResponse uses wire names", () => {
  const response = compositeResponse({
    children: [POD],
    status: { ready: 1 },
    resyncAfterSeconds: 2.5,
    finalized: true,
    events: [event("Warning", "Slow", "took long")],
  });
  assert.deepEqual(response, {
    children: [POD],
    status: { ready: 1 },
    resyncAfterSeconds: 2.5,
    finalized: true,
    events: [{ type: "Warning", reason: "Slow", message: "took long" }],
  });
});

test("compositeResponse omits what was not given", () => {
  // No `events` key unless there are events: Metacontroller's strict v2 mode rejects unknown fields.
  assert.deepEqual(compositeResponse({ children: [] }), { children: [] });
  assert.deepEqual(compositeResponse({ children: new Set([POD]), status: null }), { children: [POD] });
});

test("compositeResponse requires children", () => {
  assert.throws(() => compositeResponse({ status: {} }), /needs `children`/);
});

test("children are checked for identity", () => {
  assert.throws(
    () => compositeResponse({ children: [POD, { apiVersion: "v1", kind: "Pod", metadata: {} }] }),
    /children\[1\] has no metadata\.name/,
  );
  assert.throws(() => compositeResponse({ children: [{ metadata: { name: "a" } }] }), /children\[0\] has no apiVersion, kind/);
  assert.throws(() => compositeResponse({ children: [["a"]] }), /children\[0\] is an array/);
});

test("a negative or non-numeric resync is refused", () => {
  assert.throws(() => compositeResponse({ children: [], resyncAfterSeconds: -1 }), RangeError);
  assert.throws(() => compositeResponse({ children: [], resyncAfterSeconds: "5" }), RangeError);
});

test("decoratorResponse merges labels and deletes with null", () => {
  const response = decoratorResponse({ labels: { team: "a", old: null }, annotations: { note: "x" } });
  assert.deepEqual(response, { attachments: [], labels: { team: "a", old: null }, annotations: { note: "x" } });
  assert.deepEqual(decoratorResponse(), { attachments: [] });
});

test("decoratorResponse refuses non-string label values", () => {
  assert.throws(() => decoratorResponse({ labels: { replicas: 3 } }), /labels values must be strings.*replicas/);
});

test("decoratorResponse carries status, attachments and events", () => {
  const response = decoratorResponse({ status: { ok: true }, attachments: [POD], events: [event("Normal", "Decorated")] });
  assert.deepEqual(response, {
    attachments: [POD],
    status: { ok: true },
    events: [{ type: "Normal", reason: "Decorated", message: "" }],
  });
});

test("event types are Normal or Warning", () => {
  assert.throws(() => event("Error", "Boom"), /"Error"/);
  assert.throws(() => event("Normal", ""), /reason/);
});

test("hand-written events are checked too", () => {
  assert.throws(
    () => compositeResponse({ children: [], events: [{ type: "Info", reason: "X", message: "" }] }),
    /events\[0\]/,
  );
});

test("customizeResponse lists related rules", () => {
  const rule = relatedRule("v1", "configmaps", { labelSelector: { matchLabels: { app: "x" } }, namespace: "default" });
  assert.deepEqual(customizeResponse([rule, relatedRule("v1", "secrets", { names: ["a", "b"] })]), {
    relatedResources: [
      { apiVersion: "v1", resource: "configmaps", labelSelector: { matchLabels: { app: "x" } }, namespace: "default" },
      { apiVersion: "v1", resource: "secrets", names: ["a", "b"] },
    ],
  });
  assert.deepEqual(customizeResponse(), { relatedResources: [] });
});

test("relatedRule refuses combinations the hub refuses", () => {
  assert.throws(() => relatedRule("v1", "secrets", { names: ["a"], labelSelector: {} }), /names cannot be combined/);
  assert.throws(() => relatedRule("v1", "secrets", { namespace: "a", namespaceSelector: {} }), /namespace cannot be combined/);
});

const CM = {
  apiVersion: "v1",
  kind: "ConfigMap",
  metadata: { name: "data-snapshots", namespace: "default", uid: "u1", labels: { "metahook.dev/map-key": "k" } },
  data: { claim: "data" },
};

test("mapResponse uses wire names and omits what was not given", () => {
  assert.deepEqual(mapResponse({ outputs: [CM] }), { outputs: [CM] });
  assert.deepEqual(mapResponse({ outputs: new Set(), resyncAfterSeconds: 60, events: [event("Normal", "Planned", "1 snapshot")] }), {
    outputs: [],
    resyncAfterSeconds: 60,
    events: [{ type: "Normal", reason: "Planned", message: "1 snapshot" }],
  });
});

test("mapResponse requires outputs: the whole desired set for the input", () => {
  assert.throws(() => mapResponse(), /needs `outputs`/);
  assert.throws(() => mapResponse({ resyncAfterSeconds: 5 }), {
    name: "TypeError",
    message: /mapResponse needs `outputs`: the whole desired set for this input/,
  });
});

test("mapResponse checks outputs, resync and events", () => {
  assert.throws(() => mapResponse({ outputs: [CM, { apiVersion: "v1", metadata: { name: "x" } }] }), /outputs\[1\] has no kind/);
  assert.throws(() => mapResponse({ outputs: [null] }), /outputs\[0\] is null/);
  assert.throws(() => mapResponse({ outputs: [], resyncAfterSeconds: -1 }), RangeError);
  assert.throws(() => mapResponse({ outputs: [], events: [{ type: "Info", reason: "X" }] }), /events\[0\]/);
});

test("tombstoneResponse lists references to keep, and nothing else", () => {
  assert.deepEqual(tombstoneResponse({ keep: [CM] }), {
    outputs: [{ apiVersion: "v1", kind: "ConfigMap", metadata: { name: "data-snapshots", namespace: "default" } }],
  });
  const clusterScoped = { apiVersion: "v1", kind: "Namespace", metadata: { name: "kept" } };
  assert.deepEqual(tombstoneResponse({ keep: [clusterScoped], resyncAfterSeconds: 30 }), {
    outputs: [{ apiVersion: "v1", kind: "Namespace", metadata: { name: "kept" } }],
    resyncAfterSeconds: 30,
  });
  assert.deepEqual(tombstoneResponse(), { outputs: [] }, "keep nothing: every detached output is deleted");
  assert.deepEqual(tombstoneResponse({}), { outputs: [] });
});

test("tombstoneResponse refuses what the hub could not match", () => {
  assert.throws(() => tombstoneResponse({ keep: [{ apiVersion: "v1", kind: "ConfigMap", metadata: {} }] }), /keep\[0\] has no metadata\.name/);
  assert.throws(() => tombstoneResponse({ keep: ["data-snapshots"] }), /keep\[0\] is string, not an object/);
  assert.throws(() => tombstoneResponse({ keep: [], resyncAfterSeconds: "soon" }), RangeError);
});

test("mapFinalizeResponse emits only the fields given, finalized only when true", () => {
  assert.deepEqual(mapFinalizeResponse({ finalized: true }), { finalized: true });
  assert.deepEqual(mapFinalizeResponse({ finalized: false }), {});
  assert.deepEqual(mapFinalizeResponse(), {});
  assert.deepEqual(mapFinalizeResponse({ resyncAfterSeconds: 10, events: [event("Warning", "Waiting", "2 snapshots busy")] }), {
    resyncAfterSeconds: 10,
    events: [{ type: "Warning", reason: "Waiting", message: "2 snapshots busy" }],
  });
  assert.throws(() => mapFinalizeResponse({ resyncAfterSeconds: -5 }), RangeError);
});
