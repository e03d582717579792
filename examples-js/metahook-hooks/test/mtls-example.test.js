// The mtls example (examples-js/mtls) as the hub meets it: `node hook.mjs` started with PORT and the
// TLS variables, called over mutual TLS. Its sync logic is also run on fixtures.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import http from "node:http";
import https from "node:https";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { PermanentError, runHookOnFixtures } from "../index.js";

import { makeCertificates } from "./certs.js";
import { scratch } from "./scratch.js";

const HOOK = fileURLToPath(new URL("../../mtls/hook.mjs", import.meta.url));
const CONTROLLER = {
  apiVersion: "metacontroller.k8s.io/v1alpha1",
  kind: "CompositeController",
  metadata: { name: "js-mtls-memo" },
  spec: { parentResource: { apiVersion: "js.examples.metahook.dev/v1", resource: "memos" }, childResources: [{ apiVersion: "v1", resource: "configmaps" }] },
};

function memo(spec) {
  return { apiVersion: "js.examples.metahook.dev/v1", kind: "Memo", metadata: { name: "hello", namespace: "default", generation: 1 }, spec };
}

test("sync: one ConfigMap holding the text under spec.key", async () => {
  const { sync } = await import(HOOK);
  const response = await runHookOnFixtures(sync, { controller: CONTROLLER, parent: memo({ text: "hi", key: "note.txt" }) });
  assert.deepEqual(response.children, [
    { apiVersion: "v1", kind: "ConfigMap", metadata: { name: "hello-memo", labels: { "js.examples.metahook.dev/memo": "hello" } }, data: { "note.txt": "hi" } },
  ]);
  assert.equal(response.status.bytes, 2);
  assert.equal(response.events, undefined);
});

test("sync: an empty text is stored with a warning; a bad key is a permanent error", async () => {
  const { sync } = await import(HOOK);
  const lines = [];
  const empty = await runHookOnFixtures(sync, { controller: CONTROLLER, parent: memo({ text: " " }), log: (l) => lines.push(l) });
  assert.deepEqual(empty.children[0].data, { "memo.txt": " " });
  assert.deepEqual(empty.events, [{ type: "Warning", reason: "EmptyMemo", message: "spec.text is empty: the ConfigMap holds an empty memo" }]);
  assert.deepEqual(lines, ["hook /sync default/hello: warning EmptyMemo: spec.text is empty: the ConfigMap holds an empty memo"]);
  for (const key of ["a/b", "..x", ".", "", "k".repeat(254)]) {
    await assert.rejects(runHookOnFixtures(sync, { controller: CONTROLLER, parent: memo({ text: "hi", key }) }), PermanentError, key);
  }
});

/** One call over a new TLS connection: { status, headers, body }; rejects when the handshake fails. */
function call(port, certs, { client, path = "/sync", body } = {}) {
  return new Promise((resolve, reject) => {
    const identity = client ? { cert: readFileSync(client.cert), key: readFileSync(client.key) } : {};
    const method = body === undefined ? "GET" : "POST";
    const req = https.request({ host: "127.0.0.1", port, path, method, agent: false, ca: readFileSync(certs.ca), ...identity }, (res) => {
      let text = "";
      res.setEncoding("utf8").on("data", (d) => (text += d));
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, text }));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(body === undefined ? undefined : JSON.stringify(body));
  });
}

test("node hook.mjs serves mutual TLS from PORT and the TLS_* variables", async () => {
  const certs = makeCertificates(scratch("mtls-example-"));
  const port = await freePort();
  const env = {
    ...process.env,
    PORT: String(port),
    HOST: "127.0.0.1",
    TLS_CERT_FILE: certs.server1.cert,
    TLS_KEY_FILE: certs.server1.key,
    TLS_CLIENT_CA_FILE: certs.ca,
  };
  const hook = spawn(process.execPath, [HOOK], { env, stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  hook.stderr.on("data", (chunk) => (stderr += chunk));
  const exited = new Promise((resolve) => hook.on("exit", (code) => resolve(code)));
  try {
    await waitUntil(() => stderr.includes("listening on"));
    assert.match(stderr, new RegExp(`listening on https://127\\.0\\.0\\.1:${port} \\(client certificates required\\)`));
    await assert.rejects(call(port, certs), "no client certificate");
    const hub = certs.client;
    assert.equal((await call(port, certs, { client: hub, path: "/healthz" })).text, "ok\n");
    const request = (spec) => ({ controller: CONTROLLER, parent: memo(spec), children: { "ConfigMap.v1": {} }, related: {}, finalizing: false });

    const ok = await call(port, certs, { client: hub, body: request({ text: "" }) });
    assert.equal(ok.status, 200, ok.text);
    const answer = JSON.parse(ok.text);
    assert.deepEqual(answer.children[0].data, { "memo.txt": "" });
    assert.deepEqual(answer.events.map((e) => e.reason), ["EmptyMemo"]);

    const bad = await call(port, certs, { client: hub, body: request({ text: "hi", key: "a/b" }) });
    assert.deepEqual([bad.status, bad.headers["metahook-error"]], [422, "permanent"]);
    assert.match(bad.text, /^spec\.key must be a ConfigMap key .*not "a\/b"\n/);
    assert.match(stderr, /hook \/sync default\/hello: warning EmptyMemo/);
  } finally {
    hook.kill("SIGTERM");
  }
  assert.equal(await exited, 0);
});

async function freePort() {
  const probe = http.createServer();
  await new Promise((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const { port } = probe.address();
  await new Promise((resolve) => probe.close(resolve));
  return port;
}

async function waitUntil(check, timeoutMs = 20000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    assert.ok(Date.now() < deadline, `${check} never became true`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
