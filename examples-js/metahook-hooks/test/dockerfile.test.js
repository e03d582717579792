// examples-js/Dockerfile cannot be built here (no Docker engine), so its layout is checked against the
// repository instead: what it COPYs exists in its build context (examples-js/), the file its CMD runs is
// the hook of the example it documents, and that hook's relative import of the library lands where the
// image puts the library. Moving or renaming any of those makes this fail.
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join, posix } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const CONTEXT = fileURLToPath(new URL("../../", import.meta.url));
const TEXT = readFileSync(join(CONTEXT, "Dockerfile"), "utf8");

/** Instructions as { op, args } (continuation lines joined, comments dropped). */
function instructions(text) {
  return text
    .replace(/\\\n/g, " ")
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line !== "" && !line.startsWith("#"))
    .map((line) => {
      const [op, ...rest] = line.split(/\s+/);
      return { op: op.toUpperCase(), args: rest.join(" ") };
    });
}

/** `${NAME}` and `$NAME` replaced from `vars`; an unknown variable fails the test. */
function expand(text, vars) {
  return text.replace(/\$\{(\w+)\}|\$(\w+)/g, (_, braced, bare) => {
    const name = braced ?? bare;
    assert.ok(name in vars, `the Dockerfile uses $${name} without a default`);
    return vars[name];
  });
}

/**
 * The stages: for each FROM, its name, and with ARG defaults applied: its WORKDIR at each COPY and RUN,
 * its COPYs ({ from, sources, dest, workdir }), RUNs ({ command, workdir }) and CMD.
 */
function stages(text) {
  const all = [];
  const globals = {};
  let stage = null;
  for (const { op, args } of instructions(text)) {
    if (op === "FROM") {
      stage = { name: args.split(/\s+as\s+/i)[1], vars: { ...globals }, workdir: "/", copies: [], runs: [], cmd: null };
      all.push(stage);
    } else if (op === "ARG") {
      const [name, value = ""] = args.split("=");
      (stage ? stage.vars : globals)[name] = value;
    } else if (!stage) {
      assert.fail(`${op} before FROM`);
    } else if (op === "WORKDIR") {
      stage.workdir = posix.resolve(stage.workdir, expand(args, stage.vars));
    } else if (op === "COPY") {
      const words = expand(args, stage.vars).split(/\s+/);
      const from = words.find((w) => w.startsWith("--from="))?.slice("--from=".length);
      const paths = words.filter((w) => !w.startsWith("--"));
      stage.copies.push({ from, sources: paths.slice(0, -1), dest: posix.resolve(stage.workdir, paths.at(-1)), workdir: stage.workdir });
    } else if (op === "RUN") {
      stage.runs.push({ command: expand(args, stage.vars), workdir: stage.workdir });
    } else if (op === "CMD") {
      stage.cmd = JSON.parse(args);
    }
  }
  return all;
}

const ALL = stages(TEXT);
const FINAL = ALL.at(-1);

test("the image is built on node:20-slim, as a non-root user, listening on 8080", () => {
  assert.deepEqual(
    instructions(TEXT).filter((i) => i.op === "FROM").map((i) => i.args.split(/\s+/)[0]),
    ALL.map(() => "node:20-slim"),
  );
  const user = instructions(TEXT).filter((i) => i.op === "USER").at(-1)?.args ?? "root";
  assert.match(user, /^[1-9]\d*(:\d+)?$/, "a numeric non-root user, so that runAsNonRoot can check it");
  assert.ok(instructions(TEXT).some((i) => i.op === "EXPOSE" && i.args === "8080"));
});

test("every COPY source exists in the build context, examples-js/", () => {
  const names = new Set(ALL.map((s) => s.name).filter(Boolean));
  for (const stage of ALL) {
    for (const copy of stage.copies) {
      if (copy.from) {
        assert.ok(names.has(copy.from), `COPY --from=${copy.from}: no such stage`);
        continue;
      }
      for (const source of copy.sources) assert.ok(existsSync(join(CONTEXT, source)), `COPY ${source}: not in examples-js/`);
    }
  }
});

test("the CMD runs the hook of the example the Dockerfile documents", () => {
  const documented = /--build-arg HOOK=([\w-]+)/.exec(TEXT)?.[1];
  assert.ok(documented, "the header shows the build command with --build-arg HOOK=...");
  assert.equal(FINAL.vars.HOOK, documented, "ARG HOOK defaults to the example the header builds");
  assert.deepEqual(FINAL.cmd.slice(0, 1), ["node"]);
  const inImage = posix.resolve(FINAL.workdir, FINAL.cmd[1]);
  const copy = FINAL.copies.find((c) => !c.from && inImage.startsWith(`${c.dest}/`));
  assert.ok(copy, `no COPY puts ${inImage} in the image`);
  const fromRepo = join(CONTEXT, copy.sources[0], posix.relative(copy.dest, inImage));
  assert.equal(fromRepo, join(CONTEXT, documented, "hook.mjs"));
  assert.ok(existsSync(fromRepo), `${fromRepo} does not exist`);
});

test("the hook's relative import of the library resolves in the image", () => {
  const hookDir = posix.dirname(posix.resolve(FINAL.workdir, FINAL.cmd[1]));
  const source = readFileSync(join(CONTEXT, FINAL.vars.HOOK, "hook.mjs"), "utf8");
  const specifier = /from "(\.\.?\/[^"]*metahook-hooks\/index\.js)"/.exec(source)?.[1];
  assert.ok(specifier, "the example imports the library by relative path");
  const libraryDir = posix.dirname(posix.resolve(hookDir, specifier));
  const links = FINAL.runs.flatMap(({ command, workdir }) =>
    [...command.matchAll(/ln -s (\S+) (\S+)/g)].map(([, target, name]) => ({ at: posix.resolve(workdir, name), target: posix.resolve(workdir, target) })),
  );
  const link = links.find((l) => l.at === libraryDir);
  assert.ok(link, `nothing puts the library at ${libraryDir}; links: ${JSON.stringify(links)}`);
  const install = FINAL.runs.find(({ command }) => /npm install .*metahook-hooks\.tgz/.test(command));
  assert.ok(install, "the library is installed with npm from its packed tarball");
  assert.equal(link.target, posix.resolve(install.workdir, "node_modules/metahook-hooks"), "the link leads to the installed package");
});
