"""The command-line chain a verl / OpenRLHF user runs without the SDK, end to end on the tiny model: ``pdsr rollout``
-> ``pdsr score`` -> ``pdsr gae --estimator grpo`` -> padded arrays, each command on the previous one's file as it
is (no column flag). The commands and the Python that pads the result are those of docs/scoring-gae.md's "From the
command line to a trainer's batch", read from the page and run here, single-turn and multi-turn (an agent whose
scripted environment turns are masked)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

from support import ROOT, requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]

SECTION = "## From the command line to a trainer's batch"
#: the files the page's commands name: fp32 engines (so that the engine's log-probs are the model's to float
#: noise), a reward that spreads within a group (the random tiny model never answers right), and an agent that
#: adds an environment turn between two model turns (the tiny model writes no tool call of its own)
FILES = {
    "fp32.yaml": "engine_defaults: {dtype: float32}\n",
    "length_reward.py": "def score(text, ground_truth, **info):\n    return (len(text) % 5) / 4\n",
    "nudged_agent.py": ("from examples.agent_tools import run_scripted\n\n\n"
                        "async def run(agent):\n    await run_scripted(agent)   # None: the reward function scores "
                        "it\n"),
}
#: the multi-turn run: the page's rollout with these flags on top (a later --max-tokens wins)
MULTI_TURN = ["--agent", "nudged_agent:run", "--max-turns", "2", "--turn-max-tokens", "8", "--max-tokens", "96"]
#: the files the page's commands write, one per stage, and the multi-turn run's
STAGES = ("rollout", "scored", "adv")
OUTPUTS = ("rollout.parquet", "scored.parquet", "adv.parquet")
MULTI_TURN_OUTPUTS = ("agent.parquet", "agent-scored.parquet", "agent-adv.parquet")
#: |ref_logps - response_logprobs| on the model's tokens, fp32 engines (the page says it)
LOGP_TOLERANCE = 1e-3
#: both rollouts in one process (one import of vLLM and torch); the guard: engine processes are spawned
DRIVER = """
import json, sys
from pdsr_cli.main import cli

if __name__ == "__main__":
    for args in json.loads(sys.argv[1]):
        cli.main(args, standalone_mode=False)
"""


def page_blocks():
    """The section's shell commands (``pdsr ...`` lines, as argument lists) and its Python block."""
    text = (ROOT / "docs" / "scoring-gae.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    bash = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    python = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line)[1:] for line in bash.splitlines() if line.startswith("pdsr ")], python


def rename(args, old, new):
    return [new if a == old else a for a in args]


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """The page's commands in a fresh folder, single-turn and multi-turn: (the folder, {"single"|"multi": {stage:
    table}})."""
    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from pdsr_cli.main import cli

    (rollout, score, gae), _ = page_blocks()
    assert rollout[0] == "rollout" and score[0] == "score" and gae[0] == "gae"
    work = tmp_path_factory.mktemp("pipeline")
    for name, text in FILES.items():
        (work / name).write_text(text)
    (work / "driver.py").write_text(DRIVER)
    runs = {"single": rollout, "multi": rename(rollout, OUTPUTS[0], MULTI_TURN_OUTPUTS[0]) + MULTI_TURN}
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "driver.py", json.dumps([a + ["--quiet"] for a in runs.values()])],
                          cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = {"single": {n: n for n in OUTPUTS}, "multi": dict(zip(OUTPUTS, MULTI_TURN_OUTPUTS))}
    before = os.getcwd()
    os.chdir(work)   # the page's commands name files in the working directory
    try:
        for kind in runs:
            for args in (score, gae):
                for old, new in names[kind].items():
                    args = rename(args, old, new)
                result = CliRunner().invoke(cli, args + ["--quiet"])
                assert result.exit_code == 0, result.output
    finally:
        os.chdir(before)
    files = {kind: {stage: pq.read_table(work / names[kind][name]) for stage, name in zip(STAGES, OUTPUTS)}
             for kind in runs}
    return work, files


def grpo_reference(rewards, groups):
    """verl's GRPO by hand: (r - group mean) / (group's unbiased std + 1e-6), 0 for a group of one."""
    out = np.zeros(len(rewards))
    for g in set(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        r = np.asarray([rewards[i] for i in idx], np.float64)
        out[idx] = (r - r.mean()) / (r.std(ddof=1) + 1e-6) if len(r) > 1 else 0.0
    return out


@pytest.mark.parametrize("kind", ["single", "multi"])
def test_each_command_keeps_the_rows_and_adds_its_column(chain, kind):
    _, files = chain
    rollout, scored, adv = (files[kind][s] for s in ("rollout", "scored", "adv"))
    assert rollout.num_rows == 12 and len(set(rollout.column("prompt_id").to_pylist())) == 3
    assert scored.column_names == rollout.column_names + ["ref_logps"]
    assert adv.column_names == scored.column_names + ["advantages"]
    for name in rollout.column_names:
        assert adv.column(name).equals(rollout.column(name)), name


@pytest.mark.parametrize("kind", ["single", "multi"])
def test_per_token_columns_line_up_and_match_the_engine(chain, kind):
    _, files = chain
    rows = files[kind]["adv"].to_pylist()
    rewards = [r["reward"] for r in rows]
    assert np.ptp(rewards) > 0                      # advantages that are not all 0
    want = grpo_reference(rewards, [r["prompt_id"] for r in rows])
    masked = 0
    for r, w in zip(rows, want):
        n = len(r["response_token_ids"])
        assert n == r["response_length"] == len(r["response_logprobs"]) == len(r["ref_logps"]) == len(r["advantages"])
        if kind == "single":
            assert r["response_mask"] is None
            valid = np.ones(n, bool)
        else:
            assert len(r["response_mask"]) == n
            valid = np.asarray(r["response_mask"]) != 0
        env = ~valid
        masked += int(env.sum())
        engine, ref, a = (np.asarray(r[c], np.float64) for c in ("response_logprobs", "ref_logps", "advantages"))
        np.testing.assert_allclose(a[valid], w, rtol=1e-5, atol=1e-6)
        assert (a[env] == 0).all() and (engine[env] == 0).all()       # the environment's tokens: 0 in both
        assert (ref[env] < 0).all()                                   # score: the model's log-prob of each
        assert np.abs(engine[valid] - ref[valid]).max() <= LOGP_TOLERANCE
    assert (masked > 0) == (kind == "multi")


def sdk_batch(rows):
    """trainer_batch's tensors for the file's rows, as the SDK pads a step's samples (one segment each)."""
    from pdsr_sdk.dispatch.types import Group, SegmentRecord, Sample
    from pdsr_sdk.rollout.padded import trainer_batch

    samples = []
    for r in rows:
        g = Group(prompt_id=r["prompt_id"], prompt_token_ids=r["prompt_token_ids"], prompt_text="", n=1)
        s = Sample(group=g, index=r["sample_index"], max_tokens=len(r["response_token_ids"]),
                   token_ids=r["response_token_ids"], logprobs=r["response_logprobs"],
                   finish_reason=r["finish_reason"], response_mask=r["response_mask"])
        s.segments = [SegmentRecord(pool="fast", engine="fast-0", start_token=0,
                                    num_tokens=len(r["response_token_ids"]), policy_version=0)]
        g.samples = [s]
        samples.append(s)
    return trainer_batch(samples, pad_token_id=0, numpy=True).tensors


@pytest.mark.parametrize("kind", ["single", "multi"])
def test_the_pages_python_pads_the_file_as_trainer_batch_lays_it_out(chain, kind):
    work, files = chain
    _, python = page_blocks()
    rows = files[kind]["adv"].to_pylist()
    namespace: dict = {}
    before = os.getcwd()
    os.chdir(work)
    try:
        if kind == "multi":
            python = python.replace(f'"{OUTPUTS[2]}"', f'"{MULTI_TURN_OUTPUTS[2]}"')
        exec(compile(python, "docs/scoring-gae.md", "exec"), namespace)
    finally:
        os.chdir(before)
    batch = {k: v.numpy() for k, v in namespace["batch"].items()}
    width = max(len(r["response_token_ids"]) for r in rows)
    prompt_width = max(len(r["prompt_token_ids"]) for r in rows)
    assert batch["responses"].shape == (len(rows), width) and batch["prompts"].shape == (len(rows), prompt_width)
    # the keys trainer_batch has, with its values and dtypes: the file's int32 ids came out int32, which torch's
    # cross_entropy refuses as targets
    want = sdk_batch(rows)
    for key in ("prompts", "responses", "response_mask", "rollout_log_probs"):
        assert batch[key].dtype == want[key].dtype, key
        np.testing.assert_array_equal(batch[key], want[key], err_msg=key)
    for i, r in enumerate(rows):   # each row against its own lists: values first, then padding
        n, p = len(r["response_token_ids"]), len(r["prompt_token_ids"])
        mask = r["response_mask"] if r["response_mask"] is not None else [1] * n
        assert batch["prompts"][i].tolist() == [0] * (prompt_width - p) + r["prompt_token_ids"]
        assert batch["responses"][i].tolist() == r["response_token_ids"] + [0] * (width - n)
        assert batch["response_mask"][i].tolist() == mask + [0] * (width - n)
        np.testing.assert_array_equal(batch["rollout_log_probs"][i],
                                      np.float32(r["response_logprobs"] + [-1] * (width - n)))
        np.testing.assert_array_equal(batch["ref_log_prob"][i], np.float32(r["ref_logps"] + [0] * (width - n)))
        np.testing.assert_array_equal(batch["advantages"][i], np.float32(r["advantages"] + [0] * (width - n)))
