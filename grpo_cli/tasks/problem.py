"""What a task is: problems with a GSM8K-format solution, a prompt, an outcome reward, step checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpo_cli.tasks.answers import answers_match


@dataclass(frozen=True)
class Step:
    """One calculator step of a reference solution, `<<expression=value>>`."""

    expression: str  # e.g. "7+5"
    value: float  # the step's result, e.g. 12.0


@dataclass(frozen=True)
class Problem:
    question: str  # what the model is asked
    answer: str  # the final answer as text, e.g. "18" (the text after "####")
    solution: str  # GSM8K format: <<expr=value>> calculator steps, then a "#### N" line
    steps: tuple[Step, ...] = ()  # reference calculator steps, in order (parsed from `solution`)
    source: str = field(default="", compare=False)  # where it was read ("train.jsonl:12"); "" if generated


def format_prompt(
    problem: Problem,
    template: str,
    tokenizer: Any = None,
    use_chat_template: bool = False,
) -> str:
    """The prompt text for `problem`: `template` with `{question}` filled in, optionally chat-wrapped.

    The chat template is applied only when asked and the tokenizer has one; the result is text
    (tokenize=False) ending with the assistant's generation prompt.

    >>> format_prompt(Problem("1+1?", "2", "<<1+1=2>>2\\n#### 2"), "Q: {question}\\nA:")
    'Q: 1+1?\\nA:'
    """
    text = template.format(question=problem.question)
    if use_chat_template and tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    return text


@dataclass
class Task:
    """A named train/eval split with its prompt, outcome reward and per-step checker."""

    name: str  # arith | gsm8k
    train: list[Problem]
    eval: list[Problem]
    step_checker: Callable[[str, Problem], list[Any]]  # (completion, problem) -> list[StepCheck]
    prompt_template: str = "{question}\n"  # `{question}` is replaced by the problem's question
    use_chat_template: bool = False  # wrap prompts with the tokenizer's chat template if any
    use_math_verify: bool = False  # math-verify fallback when the numeric comparison fails
    tokenizer: Any = field(default=None, repr=False)  # only needed for use_chat_template
    warm_start: list[Problem] = field(default_factory=list)  # supervised warm-start split

    def prompt(self, problem: Problem) -> str:
        return format_prompt(problem, self.prompt_template, self.tokenizer, self.use_chat_template)

    def reward(self, completion_text: str, problem: Problem) -> float:
        """Outcome reward: 1.0 when the completion's final answer is right, else 0.0."""
        return 1.0 if answers_match(completion_text, problem.answer, self.use_math_verify) else 0.0

    def step_checks(self, completion_text: str, problem: Problem) -> list[Any]:
        """One `StepCheck` (char span + correctness) per calculator annotation in the completion."""
        return self.step_checker(completion_text, problem)
