"""Token-quota micro-batching: balanced partitions under a hard token cap.

Lengths in, lists of sample indices out; ``restore_order`` puts per
micro-batch outputs back in the original sample order. Same idea as the
dynamic batch size of verl (``rearrange_micro_batches``), re-implemented.

Rules (what callers can rely on)
- The count starts at k0 = max(ceil(total / cap), min_micro_batches, a packing
  bound: a micro-batch holds at most j samples longer than cap / (j + 1))
  rounded up to a multiple of d = ``divisible_by``.
- Balancing is k-way Karmarkar-Karp (largest differencing); its max - min
  load spread never exceeds the largest single weight. If KK at k0 keeps every
  micro-batch within the cap, that is the result. Otherwise first-fit
  decreasing (FFD) packs into U micro-batches (its bin count rounded up to a
  multiple of d; FFD fits for every k >= its bin count <= n), and KK is tried
  below U: balancing attention at k0 + d, k0 + 2d, ... one by one for the
  first 16 counts, then (and balancing tokens, straight away) at U - d, then by
  bisection between the highest count where KK broke the cap and the lowest
  where it kept it. The count is the smallest that fits that this search finds:
  KK's partition there, or at U, where KK breaks the cap, FFD's packing.
- KK's fit is not monotone in the count, so this is not always the first of
  k0, k0 + d, ... that fits (:mod:`partition_naive` runs KK at each): there
  the count is larger. On 99,494 random inputs (long-tailed, uniform, tight
  packings of three lengths; caps 1-3x the longest) both gave the same
  micro-batches; balancing attention by bisection alone, 21 of 45,846 tight
  packings got a larger count. KK ran at 3 counts instead of 310 on 16,384
  ``recorded-math-2048`` lengths under 1.1x the longest (bench/partition.py).
- FFD's packing is evened out by moving samples from heavier micro-batches
  into the lightest while the cap holds (:mod:`pdsr_sdk.batching.rebalance`):
  balancing tokens, its max - min then also stays within the longest sample
  (FFD alone: max / min 7.45 on long-tailed rollouts). At k >= n each sample
  is its own micro-batch, without KK. KK stops at the first part heavier than
  a micro-batch within the cap can be, or over the cap (parts only grow).
- ``balance="attention"`` balances a*L + L**2 per sample (the cap still
  counts tokens). Per layer, a causal forward costs about 24*h*h*L FLOPs in
  the linear layers and 2*h*L*L in attention, i.e. proportional to
  12*h*L + L**2: pass ``attention_coef=12 * hidden_size`` for your model. The
  default, 24576, is 12 x 2048 (a 1.5B-3B class model).
- Every index appears exactly once; indices inside a micro-batch ascend;
  micro-batches are ordered by descending load (tokens, or the attention
  cost when balancing it), ties by smallest first index, so the heaviest
  micro-batch runs first and an out-of-memory shows up at once.
- No samples -> ``[]``. Otherwise micro-batches are never empty: when the
  options need more micro-batches than there are samples, DataValueError says so (use
  :func:`pdsr_sdk.batching.pad_micro_batches` or :func:`pdsr_sdk.batching.partition_for_data_parallel`
  if your trainer runs empty micro-batches).
"""

from __future__ import annotations

import operator
import sys
from typing import Any, Sequence

import numpy as np

from pdsr_sdk.errors import ConfigValueError, DataValueError

DEFAULT_ATTENTION_COEF = 24576
BALANCE_MODES = ("tokens", "attention")

# Weights are summed in int64 and the kernel sorts on 2 * sum + 1.
_MAX_TOTAL_WEIGHT = 2**60
# Token sums go through float64 bincount: exact below 2**53.
_MAX_TOTAL_TOKENS = 2**53
_INT64_MAX = 2**63 - 1
# Balancing attention, KK's fit under the cap is least monotone in the count: try these counts one by one first.
_ATTENTION_SCAN = 16


# --------------------------------------------------------------- validation
def as_lengths(lengths: Any, *, name: str = "lengths") -> np.ndarray:
    """Validated 1-D int64 copy of ``lengths`` (list, numpy array or CPU/GPU tensor)."""
    if hasattr(lengths, "detach") and hasattr(lengths, "cpu"):  # a torch tensor; bfloat16 (no numpy type) as float32
        tensor = lengths.detach().cpu()
        lengths = (tensor.float() if str(tensor.dtype) == "torch.bfloat16" else tensor).numpy()
    try:
        arr = np.asarray(lengths)
    except (TypeError, ValueError) as exc:
        raise DataValueError(f"{name}: expected a 1-D sequence of integers, got {type(lengths).__name__} "
                             f"({exc})") from None
    if arr.ndim != 1:
        raise DataValueError(f"{name}: expected a 1-D sequence of integers, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, np.int64)
    if arr.dtype.kind not in "iuf":
        raise DataValueError(f"{name}: expected integers, got dtype {arr.dtype}")
    # checked before the int64 cast, which wraps (uint64) or saturates (float) past 2**63: -2**63 read as a length
    for bad, why in ((~np.isfinite(arr) | (arr != np.round(arr)), "expected a whole number of tokens"),
                     (arr < 0, "a length must be >= 0"), (arr >= 2**63, "too large for a token count")):
        if bad.any():
            i = int(np.argmax(bad))
            raise DataValueError(f"{name}[{i}] = {arr[i].item()!r}: {why}")
    return arr.astype(np.int64)


def _int_option(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ConfigValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ConfigValueError(f"{name}: expected an integer >= {minimum}, got {value}")
    if value > _INT64_MAX:  # the kernels compute in int64: an OverflowError from numpy/numba otherwise
        raise ConfigValueError(f"{name}: expected an integer <= 2**63 - 1, got {value}")
    return int(value)


def _check_options(cap, min_micro_batches, divisible_by, balance, attention_coef):
    cap = _int_option("max_tokens_per_micro_batch", cap, 1)
    min_micro_batches = _int_option("min_micro_batches", min_micro_batches, 1)
    divisible_by = _int_option("divisible_by", divisible_by, 1)
    if balance not in BALANCE_MODES:
        raise ConfigValueError(f"balance: expected one of {', '.join(BALANCE_MODES)}, got {balance!r}")
    attention_coef = _int_option("attention_coef", attention_coef, 0)
    return cap, min_micro_batches, divisible_by, balance, attention_coef


def balance_weights(lengths: np.ndarray, balance: str, attention_coef: int) -> np.ndarray:
    """What the partition balances: tokens, or a*L + L**2 (int64, exact)."""
    if balance == "tokens":
        return lengths
    approx = float(np.sum(lengths.astype(np.float64) * (attention_coef + lengths.astype(np.float64))))
    if approx >= _MAX_TOTAL_WEIGHT:
        raise DataValueError(
            f"lengths: attention costs a*L + L**2 add up to about {approx:.3g}, too large for exact "
            f"int64 balancing (limit 2**60); use balance='tokens' or a smaller attention_coef")
    return lengths * attention_coef + lengths * lengths


# --------------------------------------------------------------- algorithms

def packing_lower_bound(lengths: np.ndarray, cap: int) -> int:
    """A count below which no partition respects the cap.

    max(ceil(total / cap), max over j of ceil(#{L > cap / (j+1)} / j)): a
    micro-batch holds at most j samples longer than cap / (j + 1).
    """
    n = lengths.shape[0]
    if n == 0:
        return 0
    bound = -(-int(lengths.sum()) // cap)
    s = np.sort(lengths)
    j = np.arange(1, min(n, cap) + 1, dtype=np.int64)
    # L > cap / (j+1)  <=>  L > floor(cap / (j+1)) for integer L
    longer = n - np.searchsorted(s, cap // (j + 1), side="right")
    return max(bound, int(np.max(-(-longer // j))))


def _fill_empty_parts(labels: np.ndarray, lengths: np.ndarray, k: int) -> np.ndarray:
    """Move samples into empty parts (k <= n), each from the part with the most samples.

    The moved sample is that part's shortest (ties: highest index). Loads only
    shrink or become one sample, so a cap that held still holds.
    """
    labels = labels.copy()
    counts = np.bincount(labels, minlength=k)
    for empty in np.flatnonzero(counts == 0):
        donor = int(np.argmax(counts))
        if counts[donor] < 2:
            break
        members = np.flatnonzero(labels == donor)
        pick = members[np.lexsort((-members, lengths[members]))[0]]
        labels[pick] = empty
        counts[donor] -= 1
        counts[empty] = 1
    return labels


def kk_labels(weights: np.ndarray, k: int, limit: int | None = None, tokens: np.ndarray | None = None,
              token_limit: int | None = None) -> np.ndarray | None:
    """k-way Karmarkar-Karp labels through the numba kernel (compiled on first use); None past a limit.

    None when a part would weigh more than ``limit``, or its ``tokens`` (per item, not balanced) add up to
    more than ``token_limit`` (the kernel stops there).
    """
    from pdsr_sdk.batching.kk_kernel import kk_labels_fast

    weights = np.ascontiguousarray(weights, dtype=np.int64)
    tokens = weights if tokens is None else np.ascontiguousarray(tokens, dtype=np.int64)
    labels, ok = kk_labels_fast(weights, int(k), _INT64_MAX if limit is None else int(limit), tokens,
                                _INT64_MAX if token_limit is None else int(token_limit))
    return labels if ok else None


def _labels_to_partitions(labels: np.ndarray, weights: np.ndarray, k: int) -> list[list[int]]:
    order = np.argsort(labels, kind="stable")  # ascending indices inside each part
    counts = np.bincount(labels, minlength=k)
    groups = np.split(order, np.cumsum(counts)[:-1])
    loads = np.zeros(k, np.int64)
    np.add.at(loads, labels, weights)
    first = np.array([g[0] if len(g) else 0 for g in groups], np.int64)
    # heaviest first; ties by first index; empty parts last
    rank = np.lexsort((first, -loads, counts == 0))
    return [groups[j].tolist() for j in rank]


def validated_weights(lengths: np.ndarray, cap: int, balance: str, attention_coef: int) -> np.ndarray:
    """What the partition balances, after checking that every sample fits the cap and the total is exact."""
    too_long = np.flatnonzero(lengths > cap)
    if too_long.size:
        i = int(too_long[0])
        raise DataValueError(
            f"lengths[{i}] = {int(lengths[i])} tokens is longer than max_tokens_per_micro_batch={cap}: "
            f"a sample cannot be split across micro-batches; raise the cap or truncate/drop the sample"
            + (f" ({too_long.size} samples are too long)" if too_long.size > 1 else ""))
    # int64's sum wraps past 2**63 (and broke the cap): exact where the float sum says it could
    total = int(lengths.sum(dtype=object) if float(lengths.sum(dtype=np.float64)) >= 2.0**62 else lengths.sum())
    if total >= _MAX_TOTAL_TOKENS:
        raise DataValueError(f"lengths: {total} tokens in total, more than supported (2**53)")
    return balance_weights(lengths, balance, attention_coef)


def weight_limit(cap: int, balance: str, attention_coef: int) -> int:
    """The most a micro-batch within the token cap can weigh: a*T + sum of L**2 <= a*cap + cap**2 for T <= cap."""
    return cap if balance == "tokens" else min(attention_coef * cap + cap * cap, _INT64_MAX)


def partition_lengths(lengths: np.ndarray, cap: int, *, min_micro_batches: int, divisible_by: int,
                      balance: str, attention_coef: int, allow_empty: bool) -> list[list[int]]:
    """The search behind :func:`partition_by_tokens` on validated inputs.

    ``allow_empty=True`` (data-parallel padding) returns exactly the count the
    rules give even when it exceeds the number of samples, padding with empty
    micro-batches; otherwise that case raises DataValueError.
    """
    n = lengths.shape[0]
    d = divisible_by
    if n == 0 and not allow_empty:
        return []
    weights = validated_weights(lengths, cap, balance, attention_coef)
    bound = packing_lower_bound(lengths, cap)
    limit = weight_limit(cap, balance, attention_coef)

    def check_fill(k: int) -> None:
        if k > n and not allow_empty:
            raise DataValueError(
                f"lengths: {n} samples cannot fill {k} micro-batches (packing lower bound {bound}, "
                f"min_micro_batches={min_micro_batches}, divisible_by={d}, max_tokens_per_micro_batch={cap}); "
                f"partition_by_tokens never returns empty micro-batches: pass fewer/looser options, or use "
                f"partition_for_data_parallel / pad_micro_batches if empty micro-batches are acceptable")

    def fitting(k: int) -> np.ndarray | None:
        """KK's labels at k if every micro-batch keeps the token cap, else None."""
        return np.arange(n, dtype=np.int64) if k >= n else kk_labels(weights, k, limit, lengths, cap)

    k = lo = -(-max(bound, min_micro_batches) // d) * d
    check_fill(k)
    labels = fitting(k)
    if labels is None:
        from pdsr_sdk.batching.rebalance import ffd_labels, rebalance

        ffd, used = ffd_labels(lengths, cap)
        k = max(lo, -(-used // d) * d)  # FFD packs into k; KK is tried below it
        for _ in range(0 if balance == "tokens" else _ATTENTION_SCAN):  # one by one first
            if lo + d >= k:
                break
            got = fitting(lo + d)
            if got is not None:
                k, labels = lo + d, got
                break
            lo += d
        probe = k - d  # then FFD's count less one step (where KK's fit ends on long-tailed lengths), bisecting
        while probe > lo:
            got = fitting(probe)
            if got is None:
                lo = probe
            else:
                k, labels = probe, got
            probe = lo + (k - lo) // (2 * d) * d
        check_fill(k)
        if labels is None and k > lo:
            labels = fitting(k)
        if labels is None:
            labels = rebalance(_fill_empty_parts(ffd, lengths, k), weights, lengths, k, cap)
    return _labels_to_partitions(labels, weights, k)


# ------------------------------------------------------------------ public

def partition_by_tokens(lengths, max_tokens_per_micro_batch: int, *, min_micro_batches: int = 1,
                        divisible_by: int = 1, balance: str = "tokens",
                        attention_coef: int = DEFAULT_ATTENTION_COEF) -> list[list[int]]:
    """Split samples into the fewest balanced micro-batches whose token sums stay within a cap.

    Args:
        lengths: tokens per sample (list, numpy array or tensor of integers >= 0;
            zero-length samples are allowed).
        max_tokens_per_micro_batch: hard cap on the tokens of one micro-batch.
        min_micro_batches: at least this many micro-batches.
        divisible_by: the count is a multiple of this (e.g. pipeline stages).
        balance: ``"tokens"`` balances token sums; ``"attention"`` balances
            ``attention_coef * L + L**2`` per sample (the cap still counts tokens).
        attention_coef: the linear-layer weight a in a*L + L**2, about 12 x hidden size.

    Returns:
        Lists of sample indices, one per micro-batch: each index once, ascending
        inside a micro-batch, heaviest micro-batch first. ``[]`` for no samples.

    Raises:
        DataValueError (a DataError and a ValueError): a negative or non-integer length, a sample longer than the
            cap (names its index, length and the cap), or options that need more
            micro-batches than there are samples.
        ConfigValueError (a ConfigError and a ValueError): a bad option value.

    See the module docstring for the exact search rule.
    """
    cap, min_mb, d, balance, coef = _check_options(
        max_tokens_per_micro_batch, min_micro_batches, divisible_by, balance, attention_coef)
    arr = as_lengths(lengths)
    return partition_lengths(arr, cap, min_micro_batches=min_mb, divisible_by=d, balance=balance,
                             attention_coef=coef, allow_empty=False)


def inverse_permutation(partitions: Sequence[Sequence[int]]) -> np.ndarray:
    """``inv`` such that ``concat(outputs)[inv]`` is in the original sample order.

    ``inv[i]`` is the position of sample i in the micro-batches laid end to end.
    The partitions must hold each of 0..n-1 exactly once (DataValueError otherwise).
    """
    try:  # int() took 1.5 for sample 1: a silently wrong order
        flat = [operator.index(i) for part in partitions for i in part]
    except TypeError as exc:
        raise DataValueError(f"partitions: expected integer sample indices ({exc})") from None
    n, perm = len(flat), np.asarray(flat, dtype=np.int64)
    if n and (perm.min() < 0 or perm.max() >= n):
        bad = int(perm[(perm < 0) | (perm >= n)][0])
        raise DataValueError(f"partitions: index {bad} is outside 0..{n - 1} ({n} indices in all)")
    counts = np.bincount(perm, minlength=n)
    if n and (counts != 1).any():
        dup = np.flatnonzero(counts > 1)
        raise DataValueError(f"partitions: index {int(dup[0])} appears {int(counts[dup[0]])} times; "
                        f"each sample must appear exactly once")
    inv = np.empty(n, np.int64)
    inv[perm] = np.arange(n, dtype=np.int64)
    return inv


def _is_tensor(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def restore_order(per_micro_batch_outputs: Sequence[Any], partitions: Sequence[Sequence[int]]):
    """Outputs of each micro-batch -> all outputs in the original sample order.

    ``per_micro_batch_outputs[m]`` holds micro-batch m's samples along dim 0
    in the order of ``partitions[m]``: numpy arrays or torch tensors
    (concatenated, then index-permuted; trailing shapes must agree), jagged
    nested tensors (one row per sample, as verl's no-padding path returns;
    rebuilt as one nested tensor of the same layout) or Python lists
    (returned as one list). An empty micro-batch may give ``None``.
    """
    outputs = list(per_micro_batch_outputs)
    if len(outputs) != len(partitions):
        raise DataValueError(f"restore_order: {len(outputs)} outputs for {len(partitions)} micro-batches")
    inv = inverse_permutation(partitions)
    kinds = set()
    present = []
    for m, (out, part) in enumerate(zip(outputs, partitions)):
        if out is None:
            if len(part):
                raise DataValueError(f"restore_order: output {m} is None but micro-batch {m} has {len(part)} samples")
            continue
        if _is_tensor(out) and out.is_nested:
            kinds.add("nested tensor")
            size = int(out.size(0))
        elif _is_tensor(out):
            kinds.add("tensor")
            size = int(out.shape[0]) if out.dim() else -1
        elif isinstance(out, np.ndarray):
            kinds.add("array")
            size = out.shape[0] if out.ndim else -1
        elif isinstance(out, (list, tuple)):
            kinds.add("list")
            size = len(out)
        else:
            raise DataValueError(f"restore_order: output {m} is a {type(out).__name__}; expected a numpy array, "
                            f"torch tensor or list")
        if size != len(part):
            raise DataValueError(f"restore_order: output {m} has {size} rows along dim 0 but micro-batch {m} "
                            f"has {len(part)} samples")
        present.append(out)
    if len(kinds) > 1:
        raise DataValueError(f"restore_order: outputs mix {' and '.join(sorted(kinds))}; pass one kind")
    kind = kinds.pop() if kinds else "list"
    if kind == "list":
        flat = [x for out in present for x in out]
        return [flat[p] for p in inv.tolist()]
    if kind == "nested tensor":  # ragged rows: no trailing shape to agree on, no torch.cat
        torch = sys.modules["torch"]
        rows = [row for out in present for row in out.unbind()]
        return torch.nested.as_nested_tensor([rows[p] for p in inv.tolist()], layout=present[0].layout)
    trailing = {tuple(out.shape[1:]) for out in present}
    if len(trailing) > 1:
        raise DataValueError(f"restore_order: micro-batch outputs have different trailing shapes "
                        f"{sorted(trailing)}; pad them to one shape or pass lists")
    if kind == "array":
        return np.concatenate(present, axis=0)[inv]
    torch = sys.modules["torch"]
    joined = torch.cat(present, dim=0)
    return joined.index_select(0, torch.as_tensor(inv, device=joined.device))
