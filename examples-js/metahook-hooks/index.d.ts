/**
 * Types of metahook-hooks: the hook wire protocol (Metacontroller v1/v2 plus metahook's `events`
 * extension) and the library's functions. Field names are the JSON names.
 */

import type { Server } from "node:http";

/** A whole Kubernetes object as JSON. */
export interface KubeObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; [key: string]: unknown };
  [key: string]: unknown;
}

/**
 * `children` / `attachments` / `related`: `"Kind.group/version"` → object key → object. The key is
 * `name` or `namespace/name` depending on the hook version; the accessors hide that.
 */
export type ObjectMap = Record<string, Record<string, KubeObject>>;

/** An Event the hub records on the parent (metahook extension; Metacontroller ignores it). */
export interface HookEvent {
  type: "Normal" | "Warning";
  reason: string;
  message: string;
}

/** Body of a CompositeController `sync` or `finalize` call. */
export interface CompositeRequest {
  controller: KubeObject;
  parent: KubeObject;
  children: ObjectMap;
  related: ObjectMap;
  finalizing: boolean;
}

/** Answer to a CompositeController `sync` or `finalize` call. */
export interface CompositeResponse {
  status?: Record<string, unknown> | null;
  children?: KubeObject[];
  resyncAfterSeconds?: number;
  finalized?: boolean;
  events?: HookEvent[];
}

/** Body of a DecoratorController `sync` or `finalize` call (the target is `object`). */
export interface DecoratorRequest {
  controller: KubeObject;
  object: KubeObject;
  attachments: ObjectMap;
  related: ObjectMap;
  finalizing: boolean;
}

/** Answer to a DecoratorController call; labels/annotations merge (`null` deletes a key). */
export interface DecoratorResponse {
  labels?: Record<string, string | null>;
  annotations?: Record<string, string | null>;
  status?: Record<string, unknown> | null;
  attachments?: KubeObject[];
  resyncAfterSeconds?: number;
  finalized?: boolean;
  events?: HookEvent[];
}

export interface LabelSelectorRequirement {
  key: string;
  operator: "In" | "NotIn" | "Exists" | "DoesNotExist";
  values?: string[];
}

export interface LabelSelector {
  matchLabels?: Record<string, string>;
  matchExpressions?: LabelSelectorRequirement[];
}

/** One kind of related object a customize hook asks for (`names` excludes the selectors). */
export interface RelatedResourceRule {
  apiVersion: string;
  resource: string;
  labelSelector?: LabelSelector;
  namespaceSelector?: LabelSelector;
  namespace?: string;
  names?: string[];
}

/** Body of a `customize` call, for both controller kinds (the target is `parent` here too). */
export interface CustomizeRequest {
  controller: KubeObject;
  parent: KubeObject;
}

export interface CustomizeResponse {
  relatedResources: RelatedResourceRule[];
}

export type HookRequest = CompositeRequest | DecoratorRequest | CustomizeRequest;
export type HookResponse = CompositeResponse | DecoratorResponse | CustomizeResponse;

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
/** `request.parent` (composite, customize) or `request.object` (decorator). */
export function parentOf(request: HookRequest): KubeObject;
/** Throws RangeError if the request has no entry for `type` (usually a typo). */
export function childrenOf(request: { children: ObjectMap }, type: string): KubeObject[];
export function attachmentsOf(request: { attachments: ObjectMap }, type: string): KubeObject[];
export function relatedOf(request: { related: ObjectMap }, type: string): KubeObject[];
/** Found by metadata, whatever the keying; throws RangeError if the name is ambiguous across namespaces. */
export function child(request: { children: ObjectMap }, type: string, name: string, namespace?: string): KubeObject | undefined;
export function attachment(request: { attachments: ObjectMap }, type: string, name: string, namespace?: string): KubeObject | undefined;
export function related(request: { related: ObjectMap }, type: string, name: string, namespace?: string): KubeObject | undefined;

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

export function relatedRule(
  apiVersion: string,
  resource: string,
  options?: { labelSelector?: LabelSelector; namespaceSelector?: LabelSelector; namespace?: string; names?: Iterable<string> },
): RelatedResourceRule;
export function customizeResponse(relatedResources?: Iterable<RelatedResourceRule>): CustomizeResponse;

// ---- serving ----------------------------------------------------------------------------------

/** A route's function; may be async. Returning nothing is answered 500. */
export type Handler<Req = any, Res = HookResponse> = (request: Req) => Res | null | undefined | Promise<Res | null | undefined>;
export type Routes = Record<string, Handler>;

/** Throw from a hook to answer 429 with `Retry-After: seconds`. */
export class RetryLater extends Error {
  constructor(seconds: number, message?: string);
  readonly seconds: number;
}

/** The server for `routes`, not yet listening. */
export function createHookServer(routes: Routes): Server;
/** Listens (default `0.0.0.0:8080`) and resolves with the listening server. */
export function serve(routes: Routes, options?: { port?: number; host?: string }): Promise<Server>;

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
}

export function loadObjects(fixture: Fixture): KubeObject[];
export function fixtureRequest(options: FixtureOptions): HookRequest;
export function runHookOnFixtures<Res = HookResponse>(
  fn: (request: any) => Res | null | undefined | Promise<Res | null | undefined>,
  options: FixtureOptions,
): Promise<Res>;
