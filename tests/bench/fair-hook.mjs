// The fairness benchmark's hook (`make bench-fair`): a parent wants 3 ConfigMaps carrying its
// spec.version. Answers at once on /sync; on /slow, after 5 s (a controller whose hook is slow). It
// remembers when each (namespace/name, version) was first asked for, and counts calls by namespace, so
// the bench can time "parent changed -> hook called" and count a flood's calls.
//
//   POST /sync, /slow          the hook
//   GET  /seen?key=NS/NAME@VER {"at": <unix ms when first asked>} or {"at": null}
//   GET  /calls?ns=NS          {"calls": n}: calls for parents of namespace NS so far
//
// No dependencies. Listens on 127.0.0.1:$PORT and prints "PORT <n>" once listening.
import http from "node:http";

const seen = new Map();
const byNamespace = new Map();

function sync(request) {
  const parent = request.parent;
  const ns = parent.metadata.namespace;
  byNamespace.set(ns, (byNamespace.get(ns) ?? 0) + 1);
  const version = String(parent.spec?.version ?? "0");
  const key = `${ns}/${parent.metadata.name}@${version}`;
  if (!seen.has(key)) seen.set(key, Date.now());
  const children = [0, 1, 2].map((i) => ({
    apiVersion: "v1",
    kind: "ConfigMap",
    metadata: { name: `${parent.metadata.name}-${i}` },
    data: { version, index: String(i) },
  }));
  return { status: { version }, children };
}

const server = http.createServer((req, res) => {
  const url = new URL(req.url, "http://localhost");
  if (req.method === "GET" && url.pathname === "/seen") {
    res.end(JSON.stringify({ at: seen.get(url.searchParams.get("key")) ?? null }));
    return;
  }
  if (req.method === "GET" && url.pathname === "/calls") {
    res.end(JSON.stringify({ calls: byNamespace.get(url.searchParams.get("ns")) ?? 0 }));
    return;
  }
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const answer = JSON.stringify(sync(JSON.parse(Buffer.concat(chunks).toString())));
    const reply = () => {
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end(answer);
    };
    if (url.pathname === "/slow") setTimeout(reply, 5000);
    else reply();
  });
});
server.keepAliveTimeout = 60_000;
server.listen(Number(process.env.PORT ?? 0), "127.0.0.1", () => {
  console.log(`PORT ${server.address().port}`);
});
