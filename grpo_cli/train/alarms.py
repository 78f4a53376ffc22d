"""Training-health alarms: pure checks on the per-step metrics, no I/O.

Three alarms, each tripping at most once per run, at the step where its condition has held for
`patience` consecutive updates:

- "low_entropy": metrics["entropy"] < entropy_floor, patience entropy_patience;
- "zero_variance": metrics["zero_variance_frac"] > zero_variance_ceiling, patience
  zero_variance_patience;
- "high_kl": metrics["kl"] > kl_max, patience 1.

Comparisons are strict. A step whose metric holds and the condition fails resets that count to 0;
a missing or NaN metric (e.g. kl without a reference model) neither counts nor resets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grpo_cli.config.schema import AlarmConfig

LOW_ENTROPY = "low_entropy"
ZERO_VARIANCE = "zero_variance"
HIGH_KL = "high_kl"


@dataclass(frozen=True)
class AlarmEvent:
    """One row of events.csv."""

    step: int
    alarm: str
    value: float
    message: str


@dataclass(frozen=True)
class _Rule:
    alarm: str
    metric: str  # key in the step's metrics (a metrics.csv column)
    threshold: float
    above: bool  # trips on value > threshold (else value < threshold)
    patience: int
    description: str

    def holds(self, value: float) -> bool:
        return value > self.threshold if self.above else value < self.threshold


class AlarmMonitor:
    """Counts consecutive qualifying steps per alarm; `update` returns the alarms that trip."""

    def __init__(
        self,
        entropy_floor: float = 0.5,
        entropy_patience: int = 50,
        zero_variance_ceiling: float = 0.9,
        zero_variance_patience: int = 20,
        kl_max: float = 1.0,
    ) -> None:
        self.rules = (
            _Rule(
                LOW_ENTROPY, "entropy", entropy_floor, False, entropy_patience, "mean token entropy"
            ),
            _Rule(
                ZERO_VARIANCE,
                "zero_variance_frac",
                zero_variance_ceiling,
                True,
                zero_variance_patience,
                "zero-variance group fraction",
            ),
            _Rule(HIGH_KL, "kl", kl_max, True, 1, "KL to the reference"),
        )
        for rule in self.rules:
            if rule.patience < 1:
                raise ValueError(f"alarm {rule.alarm!r} needs patience >= 1, got {rule.patience}")
        self.streaks = {rule.alarm: 0 for rule in self.rules}  # consecutive qualifying steps
        self.tripped: set[str] = set()

    @classmethod
    def from_config(cls, alarms_cfg: AlarmConfig) -> AlarmMonitor:
        """Build from the `alarms` section (an `AlarmConfig`, or its DictConfig)."""
        return cls(
            entropy_floor=alarms_cfg.entropy_floor,
            entropy_patience=alarms_cfg.entropy_patience,
            zero_variance_ceiling=alarms_cfg.zero_variance_ceiling,
            zero_variance_patience=alarms_cfg.zero_variance_patience,
            kl_max=alarms_cfg.kl_max,
        )

    def update(self, step: int, metrics: Mapping[str, float]) -> list[AlarmEvent]:
        """Feed one optimizer step's metrics; return the events of alarms tripping now."""
        events = []
        for rule in self.rules:
            value = metrics.get(rule.metric)
            if value is None or math.isnan(float(value)):
                continue
            value = float(value)
            self.streaks[rule.alarm] = self.streaks[rule.alarm] + 1 if rule.holds(value) else 0
            if self.streaks[rule.alarm] >= rule.patience and rule.alarm not in self.tripped:
                self.tripped.add(rule.alarm)
                side = "above" if rule.above else "below"
                message = (
                    f"{rule.description} {value:.4g} {side} {rule.threshold:g} "
                    f"for {rule.patience} consecutive step(s)"
                )
                events.append(AlarmEvent(step=step, alarm=rule.alarm, value=value, message=message))
        return events

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable counters, for resumable checkpoints."""
        return {"streaks": dict(self.streaks), "tripped": sorted(self.tripped)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore counters saved by `state_dict`."""
        unknown = set(state["streaks"]) - set(self.streaks)
        if unknown:
            raise ValueError(f"unknown alarms in state: {sorted(unknown)}")
        self.streaks.update({name: int(count) for name, count in state["streaks"].items()})
        self.tripped = set(state["tripped"])
