"""``restart_lengths: redraw``: a restarted sample generates a fresh length in `pdsr simulate --steps`
(``pdsr_sdk.sim.redraw``), where ``replay`` repeats its recorded one."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.sim.redraw import cap_chance, cap_prior, redraw_length
from pdsr_sdk.sim.steps import run_steps
from pdsr_sdk.traces import LengthTrace, synth_trace, write_trace_jsonl
from sim_cases import recorded, small_cfg, small_trace


def _flags(trace):
    return [[r == "length" for r in trace.finish_reasons[trace.offsets[g]:trace.offsets[g + 1]]]
            for g in range(len(trace.prompt_ids))]


@pytest.mark.parametrize("concentration", [None, 4.0, 16.0])
def test_the_cap_prior_recovers_the_share_and_how_runaways_cluster_by_prompt(concentration):
    """`pdsr trace synth` draws each prompt's runaway rate from Beta(f k, (1 - f) k) (k = concentration; none:
    every sample alike): the moment fit finds the pooled share f, and a strength near k, or none (infinite)."""
    trace = synth_trace(groups=20_000, n=8, seed=3, runaway_frac=0.05, runaway_concentration=concentration)
    share, strength = cap_prior(_flags(trace))
    assert share == pytest.approx(0.05, rel=0.05)
    if concentration is None:
        assert strength > 200    # (the moment estimate of rho is noisy around 0: inf or a weak prior)
    else:
        assert strength == pytest.approx(concentration, rel=0.3)


def test_the_chance_after_a_restart_is_the_groups_share_shrunk_to_the_pooled_one():
    one_of_eight = [True] + [False] * 7
    assert cap_chance(one_of_eight, 0.003, math.inf) == 0.003                 # prompts alike: the pooled share
    assert cap_chance(one_of_eight, 0.003, 8.0) == pytest.approx((1 + 0.024) / 16)
    assert cap_chance(one_of_eight, 0.003, 0.0) == pytest.approx(1 / 8)      # prompts apart: its own share
    assert cap_prior([]) == (0.0, math.inf)
    assert cap_prior([[False, False], [False]]) == (0.0, math.inf)
    assert cap_prior([[True, True], [False, False]]) == (0.5, 0.0)            # all-or-nothing groups


@pytest.mark.parametrize("share", [0.0, 0.1, 0.5])
def test_a_redraw_is_the_cap_with_its_chance_else_an_uncapped_length_of_its_group(share):
    lengths, capped = [50, 70, 600, 90], [False, False, True, False]
    draws = Counter(redraw_length(lengths, capped, 600, share, f"p/{k}") for k in range(20_000))
    assert set(draws) <= {50, 70, 90, 600}
    assert draws[600] / 20_000 == pytest.approx(share, abs=0.012)
    rest = 20_000 - draws[600]
    for n in (50, 70, 90):   # the uncapped lengths equally likely
        assert draws[n] / rest == pytest.approx(1 / 3, abs=0.025)


def test_a_redraw_is_fixed_by_its_key_and_a_group_that_always_ran_to_the_cap_stays_there():
    lengths, capped = [5, 9, 13, 600], [False, False, False, True]
    assert [redraw_length(lengths, capped, 600, 0.2, f"g/1/{r}") for r in range(50)] == \
           [redraw_length(lengths, capped, 600, 0.2, f"g/1/{r}") for r in range(50)]
    assert len({redraw_length(lengths, capped, 600, 0.2, f"g/1/{r}") for r in range(50)}) > 1
    assert redraw_length([600, 600], [True, True], 600, 0.0, "x") == 600


@pytest.mark.parametrize("policy", ["baseline", "v3"])
def test_restarted_samples_are_consumed_with_fresh_lengths_and_every_token_is_accounted_for(policy):
    """Under a staleness bound some samples restart. With replay each consumed sample holds its recorded
    length; with redraw the restarted ones hold a length of their group or the cap, some of them a new one,
    and the never-restarted ones their own. The engines' tokens still add up to consumed + wasted + dropped."""
    trace = small_trace()
    rec = recorded(trace)
    cap = int(trace.lengths.max())
    runs = {rl: run_steps(trace, small_cfg(policy=policy, max_staleness=1, restart_lengths=rl), policy, 0.5,
                          keep_groups=True) for rl in ("replay", "redraw")}
    for rl, run in runs.items():
        assert run.stats["restarts"] > 0, rl
        assert sum(e.tokens for e in run.engines) == run.tokens + run.stats["wasted_tokens"] + run.dropped_tokens
    assert all(s.num_generated == rec[g.prompt_id][s.index] for g in runs["replay"].groups for s in g.samples)
    changed = 0
    for g in runs["redraw"].groups:
        for s in g.samples:
            if s.restarts:
                assert s.num_generated in set(rec[g.prompt_id]) | {cap}
                changed += s.num_generated != rec[g.prompt_id][s.index]
            else:
                assert s.num_generated == rec[g.prompt_id][s.index]
    assert changed > 0
    # token_ratio: the steady steps' consumed tokens over the trace's lengths of the same groups (steps 3 to K-1)
    assert runs["replay"].token_ratio == 1.0
    run = runs["redraw"]
    steady = range(len(run.steps))[2:-1]
    mine = [g for g in run.groups if run.consumed_at[g.prompt_id] in steady]
    want = sum(s.num_generated for g in mine for s in g.samples) / sum(sum(rec[g.prompt_id]) for g in mine)
    assert want != 1.0 and run.token_ratio == pytest.approx(want, rel=1e-12)


def test_restart_lengths_needs_steps_and_the_cli_says_which_it_used(tmp_path):
    with pytest.raises(ConfigError, match="restart_lengths"):
        small_cfg(steps=None, restart_lengths="redraw")
    trace = tmp_path / "t.jsonl"
    write_trace_jsonl(small_trace(), trace)
    args = ["simulate", "--trace", str(trace), "--fast", "2", "--heavy", "1", "--batch-size", "6", "--steps", "6",
            "--over-provision", "0.5", "--max-staleness", "1", "--no-timeline"]
    res = CliRunner().invoke(cli, args + ["--out-dir", str(tmp_path / "o")])     # redraw is the default
    assert res.exit_code == 0, res.output
    assert "restarted samples draw fresh lengths" in res.output
    assert '"restart_lengths": "redraw"' in (tmp_path / "o" / "steps.json").read_text()
    res = CliRunner().invoke(cli, args + ["--restart-lengths", "replay"])
    assert res.exit_code == 0 and "fresh lengths" not in res.output
    assert "restarted samples replay their recorded lengths" in res.output
    res = CliRunner().invoke(cli, args + ["--restart-lengths", "again"])
    assert res.exit_code != 0 and "replay" in res.output and "redraw" in res.output


def test_a_long_response_that_stopped_on_its_own_is_not_the_cap_restarts_redraw_to():
    """The cap a capped response redraws to is the longest that finished for length: one 3,000-token response
    that stopped, in a group the run never takes, changes nothing (it used to become the cap, and every
    restarted runaway ran 3,000 tokens instead of 600)."""
    trace = synth_trace(groups=80, n=4, seed=2, median_length=120, max_length=600, runaway_frac=0.2,
                        prompt_len_min=5, prompt_len_max=100)
    m = trace.matrix()
    reasons = np.asarray(trace.finish_reasons, dtype=object).reshape(m.shape)
    extra = np.vstack([m, [[3000, 100, 100, 100]]])
    outlier = LengthTrace.from_matrix(extra, prompt_ids=[*trace.prompt_ids, "outlier"],
                                      prompt_lens=np.append(trace.prompt_lens, 10),
                                      finish_reasons=np.vstack([reasons, [["stop"] * 4]]))
    cfg = small_cfg(max_staleness=1)
    runs = [run_steps(t, cfg, "baseline", 1.0, keep_groups=True) for t in (trace, outlier)]
    assert runs[0].stats["restarts"] > 0 and "outlier" not in {g.prompt_id for g in runs[1].groups}
    assert [s.duration_s for s in runs[1].steps] == [s.duration_s for s in runs[0].steps]
    redrawn = [s.num_generated for g in runs[1].groups for s in g.samples if s.restarts]
    assert 600 in redrawn and max(redrawn) == 600
