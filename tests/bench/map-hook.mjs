// The hook of `make bench-map` (tests/bench/map.rs): the same controller written twice.
// - POST /map: a MapController's map call, one input ConfigMap → its output `<input>-out`.
// - POST /customize + POST /sync: the CompositeController way, every input in one request → every output.
// GET /stats: calls and request bytes per path, so the benchmark counts what each way sends.
// Prints `PORT <n>` once it listens (on a free port).
import http from "node:http";

const stats = {};
const output = (input, namespace) => ({
  apiVersion: "v1",
  kind: "ConfigMap",
  metadata: { name: `${input.metadata.name}-out`, namespace },
  data: { value: input.data?.value ?? "" },
});
const routes = {
  "/map": (req) => ({ outputs: [output(req.input, req.parent.metadata.namespace)] }),
  "/customize": () => ({
    relatedResources: [
      { apiVersion: "v1", resource: "configmaps", labelSelector: { matchLabels: { "bench-map-input": "yes" } } },
    ],
  }),
  "/sync": (req) => ({
    children: Object.values(req.related?.["ConfigMap.v1"] ?? {}).map((input) => output(input, req.parent.metadata.namespace)),
    status: {},
  }),
};

const server = http.createServer((request, response) => {
  if (request.method === "GET" && request.url === "/stats") {
    response.writeHead(200, { "content-type": "application/json" });
    response.end(JSON.stringify(stats));
    return;
  }
  const chunks = [];
  request.on("data", (c) => chunks.push(c));
  request.on("end", () => {
    const body = Buffer.concat(chunks);
    const route = routes[request.url];
    if (!route) {
      response.writeHead(404).end();
      return;
    }
    const entry = (stats[request.url] ??= { calls: 0, bytes: 0 });
    entry.calls += 1;
    entry.bytes += body.length;
    const answer = JSON.stringify(route(JSON.parse(body)));
    response.writeHead(200, { "content-type": "application/json" });
    response.end(answer);
  });
});
server.keepAliveTimeout = 60_000;
server.listen(0, "127.0.0.1", () => console.log(`PORT ${server.address().port}`));
