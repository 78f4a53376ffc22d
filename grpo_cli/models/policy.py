"""Resolve `cfg.model` to a loaded policy (and tokenizer) on the chosen device."""

from __future__ import annotations

import torch

from grpo_cli.models.loading import (
    LoadedModel,
    ModelLoadError,
    apply_lora,
    check_transformers,
    enable_gradient_checkpointing,
    find_packaged_gguf,
    load_pretrained,
    materialize_gguf,
    resolve_dtype,
    transformers_progress_bars,
)

SOURCES = ("char_llama", "hf", "gguf_package")
WEIGHTS = ("pretrained", "random")


def load_policy(cfg, task, device: torch.device, log=print) -> LoadedModel:
    """Load the policy named by `cfg.model`; char_llama and GGUF files go via an HF directory.
    transformers' own progress bars show only with `progress=true`."""
    check_transformers()
    with transformers_progress_bars(cfg.progress):
        return _load_policy(cfg, task, device, log)


def _load_policy(cfg, task, device: torch.device, log) -> LoadedModel:
    model_cfg = cfg.model
    dtype = resolve_dtype(model_cfg.dtype, device)
    if model_cfg.weights not in WEIGHTS:
        raise ModelLoadError(f"model.weights={model_cfg.weights!r} is not one of {', '.join(WEIGHTS)}")
    if model_cfg.weights == "random":
        from grpo_cli.models.random_init import build_random

        loaded = build_random(model_cfg, cfg.cache_dir, device, dtype, log=log)
    elif model_cfg.source == "char_llama":
        from grpo_cli.models.warm_start import warm_started_char_llama

        path = warm_started_char_llama(model_cfg, task, cfg.task, cfg.cache_dir, log=log)
        loaded = load_pretrained(str(path), device, dtype)
    elif model_cfg.source == "hf":
        if not model_cfg.path:
            raise ModelLoadError("model.path is required when model.source=hf")
        loaded = load_pretrained(model_cfg.path, device, dtype)
    elif model_cfg.source == "gguf_package":
        if not model_cfg.package:
            raise ModelLoadError("model.package is required when model.source=gguf_package")
        gguf = find_packaged_gguf(model_cfg.package, model_cfg.path)
        loaded = load_pretrained(str(materialize_gguf(gguf, cfg.cache_dir, log)), device, dtype)
    else:
        raise ModelLoadError(
            f"model.source={model_cfg.source!r} is not one of {', '.join(SOURCES)}"
        )
    if model_cfg.gradient_checkpointing:
        enable_gradient_checkpointing(loaded.model)
    if model_cfg.lora.enabled:
        loaded.model = apply_lora(loaded.model, model_cfg.lora)
    return loaded
