"""A fake engine that reports each token as it makes it, for ``pdsr serve``'s streams (backend
``stream_fakes:ScriptEngine``; tests/rollout/test_serve_stream_held.py). Its responses follow a script the test
sets, and it can hold a response part-way until the test releases it, or die with responses held: a test orders
events by what it reads, never by time."""

from __future__ import annotations

import asyncio
import threading

from pdsr_sdk.dispatch.types import ABORT, LENGTH, STOP, EngineLoad
from pdsr_sdk.errors import EngineError
from turn_fakes import FakeEngine


class ScriptEngine(FakeEngine):
    """Response token ``p`` of a turn is ``script[p % len(script)]``, one per loop turn (``burst`` at a time).
    With ``ends``, a turn ends ``stop`` after the script's last token (``stop_reason``: vLLM's, the stop string the
    script ends with); else it runs to its request's ``max_tokens``. ``hold(p)``: the next response to reach token
    ``p`` waits there (``held`` is set; :meth:`wait_held` counts them) until :meth:`release`; :meth:`die` ends the
    engine as a crash would."""

    counts_only = False

    def __init__(self, name: str, pool: str, conc: int = 4):
        self.name, self.pool = name, pool
        self.max_concurrency, self.segment_capacity_tokens, self.kv_cache_tokens = conc, 4096, None
        self.script: list[int] = [5]
        self.ends = False
        self.stop_reason: str | int | None = None
        self.burst = 1
        self.hold_at: int | None = None
        self.held = threading.Event()
        self._holding = threading.Condition()
        self.n_held = 0   # responses waiting at hold_at now
        self.running: dict[str, dict] = {}
        self.listener = None
        self.loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_spec(cls, spec, **_):
        engine = cls(spec.name, spec.pool, conc=spec.max_num_seqs)
        engine.spec = spec   # its max_model_len bounds what a server accepts
        engine.loop = asyncio.get_running_loop()
        return engine

    def play(self, script: list[int], *, ends: bool = False, stop_reason: str | int | None = None,
             burst: int = 1) -> None:
        """Answer every turn from now on with ``script`` (set from the test's thread before its request)."""
        self.script, self.ends, self.stop_reason, self.burst = list(script), ends, stop_reason, burst

    def hold(self, at: int) -> None:
        self.held.clear()
        self.hold_at = at

    def release(self) -> None:
        """Let the held response go on (from any thread)."""
        self.loop.call_soon_threadsafe(self._release)

    def _release(self) -> None:
        self.hold_at = None
        self._count_held(-self.n_held)
        for rid, run in list(self.running.items()):
            if run.pop("waiting", False):
                self._next(rid)

    def wait_held(self, k: int, timeout: float) -> bool:
        """Whether ``k`` responses wait at the hold within ``timeout`` seconds (from the test's thread)."""
        with self._holding:
            return self._holding.wait_for(lambda: self.n_held >= k, timeout)

    def _count_held(self, k: int) -> None:
        with self._holding:
            self.n_held += k
            self._holding.notify_all()

    def die(self) -> None:
        """Crash (from any thread): every running response is lost and the scheduler hears the engine died."""
        self.loop.call_soon_threadsafe(self._die)

    def _die(self) -> None:
        self.running.clear()
        self._count_held(-self.n_held)
        self.listener.on_engine_dead(self, EngineError(self.name, "killed by the test", exit_status=-9))

    def submit(self, req) -> None:
        self.check_context(req)
        s = req.sample
        mask = s.response_mask or []
        turn_pos = (mask[::-1].index(0) if 0 in mask else len(mask)) if s.response_mask is not None \
            else s.num_generated
        self.running[req.request_id] = {"pos": turn_pos, "left": req.max_tokens}
        self.loop.call_soon(self._next, req.request_id)

    def _next(self, rid: str) -> None:
        """Emit the response's next tokens, or end it; then come back next loop turn."""
        run = self.running.get(rid)
        if run is None:
            return
        if self.hold_at is not None and run["pos"] >= self.hold_at:
            run["waiting"] = True
            self.held.set()
            self._count_held(1)
            return
        k = min(self.burst, run["left"])
        if self.hold_at is not None:
            k = min(k, self.hold_at - run["pos"])
        if self.ends:
            k = min(k, len(self.script) - run["pos"] % len(self.script))
        ids = [self.script[(run["pos"] + i) % len(self.script)] for i in range(k)]
        run["pos"] += k
        run["left"] -= k
        self.listener.on_tokens(self, rid, k, ids, [-0.5] * k)
        if self.ends and run["pos"] % len(self.script) == 0:
            del self.running[rid]
            self.listener.on_segment_end(self, rid, STOP, stop_reason=self.stop_reason)
        elif not run["left"]:
            del self.running[rid]
            self.listener.on_segment_end(self, rid, LENGTH)
        else:
            self.loop.call_soon(self._next, rid)

    def abort(self, rid: str) -> None:
        run = self.running.pop(rid, None)
        if run is not None:
            if run.get("waiting"):
                self._count_held(-1)
            self.loop.call_soon(lambda: self.listener.on_segment_end(self, rid, ABORT))

    def load(self) -> EngineLoad:
        return EngineLoad(running=len(self.running))
