"""bench/spec.py's accounting (bench/spec_accounting.py): the tail's size, the counter deltas, and where each verify
step lands in a response (lining vLLM's per-request verify steps up with the streamed chunks), against a simulated
engine."""

from __future__ import annotations

import random

from support import load_bench


def load():
    return load_bench("spec_accounting")


def test_tail_size_is_the_last_tenth_at_least_one():
    m = load()
    assert m.tail_size(128, 0.1) == 13
    assert m.tail_size(100, 0.1) == 10
    assert m.tail_size(8, 0.1) == 1
    assert m.tail_size(2, 0.5) == 1
    assert m.tail_size(1, 0.1) == 0   # a lone sample has no tail apart from the step


def test_delta_and_ratios():
    m = load()
    start = {"drafts": 10, "drafted_tokens": 40, "accepted_tokens": 12}
    end = {"drafts": 30, "drafted_tokens": 110, "accepted_tokens": 42}
    d = m.delta(end, start, tokens=200)
    assert (d["verify_steps"], d["drafted"], d["accepted"], d["tokens"]) == (20, 70, 30, 200)
    assert d["accepted_per_verify"] == 1.5 and d["acceptance_rate"] == 30 / 70 and d["draft_share"] == 0.15
    assert m.counts(0, 0, 0, 0)["accepted_per_verify"] == 0.0


def simulate(rng: random.Random, k: int = 4, length: int = 60):
    """An engine's segment: each step drafts 0..k tokens (or none) and accepts some; the streamed chunk is
    1 + accepted (cut at the end by the cap). Returns (chunks, drafted, accepted, true positions)."""
    chunks, drafted, accepted, where = [], [], [], []
    pos = 0
    while pos < length:
        d = rng.choice([0, 0, k, k, 2])
        a = rng.randint(0, d) if d else 0
        c = min(1 + a, length - pos)
        if d:
            drafted.append(d)
            accepted.append(a)
            where.append(pos)
        chunks.append(c)
        pos += c
    return chunks, drafted, accepted, where


def test_align_steps_places_accepting_steps_exactly():
    m = load()
    rng = random.Random(5)
    for _ in range(300):
        chunks, drafted, accepted, where = simulate(rng)
        steps, ok = m.align_steps(chunks, drafted, accepted)
        assert ok
        assert [(d, a) for _, _, d, a in steps] == list(zip(drafted, accepted))   # every step, in order
        starts = [sum(chunks[:i]) for i in range(len(chunks))]
        for (p, ci, _, a), true in zip(steps, where):
            assert p == starts[ci]
            if a > 0:
                assert p == true
        assert all(0 <= p < sum(chunks) for p, _, _, _ in steps)


def test_align_steps_known_case():
    m = load()
    # chunks: prefill 1, a non-draft step 1, a verify step accepting 0, one accepting 3, one accepting 0
    steps, ok = m.align_steps([1, 1, 1, 4, 1], [4, 4, 4], [0, 3, 0])
    assert ok
    assert [(d, a) for _, _, d, a in steps] == [(4, 0), (4, 3), (4, 0)]
    assert steps[1][:2] == (3, 3) and steps[0][0] < 3 and steps[2][:2] == (7, 4)


def test_align_steps_merged_outputs_fall_back_to_spreading():
    m = load()
    # two steps (accepting 1 and 2) merged into one chunk of 5 tokens: no step accepted 4
    steps, ok = m.align_steps([1, 5, 1], [4, 4], [1, 2])
    assert not ok
    assert [(d, a) for _, _, d, a in steps] == [(4, 1), (4, 2)]
    assert [p for p, _, _, _ in steps] == [0.0, 3.5]


def test_bin_segments_sums_match():
    m = load()
    rng = random.Random(9)
    segments = []
    for i in range(40):
        chunks, drafted, accepted, _ = simulate(rng, length=rng.randint(5, 150))
        times = [i + 0.01 * j for j in range(len(chunks))]   # segment i's chunks arrive from time i on
        segments.append(m.Segment(start=rng.choice([0, 64, 128]), finished_siblings=i % 8, chunks=chunks,
                                  times=times, drafted=drafted, accepted=accepted, finished=True))
    segments.append(m.Segment(start=0, finished_siblings=0, chunks=[1, 1, 1], times=[0, 1, 2]))   # no metrics
    got = m.bin_segments(segments, 64, {"all": -1.0, "late": 30.0, "never": 1e9})
    by_pos, by_sib, by_both = got["by_position"], got["by_siblings"], got["by_both"]
    assert (got["measured"], got["unaligned"]) == (40, 0)
    assert got["after"]["never"]["tokens"] == 0 and got["after"]["never"]["verify_steps"] == 0
    late = [s for s in segments[30:40]]   # segments 30-39 arrive wholly at or after t = 30
    assert got["after"]["late"]["tokens"] == sum(sum(s.chunks) for s in late)
    assert got["after"]["late"]["accepted"] == sum(sum(s.accepted) for s in late)
    assert got["after"]["all"]["tokens"] == sum(sum(s.chunks) for s in segments)
    for bins in (by_pos, by_sib, by_both):
        rows = bins.rows("key", "finished")
        assert sum(r["tokens"] for r in rows) == sum(sum(s.chunks) for s in segments)
        assert sum(r["accepted"] for r in rows) == sum(sum(s.accepted or ()) for s in segments)
        assert sum(r["verify_steps"] for r in rows) == sum(len(s.drafted or ()) for s in segments)
    assert all(r["key"] % 64 == 0 for r in by_pos.rows("key"))
    assert [r["key"] for r in by_sib.rows("key")] == list(range(8))
    # the joint table's rows add up to each marginal's
    for marginal, part in ((by_pos, "start"), (by_sib, "finished")):
        for row in marginal.rows(part):
            joint = [r for r in by_both.rows("start", "finished") if r[part] == row[part]]
            assert [sum(r[k] for r in joint) for k in ("tokens", "verify_steps", "drafted", "accepted")] == [
                row[k] for k in ("tokens", "verify_steps", "drafted", "accepted")]


def test_token_quantile_time():
    m = load()
    segs = [m.Segment(start=0, finished_siblings=0, chunks=[1, 1, 8], times=[0.0, 1.0, 2.0]),
            m.Segment(start=0, finished_siblings=0, chunks=[10], times=[3.0])]
    assert m.token_quantile_time(segs, 0.5) == 2.0   # 10 of 20 tokens by t = 2
    assert m.token_quantile_time(segs, 0.9) == 3.0


def test_parse_args():
    m = load_bench("spec")
    args = m.parse_args(["--methods", "off,group", "--engines", "1"])
    assert args.methods == ["off", "group"] and args.model is None
    args.model, args.dataset = "m", None
    # acceptance is measured with drafting at every batch size unless --max-batch-size says otherwise
    assert m.method_config(args, "group", 1, 4, 1024).speculative_settings.max_batch_size is None
    assert m.parse_args(["--max-batch-size", "8"]).max_batch_size == 8
