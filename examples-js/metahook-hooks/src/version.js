/**
 * The library's version, read from its own package.json: that file is the one place a release
 * changes, and it ships with every copy of the library (npm install, the in-cluster ConfigMap, a
 * container image), so a hook can log which library answered without a second constant to keep in step.
 */

import { readFileSync } from "node:fs";

export const version = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")).version;
