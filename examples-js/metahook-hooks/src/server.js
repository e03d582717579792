/**
 * An HTTP server that routes hook calls (JSON POSTs) to plain functions, sync or async.
 *
 * Each route maps a path to `fn(request) => response`. Errors are answered so that the hub can put
 * them in a Kubernetes Event on the parent: the hub reports any non-200 answer as
 * "unsupported status code: <code> body: <body>" (first 1 KiB of the body), so the body starts with
 * the one line a human needs and only then carries the stack.
 */

import http from "node:http";

import { describe } from "./responses.js";

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

/** An `http.Server` for `routes` (`{"/sync": sync, ...}`), not yet listening. */
export function createHookServer(routes) {
  const table = new Map(Object.entries(routes));
  for (const [path, fn] of table) {
    if (!path.startsWith("/") || typeof fn !== "function") {
      throw new TypeError(`route "${path}": paths start with "/" and map to a function`);
    }
  }
  const known = [...table.keys()].sort().join(", ");
  return http.createServer((req, res) => {
    handle(table, known, req, res).catch((e) => {
      // Only reading the request can fail here (e.g. the client went away); there is no one to answer.
      console.error(`hook server: ${req.method} ${req.url}:`, e);
      res.destroy();
    });
  });
}

async function handle(table, known, req, res) {
  // Read the whole body before answering anything: the hub keeps connections alive.
  const body = await readBody(req);
  const path = req.url.split("?")[0];
  const fn = table.get(path);
  if (!fn) return reply(res, 404, `no hook at ${path}; known paths: ${known}`);
  if (req.method !== "POST") {
    return reply(res, 405, `${req.method} not allowed: hooks are called with POST`, { Allow: "POST" });
  }
  let request;
  try {
    request = JSON.parse(body.toString("utf8"));
  } catch (e) {
    return reply(res, 400, `request body is not valid JSON: ${e.message}`);
  }
  if (request === null || typeof request !== "object" || Array.isArray(request)) {
    return reply(res, 400, `request body must be a JSON object, not ${describe(request)}`);
  }
  await call(fn, path, request, res);
}

/**
 * Serves `routes` and resolves with the listening server once it listens. Defaults to all
 * interfaces, as a hook in a Pod must; tests pass `{ port: 0, host: "127.0.0.1" }` and read
 * `server.address().port`.
 */
export function serve(routes, { port = 8080, host = "0.0.0.0" } = {}) {
  const server = createHookServer(routes);
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      resolve(server);
    });
  });
}

async function call(fn, path, request, res) {
  let response;
  try {
    response = await fn(request);
  } catch (e) {
    if (e instanceof RetryLater) return reply(res, 429, e.message, { "Retry-After": String(Math.trunc(e.seconds)) });
    const what = e instanceof Error ? `${e.name}: ${e.message}` : `${typeof e}: ${String(e)}`;
    console.error(`hook ${path} failed:`, e);
    return reply(res, 500, `hook ${path} raised ${what}${e instanceof Error && e.stack ? `\n\n${e.stack}` : ""}`);
  }
  if (response === undefined || response === null) return reply(res, 500, `hook ${path} returned nothing`);
  if (typeof response !== "object" || Array.isArray(response)) {
    return reply(res, 500, `hook ${path} must return an object, not ${describe(response)}`);
  }
  let encoded;
  try {
    encoded = JSON.stringify(response);
  } catch (e) {
    return reply(res, 500, `hook ${path} response is not JSON: ${e.message}`);
  }
  send(res, 200, "application/json", encoded);
}

async function readBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return Buffer.concat(chunks);
}

function reply(res, code, text, headers = {}) {
  send(res, code, "text/plain; charset=utf-8", `${text}\n`, headers);
}

function send(res, code, contentType, body, headers = {}) {
  res.writeHead(code, { "Content-Type": contentType, "Content-Length": Buffer.byteLength(body), ...headers });
  res.end(body);
}
