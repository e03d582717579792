// Scratch directories for the tests of one file, removed when that file's tests are done (they used to
// pile up in /tmp). No tests here: node --test runs this file too, and it only defines the helper.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after } from "node:test";

const dirs = [];

after(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/** A new directory under the system's temp dir, named `prefix` plus random letters. */
export function scratch(prefix) {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  dirs.push(dir);
  return dir;
}
