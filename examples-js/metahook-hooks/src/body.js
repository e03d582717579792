/**
 * Reading a request body under a size limit.
 *
 * The hub sends whole objects, so bodies are usually small, but a parent with thousands of children can
 * make one large, and a confused client can send anything. The limit keeps one call from taking the
 * hook's memory: a body over it is refused with 413 as soon as that is known (from Content-Length, or
 * while chunks arrive), without reading the rest.
 */

export const DEFAULT_MAX_BODY = 64 * 1024 * 1024;
const MAX_BODY_ENV = "METAHOOK_MAX_BODY";

/** A body over the limit: answered 413. */
export class BodyTooLarge extends Error {
  constructor(limit) {
    super(`request body is over the limit of ${limit} bytes (maxBody, or ${MAX_BODY_ENV})`);
    this.name = "BodyTooLarge";
    this.limit = limit;
  }
}

/** The limit in bytes: `option`, else `$METAHOOK_MAX_BODY`, else 64 MiB. A bad value throws at start-up. */
export function maxBodyBytes(option, env = process.env) {
  if (option === undefined) {
    const text = (env[MAX_BODY_ENV] ?? "").trim();
    if (text === "") return DEFAULT_MAX_BODY;
    option = /^\d+$/.test(text) ? Number(text) : NaN;
    if (!Number.isSafeInteger(option)) {
      throw new RangeError(`${MAX_BODY_ENV} must be a number of bytes, not ${JSON.stringify(text)}`);
    }
  }
  if (!Number.isSafeInteger(option) || option < 0) throw new RangeError(`maxBody must be a number of bytes, not ${option}`);
  return option;
}

/** Throws BodyTooLarge when the request declares a Content-Length over `limit` (chunked bodies declare none). */
export function checkDeclaredLength(req, limit) {
  const declared = Number(req.headers["content-length"] ?? 0);
  if (declared > limit) throw new BodyTooLarge(limit);
}

/**
 * The whole body. Rejects with BodyTooLarge once more than `limit` bytes arrived, leaving the rest
 * unread (the caller answers and closes the connection), and with an Error if the client goes away.
 */
export function readBody(req, limit) {
  checkDeclaredLength(req, limit);
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    const stop = (settle, value) => {
      req.off("data", onData).off("end", onEnd).off("error", onError).off("close", onClose);
      settle(value);
    };
    const onData = (chunk) => {
      size += chunk.length;
      if (size <= limit) return void chunks.push(chunk);
      req.pause();
      stop(reject, new BodyTooLarge(limit));
    };
    const onEnd = () => stop(resolve, Buffer.concat(chunks));
    const onError = (e) => stop(reject, e);
    const onClose = () => stop(reject, new Error("the client closed the connection before sending the whole body"));
    req.on("data", onData).once("end", onEnd).once("error", onError).once("close", onClose);
  });
}
