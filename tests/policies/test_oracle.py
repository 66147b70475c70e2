"""The reference schedules (``oracle``, ``oracle-probe``), the report's comparisons with them, and where they may
run."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.policies import POLICIES
from pdsr_sdk.policies.resolve import reference_policies, resolve_policy, runnable_policies
from pdsr_sdk.sim.config import SimulateConfig
from pdsr_sdk.sim.driver import policy_names, run_names, simulate
from pdsr_sdk.sim.report import gain_share
from pdsr_sdk.traces import LengthTrace, synth_trace, write_trace_jsonl

C0 = 0.01
#: one request at a time, every step costs c0: a sample of L tokens takes exactly L steps, so makespans
#: are the classic scheduling numbers (in units of c0)
UNIT = dict(max_num_seqs=1, kv_cache_tokens=4096, c0_s=C0, c1_s_per_seq=0.0, c2_s_per_token=0.0,
            prefill_s_per_token=0.0)


def run(matrix, policies, *, fast, heavy=0, profile=UNIT, batch_size=None, **kw):
    trace = LengthTrace.from_matrix(np.array(matrix), prompt_lens=[1] * len(matrix))
    cfg = SimulateConfig(policy=",".join(policies), fast=fast, heavy=heavy, timeline=False,
                         batch_size=batch_size or len(matrix), profiles={"fast": profile, "heavy": profile},
                         segments={"enabled": False}, **kw)
    return simulate(trace, cfg, keep_groups=True)


def steps(rep, policy):
    (r,) = [r for r in rep.runs if r.policy == policy]
    return r.makespan_s / C0


def test_oracle_runs_the_known_longest_first_schedule_and_beats_baseline_and_lpt():
    # 2 single-slot engines, lengths 6 5 4 | 3 2 2: longest first gives 6+3+2 | 5+4+2 = 11 (the optimum,
    # 22 / 2); baseline's chunks give 6+5+4 = 15; lpt waits for the probes (6 and 3) first
    rep = run([[6, 5, 4], [3, 2, 2]], ["baseline", "lpt", "oracle"], fast=2, references=False)
    assert steps(rep, "oracle") == pytest.approx(11)
    assert steps(rep, "baseline") == pytest.approx(15)
    assert steps(rep, "oracle") <= steps(rep, "lpt")
    # with a heavy engine it also tries the longest 2% (here: the 6) alone on heavy, 16 steps on the
    # fast engine, and keeps the better schedule per batch
    rep = run([[6, 5, 4], [3, 2, 2]], ["oracle"], fast=1, heavy=1)
    (o,) = rep.runs
    assert o.makespan_s / C0 == pytest.approx(11)
    assert o.variants == {"longest_first": {"makespan_s": pytest.approx(11 * C0), "batches_kept": 1},
                          "heavy_tail": {"makespan_s": pytest.approx(16 * C0), "batches_kept": 0}}
    assert o.batches[0].policy["variant"] == "longest_first"


@pytest.mark.parametrize("placement", ["list", "lpt", "best"])
def test_oracle_never_loses_to_baseline_or_lpt_on_a_synthetic_trace(placement):
    trace = synth_trace(groups=24, n=4, seed=1, median_length=120, max_length=700, runaway_frac=0.05)
    prof = dict(max_num_seqs=6, kv_cache_tokens=1 << 16)
    cfg = SimulateConfig(policy="baseline,lpt,oracle", fast=2, heavy=1, batch_size=8, timeline=False,
                         profiles={"fast": prof, "heavy": prof}, references=False,
                         policy_settings={"oracle": {"placement": placement}})
    rep = simulate(trace, cfg)
    base, lpt, oracle = (r.makespan_s for r in rep.runs)
    assert oracle <= base and oracle <= lpt


def test_best_of_keeps_each_batchs_shortest_variant_as_one_schedule():
    trace = synth_trace(groups=24, n=4, seed=2, median_length=120, max_length=900, runaway_frac=0.05)
    prof = dict(max_num_seqs=8, kv_cache_tokens=1 << 16)
    cfg = SimulateConfig(policy="oracle", fast=2, heavy=1, batch_size=6, timeline=True, profiles={"fast": prof,
                         "heavy": prof}, policy_settings={"oracle": {"placement": "best"}})
    (o,) = simulate(trace, cfg, keep_groups=True).runs
    assert set(o.variants) == {"longest_first/list", "longest_first/lpt", "heavy_tail/list", "heavy_tail/lpt"}
    assert sum(v["batches_kept"] for v in o.variants.values()) == len(o.batches) == 4
    start = 0.0
    for b in o.batches:
        spans = b.policy["variant_makespans_s"]
        assert b.makespan_s == min(spans.values()) and b.policy["variant"] in spans
        assert b.start_s == pytest.approx(start)
        start += b.makespan_s
    assert o.makespan_s <= min(v["makespan_s"] for v in o.variants.values())
    # every sample of the kept batches ran to its length; the stitched timeline stays within each engine
    assert all(s.num_generated == s.max_tokens for g in o.groups for s in g.samples)
    for e in o.engines:
        assert max(e.occupancy_n) <= e.max_concurrency
        assert all(a <= b for a, b in zip(e.occupancy_t, e.occupancy_t[1:]))
        assert e.occupancy_t[-1] <= o.makespan_s * (1 + 1e-9) and e.occupancy_n[-1] == 0


def test_heavy_tail_runs_only_the_longest_2_percent_on_the_heavy_pool():
    trace = synth_trace(groups=50, n=4, seed=3, median_length=100, max_length=900, runaway_frac=0.05)
    prof = dict(max_num_seqs=64, kv_cache_tokens=1 << 18)
    cfg = SimulateConfig(policy="oracle", fast=2, heavy=1, batch_size=50, timeline=False,
                         profiles={"fast": prof, "heavy": prof},
                         policy_settings={"oracle": {"variant": "heavy_tail"}})
    (o,) = simulate(trace, cfg, keep_groups=True).runs
    samples = sorted((s for g in o.groups for s in g.samples), key=lambda s: -s.max_tokens)
    heavy = [s for s in samples if {seg.pool for seg in s.segments} == {"heavy"}]
    assert len(heavy) == 4 == np.ceil(0.02 * 200)       # ceil(2% of 200 samples)
    assert {s.key for s in heavy} == {s.key for s in samples[:4]}
    assert all({seg.pool for seg in s.segments} == {"fast"} for s in samples[4:])
    assert o.batches[0].policy == {"variant": "heavy_tail"}


def test_oracle_probe_knows_only_the_probe_lengths():
    # group 0's probe is short but its siblings are long; group 1 the reverse. Three single-slot engines:
    # the true lengths put the three 9s first (10 steps); ranking groups by probe runs group 1 first and
    # starts a 9 late (11 steps)
    rep = run([[1, 9, 9], [9, 1, 1]], ["oracle", "oracle-probe"], fast=3)
    assert steps(rep, "oracle") == pytest.approx(10)
    assert steps(rep, "oracle-probe") == pytest.approx(11)
    # probes that agree with their siblings: the probe ranking is as good as the truth
    rep = run([[9, 9, 9], [1, 1, 1]], ["oracle", "oracle-probe"], fast=3)
    assert steps(rep, "oracle-probe") == pytest.approx(steps(rep, "oracle")) == pytest.approx(10)


def test_gain_share_and_its_threshold():
    assert gain_share(100.0, 90.0, 80.0) == pytest.approx(0.5)
    assert gain_share(100.0, 100.0, 80.0) == 0.0
    assert gain_share(100.0, 110.0, 80.0) == pytest.approx(-0.5)
    assert gain_share(100.0, 95.0, 99.0) == pytest.approx(5.0)        # exactly 1% of baseline: reported
    assert gain_share(100.0, 95.0, 99.5) is None                      # under 1%: n/a
    assert gain_share(100.0, 95.0, 101.0) is None                     # the reference loses: n/a
    assert gain_share(None, 95.0, 80.0) is None and gain_share(100.0, 95.0, None) is None


def test_report_columns_compare_every_policy_with_baseline_the_bound_and_the_references():
    rep = run([[6, 5, 4], [3, 2, 2]], ["baseline", "oracle"], fast=2)   # two selected: references on
    assert [r.policy for r in rep.runs] == ["baseline", "oracle", "oracle-probe"]
    by = {p["policy"]: p for p in rep.to_dict()["policies"]}
    assert by["baseline"]["vs_baseline"] == 1.0 and by["baseline"]["share_of_oracle_gain"] == 0.0
    assert by["oracle"]["vs_baseline"] == pytest.approx(11 / 15)
    assert by["oracle"]["share_of_oracle_gain"] == pytest.approx(1.0)
    # the probes rank these groups as their true lengths do: oracle-probe gains as much
    assert by["oracle"]["share_of_oracle_probe_gain"] == pytest.approx(1.0)
    for p in by.values():
        assert p["vs_lower_bound"] == pytest.approx(p["makespan_s"] / p["lower_bound_s"]) == p["ratio"]
    row = rep.rows()[1]
    assert (row["vs_base"], row["of_oracle"]) == (pytest.approx(11 / 15), pytest.approx(1.0))

    # equal lengths: no schedule gains anything, the shares are n/a
    rep = run([[3, 3], [3, 3]], ["baseline", "lpt"], fast=2)
    by = {p["policy"]: p for p in json.loads(rep.to_json())["policies"]}
    assert by["lpt"]["share_of_oracle_gain"] is None and by["lpt"]["share_of_oracle_probe_gain"] is None
    assert {(r["of_oracle"], r["of_probe"]) for r in rep.rows()} == {("n/a", "n/a")}
    # a run without baseline or references has no comparison columns
    rep = run([[3, 3], [3, 3]], ["lpt"], fast=2)
    assert not {"vs_base", "of_oracle", "of_probe"} & set(rep.rows()[0])
    assert rep.to_dict()["policies"][0]["vs_baseline"] is None


def test_all_comes_from_the_registry_without_the_references():
    assert set(reference_policies()) == {"oracle", "oracle-probe"}
    assert policy_names("all") == runnable_policies()
    assert policy_names("all")[0] == "baseline"
    assert {"baseline", "lpt", "v1", "v2", "v2.5"} <= set(policy_names("all"))
    assert not set(policy_names("all")) & set(reference_policies())

    class Mine:
        name = "mine"
        config_model = None

    class MyOracle(Mine):
        simulation_only = True

    POLICIES.register("zz-mine", Mine)
    POLICIES.register("zz-my-oracle", MyOracle)
    try:
        assert "zz-mine" in policy_names("all") and "zz-my-oracle" not in policy_names("all")
        assert "zz-my-oracle" in reference_policies()
    finally:
        del POLICIES._entries["zz-mine"], POLICIES._entries["zz-my-oracle"]


def test_which_runs_a_simulation_makes():
    def names(policy, references=None):
        return run_names(SimulateConfig(policy=policy, references=references))

    assert names("v2.5") == ["v2.5"]                                   # one policy: no references
    assert names("all")[-2:] == ["oracle", "oracle-probe"]
    assert "oracle" not in names("all", references=False)
    assert names("v1,v2") == ["baseline", "v1", "v2", "oracle", "oracle-probe"]
    assert names("v2.5", references=True) == ["baseline", "v2.5", "oracle", "oracle-probe"]
    assert names("baseline,oracle") == ["baseline", "oracle", "oracle-probe"]
    assert names("oracle-probe") == ["oracle-probe"]


def test_references_are_refused_outside_the_simulator(tmp_path):
    for name in ("oracle", "oracle-probe"):
        with pytest.raises(ConfigError, match=f"policy '{name}' is a simulator-only reference schedule"):
            resolve_policy(name)
        cls, _ = resolve_policy(name, simulation=True)
        assert cls.simulation_only
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    with pytest.raises(ConfigError, match="simulator-only reference schedule.*pdsr simulate"):
        RolloutSession(RolloutConfig(policy="oracle"))
    # a preset naming a reference is refused as well
    (tmp_path / "mine.yaml").write_text("policy: oracle\nsettings: {placement: lpt}\n")
    with pytest.raises(ConfigError, match="simulator-only"):
        resolve_policy(str(tmp_path / "mine.yaml"))


def test_rollout_cli_refuses_a_reference_schedule(tmp_path, tiny_model_dir):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"id": "q0", "prompt": "1+1?"}) + "\n")
    r = CliRunner().invoke(cli, ["rollout", "--quiet", "--data", str(data), "--policy", "oracle",
                                 "--out", str(tmp_path / "o.parquet")], catch_exceptions=False)
    assert r.exit_code == 2 and "simulator-only reference schedule" in r.output and "Traceback" not in r.output


def test_simulate_cli_names_references_and_leaves_them_out_on_request(tmp_path):
    trace = write_trace_jsonl(synth_trace(groups=8, n=4, seed=5, median_length=80, max_length=300),
                              tmp_path / "t.jsonl")
    common = ["simulate", "--trace", str(trace), "--fast", "2", "--heavy", "1", "--batch-size", "4", "--quiet",
              "--no-timeline"]
    r = CliRunner().invoke(cli, [*common, "--policy", "baseline,oracle", "--out-dir", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "a" / "simulate.json").read_text())
    assert [p["policy"] for p in report["policies"]] == ["baseline", "oracle", "oracle-probe"]
    assert set(report["policies"][1]["variants"]) == {"longest_first", "heavy_tail"}
    for key in ("vs_baseline", "vs_lower_bound", "share_of_oracle_gain", "share_of_oracle_probe_gain"):
        assert key in report["policies"][0] and key in report["definitions"]
    header = r.output.splitlines()[1].split()
    assert header[:7] == ["policy", "makespan_s", "vs_base", "bound_s", "vs_bound", "of_oracle", "of_probe"]
    r = CliRunner().invoke(cli, [*common, "--policy", "all", "--no-references"])
    assert r.exit_code == 0, r.output
    # not the notes
    policies = [line.split()[0] for line in r.output.splitlines()[3:] if line and not line.startswith("(")]
    assert policies == policy_names("all")
    assert "of_oracle" not in r.output.splitlines()[1] and "vs_base" in r.output.splitlines()[1]
    r = CliRunner().invoke(cli, [*common, "--policy", "v2.5", "--references", "--set", "oracle:variant=bad"])
    assert r.exit_code == 2 and "variant" in r.output
