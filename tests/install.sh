#!/usr/bin/env bash
# `make install-check`: the install path the book gives for the CLI, `cargo install --path . --locked`,
# works, and the installed `metahook` runs `render` and `rbac` away from the repository (a copy of an
# example in a temporary directory, the binary found on PATH), printing what the tutorial says.
#
# It installs the dev-profile build (`--debug`, into target/ where `make test` has already built it):
# the same package, binary target and locked dependencies as the release install, without a second
# 7-minute compile of the whole crate; `make image` and the benchmarks build the release profile.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "install-check: $*" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo install --path "$root" --locked --debug --target-dir "$root/target" --root "$work/prefix" --quiet
[ -x "$work/prefix/bin/metahook" ] || die "cargo install put no metahook in $work/prefix/bin"

mkdir "$work/project"
cp "$root"/examples-python/in-cluster/{controller.yaml,greeting.yaml,hook.py} "$work/project/"
cd "$work/project"
export PATH="$work/prefix/bin:$PATH" PYTHONPATH="$root/examples-python/metahook-hooks"
[ "$(command -v metahook)" = "$work/prefix/bin/metahook" ] || die "the installed metahook is not first on PATH"

metahook version
out=$(metahook render --controller controller.yaml --parent greeting.yaml --hook-cmd "python3 hook.py" 2>/dev/null) ||
  die "metahook render failed: $out"
grep -q '^# summary: 1 created, 0 updated, 0 deleted' <<<"$out" || die "render printed no summary of one create:
$out"
out=$(metahook rbac -f controller.yaml) || die "metahook rbac failed: $out"
grep -q '^kind: ClusterRole$' <<<"$out" || die "rbac printed no ClusterRole:
$out"
grep -q 'greetings' <<<"$out" || die "rbac's role does not name the parent's resource:
$out"
echo "install-check: cargo install --path . --locked gives a metahook that runs render and rbac"
