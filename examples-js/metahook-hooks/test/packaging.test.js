// The library installs with plain npm into a fresh project: from the packed tarball (what a registry
// would serve, so `files` and `exports` are what is tested) and from the directory itself; a hook that
// imports "metahook-hooks" by name then serves calls. With TSC set (make test sets it to the pinned
// compiler), a TypeScript consumer is also compiled against the installed package's types.
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import http from "node:http";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { test } from "node:test";

import { scratch } from "./scratch.js";

const LIBRARY = fileURLToPath(new URL("..", import.meta.url));
const VERSION = JSON.parse(readFileSync(join(LIBRARY, "package.json"), "utf8")).version;
const NPM = process.platform === "win32" ? "npm.cmd" : "npm";

const HOOK = `
import { compositeResponse, parentOf, serve, version } from "metahook-hooks";
await serve({ "/sync": async (request) => compositeResponse({ children: [], status: { hello: parentOf(request).metadata.name, version } }) });
`;

const CONSUMER = `
import { childrenOf, parentOf, type Request, type Resource } from "metahook-hooks";
type Greeting = Resource<{ who: string }>;
export function names(request: Request<Greeting, { "Pod.v1": Resource }>): string[] {
  return [parentOf(request).spec.who, ...childrenOf(request, "Pod.v1").map((pod) => pod.metadata.name)];
}
`;

function npm(cwd, ...args) {
  return execFileSync(NPM, [...args, "--no-audit", "--no-fund", "--loglevel=error"], { cwd, encoding: "utf8" });
}

function project() {
  const dir = scratch("metahook-hooks-consumer-");
  writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "consumer", private: true, type: "module" }));
  return dir;
}

test("npm pack ships exactly the library, and a hook runs on the installed tarball", async () => {
  const packDir = scratch("metahook-hooks-pack-");
  const [packed] = JSON.parse(npm(LIBRARY, "pack", "--json", "--pack-destination", packDir));
  const shipped = packed.files.map((f) => f.path).sort();
  assert.deepEqual(
    shipped.filter((p) => !p.startsWith("src/")),
    ["README.md", "index.d.ts", "index.js", "package.json", "wire.d.ts"],
    "no tests or fixtures in the package",
  );
  const sources = readdirSync(join(LIBRARY, "src")).map((f) => `src/${f}`).sort();
  assert.deepEqual(shipped.filter((p) => p.startsWith("src/")), sources, "every module index.js imports");

  const dir = project();
  npm(dir, "install", join(packDir, packed.filename));
  await runHook(dir);
  if (process.env.TSC) {
    writeFileSync(join(dir, "consumer.ts"), CONSUMER);
    const tsc = [process.env.TSC, "--strict", "--noEmit", "--module", "nodenext", "--moduleResolution", "nodenext", "--target", "es2022"];
    // Resolved through package.json "exports" → "types": fails if the package does not declare its types.
    execFileSync(tsc[0], [...tsc.slice(1), "--types", "node", "--typeRoots", process.env.TYPE_ROOTS ?? "", "consumer.ts"], {
      cwd: dir,
      encoding: "utf8",
    });
  } else {
    test.diagnostic?.("TSC not set: the TypeScript consumer check is skipped (make test runs it)");
  }
});

test("npm install of the directory works too", async () => {
  const dir = project();
  npm(dir, "install", LIBRARY);
  await runHook(dir);
});

/** Starts `node hook.mjs` in `dir` on a free port, checks /healthz and one sync call, stops it with SIGTERM. */
async function runHook(dir) {
  writeFileSync(join(dir, "hook.mjs"), HOOK);
  const port = await freePort();
  const hook = spawn(process.execPath, ["hook.mjs"], { cwd: dir, env: { ...process.env, PORT: String(port), HOST: "127.0.0.1" } });
  const exited = new Promise((resolve) => hook.on("exit", (code) => resolve(code)));
  try {
    await waitForHealth(port);
    const response = await fetch(`http://127.0.0.1:${port}/sync`, {
      method: "POST",
      body: JSON.stringify({ parent: { metadata: { name: "world" } }, children: {}, finalizing: false }),
    });
    // `version` reads package.json beside the installed modules: it must ship and be found there.
    assert.deepEqual(await response.json(), { children: [], status: { hello: "world", version: VERSION } });
  } finally {
    hook.kill("SIGTERM");
  }
  assert.equal(await exited, 0, "the hook drains and exits 0 on SIGTERM");
}

async function freePort() {
  const probe = http.createServer();
  await new Promise((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const { port } = probe.address();
  await new Promise((resolve) => probe.close(resolve));
  return port;
}

async function waitForHealth(port, timeoutMs = 20000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const response = await fetch(`http://127.0.0.1:${port}/healthz`);
      if (response.status === 200) return;
    } catch {
      // not listening yet
    }
    assert.ok(Date.now() < deadline, `the hook did not answer /healthz on port ${port}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
