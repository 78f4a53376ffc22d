"""`fault.step=N fault.kind=...`: a failure on purpose at step N, to rehearse what a run leaves
behind when it crashes, is interrupted or sent SIGTERM, meets a NaN loss or a full disk: its
status in run.json, its rows written so far, its checkpoints, and the resume of the same
command without the fault. The tests of those guarantees use it (tests/test_run_reliability.py),
and a researcher can run the same check on a cluster before a long job. Off unless `fault.step`
is set.

`fault.*` is left out of the run directory's name (conf/config.yaml), so that the re-run without
the fault resumes in the directory that the faulty run left.
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass

FAULT_KINDS = ("crash", "interrupt", "nan_loss", "disk_full", "sigterm")  # what each does: FaultConfig (config/schema.py)


class InjectedFault(RuntimeError):
    """The failure that `fault.kind=crash` asks for."""


@dataclass(frozen=True)
class Fault:
    step: int | None = None  # None: never
    kind: str = "crash"  # one of FAULT_KINDS

    @classmethod
    def from_config(cls, cfg) -> Fault:
        """The `fault.*` of a config (validated by grpo_cli/validate.py); off where it has none."""
        fault = cfg.get("fault")
        return cls() if fault is None else cls(fault.step, fault.kind)

    def _due(self, step: int, kind: str) -> bool:
        return self.step is not None and step == self.step and self.kind == kind

    def before_step(self, step: int) -> None:
        """Raise the crash, interrupt or full disk asked for at `step` (nothing of that step has
        run). A full disk is the OSError a write raises there (ENOSPC), with nothing filled."""
        if self._due(step, "crash"):
            raise InjectedFault(f"fault.kind=crash at step {step} (fault.step: a failure on purpose)")
        if self._due(step, "interrupt"):  # what Ctrl-C raises; run.py records it as SIGINT
            raise KeyboardInterrupt(f"fault.kind=interrupt at step {step}")
        if self._due(step, "disk_full"):
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (fault.kind=disk_full at step {step})")

    def after_step_recorded(self, step: int) -> None:
        """`fault.kind=sigterm`: SIGTERM to this process once step `step` is recorded (its rows
        and status written) and before the loop looks for a stop request: the window where a
        signal once ended a run without the checkpoint it promises. raise_signal runs the
        handler before it returns, so the signal lands there and nowhere else."""
        if self._due(step, "sigterm"):
            signal.raise_signal(signal.SIGTERM)

    def nan_loss(self, step: int) -> bool:
        """Whether the last micro-batch's loss at `step` is to become NaN."""
        return self._due(step, "nan_loss")

    def note(self) -> str:
        """What run.json's `error` adds when the fault is set, so that no reader of the results
        takes an injected failure for a real one; "" when off."""
        if self.step is None:
            return ""
        return f" [fault.step={self.step} fault.kind={self.kind} was set: a failure on purpose]"
