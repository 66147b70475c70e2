"""v3 over many batches on fake engines (tests/fakes.py, virtual time): its books stay the size of the work in flight,
however many batches the run has had (a run of days goes through thousands)."""

from __future__ import annotations

import random

from fakes import FakeEngine
from pdsr_sdk.dispatch.clock import VirtualClock
from pdsr_sdk.dispatch.config import SamplingConfig, SegmentConfig
from pdsr_sdk.dispatch.run import DispatchRun
from pdsr_sdk.policies.resolve import resolve_policy
from pdsr_sdk.policies.v3.migration import _MAX_TARGETS_TRIED
from pdsr_sdk.rollout.data import PromptRecord, build_groups

LONG = 600


def v3_run(seed: int = 0):
    """v3 on two fast engines and a heavy one; returns the run and ``batch()``, which runs one batch of 4 groups of
    4 forced lengths (mostly short, now and then one to LONG: a tail to move) to its end."""
    rng = random.Random(seed)
    clock = VirtualClock()
    engines = [FakeEngine(f"fast-{i}", "fast", clock, max_concurrency=4) for i in range(2)]
    engines.append(FakeEngine("heavy-0", "heavy", clock, max_concurrency=4))
    cls, settings = resolve_policy("v3", {})
    fatal: list = []
    run = DispatchRun(engines, cls, settings, clock, SamplingConfig(n=4, max_tokens=LONG),
                      SegmentConfig(min_tokens=16, max_tokens=64), on_fatal=fatal.append)
    count = iter(range(10**9))

    def batch() -> None:
        records = []
        for _ in range(4):
            i = next(count)
            lengths = [rng.choice([5, 10, 20, 40, 80, 200] * 8 + [LONG]) for _ in range(4)]
            records.append(PromptRecord(f"q{i}", f"p{i}", [1, 2, 3 + i % 50], target_lengths=lengths))
        done: list = []
        run.start_batch(build_groups(records, 4, LONG), lambda: done.append(True))
        clock.run(until=lambda: bool(done) or bool(fatal))
        assert not fatal, fatal
        run.finish_batch()
        for e in engines:
            e.submitted.clear()   # the fake's own record of requests, not the policy's

    return run, batch


def test_the_heap_of_move_targets_stays_bounded_and_names_the_best_target():
    """The ledger's lazy heap of move targets took an entry at every placement and finish and dropped outdated ones
    only as they reached its top at a lookup, which a batch without moves never makes: it grew by two entries per
    sample for good (16,000 after 500 batches of 16 samples). It is now dropped past ``max_targets()`` and rebuilt
    at the next lookup, which still names the engine with the fewest tail samples, then the fewest samples."""
    run, batch = v3_run()
    ledger = run.policy.ledger
    sizes = []
    for n in range(500):
        batch()
        sizes.append(len(ledger.targets))
    bound = 2 * 3 + 32   # two entries per engine and 32
    # a move's search pushes back the targets it ruled out (up to _MAX_TARGETS_TRIED) after the last push
    assert max(sizes) <= bound + _MAX_TARGETS_TRIED, max(sizes)
    assert ledger.max_targets() == bound
    assert run.scheduler.stats["samples_finished"] == 500 * 16
    target = ledger.best_target()
    want = min(ledger.tail_on, key=lambda name: (ledger.tail_on[name], ledger.assigned[name], name))
    assert target is not None and target.name == want
