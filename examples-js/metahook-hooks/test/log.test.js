// The per-call logger: `ctx.log` and `requestLog()` print lines naming the parent and the path, and
// warnings also become Warning events in the response, which the hub records on the parent.
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { after, before, test } from "node:test";

import {
  compositeResponse,
  customizeResponse,
  event,
  inputOf,
  mapFinalizeResponse,
  mapResponse,
  outputsOf,
  requestLog,
  serve,
  tombstoneResponse,
} from "../index.js";

const lines = [];
const seen = {};
const ROUTES = {
  "/sync": (request, ctx) => {
    ctx.log.info(`syncing ${request.parent.spec.size} items`);
    if (request.parent.spec.size > 10) ctx.log.warn(`size ${request.parent.spec.size} is more than 10; using 10`, "SizeCapped");
    ctx.log.warn("no owner given");
    return compositeResponse({ children: [], events: [event("Normal", "Synced", "ok")] });
  },
  "/plain": (request, ctx) => {
    ctx.log.warn("first warning");
    return { children: [] }; // no events of its own
  },
  "/deep": async (request, ctx) => {
    await sleep(request.parent.spec.delay);
    helper(request.parent.metadata.name);
    seen[request.parent.metadata.name] = requestLog() === ctx.log;
    return { children: [] };
  },
  "/long": (request, ctx) => {
    ctx.log.warn(`${"é".repeat(1030)}\nend`);
    return { children: [] };
  },
  "/customize": (request, ctx) => {
    ctx.log.warn("customize has no events field");
    return customizeResponse([]);
  },
  "/decorate": (request, ctx) => {
    ctx.log.warn("decorator target");
    return { labels: {} };
  },
  "/map": (request, ctx) => {
    ctx.log.warn(`claim ${inputOf(request).metadata.name} is not bound yet`, "NotBound");
    return mapResponse({ outputs: [], events: [event("Normal", "Mapped", "ok")] });
  },
  "/tombstone": (request, ctx) => {
    ctx.log.warn("keeping a detached output");
    return tombstoneResponse({ keep: outputsOf(request, "ConfigMap.v1") });
  },
  "/map-finalize": () => {
    requestLog().warn("finalizing");
    return mapFinalizeResponse({ finalized: true });
  },
  "/failing": (request, ctx) => {
    ctx.log.warn("about to fail");
    throw new Error("boom");
  },
};
const SHARED = compositeResponse({ children: [], events: [event("Normal", "Shared", "kept as is")] });
ROUTES["/shared"] = (request, ctx) => {
  ctx.log.warn("added to a copy");
  return SHARED;
};

/** Code that was not handed `ctx`, as in a helper module. */
function helper(name) {
  requestLog().warn(`helper ran for ${name}`);
}

let server;
before(async () => {
  server = await serve(ROUTES, { port: 0, host: "127.0.0.1", quiet: true, log: (line) => lines.push(line) });
});
after(() => new Promise((resolve) => server.close(resolve)));

function parent(name, spec = {}, namespace = "ns") {
  return { apiVersion: "x/v1", kind: "Thing", metadata: { name, namespace }, spec };
}

async function call(path, body) {
  const response = await fetch(`http://127.0.0.1:${server.address().port}${path}`, { method: "POST", body: JSON.stringify(body) });
  const text = await response.text();
  return { status: response.status, body: response.status === 200 ? JSON.parse(text) : text };
}

test("warnings are added after the handler's own events, with the default or the given reason", async () => {
  const { status, body } = await call("/sync", { parent: parent("big", { size: 12 }), children: {}, finalizing: false });
  assert.equal(status, 200);
  assert.deepEqual(body.events, [
    { type: "Normal", reason: "Synced", message: "ok" },
    { type: "Warning", reason: "SizeCapped", message: "size 12 is more than 10; using 10" },
    { type: "Warning", reason: "HookWarning", message: "no owner given" },
  ]);
});

test("info and warn print one line naming the path and the parent", async () => {
  lines.length = 0;
  await call("/sync", { parent: parent("big", { size: 12 }), children: {}, finalizing: false });
  assert.deepEqual(lines, [
    "hook /sync ns/big: syncing 12 items",
    "hook /sync ns/big: warning SizeCapped: size 12 is more than 10; using 10",
    "hook /sync ns/big: warning HookWarning: no owner given",
  ]);
});

test("the events array is created when the response has none", async () => {
  const { body } = await call("/plain", { parent: parent("p"), children: {}, finalizing: false });
  assert.deepEqual(body, { children: [], events: [{ type: "Warning", reason: "HookWarning", message: "first warning" }] });
});

test("the handler's response object is not changed", async () => {
  const { body } = await call("/shared", { parent: parent("p"), children: {}, finalizing: false });
  assert.equal(body.events.length, 2);
  assert.deepEqual(SHARED.events, [{ type: "Normal", reason: "Shared", message: "kept as is" }]);
});

test("requestLog() is the call's own logger, also across awaits of concurrent calls", async () => {
  // "slow" starts first and finishes last: each call's warning must land in its own response.
  const [slow, fast] = await Promise.all([
    call("/deep", { parent: parent("slow", { delay: 50 }), children: {}, finalizing: false }),
    call("/deep", { parent: parent("fast", { delay: 0 }), children: {}, finalizing: false }),
  ]);
  assert.deepEqual(slow.body.events, [{ type: "Warning", reason: "HookWarning", message: "helper ran for slow" }]);
  assert.deepEqual(fast.body.events, [{ type: "Warning", reason: "HookWarning", message: "helper ran for fast" }]);
  assert.deepEqual(seen, { slow: true, fast: true });
});

test("requestLog() outside a call only prints, to stderr", (t) => {
  const written = [];
  t.mock.method(process.stderr, "write", (chunk) => written.push(String(chunk)) > 0);
  const log = requestLog();
  log.info("starting");
  log.warn("no config file", "NoConfig");
  t.mock.restoreAll();
  assert.deepEqual(written, ["hook: starting\n", "hook: warning NoConfig: no config file\n"]);
});

test("messages over 1024 characters are cut, and printed on one line", async () => {
  lines.length = 0;
  const { body } = await call("/long", { parent: parent("p"), children: {}, finalizing: false });
  const [warning] = body.events;
  assert.equal(Array.from(warning.message).length, 1024);
  assert.ok(warning.message.startsWith("é".repeat(1023)) && warning.message.endsWith("…"));
  assert.equal(lines.length, 1);
  assert.equal(lines[0], `hook /long ns/p: warning HookWarning: ${warning.message}`);
});

test("a multi-line message is one printed line, and whole in the event", async () => {
  const short = { "/two-lines": (request, ctx) => (ctx.log.warn("line one\nline two"), { children: [] }) };
  const printed = [];
  const local = await serve(short, { port: 0, host: "127.0.0.1", quiet: true, handleSignals: false, log: (l) => printed.push(l) });
  try {
    const url = `http://127.0.0.1:${local.address().port}/two-lines`;
    const response = await fetch(url, { method: "POST", body: JSON.stringify({ parent: parent("p", {}, ""), children: {}, finalizing: false }) });
    assert.equal((await response.json()).events[0].message, "line one\nline two");
    assert.deepEqual(printed, ["hook /two-lines p: warning HookWarning: line one\\nline two"]);
  } finally {
    await new Promise((resolve) => local.close(resolve));
  }
});

test("customize answers get no events (the hub would refuse the field); the warning is printed", async () => {
  lines.length = 0;
  const { body } = await call("/customize", { controller: {}, parent: parent("p") });
  assert.deepEqual(body, { relatedResources: [] });
  assert.deepEqual(lines, ["hook /customize ns/p: warning HookWarning: customize has no events field"]);
});

test("a decorator call names its target and gets the warning as an event", async () => {
  lines.length = 0;
  const { body } = await call("/decorate", { controller: {}, object: parent("target"), attachments: {}, finalizing: false });
  assert.deepEqual(body.events, [{ type: "Warning", reason: "HookWarning", message: "decorator target" }]);
  assert.deepEqual(lines, ["hook /decorate ns/target: warning HookWarning: decorator target"]);
});

test("a failing call still prints its warnings", async (t) => {
  t.mock.method(console, "error", () => {});
  lines.length = 0;
  const { status } = await call("/failing", { parent: parent("p"), children: {}, finalizing: false });
  assert.equal(status, 500);
  assert.equal(lines[0], "hook /failing ns/p: warning HookWarning: about to fail");
});

test("a map call gets its warnings as events, after its own", async () => {
  lines.length = 0;
  const input = { apiVersion: "v1", kind: "PersistentVolumeClaim", metadata: { name: "data", namespace: "ns" } };
  const { body } = await call("/map", { controller: {}, parent: parent("nightly"), mapKey: "uid-1", input, outputs: {} });
  assert.deepEqual(body, {
    outputs: [],
    events: [
      { type: "Normal", reason: "Mapped", message: "ok" },
      { type: "Warning", reason: "NotBound", message: "claim data is not bound yet" },
    ],
  });
  assert.deepEqual(lines, ["hook /map ns/nightly: warning NotBound: claim data is not bound yet"]);
});

test("tombstone answers get no events (they have no such field); the warning is printed", async () => {
  lines.length = 0;
  const kept = { apiVersion: "v1", kind: "ConfigMap", metadata: { name: "gone-snapshots", namespace: "ns", uid: "u" } };
  const request = { controller: {}, parent: parent("nightly"), mapKey: "uid-2", outputs: { "ConfigMap.v1": { "ns/gone-snapshots": kept } } };
  const { status, body } = await call("/tombstone", request);
  assert.equal(status, 200);
  assert.deepEqual(body, { outputs: [{ apiVersion: "v1", kind: "ConfigMap", metadata: { name: "gone-snapshots", namespace: "ns" } }] });
  assert.deepEqual(lines, ["hook /tombstone ns/nightly: warning HookWarning: keeping a detached output"]);
});

test("a MapController finalize call gets its warnings as events", async () => {
  const { body } = await call("/map-finalize", { controller: {}, parent: parent("nightly"), outputs: {}, finalizing: true });
  assert.deepEqual(body, { finalized: true, events: [{ type: "Warning", reason: "HookWarning", message: "finalizing" }] });
});
