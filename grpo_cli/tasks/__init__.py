"""Tasks: problems with GSM8K-format solutions, prompts, outcome rewards and per-step checks.

`build_task(cfg.task)` is the entry point; every module here is light (no torch, no datasets at
import time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from grpo_cli.tasks.answers import answers_match, extract_final_answer, normalize_number
from grpo_cli.tasks.arith import generate_arith
from grpo_cli.tasks.gsm8k import DataFormatError, load_gsm8k
from grpo_cli.tasks.problem import Problem, Step, Task, format_prompt
from grpo_cli.tasks.step_rewards import (
    StepCheck,
    check_steps_against_reference,
    check_steps_by_evaluation,
    step_spans,
)

if TYPE_CHECKING:
    from grpo_cli.config.schema import TaskConfig

__all__ = [
    "DataFormatError",
    "Problem",
    "Step",
    "StepCheck",
    "Task",
    "answers_match",
    "build_task",
    "extract_final_answer",
    "format_prompt",
    "normalize_number",
    "step_spans",
]


def _arith_task(task_cfg: Any, tokenizer: Any) -> Task:
    train, eval_problems = generate_arith(
        train_size=task_cfg.warm_start_size + task_cfg.train_size,
        eval_size=task_cfg.eval_size,
        seed=task_cfg.seed,
        min_steps=task_cfg.min_steps,
        max_steps=task_cfg.max_steps,
        operand_max=task_cfg.operand_max,
        operators=list(task_cfg.operators),
    )
    return _task("arith", train, eval_problems, check_steps_against_reference, task_cfg, tokenizer)


def _gsm8k_task(task_cfg: Any, tokenizer: Any) -> Task:
    train_size = task_cfg.train_size
    if train_size >= 0:
        train_size += task_cfg.warm_start_size
    train, eval_problems = load_gsm8k(task_cfg.path, task_cfg.hub_id, train_size, task_cfg.eval_size)
    return _task("gsm8k", train, eval_problems, check_steps_by_evaluation, task_cfg, tokenizer)


def _task(
    name: str,
    train: list[Problem],
    eval_problems: list[Problem],
    step_checker: Callable,
    task_cfg: Any,
    tokenizer: Any,
) -> Task:
    """Split off the first `warm_start_size` training problems for the supervised warm start."""
    warm_start, train = train[: task_cfg.warm_start_size], train[task_cfg.warm_start_size :]
    return Task(
        name=name,
        train=train,
        warm_start=warm_start,
        eval=eval_problems,
        step_checker=step_checker,
        prompt_template=task_cfg.prompt_template,
        use_chat_template=task_cfg.use_chat_template,
        use_math_verify=task_cfg.use_math_verify,
        tokenizer=tokenizer,
    )


TASKS: dict[str, Callable[[Any, Any], Task]] = {"arith": _arith_task, "gsm8k": _gsm8k_task}


def build_task(task_cfg: TaskConfig, tokenizer: Any = None) -> Task:
    """The task named by `task_cfg.name` (a `TaskConfig` or an equivalent DictConfig)."""
    if task_cfg.name not in TASKS:
        raise ValueError(f"unknown task {task_cfg.name!r}; known tasks: {sorted(TASKS)}")
    return TASKS[task_cfg.name](task_cfg, tokenizer)
