import json
import math
from types import SimpleNamespace

import pytest
import torch

from grpo_cli.algorithm.scored import (
    expected_zero_variance_fraction,
    mean_expected_zero_variance_fraction,
)
from grpo_cli.train.alarms import (
    HIGH_KL,
    LOW_ENTROPY,
    ZERO_VARIANCE,
    AlarmEvent,
    AlarmMonitor,
)


def trips(monitor, stream, metric, start=0):
    """[(step, alarm)] of every event while feeding `stream` as `metric`."""
    events = []
    for step, value in enumerate(stream, start=start):
        events += [(event.step, event.alarm) for event in monitor.update(step, {metric: value})]
    return events


def test_entropy_trips_exactly_at_patience_and_once():
    monitor = AlarmMonitor(entropy_floor=0.5, entropy_patience=50)
    for step in range(49):
        assert monitor.update(step, {"entropy": 0.4}) == []
    events = monitor.update(49, {"entropy": 0.4})
    assert len(events) == 1
    event = events[0]
    assert isinstance(event, AlarmEvent)
    assert (event.step, event.alarm, event.value) == (49, LOW_ENTROPY, 0.4)
    assert "entropy" in event.message and "0.5" in event.message
    assert trips(monitor, [0.1] * 100, "entropy", start=50) == []  # latched


def test_entropy_at_the_floor_does_not_count_and_resets():
    monitor = AlarmMonitor(entropy_floor=0.5, entropy_patience=3)
    assert trips(monitor, [0.4, 0.4, 0.5, 0.4, 0.4, 0.6, 0.4, 0.4, 0.4], "entropy") == [
        (8, LOW_ENTROPY)
    ]


def test_nan_and_missing_metrics_neither_count_nor_reset():
    monitor = AlarmMonitor(entropy_floor=0.5, entropy_patience=4)
    assert monitor.update(0, {"entropy": 0.1}) == []
    assert monitor.update(1, {"entropy": float("nan")}) == []
    assert monitor.update(2, {}) == []
    assert monitor.update(3, {"entropy": 0.1}) == []
    assert monitor.update(4, {"entropy": 0.1}) == []
    assert [e.step for e in monitor.update(5, {"entropy": 0.1})] == [5]


def test_zero_variance_trips_strictly_above_ceiling_after_patience():
    monitor = AlarmMonitor(zero_variance_ceiling=0.9, zero_variance_patience=20)
    assert trips(monitor, [0.9] * 30, "zero_variance_frac") == []  # not strictly above
    assert trips(monitor, [0.95] * 19, "zero_variance_frac", start=30) == []
    assert trips(monitor, [0.95], "zero_variance_frac", start=49) == [(49, ZERO_VARIANCE)]


def test_kl_trips_on_the_first_step_above_the_bound():
    monitor = AlarmMonitor(kl_max=1.0)
    assert trips(monitor, [0.5, 1.0, float("nan")], "kl") == []
    assert trips(monitor, [1.01, 2.0], "kl", start=3) == [(3, HIGH_KL)]


def test_alarms_are_independent_within_one_step():
    monitor = AlarmMonitor(entropy_patience=2, zero_variance_patience=1, kl_max=0.1)
    first = monitor.update(0, {"entropy": 0.1, "zero_variance_frac": 1.0, "kl": 0.5})
    assert sorted(e.alarm for e in first) == [HIGH_KL, ZERO_VARIANCE]
    second = monitor.update(1, {"entropy": 0.1, "zero_variance_frac": 1.0, "kl": 0.5})
    assert [e.alarm for e in second] == [LOW_ENTROPY]


def test_state_round_trip_resumes_the_count():
    uninterrupted = AlarmMonitor(entropy_patience=50)
    reference = trips(uninterrupted, [0.2] * 60, "entropy")
    assert reference == [(49, LOW_ENTROPY)]

    first = AlarmMonitor(entropy_patience=50)
    assert trips(first, [0.2] * 30, "entropy") == []
    state = json.loads(json.dumps(first.state_dict()))
    assert state["streaks"][LOW_ENTROPY] == 30
    resumed = AlarmMonitor(entropy_patience=50)
    resumed.load_state_dict(state)
    assert trips(resumed, [0.2] * 30, "entropy", start=30) == reference

    again = AlarmMonitor(entropy_patience=50)
    again.load_state_dict(resumed.state_dict())
    assert trips(again, [0.2] * 60, "entropy", start=60) == []  # tripped stays tripped


def test_load_rejects_unknown_alarms_and_bad_patience():
    with pytest.raises(ValueError, match="unknown alarms"):
        AlarmMonitor().load_state_dict({"streaks": {"nope": 1}, "tripped": []})
    with pytest.raises(ValueError, match="patience >= 1"):
        AlarmMonitor(entropy_patience=0)


def test_from_config_uses_alarm_config_fields():
    from grpo_cli.config.schema import AlarmConfig

    config = AlarmConfig(entropy_floor=1.0, entropy_patience=2)
    monitor = AlarmMonitor.from_config(config)
    assert trips(monitor, [0.9, 0.9], "entropy") == [(1, LOW_ENTROPY)]
    plain = AlarmMonitor.from_config(
        SimpleNamespace(
            entropy_floor=0.5,
            entropy_patience=1,
            zero_variance_ceiling=0.5,
            zero_variance_patience=1,
            kl_max=1.0,
        )
    )
    assert trips(plain, [0.6], "zero_variance_frac") == [(0, ZERO_VARIANCE)]


def test_expected_zero_variance_fraction():
    assert expected_zero_variance_fraction(0.5, 2) == pytest.approx(0.5)
    assert expected_zero_variance_fraction(0.2, 4) == pytest.approx(0.2**4 + 0.8**4)
    assert expected_zero_variance_fraction(0.2, 4) == pytest.approx(0.4112)
    assert expected_zero_variance_fraction(0.0, 8) == 1.0
    assert expected_zero_variance_fraction(1.0, 8) == 1.0
    with pytest.raises(ValueError, match="success rate"):
        expected_zero_variance_fraction(1.5, 2)


def test_mean_expected_zero_variance_fraction_over_prompts():
    # R = 2: p = 0.5 -> 0.5, p = 0.2 -> 0.04 + 0.64
    assert mean_expected_zero_variance_fraction([0.5, 0.2], 2) == pytest.approx((0.5 + 0.68) / 2)
    assert mean_expected_zero_variance_fraction(torch.tensor([0.0, 1.0]), 4) == pytest.approx(1.0)
    assert math.isnan(mean_expected_zero_variance_fraction([], 4))
