/**
 * The W3C trace context a hook call arrives with, so that the call's log lines name the sync's trace.
 *
 * A hub that exports traces sends every hook request with the `traceparent` of the call's span
 * (W3C Trace Context: `00-<trace id>-<parent id>-<flags>`, lower-case hex). The server checks it and
 * puts it on the call's context: `ctx.traceId` (and every `ctx.log` line, as `trace=<id>`) finds the
 * sync in a tracing UI, and a hook that makes spans of its own starts them from `ctx.traceparent`.
 * A missing or malformed header means no trace, never an error: the specification says to ignore a
 * `traceparent` that does not parse, and a hook must work with a hub that sends none.
 */

/** Version 00, the only one there is: exactly these four fields, in lower-case hex. */
const VERSION_00 = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/**
 * `value` (a `traceparent` header) as `{ traceId, parentId, flags, header }`, or null when it is absent
 * or not a valid version-00 one (all-zero ids are invalid too).
 */
export function parseTraceparent(value) {
  if (typeof value !== "string") return null;
  const match = VERSION_00.exec(value.replace(/^[ \t]+|[ \t]+$/g, ""));
  if (!match) return null;
  const [, traceId, parentId, flags] = match;
  if (/^0+$/.test(traceId) || /^0+$/.test(parentId)) return null;
  return { traceId, parentId, flags, header: `00-${traceId}-${parentId}-${flags}` };
}
