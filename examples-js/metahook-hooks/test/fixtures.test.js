// The fixture helper builds the request the hub would send, keyed as the hub keys it.
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import {
  PermanentError,
  child,
  childrenOf,
  compositeResponse,
  customizeResponse,
  event,
  fixtureRequest,
  loadObjects,
  requestLog,
  runHookOnFixtures,
} from "../index.js";

import { scratch } from "./scratch.js";

const fixture = (name) => new URL(`fixtures/${name}`, import.meta.url);
const CONTROLLER = fixture("controller.json");
const PARENT = fixture("parent.json");
const PODS = fixture("pods.json");
const CACHE = fixture("cache.json");
const DECORATOR = fixture("decorator.json");
// The fixture controller declares a custom child type (`caches`); tests without a Cache fixture name its Kind.
const KINDS = { caches: "Cache" };
const base = { controller: CONTROLLER, parent: PARENT, kinds: KINDS };

test("a v1 request is keyed by name and drops other namespaces", () => {
  const request = fixtureRequest({ controller: CONTROLLER, parent: PARENT, children: [PODS, CACHE] });
  assert.deepEqual(Object.keys(request).sort(), ["children", "controller", "finalizing", "parent", "related"]);
  assert.equal(request.finalizing, false);
  assert.equal(request.parent.metadata.name, "nginx-backend");
  const { children } = request;
  assert.deepEqual(Object.keys(children).sort(), ["Cache.example.com/v1", "PersistentVolumeClaim.v1", "Pod.v1"]);
  assert.deepEqual(Object.keys(children["Pod.v1"]).sort(), ["nginx-backend-0", "nginx-backend-1"]);
  assert.deepEqual(children["PersistentVolumeClaim.v1"], {});
  assert.deepEqual(Object.keys(children["Cache.example.com/v1"]), ["nginx-backend-cache"]);
  assert.deepEqual(request.related, {});
});

test("objects without a namespace live in the parent's", () => {
  const request = fixtureRequest({ ...base, children: [PODS] });
  assert.equal(request.children["Pod.v1"]["nginx-backend-1"].metadata.namespace, "default");
});

test("the version comes from the controller's hook", () => {
  // The fixture controller declares its finalize hook as v2.
  const request = fixtureRequest({ ...base, children: [PODS], hook: "finalize" });
  assert.equal(request.finalizing, true);
  assert.deepEqual(Object.keys(request.children["Pod.v1"]).sort(), [
    "default/nginx-backend-0",
    "default/nginx-backend-1",
    "elsewhere/stray",
  ]);
});

test("the version can be forced", () => {
  const request = fixtureRequest({ ...base, children: [PODS], version: "v2" });
  assert.ok("default/nginx-backend-0" in request.children["Pod.v1"]);
  assert.throws(() => fixtureRequest({ ...base, version: "v9" }), /"v9"/);
});

test("a cluster-scoped parent gets qualified keys in v1", () => {
  const parent = { apiVersion: "example.com/v1", kind: "Backend", metadata: { name: "global" } };
  const pod = { apiVersion: "v1", kind: "Pod", metadata: { name: "p", namespace: "ns" } };
  const request = fixtureRequest({ ...base, parent, children: [pod] });
  assert.deepEqual(Object.keys(request.children["Pod.v1"]), ["ns/p"]);
});

test("a decorator request has an object and attachments", () => {
  const target = { apiVersion: "apps/v1", kind: "StatefulSet", metadata: { name: "web", namespace: "default" } };
  const svc = { apiVersion: "v1", kind: "Service", metadata: { name: "web-0" } };
  const request = fixtureRequest({ controller: DECORATOR, parent: target, children: [svc] });
  assert.deepEqual(Object.keys(request).sort(), ["attachments", "controller", "finalizing", "object", "related"]);
  assert.deepEqual(request.attachments, {
    "Service.v1": { "default/web-0": { ...svc, metadata: { name: "web-0", namespace: "default" } } },
  });
});

test("a customize request has the controller and the parent only", () => {
  assert.deepEqual(Object.keys(fixtureRequest({ controller: DECORATOR, parent: PARENT, hook: "customize" })), [
    "controller",
    "parent",
  ]);
  assert.throws(
    () => fixtureRequest({ controller: DECORATOR, parent: PARENT, children: [PODS], hook: "customize" }),
    /only the controller and the parent/,
  );
});

test("related objects are keyed by their own type", () => {
  const secret = { apiVersion: "v1", kind: "Secret", metadata: { name: "creds" } };
  const request = fixtureRequest({ ...base, related: [secret] });
  assert.deepEqual(Object.keys(request.related), ["Secret.v1"]);
  assert.deepEqual(Object.keys(request.related["Secret.v1"]), ["creds"]);
});

test("an undeclared child type is refused", () => {
  const svc = { apiVersion: "v1", kind: "Service", metadata: { name: "s" } };
  assert.throws(() => fixtureRequest({ ...base, children: [svc] }), /Service\.v1 "s" is not a type the controller declares/);
});

test("the Kind of a custom resource must be known", () => {
  assert.throws(
    () => fixtureRequest({ controller: CONTROLLER, parent: PARENT, children: [PODS] }),
    /example\.com\/v1\/caches.*kinds:/,
  );
  assert.deepEqual(fixtureRequest({ ...base, children: [PODS] }).children["Cache.example.com/v1"], {});
});

test("duplicate objects are refused", () => {
  const pod = { apiVersion: "v1", kind: "Pod", metadata: { name: "nginx-backend-0" } };
  assert.throws(() => fixtureRequest({ ...base, children: [PODS, pod] }), /twice/);
});

test("fixture objects are not modified", () => {
  const pod = { apiVersion: "v1", kind: "Pod", metadata: { name: "p" } };
  fixtureRequest({ ...base, children: [pod] });
  assert.deepEqual(pod, { apiVersion: "v1", kind: "Pod", metadata: { name: "p" } });
});

test("the parent fixture must hold one object", () => {
  assert.throws(() => fixtureRequest({ controller: CONTROLLER, parent: PODS }), /exactly one object, it holds 3/);
});

test("YAML fixtures are refused with what to do instead", () => {
  assert.throws(() => loadObjects(fixture("cache.yaml")), /cache\.yaml: YAML fixtures are not supported.*convert it to JSON/);
});

test("other files and objects without apiVersion/kind are refused", () => {
  const dir = scratch("metahook-hooks-");
  writeFileSync(join(dir, "pod.txt"), "{}");
  writeFileSync(join(dir, "bad.json"), '[{"metadata": {"name": "x"}}]');
  assert.throws(() => loadObjects(join(dir, "pod.txt")), /pod\.txt: fixtures are \.json files/);
  assert.throws(() => loadObjects(join(dir, "bad.json")), /needs apiVersion and kind/);
});

function readyPods(request) {
  const ready = childrenOf(request, "Pod.v1")
    .filter((pod) => (pod.status?.conditions ?? []).some((c) => c.type === "Ready" && c.status === "True"))
    .map((pod) => pod.metadata.name);
  return compositeResponse({
    children: [child(request, "Pod.v1", "nginx-backend-0")],
    status: { ready },
    events: [event("Normal", "Counted", `${ready.length} ready`)],
  });
}

test("runHookOnFixtures resolves with the response", async () => {
  const response = await runHookOnFixtures(readyPods, { controller: CONTROLLER, parent: PARENT, children: [PODS, CACHE] });
  assert.deepEqual(response.status, { ready: ["nginx-backend-0"] });
  assert.equal(response.children[0].metadata.name, "nginx-backend-0");
  assert.deepEqual(response.events, [{ type: "Normal", reason: "Counted", message: "1 ready" }]);
});

test("runHookOnFixtures fails as the server would", async () => {
  await assert.rejects(runHookOnFixtures(() => undefined, base), /hook returned nothing/);
  await assert.rejects(runHookOnFixtures(async () => ({ status: { n: 1n } }), base), TypeError);
});

test("runHookOnFixtures gives the hook its context, as the server does", async () => {
  const lines = [];
  const sync = (request, ctx) => {
    ctx.log.warn("cache is cold", "ColdCache");
    requestLog().info("from a helper");
    return compositeResponse({ children: [], events: [event("Normal", "Synced")] });
  };
  const response = await runHookOnFixtures(sync, { ...base, log: (line) => lines.push(line) });
  assert.deepEqual(response.events, [
    { type: "Normal", reason: "Synced", message: "" },
    { type: "Warning", reason: "ColdCache", message: "cache is cold" },
  ]);
  assert.deepEqual(lines, ["hook /sync default/nginx-backend: warning ColdCache: cache is cold", "hook /sync default/nginx-backend: from a helper"]);
});

test("runHookOnFixtures: customize answers get no events, PermanentError reaches the test", async () => {
  const customize = (request, ctx) => (ctx.log.warn("printed only"), customizeResponse([]));
  const lines = [];
  assert.deepEqual(await runHookOnFixtures(customize, { ...base, hook: "customize", log: (l) => lines.push(l) }), { relatedResources: [] });
  assert.deepEqual(lines, ["hook /customize default/nginx-backend: warning HookWarning: printed only"]);
  const invalid = () => {
    throw new PermanentError("spec.size is negative");
  };
  await assert.rejects(runHookOnFixtures(invalid, base), PermanentError);
});

test("the README example hook works", async () => {
  const readme = readFileSync(new URL("../README.md", import.meta.url), "utf8");
  const source = readme.split("```js\n")[1].split("```")[0];
  const dir = scratch("metahook-hooks-readme-");
  // Imported as a module beside this package, so its `import ... from "metahook-hooks"` must resolve here.
  const module = join(dir, "hook.mjs");
  writeFileSync(module, source.replace('from "metahook-hooks"', `from ${JSON.stringify(new URL("../index.js", import.meta.url).href)}`));
  const { sync } = await import(module);
  const response = await runHookOnFixtures(sync, { controller: CONTROLLER, parent: PARENT, children: [PODS, CACHE] });
  assert.deepEqual(response.children.map((p) => p.metadata.name), ["nginx-backend-0", "nginx-backend-1"]);
  assert.deepEqual(response.status, { replicas: 2, running: 0 });
  assert.equal(response.events, undefined); // two pods observed, two wanted
});
