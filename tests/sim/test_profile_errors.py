"""A bad ``--profile`` file is one error line naming the file and the key, before anything is simulated: an empty
file ran on the illustrative GPU-like defaults as if no profile were given, and an infinite cost ran into a
traceback from the cost model (or, as a speculation yield, into makespans below the lower bound)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.sim.config import load_profile_file
from support import ROOT

TRACE = ROOT / "examples" / "traces" / "synth_256x8.jsonl"


def simulate_with(profile):
    return CliRunner().invoke(cli, ["simulate", "--trace", str(TRACE), "--num-batches", "1", "--policy", "v3",
                                    "--profile", str(profile), "--quiet"], catch_exceptions=False)


@pytest.mark.parametrize("text, where, what", [
    ("", "", "no pool in the profile file"),
    ("# only a comment\n", "", "no pool in the profile file"),
    ("fast: {c0_s: .inf}\n", "fast.c0_s", "finite number"),
    ("heavy: {c1_s_per_seq: .nan}\n", "heavy.c1_s_per_seq", "finite number"),
    ("fast: {c2_s_per_token: .inf}\n", "fast.c2_s_per_token", "finite number"),
    ("fast: {prefill_s_per_token: .inf}\n", "fast.prefill_s_per_token", "finite number"),
    ("fast: {c0_s: -0.01}\n", "fast.c0_s", "greater than 0"),
    ("fast: {c0_ms: 5}\n", "fast.c0_ms", "unknown config key"),
    ("fast: {c0_s: 5ms}\n", "fast.c0_s", "valid number"),
    ("fast: {speculation: {tokens_per_step: .inf}}\n", "fast.speculation.tokens_per_step", "finite number"),
    ("fast: {speculation: {verify_cost: [[1, .inf]]}}\n", "fast.speculation", "finite positive factors"),
    ("fast: {speculation: {verify_cost: [[1, .nan]]}}\n", "fast.speculation", "finite positive factors"),
    ("fast: {speculation: {by_position: [[0, .nan, 0.5]]}}\n", "fast.speculation", "tokens_per_step >= 1"),
])
def test_a_bad_profile_names_its_file_and_key(tmp_path, text, where, what):
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=what) as info:
        load_profile_file(path)
    assert str(path) in str(info.value) and where in str(info.value)
    result = simulate_with(path)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "error: " in result.output
    assert f"{path}: {where}" in result.output and what in result.output
