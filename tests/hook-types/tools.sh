#!/usr/bin/env bash
# Installs the pinned type checkers the hook checks need (mypy from requirements.txt, TypeScript and
# @types/node from package.json + package-lock.json) into target/hook-tools/ (gitignored with target/),
# from PyPI and the npm registry with their ordinary clients. Idempotent and cached: each tool set is
# reinstalled only when its pin files change (a stamp holds their hash), so later runs take no time.
#
# Prints nothing when the tools are current. Env: HOOK_TOOLS (default <repo>/target/hook-tools).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/tests/hook-types
TOOLS=${HOOK_TOOLS:-$ROOT/target/hook-tools}
mkdir -p "$TOOLS"

stamp_of() { cat "$@" | sha256sum | cut -c1-16; }

want=$(stamp_of "$HERE/requirements.txt")
if [ "$(cat "$TOOLS/venv/.stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "[hook-tools] installing mypy into $TOOLS/venv" >&2
  rm -rf "$TOOLS/venv"
  python3 -m venv "$TOOLS/venv"
  "$TOOLS/venv/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$HERE/requirements.txt"
  echo "$want" >"$TOOLS/venv/.stamp"
fi

want=$(stamp_of "$HERE/package.json" "$HERE/package-lock.json")
if [ "$(cat "$TOOLS/node/.stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "[hook-tools] installing TypeScript into $TOOLS/node" >&2
  rm -rf "$TOOLS/node"
  mkdir -p "$TOOLS/node"
  cp "$HERE/package.json" "$HERE/package-lock.json" "$TOOLS/node/"
  (cd "$TOOLS/node" && npm ci --no-audit --no-fund --loglevel=error >&2)
  echo "$want" >"$TOOLS/node/.stamp"
fi
