/**
 * Types of metahook-hooks: the hook wire protocol (Metacontroller v1/v2 plus metahook's `events`
 * extension) and the library's functions. Field names are the JSON names.
 *
 * The request and response bodies are generated from the hub's own (Rust) types into `wire.d.ts`
 * (`make hook-wire-types`, which a test keeps current) and re-exported here; the Kubernetes object
 * types they are generic over (`KubeObject`, `ObjectMap`, ...) are written by hand below.
 */

import type { Server } from "node:http";

import type {
  CompositeRequest,
  CompositeResponse,
  CustomizeRequest,
  CustomizeResponse,
  DecoratorRequest,
  DecoratorResponse,
  HookEvent,
  LabelSelector,
  MapFinalizeRequest,
  MapFinalizeResponse,
  MapRequest,
  MapResponse,
  RelatedResourceRule,
  TombstoneRequest,
  TombstoneResponse,
} from "./wire.js";

export * from "./wire.js";

/** `metadata` of a Kubernetes object (the fields hooks usually read; others are `unknown`). */
export interface ObjectMeta {
  name: string;
  namespace?: string;
  uid?: string;
  generation?: number;
  resourceVersion?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  deletionTimestamp?: string;
  ownerReferences?: OwnerReference[];
  [key: string]: unknown;
}

export interface OwnerReference {
  apiVersion: string;
  kind: string;
  name: string;
  uid: string;
  controller?: boolean;
  blockOwnerDeletion?: boolean;
}

/** A whole Kubernetes object as JSON. */
export interface KubeObject {
  apiVersion: string;
  kind: string;
  metadata: ObjectMeta;
  [key: string]: unknown;
}

/**
 * A Kubernetes object with a typed `spec` and `status`: declare your parent type as
 * `type Greeting = Resource<{ replicas?: number; who: string }, { ready: number }>` and a
 * `CompositeRequest<Greeting>` gives you `parentOf(request).spec.who` as a `string`.
 */
export interface Resource<Spec = Record<string, unknown>, Status = Record<string, unknown>> extends KubeObject {
  spec: Spec;
  status?: Status;
}

/** One entry of `status.conditions` (metav1.Condition); build it with `setCondition`. */
export interface Condition {
  type: string;
  status: "True" | "False" | "Unknown";
  reason: string;
  message: string;
  lastTransitionTime: string;
  observedGeneration?: number;
}

/**
 * The declared child (or attachment, or related) types of a controller: type key → object type, e.g.
 * `{ "Pod.v1": Pod; "Service.v1": Service }`. The default lets any key through, typed `KubeObject`.
 */
export type ObjectTypes = Record<string, KubeObject>;

/**
 * `children` / `attachments` / `related`: `"Kind.group/version"` → object key → object. The key is
 * `name` or `namespace/name` depending on the hook version; the accessors hide that.
 */
export type ObjectMap<Types extends ObjectTypes = ObjectTypes> = { [Type in keyof Types]: Record<string, Types[Type]> };

/** `Request<Parent, Children>`: the composite request, the one most hooks take. */
export type Request<
  Parent extends KubeObject = KubeObject,
  Children extends ObjectTypes = ObjectTypes,
  Related extends ObjectTypes = ObjectTypes,
> = CompositeRequest<Parent, Children, Related>;

export type HookRequest =
  | CompositeRequest
  | DecoratorRequest
  | CustomizeRequest
  | MapRequest
  | TombstoneRequest
  | MapFinalizeRequest;
export type HookResponse =
  | CompositeResponse
  | DecoratorResponse
  | CustomizeResponse
  | MapResponse
  | TombstoneResponse
  | MapFinalizeResponse;

// ---- reading a request ------------------------------------------------------------------------

/** `Pod.v1` for the core group, `Deployment.apps/v1` otherwise. */
export function typeKey(apiVersion: string, kind: string): string;
/** The inner map key the hub uses, or `null` when a v1 request cannot carry the object. */
export function objectKey(
  version: "v1" | "v2",
  parentNamespace: string | null | undefined,
  namespace: string | null | undefined,
  name: string,
): string | null;
/** `request.parent` (composite, customize, map) or `request.object` (decorator), typed as the request declares it. */
export function parentOf<Parent extends KubeObject>(request: { parent: Parent }): Parent;
export function parentOf<Target extends KubeObject>(request: { object: Target }): Target;
export function parentOf(request: HookRequest): KubeObject;
/** The input of a MapController `map` call; throws TypeError for a request without one (tombstone, finalize). */
export function inputOf<Input extends KubeObject>(request: { input: Input }): Input;

/** The object type a request map holds under `Type` (`KubeObject` for an untyped request). */
type ObjectOf<Maps, Type> = Type extends keyof Maps ? (Maps[Type] extends Record<string, infer O> ? O : never) : never;

/** Throws RangeError if the request has no entry for `type` (usually a typo; a typed request catches it at compile time). */
export function childrenOf<Maps extends ObjectMap<any>, Type extends keyof Maps & string>(
  request: { children: Maps },
  type: Type,
): ObjectOf<Maps, Type>[];
export function attachmentsOf<Maps extends ObjectMap<any>, Type extends keyof Maps & string>(
  request: { attachments: Maps },
  type: Type,
): ObjectOf<Maps, Type>[];
export function relatedOf<Maps extends ObjectMap<any>, Type extends keyof Maps & string>(
  request: { related: Maps },
  type: Type,
): ObjectOf<Maps, Type>[];
/** A MapController's outputs of one type: those of this input (map) or the detached ones (tombstone). */
export function outputsOf<Maps extends ObjectMap<any>, Type extends keyof Maps & string>(
  request: { outputs: Maps },
  type: Type,
): ObjectOf<Maps, Type>[];
/** Found by metadata, whatever the keying; throws RangeError if the name is ambiguous across namespaces. */
export function child<Maps extends ObjectMap<any>, Type extends keyof Maps & string>(
  request: { children: Maps },
  type: Type,
  name: string,
  namespace?: string,
): ObjectOf<Maps, Type> | undefined;
export function attachment<Maps extends ObjectMap<any>, Type extends keyof Maps & string>(
  request: { attachments: Maps },
  type: Type,
  name: string,
  namespace?: string,
): ObjectOf<Maps, Type> | undefined;
export function related<Maps extends ObjectMap<any>, Type extends keyof Maps & string>(
  request: { related: Maps },
  type: Type,
  name: string,
  namespace?: string,
): ObjectOf<Maps, Type> | undefined;
export function output<Maps extends ObjectMap<any>, Type extends keyof Maps & string>(
  request: { outputs: Maps },
  type: Type,
  name: string,
  namespace?: string,
): ObjectOf<Maps, Type> | undefined;

// ---- building a response ----------------------------------------------------------------------

export function event(type: "Normal" | "Warning", reason: string, message?: string): HookEvent;

export interface CompositeResponseOptions {
  /** Required: the whole desired set; a child left out is deleted. */
  children: Iterable<KubeObject>;
  status?: Record<string, unknown> | null;
  resyncAfterSeconds?: number;
  finalized?: boolean;
  events?: Iterable<HookEvent>;
}
export function compositeResponse(options: CompositeResponseOptions): CompositeResponse;

export interface DecoratorResponseOptions {
  labels?: Record<string, string | null> | null;
  annotations?: Record<string, string | null> | null;
  status?: Record<string, unknown> | null;
  attachments?: Iterable<KubeObject>;
  resyncAfterSeconds?: number;
  finalized?: boolean;
  events?: Iterable<HookEvent>;
}
export function decoratorResponse(options?: DecoratorResponseOptions): DecoratorResponse;

export interface MapResponseOptions {
  /** Required: every output this input should have; one of its outputs left out is deleted. */
  outputs: Iterable<KubeObject>;
  resyncAfterSeconds?: number;
  events?: Iterable<HookEvent>;
}
/** Answer to a MapController `map` call (no `status`: the hub aggregates the parent's). */
export function mapResponse(options: MapResponseOptions): MapResponse;

export interface TombstoneResponseOptions {
  /**
   * The detached outputs to keep (observed objects or references); each is reduced to `apiVersion`,
   * `kind`, `metadata.name` and `metadata.namespace`. The others are deleted. Default: none.
   */
  keep?: Iterable<KubeObject | { apiVersion: string; kind: string; metadata: { name: string; namespace?: string } }>;
  /** Ask again after this many seconds, e.g. when the first kept output is due to go. */
  resyncAfterSeconds?: number;
}
/** Answer to a MapController `tombstone` call: `{outputs: [references to keep]}`; it has no `events`. */
export function tombstoneResponse(options?: TombstoneResponseOptions): TombstoneResponse;

export interface MapFinalizeResponseOptions {
  /** The parent may go; emitted only when true. */
  finalized?: boolean;
  resyncAfterSeconds?: number;
  events?: Iterable<HookEvent>;
}
/** Answer to a MapController `finalize` call. */
export function mapFinalizeResponse(options?: MapFinalizeResponseOptions): MapFinalizeResponse;

export function relatedRule(
  apiVersion: string,
  resource: string,
  options?: { labelSelector?: LabelSelector; namespaceSelector?: LabelSelector; namespace?: string; names?: Iterable<string> },
): RelatedResourceRule;
export function customizeResponse(relatedResources?: Iterable<RelatedResourceRule>): CustomizeResponse;

// ---- conditions -------------------------------------------------------------------------------

export interface ConditionOptions {
  type: string;
  status: boolean | "True" | "False" | "Unknown";
  /** A CamelCase word, as the API server requires. */
  reason: string;
  message?: string;
  observedGeneration?: number;
}
/**
 * The conditions with `type` set (added or replaced in place; the others kept). `lastTransitionTime`
 * is `now` when the status changes or the condition is new, and kept otherwise.
 */
export function setCondition(
  conditions: Iterable<Condition> | null | undefined,
  condition: ConditionOptions,
  now?: Date,
): Condition[];
export function findCondition(conditions: Iterable<Condition> | null | undefined, type: string): Condition | undefined;
export function conditionStatus(
  conditions: Iterable<Condition> | null | undefined,
  type: string,
): Condition["status"] | undefined;

// ---- serving ----------------------------------------------------------------------------------

/**
 * Log lines of one hook call, each naming the parent (`namespace/name`) and the path, on stderr (or the
 * server's `log`). Messages over 1024 characters are cut.
 */
export interface HookLog {
  info(message: string): void;
  /**
   * Also adds `{type: "Warning", reason, message}` to the response's `events` (sync, finalize and map
   * calls; not customize or tombstone calls, whose answers have no `events`),
   * which the hub records as an Event on the parent. `reason` defaults to `"HookWarning"`.
   */
  warn(message: string, reason?: string): void;
}

/** What a handler gets besides the request. */
export interface HookContext {
  log: HookLog;
  /**
   * The trace this call is part of (the hub's sync), 32 hex digits, from the request's W3C
   * `traceparent`; `""` when it came without a valid one (the hub exports no traces). `log` lines name
   * it as `trace=<id>`.
   */
  traceId: string;
  /** The `traceparent` the call came with, checked: the parent of a hook's own spans, or `""`. */
  traceparent: string;
}

/**
 * The logger of the hook call running now (the handler's `ctx.log`), for code the handler did not hand
 * `ctx` to; outside a call, a logger that only prints.
 */
export function requestLog(): HookLog;

/** A route's function; may be async. Returning nothing is answered 500. */
export type Handler<Req = any, Res = HookResponse> = (
  request: Req,
  ctx: HookContext,
) => Res | null | undefined | Promise<Res | null | undefined>;
export type Routes = Record<string, Handler>;

/** Throw from a hook to answer 429 with `Retry-After: seconds`. */
export class RetryLater extends Error {
  constructor(seconds: number, message?: string);
  readonly seconds: number;
}

/**
 * Throw from a hook when calling again cannot help (e.g. an invalid spec field): answers 422 with
 * `Metahook-Error: permanent`; the hub reports it once and does not retry with backoff.
 */
export class PermanentError extends Error {
  constructor(message: string);
}

export const DEFAULT_PORT: 8080;
/** Seconds calls in flight may take to finish after SIGTERM. */
export const DRAIN_SECONDS: number;

/** The listening server (an `https.Server` with TLS files), plus a graceful stop. */
export interface HookServer extends Server {
  /** Stops accepting, lets calls in flight finish (at most `drainSeconds`), resolves once closed. */
  drain(): Promise<void>;
  /** Calls being answered right now. */
  inFlight(): number;
}

export interface ServerOptions {
  /** One JSON line per call (time, method, path, status, durationMs, parent, kind, mapKey, finalizing). */
  logRequests?: boolean;
  drainSeconds?: number;
  /** Where log lines go (default: stderr). */
  log?: (line: string) => void;
  /**
   * Largest request body in bytes (default `$METAHOOK_MAX_BODY`, else 64 MiB); a larger one, declared
   * or chunked, is answered 413 and its connection closed without reading the rest.
   */
  maxBody?: number;
  /**
   * PEM certificate (chain) file: serve HTTPS (default `$TLS_CERT_FILE`). When it or the key changes
   * (a renewed Secret), new connections get the new certificate; a pair that does not load is logged
   * and the previous one kept.
   */
  tlsCert?: string;
  /** PEM private key file of `tlsCert` (default `$TLS_KEY_FILE`). */
  tlsKey?: string;
  /**
   * PEM CA file (default `$TLS_CLIENT_CA_FILE`): clients must present a certificate this CA signed
   * (mutual TLS), or the handshake fails. Needs `tlsCert` and `tlsKey`.
   */
  clientCa?: string;
  /**
   * This hook's version (default `$HOOK_VERSION`), sent with every answer as `Metahook-Hook-Version`:
   * a version the hub has not heard before makes it sync every parent again, paced.
   */
  hookVersion?: string;
}

/** The response header a hook names its version in. */
export const HOOK_VERSION_HEADER: "Metahook-Hook-Version";
/** The environment variable the server reads the hook's version from. */
export const HOOK_VERSION_ENV: "HOOK_VERSION";

export interface ServeOptions extends ServerOptions {
  /** Default: `$PORT`, else 8080. */
  port?: number;
  /** Default: `$HOST`, else `0.0.0.0`. */
  host?: string;
  /** Drain and close on SIGTERM/SIGINT (default true). */
  handleSignals?: boolean;
  /** Do not print the "listening on" line. */
  quiet?: boolean;
}

/** The server for `routes`, not yet listening. */
export function createHookServer(routes: Routes, options?: ServerOptions): HookServer;
/** Listens (default `$HOST:$PORT`, else `0.0.0.0:8080`) and resolves with the listening server. */
export function serve(routes: Routes, options?: ServeOptions): Promise<HookServer>;
/** The address `serve` listens on for these options and environment. */
export function listenAddress(
  options?: { port?: number; host?: string },
  env?: Record<string, string | undefined>,
): { host: string; port: number };

/** This library's version, as its package.json says (e.g. for a hook's startup log line). */
export const version: string;

// ---- testing ----------------------------------------------------------------------------------

/** A path to a `.json` fixture file, or an object given directly. */
export type Fixture = string | URL | Record<string, unknown>;

export interface FixtureOptions {
  controller: Fixture;
  parent: Fixture;
  /** Observed children (attachments, for a DecoratorController). */
  children?: Fixture[];
  related?: Fixture[];
  hook?: "sync" | "finalize" | "customize";
  /** Default: the version the controller declares for `hook`, else "v1". */
  version?: "v1" | "v2";
  /** Declared resource → Kind, when neither a fixture nor the built-in table tells it. */
  kinds?: Record<string, string>;
  /** Where `runHookOnFixtures` sends the hook's `ctx.log` lines (default: stderr). */
  log?: (line: string) => void;
}

export function loadObjects(fixture: Fixture): KubeObject[];
export function fixtureRequest(options: FixtureOptions): HookRequest;
/** Calls `fn(request, ctx)` as the server would: `ctx.log` warnings are added to the response's `events`. */
export function runHookOnFixtures<Res = HookResponse>(
  fn: (request: any, ctx: HookContext) => Res | null | undefined | Promise<Res | null | undefined>,
  options: FixtureOptions,
): Promise<Res>;
