"""MapController helpers: reading a map call's input and outputs, and building its three answers."""

import json

import pytest

from metahook_hooks import (
    event,
    input_of,
    map_finalize_response,
    map_response,
    output,
    outputs_of,
    request_log,
    start_server,
    tombstone_response,
)

from test_server import call

PARENT = {"apiVersion": "example.com/v1", "kind": "Policy", "metadata": {"name": "p", "namespace": "team"}}
INPUT = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "db", "namespace": "team", "uid": "u-1"}}


def config_map(name, namespace="team", **more):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}, **more}


MAP = {
    "controller": {},
    "parent": PARENT,
    "mapKey": "u-1",
    "input": INPUT,
    "outputs": {"ConfigMap.v1": {"team/db-snapshots": config_map("db-snapshots")}, "Secret.v1": {}},
}
TOMBSTONE = {"controller": {}, "parent": PARENT, "mapKey": "u-0", "outputs": {"ConfigMap.v1": {}}}


def test_a_map_call_shows_its_input_and_its_outputs_by_type():
    assert input_of(MAP) is INPUT
    assert outputs_of(MAP, "ConfigMap.v1") == [config_map("db-snapshots")]
    assert outputs_of(MAP, "Secret.v1") == []
    assert output(MAP, "ConfigMap.v1", "db-snapshots") == config_map("db-snapshots")
    assert output(MAP, "ConfigMap.v1", "db-snapshots", "elsewhere") is None
    assert output(MAP, "ConfigMap.v1", "other") is None


def test_a_misspelt_output_type_or_an_input_outside_a_map_call_is_an_error_not_nothing():
    with pytest.raises(KeyError, match="no outputs of type 'ConfigMap'.*ConfigMap.v1, Secret.v1"):
        outputs_of(MAP, "ConfigMap")
    with pytest.raises(KeyError, match="only a MapController map call"):
        input_of(TOMBSTONE)


def test_map_response_is_the_inputs_whole_desired_set_with_only_the_fields_given():
    assert map_response(outputs=[]) == {"outputs": []}
    response = map_response(
        outputs=[config_map("db-snapshots", data={"pvc": "db"})],
        resync_after_seconds=30,
        events=[event("Normal", "Snapshotted", "db")],
    )
    assert response == {
        "outputs": [config_map("db-snapshots", data={"pvc": "db"})],
        "resyncAfterSeconds": 30,
        "events": [{"type": "Normal", "reason": "Snapshotted", "message": "db"}],
    }
    json.dumps(response)


def test_map_response_refuses_what_the_hub_would_naming_the_output():
    with pytest.raises(TypeError):
        map_response()  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=r"outputs\[1\] has no metadata.name"):
        map_response(outputs=[config_map("a"), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}])
    with pytest.raises(ValueError, match="must not be negative"):
        map_response(outputs=[], resync_after_seconds=-1)


def test_tombstone_response_names_the_outputs_to_keep_and_nothing_else():
    kept = config_map("db-snapshots", data={"big": "x" * 100}, status={"ignored": True})
    kept["metadata"]["labels"] = {"a": "b"}
    cluster_scoped = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n", "uid": "x"}}
    assert tombstone_response(keep=[kept, cluster_scoped], resync_after_seconds=60) == {
        "outputs": [
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "db-snapshots", "namespace": "team"}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}},
        ],
        "resyncAfterSeconds": 60,
    }
    # Keeping nothing is an answer too: every detached output goes.
    assert tombstone_response() == {"outputs": []}
    with pytest.raises(ValueError, match=r"keep\[0\] has no apiVersion"):
        tombstone_response(keep=[{"kind": "ConfigMap", "metadata": {"name": "a"}}])


def test_map_finalize_response_only_says_finalized_when_it_is():
    assert map_finalize_response(finalized=True) == {"finalized": True}
    assert map_finalize_response(finalized=False, resync_after_seconds=5) == {"resyncAfterSeconds": 5}


def warns(request):
    request_log().warning("no schedule label", reason="NoSchedule")
    return map_response(outputs=[])


def warns_in_tombstone(request):
    request_log().warning("keeping nothing")
    return tombstone_response()


@pytest.fixture()
def served():
    server = start_server({"/map": warns, "/tombstone": warns_in_tombstone})
    yield server
    server.shutdown()
    server.server_close()


def test_a_map_calls_warnings_become_events_and_a_tombstones_do_not(served):
    # A map answer has `events`; a tombstone answer has none, so its warnings are only logged.
    status, _, text = call(served, "/map", body=MAP)
    assert status == 200, text
    assert json.loads(text)["events"] == [{"type": "Warning", "reason": "NoSchedule", "message": "no schedule label"}]
    status, _, text = call(served, "/tombstone", body=TOMBSTONE)
    assert (status, json.loads(text)) == (200, {"outputs": []})
