"""Where the config lives and the resolvers it uses (shared by `grpo run` and `compose_config`)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from omegaconf import OmegaConf


def conf_dir() -> Path:
    """The `conf/` directory: $GRPO_CONF_DIR, else the repository's top-level conf/."""
    return Path(os.environ.get("GRPO_CONF_DIR", Path(__file__).resolve().parents[2] / "conf"))


MAX_RUN_NAME = 160  # file systems allow 255 bytes per path component


def run_name(group_size: int, estimator: str, seed: int, other_overrides: str = "") -> str:
    """Directory name of a run; other overridden keys are appended so runs never collide.

    Long override lists (paths, say) are cut and end in a hash of the full list, so the name
    stays unique and within file-system limits.
    """
    name = f"R{group_size}-{estimator}-s{seed}"
    if other_overrides:
        name += "-" + re.sub(r"[^A-Za-z0-9_.=,+-]", "_", other_overrides)
    if len(name) > MAX_RUN_NAME:
        digest = hashlib.sha256(other_overrides.encode()).hexdigest()[:10]
        name = f"{name[: MAX_RUN_NAME - 11]}~{digest}"
    return name


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("grpo_run_name"):
        OmegaConf.register_new_resolver("grpo_run_name", run_name)
    if not OmegaConf.has_resolver("gpu_count"):  # ${gpu_count:}: this node's GPUs (0 without CUDA)
        OmegaConf.register_new_resolver("gpu_count", gpu_count)
    if not OmegaConf.has_resolver("grpo_conf"):  # ${grpo_conf:model/x.json}: a file shipped in conf/
        OmegaConf.register_new_resolver("grpo_conf", lambda relative: str(conf_dir() / relative))


def gpu_count() -> int:
    """The GPUs this process can see (hydra/launcher=local_gpus gives each sweep member one)."""
    import torch

    return torch.cuda.device_count()
