"""bench/spec.py's accounting, pure: the tail's size, the acceptance file's COUNTS and their deltas, where each
verify step lands in a response (lining vLLM's per-request verify steps up with the streamed chunks), and bins of
segments by position and finished siblings. Kept apart from the script's runs; ``tests/test_bench_spec.py`` checks
it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence


def tail_size(samples: int, frac: float) -> int:
    """How many samples the tail holds: the last ``ceil(frac x samples)`` to finish (at least 1, fewer than all)."""
    return min(max(1, math.ceil(frac * samples - 1e-9)), max(samples - 1, 0))


def counts(tokens: int, verify_steps: int, drafted: int, accepted: int) -> dict[str, Any]:
    """COUNTS of the acceptance file: the four totals and their ratios (0.0 where a denominator is 0)."""
    return {"tokens": int(tokens), "verify_steps": int(verify_steps), "drafted": int(drafted),
            "accepted": int(accepted),
            "accepted_per_verify": accepted / verify_steps if verify_steps else 0.0,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "draft_share": accepted / tokens if tokens else 0.0}


def delta(end: dict[str, int], start: dict[str, int], tokens: int) -> dict[str, Any]:
    """COUNTS between two snapshots of the engines' speculation counters (``speculation_stats()`` keys)."""
    return counts(tokens, end["drafts"] - start["drafts"], end["drafted_tokens"] - start["drafted_tokens"],
                  end["accepted_tokens"] - start["accepted_tokens"])


def align_steps(chunks: Sequence[int], drafted: Sequence[int], accepted: Sequence[int],
                finished: bool = True) -> tuple[list[tuple[float, int, int, int]], bool]:
    """Where in a segment each verify step ran: ``chunks`` are the streamed token counts, one per engine step
    (1 + that step's accepted drafted tokens), ``drafted``/``accepted`` the segment's verify steps in order (vLLM's
    per-request detailed metrics; steps without drafts are not in them). Returns ([(position of the step's first
    token in the segment, index of its chunk, drafted, accepted)], aligned). A chunk of more than one token is the
    next verify step that accepted that many less one, after any steps that accepted none; those are spread evenly
    over the one-token chunks before it. The last chunk may hold fewer tokens than its step accepted (a stop token
    or the cap cut it). Where the chunks do not line up (outputs merged), every step is spread evenly over the
    segment and aligned is False."""
    steps = list(zip(drafted, accepted))
    out: list[tuple[float, int, int, int]] = []
    starts = [0]
    for c in chunks:
        starts.append(starts[-1] + c)
    j = 0
    run: list[int] = []   # the one-token chunks (their indices) since the last matched step

    def spread(zeros: list[tuple[int, int]]) -> bool:
        if len(zeros) > len(run):
            return False
        for i, (d, a) in enumerate(zeros):
            ci = run[(i * len(run)) // len(zeros)]
            out.append((float(starts[ci]), ci, d, a))
        return True

    ok = True
    for ci, c in enumerate(chunks):
        last = finished and ci == len(chunks) - 1
        if c > 1:
            k = j
            while k < len(steps) and steps[k][1] == 0:
                k += 1
            if k >= len(steps) or not (steps[k][1] == c - 1 or (last and steps[k][1] > c - 1)):
                ok = False
                break
            if not spread(steps[j:k]):
                ok = False
                break
            out.append((float(starts[ci]), ci, *steps[k]))
            j, run = k + 1, []
        else:
            run.append(ci)
    if ok:
        rest = steps[j:]
        if rest and not all(a == 0 for _, a in rest[:-1]):
            ok = False
        elif rest and rest[-1][1] > 0:
            # the last step accepted drafts but its tokens came as one chunk (cut to one by a stop or the cap)
            ok = bool(run) and spread(rest[:-1])
            if ok:
                out.append((float(starts[run[-1]]), run[-1], *rest[-1]))
        elif rest:
            ok = spread(rest)
    if not ok:
        total, m = starts[-1], max(len(chunks), 1)
        out = []
        for i, (d, a) in enumerate(steps):
            ci = min((i * m) // max(len(steps), 1), m - 1)
            out.append((total * i / max(len(steps), 1), ci, d, a))
    out.sort(key=lambda t: (t[0], t[1]))
    return out, ok


@dataclass
class Bins:
    """COUNTS accumulated by key (a position bin's start, a number of finished siblings, or both: a tuple)."""

    totals: dict[Any, list[int]] = field(default_factory=dict)

    def add(self, key: Any, tokens: int = 0, verify_steps: int = 0, drafted: int = 0, accepted: int = 0) -> None:
        t = self.totals.setdefault(tuple(map(int, key)) if isinstance(key, tuple) else int(key), [0, 0, 0, 0])
        t[0] += tokens
        t[1] += verify_steps
        t[2] += drafted
        t[3] += accepted

    def rows(self, *names: str) -> list[dict[str, Any]]:
        """One row per key: the key under ``names`` (one name per part of a tuple key), then its COUNTS."""
        return [{**dict(zip(names, k if isinstance(k, tuple) else (k,))), **counts(*self.totals[k])}
                for k in sorted(self.totals)]


@dataclass
class Segment:
    """One request (a sample's segment) as the bench saw it."""

    start: int                 # response tokens the sample had before it
    finished_siblings: int     # siblings finished when it was launched
    chunks: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)   # each chunk's arrival (any clock)
    drafted: list[int] | None = None
    accepted: list[int] | None = None
    finished: bool = False


def bin_segments(segments: Sequence[Segment], width: int,
                 cuts: dict[str, float] | None = None) -> dict[str, Any]:
    """Per-request accounting over ``segments``: ``by_position``, ``by_siblings`` and ``by_both`` ((position bin,
    siblings finished): the simulator cannot tell the two apart from the marginals alone, since a segment launched
    later is also later in its response) (:class:`Bins`), for each named time in ``cuts`` the COUNTS of what came
    after it (chunks and verify steps whose chunk arrived at or after it), ``measured`` (segments with per-step
    metrics) and ``unaligned`` (of them, spread evenly)."""
    by_pos, by_sib, by_both = Bins(), Bins(), Bins()
    cuts = cuts or {}
    after = {name: [0, 0, 0, 0] for name in cuts}
    measured = unaligned = 0
    for seg in segments:
        pos = seg.start
        times = seg.times if len(seg.times) == len(seg.chunks) else [0.0] * len(seg.chunks)
        for c, t in zip(seg.chunks, times):   # tokens by position (a chunk's tokens to its first token's bin)
            by_pos.add((pos // width) * width, tokens=c)
            by_both.add(((pos // width) * width, seg.finished_siblings), tokens=c)
            pos += c
            for name, cut in cuts.items():
                if t >= cut:
                    after[name][0] += c
        by_sib.add(seg.finished_siblings, tokens=sum(seg.chunks))
        if seg.drafted is None or seg.accepted is None:
            continue
        measured += 1
        steps, ok = align_steps(seg.chunks, seg.drafted, seg.accepted, seg.finished)
        unaligned += not ok
        for p, ci, d, a in steps:
            by_pos.add(int((seg.start + p) // width) * width, verify_steps=1, drafted=d, accepted=a)
            by_both.add((int((seg.start + p) // width) * width, seg.finished_siblings), verify_steps=1, drafted=d,
                        accepted=a)
            by_sib.add(seg.finished_siblings, verify_steps=1, drafted=d, accepted=a)
            for name, cut in cuts.items():
                if ci < len(times) and times[ci] >= cut:
                    tot = after[name]
                    tot[1] += 1
                    tot[2] += d
                    tot[3] += a
    return {"by_position": by_pos, "by_siblings": by_sib, "by_both": by_both,
            "after": {k: counts(*v) for k, v in after.items()},
            "measured": measured, "unaligned": unaligned}


def token_quantile_time(segments: Sequence[Segment], frac: float) -> float:
    """The arrival time of the chunk by which ``frac`` of all the segments' tokens had been streamed."""
    chunks = sorted((t, c) for seg in segments for c, t in zip(seg.chunks, seg.times))
    total = sum(c for _, c in chunks)
    run = 0
    for t, c in chunks:
        run += c
        if run >= frac * total:
            return t
    return chunks[-1][0] if chunks else 0.0


# ----------------------------------------------------------------------------------------------- the table

def cell(c: dict[str, Any] | None) -> str:
    """COUNTS as a table cell: accepted / drafted, per verify step, draft share."""
    if not c:
        return "-"
    return f"{c['accepted']} / {c['drafted']}, {c['accepted_per_verify']:.2f}, {c['draft_share']:.1%}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def fmt_row(r: dict[str, Any], off: dict[str, Any] | None) -> str:
    vs = ratio(r["tokens_per_s"], off["tokens_per_s"]) if off else "-"
    vs_tail = ratio(r["token_tail_tokens_per_s"], off["token_tail_tokens_per_s"]) if off else "-"
    return (f"| {r['method']} | {cell(r['whole'])} | {cell(r['tail'])} ({r['tail']['tokens']} tokens) | "
            f"{cell(r['token_tail'])} | {r['tokens']} in {r['makespan_s']:.1f} s, {r['tokens_per_s']:.1f}/s | {vs} | "
            f"{vs_tail} |")


TABLE_HEAD = ("| method | whole step | tail: last 10% of samples | tail: last 10% of tokens | tokens, makespan | "
              "tokens/s vs off | token tail tokens/s vs off |\n|---|---|---|---|---|---|---|")
