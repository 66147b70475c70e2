"""math_boxed compares numbers by exact rational value (issue 15), on real MATH-500 answers."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from support import ROOT
from pdsr_sdk.rollout.answers import answers_equal, exact_value, normalize_answer
from pdsr_sdk.rollout.reward import math_boxed

#: the team's shared data sits beside the repository and is not copied into it (its README says so)
MATH500 = ROOT.parent / "shared" / "data" / "math500.jsonl"


def boxed(answer: str) -> str:
    return f"Step by step ... so the answer is \\boxed{{{answer}}}."


@pytest.mark.parametrize("a, b", [
    ("1/2", "\\frac{1}{2}"), ("\\dfrac12", "0.5"), ("\\tfrac{1}{2}", "1/2"), ("0.50", "\\frac{2}{4}"),
    ("-\\frac{3}{8}", "-0.375"), ("\\frac{-3}{8}", "-3/8"), ("\\frac 59", "5/9"), ("\\frac9{19}", "9/19"),
    ("10", "10.0"), ("+4", "4"), ("{\\frac{1}{2}}", ".5"), ("1,000", "1000"), ("\\frac{1.5}{3}", "1/2"),
])
def test_equal_values(a, b):
    assert math_boxed(boxed(a), b) == 1.0 and math_boxed(boxed(b), a) == 1.0


@pytest.mark.parametrize("a, b", [
    ("0.333", "1/3"), ("0.33", "\\frac{1}{3}"), ("1/2", "-1/2"), ("\\frac{1}{2}", "2"), ("1/0", "0"),
    ("\\frac{x}{2}", "1/2"), ("1\\frac{4}{5}", "9/5"), ("50\\%", "0.5"), ("1/2/3", "1/6"),
])
def test_different_values(a, b):
    assert math_boxed(boxed(a), b) == 0.0


def test_parser_refuses_what_is_not_a_plain_number():
    for text in ["", "x", "\\frac{\\pi}{2}", "\\sqrt{2}", "2\\frac{1}{2}", "(1,2)", "1e3", "--1", "\\frac{1}", "3.2.1"]:
        assert exact_value(normalize_answer(text)) is None, text


@pytest.mark.skipif(not MATH500.is_file(), reason="MATH-500 not found at ../shared/data/math500.jsonl")
def test_math500_answers():
    numbers = 0
    for row in map(json.loads, MATH500.open()):
        answer = row["answer"]
        assert math_boxed(boxed(answer), answer) == 1.0, row   # every answer matches itself
        value = exact_value(normalize_answer(answer))
        if value is None:
            continue
        numbers += 1
        forms = [f"{value.numerator}/{value.denominator}", f"\\dfrac{{{value.numerator}}}{{{value.denominator}}}"]
        if value.denominator == 1:
            forms.append(f"{value.numerator}.0")
        d = value.denominator
        while d % 2 == 0:
            d //= 2
        while d % 5 == 0:
            d //= 5
        if d == 1:   # a terminating decimal: write it out exactly
            digits = 0
            while (value * 10 ** digits).denominator != 1:
                digits += 1
            forms.append(f"{float(value):.{digits}f}")
        for form in forms:
            assert answers_equal(form, answer), (form, row)
            assert math_boxed(boxed(form), answer) == 1.0, (form, row)
        off = value + Fraction(1, 1000)
        assert math_boxed(boxed(f"{off.numerator}/{off.denominator}"), answer) == 0.0, row
        if value.denominator % 3 == 0:   # a repeating decimal rounded is not the same number
            assert math_boxed(boxed(f"{float(value):.3f}"), answer) == 0.0, row
    assert numbers >= 70
