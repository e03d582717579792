/**
 * Reading the object maps of a request without caring whether the hook is v1 or v2.
 *
 * A request's `children`, `attachments`, `related` and (MapController) `outputs` are maps
 * `"Kind.group/version"` → key → object, where the key is `name` or `namespace/name` depending on the
 * hook version and on the parent's scope (Metacontroller compatibility reference §2.2). Hooks should
 * not depend on that, so these accessors return arrays and find objects by their metadata, never by
 * their map key.
 */

/** The outer map key of a type: `Pod.v1` for the core group, `Deployment.apps/v1` otherwise. */
export function typeKey(apiVersion, kind) {
  return `${kind}.${apiVersion}`;
}

/**
 * The inner map key the hub uses for an object, or `null` when a v1 request cannot carry it.
 * v2 keys are uniform (`namespace/name`, or `name` for cluster-scoped objects); v1 keys are relative
 * to the parent: under a namespaced parent only objects of that namespace, and cluster-scoped ones (a
 * related Namespace), are sent, keyed by `name`.
 */
export function objectKey(version, parentNamespace, namespace, name) {
  const qualified = namespace ? `${namespace}/${name}` : name;
  if (version === "v2" || !parentNamespace) return qualified;
  if (version !== "v1") throw new Error(`unknown hook version ${JSON.stringify(version)}: expected "v1" or "v2"`);
  return !namespace || namespace === parentNamespace ? name : null;
}

/** The object the hook is called for: `parent` (composite, customize, map) or `object` (decorator). */
export function parentOf(request) {
  return "parent" in request ? request.parent : request.object;
}

/** Observed children of one type, e.g. `childrenOf(request, "Pod.v1")`. */
export const childrenOf = (request, type) => objectsOf(request, "children", type);
/** Observed attachments of one type (DecoratorController). */
export const attachmentsOf = (request, type) => objectsOf(request, "attachments", type);
/** Related objects of one type, as selected by the customize hook. */
export const relatedOf = (request, type) => objectsOf(request, "related", type);
/** Observed outputs of one type (MapController: the outputs made for this input, or the detached ones). */
export const outputsOf = (request, type) => objectsOf(request, "outputs", type);

/** The input a MapController `map` call is for. */
export function inputOf(request) {
  if (request.input === null || typeof request.input !== "object") {
    // A tombstone or finalize request has no input: its input is gone, or the parent is.
    throw new TypeError("the request has no `input`: only a MapController map call has one");
  }
  return request.input;
}

/** The child of that type and name (and namespace, if given), or `undefined`. */
export const child = (request, type, name, namespace) => find(request, "children", type, name, namespace);
/** The attachment of that type and name (and namespace, if given), or `undefined`. */
export const attachment = (request, type, name, namespace) => find(request, "attachments", type, name, namespace);
/** The related object of that type and name (and namespace, if given), or `undefined`. */
export const related = (request, type, name, namespace) => find(request, "related", type, name, namespace);
/** The output of that type and name (and namespace, if given), or `undefined`. */
export const output = (request, type, name, namespace) => find(request, "outputs", type, name, namespace);

function objectsOf(request, field, type) {
  // The hub sends an entry for every declared type, even an empty one, so a missing entry is
  // almost always a typo in the type key: say so instead of quietly returning nothing.
  const maps = request[field] ?? {};
  if (!Object.hasOwn(maps, type)) {
    const present = Object.keys(maps).sort().join(", ") || "none";
    throw new RangeError(
      `the request has no ${field} of type "${type}" (types present: ${present}); ` +
        `type keys look like "Pod.v1" or "Deployment.apps/v1"`,
    );
  }
  return Object.values(maps[type] ?? {});
}

function find(request, field, type, name, namespace) {
  const found = objectsOf(request, field, type).filter(
    (obj) => obj.metadata?.name === name && (namespace === undefined || obj.metadata.namespace === namespace),
  );
  if (found.length > 1) {
    // Only possible under a cluster-scoped parent, whose objects may live in several namespaces.
    const namespaces = found.map((obj) => obj.metadata.namespace ?? "").sort();
    throw new RangeError(
      `${found.length} ${type} objects are named "${name}" (namespaces ${namespaces.join(", ")}): pass a namespace`,
    );
  }
  return found[0];
}
