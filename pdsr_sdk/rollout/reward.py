"""Rewards: the built-in ``math_boxed`` and user functions by import path.

A reward function is ``fn(response_text: str, ground_truth: str | None, **info) -> float``
where ``info`` has ``prompt_id``, ``sample_index`` and ``prompt_text``.
"""

from __future__ import annotations

import re
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
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


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


def math_boxed(response_text: str, ground_truth: str | None, **info) -> float:
    """1.0 if the last ``\\boxed{}`` of the response equals the ground truth after
    :func:`normalize_answer`, else 0.0 (also 0.0 without a boxed answer)."""
    if ground_truth is None:
        return 0.0
    predicted = last_boxed(response_text)
    if predicted is None:
        return 0.0
    truth = last_boxed(ground_truth)
    if truth is None:
        # GSM8K-style worked solutions end with "#### <answer>"
        truth = ground_truth.rsplit("####", 1)[-1] if "####" in ground_truth else ground_truth
    return 1.0 if normalize_answer(predicted) == normalize_answer(truth) else 0.0


REWARDS: Registry[RewardFn] = Registry("reward")
REWARDS.register("math_boxed", math_boxed)


def resolve_reward(name: str | None, has_ground_truth: bool) -> RewardFn | None:
    """``auto`` -> math_boxed when the data has a ground truth; ``none`` -> no reward."""
    if name is None or name == "none":
        return None
    if name == "auto":
        return math_boxed if has_ground_truth else None
    if ":" in name:
        fn = import_object(name)
        if not callable(fn):
            raise ConfigError(f"reward: {name!r} is not callable")
        return fn
    return REWARDS.get(name)
