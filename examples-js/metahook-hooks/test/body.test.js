// Request bodies: chunked ones are read like any other, and bodies over the limit are refused with 413
// before they are read to the end (the connection is closed instead).
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, test } from "node:test";

import { compositeResponse, serve } from "../index.js";

const LIMIT = 4096;
const ROUTES = { "/sync": (request) => compositeResponse({ children: [], status: { parent: request.parent.metadata.name, pad: request.pad?.length ?? 0 } }) };

let server;
before(async () => {
  server = await serve(ROUTES, { port: 0, host: "127.0.0.1", quiet: true, maxBody: LIMIT, log: () => {} });
});
after(() => new Promise((resolve) => server.close(resolve)));

/** A request body for parent `name`, padded to exactly `size` bytes. */
function bodyOf(name, size) {
  const empty = JSON.stringify({ parent: { metadata: { name } }, pad: "" });
  return JSON.stringify({ parent: { metadata: { name } }, pad: "x".repeat(size - empty.length) });
}

/**
 * POSTs `chunks` one by one (chunked unless `headers` says otherwise), without ending the request
 * unless `end`. Resolves with { status, headers, text, closed } once the answer is read and the
 * server has closed the connection or, when the server keeps it open, once the answer is read.
 */
function post(port, chunks, { headers = {}, end = true } = {}) {
  // Keep-alive, as the hub asks: closing the connection must be the server's decision.
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  return new Promise((resolve, reject) => {
    const req = http.request({ host: "127.0.0.1", port, path: "/sync", method: "POST", headers, agent }, (res) => {
      let text = "";
      res.setEncoding("utf8").on("data", (d) => (text += d));
      res.on("end", () => {
        const answer = { status: res.statusCode, headers: res.headers, text };
        if (end) return resolve(answer);
        // The request was never finished: only the server closing the connection ends this call.
        req.socket.once("close", () => resolve({ ...answer, closed: true }));
      });
    });
    // Writing after the server answered and closed fails with EPIPE/ECONNRESET; the answer is what counts.
    req.on("error", (e) => (req.res ? undefined : reject(e)));
    req.flushHeaders(); // so that the server sees the headers even when no body follows
    for (const chunk of chunks) req.write(chunk);
    if (end) req.end();
  }).finally(() => agent.destroy());
}

test("a chunked body is read and answered", async () => {
  const body = bodyOf("chunked", 3000);
  const parts = [body.slice(0, 10), body.slice(10, 1500), body.slice(1500)];
  const { status, headers, text } = await post(server.address().port, parts, { headers: { "Transfer-Encoding": "chunked" } });
  assert.equal(status, 200, text);
  assert.equal(JSON.parse(text).status.parent, "chunked");
  assert.equal(JSON.parse(text).status.pad, JSON.parse(body).pad.length);
  assert.equal(headers["content-type"], "application/json");
});

test("a body of exactly the limit is accepted", async () => {
  const body = bodyOf("exact", LIMIT);
  assert.equal(Buffer.byteLength(body), LIMIT);
  const { status } = await post(server.address().port, [body], { headers: { "Content-Length": String(LIMIT) } });
  assert.equal(status, 200);
});

test("a chunked body over the limit is 413 and the connection closed, without waiting for its end", { timeout: 10000 }, async () => {
  const { status, headers, text, closed } = await post(server.address().port, ["{", "x".repeat(LIMIT)], {
    headers: { "Transfer-Encoding": "chunked" },
    end: false,
  });
  assert.equal(status, 413);
  assert.equal(headers.connection, "close");
  assert.match(text, /^request body is over the limit of 4096 bytes/);
  assert.equal(closed, true);
});

test("a Content-Length over the limit is 413 before any of the body is sent", { timeout: 10000 }, async () => {
  const { status, text, closed } = await post(server.address().port, [], {
    headers: { "Content-Length": String(LIMIT + 1) },
    end: false,
  });
  assert.deepEqual([status, closed], [413, true]);
  assert.match(text, /over the limit of 4096 bytes \(maxBody, or METAHOOK_MAX_BODY\)/);
});

test("the limit defaults to METAHOOK_MAX_BODY, else 64 MiB", { timeout: 20000 }, async (t) => {
  const withEnv = async (value, fn) => {
    const saved = process.env.METAHOOK_MAX_BODY;
    if (value === undefined) delete process.env.METAHOOK_MAX_BODY;
    else process.env.METAHOOK_MAX_BODY = value;
    try {
      const limited = await serve(ROUTES, { port: 0, host: "127.0.0.1", quiet: true, handleSignals: false, log: () => {} });
      try {
        await fn(limited.address().port);
      } finally {
        await new Promise((resolve) => limited.close(resolve));
      }
    } finally {
      if (saved === undefined) delete process.env.METAHOOK_MAX_BODY;
      else process.env.METAHOOK_MAX_BODY = saved;
    }
  };
  await t.test("METAHOOK_MAX_BODY=100", () =>
    withEnv("100", async (port) => {
      assert.equal((await post(port, [bodyOf("small", 100)])).status, 200);
      assert.equal((await post(port, [bodyOf("big", 101)])).status, 413);
    }),
  );
  await t.test("unset: 64 MiB", () =>
    withEnv(undefined, async (port) => {
      const mib = 1024 * 1024;
      assert.equal((await post(port, [bodyOf("two-mib", 2 * mib)])).status, 200);
      const over = await post(port, [], { headers: { "Content-Length": String(64 * mib + 1) }, end: false });
      assert.equal(over.status, 413);
      assert.match(over.text, /limit of 67108864 bytes/);
    }),
  );
  assert.throws(() => {
    process.env.METAHOOK_MAX_BODY = "64Mi";
    try {
      serve(ROUTES, { port: 0, quiet: true });
    } finally {
      delete process.env.METAHOOK_MAX_BODY;
    }
  }, /METAHOOK_MAX_BODY must be a number of bytes, not "64Mi"/);
});
