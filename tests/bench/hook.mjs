// The benchmark's hook ("fanout"): a parent wants 3 ConfigMaps carrying its spec.version, and a status
// naming that version. Answers at once, counts calls, and remembers when each (parent, version) was
// first asked for, so the bench can time "parent changed -> hook called". Keys carry the namespace:
// every system of a run has its own, with the same parent names.
//
//   POST /sync                 the hook
//   GET  /stats                {"calls": n, "identical": m}: m of the n requests were identical to the
//                              previous request for the same parent (the parent, every child and the
//                              finalizing flag at the same UIDs and resourceVersions): resyncs, and
//                              redundant calls, which a level-triggered hub never needs to make
//   GET  /call?n=K             {"at": <unix ms of the K-th call>} or {"at": null}
//   GET  /seen?key=NS/NAME@VER {"at": <unix ms when first asked>} or {"at": null}
//
// No dependencies. Listens on 127.0.0.1:$PORT and prints "PORT <n>" once listening.
import http from "node:http";

let calls = 0;
let identical = 0;
// Per parent (namespace/name): the identity of its last request.
const lastRequest = new Map();

/// What a request shows, by identity: what the hook would be told again if it were asked again.
function identity(request) {
  const parent = request.parent.metadata;
  const children = Object.entries(request.children ?? {}).flatMap(([type, objects]) =>
    Object.entries(objects).map(([key, o]) => `${type} ${key} ${o.metadata.uid} ${o.metadata.resourceVersion}`),
  );
  children.sort();
  return [parent.uid, parent.resourceVersion, String(request.finalizing), ...children].join("\n");
}
// When each call came (unix ms), so the bench can time "the N-th call" exactly instead of by polling.
const callTimes = [];
const seen = new Map();

function sync(request) {
  const parent = request.parent;
  const who = `${parent.metadata.namespace}/${parent.metadata.name}`;
  const id = identity(request);
  if (lastRequest.get(who) === id) identical += 1;
  lastRequest.set(who, id);
  const name = parent.metadata.name;
  const version = String(parent.spec?.version ?? "0");
  const key = `${parent.metadata.namespace}/${name}@${version}`;
  if (!seen.has(key)) seen.set(key, Date.now());
  const children = [0, 1, 2].map((i) => ({
    apiVersion: "v1",
    kind: "ConfigMap",
    metadata: { name: `${name}-${i}` },
    data: { version, index: String(i) },
  }));
  return { status: { version }, children };
}

const server = http.createServer((req, res) => {
  const url = new URL(req.url, "http://localhost");
  if (req.method === "GET" && url.pathname === "/stats") {
    res.end(JSON.stringify({ calls, identical }));
    return;
  }
  if (req.method === "GET" && url.pathname === "/call") {
    res.end(JSON.stringify({ at: callTimes[Number(url.searchParams.get("n")) - 1] ?? null }));
    return;
  }
  if (req.method === "GET" && url.pathname === "/seen") {
    res.end(JSON.stringify({ at: seen.get(url.searchParams.get("key")) ?? null }));
    return;
  }
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    calls += 1;
    callTimes.push(Date.now());
    const body = JSON.stringify(sync(JSON.parse(Buffer.concat(chunks).toString())));
    res.writeHead(200, { "Content-Type": "application/json" });
    res.end(body);
  });
});
server.keepAliveTimeout = 60_000;
server.listen(Number(process.env.PORT ?? 0), "127.0.0.1", () => {
  console.log(`PORT ${server.address().port}`);
});
