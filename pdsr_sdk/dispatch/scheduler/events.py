"""The scheduler as its engines' listener (:class:`~pdsr_sdk.dispatch.protocols.EngineListener`): tokens, a
segment's end, an engine's death."""

from __future__ import annotations

from collections import deque
from typing import Callable, Sequence

from pdsr_sdk.dispatch.protocols import Engine
from pdsr_sdk.dispatch.scheduler.pause import Pausing
from pdsr_sdk.dispatch.scheduler.slots import Run
from pdsr_sdk.dispatch.scheduler.turns import Turns
from pdsr_sdk.dispatch.types import ABORT, FAILED, LENGTH, STOP, Sample
from pdsr_sdk.errors import EngineError


class EngineEvents(Pausing, Turns):
    """What engines report, and where each ended segment's sample goes next (``engine_errors`` set by
    :meth:`_init_events`)."""

    def _init_events(self, on_tokens: Callable[[Sample, int], None] | None = None) -> None:
        self.engine_errors: list[EngineError] = []
        # a sample's new tokens, once added to it (a server streams them to its client)
        self._on_tokens = on_tokens

    def on_tokens(self, engine: Engine, request_id: str, n: int,
                  token_ids: Sequence[int] | None, logprobs: Sequence[float] | None, *,
                  first_token_time_s: float | None = None) -> None:
        run = self._runs.get(request_id)
        if run is None or n <= 0:
            return
        sample = run.sample
        seg = sample.segments[-1]
        if seg.first_token_time_s is None:
            # the span's decode steps run from here on (`pdsr simulate calibrate` times them; v3 prices a
            # move's prefill by the wait); an engine that reports counts only at the end says when it was
            if first_token_time_s is not None:
                seg.first_token_time_s = first_token_time_s
            elif not getattr(engine, "counts_only", False):
                seg.first_token_time_s = self.clock.now()
        if sample.first_token_time_s is None:
            sample.first_token_time_s = (seg.first_token_time_s if seg.first_token_time_s is not None
                                         else self.clock.now())
        sample.add_tokens(n, token_ids, logprobs)
        usage = self.usage[engine.name]
        usage.tokens += n
        if self._on_tokens is not None:
            self._on_tokens(sample, n)

    def on_segment_end(self, engine: Engine, request_id: str, finish_reason: str, *,
                       speculation: tuple[int, int] | None = None, stop_reason: str | int | None = None) -> None:
        run = self._end_request(engine, request_id)
        if run is None:
            return
        # what ended the sample (or a multi-turn sample's latest turn); a segment that ends otherwise clears it
        run.sample.stop_reason = stop_reason if finish_reason == STOP else None
        if speculation is not None:
            seg = run.sample.segments[-1]
            seg.drafted_tokens, seg.accepted_tokens = speculation
        self.guarded(self._after_segment, run, finish_reason)
        self._go_on()

    def on_request_failed(self, engine: Engine, request_id: str, error: str) -> None:
        """The engine refused one request (vLLM's validation: an empty prompt, a token out of vocabulary, a
        context past its ``max_model_len``): its sample fails (finish reason ``failed``, ``sample.error`` saying
        why) and the engine goes on serving the others."""
        run = self._end_request(engine, request_id)
        if run is None:
            return
        sample = run.sample
        sample.segments[-1].end_reason = FAILED
        turns = sample.turns
        if turns and turns[-1].role == "assistant" and turns[-1].end_s is None:
            if turns[-1].num_tokens:   # a turn refused part-way (a later segment): it ended there
                turns[-1].end_s, turns[-1].finish_reason = self.clock.now(), FAILED
            else:   # a turn refused at its start never ran: a trainer counting turns would count an empty one
                turns.pop()
        sample.error = f"engine {engine.name!r} refused request {request_id}: {error}"[:2000]
        self.guarded(self._finish, sample, FAILED)
        self._go_on()

    def _end_request(self, engine: Engine, request_id: str) -> Run | None:
        """An ended request's run taken off the books (None if it is not running): its slot freed, its segment's
        end time set."""
        run = self._runs.pop(request_id, None)
        if run is None:
            return None
        del self._run_of[run.sample]
        self._release_slot(engine, request_id)
        run.sample.segments[-1].end_time_s = self.clock.now()
        return run

    def _go_on(self) -> None:
        """After a request ended: start what the freed slot can take, and finish a pause that was waiting for it."""
        self._pump()
        if self.paused is not None:
            self._check_drained()

    def on_engine_dead(self, engine: Engine, error: Exception) -> None:
        usage = self.usage[engine.name]
        if usage.dead:
            return
        usage.dead = True
        self._live[engine.pool] -= 1
        self._mark_idle(engine)
        err = error if isinstance(error, EngineError) else EngineError(engine.name, str(error))
        self.engine_errors.append(err)
        self.stats["engines_lost"] += 1
        requeued: list[Sample] = []
        for rid in list(self._running_on[engine.name]):
            run = self._runs.pop(rid, None)
            if run is None:
                continue   # a slot a parked sample held (hold_turn_slots): its next turn goes to the pool
            sample = run.sample
            del self._run_of[sample]
            sample.segments[-1].end_time_s = self.clock.now()
            sample.segments[-1].end_reason = "engine_dead"
            sample.retries += 1
            self.stats["retries"] += 1
            intent = run.intent if run.intent and run.intent[0] != "pause" else None
            if intent and intent[0] == "finish":
                self._finish(sample, intent[1])
                continue
            target = intent[1] if intent else (run.stolen_from or engine.pool)
            requeued.append(sample)
            self._enqueue(sample, target, None, intent[3] if intent else sample.cap, True,
                          check_live=False)
        self._running_on[engine.name].clear()
        for item in self._engine_queues.pop(engine.name, deque()):
            del self._where[item.sample]
            requeued.append(item.sample)
            self._enqueue(item.sample, engine.pool, None, item.cap, False, check_live=False)
        if not self._live[engine.pool]:
            self._on_fatal(EngineError(
                engine.name,
                f"died and no live engine is left in pool {engine.pool!r} to take its "
                f"{len(requeued)} unfinished request(s); the engine's error: {err.message}",
                exit_status=err.exit_status, remote_traceback=err.remote_traceback))
            return
        self.guarded(self.policy.on_engine_lost, engine, requeued)
        self._pump()
        if self.paused is not None:
            self._check_drained()

    def _after_segment(self, run: Run, reason: str) -> None:
        sample, engine = run.sample, run.engine
        seg = sample.segments[-1]
        if sample.turns is not None and self._on_turn_end is not None and (
                reason == STOP or sample.num_generated >= min(sample.max_tokens, sample.turn_end or sample.max_tokens)):
            # a forced sample (a replayed trace of turns) ends each turn as recorded: the model's end of turn
            self._end_turn(run, STOP if reason == STOP or sample.forced else LENGTH)
            return
        if reason == STOP:
            seg.end_reason = STOP
            self._finish(sample, STOP)
            return
        if sample.num_generated >= sample.max_tokens:
            seg.end_reason = LENGTH
            self._finish(sample, self._final_length_reason(sample))
            return
        if run.intent is not None and run.intent[0] == "pause":
            seg.end_reason = "pause"
            self._held[sample] = run
            return
        if run.intent is not None:
            seg.end_reason = "moved" if run.intent[0] == "queue" else run.intent[1]
            if run.intent[0] == "finish":
                self._finish(sample, run.intent[1])
            else:
                _, pool, target_engine, cap, restart = run.intent
                if restart:
                    self._restart(sample)
                self._enqueue(sample, pool, target_engine, cap, False)
            return
        if reason == ABORT:
            # An abort nobody asked for (engine-side); run it again where it was.
            seg.end_reason = ABORT
            self._enqueue(sample, run.stolen_from or engine.pool, None, sample.cap, True)
            return
        self._next_segment(run, mark=True)
