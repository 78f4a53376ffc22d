"""Split a training step's wall time into phases without touching the trainer's code.

A `PhaseClock` wraps methods of live objects (instance attributes, so only this trainer is
affected), adds forward hooks to the policy and patches `torch.Tensor.backward` for as long as it
is attached. Forward time counts only grad-enabled forwards (sampling runs under no_grad).
Phases are exclusive by construction except where noted: the caller subtracts them from the
step's wall time to get "other".
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from contextlib import contextmanager

import torch


class PhaseClock:
    def __init__(self, synchronize: bool = False):
        self.totals: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.synchronize = synchronize and torch.cuda.is_available()
        self._undo: list = []
        self._forward_start: list[float] = []
        self._hooks_paused = 0  # inside a phase that owns its own forwards/backwards (probes)

    def _now(self) -> float:
        if self.synchronize:
            torch.cuda.synchronize()
        return time.perf_counter()

    def reset(self) -> dict[str, float]:
        """Return the phase totals so far and start from zero."""
        totals = dict(self.totals)
        self.totals.clear()
        self.counts.clear()
        return totals

    @contextmanager
    def phase(self, name: str, own_passes: bool = False):
        """Time a block; with `own_passes`, its forwards/backwards are not counted separately."""
        start = self._now()
        self._hooks_paused += own_passes
        try:
            yield
        finally:
            self._hooks_paused -= own_passes
            self.totals[name] += self._now() - start
            self.counts[name] += 1

    def wrap(self, owner, attribute: str, name: str) -> None:
        """Time every call of `owner.attribute` as phase `name` (an instance-level patch)."""
        original = getattr(owner, attribute)
        had_own = attribute in vars(owner) if hasattr(owner, "__dict__") else False

        @functools.wraps(original)
        def timed(*args, **kwargs):
            with self.phase(name):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed)

        def undo():
            if had_own:
                setattr(owner, attribute, original)
            else:
                delattr(owner, attribute)

        self._undo.append(undo)

    def hook_forward(self, model: torch.nn.Module, name: str = "forward") -> None:
        """Time grad-enabled forwards of `model` (the training forward, not sampling)."""

        def before(module, args, kwargs):
            if torch.is_grad_enabled() and not self._hooks_paused:
                self._forward_start.append(self._now())

        def after(module, args, kwargs, output):
            if torch.is_grad_enabled() and self._forward_start and not self._hooks_paused:
                self.totals[name] += self._now() - self._forward_start.pop()
                self.counts[name] += 1

        handles = [
            model.register_forward_pre_hook(before, with_kwargs=True),
            model.register_forward_hook(after, with_kwargs=True),
        ]
        self._undo.append(lambda: [handle.remove() for handle in handles])

    def patch_backward(self, name: str = "backward") -> None:
        """Time every `Tensor.backward` call (global while attached; benchmarks only)."""
        original = torch.Tensor.backward
        clock = self

        def timed_backward(tensor, *args, **kwargs):
            if clock._hooks_paused:
                return original(tensor, *args, **kwargs)
            with clock.phase(name):
                return original(tensor, *args, **kwargs)

        torch.Tensor.backward = timed_backward
        self._undo.append(lambda: setattr(torch.Tensor, "backward", original))

    def detach(self) -> None:
        while self._undo:
            self._undo.pop()()
