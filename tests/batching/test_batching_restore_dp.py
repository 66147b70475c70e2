"""Token-quota micro-batching: restoring the order of micro-batched outputs, and data-parallel ranks agreeing on a
count (threads, and processes over gloo). References are the outputs computed on the unbatched data."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from partition_checks import check_partition
from support import WAIT_S

from pdsr_sdk.batching import (
    all_reduce_max,
    common_micro_batch_count,
    inverse_permutation,
    pad_micro_batches,
    partition_by_tokens,
    partition_for_data_parallel,
    partition_on_rank,
    restore_order,
)
from pdsr_sdk.errors import ConfigError, DataError

SETTINGS = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------- restoring

@st.composite
def random_partitions(draw):
    n = draw(st.integers(0, 40))
    perm = draw(st.permutations(list(range(n))))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=6)))
    bounds = [0, *cuts, n]
    return [sorted(perm[a:b]) if draw(st.booleans()) else list(perm[a:b]) for a, b in zip(bounds, bounds[1:])]


def rowwise(x):
    # Any per-sample function: each output row depends only on its input row.
    return x * x + x.sum(axis=1, keepdims=True)


@SETTINGS
@given(random_partitions())
def test_restore_arrays_and_lists_match_unbatched(parts):
    n = sum(len(p) for p in parts)
    data = np.arange(n * 3, dtype=np.int64).reshape(n, 3) * 7 % 31
    outputs = [rowwise(data[p]) if p else np.zeros((0, 3), np.int64) for p in parts]
    assert np.array_equal(restore_order(outputs, parts), rowwise(data))
    names = [f"sample-{i}" for i in range(n)]
    assert restore_order([[names[i] for i in p] for p in parts], parts) == names
    inv = inverse_permutation(parts)
    flat = np.array([i for p in parts for i in p], np.int64)
    assert np.array_equal(flat[inv], np.arange(n))


def test_restore_torch_tensors_match_unbatched():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 50, 37)
    parts = partition_by_tokens(lengths, 120)
    data = torch.from_numpy(rng.standard_normal((37, 4)))
    out = restore_order([torch.tanh(data[p]) * 3 for p in parts], parts)
    assert isinstance(out, torch.Tensor)
    assert torch.equal(out, torch.tanh(data) * 3)


def test_restore_jagged_nested_tensors_match_unbatched():
    # verl's no-padding path returns log-probs as jagged nested tensors, one ragged row per sample
    # (restore_dynamic_batch takes them); each row here is a function of its sample alone.
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    lengths = rng.integers(1, 40, 23)
    parts = partition_by_tokens(lengths, 90)
    rows = [torch.from_numpy(rng.standard_normal(int(n))) for n in lengths]
    expected = [torch.tanh(r) * 2 for r in rows]
    outputs = [torch.nested.as_nested_tensor([torch.tanh(rows[i]) * 2 for i in p], layout=torch.jagged)
               for p in parts]
    out = restore_order(outputs, parts)
    assert out.is_nested and out.layout == torch.jagged
    got = out.unbind()
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))
    with pytest.raises(DataError, match="mix nested tensor and tensor"):
        restore_order([outputs[0], torch.zeros(len(parts[1]))] + outputs[2:], parts)
    with pytest.raises(DataError, match="output 0 has"):
        restore_order([outputs[1], outputs[0]] + outputs[2:], parts)


def test_restore_with_padding_and_bad_outputs():
    parts = pad_micro_batches([[2, 0], [1]], 4)
    assert parts == [[2, 0], [1], [], []]
    out = restore_order([np.array([20, 0]), np.array([10]), None, np.zeros(0, np.int64)], parts)
    assert out.tolist() == [0, 10, 20]
    with pytest.raises(DataError, match="output 1 has 2 rows along dim 0 but micro-batch 1 has 1"):
        restore_order([np.array([1, 2]), np.array([1, 2])], [[0, 1], [2]])
    with pytest.raises(DataError, match="2 outputs for 3 micro-batches"):
        restore_order([[1], [2]], [[0], [1], [2]])
    with pytest.raises(DataError, match="index 1 appears 2 times"):
        inverse_permutation([[0, 1], [1]])
    with pytest.raises(DataError, match="outside"):
        inverse_permutation([[0, 5]])
    with pytest.raises(DataError, match="trailing shapes"):
        restore_order([np.zeros((1, 3)), np.zeros((1, 4))], [[0], [1]])
    with pytest.raises(DataError, match="mix"):
        restore_order([np.zeros(1), [1]], [[0], [1]])
    with pytest.raises(DataError, match="more than count"):
        pad_micro_batches([[0], [1]], 1)
    # a TypeError ("'>' not supported between instances of 'int' and 'str'") before
    with pytest.raises(ConfigError, match="count: expected an integer >= 0, got '3'"):
        pad_micro_batches([[0]], "3")
    with pytest.raises(ConfigError, match="count: expected an integer >= 0, got 2.5"):
        pad_micro_batches([[0]], 2.5)


def test_non_integer_indices_are_refused_not_truncated():
    # int() made 1.5 index 1: restore_order put the rows back as if the partition had said 1.
    with pytest.raises(DataError, match="partitions: expected integer sample indices"):
        inverse_permutation([[0, 1.5], [2]])
    with pytest.raises(DataError, match="integer sample indices"):
        restore_order([[10, 11], [12]], [[0, 1.5], [2]])
    assert inverse_permutation([np.array([2, 0]), [np.int32(1)]]).tolist() == [1, 2, 0]


# ---------------------------------------------------------- data parallel

@st.composite
def dp_cases(draw):
    cap = draw(st.integers(5, 100))
    ranks = draw(st.lists(st.lists(st.integers(0, cap), max_size=25), min_size=1, max_size=5))
    return ranks, cap


@SETTINGS
@given(dp_cases(), st.integers(1, 3), st.integers(1, 3))
def test_data_parallel_same_count_caps_hold_nothing_lost(case, min_mb, d):
    ranks, cap = case
    result = partition_for_data_parallel(ranks, cap, min_micro_batches=min_mb, divisible_by=d)
    counts = {len(parts) for parts in result}
    assert len(counts) == 1
    count = counts.pop()
    assert count % d == 0 and count >= min_mb
    for lengths, parts in zip(ranks, result):
        check_partition(parts, len(lengths))
        assert all(sum(lengths[i] for i in p) <= cap for p in parts)
        if len(lengths) >= count:
            assert all(parts), "a rank with enough samples is re-balanced, not padded"
        else:
            assert sorted(len(p) for p in parts) == [0] * (count - len(lengths)) + [1] * len(lengths)
        try:
            own = len(partition_by_tokens(lengths, cap, min_micro_batches=min_mb, divisible_by=d))
        except DataError:
            continue  # more micro-batches than samples on its own: this rank is padded
        assert own <= count


def test_data_parallel_rebalances_the_lighter_rank():
    heavy = [100] * 8  # needs 4 micro-batches under a cap of 200
    light = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]  # 1 on its own
    result = partition_for_data_parallel([heavy, light], 200)
    assert [len(r) for r in result] == [4, 4]
    loads = [sum(light[i] for i in p) for p in result[1]]
    assert max(loads) - min(loads) <= max(light)
    assert all(result[1])
    assert partition_for_data_parallel([[], [1, 1]], 5) == [[[]], [[0, 1]]]
    with pytest.raises(DataError, match=r"lengths_per_rank\[1\]\[0\] = -1"):
        partition_for_data_parallel([[1], [-1]], 5)
    with pytest.raises(DataError, match=r"rank 0: lengths\[0\] = 9 tokens"):
        partition_for_data_parallel([[9], [1]], 5)


def test_common_count_and_reduce_without_process_group():
    assert common_micro_batch_count([3, 7, 2]) == 7
    with pytest.raises(ConfigError):
        common_micro_batch_count([])
    with pytest.raises(ConfigError, match=r"counts\[1\]"):
        common_micro_batch_count([1, -2])
    assert all_reduce_max(5) == 5


def barrier_reducers(barrier, calls):
    """One max-reduce per simulated rank, meeting at ``barrier`` (as a collective does); ``calls[rank]`` counts."""
    slots = [0] * len(calls)

    def reducer(rank):
        def reduce_max(value):
            calls[rank] += 1
            slots[rank] = value
            barrier.wait()
            out = max(slots)
            barrier.wait()
            return out
        return reduce_max
    return reducer


def thread_ranks(ranks, cap, **kw):
    """Run partition_on_rank on threads, one per simulated rank, with a barrier max-reduce."""
    world = len(ranks)
    barrier = threading.Barrier(world)
    calls = [0] * world
    reducer = barrier_reducers(barrier, calls)

    results = [None] * world
    errors = []

    def run(rank):
        try:
            results[rank] = partition_on_rank(ranks[rank], cap, reduce_max=reducer(rank), **kw)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(set(calls)) == 1, "every rank reduces equally often"
    return results


@settings(deadline=None, max_examples=40)
@given(dp_cases(), st.integers(1, 3))
def test_partition_on_rank_agrees_like_the_single_process_helper(case, d):
    ranks, cap = case
    assert thread_ranks(ranks, cap, divisible_by=d) == partition_for_data_parallel(ranks, cap, divisible_by=d)


def test_a_rank_that_cannot_partition_does_not_leave_the_others_waiting():
    # A collective does not return until every rank has called it. Before, rank 0's error (a sample over the cap)
    # came before its reduce, and rank 1 waited in the reduce (here: until the barrier's timeout).
    ranks = [[9, 1], [1, 2, 3]]
    reducer = barrier_reducers(threading.Barrier(2, timeout=20), [0, 0])
    errors = [None, None]

    def run(rank):
        try:
            partition_on_rank(ranks[rank], 5, reduce_max=reducer(rank))
        except Exception as exc:  # checked below
            errors[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert isinstance(errors[0], DataError) and "lengths[0] = 9 tokens" in str(errors[0])
    assert isinstance(errors[1], DataError), errors[1]
    assert "another rank of the group could not partition its samples" in str(errors[1])


def _gloo_rank(rank, world, store_path, lengths, cap, queue):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    try:
        queue.put((rank, all_reduce_max(10 * rank + 3), partition_on_rank(lengths, cap)))
    finally:
        dist.destroy_process_group()


def test_all_reduce_max_and_partition_on_rank_over_gloo(tmp_path):
    pytest.importorskip("torch")
    ranks = [[50, 50, 50, 50, 50, 50], [5, 6, 7]]
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_gloo_rank, args=(r, 2, str(tmp_path / "store"), ranks[r], 100, queue))
             for r in range(2)]
    for p in procs:
        p.start()
    got = dict((rank, (m, parts)) for rank, m, parts in (queue.get(timeout=WAIT_S) for _ in procs))
    for p in procs:
        p.join(timeout=WAIT_S)
        assert p.exitcode == 0
    assert got[0][0] == got[1][0] == 13
    assert [got[0][1], got[1][1]] == partition_for_data_parallel(ranks, 100)
    assert len(got[0][1]) == len(got[1][1]) == 3


def test_import_is_lazy():
    code = ("import sys, pdsr_sdk.batching; "
            "print(sorted(m for m in ('numba', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
