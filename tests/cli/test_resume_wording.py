"""``pdsr rollout --resume`` and ``pdsr score --resume`` refuse other settings in one wording: the run's file, the
setting's config key and flag, both values, and how to go on."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq

from cli_checks import failed, invoke
from support import requires_torch
from tiny_scoring import random_samples

#: the one error both commands give for a setting that differs
REFUSED = re.compile(r"error: (?P<where>\S+): --resume continues a run made with other settings: (?P<key>\S+) "
                     r"\((?P<flag>--\S+)\) is (?P<now>\S+) now but was (?P<then>\S+)\. Resume with the run's settings "
                     r"\(the values it was made with\), or start over with --overwrite \(which replaces it\)")


def _refusal(output: str) -> dict[str, str]:
    found = REFUSED.search(" ".join(output.split()))   # a terminal may wrap the line
    assert found is not None, output
    return found.groupdict()


def test_rollout_names_the_file_the_flag_and_both_values(prompts, tmp_path, fake_run):
    out = tmp_path / "o.parquet"
    assert invoke(*fake_run, "--data", prompts, "--out", out, "--batch-size", 2, "--num-batches", 1).exit_code == 0
    before = out.read_bytes()
    said = _refusal(failed(invoke(*fake_run, "--data", prompts, "--out", out, "--batch-size", 2, "--resume",
                                  "--temperature", 0.5)))
    assert said == {"where": str(out), "key": "sampling.temperature", "flag": "--temperature", "now": "0.5",
                    "then": "1.0"}
    assert out.read_bytes() == before


@requires_torch
def test_score_names_the_file_the_flag_and_both_values(tmp_path, tiny_model_dir):
    prompts, responses = random_samples(3, 6, max_prompt=10, max_completion=10)
    data = tmp_path / "traj.parquet"
    pq.write_table(pa.table({"prompt_token_ids": prompts, "response_token_ids": responses}), data)
    out = tmp_path / "scored.parquet"
    run = ["score", "--model", tiny_model_dir, "--data", data, "--out", out, "--device", "cpu", "--quiet"]
    assert invoke(*run).exit_code == 0
    before = out.read_bytes()
    said = _refusal(failed(invoke(*run, "--resume", "--temperature", 0.5)))
    assert said == {"where": str(out), "key": "temperature", "flag": "--temperature", "now": "0.5", "then": "1.0"}
    assert out.read_bytes() == before
