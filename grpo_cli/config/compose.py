"""Compose the config outside a Hydra run (for `grpo config`, tests and benchmarks)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from grpo_cli.config.errors import ConfigError
from grpo_cli.config.resolvers import conf_dir, register_resolvers
from grpo_cli.config.schema import register_configs


def check_group_options(overrides: list[str]) -> None:
    """ConfigError unless every config group option (`experiment=smoke`, `hydra/launcher=slurm`)
    names a file under conf/<group>/: `experiment=../../x` once loaded a YAML from outside conf/."""
    groups = {path.name for path in conf_dir().iterdir() if path.is_dir()}
    for override in overrides:
        key, equals, value = override.lstrip("+~").partition("=")
        if not equals or not (key in groups or "/" in key):
            continue
        for option in value.split(","):  # a sweep lists several
            parts = option.strip().replace("\\", "/").split("/")
            if option.strip().startswith("/") or ".." in parts:
                raise ConfigError(f"{key}={value!r}: a config group option names a file under "
                                  f"conf/{key}/ (no '..' or absolute path)")


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """The config `grpo run` would use for these overrides (without the hydra node)."""
    check_group_options(list(overrides or []))
    register_configs()
    register_resolvers()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides or []))


def to_yaml(cfg: DictConfig, resolve: bool = True) -> str:
    return OmegaConf.to_yaml(cfg, resolve=resolve)
