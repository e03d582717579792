"""Conditions are set like apimachinery's meta.SetStatusCondition does."""

from datetime import datetime, timezone

import pytest

from metahook_hooks import condition_status, find_condition, set_condition

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
T1 = datetime(2024, 5, 1, 12, 5, 30, 123456, tzinfo=timezone.utc)


def test_a_new_condition_gets_the_transition_time():
    assert set_condition(None, "Ready", True, "AllPodsReady", "2 of 2", now=T0) == [
        {"type": "Ready", "status": "True", "reason": "AllPodsReady", "message": "2 of 2",
         "lastTransitionTime": "2024-05-01T12:00:00Z"}
    ]


def test_same_status_keeps_the_time_but_takes_reason_and_message():
    before = set_condition([], "Ready", False, "Waiting", "0 of 2", now=T0)
    after = set_condition(before, "Ready", "False", "StillWaiting", "1 of 2", now=T1)
    assert after == [{"type": "Ready", "status": "False", "reason": "StillWaiting", "message": "1 of 2",
                      "lastTransitionTime": "2024-05-01T12:00:00Z"}]


def test_a_status_change_moves_the_time_and_other_conditions_stay_in_place():
    observed = [
        {"type": "Progressing", "status": "True", "reason": "Rolling", "message": "", "lastTransitionTime": "x"},
        {"type": "Ready", "status": "False", "reason": "Waiting", "message": "", "lastTransitionTime": "y"},
    ]
    after = set_condition(observed, "Ready", True, "AllPodsReady", observed_generation=3, now=T1)
    assert after[0] == observed[0]
    assert after[1] == {"type": "Ready", "status": "True", "reason": "AllPodsReady", "message": "",
                        "lastTransitionTime": "2024-05-01T12:05:30Z", "observedGeneration": 3}
    assert observed[1]["status"] == "False", "the observed list is not changed"


def test_lookups():
    conditions = set_condition(None, "Ready", "Unknown", "Starting", now=T0)
    assert find_condition(conditions, "Ready")["reason"] == "Starting"
    assert condition_status(conditions, "Ready") == "Unknown"
    assert find_condition(conditions, "Other") is None and condition_status(None, "Ready") is None


@pytest.mark.parametrize(("status", "reason", "error"), [
    ("Yes", "Fine", "status must be True, False or Unknown"),
    (True, "not camel case", "CamelCase"),
    (True, "", "CamelCase"),
])
def test_values_the_apiserver_would_refuse_are_refused_here(status, reason, error):
    with pytest.raises(ValueError, match=error):
        set_condition(None, "Ready", status, reason)
