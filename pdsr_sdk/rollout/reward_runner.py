"""Rewards as samples finish, off the dispatch loop.

A session hands every finished sample to a :class:`RewardRunner` (from the scheduler's callback, on the event loop).
The runner decodes the response there (cheap) and runs the reward function on a worker thread, so a slow reward never
holds up the loop that feeds the engines; ``math_verify``'s checks run in its own worker processes
(:mod:`pdsr_sdk.rollout.verify_reward`) beneath that thread. With ``executor="process"`` the reward functions
themselves run in worker processes (spawned), so a CPU-bound Python reward does not hold the interpreter lock either;
the functions must pickle (:func:`check_picklable`). A reward that raises fails only its own sample (``SystemExit``
too; ``KeyboardInterrupt`` stops the run with a ``RunError``), and so does one that kills its worker process. A step
waits for its samples' scores only after its groups are complete (:meth:`RewardRunner.wait`), and dynamic sampling
reads a group's scores as soon as its last one is in (:meth:`RewardRunner.when_scored`).

A sample that finishes again (restarted, regenerated) is scored again: each job remembers the state it
scored (restarts, tokens, finish reason), and a stale job's result is never used. The scores are the
same as scoring after the step (:func:`pdsr_sdk.dispatch.trajectory.score_sample`, the same call).

A reward call gets no time limit unless ``time_limit_s`` is given (``reward_time_limit_s``; math_verify's own checks
have ``reward_timeout_s`` beneath it): without one, a call that never returns holds its group, and the batch or step,
until the run is stopped. With one, a call that runs longer (counted from its start, not its wait in the queue) is
its sample's reward error. In a worker process a watchdog thread's signal interrupts the call (Python code; not one
stuck inside C code); in a thread it cannot be stopped: it keeps its thread until it returns, its result unused, and
the pool starts a thread in its place. Stopping a run ends the process either way: the threads are daemons and
:meth:`RewardRunner.close` ends the worker processes (the standard pools are joined at exit: a run stopped with
Ctrl-C or SIGTERM said so and then never exited).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import multiprocessing
import pickle
import signal
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

from pdsr_sdk.dispatch.trajectory import RewardStopped as _TimeLimit   # raised into a call by its watchdog
from pdsr_sdk.dispatch.types import Group, Sample
from pdsr_sdk.rollout.reward_pools import DaemonThreads, process_workers, terminate
from pdsr_sdk.errors import ConfigError, RunError

EXECUTORS = ("thread", "process")


@dataclass(frozen=True)
class Scored:
    """One sample's reward: its decoded text, the reward (None where it failed or there is no reward
    function), the extra fields as JSON, the error, seconds the reward call took, the reward
    counters it added (math_verify's ``reward_timeouts``), and the reward function's own score before DAPO's
    overlong shaping (None: the same as ``reward``), what dynamic sampling's filter compares."""

    text: str
    reward: float | None
    extra: str | None
    error: str | None
    seconds: float = 0.0
    timeouts: int = 0
    score: float | None = None

    @property
    def unshaped(self) -> float | None:
        """The reward before overlong shaping (the reward itself where there is none)."""
        return self.reward if self.score is None else self.score


def _state(sample: Sample) -> tuple:
    return (sample.restarts, sample.num_generated, sample.finish_reason)


def time_limit_error(limit_s: float) -> str:
    """A sample's reward error when its call ran past ``reward_time_limit_s``."""
    return f"the reward call ran past reward_time_limit_s ({limit_s:g} s) and was given up"


#: not SIGALRM: a reward's own timeouts (math-verify's) set and cancel its timer, and with it a limit kept there
LIMIT_SIGNAL = "SIGUSR1"
_armed: Any = None   # the running call's watchdog; a late signal from an earlier call's finds it unfired


def _expire(signum, frame):
    if getattr(_armed, "fired", False):
        raise _TimeLimit


def _score_limited(fn: Callable[..., Any] | None, text: str, ground_truth: Any, info: dict[str, Any],
                   limit_s: float) -> Scored:
    """In a worker process (its main thread): :func:`_score` under a watchdog thread signalling it at ``limit_s``."""
    global _armed
    signal.signal(sig := getattr(signal, LIMIT_SIGNAL), _expire)

    def fire():
        watchdog.fired = True
        signal.pthread_kill(main, sig)

    main, watchdog = threading.main_thread().ident, threading.Timer(limit_s, fire)
    watchdog.daemon, _armed = True, watchdog
    try:
        watchdog.start()
        try:
            return _score(fn, text, ground_truth, info)
        finally:
            _armed = None
            watchdog.cancel()
    except _TimeLimit:
        return Scored(text, None, None, time_limit_error(limit_s), limit_s)


def _score(fn: Callable[..., Any] | None, text: str, ground_truth: Any, info: dict[str, Any]) -> Scored:
    """In a worker thread: the reward of one decoded response, timed, with the counters it moved."""
    from pdsr_sdk.dispatch.trajectory import score_text
    from pdsr_sdk.rollout.reward import OverlongShaping, reward_counters

    if fn is None:
        return Scored(text, None, None, None)
    before = reward_counters(fn).get("reward_timeouts", 0)
    began = time.perf_counter()
    # under overlong shaping, the reward's own score is kept beside the shaped one (the filter's)
    shaping = fn if isinstance(fn, OverlongShaping) else None
    try:
        reward, extra, error = score_text(fn if shaping is None else shaping.fn, text, ground_truth, info)
    except KeyboardInterrupt as exc:   # the reward's own (Ctrl-C goes to the main thread): it would end the loop
        raise RunError(f"the reward function raised KeyboardInterrupt{f' ({exc})' if str(exc) else ''} on sample "
                       f"{info.get('sample_index')} of prompt {info.get('prompt_id')!r}: the run stops") from None
    score = reward
    if shaping is not None and reward is not None:
        reward, extra = shaping.apply(reward, extra, info.get("response_length") or 0)
    timeouts = reward_counters(fn).get("reward_timeouts", 0) - before
    return Scored(text, reward, extra, error, time.perf_counter() - began, timeouts, score)


def _shaped(fn: Callable[..., Any] | None, scored: Scored, response_length: int) -> Scored:
    """A reward decided elsewhere (an agent's own) with the overlong shaping ``fn`` has, if any, as a reward
    function's score gets it (verl's DAPO reward manager shapes every response's score)."""
    from pdsr_sdk.rollout.reward import OverlongShaping

    if not isinstance(fn, OverlongShaping) or scored.reward is None:
        return scored
    reward, extra = fn.apply(scored.reward, scored.extra, response_length)
    return replace(scored, reward=reward, extra=extra, score=scored.reward)


class RewardRunner:
    """Scores finished samples on ``workers`` threads (see the module). ``reward_for(group)`` is the reward
    function for a group's samples (None: no reward; the text is still decoded); ``tokenizer`` decodes
    responses: a tokenizer, or a function that loads one at the first decode (None, or ``decode=False``:
    the text is empty, as for simulated samples). With one worker
    (the default) the counters a reward keeps (math_verify's timeouts) are attributed to the sample whose
    call moved them. ``time_limit_s``: seconds one reward call may run (None: no limit; see the module)."""

    def __init__(self, reward_for: Callable[[Group], Callable[..., Any] | None], tokenizer: Any, *,
                 workers: int = 1, decode: bool = True, executor: str = "thread",
                 given: Callable[[Sample], tuple[float | None, str | None, str | None] | None] | None = None,
                 time_limit_s: float | None = None):
        if executor not in EXECUTORS:
            raise ConfigError(f"reward_executor: expected one of {', '.join(EXECUTORS)}, got {executor!r}")
        self.time_limit_s = time_limit_s
        self.reward_for = reward_for
        self._tokenizer = tokenizer
        self.decode = decode and tokenizer is not None
        self.workers = workers
        self.executor = executor
        self._pool: cf.Executor | None = None
        # with executor 'process': a one-worker pool that runs again, one at a time, the calls whose pool broke
        self._alone: cf.Executor | None = None
        self._alone_lock: asyncio.Lock | None = None
        #: a sample's (reward, extra, error) decided elsewhere (a multi-turn sample's agent), else None
        self.given = given
        # id(sample) -> (the sample, the state scored, its future); the sample is kept so its id stays its own
        self._jobs: dict[int, tuple[Sample, tuple, asyncio.Future]] = {}

    def submit(self, sample: Sample) -> asyncio.Future:
        """Start scoring a finished sample (on the event loop); a sample already being scored in its
        current state is not scored twice. Returns its job's future."""
        key, state = id(sample), _state(sample)
        job = self._jobs.get(key)
        if job is not None and job[0] is sample and job[1] == state:
            return job[2]
        g = sample.group
        text = (self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
                if self.decode and sample.token_ids else "")
        info = {"prompt_id": g.prompt_id, "sample_index": sample.index, "prompt_text": g.prompt_text,
                "response_length": sample.num_generated, **(g.reward_info or {})}
        fn = self.reward_for(g)
        loop = asyncio.get_running_loop()
        decided = self.given(sample) if self.given is not None else None
        if decided is not None:
            future = loop.create_future()
            future.set_result(_shaped(fn, Scored(text, *decided), sample.num_generated))
        elif fn is None:
            future = loop.create_future()
            future.set_result(Scored(text, None, None, None))
        elif self.executor == "process":
            future = asyncio.ensure_future(self._in_process(fn, text, g.ground_truth, info))
        elif self.time_limit_s is not None:
            future = asyncio.ensure_future(self._in_thread_limited(fn, text, g.ground_truth, info))
        else:
            future = loop.run_in_executor(self._executor(), _score, fn, text, g.ground_truth, info)
        self._jobs[key] = (sample, state, future)
        return future

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is not None and not hasattr(self._tokenizer, "decode"):
            self._tokenizer = self._tokenizer()   # loaded at the first decode
        return self._tokenizer

    async def wait(self, samples: Iterable[Sample]) -> list[Scored]:
        """The scores of finished samples in their current state (those not scored yet start now)."""
        return list(await asyncio.gather(*(self.submit(s) for s in samples)))

    def when_scored(self, group: Group, callback: Callable[[Group, list[Scored]], None],
                    on_error: Callable[[BaseException], None]) -> None:
        """Call ``callback(group, scores)`` on the loop once every sample of the complete ``group`` is scored
        (``on_error(exc)`` if a reward stops the run). The caller checks the group is still complete then."""
        task = asyncio.ensure_future(self.wait(group.samples))

        def done(t: asyncio.Future) -> None:
            if t.cancelled():
                return
            if t.exception() is not None:
                on_error(t.exception())
                return
            callback(group, t.result())
        task.add_done_callback(done)

    def result(self, sample: Sample) -> Scored | None:
        """The score of a sample in its current state, when it is in (else None)."""
        job = self._jobs.get(id(sample))
        if job is None or job[0] is not sample or job[1] != _state(sample) or not job[2].done() \
                or job[2].cancelled() or job[2].exception() is not None:
            return None
        return job[2].result()

    def forget(self, samples: Iterable[Sample]) -> None:
        """Drop the jobs of samples handed on (a consumed step's), so the runner does not keep them alive."""
        for s in samples:
            self._jobs.pop(id(s), None)

    def close(self) -> None:
        """Stop the workers: queued scores are cancelled, a running call in a thread is left to end on its own (its
        thread does not keep the process alive), worker processes are ended."""
        for pool in (self._pool, self._alone):
            if pool is not None:
                workers = process_workers(pool)   # shutdown forgets them
                pool.shutdown(wait=False, cancel_futures=True)
                terminate(workers)
        self._pool = self._alone = None
        self._jobs.clear()

    async def _in_thread_limited(self, fn: Callable[..., Any], text: str, ground_truth: Any,
                                 info: dict[str, Any]) -> Scored:
        """``_score`` on a worker thread, given up ``time_limit_s`` after the call starts: the thread cannot be
        stopped, so it is left to its call and the pool starts another in its place."""
        loop = asyncio.get_running_loop()
        started = loop.create_future()

        def call() -> Scored:
            loop.call_soon_threadsafe(lambda: started.done() or started.set_result(None))
            return _score(fn, text, ground_truth, info)

        pool = self._executor()
        job = asyncio.wrap_future(pool.submit(call))
        await asyncio.wait({started, job}, return_when=asyncio.FIRST_COMPLETED)   # cancelled before it started
        try:
            return await asyncio.wait_for(asyncio.shield(job), self.time_limit_s)
        except asyncio.TimeoutError:
            if isinstance(pool, DaemonThreads):
                pool.add_worker()
            return Scored(text, None, None, time_limit_error(self.time_limit_s), self.time_limit_s)

    async def _in_process(self, fn: Callable[..., Any], text: str, ground_truth: Any,
                          info: dict[str, Any]) -> Scored:
        """``_score`` in a worker process. A worker that dies (the reward called ``os._exit``, crashed, was
        killed) breaks its pool and every call in it: the pool is replaced, and each such call runs again
        alone, in a one-worker pool of its own, one at a time, so that only its own reward can kill that
        worker. A call whose worker dies there too is this sample's reward error, as an exception is."""
        pool = self._executor()
        try:
            return await asyncio.wrap_future(pool.submit(*self._process_call(fn, text, ground_truth, info)))
        except cf.process.BrokenProcessPool:
            if self._pool is pool:
                self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
        if self._alone_lock is None:
            self._alone_lock = asyncio.Lock()
        async with self._alone_lock:
            if self._alone is None:
                self._alone = cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
            alone = self._alone
            try:
                return await asyncio.wrap_future(alone.submit(*self._process_call(fn, text, ground_truth, info)))
            except cf.process.BrokenProcessPool:
                self._alone = None
                alone.shutdown(wait=False, cancel_futures=True)
        return Scored(text, None, None, "the reward's worker process died while scoring this sample, alone in a "
                                        "fresh process too (os._exit, a crash, or a kill); reward_executor 'process'")

    def _process_call(self, fn: Callable[..., Any], text: str, ground_truth: Any, info: dict[str, Any]) -> tuple:
        """What a worker process runs for one reward: under the time limit's timer where there is one."""
        if self.time_limit_s is None:
            return _score, fn, text, ground_truth, info
        return _score_limited, fn, text, ground_truth, info, self.time_limit_s

    def _executor(self) -> cf.Executor:
        if self._pool is None:
            if self.executor == "process":
                # spawned, not forked: this process runs an event loop and engine clients' threads
                self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
            else:
                self._pool = DaemonThreads(self.workers, "pdsr-reward")
        return self._pool


def check_picklable(fn: Callable[..., Any] | None, what: str = "the reward function") -> None:
    """ConfigError unless ``fn`` pickles (what ``reward_executor: process`` sends to its workers)."""
    if fn is None:
        return
    if getattr(fn, "runs_in_processes", False) or getattr(getattr(fn, "fn", None), "runs_in_processes", False):
        raise ConfigError(f"reward_executor 'process': {what} runs its checks in worker processes already "
                          f"(math_verify); use reward_executor 'thread' with it")
    try:
        pickle.dumps(fn)
    except Exception as exc:  # noqa: BLE001 - pickle raises several types
        raise ConfigError(f"reward_executor 'process': {what} ({fn!r}) cannot be sent to a worker process "
                          f"({type(exc).__name__}: {exc}); give a module-level function by import path "
                          f"(pkg.mod:fn), or use reward_executor 'thread'") from None
