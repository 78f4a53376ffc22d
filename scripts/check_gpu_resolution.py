"""Check, on any machine, that the GPU set-up resolves: vLLM, the torch it pins and grpo-cli's
extras in one pip resolution, every declared requirement met.

`make setup` on a machine with `nvidia-smi` runs one `pip install "$(VLLM_GPU)" -e ".[dev,trackers]"`;
this asks pip for the same resolution with `--dry-run --ignore-installed --report` (metadata only:
nothing is installed, no CUDA wheel is downloaded), then checks the report as `pip check` would
check the installed environment: each resolved package's requirements (markers evaluated for this
platform, extras as requested) hold among the resolved versions. It prints the versions a GPU user
gets and writes the report's summary as JSON (--summary).

Usage: python scripts/check_gpu_resolution.py [--summary FILE] REQUIREMENT... (the Makefile's
`check-gpu-resolution` passes the set-up's own requirements)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

SHOWN = ("vllm", "torch", "transformers", "tokenizers", "trl", "peft", "grpo-cli")


def resolve(requirements: list[str]) -> dict:
    """pip's report of installing `requirements` into an empty environment (nothing installed)."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                        "--quiet", "--disable-pip-version-check", "--report", str(report),
                        *requirements], check=True)
        return json.loads(report.read_text())


def unmet_requirements(report: dict) -> list[str]:
    """Each requirement of a resolved package that the resolved set does not meet, as pip check
    words it; [] when the resolution is consistent."""
    environment = report.get("environment") or default_environment()
    installs = report["install"]
    versions = {canonicalize_name(item["metadata"]["name"]): Version(item["metadata"]["version"])
                for item in installs}
    unmet = []
    for item in installs:
        metadata = item["metadata"]
        extras = set(item.get("requested_extras") or [])
        for line in metadata.get("requires_dist") or []:
            requirement = Requirement(line)
            if requirement.marker is not None and not any(
                requirement.marker.evaluate(environment | {"extra": extra}) for extra in extras | {""}
            ):
                continue
            name = canonicalize_name(requirement.name)
            found = versions.get(name)
            who = f"{metadata['name']} {metadata['version']}"
            if found is None:
                unmet.append(f"{who} requires {requirement.name}, which is not in the resolution")
            elif not requirement.specifier.contains(found, prereleases=True):
                unmet.append(f"{who} has requirement {requirement}, but the resolution has "
                             f"{requirement.name} {found}")
    return unmet


def summary(report: dict) -> dict[str, str]:
    versions = {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
                for item in report["install"]}
    return {name: versions[name] for name in SHOWN if name in versions}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """--summary FILE, then pip's own arguments as they are (`-e .[dev]` included)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", type=Path, help="write the shown versions here as JSON")
    parser.add_argument("requirements", nargs=argparse.REMAINDER, help="pip install arguments (-e PATH included)")
    args = parser.parse_args(argv)
    if not args.requirements:
        parser.error("give the requirements to resolve")
    return args


def main() -> int:
    args = parse_args()
    report = resolve(args.requirements)
    unmet = unmet_requirements(report)
    shown = summary(report)
    print("GPU set-up resolves to: " + ", ".join(f"{name} {version}" for name, version in shown.items())
          + f" ({len(report['install'])} packages)")
    if args.summary:
        args.summary.write_text(json.dumps(shown, indent=2) + "\n")
    for line in unmet:
        print(f"unmet: {line}")
    return 1 if unmet else 0


if __name__ == "__main__":
    sys.exit(main())
