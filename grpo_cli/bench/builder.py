"""Build a trainer the way `grpo run` does (grpo_cli/train/run.py), minus results and resume.

Model-size presets turn `--model-size 25m` into char_llama overrides; a preset other than the
CPU one is a random model (no warm start) trained with lr 0: the optimizer still does all its
work, but the policy stays fixed, so every step of both grpo-cli and TRL samples from the same
distribution (a random policy rarely samples EOS, so most completions run to
`rollout.max_new_tokens`). Compare tokens/s as well as step times all the same.
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

# ~params: layers * (4 h^2 + 3 h i) + 2 V h, with the char vocabulary V = 100.
MODEL_SIZES: dict[str, list[str]] = {
    "tiny": [],  # the CPU preset's warm-started char_llama_tiny (~0.1M parameters)
    "5m": [
        "model.name=char_llama_5m", "model.hidden_size=256", "model.num_layers=6",
        "model.num_heads=4", "model.intermediate_size=688", "model.warm_start.steps=0",
        "algorithm.lr=0.0",
    ],
    "25m": [
        "model.name=char_llama_25m", "model.hidden_size=512", "model.num_layers=8",
        "model.num_heads=8", "model.intermediate_size=1376", "model.warm_start.steps=0",
        "algorithm.lr=0.0",
    ],
}


def size_overrides(size: str) -> list[str]:
    key = size.lower()
    if key not in MODEL_SIZES:
        raise ValueError(f"--model-size {size!r} is not one of {', '.join(MODEL_SIZES)}")
    return list(MODEL_SIZES[key])


@dataclass
class BenchSetup:
    cfg: object
    trainer: object  # GRPOTrainer
    model: torch.nn.Module
    tokenizer: object
    task: object
    probes: object | None  # ProbeSuite when analysis.every > 0
    device: torch.device
    source_path: str  # HF directory of the starting weights (TRL loads the same one)


def build_backend(cfg, model, tokenizer, device, source_path: str, compile_decode: bool = False):
    """run.py's backends plus `hf_static` (grpo_cli/rollout/static_decode.py)."""
    if cfg.rollout.backend == "hf_static":
        from grpo_cli.rollout.static_decode import StaticDecodeBackend

        return StaticDecodeBackend(model, tokenizer, device, compile=compile_decode)
    from grpo_cli.train.run import build_backend as run_build_backend

    return run_build_backend(cfg, model, tokenizer, device, source_path)


def build_setup(
    cfg, log=print, scratch: Path | None = None, compile_decode: bool = False
) -> BenchSetup:
    """Everything `_train` builds before its loop, from a composed config."""
    from grpo_cli.algorithm.value_head import ValueHead
    from grpo_cli.models.policy import load_policy
    from grpo_cli.probes.runner import ProbeSuite
    from grpo_cli.tasks import build_task
    from grpo_cli.train.run import resolve_device
    from grpo_cli.train.trainer import GRPOTrainer

    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    task = build_task(cfg.task)
    loaded = load_policy(cfg, task, device, log=log)
    task.tokenizer = loaded.tokenizer
    model = loaded.model
    reference = None
    if cfg.algorithm.kl_coef > 0:
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    value_head = None
    if cfg.algorithm.name == "ppo":
        value_head = ValueHead(model.config.hidden_size).to(device)
    backend = build_backend(cfg, model, loaded.tokenizer, device, loaded.source_path, compile_decode)
    trainer = GRPOTrainer(cfg, model, loaded.tokenizer, task, backend, device, reference, value_head)
    probes = None
    if cfg.analysis.every > 0:
        scratch = scratch or Path(tempfile.mkdtemp(prefix="grpo-bench-"))
        probes = ProbeSuite(cfg.analysis, model, scratch / "initial_layers.pt")
    path = loaded.source_path
    return BenchSetup(cfg, trainer, model, loaded.tokenizer, task, probes, device, path)
