import re

import pytest

from grpo_cli.config.schema import TaskConfig
from grpo_cli.tasks import build_task
from grpo_cli.tasks.answers import answers_match
from grpo_cli.tasks.arith import generate_arith
from grpo_cli.tasks.step_rewards import parse_steps, safe_eval, step_spans

STEP_LINE = re.compile(r"<<(\d+)([-+*/])(\d+)=(\d+)>>(\d+)")


def _chain(problem):
    """The arithmetic content of a problem, without the names and items of its question."""
    return tuple((step.expression, step.value) for step in problem.steps)


def test_same_seed_same_problems_other_seed_other_problems():
    first = generate_arith(train_size=50, eval_size=20, seed=7)
    again = generate_arith(train_size=50, eval_size=20, seed=7)
    other = generate_arith(train_size=50, eval_size=20, seed=8)
    assert first == again
    assert first != other


def test_eval_split_does_not_depend_on_train_size():
    _, eval_small = generate_arith(train_size=10, eval_size=30, seed=3)
    _, eval_large = generate_arith(train_size=500, eval_size=30, seed=3)
    assert eval_small == eval_large


def test_eval_is_distinct_and_disjoint_from_train():
    # A small problem space (1 step, operands 1..4: at most 4*4*3 chains) makes collisions likely.
    train, eval_problems = generate_arith(
        train_size=300, eval_size=20, seed=0, min_steps=1, max_steps=1, operand_max=4
    )
    eval_chains = [_chain(problem) for problem in eval_problems]
    assert len(set(eval_chains)) == len(eval_chains) == 20
    assert not set(eval_chains) & {_chain(problem) for problem in train}
    assert not {p.question for p in eval_problems} & {p.question for p in train}
    assert len(train) == 300


def test_every_solution_checks_correct_against_its_own_answer():
    train, eval_problems = generate_arith(
        train_size=300, eval_size=50, seed=1, max_steps=3, operators=["+", "-", "*", "/"]
    )
    for problem in train + eval_problems:
        assert answers_match(problem.solution, problem.answer)
        assert problem.solution.endswith(f"\n#### {problem.answer}")
        assert all(check.correct for check in step_spans(problem.solution, problem.question))
        assert parse_steps(problem.solution) == problem.steps


@pytest.mark.parametrize(
    "min_steps, max_steps, operand_max, operators",
    [
        (1, 1, 5, ["+"]),
        (2, 3, 9, ["-", "*"]),
        (3, 3, 20, ["/", "+"]),
        (1, 4, 9, ["+", "-", "*", "/"]),
    ],
)
def test_difficulty_knobs_are_respected(min_steps, max_steps, operand_max, operators):
    train, eval_problems = generate_arith(
        200,
        20,
        seed=5,
        min_steps=min_steps,
        max_steps=max_steps,
        operand_max=operand_max,
        operators=operators,
    )
    step_counts = set()
    for problem in train + eval_problems:
        lines = problem.solution.split("\n")
        step_counts.add(len(lines) - 1)
        start = int(re.search(r"has (\d+)", problem.question).group(1))
        assert 1 <= start <= operand_max
        previous = start
        for line, step in zip(lines[:-1], problem.steps, strict=True):
            left, operator, right, value, restated = STEP_LINE.fullmatch(line).groups()
            assert int(left) == previous  # a chain: each step starts from the last result
            assert operator in operators
            assert 1 <= int(right) <= operand_max
            assert value == restated and int(value) >= 0
            assert safe_eval(f"{left}{operator}{right}") == step.value == int(value)
            previous = int(value)
        assert lines[-1] == f"#### {previous}" and problem.answer == str(previous)
    assert step_counts == set(range(min_steps, max_steps + 1))


def test_default_problems_fit_a_small_char_model():
    train, eval_problems = generate_arith(train_size=2000, eval_size=128, seed=1234)
    assert max(len(p.question) for p in train + eval_problems) <= 90
    assert max(len(p.solution) for p in train + eval_problems) <= 48


@pytest.mark.parametrize(
    "knobs",
    [
        {"operators": ["^"]},
        {"operators": []},
        {"min_steps": 0},
        {"min_steps": 3, "max_steps": 2},
        {"operand_max": 0},
    ],
)
def test_bad_knobs_raise(knobs):
    with pytest.raises(ValueError):
        generate_arith(10, 5, **knobs)


def test_too_small_a_space_for_eval_raises():
    with pytest.raises(ValueError, match="distinct problems"):
        generate_arith(10, 50, min_steps=1, max_steps=1, operand_max=2, operators=["+"])


def _task_config(**overrides):
    config = dict(name="arith", train_size=40, warm_start_size=20, eval_size=10,
                  prompt_template="Q: {question}\nA: ")
    return TaskConfig(**(config | overrides))


def test_build_task_arith_rewards_and_step_checks():
    task = build_task(_task_config())
    assert task.name == "arith" and len(task.train) == 40 and len(task.eval) == 10
    problem = task.train[0]
    assert task.prompt(problem) == f"Q: {problem.question}\nA: "
    assert task.reward(problem.solution, problem) == 1.0
    assert task.reward("#### 100000", problem) == 0.0
    checks = task.step_checks(problem.solution, problem)
    assert len(checks) == len(problem.steps) and all(check.correct for check in checks)


def test_build_task_unknown_name_lists_known_tasks():
    with pytest.raises(ValueError, match=r"unknown task 'math'.*\['arith', 'gsm8k'\]"):
        build_task(_task_config(name="math"))
