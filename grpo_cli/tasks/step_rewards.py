"""Per-step checks of GSM8K-format completions, for process rewards.

A step is one calculator annotation `<<expression=value>>`, usually followed by the value restated
(`<<7+5=12>>12`). Each step becomes a `StepCheck` whose half-open char span `[start_char, end_char)`
covers the annotation and the restated value, so the trainer can map it onto completion tokens.

Two checkers share the parsing:

- `step_spans(completion, question)` (GSM8K): a step is correct when its expression evaluates to
  the stated value and, when a question is given, every number in the expression is available: it
  appears in the question (also divided by 100, for percentages), is the stated result of an earlier
  step, or is one of `SMALL_CONSTANTS` (unit conversions and fractions word problems use).
- `reference_step_spans(completion, steps)` (arith, whose generator knows every intermediate value):
  step i is correct when its expression evaluates to the stated value and that value equals
  the reference step i's value. Steps beyond the reference count are wrong.

In both, a restated value (a number right after `>>`, after at most one space or `$`) that differs
from the annotation's value (`<<7+5=12>>13`, or a truncated `<<7+5=12>>1`) makes the step wrong.
On GSM8K's own reference solutions, 96% of steps pass `step_spans` with their question; the rest
use numbers the solution computed in prose, without an annotation. Expressions are evaluated by a small hand-written parser (numbers with optional thousands
commas and decimals, + - * /, parentheses, unary signs): no `eval`, no exponent, at most
`MAX_EXPRESSION_CHARS` characters and `MAX_DEPTH` nested parentheses; anything else (including
division by zero or a non-finite result) evaluates to None, never raises.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from grpo_cli.tasks.answers import NUMBER_PATTERN, normalize_number, numbers_close
from grpo_cli.tasks.problem import Problem, Step

MAX_EXPRESSION_CHARS = 200  # longer annotations are wrong steps, not parsed
MAX_DEPTH = 32  # deepest parenthesis nesting the parser follows
# Numbers a solution may use without finding them in the question or an earlier step:
# small counts and fractions, percent, dozen, and time units (minutes, hours, days, weeks, months).
SMALL_CONSTANTS = frozenset(
    {0.5, 0.25, 0.1, 0.01, *range(0, 13), 24, 30, 31, 52, 60, 100, 365, 1000}
)

# Number words a question may use instead of digits ("twenty", "a dozen", "half").
_NUMBER_WORDS = {
    word: float(index)
    for index, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
        " fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
}
_NUMBER_WORDS |= {
    word: 10.0 * tens
    for tens, word in enumerate("thirty forty fifty sixty seventy eighty ninety".split(), start=3)
}
_NUMBER_WORDS |= {
    "half": 0.5,
    "quarter": 0.25,
    "twice": 2.0,
    "double": 2.0,
    "triple": 3.0,
    "dozen": 12.0,
    "hundred": 100.0,
    "thousand": 1000.0,
}
_WORD = re.compile(r"[a-z]+")
# An annotation: at most a few hundred characters between << and >>; then an optional restated value.
_ANNOTATION = re.compile(r"<<([^<>]{0,300})>>")
_RESTATED = re.compile(r"[ ]?\$?((?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+|-\d+(?:\.\d+)?)")
_TOKEN = re.compile(r"\s*(?:(\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d*)?|\.\d+|[-+*/()])")


@dataclass(frozen=True)
class StepCheck:
    start_char: int  # first char of the step in the completion ("<" of "<<")
    end_char: int  # one past its last char (after the restated value, if any)
    correct: bool  # the step passed its checker
    value: float | None  # the stated value, None when it does not parse


class _Parser:
    """Recursive descent over  expr := term (('+'|'-') term)* ; term := unary (('*'|'/') unary)* ;
    unary := ('+'|'-') unary | number | '(' expr ')'."""

    def __init__(self, tokens: list[str]):
        self.tokens, self.position, self.depth = tokens, 0, 0

    def peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ValueError("unexpected end of expression")
        self.position += 1
        return token

    def expression(self) -> float:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> float:
        value = self.unary()
        while self.peek() in ("*", "/"):
            if self.take() == "*":
                value *= self.unary()
            else:
                value /= self.unary()  # ZeroDivisionError -> None in safe_eval
        return value

    def unary(self) -> float:
        token = self.take()
        if token in ("+", "-"):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ValueError("expression nested too deeply")
            value = self.unary()
            self.depth -= 1
            return value if token == "+" else -value
        if token == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ValueError("expression nested too deeply")
            value = self.expression()
            if self.take() != ")":
                raise ValueError("unbalanced parenthesis")
            self.depth -= 1
            return value
        if token[0].isdigit() or token[0] == ".":
            return float(token.replace(",", ""))
        raise ValueError(f"unexpected token {token!r}")


def _tokenize(expression: str) -> list[str] | None:
    tokens, position = [], 0
    expression = expression.rstrip()
    while position < len(expression):
        match = _TOKEN.match(expression, position)
        if match is None:
            return None
        tokens.append(match.group(0).strip())
        position = match.end()
    return tokens


def safe_eval(expression: str) -> float | None:
    """The value of an arithmetic expression, or None when it is not one we accept.

    >>> safe_eval("16-3-4")
    9.0
    >>> safe_eval("80,000*1.5")
    120000.0
    >>> safe_eval("-(2+3)*4/5")
    -4.0
    >>> safe_eval("2**10") is None, safe_eval("1/0") is None, safe_eval("__import__('os')") is None
    (True, True, True)
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        return None
    tokens = _tokenize(expression)
    if not tokens:
        return None
    parser = _Parser(tokens)
    try:
        value = parser.expression()
    except (ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return None
    if parser.peek() is not None or not math.isfinite(value):
        return None
    return value


def _literals(expression: str) -> list[float]:
    """The unsigned number literals of an expression (thousands commas removed)."""
    return [
        float(token.replace(",", ""))
        for token in (_tokenize(expression) or [])
        if token[0] not in "+-*/()"
    ]


def question_numbers(question: str) -> set[float]:
    """Numbers a solution may take from the question, in digits or words, each also divided by 100.

    >>> sorted(question_numbers("Twenty cats, 5% of them"))
    [0.05, 0.2, 5.0, 20.0]
    """
    values = [normalize_number(text) for text in NUMBER_PATTERN.findall(question)]
    values += [
        _NUMBER_WORDS[word] for word in _WORD.findall(question.lower()) if word in _NUMBER_WORDS
    ]
    return {
        scaled for value in values if value is not None for scaled in (abs(value), abs(value) / 100)
    }


def _is_available(value: float, available: Iterable[float]) -> bool:
    return any(numbers_close(value, candidate) for candidate in available)


def _annotation_steps(completion: str) -> list[tuple[int, int, str | None, float | None, bool]]:
    """(start, end, expression, stated value, well formed) for every `<<...>>` in the completion."""
    steps = []
    for match in _ANNOTATION.finditer(completion):
        inner, end = match.group(1), match.end()
        expression, value = None, None
        if inner.count("=") == 1:
            expression, stated = inner.split("=")
            value = normalize_number(stated)
        well_formed = expression is not None and value is not None
        restated = _RESTATED.match(completion, end)
        if restated is not None:
            end = restated.end()
            restated_value = normalize_number(restated.group(1))
            if value is not None and (
                restated_value is None or not numbers_close(restated_value, value)
            ):
                well_formed = False
        steps.append((match.start(), end, expression, value, well_formed))
    return steps


def parse_steps(solution: str) -> tuple[Step, ...]:
    """The well-formed calculator steps of a reference solution, in order.

    >>> parse_steps("2/2=<<2/2=1>>1 bolt\\n2+1=<<2+1=3>>3\\n#### 3")
    (Step(expression='2/2', value=1.0), Step(expression='2+1', value=3.0))
    """
    return tuple(
        Step(expression.strip(), value)
        for _, _, expression, value, well_formed in _annotation_steps(solution)
        if well_formed
    )


def step_spans(
    completion: str,
    question: str | None = None,
    constants: Iterable[float] = SMALL_CONSTANTS,
) -> list[StepCheck]:
    """Check every calculator step by evaluating it (GSM8K); see the module docstring.

    With `question` None, only the arithmetic is checked (no availability check).

    >>> [s.correct for s in step_spans("<<2+3=5>>5 then <<5*2=11>>11", "2 and 3")]
    [True, False]
    >>> [s.correct for s in step_spans("<<37*41=1517>>1517", "2 and 3")]
    [False]
    """
    available = None if question is None else question_numbers(question) | set(constants)
    checks = []
    for start, end, expression, value, well_formed in _annotation_steps(completion):
        correct = well_formed
        if correct:
            computed = safe_eval(expression)
            correct = computed is not None and numbers_close(computed, value)
        if correct and available is not None:
            correct = all(_is_available(literal, available) for literal in _literals(expression))
        if available is not None and value is not None and well_formed:
            available.add(abs(value))  # later steps may use what this step claims, right or wrong
        checks.append(StepCheck(start, end, correct, value))
    return checks


def reference_step_spans(completion: str, steps: Sequence[Step]) -> list[StepCheck]:
    """Check the i-th calculator step against reference step i (arith); see the module docstring.

    >>> ref = (Step("7+5", 12.0), Step("12-3", 9.0))
    >>> [s.correct for s in reference_step_spans("<<7+5=12>>12\\n<<12-4=8>>8\\n#### 8", ref)]
    [True, False]
    """
    checks = []
    for index, (start, end, expression, value, well_formed) in enumerate(
        _annotation_steps(completion)
    ):
        correct = well_formed and index < len(steps)
        if correct:
            computed = safe_eval(expression)
            correct = (
                computed is not None
                and numbers_close(computed, value)
                and numbers_close(value, steps[index].value)
            )
        checks.append(StepCheck(start, end, correct, value))
    return checks


def check_steps_by_evaluation(completion: str, problem: Problem) -> list[StepCheck]:
    """`Task.step_checker` for GSM8K: `step_spans` with the problem's question."""
    return step_spans(completion, problem.question)


def check_steps_against_reference(completion: str, problem: Problem) -> list[StepCheck]:
    """`Task.step_checker` for arith: `reference_step_spans` with the problem's known steps."""
    return reference_step_spans(completion, problem.steps)
