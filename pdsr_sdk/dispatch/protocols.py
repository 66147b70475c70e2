"""The seams of the dispatch machinery: Clock, Engine, Dispatcher.

Who calls what:

- The :class:`~pdsr_sdk.dispatch.scheduler.Scheduler` owns the queues and the
  engines' slots. It calls ``Engine.submit``/``Engine.abort`` and receives the
  engine's progress through the :class:`EngineListener` methods.
- The scheduler calls the :class:`Dispatcher` (a policy) on events; the
  policy answers by calling :class:`DispatchContext` commands. A policy does
  no IO and reads time only from ``ctx.clock``, so the same class runs on
  real engines (wall clock) and on simulated ones (virtual clock).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Literal, Protocol, Sequence, runtime_checkable

from pdsr_sdk.dispatch.types import EngineLoad, Group, Sample, SegmentRequest, StreamSpec


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Time as the dispatcher sees it: seconds since the run started."""

    def now(self) -> float:
        """Current time in seconds (wall or virtual)."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback()`` after ``delay`` seconds; the handle cancels it."""


class EngineListener(Protocol):
    """Receives an engine's progress. Implemented by the scheduler."""

    def on_tokens(self, engine: "Engine", request_id: str, n: int,
                  token_ids: Sequence[int] | None, logprobs: Sequence[float] | None, *,
                  first_token_time_s: float | None = None) -> None:
        """Called zero or more times per request as tokens are generated (``n`` new tokens).

        ``first_token_time_s``: when the request's first token was sampled, from an engine that reports
        its tokens only later (the simulator reports counts at a segment's end); a streaming engine leaves
        it out and the time of its first call counts."""

    def on_segment_end(self, engine: "Engine", request_id: str, finish_reason: str, *,
                       speculation: tuple[int, int] | None = None, stop_reason: str | int | None = None) -> None:
        """Called exactly once per submitted request, after its last ``on_tokens``.

        ``finish_reason``: ``stop`` (EOS/stop string), ``length`` (hit the
        request's ``max_tokens``) or ``abort`` (after ``Engine.abort``).
        ``speculation``: (drafted, accepted) tokens of the request's verify steps, from an engine running
        speculative decoding that counts them (only then is it passed).
        ``stop_reason``: with ``stop``, the stop string or stop token id that ended the request (vLLM's
        ``CompletionOutput.stop_reason``; only then is it passed: the model's EOS has none).
        """

    def on_request_failed(self, engine: "Engine", request_id: str, error: str) -> None:
        """Optional (an engine checks for it): the engine refused this one request (a bad prompt; ``error``
        says why) and goes on serving; it gets no ``on_segment_end``. A listener without it hears such a
        refusal as ``on_engine_dead``."""

    def on_engine_dead(self, engine: "Engine", error: Exception) -> None:
        """Called once when the engine can no longer serve; its open requests get no
        ``on_segment_end``. ``error`` is a :class:`~pdsr_sdk.errors.EngineError`."""


@runtime_checkable
class Engine(Protocol):
    """A generation engine (a vLLM engine, a Ray actor holding one, or a simulated one)."""

    name: str
    pool: str
    #: most requests the scheduler runs on it at once
    max_concurrency: int
    #: token budget used to size segments (``L_next = capacity / n_active``)
    segment_capacity_tokens: int
    #: KV-cache capacity in tokens, when known (None until a real engine has started, or unknown)
    kv_cache_tokens: int | None

    async def start(self) -> None:
        """Called once before any submit: loads the model (may take a while)."""

    def bind(self, listener: EngineListener) -> None:
        """Send progress to ``listener`` from now on. Called by the owner of a scheduler
        before its first submit; engines outlive schedulers (one per rollout session)."""

    def submit(self, request: SegmentRequest) -> None:
        """Start generating up to ``request.max_tokens`` tokens after ``request.context_ids``.

        Must not block; progress arrives via the listener.
        """

    def abort(self, request_id: str) -> None:
        """Stop a running request; the listener then gets ``on_segment_end(..., "abort")``
        with every token produced so far already reported."""

    def load(self) -> EngineLoad:
        """Running/waiting requests and KV-cache usage as last seen."""

    async def close(self) -> None:
        """Release the engine (stop its process). Safe to call twice."""


class DispatchContext(Protocol):
    """Commands and read-only state a policy may use. Implemented by the scheduler."""

    clock: Clock
    policy_version: int
    #: True once groups have arrived while others may run (``add_groups``: partial rollout across steps)
    streaming: bool
    #: what the stream told with its groups (``add_groups(groups, stream=...)``): steps, groups in flight, the
    #: staleness bound; None before, or when groups stream without a description
    stream: StreamSpec | None

    @property
    def max_staleness(self) -> int | None:
        """The stream's staleness bound in policy versions (``stream.max_staleness``), None when unbounded or
        not streaming: a policy may spend capacity to keep long samples within it."""
    #: how responses are sampled (``SamplingConfig``); its ``max_tokens`` is the response cap a policy's
    #: predictions may use. A forced sample's own ``max_tokens`` is its recorded length (a replay or the
    #: simulator): a policy that is not a reference schedule must not read it.
    sampling: Any

    def pools(self) -> dict[str, list[Engine]]:
        """Live engines by pool name (``fast``, ``heavy``)."""

    def submit(self, sample: Sample, pool: str | None = None, *, engine: Engine | None = None,
               cap: int | None = None, front: bool = False) -> None:
        """Queue a sample on a pool's queue (or one engine's queue). ``cap`` bounds its
        response tokens while in that pool (``None`` = only its ``max_tokens``)."""

    def move(self, sample: Sample, pool: str | None = None, *, restart: bool = False, cap: int | None = None,
             engine: Engine | None = None) -> None:
        """Move a queued or running sample to another pool's queue (or to ``engine``'s queue). A
        running one is aborted first and continues from its tokens (``restart=True`` throws them
        away)."""

    def finish(self, sample: Sample, reason: str) -> None:
        """End a sample now with ``reason`` (e.g. ``truncated``); aborts it if running."""

    def restart(self, sample: Sample) -> None:
        """Throw a sample's tokens away and generate it again from its prompt on the engine it
        ran on (aborting it first if running; a finished one runs again)."""

    def queued(self, pool: str) -> list[Sample]:
        """The samples waiting in a pool's queue, in order (a copy)."""

    def queue_length(self, pool: str) -> int:
        """How many samples wait in a pool's queue."""

    def free_slots(self, engine: Engine) -> int:
        """How many more samples the engine can run now (0 if it is dead)."""

    def least_loaded(self, pool: str) -> Engine | None:
        """The live engine of ``pool`` with the smallest busy fraction that has a free slot."""

    def engine_of(self, sample: Sample) -> Engine | None:
        """The engine running the sample now, or None if it is queued or finished."""

    def steal(self, engine: Engine, from_pool: str, max_items: int, *,
              time_limit_s: float | None = None, cap: int | None | Literal["keep"] = "keep") -> int:
        """Run up to ``max_items`` samples from another pool's queue on ``engine`` now.
        With ``time_limit_s``, a stolen sample still running after that long goes back
        to ``from_pool`` (continuing from its tokens). ``cap`` replaces the samples' caps
        (``"keep"`` keeps them). Returns how many were taken."""

    def reroute(self, sample: Sample, engine: Engine) -> bool:
        """Queue ``sample``, waiting unstarted in another engine's queue, on ``engine`` instead (counted as a
        steal, not a move: nothing was generated, so nothing is re-prefilled). False, and nothing done, if
        the sample is not waiting in an engine's queue or has already run."""

    def count(self, key: str, n: int = 1) -> None:
        """Add to a run statistic (e.g. ``offloaded_prompts``, ``breaks``)."""


class Dispatcher(Protocol):
    """A dispatch policy. One instance serves one run; hooks are called by the scheduler.

    Subclass :class:`pdsr_sdk.dispatch.policy.Policy` (also ``pdsr_sdk.policies.base.Policy``)
    for no-op defaults.

    A mistake ends the run with a :class:`~pdsr_sdk.errors.RunError` naming the policy: an exception a hook
    (or a callback set with ``ctx.clock.call_later``) raises names the hook and the line (the exception is its
    ``__cause__``); a command the scheduler refuses names the hook that gave it; and once nothing runs, waits on a
    queue, a pause or a ``ctx.clock`` timer while samples it was given are unfinished, the error lists them.
    """

    name: ClassVar[str]
    #: pydantic model of this policy's settings (``extra="forbid"``)
    config_model: ClassVar[type]
    #: optional: True if ``on_batch`` may be called again while earlier groups still run
    #: (streaming: ``DispatchRun.add_groups``, ``pdsr simulate --steps``); absent = False
    streaming: ClassVar[bool]

    def on_batch(self, groups: list[Group]) -> None:
        """A batch of prompt groups arrived; every sample is in ``group.samples``.
        The policy must eventually submit (or finish) every sample: one left with nothing else to wait for is
        an error naming it."""

    def on_launch(self, sample: Sample, engine: Engine) -> None:
        """A sample left a queue and started running on ``engine`` (not called for the
        continuation segments that follow on the same engine)."""

    def on_sample_finished(self, sample: Sample) -> None:
        """A sample finished (any reason). Probes are reported here too (``sample.is_probe``)."""

    def on_segment_end(self, sample: Sample, engine: Engine) -> None:
        """A segment ended and the sample is not finished. Unless the policy moves or
        finishes it here, it continues on the same engine."""

    def on_over_cap(self, sample: Sample, engine: Engine) -> None:
        """The sample reached its pool cap (``sample.cap``) without finishing. The policy
        must move or finish it; if it does neither, the sample is truncated."""

    def on_worker_idle(self, engine: Engine) -> None:
        """An engine has free slots and nothing queued for it (a chance to steal work)."""

    def on_engine_lost(self, engine: Engine, requeued: list[Sample]) -> None:
        """An engine died; ``requeued`` were put back on its pool's queue."""

    def on_turn_parked(self, sample: Sample, engine: Engine) -> None:
        """Optional: a multi-turn sample's turn ended on ``engine``; it is parked, holding no slot, until its owner
        continues it (its room may go to other samples meanwhile)."""

    def on_next_turn(self, sample: Sample, engine: Engine) -> None:
        """Optional: a parked multi-turn sample's next turn is about to queue on ``engine``, the one that holds its
        prefix (or where the policy moved it while parked); ``move(sample, engine=...)`` here sends it elsewhere."""

    def idle_interest(self, pool: str) -> bool:
        """Optional speed hint, asked before ``on_worker_idle`` calls for a pool's engines:
        False means the policy would do nothing for them now (skipped at scale)."""

    def segment_floor(self, sample: Sample, engine: Engine) -> int:
        """Optional: the fewest tokens the segment of ``sample`` about to launch on ``engine`` should ask
        for, called at every launch (continuations too) while segments are on. The budget-aware length
        (``L = capacity / running``, at most ``L_max``) is raised to it, never past ``L_max``. Each
        segment end is a decision point for the policy and costs the engine a prefill of the context's
        last partial block; a policy that needs no decision point for a sample asks for fewer ends."""

    def on_step_end(self, carried: list[Group]) -> list[Sample]:
        """Optional (partial rollout across steps): a step ended and the weights changed; ``carried`` are
        the groups going into the next step (their running samples stopped, holding their tokens). Return a
        list (``[]`` for none) of samples to generate again under the new weights (their tokens are thrown away and
        counted as wasted): finished ones, and under a staleness bound running ones, whose restart then counts as
        their one staleness restart (one already restarted for staleness is left as it is); called after
        the staleness restarts and before the step's new groups arrive."""

    def batch_report(self) -> dict[str, Any]:
        """Optional: facts about the batch that just finished (e.g. v2.5's ``l_cut``, ``fast_cap``), a dict
        put in its :class:`~pdsr_sdk.dispatch.run.BatchReport`. Called once per batch, after its last
        sample finished; in partial rollout once per step at its end (``pdsr rollout --steps``), and once at
        the run's end in ``pdsr simulate --steps`` (its report's ``policy``)."""


DispatcherFactory = Callable[[Any, DispatchContext], Dispatcher]

#: the hooks every :class:`Dispatcher` has (the others are optional); a policy class without one is refused by name
REQUIRED_HOOKS = ("on_batch", "on_launch", "on_sample_finished", "on_segment_end", "on_over_cap", "on_worker_idle",
                  "on_engine_lost")
