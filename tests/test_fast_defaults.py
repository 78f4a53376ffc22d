"""Issue 45: every exact or exact-in-law speed-up is the default; what changes the estimate
(bf16) stays opt-in. The defaults as a run resolves them, and what each explicit setting keeps."""

from __future__ import annotations

import pytest
import torch
from step_parity import TINY

from grpo_cli.bench.builder import build_setup
from grpo_cli.config.compose import compose_config
from grpo_cli.config.schema import ModelConfig, OptimConfig, RolloutConfig, TrainConfig
from grpo_cli.rollout.sampling import DRAWS, resolve_draw
from grpo_cli.train.setup import resolved_rollout


def test_the_schema_defaults_are_the_fast_exact_settings():
    assert TrainConfig().completion_buckets == 4 and TrainConfig().backward_live_rows is True
    assert TrainConfig().shared_prompt_forward is True
    assert OptimConfig().fused is None  # auto: fused AdamW for fp32 weights (tests/test_optim.py)
    assert RolloutConfig().draw == "auto"
    # CUDA graphs are opt-in again: full runs with them failed on an H200 (NaN at step 0)
    assert RolloutConfig().cuda_graphs is False
    assert ModelConfig().autocast == "none"  # bf16 changes what is estimated: opt-in


@pytest.mark.parametrize("draw,graphs,expected", [
    ("auto", False, "inverse_cdf"), ("auto", True, "multinomial"),
    ("multinomial", False, "multinomial"), ("inverse_cdf", False, "inverse_cdf"),
])
def test_resolve_draw(draw, graphs, expected):
    assert resolve_draw(draw, graphs) == expected


@pytest.mark.parametrize("overrides,draw,compact", [
    ([], "inverse_cdf", True),  # the defaults on a CPU: no graphs, inverse_cdf, finished rows leave
    (["rollout.draw=multinomial"], "multinomial", False),
])
def test_a_cpu_run_resolves_the_sampler(tmp_path, overrides, draw, compact):
    cfg = compose_config(TINY + ["rollout.backend=hf_static", f"cache_dir={tmp_path}", *overrides])
    backend = build_setup(cfg, log=lambda message: None).trainer.backend
    assert backend.cuda_graphs is False
    assert backend.draw is DRAWS[draw] and backend.compact_rows is compact
    # run.json records the draw `auto` resolved to (config.yaml keeps the rule)
    assert resolved_rollout(cfg, backend) == {"backend": "hf_static", "draw": draw,
                                              "cuda_graphs": False, "compile_decode": False}


def test_a_cpu_run_trains_with_fused_adamw_by_default(tmp_path):
    cfg = compose_config(TINY + [f"cache_dir={tmp_path}"])
    optimizer = build_setup(cfg, log=lambda message: None).trainer.optimizer
    assert type(optimizer) is torch.optim.AdamW and optimizer.defaults["fused"] is True


def test_a_non_finite_loss_in_a_graph_decoding_run_names_the_graphs(tmp_path):
    """Full runs decoding in CUDA graphs met NaN gradients on an H200 (2026-11-28): the error of
    such a run points at `rollout.cuda_graphs=false`; a run without graphs does not. On a CPU
    the graph decoder's step runs eagerly, so the same trainer serves both."""
    from grpo_cli.train.pass_reading import NonFiniteLossError

    cfg = compose_config(TINY + ["rollout.backend=hf_static", "rollout.draw=multinomial",
                                 "fault.step=0", "fault.kind=nan_loss", f"cache_dir={tmp_path}"])
    trainer = build_setup(cfg, log=lambda message: None).trainer
    with pytest.raises(NonFiniteLossError) as plain:
        trainer.step(0)
    assert "cuda_graphs" not in str(plain.value)
    trainer.backend.cuda_graphs = True  # graph_decode.py's loop, eager on a CPU
    with pytest.raises(NonFiniteLossError, match=r"step 0: loss is nan.*rollout.cuda_graphs=false"):
        trainer.step(0)
