"""The workload family (pdsr_sdk.traces.family): each member's statistics, its pinned measurement, the recorded
member's resampling and `pdsr trace synth --family`."""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.analysis import AnalyzeConfig, analyze_trace
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.traces import (
    WORKLOADS,
    LengthTrace,
    Measurement,
    TraceSynthConfig,
    WorkloadMember,
    read_trace,
    resample_trace,
    synth_trace,
    workload,
)

#: the members' statistics (docs/notes/workload-family.md: the mean over the pinned seeds 101-105 at 4,096
#: groups x 8): mean CV (ddof 1), mean Spearman(probe, sample j), p99 length, share of samples at the cap,
#: median length
FAMILY = {
    "informative": dict(cv=0.315, spearman=0.611, p99=1390, at_cap=0.0028, median=418),
    "uninformative": dict(cv=0.519, spearman=0.007, p99=1024, at_cap=0.416, median=700),
    "uninformative-by-prompt": dict(cv=0.499, spearman=0.106, p99=1024, at_cap=0.415, median=701),
    "kv-bound": dict(cv=0.315, spearman=0.611, p99=11250, at_cap=0.0028, median=3383),
    "seed002": dict(cv=0.303, spearman=0.658, p99=2200, at_cap=0.0048, median=618),
    "heavy": dict(cv=0.564, spearman=0.524, p99=4096, at_cap=0.070, median=647),
    "longcot": dict(cv=0.586, spearman=0.575, p99=16384, at_cap=0.045, median=2067),
    "multi-turn": dict(cv=0.274, spearman=0.640, p99=2040, at_cap=0.0027, median=923),
    "recorded-gsm8k": dict(cv=0.450, spearman=0.028, p99=512, at_cap=0.438, median=414),
    "recorded-math": dict(cv=0.488, spearman=0.066, p99=512, at_cap=0.447, median=415),
    "recorded-gsm8k-2048": dict(cv=0.944, spearman=-0.114, p99=2048, at_cap=0.281, median=370),
    "recorded-math-2048": dict(cv=0.946, spearman=0.005, p99=2048, at_cap=0.381, median=469),
}
#: the tolerances of one draw of 2,048 groups (about three of its seed-to-seed spreads): absolute for CV and
#: Spearman, relative for p99, the median and the share at the cap (the last with a floor of 0.1 points)
TOL = dict(cv=0.02, spearman=0.04, p99=0.10, median=0.05, at_cap=0.20)
GROUPS = 2048


def measured(name: str, groups: int = GROUPS) -> dict:
    """The member's statistics on its first pinned seed, read back from `pdsr analyze`'s report."""
    member = workload(name)
    report = analyze_trace(member.trace(groups=groups, seed=member.measure.seeds[0]), AnalyzeConfig(plots=False))
    t = report["trace"]
    return dict(cv=report["cv"]["mean"], spearman=report["spearman"]["mean"], p99=t["length"]["p99"],
                at_cap=t["finish_reasons"].get("length", 0) / t["samples"], median=t["length"]["median"])


def test_the_family_is_the_registry():
    assert sorted(FAMILY) == WORKLOADS.names()


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_member_statistics(name):
    got, want = measured(name), FAMILY[name]
    assert got["cv"] == pytest.approx(want["cv"], abs=TOL["cv"])
    assert got["spearman"] == pytest.approx(want["spearman"], abs=TOL["spearman"])
    assert got["p99"] == pytest.approx(want["p99"], rel=TOL["p99"])
    assert got["median"] == pytest.approx(want["median"], rel=TOL["median"])
    assert got["at_cap"] == pytest.approx(want["at_cap"], rel=TOL["at_cap"], abs=0.001)


def test_members_keep_their_definitions():
    """What each member is for (issue 48), on the pinned statistics."""
    seed002, heavy, longcot = FAMILY["seed002"], FAMILY["heavy"], FAMILY["longcot"]
    assert 0.28 <= seed002["cv"] <= 0.32 and 0.62 <= seed002["spearman"] <= 0.68
    assert 2000 <= seed002["p99"] <= 2400 and 0.003 <= seed002["at_cap"] <= 0.007
    assert workload("seed002").config().max_length == 4096
    assert 0.05 <= heavy["at_cap"] <= 0.10
    assert 1500 <= longcot["median"] <= 3400 and 0.035 <= longcot["at_cap"] <= 0.055
    assert 16384 <= workload("longcot").config().max_length <= 32768
    assert max(FAMILY["uninformative"]["spearman"], FAMILY["uninformative-by-prompt"]["spearman"]) < 0.15
    assert workload("informative").synth == {}   # today's default


def test_kv_bound_members_are_kv_bound_on_their_engines():
    def demand(name):
        m = workload(name)
        return m.measure.kv_demand(m.trace(groups=512, seed=m.measure.seeds[0]))

    assert demand("kv-bound") > 2 and demand("longcot") > 2
    assert demand("informative") < 1 and demand("seed002") < 1 and demand("recorded-gsm8k") < 1
    assert demand("recorded-math") < 1 and demand("recorded-gsm8k-2048") < 1
    assert 1 < demand("recorded-math-2048") < 1.5    # 38% of its samples run to 2,048: the cache binds a little


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_member_pins_its_measurement(name):
    m = workload(name)
    assert len(set(m.measure.seeds)) >= 5 and m.measure.steps >= 4
    assert set(m.measure.profile) == {"max_num_seqs", "kv_cache_tokens", "max_model_len"}
    cfg = m.config()
    assert m.measure.profile["max_model_len"] >= cfg.max_length + cfg.prompt_len_max
    assert m.measure.profile["kv_cache_tokens"] >= m.measure.profile["max_model_len"]
    assert 1 <= len(re.findall(r"[.!?](?:\s|$)", m.description)) <= 2, m.description   # one or two sentences


@pytest.mark.parametrize("values", [[0.9], [0.97, 0.91, 1.02], [1.0, 0.95, 0.9, 0.99], list(np.linspace(0.5, 1.5, 11))])
def test_spread_reports_the_median_and_range_over_seeds(values):
    s = sorted(values)
    mid = s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2
    want = f"{mid:.3f}" if len(s) == 1 else f"{mid:.3f} [{s[0]:.3f}, {s[-1]:.3f}]"
    assert Measurement.spread(values) == want
    assert Measurement.spread(values, ".1%").startswith(f"{mid:.1%}")


def test_measurement_needs_five_seeds_and_a_steady_state():
    with pytest.raises(ConfigError, match="5 distinct seeds"):
        Measurement(seeds=(1, 2, 3, 4, 4))
    with pytest.raises(ConfigError, match="steady state"):
        Measurement(steps=3)
    with pytest.raises(ConfigError, match="max_model_len"):
        WorkloadMember("short", "Too short an engine.", synth=dict(max_length=8192),
                       measure=Measurement(profile={"max_num_seqs": 8, "kv_cache_tokens": 9000, "max_model_len": 8192}))
    with pytest.raises(ConfigError, match="median_lenght"):
        WorkloadMember("typo", "A typo.", synth=dict(median_lenght=10))


def test_without_a_family_the_trace_is_informative():
    a, b = synth_trace(groups=64, seed=5), synth_trace(family="informative", groups=64, seed=5)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_array_equal(a.prompt_lens, b.prompt_lens)


def test_keys_given_override_the_member():
    cfg = TraceSynthConfig(family="heavy", max_length=2048)
    assert cfg.max_length == 2048 and cfg.runaway_frac == workload("heavy").synth["runaway_frac"]
    np.testing.assert_array_equal(synth_trace(cfg, groups=32).lengths,
                                  workload("heavy").trace(groups=32, max_length=2048).lengths)
    # the config's other values stay (groups replaced, the family's defaults kept)
    assert synth_trace(TraceSynthConfig(family="longcot", groups=16)).lengths.max() == 16384
    with pytest.raises(ConfigError, match="family"):
        synth_trace(TraceSynthConfig(family="heavy"), family="longcot")


def test_unknown_family_names_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown workload 'nope'; valid names: heavy, informative"):
        TraceSynthConfig(family="nope")


def test_recorded_member_resamples_whole_groups():
    member = workload("recorded-gsm8k")
    recorded = member.recorded_trace()
    in_order = member.trace(groups=recorded.num_groups + 3, seed=0)
    np.testing.assert_array_equal(in_order.matrix()[:recorded.num_groups], recorded.matrix())
    np.testing.assert_array_equal(in_order.matrix()[-3:], recorded.matrix()[:3])
    draw = member.trace(groups=300, seed=member.measure.seeds[0])
    rows = {tuple(r) for r in recorded.matrix().tolist()}
    assert draw.num_groups == 300 and all(tuple(r) in rows for r in draw.matrix().tolist())
    assert len(set(draw.prompt_ids)) == 300 and draw.prompt_ids[0].endswith("#0")
    assert (draw.finish_reasons == "length").mean() == pytest.approx((draw.lengths == 512).mean())
    assert not np.array_equal(draw.lengths, member.trace(groups=300, seed=102).lengths)
    np.testing.assert_array_equal(resample_trace(recorded, 300, 101).lengths, draw.lengths)
    with pytest.raises(ConfigError, match="only groups and seed, not median_length"):
        member.config(median_length=100)


def test_resampling_keeps_each_groups_rewards():
    lengths = np.arange(1, 13).reshape(4, 3)
    rewards = np.array([[1, 0, 0], [0, 0, 0], [np.nan, 1, 1], [0, 1, 0]], dtype=float)
    recorded = LengthTrace.from_matrix(lengths, prompt_ids=list("abcd"), prompt_lens=np.full(4, 5), rewards=rewards)
    draw = resample_trace(recorded, 40, 7)
    by_first_length = {int(r[0]): i for i, r in enumerate(lengths)}
    for row, got in zip(draw.matrix(), draw.rewards.reshape(40, 3)):
        np.testing.assert_array_equal(got, rewards[by_first_length[int(row[0])]])   # NaN where none
    assert resample_trace(LengthTrace.from_matrix(lengths), 5, 7).rewards is None


# -- CLI --------------------------------------------------------------------------------------------

def test_cli_family_list_lists_every_member():
    result = CliRunner().invoke(cli, ["trace", "synth", "--family", "list"])   # no --out needed
    assert result.exit_code == 0, result.output
    for name in WORKLOADS:
        assert f"{name}: {workload(name).description}" in result.output
    assert "seeds 101, 102, 103, 104, 105" in result.output


def test_cli_explicit_flag_overrides_the_family(tmp_path):
    out = tmp_path / "t.jsonl"
    result = CliRunner().invoke(cli, ["trace", "synth", "--family", "seed002", "--groups", "64", "--seed", "3",
                                      "--max-length", "1500", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "(seed002)" in result.output and "at max_length 1500" in result.output
    got = read_trace(out)
    np.testing.assert_array_equal(got.lengths, synth_trace(family="seed002", groups=64, seed=3,
                                                           max_length=1500).lengths)
    assert not np.array_equal(got.lengths, synth_trace(family="seed002", groups=64, seed=3).lengths)


def test_cli_family_from_a_config_file(tmp_path):
    cfg, out = tmp_path / "synth.yaml", tmp_path / "t.jsonl"
    cfg.write_text("family: longcot\ngroups: 20\nseed: 4\n")
    result = CliRunner().invoke(cli, ["trace", "synth", "--config", str(cfg), "--runaway-frac", "0",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(read_trace(out).lengths,
                                  synth_trace(family="longcot", groups=20, seed=4, runaway_frac=0).lengths)


def test_cli_unknown_family_is_a_clean_error(tmp_path):
    result = CliRunner().invoke(cli, ["trace", "synth", "--family", "nope", "--out", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "unknown workload 'nope'" in result.output
    assert all(name in result.output for name in WORKLOADS)


def test_cli_recorded_family_refuses_synthetic_flags(tmp_path):
    result = CliRunner().invoke(cli, ["trace", "synth", "--family", "recorded-gsm8k", "--median-length", "100",
                                      "--out", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 2 and "only groups and seed, not median_length" in result.output


def test_a_users_member_registers_and_draws():
    from pdsr_sdk.traces import register_workload

    mine = WorkloadMember("test-short", "Short answers.", synth=dict(median_length=50, max_length=200))
    assert mine.trace(groups=8, seed=1).lengths.max() <= 200   # unregistered: drawn without a family name
    register_workload(mine)
    try:
        assert mine.config().family == "test-short"
        np.testing.assert_array_equal(synth_trace(family="test-short", groups=8, seed=1).lengths,
                                      mine.trace(groups=8, seed=1).lengths)
        with pytest.raises(Exception, match="already registered"):
            register_workload(mine)
    finally:
        WORKLOADS.unregister("test-short")
