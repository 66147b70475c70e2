"""Length traces: JSONL and trajectories readers, the writer, LengthTrace, synthetic traces, `pdsr trace`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from support import ROOT
from pdsr_cli.main import cli
from pdsr_sdk.errors import DataError
from pdsr_sdk.traces import (
    LengthTrace,
    TraceSynthConfig,
    read_trace,
    synth_trace,
    trace_from_trajectories,
    write_trace_jsonl,
)

REPO = ROOT
EXAMPLE = REPO / "examples" / "traces" / "synth_256x8.jsonl"
#: the command that made the committed example (also in examples/traces/README.md)
EXAMPLE_CONFIG = TraceSynthConfig(groups=256, n=8, seed=0, tokens_per_s=50)


def _write_lines(path: Path, lines: list) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def _assert_same(a: LengthTrace, b: LengthTrace) -> None:
    assert a.prompt_ids == b.prompt_ids
    np.testing.assert_array_equal(a.prompt_lens, b.prompt_lens)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_array_equal(a.offsets, b.offsets)
    for x, y in ((a.durations_s, b.durations_s), (a.finish_reasons, b.finish_reasons)):
        assert (x is None) == (y is None)
        if x is not None:
            np.testing.assert_array_equal(x, y)


# -- JSONL ------------------------------------------------------------------------------

def test_jsonl_parses_ragged_groups_with_optional_keys(tmp_path):
    path = _write_lines(tmp_path / "t.jsonl", [
        {"prompt_id": "a", "prompt_len": 87, "lengths": [412, 380, 9], "durations_s": [4.12, 3.8, 0.09],
         "finish_reasons": ["stop", "stop", "length"]},
        "",
        {"prompt_id": 7, "prompt_len": 0, "lengths": [5.0, 0], "durations_s": [1, 0.0],
         "finish_reasons": ["stop", "abort"], "extra": "ignored"},
    ])
    trace = read_trace(path)
    assert trace.prompt_ids == ["a", "7"]
    assert trace.prompt_lens.tolist() == [87, 0]
    assert trace.lengths.tolist() == [412, 380, 9, 5, 0]
    assert trace.lengths.dtype == np.int64
    assert trace.offsets.tolist() == [0, 3, 5]
    assert trace.durations_s.tolist() == [4.12, 3.8, 0.09, 1.0, 0.0]
    assert trace.finish_reasons.tolist() == ["stop", "stop", "length", "stop", "abort"]
    assert not trace.is_rectangular
    assert trace.group(1) == {"prompt_id": "7", "prompt_len": 0, "lengths": [5, 0], "durations_s": [1.0, 0.0],
                              "finish_reasons": ["stop", "abort"]}


def test_jsonl_without_optional_keys(tmp_path):
    path = _write_lines(tmp_path / "t.jsonl", [{"prompt_id": "a", "prompt_len": 3, "lengths": [1, 2]},
                                               {"prompt_id": "b", "prompt_len": 4, "lengths": [3, 4]}])
    trace = read_trace(path)
    assert trace.durations_s is None and trace.finish_reasons is None
    assert trace.matrix().tolist() == [[1, 2], [3, 4]]
    assert trace.duration_matrix() is None


def test_write_then_read_round_trips(tmp_path):
    trace = synth_trace(groups=37, n=5, seed=3, tokens_per_s=123.0)
    out = write_trace_jsonl(trace, tmp_path / "sub" / "trace.jsonl")
    back = read_trace(out)
    _assert_same(trace, back)
    first = json.loads(out.read_text().splitlines()[0])
    assert list(first) == ["prompt_id", "prompt_len", "lengths", "durations_s", "finish_reasons"]
    assert not list(out.parent.glob(".*.tmp"))  # the temp file was renamed away


def test_non_ascii_ids_and_byte_order_mark(tmp_path):
    trace = LengthTrace.from_matrix(np.array([[3, 4], [5, 6]]), prompt_ids=["数学-1", "b"], prompt_lens=[1, 2])
    out = write_trace_jsonl(trace, tmp_path / "t.jsonl")
    out.read_text(encoding="ascii")  # escaped, so any locale can write and read it
    _assert_same(read_trace(out), trace)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + out.read_bytes())
    _assert_same(read_trace(bom), trace)


GOOD = {"prompt_id": "g", "prompt_len": 5, "lengths": [1, 2, 3]}


@pytest.mark.parametrize("line, needle", [
    ('{"prompt_id": "x", "prompt_len": 5, "lengths": [1, 2', "not valid JSON"),
    ('[1, 2, 3]', "expected a JSON object per line, got list"),
    ({"prompt_id": "x", "lengths": [1]}, "missing key(s) 'prompt_len'"),
    ({"prompt_id": "x", "prompt_len": 5}, "missing key(s) 'lengths'"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": [3, -1]}, "lengths[1] is negative (-1)"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": [3, 1.5]}, "lengths[1] is 1.5; expected an integer"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": [3, "4"]}, "lengths[1] is '4'"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": [True, 4]}, "lengths[0] is True"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": []}, "lengths must be a non-empty list"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": 4}, "lengths must be a non-empty list"),
    ({"prompt_id": "x", "prompt_len": -2, "lengths": [1]}, "prompt_len must be a non-negative integer"),
    ({"prompt_id": ["x"], "prompt_len": 2, "lengths": [1]}, "prompt_id must be a string"),
    ({"prompt_id": "g", "prompt_len": 2, "lengths": [1]}, "duplicate prompt_id 'g' (first on line 1)"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": [1, 2], "durations_s": [0.5]},
     "durations_s has 1 entries but lengths has 2"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": [1], "durations_s": [-0.5]}, "durations_s[0] is -0.5"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": [1], "durations_s": ["1s"]}, "durations_s[0] is '1s'"),
    ({"prompt_id": "x", "prompt_len": 5, "lengths": [1, 2], "finish_reasons": ["stop", 3]},
     "finish_reasons[1] is 3"),
])
def test_jsonl_errors_name_file_line_and_key(tmp_path, line, needle):
    # the bad line is line 2; line 1 is good and, for the optional-key cases, has no optional keys
    first = dict(GOOD)
    if isinstance(line, dict) and "durations_s" in line:
        first["durations_s"] = [0.1, 0.2, 0.3]
    if isinstance(line, dict) and "finish_reasons" in line:
        first["finish_reasons"] = ["stop"] * 3
    path = _write_lines(tmp_path / "bad.jsonl", [first, line])
    with pytest.raises(DataError) as info:
        read_trace(path)
    message = str(info.value)
    assert f"{path}:2:" in message
    assert needle in message


def test_jsonl_optional_key_must_be_all_or_none(tmp_path):
    path = _write_lines(tmp_path / "t.jsonl", [dict(GOOD, durations_s=[1, 2, 3]),
                                               {"prompt_id": "h", "prompt_len": 1, "lengths": [4]}])
    with pytest.raises(DataError, match=r"t.jsonl:2: this line lacks 'durations_s' but line 1 has it"):
        read_trace(path)


def test_jsonl_empty_file_and_unknown_formats(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(DataError, match="the file is empty"):
        read_trace(empty)
    (tmp_path / "run.parquet").write_bytes(b"")   # a zero-byte file is empty, not a JSONL of no lines
    with pytest.raises(DataError, match=r"run.parquet: the file is empty \(no groups\); expected a length trace"):
        read_trace(tmp_path / "run.parquet")
    csv = tmp_path / "lengths.csv"
    csv.write_text("prompt_id,length\na,3\n")
    with pytest.raises(DataError, match="not a length trace"):
        read_trace(csv)
    with pytest.raises(DataError, match="does not exist"):
        read_trace(tmp_path / "missing.jsonl")
    with pytest.raises(DataError, match="is a directory"):
        read_trace(tmp_path)


# -- trajectories tables ------------------------------------------------------------------

def _trajectories() -> pa.Table:
    # rows out of order on purpose; prompt "q" appears first, then "p"
    rows = [
        ("q", 1, 7, 40, "stop", 0.0, 4.0),
        ("p", 2, 5, 300, "length", 1.0, 31.0),
        ("q", 0, 7, 35, "stop", 0.0, 3.5),
        ("p", 0, 5, 100, "stop", 0.0, 10.0),
        ("p", 1, 5, 120, "stop", 0.5, 12.5),
        ("q", 2, 7, 0, "abort", 2.0, 2.0),
    ]
    cols = list(zip(*rows))
    return pa.table({
        "prompt_id": pa.array(cols[0], pa.string()),
        "sample_index": pa.array(cols[1], pa.int32()),
        "prompt_length": pa.array(cols[2], pa.int32()),
        "response_length": pa.array(cols[3], pa.int32()),
        "finish_reason": pa.array(cols[4], pa.string()),
        "submit_time_s": pa.array(cols[5], pa.float64()),
        "finish_time_s": pa.array(cols[6], pa.float64()),
        "response_ids": pa.array([[1, 2]] * len(rows), pa.list_(pa.int32())),  # ignored
    })


EXPECTED_FROM_TRAJECTORIES = LengthTrace.from_matrix(
    np.array([[35, 40, 0], [100, 120, 300]]), prompt_ids=["q", "p"], prompt_lens=[7, 5],
    durations_s=[[3.5, 4.0, 0.0], [10.0, 12.0, 30.0]],
    finish_reasons=[["stop", "stop", "abort"], ["stop", "stop", "length"]])


def test_trajectories_parquet_groups_by_prompt_in_first_appearance_order(tmp_path):
    path = tmp_path / "traj.parquet"
    pq.write_table(_trajectories(), path, row_group_size=2)
    _assert_same(read_trace(path), EXPECTED_FROM_TRAJECTORIES)


def test_trajectories_arrow_file_and_stream(tmp_path):
    table = _trajectories()
    file_path, stream_path = tmp_path / "traj.arrow", tmp_path / "traj.stream"
    with pa.OSFile(str(file_path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=4)
    with pa.OSFile(str(stream_path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=4)
    _assert_same(read_trace(file_path), EXPECTED_FROM_TRAJECTORIES)
    _assert_same(read_trace(stream_path), EXPECTED_FROM_TRAJECTORIES)


def test_trajectories_float_columns_of_whole_numbers_are_read(tmp_path):
    # verl and pandas dumps store lengths (and sometimes indices) as doubles
    table = _trajectories()
    for name in ("sample_index", "prompt_length", "response_length"):
        i = table.column_names.index(name)
        table = table.set_column(i, name, table[name].cast(pa.float64()))
    path = tmp_path / "traj.parquet"
    pq.write_table(table, path)
    _assert_same(read_trace(path), EXPECTED_FROM_TRAJECTORIES)


def test_trajectories_without_timing_columns():
    table = _trajectories().drop(["submit_time_s", "finish_time_s", "finish_reason"])
    trace = trace_from_trajectories(table)
    assert trace.durations_s is None and trace.finish_reasons is None
    assert trace.matrix().tolist() == [[35, 40, 0], [100, 120, 300]]


def _with(table: pa.Table, name: str, values) -> pa.Table:
    i = table.column_names.index(name)
    return table.set_column(i, name, pa.array(values, table.schema.field(name).type))


@pytest.mark.parametrize("edit, needle", [
    (lambda t: t.drop(["sample_index"]), "missing column(s) 'sample_index'"),
    (lambda t: _with(t, "sample_index", [1, 2, 0, 0, 1, 1]), "prompt 'q' has sample_index values [0, 1, 1]"),
    (lambda t: _with(t, "sample_index", [1, 2, 3, 0, 1, 2]), "prompt 'q' has sample_index values [1, 2, 3]"),
    (lambda t: _with(t, "response_length", [40, 300, 35, 100, -1, 0]), "'response_length' row 4 is negative"),
    (lambda t: _with(t, "prompt_length", [7, 5, 7, 5, 6, 7]), "'prompt_length' row 4 differs"),
    (lambda t: _with(t, "finish_time_s", [4.0, 31.0, 3.5, 10.0, 12.5, 1.0]), "row 5: finish_time_s - submit_time_s"),
    (lambda t: _with(t, "response_length", [40, None, 35, 100, 120, 0]), "'response_length' row 1 is null"),
    (lambda t: t.set_column(1, "sample_index", pa.array(["1", "2", "0", "0", "1", "2"])),
     "'sample_index' must be integers (or whole floats), got string"),
    (lambda t: t.set_column(3, "response_length", pa.array([40.0, 300, 35, 100, 120.5, 0])),
     "column 'response_length' row 4 is 120.5; expected a whole number"),
    (lambda t: t.set_column(3, "response_length", pa.array([40.0, 300, 35, 100, float("inf"), 0])),
     "column 'response_length' row 4 is inf; expected a whole number"),
])
def test_trajectories_errors_name_file_row_and_column(tmp_path, edit, needle):
    path = tmp_path / "traj.parquet"
    pq.write_table(edit(_trajectories()), path)
    with pytest.raises(DataError) as info:
        read_trace(path)
    assert str(path) in str(info.value)
    assert needle in str(info.value)


# -- LengthTrace ---------------------------------------------------------------------------

def test_matrix_of_ragged_trace_names_the_groups():
    trace = LengthTrace(prompt_ids=["a", "b", "c"], prompt_lens=[1, 1, 1], lengths=[1, 2, 3, 4, 5, 6, 7],
                        offsets=[0, 3, 6, 7])
    assert trace.group_sizes.tolist() == [3, 3, 1]
    with pytest.raises(DataError, match=r"group 0 \('a'\) has 3 and group 2 \('c'\) has 1"):
        trace.matrix()


@pytest.mark.parametrize("kwargs, needle", [
    (dict(offsets=[0, 2, 3]), "offsets must have"),
    (dict(offsets=[0, 0, 4]), "group 0 ('a') has no samples"),
    (dict(lengths=[1, -2, 3, 4]), "group 0 ('a') has a negative length"),
    (dict(prompt_lens=[1]), "prompt_lens has 1 entries"),
    (dict(durations_s=[1.0, 2.0]), "durations_s has 2 entries"),
    (dict(finish_reasons=["stop"]), "finish_reasons has 1 entries"),
])
def test_length_trace_checks_its_shape(kwargs, needle):
    base = dict(prompt_ids=["a", "b"], prompt_lens=[1, 2], lengths=[1, 2, 3, 4], offsets=[0, 2, 4])
    with pytest.raises(DataError) as info:
        LengthTrace(**{**base, **kwargs})
    assert needle in str(info.value)


# -- synthetic traces -----------------------------------------------------------------------

def test_synth_is_reproducible_and_seed_dependent():
    a, b = synth_trace(groups=64, seed=5), synth_trace(groups=64, seed=5)
    _assert_same(a, b)
    assert not np.array_equal(a.lengths, synth_trace(groups=64, seed=6).lengths)


def test_synth_respects_bounds_and_marks_the_cap():
    cfg = TraceSynthConfig(groups=500, n=6, seed=1, median_length=300, prompt_sigma=1.5, noise_sigma=1.0,
                           max_length=900, min_length=20, prompt_len_min=10, prompt_len_max=12, tokens_per_s=40)
    trace = synth_trace(cfg)
    x = trace.matrix()
    assert x.shape == (500, 6)
    assert x.min() == 20 and x.max() == 900  # such wide sigmas reach both clips
    assert set(trace.prompt_lens.tolist()) == {10, 11, 12}
    np.testing.assert_array_equal(trace.finish_reasons == "length", trace.lengths == 900)
    np.testing.assert_allclose(trace.durations_s, trace.lengths / 40.0)
    assert trace.prompt_ids[0] == "p000" and trace.prompt_ids[-1] == "p499"


def test_synth_degenerate_parameters_give_exact_lengths():
    trace = synth_trace(groups=10, n=4, median_length=123.4, prompt_sigma=0, noise_sigma=0, runaway_frac=0)
    assert (trace.lengths == 123).all()
    runaway = synth_trace(groups=10, n=4, runaway_frac=1.0, max_length=777)
    assert (runaway.lengths == 777).all() and (runaway.finish_reasons == "length").all()


def test_synth_log_lengths_follow_the_model():
    # No clipping or runaways: log length = log(median) + prompt_sigma*z_g + noise_sigma*e_gj.
    cfg = TraceSynthConfig(groups=20000, n=8, seed=2, median_length=1000, prompt_sigma=0.5, noise_sigma=0.25,
                           runaway_frac=0.0, max_length=10**9)
    logs = np.log(synth_trace(cfg).matrix())
    assert np.median(logs) == pytest.approx(np.log(1000), abs=0.02)
    within = logs.std(axis=1, ddof=1)          # per-group sample std estimates noise_sigma
    assert np.sqrt((within ** 2).mean()) == pytest.approx(0.25, rel=0.02)
    between = logs.mean(axis=1).std()          # group means: prompt_sigma^2 + noise_sigma^2 / n
    assert between == pytest.approx(np.sqrt(0.5 ** 2 + 0.25 ** 2 / 8), rel=0.03)


def test_synth_runaway_concentration_spreads_the_rate_between_prompts():
    # each prompt draws its own runaway rate from Beta(f*k, (1-f)*k): the mean stays f, and the per-prompt
    # share at the cap varies (1 + (n-1)/(k+1)) times as much as with independent runaways
    kw = dict(groups=20000, n=8, seed=3, prompt_sigma=0.0, noise_sigma=0.7, runaway_frac=0.35, max_length=10**6)
    plain, spread = synth_trace(**kw).matrix(), synth_trace(**kw, runaway_concentration=5).matrix()
    cap_plain, cap_spread = (plain == 10**6).mean(axis=1), (spread == 10**6).mean(axis=1)
    assert cap_plain.mean() == pytest.approx(0.35, abs=0.005) and cap_spread.mean() == pytest.approx(0.35, abs=0.01)
    binomial = 0.35 * 0.65 / 8
    assert cap_plain.var() == pytest.approx(binomial, rel=0.05)
    assert cap_spread.var() == pytest.approx(binomial * (1 + 7 / 6), rel=0.05)
    # drawn last: the lengths of samples that run away in neither trace are the same
    both = (plain < 10**6) & (spread < 10**6)
    np.testing.assert_array_equal(plain[both], spread[both])


def test_synth_defaults_resemble_the_seed_statistics():
    from pdsr_sdk.analysis import group_cv, spearman_vs_probe

    x = synth_trace(groups=4000, seed=0).matrix()
    assert 0.25 < group_cv(x).mean() < 0.38        # seed: 0.29
    assert 0.5 < spearman_vs_probe(x).mean() < 0.7  # seed: 0.62
    assert (x == 4096).any()                         # a few runaways reach the cap


def test_synth_rejects_inverted_ranges():
    from pdsr_sdk.errors import ConfigError
    from pdsr_sdk.config import load_config

    with pytest.raises(ConfigError, match="min_length"):
        load_config(TraceSynthConfig, overrides={"min_length": 10, "max_length": 5})


def test_committed_example_is_what_synth_makes(tmp_path):
    """examples/traces/synth_256x8.jsonl is what the command in its README writes, byte for byte."""
    fresh = write_trace_jsonl(synth_trace(EXAMPLE_CONFIG), tmp_path / "fresh.jsonl")
    assert EXAMPLE.read_text() == fresh.read_text()
    _assert_same(read_trace(EXAMPLE), synth_trace(EXAMPLE_CONFIG))


# -- CLI ------------------------------------------------------------------------------------

def test_cli_synth_writes_the_sdk_trace(tmp_path):
    out = tmp_path / "t.jsonl"
    result = CliRunner().invoke(cli, ["trace", "synth", "--groups", "40", "--n", "4", "--seed", "9",
                                      "--tokens-per-s", "80", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "40 groups x 4 samples" in result.output
    _assert_same(read_trace(out), synth_trace(groups=40, n=4, seed=9, tokens_per_s=80))


def test_cli_synth_flags_override_config_file(tmp_path):
    cfg = tmp_path / "synth.yaml"
    cfg.write_text("groups: 12\nn: 3\nseed: 4\nmax_length: 999\n")
    out = tmp_path / "t.jsonl"
    result = CliRunner().invoke(cli, ["trace", "synth", "--config", str(cfg), "--n", "5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    _assert_same(read_trace(out), synth_trace(groups=12, n=5, seed=4, max_length=999))


def test_cli_synth_bad_value_is_a_clean_error(tmp_path):
    result = CliRunner().invoke(cli, ["trace", "synth", "--groups", "0", "--out", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 2
    assert "groups" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("job", ["synth", "convert"])
def test_cli_an_existing_out_is_kept_unless_overwrite(tmp_path, job):
    src = tmp_path / "traj.parquet"
    pq.write_table(_trajectories(), src)
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
    src = _write_lines(tmp_path / "t.jsonl", [GOOD])
    before = src.read_text()
    result = CliRunner().invoke(cli, ["trace", "convert", str(src), "--out", str(src), "--overwrite"])
    assert result.exit_code == 2 and f"--out and SOURCE are the same file {src}" in result.output, result.output
    assert src.read_text() == before


def test_cli_convert_parquet_to_jsonl(tmp_path):
    src, out = tmp_path / "traj.parquet", tmp_path / "trace.jsonl"
    pq.write_table(_trajectories(), src)
    result = CliRunner().invoke(cli, ["trace", "convert", str(src), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "2 groups, 3 samples each, 6 samples (with durations, finish reasons)" in result.output
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0] == {"prompt_id": "q", "prompt_len": 7, "lengths": [35, 40, 0], "durations_s": [3.5, 4.0, 0.0],
                        "finish_reasons": ["stop", "stop", "abort"]}
    assert lines[1]["lengths"] == [100, 120, 300]


def test_cli_convert_reports_bad_input_without_traceback(tmp_path):
    src = _write_lines(tmp_path / "bad.jsonl", [GOOD, {"prompt_id": "h", "prompt_len": 1, "lengths": [-4]}])
    result = CliRunner().invoke(cli, ["trace", "convert", str(src), "--out", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 2
    assert f"{src}:2: lengths[0] is negative" in result.output
    assert not (tmp_path / "o.jsonl").exists()
