// Type-level tests of index.d.ts: `make test` compiles this file with `tsc --strict` (it is never run).
// Each `@ts-expect-error` line must fail to compile, so the generics are shown to catch mistakes, not
// only to accept correct code.
import {
  PermanentError,
  attachmentsOf,
  child,
  childrenOf,
  compositeResponse,
  conditionStatus,
  decoratorResponse,
  inputOf,
  mapFinalizeResponse,
  mapResponse,
  output,
  outputsOf,
  parentOf,
  relatedOf,
  requestLog,
  runHookOnFixtures,
  serve,
  setCondition,
  tombstoneResponse,
} from "../index.js";
import type {
  CompositeResponse,
  Condition,
  CustomizeRequest,
  DecoratorRequest,
  DecoratorResponse,
  HookContext,
  HookLog,
  KubeObject,
  MapFinalizeRequest,
  MapFinalizeResponse,
  MapRequest,
  MapResponse,
  Request,
  Resource,
  TombstoneRequest,
  TombstoneResponse,
} from "../index.js";

type Greeting = Resource<{ replicas?: number; who: string }, { ready: number; conditions?: Condition[] }>;
type Pod = Resource<{ containers: { name: string; image: string }[] }, { phase?: string }>;

function sync(request: Request<Greeting, { "Pod.v1": Pod }, { "ConfigMap.v1": KubeObject }>): CompositeResponse {
  const greeting = parentOf(request);
  const who: string = greeting.spec.who;
  const replicas: number = greeting.spec.replicas ?? 1;
  const pods: Pod[] = childrenOf(request, "Pod.v1");
  const phase: string | undefined = pods[0]?.status?.phase;
  const first: Pod | undefined = child(request, "Pod.v1", "greeting-0");
  const configs: KubeObject[] = relatedOf(request, "ConfigMap.v1");
  // @ts-expect-error a misspelt type key is a compile error, not a RangeError at run time
  childrenOf(request, "Pod/v1");
  // @ts-expect-error spec fields have their declared types
  const wrong: number = greeting.spec.who;
  const conditions = setCondition(greeting.status?.conditions, { type: "Ready", status: pods.length === replicas, reason: "Counted" });
  const ready: "True" | "False" | "Unknown" | undefined = conditionStatus(conditions, "Ready");
  return compositeResponse({
    children: [],
    status: { who, phase, first: first?.metadata.name, configs: configs.length, conditions, ready, wrong },
  });
}

// Untyped requests still work, every object a KubeObject.
function untyped(request: Request): CompositeResponse {
  const pods: KubeObject[] = childrenOf(request, "anything.v1");
  return compositeResponse({ children: pods });
}

type CRD = Resource<{ group: string }>;
function decorate(request: DecoratorRequest<CRD, { "ClusterRole.rbac.authorization.k8s.io/v1": KubeObject }>): DecoratorResponse {
  const crd: CRD = parentOf(request);
  const roles = attachmentsOf(request, "ClusterRole.rbac.authorization.k8s.io/v1");
  // @ts-expect-error a decorator request has attachments, not children
  childrenOf(request, "Pod.v1");
  return decoratorResponse({ labels: { group: crd.spec.group }, attachments: roles });
}

async function customize(request: CustomizeRequest<Greeting>) {
  return { relatedResources: [{ apiVersion: "v1", resource: "configmaps", names: [parentOf(request).spec.who] }] };
}

// A handler may take the call's context: its logger prints and turns warnings into Events.
function logged(request: Request<Greeting>, ctx: HookContext): CompositeResponse {
  const { who } = parentOf(request).spec;
  if (who === "") throw new PermanentError("spec.who must not be empty");
  ctx.log.info(`greeting ${who}`);
  ctx.log.warn("no replicas given", "DefaultReplicas");
  const same: HookLog = requestLog();
  same.warn("from anywhere inside the call");
  // @ts-expect-error messages are strings
  ctx.log.warn(42);
  // @ts-expect-error a PermanentError needs its message
  new PermanentError();
  // The hub's trace, when it sends one: text, "" when there is none.
  const trace: string = ctx.traceId || "none";
  ctx.log.info(`in trace ${trace}, called by ${ctx.traceparent}`);
  // @ts-expect-error the trace id is text, not a number
  const asNumber: number = ctx.traceId;
  return compositeResponse({ children: [], status: { trace, asNumber } });
}

// MapController hooks: one input per map call, its outputs by declared type.
type Schedule = Resource<{ retainDetachedSeconds: number }>;
type Claim = Resource<{ storageClassName?: string }>;
type ConfigMap = KubeObject & { data?: Record<string, string> };
function map(request: MapRequest<Schedule, Claim, { "ConfigMap.v1": ConfigMap }>): MapResponse {
  const claim: Claim = inputOf(request);
  const storageClass: string | undefined = claim.spec.storageClassName;
  const retain: number = parentOf(request).spec.retainDetachedSeconds;
  const mine: ConfigMap[] = outputsOf(request, "ConfigMap.v1");
  const previous: ConfigMap | undefined = output(request, "ConfigMap.v1", `${claim.metadata.name}-snapshots`);
  // @ts-expect-error a misspelt output type key is a compile error
  outputsOf(request, "ConfigMap/v1");
  // @ts-expect-error a map request has outputs, not children
  childrenOf(request, "ConfigMap.v1");
  // @ts-expect-error the map answer needs its outputs: the whole desired set
  mapResponse({ resyncAfterSeconds: 5 });
  const data = { storageClass: storageClass ?? "", retain: String(retain), seen: String(mine.length + (previous ? 1 : 0)) };
  return mapResponse({ outputs: [{ apiVersion: "v1", kind: "ConfigMap", metadata: { name: "x" }, data }] });
}

function tombstone(request: TombstoneRequest<Schedule, { "ConfigMap.v1": ConfigMap }>): TombstoneResponse {
  // @ts-expect-error a tombstone request has no input
  inputOf(request);
  // @ts-expect-error a tombstone answer has no events
  tombstoneResponse({ keep: [], events: [] });
  return tombstoneResponse({ keep: outputsOf(request, "ConfigMap.v1"), resyncAfterSeconds: 60 });
}

function finalizeMap(request: MapFinalizeRequest<Schedule>): MapFinalizeResponse {
  const left: KubeObject[] = outputsOf(request, "anything.v1");
  return mapFinalizeResponse({ finalized: left.length === 0 });
}

async function main(): Promise<void> {
  // Typed handlers, sync and async, are routes; options are checked.
  const server = await serve(
    {
      "/sync": sync,
      "/untyped": untyped,
      "/decorate": decorate,
      "/customize": customize,
      "/logged": logged,
      "/map": map,
      "/tombstone": tombstone,
      "/finalize-map": finalizeMap,
    },
    { logRequests: true, maxBody: 1 << 20 },
  );
  await server.drain();
  // @ts-expect-error ports are numbers
  await serve({ "/sync": sync }, { port: "8080" });
  const secure = await serve({ "/sync": sync }, { tlsCert: "/tls/tls.crt", tlsKey: "/tls/tls.key", clientCa: "/tls/ca.crt" });
  await secure.drain();
  // @ts-expect-error TLS settings are file paths, not PEM contents
  await serve({ "/sync": sync }, { tlsCert: Buffer.from("-----BEGIN CERTIFICATE-----") });
  // @ts-expect-error a handler's second argument is the context, not a string
  await serve({ "/sync": (request: Request, path: string) => compositeResponse({ children: [], status: { path } }) });
  const response: CompositeResponse = await runHookOnFixtures(sync, { controller: "c.json", parent: "p.json" });
  void response;
}
void main;
