"""Rewards: the built-in ``math_verify`` (the default for math data) and ``math_boxed`` (its fallback,
pure Python), and user functions by import path.

A reward function is ``fn(response_text: str, ground_truth: str | None, **info) -> float``
where ``info`` has ``prompt_id``, ``sample_index`` and ``prompt_text``. A reward may also have a
``stats`` dict of counters (``math_verify``: ``reward_timeouts``), which runs add up and report.
"""

from __future__ import annotations

import inspect
import re
from fractions import Fraction
from typing import Any, Callable

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
        return adapt_reward(fn, name)
    return adapt_reward(REWARDS.get(name), name)


#: the info a reward is given by keyword (the last two when the data row has those columns)
INFO_KEYS = ("prompt_id", "sample_index", "prompt_text", "response_length", "data_source", "extra_info")
#: what pdsr can call, for the error naming a function it cannot
SIGNATURES = ("fn(response_text, ground_truth, **info) -> float | dict with 'score' (pdsr; info: prompt_id, "
              "sample_index, prompt_text, response_length, and the row's data_source and extra_info)",
              "compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict with "
              "'score' (verl)",
              "compute_score(data_sources, solution_strs, ground_truths, extra_infos=None) -> list (verl, batched)")


def adapt_reward(fn: Callable[..., Any], name: str) -> RewardFn:
    """``fn`` callable as pdsr calls a reward (``fn(text, ground_truth, **info)``): as it is when it takes that;
    wrapped when it is verl's ``compute_score`` (first parameter ``data_source``, or ``data_sources`` for the
    batched form); a ConfigError naming the function and the signatures pdsr knows otherwise."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):   # a builtin without a signature: trust it
        return fn
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keywords = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    var_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
    first = params[0].name if params else None
    if first in ("data_source", "data_sources"):
        batched = first == "data_sources"
        wanted = (["data_sources", "solution_strs", "ground_truths"] if batched
                  else ["data_source", "solution_str", "ground_truth"])
        if all(w in keywords for w in wanted):
            extra = "extra_infos" if batched else "extra_info"
            return VerlReward(fn, batched=batched, pass_extra_info=extra in keywords or var_keyword)
    elif len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params):
        required = [p for p in params[2:] if p.default is p.empty and p.name not in INFO_KEYS
                    and p.kind in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY, p.KEYWORD_ONLY)]
        if not required:
            return fn if var_keyword else _NamedInfo(fn, keywords - {p.name for p in positional[:2]})
    where = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"
    raise ConfigError(f"reward {name!r} ({where}{_signature(fn)}) cannot be called with any signature pdsr knows; "
                      f"it accepts: " + "; ".join(SIGNATURES))


def _signature(fn: Callable[..., Any]) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return ""


class _NamedInfo:
    """A pdsr-style reward without ``**info``: given only the info keys it names."""

    def __init__(self, fn: Callable[..., Any], names: set[str]):
        self.fn, self.names = fn, names
        self.stats = getattr(fn, "stats", None)

    def __call__(self, text: str, ground_truth: str | None, **info: Any) -> Any:
        return self.fn(text, ground_truth, **{k: v for k, v in info.items() if k in self.names})


class VerlReward:
    """verl's ``compute_score`` called as verl's reward manager calls it (by keyword), from pdsr's
    ``(text, ground_truth, **info)``: ``data_source`` and ``extra_info`` come from the data row's columns
    of those names (None when the data has none). The batched form gets lists of one."""

    def __init__(self, fn: Callable[..., Any], *, batched: bool, pass_extra_info: bool):
        self.fn, self.batched, self.pass_extra_info = fn, batched, pass_extra_info

    def __call__(self, text: str, ground_truth: str | None, *, data_source: Any = None, extra_info: Any = None,
                 **info: Any) -> Any:
        if not self.batched:
            kwargs = {"data_source": data_source, "solution_str": text, "ground_truth": ground_truth}
            if self.pass_extra_info:
                kwargs["extra_info"] = extra_info
            return self.fn(**kwargs)
        kwargs = {"data_sources": [data_source], "solution_strs": [text], "ground_truths": [ground_truth]}
        if self.pass_extra_info:
            kwargs["extra_infos"] = [extra_info]
        got = self.fn(**kwargs)
        if not isinstance(got, (list, tuple)) or len(got) != 1:
            raise TypeError(f"a batched verl reward returns a list with one score per input; got {got!r}")
        return got[0]


def reward_counters(reward_fn: object) -> dict[str, int]:
    """A copy of a reward's counters (its ``stats`` dict; empty for a plain function)."""
    stats = getattr(reward_fn, "stats", None)
    return {k: v for k, v in stats.items() if isinstance(v, int)} if isinstance(stats, dict) else {}


class OverlongShaping:
    """DAPO's overlong reward shaping around a reward (verl's DAPO reward manager): a response of L tokens
    past ``max_tokens - buffer`` gets ``min(-(L - (max_tokens - buffer)) / buffer * penalty, 0)`` added to its
    score (``-penalty`` at ``max_tokens``); a dict result also keeps it as ``overlong_reward``."""

    def __init__(self, fn: Callable[..., Any], *, max_tokens: int, buffer: int, penalty: float):
        self.fn, self.max_tokens, self.buffer, self.penalty = fn, max_tokens, buffer, penalty
        self.stats = getattr(fn, "stats", None)   # the wrapped reward's counters (math_verify's timeouts)

    def shaping(self, response_length: int) -> float:
        exceed = response_length - (self.max_tokens - self.buffer)
        return min(-exceed / self.buffer * self.penalty, 0.0)

    def __call__(self, text: str, ground_truth: str | None, **info: Any) -> Any:
        got = self.fn(text, ground_truth, **info)
        extra = self.shaping(int(info.get("response_length") or 0))
        if isinstance(got, dict) and "score" in got:
            return {**got, "score": float(got["score"]) + extra, "overlong_reward": extra}
        return float(got) + extra


def config_reward(config: Any, has_ground_truth: bool) -> RewardFn | None:
    """The reward a rollout config asks for (``reward``, ``reward_timeout_s``), with DAPO's overlong shaping
    when ``overlong_buffer`` is set; None for no reward."""
    fn = resolve_reward(config.reward, has_ground_truth, timeout_s=config.reward_timeout_s)
    if fn is None or not getattr(config, "overlong_buffer", None):
        return fn
    return OverlongShaping(fn, max_tokens=config.sampling.max_tokens, buffer=config.overlong_buffer,
                           penalty=config.overlong_penalty)
