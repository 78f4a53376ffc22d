"""Checks that need the data and the model's shape but not its weights, run before any model is
built or warm-started: enough records, prompts that fit the model's positions, and memory.

Each refusal is one line naming the key, or the file and line: a ConfigError (exit 2) when a
setting is the cause, an InputError (exit 1) when the data are. The shape comes from the config
(char_llama) or a model directory's config.json and tokenizer, never from weights; for a hub id
or a GGUF file not yet converted it is read from the loaded model instead (`check_loaded`),
which is still before the warm start, the trainer and the first rollout.

The memory estimate is a lower bound, so a refusal is never a false alarm: it counts only what
one step cannot do without, and refuses when that alone exceeds the memory free now.

    weights, gradients, AdamW's two moments               P * 4 * dtype bytes   (LoRA: P * dtype bytes;
                                                          + P * dtype bytes for a KL reference)
    rollout KV cache                                      L * 2 * kv_dim * dtype bytes * B * R * (prompt + max_new_tokens)
                                                          (hf_static shares each prompt's part: B * prompt + B * R * max_new_tokens)
    one decode step's float32 logits                      B * R * V * 4
    per-rollout Gram (probes on a per-rollout matrix)     (B * R)^2 * 8            (float64, probes/gram.py)

Activations, the training forward's logits, allocator slack and the CUDA context come on top,
so a run can still fail for memory that this lets through; vLLM's cache is left out (it takes
`rollout.vllm_gpu_memory_utilization` of the GPU and pages within it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_cli.config.errors import ConfigError, InputError
from grpo_cli.tasks.problem import Problem, format_prompt

GIB = 2**30


@dataclass(frozen=True)
class ModelShape:
    """What the checks need of a model: sizes from its config, and its tokenizer."""

    tokenizer: Any
    vocab_size: int
    hidden_size: int
    num_layers: int
    kv_dim: int  # key/value heads x head dimension
    intermediate_size: int
    max_positions: int | None  # None: the config does not say
    tied_embeddings: bool
    positions_key: str  # the setting or file that sets max_positions, for messages
    counted_parameters: int | None = None  # counted on the meta device, where the config builds

    @property
    def parameters(self) -> int:
        """Parameters counted from the config's model on the meta device (no memory), else a
        Llama-shaped count (attention, gated MLP, embeddings; norms left out)."""
        if self.counted_parameters is not None:
            return self.counted_parameters
        h, kv = self.hidden_size, self.kv_dim
        per_layer = h * (2 * h + 2 * kv) + 3 * h * self.intermediate_size
        embeddings = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        return self.num_layers * per_layer + embeddings

    @classmethod
    def from_hf_config(cls, config, tokenizer, where: str) -> ModelShape:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        hidden = int(getattr(text, "hidden_size", 0) or 0)
        heads = int(getattr(text, "num_attention_heads", 0) or 0) or 1
        head_dim = int(getattr(text, "head_dim", 0) or 0) or hidden // heads
        kv_heads = int(getattr(text, "num_key_value_heads", 0) or 0) or heads
        return cls(
            tokenizer=tokenizer,
            vocab_size=int(getattr(text, "vocab_size", 0) or 0),
            hidden_size=hidden,
            num_layers=int(getattr(text, "num_hidden_layers", 0) or 0),
            kv_dim=kv_heads * head_dim,
            intermediate_size=int(getattr(text, "intermediate_size", 0) or 0),
            max_positions=getattr(text, "max_position_embeddings", None),
            tied_embeddings=bool(getattr(text, "tie_word_embeddings", False)),
            positions_key=f"max_position_embeddings of {where}",
            counted_parameters=_meta_parameter_count(config),
        )


def _meta_parameter_count(config) -> int | None:
    """The parameters of the model `config` describes, built on the meta device (shapes only)."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - an architecture transformers cannot build: the Llama count
        return None
    return sum(p.numel() for p in model.parameters())


def shape_before_loading(cfg, log=print) -> ModelShape | None:
    """The model's shape without its weights: char_llama from the config; a local HF directory,
    random weights' config-and-tokenizer directory (models/random_init.py, no weights) and an
    already converted GGUF file from their config.json and tokenizer. None where only loading
    tells (a hub id, a GGUF file not yet converted) or the files cannot be read (the loader then
    names the problem)."""
    model = cfg.model
    if model.weights == "random":
        from grpo_cli.models.loading import ModelLoadError
        from grpo_cli.models.random_init import materialize_random_dir

        try:
            return _hf_shape(str(materialize_random_dir(model, cfg.cache_dir, log)))
        except ModelLoadError:
            return None
    if model.source == "char_llama":
        from grpo_cli.models.char_tokenizer import build_char_tokenizer

        tokenizer = build_char_tokenizer()
        return ModelShape(tokenizer, len(tokenizer), model.hidden_size, model.num_layers,
                          model.hidden_size, model.intermediate_size, model.max_positions,
                          tied_embeddings=False, positions_key="model.max_positions")
    if model.source == "hf" and model.path and Path(model.path).expanduser().is_dir():
        return _hf_shape(model.path)
    if model.source == "gguf_package" and model.package:
        from grpo_cli.models.loading import ModelLoadError, find_packaged_gguf, gguf_cache_key

        try:
            converted = Path(cfg.cache_dir) / "gguf" / gguf_cache_key(find_packaged_gguf(model.package, model.path))
        except ModelLoadError:
            return None
        return _hf_shape(str(converted)) if (converted / "config.json").is_file() else None
    return None


def _hf_shape(directory: str) -> ModelShape | None:
    from transformers import AutoConfig, AutoTokenizer

    from grpo_cli.models.loading import NO_REMOTE_CODE

    try:
        config = AutoConfig.from_pretrained(directory, **NO_REMOTE_CODE)
        tokenizer = AutoTokenizer.from_pretrained(directory, **NO_REMOTE_CODE)
    except (OSError, ValueError, ImportError):
        return None
    return ModelShape.from_hf_config(config, tokenizer, f"{directory}/config.json")


def check_record_counts(cfg, task) -> None:
    """Enough problems for what the config asks: warm_start_size + train_size records, and at
    least prompts_per_step of them for GRPO (each step draws that many distinct prompts)."""
    wanted_train, set_aside = cfg.task.train_size, cfg.task.warm_start_size
    per_step = cfg.rollout.prompts_per_step
    have = len(task.warm_start) + len(task.train)
    source = _train_source(cfg)
    if wanted_train >= 0 and have < set_aside + wanted_train:
        raise InputError(
            f"{source}: {have} records, fewer than task.warm_start_size={set_aside} + "
            f"task.train_size={wanted_train}; lower them or use a larger file"
        )
    if len(task.train) < per_step:
        raise InputError(
            f"{source}: {len(task.train)} records left for GRPO after task.warm_start_size={set_aside} "
            f"set aside {len(task.warm_start)}, fewer than rollout.prompts_per_step={per_step}"
        )


def _train_source(cfg) -> str:
    if cfg.task.name != "gsm8k":
        return f"task {cfg.task.name}"
    if cfg.task.path is None:
        return f"{cfg.task.hub_id} (train split)"
    return str(Path(cfg.task.path) / "train.jsonl")


def longest_prompt(cfg, task, tokenizer) -> tuple[int, Problem | None, str]:
    """(tokens, problem, split) of the longest prompt of the train and eval problems."""
    longest, problem, split = 0, None, ""
    for name, problems in (("train", task.train), ("eval", task.eval)):
        for candidate in problems:
            text = format_prompt(candidate, cfg.task.prompt_template, tokenizer, cfg.task.use_chat_template)
            tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
            if tokens > longest:
                longest, problem, split = tokens, candidate, name
    return longest, problem, split


def check_prompt_lengths(cfg, task, shape: ModelShape) -> int:
    """Every prompt plus rollout.max_new_tokens within the model's positions; returns the
    longest prompt's length in tokens."""
    longest, problem, split = longest_prompt(cfg, task, shape.tokenizer)
    limit, new_tokens = shape.max_positions, cfg.rollout.max_new_tokens
    if limit is None or problem is None or longest + new_tokens <= limit:
        return longest
    what = (f"prompt of {longest} tokens + rollout.max_new_tokens={new_tokens} exceeds the "
            f"model's {limit} positions ({shape.positions_key})")
    if problem.source:  # a record of a data file or hub split: the data's fault
        raise InputError(f"{problem.source}: {what}")
    raise ConfigError(f"task={cfg.task.name} ({split} problems): the longest {what}; lower "
                      "rollout.max_new_tokens or make the problems shorter")


def memory_needed(cfg, shape: ModelShape, prompt_tokens: int, dtype_bytes: int) -> dict[str, int]:
    """The lower bound of the module docstring, in bytes, by part."""
    prompts, group = cfg.rollout.prompts_per_step, cfg.rollout.group_size
    rollouts = prompts * group
    parameters = shape.parameters
    copies = (1 if cfg.model.lora.enabled else 4) + (1 if cfg.algorithm.kl_coef > 0 else 0)
    parts = {  # moments in the weights' dtype at the least (algorithm/optim.py, master_weights=none)
        "weights and optimizer": parameters * copies * dtype_bytes,
        "logits of a decode step": rollouts * shape.vocab_size * 4,
    }
    if cfg.rollout.backend != "vllm":
        per_token = shape.num_layers * 2 * shape.kv_dim * dtype_bytes
        if cfg.rollout.backend == "hf_static":  # one prompt part per group (rollout/static_decode.py)
            tokens = prompts * prompt_tokens + rollouts * cfg.rollout.max_new_tokens
        else:  # transformers' generate holds every rollout's own copy of its prompt
            tokens = rollouts * (prompt_tokens + cfg.rollout.max_new_tokens)
        parts["rollout KV cache"] = per_token * tokens
    if _probes_build_gram(cfg):
        parts["per-rollout Gram"] = rollouts * rollouts * 8
    return parts


def _probes_build_gram(cfg) -> bool:
    from grpo_cli.probes.runner import PER_ROLLOUT_MATRICES

    return bool(cfg.probes.enabled and cfg.probes.every > 0
                and set(cfg.probes.matrices) & set(PER_ROLLOUT_MATRICES))


def free_memory(device) -> tuple[int | None, str]:
    """(bytes free now, where it was read) on `device`; None when it cannot be read."""
    if device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return free, f"{device} (torch.cuda.mem_get_info)"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "this machine (MemAvailable, /proc/meminfo)"
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        return None, "unknown"
    return psutil.virtual_memory().available, "this machine (psutil)"


def check_memory(cfg, shape: ModelShape, prompt_tokens: int, device) -> None:
    """ConfigError with the numbers when the lower bound alone exceeds the memory free."""
    import torch

    from grpo_cli.models.loading import resolve_dtype

    dtype_bytes = torch.empty((), dtype=resolve_dtype(cfg.model.dtype, device)).element_size()
    parts = memory_needed(cfg, shape, prompt_tokens, dtype_bytes)
    needed = sum(parts.values())
    free, where = free_memory(device)
    if free is None or needed <= free:
        return
    largest = ", ".join(f"{name} {size / GIB:.1f}" for name, size in
                        sorted(parts.items(), key=lambda item: -item[1]) if size >= GIB / 10)
    group, prompts = cfg.rollout.group_size, cfg.rollout.prompts_per_step
    raise ConfigError(
        f"rollout.group_size={group} x rollout.prompts_per_step={prompts} = {group * prompts} "
        f"rollouts of up to {prompt_tokens} + rollout.max_new_tokens={cfg.rollout.max_new_tokens} "
        f"tokens need at least {needed / GIB:.1f} GiB ({largest} GiB), but {free / GIB:.1f} GiB "
        f"is free on {where}; lower rollout.group_size or rollout.prompts_per_step"
        + (", or leave the per-rollout matrices out of probes.matrices" if "per-rollout Gram" in parts else "")
    )


def check_sampler_installed(cfg) -> None:
    """ConfigError for `rollout.backend=vllm` where vllm is not installed (an optional extra), so
    the run stops in one line before any weights are loaded."""
    import importlib.util

    if cfg.rollout.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        from grpo_cli.rollout.vllm_backend import INSTALL_HINT

        raise ConfigError(f"rollout.backend=vllm: {INSTALL_HINT}")


def check_before_building(cfg, task, device, log=print) -> bool:
    """Every check that needs no weights; False when the shape checks must wait for the loaded
    model (`check_loaded`)."""
    check_sampler_installed(cfg)
    check_record_counts(cfg, task)
    if cfg.model.source == "hf" and cfg.model.weights == "pretrained" and cfg.model.path:
        from grpo_cli.models.policy import check_model_dir

        check_model_dir(cfg.model.path)  # an empty directory: not "install sentencepiece"
    shape = shape_before_loading(cfg, log)
    if shape is None:
        return False
    check_memory(cfg, shape, check_prompt_lengths(cfg, task, shape), device)
    return True


def check_loaded(cfg, task, loaded, device) -> None:
    """The shape checks from a loaded model, where its shape could not be read before."""
    shape = ModelShape.from_hf_config(loaded.model.config, loaded.tokenizer, f"{loaded.source_path}/config.json")
    check_memory(cfg, shape, check_prompt_lengths(cfg, task, shape), device)
