"""A group choice on the command line wins over an experiment preset's values.

Presets are merged after the group options (conf/config.yaml), so a preset key that an option
file also sets would silently undo `grpo run experiment=P group=option`. Sizes are the one
allowed exception: a preset's scale applies whichever option is chosen.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from grpo_cli.config.compose import compose_config
from grpo_cli.config.resolvers import conf_dir

GROUPS = ("model", "task", "rollout", "algorithm", "probes", "alarms")
PRESET_SIZES = {"task.train_size", "task.eval_size", "model.warm_start.steps"}  # a preset's scale


def leaves(node: dict, prefix: str = ""):
    for key, value in node.items():
        if key == "defaults":
            continue
        if isinstance(value, dict):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def preset_values(name: str) -> dict:
    """The keys a preset's own bodies set (its parent presets' first), as flat dotted keys."""
    raw = OmegaConf.to_container(OmegaConf.load(conf_dir() / "experiment" / f"{name}.yaml"))
    values: dict = {}
    for entry in raw.get("defaults", []):
        if isinstance(entry, str) and entry != "_self_":  # another preset this one extends
            values.update(preset_values(entry))
    values.update(leaves(raw))
    return values


def option_files():
    for group in GROUPS:
        for path in sorted((conf_dir() / group).glob("*.yaml")):
            yield group, path


PRESETS = sorted(p.stem for p in (conf_dir() / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS)
def test_no_preset_undoes_a_group_option(preset):
    values = preset_values(preset)
    undone = []
    for group, path in option_files():
        option = OmegaConf.to_container(OmegaConf.load(path))
        for key, value in leaves(option):
            full = f"{group}.{key}"
            if full in values and values[full] != value and full not in PRESET_SIZES:
                undone.append(f"{group}={path.stem}: {full} {value!r} -> preset's {values[full]!r}")
    assert undone == [], f"experiment={preset} undoes a command-line group choice: {undone}"


def test_probes_off_beats_a_preset_that_sets_every():
    assert preset_values("cpu_smollm2_learn")["probes.every"] == 4
    cfg = compose_config(["experiment=cpu_smollm2_learn", "probes=off"])
    assert cfg.probes.enabled is False
    assert compose_config(["experiment=cpu_smollm2_learn"]).probes.enabled is True


def test_rollout_and_task_choices_beat_the_smollm2_preset():
    preset = compose_config(["experiment=gpu_smollm2"])
    assert preset.rollout.backend == "hf"
    assert preset.task.prompt_template.endswith("ends with the number.")
    cfg = compose_config(["experiment=gpu_smollm2", "rollout=hf_static", "task=gsm8k"])
    assert cfg.rollout.backend == "hf_static"
    gsm8k = OmegaConf.load(Path(conf_dir()) / "task" / "gsm8k.yaml")
    assert cfg.task.prompt_template == gsm8k.prompt_template
