"""Speculative decoding in the simulator: the acceptance file bench/spec.py writes, read into a profile, and
``pdsr simulate --speculative`` against the same run without it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.errors import DataError
from pdsr_sdk.sim.speculation import H100_VERIFY_COST, speculation_from_acceptance, verify_cost_for


def counts(verify: int, accepted: int) -> dict:
    return {"tokens": 1000, "verify_steps": verify, "drafted": 4 * verify, "accepted": accepted,
            "accepted_per_verify": accepted / verify if verify else 0.0, "acceptance_rate": 0.0, "draft_share": 0.0}


def acceptance_file(tmp_path):
    doc = {"version": 1, "model": "m", "k": 4, "window": [2, 4], "n": 8, "temperature": 1.0, "max_tokens": 512,
           "tail_frac": 0.1, "position_bin": 64, "datasets": {
               "math500": {"prompts": 16, "methods": {
                   "off": {"whole": counts(0, 0), "tail": counts(0, 0), "token_tail": counts(0, 0)},
                   "group": {"whole": counts(100, 60), "tail": counts(10, 9), "token_tail": counts(20, 24)}}},
               "gsm8k": {"prompts": 16, "methods": {
                   "group": {"whole": counts(100, 50), "tail": counts(10, 10), "token_tail": counts(0, 0)}}}}}
    path = tmp_path / "acceptance.json"
    path.write_text(json.dumps(doc))
    return path


def test_the_tail_counts_of_each_data_set_make_the_tokens_per_step_and_the_draft_load(tmp_path, monkeypatch):
    path = acceptance_file(tmp_path)
    # every step counts, those that drafted nothing too. math500's token tail: 1000 tokens, 24 accepted of 80
    # drafted, so 976 steps; gsm8k has no token-tail verify steps: its tail, 10 accepted of 40, 990 steps
    both = speculation_from_acceptance(path, "group")
    assert both["tokens_per_step"] == pytest.approx((1000 / 976 + 1000 / 990) / 2)
    assert both["draft_load"] == pytest.approx((80 / (976 * 4) + 40 / (990 * 4)) / 2)
    one = speculation_from_acceptance(path, "group", dataset="math500", max_batch=16)
    assert one == {"tokens_per_step": pytest.approx(1000 / 976), "draft_load": pytest.approx(80 / 3904),
                   "verify_cost": H100_VERIFY_COST[4], "max_batch": 16, "num_speculative_tokens": 4}
    with pytest.raises(DataError, match="no method 'ngram'"):
        speculation_from_acceptance(path, "ngram")
    with pytest.raises(DataError, match="has no verify steps"):
        speculation_from_acceptance(path, "off", dataset="math500")
    with pytest.raises(DataError, match="no data set 'aime'"):
        speculation_from_acceptance(path, "group", dataset="aime")
    whole = json.loads(path.read_text())
    whole["datasets"]["gsm8k"]["methods"]["group"]["tail"] = counts(10, 1000)   # every token drafted: no steps
    (tmp_path / "all.json").write_text(json.dumps(whole))
    with pytest.raises(DataError, match="accepted 1000 of 1000 tokens"):
        speculation_from_acceptance(tmp_path / "all.json", "group", dataset="gsm8k")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(DataError, match="not an acceptance file"):
        speculation_from_acceptance(tmp_path / "bad.json", "group")
    # a missing file is named with the OS's reason, not Python's repr of the exception ([Errno 2] ...); in an
    # empty folder, so that an acceptance.json where the tests run (docs/simulate.md's command writes one) is not read
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    with pytest.raises(DataError,
                       match=r"^acceptance\.json: cannot read the acceptance file: No such file or directory$"):
        speculation_from_acceptance("acceptance.json", "group")
    (tmp_path / "cut.json").write_text('{"datasets": ')
    with pytest.raises(DataError, match="cut.json: the acceptance file is not JSON"):
        speculation_from_acceptance(tmp_path / "cut.json", "group")
    assert verify_cost_for(3) == H100_VERIFY_COST[4] and verify_cost_for(16) == H100_VERIFY_COST[8]


def test_pdsr_simulate_speculative_shortens_the_tail(tmp_path):
    path = acceptance_file(tmp_path)
    args = ["simulate", "--policy", "baseline", "--no-references", "--fast", "2", "--heavy", "0", "--batch-size",
            "16", "--num-batches", "1", "--no-timeline", "--quiet"]
    runs = {}
    for name, extra in (("off", []), ("group", ["--speculative", "group", "--acceptance", str(path)])):
        out = tmp_path / name
        r = CliRunner().invoke(cli, [*args, *extra, "--out-dir", str(out)])
        assert r.exit_code == 0, r.output
        runs[name] = json.loads((out / "simulate.json").read_text())["policies"][0]["makespan_s"]
    assert runs["group"] < runs["off"]
    r = CliRunner().invoke(cli, [*args, "--speculative", "group"])
    assert r.exit_code != 0 and "go together" in r.output


def test_acceptance_by_position_is_read_per_bin_and_averaged_over_the_data_sets(tmp_path):
    """Each bin's tokens / (tokens - accepted) and drafted / (steps x k), averaged over the data sets that reached
    it (gsm8k stops at 64 tokens here); without the rows, or with by_position=False, none."""
    path = acceptance_file(tmp_path)
    doc = json.loads(path.read_text())
    doc["datasets"]["math500"]["methods"]["group"]["by_position"] = [
        {"start": 0, **counts(50, 40)}, {"start": 64, **counts(40, 20)}, {"start": 128, **counts(10, 0)}]
    doc["datasets"]["gsm8k"]["methods"]["group"]["by_position"] = [
        {"start": 0, **counts(50, 60)}, {"start": 64, **counts(40, 0)}]
    path.write_text(json.dumps(doc))
    rows = speculation_from_acceptance(path, "group")["by_position"]
    assert [r[0] for r in rows] == [0, 64, 128]
    assert rows[0][1] == pytest.approx((1000 / 960 + 1000 / 940) / 2)
    assert rows[0][2] == pytest.approx((200 / (960 * 4) + 200 / (940 * 4)) / 2)
    assert rows[1][1] == pytest.approx((1000 / 980 + 1.0) / 2) and rows[2][1] == pytest.approx(1.0)
    assert "by_position" not in speculation_from_acceptance(path, "group", by_position=False)
    assert "by_position" not in speculation_from_acceptance(acceptance_file(tmp_path), "group")
    assert "by_position_and_siblings" not in speculation_from_acceptance(path, "group")


def test_the_joint_table_gives_cells_with_enough_verify_steps(tmp_path):
    """A (position, finished siblings) cell is read where a data set has 100 or more verify steps in it, averaged
    over those data sets; the simulator takes the position's row for the others."""
    path = acceptance_file(tmp_path)
    doc = json.loads(path.read_text())
    for name in ("math500", "gsm8k"):
        doc["datasets"][name]["methods"]["group"]["by_position"] = [{"start": 0, **counts(200, 100)}]
    doc["datasets"]["math500"]["methods"]["group"]["by_position_and_siblings"] = [
        {"start": 0, "finished": 0, **counts(150, 100)}, {"start": 0, "finished": 3, **counts(99, 90)}]
    doc["datasets"]["gsm8k"]["methods"]["group"]["by_position_and_siblings"] = [
        {"start": 0, "finished": 0, **counts(100, 50)}, {"start": 0, "finished": 3, **counts(100, 500)}]
    path.write_text(json.dumps(doc))
    got = speculation_from_acceptance(path, "group")
    assert [(p, f) for p, f, _, _ in got["by_position_and_siblings"]] == [(0, 0), (0, 3)]
    (_, _, y0, d0), (_, _, y3, d3) = got["by_position_and_siblings"]
    assert y0 == pytest.approx((1000 / 900 + 1000 / 950) / 2) and d0 == pytest.approx((600 / 3600 + 400 / 3800) / 2)
    assert y3 == pytest.approx(1000 / 500)   # math500's cell has 99 verify steps: gsm8k's alone
    from pdsr_sdk.sim.config import SpeculationProfile

    SpeculationProfile(**got)   # a valid profile section


def test_a_request_drafts_at_its_own_positions_acceptance():
    """One request of 128 tokens alone, steps of 10 ms, a verify step as dear as a decode step: 2 tokens a step
    over its first 64 tokens and 1 after, so 32 + 64 steps' time. The simulator advances a token a "step" and
    re-reads the positions every 64 of them (the first bin's width) at the middle of that cell: position 32,
    then 96. (The naive twin; test_sim_engine.py holds the engine to it.)"""
    from pdsr_sdk.sim.config import EngineProfile
    from pdsr_sdk.sim.naive import NaiveJob, naive_replay

    base = dict(max_num_seqs=4, c0_s=0.01, c1_s_per_seq=0.0, c2_s_per_token=0.0, prefill_s_per_token=0.0)
    spec = {"verify_cost": [(1, 1.0)], "max_batch": 4, "by_position": [(0, 2.0, 0.5), (64, 1.0, 0.5)]}
    out = naive_replay(EngineProfile(**base, speculation=spec), [NaiveJob("a", 0.0, 4, [128])])
    # steps 0-63 read position 32 (bin 0: 64 steps at half price), steps 64-127 read position 96 (full price)
    assert out["a"] == [("length", pytest.approx(64 * 0.005 + 64 * 0.01), 128)]


def test_a_joint_row_needs_a_position_row_of_its_bin():
    from pdsr_sdk.sim.config import SpeculationProfile

    rows = {"by_position": [(0, 1.2, 0.1), (64, 1.1, 0.1)]}
    SpeculationProfile(**rows, by_position_and_siblings=[(64, 2, 1.3, 0.2)])
    for bad in ([(32, 0, 1.3, 0.2)], [(0, -1, 1.3, 0.2)], [(0, 0, 0.9, 0.2)]):
        with pytest.raises(Exception, match="by_position_and_siblings"):
            SpeculationProfile(**rows, by_position_and_siblings=bad)
    with pytest.raises(Exception, match="by_position_and_siblings"):
        SpeculationProfile(by_position_and_siblings=[(0, 0, 1.3, 0.2)])
