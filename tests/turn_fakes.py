"""A fake engine for multi-turn samples: each turn samples a fixed number of tokens, then ends it (STOP), and
every request's context is checked to be the prompt plus the sample's response so far, exactly."""

from __future__ import annotations

import zlib

from pdsr_sdk.dispatch.types import LENGTH, STOP, EngineLoad


def sampled_token(key: str, i: int) -> int:
    """The fake model's token at response position ``i`` of sample ``key`` (ids 3-502: plain tokens)."""
    return zlib.crc32(f"{key}/{i}".encode()) % 500 + 3


def turn_length(sample) -> int:
    return 5 + 3 * sample.index + 7 * (sample.group.position % 3)


class FakeEngine:
    """What the in-process fake engines share: nothing to start or close, the listener bound, and each request's
    context checked to be the sample's prompt plus its response so far, exactly."""

    async def start(self):
        pass

    async def close(self):
        pass

    def bind(self, listener):
        self.listener = listener

    @staticmethod
    def check_context(req) -> None:
        s = req.sample
        assert req.context_ids == s.group.prompt_token_ids + s.token_ids, "context is not the trajectory"


class TurnEngine(FakeEngine):
    """Samples ``turn_length(sample)`` tokens per turn (the last one ``eos`` when given), one per ``token_time``."""

    counts_only = False

    def __init__(self, name, pool, clock, conc=4, token_time=0.01, eos: int | None = None):
        self.name, self.pool, self.clock = name, pool, clock
        self.max_concurrency, self.segment_capacity_tokens, self.kv_cache_tokens = conc, 4096, None
        self.token_time = token_time
        self.eos = eos
        self.running: dict[str, dict] = {}
        self.requests: list = []

    @classmethod
    def from_spec(cls, spec, **_):
        import asyncio

        from pdsr_sdk.dispatch.clock import LoopClock

        engine = cls(spec.name, spec.pool, LoopClock(asyncio.get_running_loop()), conc=spec.max_num_seqs,
                     token_time=0.001, eos=2)
        engine.spec = spec   # its max_model_len bounds what a server accepts
        return engine

    def submit(self, req):
        self.check_context(req)
        s = req.sample
        mask = s.response_mask or []
        in_turn = mask[::-1].index(0) if 0 in mask else len(mask)
        left = turn_length(s) - in_turn
        n = min(req.max_tokens, left)
        entry = {"req": req, "n": n, "reason": STOP if n == left else LENGTH, "pos": s.num_generated,
                 "eos": n == left}
        entry["timer"] = self.clock.call_later(n * self.token_time, lambda rid=req.request_id: self._end(rid))
        self.running[req.request_id] = entry
        self.requests.append(req)

    def _end(self, rid):
        e = self.running.pop(rid)
        s = e["req"].sample
        ids = [sampled_token(s.key, e["pos"] + i) for i in range(e["n"])]
        if e["eos"] and self.eos is not None:
            ids[-1] = self.eos
        self.listener.on_tokens(self, rid, e["n"], ids, [-0.25] * e["n"])
        self.listener.on_segment_end(self, rid, e["reason"])

    def abort(self, rid):
        e = self.running.pop(rid, None)
        if e is not None:
            e["timer"].cancel()
            self.clock.call_later(0.0, lambda: self.listener.on_segment_end(self, rid, "abort"))

    def load(self):
        return EngineLoad(running=len(self.running))


#: a token id in the tiny model's vocabulary that :class:`RefusingTurnEngine` refuses
REFUSED_ID = 999


class RefusingTurnEngine(TurnEngine):
    """A :class:`TurnEngine` that refuses, as vLLM's request validation does, every request whose context holds
    :data:`REFUSED_ID`: its sample fails and the engine goes on serving the others."""

    def submit(self, req):
        if REFUSED_ID in req.context_ids:
            self.clock.call_later(0.0, lambda rid=req.request_id: self.listener.on_request_failed(
                self, rid, f"VLLMValidationError: token {REFUSED_ID} refused"))
            return
        super().submit(req)


class StopTurnEngine(TurnEngine):
    """A :class:`TurnEngine` whose turns that end (not at a limit) report ``STOP_REASON`` as vLLM's
    ``stop_reason`` (a stop string or stop token id: a test sets it), and end with no EOS token; with
    ``TURN_IDS`` set, a turn samples them over and over instead (a text that holds the stop string)."""

    STOP_REASON: str | int | None = None
    TURN_IDS: list[int] | None = None

    def _end(self, rid):
        e = self.running.pop(rid)
        s = e["req"].sample
        ids = [sampled_token(s.key, e["pos"] + i) for i in range(e["n"])]
        if self.TURN_IDS:
            ids = [self.TURN_IDS[i % len(self.TURN_IDS)] for i in range(e["n"])]
        self.listener.on_tokens(self, rid, e["n"], ids, [-0.25] * e["n"])
        self.listener.on_segment_end(self, rid, e["reason"], stop_reason=self.STOP_REASON if e["eos"] else None)
