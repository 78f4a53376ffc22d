"""Compose the config outside a Hydra run (for `grpo config`, tests and benchmarks)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from grpo_cli.config.resolvers import conf_dir, register_resolvers
from grpo_cli.config.schema import register_configs


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """The config `grpo run` would use for these overrides (without the hydra node)."""
    register_configs()
    register_resolvers()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides or []))


def to_yaml(cfg: DictConfig, resolve: bool = True) -> str:
    return OmegaConf.to_yaml(cfg, resolve=resolve)
