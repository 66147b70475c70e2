"""Statistics of GRPO length traces (seed 002), as pure functions on arrays.

Every function takes ``lengths``, an integer [G, N] array of G prompt groups
by N samples, where column 0 is the probe (sample 0) and columns 1..N-1 are
the later samples. No IO, no config objects; vectorised numpy throughout
(the loops are over the N columns at most). ``reference.py`` holds the naive
float64 twins the tests compare against.

Conventions (where the seed leaves a choice):
- top-K sets hold ``floor(K * G)`` groups, the seed's "Top 742" of 7424 at
  K = 10%; an empty set (``floor(K * G) = 0``) makes its statistics NaN.
- ties are broken uniformly at random, independently in each column, and the
  rank statistics (top-K recall, safe rate, batch capture) are the exact
  expectation over those tie orders: a tie block straddling a top-K boundary
  puts each of its members in the set with probability (slots left) / (block
  size). A fixed rule (say, earlier group first) would pick the same tied
  groups in every column and count them as agreement: with many lengths at
  the cap, a probe with no signal would look good.
- ranks for Spearman are average ranks over ties.
- batches are consecutive runs of B groups; a shorter last batch is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pdsr_sdk.errors import ConfigValueError, DataValueError

_EPS = 1e-9  # guards ceil/floor of float products: 0.55 * 100 = 55.00000000000001, 0.7 * 90 = 62.99999999999999


def as_matrix(lengths, *, min_n: int = 1) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != 2:
        raise DataValueError(f"lengths must be a [G, N] array, got shape {arr.shape}")
    if arr.shape[1] < min_n:
        raise DataValueError(f"this statistic needs at least {min_n} samples per group, got N = {arr.shape[1]}")
    if arr.shape[0] < 1:
        raise DataValueError("lengths has no groups")
    return arr


def top_k_count(num_groups: int, frac: float) -> int:
    """Size of a top-``frac`` set of ``num_groups`` groups: ``floor(frac * G)``, 0 when fewer than 1/frac groups.

    An empty set is not raised to 1: the top 10% of 5 groups is no group, and
    its recall is n/a rather than the recall of the single longest group.
    """
    if not 0 < frac <= 1:
        raise ConfigValueError(f"fraction must be in (0, 1], got {frac}")
    return math.floor(frac * num_groups + _EPS)


def offload_count(frac: float, batch_prompts: int) -> int:
    """Prompts a batch of ``batch_prompts`` offloads to heavy: ``floor(frac * B)``, at least 1.

    Floor is seed 002's own count: its 1450 heavy prompts of 58 batches of 128 are 25 a batch at 20%
    (ceil would be 26). At least 1 so that a small batch still has an ``L_cut``.
    """
    if not 0 < frac <= 1:
        raise ConfigValueError(f"offload fraction must be in (0, 1], got {frac}")
    return min(batch_prompts, max(1, math.floor(frac * batch_prompts + _EPS)))


#: the cap of a product past int64 (``cap_multiplier`` 1e17 or ``inf``): longer than any length, so no cap
NO_CAP = 2**62


def cap_tokens(cap_multiplier: float, l_cut):
    """The fast-pool cap ``floor(cap_multiplier * L_cut)``; a sample breaks when its length exceeds it. Held at
    :data:`NO_CAP` (converted to int64, a larger product wrapped to a negative cap, and every fast sample broke).

    For integer lengths, ``length > floor(x)`` is the same as ``length > x``.
    """
    # fmin: inf x 0 (NaN) is no cap too
    cap = np.fmin(cap_multiplier * np.asarray(l_cut, dtype=np.float64) + _EPS, float(NO_CAP))
    return np.floor(cap).astype(np.int64)


# -- per-group spread ---------------------------------------------------------------------

def group_cv(lengths, ddof: int = 1) -> np.ndarray:
    """Coefficient of variation std / mean of each group, float64 [G].

    ``ddof=1`` is the sample std (pandas' default; the original P-DSR analysis
    was pandas-based); ``ddof=0`` the population std. A group whose lengths are all 0 has
    CV 0. NaN for every group when N <= ddof.
    """
    x = as_matrix(lengths).astype(np.float64)
    n = x.shape[1]
    if n <= ddof:
        return np.full(x.shape[0], np.nan)
    mean = x.mean(axis=1)
    std = x.std(axis=1, ddof=ddof)
    out = np.zeros_like(mean)
    np.divide(std, mean, out=out, where=mean > 0)
    return out


# -- rank agreement of the probe with later samples ---------------------------------------

def average_ranks(x) -> np.ndarray:
    """1-based ranks of each column of ``x`` ([G] or [G, N]), ties given their average rank."""
    arr = np.asarray(x)
    flat = arr.ndim == 1
    cols = arr[:, None] if flat else arr
    g = cols.shape[0]
    out = np.empty(cols.shape, dtype=np.float64)
    for j in range(cols.shape[1]):
        col = cols[:, j]
        order = np.argsort(col, kind="stable")
        sorted_col = col[order]
        new_block = np.empty(g, dtype=bool)
        new_block[0] = True
        np.not_equal(sorted_col[1:], sorted_col[:-1], out=new_block[1:])
        block = np.cumsum(new_block) - 1               # tie block of each sorted position
        bounds = np.append(np.flatnonzero(new_block), g)  # block b spans sorted positions bounds[b]:bounds[b+1]
        avg = 0.5 * (bounds[:-1] + 1 + bounds[1:])      # mean of ranks bounds[b]+1 .. bounds[b+1]
        out[order, j] = avg[block]
    return out[:, 0] if flat else out


def _pearson_cols(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation of column vector ``a`` [G] with each column of ``b`` [G, M]; NaN if constant."""
    a = a - a.mean()
    b = b - b.mean(axis=0)
    num = a @ b
    den = np.sqrt((a @ a) * np.einsum("ij,ij->j", b, b))
    out = np.full(b.shape[1], np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def spearman_vs_probe(lengths) -> np.ndarray:
    """Spearman rank correlation of sample 0 with sample j across groups, for j = 1..N-1 ([N-1]).

    Pearson correlation of average ranks; NaN when a column is constant.
    """
    x = as_matrix(lengths, min_n=2)
    ranks = average_ranks(x)
    return _pearson_cols(ranks[:, 0], ranks[:, 1:])


def greater_equal_counts(values) -> tuple[np.ndarray, np.ndarray]:
    """For an integer [R, B] array: per entry, how many entries of its row are strictly greater, and how many
    are equal (itself included)."""
    v = np.asarray(values, dtype=np.int64)
    greater = count_greater_rowwise(v)
    less = count_greater_rowwise(-v)
    return greater, v.shape[1] - greater - less


def top_k_prob(lengths, k: int) -> np.ndarray:
    """float64 [G, N]: the probability that each group is among the ``k`` longest of its column.

    Ties are broken uniformly at random: a group with ``gt`` strictly longer
    groups and ``eq`` equal ones (itself included) is in the top ``k`` with
    probability ``clip((k - gt) / eq, 0, 1)``; without ties this is 0 or 1.
    """
    x = as_matrix(lengths)
    g = x.shape[0]
    if not 0 <= k <= g:
        raise ConfigValueError(f"k must be in 0..{g}, got {k}")
    gt, eq = greater_equal_counts(x.T)
    return np.clip((k - gt.T) / eq.T, 0.0, 1.0)


def top_k_recall(lengths, k_frac: float = 0.1) -> np.ndarray:
    """For j = 1..N-1: E|top-K of sample 0 ∩ top-K of sample j| / K  ([N-1]), ties broken at random.

    The expectation over independent uniformly random tie orders of the two
    columns is ``sum_i P(i in top-K of 0) * P(i in top-K of j) / K``; a probe
    with no signal scores K / G (chance) however many ties. NaN when K = 0.
    """
    x = as_matrix(lengths, min_n=2)
    k = top_k_count(x.shape[0], k_frac)
    if k == 0:
        return np.full(x.shape[1] - 1, np.nan)
    p = top_k_prob(x, k)
    return (p[:, :1] * p[:, 1:]).sum(axis=0) / k


def safe_rate(lengths, k_frac: float = 0.1, safe_frac: float = 0.2) -> np.ndarray:
    """For j = 1..N-1: expected share of sample 0's top ``k_frac`` that is in sample j's top ``safe_frac`` ([N-1]).

    The seed's "safe dispatch" rate: a group predicted long by the probe and
    sent to the heavy pool is safe when it is at least among the long ones.
    Ties are broken at random as in ``top_k_recall`` (chance: safe_frac's
    set size / G). NaN when either set is empty.
    """
    x = as_matrix(lengths, min_n=2)
    g = x.shape[0]
    k_pred, k_safe = top_k_count(g, k_frac), top_k_count(g, safe_frac)
    if k_pred == 0 or k_safe == 0:
        return np.full(x.shape[1] - 1, np.nan)
    pred = top_k_prob(x[:, :1], k_pred)[:, 0]
    actual = top_k_prob(x[:, 1:], k_safe)
    return (pred[:, None] * actual).sum(axis=0) / k_pred


# -- false negatives of a fixed length threshold ------------------------------------------

@dataclass(frozen=True)
class FalseNegatives:
    """Groups whose probe is below ``length`` but whose later samples exceed it."""

    length: int
    groups_below: int          # groups with probe < length
    groups_exceeding: int      # ... of which any later sample > length
    group_rate: float          # groups_exceeding / groups_below (NaN if none below)
    samples_below: int         # later samples of groups with probe < length
    samples_exceeding: int     # ... that are > length
    sample_rate: float         # samples_exceeding / samples_below (NaN if none)


def false_negatives(lengths, length: int) -> FalseNegatives:
    """The seed's false-negative ("漏判") rate of a static threshold ``length``.

    Among groups whose probe is < ``length``: the share where any later
    sample is > ``length`` (group rate) and the share of those groups' later
    samples that are > ``length`` (sample rate).
    """
    x = as_matrix(lengths, min_n=2)
    below = x[:, 0] < length
    over = x[below, 1:] > length
    gb, sb = int(below.sum()), int(over.size)
    ge, se = int(over.any(axis=1).sum()), int(over.sum())
    return FalseNegatives(length=int(length), groups_below=gb, groups_exceeding=ge,
                          group_rate=ge / gb if gb else math.nan, samples_below=sb, samples_exceeding=se,
                          sample_rate=se / sb if sb else math.nan)


# -- batch-level statistics -----------------------------------------------------------------

def batch_blocks(x: np.ndarray, batch_prompts: int) -> list[np.ndarray]:
    """[G, N] -> [nb, B, N] of the full batches, plus [1, r, N] for a shorter last batch."""
    if batch_prompts < 1:
        raise ConfigValueError(f"batch_prompts must be >= 1, got {batch_prompts}")
    g = x.shape[0]
    full = g // batch_prompts
    blocks = []
    if full:
        blocks.append(x[: full * batch_prompts].reshape(full, batch_prompts, x.shape[1]))
    if g % batch_prompts:
        blocks.append(x[full * batch_prompts:][None])
    return blocks


def count_greater_rowwise(values: np.ndarray) -> np.ndarray:
    """For an integer [R, B] array: how many entries of the same row are strictly greater than each entry."""
    v = np.asarray(values, dtype=np.int64)
    rows, b = v.shape
    if v.size == 0:
        return np.zeros(v.shape, dtype=np.int64)
    # Shift row r by r * span so one global sorted array holds every row in order;
    # a single searchsorted then answers every row at once.
    lo = v.min()
    span = int(v.max() - lo) + 1
    keyed = (v - lo) + np.arange(rows, dtype=np.int64)[:, None] * span
    sorted_keys = np.sort(keyed, axis=1).ravel()
    pos = np.searchsorted(sorted_keys, keyed.ravel(), side="right").reshape(rows, b)
    return b - (pos - np.arange(rows, dtype=np.int64)[:, None] * b)


@dataclass(frozen=True)
class BatchCapture:
    """Per-batch capture of the batch's longest task by the probe ranking, in expectation over tie orders."""

    batch_prompts: int
    capture_top: int
    sizes: np.ndarray          # int64 [batches]: groups in the batch (a shorter last batch is kept)
    capture_prob: np.ndarray   # float64 [batches]: probability that the batch is captured (0 or 1 without ties)
    longest: np.ndarray        # int64 [batches]: the batch's longest later sample
    cost_ratio: np.ndarray     # float64 [batches]: E[longest / max(probe of its group, 1)]
    miss_cost: np.ndarray      # float64 [batches]: E[that ratio when the batch is missed, else 0]
    miss_max: np.ndarray       # float64 [batches]: largest ratio of a holder that can be missed (NaN if none)

    @property
    def batches(self) -> int:
        return int(self.capture_prob.size)

    @property
    def ranked(self) -> np.ndarray:
        """bool [batches]: batches of more than ``capture_top`` groups (the others are captured whatever the probe)."""
        return self.sizes > self.capture_top

    @property
    def capture_rate(self) -> float:
        """Mean capture probability over the ranked batches; NaN when there are none."""
        r = self.ranked
        return float(self.capture_prob[r].mean()) if r.any() else math.nan

    @property
    def chance_rate(self) -> float:
        """What a probe with no signal captures: mean of capture_top / size over the ranked batches."""
        r = self.ranked
        return float((self.capture_top / self.sizes[r]).mean()) if r.any() else math.nan


def batch_capture(lengths, batch_prompts: int = 16, capture_top: int = 3) -> BatchCapture:
    """The seed's batch-level "destructive test" of the probe.

    Groups are split into consecutive batches of ``batch_prompts``. In each,
    the longest task is the largest later sample (samples 1..N-1); the batch
    is captured when the group holding it is among the batch's
    ``capture_top`` longest probes. Ties are broken uniformly at random, and
    the result is the exact expectation: when several groups tie for the
    longest task, it is held by one of them chosen uniformly; a group whose
    probe ties with others across the top-``capture_top`` boundary is in the
    top with probability (slots left) / (tied groups). The cost ratio is that
    task's length over its group's probe length (a probe of 0 counts as 1):
    how much longer the task ran than the probe predicted.
    """
    x = as_matrix(lengths, min_n=2)
    if capture_top < 1:
        raise ConfigValueError(f"capture_top must be >= 1, got {capture_top}")
    parts = []
    for block in batch_blocks(x.astype(np.int64), batch_prompts):
        nb, b, _ = block.shape
        probe = block[:, :, 0]
        later = block[:, :, 1:].max(axis=2)
        longest = later.max(axis=1)
        holds = later == longest[:, None]
        share = holds / holds.sum(axis=1, keepdims=True)      # P(group holds the longest task)
        gt, eq = greater_equal_counts(probe)
        top = min(capture_top, b)   # a top past the batch holds all of it (and, so bounded, fits an int64)
        in_top = np.clip((top - gt) / eq, 0.0, 1.0)   # P(group's probe is in the top capture_top)
        ratio = longest[:, None] / np.maximum(probe, 1)
        capture = (share * in_top).sum(axis=1)
        miss_cost = (share * (1.0 - in_top) * ratio).sum(axis=1)
        can_miss = holds & (in_top < 1.0)
        miss_max = np.where(can_miss, ratio, -np.inf).max(axis=1)
        parts.append((np.full(nb, b, dtype=np.int64), capture, longest, (share * ratio).sum(axis=1), miss_cost,
                      np.where(np.isfinite(miss_max), miss_max, np.nan)))
    sizes, capture, longest, ratio, miss_cost, miss_max = (np.concatenate(p) for p in zip(*parts))
    return BatchCapture(batch_prompts=batch_prompts, capture_top=capture_top, sizes=sizes, capture_prob=capture,
                        longest=longest, cost_ratio=ratio, miss_cost=miss_cost, miss_max=miss_max)
