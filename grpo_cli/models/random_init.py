"""`model.weights=random`: the model's real architecture with random weights, nothing downloaded.

The architecture comes from an HF `config.json` alone (`model.config_json`, e.g. the Nemotron-Mini
config shipped under conf/model/; else `model.path`'s). The tokenizer is `model.path`'s when that
is a local directory holding one, else a byte-level tokenizer sized to the vocabulary
(`byte_tokenizer.py`). Config and tokenizer are saved once as an HF directory without weights
under cache_dir/random/, which vLLM serves with `load_format="dummy"` (the trainer then pushes the
policy's weights into it). Weights are drawn by transformers' own initialisation under the run's
seed, directly on the target device. For rehearsing memory and time at full size: the outputs are
noise.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from grpo_cli.models.byte_tokenizer import build_byte_tokenizer
from grpo_cli.models.cache import cached_model_dir
from grpo_cli.models.loading import (
    NO_REMOTE_CODE,
    TOKENIZER_FILES,
    LoadedModel,
    ModelLoadError,
    custom_code_refusal,
)


def read_config_json(model_cfg) -> tuple[Path, dict]:
    """The config.json named by model.config_json (a file or a directory), else model.path's."""
    named = model_cfg.config_json or model_cfg.path
    if not named:
        raise ModelLoadError("model.weights=random needs model.config_json or a local model.path")
    path = Path(named).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        field = "model.config_json" if model_cfg.config_json else "model.path"
        raise ModelLoadError(
            f"{field}={named!r}: no config.json there (model.weights=random builds the model "
            "from its config alone; give a local config.json)"
        )
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ModelLoadError(f"{path}: not valid JSON ({error})") from error
    if "model_type" not in config:
        raise ModelLoadError(f"{path}: has no model_type, so transformers cannot build it")
    return path, config


def local_tokenizer_dir(model_cfg) -> Path | None:
    if not model_cfg.path:
        return None
    path = Path(model_cfg.path).expanduser()
    if path.is_dir() and any((path / name).exists() for name in TOKENIZER_FILES):
        return path
    return None


def materialize_random_dir(model_cfg, cache_dir: str, log=print) -> Path:
    """config.json + tokenizer, no weights, under cache_dir/random/<key>; built once."""
    config_path, config = read_config_json(model_cfg)
    tokenizer_dir = local_tokenizer_dir(model_cfg)
    stop_tokens = list(model_cfg.stop_tokens)
    blob = json.dumps([config, str(tokenizer_dir), stop_tokens], sort_keys=True)
    key = f"{config['model_type']}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"

    def build(partial: Path) -> None:
        if tokenizer_dir is not None:
            try:
                tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), **NO_REMOTE_CODE)
            except ValueError as error:
                raise custom_code_refusal(error, str(tokenizer_dir)) or error from None
            log(f"model.weights=random: tokenizer from {tokenizer_dir}")
        else:
            tokenizer = build_byte_tokenizer(config["vocab_size"], stop_tokens)
            log(
                f"model.weights=random: no tokenizer at model.path={model_cfg.path!r}; "
                f"byte-level tokenizer of {len(tokenizer)} ids (stop tokens {stop_tokens} "
                "added as special tokens)"
            )
        if len(tokenizer) > config["vocab_size"]:
            raise ModelLoadError(
                f"tokenizer has {len(tokenizer)} ids but {config_path} says vocab_size="
                f"{config['vocab_size']}"
            )
        # The ids a generation config stops on must be this tokenizer's
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            config[name] = getattr(tokenizer, name)
        config.pop("_name_or_path", None)
        (partial / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        tokenizer.save_pretrained(partial)
        log(f"model.weights=random: architecture from {config_path}, saved under {partial.parent / key}")

    return cached_model_dir(Path(cache_dir) / "random", key, build)


def build_random(model_cfg, cache_dir: str, device: torch.device, dtype: torch.dtype,
                 log=print) -> LoadedModel:
    """The architecture of model.config_json with freshly initialised weights (torch's RNG)."""
    directory = materialize_random_dir(model_cfg, cache_dir, log)
    try:
        config = AutoConfig.from_pretrained(str(directory), **NO_REMOTE_CODE)
        tokenizer = AutoTokenizer.from_pretrained(str(directory), **NO_REMOTE_CODE)
    except ValueError as error:
        raise custom_code_refusal(error, str(model_cfg.config_json or model_cfg.path)) or error from None
    with torch.device(device):  # initialise on the device: a 4B model never passes through CPU
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return LoadedModel(model=model, tokenizer=tokenizer, source_path=str(directory))
