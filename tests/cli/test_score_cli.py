"""``pdsr score``: round trip on a small Parquet file and its error messages."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from pdsr_cli.main import cli  # noqa: E402


def _write(path, prompts, responses, **extra):
    pq.write_table(pa.table({"prompt_token_ids": prompts, "response_token_ids": responses, **extra}), path)
    return path


@pytest.fixture(scope="module")
def rows():
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 1024, int(rng.integers(1, 30))).tolist() for _ in range(10)]
    responses = [rng.integers(0, 1024, int(rng.integers(1, 60))).tolist() for _ in range(10)]
    return prompts, responses


def _run(*args):
    result = CliRunner().invoke(cli, ["score", *map(str, args)])
    return result


def test_round_trip_matches_sdk(tmp_path, tiny_model_dir, rows):
    from pdsr_sdk.scoring import per_token_logps
    from pdsr_sdk.scoring.torch_backend import load_model

    data = _write(tmp_path / "traj.parquet", *rows, sample_id=list(range(10)))
    out = tmp_path / "sub" / "scored.parquet"
    res = _run("--model", tiny_model_dir, "--data", data, "--out", out, "--mbs", 4, "--entropy",
               "--dtype", "float32", "--device", "cpu", "--column", "old_logps")
    assert res.exit_code == 0, res.output
    table = pq.read_table(out)
    assert table.column_names == ["prompt_token_ids", "response_token_ids", "sample_id", "old_logps",
                                  "old_logps_entropy"]
    assert table.column("sample_id").to_pylist() == list(range(10))
    assert table.schema.field("old_logps").type == pa.list_(pa.float32())
    assert b"description" in table.schema.field("old_logps").metadata
    expected = per_token_logps(load_model(tiny_model_dir, "cpu", "float32"), *rows, return_entropy=True)
    for got, want, resp in zip(table.column("old_logps").to_pylist(), expected.logps, rows[1]):
        assert len(got) == len(resp)
        np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=1e-6, atol=1e-6)
    for got, want in zip(table.column("old_logps_entropy").to_pylist(), expected.entropy):
        np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=1e-6, atol=1e-6)
    # the one summary line
    for piece in ("tokens/s", "peak memory", "micro-batches", "distinct shapes", "padding efficiency"):
        assert piece in res.output
    assert "3 micro-batches (mbs=4)" in res.output
    assert not list(out.parent.glob(".*.tmp"))  # atomic write left no temp file


def test_pack_flag_packs_and_matches_unpacked(tmp_path, tiny_model_dir, rows):
    data = _write(tmp_path / "traj.parquet", *rows)
    outs = {}
    for name, extra in (("packed", ["--pack"]), ("padded", ["--no-pack"])):
        outs[name] = tmp_path / f"{name}.parquet"
        res = _run("--model", tiny_model_dir, "--data", data, "--out", outs[name], "--max-tokens-per-mb", 256,
                   "--dtype", "float32", "--device", "cpu", *extra)
        assert res.exit_code == 0, res.output
        assert ("packed, token quota 256" in res.output) == (name == "packed")
        if name == "packed":
            assert "padding efficiency 1.000" in res.output
    got = pq.read_table(outs["packed"]).column("ref_logps").to_pylist()
    want = pq.read_table(outs["padded"]).column("ref_logps").to_pylist()
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def test_config_file_and_flag_override(tmp_path, tiny_model_dir, rows):
    data = _write(tmp_path / "traj.parquet", *rows)
    cfg = tmp_path / "score.yaml"
    cfg.write_text(f"model: {tiny_model_dir}\ndata: {data}\nout: {tmp_path / 'a.parquet'}\nmbs: 3\n"
                   f"dtype: float32\ndevice: cpu\n")
    res = _run("--config", cfg, "--max-tokens-per-mb", 512, "--out", tmp_path / "b.parquet")
    assert res.exit_code == 0, res.output
    assert "(token quota 512)" in res.output  # the flag's mode replaced the file's mbs
    assert (tmp_path / "b.parquet").exists() and not (tmp_path / "a.parquet").exists()


def test_without_model_uses_tiny_model(tmp_path, tiny_model_dir, rows, monkeypatch):
    from pdsr_sdk.models import tiny

    monkeypatch.setattr(tiny, "ensure_tiny_model", lambda *a, **k: tiny_model_dir)
    data = _write(tmp_path / "traj.parquet", *rows)
    res = _run("--data", data, "--out", tmp_path / "o.parquet", "--max-tokens-per-mb", 256)
    assert res.exit_code == 0, res.output
    assert "built-in tiny random model" in res.output
    assert "token quota 256" in res.output


@pytest.mark.parametrize("case,pattern", [
    ("missing_column", r"missing column\(s\) 'response_token_ids' \(--response-column\)"),
    ("empty_prompt", r"row 2: empty prompt"),
    ("bad_token", r"row 1: token id 4096 in response_token_ids .*vocab size 1024"),
    ("no_config_json", r"not a Hugging Face model directory \(no config.json"),
    ("both_modes", r"--mbs \(4\) and --max-tokens-per-mb \(100\) are exclusive"),
    ("missing_out", r"--out is required"),
    ("vllm_temperature", r"vllm backend cannot apply temperature=0.5"),
    ("too_long", r"traj.parquet: row 0: prompt \+ completion = 3 tokens does not fit "
                 r"max_tokens_per_micro_batch=2; raise the quota \(3 row"),
])
def test_errors_are_clean(tmp_path, tiny_model_dir, case, pattern):
    data = tmp_path / "traj.parquet"
    args = ["--model", tiny_model_dir, "--data", data, "--out", tmp_path / "o.parquet"]
    prompts, responses = [[1, 2], [3], [4, 5]], [[6], [7, 8], [9]]
    if case == "missing_column":
        pq.write_table(pa.table({"prompt_token_ids": prompts}), data)
    else:
        if case == "empty_prompt":
            prompts[2] = []
        if case == "bad_token":
            responses[1] = [7, 4096]
        _write(data, prompts, responses)
    if case == "no_config_json":
        (tmp_path / "empty_model").mkdir()
        args[1] = tmp_path / "empty_model"
    if case == "both_modes":
        args += ["--mbs", 4, "--max-tokens-per-mb", 100]
    if case == "missing_out":
        args = args[:4]
    if case == "vllm_temperature":
        args += ["--backend", "vllm", "--temperature", 0.5]
    if case == "too_long":
        args += ["--max-tokens-per-mb", 2, "--token-grouping", "none"]
    res = _run(*args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert res.output.startswith("error: ")
    import re

    assert re.search(pattern, res.output), res.output
    assert not (tmp_path / "o.parquet").exists()


def test_score_schemas_are_registered():
    from pdsr_sdk.config.catalog import CONFIG_MODELS, OUTPUT_SCHEMAS, arrow_schema_to_json
    from pdsr_sdk.scoring import ScoreConfig

    assert CONFIG_MODELS.get("score") is ScoreConfig
    arrow = arrow_schema_to_json(OUTPUT_SCHEMAS.get("score_output")())
    assert [f["name"] for f in arrow["fields"]] == ["ref_logps", "ref_logps_entropy"]
    assert all(f["description"] and f["type"] == "list<item: float>" for f in arrow["fields"])
    schema = ScoreConfig.model_json_schema()
    assert all(p.get("description") for p in schema["properties"].values())


def test_option_errors_name_the_key_and_where_it_came_from(tmp_path, tiny_model_dir, rows):
    import re

    data = _write(tmp_path / "traj.parquet", *rows)
    args = ["--model", tiny_model_dir, "--data", data, "--out", tmp_path / "o.parquet"]
    cfg = tmp_path / "score.yaml"
    cfg.write_text(f"out: {tmp_path / 'o.parquet'}\nmbz: 3\n")
    for extra, pattern in [
        (["--backend", "jax"], r"--backend: backend: unknown scoring backend 'jax'; valid names: torch, vllm"),
        (["--row-chunk", "0"], r"--row-chunk: row_chunk: Input should be greater than or equal to 1"),
        (["--device", "gpu"], r"--device: device: expected auto, cpu, cuda or cuda:N, got 'gpu'"),
        (["--config", cfg], rf"{cfg}: mbz: unknown config key; valid keys here: .*max_tokens_per_micro_batch"),
    ]:
        res = _run(*args, *extra)
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert re.search(pattern, res.output), res.output
    res = _run("--config", cfg, "--out", tmp_path / "o.parquet")
    assert res.exit_code == 2 and "--data is required (or 'data:' in the --config file)" in res.output, res.output
    assert not (tmp_path / "o.parquet").exists()


def test_every_option_has_a_flag(tmp_path, tiny_model_dir, rows):
    from pdsr_cli.commands.score import command
    from pdsr_sdk.scoring import ScoreConfig, per_token_logps
    from pdsr_sdk.scoring.torch_backend import load_model

    flags = {p.name for p in command.params}
    assert set(ScoreConfig.model_fields) <= flags
    data = _write(tmp_path / "traj.parquet", *rows)
    out = tmp_path / "o.parquet"
    res = _run("--model", tiny_model_dir, "--data", data, "--out", out, "--dtype", "float32", "--device", "cpu",
               "--max-tokens-per-mb", 300, "--token-grouping", "none", "--no-attention-mask", "--pad-id", 977,
               "--length-bucket", 16, "--max-padding-fraction", 0.1)
    assert res.exit_code == 0, res.output
    assert "token quota 300, grouping=none" in res.output
    expected = per_token_logps(load_model(tiny_model_dir, "cpu", "float32"), *rows)
    for got, want in zip(pq.read_table(out).column("ref_logps").to_pylist(), expected.logps, strict=True):
        np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=1e-6, atol=1e-6)


def test_help_names_the_flags_where_the_config_names_its_keys():
    import re

    from pdsr_cli.commands.score import command
    from pdsr_sdk.scoring import ScoreConfig

    helps = {p.name: p.help for p in command.params}
    keys = [k for k in ScoreConfig.model_fields if "_" in k]
    named = [(name, key) for name, text in helps.items() for key in keys
             if text and re.search(rf"(?<![\w-]){key}(?![\w-])", text)]
    assert not named, f"help naming a config key: {named}"
    assert "Exclusive with --max-tokens-per-mb." in helps["mbs"] and "Exclusive with --mbs." in helps[
        "max_tokens_per_micro_batch"]
    assert "with --entropy, `<column>_entropy` is written" in helps["column"]
    assert helps["pack"].endswith("--length-bucket, --attention-mask and --pad-id do not apply to packed forwards. "
                                  "[default: unpacked (the rule above)]")
    # the config's own descriptions (config files, JSON schema) name the keys
    assert "Exclusive with `max_tokens_per_micro_batch`." in ScoreConfig.model_fields["mbs"].description
    out = " ".join(CliRunner().invoke(cli, ["score", "--help"]).output.split())
    assert "[default: unpacked (the rule above)]" in out


def test_an_existing_output_needs_overwrite(tmp_path, tiny_model_dir, rows):
    data = _write(tmp_path / "traj.parquet", *rows)
    out = tmp_path / "scored.parquet"
    out.write_bytes(b"an earlier result")
    res = _run("--model", tiny_model_dir, "--data", data, "--out", out)
    assert res.exit_code == 2 and f"{out}: already exists; pass --overwrite" in res.output
    assert out.read_bytes() == b"an earlier result"
    res = _run("--model", tiny_model_dir, "--data", data, "--out", out, "--overwrite")
    assert res.exit_code == 0, res.output
    assert "ref_logps" in pq.read_table(out).column_names


def test_a_folder_of_shards_scores_as_one_file(tmp_path, tiny_model_dir, rows):
    prompts, responses = rows
    whole = _write(tmp_path / "whole.parquet", prompts, responses)
    shards = tmp_path / "shards"
    shards.mkdir()
    _write(shards / "part-0.parquet", prompts[:4], responses[:4])
    _write(shards / "part-1.parquet", prompts[4:], responses[4:])
    got = {}
    for name, data in (("whole", whole), ("shards", shards)):
        res = _run("--model", tiny_model_dir, "--data", data, "--out", tmp_path / f"{name}.out.parquet")
        assert res.exit_code == 0, res.output
        got[name] = pq.read_table(tmp_path / f"{name}.out.parquet").column("ref_logps").to_pylist()
    assert got["shards"] == got["whole"]


def test_rollout_file_with_a_failed_sample(tmp_path, tiny_model_dir, rows):
    # pdsr rollout's columns are list<int32>, and a failed sample has no response tokens: it gets []
    prompts, responses = rows[0][:4], list(rows[1][:4])
    responses[1] = []
    data = tmp_path / "rollout.parquet"
    pq.write_table(pa.table({"prompt_token_ids": pa.array(prompts, pa.list_(pa.int32())),
                             "response_token_ids": pa.array(responses, pa.list_(pa.int32())),
                             "finish_reason": ["stop", "failed", "length", "stop"]}), data)
    res = _run("--model", tiny_model_dir, "--data", data, "--out", tmp_path / "o.parquet", "--mbs", 2,
               "--dtype", "float32", "--device", "cpu")
    assert res.exit_code == 0, res.output
    got = pq.read_table(tmp_path / "o.parquet").column("ref_logps").to_pylist()
    assert [len(g) for g in got] == [len(r) for r in responses] and got[1] == []
    import torch

    from pdsr_sdk.scoring.torch_backend import load_model

    model = load_model(tiny_model_dir, "cpu", "float32")
    for i in (0, 2, 3):   # an unpadded forward per sample, float64 log-softmax
        with torch.inference_mode():
            logits = model(torch.tensor([prompts[i] + responses[i]])).logits[0].double()
        logp = torch.log_softmax(logits[len(prompts[i]) - 1:-1], -1)
        want = logp.gather(-1, torch.tensor(responses[i])[:, None])[:, 0].numpy()
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5)


def test_a_file_of_no_rows_reports_no_rate(tmp_path, tiny_model_dir):
    """A file of no rows scored nothing in no time, and the summary said 'inf tokens/s' (its stats' to_dict held
    inf too, which json.dumps writes as the non-JSON 'Infinity'). It says 0 tokens/s, as a rollout's summary does."""
    import json

    from pdsr_sdk.scoring.config import ScoreConfig
    from pdsr_sdk.scoring.file_run import score_file

    data = _write(tmp_path / "empty.parquet", pa.array([], pa.list_(pa.int64())), pa.array([], pa.list_(pa.int64())))
    out = tmp_path / "scored.parquet"
    result = _run("--model", tiny_model_dir, "--data", data, "--out", out, "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert f"wrote {out}: 0 rows" in result.output
    assert "\n0 tokens/s (0 tokens, 0 scored, 0.00 s)" in result.output and "inf" not in result.output
    _, stats = score_file(ScoreConfig(model=tiny_model_dir, data=data, out=tmp_path / "o.parquet", device="cpu"))
    assert stats.tokens_per_s == 0.0
    json.dumps(stats.to_dict(), allow_nan=False)
