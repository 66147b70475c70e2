"""EngineLeads (v3's move guard): each engine's furthest-along sample, held to a scan of every sample."""

from __future__ import annotations

import random

import pytest

from pdsr_sdk.dispatch.types import Group, Sample
from pdsr_sdk.policies.engine_leads import EngineLeads


def scan(placement: dict[Sample, str], name: str) -> int | None:
    produced = [s.num_generated for s, e in placement.items() if e == name]
    return max(produced) if produced else None


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_each_engines_lead_matches_a_scan_of_its_samples(seed, streamed):
    """Random placements, segment ends (tokens only grow), moves, restarts (tokens back to 0), finishes and a
    lost engine; every engine's lead is read after every step and held to a scan of its samples. Small engines,
    so heaps are compacted often. With ``streamed``, tokens also arrive between notes (a real engine streams
    them between segment ends): the lead then lies between the most any sample had at its last note and the
    truth; without, it is exact."""
    rng = random.Random(seed)
    engines = ["e0", "e1", "e2"]
    group = Group(prompt_id="p", prompt_token_ids=[1], prompt_text="p", n=40)
    samples = [Sample(group=group, index=i, max_tokens=10**6) for i in range(40)]
    placement: dict[Sample, str] = {}
    noted: dict[Sample, int] = {}
    leads = EngineLeads(placement)

    def note(s):
        nonlocal notes
        notes += 1
        noted[s] = s.num_generated
        leads.note(s, sum(1 for e in placement.values() if e == placement[s]))

    notes = 0
    for _ in range(3000):
        op = rng.random()
        s = rng.choice(samples)
        if s not in placement:
            if op < 0.5:
                s.num_generated = 0
                placement[s] = rng.choice(engines)
                note(s)
        elif op < 0.6:      # a segment ends
            s.num_generated += rng.randint(0, 50)
            note(s)
        elif op < 0.7:      # tokens streamed in, not noted yet
            if streamed:
                s.num_generated += rng.randint(1, 20)
        elif op < 0.78:     # moved
            placement[s] = rng.choice(engines)
            note(s)
        elif op < 0.84:     # restarted where it runs
            s.num_generated = 0
            note(s)
        elif op < 0.95:     # finished or requeued: it leaves its engine
            del placement[s]
        elif op > 0.998 and len(engines) > 1:   # an engine is lost, its samples requeued
            lost = engines.pop()
            for x in [x for x, e in placement.items() if e == lost]:
                del placement[x]
            leads.drop(lost)
        for name in engines:
            got, want = leads.lead(name), scan(placement, name)
            if want is None:
                assert got is None
                continue
            floor = max(noted[x] for x, e in placement.items() if e == name)
            if streamed:
                assert got is not None and floor <= got <= want
            else:
                assert got == want
    # compacted on the way: far more entries were pushed than any heap holds
    assert notes > 1000 and max(len(h) for h in leads.heaps.values()) <= 2 * len(samples) + 64 + 1


def test_the_lead_is_exact_when_every_change_is_noted():
    group = Group(prompt_id="p", prompt_token_ids=[1], prompt_text="p", n=40)
    a, b, c = (Sample(group=group, index=i, max_tokens=100) for i in range(3))
    placement = {a: "e0", b: "e0", c: "e1"}
    leads = EngineLeads(placement)
    for s in (a, b, c):
        leads.note(s, 2)
    assert leads.lead("e0") == 0 and leads.lead("e1") == 0 and leads.lead("e2") is None
    a.num_generated = 30
    leads.note(a, 2)
    b.num_generated = 10
    leads.note(b, 2)
    assert leads.lead("e0") == 30
    placement["a"] = placement.pop(a)   # a leaves e0
    assert leads.lead("e0") == 10
    b.num_generated = 0                  # b restarted, noted at 0
    leads.note(b, 1)
    assert leads.lead("e0") == 0
    del placement[b]
    assert leads.lead("e0") is None
