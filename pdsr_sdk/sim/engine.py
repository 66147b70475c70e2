"""``SimEngine``: a simulated vLLM-like engine in virtual time (the ``sim`` engine backend).

What it models (the rules; :mod:`pdsr_sdk.sim.naive` implements the same rules
token by token and the tests hold the two together):

- Continuous batching: all running requests advance one token per step; at
  most ``max_num_seqs`` run at once. Step time is the cost model of
  :mod:`pdsr_sdk.sim.cost` (``c0 + c1*R + c2*C`` plus prefill of the
  requests admitted at that step).
- Requests join and leave only at step boundaries. A request submitted while
  a step runs waits for the next boundary (an idle engine starts at once);
  requests submitted in the same instant join together, in submission order.
- KV cache of ``kv_cache_tokens`` in blocks of ``block_size``: a request
  reading a context of c tokens holds ``ceil(c / block)`` blocks. At a
  boundary, if the running requests need more blocks than there are, the
  newest running request is preempted (its KV dropped; it goes to the front of
  the waiting queue keeping its tokens and pays prefill of its whole context
  when resumed), as vLLM's recompute preemption does; no request is admitted at
  a boundary that preempted. Waiting requests are admitted first-come
  first-served while slots and blocks allow.
- Prefix cache: after a segment ends or is aborted the engine remembers the
  whole blocks of the sample's computed context (vLLM keeps an aborted
  request's blocks cached until they are evicted), so a continuation on the
  same engine prefills only the uncached tail; preemption, the sample's last
  token and :meth:`SimEngine.reset_prefix_cache` (what a weight update does
  unless the KV cache is kept across it) forget it. A sample moved elsewhere
  pays full prefill there. A request with a ``cache_salt`` finds only what
  requests of the same salt cached (vLLM's salted block hashes: a sample
  restarted under a newer version starts afresh, ``kv_on_update: keep``).
  With ``prompt_cache``, a request admitted while another
  request of the same prompt (``Group.prompt_id``) runs on the engine also
  finds the prompt's whole blocks cached (vLLM caches a block as soon as it is
  allocated, so this holds within one step too); the cache is forgotten when
  the prompt's last request leaves the batch, a conservative stand-in for
  vLLM's LRU eviction.
- Speculative decoding (``profile.speculation``): while at most ``max_batch``
  requests run, a step costs a verify step's price over the tokens it yields a
  request, the mean of the running requests' rows (by response position, and by
  siblings finished at submission where the joint table has the cell), re-read
  every ``position_width`` steps; every running request still advances one token
  a step. Each span reports its drafted and accepted tokens.
- A segment generates exactly its ``max_tokens`` (lengths are forced) and ends
  with ``length``. ``abort(rid)`` reports the tokens of the steps completed so
  far, then ``abort``, from a 0-delay timer; the request leaves the batch at
  the next boundary (the step in flight is wasted).

Event-driven: between events the batch is fixed, so the time of k steps is an
arithmetic series (closed form). Each engine keeps one timer for its next
event: the earliest segment end (a heap of end steps on a per-engine global
step counter) or the step at which the KV cache would overflow.
"""

from __future__ import annotations

from collections import deque

from pdsr_sdk.dispatch.types import ABORT, EngineLoad
from pdsr_sdk.errors import EngineError
from pdsr_sdk.sim.config import EngineProfile
from pdsr_sdk.sim.cost import steps_within
from pdsr_sdk.sim.engine_boundaries import StepBoundaries
from pdsr_sdk.sim.engine_request import GONE, LEAVING, WAITING, SimRequest


class SimEngine(StepBoundaries):
    """A simulated engine implementing :class:`pdsr_sdk.dispatch.protocols.Engine`."""

    counts_only = True   # the scheduler sends no token ids; progress is reported as counts

    def __init__(self, name: str, pool: str, profile: EngineProfile | None = None, clock=None, *,
                 record: bool = True):
        self.name = name
        self.pool = pool
        self.profile = profile or EngineProfile()
        p = self.profile
        self.max_concurrency = p.max_num_seqs
        self.segment_capacity_tokens = p.segment_capacity_tokens
        self.kv_cache_tokens = p.kv_blocks * p.block_size
        self.clock = clock
        self._c0, self._c1, self._c2, self._p = p.c0_s, p.c1_s_per_seq, p.c2_s_per_token, p.prefill_s_per_token
        self._block = p.block_size
        self._kv = p.kv_blocks
        self._spec = p.speculation   # speculative decoding (None: off): a token's cost scaled while few run
        self._max_ctx = p.max_context
        self._record = record
        self._listener = None
        self._running: dict[str, SimRequest] = {}
        self._waiting: deque[SimRequest] = deque()
        self._reqs: dict[str, SimRequest] = {}
        self._heap: list[tuple[int, int, SimRequest]] = []
        self._leaving: list[SimRequest] = []
        self._cache: dict = {}                 # sample (and salt) -> cached prefix tokens on this engine
        self._prompt_cache = p.prompt_cache
        self._prompt_refs: dict = {}           # prompt -> its running requests on this engine
        self._seq = 0
        # the current epoch: from boundary (t0, step) with a fixed batch, step j costs a + b*j (+ extra if j == 0)
        self._step = 0
        self._t0 = 0.0
        self._a = self._b = self._extra = 0.0
        self._sum_off = 0                      # sum of running requests' off: context tokens = sum_off + R*S
        self._sum_q = 0                        # sum of off // block
        self._res = [0] * self._block          # running requests per off % block
        self._pending_prefill = 0              # prefill tokens of the epoch's first step (not yet run)
        self._admitted: list[SimRequest] = []        # requests admitted at the current step (their first step not run)
        self._timer = None
        self._timer_step = -1
        self._in_boundary = False
        self._call_at = None
        # statistics
        self.busy_s = 0.0
        self.steps = 0
        self.tokens = 0
        self.preemptions = 0
        self.drafted_tokens = 0      # tokens generated while drafting ran (speculation on, few requests running)
        self._drafting = False
        # speculation, per running request and step of the epoch: (drafting steps, accepted, drafted tokens);
        # and those summed over the steps up to self._step (a request's own: the difference since it joined)
        self._rate = (0.0, 0.0, 0.0)
        self._cum = (0.0, 0.0, 0.0)
        by_pos = None if self._spec is None else self._spec.by_position
        self._pos_starts = [row[0] for row in by_pos] if by_pos else None
        self._pos_width = self._spec.position_width if by_pos else 0
        joint = None if self._spec is None else self._spec.by_position_and_siblings
        self._joint = {(p, f): (y, d) for p, f, y, d in joint} if joint else None
        self.prefill_tokens = 0
        self.occupancy_t: list[float] = [0.0]
        self.occupancy_n: list[int] = [0]

    @classmethod
    def from_spec(cls, spec, *, clock=None, profile: EngineProfile | None = None, **_: object) -> "SimEngine":
        """Build from an EngineSpec (``backend: sim``): limits from the spec, cost keys from
        ``spec.engine_args`` over ``profile`` (or the pool's default profile)."""
        return cls(spec.name, spec.pool, EngineProfile.from_spec(spec, base=profile), clock)

    # ------------------------------------------------------------- lifecycle
    def bind(self, listener) -> "SimEngine":
        self._listener = listener
        return self

    async def start(self) -> None:
        if self.clock is None:   # standalone in a real run: simulate in wall time
            from pdsr_sdk.dispatch.clock import LoopClock

            self.clock = LoopClock()

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def load(self) -> EngineLoad:
        used = self._total_blocks(self._step) if self._running else 0
        return EngineLoad(running=len(self._running), waiting=len(self._waiting), kv_cache_usage=used / self._kv)

    def busy_s_at(self, now: float) -> float:
        """Seconds a step was running on this engine up to ``now`` (``busy_s`` itself advances only at
        step boundaries; this adds the step in flight)."""
        return self.busy_s + (now - self._t0 if self._running and now > self._t0 else 0.0)

    # -------------------------------------------------------------- requests
    def submit(self, request) -> None:
        ctx, n = request.context_len, request.max_tokens
        if ctx + n > self._max_ctx:
            raise EngineError(self.name, f"request {request.request_id} needs a context of {ctx + n} tokens; this "
                              f"simulated engine holds at most {self._max_ctx} (max_model_len / kv_cache_tokens)")
        if n < 1:
            raise EngineError(self.name, f"request {request.request_id} asks for {n} tokens; expected >= 1")
        prompt = None
        salt = getattr(request, "cache_salt", None)
        if self._prompt_cache:
            group = getattr(request.sample, "group", None)
            prompt = getattr(group, "prompt_id", None)
            if prompt is not None and salt is not None:
                prompt = (prompt, salt)
        r = SimRequest(request.request_id, request.sample, ctx, n, prompt, salt)
        if self._joint is not None:
            group = getattr(request.sample, "group", None)
            r.sib = sum(1 for s in group.samples if s is not request.sample and s.finished) if group else 0
        self._reqs[r.rid] = r
        self._waiting.append(r)
        if not self._in_boundary:   # inside a boundary the batch is planned right after the callbacks
            self._wake()

    def abort(self, request_id: str) -> None:
        r = self._reqs.pop(request_id, None)
        if r is None:
            return
        ran = 0   # steps it ran since its last admission
        if r.state == WAITING:
            head = self._waiting[0] is r
            self._waiting.remove(r)
            r.state = GONE
            n, spec = r.done, r.spec
            if head and self._waiting:
                self._wake()   # the head held the queue (admission is in order): the next may fit at a boundary
        elif self._in_boundary:
            ran = self._step - r.s_adm
            self._remove_running(r, self._step)
            r.state = GONE
            n, spec = r.done, r.spec
        else:
            # mid-epoch: the tokens of the steps completed by now; it leaves at the next boundary
            now = self.clock.now()
            k = steps_within(now - self._t0, self._a, self._b, self._extra)
            # an epoch planned ahead (_wake) starts at the end of the step in flight, which self._step already
            # counts: that step's token is thrown away, as any in-flight step's of a request aborted mid-step
            ran = max(0, self._step + k - r.s_adm - (1 if now < self._t0 else 0))
            n = min(r.done + ran, r.max_tokens)
            # and of them, the steps that ran while drafting (in this epoch, if it drafts)
            since = [c - d + k * q for c, d, q in zip(self._cum, r.adm, self._rate)]
            if since[0] > ran:   # (the step in flight at an epoch planned ahead did not run)
                since = [x * ran / since[0] for x in since]
            spec = tuple(a + b for a, b in zip(r.spec, since))
            if k and r.first_t is None and r.s_adm == self._step:   # its first step ran in this epoch
                r.first_t = self._first_step_end()
            r.state = LEAVING
            self._leaving.append(r)
            self._wake()
        self._remember_aborted(r, n, ran)
        self.tokens += n
        self.clock.call_later(0.0, lambda: self._report_abort(r, n, spec))

    def _remember_aborted(self, r: SimRequest, n: int, ran: int) -> None:
        """Cache the whole blocks of an aborted request's computed context (its context after ``n`` tokens of this
        segment, less the last sampled token, which has no KV yet) if it ran a step since its last admission; a
        request that generated its last token leaves nothing to continue."""
        sample = r.sample
        if sample.num_generated + n >= sample.max_tokens:
            self._cache.pop(r.ckey, None)
        elif ran > 0:
            computed = sample.prompt_len + sample.num_generated + n - 1
            self._cache[r.ckey] = max(self._cache.get(r.ckey, 0), self._block * (computed // self._block))

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (vLLM's ``reset_prefix_cache``, which a weight update calls unless the KV
        cache is kept across it): the next segment of each sample prefills its whole context."""
        self._cache.clear()

    def _report_abort(self, r: SimRequest, n: int, spec: tuple[float, float, float]) -> None:
        if n:
            self._listener.on_tokens(self, r.rid, n, None, None, first_token_time_s=r.first_t)
        if self._spec is None:
            self._listener.on_segment_end(self, r.rid, ABORT)
        else:
            self._listener.on_segment_end(self, r.rid, ABORT, speculation=self._counts(spec))

    @staticmethod
    def _counts(spec: tuple[float, float, float]) -> tuple[int, int]:
        """A request's (drafted, accepted) tokens from its speculation sums."""
        return round(spec[2]), round(spec[1])
