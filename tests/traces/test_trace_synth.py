"""Synthetic length traces: reproducible, within their bounds, following the log-normal model with runaways,
and the committed example is what `pdsr trace synth` makes."""

from __future__ import annotations

import numpy as np
import pytest

from support import ROOT
from pdsr_sdk.traces import TraceSynthConfig, read_trace, synth_trace, write_trace_jsonl
from trace_inputs import assert_same_trace


REPO = ROOT
EXAMPLE = REPO / "examples" / "traces" / "synth_256x8.jsonl"
#: the command that made the committed example (also in examples/traces/README.md)
EXAMPLE_CONFIG = TraceSynthConfig(groups=256, n=8, seed=0, tokens_per_s=50)


def test_synth_is_reproducible_and_seed_dependent():
    a, b = synth_trace(groups=64, seed=5), synth_trace(groups=64, seed=5)
    assert_same_trace(a, b)
    assert not np.array_equal(a.lengths, synth_trace(groups=64, seed=6).lengths)


def test_synth_respects_bounds_and_marks_the_cap():
    cfg = TraceSynthConfig(groups=500, n=6, seed=1, median_length=300, prompt_sigma=1.5, noise_sigma=1.0,
                           max_length=900, min_length=20, prompt_len_min=10, prompt_len_max=12, tokens_per_s=40)
    trace = synth_trace(cfg)
    x = trace.matrix()
    assert x.shape == (500, 6)
    assert x.min() == 20 and x.max() == 900  # such wide sigmas reach both clips
    assert set(trace.prompt_lens.tolist()) == {10, 11, 12}
    np.testing.assert_array_equal(trace.finish_reasons == "length", trace.lengths == 900)
    np.testing.assert_allclose(trace.durations_s, trace.lengths / 40.0)
    assert trace.prompt_ids[0] == "p000" and trace.prompt_ids[-1] == "p499"


def test_synth_degenerate_parameters_give_exact_lengths():
    trace = synth_trace(groups=10, n=4, median_length=123.4, prompt_sigma=0, noise_sigma=0, runaway_frac=0)
    assert (trace.lengths == 123).all()
    runaway = synth_trace(groups=10, n=4, runaway_frac=1.0, max_length=777)
    assert (runaway.lengths == 777).all() and (runaway.finish_reasons == "length").all()


def test_synth_log_lengths_follow_the_model():
    # No clipping or runaways: log length = log(median) + prompt_sigma*z_g + noise_sigma*e_gj.
    cfg = TraceSynthConfig(groups=20000, n=8, seed=2, median_length=1000, prompt_sigma=0.5, noise_sigma=0.25,
                           runaway_frac=0.0, max_length=10**9)
    logs = np.log(synth_trace(cfg).matrix())
    assert np.median(logs) == pytest.approx(np.log(1000), abs=0.02)
    within = logs.std(axis=1, ddof=1)          # per-group sample std estimates noise_sigma
    assert np.sqrt((within ** 2).mean()) == pytest.approx(0.25, rel=0.02)
    between = logs.mean(axis=1).std()          # group means: prompt_sigma^2 + noise_sigma^2 / n
    assert between == pytest.approx(np.sqrt(0.5 ** 2 + 0.25 ** 2 / 8), rel=0.03)


def test_synth_runaway_concentration_spreads_the_rate_between_prompts():
    # each prompt draws its own runaway rate from Beta(f*k, (1-f)*k): the mean stays f, and the per-prompt
    # share at the cap varies (1 + (n-1)/(k+1)) times as much as with independent runaways
    kw = dict(groups=20000, n=8, seed=3, prompt_sigma=0.0, noise_sigma=0.7, runaway_frac=0.35, max_length=10**6)
    plain, spread = synth_trace(**kw).matrix(), synth_trace(**kw, runaway_concentration=5).matrix()
    cap_plain, cap_spread = (plain == 10**6).mean(axis=1), (spread == 10**6).mean(axis=1)
    assert cap_plain.mean() == pytest.approx(0.35, abs=0.005) and cap_spread.mean() == pytest.approx(0.35, abs=0.01)
    binomial = 0.35 * 0.65 / 8
    assert cap_plain.var() == pytest.approx(binomial, rel=0.05)
    assert cap_spread.var() == pytest.approx(binomial * (1 + 7 / 6), rel=0.05)
    # drawn last: the lengths of samples that run away in neither trace are the same
    both = (plain < 10**6) & (spread < 10**6)
    np.testing.assert_array_equal(plain[both], spread[both])


def test_synth_defaults_resemble_the_seed_statistics():
    from pdsr_sdk.analysis import group_cv, spearman_vs_probe

    x = synth_trace(groups=4000, seed=0).matrix()
    assert 0.25 < group_cv(x).mean() < 0.38        # seed: 0.29
    assert 0.5 < spearman_vs_probe(x).mean() < 0.7  # seed: 0.62
    assert (x == 4096).any()                         # a few runaways reach the cap


def test_synth_rejects_inverted_ranges():
    from pdsr_sdk.errors import ConfigError
    from pdsr_sdk.config import load_config

    with pytest.raises(ConfigError, match="min_length"):
        load_config(TraceSynthConfig, overrides={"min_length": 10, "max_length": 5})


def test_committed_example_is_what_synth_makes(tmp_path):
    """examples/traces/synth_256x8.jsonl is what the command in its README writes, byte for byte."""
    fresh = write_trace_jsonl(synth_trace(EXAMPLE_CONFIG), tmp_path / "fresh.jsonl")
    assert EXAMPLE.read_text() == fresh.read_text()
    assert_same_trace(read_trace(EXAMPLE), synth_trace(EXAMPLE_CONFIG))
