// The server, listening on port 0 and called over real HTTP.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, writeFileSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { PermanentError, RetryLater, compositeResponse, createHookServer, listenAddress, serve } from "../index.js";

import { scratch } from "./scratch.js";

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
  "/invalid": () => {
    throw new PermanentError("spec.size must be a positive number, not -1\nsecond line");
  },
};
const REQUEST = { parent: { metadata: { name: "p" } }, finalizing: true };

let server;
before(async () => {
  server = await serve(ROUTES, { port: 0, host: "127.0.0.1", quiet: true });
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

test("a hook version goes with every answer, from the option or $HOOK_VERSION; none without", async () => {
  assert.equal((await call("/sync")).headers.get("metahook-hook-version"), null);
  const before = process.env.HOOK_VERSION;
  for (const [options, env, expected] of [[{ hookVersion: "2.1.0" }, undefined, "2.1.0"], [{}, "from-env", "from-env"]]) {
    if (env === undefined) delete process.env.HOOK_VERSION;
    else process.env.HOOK_VERSION = env;
    const versioned = await serve(ROUTES, { port: 0, host: "127.0.0.1", quiet: true, handleSignals: false, ...options });
    try {
      const response = await fetch(`http://127.0.0.1:${versioned.address().port}/sync`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(REQUEST),
      });
      assert.equal(response.status, 200);
      assert.equal(response.headers.get("metahook-hook-version"), expected);
      await response.text();
    } finally {
      await new Promise((resolve) => versioned.close(resolve));
    }
  }
  if (before === undefined) delete process.env.HOOK_VERSION;
  else process.env.HOOK_VERSION = before;
  assert.throws(() => createHookServer(ROUTES, { hookVersion: "v1\r\nX-Injected: 1" }), /one line/);
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

test("PermanentError is 422 with Metahook-Error: permanent and the message first", async () => {
  const { status, headers, text } = await call("/invalid");
  assert.deepEqual([status, headers.get("metahook-error")], [422, "permanent"]);
  assert.equal(text.split("\n")[0], "spec.size must be a positive number, not -1");
  assert.equal(headers.get("retry-after"), null);
});

test("only PermanentError answers 422: other failures are not marked permanent", async (t) => {
  t.mock.method(console, "error", () => {});
  for (const path of ["/broken", "/busy"]) {
    const { status, headers } = await call(path);
    assert.notEqual(status, 422);
    assert.equal(headers.get("metahook-error"), null, path);
  }
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

// ---- what a hook in a Pod needs: health, address from the environment, logs, drain ----------------

test("GET and HEAD /healthz answer 200 for probes", async () => {
  const get = await call("/healthz", { method: "GET", body: null });
  assert.deepEqual([get.status, get.text], [200, "ok\n"]);
  assert.equal((await call("/healthz", { method: "HEAD", body: null })).status, 200);
});

test("the address comes from PORT and HOST, explicit options win", () => {
  assert.deepEqual(listenAddress({}, {}), { host: "0.0.0.0", port: 8080 });
  assert.deepEqual(listenAddress({}, { PORT: "18081", HOST: "127.0.0.1" }), { host: "127.0.0.1", port: 18081 });
  assert.deepEqual(listenAddress({ port: 9000, host: "::1" }, { PORT: "1", HOST: "x" }), { host: "::1", port: 9000 });
  assert.throws(() => listenAddress({}, { PORT: "http" }), /PORT must be a port number, not "http"/);
});

test("requests are logged as JSON lines with the parent and the duration", async () => {
  const lines = [];
  const logged = await serve(ROUTES, { port: 0, host: "127.0.0.1", logRequests: true, log: (l) => lines.push(l), quiet: true });
  try {
    const base = `http://127.0.0.1:${logged.address().port}`;
    const parent = { kind: "Greeting", metadata: { name: "p", namespace: "ns" } };
    await (await fetch(`${base}/sync`, { method: "POST", body: JSON.stringify({ parent, finalizing: false }) })).text();
    await (await fetch(`${base}/broken`, { method: "POST", body: JSON.stringify(REQUEST) })).text();
    const map = { parent: { ...parent, kind: "SnapshotSchedule" }, mapKey: "uid-1", input: {}, outputs: {} };
    await (await fetch(`${base}/sync`, { method: "POST", body: JSON.stringify(map) })).text();
  } finally {
    await new Promise((resolve) => logged.close(resolve));
  }
  const [ok, failed, mapped] = lines.map((l) => JSON.parse(l));
  assert.deepEqual(
    { method: ok.method, path: ok.path, status: ok.status, parent: ok.parent, kind: ok.kind, finalizing: ok.finalizing },
    { method: "POST", path: "/sync", status: 200, parent: "ns/p", kind: "Greeting", finalizing: false },
  );
  assert.equal("mapKey" in ok, false);
  // A MapController's map and tombstone calls also name the input, by its map key.
  assert.deepEqual([mapped.parent, mapped.kind, mapped.mapKey, "finalizing" in mapped], ["ns/p", "SnapshotSchedule", "uid-1", false]);
  assert.equal(typeof ok.durationMs, "number");
  assert.ok(ok.durationMs >= 0 && ok.time.endsWith("Z"));
  assert.deepEqual([failed.status, failed.error], [500, "TypeError: no replicas in spec"]);
});

const SIGTERM_HOOK = `
import { existsSync, writeFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { compositeResponse, serve } from ${JSON.stringify(new URL("../index.js", import.meta.url).href)};
const slow = async () => {
  writeFileSync(process.env.STARTED, "");
  while (!existsSync(process.env.RELEASE)) await sleep(10);
  return compositeResponse({ children: [], status: { finished: true } });
};
await serve({ "/slow": slow });
`;

test("SIGTERM drains the calls in flight, then the process exits cleanly", async () => {
  const dir = scratch("drain-");
  const started = join(dir, "started");
  const release = join(dir, "release");
  const port = await freePort();
  const hook = spawn(process.execPath, ["--input-type=module", "-e", SIGTERM_HOOK], {
    env: { ...process.env, PORT: String(port), HOST: "127.0.0.1", STARTED: started, RELEASE: release },
    stdio: ["ignore", "ignore", "pipe"],
  });
  let stderr = "";
  hook.stderr.on("data", (chunk) => (stderr += chunk));
  const exited = new Promise((resolve) => hook.on("exit", (code) => resolve(code)));
  try {
    await waitUntil(() => connectable(port));
    const inFlight = fetch(`http://127.0.0.1:${port}/slow`, { method: "POST", body: JSON.stringify(REQUEST) });
    await waitUntil(async () => existsSync(started));
    hook.kill("SIGTERM");
    // Draining: no new connections, while the call in flight is still running.
    await waitUntil(async () => !(await connectable(port)));
    writeFileSync(release, "");
    const response = await inFlight;
    assert.equal(response.status, 200);
    assert.deepEqual(await response.json(), { children: [], status: { finished: true } });
    assert.equal(await exited, 0);
    assert.match(stderr, /SIGTERM: draining \(1 call\(s\) in flight\)/);
  } finally {
    hook.kill("SIGKILL");
  }
});

async function freePort() {
  const probe = http.createServer();
  await new Promise((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const { port } = probe.address();
  await new Promise((resolve) => probe.close(resolve));
  return port;
}

function connectable(port) {
  return new Promise((resolve) => {
    const socket = net.connect(port, "127.0.0.1");
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}

async function waitUntil(check, timeoutMs = 20000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    assert.ok(Date.now() < deadline, `${check} never became true`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
