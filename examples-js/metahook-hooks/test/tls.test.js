// TLS: the server speaks HTTPS with the given certificate, requires client certificates with a client
// CA (mutual TLS), and gives new connections a renewed certificate once its files change — replaced by
// a rename, or by the kubelet's swap of a Secret volume's `..data` symlink.
import assert from "node:assert/strict";
import { copyFileSync, mkdirSync, readFileSync, renameSync, symlinkSync } from "node:fs";
import https from "node:https";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { before, test } from "node:test";

import { compositeResponse, createHookServer, serve } from "../index.js";

import { makeCertificates } from "./certs.js";
import { scratch } from "./scratch.js";

const ROUTES = { "/sync": (request) => compositeResponse({ children: [], status: { parent: request.parent.metadata.name } }) };
const REQUEST = JSON.stringify({ parent: { metadata: { name: "p" } }, children: {}, finalizing: false });
/** Longer than the server's once-a-second look at the files. */
const AFTER_CHECK_INTERVAL_MS = 1200;

let certs;
before(() => {
  certs = makeCertificates(scratch("tls-certs-"));
});

/** A copy of `pair` in a new directory as tls.crt / tls.key, so that a test can replace them. */
function ownCopy(pair, prefix) {
  const dir = scratch(prefix);
  const files = { cert: join(dir, "tls.crt"), key: join(dir, "tls.key") };
  copyFileSync(pair.cert, files.cert);
  copyFileSync(pair.key, files.key);
  return files;
}

/** Replaces `to` by a copy of `from`, atomically (write beside, rename over), as tools that renew do. */
function renameOver(from, to) {
  copyFileSync(from, `${to}.new`);
  renameSync(`${to}.new`, to);
}

/** Serves ROUTES over TLS with `options`, calls `fn(port, lines)`, closes. */
async function withServer(options, fn) {
  const lines = [];
  const server = await serve(ROUTES, { port: 0, host: "127.0.0.1", handleSignals: false, log: (l) => lines.push(l), ...options });
  try {
    return await fn(server.address().port, lines);
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
}

/**
 * One call on a new connection, trusting only the test CA: { status, text, serial } (serial of the
 * server certificate the connection got), or rejects when the handshake or the call fails.
 */
function call(port, { path = "/sync", method = "POST", client } = {}) {
  return new Promise((resolve, reject) => {
    const tlsOptions = { ca: readFileSync(certs.ca), ...(client ? { cert: readFileSync(client.cert), key: readFileSync(client.key) } : {}) };
    const req = https.request({ host: "127.0.0.1", port, path, method, agent: false, ...tlsOptions }, (res) => {
      const serial = res.socket.getPeerCertificate().serialNumber;
      let text = "";
      res.setEncoding("utf8").on("data", (d) => (text += d));
      res.on("end", () => resolve({ status: res.statusCode, text, serial }));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(method === "POST" ? REQUEST : undefined);
  });
}

test("HTTPS with the given certificate: calls and /healthz over the same listener", async () => {
  await withServer({ tlsCert: certs.server1.cert, tlsKey: certs.server1.key, quiet: true }, async (port, lines) => {
    const sync = await call(port);
    assert.deepEqual([sync.status, JSON.parse(sync.text).status, sync.serial], [200, { parent: "p" }, "1001"]);
    const health = await call(port, { path: "/healthz", method: "GET" });
    assert.deepEqual([health.status, health.text], [200, "ok\n"]);
    assert.deepEqual(lines, []);
  });
});

test("the start-up line says https, and whether client certificates are required", async () => {
  const server1 = { tlsCert: certs.server1.cert, tlsKey: certs.server1.key };
  await withServer(server1, async (port, lines) => assert.match(lines[0], new RegExp(`listening on https://127\\.0\\.0\\.1:${port} \\(health`)));
  await withServer({ ...server1, clientCa: certs.ca }, async (port, lines) =>
    assert.match(lines[0], new RegExp(`listening on https://127\\.0\\.0\\.1:${port} \\(client certificates required\\) \\(health`)),
  );
});

test("plain HTTP clients get no answer from a TLS server", async () => {
  await withServer({ tlsCert: certs.server1.cert, tlsKey: certs.server1.key, quiet: true }, async (port) => {
    await assert.rejects(fetch(`http://127.0.0.1:${port}/healthz`));
  });
});

test("with clientCa a client certificate that CA signed is required", async () => {
  const options = { tlsCert: certs.server1.cert, tlsKey: certs.server1.key, clientCa: certs.ca, quiet: true };
  await withServer(options, async (port) => {
    await assert.rejects(call(port), "no client certificate");
    await assert.rejects(call(port, { client: certs.rogue }), "a client certificate from another CA");
    const served = await call(port, { client: certs.client });
    assert.deepEqual([served.status, served.serial], [200, "1001"]);
    assert.equal((await call(port, { path: "/healthz", method: "GET", client: certs.client })).status, 200);
  });
});

test("files replaced by rename: the next connection gets the new certificate", async () => {
  const files = ownCopy(certs.server1, "tls-rename-");
  await withServer({ tlsCert: files.cert, tlsKey: files.key, quiet: true }, async (port, lines) => {
    assert.equal((await call(port)).serial, "1001");
    renameOver(certs.server2.cert, files.cert);
    renameOver(certs.server2.key, files.key);
    await sleep(AFTER_CHECK_INTERVAL_MS);
    const renewed = await call(port);
    assert.deepEqual([renewed.status, renewed.serial], [200, "1002"]);
    assert.deepEqual(lines, [`hook server: TLS files changed: serving the certificate now in ${files.cert}`]);
  });
});

test("a Secret volume's ..data swap: the next connection gets the new certificate", async () => {
  // The kubelet's layout: tls.crt -> ..data/tls.crt, ..data -> ..<timestamp>/, swapped by renaming a new
  // ..data symlink over the old one. The files' own names never change.
  const volume = scratch("tls-volume-");
  const version = (name, pair) => {
    mkdirSync(join(volume, name));
    copyFileSync(pair.cert, join(volume, name, "tls.crt"));
    copyFileSync(pair.key, join(volume, name, "tls.key"));
  };
  version("..2024_01_01", certs.server1);
  symlinkSync("..2024_01_01", join(volume, "..data"));
  symlinkSync("..data/tls.crt", join(volume, "tls.crt"));
  symlinkSync("..data/tls.key", join(volume, "tls.key"));
  await withServer({ tlsCert: join(volume, "tls.crt"), tlsKey: join(volume, "tls.key"), quiet: true }, async (port) => {
    assert.equal((await call(port)).serial, "1001");
    version("..2024_02_01", certs.server2);
    symlinkSync("..2024_02_01", join(volume, "..data_tmp"));
    renameSync(join(volume, "..data_tmp"), join(volume, "..data"));
    await sleep(AFTER_CHECK_INTERVAL_MS);
    assert.equal((await call(port)).serial, "1002");
  });
});

test("a changed pair that does not load keeps the old certificate, says so once, and is retried when fixed", async () => {
  const files = ownCopy(certs.server1, "tls-broken-");
  await withServer({ tlsCert: files.cert, tlsKey: files.key, quiet: true }, async (port, lines) => {
    renameOver(certs.server2.cert, files.cert); // the new certificate, with the old key: no pair
    await sleep(AFTER_CHECK_INTERVAL_MS);
    assert.equal((await call(port)).serial, "1001");
    await sleep(AFTER_CHECK_INTERVAL_MS);
    assert.equal((await call(port)).serial, "1001");
    assert.equal(lines.length, 1, lines.join("\n"));
    assert.match(lines[0], /^hook server: TLS files changed but do not load, still serving the previous certificate: .*key values mismatch/);
    renameOver(certs.server2.key, files.key);
    await sleep(AFTER_CHECK_INTERVAL_MS);
    assert.equal((await call(port)).serial, "1002");
    assert.equal(lines.length, 2);
  });
});

test("the files default to TLS_CERT_FILE, TLS_KEY_FILE and TLS_CLIENT_CA_FILE", async () => {
  const saved = { ...process.env };
  Object.assign(process.env, { TLS_CERT_FILE: certs.server1.cert, TLS_KEY_FILE: certs.server1.key, TLS_CLIENT_CA_FILE: certs.ca });
  try {
    await withServer({ quiet: true }, async (port) => {
      await assert.rejects(call(port));
      assert.equal((await call(port, { client: certs.client })).serial, "1001");
    });
  } finally {
    for (const name of ["TLS_CERT_FILE", "TLS_KEY_FILE", "TLS_CLIENT_CA_FILE"]) {
      if (saved[name] === undefined) delete process.env[name];
      else process.env[name] = saved[name];
    }
  }
});

test("incomplete or unloadable TLS settings fail at start-up", () => {
  const { cert, key } = certs.server1;
  assert.throws(() => createHookServer(ROUTES, { tlsCert: cert }), /TLS needs a certificate and its key/);
  assert.throws(() => createHookServer(ROUTES, { tlsKey: key }), /TLS needs a certificate and its key/);
  assert.throws(() => createHookServer(ROUTES, { clientCa: certs.ca }), /TLS needs a certificate and its key/);
  assert.throws(() => createHookServer(ROUTES, { tlsCert: cert, tlsKey: certs.server2.key }), /key values mismatch/);
  assert.throws(() => createHookServer(ROUTES, { tlsCert: `${cert}.missing`, tlsKey: key }), { code: "ENOENT" });
});
