"""What each v3 setting does, asserted: for the settings whose only test was that a changed value schedules
differently (tests/policies/test_v3_settings.py::test_changing_a_setting_changes_what_v3_does), a scenario in which
the setting's own effect is visible and checked against what its description says (or an independent reference)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pdsr_sdk.dispatch.types import Group, Sample
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.policies.v3 import V3Policy
from pdsr_sdk.policies.v3.ledger import Ledger
from pdsr_sdk.policies.v3.lengths import Lengths
from pdsr_sdk.policies.v3.migration import Migration
from pdsr_sdk.policies.v3.settings import V3Settings
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import run_policy, trace_batches
from pdsr_sdk.sim.steps import run_steps
from pdsr_sdk.traces import LengthTrace, synth_trace
from sim_cases import small_cfg
from v3_cases import EQUAL

PROF = dict(max_num_seqs=32, kv_cache_tokens=65536)


def _batches(settings, trace=None, **kw):
    """Three batches of 32 groups of eight (informative: the probe predicts) on three fast and one heavy engine."""
    trace = trace if trace is not None else synth_trace(groups=200, n=8, seed=5, runaway_frac=0.02, max_length=2048)
    base = dict(policy="v3", fast=3, heavy=1, batch_size=32, timeline=False, references=False, num_batches=3,
                profiles={"fast": PROF, "heavy": PROF}) | kw
    cfg = SimulateConfig(**base, policy_settings={"v3": settings})
    return run_policy(trace_batches(trace, cfg), cfg, "v3", keep_groups=True)


def _stream(settings, **kw):
    """A stream under a staleness bound (S = 1) with a few runaways, replayed restarts."""
    kw = {"fast": 3, "heavy": 1, "max_staleness": 1, "profiles": {"fast": EQUAL, "heavy": EQUAL},
          "restart_lengths": "replay"} | kw
    cfg = SimulateConfig(policy="v3", batch_size=32, steps=8, over_provision=0.25, timeline=False, references=False,
                         policy_settings={"v3": settings}, **kw)
    return run_steps(synth_trace(groups=400, n=8, seed=7, runaway_frac=0.01), cfg, "v3", 0.25, keep_groups=True)


def _short(seed=2, groups=300):
    # runaways (0.4% at 1,500 tokens) among ~120-token responses: at S = 1 they outlive their window
    return synth_trace(groups=groups, n=8, seed=seed, median_length=120, max_length=1500, runaway_frac=0.004,
                       prompt_len_min=5, prompt_len_max=100)


# ----------------------------------------------------------------------------------------------- ranking
def test_without_probes_first_no_sample_is_a_probe_and_queue_order_is_kept():
    """One single-slot engine, the rank off: probes (sample 0 of each group) go first and are counted; with
    ``disable: [probes_first]`` none is marked or counted, and the pool is in plain queue order."""
    unit = dict(max_num_seqs=1, kv_cache_tokens=4096, c0_s=0.01, c1_s_per_seq=0.0, c2_s_per_token=0.0,
                prefill_s_per_token=0.0)
    trace = LengthTrace.from_matrix(np.array([[10, 10, 10], [50, 50, 50]]), prompt_lens=[1, 1])
    orders, probes = {}, {}
    for disable in ([], ["probes_first"]):
        cfg = SimulateConfig(policy="v3", fast=1, heavy=0, timeline=False, batch_size=2, references=False,
                             profiles={"fast": unit, "heavy": unit}, segments={"enabled": False},
                             policy_settings={"v3": {"placement": {"mode": "deal"}, "ranking": {"mode": "never"},
                                                     "disable": disable}})
        run = run_policy(trace_batches(trace, cfg), cfg, "v3", keep_groups=True)
        samples = [s for g in run.groups for s in g.samples]
        orders[bool(disable)] = [s.key for s in sorted(samples, key=lambda s: s.segments[0].submit_time_s)]
        probes[bool(disable)] = (sum(s.is_probe for s in samples), run.stats["probes"])
    assert orders[False] == ["p0/0", "p1/0", "p0/1", "p0/2", "p1/1", "p1/2"] and probes[False] == (2, 2)
    assert orders[True] == ["p0/0", "p0/1", "p0/2", "p1/0", "p1/1", "p1/2"] and probes[True] == (0, 0)


@pytest.mark.parametrize("min_correlation", [0.3, 0.99])
def test_the_rank_is_on_exactly_while_the_measured_correlation_reaches_min_correlation(min_correlation):
    """The probe's correlation here is 0.50-0.59: the default 0.3 ranks every batch, 0.99 none."""
    run = _batches({"ranking": {"min_correlation": min_correlation}})
    facts = [b.policy for b in run.batches]
    assert all(0.4 < f["probe_correlation"] < 0.7 for f in facts), facts
    assert [f["ranking"] for f in facts] == [min_correlation <= 0.3] * 3


@pytest.mark.parametrize("window", [21, 1024])
def test_the_correlation_is_measured_over_the_last_correlation_window_pairs(window):
    """The correlation v3 reports is that of log(1 + length) of each probe against each of its siblings over the
    last ``correlation_window`` pairs of the groups completed so far, in the order they completed (numpy's, on the
    groups as they ran). 21 pairs: the last three groups of eight."""
    run = _batches({"ranking": {"correlation_window": window, "min_pairs": 21}}, num_batches=1)
    groups = sorted(run.groups, key=lambda g: max(s.finish_time_s for s in g.samples))
    ends = [max(s.finish_time_s for s in g.samples) for g in groups]
    assert len(set(ends[-4:])) == 4   # (no tie decides which groups are in the window)
    pairs = [(g.samples[0].num_generated, s.num_generated) for g in groups for s in g.samples[1:]][-window:]
    x, y = np.log1p(np.array(pairs, dtype=float)).T
    assert run.batches[0].policy["probe_correlation"] == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-4)


def test_a_window_shorter_than_min_pairs_is_refused():
    """Such a window never holds enough pairs, so 'auto' never measured and never ranked, without a word (every
    batch reported probe_correlation None); it is a ConfigError naming both keys."""
    with pytest.raises(ConfigError, match=r"ranking.correlation_window \(16\) holds fewer pairs than "
                                          r"ranking.min_pairs \(64\) needs"):
        _batches({"ranking": {"correlation_window": 16}})
    facts = [b.policy for b in _batches({"ranking": {"correlation_window": 16, "min_pairs": 16}}).batches]
    assert any(f["probe_correlation"] is not None for f in facts)


def test_the_default_min_pairs_is_first_reached_by_the_tenth_group_of_eight():
    """A group of eight gives seven (probe, sibling) pairs, so the default 64 pairs are first held once ten groups
    have completed (70 pairs; nine give 63), as the description says (it said eight groups, 56 pairs). One group a
    batch: the correlation is first reported after the tenth."""
    run = _batches({}, batch_size=1, num_batches=11)
    measured = [b.policy["probe_correlation"] is not None for b in run.batches]
    assert measured == [False] * 9 + [True] * 2
    description = V3Settings.model_fields["ranking"].annotation.model_fields["min_pairs"].description
    assert "ten groups of eight" in description


# ----------------------------------------------------------------------------------------------- lengths
def _last_finished(run, batch, size):
    """The lengths of the last ``size`` samples to finish by the end of ``batch``, sorted (none tied across the
    window's edge: which one is in it would be a guess)."""
    done = sorted((s for g in run.groups if g.batch_index <= batch for s in g.samples), key=lambda s: s.finish_time_s)
    if size < len(done):
        assert done[-size - 1].finish_time_s < done[-size].finish_time_s
    return sorted(s.num_generated for s in done[-size:])


def test_the_tail_threshold_is_read_from_the_last_history_finished_lengths():
    """The thresholds are quantiles of the last ``lengths.history`` finished lengths, in the order they finished
    (the cap runners' threshold out of the way): after each batch, 0.9 of the last 64 with history 64, of every
    one with the default 2,048 (a different threshold after every batch here)."""
    tail = {"cap_runner_share": 1.0}
    short, full = (_batches({"lengths": {"history": h}, "migration": tail}) for h in (64, 2048))
    for run, size in ((short, 64), (full, 2048)):
        windows = [_last_finished(run, b, size) for b in range(3)]
        assert [b.policy["tail_threshold"] for b in run.batches] == [w[int(0.9 * len(w))] for w in windows]
    assert all(a.policy["tail_threshold"] != b.policy["tail_threshold"] for a, b in zip(short.batches, full.batches))


# ----------------------------------------------------------------------------------------------- placement
def _peak_running(run, pool):
    """The most samples running at once on one engine of ``pool`` (from the segments' spans)."""
    events: dict[str, list[tuple[float, int]]] = {}
    for s in (s for g in run.groups for s in g.samples):
        for seg in s.segments:
            if seg.pool == pool:
                events.setdefault(seg.engine, []).extend([(seg.submit_time_s, 1), (seg.end_time_s, -1)])
    peak = 0
    for spans in events.values():
        now = 0
        for _, step in sorted(spans, key=lambda e: (e[0], e[1])):
            now += step
            peak = max(peak, now)
    return peak


def test_heavy_max_seqs_holds_the_heavy_engines_where_work_is_dealt():
    dealt = {"placement": {"mode": "deal"}}
    free, held = _batches(dealt), _batches({"placement": {"mode": "deal", "heavy_max_seqs": 2}})
    assert _peak_running(free, "heavy") == PROF["max_num_seqs"]
    assert _peak_running(held, "heavy") == 2 and _peak_running(held, "fast") == PROF["max_num_seqs"]


def test_heavy_max_seqs_holds_the_heavy_engines_under_auto_placement_and_is_refused_with_chunks():
    """'auto' placed these batches in chunks, which hand a heavy engine its whole chunk: the heavy engine ran 32
    samples at once with heavy_max_seqs 2. Set, it makes 'auto' deal; with 'chunk' it is refused."""
    held = _batches({"placement": {"mode": "auto", "heavy_max_seqs": 2}})
    assert _peak_running(held, "heavy") == 2
    assert _peak_running(_batches({}), "heavy") == PROF["max_num_seqs"]
    with pytest.raises(ConfigError, match=r"placement.heavy_max_seqs \(2\) holds the heavy engines back only where"):
        _batches({"placement": {"mode": "chunk", "heavy_max_seqs": 2}})


def _engines_per_group(run, batch):
    """How many engines each group of ``batch`` first ran its samples on."""
    return [len({s.segments[0].engine for s in g.samples}) for g in run.groups if g.batch_index == batch]


@pytest.mark.parametrize("mode, spread", [("chunk", [False] * 3), ("deal", [True] * 3), ("auto", [True, False, False])])
def test_placement_mode_chunks_or_deals_each_batch(mode, spread):
    """Moves off (a moved sample ran on two engines): 'chunk' gives each engine contiguous whole groups (32 groups of
    eight in four chunks of 64), so every group starts on one engine; 'deal' hands out samples one at a time and
    spreads groups; 'auto' deals the cold first batch, which queues for slots (256 samples, 128 slots), and chunks
    the batches after it."""
    run = _batches({"placement": {"mode": mode}, "disable": ["migration"]})
    per_batch = [_engines_per_group(run, b) for b in range(3)]
    assert [max(n) > 1 for n in per_batch] == spread, per_batch
    assert all(min(n) == 1 and len(n) == 32 for n in per_batch if max(n) == 1)


# ----------------------------------------------------------------------------------------------- migration
def _sorted_finished(run, batches):
    return sorted(s.num_generated for g in run.groups if g.batch_index < batches for s in g.samples)


def test_the_tail_threshold_is_the_migration_quantile_of_the_finished_lengths():
    """After each batch (256 finishes: the thresholds were just set again, the history of 2,048 holds them all)
    the tail threshold is the ``migration.quantile`` of every finished length (the cap runners' threshold out of
    the way: cap_runner_share 1)."""
    for q in (0.9, 0.5):
        run = _batches({"migration": {"quantile": q, "cap_runner_share": 1.0}})
        for b, batch in enumerate(run.batches):
            lengths = _sorted_finished(run, b + 1)
            assert batch.policy["tail_threshold"] == lengths[int(q * len(lengths))], (q, b)


def test_the_tail_threshold_is_the_cap_runners_length_below_cap_runner_share():
    """With the quantile out of the way (1), a sample joins the tail past the shortest finished length beyond which
    at most 1 / cap_runner_share as many samples lie as ran to the cap (a sample past it runs to the cap with at
    least that chance); a lower share, a lower threshold."""
    thresholds = {}
    for share in (0.5, 0.05):
        run = _batches({"migration": {"quantile": 1.0, "cap_runner_share": share}})
        thresholds[share] = [b.policy["tail_threshold"] for b in run.batches]
        for b, got in enumerate(thresholds[share]):
            lengths = _sorted_finished(run, b + 1)
            n, at_cap = len(lengths), sum(x == 2048 for x in lengths)
            assert 0 < at_cap < n
            k = next(k for k in range(1, n + 1) if n - k <= at_cap / share + 1e-9)
            assert got == lengths[k - 1], (share, b)
    assert all(a > b for a, b in zip(thresholds[0.5], thresholds[0.05]))


def test_the_stream_tail_follows_stream_quantile():
    never = {"lane": {"mode": "never"}}
    default, lower = _stream(never), _stream({**never, "migration": {"stream_quantile": 0.8}})
    assert lower.policy_facts["tail_threshold"] < default.policy_facts["tail_threshold"]
    assert lower.stats["moves"] > default.stats["moves"] > 0


def test_kv_headroom_of_one_leaves_no_target_room():
    """A target takes a moved sample only while its KV cache keeps ``kv_headroom`` free with the moved context
    added: at 1 no engine ever does."""
    assert _batches({}).stats["moves"] > 0
    assert _batches({"migration": {"kv_headroom": 1.0}}).stats["moves"] == 0


class _Ctx(SimpleNamespace):
    def pools(self):
        return {"fast": self.engines}

    def move(self, sample, pool=None, *, engine=None, **_):
        self.moved.append((sample, engine.name))

    def free_slots(self, engine):
        return 1


def _engine(name):
    load = SimpleNamespace(kv_cache_usage=None)
    return SimpleNamespace(name=name, pool="fast", max_concurrency=64, kv_cache_tokens=0, load=lambda: load)


@pytest.mark.parametrize("settings, moves", [({}, False), ({"min_ratio": 0.6}, True),
                                             ({"min_ratio": 0.6, "min_gap": 5}, False),
                                             ({"min_ratio": 1.0, "min_gap": 4}, True)])
def test_a_move_needs_min_gap_fewer_samples_and_at_most_min_ratio_of_the_source(settings, moves):
    """A tail sample on an engine running 10 samples, the only other engine running 6 and no tail sample: 4
    fewer, 0.6 of the source. The default (min_gap 4, min_ratio 0.5) keeps it; min_ratio 0.6 moves it, unless
    min_gap asks for 5 fewer."""
    cfg = V3Settings.model_validate({"migration": settings})
    src, dst = _engine("a"), _engine("b")
    ctx = _Ctx(engines=[src, dst], moved=[], streaming=False, sampling=SimpleNamespace(max_tokens=1000))
    ledger = Ledger(cfg, ctx)
    ledger.arrive([src, dst], [])
    group = Group(prompt_id="p", prompt_token_ids=[1, 2], prompt_text="", n=16)
    group.samples = [Sample(group=group, index=i, max_tokens=1000) for i in range(16)]
    for i, s in enumerate(group.samples):
        ledger.place(s, src if i < 10 else dst, 100.0)
    lengths = Lengths(cfg, ctx, lambda: True)
    runner = group.samples[0]
    runner.num_generated = 300
    ledger.mark_tail(runner, "a", +1)
    Migration(cfg, ctx, ledger, lengths).move(runner, src)
    assert ctx.moved == ([(runner, "b")] if moves else [])


# ----------------------------------------------------------------------------------------------- the lane
def test_lane_engines_limits_the_lane_to_the_first_heavy_engines():
    always = {"mode": "always"}
    assert _stream({"lane": always}, heavy=2).policy_facts["lane_engines"] == ["heavy-0", "heavy-1"]
    assert _stream({"lane": {**always, "engines": 1}}, heavy=2).policy_facts["lane_engines"] == ["heavy-0"]


class _Submits:
    """The dispatch context as the placement rule sees it, noting each sample given to a lane engine while that
    engine holds a runaway: the samples it was running then."""

    def __init__(self, ctx, policy):
        self.ctx, self.policy = ctx, policy

    def __getattr__(self, key):
        return getattr(self.ctx, key)

    def submit(self, sample, pool=None, *, engine=None, **kw):
        book, lane = self.policy.ledger, self.policy.lane
        if engine is not None and lane.on and engine.name in lane.names and book.runaways_on.get(engine.name):
            LaneSeqsV3.held.append(book.assigned[engine.name] - 1)   # (booked before it is submitted)
        return self.ctx.submit(sample, pool, engine=engine, **kw)


class LaneSeqsV3(V3Policy):
    """v3 noting what lane engines holding a runaway were running when given new work."""

    simulation_only = True
    held: list[int] = []

    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self.placement.ctx = _Submits(ctx, self)


def test_a_lane_engine_holding_a_runaway_takes_new_work_only_below_lane_seqs():
    name = f"{__name__}:LaneSeqsV3"
    running = {}
    for seqs in (48, 4):
        LaneSeqsV3.held = []
        cfg = SimulateConfig(policy=name, batch_size=32, steps=8, over_provision=0.25, timeline=False,
                             references=False, fast=3, heavy=1, max_staleness=1, restart_lengths="replay",
                             profiles={"fast": EQUAL, "heavy": EQUAL},
                             policy_settings={name: {"lane": {"mode": "always", "seqs": seqs}}})
        run_steps(synth_trace(groups=400, n=8, seed=7, runaway_frac=0.01), cfg, name, 0.25)
        running[seqs] = LaneSeqsV3.held
    assert running[4] and max(running[4]) < 4
    assert max(running[48]) < 48 and sum(n >= 4 for n in running[48]) > 10 * len(running[4])


def test_a_lower_lane_quantile_sends_more_samples_to_the_lane():
    def lane_moves(run):
        return sum(a.engine != b.engine and b.pool == "heavy" for g in run.groups for s in g.samples
                   for a, b in zip(s.segments, s.segments[1:]))

    assert lane_moves(_stream({"lane": {"mode": "always", "quantile": 0.9}})) > \
        2 * lane_moves(_stream({"lane": {"mode": "always"}})) > 0


def test_lane_recurrence_zero_keeps_the_lane_where_restarts_draw_fresh_lengths():
    """Fresh draws: no restarted runaway ran away again. At the default share (0.5) 'auto' drops the lane; at 0
    any share is enough, and it stays."""
    facts = {}
    for share in (0.5, 0.0):
        cfg = small_cfg(policy="v3", max_staleness=1, restart_lengths="redraw", steps=16, batch_size=16,
                        policy_settings={"v3": {"lane": {"evidence": 2, "recurrence": share}}})
        facts[share] = run_steps(_short(), cfg, "v3", 0.5).policy_facts
    assert all(f["restarted_runaways"] >= 2 and f["recurred"] == 0 for f in facts.values())
    assert not facts[0.5]["tail_lane"] and facts[0.0]["tail_lane"] and facts[0.0]["lane_engines"] == ["heavy-0"]


@pytest.mark.parametrize("floor", [200, 0])
def test_segments_are_at_least_segment_tokens_long_with_the_lane_off(floor):
    """A stream under a bound (S = 2), the lane off: no segment ends for its length short of segment_tokens (the
    default 512's test: tests/policies/test_segment_floor.py); some ended short of 512, which the default forbids."""
    run = _stream({"lane": {"mode": "never", "segment_tokens": floor}}, max_staleness=2)
    ends = [seg.num_tokens for g in run.groups for s in g.samples for seg in s.segments if seg.end_reason == "segment"]
    assert ends and min(ends) >= floor and min(ends) < 512


# ----------------------------------------------------------------------------------------------- step end
def test_restart_chance_sets_how_likely_to_end_a_sample_must_be_to_be_spared():
    """A stream that fills every slot (8 a engine), fresh draws: v3 restarts early the running samples of groups in
    their last step whose chance to end within it is below restart_chance: none at 0, more at 1 than at 0.75."""
    profile = dict(max_num_seqs=8, kv_cache_tokens=65536, block_size=16)
    early = {}
    for chance in (0.0, 0.75, 1.0):
        cfg = small_cfg(policy="v3", max_staleness=1, restart_lengths="redraw", steps=20, batch_size=16,
                        profiles={"fast": profile, "heavy": profile},
                        policy_settings={"v3": {"lane": {"evidence": 2}, "step_end": {"restart_chance": chance}}})
        early[chance] = sum(s.early_restarts for s in run_steps(_short(groups=400), cfg, "v3", 0.5).steps)
    assert early[0.0] == 0 < early[0.75] < early[1.0]
