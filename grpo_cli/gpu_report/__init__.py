"""One command for every GPU figure grpo-cli owes (issue 24): `python -m grpo_cli.gpu_report`.

On a CUDA machine it runs the steps of steps.py, each a time-boxed subprocess that fails soft,
and writes gpu_report.md and gpu_report.csv (GPU, versions, each figure beside its target and
previous value) into one small directory; with --dry-run, on any machine, it prints the plan and
checks that every step's command composes. docs/speed.md says how to run it.
"""
