// The server, listening on port 0 and called over real HTTP.
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, test } from "node:test";

import { RetryLater, compositeResponse, createHookServer, serve } from "../index.js";

const ROUTES = {
  "/sync": (request) => compositeResponse({ children: [], status: { parent: request.parent.metadata.name } }),
  "/finalize": async (request) => compositeResponse({ children: [], finalized: request.finalizing }),
  "/broken": () => {
    throw new TypeError("no replicas in spec");
  },
  "/rejects": async () => Promise.reject(new Error("async failure")),
  "/silent": () => undefined,
  "/busy": () => {
    throw new RetryLater(7, "database busy");
  },
  "/bigint": () => ({ status: { n: 1n } }),
};
const REQUEST = { parent: { metadata: { name: "p" } }, finalizing: true };

let server;
before(async () => {
  server = await serve(ROUTES, { port: 0, host: "127.0.0.1" });
});
after(() => new Promise((resolve) => server.close(resolve)));

/** { status, headers, text } of one call; strings are sent as is, anything else as JSON. */
async function call(path, { body = REQUEST, method = "POST" } = {}) {
  const url = `http://127.0.0.1:${server.address().port}${path}`;
  const init = { method, headers: { "Content-Type": "application/json" } };
  if (body !== null) init.body = typeof body === "string" ? body : JSON.stringify(body);
  const response = await fetch(url, init);
  return { status: response.status, headers: response.headers, text: await response.text() };
}

test("routes by path, sync and async handlers alike", async () => {
  const sync = await call("/sync");
  assert.equal(sync.status, 200);
  assert.equal(sync.headers.get("content-type"), "application/json");
  assert.deepEqual(JSON.parse(sync.text), { children: [], status: { parent: "p" } });
  assert.deepEqual(JSON.parse((await call("/finalize")).text), { children: [], finalized: true });
});

test("query strings do not change the route", async () => {
  assert.equal((await call("/sync?debug=1")).status, 200);
});

test("an unknown path is 404 naming the known ones", async () => {
  const { status, text } = await call("/nope");
  assert.equal(status, 404);
  assert.match(text, /no hook at \/nope; known paths: \/bigint, \/broken, \/busy, \/finalize/);
});

for (const method of ["GET", "PUT", "DELETE", "PATCH"]) {
  test(`${method} is 405`, async () => {
    const { status, headers, text } = await call("/sync", { method, body: method === "GET" ? null : "{}" });
    assert.equal(status, 405);
    assert.equal(headers.get("allow"), "POST");
    assert.match(text, new RegExp(method));
  });
}

test("a body that is not JSON is 400", async () => {
  const { status, text } = await call("/sync", { body: "{not json" });
  assert.equal(status, 400);
  assert.match(text, /^request body is not valid JSON/);
});

test("a body that is not an object is 400", async () => {
  assert.deepEqual(
    [(await call("/sync", { body: [1, 2] })).text, (await call("/sync", { body: "null" })).text],
    ["request body must be a JSON object, not an array\n", "request body must be a JSON object, not null\n"],
  );
});

test("a hook exception is 500 with the message first, then the stack", async (t) => {
  t.mock.method(console, "error", () => {}); // the server logs failures; keep the test output clean
  const { status, text } = await call("/broken");
  assert.equal(status, 500);
  const [first, , ...stack] = text.split("\n");
  assert.equal(first, "hook /broken raised TypeError: no replicas in spec");
  assert.match(stack.join("\n"), /at .*server\.test\.js/);
  assert.match((await call("/rejects")).text, /^hook \/rejects raised Error: async failure/);
  assert.equal(console.error.mock.callCount(), 2);
});

test("a hook returning nothing is 500", async () => {
  const { status, text } = await call("/silent");
  assert.deepEqual([status, text], [500, "hook /silent returned nothing\n"]);
});

test("a response that cannot be JSON is 500", async () => {
  const { status, text } = await call("/bigint");
  assert.equal(status, 500);
  assert.match(text, /response is not JSON/);
});

test("RetryLater is 429 with Retry-After", async () => {
  const { status, headers, text } = await call("/busy");
  assert.deepEqual([status, headers.get("retry-after"), text], [429, "7", "database busy\n"]);
});

test("the connection is kept alive across errors", async () => {
  // The hub pools connections: an error answer must not leave the body behind to poison the next call.
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const sockets = new Set();
  const post = (path, body) =>
    new Promise((resolve, reject) => {
      const req = http.request(
        { host: "127.0.0.1", port: server.address().port, path, method: "POST", agent },
        (res) => {
          sockets.add(req.socket);
          res.resume();
          res.on("end", () => resolve(res.statusCode));
        },
      );
      req.on("error", reject);
      req.end(body);
    });
  assert.equal(await post("/nope", '{"a": 1}'), 404);
  assert.equal(await post("/sync", "[]"), 400);
  assert.equal(await post("/sync", JSON.stringify(REQUEST)), 200);
  assert.equal(sockets.size, 1);
  agent.destroy();
});

test("routes must be paths to functions", () => {
  assert.throws(() => createHookServer({ sync: () => ({}) }), /"sync"/);
  assert.throws(() => createHookServer({ "/sync": "sync" }), /"\/sync"/);
});

test("serve rejects when the port is taken", async () => {
  await assert.rejects(serve(ROUTES, { port: server.address().port, host: "127.0.0.1" }), { code: "EADDRINUSE" });
});
