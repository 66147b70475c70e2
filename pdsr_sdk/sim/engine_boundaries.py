"""The step boundaries of :class:`~pdsr_sdk.sim.engine.SimEngine` (its rules are in that module's docstring):
when the next event falls, what ends, leaves, is preempted and is admitted at one, and the price of the steps up to
the next."""

from __future__ import annotations

import heapq
from bisect import bisect_right

from pdsr_sdk.dispatch.types import LENGTH
from pdsr_sdk.sim.cost import drafting, overflow_step, speculation_scale, steps_time, steps_within, uncached_tokens
from pdsr_sdk.sim.engine_request import GONE, RUNNING, WAITING, SimRequest


class StepBoundaries:
    """The event loop of :class:`~pdsr_sdk.sim.engine.SimEngine`, a mixin of it (one state machine in two files:
    ``submit``, ``abort`` and ``load`` call in through :meth:`_wake`, :meth:`_remove_running`,
    :meth:`_first_step_end` and :meth:`_total_blocks`).

    Relies on what ``SimEngine.__init__`` sets: ``clock``, ``max_concurrency``, the cost terms ``_c0``, ``_c1``,
    ``_c2``, ``_p``, ``_block``, ``_kv``, ``_spec``, ``_pos_starts``, ``_pos_width``, ``_joint``, ``_record``,
    ``_listener``, and its :meth:`_counts`. Sets (all initialised there): the batch ``_running``, ``_waiting``,
    ``_reqs``, ``_heap``, ``_leaving``, ``_admitted``, ``_cache``, ``_prompt_refs``, ``_seq``; the epoch ``_step``,
    ``_t0``, ``_a``, ``_b``, ``_extra``, ``_sum_off``, ``_sum_q``, ``_res``, ``_pending_prefill``; the timer
    ``_timer``, ``_timer_step``, ``_in_boundary``, ``_call_at``; speculation's ``_drafting``, ``_rate``, ``_cum``;
    and the statistics ``busy_s``, ``steps``, ``tokens``, ``preemptions``, ``drafted_tokens``, ``prefill_tokens``,
    ``occupancy_t``, ``occupancy_n``.
    """

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
            if r.state == RUNNING and r.s_adm == self._step and r.first_t is None:
                r.first_t = t
        self._admitted.clear()

    def _next_end(self) -> int:
        """The step at which the first running request finishes (dropping stale heap entries)."""
        heap = self._heap
        while True:
            end, seq, r = heap[0]
            if r.seq == seq and r.state == RUNNING:
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
            if r.seq == seq and r.state == RUNNING:
                finished.append(r)
        if self._leaving:
            for r in self._leaving:
                self._remove_running(r, S)
                r.state = GONE
            self._leaving.clear()
        if finished:
            block = self._block
            cache = self._cache
            reqs = self._reqs
            for r in finished:
                self._remove_running(r, S)
                r.state = GONE
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

    def _remove_running(self, r: SimRequest, S: int) -> None:
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

    def _admit(self, w: SimRequest, S: int) -> None:
        self._seq += 1
        w.seq = self._seq
        w.s_adm = S
        w.adm = self._cum
        w.off = off = w.ctx - S
        q, res = divmod(off, self._block)
        self._sum_off += off
        self._sum_q += q
        self._res[res] += 1
        w.state = RUNNING
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

    def _preempt(self, v: SimRequest, S: int) -> None:
        self._remove_running(v, S)
        v.ctx = v.off + S
        v.state = WAITING
        self._cache.pop(v.ckey, None)
        self._waiting.appendleft(v)
        self.preemptions += 1
