"""Arith: short word problems with a GSM8K-format solution, small enough for a char-level LM.

    question: "Ann has 7 pens. She gets 5, then loses 3. How many pens?"
    solution: "<<7+5=12>>12\\n<<12-3=9>>9\\n#### 9"

A problem is a chain: a start value and `steps` operations applied left to right, each one clause
of the question and one calculator line of the solution (the previous result is the left operand, so
operator precedence never matters). Operands are drawn from [1, operand_max]; subtraction never goes
below zero and division is always exact, so every intermediate value is a non-negative integer.

The held-out eval split is drawn first from its own stream (it does not change with train_size) and
holds distinct chains; train draws i.i.d. chains, rejecting any chain that is in eval (so no eval
problem, whatever its names, appears in train), and may repeat a chain.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from grpo_cli.tasks.problem import Problem, Step

OPERATORS = ("+", "-", "*", "/")
_NAMES = (
    ("Ann", "She"),
    ("Tom", "He"),
    ("Sue", "She"),
    ("Max", "He"),
    ("Eva", "She"),
    ("Bob", "He"),
)
_ITEMS = ("pens", "cards", "coins", "books", "eggs", "cups")
_CLAUSES = {
    "+": "gets {operand}",
    "-": "loses {operand}",
    "*": "has {operand} times as many",
    "/": "keeps 1/{operand} of them",
}
_MAX_TRIES = 100  # draws per step before restarting a chain, and restarts before giving up

Chain = tuple[int, tuple[tuple[str, int], ...]]  # (start, ((operator, operand), ...))


def _apply(value: int, operator: str, operand: int) -> int | None:
    """The next value of the chain, or None when it would be negative or a fraction."""
    if operator == "+":
        return value + operand
    if operator == "-":
        return value - operand if value >= operand else None
    if operator == "*":
        return value * operand
    return value // operand if value % operand == 0 else None


def _sample_chain(
    rng: random.Random, min_steps: int, max_steps: int, operand_max: int, operators: Sequence[str]
) -> Chain:
    num_steps = rng.randint(min_steps, max_steps)
    for _ in range(_MAX_TRIES):
        value = rng.randint(1, operand_max)
        start, operations = value, []
        for _ in range(num_steps):
            for _ in range(_MAX_TRIES):
                operator, operand = rng.choice(operators), rng.randint(1, operand_max)
                next_value = _apply(value, operator, operand)
                if next_value is not None:
                    break
            else:
                break  # stuck (e.g. only "-" and the value hit 0): restart the chain
            value = next_value
            operations.append((operator, operand))
        if len(operations) == num_steps:
            return start, tuple(operations)
    raise ValueError(
        f"cannot generate a {num_steps}-step chain with operators {list(operators)} and operand_max {operand_max}"
    )


def _render(chain: Chain, rng: random.Random) -> Problem:
    """Question text (names drawn from `rng`), solution and steps of a chain."""
    start, operations = chain
    (name, pronoun), item = rng.choice(_NAMES), rng.choice(_ITEMS)
    clauses = [_CLAUSES[operator].format(operand=operand) for operator, operand in operations]
    if len(clauses) > 1:
        clauses[-1] = "then " + clauses[-1]
    start_item = item if start != 1 else item.removesuffix("s")
    question = f"{name} has {start} {start_item}. {pronoun} {', '.join(clauses)}. How many {item}?"
    value, steps = start, []
    for operator, operand in operations:
        result = _apply(value, operator, operand)
        steps.append(Step(f"{value}{operator}{operand}", float(result)))
        value = result
    lines = [f"<<{step.expression}={int(step.value)}>>{int(step.value)}" for step in steps]
    solution = "\n".join([*lines, f"#### {value}"])
    return Problem(question=question, answer=str(value), solution=solution, steps=tuple(steps))


def generate_arith(
    train_size: int,
    eval_size: int,
    seed: int = 1234,
    min_steps: int = 1,
    max_steps: int = 2,
    operand_max: int = 9,
    operators: Sequence[str] = ("+", "-", "*"),
) -> tuple[list[Problem], list[Problem]]:
    """(train, eval) problems, deterministic in every argument; see the module docstring."""
    operators = tuple(operators)
    if not operators or not set(operators) <= set(OPERATORS):
        raise ValueError(
            f"operators must be a non-empty subset of {list(OPERATORS)}, got {list(operators)}"
        )
    if not 1 <= min_steps <= max_steps:
        raise ValueError(
            f"need 1 <= min_steps <= max_steps, got min_steps={min_steps}, max_steps={max_steps}"
        )
    if operand_max < 1 or train_size < 0 or eval_size < 0:
        raise ValueError(
            f"need operand_max >= 1 and non-negative sizes, got {operand_max}, {train_size}, {eval_size}"
        )
    knobs = (min_steps, max_steps, operand_max, operators)

    eval_rng = random.Random(f"arith-eval-{seed}")
    eval_chains: dict[Chain, None] = {}  # insertion-ordered set
    attempts = 0
    while len(eval_chains) < eval_size:
        attempts += 1
        if attempts > _MAX_TRIES * eval_size:
            raise ValueError(
                f"only {len(eval_chains)} distinct problems found for eval_size={eval_size}; raise operand_max or max_steps"
            )
        eval_chains.setdefault(_sample_chain(eval_rng, *knobs))
    eval_problems = [_render(chain, eval_rng) for chain in eval_chains]

    train_rng = random.Random(f"arith-train-{seed}")
    train_problems: list[Problem] = []
    attempts = 0
    while len(train_problems) < train_size:
        attempts += 1
        if attempts > _MAX_TRIES * train_size:
            raise ValueError(
                "eval holds (nearly) every possible problem; lower eval_size or raise operand_max"
            )
        chain = _sample_chain(train_rng, *knobs)
        if chain not in eval_chains:
            train_problems.append(_render(chain, train_rng))
    return train_problems, eval_problems
