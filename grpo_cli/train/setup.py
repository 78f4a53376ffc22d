"""Build everything a run needs before its loop, from a composed config (shared by run and bench)."""

from __future__ import annotations

import copy
import gc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from grpo_cli.config.errors import ConfigError

if TYPE_CHECKING:  # imported where built (build_components), so importing this module stays light
    from transformers import PreTrainedTokenizerBase

    from grpo_cli.models.loading import LoadedModel
    from grpo_cli.probes.runner import ProbeSuite
    from grpo_cli.rollout.base import RolloutBackend
    from grpo_cli.tasks.problem import Task
    from grpo_cli.train.trainer import GRPOTrainer


@dataclass
class RunComponents:
    device: torch.device
    task: Task  # with its tokenizer set
    loaded: LoadedModel
    backend: RolloutBackend
    trainer: GRPOTrainer
    probes: ProbeSuite | None  # None when probes are off (probes=off or probes.every=0)

    @property
    def model(self) -> torch.nn.Module:
        return self.loaded.model

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.loaded.tokenizer


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda: torch sees no CUDA device here; use device=cpu or auto")
    return torch.device(name)


def device_label(device: torch.device) -> str:
    """run.json's `device`: the device, and a GPU's name."""
    return str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")


def build_backend(cfg, model, tokenizer, device, source_path: str):
    """The rollout backend named by `rollout.backend`; vLLM is imported only when chosen."""
    from grpo_cli.rollout.stop_tokens import stop_token_ids

    stop_ids = stop_token_ids(tokenizer, model, list(cfg.model.stop_tokens))
    if cfg.rollout.backend == "hf":
        from grpo_cli.rollout.hf_backend import HFGenerateBackend

        return HFGenerateBackend(model, tokenizer, device, stop_ids=stop_ids)
    if cfg.rollout.backend == "hf_static":
        from grpo_cli.rollout.sampling import resolve_draw
        from grpo_cli.rollout.static_decode import StaticDecodeBackend, graph_decode_problem

        problem = graph_decode_problem(model, device)
        if cfg.rollout.cuda_graphs and problem is not None:
            raise ConfigError(f"rollout.cuda_graphs=true: {problem}; set rollout.cuda_graphs=false")
        auto = cfg.rollout.cuda_graphs is None  # wherever the model, device and options allow
        graphs = cfg.rollout.cuda_graphs if not auto else (
            problem is None and not cfg.rollout.compile_decode and cfg.rollout.draw != "inverse_cdf"
            and not cfg.deterministic)  # deterministic kernels inside a capture: never tried
        return StaticDecodeBackend(model, tokenizer, device, compile=cfg.rollout.compile_decode,
                                   stop_ids=stop_ids, cuda_graphs=graphs, graphs_fallback=auto,
                                   draw=resolve_draw(cfg.rollout.draw, graphs))
    if cfg.rollout.backend == "vllm":
        from grpo_cli.rollout.vllm_backend import VllmBackend

        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        random_weights = cfg.model.weights == "random"  # source_path holds no weights
        backend = VllmBackend.from_config(
            cfg.rollout, source_path, dtype=dtype, seed=cfg.seed, stop_ids=stop_ids,
            **({"load_format": "dummy"} if random_weights else {}),
        )
        if random_weights:  # the engine's dummy weights -> the policy's, before the first rollout
            backend.sync_weights(model)
        return backend
    raise ValueError(f"rollout.backend={cfg.rollout.backend!r} is not one of hf, hf_static, vllm")


def use_deterministic_kernels() -> None:
    """Deterministic kernels for `deterministic=true`. On CUDA, cuBLAS reads its workspace
    setting when it first starts, so this runs before anything touches the GPU; ops without a
    deterministic kernel then raise instead of running nondeterministically."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=False)
    torch.backends.cudnn.benchmark = False


def resolved_rollout(cfg, backend) -> dict:
    """What the auto settings of `rollout` resolved to for this run (run.json `rollout_resolved`):
    config.yaml keeps `auto` / null, which is a rule, not the draw a seed's tokens came from."""
    if cfg.rollout.backend != "hf_static":
        return {"backend": cfg.rollout.backend}
    return {"backend": "hf_static", "draw": backend.draw_name, "cuda_graphs": bool(backend.cuda_graphs),
            "compile_decode": bool(cfg.rollout.compile_decode)}


def build_components(cfg, initial_layers_path: Path, log=print) -> RunComponents:
    """Task, policy (with reference and value head when needed), sampler, trainer and probes."""
    from grpo_cli.algorithm.advantages import get_estimator
    from grpo_cli.algorithm.value_head import ValueHead
    from grpo_cli.models.policy import load_policy
    from grpo_cli.probes.runner import ProbeSuite
    from grpo_cli.tasks import build_task
    from grpo_cli.train.preflight import check_before_building, check_loaded
    from grpo_cli.train.trainer import GRPOTrainer

    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    if cfg.deterministic:
        use_deterministic_kernels()
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    task = build_task(cfg.task)
    checked = check_before_building(cfg, task, device, log)  # counts, prompt lengths, memory: no weights yet
    loaded = load_policy(cfg, task, device, log=log)
    if not checked:  # a shape that only the loaded model tells
        check_loaded(cfg, task, loaded, device)
    task.tokenizer = loaded.tokenizer
    model = loaded.model
    reference = None
    if cfg.algorithm.kl_coef > 0:
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    value_head = None
    if get_estimator(cfg.algorithm.name).needs_values:
        value_head = ValueHead(model.config.hidden_size).to(device)
    backend = build_backend(cfg, model, loaded.tokenizer, device, loaded.source_path)
    trainer = GRPOTrainer(cfg, model, loaded.tokenizer, task, backend, device, reference, value_head)
    probes = None
    if cfg.probes.enabled and cfg.probes.every > 0:
        probes = ProbeSuite(cfg.probes, model, initial_layers_path, optimizer=trainer.optimizer,
                            problem_steps=[len(problem.steps) for problem in task.train])
        rounded = probes.rounded_update_layers()
        if rounded:
            log(f"WARNING: `update` spectra of {len(rounded)} bf16 weights without fp32 master "
                f"weights (model.master_weights={cfg.model.master_weights}): W_t - W_0 includes "
                "stochastic-rounding noise; model.master_weights=fp32 or probed removes it")
    return RunComponents(device, task, loaded, backend, trainer, probes)


def freeze_long_lived_objects() -> None:
    """Move everything allocated so far (modules, tokenizer, data set) out of the cyclic GC's
    reach: its full collections would otherwise rescan them every few hundred steps' worth of
    temporaries. A CPU decode loop allocates many small objects; measured with TRL's trainer in
    the same process, this took grpo-cli's tiny-model step from ~0.105 s to ~0.082 s. `grpo run`
    calls `gc.unfreeze()` when the run ends, so a multirun's next job can collect them."""
    gc.collect()
    gc.freeze()
