"""Builders emit the wire field names, only the fields given, and refuse what the hub would."""

import json

import pytest

from metahook_hooks import (
    composite_response,
    customize_response,
    decorator_response,
    event,
    related_rule,
)

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}}


def test_composite_response_uses_wire_names():
    response = composite_response(
        children=[POD],
        status={"ready": 1},
        resync_after_seconds=2.5,
        finalized=True,
        events=[event("Warning", "Slow", "took long")],
    )
    assert response == {
        "children": [POD],
        "status": {"ready": 1},
        "resyncAfterSeconds": 2.5,
        "finalized": True,
        "events": [{"type": "Warning", "reason": "Slow", "message": "took long"}],
    }
    json.dumps(response)


def test_composite_response_omits_what_was_not_given():
    # No `events` key unless there are events: Metacontroller's strict v2 mode rejects unknown fields.
    assert composite_response(children=()) == {"children": []}


def test_children_are_checked_for_identity():
    with pytest.raises(ValueError, match=r"children\[1\] has no metadata\.name"):
        composite_response(children=[POD, {"apiVersion": "v1", "kind": "Pod", "metadata": {}}])
    with pytest.raises(ValueError, match=r"children\[0\] has no apiVersion, kind"):
        composite_response(children=[{"metadata": {"name": "a"}}])
    with pytest.raises(TypeError, match=r"children\[0\] is a str"):
        composite_response(children=["a"])


def test_negative_resync_is_refused():
    with pytest.raises(ValueError, match="negative"):
        composite_response(children=[], resync_after_seconds=-1)


def test_decorator_response_merges_labels_and_deletes_with_none():
    response = decorator_response(labels={"team": "a", "old": None}, annotations={"note": "x"})
    assert response == {"attachments": [], "labels": {"team": "a", "old": None}, "annotations": {"note": "x"}}


def test_decorator_response_refuses_non_string_label_values():
    with pytest.raises(TypeError, match=r"labels values must be strings.*\['replicas'\]"):
        decorator_response(labels={"replicas": 3})


def test_decorator_response_carries_status_attachments_and_events():
    response = decorator_response(status={"ok": True}, attachments=[POD], events=[event("Normal", "Decorated")])
    assert response == {
        "attachments": [POD],
        "status": {"ok": True},
        "events": [{"type": "Normal", "reason": "Decorated", "message": ""}],
    }


def test_event_types_are_normal_or_warning():
    with pytest.raises(ValueError, match="'Error'"):
        event("Error", "Boom")
    with pytest.raises(ValueError, match="reason"):
        event("Normal", "")


def test_hand_written_events_are_checked_too():
    with pytest.raises(ValueError, match=r"events\[0\]"):
        composite_response(children=[], events=[{"type": "Info", "reason": "X", "message": ""}])


def test_customize_response_lists_related_rules():
    rule = related_rule("v1", "configmaps", label_selector={"matchLabels": {"app": "x"}}, namespace="default")
    assert customize_response([rule, related_rule("v1", "secrets", names=["a", "b"])]) == {
        "relatedResources": [
            {"apiVersion": "v1", "resource": "configmaps", "labelSelector": {"matchLabels": {"app": "x"}}, "namespace": "default"},
            {"apiVersion": "v1", "resource": "secrets", "names": ["a", "b"]},
        ]
    }
    assert customize_response() == {"relatedResources": []}


def test_related_rule_refuses_combinations_the_hub_refuses():
    with pytest.raises(ValueError, match="names cannot be combined"):
        related_rule("v1", "secrets", names=["a"], label_selector={})
    with pytest.raises(ValueError, match="namespace cannot be combined"):
        related_rule("v1", "secrets", namespace="a", namespace_selector={})
