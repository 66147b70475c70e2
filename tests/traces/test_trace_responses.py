"""Your own rollout logs (one row per response: Parquet, Arrow, JSONL, CSV) into a length trace with `pdsr trace
convert`: each kind gives the trace the equivalent pdsr JSONL trace gives, and bad input is one clean error."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.errors import DataError
from pdsr_sdk.traces import LengthTrace, read_any_trace, read_responses_trace, read_trace
from trace_inputs import assert_same_trace

#: the equivalent pdsr JSONL trace: two prompts of unequal size, rows interleaved in the logs below
TRACE_LINES = [
    {"prompt_id": "a", "prompt_len": 5, "lengths": [10, 11, 12], "finish_reasons": ["stop", "stop", "length"],
     "rewards": [1.0, None, 0.0]},
    {"prompt_id": "b", "prompt_len": 7, "lengths": [20, 21], "finish_reasons": ["stop", "stop"],
     "rewards": [0.0, 1.0]},
]
#: (prompt id, prompt length, response length, finish reason, reward) in the logs' row order
ROWS = [("a", 5, 10, "stop", 1.0), ("b", 7, 20, "stop", 0.0), ("a", 5, 11, "stop", None),
        ("b", 7, 21, "stop", 1.0), ("a", 5, 12, "length", 0.0)]


def _expected(tmp_path: Path, keys=("finish_reasons", "rewards"), prompt_lens=True) -> LengthTrace:
    lines = [{k: v for k, v in line.items() if k in ("prompt_id", "prompt_len", "lengths", *keys)}
             for line in TRACE_LINES]
    if not prompt_lens:
        lines = [dict(line, prompt_len=0) for line in lines]
    path = tmp_path / "expected.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return read_trace(path)


def _verl_table() -> pa.Table:
    """verl-style: uid, float lengths, score."""
    ids, plens, lens, reasons, rewards = zip(*ROWS)
    return pa.table({"uid": list(ids), "prompt_length": pa.array(plens, pa.float64()),
                     "response_length": pa.array(lens, pa.float64()), "finish_reason": list(reasons),
                     "score": pa.array(rewards, pa.float64())})


VERL_FLAGS = ["--id-column", "uid", "--length-column", "response_length", "--prompt-length-column",
              "prompt_length", "--reward-column", "score", "--finish-reason-column", "finish_reason"]


def _convert(src: Path, out: Path, *flags: str):
    return CliRunner().invoke(cli, ["trace", "convert", str(src), *flags, "--out", str(out)])


@pytest.mark.parametrize("kind", ["parquet", "arrow", "stream"])
def test_verl_style_tables_round_trip_with_and_without_flags(tmp_path, kind):
    src = tmp_path / f"dump.{'parquet' if kind == 'parquet' else 'arrow'}"
    if kind == "parquet":
        pq.write_table(_verl_table(), src)
    elif kind == "arrow":
        feather.write_feather(_verl_table(), src)
    else:
        with pa.OSFile(str(src), "wb") as sink, pa.ipc.new_stream(sink, _verl_table().schema) as writer:
            writer.write_table(_verl_table())
    expected = _expected(tmp_path)
    for flags in (VERL_FLAGS, []):   # uid / score / prompt_length are among the names looked for
        out = tmp_path / f"out{len(flags)}.jsonl"
        result = _convert(src, out, *flags)
        assert result.exit_code == 0, result.output
        assert "2 groups, 2..3 samples, 5 samples (with finish reasons, rewards)" in result.output
        assert_same_trace(read_trace(out), expected)


def test_openai_style_jsonl_with_dotted_paths(tmp_path):
    src = tmp_path / "log.jsonl"
    src.write_text("".join(json.dumps({
        "id": f"cmpl-{i}", "metadata": {"prompt_id": pid},
        "choices": [{"text": "...", "finish_reason": reason}],
        "usage": {"prompt_tokens": plen, "completion_tokens": n, "total_tokens": plen + n}}) + "\n"
        for i, (pid, plen, n, reason, _) in enumerate(ROWS)))
    out = tmp_path / "t.jsonl"
    # usage.completion_tokens, usage.prompt_tokens and choices.0.finish_reason are found by their usual names
    result = _convert(src, out, "--id-column", "metadata.prompt_id")
    assert result.exit_code == 0, result.output
    assert_same_trace(read_trace(out), _expected(tmp_path, keys=("finish_reasons",)))


def test_per_response_jsonl_and_csv(tmp_path):
    jsonl = tmp_path / "resp.jsonl"
    jsonl.write_text("".join(json.dumps({"prompt_id": pid, "prompt_len": plen, "response_length": n,
                                         "finish_reason": r, "reward": w}) + "\n" for pid, plen, n, r, w in ROWS))
    assert_same_trace(read_any_trace(jsonl), _expected(tmp_path))
    csv = tmp_path / "log.csv"
    csv.write_text("question,n_tokens,why,score\n" + "".join(
        f"{pid},{float(n) if i == 1 else n},{r},{'' if w is None else w}\n"
        for i, (pid, _, n, r, w) in enumerate(ROWS)))
    out = tmp_path / "t.jsonl"
    result = _convert(csv, out, "--id-column", "question", "--length-column", "n_tokens",
                      "--finish-reason-column", "why")
    assert result.exit_code == 0, result.output
    assert_same_trace(read_trace(out), _expected(tmp_path, prompt_lens=False))   # no prompt length column: 0


def test_sample_index_orders_a_prompts_samples_and_token_ids_are_counted(tmp_path):
    table = pa.table({"prompt_id": ["a", "a", "b", "a"], "sample_index": [7, 2, 0, 5],
                      "response_ids": pa.array([[1, 2, 3], [4], [], [5, 6]], pa.list_(pa.int32()))})
    trace = read_responses_trace(_parquet(tmp_path, table))
    assert trace.prompt_ids == ["a", "b"]
    assert trace.lengths.tolist() == [1, 2, 3, 0]   # a: index 2, 5, 7; b: index 0
    assert trace.prompt_lens.tolist() == [0, 0]


def test_pdsr_traces_and_trajectories_still_convert_as_before(tmp_path):
    trace_path = tmp_path / "trace.jsonl"
    trace_path.write_text("".join(json.dumps(x) + "\n" for x in TRACE_LINES))
    assert_same_trace(read_any_trace(trace_path), _expected(tmp_path))
    ids, plens, lens, reasons, rewards = zip(*ROWS)
    traj = pa.table({"prompt_id": list(ids), "sample_index": [0, 0, 1, 1, 2], "prompt_length": list(plens),
                     "response_length": list(lens), "finish_reason": list(reasons),
                     "reward": pa.array(rewards, pa.float64())})
    assert_same_trace(read_any_trace(_parquet(tmp_path, traj)), _expected(tmp_path))


def _parquet(tmp_path: Path, table: pa.Table, name: str = "log.parquet") -> Path:
    path = tmp_path / name
    pq.write_table(table, path)
    return path


def _bad_csv(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "bad.csv"
    path.write_text(body)
    return path


@pytest.mark.parametrize("make, flags, needle", [
    (lambda d: _parquet(d, _verl_table()), ["--id-column", "prompt"],
     "bad.parquet: --id-column is 'prompt' but the file has no such column; columns: uid, prompt_length"),
    (lambda d: _parquet(d, _verl_table()), ["--length-column", "usage.completion_tokens"],
     "--length-column is 'usage.completion_tokens' but the file has no such column"),
    (lambda d: _parquet(d, _verl_table().drop(["uid"])), [],
     "no prompt id column; name it with --id-column (looked for prompt_id, uid); columns: prompt_length"),
    (lambda d: _parquet(d, _verl_table().set_column(2, "response_length", pa.array([10, 20, 11.5, 21, 12.0]))), [],
     "bad.parquet: column 'response_length' row 2 is 11.5; expected a whole number of tokens"),
    (lambda d: _bad_csv(d, "uid,len\na,10\nb,-3\n"), ["--length-column", "len"],
     "bad.csv: column 'len' row 1 is negative (-3); expected a token count >= 0"),
    (lambda d: _bad_csv(d, "uid,len\na,10\nb,many\n"), ["--length-column", "len"],
     "bad.csv: column 'len' row 1 is text ('many'), not a token count; count its tokens with --tokenizer DIR"),
    (lambda d: _bad_csv(d, "uid,len\na,10\n,4\n"), ["--length-column", "len"],
     "bad.csv: column 'uid' row 1 is empty (null); every response needs its prompt's id"),
    (lambda d: _bad_csv(d, "uid,len,plen\na,10,5\na,4,6\n"), ["--length-column", "len", "--prompt-length-column",
                                                             "plen"],
     "bad.csv: column 'plen' row 1 differs from the other samples of prompt 'a'"),
    (lambda d: _bad_csv(d, "uid,len,k\na,10,1\na,4,1\n"), ["--length-column", "len", "--sample-index-column", "k"],
     "bad.csv: rows 0 and 1 of prompt 'a' have the same k 1; expected distinct values within a prompt"),
    (lambda d: _bad_csv(d, ""), [], "bad.csv: the file is empty"),
    (lambda d: (d / "bad.jsonl").write_text("\n\n") and d / "bad.jsonl", [], "bad.jsonl: the file is empty"),
    (lambda d: _parquet(d, _verl_table().slice(0, 0)), [], "bad.parquet: the table has no rows"),
    (lambda d: _parquet(d, pa.table({"uid": ["a"], "text": ["some words"]})), ["--length-column", "text"],
     "bad.parquet: column 'text' row 0 is text ('some words'), not a token count; count its tokens with --tokenizer"),
    (lambda d: _parquet(d, pa.table({"uid": ["a"], "out": [["some", "words"]]})), ["--length-column", "out"],
     "a list column counts as a length only when it holds token ids (integers)"),
])
def test_bad_logs_are_one_clean_error_naming_file_row_and_column(tmp_path, make, flags, needle):
    src = make(tmp_path)
    if src.suffix == ".parquet":
        src = src.rename(tmp_path / "bad.parquet")
    out = tmp_path / "t.jsonl"
    result = _convert(src, out, *flags)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert needle in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()
    with pytest.raises(DataError):
        read_any_trace(src, **{f.removeprefix("--").replace("-", "_"): v for f, v in zip(flags[::2], flags[1::2])})


def test_simulate_reader_points_a_per_response_log_to_convert(tmp_path):
    src = tmp_path / "resp.jsonl"
    src.write_text(json.dumps({"prompt_id": "a", "response_length": 3}) + "\n")
    with pytest.raises(DataError) as info:
        read_trace(src)
    assert f"{src}:1: this looks like one row per response (keys: prompt_id, response_length)" in str(info.value)
    assert f"`pdsr trace convert {src} --out trace.jsonl` reads such a log" in str(info.value)
    verl = _parquet(tmp_path, _verl_table())
    with pytest.raises(DataError, match=r"missing column\(s\) 'prompt_id', 'sample_index'.*`pdsr trace convert "):
        read_trace(verl)
    csv = _bad_csv(tmp_path, "uid,len\na,1\n")
    with pytest.raises(DataError, match=r"not a length trace .*`pdsr trace convert .*bad.csv --out trace.jsonl`"):
        read_trace(csv)


def test_help_says_which_inputs_are_accepted():
    group = CliRunner().invoke(cli, ["trace", "--help"]).output
    assert "Rollout log (one row per response: Parquet/Arrow/JSONL/CSV)" in group
    text = CliRunner().invoke(cli, ["trace", "convert", "--help"]).output
    for flag in ("--id-column", "--length-column", "--prompt-length-column", "--sample-index-column",
                 "--reward-column", "--finish-reason-column"):
        assert flag in text
    assert "Parquet, Arrow" in text and "CSV" in text


def test_a_log_named_otherwise_is_read_by_its_content_and_chat_turns_are_not_read_as_spans(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("".join(json.dumps({"uid": pid, "response_length": n,
                                       "turns": [{"role": "user", "content": "hi"}]}) + "\n"
                           for pid, _, n, _, _ in ROWS))
    trace = read_any_trace(log)
    assert trace.prompt_ids == ["a", "b"] and trace.lengths.tolist() == [10, 11, 12, 20, 21]
    assert trace.turns is None


def _completion_ordered_log(path: Path, groups: int = 200, n: int = 8, seed: int = 0, shuffle: bool = False):
    """A log of lognormal lengths in the order responses of those lengths finish (shortest first) or, with
    ``shuffle``, in random order; its column ``sample`` numbers each prompt's samples (a name not looked for)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = np.rint(400 * np.exp(0.3 * rng.standard_normal((groups, n)))).astype(int)
    uid = np.repeat(np.arange(groups), n)
    order = rng.permutation(lengths.size) if shuffle else np.argsort(lengths.ravel(), kind="stable")
    pq.write_table(pa.table({"uid": uid[order], "response_length": lengths.ravel()[order],
                             "sample": np.tile(np.arange(n), groups)[order]}), path)


def test_a_log_in_completion_order_warns_that_its_probes_are_the_shortest(tmp_path):
    # a log written as responses finished: each prompt's first row, its probe, was its shortest, without a word
    import warnings

    from pdsr_sdk.errors import PdsrWarning

    path = tmp_path / "done.parquet"
    _completion_ordered_log(path)
    with pytest.warns(PdsrWarning) as said:
        x = read_responses_trace(path).matrix()
    assert (x[:, 0] == x.min(axis=1)).mean() > 0.95   # not reordered: the rows' order, as documented
    text = str(said[0].message)
    chance = ((x == x.min(axis=1, keepdims=True)).sum(axis=1) / 8).mean()   # 1/8, more where the shortest ties
    assert text.startswith(f"{path}: in 200 of 200 prompts (100%) the first row is the prompt's shortest response, "
                           f"against {chance:.1%} expected")
    assert "--sample-index-column" in text and "shuffle" in text
    # the sample-index column orders the samples: no warning, and the probe is the logged sample 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ordered = read_any_trace(path, id_column="uid", sample_index_column="sample").matrix()
    assert (ordered[:, 0] == x.min(axis=1)).mean() < 0.3
    # random order never warns (its false-alarm rate is at most 1e-6), however the rows fell
    for seed in range(30):
        _completion_ordered_log(path, groups=50, seed=seed, shuffle=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            read_any_trace(path, id_column="uid")
    # the CLI prints it as a warning line
    _completion_ordered_log(path)
    result = CliRunner().invoke(cli, ["trace", "convert", str(path), "--id-column", "uid", "--out",
                                      str(tmp_path / "t.jsonl")])
    assert result.exit_code == 0, result.output
    assert "warning: " in result.stderr and "the first row is the prompt's shortest" in result.stderr
