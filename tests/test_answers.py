import doctest
import importlib
import threading

import pytest

from grpo_cli.tasks.answers import answers_match, extract_final_answer, normalize_number


@pytest.mark.parametrize(
    "module",
    ["answers", "problem", "arith", "gsm8k", "step_rewards"],
)
def test_doctests_of_task_modules_pass(module):
    result = doctest.testmod(importlib.import_module(f"grpo_cli.tasks.{module}"))
    assert result.failed == 0


@pytest.mark.parametrize(
    "text, expected",
    [
        ("#### 1,234", "1,234"),
        ("#### 7\n", "7"),
        ("#### 7\n<<3+4=7>>", "7"),  # only the line after the last ####
        ("#### 3\nwait\n#### 4", "4"),  # the last #### wins
        ("the answer is -3.", "-3"),
        ("It costs $5.00 in total", "$5.00"),
        ("2 cats and 3 dogs make 5 animals", "5"),  # last number wins
        ("so 10-4 leaves 6", "6"),
        ("10-4", "4"),  # a binary minus is not a sign
        ("half is 1/2", "1/2"),
        ("no number at all", None),
        ("", None),
        ("####   ", None),
        ("x2 and y3", None),  # digits glued to words are not numbers
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1,234", 1234.0),
        ("1,234,567.5", 1234567.5),
        ("$5.00", 5.0),
        ("-5", -5.0),
        ("+5", 5.0),
        ("−5", -5.0),  # unicode minus
        ("3.50", 3.5),
        (".5", 0.5),
        ("7.", 7.0),
        (" 42 ", 42.0),
        ("1/2", 0.5),
        ("-3/4", -0.75),
        ("25%", 25.0),
        ("1/0", None),
        ("1,23", None),
        ("5 apples", None),
        ("inf", None),
        ("nan", None),
        ("1e5", None),
        ("", None),
        ("abc", None),
    ],
)
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


@pytest.mark.parametrize(
    "predicted, reference, expected",
    [
        ("#### 1,234", "1234", True),
        ("$5.00", "5", True),
        ("the answer is -3.", "-3", True),
        ("#### 7\n", "7", True),
        ("3.0", "3", True),
        ("#### 3", "3.0", True),
        ("#### 18 dollars", "18", True),
        ("#### $18", "18", True),
        ("I got 4, then 9, so 12", "12", True),
        ("I got 12, then 9", "12", False),  # the last number is the answer
        ("no number at all", "12", False),
        ("#### 7", "8", False),
        ("#### 3.0000001", "3", True),  # within the 1e-6 relative tolerance
        ("#### 3.001", "3", False),
        ("#### 0.5", "1/2", True),
        ("#### 5", "Solution: <<2+3=5>>5\n#### 5", True),  # a whole reference solution
        ("#### 5", "", False),
    ],
)
def test_answers_match(predicted, reference, expected):
    assert answers_match(predicted, reference) is expected


def test_math_verify_fallback_accepts_latex_only_when_asked():
    completion = "so the result is $\\frac{1}{2}$"
    assert not answers_match(completion, "0.5")
    assert answers_match(completion, "0.5", use_math_verify=True)
    assert not answers_match("so the result is $\\frac{1}{3}$", "0.5", use_math_verify=True)


def test_math_verify_fallback_works_outside_the_main_thread():
    results = []
    worker = threading.Thread(
        target=lambda: results.append(
            answers_match("so $\\frac{1}{2}$", "0.5", use_math_verify=True)
        )
    )
    worker.start()
    worker.join()
    assert results == [True]
