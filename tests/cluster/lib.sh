# Shell helpers shared by up.sh and node-up.sh (sourced, not run). The caller defines HERE, BIN, CL,
# LOGS, PIDS, TIMEOUT, PKI, log() and fail <component> <message> (what a failure tears down is the
# caller's business: up.sh stops the whole cluster, node-up.sh only the node).

# pid of a component if its pid file exists and the process is alive *and* is our binary
# (guards against pid reuse after a reboot or a crash).
alive_pid() { # <name>
  local f=$PIDS/$1.pid pid
  [ -s "$f" ] || return 1
  pid=$(cat "$f")
  kill -0 "$pid" 2>/dev/null || return 1
  [[ "$(readlink "/proc/$pid/exe" 2>/dev/null || true)" == "$BIN/"* ]] || return 1
  echo "$pid"
}

# curl against the apiserver as admin. Needs API_PORT.
api() { # <method> <path> [json-body]
  local args=(-sS --fail-with-body --max-time 10 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt"
    --key "$PKI/admin.key" -X "$1" "https://127.0.0.1:$API_PORT$2")
  [ $# -lt 3 ] || args+=(-H 'Content-Type: application/json' --data-binary "$3")
  curl "${args[@]}"
}

# Short timeout: a port squatter that accepts but never answers must not stall the poll loop.
readyz() {
  [ -n "${API_PORT:-}" ] && [ "$(curl -sS --max-time 3 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" \
    --key "$PKI/admin.key" "https://127.0.0.1:$API_PORT/readyz" 2>/dev/null)" = ok ]
}

# Polls <check> (a shell function or command) every 0.5 s until it succeeds; on timeout or when
# <component>'s process dies, fails with its log.
wait_for() { # <component> <what> <check...>
  local comp=$1 what=$2 deadline=$((SECONDS + TIMEOUT))
  shift 2
  until "$@"; do
    if [ "$comp" != - ] && ! alive_pid "$comp" >/dev/null; then fail "$comp" "process exited while waiting for $what"; fi
    [ $SECONDS -lt $deadline ] || fail "$comp" "timed out after ${TIMEOUT}s waiting for $what"
    sleep 0.5
  done
}

# Starts a component detached from this shell (own session, stdin/stdout/stderr away from the
# caller, so `$(up.sh)` returns and make/CI do not hang), recording pid and log.
start() { # <name> <binary> args...
  local name=$1 bin=$2
  shift 2
  [ -x "$bin" ] || fail "$name" "binary missing: $bin (run tests/cluster/build.sh)"
  log "starting $name"
  CURRENT=$name
  # 9>&-: the process must not inherit (and so hold) the up/down lock.
  setsid "$bin" "$@" </dev/null >"$LOGS/$name.log" 2>&1 9>&- &
  echo $! >"$PIDS/$name.pid"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# The machine's own IPv4 address (the source address of its default route): what the real node
# registers as its InternalIP and where Pods reach the API server (they cannot reach 127.0.0.1).
node_ip() {
  ip -4 route get 1.1.1.1 2>/dev/null | awk '{ for (i = 1; i < NF; i++) if ($i == "src") { print $(i + 1); exit } }'
}
