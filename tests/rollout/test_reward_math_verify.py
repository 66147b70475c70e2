"""The math_verify reward (issue 49): the forms people write, timeouts in worker processes, calls from
a non-main thread, and the acceptance of equal forms of real MATH-500 answers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from fractions import Fraction

import pytest

from support import ROOT, WAIT_S
from pdsr_sdk.rollout.answers import exact_value, normalize_answer
from pdsr_sdk.rollout.reward import REWARDS, math_boxed, resolve_reward
from pdsr_sdk.rollout.verify_reward import MathVerifyReward, math_verify_reward, reference_answer

pytest.importorskip("math_verify")

MATH500 = ROOT.parent / "shared" / "data" / "math500.jsonl"


def boxed(answer: str) -> str:
    return f"Step by step ... so the answer is \\boxed{{{answer}}}."


def slow_check(predicted: str, truth: str) -> bool:
    """A comparison that hangs in Python code (what the worker's alarm interrupts)."""
    time.sleep(60)
    return True


def stuck_check(predicted: str, truth: str) -> bool:
    """A comparison that does not answer the alarm (as one stuck in C code would)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(600)   # far past the bound below: a check waited for would fail it, not pass late
    return True


def always_equal(predicted: str, truth: str) -> bool:
    return True


@pytest.fixture(scope="module")
def reward():
    # a shared one, as runs use it, with a time limit no loaded machine reaches: these tests are about the answers
    # (a check of '2x + 1' took over the default 5 s once beside a full test run); the limit has its own tests
    r = math_verify_reward(120.0)
    yield r


@pytest.mark.parametrize("answer, truth", [
    ("\\dfrac{1}{2}", "1/2"), ("\\frac12", "\\dfrac{1}{2}"), ("6/8", "\\frac{3}{4}"), ("\\frac{10}{4}", "5/2"),
    ("0.5", "\\frac{1}{2}"), ("0.75", "3/4"), ("x = 9", "9"), ("9.0", "9"), ("\\text{9}", "9"),
    ("9 \\text{ cm}", "9"), ("90^\\circ", "90"), ("(1, 2]", "(1,2]"), ("\\left(1, 2\\right]", "(1, 2]"),
    ("\\{1, 2\\}", "\\{2, 1\\}"), ("1,000", "1000"), ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}"),
    ("3^2", "9"), ("2x + 1", "1 + 2x"), ("\\text{Evelyn}", "\\text{Evelyn}"), ("9.", "9"), ("$\\frac{1}{2}$.", "0.5"),
    ("x = 10,\\!080", "10,\\!080"), ("a_1 = 5", "5"), ("y = 2x + 3", "y = 2x + 3"),
])
def test_equal_forms(reward, answer, truth):
    assert reward(boxed(answer), truth) == 1.0


@pytest.mark.parametrize("answer, truth", [
    ("2", "3"), ("(1,2)", "[1,2]"), ("(1, 2]", "[1, 2)"), ("\\{1, 2\\}", "\\{1, 3\\}"), ("0.333", "\\frac{1}{3}"),
    ("-\\frac{1}{2}", "\\frac{1}{2}"), ("x = 8", "9"), ("\\frac{3}{4}", "\\frac{4}{3}"),
])
def test_different_answers(reward, answer, truth):
    assert reward(boxed(answer), truth) == 0.0


def test_reads_the_last_box_and_the_truths_answer(reward):
    assert reward("first \\boxed{3} then \\boxed{9}", "9") == 1.0
    assert reward("first \\boxed{9} then \\boxed{3}", "9") == 0.0
    assert reward("the answer is 9", "9") == 0.0             # no box, no reward (--instruction math asks for one)
    assert reward(boxed("9"), None) == 0.0
    assert reward(boxed("18"), "Janet sells ... #### 18") == 1.0   # GSM8K worked solutions
    assert reward(boxed("\\frac12"), "so $\\boxed{0.5}$") == 1.0    # a truth with its own box
    assert reference_answer("a lot of work #### 1,234") == "1,234"


@pytest.mark.parametrize("response, truth, score", [
    ("so \\boxed 5 since $x^{2}$ is even", "5", 1.0),   # a brace further on is no box's
    ("so \\boxed 5 since $x^{2}$ is even", "2", 0.0),
    ("The answer is \\boxed 7.", "7", 1.0), ("$\\fbox 8$", "8", 1.0),   # what TeX boxes without braces
    ("\\boxedanswer{4}", "4", 0.0),   # another command
    ("\\boxed{3} and then \\boxed{4", "3", 0.0),   # cut off inside its last box: no answer
])
def test_a_box_is_its_own_argument(reward, response, truth, score):
    assert reward(response, truth) == score
    assert math_boxed(response, truth) == score


@pytest.mark.parametrize("response, truth, score", [
    # verl's gsm8k parquet asks for "output the final answer after ####": such a response scores by that line
    ("She sells 16 - 3 - 4 = 9 eggs, 9 * 2 = 18 dollars.\n#### 18", "18", 1.0),
    ("So 9 * 2 = 18.\n#### $18.", "Janet sells ... #### 18", 1.0),
    ("#### 17 ... no.\n#### 1,234", "1234", 1.0),
    ("#### 17", "18", 0.0),
    ("the answer is \\boxed{17}\n#### 18", "18", 0.0),   # the boxed answer is the final one
    ("She makes 18 dollars.\n#### 18 dollars", "18", 1.0),   # unit words after the number (verl reads 18)
    ("#### $18 per day.", "#### 18", 1.0), ("#### 18 or 19", "18", 0.0), ("#### 18 apples", "19", 0.0),
    ("#### 18\n\n#### Explanation\nWe subtract the eggs.", "18", 1.0),   # a Markdown heading after it
    ("#### Step 1: 16 - 3 - 4 = 9\n#### Step 2: 9 * 2 = 20", "18", 0.0),   # headings only: no right answer
    ("**#### 18**", "18", 1.0), ("#### **18**", "18", 1.0), ("#### **17**", "18", 0.0),   # Markdown bold
    ("So #### x = 18", "18", 1.0),
])
def test_a_gsm8k_answer_line_is_the_final_answer_without_a_box(reward, response, truth, score):
    assert reward(response, truth) == score
    if "=" not in response:   # math_boxed, the fallback, reads the same answer
        assert math_boxed(response, truth) == score
    assert math_boxed("\\boxed{\\$18}", "18") == 1.0


def test_default_for_math_data_and_math_boxed_stays():
    auto = resolve_reward("auto", has_ground_truth=True)
    assert isinstance(auto, MathVerifyReward) and auto.timeout_s == 5.0
    assert resolve_reward("math_verify", True) is auto is REWARDS.get("math_verify")
    assert resolve_reward("auto", True, timeout_s=2.0).timeout_s == 2.0
    assert resolve_reward("auto", has_ground_truth=False) is None
    assert resolve_reward("math_boxed", True) is math_boxed


def test_called_from_a_thread_that_is_not_main(reward):
    got: list[float] = []
    errors: list[BaseException] = []

    def score() -> None:
        try:
            got.extend([reward(boxed("x = 9"), "9"), reward(boxed("2"), "3")])
        except BaseException as exc:   # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=score)
    thread.start()
    thread.join(WAIT_S)
    assert not errors and got == [1.0, 0.0]


def test_a_hanging_check_times_out_scores_0_and_is_counted():
    reward = MathVerifyReward(0.5, check=slow_check)
    try:
        assert reward(boxed("3^2"), "9") == 0.0   # not the same text or number: math-verify's to check
        assert reward.stats["reward_timeouts"] == 1
        reward.check = always_equal   # the same worker goes on serving checks
        assert reward(boxed("3^2"), "9") == 1.0 and reward.stats["reward_timeouts"] == 1
    finally:
        reward.close()


def test_a_check_deaf_to_its_alarm_is_abandoned_and_its_worker_replaced():
    reward = MathVerifyReward(0.3, check=stuck_check)
    try:
        t0 = time.monotonic()
        assert reward(boxed("3^2"), "9") == 0.0
        assert reward.stats["reward_timeouts"] == 1 and time.monotonic() - t0 < 300   # not the 600 s of the check
        reward.check = always_equal
        assert reward(boxed("3^2"), "9") == 1.0   # a fresh worker
    finally:
        reward.close()


def test_timeout_is_a_described_setting():
    from pdsr_sdk.errors import ConfigError
    from pdsr_sdk.rollout.config import RolloutConfig

    field = RolloutConfig.model_fields["reward_timeout_s"]
    assert field.default == 5.0 and "math_verify" in field.description
    with pytest.raises(ConfigError):
        RolloutConfig(reward_timeout_s=0)


def equal_forms(answer: str) -> list[str]:
    """Forms a model writes for a MATH-500 answer: the truth's own text respaced and restyled, ``x = ``
    before it, and for a number its fractions, decimals, ``N.0``, ``\\text{N}`` and a unit."""
    forms = [answer.replace("\\frac", "\\dfrac"), f" {answer} ", f"{answer}."]
    if not any(s in answer for s in ("=", "\\in", "\\text")):   # a value, not an equation or a word
        forms.append(f"x = {answer}")
    value = exact_value(normalize_answer(answer))
    if value is None:
        return forms
    n, d = value.numerator, value.denominator
    forms += [f"{n}/{d}", f"\\dfrac{{{n}}}{{{d}}}", f"\\frac{{{2 * n}}}{{{2 * d}}}", f"{2 * n}/{2 * d}"]
    if d == 1:
        forms += [f"{n}.0", f"\\text{{{n}}}", f"{n} \\text{{ cm}}", f"x = {n}"]
    rest = d
    for p in (2, 5):
        while rest % p == 0:
            rest //= p
    if rest == 1 and d > 1:   # a terminating decimal, written out exactly
        digits = 0
        while (value * 10 ** digits).denominator != 1:
            digits += 1
        forms.append(f"{float(value):.{digits}f}")
    return forms


def different_answers(answer: str, others: list[str]) -> list[str]:
    """Answers that are not equal: for a number, off by a little and by a sign; for anything, the next
    MATH-500 answer that is not the same number or text."""
    out = []
    value = exact_value(normalize_answer(answer))
    if value is not None:
        off = value + Fraction(1, 1000)
        out += [f"{off.numerator}/{off.denominator}", str(value.numerator + value.denominator)]
        if value != 0:
            out.append(f"{-value.numerator}/{value.denominator}")
    for other in others:
        other_value = exact_value(normalize_answer(other))
        if normalize_answer(other) != normalize_answer(answer) and (other_value is None or other_value != value) \
                and (value is None or other_value is not None):
            out.append(other)
            break
    return out


def acceptance(reward, rows: list[dict]) -> tuple[int, int, int, int, list, list]:
    equal = accepted = different = rejected = 0
    missed, wrong = [], []
    answers = [row["answer"] for row in rows]
    for i, answer in enumerate(answers):
        for form in [answer] + equal_forms(answer):
            equal += 1
            if reward(boxed(form), answer) == 1.0:
                accepted += 1
            else:
                missed.append((form, answer))
        for form in different_answers(answer, answers[i + 1:] + answers[:i]):
            different += 1
            if reward(boxed(form), answer) == 0.0:
                rejected += 1
            else:
                wrong.append((form, answer))
    return equal, accepted, different, rejected, missed, wrong


@pytest.mark.slow
@pytest.mark.skipif(not MATH500.is_file(), reason="MATH-500 not found at ../shared/data/math500.jsonl")
def test_math500_equal_forms_accepted_and_different_rejected(reward):
    rows = [json.loads(line) for line in MATH500.open()]
    equal, accepted, different, rejected, missed, wrong = acceptance(reward, rows)
    print(f"math_verify: equal forms accepted {accepted}/{equal} ({accepted / equal:.2%}), "
          f"different rejected {rejected}/{different} ({rejected / different:.2%})")
    print("missed:", missed[:20])
    assert accepted / equal >= 0.99, missed[:20]
    assert rejected == different, wrong[:20]


def test_a_script_without_a_main_guard_can_use_it(tmp_path):
    """Workers are spawned without the caller's script: one with no ``if __name__ == "__main__":`` guard
    is not run again in them (which would start workers of its own, and fail)."""
    script = tmp_path / "score.py"
    script.write_text("from pdsr_sdk.rollout.reward import resolve_reward\n"
                      "reward = resolve_reward('auto', True)\n"
                      "print('score', reward('so \\\\boxed{3^2}', '9'), reward.stats['reward_timeouts'])\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["score 1.0 0"]


def exit_check(predicted: str, truth: str) -> bool:
    """A comparison that calls sys.exit() (as the model's code run by a check could)."""
    sys.exit(3)


def die_check(predicted: str, truth: str) -> bool:
    """A comparison whose worker process ends under it."""
    os._exit(3)


def test_a_check_that_exits_or_kills_its_worker_is_that_samples_reward_error():
    from pdsr_sdk.dispatch.trajectory import score_text

    reward = MathVerifyReward(5.0, check=exit_check)
    try:
        assert score_text(reward, boxed("3^2"), "9", {}) == (None, None, "SystemExit: the reward called sys.exit(3)")
        reward.check = die_check
        got = score_text(reward, boxed("3^2"), "9", {})
        assert got[0] is None and "BrokenProcessPool" in got[2]
        reward.check = always_equal   # a fresh worker goes on serving checks
        assert score_text(reward, boxed("3^2"), "9", {}) == (1.0, None, None)
    finally:
        reward.close()
