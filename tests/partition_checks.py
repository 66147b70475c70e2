"""Shared by the micro-batching tests: what every partition of sample indices must be."""

from __future__ import annotations


def check_partition(parts, n):
    flat = sorted(i for p in parts for i in p)
    assert flat == list(range(n)), "every index exactly once"
    for p in parts:
        assert p == sorted(p), "indices ascend inside a micro-batch"
