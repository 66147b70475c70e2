"""Shared by the CLI's tests (tests/cli/test_bad_gae_inputs.py, test_bad_flag_values.py, test_bad_rollout_inputs.py,
test_resume_checks.py, test_interrupted_rollout.py, tests/rollout/test_faults_output.py): run a command, check it
failed cleanly naming what it must, snapshot files, write JSONL prompts, a ``pdsr rollout`` on a fake engine."""

from __future__ import annotations

import json

from click.testing import CliRunner

from pdsr_cli.main import cli


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def failed(result, *needles):
    """The command failed cleanly (exit 2, one error line, no traceback) and its message has every needle."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "error: " in result.output.lower()
    for needle in needles:
        assert str(needle) in result.output, (needle, result.output)
    return result.output


def snapshot(*paths):
    return {p: p.read_bytes() for p in paths}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def fake_rollout(tmp_path, model_dir, **output) -> list:
    """``pdsr rollout`` on a fake engine (no vLLM): baseline, 2 samples of 8 tokens a prompt, ``output`` keys in
    the config's output section; flags after it (``--data``, ``--out`` ...) make a whole, fast run."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps({
        "model": str(model_dir), "policy": "baseline", "sampling": {"n": 2, "max_tokens": 8},
        **({"output": output} if output else {}),
        "engines": [{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine", "max_model_len": 256}]}))
    return ["rollout", "--quiet", "--config", cfg]
