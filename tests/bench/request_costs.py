"""What one request of each kind the fanout workload's systems make costs the API server (and etcd).

`make bench-requests` (needs the test cluster: `make cluster-up`). Each kind is sent N times (N=, default
2000) by 5 threads on keep-alive connections, and the API server's and etcd's CPU seconds are read from
/proc before and after: CPU milliseconds per request, and the mean latency a client saw. The bench's
tables say how many of each a system makes per parent; this says what each one costs, so a difference
in the API server's CPU per parent can be put down to the requests that make it.

The requests, as the systems make them (tests/bench/main.rs, tests/bench/mcmix.rs, src/write/apply.rs,
src/engine/status.rs):
- the hub's fresh read of the parent before creating children;
- a child created by server-side apply: as `raw` sends it, and as the hub sends it (plus its applied
  annotation and the resourceVersion precondition that keeps it from taking over an object by name);
- a child created by POST, as Metacontroller creates it (its last-applied annotation);
- the parent's status: a merge patch (`raw`), the hub's JSON patch that first tests the UID, and
  Metacontroller's GET and PUT of the status subresource.

A figure is the API server's whole CPU over the run divided by the requests: its watch caches and
dispatch (to the cluster's own watchers) are counted with the writes that cause them.
"""

import hashlib
import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import http.client
import base64

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = int(os.environ.get("N", "2000"))
THREADS = 5
LOCAL = threading.local()
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "benchthings.bench.metahook.dev"},
    "spec": {"group": "bench.metahook.dev", "scope": "Namespaced",
             "names": {"kind": "BenchThing", "plural": "benchthings", "singular": "benchthing"},
             "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def kubeconfig():
    out = subprocess.run(
        [f"{ROOT}/tests/cluster/bin/kubectl", "config", "view", "--raw", "-o", "json"],
        env={**os.environ, "KUBECONFIG": f"{ROOT}/.cluster/kubeconfig"},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def tls_context(config, directory):
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    paths = {}
    for key, name, value in [
        ("ca", "ca.crt", cluster["certificate-authority-data"]),
        ("cert", "client.crt", user["client-certificate-data"]),
        ("key", "client.key", user["client-key-data"]),
    ]:
        paths[key] = os.path.join(directory, name)
        with open(paths[key], "wb") as f:
            f.write(base64.b64decode(value))
    context = ssl.create_default_context(cafile=paths["ca"])
    context.load_cert_chain(paths["cert"], paths["key"])
    return context, cluster["server"].removeprefix("https://")


def cluster_pid(name):
    with open(f"{ROOT}/.cluster/pids/{name}.pid") as f:
        return int(f.read())


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Api:
    def __init__(self, context, server):
        self.context = context
        self.host, port = server.rsplit(":", 1)
        self.port = int(port)

    def request(self, method, path, body=None, content_type="application/json"):
        if not hasattr(LOCAL, "connection"):
            LOCAL.connection = http.client.HTTPSConnection(self.host, self.port, context=self.context)
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        LOCAL.connection.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = LOCAL.connection.getresponse()
        data = response.read()
        if response.status >= 300:
            sys.exit(f"{method} {path}: {response.status} {data[:300]!r}")
        return json.loads(data) if data else None


def measure(send):
    """Sends request `i` for every i < N from THREADS threads: (API server ms, etcd ms, latency ms) per request."""

    failures = []

    def work(first):
        try:
            for i in range(first, N, THREADS):
                send(i)
        except BaseException as e:  # a failed request ends the run: a figure over part of N would lie
            failures.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    apiserver, etcd = cluster_pid("kube-apiserver"), cluster_pid("etcd")
    api0, etcd0, started = cpu_seconds(apiserver), cpu_seconds(etcd), time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    if failures:
        sys.exit(f"a request failed: {failures[0]!r}")
    return (
        (cpu_seconds(apiserver) - api0) * 1000 / N,
        (cpu_seconds(etcd) - etcd0) * 1000 / N,
        elapsed * 1000 * THREADS / N,
    )


def main():
    with tempfile.TemporaryDirectory() as directory:
        api = Api(*tls_context(kubeconfig(), directory))
        # The bench's parent type (tests/bench/main.rs installs the same on a fresh control plane).
        api.request("PATCH", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/benchthings.bench.metahook.dev"
                    "?fieldManager=bench-driver&force=true", CRD, "application/apply-patch+yaml")
        for _ in range(100):
            crd = api.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/benchthings.bench.metahook.dev")
            if any(c["type"] == "Established" and c["status"] == "True" for c in crd.get("status", {}).get("conditions", [])):
                break
            time.sleep(0.1)
        ns = f"request-costs-{int(time.time())}"
        api.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        parents = f"/apis/bench.metahook.dev/v1/namespaces/{ns}/benchthings"
        configmaps = f"/api/v1/namespaces/{ns}/configmaps"
        uids, versions = {}, {}

        def create_parent(i):
            body = {"apiVersion": "bench.metahook.dev/v1", "kind": "BenchThing", "metadata": {"name": f"p{i}"},
                    "spec": {"version": "1"}}
            created = api.request("PATCH", f"{parents}/p{i}?fieldManager=bench-driver", body, "application/apply-patch+yaml")
            uids[i] = created["metadata"]["uid"]
            versions[i] = created["metadata"]["resourceVersion"]

        def child(i, c, **meta):
            metadata = {"name": f"p{i}-{c}", "namespace": ns, "labels": {"controller-uid": uids[i]},
                        "ownerReferences": [{"apiVersion": "bench.metahook.dev/v1", "kind": "BenchThing", "name": f"p{i}",
                                             "uid": uids[i], "controller": True, "blockOwnerDeletion": True}]}
            metadata.update(meta)
            return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
                    "data": {"version": "1", "index": str(c)}}

        def applied_hash(i, c):
            return hashlib.sha1(f"{i}/{c}".encode()).hexdigest()[:32]

        def apply(i, c, manager, body):
            api.request("PATCH", f"{configmaps}/p{i}-{c}?fieldManager={manager}&force=true", body,
                        "application/apply-patch+yaml")

        def post_as_metacontroller(i):
            desired = child(i, 2)
            del desired["metadata"]["ownerReferences"]
            annotations = {"metacontroller.k8s.io/last-applied-configuration": json.dumps(desired)}
            api.request("POST", configmaps, child(i, 2, annotations=annotations))

        def status(i, patch, content_type):
            written = api.request("PATCH", f"{parents}/p{i}/status", patch, content_type)
            versions[i] = written["metadata"]["resourceVersion"]

        def status_json_patch(i):
            patch = [{"op": "test", "path": "/metadata/uid", "value": uids[i]},
                     {"op": "add", "path": "/status", "value": {"version": "2", "observedGeneration": 1}}]
            status(i, patch, "application/json-patch+json")

        def status_merge_patch_version(i):
            patch = {"metadata": {"resourceVersion": versions[i]}, "status": {"version": "4", "observedGeneration": 1}}
            status(i, patch, "application/merge-patch+json")

        def status_get_put(i):
            current = api.request("GET", f"{parents}/p{i}")
            current["status"] = {"version": "3", "observedGeneration": 1}
            versions[i] = api.request("PUT", f"{parents}/p{i}/status", current)["metadata"]["resourceVersion"]

        kinds = [
            ("GET of the parent (hub: before creating children)", lambda i: api.request("GET", f"{parents}/p{i}")),
            ("create, server-side apply (raw)", lambda i: apply(i, 0, "bench-raw", child(i, 0))),
            ("create, server-side apply (hub: + applied annotation, precondition)",
             lambda i: apply(i, 1, "metahook", child(i, 1, annotations={"metahook.dev/applied": applied_hash(i, 1)},
                                                      resourceVersion="1"))),
            ("create, POST (Metacontroller: + last-applied annotation)", post_as_metacontroller),
            ("status, merge patch (raw)", lambda i: status(i, {"status": {"version": "1", "observedGeneration": 1}}, "application/merge-patch+json")),
            ("status, JSON patch testing the UID (hub)", status_json_patch),
            ("status, GET + PUT of the subresource (Metacontroller)", status_get_put),
            ("status, merge patch naming the observed resourceVersion (hub candidate)", status_merge_patch_version),
            ("status, merge patch (raw), again", lambda i: status(i, {"status": {"version": "5", "observedGeneration": 1}}, "application/merge-patch+json")),
            ("status, JSON patch testing the UID (hub), again", lambda i: status(i, [{"op": "test", "path": "/metadata/uid", "value": uids[i]},
                         {"op": "add", "path": "/status", "value": {"version": "6", "observedGeneration": 1}}],
                "application/json-patch+json")),
        ]
        try:
            measure(create_parent)
            print(f"### CPU per request, N = {N}, {THREADS} threads\n")
            print("| request | API server CPU (ms) | etcd CPU (ms) | latency (ms) |\n|---|---|---|---|")
            for name, send in kinds:
                apiserver, etcd, latency = measure(send)
                print(f"| {name} | {apiserver:.2f} | {etcd:.2f} | {latency:.2f} |", flush=True)
        finally:
            api.request("DELETE", f"/api/v1/namespaces/{ns}")


if __name__ == "__main__":
    main()
