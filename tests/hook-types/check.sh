#!/usr/bin/env bash
# The strict type checks of the hook libraries and of every example hook, as `make test` runs them:
#   mypy --strict  over metahook_hooks, its typed-hook test, every examples-python/*/*.py hook, and the
#                  hook of the library README's "A hook in 20 lines";
#   tsc --strict   over metahook-hooks' index.d.ts, its type tests (test/types.check.ts) and every
#                  examples-js/*/*.mjs hook (JavaScript checked against the JSDoc types, checkJs).
# The checkers are the pinned ones tools.sh installs. Exits non-zero on the first failing check.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TOOLS=${HOOK_TOOLS:-$ROOT/target/hook-tools}
bash "$ROOT/tests/hook-types/tools.sh"
cd "$ROOT"

mypy() { "$TOOLS/venv/bin/mypy" --strict --cache-dir "$TOOLS/mypy-cache" --no-error-summary "$@"; }

echo "[hook-types] mypy --strict examples-python/metahook-hooks" >&2
(cd examples-python/metahook-hooks && mypy metahook_hooks tests/test_typed_hooks.py)
# One run per example: every example's hook module is called `hook`, and one run cannot hold two.
for hook in examples-python/*/*.py; do
  case $hook in examples-python/metahook-hooks/*) continue ;; esac
  echo "[hook-types] mypy --strict $hook" >&2
  MYPYPATH=examples-python/metahook-hooks mypy "$hook"
done

# The README's "A hook in 20 lines", as a reader would copy it.
mkdir -p "$TOOLS/readme"
python3 - examples-python/metahook-hooks/README.md "$TOOLS/readme/hook.py" <<'PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read()
after = text[text.index("## A hook in 20 lines"):]
start = after.index("```python\n") + len("```python\n")
open(sys.argv[2], "w", encoding="utf-8").write(after[start:after.index("```", start)])
PY
echo "[hook-types] mypy --strict the hook of examples-python/metahook-hooks/README.md" >&2
MYPYPATH=examples-python/metahook-hooks mypy "$TOOLS/readme/hook.py"

echo "[hook-types] tsc --strict -p tests/hook-types/tsconfig.json" >&2
"$TOOLS/node/node_modules/.bin/tsc" -p tests/hook-types/tsconfig.json
echo "[hook-types] OK" >&2
