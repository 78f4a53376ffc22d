"""scripts/check_gpu_resolution.py: pip's dry-run report of the GPU set-up, checked as `pip check`
checks an environment. The resolution itself needs the package index (`make check-gpu-resolution`,
run by `make check`); here the checker is tested on small hand-written reports."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from check_gpu_resolution import parse_args, summary, unmet_requirements  # noqa: E402

ENVIRONMENT = {"python_version": "3.11", "sys_platform": "linux", "platform_machine": "x86_64",
               "platform_system": "Linux", "implementation_name": "cpython",
               "platform_python_implementation": "CPython", "python_full_version": "3.11.7",
               "os_name": "posix", "platform_release": "", "platform_version": "",
               "implementation_version": "3.11.7"}


def report(*packages, extras=None):
    return {"environment": ENVIRONMENT, "install": [
        {"metadata": {"name": name, "version": version, "requires_dist": list(requires)},
         "requested_extras": (extras or {}).get(name)}
        for name, version, requires in packages]}


VLLM = ("vllm", "0.33.0", ["torch==2.14.0", "transformers<5.21.0,>=5.16.1",
                           'triton; platform_machine == "aarch64"'])
PROJECT = ("grpo-cli", "0.1.0", ["torch<3,>=2.6", "transformers<6,>=5.16.1",
                                 'pytest>=8; extra == "dev"', 'wandb>=0.31; extra == "trackers"'])


def test_a_consistent_resolution_has_nothing_unmet():
    consistent = report(VLLM, PROJECT, ("torch", "2.14.0", []), ("transformers", "5.20.2", []),
                        ("pytest", "9.0", []), extras={"grpo-cli": ["dev"]})
    assert unmet_requirements(consistent) == []  # triton: aarch64 only; wandb: extra not asked
    assert summary(consistent) == {"vllm": "0.33.0", "torch": "2.14.0", "transformers": "5.20.2",
                                   "grpo-cli": "0.1.0"}


def test_the_old_floor_above_vllms_cap_is_caught():
    """What `make setup` did before: transformers lifted to 5.24 over vLLM's < 5.21."""
    lifted = report(VLLM, PROJECT, ("torch", "2.14.0", []), ("transformers", "5.24.0", []))
    assert unmet_requirements(lifted) == [
        "vllm 0.33.0 has requirement transformers<5.21.0,>=5.16.1, but the resolution has "
        "transformers 5.24.0"]


def test_a_missing_requirement_and_a_requested_extra_are_caught():
    missing = report(VLLM, PROJECT, ("transformers", "5.20.2", []), extras={"grpo-cli": ["dev"]})
    assert unmet_requirements(missing) == [
        "vllm 0.33.0 requires torch, which is not in the resolution",
        "grpo-cli 0.1.0 requires torch, which is not in the resolution",
        "grpo-cli 0.1.0 requires pytest, which is not in the resolution"]


def test_the_makefile_targets_arguments_reach_pip_as_they_are():
    """`make check-gpu-resolution` passes the set-up's own pip arguments, `-e .[...]` included."""
    import re

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    line = re.search(r"scripts/check_gpu_resolution.py (.+)", makefile).group(1)
    arguments = [a.strip('"').replace("$(VLLM_GPU)", "vllm==0.33.0") for a in line.split()]
    args = parse_args(["--summary", "out.json", *arguments])
    assert args.requirements == ["vllm==0.33.0", "-e", ".[dev,trackers]"]
    assert str(args.summary) == "out.json"
