/**
 * An HTTP server that routes hook calls (JSON POSTs) to plain functions, sync or async.
 *
 * Each route maps a path to `fn(request, ctx) => response`, where `ctx.log` prints lines naming the
 * parent and turns warnings into Events on it (see log.js). Errors are answered so that the hub can put
 * them in a Kubernetes Event on the parent: the hub reports any non-200 answer as
 * "unsupported status code: <code> body: <body>" (first 1 KiB of the body), so the body starts with
 * the one line a human needs and only then carries the stack.
 *
 * What a hook in a Pod needs besides routing: `GET /healthz` for probes, the listen address from
 * `PORT` and `HOST`, and a graceful stop: on SIGTERM (Kubernetes' way of stopping a Pod) the server
 * stops accepting connections, lets the calls in flight finish and answer, then closes.
 *
 * A hook that names its version (`hookVersion`, default `$HOOK_VERSION`) sends it with every answer as
 * `Metahook-Hook-Version`: when the hub hears a version it has not heard before, it syncs every parent
 * again (paced), so rolling out a new hook needs no resync period to show.
 */

import http from "node:http";
import https from "node:https";

import { BodyTooLarge, maxBodyBytes, readBody } from "./body.js";
import { callContext, parentName, runInCall, withWarnings } from "./log.js";
import { parseTraceparent } from "./trace.js";
import { describe } from "./responses.js";
import { createTlsServer, tlsFiles } from "./tls.js";

export const DEFAULT_PORT = 8080;
/** How long calls in flight may take after SIGTERM: under Kubernetes' default 30 s grace period. */
export const DRAIN_SECONDS = 25;
const HEALTH_PATH = "/healthz";
const LOG_ENV = "METAHOOK_LOG_REQUESTS";
/** The response header a hook names its version in. */
export const HOOK_VERSION_HEADER = "Metahook-Hook-Version";
/** Where the server reads the hook's version from when it is given none. */
export const HOOK_VERSION_ENV = "HOOK_VERSION";

/**
 * Throw from a hook to answer 429 with `Retry-After`: the hub calls again after that many seconds,
 * without recording an error (e.g. while an external system is busy).
 */
export class RetryLater extends Error {
  constructor(seconds, message = `retry after ${seconds}s`) {
    super(message);
    this.name = "RetryLater";
    this.seconds = seconds;
  }
}

/**
 * Throw from a hook when calling again cannot help, e.g. a spec field that is invalid: answers 422
 * with `Metahook-Error: permanent` and the message as the body's first line. The hub then reports the
 * message once (an Event and a condition on the parent) instead of retrying with backoff and repeating
 * the same Event; it calls again when the parent or its children change, or at the next resync, which
 * is when the answer can differ.
 */
export class PermanentError extends Error {
  constructor(message) {
    super(message);
    this.name = "PermanentError";
  }
}

/**
 * `{ host, port }` to listen on: the options, else `$HOST` / `$PORT`, else all interfaces and 8080.
 * Tools that start a hook (`metahook render --hook-cmd`, test harnesses) pass a free port in `PORT`,
 * so a hook that does not hard-code one works everywhere.
 */
export function listenAddress({ port, host } = {}, env = process.env) {
  if (port === undefined) {
    const text = (env.PORT ?? "").trim();
    port = text === "" ? DEFAULT_PORT : Number(text);
    if (!Number.isInteger(port)) throw new RangeError(`PORT must be a port number, not ${JSON.stringify(text)}`);
  }
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    throw new RangeError(`port must be between 0 and 65535, not ${port}`);
  }
  host = host ?? ((env.HOST ?? "").trim() || "0.0.0.0");
  return { host, port };
}

/**
 * An `http.Server` for `routes` (`{"/sync": sync, ...}`), not yet listening, with `drain()`: stop
 * accepting, let calls in flight finish (at most `drainSeconds`), close idle connections.
 * `logRequests` writes one JSON line per call to `log` (default: stderr). Bodies over `maxBody` bytes
 * (default `$METAHOOK_MAX_BODY`, else 64 MiB) are refused with 413; chunked bodies are read like others.
 * With `tlsCert` and `tlsKey` (default `$TLS_CERT_FILE`, `$TLS_KEY_FILE`) it is an `https.Server`
 * that picks up renewed files; with `clientCa` too (`$TLS_CLIENT_CA_FILE`) clients must present a
 * certificate that CA signed. `hookVersion` (default `$HOOK_VERSION`) goes with every answer as
 * `Metahook-Hook-Version`.
 */
export function createHookServer(routes, options = {}) {
  const { logRequests = false, drainSeconds = DRAIN_SECONDS, log, maxBody } = options;
  const hookVersion = hookVersionOf(options.hookVersion ?? (process.env[HOOK_VERSION_ENV] || undefined));
  const table = new Map(Object.entries(routes));
  for (const [path, fn] of table) {
    if (!path.startsWith("/") || typeof fn !== "function") {
      throw new TypeError(`route "${path}": paths start with "/" and map to a function`);
    }
  }
  const write = log ?? ((line) => process.stderr.write(`${line}\n`));
  const state = {
    draining: false,
    known: [...table.keys()].sort().join(", "),
    logRequests,
    write,
    maxBody: maxBodyBytes(maxBody),
    answered: hookVersion === undefined ? {} : { [HOOK_VERSION_HEADER]: hookVersion },
  };
  /** Responses not yet finished: a drain waits for them, and tells their clients not to reuse the connection. */
  const active = new Set();
  const listener = (req, res) => {
    active.add(res);
    res.on("close", () => {
      active.delete(res);
      if (state.draining) server.closeIdleConnections();
    });
    answer(table, state, req, res);
  };
  const files = tlsFiles(options);
  const server = files ? createTlsServer(files, listener, write) : http.createServer(listener);
  server.drain = drainer(server, state, active, drainSeconds);
  server.inFlight = () => active.size;
  return server;
}

/** Answers one request and logs it. */
function answer(table, state, req, res) {
  const started = process.hrtime.bigint();
  if (state.draining) res.setHeader("Connection", "close");
  handle(table, state, req, res)
    .then((fields) => logCall(state, req, res, started, fields))
    .catch((e) => {
      // Only reading the request can fail here (e.g. the client went away); there is no one to answer.
      state.write(`hook server: ${req.method} ${req.url}: ${e instanceof Error ? e.message : String(e)}`);
      res.destroy();
    });
}

/** `server.drain()`: the first call starts the drain, every call returns the same promise. */
function drainer(server, state, active, drainSeconds) {
  let drained;
  return () => {
    drained ??= new Promise((resolve) => {
      state.draining = true;
      for (const res of active) if (!res.headersSent) res.setHeader("Connection", "close");
      server.close(() => resolve());
      server.closeIdleConnections();
      const force = setTimeout(() => {
        state.write(`hook server: ${active.size} call(s) still running after ${drainSeconds}s: cut`);
        server.closeAllConnections();
      }, drainSeconds * 1000);
      force.unref();
      server.once("close", () => clearTimeout(force));
    });
    return drained;
  };
}

async function handle(table, state, req, res) {
  // Read the whole body before answering anything: the hub keeps connections alive.
  let body;
  try {
    body = await readBody(req, state.maxBody);
  } catch (e) {
    if (e instanceof BodyTooLarge) return refuseTooLarge(res, e);
    throw e;
  }
  const path = (req.url ?? "/").split("?")[0];
  if (path === HEALTH_PATH && (req.method === "GET" || req.method === "HEAD")) {
    // Failing readiness while draining takes the Pod out of its Service before it is gone.
    return state.draining ? reply(res, 503, "draining") : reply(res, 200, "ok");
  }
  const fn = table.get(path);
  if (!fn) return reply(res, 404, `no hook at ${path}; known paths: ${state.known}; health: GET ${HEALTH_PATH}`);
  if (req.method !== "POST") {
    return reply(res, 405, `${req.method} not allowed: hooks are called with POST`, { Allow: "POST" });
  }
  let request;
  try {
    request = JSON.parse(body.toString("utf8"));
  } catch (e) {
    return reply(res, 400, `request body is not valid JSON: ${e instanceof Error ? e.message : e}`);
  }
  if (request === null || typeof request !== "object" || Array.isArray(request)) {
    return reply(res, 400, `request body must be a JSON object, not ${describe(request)}`);
  }
  const trace = parseTraceparent(req.headers.traceparent);
  const fields = { ...parentFields(request), ...(await call(fn, path, request, res, state, trace)) };
  if (trace) fields.trace = trace.traceId;
  return fields;
}

/**
 * Serves `routes` and resolves with the listening server once it listens. The address is
 * `options.port`/`options.host`, else `$PORT`/`$HOST`, else `0.0.0.0:8080` (all interfaces, as a hook
 * in a Pod must); tests pass `{ port: 0, host: "127.0.0.1" }` and read `server.address().port`.
 * On SIGTERM or SIGINT (unless `handleSignals: false`) the server drains and closes, and the process
 * exits once nothing else keeps it alive. `logRequests` defaults to `$METAHOOK_LOG_REQUESTS`.
 */
export function serve(routes, options = {}) {
  const { host, port } = listenAddress(options);
  const logRequests = options.logRequests ?? ["1", "true", "yes", "json"].includes((process.env[LOG_ENV] ?? "").toLowerCase());
  const server = createHookServer(routes, { ...options, logRequests });
  const write = options.log ?? ((line) => process.stderr.write(`${line}\n`));
  if (options.handleSignals ?? true) {
    const onSignal = (signal) => {
      write(`hook server: ${signal}: draining (${server.inFlight()} call(s) in flight), then exiting`);
      server.drain();
    };
    process.on("SIGTERM", onSignal);
    process.on("SIGINT", onSignal);
    server.once("close", () => {
      process.off("SIGTERM", onSignal);
      process.off("SIGINT", onSignal);
    });
  }
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      const paths = [...Object.keys(routes)].sort().join(", ");
      if (!options.quiet) write(`metahook hooks ${paths} listening on ${describeListener(server)} (health: GET ${HEALTH_PATH})`);
      resolve(server);
    });
  });
}

/** Where the server listens, as the start-up line says it: `https://0.0.0.0:8443 (client certificates required)`. */
function describeListener(server) {
  const bound = server.address();
  const where = typeof bound === "object" && bound ? `${bound.address}:${bound.port}` : String(bound);
  if (!(server instanceof https.Server)) return `http://${where}`;
  return server.requestCert ? `https://${where} (client certificates required)` : `https://${where}`;
}

/**
 * Calls `fn(request, ctx)` and answers with what it returns or throws. Warnings it logs through
 * `ctx.log` (or `requestLog()`) join the response's `events` when the answer has that field (sync,
 * finalize and map answers; not customize or tombstone ones, see `withWarnings`).
 */
async function call(fn, path, request, res, state, trace) {
  const { ctx, warnings } = callContext(path, request, state.write, trace);
  let response;
  try {
    response = await runInCall(ctx, () => fn(request, ctx));
  } catch (e) {
    if (e instanceof RetryLater) {
      reply(res, 429, e.message, { "Retry-After": String(Math.trunc(e.seconds)) });
      return {};
    }
    if (e instanceof PermanentError) {
      reply(res, 422, e.message, { "Metahook-Error": "permanent" });
      return { error: `PermanentError: ${e.message}` };
    }
    const what = e instanceof Error ? `${e.name}: ${e.message}` : `${typeof e}: ${String(e)}`;
    if (!state.logRequests) console.error(`hook ${path} failed:`, e);
    reply(res, 500, `hook ${path} raised ${what}${e instanceof Error && e.stack ? `\n\n${e.stack}` : ""}`);
    return { error: what };
  }
  if (response === undefined || response === null) return reply(res, 500, `hook ${path} returned nothing`);
  if (typeof response !== "object" || Array.isArray(response)) {
    return reply(res, 500, `hook ${path} must return an object, not ${describe(response)}`);
  }
  response = withWarnings(request, response, warnings);
  let encoded;
  try {
    encoded = JSON.stringify(response);
  } catch (e) {
    return reply(res, 500, `hook ${path} response is not JSON: ${e instanceof Error ? e.message : e}`);
  }
  send(res, 200, "application/json", encoded, state.answered);
  return {};
}

/** A hook version as a header can carry it: one line, not empty; `undefined` stays so. */
function hookVersionOf(text) {
  if (text === undefined) return undefined;
  const version = String(text).trim();
  if (version === "" || /[\r\n]/.test(version)) {
    throw new RangeError(`hookVersion ${JSON.stringify(text)}: one line, not empty`);
  }
  return version;
}

/**
 * The request log fields naming the object the call is for, and for a MapController's map and
 * tombstone calls the input's map key (its UID, as in the outputs' `metahook.dev/map-key` label).
 */
function parentFields(request) {
  const parent = request.parent ?? request.object;
  if (parent === null || typeof parent !== "object") return {};
  const fields = { parent: parentName(request), kind: parent.kind ?? "" };
  if (typeof request.mapKey === "string") fields.mapKey = request.mapKey;
  if ("finalizing" in request) fields.finalizing = Boolean(request.finalizing);
  return fields;
}

function logCall(state, req, res, started, fields) {
  const path = (req.url ?? "/").split("?")[0];
  if (state.logRequests) {
    const durationMs = Number(process.hrtime.bigint() - started) / 1e6;
    const line = { time: new Date().toISOString(), method: req.method, path, status: res.statusCode, durationMs, ...fields };
    state.write(JSON.stringify(line));
  } else if (res.statusCode >= 400 && res.statusCode !== 429) {
    // Successful calls come at every resync; only failures are worth a line by default.
    state.write(`hook server: ${req.method} ${path} -> ${res.statusCode}${fields.trace ? ` trace=${fields.trace}` : ""}`);
  }
}

/**
 * 413, and the connection closed after it: the rest of the body is never read, so the connection
 * cannot carry another request.
 */
function refuseTooLarge(res, error) {
  res.once("finish", () => res.socket?.destroySoon());
  return reply(res, 413, error.message, { Connection: "close" });
}

function reply(res, code, text, headers = {}) {
  send(res, code, "text/plain; charset=utf-8", `${text}\n`, headers);
  return {};
}

function send(res, code, contentType, body, headers = {}) {
  res.writeHead(code, { "Content-Type": contentType, "Content-Length": Buffer.byteLength(body), ...headers });
  res.end(body);
}
