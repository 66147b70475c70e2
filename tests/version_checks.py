"""Shared by the staggered-update tests (tests/sim/test_sim_staggered.py, tests/rollout/test_rollout_vllm_stagger.py):
an engine holds one set of weights, so no two of its segments that overlap in time were made by different versions."""

from __future__ import annotations


def assert_one_version_at_a_time(samples) -> None:
    by_engine: dict[str, list] = {}
    for s in samples:
        for seg in s.segments:
            by_engine.setdefault(seg.engine, []).append(seg)
    for name, segs in by_engine.items():
        segs.sort(key=lambda x: x.submit_time_s)
        for i, x in enumerate(segs):
            for y in segs[i + 1:]:
                if y.submit_time_s >= x.end_time_s:
                    break   # the later ones start later still
                assert x.policy_version == y.policy_version, (name, x, y)
