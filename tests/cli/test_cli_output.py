"""What a user sees: status lines, --quiet, progress in a log file, the printed summary (a real run's output:
test_cli_real_run.py; the prompt flags: test_prompt_options.py)."""

from __future__ import annotations

import io
import json
import os
import re
import sys
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli



# -- progress in a log file ---------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_plain_bar_writes_whole_lines_at_an_interval_and_at_the_end():
    from pdsr_sdk.progress import PlainBar

    out, clock = io.StringIO(), Clock()
    bar = PlainBar("samples", total=10, unit="sample", file=out, interval_s=5.0, clock=clock)
    for _ in range(4):
        clock.t += 1.0
        bar.update(1)
    assert out.getvalue() == ""                      # under the interval: nothing yet
    clock.t += 1.0
    bar.update(1)                                    # 5 s: one line
    bar.set_postfix_str("2 moves")
    clock.t += 5.0
    bar.update(5)
    bar.close()
    bar.close()                                      # once only
    assert out.getvalue().splitlines() == ["samples: 5/10 (50%), 1 sample/s, 5 s",
                                           "samples: 10/10 (100%), 1 sample/s, 10 s, 2 moves",
                                           "samples: 10/10 (100%), 1 sample/s, 10 s, 2 moves"]
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_stderr_progress_is_plain_lines_unless_stderr_is_a_terminal(monkeypatch):
    from pdsr_sdk.progress import PlainBar, stderr_progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert isinstance(stderr_progress("x", total=3), PlainBar)
    monkeypatch.setattr(sys, "stderr", Tty())
    bar = stderr_progress("x", total=3)
    assert not isinstance(bar, PlainBar) and type(bar).__module__.startswith("tqdm")
    bar.close()


# -- the printed summary ------------------------------------------------------------------------------

def summary(**over):
    from pdsr_sdk.dispatch.run import STAT_KEYS
    from pdsr_sdk.rollout.summary import RolloutSummary

    stats = {k: 0 for k in STAT_KEYS}
    stats.update(probes=8, moves=3)
    batch = {"batch_index": 0, "groups": 4, "makespan_s": 2.0, "tokens": 500, "tokens_per_s": 250.0,
             "l_cut": None, "fast_cap": None, **{k: 0 for k in STAT_KEYS}, "policy": {}, "reward_sum": 1.0,
             "rewarded_samples": 16}
    base = dict(policy="v3", model="m", output="o.parquet", groups=8, samples=32, skipped_groups=0,
                batches=[batch, {**batch, "batch_index": 1, "moves": 3, "reward_sum": 0.0}], makespan_s=4.0,
                tokens=1000, tokens_per_s=250.0, engine_busy_fraction={"fast-0": 0.91, "heavy-0": 0.5},
                stats=stats, reward_mean=1 / 32, rewarded_samples=32)
    return RolloutSummary(**{**base, **over})


def test_rollout_summary_leads_with_what_matters_and_hides_zero_counters():
    from pdsr_cli.commands.rollout import render_summary

    text = render_summary(summary())
    lines = text.splitlines()
    assert lines[0] == "policy v3: makespan 4.00 s, 250.0 tokens/s, reward mean 0.031"
    assert lines[1] == "counters: probes 8, moves 3"
    extras = render_summary(summary(reward_extra_means={"acc": 0.5, "overlong_reward": -0.0125}))
    assert extras.splitlines()[0].endswith("reward mean 0.031 (acc 0.500, overlong_reward -0.013)")
    assert "engines busy: fast-0 91%, heavy-0 50%" in lines
    table = text[text.index("batch_index"):]
    header = table.splitlines()[0].split()
    assert header == ["batch_index", "groups", "makespan_s", "tokens_per_s", "reward_mean", "tokens", "moves"]
    for zero in ("steals", "breaks", "restarts", "wasted_tokens", "offloaded_prompts", "l_cut", "engines_lost"):
        assert zero not in text
    # no reward function: no reward anywhere; one batch: no batch table
    one = render_summary(summary(reward_mean=None, rewarded_samples=0, batches=summary().batches[:1],
                                 stats={"probes": 0, "moves": 0}))
    assert one.splitlines()[0] == "policy v3: makespan 4.00 s, 250.0 tokens/s"
    assert "counters" not in one and "reward" not in one and "batch_index" not in one


def test_a_multi_step_summary_shows_each_steps_off_policy_columns():
    """``pdsr rollout --steps``: the step table adds the off-policy share, partial tokens, oldest token age,
    staleness restarts and carried groups of each step (the step summary's keys); a batch run has none."""
    from pdsr_cli.commands.rollout import STEP_COLUMNS, render_summary

    base = summary()
    step = {"off_policy_share": 0.25, "partial_tokens": 40, "max_token_age": 1, "stale_restarts": 2,
            "carried_groups": 1}
    text = render_summary(summary(batches=[{**b, **step, "batch_index": i} for i, b in enumerate(base.batches)]))
    table = text[text.index("batch_index"):].splitlines()
    header = table[0].split()
    assert header[-len(STEP_COLUMNS) - 1:] == [*STEP_COLUMNS, "moves"]
    assert table[2].split()[6:11] == ["0.25", "40", "1", "2", "1"]
    assert not any(c in render_summary(base) for c in STEP_COLUMNS)


def test_summary_json_keeps_every_key():
    from pdsr_sdk.dispatch.run import STAT_KEYS

    data = json.loads(summary().to_json())
    assert set(STAT_KEYS) <= set(data["stats"]) and data["stats"]["steals"] == 0
    assert data["reward_mean"] == pytest.approx(1 / 32) and data["rewarded_samples"] == 32
    assert {"l_cut", "fast_cap", "steals", "reward_sum"} <= set(data["batches"][0])


def test_format_table_hides_only_the_named_empty_columns():
    from pdsr_cli.common import format_table

    rows = [{"policy": "a", "moves": 0, "steals": 2, "tail": 0.0},
            {"policy": "b", "moves": 0, "steals": 0, "tail": 0.0}]
    header = format_table(rows, hide_empty=("moves", "steals")).splitlines()[0].split()
    assert header == ["policy", "steals", "tail"]



def test_format_table_writes_large_floats_whole_with_separators_from_a_thousand():
    """A column of tok/s reads alike above and below 10,000: ``8,693`` beside ``10,025``, not ``8693``."""
    from pdsr_cli.common import format_table

    rows = [{"tok/s": v} for v in (8693.4, 10025.0, 999.94, 0.1234567, 1234567.0)]
    assert format_table(rows).splitlines()[2:] == ["    8,693", "   10,025", "    999.9", "   0.1235", "1,234,567"]

# -- status lines and a whole run on fake engines (no vLLM: fast) --------------------------------------

def fake_config(tmp_path, tiny_model_dir) -> Path:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps({
        "model": str(tiny_model_dir), "policy": "baseline", "sampling": {"n": 2, "max_tokens": 8},
        "engines": [{"name": "f0", "pool": "fast", "backend": "fakes:LoopEngine", "max_model_len": 256}]}))
    return cfg


def test_session_reports_engine_start_through_on_status(tmp_path, tiny_model_dir):
    from pdsr_sdk.config import load_config
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    session = RolloutSession(load_config(RolloutConfig, fake_config(tmp_path, tiny_model_dir)))
    seen: list[str] = []
    session.hooks.on_status.append(seen.append)
    with session:
        session.step(["What is 1+1?"])
    assert seen[0] == f"starting 1 engine (1 fast; model {Path(tiny_model_dir).name}) ..."
    assert re.fullmatch(r"engines ready in \d+\.\d s", seen[1]) and len(seen) == 2


def test_the_sample_bar_counts_from_the_start_of_generation(tmp_path, tiny_model_dir):
    """Its elapsed time (and so its rate) covers the batch from its start, not only the time since the first
    sample finished: the bar opens once the engines are ready, before any sample is submitted, so by its first
    update it has been open at least as long as the first finished sample ran (monotonic clocks both)."""
    import time

    import pyarrow.parquet as pq

    from pdsr_sdk.config import load_config
    from pdsr_sdk.progress import PlainBar
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.run import run_rollout

    class Bar(PlainBar):
        first_update: float | None = None

        def update(self, n: int = 1) -> None:
            if self.first_update is None:
                self.first_update = self.clock()
            super().update(n)

    bars: list[Bar] = []

    def progress(desc="", total=None, unit="it"):
        bars.append(Bar(desc, total, unit, file=io.StringIO(), clock=time.monotonic))
        return bars[-1]

    out = tmp_path / "o.parquet"
    config = load_config(RolloutConfig, fake_config(tmp_path, tiny_model_dir),
                         {"sampling.max_tokens": 150, "batch_size": 2, "data.limit": 2, "output.path": str(out)})
    summary = run_rollout(config, progress=progress)
    (bar,) = [b for b in bars if b.desc == "samples"]
    assert bar.n == summary.samples == 2 * 2
    rows = pq.read_table(out).to_pylist()
    shortest = min(r["finish_time_s"] - r["submit_time_s"] for r in rows)
    assert shortest > 0 and bar.first_update - bar.start >= shortest


def test_cli_run_in_a_log_file_on_fake_engines(tmp_path, tiny_model_dir):
    r = CliRunner().invoke(cli, ["rollout", "--config", str(fake_config(tmp_path, tiny_model_dir)),
                                 "--out", str(tmp_path / "o.parquet"), "--n", "2", "--batch-size", "2"])
    assert r.exit_code == 0, r.output
    assert "\r" not in r.output and "\x1b[" not in r.output                  # CliRunner's stderr is no terminal
    assert "pdsr: starting 1 engine (1 fast; model " in r.output and "pdsr: engines ready in " in r.output
    assert re.search(r"^samples: (\d+)/\1 \(100%\), .* sample/s, \d+ s$", r.output, re.M), r.output
    q = CliRunner().invoke(cli, ["rollout", "--config", str(fake_config(tmp_path, tiny_model_dir)), "--quiet",
                                 "--out", str(tmp_path / "o.parquet"), "--overwrite"])
    assert q.exit_code == 0 and "samples:" not in q.output and "pdsr: engines ready in " in q.output


def test_a_comparison_of_policies_names_each_ones_engines_and_says_when_they_differ(tmp_path, tiny_model_dir,
                                                                                     monkeypatch):
    """``--policy baseline,v2.5`` on the automatic layout (fake engines): baseline needs a fast engine, v2.5 a
    fast and a heavy one, and the side-by-side table says so; with --fast and --heavy both get the same."""
    from pdsr_sdk.engines import vllm_env

    monkeypatch.setattr(vllm_env, "is_cpu_build", lambda: True)   # the CPU layout on a GPU machine too
    cfg = tmp_path / "auto.yaml"
    cfg.write_text(json.dumps({"model": str(tiny_model_dir), "sampling": {"n": 2, "max_tokens": 8},
                               "engine_defaults": {"backend": "fakes:LoopEngine", "max_model_len": 256}}))

    def compare(*flags):
        r = CliRunner().invoke(cli, ["rollout", "--quiet", "--config", str(cfg), "--policy", "baseline,v2.5",
                                     "--limit", "2", "--batch-size", "2", "--out", str(tmp_path / "ab.parquet"),
                                     "--overwrite", *flags])
        assert r.exit_code == 0, r.output
        table = r.output[r.output.index("policy    engines"):].splitlines()
        pools = {p: [e["pool"] for e in json.loads((tmp_path / f"ab.{p}.summary.json").read_text())["engines"]]
                 for p in ("baseline", "v2.5")}
        return r.output, table, pools

    out, table, pools = compare()
    assert pools == {"baseline": ["fast"], "v2.5": ["fast", "heavy"]}   # what each run started
    assert "starting 1 engine (1 fast;" in out and "starting 2 engines (1 fast, 1 heavy;" in out
    assert table[0].split()[:3] == ["policy", "engines", "makespan_s"]
    assert table[2].startswith("baseline  1 fast  ") and table[3].startswith("v2.5      1 fast + 1 heavy  ")
    assert table[4] == ("note: the policies ran on different engines (1 fast; 1 fast + 1 heavy): their tokens/s "
                        "compare different engine counts, not the policies alone; --fast and --heavy give every "
                        "policy the same engines")
    out, table, pools = compare("--fast", "1", "--heavy", "1")
    assert pools == {"baseline": ["fast", "heavy"], "v2.5": ["fast", "heavy"]}
    assert [row.split()[1:4] for row in table[2:]] == [["1", "fast", "+"]] * 2 and "note:" not in out


# -- --quiet ------------------------------------------------------------------------------------------

def test_quiet_mode_sets_the_engine_environment_and_restores_it(monkeypatch):
    import logging

    from pdsr_cli.quiet import QUIET_ENV, output_mode
    from pdsr_sdk.errors import PdsrDeprecationWarning, PdsrWarning

    for key in QUIET_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    before = logging.getLogger("vllm").level
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with output_mode(quiet=True):
            assert {k: os.environ[k] for k in QUIET_ENV} == QUIET_ENV     # engine processes inherit these
            assert logging.getLogger("vllm").getEffectiveLevel() == logging.ERROR
            assert logging.getLogger("vllm.triton_utils.importing").getEffectiveLevel() == logging.ERROR
            warnings.warn("third-party noise", UserWarning)
            warnings.warn("old key", PdsrDeprecationWarning)
            warnings.warn("key ignored", PdsrWarning)   # a UserWarning, but pdsr's own
        warnings.warn("after", UserWarning)
    assert [str(w.message) for w in seen] == ["old key", "key ignored", "after"]
    assert os.environ["VLLM_LOGGING_LEVEL"] == "INFO" and "PDSR_QUIET" not in os.environ
    assert logging.getLogger("vllm").level == before


def test_quiet_engine_args_turn_off_the_weight_loading_bar():
    from pdsr_cli.quiet import quiet_engine_args
    from pdsr_sdk.rollout.config import EngineSpec, RolloutConfig

    cfg = quiet_engine_args(RolloutConfig(engine_defaults={"engine_args": {"enable_chunked_prefill": True}}))
    assert cfg.engine_defaults["engine_args"] == {"use_tqdm_on_load": False, "enable_chunked_prefill": True}
    cfg = quiet_engine_args(RolloutConfig(engines=[EngineSpec(name="a", pool="fast",
                                                              engine_args={"use_tqdm_on_load": True}),
                                                   EngineSpec(name="b", pool="fast"),
                                                   EngineSpec(name="c", pool="heavy", backend="sim")]))
    assert [e.engine_args for e in cfg.engines] == [{"use_tqdm_on_load": True}, {"use_tqdm_on_load": False}, {}]


def test_long_running_commands_take_quiet():
    for name in ("rollout", "simulate", "score", "gae"):
        r = CliRunner().invoke(cli, [name, "--help"])
        assert r.exit_code == 0 and "--quiet" in r.output and "status lines" in r.output, name


def test_every_option_of_every_command_has_help():
    import click

    def commands(cmd, path, ctx):
        yield path, cmd
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                yield from commands(cmd.get_command(ctx, name), [*path, name], ctx)

    ctx = click.Context(cli)
    bare = [f"pdsr {' '.join(path)} {max(p.opts, key=len)}" for path, cmd in commands(cli, [], ctx)
            for p in cmd.params if isinstance(p, click.Option) and not p.hidden and not p.help]
    assert not bare, f"options without help: {', '.join(bare)}"
    assert "Data type of the weights written" in CliRunner().invoke(cli, ["model", "smollm2", "--help"]).output
