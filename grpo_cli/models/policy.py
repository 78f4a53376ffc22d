"""Resolve `cfg.model` to a loaded policy (and tokenizer) on the chosen device."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import torch
from safetensors import SafetensorError

from grpo_cli.models.loading import (
    TOKENIZER_FILES,
    LoadedModel,
    ModelLoadError,
    apply_lora,
    check_transformers,
    enable_gradient_checkpointing,
    find_packaged_gguf,
    load_pretrained,
    materialize_gguf,
    refuse_custom_code,
    resolve_dtype,
    transformers_progress_bars,
)

SOURCES = ("char_llama", "hf", "gguf_package")
WEIGHTS = ("pretrained", "random")
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


def weight_files(directory: Path) -> list[str]:
    return sorted(p.name for pattern in WEIGHT_FILES for p in directory.glob(pattern))


def check_model_dir(path: str) -> None:
    """ModelLoadError naming the directory when a local model.path holds no model files or no
    tokenizer (else transformers answers 'install sentencepiece'), or needs its own code."""
    directory = Path(path).expanduser()
    if not directory.is_dir():
        return  # a hub id, or a missing directory: load_pretrained names it
    refuse_custom_code(directory)
    tokenizer = any((directory / name).is_file() for name in TOKENIZER_FILES)
    missing = [what for what, there in (("config.json", (directory / "config.json").is_file()),
                                        ("weights (" + ", ".join(WEIGHT_FILES) + ")", bool(weight_files(directory))),
                                        ("tokenizer (" + ", ".join(TOKENIZER_FILES) + ")", tokenizer))
               if not there]
    if missing:
        raise ModelLoadError(f"model.path={path!r}: {directory} has no model files (no "
                             f"{', no '.join(missing)}); give an HF model directory")


def load_weights(path: str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """load_pretrained, with a damaged weight file (truncated, partly downloaded, not a weight
    file) answered in one line naming the directory and its weight files."""
    try:
        return load_pretrained(path, device, dtype)
    except ModelLoadError:
        raise
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, SafetensorError) as error:
        if isinstance(error, torch.OutOfMemoryError):
            raise
        files = ", ".join(weight_files(Path(path).expanduser())) or "its weight files"
        detail = str(error).splitlines()[0] if str(error) else ""
        raise ModelLoadError(f"{path}: {files} could not be read ({type(error).__name__}: {detail}); "
                             "a damaged or partly written file?") from error


def initial_model_record(cfg) -> dict:
    """run.json's `initial_model`: the weights a run's RL starts from, and whether every run seed
    shares them (`shared`). A shared model is a random effect common to all seeds: intervals over
    seeds are then conditional on it (the unit is the RL seed on that one model)."""
    model_cfg = cfg.model
    if model_cfg.weights == "random":  # drawn under the run's seed (models/random_init.py)
        return {"kind": "random", "seed": int(cfg.seed), "shared": False}
    if model_cfg.source == "char_llama":
        from grpo_cli.models.warm_start import warm_start_record

        return warm_start_record(model_cfg, cfg.task, cfg.seed)
    where = model_cfg.path if model_cfg.source == "hf" else f"{model_cfg.package}:{model_cfg.path or ''}"
    return {"kind": "pretrained", "source": model_cfg.source, "path": where, "shared": True}


def load_policy(cfg, task, device: torch.device, log=print) -> LoadedModel:
    """Load the policy named by `cfg.model`; char_llama and GGUF files go via an HF directory.
    transformers' own progress bars never show: a run's one bar is grpo-cli's (`progress`)."""
    check_transformers()
    with transformers_progress_bars(False):
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

        path = warm_started_char_llama(model_cfg, task, cfg.task, cfg.cache_dir, cfg.seed, log=log)
        loaded = load_weights(str(path), device, dtype)
    elif model_cfg.source == "hf":
        if not model_cfg.path:
            raise ModelLoadError("model.path is required when model.source=hf")
        check_model_dir(model_cfg.path)
        loaded = load_weights(model_cfg.path, device, dtype)
    elif model_cfg.source == "gguf_package":
        if not model_cfg.package:
            raise ModelLoadError("model.package is required when model.source=gguf_package")
        gguf = find_packaged_gguf(model_cfg.package, model_cfg.path)
        loaded = load_weights(str(materialize_gguf(gguf, cfg.cache_dir, log)), device, dtype)
    else:
        raise ModelLoadError(
            f"model.source={model_cfg.source!r} is not one of {', '.join(SOURCES)}"
        )
    if model_cfg.gradient_checkpointing:
        enable_gradient_checkpointing(loaded.model)
    if model_cfg.lora.enabled:
        loaded.model = apply_lora(loaded.model, model_cfg.lora)
    return loaded
