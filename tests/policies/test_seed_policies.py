"""v1, v2 and v2.5 at their default settings in the simulator, against what the seeds' algorithms do on small
hand-made traces, counted here from the seeds' rules (not from pdsr's code).

Seed 001 V1: probe = the 1st sample of each prompt, on the fast worker, uncapped; sort by wall time; the top K%
(10%) send their N-1 other samples to heavy; a probe not done at 5 s is stopped and its prompt marked heavy; fast
workers truncate past max_tokens 2048. V2: each finished probe routes at once, heavy when its time T exceeds the
P80 of the last M probe times; the breaker moves a fast sample to heavy at Time > 10 s or Token > 2048 and marks
its prompt hard. Seed 002 (V2.5): sort by probe length, the top 20% (seed 002 counts 25 of 128, so floor) go heavy,
the fast cap is 1.5 x L_cut (L_cut the 20% boundary), a fast sample past it breaks and is re-run on heavy.

The engines cost c0 seconds a token whatever runs (no batch or context cost, no prefill) and have slots for
everything, so a sample started at t with L tokens ends at t + c0 x L and the order of events is the order of
lengths. pdsr's own additions, stated where used: at least 8 probe times before v2 routes anything heavy
(``min_history``), a window of M = 64 (the seed names no M), L_cut = the shortest offloaded probe.
"""

from __future__ import annotations

import math

import numpy as np

from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import simulate
from pdsr_sdk.traces import LengthTrace


def _simulate(policy: str, lengths, batch: int, c0: float = 0.001, settings: dict | None = None):
    x = np.array(lengths)
    trace = LengthTrace.from_matrix(x, prompt_lens=np.full(len(x), 4))
    profile = dict(max_num_seqs=64, kv_cache_tokens=10 ** 7, c0_s=c0, c1_s_per_seq=0.0, c2_s_per_token=0.0,
                   prefill_s_per_token=0.0)
    cfg = SimulateConfig(policy=policy, fast=2, heavy=1, batch_size=batch, timeline=False, references=False,
                         profiles={"fast": profile, "heavy": profile}, segments={"enabled": False},
                         policy_settings={policy: settings or {}})
    run = simulate(trace, cfg, keep_groups=True).runs[0]
    for key in ("breaks_time", "breaks_tokens"):   # counters outside STAT_KEYS are only in the batches' stats
        run.stats[key] = sum(b.stats.get(key, 0) for b in run.batches)
    groups = [g for b in run.batches for g in b.group_objects]
    return run, {(int(g.prompt_id[1:]), s.index): s for g in groups for s in g.samples}


def _fast_tokens(sample) -> int:
    return sum(seg.num_tokens for seg in sample.segments if seg.pool == "fast")


def _later_pool(samples, g: int) -> str:
    return samples[(g, 1)].segments[0].pool


# -- v2.5 (seed 002) ---------------------------------------------------------------------------------------------

# 16 prompts x 4: probes (column 0) 900, 40, ..., the top 20% = floor(3.2) = 3 prompts
V25 = [[900, 800, 950, 700], [40, 30, 500, 45], [10, 12, 8, 91], [600, 650, 700, 2000], [20, 90, 15, 22],
       [300, 310, 320, 451], [35, 10, 10, 10], [500, 750, 600, 40], [45, 20, 20, 20], [25, 25, 25, 25],
       [700, 50, 60, 70], [450, 460, 470, 480], [200, 1000, 210, 220], [100, 110, 120, 130], [400, 449, 450, 300],
       [60, 70, 80, 90]]


def _v25_by_hand():
    probes = [row[0] for row in V25]
    top = sorted(range(len(V25)), key=lambda g: -probes[g])[:math.floor(0.2 * len(V25))]
    l_cut = min(probes[g] for g in top)
    cap = math.floor(1.5 * l_cut)
    broke = {(g, j) for g, row in enumerate(V25) if g not in top for j, v in enumerate(row) if v > 1.5 * l_cut}
    return set(top), l_cut, cap, broke


def test_v25_offloads_the_seeds_top_20_percent_and_breaks_past_1_5_l_cut():
    top, l_cut, cap, broke = _v25_by_hand()
    # by hand: probes 900, 700, 600 go heavy (ceil(3.2) would add 500); L_cut 600, cap 900; of the fast samples
    # (7, 1) = 750 fits and (12, 1) = 1000 breaks; (3, 3)'s 2000 runs on heavy with its prompt
    assert top == {0, 10, 3} and (l_cut, cap) == (600, 900) and broke == {(12, 1)}
    run, samples = _simulate("v2.5", V25, batch=16)
    assert run.batches[0].policy == {"l_cut": l_cut, "fast_cap": cap}
    assert run.stats["offloaded_prompts"] == len(top) and run.stats["breaks"] == len(broke)
    assert {g for g in range(16) if _later_pool(samples, g) == "heavy"} == top
    assert {k for k, s in samples.items() if s.moves} == broke
    for key in broke:   # ran to the cap on fast, then went on from its tokens on heavy (on_break: resume)
        assert _fast_tokens(samples[key]) == cap and samples[key].segments[-1].pool == "heavy"
    assert {s.segments[0].pool for k, s in samples.items() if k[1] == 0} == {"fast", "heavy"}   # every worker probes


def test_v25_restart_preset_reruns_a_break_on_heavy_as_the_seed_counted():
    _, _, cap, broke = _v25_by_hand()
    run, samples = _simulate("v2.5-restart", V25, batch=16)
    assert run.stats["restarts"] == run.stats["breaks"] == len(broke)
    assert run.stats["wasted_tokens"] == cap * len(broke)


# -- v1 (seed 001, V1) ---------------------------------------------------------------------------------------------

# two batches of 16 prompts x 3 at 1 ms a token: probe times are their lengths in ms
V1 = ([[100 * (g + 1), 2049 if g % 4 == 0 else 50, 2048 if g % 5 == 0 else 70] for g in range(16)]
      + [[6000, 100, 200]] + [[150 + 10 * g, 60, 3000 if g == 14 else 80] for g in range(15)])


def test_v1_offloads_the_slowest_10_percent_times_out_at_5_s_and_truncates_past_2048():
    k = math.floor(0.1 * 16)                                    # 1 prompt a batch
    # batch 0: the slowest probe (prompt 15, 1.6 s); batch 1: prompt 16's probe (6 s) is stopped at 5 s and
    # marked heavy, which fills the batch's 10%
    heavy = {15, 16}
    truncated = {(g, j) for g, row in enumerate(V1) if g not in heavy for j, v in enumerate(row[1:], 1) if v > 2048}
    assert k == 1 and truncated == {(0, 1), (4, 1), (8, 1), (12, 1), (31, 2)}
    run, samples = _simulate("v1", V1, batch=16)
    assert run.stats["offloaded_prompts"] == 2 and run.stats["probe_timeouts"] == 1
    assert {g for g in range(32) if _later_pool(samples, g) == "heavy"} == heavy
    assert run.stats["truncations"] == len(truncated)
    assert {key for key, s in samples.items() if s.finish_reason == "truncated"} == truncated
    assert all(samples[key].num_generated == 2048 for key in truncated)
    probe = samples[(16, 0)]   # stopped on fast after 5 s of tokens, then went on on heavy (on_probe_timeout)
    assert _fast_tokens(probe) == 5000 and probe.segments[-1].pool == "heavy"
    assert all(samples[(g, 0)].segments[0].pool == "fast" for g in range(32))   # probes on the fast worker


# -- v2 (seed 001, V2) ---------------------------------------------------------------------------------------------

# two batches of 10 prompts x 3; prompt 10's sample 2 passes 2048 tokens on fast, prompt 19's probe does
V2 = ([[100 * (g + 1), 50, 100 * (g + 1) + 10] for g in range(10)]
      + [[150 * (g + 1) + 5, 50, 3000 if g == 0 else 60] for g in range(9)] + [[2500, 50, 60]])


def _v2_heavy_by_hand(window=64, percentile=80, min_history=8) -> set[int]:
    """Prompts routed heavy by their probe: probes finish in the order of their lengths within a batch (times are
    lengths x c0, so lengths stand for times); a probe that breaks first is routed by the breaker instead."""
    times: list[int] = []
    heavy = set()
    for start in (0, 10):
        for g in sorted(range(start, start + 10), key=lambda g: V2[g][0]):
            probe = V2[g][0]
            recent = times[-window:]
            if probe > 2048 or (len(recent) >= min_history and probe > np.percentile(recent, percentile)):
                heavy.add(g)
            times.append(probe)
    return heavy


def test_v2_routes_by_the_p80_of_recent_probe_times_and_breaks_past_2048_tokens():
    heavy = _v2_heavy_by_hand()
    # by hand: batch 0 routes its first 8 probes fast (too few times), then 900 and 1000 exceed the P80 of
    # 100..800 (660); batch 1: 155, 305, 455, 605 are under the P80 of the times before them (820, 800, 780, 760),
    # 755 is over 740, and so is every longer one; 2500 breaks at 2048 first
    assert heavy == {8, 9, 14, 15, 16, 17, 18, 19}
    breaks = {(10, 2), (19, 0)}
    run, samples = _simulate("v2", V2, batch=10)
    assert {g for g in range(20) if _later_pool(samples, g) == "heavy"} == heavy
    assert run.stats["offloaded_prompts"] == len(heavy)
    assert run.stats["breaks"] == run.stats["breaks_tokens"] == len(breaks) and run.stats["steals"] == 0
    assert {k for k, s in samples.items() if s.moves} == breaks
    for key in breaks:
        assert _fast_tokens(samples[key]) == 2048 and samples[key].segments[-1].pool == "heavy"


def test_v2_time_breaker_fires_at_10_s():
    # 10 ms a token: the 10 s breaker fires at 1000 tokens, before the 2048-token one
    lengths = [[300, 1500, 200], [400, 100, 1200], [500, 900, 100], [600, 60, 70], [700, 80, 90]]
    run, samples = _simulate("v2", lengths, batch=5, c0=0.01)
    over = {(g, j) for g, row in enumerate(lengths) for j, v in enumerate(row) if v > 1000}
    assert run.stats["breaks"] == run.stats["breaks_time"] == len(over) == 2
    for key in over:
        assert abs(_fast_tokens(samples[key]) - 1000) <= 1 and samples[key].segments[-1].pool == "heavy"
