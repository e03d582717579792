/**
 * The per-call logger handed to hooks as `ctx.log`, and found again anywhere inside the call with
 * `requestLog()`.
 *
 * A hook's stderr is read by whoever runs the Pod; the person who wrote the parent reads
 * `kubectl describe` instead. So every line names the parent and the path, and every warning is also
 * added to the response's `events`, which the hub records as a Kubernetes Event on that parent. When the
 * hub exports traces, every line names the sync's trace too (`trace=<id>`, see trace.js).
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

/** `namespace/name` of the object a request is for (`parent`, or a decorator's `object`); "" if none. */
export function parentName(request) {
  const parent = request.parent ?? request.object;
  if (parent === null || typeof parent !== "object") return "";
  const { name = "", namespace } = parent.metadata ?? {};
  return namespace ? `${namespace}/${name}` : name;
}

/**
 * The context of one call of `request` to `path`, in the trace `trace` (a `parseTraceparent` result, or
 * null): `ctx.log`, `ctx.traceId` and `ctx.traceparent` for the handler, and the warnings it logged, for
 * the response. Lines go to `write`.
 */
export function callContext(path, request, write, trace = null) {
  const warnings = [];
  const where = `hook ${path} ${parentName(request) || "-"}${trace ? ` trace=${trace.traceId}` : ""}`;
  const ctx = { log: logger(where, write, warnings), traceId: trace?.traceId ?? "", traceparent: trace?.header ?? "" };
  return { ctx, warnings };
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
 * Only answers that have an `events` field get them: sync, finalize and map answers. Customize answers
 * (only `relatedResources`) and tombstone answers (only `outputs` and `resyncAfterSeconds`) are left
 * alone, as strict (v2) decoding would refuse an `events` field: their warnings are only printed. An
 * `events` that is not an array is left for the hub to refuse, rather than silently replaced.
 */
export function withWarnings(request, response, warnings) {
  if (warnings.length === 0 || !answersWithEvents(request)) return response;
  const own = response.events ?? [];
  if (!Array.isArray(own)) return response;
  return { ...response, events: [...own, ...warnings] };
}

/**
 * Whether the answer to `request` has an `events` field, told by what the request carries: composite
 * sync (`children`), decorator (`object`, `attachments`), map (`input`) and every finalize
 * (`finalizing`) requests do; customize (`controller` and `parent` only) and tombstone (`mapKey` and
 * `outputs`, no `input`) requests do not.
 */
function answersWithEvents(request) {
  return ["children", "attachments", "object", "input", "finalizing"].some((field) => field in request);
}
