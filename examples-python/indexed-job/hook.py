#!/usr/bin/env python3
"""indexed-job sync hook: one Pod per index, at most `parallelism` running, status counts them.

The desired children are: every Pod that already exists (so finished Pods stay, like a Job's), plus
Pods for indexes that never succeeded, as long as fewer than `parallelism` are active. A succeeded
index is remembered in the status, so it is not run again if its Pod is deleted. A failed Pod is not
retried (delete it to retry its index).

Uses metahook_hooks (standard library only). Listens on $HOST:$PORT (default 0.0.0.0:8080).
"""
import copy
from typing import Any, TypedDict

from metahook_hooks import (
    CompositeRequest,
    CompositeResponse,
    Condition,
    KubeObject,
    children_of,
    composite_response,
    condition_status,
    event,
    parent_of,
    serve,
    set_condition,
)

JOB_LABEL = "python.examples.metahook.dev/indexed-job"
INDEX_LABEL = "python.examples.metahook.dev/completion-index"
ACTIVE = ("Pending", "Running")


class IndexedJobSpec(TypedDict, total=False):
    completions: int
    parallelism: int
    template: dict[str, Any]


class IndexedJobStatus(TypedDict, total=False):
    completedIndexes: list[int]
    conditions: list[Condition]


class IndexedJob(TypedDict):
    """The parent, as the CRD declares it: a type checker then knows `spec` and `status`."""

    apiVersion: str
    kind: str
    metadata: dict[str, Any]
    spec: IndexedJobSpec
    status: IndexedJobStatus


def pod_for(job: IndexedJob, index: int) -> KubeObject:
    """The Pod for one index: the job's template, named `<job>-<index>`, with INDEX set."""
    template = copy.deepcopy(job["spec"]["template"])
    name = job["metadata"]["name"]
    metadata = template.get("metadata", {})
    labels = {**metadata.get("labels", {}), JOB_LABEL: name, INDEX_LABEL: str(index)}
    spec = template["spec"]
    spec.setdefault("restartPolicy", "Never")
    for container in spec["containers"]:
        env = [e for e in container.get("env", []) if e["name"] != "INDEX"]
        container["env"] = [*env, {"name": "INDEX", "value": str(index)}]
    pod_metadata = {"name": f"{name}-{index}", "labels": labels}
    if metadata.get("annotations"):
        pod_metadata["annotations"] = metadata["annotations"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_metadata, "spec": spec}


def sync(request: CompositeRequest) -> CompositeResponse:
    job = parent_of(request, as_type=IndexedJob)
    completions = job["spec"]["completions"]
    parallelism = job["spec"].get("parallelism", completions)
    previous = job.get("status", {})

    pods: dict[int, KubeObject] = {}
    for pod in children_of(request, "Pod.v1"):
        index = pod["metadata"].get("labels", {}).get(INDEX_LABEL, "")
        if index.isdigit() and int(index) < completions:
            pods[int(index)] = pod
    phase = {i: pod.get("status", {}).get("phase", "Pending") for i, pod in pods.items()}
    succeeded = {i for i, p in phase.items() if p == "Succeeded"} | set(previous.get("completedIndexes", []))
    failed = {i for i, p in phase.items() if p == "Failed"} - succeeded
    active = {i for i, p in phase.items() if p in ACTIVE and pods[i]["metadata"].get("deletionTimestamp") is None}

    # Keep every Pod we have; start missing indexes while there is room.
    wanted = set(pods)
    for index in range(completions):
        if len(active) >= parallelism:
            break
        if index not in pods and index not in succeeded:
            wanted.add(index)
            active.add(index)
    children = [pod_for(job, i) for i in sorted(wanted)]

    complete = len(succeeded) == completions
    # The status is replaced whole: carry the observed conditions forward, changing only Complete
    # (its lastTransitionTime moves only when it flips).
    was_complete = condition_status(previous.get("conditions"), "Complete") == "True"
    reason, message = ("AllIndexesSucceeded", "") if complete else ("Running", f"{len(succeeded)} of {completions} succeeded")
    status = {
        "active": len(active),
        "succeeded": len(succeeded),
        "failed": len(failed),
        "completedIndexes": sorted(succeeded),
        "conditions": set_condition(previous.get("conditions"), "Complete", complete, reason, message),
    }
    events = [event("Normal", "Completed", f"all {completions} indexes succeeded")] if complete and not was_complete else []
    return composite_response(children=children, status=status, events=events)


if __name__ == "__main__":
    serve({"/sync": sync})
