"""Rewards: the built-in ``math_verify`` (the default for math data) and ``math_boxed`` (its fallback,
pure Python), and user functions by import path.

A reward function is ``fn(response_text: str, ground_truth: str | None, **info) -> float``
where ``info`` has ``prompt_id``, ``sample_index`` and ``prompt_text``. A reward may also have a
``stats`` dict of counters (``math_verify``: ``reward_timeouts``), which runs add up and report.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Callable

from pdsr_sdk.errors import ConfigError
from pdsr_sdk.registry import Registry, import_object

RewardFn = Callable[..., float]


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    end = _closing_brace(text, i)
    return None if end < 0 else text[i + 1:end]


_STRIP = [
    (re.compile(r"\\(?:left|right|!|,|;|:|quad|qquad)"), ""),
    (re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}"), r"\1"),
    (re.compile(r"\\[dt]frac"), r"\\frac"),
    (re.compile(r"\^\{?\\circ\}?|°"), ""),
    (re.compile(r"\\%|%"), ""),
    (re.compile(r"\s+"), ""),
    (re.compile(r"\$"), ""),
]


def normalize_answer(answer: str) -> str:
    """Light normalisation: strip spacing commands, text wrappers, units of degrees and
    percent, dollar signs and whitespace; drop a trailing period; '0.50' -> '0.5'."""
    s = answer.strip()
    for pattern, repl in _STRIP:
        s = pattern.sub(repl, s)
    s = s.rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    if re.fullmatch(r"-?\d+\.\d+", s):
        s = s.rstrip("0").rstrip(".")
    return s


_UNSIGNED = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def exact_value(answer: str) -> Fraction | None:
    """The exact rational value of a number written as an integer, a decimal, ``a/b`` or
    ``\\frac{a}{b}`` (also ``\\dfrac``/``\\tfrac`` and the short ``\\frac12``), with a sign; None for
    anything else (expressions, mixed numbers, units, lists). Decimals are exact: 0.333 is
    333/1000, not 1/3. Expects the output of :func:`normalize_answer` (no spaces)."""
    s = answer
    while len(s) >= 2 and s[0] == "{" and s[-1] == "}" and _closing_brace(s, 0) == len(s) - 1:
        s = s[1:-1]
    sign = 1
    if s[:1] in ("+", "-"):
        sign, s = (-1 if s[0] == "-" else 1), s[1:]
    if _UNSIGNED.fullmatch(s):
        return sign * Fraction(s)
    if s.startswith("\\frac") or s.startswith("\\dfrac") or s.startswith("\\tfrac"):
        rest = s[s.index("frac") + 4:]
        num, rest = _frac_argument(rest)
        den, rest = _frac_argument(rest) if num is not None else (None, rest)
        if num is None or den is None or rest:
            return None
        top, bottom = exact_value(num), exact_value(den)
    elif s.count("/") == 1:
        a, b = s.split("/")
        if a[:1] in ("+", "-") or not _UNSIGNED.fullmatch(a):
            return None
        top, bottom = Fraction(a), exact_value(b)
    else:
        return None
    if top is None or bottom is None or bottom == 0:
        return None
    return sign * top / bottom


def _frac_argument(s: str) -> tuple[str | None, str]:
    """One argument of ``\\frac``: ``{...}`` or a single digit (``\\frac12``); (argument, rest)."""
    if s[:1] == "{":
        end = _closing_brace(s, 0)
        return (None, s) if end < 0 else (s[1:end], s[end + 1:])
    if s[:1].isdigit():
        return s[0], s[1:]
    return None, s


def _closing_brace(s: str, i: int) -> int:
    """Index of the brace closing the one at ``s[i]`` (balanced), or -1."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return -1


def answers_equal(predicted: str, truth: str) -> bool:
    """Equal after :func:`normalize_answer`, or both numbers of the same exact value (:func:`exact_value`)."""
    p, t = normalize_answer(predicted), normalize_answer(truth)
    if p == t:
        return True
    vp = exact_value(p)
    return vp is not None and vp == exact_value(t)


def math_boxed(response_text: str, ground_truth: str | None, **info) -> float:
    """1.0 if the last ``\\boxed{}`` of the response equals the ground truth (:func:`answers_equal`:
    the same text after :func:`normalize_answer`, or numbers of the same exact rational value, so
    1/2, \\frac{1}{2}, \\dfrac12 and 0.5 match and 0.333 and 1/3 do not), else 0.0 (also 0.0
    without a boxed answer)."""
    if ground_truth is None:
        return 0.0
    predicted = last_boxed(response_text)
    if predicted is None:
        return 0.0
    truth = last_boxed(ground_truth)
    if truth is None:
        # GSM8K-style worked solutions end with "#### <answer>"
        truth = ground_truth.rsplit("####", 1)[-1] if "####" in ground_truth else ground_truth
    return 1.0 if answers_equal(predicted, truth) else 0.0


REWARDS: Registry[RewardFn] = Registry("reward")
REWARDS.register("math_boxed", math_boxed)
REWARDS.register("math_verify", "pdsr_sdk.rollout.verify_reward:math_verify")

#: the reward ``auto`` picks for data with a ground truth
DEFAULT_MATH_REWARD = "math_verify"
#: the default of ``reward_timeout_s``: seconds one math_verify check may take
DEFAULT_TIMEOUT_S = 5.0


def resolve_reward(name: str | None, has_ground_truth: bool, *,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> RewardFn | None:
    """``auto`` -> math_verify when the data has a ground truth; ``none`` -> no reward. ``timeout_s`` is
    math_verify's time for one check (its worker pool is shared by every caller with the same timeout)."""
    if name is None or name == "none":
        return None
    if name == "auto":
        name = DEFAULT_MATH_REWARD if has_ground_truth else "none"
        if name == "none":
            return None
    if name == "math_verify":
        from pdsr_sdk.rollout.verify_reward import math_verify_reward

        return math_verify_reward(timeout_s)
    if ":" in name:
        fn = import_object(name)
        if not callable(fn):
            raise ConfigError(f"reward: {name!r} is not callable")
        return fn
    return REWARDS.get(name)


def reward_counters(reward_fn: object) -> dict[str, int]:
    """A copy of a reward's counters (its ``stats`` dict; empty for a plain function)."""
    stats = getattr(reward_fn, "stats", None)
    return {k: v for k, v in stats.items() if isinstance(v, int)} if isinstance(stats, dict) else {}
