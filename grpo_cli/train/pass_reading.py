"""A pass's one host read: each micro-batch's logged terms and the gradient norm, the stop on a
non-finite loss or norm before any weight moves, and the first pass's totals for metrics.csv.

The trainer (trainer.py `_update`) keeps every micro-batch's terms as a tensor and reads the pass
back once; where a NaN or inf came from is train/non_finite.py's to say, on the failure path only.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from grpo_cli.config.errors import RunStopped
from grpo_cli.probes.step_metrics import LossTotals

# What each micro-batch logs, as one [6] tensor read back once per pass
LOGGED_TERMS = ("loss", "pg_loss", "clip_frac", "entropy_sum", "kl_sum", "value_loss")


class NonFiniteLossError(RuntimeError, RunStopped):
    """The loss became NaN or infinite; the run stops with status failed."""


def read_pass(step: int, logged: list[torch.Tensor], norm: torch.Tensor,
              tail: Callable[[bool], str]) -> tuple[list[list[float]], float]:
    """(each micro-batch's LOGGED_TERMS [micro-batches, 6], the gradient norm) in one host read.
    A non-finite loss or norm stops the run here, before any update: NonFiniteLossError with
    `tail(norm_failed)` (where the NaN or inf is) after the number."""
    read = torch.cat([torch.stack(logged).flatten(), norm.double().reshape(1)]).tolist()
    width = len(LOGGED_TERMS)
    values = [read[start : start + width] for start in range(0, len(read) - 1, width)]
    bad = next((row for row in values if not math.isfinite(row[0])), None)
    if bad is not None:
        raise NonFiniteLossError(
            f"step {step}: loss is {bad[0]} (pg_loss {bad[1]}); lower optim.lr or check the "
            f"rewards{tail(False)}"
        )
    if not math.isfinite(read[-1]):
        raise NonFiniteLossError(f"step {step}: gradient norm is {read[-1]}{tail(True)}")
    return values, read[-1]


def logged_totals(values: list[list[float]], shares: list[float], batch_tokens: float, *,
                  kl_term: bool, value_term: bool) -> LossTotals:
    """The first pass's logged terms, from each micro-batch's LOGGED_TERMS: losses summed,
    clip_frac and value loss weighted by token share, entropy and kl per completion token; summed
    in micro-batch order, as the per-micro-batch reads did. NaN for the kl without a KL term
    (`kl_term`) and for the value loss without a value head (`value_term`)."""
    totals = dict.fromkeys(LOGGED_TERMS, 0.0)
    for row, share in zip(values, shares, strict=True):
        terms = dict(zip(LOGGED_TERMS, row, strict=True))
        totals["loss"] += terms["loss"]
        totals["pg_loss"] += terms["pg_loss"]
        totals["clip_frac"] += terms["clip_frac"] * share
        totals["entropy_sum"] += terms["entropy_sum"] / max(batch_tokens, 1.0)
        totals["kl_sum"] += terms["kl_sum"] / max(batch_tokens, 1.0)
        totals["value_loss"] += terms["value_loss"] * share
    return LossTotals(
        loss=totals["loss"], pg_loss=totals["pg_loss"],
        kl=totals["kl_sum"] if kl_term else math.nan,
        value_loss=totals["value_loss"] if value_term else math.nan,
        entropy=totals["entropy_sum"], clip_frac=totals["clip_frac"],
    )
