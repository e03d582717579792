"""The accessors give the same answers for v1- and v2-keyed requests."""

import pytest

from metahook_hooks import (
    attachment,
    attachments_of,
    child,
    children_of,
    object_key,
    parent_of,
    related,
    related_of,
    type_key,
)


def pod(name, namespace="default"):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}}


PARENT = {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t", "namespace": "default"}}
V1 = {"parent": PARENT, "children": {"Pod.v1": {"a": pod("a"), "b": pod("b")}, "Service.v1": {}}, "related": {}}
V2 = {"parent": PARENT, "children": {"Pod.v1": {"default/a": pod("a"), "default/b": pod("b")}, "Service.v1": {}}, "related": {}}


def test_type_keys_omit_the_core_group():
    assert type_key("v1", "Pod") == "Pod.v1"
    assert type_key("apps/v1", "Deployment") == "Deployment.apps/v1"


def test_v1_keys_are_relative_to_a_namespaced_parent():
    assert object_key("v1", "default", "default", "a") == "a"
    assert object_key("v1", "default", "other", "a") is None
    assert object_key("v1", "default", None, "node-1") == "node-1"  # cluster-scoped: by name
    assert object_key("v1", None, "default", "a") == "default/a"
    assert object_key("v1", None, None, "node-1") == "node-1"


def test_v2_keys_are_uniform():
    assert object_key("v2", "default", "default", "a") == "default/a"
    assert object_key("v2", "default", "other", "a") == "other/a"
    assert object_key("v2", "default", None, "node-1") == "node-1"


def test_unknown_hook_version_is_refused():
    with pytest.raises(ValueError, match="v3"):
        object_key("v3", "default", "default", "a")


@pytest.mark.parametrize("request_", [V1, V2], ids=["v1", "v2"])
def test_children_and_child_ignore_the_keying(request_):
    assert [p["metadata"]["name"] for p in children_of(request_, "Pod.v1")] == ["a", "b"]
    assert children_of(request_, "Service.v1") == []
    assert child(request_, "Pod.v1", "b") == pod("b")
    assert child(request_, "Pod.v1", "b", namespace="default") == pod("b")
    assert child(request_, "Pod.v1", "b", namespace="other") is None
    assert child(request_, "Pod.v1", "zzz") is None


def test_a_type_missing_from_the_request_is_named_in_the_error():
    with pytest.raises(KeyError, match=r"'Pod/v1'.*Pod\.v1, Service\.v1"):
        children_of(V1, "Pod/v1")


def test_same_name_in_two_namespaces_needs_a_namespace():
    request = {"children": {"Pod.v1": {"x/a": pod("a", "x"), "y/a": pod("a", "y")}}}
    with pytest.raises(LookupError, match="pass namespace="):
        child(request, "Pod.v1", "a")
    assert child(request, "Pod.v1", "a", namespace="y") == pod("a", "y")


def test_decorator_requests_have_attachments_and_an_object():
    request = {"object": PARENT, "attachments": {"Pod.v1": {"a": pod("a")}}, "related": {"Secret.v1": {}}}
    assert parent_of(request) is PARENT
    assert attachments_of(request, "Pod.v1") == [pod("a")]
    assert attachment(request, "Pod.v1", "a") == pod("a")
    assert related_of(request, "Secret.v1") == []
    assert related(request, "Secret.v1", "a") is None
    with pytest.raises(KeyError):
        children_of(request, "Pod.v1")


def test_parent_of_reads_parent_for_composite_and_customize():
    assert parent_of({"controller": {}, "parent": PARENT}) is PARENT


def test_a_null_map_entry_reads_as_empty():
    assert children_of({"children": {"Pod.v1": None}}, "Pod.v1") == []
