import time

import pytest

from grpo_cli.tasks.problem import Step
from grpo_cli.tasks.step_rewards import (
    MAX_EXPRESSION_CHARS,
    StepCheck,
    parse_steps,
    question_numbers,
    reference_step_spans,
    safe_eval,
    step_spans,
)


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("3+4", 7.0),
        ("16-3-4", 9.0),  # left associative
        ("2+3*4", 14.0),  # precedence
        ("(2+3)*4", 20.0),
        ("8/2/2", 2.0),
        ("-3+5", 2.0),
        ("--3", 3.0),
        ("-(2+3)", -5.0),
        ("+4", 4.0),
        ("80,000*1.5", 120000.0),
        ("1,234+1", 1235.0),
        (".5*10", 5.0),
        ("5.*2", 10.0),
        (" 2 * ( 3 + 4 ) ", 14.0),
        ("100/3", 100 / 3),
    ],
)
def test_safe_eval_valid(expression, expected):
    assert safe_eval(expression) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "   ",
        "1/0",
        "5/(3-3)",
        "2**10",
        "2^10",
        "9**9**9**9",
        "1e308*10",
        "(1+2",
        "1+2)",
        "1+",
        "*3",
        "3 4",
        "()",
        "__import__('os').system('echo hi')",
        "open('/etc/passwd').read()",
        "(lambda: 1)()",
        "x+1",
        "1,23+4",
        "2" + "*99999999999" * 20 + "*" + "9" * 150,  # longer than the cap
        "(" * 100 + "1" + ")" * 99,  # 200 chars but nested too deeply
        "-" * 150 + "1",
        "1\n+2; 3",
    ],
)
def test_safe_eval_rejects_without_raising(expression):
    assert safe_eval(expression) is None


def test_safe_eval_length_cap_and_speed_on_garbage():
    assert safe_eval("1+" * 99 + "1") == 100.0  # 199 chars: under the cap
    assert safe_eval("1+" * (MAX_EXPRESSION_CHARS // 2) + "1") is None
    assert safe_eval("9" * 99 + "*" + "9" * 99) == pytest.approx(1e198)  # no exponent: stays finite
    start = time.perf_counter()
    for garbage in ["((((" * 50, "1" * 10_000, "<>=" * 1000, "-(" * 100 + "1" + ")" * 100]:
        assert safe_eval(garbage) is None
    assert time.perf_counter() - start < 0.5


def test_step_spans_cover_annotation_and_restated_value():
    completion = "Janet has 16-3=<<16-3=13>>13 eggs. Then <<13*2=26>>26.\n#### 26"
    first, second = step_spans(completion)
    assert completion[first.start_char : first.end_char] == "<<16-3=13>>13"
    assert completion[second.start_char : second.end_char] == "<<13*2=26>>26"
    assert first == StepCheck(first.start_char, first.end_char, True, 13.0)
    assert second.value == 26.0 and second.correct


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<<2+3=5>>5", [True]),
        ("<<2+3=6>>6", [False]),  # wrong arithmetic
        ("<<2+3=5>>6", [False]),  # restated value disagrees with the annotation
        ("<<2+3=5>>", [True]),  # no restated value is fine
        ("<<2+3=5>> apples", [True]),
        ("<<2+3=5=5>>5", [False]),  # two '='
        ("<<2+3>>5", [False]),  # no '='
        ("<<2+3=five>>", [False]),
        ("<<2**3=8>>8", [False]),
        ("<<1/0=0>>0", [False]),
        ("<<__import__('os')=0>>0", [False]),
        ("<<2+3=5", []),  # unclosed: not a step
        ("no steps here", []),
        ("<<1,000+500=1,500>>1,500", [True]),
        ("<<10/4=2.5>>2.5 then <<2.5*2=5>>5", [True, True]),
        ("<<3-5=-2>>-2", [True]),
    ],
)
def test_step_spans_arithmetic_only(completion, expected):
    assert [check.correct for check in step_spans(completion)] == expected


def test_step_spans_availability_of_numbers():
    question = "Tom has 37 marbles and buys 41 more. Twenty of them are red, 15% are blue."
    completion = (
        "<<37+41=78>>78\n"  # both from the question
        "<<78-20=58>>58\n"  # 78 from step 1, 20 from "Twenty"
        "<<58*3=174>>174\n"  # 3 is a small constant
        "<<78*0.15=11.7>>11.7\n"  # 15% as 0.15
        "<<99+1=100>>100\n"  # 99 appears nowhere: arithmetic right, step wrong
        "<<100+1=101>>101\n"  # 100 was claimed by the (wrong) step before, and is a constant
        "<<37*43=1591>>1591\n"  # 43 appears nowhere
    )
    assert [check.correct for check in step_spans(completion, question)] == [
        True,
        True,
        True,
        True,
        False,
        True,
        False,
    ]
    # Without a question only the arithmetic is checked.
    assert all(check.correct for check in step_spans(completion))


def test_question_numbers_include_words_and_percentages():
    numbers = question_numbers("She bought a dozen eggs for $3.50 and 1,200 beads, half price.")
    assert {12.0, 0.12, 3.5, 0.035, 1200.0, 0.5} <= numbers


def test_reference_step_spans_compare_with_the_known_values():
    steps = (Step("7+5", 12.0), Step("12-3", 9.0))
    assert [
        c.correct for c in reference_step_spans("<<7+5=12>>12\n<<12-3=9>>9\n#### 9", steps)
    ] == [True, True]
    # Right value, other expression: still the true value of that step.
    assert [c.correct for c in reference_step_spans("<<3*4=12>>12\n<<12-3=9>>9", steps)] == [
        True,
        True,
    ]
    # Wrong first step; the second is judged on its own value, not on consistency.
    assert [c.correct for c in reference_step_spans("<<7+5=13>>13\n<<13-3=10>>10", steps)] == [
        False,
        False,
    ]
    assert [c.correct for c in reference_step_spans("<<7+5=13>>13\n<<12-3=9>>9", steps)] == [
        False,
        True,
    ]
    # Claimed value right but arithmetic wrong.
    assert [c.correct for c in reference_step_spans("<<7+6=12>>12", steps)] == [False]
    # Steps past the reference count are wrong.
    assert [
        c.correct for c in reference_step_spans("<<7+5=12>>12\n<<12-3=9>>9\n<<9+0=9>>9", steps)
    ] == [True, True, False]
    assert reference_step_spans("#### 9", steps) == []


def test_parse_steps_keeps_only_well_formed_steps():
    solution = "a <<2+3=5>>5 b <<oops>> c <<5*2=10>>10\n#### 10"
    assert parse_steps(solution) == (Step("2+3", 5.0), Step("5*2", 10.0))
