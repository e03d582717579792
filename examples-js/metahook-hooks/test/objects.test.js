// The accessors give the same answers for v1- and v2-keyed requests.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  attachment,
  attachmentsOf,
  child,
  childrenOf,
  inputOf,
  objectKey,
  output,
  outputsOf,
  parentOf,
  related,
  relatedOf,
  typeKey,
} from "../index.js";

const pod = (name, namespace = "default") => ({ apiVersion: "v1", kind: "Pod", metadata: { name, namespace } });
const PARENT = { apiVersion: "example.com/v1", kind: "Thing", metadata: { name: "t", namespace: "default" } };
const V1 = { parent: PARENT, children: { "Pod.v1": { a: pod("a"), b: pod("b") }, "Service.v1": {} }, related: {} };
const V2 = {
  parent: PARENT,
  children: { "Pod.v1": { "default/a": pod("a"), "default/b": pod("b") }, "Service.v1": {} },
  related: {},
};

test("type keys omit the core group", () => {
  assert.equal(typeKey("v1", "Pod"), "Pod.v1");
  assert.equal(typeKey("apps/v1", "Deployment"), "Deployment.apps/v1");
});

test("v1 keys are relative to a namespaced parent", () => {
  assert.equal(objectKey("v1", "default", "default", "a"), "a");
  assert.equal(objectKey("v1", "default", "other", "a"), null);
  assert.equal(objectKey("v1", "default", undefined, "node-1"), "node-1"); // cluster-scoped: by name
  assert.equal(objectKey("v1", undefined, "default", "a"), "default/a");
  assert.equal(objectKey("v1", null, null, "node-1"), "node-1");
});

test("v2 keys are uniform", () => {
  assert.equal(objectKey("v2", "default", "default", "a"), "default/a");
  assert.equal(objectKey("v2", "default", "other", "a"), "other/a");
  assert.equal(objectKey("v2", "default", undefined, "node-1"), "node-1");
});

test("an unknown hook version is refused", () => {
  assert.throws(() => objectKey("v3", "default", "default", "a"), /"v3"/);
});

for (const [version, request] of [["v1", V1], ["v2", V2]]) {
  describe(`a ${version}-keyed request`, () => {
    test("childrenOf lists the objects", () => {
      assert.deepEqual(childrenOf(request, "Pod.v1").map((p) => p.metadata.name), ["a", "b"]);
      assert.deepEqual(childrenOf(request, "Service.v1"), []);
    });
    test("child finds by name and namespace", () => {
      assert.deepEqual(child(request, "Pod.v1", "b"), pod("b"));
      assert.deepEqual(child(request, "Pod.v1", "b", "default"), pod("b"));
      assert.equal(child(request, "Pod.v1", "b", "other"), undefined);
      assert.equal(child(request, "Pod.v1", "zzz"), undefined);
    });
  });
}

test("a type missing from the request is named in the error", () => {
  assert.throws(() => childrenOf(V1, "Pod/v1"), { name: "RangeError", message: /"Pod\/v1".*Pod\.v1, Service\.v1/ });
});

test("the same name in two namespaces needs a namespace", () => {
  const request = { children: { "Pod.v1": { "x/a": pod("a", "x"), "y/a": pod("a", "y") } } };
  assert.throws(() => child(request, "Pod.v1", "a"), /pass a namespace/);
  assert.deepEqual(child(request, "Pod.v1", "a", "y"), pod("a", "y"));
});

test("decorator requests have attachments and an object", () => {
  const request = { object: PARENT, attachments: { "Pod.v1": { a: pod("a") } }, related: { "Secret.v1": {} } };
  assert.equal(parentOf(request), PARENT);
  assert.deepEqual(attachmentsOf(request, "Pod.v1"), [pod("a")]);
  assert.deepEqual(attachment(request, "Pod.v1", "a"), pod("a"));
  assert.deepEqual(relatedOf(request, "Secret.v1"), []);
  assert.equal(related(request, "Secret.v1", "a"), undefined);
  assert.throws(() => childrenOf(request, "Pod.v1"), RangeError);
});

test("parentOf reads parent for composite and customize requests", () => {
  assert.equal(parentOf({ controller: {}, parent: PARENT }), PARENT);
});

test("a null map entry reads as empty", () => {
  assert.deepEqual(childrenOf({ children: { "Pod.v1": null } }, "Pod.v1"), []);
});

describe("MapController requests", () => {
  const pvc = (name) => ({ apiVersion: "v1", kind: "PersistentVolumeClaim", metadata: { name, namespace: "default", uid: `uid-${name}` } });
  const cm = (name) => ({ apiVersion: "v1", kind: "ConfigMap", metadata: { name, namespace: "default" } });
  const MAP = {
    controller: {},
    parent: PARENT,
    mapKey: "uid-data",
    input: pvc("data"),
    outputs: { "ConfigMap.v1": { "default/data-snapshots": cm("data-snapshots") }, "Secret.v1": {} },
  };
  const TOMBSTONE = { controller: {}, parent: PARENT, mapKey: "uid-gone", outputs: { "ConfigMap.v1": { "gone-snapshots": cm("gone-snapshots") } } };

  test("inputOf is the input, parentOf the parent", () => {
    assert.equal(inputOf(MAP), MAP.input);
    assert.equal(parentOf(MAP), PARENT);
  });

  test("inputOf refuses a request without an input (tombstone, finalize)", () => {
    assert.throws(() => inputOf(TOMBSTONE), { name: "TypeError", message: /no `input`.*map call/ });
    assert.throws(() => inputOf({ parent: PARENT, outputs: {}, finalizing: true }), TypeError);
  });

  test("outputsOf and output read the outputs, whatever the keying", () => {
    assert.deepEqual(outputsOf(MAP, "ConfigMap.v1"), [cm("data-snapshots")]);
    assert.deepEqual(outputsOf(MAP, "Secret.v1"), []);
    assert.deepEqual(outputsOf(TOMBSTONE, "ConfigMap.v1"), [cm("gone-snapshots")]);
    assert.deepEqual(output(MAP, "ConfigMap.v1", "data-snapshots"), cm("data-snapshots"));
    assert.deepEqual(output(TOMBSTONE, "ConfigMap.v1", "gone-snapshots", "default"), cm("gone-snapshots"));
    assert.equal(output(MAP, "ConfigMap.v1", "data-snapshots", "other"), undefined);
    assert.equal(output(MAP, "Secret.v1", "data-snapshots"), undefined);
  });

  test("an output type missing from the request is named in the error", () => {
    assert.throws(() => outputsOf(MAP, "ConfigMap/v1"), {
      name: "RangeError",
      message: /no outputs of type "ConfigMap\/v1" \(types present: ConfigMap\.v1, Secret\.v1\)/,
    });
    assert.throws(() => output(MAP, "Pod.v1", "a"), RangeError);
    assert.throws(() => childrenOf(MAP, "ConfigMap.v1"), /no children/);
  });
});
