"""`python -m grpo_cli.gpu_report`: the dry run composes every step (CI runs it here), a broken
step is reported while the others are still checked or run, the report puts each figure beside
its target and previous value, and the command refuses a machine without CUDA."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from grpo_cli.gpu_report import checks, collect
from grpo_cli.gpu_report.report import Figure, write_report
from grpo_cli.gpu_report.runner import dry_run, main, run_steps, saved_records, select
from grpo_cli.gpu_report.steps import Settings, Step, plan, rank_collapse_step

ISSUE_STEPS = {1, 2, 3, 4, 5, 6}


def settings(tmp_path: Path, **overrides) -> Settings:
    return Settings(out_dir=tmp_path / "report", scratch_dir=tmp_path / "runs", **overrides)


def broken_steps() -> list[Step]:
    """One broken command of each kind a step can have: a Hydra key, a bench flag, a script flag."""
    return [
        Step("broken_override", 2, "a misspelled key", ["true"], 1, lambda: checks.check_overrides(
            [["experiment=cpu_rank_collapse", "rollout.group_sise=2"]])),
        Step("broken_bench_flag", 4, "a misspelled bench flag", ["true"], 1,
             lambda: checks.check_bench(["--model-sise", "25m"], vs_trl=False)),
        Step("broken_script_flag", 3, "a misspelled script flag", ["true"], 1,
             lambda: checks.check_script(sys.executable, Path("scripts/bench_rollout.py"),
                                         ["--backends", "hf_statik"], Path(__file__).parents[1])),
    ]


@pytest.fixture(scope="module")
def dry_records(tmp_path_factory) -> tuple[list[Step], list[dict], list[str]]:
    """One dry run over the whole plan with the broken steps first."""
    steps = plan(settings(tmp_path_factory.mktemp("dry")))
    lines: list[str] = []
    return steps, dry_run(broken_steps() + steps, echo=lines.append), lines


def test_dry_run_composes_every_step(dry_records):
    steps, records, lines = dry_records
    planned = {record["name"]: record for record in records[len(broken_steps()):]}
    assert list(planned) == [step.name for step in steps]
    assert {step.group for step in steps} == ISSUE_STEPS
    assert all(record["status"] == "ok" for record in planned.values()), planned
    assert "3 config(s) composed" in planned["rank_collapse_bf16"]["detail"]  # R = 2, 4, 8
    assert any("rollout.backend=" in line and "paper_rehearsal" in line for line in lines)


def test_broken_step_is_reported_and_the_rest_still_checked(dry_records):
    _, records, _ = dry_records
    broken = {record["name"]: record["detail"] for record in records if record["status"] == "broken"}
    assert set(broken) == {"broken_override", "broken_bench_flag", "broken_script_flag"}
    assert "group_sise" in broken["broken_override"]
    assert "--model-sise" in broken["broken_bench_flag"]
    assert "hf_statik" in broken["broken_script_flag"]
    assert sum(record["status"] == "ok" for record in records) == len(records) - 3


def test_main_dry_run_exit_codes(tmp_path, capsys):
    out = ["--out", str(tmp_path / "report")]
    assert main(["--dry-run", "--only", "rollout", *out]) == 0
    assert main(["--dry-run", "--only", "rollout,broken_override", *out],
                extra_steps=broken_steps()) == 1
    printed = capsys.readouterr().out
    assert "1 of 2 steps compose; broken: broken_override" in printed
    assert main(["--dry-run", "--only", "nine", *out]) == 2
    assert not (tmp_path / "report" / "gpu_report.md").exists()  # a dry run writes no report


def test_refuses_without_cuda(tmp_path, capsys):
    code = main(["--out", str(tmp_path / "report")], cuda_available=lambda: False)
    assert code == 2
    assert "no CUDA device" in capsys.readouterr().out
    assert not (tmp_path / "report").exists()


def test_select_by_name_or_issue_step(tmp_path):
    steps = plan(settings(tmp_path))
    assert [s.name for s in select(steps, "4", None)] == ["bench_25m", "bench_smollm2"]
    assert [s.name for s in select(steps, "1,rollout", "tests_gpu")] == ["tests_fast", "rollout"]
    with pytest.raises(ValueError, match="unknown step"):
        select(steps, "tests", None)


def python_step(name: str, code: str, timeout_s: int, collect_figures=None) -> Step:
    return Step(name, 1, name, [sys.executable, "-c", code], timeout_s, lambda: "ok",
                collect_figures or (lambda log: []))


def test_steps_fail_soft_time_out_and_respect_the_budget(tmp_path):
    out = tmp_path / "report"
    steps = [
        python_step("fails", "import sys; print('boom'); sys.exit(3)", 30),
        python_step("hangs", "import time; time.sleep(60)", 1),
        python_step("passes", "print('== 2 failed, 7 passed, 1 skipped in 0.1s ==')", 30,
                    lambda log: collect.pytest_figures("passes", log)),
    ]
    records = run_steps(steps, out, budget_s=600, echo=lambda line: None)
    assert [r["status"] for r in records] == ["failed", "timeout", "ok"]
    assert records[0]["detail"] == "exit code 3"
    assert "boom" in (out / "logs" / "fails.log").read_text()
    figures = {f["key"]: f["value"] for f in records[2]["figures"]}
    assert figures == {"passes.passed": 7, "passes.failed": 2, "passes.skipped": 1}
    later = run_steps([python_step("late", "pass", 30)], out, budget_s=5, echo=lambda line: None)
    assert later[0]["status"] == "skipped"  # less than a step's minimum left
    names = [r["name"] for r in saved_records(out, steps)]
    assert names == ["fails", "hangs", "passes", "late"]  # earlier runs into the directory add up


def test_report_puts_each_figure_beside_target_and_previous(tmp_path):
    records = [
        {"name": "rollout", "group": 3, "status": "ok", "seconds": 40.0, "command": "x",
         "figures": [vars(Figure("rollout.hf_static_graphs.tokens_per_s", "graphs", 61234.5, "tok/s")),
                     vars(Figure("rollout.hf_generate.tokens_per_s", "generate", 2000.0, "tok/s")),
                     vars(Figure("rollout.train_pass.ms", "pass", 120.0, "ms"))]},
        {"name": "bench_25m", "group": 4, "status": "timeout", "seconds": 120.0, "command": "y",
         "detail": "stopped at 120 s", "figures": []},
    ]
    docs = tmp_path / "docs"
    docs.mkdir()
    environment = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130"}
    markdown = write_report(tmp_path, environment, records, docs).read_text()
    assert "- gpu: NVIDIA H100 80GB HBM3" in markdown
    assert "| rollout | graphs | 61,234 | tok/s | >= 50,000 | yes |  |  |" in markdown
    assert "| rollout | generate | 2,000 | tok/s | >= 50,000 | no | 1,721 (H100 2026-11-22, 5212bb0) |" in markdown
    assert "| rollout | pass | 120 | ms | <= 100 | no |" in markdown
    assert "| bench_25m | 4 | timeout: stopped at 120 s |" in markdown
    with open(tmp_path / "gpu_report.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows[0]["key"] == "environment.gpu" and rows[0]["value"] == "NVIDIA H100 80GB HBM3"
    assert float(rows[2]["value"]) == 61234.5 and rows[2]["target"] == ">= 50,000"

    # a report committed under docs/ becomes the previous value
    (tmp_path / "gpu_report.csv").rename(docs / "gpu_report_2026-12-01_NVIDIA_H100.csv")
    markdown = write_report(tmp_path, environment, records, docs).read_text()
    assert "| 2,000 | tok/s | >= 50,000 | no | 2,000 (gpu_report_2026-12-01_NVIDIA_H100.csv) |" in markdown

    # a newer report without the rollout step: each figure keeps its newest measured value
    newer = [{"name": "bench_25m", "group": 4, "status": "ok", "seconds": 60.0, "command": "y",
              "figures": [vars(Figure("bench_25m.ratio", "ratio", 0.5))]}]
    write_report(tmp_path, environment, newer, docs)
    (tmp_path / "gpu_report.csv").rename(docs / "gpu_report_2026-12-02_NVIDIA_H100.csv")
    markdown = write_report(tmp_path, environment, records + newer, docs).read_text()
    assert "| 2,000 | tok/s | >= 50,000 | no | 2,000 (gpu_report_2026-12-01_NVIDIA_H100.csv) |" in markdown
    assert "| 0.5 |  | <= 0.3 | no | 0.5 (gpu_report_2026-12-02_NVIDIA_H100.csv) |" in markdown


def test_rollout_and_bench_readers(tmp_path):
    rollout = tmp_path / "rollout.csv"
    rollout.write_text(
        "backend,model,prompts,group_size,max_new_tokens,dtype,tokens_per_s,seconds_per_repeat\n"
        "hf_static_graphs,smollm2,8,8,64,bfloat16,55000.5,0.07\n"
        "train_pass,smollm2,8,8,64,bfloat16,90000,0.0812\n")
    figures = {f.key: f.value for f in collect.rollout_figures("rollout", rollout)}
    assert figures == {"rollout.hf_static_graphs.tokens_per_s": 55000.5,
                       "rollout.hf_static_graphs.rollout_s": 0.07,
                       "rollout.train_pass.ms": pytest.approx(81.2)}
    bench = tmp_path / "bench.csv"
    bench.write_text("side,step,step_s,tokens_per_s,ratio\n"
                     "grpo-cli,1,0.1,1000,0.2\ntrl,1,0.5,300,0.2\n"
                     "grpo-cli,2,0.3,900,0.6\ntrl,2,0.5,280,0.6\n"
                     "grpo-cli,3,0.2,950,0.4\ntrl,3,0.5,290,0.4\n")
    figures = {f.key: f.value for f in collect.bench_figures("bench_25m", bench)}
    assert figures["bench_25m.ratio"] == pytest.approx(0.4)
    assert figures["bench_25m.grpo_step_s"] == pytest.approx(0.2)
    assert figures["bench_25m.trl_step_s"] == pytest.approx(0.5)


@pytest.mark.gpu
def test_one_real_step_on_cuda(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    # 4 steps: probes at step 0 and the last step (probes.every), so steps 1-2 are plain steps
    step = rank_collapse_step(settings(tmp_path, rank_steps=4, group_sizes=(2,)), "float32")
    [record] = run_steps([step], tmp_path / "report", budget_s=600, echo=lambda line: None)
    assert record["status"] == "ok", (tmp_path / "report" / "logs" / f"{step.name}.log").read_text()[-2000:]
    figures = {f["key"]: f["value"] for f in record["figures"]}
    assert figures["rank_collapse_fp32.R2.steps"] == 4
    assert figures["rank_collapse_fp32.R2.step_s"] > 0
    assert not list((tmp_path / "runs").glob("**/checkpoints"))  # deleted after the step


def test_docs_list_every_step_with_its_limit(tmp_path):
    text = (Path(__file__).parents[1] / "docs" / "speed.md").read_text()
    section = text.split("## Every GPU figure in one command")[1].split("\n## ")[0]
    for step in plan(settings(tmp_path)):
        row = next((line for line in section.splitlines() if f"`{step.name}`" in line), None)
        assert row is not None, f"docs/speed.md's gpu-report table lacks {step.name}"
        assert f"{step.timeout_s} s" in row, f"{step.name}: limit {step.timeout_s} s not in {row!r}"


def test_environment_names_gpu_and_versions():
    from grpo_cli.gpu_report.runner import environment

    env = environment()
    assert {"date", "gpu", "cuda", "torch", "transformers", "trl", "vllm", "commit"} <= set(env)
    assert env["torch"].split("+")[0].count(".") == 2


def test_bench_rollout_train_pass_updates_every_parameter(tmp_path):
    """The rollout step's training pass does the whole update: forward, backward, AdamW."""
    import importlib.util

    import torch

    from grpo_cli.rollout.base import SamplingSettings
    from grpo_cli.rollout.static_decode import StaticDecodeBackend

    path = Path(__file__).parents[1] / "scripts" / "bench_rollout.py"
    spec = importlib.util.spec_from_file_location("bench_rollout", path)
    bench_rollout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_rollout)
    tokenizer, model = bench_rollout.save_char_llama(str(tmp_path), *bench_rollout.SIZES["tiny"])
    prompts = bench_rollout.make_prompts(tokenizer, 2)
    settings = SamplingSettings(group_size=3, max_new_tokens=6, temperature=1.0, top_p=1.0)
    batch = StaticDecodeBackend(model, tokenizer, torch.device("cpu")).generate(prompts, settings, 0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    seconds = bench_rollout.train_pass(model, batch, [row // 3 for row in range(6)], repeats=2)
    assert len(seconds) == 2 and all(s > 0 for s in seconds)
    unchanged = [name for name, p in model.named_parameters() if torch.equal(p, before[name])]
    assert unchanged == []


def test_bench_rollout_builds_the_rehearsal_architecture_on_the_device(tmp_path):
    """`--size nemotron_tiny`: Nemotron-Mini's config.json at tiny sizes, random weights drawn in the
    asked dtype; hf_static and its graph-ready step (eager on CPU) decode the same tokens."""
    import importlib.util
    import sys as system

    import torch

    path = Path(__file__).parents[1] / "scripts" / "bench_rollout.py"
    spec = importlib.util.spec_from_file_location("bench_rollout", path)
    bench_rollout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_rollout)
    _, model = bench_rollout.build_model("nemotron_tiny", str(tmp_path), torch.device("cpu"),
                                         torch.bfloat16, save=False)
    assert type(model).__name__ == "NemotronForCausalLM" and model.dtype == torch.bfloat16
    assert model.config.rope_parameters["partial_rotary_factor"] == 0.5
    assert torch.get_default_dtype() == torch.float32  # restored
    assert not any(tmp_path.iterdir())  # nothing written without vLLM
    out = tmp_path / "rollout.csv"
    bench_rollout.main(["--size", "nemotron_tiny", "--prompts", "2", "--group-size", "2",
                        "--max-new-tokens", "8", "--repeats", "1",
                        "--backends", "hf_static,hf_static_graphs", "--out", str(out)])
    rows = {row["backend"]: row for row in csv.DictReader(out.open())}
    assert set(rows) == {"hf_static", "hf_static_graphs"}
    assert rows["hf_static"]["tokens"] == rows["hf_static_graphs"]["tokens"] == "32"
    figures = {f.key for f in collect.rollout_figures("rollout_nemotron", out)}
    assert "rollout_nemotron.hf_static_graphs.rollout_s" in figures
    assert system.modules.get("vllm") is None


def test_rehearsal_reader_puts_each_phase_beside_its_plan(tmp_path):
    import pandas as pd

    from grpo_cli.results.rehearsal import PLAN_GIB, rehearsal_table

    run_dir = tmp_path / "paper_rehearsal" / "R8-grpo-s0"
    run_dir.mkdir(parents=True)
    timings = pd.DataFrame({"step": [0, 1, 2], "time_step": [30.0, 20.0, 22.0],
                            "time_rollout": [9.0, 4.0, 6.0], "time_probes": [12.0, 0.0, 8.0],
                            "peak_memory_mb": [40960.0, 51200.0, 50000.0],
                            **{f"peak_{phase}_mb": [10240.0, 20480.0, 15360.0] for phase in PLAN_GIB}})
    timings.to_csv(run_dir / "timings.csv", index=False)
    rehearsal_table(timings).to_csv(run_dir / "rehearsal.csv", index=False)
    figures = {f.key: f for f in collect.rehearsal_figures("rehearsal", tmp_path)}
    assert figures["rehearsal.rollout.peak_gib"].value == 20.0
    assert figures["rehearsal.rollout.peak_gib"].note == f"plan {PLAN_GIB['rollout'][0]} GiB"
    assert figures["rehearsal.whole_step.peak_gib"].value == 50.0
    assert figures["rehearsal.step_s"].value == 21.0  # median after step 0
    assert figures["rehearsal.rollout_s"].value == 5.0
    assert figures["rehearsal.probes_s"].value == 8.0  # probe steps only (step 1 had none)


def test_run_reader_tells_probe_steps_by_ranks_csv(tmp_path):
    """Plain steps record a tiny time_probes (the grad_sum observer): probe steps are those
    that wrote ranks.csv."""
    import pandas as pd

    run_dir = tmp_path / "cpu_rank_collapse" / "R4-grpo-s0-model.dtype=float32"
    run_dir.mkdir(parents=True)
    pd.DataFrame({"step": range(6), "time_step": [9.0, 0.2, 0.4, 0.3, 0.5, 1.0],
                  "time_probes": [5.0, 1e-4, 1e-4, 1e-4, 1e-4, 0.6],
                  "time_rollout": [1.0, 0.1, 0.1, 0.1, 0.1, 0.1], "time_eval": [0.0] * 6,
                  "peak_memory_mb": [100.0, 120.0, 110.0, 110.0, 110.0, 130.0]}
                 ).to_csv(run_dir / "timings.csv", index=False)
    pd.DataFrame({"step": [0, 0, 5], "matrix": ["a", "b", "a"]}).to_csv(run_dir / "ranks.csv", index=False)
    pd.DataFrame({"step": [0, 6], "accuracy": [0.25, 0.5]}).to_csv(run_dir / "eval.csv", index=False)
    figures = {f.key: f.value for f in collect.run_figures("rank", tmp_path, 30)}
    # probe steps' cost outside the rollout, beyond the plain steps' median 0.25 of 0.35 s:
    # step 0 (9.0 - 1.0 - 0.25) / 0.35, step 5 (1.0 - 0.1 - 0.25) / 0.35; median 12.0
    assert figures == pytest.approx({"rank.R4.step_s": 0.35, "rank.R4.probes_s": 2.8,
                                     "rank.R4.probe_cost": 1200.0, "rank.R4.peak_mb": 130.0,
                                     "rank.R4.steps": 6.0, "rank.R4.accuracy": 0.5})
    timings = pd.read_csv(run_dir / "timings.csv")
    whole, phase = collect.probe_step_costs(timings, timings["step"].isin(collect.probe_steps(run_dir)))
    assert whole == pytest.approx([7.75 / 0.35, 0.65 / 0.35]) and phase == pytest.approx([5.0 / 0.35, 0.6 / 0.35])


def test_layer_spectra_figures_keep_the_routes_that_finished(tmp_path):
    """bench_layer_spectra.py's CSV: a route's total row becomes its figure; svd, cut by the time
    limit after one shape, has no total and so no figure."""
    path = tmp_path / "layer_spectra.csv"
    path.write_text(
        "shapes,device,method,rows,columns,count,seconds\n"
        "nemotron_4b,cuda,gram,3072,3072,3,0.1\n"
        "nemotron_4b,cuda,gram,1024,3072,3,0.05\n"
        "nemotron_4b,cuda,gram,3072,9216,3,0.2\n"
        "nemotron_4b,cuda,gram,0,0,27,3.15\n"
        "nemotron_4b,cuda,svd,3072,3072,3,9.0\n")
    figures = collect.layer_spectra_figures("layer_spectra", path)
    assert [(f.key, f.value, f.unit) for f in figures] == [("layer_spectra.gram.probe_step_s", 3.15, "s")]
    assert "27 float64 decompositions" in figures[0].label and figures[0].note == "nemotron_4b, cuda"
    assert collect.layer_spectra_figures("layer_spectra", tmp_path / "missing.csv") == []
