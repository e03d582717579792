// The hub's `traceparent`: checked, handed to the handler as `ctx.traceId`, and named in every line of
// the call.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { compositeResponse, requestLog, serve } from "../index.js";
import { parseTraceparent } from "../src/trace.js";

const TRACE = "4bf92f3577b34da6a3ce929d0e0e4736";
const TRACEPARENT = `00-${TRACE}-00f067aa0ba902b7-01`;

test("a version-00 traceparent is read field by field", () => {
  assert.deepEqual(parseTraceparent(TRACEPARENT), { traceId: TRACE, parentId: "00f067aa0ba902b7", flags: "01", header: TRACEPARENT });
  assert.equal(parseTraceparent(` ${TRACEPARENT}\t`)?.header, TRACEPARENT, "optional white space around the value");
  assert.equal(parseTraceparent(`00-${TRACE}-00f067aa0ba902b7-00`)?.flags, "00", "not sampled is still a trace");
});

test("anything else is no trace", () => {
  for (const value of [
    undefined,
    "",
    [TRACEPARENT, TRACEPARENT],
    `01-${TRACE}-00f067aa0ba902b7-01`, // a version this library does not know
    `ff-${TRACE}-00f067aa0ba902b7-01`, // the invalid version
    `00-${"0".repeat(32)}-00f067aa0ba902b7-01`, // all-zero trace id
    `00-${TRACE}-${"0".repeat(16)}-01`, // all-zero parent id
    `00-${TRACE.toUpperCase()}-00f067aa0ba902b7-01`, // upper-case hex
    `00-${TRACE.slice(1)}-00f067aa0ba902b7-01`, // a digit short
    `00-${TRACE}-00f067aa0ba902b7-01-extra`, // fields version 00 does not have
    `00-${TRACE.slice(1)}g-00f067aa0ba902b7-01`, // not hex
  ]) {
    assert.equal(parseTraceparent(value), null, String(value));
  }
});

const lines = [];
let seen;
const ROUTES = {
  "/sync": (request, ctx) => {
    seen = { traceId: ctx.traceId, traceparent: ctx.traceparent, same: requestLog() === ctx.log };
    ctx.log.info("making 1 ConfigMap");
    requestLog().warn("spec.text is empty", "EmptyNote");
    return compositeResponse({ children: [] });
  },
  "/broken": () => {
    throw new Error("no replicas in spec");
  },
};
const PARENT = { parent: { kind: "Note", metadata: { name: "memo", namespace: "team" } }, children: {}, finalizing: false };

let server;
let jsonServer;
before(async () => {
  const options = { port: 0, host: "127.0.0.1", quiet: true, handleSignals: false, log: (line) => lines.push(line) };
  server = await serve(ROUTES, options);
  jsonServer = await serve(ROUTES, { ...options, logRequests: true });
});
after(() => Promise.all([server, jsonServer].map((s) => new Promise((resolve) => s.close(resolve)))));

async function call(on, path, headers) {
  lines.length = 0;
  seen = undefined;
  const url = `http://127.0.0.1:${on.address().port}${path}`;
  const response = await fetch(url, { method: "POST", headers, body: JSON.stringify(PARENT) });
  await response.text();
  return response.status;
}

test("the handler and each line of the call name the trace", async () => {
  assert.equal(await call(server, "/sync", { traceparent: TRACEPARENT }), 200);
  assert.deepEqual(seen, { traceId: TRACE, traceparent: TRACEPARENT, same: true });
  assert.deepEqual(lines, [
    `hook /sync team/memo trace=${TRACE}: making 1 ConfigMap`,
    `hook /sync team/memo trace=${TRACE}: warning EmptyNote: spec.text is empty`,
  ]);
});

test("the JSON request line carries the trace", async () => {
  await call(jsonServer, "/sync", { traceparent: TRACEPARENT });
  const request = JSON.parse(lines.at(-1));
  assert.equal(request.status, 200);
  assert.equal(request.trace, TRACE);
});

test("a failed call names its trace", async (t) => {
  t.mock.method(console, "error", () => {});
  assert.equal(await call(server, "/broken", { traceparent: TRACEPARENT }), 500);
  assert.deepEqual(lines, [`hook server: POST /broken -> 500 trace=${TRACE}`]);
});

test("without a valid traceparent there is no trace", async () => {
  for (const headers of [{}, { traceparent: `00-${"0".repeat(32)}-00f067aa0ba902b7-01` }]) {
    await call(server, "/sync", headers);
    assert.deepEqual(seen, { traceId: "", traceparent: "", same: true });
    assert.equal(lines[0], "hook /sync team/memo: making 1 ConfigMap");
    await call(jsonServer, "/sync", headers);
    assert.equal("trace" in JSON.parse(lines.at(-1)), false);
  }
});
