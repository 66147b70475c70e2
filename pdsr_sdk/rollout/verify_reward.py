"""The ``math_verify`` reward: a response's final answer (its last ``\\boxed{}``, else its last ``#### N``, else its
last ``Answer: N``) against the ground truth with
Hugging Face's math-verify (``parse`` + ``verify``), each check in a worker process under a timeout.

math-verify's own timeout uses ``signal.alarm``, which works only in a process's main thread, and a
rollout session calls rewards from its event-loop thread. So every check runs in a small, lazily
started process pool (spawn context; its worker runs the check in its main thread under an alarm of
``timeout_s``). A check that overruns scores 0 and is counted in ``stats["reward_timeouts"]``; one that
does not even answer the alarm (stuck in C code) is given up on after a grace period, and the pool's
workers are killed and replaced. The pool is reused across calls and shut down at interpreter exit.

math_verify is imported only in the workers (and by :func:`verify_check`), never by importing this module.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import contextlib
import importlib.util
import multiprocessing
import signal
import sys
import threading
import types
from typing import Any, Callable, Iterator

from pdsr_sdk.errors import ConfigError, RunError
from pdsr_sdk.rollout.answers import answers_equal, drop_assignment, last_boxed, response_answer

#: seconds a fresh worker may take to start and import math-verify (sympy) before the first check
STARTUP_TIMEOUT_S = 120.0
#: extra seconds the caller waits past ``timeout_s`` for a worker that does not answer its alarm
GRACE_S = 2.0

#: what a check is: (predicted answer, reference answer) -> equal?; run in a worker, so a module-level function
Check = Callable[[str, str], bool]


class CheckTimeout(BaseException):
    """Raised by the worker's alarm. A BaseException, so that math-verify's and sympy's ``except
    Exception`` clauses let it through instead of treating the timeout as a failed comparison."""


def verify_check(predicted: str, truth: str) -> bool:
    """math-verify's comparison of two answers (the contents of their ``\\boxed{}``): both parsed as boxed
    LaTeX (then as a plain expression), the truth as gold. math-verify's own timeouts are off: the worker's
    alarm bounds the whole check."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    gold = parse(f"\\boxed{{{truth}}}", extraction_config=config, parsing_timeout=None)
    answer = parse(f"\\boxed{{{predicted}}}", extraction_config=config, parsing_timeout=None)
    if not gold or not answer:
        return False
    return bool(verify(gold, answer, timeout_seconds=None))


def _on_alarm(signum: int, frame: Any) -> None:
    raise CheckTimeout


def _worker_start() -> None:
    """Pool initializer: quiet math-verify's one-time warning about its own timeouts being off."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)


def _run_check(check: Check, predicted: str, truth: str, timeout_s: float) -> bool | None:
    """In a worker (its main thread): ``check`` under an alarm; None when it timed out."""
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return bool(check(predicted, truth))
    except CheckTimeout:
        return None
    except Exception:   # an answer math-verify cannot handle is not equal
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _warm_up() -> bool:
    """First task of a fresh worker: import math-verify before any check is timed."""
    if importlib.util.find_spec("math_verify") is not None:
        import math_verify  # noqa: F401
    return True


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """While workers spawn: an empty ``__main__``, so that they do not import the caller's script (spawn runs
    a script's top level again in each child, which breaks, or recurses in, a script without a
    ``if __name__ == "__main__":`` guard). Workers need only importable modules."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def tidy_answer(answer: str) -> str:
    """An answer without surrounding space, dollar signs or a final period (``9.`` is how a sentence ends,
    and math-verify reads it as nothing)."""
    return answer.strip().rstrip(".").strip().strip("$").strip()


def reference_answer(ground_truth: str) -> str:
    """The answer in a ground truth: its last ``\\boxed{}``, a GSM8K worked solution's ``#### N``, or all of it."""
    boxed = last_boxed(ground_truth)
    if boxed is not None:
        return boxed
    return ground_truth.rsplit("####", 1)[-1].strip() if "####" in ground_truth else ground_truth.strip()


class MathVerifyReward:
    """``reward(response_text, ground_truth, **info) -> float``: 1.0 when the response's final answer (its last
    ``\\boxed{}``, else its last ``#### N``, GSM8K's form, else its last ``Answer: N``, DAPO's:
    :func:`~pdsr_sdk.rollout.answers.response_answer`)
    equals the ground truth by ``check`` (default :func:`verify_check`, math-verify), else 0.0 (also without
    such an answer or a ground truth). A check that takes longer than ``timeout_s`` scores 0.0 and adds one
    to ``stats["reward_timeouts"]``. Safe to call from any thread; calls are served one at a time."""

    #: its checks already run in worker processes (``reward_executor: process`` is for other rewards)
    runs_in_processes = True

    def __init__(self, timeout_s: float = 5.0, *, check: Check = verify_check, workers: int = 1):
        # check: a module-level function of an importable module (it is pickled to the worker by name)
        if timeout_s <= 0:
            raise ConfigError(f"math_verify reward: timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.check = check
        self.workers = workers
        self.stats: dict[str, int] = {"reward_timeouts": 0}
        self._pool: cf.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._atexit = False

    def __call__(self, response_text: str, ground_truth: Any, **info: Any) -> float:
        from pdsr_sdk.rollout.reward import text_truth

        if ground_truth is None:
            return 0.0
        ground_truth = text_truth(ground_truth, "math_verify", info)
        predicted = response_answer(response_text)
        if predicted is None or not predicted.strip():
            return 0.0
        predicted, truth = tidy_answer(predicted), tidy_answer(reference_answer(ground_truth))
        if answers_equal(predicted, truth):   # math_boxed's rule: the same text or number, no worker needed
            return 1.0
        if "=" not in truth and "\\in" not in truth:   # 'x = 10,\\!080' against '10,\\!080'
            predicted = drop_assignment(predicted)
        return 1.0 if self.equal(predicted, truth) else 0.0

    def equal(self, predicted: str, truth: str) -> bool:
        """Whether two answers are equal by ``check``, in a worker under the timeout (a timeout is False, counted)."""
        with self._lock:
            pool = self._ensure_pool()
            future = pool.submit(_run_check, self.check, predicted, truth, self.timeout_s)
            try:
                result = future.result(timeout=self.timeout_s + GRACE_S)
            except cf.TimeoutError:   # the worker did not answer its alarm: kill it, start afresh next call
                self._kill_pool()
                result = None
            except cf.process.BrokenProcessPool:
                self._kill_pool()
                raise
        if result is None:
            self.stats["reward_timeouts"] += 1
            return False
        return result

    def close(self) -> None:
        """Stop the worker processes (a later call starts new ones)."""
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None

    def _ensure_pool(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            if self.check is verify_check and importlib.util.find_spec("math_verify") is None:
                raise ConfigError("the math_verify reward needs the math-verify package (a base dependency of "
                                  "pdsr): pip install 'math-verify>=0.7'; or pass --reward math_boxed")
            pool = cf.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                          initializer=_worker_start)
            self._pool = pool
            try:   # start the workers (now, in submit) and import math-verify before the first timed check
                with _main_hidden():
                    warm = [pool.submit(_warm_up) for _ in range(self.workers)]
                for f in warm:
                    f.result(timeout=STARTUP_TIMEOUT_S)
            except (cf.TimeoutError, cf.process.BrokenProcessPool) as exc:
                self._kill_pool()
                raise RunError(f"math_verify reward: its worker process did not start within "
                               f"{STARTUP_TIMEOUT_S:.0f} s ({type(exc).__name__}: {exc})") from exc
            if not self._atexit:
                atexit.register(self.close)
                self._atexit = True
        return self._pool

    def _kill_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for process in list(getattr(pool, "_processes", {}).values()):   # no public way before Python 3.14
            process.kill()
        pool.shutdown(wait=True, cancel_futures=True)


_SHARED: dict[float, MathVerifyReward] = {}
_SHARED_LOCK = threading.Lock()


def math_verify_reward(timeout_s: float = 5.0) -> MathVerifyReward:
    """The process-wide ``math_verify`` reward with this timeout (one worker pool per timeout, reused)."""
    with _SHARED_LOCK:
        if timeout_s not in _SHARED:
            _SHARED[timeout_s] = MathVerifyReward(timeout_s)
        return _SHARED[timeout_s]


#: the registered ``math_verify`` reward (default timeout)
math_verify = math_verify_reward()
