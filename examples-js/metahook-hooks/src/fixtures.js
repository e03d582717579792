/**
 * Unit-testing a hook without a cluster: build the request the hub would send from fixture files.
 *
 * Fixtures are Kubernetes objects in `.json` files (one object, an array, or a `kind: List`), or
 * objects given directly. YAML is not read: this package has no dependencies, and Node has no
 * YAML parser (convert with e.g. `yq -o=json`).
 */

import { readFileSync } from "node:fs";

import { callContext, runInCall, withWarnings } from "./log.js";
import { objectKey, typeKey } from "./objects.js";

// Kinds of common built-in resources, for declared child types no fixture object shows
// (a plural cannot be turned back into a Kind reliably: "networkpolicies" → "NetworkPolicy").
const BUILTIN_KINDS = {
  pods: "Pod", services: "Service", configmaps: "ConfigMap", secrets: "Secret",
  serviceaccounts: "ServiceAccount", persistentvolumeclaims: "PersistentVolumeClaim",
  persistentvolumes: "PersistentVolume", namespaces: "Namespace", nodes: "Node",
  endpoints: "Endpoints", events: "Event", deployments: "Deployment", replicasets: "ReplicaSet",
  statefulsets: "StatefulSet", daemonsets: "DaemonSet", jobs: "Job", cronjobs: "CronJob",
  ingresses: "Ingress", networkpolicies: "NetworkPolicy", roles: "Role", rolebindings: "RoleBinding",
  clusterroles: "ClusterRole", clusterrolebindings: "ClusterRoleBinding",
  poddisruptionbudgets: "PodDisruptionBudget", horizontalpodautoscalers: "HorizontalPodAutoscaler",
};

const HOOKS = ["sync", "finalize", "customize"];

/** Every object in a fixture file (a path string or URL), or a copy of the one object given. */
export function loadObjects(fixture) {
  if (fixture !== null && typeof fixture === "object" && !(fixture instanceof URL)) return [structuredClone(fixture)];
  const path = String(fixture instanceof URL ? fixture.pathname : fixture);
  if (/\.ya?ml$/.test(path)) {
    throw new Error(`${path}: YAML fixtures are not supported (no dependencies); convert it to JSON, e.g. yq -o=json`);
  }
  if (!path.endsWith(".json")) throw new Error(`${path}: fixtures are .json files`);
  let doc = JSON.parse(readFileSync(fixture, "utf8"));
  if (doc?.kind === "List") doc = doc.items ?? [];
  const objects = Array.isArray(doc) ? doc : [doc];
  for (const obj of objects) {
    if (obj === null || typeof obj !== "object" || !obj.kind || !obj.apiVersion) {
      throw new Error(`${path}: every fixture object needs apiVersion and kind`);
    }
  }
  return objects;
}

/**
 * The request body the hub sends to `hook` ("sync", "finalize" or "customize") of the
 * CompositeController or DecoratorController `controller`, for `parent` and the observed `children`
 * (attachments, for a decorator) and `related` objects.
 *
 * As the hub does, it keys objects for the hook `version` (default: the one the controller declares
 * for that hook, else "v1"), drops what a v1 request cannot carry, and gives every declared child
 * type an entry even when empty. Fixture objects without a namespace are taken to live in the
 * parent's namespace. `kinds` maps a declared resource to its Kind (`{widgets: "Widget"}`) when
 * neither a fixture object nor the built-in table tells it.
 */
export function fixtureRequest({ controller, parent, children = [], related = [], hook = "sync", version, kinds = {} }) {
  if (!HOOKS.includes(hook)) throw new Error(`hook must be one of ${HOOKS.join(", ")}, not ${JSON.stringify(hook)}`);
  const ctl = one("controller", controller);
  const obj = one("parent", parent);
  const spec = ctl.spec ?? {};
  let parentField, objectsField, rules;
  if (ctl.kind === "CompositeController") {
    [parentField, objectsField, rules] = ["parent", "children", spec.childResources ?? []];
  } else if (ctl.kind === "DecoratorController") {
    [parentField, objectsField, rules] = ["object", "attachments", spec.attachments ?? []];
  } else {
    throw new Error(`controller must be a CompositeController or DecoratorController, not ${JSON.stringify(ctl.kind)}`);
  }
  if (hook === "customize") {
    if (children.length || related.length) throw new Error("a customize request carries only the controller and the parent");
    return { controller: ctl, parent: obj };
  }
  version ??= spec.hooks?.[hook]?.version || "v1";
  if (version !== "v1" && version !== "v2") throw new Error(`hook version must be "v1" or "v2", not ${JSON.stringify(version)}`);
  const parentNamespace = obj.metadata?.namespace;

  const observed = children.flatMap(loadObjects);
  const declared = Object.fromEntries(rules.map((rule) => [typeKey(rule.apiVersion, kindOf(rule, observed, kinds)), {}]));
  return {
    controller: ctl,
    [parentField]: obj,
    [objectsField]: objectMap(observed, version, parentNamespace, declared, objectsField),
    related: objectMap(related.flatMap(loadObjects), version, parentNamespace, null, "related"),
    finalizing: hook === "finalize",
  };
}

/**
 * Calls `fn(request, ctx)` (sync or async) with `fixtureRequest(options)` and the context the server
 * would give it, and resolves with its response as the hub would read it: warnings logged through
 * `ctx.log` added to `events`, after a JSON round trip (so what cannot be sent fails here). Log lines
 * go to `options.log`, else stderr.
 */
export async function runHookOnFixtures(fn, options) {
  const request = fixtureRequest(options);
  const write = options.log ?? ((line) => process.stderr.write(`${line}\n`));
  const { ctx, warnings } = callContext(`/${options.hook ?? "sync"}`, request, write);
  const response = await runInCall(ctx, () => fn(request, ctx));
  if (response === undefined || response === null) throw new Error("hook returned nothing");
  return JSON.parse(JSON.stringify(withWarnings(request, response, warnings)));
}

function one(what, fixture) {
  const objects = loadObjects(fixture);
  if (objects.length !== 1) throw new Error(`the ${what} fixture must hold exactly one object, it holds ${objects.length}`);
  return objects[0];
}

function kindOf(rule, observed, kinds) {
  const { apiVersion, resource } = rule;
  if (Object.hasOwn(kinds, resource)) return kinds[resource];
  for (const obj of observed) {
    const kind = obj.kind.toLowerCase();
    if (obj.apiVersion === apiVersion && [`${kind}s`, `${kind}es`, `${kind.slice(0, -1)}ies`].includes(resource)) {
      return obj.kind;
    }
  }
  if (Object.hasOwn(BUILTIN_KINDS, resource)) return BUILTIN_KINDS[resource];
  throw new Error(
    `cannot tell the Kind of declared resource ${apiVersion}/${resource}: ` +
      `pass kinds: {${resource}: "TheKind"} or add a fixture object of that type`,
  );
}

function objectMap(objects, version, parentNamespace, declared, field) {
  const maps = declared ?? {};
  for (const obj of objects) {
    obj.metadata ??= {};
    const { metadata } = obj;
    if (!metadata.name) throw new Error(`${field} fixture ${obj.kind} has no metadata.name`);
    if (parentNamespace && !metadata.namespace) metadata.namespace = parentNamespace;
    const type = typeKey(obj.apiVersion, obj.kind);
    if (declared && !Object.hasOwn(maps, type)) {
      const known = Object.keys(maps).sort().join(", ");
      throw new Error(`${field} fixture ${type} "${metadata.name}" is not a type the controller declares (${known})`);
    }
    const key = objectKey(version, parentNamespace, metadata.namespace, metadata.name);
    if (key === null) continue; // a v1 request under a namespaced parent only carries that namespace's objects
    maps[type] ??= {};
    if (Object.hasOwn(maps[type], key)) throw new Error(`${field} fixtures hold ${type} "${key}" twice`);
    maps[type][key] = obj;
  }
  return maps;
}
