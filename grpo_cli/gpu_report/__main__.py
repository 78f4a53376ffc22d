"""`python -m grpo_cli.gpu_report [--dry-run] [--only ...]`: see grpo_cli/gpu_report/runner.py."""

from grpo_cli.gpu_report.runner import main

raise SystemExit(main())
