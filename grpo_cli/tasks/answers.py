"""The shared final-answer checker: pull the answer out of a completion and compare it numerically.

GSM8K convention: the final answer follows `####` on the last line of a solution. A completion
without `####` is judged by the last number it contains (lenient, like most GSM8K graders).

Number format accepted by `normalize_number`: optional sign (`-`, `+`, or the unicode minus `−`),
optional `$`, digits with optional thousands commas (`1,234`) and decimals (`3.50`, `.5`), an
optional trailing `%` (stripped; the value is NOT divided by 100, since GSM8K writes "what percent"
answers as plain numbers), an optional trailing period, and simple fractions `a/b` (`1/2` -> 0.5).
Anything else (units, words, `inf`, `nan`, exponents) gives None.
"""

from __future__ import annotations

import math
import re
import threading

# A number as written in text: thousands commas only in groups of three, so "1,2,3" is three numbers.
_NUMBER_BODY = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+"
# Sign only when it is not the binary minus of "3-4" (no word character or '.' right before it).
NUMBER_PATTERN = re.compile(rf"(?<![\w.])[-+−]?\$?(?:{_NUMBER_BODY})(?:/\d+)?%?")
_CLEAN_NUMBER = re.compile(rf"[-+]?(?:{_NUMBER_BODY})(?:/(?:{_NUMBER_BODY}))?")

REL_TOL = 1e-6  # relative tolerance of the numeric comparison
ABS_TOL = 1e-9  # absolute tolerance (for answers near zero)


def extract_final_answer(text: str) -> str | None:
    """The answer text: the rest of the line after the last `####`, else the last number.

    >>> extract_final_answer("5+2=<<5+2=7>>7\\n#### 7\\n")
    '7'
    >>> extract_final_answer("I have 3 apples and 4 pears, so 7.")
    '7'
    >>> extract_final_answer("no digits here") is None
    True
    >>> extract_final_answer("#### ") is None
    True
    """
    if "####" in text:
        answer = text.rsplit("####", 1)[1].strip().split("\n", 1)[0].strip()
        return answer or None
    numbers = NUMBER_PATTERN.findall(text)
    return numbers[-1] if numbers else None


def normalize_number(s: str) -> float | None:
    """Parse a number as GSM8K writes it; None when `s` is not exactly one number.

    >>> normalize_number("1,234")
    1234.0
    >>> normalize_number("$5.00")
    5.0
    >>> normalize_number("−5")
    -5.0
    >>> normalize_number("-3.")
    -3.0
    >>> normalize_number("1/2")
    0.5
    >>> normalize_number("25%")
    25.0
    >>> normalize_number("5 apples") is None
    True
    """
    cleaned = s.strip().replace("−", "-").replace("$", "").replace(" ", "")
    cleaned = cleaned.rstrip(".").removesuffix("%")
    if not _CLEAN_NUMBER.fullmatch(cleaned):
        return None
    cleaned = cleaned.replace(",", "")
    if "/" in cleaned:
        numerator, denominator = cleaned.split("/")
        if float(denominator) == 0:
            return None
        return float(numerator) / float(denominator)
    return float(cleaned)


def _numeric_value(answer_text: str) -> float | None:
    """The value of an extracted answer; falls back to its first number ("18 dollars" -> 18)."""
    value = normalize_number(answer_text)
    if value is None:
        numbers = NUMBER_PATTERN.findall(answer_text)
        value = normalize_number(numbers[0]) if numbers else None
    return value


def numbers_close(a: float, b: float) -> bool:
    """The tolerance every numeric comparison in the task layer uses."""
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def answers_match(
    predicted_text: str, reference_answer: str, use_math_verify: bool = False
) -> bool:
    """Whether the completion's final answer equals the reference answer.

    `reference_answer` is the bare answer ("18") or a whole reference solution ending in "#### 18".
    With `use_math_verify`, a failed numeric comparison falls back to math-verify on the whole
    completion (it finds \\boxed{}, LaTeX fractions, ...); its errors count as a mismatch.

    >>> answers_match("<<12-3=9>>9\\n#### 9", "9")
    True
    >>> answers_match("#### 1,234", "1234")
    True
    >>> answers_match("so the answer is 3.0", "3")
    True
    >>> answers_match("#### 8", "9")
    False
    """
    reference = (
        extract_final_answer(reference_answer)
        if "####" in reference_answer
        else reference_answer.strip()
    )
    predicted = extract_final_answer(predicted_text)
    if predicted is not None and reference:
        predicted_value, reference_value = _numeric_value(predicted), _numeric_value(reference)
        if predicted_value is not None and reference_value is not None:
            if numbers_close(predicted_value, reference_value):
                return True
        elif predicted == reference:
            return True
    if use_math_verify and reference:
        return _math_verify_match(predicted_text, reference)
    return False


def _math_verify_match(predicted_text: str, reference: str) -> bool:
    """math-verify's parse/verify; its signal-based timeout only works in the main thread."""
    try:
        from math_verify import parse, verify
    except ImportError as error:
        raise ImportError("use_math_verify=True needs the math-verify package") from error
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        gold = parse(reference, parsing_timeout=timeout)
        target = parse(predicted_text, parsing_timeout=timeout)
        return bool(gold and target and verify(gold, target, timeout_seconds=timeout))
    except Exception:  # math-verify raising on odd input is a wrong answer, not a crash
        return False
