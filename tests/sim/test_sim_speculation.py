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


def test_the_tail_counts_of_each_data_set_make_the_tokens_per_step_and_the_draft_load(tmp_path):
    path = acceptance_file(tmp_path)
    # every step counts, those that drafted nothing too. math500's token tail: 1000 tokens, 24 accepted of 80
    # drafted, so 976 steps; gsm8k has no token-tail verify steps: its tail, 10 accepted of 40, 990 steps
    both = speculation_from_acceptance(path, "group")
    assert both["tokens_per_step"] == pytest.approx((1000 / 976 + 1000 / 990) / 2)
    assert both["draft_load"] == pytest.approx((80 / (976 * 4) + 40 / (990 * 4)) / 2)
    one = speculation_from_acceptance(path, "group", dataset="math500", max_batch=16)
    assert one == {"tokens_per_step": pytest.approx(1000 / 976), "draft_load": pytest.approx(80 / 3904),
                   "verify_cost": H100_VERIFY_COST[4], "max_batch": 16}
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
