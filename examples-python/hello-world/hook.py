#!/usr/bin/env python3
"""The hello-world sync hook: a HelloWorld parent wants `replicas` Pods that greet `who`.

Standard library only. Listens on $HOST:$PORT (default 127.0.0.1:18080; in a Pod, HOST=0.0.0.0 so that
its Service reaches it).
"""
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def sync(parent: dict[str, Any], children: dict[str, dict[str, Any]]) -> dict[str, Any]:
    spec = parent["spec"]
    name = parent["metadata"]["name"]
    message = f'{spec.get("greeting", "Hello")}, {spec["who"]}!'
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{name}-{i}", "labels": {"app": "hello-world"}},
            "spec": {
                "restartPolicy": "Always",
                "containers": [{"name": "greeter", "image": "busybox", "command": ["echo", message]}],
            },
        }
        for i in range(spec.get("replicas", 1))
    ]
    observed = children["Pod.v1"].values()
    ready = sum(
        1
        for pod in observed
        for cond in pod.get("status", {}).get("conditions", [])
        if cond["type"] == "Ready" and cond["status"] == "True"
    )
    return {"status": {"message": message, "pods": len(observed), "readyPods": ready}, "children": pods}


class Hook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body = json.dumps(sync(request["parent"], request["children"])).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


if __name__ == "__main__":
    host = os.environ.get("HOST", "127.0.0.1")
    port = int(os.environ.get("PORT", "18080"))
    print(f"hello-world hook listening on {host}:{port}", flush=True)
    ThreadingHTTPServer((host, port), Hook).serve_forever()
