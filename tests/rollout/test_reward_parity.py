"""The built-in math rewards against what a verl user knows (verl's default rewards, as
tests/reward_references.py writes their rules down) and against math-verify called directly, on responses
written for real MATH-500 and GSM8K rows, each labelled as a human grader scores it. pdsr's rewards may differ
from a reference only where the reference is wrong, except for the one deliberate difference in DELIBERATE."""

from __future__ import annotations

import collections

import pytest

from reward_references import (GSM8K, MATH500, Case, confusion, gsm8k_cases, gsm8k_number, gsm8k_rows,
                               math500_cases, math500_rows, math_verify_direct, verl_gsm8k, verl_math_dapo,
                               verl_math_reward)
from pdsr_sdk.rollout.reward import math_boxed
from pdsr_sdk.rollout.verify_reward import math_verify_reward

pytest.importorskip("math_verify")
pytestmark = pytest.mark.skipif(not (MATH500.is_file() and GSM8K.is_file()), reason="../shared/data not found")

#: ways of answering that pdsr's rewards score 0 on purpose: a final answer only in prose ("The answer is 18.")
#: is no answer, as for verl's MATH and GSM8K rewards (math-verify called on the whole response takes the
#: last number or formula it finds, which a training reward should not)
DELIBERATE = {"answer_is"}


def rows_of(name: str, limit: int | None) -> tuple[list[Case], dict[str, str]]:
    """The cases of a data set's first ``limit`` rows, and each row's ground truth as its data file has it."""
    if name == "math500":
        rows = math500_rows()
        return math500_cases(rows[:limit]), {r["unique_id"]: r["answer"] for r in rows}
    rows = gsm8k_rows()
    return gsm8k_cases(rows[:limit]), {str(r["idx"]): r["answer"] for r in rows}


def scored(name: str, cases: list[Case], truths: dict[str, str], direct: bool) -> dict[str, list[bool]]:
    """Each reward's verdict on each case. pdsr's get the data file's ground truth (GSM8K's worked solution);
    the references get the answer as verl's data preparation writes it (GSM8K's number without commas)."""
    pdsr_verify = math_verify_reward(60.0)   # a check's time limit well above what a loaded machine takes
    verl = verl_math_reward if name == "math500" else verl_gsm8k
    out: dict[str, list[bool]] = collections.defaultdict(list)
    for case in cases:
        truth = truths[case.row]
        answer = truth if name == "math500" else gsm8k_number({"answer": truth}).replace(",", "")
        out["math_verify"].append(pdsr_verify(case.response, truth) == 1.0)
        out["math_boxed"].append(math_boxed(case.response, truth) == 1.0)
        out["verl"].append(verl(case.response, answer))
        out["verl math_dapo"].append(verl_math_dapo(case.response, answer))
        if direct:
            out["math-verify direct"].append(math_verify_direct(case.response, answer))
    return out


def check_parity(name: str, limit: int | None, direct: bool) -> dict[str, dict[str, int]]:
    cases, truths = rows_of(name, limit)
    scores = scored(name, cases, truths, direct)
    labels = [c.correct for c in cases]
    tables = {}
    for ours in ("math_verify", "math_boxed"):
        wrong = [(c.row, c.kind, c.response[-60:]) for c, s in zip(cases, scores[ours])
                 if s != c.correct and c.kind not in DELIBERATE]
        assert not wrong, (ours, wrong[:10])   # every other way of answering scored as a human scores it
        for ref in scores.keys() - {"math_verify", "math_boxed"}:
            table = tables[f"{ours} vs {ref}"] = confusion(labels, scores[ours], scores[ref])
            ours_wrong = [c.kind for c, a, b in zip(cases, scores[ours], scores[ref])
                          if a != b and a != c.correct]
            assert set(ours_wrong) <= DELIBERATE, (ours, ref, collections.Counter(ours_wrong))
            if ref == "verl":   # verl's MATH and GSM8K rewards do not read prose either: never right where pdsr is not
                assert table["ours_wrong"] == 0, (ours, table)
    return tables


@pytest.mark.parametrize("name", ["math500", "gsm8k"])
def test_scores_as_a_grader_where_verl_or_math_verify_do(name):
    tables = check_parity(name, 40, direct=True)
    # the references do miss what a grader accepts, so the comparison can tell: verl's gsm8k reward refuses
    # '#### 18.', verl's MATH reward refuses \fbox and 1,000, math-verify refuses \boxed{9.}
    assert tables["math_verify vs verl"]["ours_right"] > 0
    assert tables["math_boxed vs math-verify direct"]["ours_right"] > 0 or name == "gsm8k"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["math500", "gsm8k"])
def test_every_row(name):
    for pair, table in check_parity(name, None, direct=name == "math500").items():
        print(name, pair, table)


@pytest.mark.parametrize("row, truth, value", [
    ("test/geometry/473.json", "864 \\mbox{ inches}^2", "864"),
    ("test/prealgebra/1114.json", "15\\mbox{ cm}^2", "15"),
    ("test/prealgebra/1044.json", "5.4 \\text{ cents}", "5.4"),
    ("test/prealgebra/1003.json", "\\frac{270}7\\text{ degrees}", "\\frac{270}{7}"),
])
def test_math_boxed_reads_a_truth_with_a_unit_as_its_value(row, truth, value):
    """math_boxed compared '864' with MATH-500's '864 \\mbox{ inches}^2' as the text '864inches^2' and scored the
    right answer 0 on these four rows (math_verify and verl's MATH reward accept it)."""
    assert {r["unique_id"]: r["answer"] for r in math500_rows()}[row] == truth
    assert math_boxed(f"So the answer is $\\boxed{{{value}}}$.", truth) == 1.0
    assert math_boxed(f"So the answer is $\\boxed{{{value} \\text{{ units}}}}$.", truth) == 1.0
    assert math_boxed(f"So the answer is $\\boxed{{{value}1}}$.", truth) == 0.0
    assert math_boxed("So the answer is $\\boxed{\\text{Evelyn}}$.", "\\text{Evelyn}") == 1.0   # a word stays a word
    assert math_boxed("So the answer is $\\boxed{\\text{Evelyn}}$.", "\\text{Navin}") == 0.0


@pytest.mark.parametrize("reward", ["math_verify", "math_boxed"])
def test_an_answer_line_is_the_final_answer_without_a_box_or_hashes(reward):
    """DAPO's prompt asks for 'Answer: N' on the last line (verl's math_dapo reads it); pdsr's rewards read only a
    box or '#### N' and scored every such response 0. GSM8K row 0 (Janet's ducks, 18) and MATH-500's first row,
    test/precalculus/807.json (\\left( 3, \\frac{\\pi}{2} \\right))."""
    fn = math_verify_reward(60.0) if reward == "math_verify" else math_boxed
    janet = gsm8k_rows()[0]
    assert gsm8k_number(janet) == "18"
    for response, score in [("She makes 9 * 2 = 18.\nAnswer: 18", 1.0), ("...\n**Answer:** 18", 1.0),
                            ("...\nAnswer: $18$.", 1.0), ("...\nAnswer: 18 dollars", 1.0),
                            ("Answer: 18\nWait, that is wrong.\nAnswer: 20", 0.0), ("...\nAnswer: 20", 0.0),
                            ("...\nAnswer: 20\n#### 18", 1.0),   # '####' comes first, as a box does
                            ("...\\boxed{20}\nAnswer: 18", 0.0), ("The answer is 18.", 0.0),
                            ("...\n## Final Answer: 18", 1.0),
                            ("To answer: first we count 18 eggs, then subtract.", 0.0)]:   # prose, no answer line
        assert fn(response, janet["answer"]) == score, response
    first = math500_rows()[0]
    assert first["unique_id"] == "test/precalculus/807.json"
    assert fn(f"...\nAnswer: {first['answer']}", first["answer"]) == 1.0
