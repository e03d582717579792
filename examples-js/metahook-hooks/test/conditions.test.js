// Conditions are set like apimachinery's meta.SetStatusCondition does.
import assert from "node:assert/strict";
import { test } from "node:test";

import { conditionStatus, findCondition, setCondition } from "../index.js";

const T0 = new Date("2024-05-01T12:00:00Z");
const T1 = new Date("2024-05-01T12:05:30.123Z");

test("a new condition gets the transition time", () => {
  assert.deepEqual(setCondition(undefined, { type: "Ready", status: true, reason: "AllPodsReady", message: "2 of 2" }, T0), [
    { type: "Ready", status: "True", reason: "AllPodsReady", message: "2 of 2", lastTransitionTime: "2024-05-01T12:00:00Z" },
  ]);
});

test("the same status keeps the time but takes reason and message", () => {
  const before = setCondition([], { type: "Ready", status: false, reason: "Waiting", message: "0 of 2" }, T0);
  const after = setCondition(before, { type: "Ready", status: "False", reason: "StillWaiting", message: "1 of 2" }, T1);
  assert.deepEqual(after, [
    { type: "Ready", status: "False", reason: "StillWaiting", message: "1 of 2", lastTransitionTime: "2024-05-01T12:00:00Z" },
  ]);
});

test("a status change moves the time; other conditions stay in place", () => {
  const observed = [
    { type: "Progressing", status: "True", reason: "Rolling", message: "", lastTransitionTime: "x" },
    { type: "Ready", status: "False", reason: "Waiting", message: "", lastTransitionTime: "y" },
  ];
  const after = setCondition(observed, { type: "Ready", status: true, reason: "AllPodsReady", observedGeneration: 3 }, T1);
  assert.deepEqual(after[0], observed[0]);
  assert.deepEqual(after[1], {
    type: "Ready", status: "True", reason: "AllPodsReady", message: "", lastTransitionTime: "2024-05-01T12:05:30Z", observedGeneration: 3,
  });
  assert.equal(observed[1].status, "False", "the observed list is not changed");
});

test("lookups", () => {
  const conditions = setCondition(null, { type: "Ready", status: "Unknown", reason: "Starting" }, T0);
  assert.equal(findCondition(conditions, "Ready").reason, "Starting");
  assert.equal(conditionStatus(conditions, "Ready"), "Unknown");
  assert.equal(findCondition(conditions, "Other"), undefined);
  assert.equal(conditionStatus(undefined, "Ready"), undefined);
});

test("values the apiserver would refuse are refused here", () => {
  assert.throws(() => setCondition([], { type: "Ready", status: "Yes", reason: "Fine" }), /True, False or Unknown/);
  assert.throws(() => setCondition([], { type: "Ready", status: true, reason: "not camel case" }), /CamelCase/);
  assert.throws(() => setCondition([], { type: "Ready", status: true, reason: "" }), /CamelCase/);
});
