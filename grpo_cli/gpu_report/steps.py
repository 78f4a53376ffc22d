"""The report's steps: issue 24's six, each one subprocess with its own time limit.

A `Step` is a command line, a limit, a dry-run `check` (does the command compose?) and a
`collect` (the figures it left behind). `plan(settings)` lists them in the issue's order:

  1 tests_fast, tests_gpu       the fast suite with CUDA visible; the `gpu` tier
  2 rank_collapse_bf16, _fp32   experiment=cpu_rank_collapse device=cuda, R = 2, 4, 8, with probes
  3 rollout                     SmolLM2-135M-shaped model, 64 rows x 64 new tokens: hf generate,
                                hf_static, hf_static + CUDA graphs (tok/s), then the training pass
    rollout_nemotron            the rehearsal's rollout shape (Nemotron-Mini-4B architecture,
                                random bf16 weights, 64 rows x 512 new tokens): hf_static eager
                                and in CUDA graphs (seconds a rollout, tok/s)
  4 bench_25m, bench_smollm2    grpo bench --vs-trl (ratio of step times)
  5 layer_spectra               the paper preset's nine layer weights' float64 spectra (up to
                                3072 x 9216): probes.layer_spectrum=gram, then svd (seconds)
    rehearsal                   experiment=paper_rehearsal at full size (peak memory per phase);
                                rollout.backend=hf_static when vLLM is absent
  6 gpu_smollm2                 experiment=gpu_smollm2 for a few steps
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from grpo_cli.gpu_report import checks, collect
from grpo_cli.gpu_report.report import Figure

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Step:
    name: str
    group: int  # the step number, 1 to 6
    title: str
    argv: list[str]
    timeout_s: int
    check: Callable[[], str]  # dry run: raises checks.StepBroken, else says what it checked
    collect: Callable[[str], list[Figure]] = lambda log_text: []  # figures, from the log or files
    scratch: Path | None = None  # run directories (checkpoints deleted after the step)

    def command(self) -> str:
        """The command line as printed (this interpreter shown as `python`)."""
        return " ".join("python" if arg == sys.executable else arg for arg in self.argv)


@dataclass
class Settings:
    out_dir: Path  # the report: gpu_report.md, gpu_report.csv, steps/, logs/
    scratch_dir: Path  # run directories of the `grpo run` steps
    python: str = sys.executable
    group_sizes: tuple[int, ...] = (2, 4, 8)
    rank_steps: int = 30  # steps of each cpu_rank_collapse run
    bench_steps: int = 6  # timed step pairs of each --vs-trl bench
    smollm2_steps: int = 4  # steps of the gpu_smollm2 run
    rehearsal_backend: str = field(default_factory=lambda: (
        "vllm" if importlib.util.find_spec("vllm") else "hf_static"))
    gsm8k_dir: Path | None = field(default_factory=lambda: next(  # offline GSM8K (no hub)
        (path for path in [REPO.parent / "shared" / "data" / "gsm8k"] if (path / "test.jsonl").exists()), None))
    pytest_workers: int = field(default_factory=lambda: 8 if importlib.util.find_spec("xdist") else 0)


def grpo(settings: Settings, *args: str) -> list[str]:
    return [settings.python, "-m", "grpo_cli.cli", *args]


def run_overrides(settings: Settings, name: str) -> list[str]:
    """Settings every `grpo run` step shares: its own results directory, a fresh start."""
    return [f"results_dir={settings.scratch_dir / name}", "resume=false", "progress=false"]


def tests_steps(settings: Settings) -> list[Step]:
    pytest = [settings.python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    workers = ["-n", str(settings.pytest_workers)] if settings.pytest_workers else []
    # the gpu tier shares one GPU: 4 workers (145 s sequential on an H100, 104 s with -n 4)
    gpu_workers = ["-n", str(min(4, settings.pytest_workers))] if settings.pytest_workers else []
    pyproject = REPO / "pyproject.toml"
    return [
        Step("tests_fast", 1, "fast suite with CUDA visible", pytest + workers, 180,
             lambda: checks.check_tests([REPO / "tests"], None, pyproject),
             lambda log: collect.pytest_figures("tests_fast", log)),
        Step("tests_gpu", 1, "gpu tier (`-m gpu`)", pytest + gpu_workers + ["-m", "gpu", "tests"], 240,
             lambda: checks.check_tests([REPO / "tests"], "gpu", pyproject),
             lambda log: collect.pytest_figures("tests_gpu", log)),
    ]


def rank_collapse_step(settings: Settings, dtype: str) -> Step:
    name = f"rank_collapse_{'bf16' if dtype == 'bfloat16' else 'fp32'}"
    base = ["experiment=cpu_rank_collapse", "device=cuda", f"model.dtype={dtype}",
            f"train.steps={settings.rank_steps}", *run_overrides(settings, name)]
    sizes = ",".join(str(size) for size in settings.group_sizes)
    return Step(
        name, 2, f"cpu_rank_collapse on CUDA, {dtype}, R = {sizes}, {settings.rank_steps} steps, probes",
        grpo(settings, "run", "-m", *base, f"rollout.group_size={sizes}"), 150,
        lambda: checks.check_overrides([base + [f"rollout.group_size={size}"]
                                        for size in settings.group_sizes]),
        lambda log: collect.run_figures(name, settings.scratch_dir / name, settings.rank_steps),
        settings.scratch_dir / name,
    )


def script_step(settings: Settings, name: str, group: int, title: str, script: str, args: list[str],
                timeout_s: int, figures: Callable[[str, Path], list[Figure]]) -> Step:
    """A benchmark under scripts/ that appends its rows to steps/<name>.csv (`--out`), checked by
    its own `--dry-run`; `figures(name, csv_path)` reads them."""
    path = Path(script)
    csv_path = settings.out_dir / "steps" / f"{name}.csv"
    return Step(name, group, title, [settings.python, str(path), *args, "--out", str(csv_path)],
                timeout_s, lambda: checks.check_script(settings.python, path, args, REPO),
                lambda log: figures(name, csv_path))


def rollout_step(settings: Settings) -> Step:
    args = ["--device", "cuda", "--dtype", "bfloat16", "--size", "smollm2", "--prompts", "8",
            "--group-size", "8", "--max-new-tokens", "64", "--repeats", "3",
            "--backends", "hf_generate,hf_static,hf_static_graphs", "--train-pass"]
    return script_step(settings, "rollout", 3, "rollout tok/s, SmolLM2-135M shape, 64 rows x 64 new "
                       "tokens, bf16; training pass", "scripts/bench_rollout.py", args, 150,
                       collect.rollout_figures)


def nemotron_rollout_step(settings: Settings) -> Step:
    args = ["--device", "cuda", "--dtype", "bfloat16", "--size", "nemotron_4b", "--prompts", "8",
            "--group-size", "8", "--max-new-tokens", "512", "--repeats", "1",
            "--backends", "hf_static,hf_static_graphs"]
    return script_step(settings, "rollout_nemotron", 3, "rollout of the rehearsal's shape, "
                       "Nemotron-Mini-4B architecture, 64 rows x 512 new tokens, bf16: hf_static "
                       "eager and in CUDA graphs", "scripts/bench_rollout.py", args, 240,
                       collect.rollout_figures)


def bench_step(settings: Settings, size: str, args: list[str], timeout_s: int) -> Step:
    name = f"bench_{size}"
    csv_path = settings.out_dir / "steps" / f"{name}.csv"
    bench_args = ["--model-size", size, "--shared-prompt-forward", "device=cuda", *args]
    return Step(
        name, 4, f"grpo bench --vs-trl, {size}",
        grpo(settings, "bench", "--steps", str(settings.bench_steps), "--vs-trl", *bench_args,
             "--out", str(csv_path)), timeout_s,
        lambda: checks.check_bench(bench_args, vs_trl=True),
        lambda log: collect.bench_figures(name, csv_path),
    )


def layer_spectra_step(settings: Settings) -> Step:
    args = ["--shapes", "nemotron_4b", "--device", "cuda", "--methods", "gram,svd", "--repeats", "1"]
    return script_step(settings, "layer_spectra", 5, "the paper preset's layer spectra (nine weights "
                       "up to 3072 x 9216, float64, x 3 ways): the Gram route, then svdvals",
                       "scripts/bench_layer_spectra.py", args, 150, collect.layer_spectra_figures)


def rehearsal_step(settings: Settings) -> Step:
    overrides = ["experiment=paper_rehearsal", f"rollout.backend={settings.rehearsal_backend}",
                 *run_overrides(settings, "rehearsal")]
    if settings.gsm8k_dir is not None:  # the preset's prompts; a GPU machine has no hub
        overrides.append(f"task.path={settings.gsm8k_dir}")
    return Step(
        "rehearsal", 5, f"paper rehearsal at full size, rollout.backend={settings.rehearsal_backend}",
        grpo(settings, "run", *overrides), 360,
        lambda: checks.check_overrides([overrides]),
        lambda log: collect.rehearsal_figures("rehearsal", settings.scratch_dir / "rehearsal"),
        settings.scratch_dir / "rehearsal",
    )


def smollm2_step(settings: Settings) -> Step:
    steps = settings.smollm2_steps
    overrides = ["experiment=gpu_smollm2", f"train.steps={steps}", f"eval.every={steps}",
                 f"probes.every={steps}", *run_overrides(settings, "gpu_smollm2")]
    return Step(
        "gpu_smollm2", 6, f"experiment=gpu_smollm2, {steps} steps",
        grpo(settings, "run", *overrides), 180,
        lambda: checks.check_overrides([overrides]),
        lambda log: collect.run_figures("gpu_smollm2", settings.scratch_dir / "gpu_smollm2", steps),
        settings.scratch_dir / "gpu_smollm2",
    )


def plan(settings: Settings) -> list[Step]:
    """Every step, in the issue's order; limits add up to about 35 minutes (the budget cuts)."""
    return [
        *tests_steps(settings),
        rank_collapse_step(settings, "bfloat16"),
        rank_collapse_step(settings, "float32"),
        rollout_step(settings),
        nemotron_rollout_step(settings),
        bench_step(settings, "25m", ["model.dtype=float32"], 120),
        bench_step(settings, "smollm2", ["rollout.group_size=8"], 180),
        layer_spectra_step(settings),
        rehearsal_step(settings),
        smollm2_step(settings),
    ]
