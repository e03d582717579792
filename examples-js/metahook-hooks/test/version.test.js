// `version` is the one package.json declares, so a hook can report which library it runs.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { version } from "../index.js";

test("version is package.json's version", () => {
  const declared = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")).version;
  assert.match(declared, /^\d+\.\d+\.\d+/);
  assert.equal(version, declared);
});
