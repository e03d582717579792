/**
 * The per-call logger handed to hooks as `ctx.log`, and found again anywhere inside the call with
 * `requestLog()`.
 *
 * A hook's stderr is read by whoever runs the Pod; the person who wrote the parent reads
 * `kubectl describe` instead. So every line names the parent and the path, and every warning is also
 * added to the response's `events`, which the hub records as a Kubernetes Event on that parent.
 */

import { AsyncLocalStorage } from "node:async_hooks";

import { event } from "./responses.js";

/** Longest message kept, in characters: an Event's note holds about 1 KiB; longer ones are cut. */
export const MAX_MESSAGE = 1024;
const DEFAULT_REASON = "HookWarning";
const calls = new AsyncLocalStorage();

/** `message` as text, cut to MAX_MESSAGE characters (never inside a surrogate pair), ending in "…" if cut. */
export function cut(message) {
  const text = String(message);
  if (text.length <= MAX_MESSAGE) return text;
  const chars = Array.from(text);
  return chars.length <= MAX_MESSAGE ? text : `${chars.slice(0, MAX_MESSAGE - 1).join("")}…`;
}

/** One printed line per message, however many lines the message has. */
function oneLine(text) {
  return text.replace(/\r?\n/g, "\\n");
}

/**
 * A logger whose lines start with `where` and are given to `write`. Warnings go into `warnings`
 * (as Events) when that array is given; a print-only logger has none.
 */
function logger(where, write, warnings) {
  return {
    info(message) {
      write(`${where}: ${oneLine(cut(message))}`);
    },
    warn(message, reason = DEFAULT_REASON) {
      const warning = event("Warning", reason, cut(message));
      warnings?.push(warning);
      write(`${where}: warning ${reason}: ${oneLine(warning.message)}`);
    },
  };
}

const printOnly = logger("hook", (line) => process.stderr.write(`${line}\n`));

/**
 * The context of one call to `path` for `parent` ("namespace/name", or "" when the request names
 * none): `ctx.log` for the handler, and the warnings it logged, for the response.
 */
export function callContext(path, parent, write) {
  const warnings = [];
  return { ctx: { log: logger(`hook ${path} ${parent || "-"}`, write, warnings) }, warnings };
}

/** Runs `fn` as part of the call `ctx` belongs to, so that `requestLog()` inside it finds `ctx.log`. */
export function runInCall(ctx, fn) {
  return calls.run(ctx, fn);
}

/**
 * The logger of the hook call running now, the same as the handler's `ctx.log`, for code deep inside
 * a hook that was not handed `ctx`. Outside a call it only prints (to stderr), naming no parent.
 */
export function requestLog() {
  return calls.getStore()?.log ?? printOnly;
}

/**
 * `response` with `warnings` added after its own `events` (a copy: the handler's object may be shared).
 * An `events` that is not an array is left for the hub to refuse, rather than silently replaced.
 */
export function withWarnings(response, warnings) {
  if (warnings.length === 0) return response;
  const own = response.events ?? [];
  if (!Array.isArray(own)) return response;
  return { ...response, events: [...own, ...warnings] };
}
