"""Run the steps (or, with --dry-run, check that each composes) and write the report.

Each step is one subprocess in its own process group with its own time limit, cut further by
what is left of the whole budget; a failure or a timeout is recorded and the next step runs.
Every step leaves `steps/<name>.json` (status, seconds, figures) and `logs/<name>.log` in the
output directory, and the report is rebuilt from all the records there, so runs with --only into
the same directory add up (a GPU machine that allows 10 minutes a command can run it in parts).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from grpo_cli.gpu_report import report
from grpo_cli.gpu_report.checks import StepBroken
from grpo_cli.gpu_report.steps import REPO, Settings, Step, plan

LOG_TAIL_BYTES = 200_000  # logs are cut to their last 200 kB, so the directory stays small
MIN_STEP_S = 20  # a step is skipped when less of the budget is left


def select(steps: list[Step], only: str | None, skip: str | None) -> list[Step]:
    """Steps named (or numbered by issue step) in `only`, minus those in `skip`; comma lists."""
    def matches(step: Step, names: str) -> bool:
        wanted = {name.strip() for name in names.split(",") if name.strip()}
        return step.name in wanted or str(step.group) in wanted

    known = {step.name for step in steps} | {str(step.group) for step in steps}
    for names in (only, skip):
        unknown = sorted({n.strip() for n in (names or "").split(",") if n.strip()} - known)
        if unknown:
            raise ValueError(f"unknown step(s) {', '.join(unknown)}; --list shows them")
    chosen = [step for step in steps if only is None or matches(step, only)]
    return [step for step in chosen if skip is None or not matches(step, skip)]


def dry_run(steps: list[Step], echo: Callable[[str], None] = print) -> list[dict]:
    """Print the plan and check that every step's command composes; a broken step is reported
    and the others are still checked. Returns one record per step (status ok or broken)."""
    records = []
    for step in steps:
        echo(f"[{step.group}] {step.name} ({step.timeout_s} s): {step.title}\n    $ {step.command()}")
        start = time.perf_counter()
        try:
            detail, status = step.check(), "ok"
        except Exception as error:  # any failure of a check is this step's, not the report's
            status = "broken"
            detail = str(error) if isinstance(error, StepBroken) else f"{type(error).__name__}: {error}"
        echo(f"    {status}: {detail}")
        records.append({"name": step.name, "group": step.group, "status": status, "detail": detail,
                        "seconds": time.perf_counter() - start})
    return records


def run_command(argv: list[str], log_path: Path, timeout_s: float) -> tuple[str, int | None]:
    """('ok' | 'failed' | 'timeout', exit code): the command in its own process group, output to
    the log; on timeout the whole group gets SIGTERM, then SIGKILL after 15 s."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, None)):
                try:
                    os.killpg(process.pid, sig)
                    process.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
                except ProcessLookupError:
                    break
            return "timeout", None
    return ("ok" if code == 0 else "failed"), code


def tail(path: Path) -> str:
    data = path.read_bytes()
    if len(data) > LOG_TAIL_BYTES:
        data = data[-LOG_TAIL_BYTES:]
        path.write_bytes(data)
    return data.decode("utf-8", errors="replace")


def run_steps(steps: list[Step], out_dir: Path, budget_s: float, echo: Callable[[str], None] = print
              ) -> list[dict]:
    """Run each step within its limit and the budget left; record it; never stop early."""
    (out_dir / "steps").mkdir(parents=True, exist_ok=True)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    start, records = time.monotonic(), []
    for step in steps:
        left = budget_s - (time.monotonic() - start)
        record = {"name": step.name, "group": step.group, "title": step.title,
                  "command": step.command(), "figures": [], "seconds": 0.0, "detail": ""}
        if left < MIN_STEP_S:
            record.update(status="skipped", detail=f"budget spent ({left:.0f} s left)")
        else:
            limit = min(step.timeout_s, left)
            echo(f"[{step.group}] {step.name}: up to {limit:.0f} s\n    $ {step.command()}")
            log_path = out_dir / "logs" / f"{step.name}.log"
            began = time.monotonic()
            status, code = run_command(step.argv, log_path, limit)
            record.update(status=status, seconds=time.monotonic() - began,
                          detail=f"exit code {code}" if status == "failed" else
                          (f"stopped at {limit:.0f} s" if status == "timeout" else ""))
            try:
                record["figures"] = [asdict(figure) for figure in step.collect(tail(log_path))]
            except Exception as error:  # a reader's failure is recorded beside the step's status
                record["detail"] = (record["detail"] + f"; figures not read: {error}").lstrip("; ")
            if step.scratch is not None:  # checkpoints are large (23 GB for the rehearsal)
                for checkpoints in step.scratch.glob("**/checkpoints"):
                    shutil.rmtree(checkpoints, ignore_errors=True)
            echo(f"    {record['status']} in {record['seconds']:.0f} s, "
                 f"{len(record['figures'])} figures {record['detail']}")
        (out_dir / "steps" / f"{step.name}.json").write_text(json.dumps(record, indent=1))
        records.append(record)
    return records


def saved_records(out_dir: Path, order: list[Step]) -> list[dict]:
    """Every step record in the directory (this run's and earlier --only runs'), in plan order."""
    rank = {step.name: index for index, step in enumerate(order)}
    records = [json.loads(path.read_text()) for path in (out_dir / "steps").glob("*.json")]
    return sorted(records, key=lambda record: rank.get(record["name"], len(rank)))


def environment() -> dict[str, str]:
    """GPU, versions and commit, for the report's head."""
    from importlib import metadata

    import torch

    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "not installed"

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
        "gpu_count": str(torch.cuda.device_count()),
        "cuda": str(torch.version.cuda),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "trl": version("trl"),
        "vllm": version("vllm"),
        "commit": commit or "unknown (no git)",
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m grpo_cli.gpu_report",
        description="Every GPU figure grpo-cli owes, in one command (docs/speed.md).")
    parser.add_argument("--dry-run", action="store_true",
                        default=os.environ.get("GPU_REPORT_DRY", "") not in ("", "0"),
                        help="print the plan and check that every step composes (CPU; also "
                             "GPU_REPORT_DRY=1)")
    parser.add_argument("--list", action="store_true", help="list the steps and exit")
    parser.add_argument("--only", help="comma list of step names or issue step numbers (1-6)")
    parser.add_argument("--skip", help="comma list of step names or issue step numbers to leave out")
    parser.add_argument("--budget-min", type=float, default=25.0, help="whole run, minutes")
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")  # parts of one visit add up, not visits
    parser.add_argument("--out", type=Path, default=REPO / "results" / "gpu_report" / today,
                        help="report directory (small: copy it back); default results/gpu_report/DATE")
    parser.add_argument("--scratch", type=Path, default=None,
                        help="run directories, checkpoints deleted after each step (default: <out>-runs)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, cuda_available: Callable[[], bool] | None = None,
         extra_steps: list[Step] | None = None) -> int:
    """Exit code: 0 done (steps may have failed: see the report), 1 a dry-run check failed,
    2 refused (no CUDA without --dry-run, or an unknown step)."""
    args = parse_args(argv)
    out_dir = args.out.resolve()
    settings = Settings(out_dir=out_dir,
                        scratch_dir=(args.scratch or out_dir.parent / f"{out_dir.name}-runs").resolve())
    steps = plan(settings) + list(extra_steps or [])
    try:
        steps = select(steps, args.only, args.skip)
    except ValueError as error:
        print(f"gpu-report: {error}")
        return 2
    if args.list:
        for step in steps:
            print(f"[{step.group}] {step.name:20s} {step.timeout_s:4d} s  {step.title}")
        return 0
    if args.dry_run:
        records = dry_run(steps)
        broken = [record["name"] for record in records if record["status"] != "ok"]
        print(f"dry run: {len(records) - len(broken)} of {len(records)} steps compose"
              + (f"; broken: {', '.join(broken)}" if broken else ""))
        return 1 if broken else 0
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available
    if not cuda_available():
        print("gpu-report: no CUDA device (torch.cuda.is_available() is False); on a CPU machine "
              "use --dry-run (or GPU_REPORT_DRY=1) to check the plan")
        return 2
    ran = run_steps(steps, out_dir, args.budget_min * 60)
    not_ok = [f"{record['name']} ({record['status']})" for record in ran if record["status"] != "ok"]
    print(f"{len(ran) - len(not_ok)} of {len(ran)} steps ok" + (f"; {', '.join(not_ok)}: see "
          f"{out_dir / 'logs'}" if not_ok else ""))
    records = saved_records(out_dir, plan(settings) + list(extra_steps or []))
    env = environment()
    path = report.write_report(out_dir, env, records, REPO / "docs")
    gpu = "".join(ch if ch.isalnum() else "_" for ch in env["gpu"]).strip("_")
    print(f"wrote {path} and {path.with_suffix('.csv')}; to keep it: cp {path} "
          f"docs/gpu_report_{env['date'][:10]}_{gpu}.md (and the .csv beside it)")
    return 0
