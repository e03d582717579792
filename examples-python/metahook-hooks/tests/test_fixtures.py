"""The fixture helper builds the request the hub would send, keyed as the hub keys it."""

import sys
from pathlib import Path

import pytest

from metahook_hooks import (
    child,
    children_of,
    composite_response,
    event,
    fixture_request,
    load_objects,
    run_hook_on_fixtures,
)

HERE = Path(__file__).parent / "fixtures"
CONTROLLER, PARENT, PODS, CACHE, DECORATOR = (
    HERE / "controller.json",
    HERE / "parent.json",
    HERE / "pods.json",
    HERE / "cache.yaml",
    HERE / "decorator.json",
)
# The fixture controller declares a custom child type (`caches`); tests without a Cache fixture name its Kind.
KINDS = {"caches": "Cache"}


def test_v1_request_is_keyed_by_name_and_drops_other_namespaces():
    request = fixture_request(CONTROLLER, PARENT, [PODS, CACHE])
    assert set(request) == {"controller", "parent", "children", "related", "finalizing"}
    assert request["finalizing"] is False
    assert request["parent"]["metadata"]["name"] == "nginx-backend"
    children = request["children"]
    assert sorted(children) == ["Cache.example.com/v1", "PersistentVolumeClaim.v1", "Pod.v1"]
    assert sorted(children["Pod.v1"]) == ["nginx-backend-0", "nginx-backend-1"]
    assert children["PersistentVolumeClaim.v1"] == {}
    assert sorted(children["Cache.example.com/v1"]) == ["nginx-backend-cache"]
    assert request["related"] == {}


def test_objects_without_namespace_live_in_the_parents():
    request = fixture_request(CONTROLLER, PARENT, [PODS], kinds=KINDS)
    assert request["children"]["Pod.v1"]["nginx-backend-1"]["metadata"]["namespace"] == "default"


def test_version_comes_from_the_controllers_hook():
    # The fixture controller declares its finalize hook as v2.
    request = fixture_request(CONTROLLER, PARENT, [PODS], hook="finalize", kinds=KINDS)
    assert request["finalizing"] is True
    assert sorted(request["children"]["Pod.v1"]) == [
        "default/nginx-backend-0",
        "default/nginx-backend-1",
        "elsewhere/stray",
    ]


def test_version_can_be_forced():
    request = fixture_request(CONTROLLER, PARENT, [PODS], version="v2", kinds=KINDS)
    assert "default/nginx-backend-0" in request["children"]["Pod.v1"]
    with pytest.raises(ValueError, match="'v9'"):
        fixture_request(CONTROLLER, PARENT, [PODS], version="v9", kinds=KINDS)


def test_cluster_scoped_parent_gets_qualified_keys_in_v1():
    parent = {"apiVersion": "example.com/v1", "kind": "Backend", "metadata": {"name": "global"}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}}
    request = fixture_request(CONTROLLER, parent, [pod], kinds=KINDS)
    assert list(request["children"]["Pod.v1"]) == ["ns/p"]


def test_decorator_request_has_object_and_attachments():
    target = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "web", "namespace": "default"}}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-0"}}
    request = fixture_request(DECORATOR, target, [svc])
    assert set(request) == {"controller", "object", "attachments", "related", "finalizing"}
    assert request["attachments"] == {"Service.v1": {"default/web-0": {**svc, "metadata": {"name": "web-0", "namespace": "default"}}}}


def test_customize_request_has_controller_and_parent_only():
    request = fixture_request(DECORATOR, PARENT, hook="customize")
    assert set(request) == {"controller", "parent"}
    with pytest.raises(ValueError, match="only the controller and the parent"):
        fixture_request(DECORATOR, PARENT, [PODS], hook="customize")


def test_related_objects_are_keyed_by_their_own_type():
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"}}
    request = fixture_request(CONTROLLER, PARENT, related=[secret], kinds=KINDS)
    assert list(request["related"]) == ["Secret.v1"]
    assert list(request["related"]["Secret.v1"]) == ["creds"]


def test_undeclared_child_type_is_refused():
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}
    with pytest.raises(ValueError, match="Service.v1 's' is not a type the controller declares"):
        fixture_request(CONTROLLER, PARENT, [svc], kinds=KINDS)


def test_kind_of_a_custom_resource_must_be_known():
    with pytest.raises(ValueError, match="example.com/v1/caches.*kinds="):
        fixture_request(CONTROLLER, PARENT, [PODS])
    request = fixture_request(CONTROLLER, PARENT, [PODS], kinds=KINDS)
    assert request["children"]["Cache.example.com/v1"] == {}


def test_duplicate_objects_are_refused():
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nginx-backend-0"}}
    with pytest.raises(ValueError, match="twice"):
        fixture_request(CONTROLLER, PARENT, [PODS, pod], kinds=KINDS)


def test_fixture_dicts_are_not_modified():
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    fixture_request(CONTROLLER, PARENT, [pod], kinds=KINDS)
    assert pod == {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}


def test_parent_fixture_must_hold_one_object():
    with pytest.raises(ValueError, match="exactly one object, it holds 3"):
        fixture_request(CONTROLLER, PODS)


def test_yaml_without_pyyaml_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)  # makes `import yaml` raise ImportError
    with pytest.raises(RuntimeError, match="needs PyYAML.*convert the fixture to JSON"):
        load_objects(CACHE)


def test_yaml_is_read_when_pyyaml_is_installed():
    pytest.importorskip("yaml")
    (cache,) = load_objects(CACHE)
    assert cache["spec"] == {"sizeMi": 64}


def test_other_file_types_are_refused(tmp_path):
    path = tmp_path / "pod.txt"
    path.write_text("{}")
    with pytest.raises(ValueError, match=r"pod\.txt: fixtures are \.json files"):
        load_objects(path)


def test_objects_need_api_version_and_kind(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[{"metadata": {"name": "x"}}]')
    with pytest.raises(ValueError, match="needs apiVersion and kind"):
        load_objects(path)


def ready_pods(request):
    ready = [
        pod["metadata"]["name"]
        for pod in children_of(request, "Pod.v1")
        if {"type": "Ready", "status": "True"} in pod.get("status", {}).get("conditions", [])
    ]
    return composite_response(
        children=[child(request, "Pod.v1", "nginx-backend-0")],
        status={"ready": ready},
        events=[event("Normal", "Counted", f"{len(ready)} ready")],
    )


def test_run_hook_on_fixtures_returns_the_response():
    response = run_hook_on_fixtures(ready_pods, CONTROLLER, PARENT, [PODS, CACHE])
    assert response["status"] == {"ready": ["nginx-backend-0"]}
    assert response["children"][0]["metadata"]["name"] == "nginx-backend-0"
    assert response["events"] == [{"type": "Normal", "reason": "Counted", "message": "1 ready"}]


def test_run_hook_on_fixtures_fails_as_the_server_would():
    with pytest.raises(ValueError, match="hook returned nothing"):
        run_hook_on_fixtures(lambda request: None, CONTROLLER, PARENT, kinds=KINDS)
    with pytest.raises(TypeError, match="not JSON serializable"):
        run_hook_on_fixtures(lambda request: {"status": {1, 2}}, CONTROLLER, PARENT, kinds=KINDS)


def test_the_readme_example_hook_works():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    source = readme.split("```python\n", 1)[1].split("```", 1)[0]
    namespace = {"__name__": "readme_example"}  # not __main__: do not serve
    exec(compile(source, "README.md", "exec"), namespace)
    response = run_hook_on_fixtures(namespace["sync"], CONTROLLER, PARENT, [PODS, CACHE])
    assert [p["metadata"]["name"] for p in response["children"]] == ["nginx-backend-0", "nginx-backend-1"]
    assert response["status"] == {"replicas": 2, "running": 0}
    assert "events" not in response  # two pods observed, two wanted
