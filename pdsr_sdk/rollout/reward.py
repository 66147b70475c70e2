"""Rewards: the built-in ``math_verify`` (the default for math data) and ``math_boxed`` (its fallback,
pure Python), and user functions by import path.

A reward function is ``fn(response_text: str, ground_truth: Any, **info) -> float``
where ``info`` has ``prompt_id``, ``sample_index`` and ``prompt_text``. The ground truth is text (a data file's
string or number column), a list or struct column's value as pyarrow gives it (a dict, a list), or None. A reward may
also have a ``stats`` dict of counters (``math_verify``: ``reward_timeouts``), which runs add up and report. An
``async def`` reward (verl's reward loop awaits them too) is awaited on its worker thread's own event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import inspect
import threading
from typing import Any, Callable

from pdsr_sdk.errors import ConfigError, DataError
from pdsr_sdk.registry import Registry, import_object
from pdsr_sdk.rollout.answers import answers_equal, last_boxed, response_answer

RewardFn = Callable[..., float]


#: the built-in rewards that compare the answer as text (``auto`` picks ``math_verify`` for data with a ground truth)
TEXT_REWARDS = {"auto": "math_verify", "math_verify": "math_verify", "math_boxed": "math_boxed"}


def compares_text(reward: str | None) -> str | None:
    """The built-in reward that a config's ``reward`` name gives and that compares the ground truth as text
    (``auto`` -> ``math_verify``), else None (no reward, or one that takes any ground truth)."""
    return TEXT_REWARDS.get(reward) if isinstance(reward, str) else None


def scalar_truth(ground_truth: Any) -> bool:
    """Whether a ground truth is one plain value, read as text: a string, a number, a numpy scalar."""
    return isinstance(ground_truth, (str, int, float)) or (getattr(ground_truth, "ndim", None) == 0
                                                           and hasattr(ground_truth, "item"))


def text_truth(ground_truth: Any, reward: str, info: dict[str, Any]) -> str:
    """``ground_truth`` as the text a built-in reward (``reward``) compares: a string as it is, a number written
    out; any other value (a dict, a list: Search-R1's ``{"target": [...]}``) is a DataError naming the prompt
    (``info``'s ``prompt_id``), which stops the run rather than scoring every sample 0."""
    if scalar_truth(ground_truth):
        return str(ground_truth)
    raise DataError(f"prompt {info.get('prompt_id')!r}: the {reward} reward compares the answer as text and needs a "
                    f"string or number ground truth; this one is a {type(ground_truth).__name__}, "
                    f"{ground_truth!r:.80}. Give a reward that takes this value (a session's reward=fn, "
                    f"config.reward 'pkg.mod:fn': pdsr's fn(response_text, ground_truth, **info) or verl's "
                    f"compute_score)")


def math_boxed(response_text: str, ground_truth: Any, **info) -> float:
    """1.0 if the response's final answer (:func:`response_answer`: its last ``\\boxed{}``, else its last
    ``#### N``, GSM8K's form, else its last ``Answer: N``, DAPO's) equals the ground truth
    (:func:`answers_equal`: the same text after
    :func:`normalize_answer`, or numbers of the same exact rational value, so 1/2, \\frac{1}{2}, \\dfrac12
    and 0.5 match and 0.333 and 1/3 do not; ``x = 5`` is 5), else 0.0 (also 0.0 without such an answer)."""
    if ground_truth is None:
        return 0.0
    ground_truth = text_truth(ground_truth, "math_boxed", info)
    predicted = response_answer(response_text)
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

#: the reward names that are no registered function: ``auto`` (the default) and ``none``
REWARD_WORDS = ("auto", "none")
#: the reward ``auto`` picks for data with a ground truth
DEFAULT_MATH_REWARD = "math_verify"
#: the default of ``reward_timeout_s``: seconds one math_verify check may take
DEFAULT_TIMEOUT_S = 5.0


def resolve_reward(name: str | None, has_ground_truth: bool, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                   where: str = "reward (--reward)") -> RewardFn | None:
    """``auto`` -> math_verify when the data has a ground truth; ``none`` -> no reward. ``timeout_s`` is
    math_verify's time for one check (its worker pool is shared by every caller with the same timeout). ``where``
    begins the error of an import path that cannot be loaded (:func:`load_reward`)."""
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
        return load_reward(name, where=where)
    return adapt_reward(REWARDS.get(REWARDS.check_name(name, also=REWARD_WORDS)), name)


def load_reward(name: str, *, where: str = "reward (--reward)") -> RewardFn:
    """The reward function of an import path ``pkg.mod:fn`` or a file's ``path/to/file.py:fn``, callable as pdsr
    calls a reward (:func:`adapt_reward`). A ConfigError otherwise, its message starting with ``where`` (the config
    key and flag that gave it; pdsr rollout adds the --config file it was in), as :func:`load_agent`'s."""
    try:
        fn = (_reward_file_object(name) if name.rpartition(":")[0].endswith(".py")
              else import_object(name, kind="reward function"))
        return adapt_reward(fn, name)
    except ConfigError as exc:
        text = str(exc).removeprefix("reward ")   # adapt_reward's "reward 'pkg.mod:fn' (...)": where says reward
        raise type(exc)(f"{where}: {text}") from exc.__cause__


def _reward_file_object(name: str) -> Any:
    """``path/to/file.py:fn`` (verl's ``custom_reward_function.path`` and ``.name``): the file is imported as the
    module of its stem, its folder put on ``sys.path`` so that reward worker processes import it too."""
    import sys
    from pathlib import Path

    file, _, attr = name.rpartition(":")
    path = Path(file).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"{name!r}: no such file: {path}")
    loaded = sys.modules.get(path.stem)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() != path:
        raise ConfigError(f"{name!r}: a module named {path.stem!r} is imported already (from "
                          f"{getattr(loaded, '__file__', None) or 'no file'}); rename {path.name}")
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    try:   # imports the file: its errors name the module, file and line
        import_object(f"{path.stem}:__name__")
    except ConfigError as exc:   # as given, not the module attribute this asked for
        raise type(exc)(str(exc).replace(repr(f"{path.stem}:__name__"), repr(name))) from exc.__cause__
    module = sys.modules[path.stem]
    if "." not in attr and not hasattr(module, attr):   # not import_object's answer, which is about import paths
        own = sorted(k for k, v in vars(module).items()
                     if callable(v) and not k.startswith("_") and getattr(v, "__module__", None) == path.stem)
        raise ConfigError(f"{name!r}: {path} has no {attr!r}" + (f" (its functions: {', '.join(own)})" if own else ""))
    return import_object(f"{path.stem}:{attr}", kind="reward function")


#: the info a reward is given by keyword (the last two when the data row has those columns)
INFO_KEYS = ("prompt_id", "sample_index", "prompt_text", "response_length", "data_source", "extra_info")
#: what pdsr can call, for the error naming a function it cannot
SIGNATURES = ("fn(response_text, ground_truth, **info) -> float | dict with 'score' (pdsr; info: prompt_id, "
              "sample_index, prompt_text, response_length, and the row's data_source and extra_info)",
              "compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict with "
              "'score' (verl)",
              "compute_score(data_sources, solution_strs, ground_truths, extra_infos=None) -> list (verl, batched)")


_LOOPS = threading.local()


def awaited(got: Any) -> Any:
    """A reward's result, awaited when it is awaitable (an ``async def`` reward) on this thread's own event loop,
    kept across calls (so a client the reward keeps, bound to the loop it first ran on, goes on working). A
    thread that already runs a loop (a caller on the session's loop) awaits it on a thread of its own."""
    if not inspect.isawaitable(got):
        return got

    async def wait() -> Any:
        return await got
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loop = getattr(_LOOPS, "loop", None)
        if loop is None or loop.is_closed():
            loop = _LOOPS.loop = asyncio.new_event_loop()
        return loop.run_until_complete(wait())
    with cf.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, wait()).result()


class _Awaiting:
    """An ``async def`` reward called as pdsr calls a reward: its result awaited (:func:`awaited`)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.stats = getattr(fn, "stats", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return awaited(self.fn(*args, **kwargs))


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def adapt_reward(fn: Callable[..., Any], name: str) -> RewardFn:
    """``fn`` callable as pdsr calls a reward (``fn(text, ground_truth, **info)``): as it is when it takes that;
    wrapped when it is verl's ``compute_score`` (first parameter ``data_source``, or ``data_sources`` for the
    batched form); a ConfigError naming the function and the signatures pdsr knows otherwise (also when it is
    not callable at all)."""
    if not callable(fn):
        raise ConfigError(f"reward {name!r}: {fn!r:.80} ({type(fn).__name__}) is not callable; give a function: "
                          + "; ".join(SIGNATURES))
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
            if not var_keyword:
                return _NamedInfo(fn, keywords - {p.name for p in positional[:2]})
            return _Awaiting(fn) if _is_async(fn) else fn
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

    def __call__(self, text: str, ground_truth: Any, **info: Any) -> Any:
        return awaited(self.fn(text, ground_truth, **{k: v for k, v in info.items() if k in self.names}))


class VerlReward:
    """verl's ``compute_score`` called as verl's reward manager calls it (by keyword), from pdsr's
    ``(text, ground_truth, **info)``: ``data_source`` and ``extra_info`` come from the data row's columns
    of those names (None when the data has none). The batched form gets lists of one."""

    def __init__(self, fn: Callable[..., Any], *, batched: bool, pass_extra_info: bool):
        self.fn, self.batched, self.pass_extra_info = fn, batched, pass_extra_info

    def __call__(self, text: str, ground_truth: Any, *, data_source: Any = None, extra_info: Any = None,
                 **info: Any) -> Any:
        if not self.batched:
            kwargs = {"data_source": data_source, "solution_str": text, "ground_truth": ground_truth}
            if self.pass_extra_info:
                kwargs["extra_info"] = extra_info
            return awaited(self.fn(**kwargs))
        kwargs = {"data_sources": [data_source], "solution_strs": [text], "ground_truths": [ground_truth]}
        if self.pass_extra_info:
            kwargs["extra_infos"] = [extra_info]
        got = awaited(self.fn(**kwargs))
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
    score (``-penalty`` at ``max_tokens``), and the amount is a field of its own, ``overlong_reward``, beside
    ``overlong`` (whether it is below 0), as verl logs both (``overlong_buffer.log``). The
    reward's own score (before shaping) is what dynamic sampling's filter compares, as DAPO's ``acc``."""

    def __init__(self, fn: Callable[..., Any], *, max_tokens: int, buffer: int, penalty: float):
        self.fn, self.max_tokens, self.buffer, self.penalty = fn, max_tokens, buffer, penalty
        self.stats = getattr(fn, "stats", None)   # the wrapped reward's counters (math_verify's timeouts)

    def shaping(self, response_length: int) -> float:
        exceed = response_length - (self.max_tokens - self.buffer)
        return min(-exceed / self.buffer * self.penalty, 0.0)

    def __call__(self, text: str, ground_truth: Any, **info: Any) -> Any:
        got = awaited(self.fn(text, ground_truth, **info))
        score = got.get("score") if isinstance(got, dict) else got
        if score is None or isinstance(score, (str, bytes)) or not hasattr(score, "__float__"):
            return got   # no number to shape: the sample's reward error says so
        fields = got if isinstance(got, dict) else {"score": got}
        extra = self.shaping(int(info.get("response_length") or 0))
        return {**fields, "score": float(fields["score"]) + extra, "overlong_reward": extra, "overlong": extra < 0}

    def apply(self, score: float, extra: str | None, response_length: int) -> tuple[float, str]:
        """What :meth:`__call__` gives, from the wrapped reward's score and other fields (JSON) already computed:
        (the shaped score, the fields with ``overlong_reward``, as JSON)."""
        import json

        shaping = self.shaping(int(response_length or 0))
        return score + shaping, json.dumps({**(json.loads(extra) if extra else {}), "overlong_reward": shaping,
                                            "overlong": shaping < 0})


def config_reward(config: Any, has_ground_truth: bool) -> RewardFn | None:
    """The reward a rollout config asks for (``reward``, ``reward_timeout_s``), with DAPO's overlong shaping
    when ``overlong_buffer`` is set; None for no reward."""
    return with_overlong(resolve_reward(config.reward, has_ground_truth, timeout_s=config.reward_timeout_s), config)


def with_overlong(fn: RewardFn | None, config: Any) -> RewardFn | None:
    """``fn`` with DAPO's overlong shaping when the config sets ``overlong_buffer`` (a session's own reward
    function too, as verl's DAPO reward manager shapes whatever ``compute_score`` it is given)."""
    if fn is None or not getattr(config, "overlong_buffer", None):
        return fn
    return OverlongShaping(fn, max_tokens=config.sampling.max_tokens, buffer=config.overlong_buffer,
                           penalty=config.overlong_penalty)
