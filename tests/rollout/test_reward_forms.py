"""Ways of writing a right answer that math_boxed (the pure-Python fallback) scored 0 where verl's MATH reward
(data_source HuggingFaceH4/MATH-500, its rules written down in tests/reward_references.py) or math-verify scores
1: each case is checked against that reference too, and, where the team's data is there, on every MATH-500 row
the form applies to."""

from __future__ import annotations

import re

import pytest

from reward_references import MATH500, math500_rows, verl_math_reward
from pdsr_sdk.rollout.reward import math_boxed


def boxed(answer: str) -> str:
    return f"Step by step ... so the answer is $\\boxed{{{answer}}}$."


#: (response's answer, ground truth, right?): a variable assigned its value, as verl's MATH reward and
#: math_verify read it (MATH-500's test/algebra/2193.json has 'x=5' as its answer)
ASSIGNMENTS = [("x = 5", "5", True), ("5", "x=5", True), ("a_1 = -3", "-3", True), ("x = \\frac{1}{2}", "0.5", True),
               ("y = 2x+3", "2x+3", True), ("x = 6", "5", False), ("5", "x=6", False), ("x = 5 = y", "5", False)]


@pytest.mark.parametrize("answer, truth, right", ASSIGNMENTS)
def test_an_assigned_variable_is_its_value(answer, truth, right):
    assert math_boxed(boxed(answer), truth) == float(right)


@pytest.mark.parametrize("answer, truth, right",
                         [c for c in ASSIGNMENTS if c[0] in ("x = 5", "5", "y = 2x+3", "x = 6")])
def test_assignments_as_verl_reads_them(answer, truth, right):
    """The reference agrees with the cases above (verl reads a left side of at most two characters, so not
    'a_1', and compares text, so not a fraction with a decimal)."""
    assert verl_math_reward(boxed(answer), truth) is right


@pytest.mark.skipif(not MATH500.is_file(), reason="../shared/data not found")
def test_every_math500_integer_answer_assigned():
    """On the 311 MATH-500 rows whose answer is an integer (2026-12-01: math_boxed 0 of 311, verl's MATH reward
    and math_verify 311)."""
    rows = [r for r in math500_rows() if re.fullmatch(r"-?\d+", r["answer"])]
    assert len(rows) > 300
    for row in rows:
        a = row["answer"]
        assert verl_math_reward(boxed(f"x = {a}"), a)
        assert math_boxed(boxed(f"x = {a}"), a) == 1.0, row["unique_id"]
        assert math_boxed(boxed(f"x = {int(a) + 1}"), a) == 0.0, row["unique_id"]


#: TeX's shorthand arguments, \frac32 and \sqrt2 for \frac{3}{2} and \sqrt{2}, inside answers that are no plain
#: number (from MATH-500 answers); verl's MATH reward reads all of them but \frac{270}7 (MATH-500's own form,
#: test/prealgebra/1003.json, which math-verify reads)
SHORTHAND = [("\\left( \\frac32, -13 \\right)", "\\left( \\frac{3}{2}, -13 \\right)", True),
             ("1\\frac45", "1\\frac{4}{5}", True), ("137 \\frac12", "137 \\frac{1}{2}", True),
             ("\\frac{270}7", "\\frac{270}{7}", True), ("\\frac1{2}\\pi", "\\frac{1}{2}\\pi", True),
             ("2\\sqrt2", "2\\sqrt{2}", True), ("\\frac{\\sqrt3}{2}", "\\frac{\\sqrt{3}}{2}", True),
             ("\\sqrt5 - 1", "\\sqrt{5}-1", True),
             ("\\left(\\frac35,\\frac83\\right]", "\\left(\\frac{3}{5},\\frac{8}{3}\\right]", True),
             ("2\\sqrt3", "2\\sqrt{2}", False), ("\\frac32", "\\frac{2}{3}", False),
             ("\\sqrt{12}", "\\sqrt{1}2", False),
             ("1\\frac45", "1\\frac{4}{6}", False)]


@pytest.mark.parametrize("answer, truth, right", SHORTHAND)
def test_tex_shorthand_arguments(answer, truth, right):
    if answer != "\\frac{270}7":
        assert verl_math_reward(boxed(answer), truth) is right   # the reference reads them so
    assert math_boxed(boxed(answer), truth) == float(right)
    assert math_boxed(boxed(truth), answer) == float(right)


@pytest.mark.skipif(not MATH500.is_file(), reason="../shared/data not found")
def test_every_math500_answer_in_shorthand():
    """The MATH-500 answers with a \\frac or \\sqrt of one-digit arguments, written in shorthand (2026-12-01:
    math_boxed 18 of 38, verl's MATH reward and math_verify 38)."""
    count = 0
    for row in math500_rows():
        a = row["answer"]
        short = re.sub(r"\\sqrt\{(\d)\}", r"\\sqrt\1", re.sub(r"\\frac\{(\d)\}\{(\d)\}", r"\\frac\1\2", a))
        if short == a:
            continue
        count += 1
        assert verl_math_reward(boxed(short), a)
        assert math_boxed(boxed(short), a) == 1.0, (row["unique_id"], short)
    assert count > 30


#: numbers as TeX and Unicode write them: ``{,}`` between thousands (a comma that TeX spaces as a digit
#: separator) and the minus sign U+2212; math-verify reads them (verl's MATH reward does not)
NUMBERS = [("1{,}000", "1000", True), ("12{,}345{,}678", "12,345,678", True), ("\u22125", "-5", True),
           ("\u2212\\frac{1}{2}", "-0.5", True), ("\u22121024", "-1024", True), ("1{,}001", "1000", False),
           ("\u22125", "5", False), ("1{,}00", "100", False)]


@pytest.mark.parametrize("answer, truth, right", NUMBERS)
def test_tex_thousands_and_unicode_minus(answer, truth, right):
    pytest.importorskip("math_verify")
    from reward_references import math_verify_direct

    assert math_verify_direct(boxed(answer), truth) is right   # the reference reads them so
    assert math_boxed(boxed(answer), truth) == float(right)


def test_gsm8k_answer_with_unicode_minus_and_tex_thousands():
    truth = "She lost 3 - 8 = <<3-8=-5>>-5 dollars.\n#### -5"
    assert math_boxed("So the change is \u22125.\n#### \u22125", truth) == 1.0
    assert math_boxed("So the change is 5.\n#### 5", truth) == 0.0
    assert math_boxed("So the change is \u22125 dollars.\n#### \u22125 dollars", truth) == 1.0   # a unit after it
    assert math_boxed("The total is \\boxed{1{,}234}.", "Adding up ...\n#### 1,234") == 1.0


#: a multiple-choice answer, MATH-500's \text{(C)} (test/precalculus/819.json; \text{(E)} and \text{(B)} in two
#: more), as a letter
CHOICES = [("C", "\\text{(C)}", True), ("(C)", "\\text{(C)}", True), ("\\text{C}", "\\text{(C)}", True),
           ("\\textbf{(C)}", "C", True), ("B", "\\text{(C)}", False), ("(B)", "\\text{(C)}", False)]


@pytest.mark.parametrize("answer, truth, right", CHOICES)
def test_a_choice_letter_with_or_without_parentheses(answer, truth, right):
    pytest.importorskip("math_verify")
    from reward_references import math_verify_direct

    assert math_verify_direct(boxed(answer), truth) is right   # the reference reads them so
    assert math_boxed(boxed(answer), truth) == float(right)
