"""What bench/spec.py records of a run on real engines: each request's launch, streamed chunks and per-request
speculation metrics (a ``VllmEngine`` observer), and the engines' speculation counters summed."""

from __future__ import annotations

import time
from typing import Any, Sequence

from spec_accounting import Segment


class Recorder:
    """Observes each started engine (``VllmEngine.observer``): every request's launch (sample, position, finished
    siblings), streamed chunks and per-request speculation metrics, and a running token count for the tail snapshot."""

    def __init__(self, rule: str | None = None) -> None:
        self.rule = rule   # group: the draft rule the requests name (None: the engine's default)
        self.tokens = 0
        self.segments: dict[str, Segment] = {}

    def attach(self, engine: Any) -> None:
        """Record ``engine``'s requests here from now on (a ``VllmEngine``: this recorder becomes its observer)."""
        engine.observer = self

    def on_launch(self, request: Any, extra: dict[str, Any] | None) -> dict[str, Any] | None:
        sample = request.sample
        group = getattr(sample, "group", None)
        fin = sum(1 for s in group.samples if s is not sample and s.finished) if group is not None else 0
        prompt_len = getattr(sample, "prompt_len", request.context_len)
        self.segments[request.request_id] = Segment(start=max(request.context_len - prompt_len, 0),
                                                    finished_siblings=fin)
        if self.rule is not None and extra:
            from pdsr_sdk.engines.group_drafter import EXTRA_KEY

            extra = {**extra, EXTRA_KEY: {**extra[EXTRA_KEY], "rule": self.rule}}
        return extra

    def on_output(self, request_id: str, out: Any) -> None:
        seg = self.segments.get(request_id)
        comp = out.outputs[0]
        n = len(comp.token_ids or ())
        if n:
            self.tokens += n
            if seg is not None:
                seg.chunks.append(n)
                seg.times.append(time.perf_counter())
        if out.finished and seg is not None:
            seg.finished = True
            m = getattr(comp, "spec_decode_metrics", None)
            if m is not None:
                seg.drafted = list(getattr(m, "per_step_drafted", None) or ())
                seg.accepted = list(getattr(m, "per_step_accepted", None) or ())
                if not seg.drafted and sum(getattr(m, "histogram", ()) or ()):
                    seg.drafted = seg.accepted = None   # summary level only: no per-step arrays


def engine_totals(engines: Sequence[Any]) -> dict[str, int]:
    from pdsr_sdk.engines.vllm_stats import SPECULATION_KEYS

    tot = dict.fromkeys(SPECULATION_KEYS, 0)
    for e in engines:
        for k, v in e.speculation_stats().items():
            tot[k] += int(v)
    return tot
