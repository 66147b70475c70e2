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

import heapq
from bisect import bisect_right
from collections import deque

from pdsr_sdk.dispatch.types import ABORT, LENGTH, EngineLoad
from pdsr_sdk.errors import EngineError
from pdsr_sdk.sim.config import EngineProfile
from pdsr_sdk.sim.cost import drafting, overflow_step, speculation_scale, steps_time, steps_within, uncached_tokens

_WAITING, _RUNNING, _LEAVING, _GONE = 0, 1, 2, 3


class _Req:
    __slots__ = ("rid", "sample", "ctx", "max_tokens", "done", "s_adm", "off", "seq", "state", "prefill", "prompt",
                 "first_t", "ckey", "adm", "spec", "sib")

    def __init__(self, rid: str, sample, ctx: int, max_tokens: int, prompt, salt: str | None = None):
        self.rid = rid
        self.sample = sample
        self.prompt = prompt      # the prompt's identity for the prompt cache (None: not shared)
        # its sample's key in the prefix cache: blocks cached under another salt are not found
        self.ckey = sample if salt is None else (sample, salt)
        self.ctx = ctx            # context (prompt + generated) when last admitted / now if waiting
        self.max_tokens = max_tokens
        self.done = 0             # tokens of this segment generated before its current admission
        self.s_adm = 0            # global step at which it was (last) admitted
        self.off = 0              # ctx - s_adm: its context at global step S is S + off
        self.seq = 0              # admission number (running order; heap entries of older admissions are stale)
        self.state = _WAITING
        self.prefill = 0          # uncached tokens prefilled at its admission
        self.first_t = None       # when the step that prefilled it (and sampled its first token) ended
        self.adm = (0.0, 0.0, 0.0)   # the engine's speculation sums (SimEngine._cum) at its last admission
        self.spec = (0.0, 0.0, 0.0)  # its own, before its current admission: drafting steps, accepted, drafted
        self.sib = 0                 # its sample's siblings finished when it was submitted (their draft corpus)


class SimEngine:
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
        self._max_ctx = min(p.max_model_len, self._kv * self._block)
        self._record = record
        self._listener = None
        self._running: dict[str, _Req] = {}
        self._waiting: deque[_Req] = deque()
        self._reqs: dict[str, _Req] = {}
        self._heap: list[tuple[int, int, _Req]] = []
        self._leaving: list[_Req] = []
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
        self._admitted: list[_Req] = []        # requests admitted at the current step (their first step not run)
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
        r = _Req(request.request_id, request.sample, ctx, n, prompt, salt)
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
        if r.state == _WAITING:
            head = self._waiting[0] is r
            self._waiting.remove(r)
            r.state = _GONE
            n, spec = r.done, r.spec
            if head and self._waiting:
                self._wake()   # the head held the queue (admission is in order): the next may fit at a boundary
        elif self._in_boundary:
            ran = self._step - r.s_adm
            self._remove_running(r, self._step)
            r.state = _GONE
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
            r.state = _LEAVING
            self._leaving.append(r)
            self._wake()
        self._remember_aborted(r, n, ran)
        self.tokens += n
        self.clock.call_later(0.0, lambda: self._report_abort(r, n, spec))

    def _remember_aborted(self, r: _Req, n: int, ran: int) -> None:
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

    def _report_abort(self, r: _Req, n: int, spec: tuple[float, float, float]) -> None:
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

    def _advance(self, k: int) -> None:
        """``k`` steps of the current epoch have run: count what drafting did in them."""
        if self._drafting:
            self.drafted_tokens += k * len(self._running)
            self._cum = tuple(c + k * q for c, q in zip(self._cum, self._rate))

    # ------------------------------------------------------------ the events
    def _wake(self) -> None:
        """Make sure a boundary is processed at the first step boundary at or after now."""
        now = self.clock.now()
        if self._running:
            k = steps_within(now - self._t0, self._a, self._b, self._extra)
            when = self._t0 + steps_time(k, self._a, self._b, self._extra)
            if when < now:
                k += 1
                when = self._t0 + steps_time(k, self._a, self._b, self._extra)
            target = self._step + k
            timer = self._timer
            if (not self._leaving and timer is not None and self._timer_step > target
                    and self._next_end() > target):
                # Nothing happens at that boundary but the admission: plan it now instead of
                # firing an event there (streaming policies submit mid-step all the time).
                # The new epoch starts at `when`, possibly after now; nothing runs before it.
                self.busy_s += when - self._t0
                if target > self._step:
                    self.steps += target - self._step
                    self._advance(target - self._step)
                    self._first_step_ran()
                self._step, self._t0 = target, when
                self._plan()
                return
        else:
            target, when = self._step, now
        if self._timer is not None:
            if self._timer_step <= target:
                return
            self._timer.cancel()
        self._set_timer(when, target)

    def _first_step_end(self) -> float:
        """When the current epoch's first step (the one that prefills what it admitted) ends."""
        return self._t0 + self._extra + self._a

    def _first_step_ran(self) -> None:
        """The epoch's first step has run: its prefill is done, and the requests it admitted have their first
        token (reported as the span's ``first_token_time_s``, as a real engine's stream shows it; v3 prices a
        move's prefill by it)."""
        self._pending_prefill = 0
        t = self._first_step_end()
        for r in self._admitted:
            if r.state == _RUNNING and r.s_adm == self._step and r.first_t is None:
                r.first_t = t
        self._admitted.clear()

    def _next_end(self) -> int:
        """The step at which the first running request finishes (dropping stale heap entries)."""
        heap = self._heap
        while True:
            end, seq, r = heap[0]
            if r.seq == seq and r.state == _RUNNING:
                return end
            heapq.heappop(heap)

    def _set_timer(self, when: float, step: int) -> None:
        self._timer_step = step
        call_at = self._call_at
        if call_at is None:
            call_at = self._call_at = getattr(self.clock, "call_at", None) or self._call_at_fallback
        self._timer = call_at(when, self._on_timer)

    def _call_at_fallback(self, when: float, callback):
        return self.clock.call_later(when - self.clock.now(), callback)

    def _on_timer(self) -> None:
        """A step boundary: drop leavers, end finished segments (callbacks may submit/abort), replan."""
        self._timer = None
        S = self._timer_step
        now = self.clock.now()
        if self._running:
            self.busy_s += now - self._t0
            if S > self._step:
                self.steps += S - self._step
                self._advance(S - self._step)
                self._first_step_ran()
        self._step = S
        self._t0 = now
        heap = self._heap
        finished = []
        while heap and heap[0][0] <= S:
            _, seq, r = heapq.heappop(heap)
            if r.seq == seq and r.state == _RUNNING:
                finished.append(r)
        if self._leaving:
            for r in self._leaving:
                self._remove_running(r, S)
                r.state = _GONE
            self._leaving.clear()
        if finished:
            block = self._block
            cache = self._cache
            reqs = self._reqs
            for r in finished:
                self._remove_running(r, S)
                r.state = _GONE
                del reqs[r.rid]
                sample = r.sample
                if sample.num_generated + r.done >= sample.max_tokens:   # its last token: nothing to continue
                    cache.pop(r.ckey, None)
                else:   # whole blocks of the computed context (the last sampled token has no KV yet)
                    cache[r.ckey] = block * ((r.off + S - 1) // block)
            self._in_boundary = True
            try:
                listener = self._listener
                for r in finished:
                    self.tokens += r.done
                    listener.on_tokens(self, r.rid, r.done, None, None, first_token_time_s=r.first_t)
                    if self._spec is None:
                        listener.on_segment_end(self, r.rid, LENGTH)
                    else:
                        listener.on_segment_end(self, r.rid, LENGTH, speculation=self._counts(r.spec))
            finally:
                self._in_boundary = False
        self._plan()

    def _remove_running(self, r: _Req, S: int) -> None:
        del self._running[r.rid]
        if r.prompt is not None:
            refs = self._prompt_refs[r.prompt] - 1
            if refs:
                self._prompt_refs[r.prompt] = refs
            else:
                del self._prompt_refs[r.prompt]
        q, res = divmod(r.off, self._block)
        self._sum_off -= r.off
        self._sum_q -= q
        self._res[res] -= 1
        if r.s_adm == S:   # removed before its first step ran: its prefill never happened
            self._pending_prefill -= r.prefill
            self.prefill_tokens -= r.prefill
        r.done += S - r.s_adm
        # (callers remove at the current step, S == self._step)
        r.spec = tuple(a + c - d for a, c, d in zip(r.spec, self._cum, r.adm))

    def _total_blocks(self, S: int) -> int:
        """Blocks the running requests need for the step at global step S (exact, O(block))."""
        block = self._block
        total = self._sum_q
        res = self._res
        for r in range(block):
            if res[r]:
                total += res[r] * ((S + r + block - 1) // block)
        return total

    def _plan(self) -> None:
        """At a boundary: preempt if the KV cache overflows, admit waiting requests, time the next event."""
        S = self._step
        block, kv = self._block, self._kv
        running = self._running
        total = None
        preempted = False
        if running and (self._sum_off + len(running) * (S + block - 1)) // block > kv:  # cheap upper bound first
            total = self._total_blocks(S)
            while total > kv:
                victim = running[next(reversed(running))]
                total -= -(-(victim.off + S) // block)
                self._preempt(victim, S)
                preempted = True
        waiting = self._waiting
        if waiting and not preempted:
            max_seqs = self.max_concurrency
            while waiting and len(running) < max_seqs:
                w = waiting[0]
                need = -(-w.ctx // block)
                if total is None and (self._sum_off + len(running) * (S + block - 1)) // block + need > kv:
                    total = self._total_blocks(S)
                if total is not None:
                    if total + need > kv:
                        break
                    total += need
                waiting.popleft()
                self._admit(w, S)
        R = len(running)
        if self._record and R != self.occupancy_n[-1]:
            self.occupancy_t.append(self._t0)
            self.occupancy_n.append(R)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if R == 0:
            self._a = self._b = self._extra = 0.0
            return
        c2 = self._c2
        self._a = a = self._c0 + self._c1 * R + c2 * (self._sum_off + R * S)
        self._b = b = c2 * R
        self._drafting = False
        self._rate = (0.0, 0.0, 0.0)
        end = target = self._next_end()
        if self._spec is not None:   # a verify step's cost spread over the tokens it yields (one "step" = a token)
            spec = self._spec
            y, load = spec.tokens_per_step, spec.draft_load
            if self._pos_starts is not None and R <= spec.max_batch:
                y, load = self._acceptance_along(S)
                target = min(target, (S // self._pos_width + 1) * self._pos_width)   # the next cell: again
            m = speculation_scale(R, y, spec.verify_cost, spec.max_batch, load)
            self._a = a = a * m
            self._b = b = b * m
            self._drafting = drafting(R, y, spec.max_batch)
            if self._drafting:
                self._rate = (1.0, 1.0 - 1.0 / y, load * spec.num_speculative_tokens / y)
        self._extra = extra = self._p * self._pending_prefill
        # the KV cache can overflow before `end` only if the context then may need more blocks than there are
        if end - 1 > S and (self._sum_off + R * (end - 1 + block - 1)) // block > kv:
            if total is None:
                total = self._total_blocks(S)
            ovf = overflow_step(kv - total, self._res, S, block)
            if ovf < target:
                target = ovf
        self._set_timer(self._t0 + steps_time(target - S, a, b, extra), target)

    def _acceptance_along(self, S: int) -> tuple[float, float]:
        """(tokens_per_step, draft_load) of the running requests, each from the ``by_position`` row of its
        response position at the middle of the current cell of ``position_width`` global steps (or the joint row
        of that bin and its finished siblings, where there is one), averaged."""
        width = self._pos_width
        mid = (S // width) * width + width // 2
        starts, rows, joint = self._pos_starts, self._spec.by_position, self._joint
        ys = loads = 0.0
        for r in self._running.values():
            pos = r.sample.num_generated + r.done + mid - r.s_adm
            row = rows[max(0, bisect_right(starts, pos) - 1)]
            y, d = row[1], row[2]
            if joint is not None:
                y, d = joint.get((row[0], r.sib), (y, d))
            ys += y
            loads += d
        R = len(self._running)
        return ys / R, loads / R

    def _admit(self, w: _Req, S: int) -> None:
        self._seq += 1
        w.seq = self._seq
        w.s_adm = S
        w.adm = self._cum
        w.off = off = w.ctx - S
        q, res = divmod(off, self._block)
        self._sum_off += off
        self._sum_q += q
        self._res[res] += 1
        w.state = _RUNNING
        self._running[w.rid] = w
        cached = self._cache.get(w.ckey, 0)
        if w.prompt is not None:
            refs = self._prompt_refs.get(w.prompt, 0)
            if refs:
                cached = max(cached, self._block * (w.sample.prompt_len // self._block))
            self._prompt_refs[w.prompt] = refs + 1
        w.prefill = uncached_tokens(w.ctx, cached, self._block)
        self._admitted.append(w)
        self._pending_prefill += w.prefill
        self.prefill_tokens += w.prefill
        heapq.heappush(self._heap, (S + w.max_tokens - w.done, w.seq, w))

    def _preempt(self, v: _Req, S: int) -> None:
        self._remove_running(v, S)
        v.ctx = v.off + S
        v.state = _WAITING
        self._cache.pop(v.ckey, None)
        self._waiting.appendleft(v)
        self.preemptions += 1
