"""Runs one agent function per multi-turn sample, beside the scheduler, on the session's event loop.

The scheduler parks a multi-turn sample at each turn's end and calls :meth:`AgentRunner.on_turn_end`. The
runner hands the turn to the sample's :class:`~pdsr_sdk.agent.context.AgentContext` (starting the agent after
the first turn), and the agent's next ``generate()`` comes back as :meth:`Scheduler.continue_turn
<pdsr_sdk.dispatch.scheduler.Scheduler.continue_turn>`. While the agent waits on its environment, the sample
holds no slot.

Failures stay with their sample: an agent that raises, takes longer than ``env_timeout_s`` between turns, or
returns something that is not a reward ends its sample with finish reason ``failed`` and the error in
``sample.error``; the step goes on.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from pdsr_sdk.agent.context import AgentContext, AgentDone, TurnResult
from pdsr_sdk.dispatch.trajectory import extra_json
from pdsr_sdk.dispatch.types import DROPPED, FAILED, LENGTH, STOP, Group, Sample
from pdsr_sdk.errors import ConfigError

if TYPE_CHECKING:
    from pdsr_sdk.agent.config import AgentConfig

AgentFn = Callable[[AgentContext], Awaitable[Any]]


@dataclass
class AgentOutcome:
    """What an agent left for its sample's reward: the reward it returned (None: the reward function scores
    the trajectory) and the other fields of a returned dict."""

    reward: float | None = None
    extra: dict[str, Any] | None = None


def load_agent(path_or_fn: str | AgentFn, *, where: str = "agent") -> AgentFn:
    """The agent function of an import path ``pkg.mod:run`` (or the function itself): an ``async def``
    taking one argument. A ConfigError naming it otherwise, before any engine starts, its message starting with
    ``where`` (the config key and flag, or the argument, that gave it)."""
    import inspect

    from pdsr_sdk.registry import import_object

    try:
        fn = import_object(path_or_fn, kind="agent") if isinstance(path_or_fn, str) else path_or_fn
    except ConfigError as exc:
        raise type(exc)(f"{where}: {exc}") from exc.__cause__
    name = path_or_fn if isinstance(path_or_fn, str) else getattr(fn, "__qualname__", repr(fn))
    if not inspect.iscoroutinefunction(fn) and not inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        raise ConfigError(f"{where}: {name!r} must be an `async def run(agent)` function; got {fn!r}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):   # no signature to read (a builtin): the call will say
        return fn
    try:
        signature.bind(None)
    except TypeError as exc:   # else found only once every first turn has run, failing each sample
        raise ConfigError(f"{where}: {name!r} must take the agent context as its one argument (`async def "
                          f"run(agent)`): {exc}") from None
    return fn


class AgentRunner:
    """Agent tasks of one session (see the module). ``scheduler`` is read when a turn ends (the session's current
    one); ``tokenizer`` decodes turns and renders what agents append; ``limits`` (an ``AgentConfig``) holds the
    turn and time limits; ``vocab`` is the vocabulary size the ids an agent appends are checked against (None: not
    known; the engine checks them); ``template_kwargs`` the chat template's extra variables new messages are
    rendered with (``data.chat_template_kwargs``)."""

    def __init__(self, scheduler: Callable[[], Any], tokenizer: Callable[[], Any], limits: AgentConfig, *,
                 vocab: Callable[[], int | None] = lambda: None, template_kwargs: dict[str, Any] | None = None):
        self.template_kwargs = dict(template_kwargs or {})
        self._scheduler = scheduler
        self._tokenizer = tokenizer
        self.vocab = vocab
        self.max_turns = limits.max_turns
        self.max_env_turns = limits.max_env_turns
        self.turn_max_tokens = limits.turn_max_tokens
        self.env_timeout_s = limits.env_timeout_s
        self.tool_cap = (None if limits.max_tool_response_chars is None
                         else (limits.max_tool_response_chars, limits.tool_response_truncate_side))
        self._capped: set[Sample] = set()
        self._fns: dict[Sample, AgentFn] = {}
        self._contexts: dict[Sample, AgentContext] = {}
        self._tasks: dict[Sample, asyncio.Task] = {}
        self._timers: dict[Sample, asyncio.TimerHandle] = {}
        self._env_since: dict[Sample, float] = {}
        self.outcomes: dict[Sample, AgentOutcome] = {}

    def prepare(self, groups: list[Group], fn: AgentFn, *, cap_tools: bool = False) -> None:
        """Make the groups' samples multi-turn, run by ``fn`` (before they are handed to the scheduler).
        ``cap_tools``: cut the tool messages ``fn`` appends to ``agent.max_tool_response_chars`` (an agent
        function's samples; serve's named ones are not cut, their client holds the conversation it sent)."""
        for g in groups:
            for s in g.samples:
                self._fns[s] = fn
                if cap_tools and self.tool_cap is not None:
                    self._capped.add(s)
                if s.turns is None:
                    s.turns = []
                    s.response_mask = []
                if self.turn_max_tokens is not None and not s.num_generated:
                    s.turn_end = self.turn_max_tokens

    # ----------------------------------------------------------- scheduler side
    def on_turn_end(self, sample: Sample, reason: str) -> None:
        """Called by the scheduler: a turn of ``sample`` ended and it is parked."""
        ctx = self._contexts.get(sample)
        if ctx is None:
            ctx = AgentContext(sample, self._tokenizer(), max_turns=self.max_turns,
                               turn_max_tokens=self.turn_max_tokens, runner=self, max_env_turns=self.max_env_turns,
                               tool_cap=self.tool_cap if sample in self._capped else None)
            self._contexts[sample] = ctx
        turn = sample.turns[-1] if sample.turns else None
        n = turn.num_tokens if turn is not None else 0
        ids = sample.token_ids[len(sample.token_ids) - n:] if n else []
        lps = sample.logprobs[len(sample.logprobs) - n:] if n and len(sample.logprobs) >= n else []
        text = self._tokenizer().decode(ids, skip_special_tokens=True) if ids else ""
        ctx.turn_ended(TurnResult(list(ids), text, list(lps), reason, ctx.turns))
        self._env_since[sample] = time.perf_counter()
        self._arm_timer(sample)
        if sample not in self._tasks:
            self._tasks[sample] = asyncio.get_running_loop().create_task(self._run(ctx, self._fns[sample]))

    def on_sample_done(self, sample: Sample) -> None:
        """Called as any sample finishes: an agent sample ended by the policy (truncated) or by the runner."""
        ctx = self._contexts.pop(sample, None)
        self._fns.pop(sample, None)
        self._capped.discard(sample)
        self._disarm(sample)
        if sample.finish_reason == DROPPED:   # never scored: nothing reads its outcome
            self.outcomes.pop(sample, None)
        if ctx is not None:
            ctx.end(sample.finish_reason or "")
        task = self._tasks.pop(sample, None)
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()   # the sample ended without it (dropped, truncated, failed): its work is moot

    def continue_turn(self, ctx: AgentContext, env_ids: list[int], max_tokens: int | None,
                      tool_name: str | None) -> None:
        """Called by :meth:`AgentContext.generate`: run the sample's next turn."""
        sample = ctx.sample
        if self._overdue(sample):
            return
        self._disarm(sample)
        sched = self._scheduler()
        sched.guarded(functools.partial(sched.continue_turn, sample, env_ids, max_tokens, tool_name=tool_name))

    # ----------------------------------------------------------- agent side
    async def _run(self, ctx: AgentContext, fn: AgentFn) -> None:
        sample = ctx.sample
        try:
            got = await fn(ctx)
        except AgentDone:
            got = None
        except asyncio.CancelledError:
            if sample.finished or ctx.done:
                return
            raise
        except (Exception, SystemExit) as exc:   # noqa: BLE001 - an agent's bug fails its own sample only
            # SystemExit too: a tool running the model's code in this process (`exec`) gets its sys.exit(), which
            # out of this task would stop the session's event loop and hang the step
            self._fail(sample, f"the agent raised {type(exc).__name__}: {exc}")
            return
        if sample.finished or self._overdue(sample):
            return
        try:
            self._record(sample, got)
        except ValueError as exc:
            self._fail(sample, str(exc))
            return
        self._disarm(sample)
        # length when the budget ended the sample (its last turn cut, a generate() past the budget refused, the agent
        # said so, or it returned with the environment's ids past the budget, which a generate() would have refused):
        # a trainer's overlong filter masks or penalises it; else (the agent returned, or hit agent.max_turns) the
        # last turn's, as verl's multi-turn rollout ends a max-turn sample stop
        last = sample.turns[-1] if sample.turns else None
        spent = ctx.budget_spent or (ctx.env_pending and ctx.tokens_left <= 0)
        reason = STOP if last is not None and last.finish_reason == STOP and not spent else LENGTH
        sched = self._scheduler()
        sched.guarded(sched.finish, sample, reason)

    def _record(self, sample: Sample, got: Any) -> None:
        outcome = self.outcomes.setdefault(sample, AgentOutcome())
        if got is None:
            return
        extra = None
        if isinstance(got, dict):
            if "score" not in got:
                raise ValueError(f"the agent returned a dict without 'score' (keys: {sorted(got)})")
            extra = {k: v for k, v in got.items() if k != "score"} or None
            try:   # as the row writes them; else the step stops where its rewards are gathered
                extra_json(extra)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"the agent returned a dict whose other fields cannot be written as JSON "
                                 f"(reward_extra): {exc}") from None
            if not _finite_number(got["score"]):
                raise ValueError(f"the agent returned a dict whose 'score' is {got['score']!r:.80}; expected a finite "
                                 f"number (return None, not a dict, for the reward function to score the trajectory)")
            got = got["score"]
        # a number as a reward function's score is one: float() of it (numpy's too), but not text or a bool
        if not _finite_number(got):
            raise ValueError(f"the agent returned {got!r:.80}; expected None (the reward function scores the "
                             f"trajectory), a finite number, or a dict with 'score'")
        outcome.reward, outcome.extra = float(got), extra

    def _fail(self, sample: Sample, error: str) -> None:
        if sample.finished:   # ended meanwhile (dropped, truncated): its agent's end is no failure of its own
            return
        self._disarm(sample)
        task = self._tasks.get(sample)
        sample.error = error[:2000]
        sched = self._scheduler()
        sched.guarded(sched.finish, sample, FAILED)
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()

    def _timeout_error(self, sample: Sample) -> str:
        ctx = self._contexts.get(sample)
        refused = ctx.refused if ctx is not None else 0
        retried = (f"; {refused} generate() calls were refused meanwhile (AgentDone or AgentError): an agent that "
                   f"calls again after AgentDone never gets another turn" if refused > 1 else "")
        return f"the agent took longer than agent.env_timeout_s ({self.env_timeout_s:g} s) between turns{retried}"

    def _arm_timer(self, sample: Sample) -> None:
        self._disarm(sample, count=False)
        loop = asyncio.get_running_loop()
        # the error is worded when it fires: it names the generate() calls refused by then
        self._timers[sample] = loop.call_later(self.env_timeout_s,
                                               lambda: self._fail(sample, self._timeout_error(sample)))

    def _overdue(self, sample: Sample) -> bool:
        """Fails ``sample`` when its agent's time since the turn's end is past ``env_timeout_s``: an agent that
        blocked the event loop (a tool's synchronous call) held off its timer until it called generate() or
        returned, and would otherwise go on."""
        since = self._env_since.get(sample)
        if since is None or time.perf_counter() - since <= self.env_timeout_s:
            return False
        self._fail(sample, self._timeout_error(sample) + " (the event loop was held past it, as a tool's blocking "
                   "call holds it: run blocking code with asyncio.to_thread)")
        return True

    def _disarm(self, sample: Sample, count: bool = True) -> None:
        timer = self._timers.pop(sample, None)
        if timer is not None:
            timer.cancel()
        since = self._env_since.pop(sample, None) if count else None
        if since is not None:
            sample.env_s += time.perf_counter() - since

    def cancel_all(self) -> None:
        """Cancel every agent still running (the session closes, or its step failed)."""
        for task in self._tasks.values():
            task.cancel()
        for timer in self._timers.values():
            timer.cancel()
        self._tasks.clear()
        self._timers.clear()
        self._contexts.clear()
        self._fns.clear()
        self._capped.clear()


def _finite_number(value: Any) -> bool:
    """Whether ``value`` is a score: a finite number ``float()`` reads (numpy's too), not text, a bool or a list."""
    try:
        score = None if isinstance(value, (bool, str, bytes)) else float(value)
    except (TypeError, ValueError):   # a list, an array of several
        return False
    return score is not None and math.isfinite(score)
