"""`pdsr analyze` against seed 002's own definitions, written here from the seed's words (not from pdsr's code).

Seed 002 (the P-DSR length study, 7424 prompt groups x 8 samples of a 0.5B model on MATH):
- top-K recall: "关注最长的前 10.0% (即 Top 742 个样本)": R0's top 10% (floor(0.1 G) groups) against Rj's, mean over j;
- safe rate: "R0 预测为 Top 10%，实际落入 Top 20% 的比例": the share of R0's top 10% inside Rj's top 20%;
- false negatives: "Probe < 512 的样本中，有 63% 的概率后续会爆出 > 512 的长尾": groups with probe < 512 of which
  a later sample is > 512;
- batch capture: "464 (每个Batch含 16 个Prompt) ... 能够识别出 Batch 中最长任务即为成功 (容忍度 Top-3)": batches of 16
  consecutive groups, a success when the group of the batch's longest task is among the 3 longest probes; the
  cost ratio of a miss "Probe 认为是100，实际跑了 467" is that task's length over its probe, mean and max over misses;
- dispatch ("58 Batches / 7424", batch size 128): "以首个回答长度排序，Top 20% 判定为“长尾”，Fast Worker 熔断阈值为长尾
  长度的 1.5 倍", reported per prompt: heavy 1450 (19.5%) = 25 of 128 in each of 58 batches (floor(0.2 x 128)),
  fast 5974, of which 777 (13.0%) "熔断重试".

Where the seed leaves ties open, pdsr breaks them at random and reports the expectation; the reference here
enumerates every equally likely top set (which members of the tie block straddling the boundary get in) instead of
pdsr's closed form. The dispatch's tie order (equal probes by group order) is pdsr's documented choice.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pdsr_sdk.analysis import AnalyzeConfig, analyze_trace, report_tables
from pdsr_sdk.traces import LengthTrace, synth_trace


def _top_sets(values: list[int], k: int) -> list[frozenset[int]]:
    """Every equally likely set of the k largest of ``values`` under a uniformly random tie order."""
    order = sorted(values, reverse=True)
    edge = order[k - 1]
    sure = [i for i, v in enumerate(values) if v > edge]
    block = [i for i, v in enumerate(values) if v == edge]
    return [frozenset(sure + list(c)) for c in itertools.combinations(block, k - len(sure))]


def seed_recall(rows: list[list[int]], k_frac: float, safe_frac: float) -> tuple[float, float]:
    """(mean top-K recall, mean safe rate) over samples j = 1..N-1, as seed 002 defines them."""
    g, n = len(rows), len(rows[0])
    k, k_safe = int(k_frac * g + 1e-9), int(safe_frac * g + 1e-9)
    probe_sets = _top_sets([r[0] for r in rows], k)
    recalls, safes = [], []
    for j in range(1, n):
        col = [r[j] for r in rows]
        for size, out in ((k, recalls), (k_safe, safes)):
            sets = _top_sets(col, size)
            out.append(sum(len(a & b) for a in probe_sets for b in sets) / (len(probe_sets) * len(sets) * k))
    return sum(recalls) / len(recalls), sum(safes) / len(safes)


def seed_false_negatives(rows: list[list[int]], length: int) -> float:
    below = [r for r in rows if r[0] < length]
    return sum(1 for r in below if any(v > length for v in r[1:])) / len(below)


def seed_batch_capture(rows: list[list[int]], b: int, top: int) -> tuple[float, float, float]:
    """(capture rate over batches of more than ``top`` groups, mean and max cost ratio of the misses)."""
    rates, miss_weight, miss_ratio, worst = [], 0.0, 0.0, 0.0
    for start in range(0, len(rows), b):
        batch = rows[start:start + b]
        if len(batch) <= top:
            continue
        later = [max(r[1:]) for r in batch]
        longest = max(later)
        holders = [i for i, v in enumerate(later) if v == longest]
        sets = _top_sets([r[0] for r in batch], top)
        hit = 0.0
        for h in holders:
            ratio = longest / batch[h][0]
            for s in sets:
                p = 1.0 / (len(holders) * len(sets))
                if h in s:
                    hit += p
                else:
                    miss_weight += p
                    miss_ratio += p * ratio
                    worst = max(worst, ratio)
        rates.append(hit)
    return sum(rates) / len(rates), miss_ratio / miss_weight, worst


def seed_dispatch(rows: list[list[int]], b: int, frac: float, mult: float) -> tuple[int, int, int]:
    """Seed 002's table in prompts: (heavy, fast, fast that retry), top floor(frac x B) of each batch by probe."""
    heavy = fast = retry = 0
    for start in range(0, len(rows), b):
        batch = rows[start:start + b]
        n_heavy = max(1, math.floor(frac * len(batch) + 1e-9))
        order = sorted(range(len(batch)), key=lambda i: (-batch[i][0], i))
        l_cut = batch[order[n_heavy - 1]][0]
        heavy += n_heavy
        for i in order[n_heavy:]:
            fast += 1
            retry += any(v > mult * l_cut for v in batch[i])
    return heavy, fast, retry


def _check(x: np.ndarray, cfg: AnalyzeConfig) -> None:
    rows = x.tolist()
    report = analyze_trace(LengthTrace.from_matrix(x), cfg)
    recall, safe = seed_recall(rows, cfg.top_k, cfg.safe_k)
    assert report["top_k_recall"]["mean"] == pytest.approx(recall, rel=1e-12)
    assert report["safe_rate"]["mean"] == pytest.approx(safe, rel=1e-12)
    assert report["false_negatives"]["group_rate"] == pytest.approx(seed_false_negatives(rows, cfg.fn_length))
    rate, miss_mean, miss_max = seed_batch_capture(rows, cfg.batch_prompts, cfg.capture_top)
    bc = report["batch_capture"]
    assert bc["capture_rate"] == pytest.approx(rate, rel=1e-12)
    assert bc["cost_ratio_missed"]["mean"] == pytest.approx(miss_mean, rel=1e-12)
    assert bc["cost_ratio_missed"]["max"] == pytest.approx(miss_max, rel=1e-12)
    heavy, fast, retry = seed_dispatch(rows, cfg.dispatch_batch_prompts, cfg.offload_fraction, cfg.cap_multiplier)
    dv = report["dispatch_v25"]
    n = x.shape[1]
    assert (dv["heavy"], dv["fast"]) == (heavy * n, fast * n)
    assert (dv["heavy_prompts"], dv["fast_prompts"], dv["fast_prompts_broke"]) == (heavy, fast, retry)
    table = report_tables(report)["dispatch"]
    assert [row["prompts"] for row in table] == [heavy, fast, fast - retry, retry]
    seed_settings = (cfg.dispatch_batch_prompts, cfg.offload_fraction, cfg.cap_multiplier) == (128, 0.2, 1.5)
    assert [row["ref seed 002 (prompts)"] for row in table] == (
        ["1450 (19.5%)", "5974 (80.5%)", "5197 (87.0%)", "777 (13.0%)"] if seed_settings else [""] * 4)


# 20 groups x 4: ties straddle the top-4 (20%) boundary of the probe and the top-2 (10%) one of sample 2; the
# longest task (900) of the second batch of 8 is held by three groups, one of them (12) in a three-way probe tie
# across that batch's top 2
HAND = np.array([
    [300, 310, 280, 500], [120, 100, 900, 130], [300, 250, 260, 240], [80, 600, 90, 85], [200, 210, 190, 205],
    [90, 95, 100, 90], [50, 55, 60, 700], [250, 240, 260, 270], [60, 50, 40, 45], [40, 500, 30, 35],
    [100, 90, 900, 95], [220, 230, 210, 215], [220, 225, 235, 900], [220, 35, 40, 45], [70, 65, 60, 600],
    [10, 20, 15, 900], [150, 160, 900, 155], [130, 120, 110, 140], [110, 120, 130, 115], [20, 25, 30, 35],
])


def test_hand_trace_matches_the_seed_definitions():
    # batches of 8 (8, 8, 4): capture top 2; dispatch batches of 10 at 20%: 2 heavy each, L_cut = 250 and 220
    cfg = AnalyzeConfig(batch_prompts=8, capture_top=2, dispatch_batch_prompts=10, fn_length=200, plots=False)
    _check(HAND, cfg)
    rows = HAND.tolist()
    # by hand: probes < 200 in groups 1,3,5,6,8,9,10,14,15,16,17,18,19 (13); a later sample > 200 in
    # 1,3,6,9,10,14,15,16 (8)
    assert seed_false_negatives(rows, 200) == 8 / 13
    # batch capture by hand, batch 1 (groups 8-15): the longest task's holders 10, 12, 15 are equally likely; of
    # them only 12 can be in the top 2 probes (220, 220, 220: two of three), so it is captured 1/3 x 2/3
    assert seed_batch_capture(rows[8:16], 8, 2)[0] == pytest.approx(2 / 9)
    # dispatch by hand: batch 0 probes 300,120,300,80,200,90,50,250,60,40 -> heavy g0, g2; L_cut 300, cap 450:
    # g7 (270) fits, g1 (900), g3 (600), g6 (700), g9 (500) retry; batch 1 probes 100,220,220,220,70,10,150,130,110,20
    # -> heavy g11, g12; L_cut 220, cap 330: g10, g14, g15, g16 retry
    assert seed_dispatch(rows, 10, 0.2, 1.5) == (4, 16, 8)


@pytest.mark.parametrize("seed", [3, 11])
def test_synthetic_seed002_trace_matches_the_seed_definitions(seed):
    # `pdsr trace synth --family seed002 --groups 1024`: 8 batches of 128 for the dispatch, 64 of 16 for capture
    x = synth_trace(family="seed002", groups=1024, seed=seed).matrix()
    _check(x, AnalyzeConfig(plots=False))
