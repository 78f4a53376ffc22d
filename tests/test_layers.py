"""The package's layer rules (pyproject.toml, [tool.importlinter]) hold, and their check can fail.

Layers, top to bottom: cli -> hydra_app -> validate -> bench -> integrations | train -> probes | results | analysis ->
rollout | algorithm | tasks | models -> config | measures | runtime; integrations import no train
module; results, analysis and measures import no torch, transformers, vLLM or torch-side
package; no package has an import cycle.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = (
    "import sys\n"
    "from importlinter.cli import lint_imports\n"
    "sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True, no_logo=True))\n"
)


def lint(config: Path) -> subprocess.CompletedProcess:
    # this checkout's grpo_cli first, not an installed one; the rest of PYTHONPATH kept (an offline
    # GPU machine provides import-linter through it)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", LINT, str(config)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )


def test_import_contracts_hold():
    done = lint(ROOT / "pyproject.toml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 kept, 0 broken" in done.stdout


def test_a_layer_order_the_code_breaks_is_reported(tmp_path):
    config = tmp_path / "reversed.ini"
    config.write_text(
        "[importlinter]\nroot_package = grpo_cli\n\n"
        "[importlinter:contract:reversed]\nname = train below probes\ntype = layers\n"
        "layers =\n    grpo_cli.probes\n    grpo_cli.train\n"
    )
    done = lint(config)
    assert done.returncode != 0
    assert "BROKEN" in done.stdout and "grpo_cli.train" in done.stdout
