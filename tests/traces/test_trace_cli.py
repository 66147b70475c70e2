"""`pdsr trace synth` and `pdsr trace convert`: the files they write, --config and flags, --out and
--overwrite, and clean errors."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.traces import read_trace, synth_trace
from trace_inputs import GOOD, assert_same_trace, sample_trajectories, write_lines


def test_cli_synth_writes_the_sdk_trace(tmp_path):
    out = tmp_path / "t.jsonl"
    result = CliRunner().invoke(cli, ["trace", "synth", "--groups", "40", "--n", "4", "--seed", "9",
                                      "--tokens-per-s", "80", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "40 groups x 4 samples" in result.output
    assert_same_trace(read_trace(out), synth_trace(groups=40, n=4, seed=9, tokens_per_s=80))


def test_cli_synth_counts_one_group_and_one_sample_in_the_singular(tmp_path):
    result = CliRunner().invoke(cli,
                                ["trace", "synth", "--groups", "1", "--n", "1", "--out", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 0, result.output
    assert ": 1 group x 1 sample, length median" in result.output   # was "1 groups x 1 samples"


def test_cli_synth_flags_override_config_file(tmp_path):
    cfg = tmp_path / "synth.yaml"
    cfg.write_text("groups: 12\nn: 3\nseed: 4\nmax_length: 999\n")
    out = tmp_path / "t.jsonl"
    result = CliRunner().invoke(cli, ["trace", "synth", "--config", str(cfg), "--n", "5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert_same_trace(read_trace(out), synth_trace(groups=12, n=5, seed=4, max_length=999))


def test_cli_synth_bad_value_is_a_clean_error(tmp_path):
    result = CliRunner().invoke(cli, ["trace", "synth", "--groups", "0", "--out", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 2
    assert "groups" in result.output and "Traceback" not in result.output


HUGE = str(10**20)   # past int64: numpy's arithmetic on it raised OverflowError / ValueError deep in the generator


@pytest.mark.parametrize("flags, named", [
    (["--max-length", HUGE], "--max-length"),
    (["--min-length", HUGE, "--max-length", HUGE], "--max-length"),
    (["--prompt-len-min", HUGE, "--prompt-len-max", HUGE], "--prompt-len-min"),
    (["--turns-max", HUGE], "--turns-max"),
    (["--env-tokens-max", HUGE, "--turns-max", "3"], "--env-tokens-max"),
    (["--groups", HUGE], "groups (--groups) x n (--n)"),
    (["--groups", "100000000", "--n", "100000"], "groups (--groups) x n (--n)"),   # 10^13 samples: a 73 TiB allocation
    (["--env-delay-max-s", "inf", "--turns-max", "3"], "--env-delay-max-s"),
    (["--median-length", "inf"], "--median-length"),                # every length silently at the cap
    (["--runaway-concentration", "inf"], "--runaway-concentration"),  # Beta(inf, inf): no runaways at all
])
def test_cli_synth_out_of_range_values_are_clean_errors(tmp_path, flags, named):
    from cli_checks import failed, invoke

    out = tmp_path / "t.jsonl"
    failed(invoke("trace", "synth", *flags, "--out", out), named)
    assert not out.exists()


def test_synth_takes_lengths_up_to_its_bound(tmp_path):
    from pdsr_sdk.traces.config import MAX_TOKENS

    trace = synth_trace(groups=50, n=4, max_length=MAX_TOKENS, runaway_frac=0.1, seed=0)
    assert trace.lengths.max() == MAX_TOKENS and (trace.lengths > 0).all()


@pytest.mark.parametrize("job", ["synth", "convert"])
def test_cli_an_existing_out_is_kept_unless_overwrite(tmp_path, job):
    src = tmp_path / "traj.parquet"
    pq.write_table(sample_trajectories(), src)
    out = tmp_path / "t.jsonl"
    out.write_text("mine\n")
    args = ["trace", "synth", "--groups", "4", "--n", "2"] if job == "synth" else ["trace", "convert", str(src)]
    result = CliRunner().invoke(cli, [*args, "--out", str(out)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"--out {out}: already exists; pass --overwrite to replace it" in result.output
    assert out.read_text() == "mine\n"
    result = CliRunner().invoke(cli, [*args, "--out", str(out), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert read_trace(out).num_groups == (4 if job == "synth" else 2)


def test_cli_convert_onto_its_source_is_refused(tmp_path):
    src = write_lines(tmp_path / "t.jsonl", [GOOD])
    before = src.read_text()
    result = CliRunner().invoke(cli, ["trace", "convert", str(src), "--out", str(src), "--overwrite"])
    assert result.exit_code == 2 and f"--out and SOURCE are the same file {src}" in result.output, result.output
    assert src.read_text() == before


def test_cli_convert_parquet_to_jsonl(tmp_path):
    src, out = tmp_path / "traj.parquet", tmp_path / "trace.jsonl"
    pq.write_table(sample_trajectories(), src)
    result = CliRunner().invoke(cli, ["trace", "convert", str(src), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "2 groups, 3 samples each, 6 samples (with durations, finish reasons)" in result.output
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0] == {"prompt_id": "q", "prompt_len": 7, "lengths": [35, 40, 0], "durations_s": [3.5, 4.0, 0.0],
                        "finish_reasons": ["stop", "stop", "abort"]}
    assert lines[1]["lengths"] == [100, 120, 300]


def test_cli_convert_reports_bad_input_without_traceback(tmp_path):
    src = write_lines(tmp_path / "bad.jsonl", [GOOD, {"prompt_id": "h", "prompt_len": 1, "lengths": [-4]}])
    result = CliRunner().invoke(cli, ["trace", "convert", str(src), "--out", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 2
    assert f"{src}:2: lengths[0] is negative" in result.output
    assert not (tmp_path / "o.jsonl").exists()


def convert_error(tmp_path, source) -> str:
    result = CliRunner().invoke(cli, ["trace", "convert", str(source), "--out", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert not (tmp_path / "o.jsonl").exists()
    return result.output.strip()


@pytest.mark.parametrize("name, make, expected", [
    ("gone.jsonl", lambda p: None, "rollout log file does not exist"),
    ("gone-*.parquet", lambda p: None, "rollout log file does not exist, nor does the pattern match any"),
    ("empty", lambda p: p.mkdir(), "the folder must hold rollout log files of one format"),
    ("log.bin", lambda p: p.write_bytes(b"neither Parquet nor Arrow"), "cannot read rollout log file as parquet"),
    ("broken.parquet", lambda p: p.write_bytes(b"PAR1 and nothing else"), "cannot read trajectories file"),
    ("bad.jsonl", lambda p: p.write_text("hello\n"), ":1: not valid JSON"),
    ("cols.csv", lambda p: p.write_text("x,y\n1,2\n"), "no prompt id column; name it with --id-column"),
])
def test_cli_convert_errors_about_source_name_the_argument(tmp_path, name, make, expected):
    """Each error about SOURCE (missing, a pattern matching nothing, a folder of no files read, a format not
    read, a bad line, no usable column) names the argument as well as its path, as --data's errors name it."""
    source = tmp_path / name
    make(source)
    message = convert_error(tmp_path, source)
    assert message.startswith(f"error: SOURCE {source}"), message
    assert expected in message


def test_cli_convert_a_missing_source_is_named_as_the_user_gave_it(tmp_path):
    """A path, a pattern or a folder that gives no file is named as what SOURCE is, the user's rollout log (it
    said 'response file', the table reader's word for it), in these words."""
    formats = ".parquet, .jsonl, .json, .arrow, .ipc, .feather, .csv, .tsv"
    gone, pattern, folder = tmp_path / "gone.jsonl", tmp_path / "gone-*.jsonl", tmp_path / "logs"
    folder.mkdir()
    assert convert_error(tmp_path, gone) == f"error: SOURCE {gone}: rollout log file does not exist"
    assert convert_error(tmp_path, pattern) == (f"error: SOURCE {pattern}: rollout log file does not exist, nor "
                                                f"does the pattern match any")
    assert convert_error(tmp_path, folder) == (f"error: SOURCE {folder}: the folder must hold rollout log files of "
                                               f"one format ({formats}); found none")


def test_cli_convert_an_unreadable_source_is_an_error_naming_it(tmp_path, monkeypatch):
    """A SOURCE the process may not read is one error line naming it, not an OSError's traceback. (Path.open raises
    what the OS would: the tests run as root here, where a file of mode 000 reads anyway.)"""
    from pathlib import Path

    source = write_lines(tmp_path / "t.jsonl", [GOOD])
    real_open = Path.open

    def denied(self, *args, **kwargs):
        if self == source:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", denied)
    assert convert_error(tmp_path, source) == f"error: SOURCE {source}: cannot read: Permission denied"


@pytest.mark.parametrize("command", [["trace", "convert", "{}", "--out", "{out}"], ["analyze", "{}", "--no-plots"],
                                     ["simulate", "--trace", "{}", "--quiet"]])
def test_a_pretty_printed_report_given_as_a_trace_or_log_is_named_as_one(tmp_path, command):
    """A JSON report (pdsr rollout's .summary.json, here one of its shape) given where a trace or a log goes read
    as 'summary.json:1: not valid JSON: Expecting property name enclosed in double quotes': the file is valid JSON,
    one object over lines; the error now says what it is. A JSONL file whose later line is cut keeps its line."""
    report = tmp_path / "roll.summary.json"
    report.write_text(json.dumps({"policy": "v3", "makespan_s": 1.5, "counters": {"probes": 16}}, indent=2) + "\n")
    args = [a.format(report, out=tmp_path / "o.jsonl") for a in command]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert f"{report}: one JSON object over 7 lines (a report, such as pdsr rollout's .summary.json or pdsr " \
           "analyze's analysis.json), not JSON Lines (one JSON object per line); line 1 alone is not valid JSON " \
           "(Expecting property name enclosed in double quotes)" in result.output
    cut = write_lines(tmp_path / "cut.jsonl", [GOOD, json.dumps(GOOD)[:20]])
    result = CliRunner().invoke(cli, [a.format(cut, out=tmp_path / "o.jsonl") for a in command])
    assert result.exit_code == 2 and f"{cut}:2: not valid JSON: " in result.output, result.output


def test_the_output_of_a_rollout_still_running_or_stopped_is_named_as_such(tmp_path):
    """A rollout streams finished groups to <out>.parts/ and writes <out> at its end, holding <out>.lock meanwhile.
    Converting, analysing or simulating <out> before then said only 'file does not exist'; the error now says a
    run is writing it (process, lock) or stopped before its end, and where what it finished is. The parts folder
    converts as it is. A path with neither is the plain error."""
    import os
    import subprocess
    import sys

    out = tmp_path / "roll.parquet"
    parts, lock = tmp_path / "roll.parquet.parts", tmp_path / "roll.parquet.lock"
    commands = [(["trace", "convert", str(out), "--out", str(tmp_path / "t.jsonl"), "--overwrite"],
                 f"SOURCE {out}: rollout log",
                 "give that folder to read them as they are"),
                (["analyze", str(out), "--no-plots"], f"TRACE {out}: trace",
                 f"`pdsr trace convert {parts} --out trace.jsonl` makes a trace of them"),
                (["simulate", "--trace", str(out), "--quiet"], f"trace (--trace) {out}: trace",
                 f"`pdsr trace convert {parts} --out trace.jsonl` makes a trace of them")]

    def errors() -> list[str]:
        results = [CliRunner().invoke(cli, args) for args, _, _ in commands]
        assert all(r.exit_code == 2 and "Traceback" not in r.output for r in results), [r.output for r in results]
        return [r.output.strip() for r in results]

    running = (f"pdsr rollout (process {os.getpid()}, holding roll.parquet.lock) is still writing it and writes it "
               f"at its end")
    lock.write_text(f"{os.getpid()} pdsr rollout")
    for message, (_, where, _) in zip(errors(), commands):
        assert message == f"error: {where} file does not exist yet: {running}; it has finished nothing yet"
    parts.mkdir()
    pq.write_table(sample_trajectories(), parts / "part-000000.parquet")
    for message, (_, where, read) in zip(errors(), commands):
        assert message == (f"error: {where} file does not exist yet: {running}; the part files of what it has "
                           f"finished so far are in {parts}/: {read}")
    # the run stopped (SIGTERM removes the lock; SIGKILL leaves it, naming a process that is gone)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(f"{gone.stdout.strip()} pdsr rollout")
    for message, (_, where, read) in zip(errors(), commands):
        assert message == (f"error: {where} file does not exist yet: a run writing it stopped before its end "
                           f"(--resume finishes it); the part files of what it finished are in {parts}/: {read}")
    result = CliRunner().invoke(cli, ["trace", "convert", str(parts), "--out", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 0 and read_trace(tmp_path / "t.jsonl").num_groups == 2, result.output
    lock.unlink()
    (parts / "part-000000.parquet").unlink()
    for message, (_, where, _) in zip(errors(), commands):
        assert message == f"error: {where} file does not exist"


def test_reading_an_output_a_run_is_writing_warns_what_it_reads(tmp_path):
    """A --resume (or --overwrite) rollout keeps OUT as it was and writes its new groups to OUT.parts/ until its end:
    converting, analysing or simulating OUT meanwhile read the earlier groups alone, without a word. Each now warns
    (and still reads the file); a lock whose process is gone says nothing."""
    import os
    import subprocess
    import sys

    out = tmp_path / "roll.parquet"
    pq.write_table(sample_trajectories(), out)
    lock = tmp_path / "roll.parquet.lock"
    commands = [(["trace", "convert", str(out), "--out", str(tmp_path / "t.jsonl"), "--overwrite"], "SOURCE"),
                (["analyze", str(out), "--no-plots", "--out-dir", str(tmp_path / "a")], "TRACE"),
                (["simulate", "--trace", str(out), "--quiet"], "trace (--trace)")]
    lock.write_text(f"{os.getpid()} pdsr rollout")
    for args, label in commands:
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        assert (f"warning: {label} {out}: pdsr rollout (process {os.getpid()}, holding roll.parquet.lock) is writing "
                f"this output now: the file read is what it held when that run started; the groups finished since "
                f"are in {tmp_path / 'roll.parquet.parts'}/ and join it at the run's end") in result.stderr
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(f"{gone.stdout.strip()} pdsr rollout")
    for args, _ in commands:
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0 and "is writing this output" not in result.output, result.output
