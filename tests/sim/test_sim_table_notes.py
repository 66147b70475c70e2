"""The notes under `pdsr simulate`'s tables say what every column shown means, and no column that is not shown:
tok/s, util_<pool> and the counter columns (probes, offloads, moves, steals, ...) had no note, and the steps table's
step_s said "mean of steps 3 to K-1" also where K < 4 averaged every step."""

from __future__ import annotations

import re
import statistics

from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.traces import write_trace_jsonl
from sim_driver_inputs import small_trace


def run(*args: str) -> list[str]:
    result = CliRunner().invoke(cli, ["simulate", *args, "--quiet", "--no-timeline"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def table(lines: list[str], first: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the printed table whose header starts with ``first``."""
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [first])
    body = []
    for line in lines[start + 2:]:
        if not line.strip() or line.startswith("(") or line.split()[0] in (first, "engine"):
            break
        body.append(line.split())
    return lines[start].split(), body


def noted(column: str, notes: str) -> bool:
    name = "util_<pool>" if column.startswith("util_") else column.removesuffix("_s")
    return re.search(rf"(?<![\w<]){re.escape(name)}(, [\w<>]+)* =", notes) is not None   # "of_oracle, of_probe ="


def test_every_column_of_the_side_by_side_table_is_explained_and_no_hidden_one(tmp_path):
    trace = write_trace_jsonl(small_trace(groups=24), tmp_path / "t.jsonl")
    lines = run("--trace", str(trace), "--policy", "v2,v3", "--fast", "2", "--heavy", "1", "--batch-size", "12")
    header, rows = table(lines, "policy")
    notes = "\n".join(line for line in lines if line.startswith("("))
    assert [c for c in header[1:] if not noted(c, notes)] == []
    assert {"tok/s", "util_fast", "util_heavy", "probes", "offloads"} <= set(header)
    counters = next(line for line in lines if line.startswith("(counters"))
    assert "probes =" in counters and "probes =" not in lines[lines.index(counters) - 1]
    for counter in ("restarts", "wasted", "trunc", "preempt"):   # all zero here: not in the table, not explained
        assert counter not in header and f"{counter} =" not in notes
    assert [r[0] for r in rows] == ["baseline", "v2", "v3", "oracle", "oracle-probe"]


def test_one_pool_gets_its_util_column_explained(tmp_path):
    trace = write_trace_jsonl(small_trace(groups=12), tmp_path / "t.jsonl")
    lines = run("--trace", str(trace), "--policy", "baseline", "--fast", "2", "--heavy", "0")
    header, _ = table(lines, "policy")
    assert "util_fast" in header and "util_heavy" not in header
    assert "util_<pool> = share of the pool's engine-time with a step running" in "\n".join(lines)
    assert "(counters" not in "\n".join(lines)


def test_step_s_is_the_mean_of_the_steps_the_note_names(tmp_path):
    """The note's window is checked against the per-step table: step_s equals the mean of those steps' times."""
    trace = write_trace_jsonl(small_trace(groups=60, seed=4), tmp_path / "t.jsonl")
    for steps, window, words in ((5, slice(2, 4), "step_s: mean of steps 3 to 4;"),
                                 (4, slice(2, 3), "step_s: mean of step 3;"),
                                 (3, slice(0, 3), "step_s: mean of all 3 steps (under 4, the first two"),
                                 (1, slice(0, 1), "step_s: the one step's time (it fills the pipeline")):
        lines = run("--trace", str(trace), "--steps", str(steps), "--step-groups", "8", "--over-provision", "0.25",
                    "--fast", "2", "--heavy", "1")
        header, per_step = table(lines, "step")
        times = [float(r[header.index("time_s")]) for r in per_step]
        assert len(times) == steps
        header, summary = table(lines, "F")
        step_s = float(summary[0][header.index("step_s")])
        assert abs(step_s - statistics.mean(times[window])) <= 1e-3 * step_s + 1e-3, (steps, times, step_s)
        assert any(line.startswith("(" + words) for line in lines), (steps, lines[-1][:120])


def test_calibrate_help_says_what_it_measures_and_names_every_column_it_prints(tmp_path):
    import pyarrow.parquet as pq

    from pdsr_sdk.sim.config import SimulateConfig
    from pdsr_sdk.sim.driver import simulate, trajectories_table

    rep = simulate(small_trace(groups=16), SimulateConfig(policy="baseline", fast=1, heavy=1, batch_size=16,
                                                          timeline=False), keep_groups=True)
    traj = tmp_path / "run.parquet"
    pq.write_table(trajectories_table(rep.runs[0].groups), traj)
    result = CliRunner().invoke(cli, ["simulate", "calibrate", "--trajectories", str(traj), "--out",
                                      str(tmp_path / "p.yaml")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    header = result.output.splitlines()[0].split()
    assert header[:2] == ["pool", "spans"]
    help_text = " ".join(CliRunner().invoke(cli, ["simulate", "calibrate", "--help"]).output.split())
    assert [c for c in header if c not in help_text] == []
    assert "a run on this machine's CPU gives a CPU profile" in help_text
    assert "bench/data/profile-h100-7b.yaml" in help_text
