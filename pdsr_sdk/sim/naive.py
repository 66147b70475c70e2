"""The naive twin of :class:`pdsr_sdk.sim.engine.SimEngine`: the same rules, one step at a time.

No heaps, no closed forms, no virtual clock: a loop that runs the engine
step by step, summing step times in float64, re-counting KV blocks from
scratch at every boundary. Tests feed the same script to both and compare
every segment's end time and token count.

A script is a list of :class:`NaiveJob`: a sample arriving at ``arrival_s``
with a prompt of ``prompt_len`` tokens that generates ``segments`` (token
counts) one after another on this engine, each continuation submitted the
moment the previous segment ends; optionally its current segment is aborted
at ``abort_s`` (and the job ends there). Jobs with the same ``prompt`` share its
whole blocks while one of them runs (``prompt_cache``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from pdsr_sdk.sim.cost import speculation_scale_naive


@dataclass
class NaiveJob:
    key: str
    arrival_s: float
    prompt_len: int
    segments: list[int]
    abort_s: float | None = None
    #: the prompt's identity (jobs of one prompt have the same prompt_len); None: the job's own key
    prompt: str | None = None
    #: per segment, the sample's siblings finished when it is submitted (speculation's by_position_and_siblings)
    finished_siblings: list[int] | None = None


class _R:
    def __init__(self, j: int, seg: int, ctx: int, n: int):
        self.j, self.seg, self.ctx, self.remaining = j, seg, ctx, n
        self.done = 0
        self.prefill = 0
        self.leaving = False
        self.first: float | None = None   # end of its first step (its first token)
        self.accepted = 0.0               # speculation: drafted tokens accepted, and drafted, summed step by step
        self.drafted = 0.0


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def naive_replay(profile, jobs: list[NaiveJob], first_tokens: dict[str, list[float | None]] | None = None,
                 speculation: dict[str, list[tuple[int, int]]] | None = None
                 ) -> dict[str, list[tuple[str, float, int]]]:
    """Per job key, its segment ends in order: ``(reason, time_s, tokens)`` with reason ``length`` or ``abort``.
    ``first_tokens``, if given, receives per job key the time each segment that produced tokens sampled its
    first one; ``speculation``, per job key and segment end, its (drafted, accepted) tokens, rounded."""
    B, kv, M = profile.block_size, profile.kv_blocks, profile.max_num_seqs
    c0, c1, c2, p = profile.c0_s, profile.c1_s_per_seq, profile.c2_s_per_token, profile.prefill_s_per_token
    events = sorted([(job.arrival_s, 0, j) for j, job in enumerate(jobs)]
                    + [(job.abort_s, 1, j) for j, job in enumerate(jobs) if job.abort_s is not None])
    out: dict[str, list[tuple[str, float, int]]] = {job.key: [] for job in jobs}
    running: list[_R] = []
    waiting: deque[_R] = deque()
    cache: dict[int, int] = {}
    current: dict[int, _R] = {}

    def prompt(j: int) -> str:
        return jobs[j].prompt or jobs[j].key

    def handle(time: float, kind: int, j: int) -> None:
        if kind == 0:
            r = _R(j, 0, jobs[j].prompt_len, jobs[j].segments[0])
            waiting.append(r)
            current[j] = r
            return
        r = current.pop(j, None)
        if r is None:
            return
        if r in waiting:
            waiting.remove(r)
        else:
            r.leaving = True   # still runs the step in flight; its token is thrown away
        out[jobs[j].key].append(("abort", time, r.done))
        if speculation is not None:
            speculation.setdefault(jobs[j].key, []).append((round(r.drafted), round(r.accepted)))
        if first_tokens is not None and r.done:
            first_tokens.setdefault(jobs[j].key, []).append(r.first)
        cache.pop(j, None)

    def plan() -> None:
        preempted = False
        while sum(_ceil(r.ctx, B) for r in running) > kv:
            victim = running.pop()          # the newest running request
            victim.prefill = 0
            cache.pop(victim.j, None)
            waiting.appendleft(victim)
            preempted = True
        if preempted:
            return
        while waiting and len(running) < M:
            w = waiting[0]
            if sum(_ceil(r.ctx, B) for r in running) + _ceil(w.ctx, B) > kv:
                break
            waiting.popleft()
            cached = cache.get(w.j, 0)
            if profile.prompt_cache and any(prompt(r.j) == prompt(w.j) for r in running):
                cached = max(cached, B * (jobs[w.j].prompt_len // B))
            cached = min(cached, B * ((w.ctx - 1) // B))
            w.prefill = w.ctx - cached
            running.append(w)

    def acceptance(spec, running: list[_R], step: int) -> tuple[float, float]:
        """(tokens_per_step, draft_load) of this step: with by_position, each running request's row at its
        response position at the middle of the step's cell of position_width steps, averaged."""
        if spec.by_position is None or len(running) > spec.max_batch:
            return spec.tokens_per_step, spec.draft_load
        width = spec.position_width
        mid = (step // width) * width + width // 2
        ys, loads = [], []
        for r in running:
            job = jobs[r.j]
            pos = sum(job.segments[:r.seg]) + r.done + mid - step
            row = spec.by_position[0]
            for candidate in spec.by_position:
                if candidate[0] <= pos:
                    row = candidate
            y, d = row[1], row[2]
            sib = job.finished_siblings[r.seg] if job.finished_siblings else 0
            for p, f, jy, jd in spec.by_position_and_siblings or ():
                if (p, f) == (row[0], sib):
                    y, d = jy, jd
            ys.append(y)
            loads.append(d)
        return sum(ys) / len(ys), sum(loads) / len(loads)

    t = 0.0
    i = 0
    step = 0   # steps run (the engine's global step count)
    while True:
        if not running:
            if waiting:
                raise AssertionError("an idle engine with waiting requests")
            if i == len(events):
                break
            t = events[i][0]
            while i < len(events) and events[i][0] == t:
                handle(*events[i])
                i += 1
            plan()
            continue
        spec = profile.speculation
        y, load = acceptance(spec, running, step) if spec is not None else (1.0, 0.0)
        scale = 1.0 if spec is None else speculation_scale_naive(len(running), y, spec.verify_cost, spec.max_batch,
                                                                 load)
        drafts = spec is not None and len(running) <= spec.max_batch and y > 1.0
        dt = ((c0 + c1 * len(running) + c2 * sum(r.ctx for r in running)) * scale
              + p * sum(r.prefill for r in running))
        t_next = t + dt
        while i < len(events) and events[i][0] < t_next:
            handle(*events[i])
            i += 1
        for r in running:
            if r.first is None:
                r.first = t_next
            r.ctx += 1
            r.done += 1
            r.remaining -= 1
            if drafts:
                r.accepted += 1.0 - 1.0 / y
                r.drafted += load * spec.num_speculative_tokens / y
            r.prefill = 0
        t = t_next
        step += 1
        running = [r for r in running if not r.leaving]
        finished = [r for r in running if r.remaining == 0]
        running = [r for r in running if r.remaining > 0]
        for r in finished:
            job = jobs[r.j]
            out[job.key].append(("length", t, r.done))
            if speculation is not None:
                speculation.setdefault(job.key, []).append((round(r.drafted), round(r.accepted)))
            if first_tokens is not None:
                first_tokens.setdefault(job.key, []).append(r.first)
            if r.seg + 1 < len(job.segments):
                cache[r.j] = B * ((r.ctx - 1) // B)
                nxt = _R(r.j, r.seg + 1, r.ctx, job.segments[r.seg + 1])
                waiting.append(nxt)
                current[r.j] = nxt
            else:
                cache.pop(r.j, None)
                current.pop(r.j, None)
        plan()
    return out
