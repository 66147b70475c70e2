"""``pdsr gae`` end to end on small ragged Parquet files."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.gae.reference import reference_gae
from pdsr_sdk.gae.table import gae_output_schema


def ragged_rows(seed: int, n: int = 7, max_len: int = 40):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        length = int(rng.integers(0, max_len)) if i else 0   # row 0 is empty
        rows.append({
            "id": i,
            "rewards": rng.standard_normal(length).tolist(),
            "values": rng.standard_normal(length).tolist(),
            "response_mask": (rng.random(length) < 0.7).astype(int).tolist(),
        })
    return rows


def write(rows, path):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def invoke(*args):
    return CliRunner().invoke(cli, ["gae", *map(str, args)], catch_exceptions=False)


def row_reference(row, gamma, lam, rewards=None):
    r = np.array([rewards if rewards is not None else row["rewards"]], dtype=np.float32).reshape(1, -1)
    v = np.array([row["values"]], dtype=np.float32).reshape(1, -1)
    m = np.array([row["response_mask"]]).reshape(1, -1)
    adv, ret = reference_gae(r, v, m, gamma, lam)
    return adv[0], ret[0]


@pytest.mark.parametrize("backend", ["numba", "torch", "reference"])
def test_round_trip_matches_per_row_reference(tmp_path, backend):
    if backend == "torch":
        pytest.importorskip("torch")
    rows = ragged_rows(0)
    src = write(rows, tmp_path / "in.parquet")
    out = tmp_path / "sub" / "out.parquet"
    result = invoke("--data", src, "--out", out, "--backend", backend, "--gamma", 0.99, "--lam", 0.9, "--chunk", 8)
    assert result.exit_code == 0, result.output
    tokens = sum(len(r["rewards"]) for r in rows)
    valid = sum(sum(r["response_mask"]) for r in rows)
    assert f"{len(rows)} rows, {tokens} tokens ({valid} valid), backend {backend}" in result.output
    table = pq.read_table(out)
    assert table.column_names == ["id", "rewards", "values", "response_mask", "advantages", "returns"]
    expected_schema = gae_output_schema()
    for name in ("advantages", "returns"):
        assert table.schema.field(name).type == pa.list_(pa.float32())
        assert table.schema.field(name).metadata == expected_schema.field(name).metadata
    for row, got in zip(rows, table.to_pylist()):
        assert got["id"] == row["id"] and got["rewards"] == row["rewards"]     # input columns kept
        adv, ret = row_reference(row, 0.99, 0.9)
        assert len(got["advantages"]) == len(row["rewards"]) == len(got["returns"])
        np.testing.assert_allclose(got["advantages"], adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["returns"], ret, rtol=1e-5, atol=1e-5)
    assert not list(out.parent.glob(".*.tmp")), "temp file left behind"


def test_config_file_and_flag_override(tmp_path):
    rows = ragged_rows(1)
    for r in rows:
        r["rw"], r["v"], r["m"] = r.pop("rewards"), r.pop("values"), r.pop("response_mask")
    src = write(rows, tmp_path / "in.parquet")
    cfg = tmp_path / "gae.yaml"
    cfg.write_text(f"data: {src}\nout: {tmp_path / 'out.parquet'}\nrewards_column: rw\nvalues_column: v\n"
                   f"mask_column: m\ngamma: 0.5\nlam: 0.5\n")
    result = invoke("--config", cfg, "--lam", 1.0)    # the flag wins over the file
    assert result.exit_code == 0, result.output
    got = pq.read_table(tmp_path / "out.parquet").to_pylist()
    for row, g in zip(rows, got):
        adv, _ = row_reference({"values": row["v"], "response_mask": row["m"]}, 0.5, 1.0, rewards=row["rw"])
        np.testing.assert_allclose(g["advantages"], adv, rtol=1e-5, atol=1e-5)


def test_scalar_rewards_go_on_last_valid_token(tmp_path):
    rows = ragged_rows(2)
    for i, r in enumerate(rows):
        r["rewards"] = float(i) - 2.5
    src = write(rows, tmp_path / "in.parquet")
    result = invoke("--data", src, "--out", tmp_path / "out.parquet", "--gamma", 1.0, "--lam", 0.95)
    assert result.exit_code == 0, result.output
    got = pq.read_table(tmp_path / "out.parquet").to_pylist()
    for row, g in zip(rows, got):
        token_rewards = np.zeros(len(row["values"]))
        valid = np.flatnonzero(row["response_mask"])
        if valid.size:
            token_rewards[valid[-1]] = row["rewards"]
        adv, _ = row_reference(row, 1.0, 0.95, rewards=token_rewards)
        np.testing.assert_allclose(g["advantages"], adv, rtol=1e-5, atol=1e-5)


def test_whiten_and_no_mask_and_existing_columns_replaced(tmp_path):
    rows = ragged_rows(3)
    for r in rows:
        r["advantages"] = [0.0] * len(r["rewards"])      # stale output of an earlier run
    src = write(rows, tmp_path / "in.parquet")
    result = invoke("--data", src, "--out", src, "--mask-column", "", "--whiten", "--overwrite")   # in place
    assert result.exit_code == 0, result.output
    table = pq.read_table(src)
    assert table.column_names.count("advantages") == 1
    adv = np.concatenate([np.asarray(a, dtype=np.float64) for a in table.column("advantages").to_pylist()])
    assert abs(adv.mean()) < 1e-5 and abs(adv.var(ddof=1) - 1.0) < 1e-4     # every token valid
    ret = table.column("returns").to_pylist()
    for row, r in zip(rows, ret):
        _, expected = reference_gae(np.array([row["rewards"]]).reshape(1, -1), np.array([row["values"]]).reshape(1, -1),
                                    np.ones((1, len(row["values"]))), 1.0, 0.95)
        np.testing.assert_allclose(r, expected[0], rtol=1e-5, atol=1e-5)   # returns are not whitened


def test_empty_table(tmp_path):
    schema = pa.schema([("rewards", pa.list_(pa.float64())), ("values", pa.list_(pa.float64())),
                        ("response_mask", pa.list_(pa.bool_()))])
    src = tmp_path / "in.parquet"
    pq.write_table(schema.empty_table(), src)
    result = invoke("--data", src, "--out", tmp_path / "out.parquet")
    assert result.exit_code == 0, result.output
    assert "0 rows, 0 tokens" in result.output
    assert pq.read_table(tmp_path / "out.parquet").column_names[-2:] == ["advantages", "returns"]


def test_missing_column_names_column_and_file(tmp_path):
    src = write(ragged_rows(4), tmp_path / "in.parquet")
    result = invoke("--data", src, "--out", tmp_path / "out.parquet", "--values-column", "critic_values")
    assert result.exit_code == 2
    assert "in.parquet" in result.output and "'critic_values'" in result.output
    assert "the file has: id, rewards, values, response_mask" in result.output
    assert not (tmp_path / "out.parquet").exists()


def test_unequal_list_lengths_name_the_row(tmp_path):
    rows = ragged_rows(5)
    rows[3]["response_mask"] = rows[3]["response_mask"] + [1]
    src = write(rows, tmp_path / "in.parquet")
    result = invoke("--data", src, "--out", tmp_path / "out.parquet")
    assert result.exit_code == 2
    n = len(rows[3]["values"])
    assert f"in.parquet: row 3: 'values' has {n} elements but 'response_mask' has {n + 1}" in result.output


def test_bad_config_values_are_reported(tmp_path):
    src = write(ragged_rows(6), tmp_path / "in.parquet")
    result = invoke("--data", src, "--out", tmp_path / "o.parquet", "--lam", 1.5, "--chunk", 0)
    assert result.exit_code == 2
    assert "lam: Input should be less than or equal to 1" in result.output
    assert "chunk: Input should be greater than or equal to 1" in result.output
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"data": str(src), "out": str(tmp_path / "o.parquet"), "backend": "fast"}))
    result = invoke("--config", cfg)
    assert result.exit_code == 2 and "unknown GAE backend 'fast'" in result.output


def test_cuda_device_without_gpu_is_a_clean_error(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    src = write(ragged_rows(7), tmp_path / "in.parquet")
    result = invoke("--data", src, "--out", tmp_path / "o.parquet", "--device", "cuda")
    assert result.exit_code == 2 and "device: 'cuda' requested but torch sees no CUDA device" in result.output


def test_help_shows_defaults():
    result = CliRunner().invoke(cli, ["gae", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())   # undo line wrapping
    for part in ("--chunk", "C of the torch chunk-scan backend (numba and reference ignore it). [default: 256]",
                 "--lam", "GAE lambda, in [0, 1]. [default: 0.95]", "--backend", "--whiten"):
        assert part in text


def test_normalize_std_help_offers_true_and_false_only_where_they_are_taken(tmp_path):
    """The help said 'true / false mean group / none', which --normalize-std refuses: a config file's YAML bool."""
    text = " ".join(CliRunner().invoke(cli, ["gae", "--help"]).output.split())
    assert "in --config, true / false mean group / none" in text
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 9, size=9)
    src = write([{"prompt_id": f"p{i // 3}", "response_token_ids": [1] * int(n), "response_mask": [1] * int(n),
                  "reward": float(rng.random())} for i, n in enumerate(lengths)], tmp_path / "in.parquet")
    refused = invoke("--data", src, "--out", tmp_path / "a.parquet", "--estimator", "grpo", "--normalize-std", "false")
    assert refused.exit_code == 2 and "'false' is not one of 'group', 'batch', 'none'" in refused.output
    cfg = tmp_path / "gae.yaml"
    cfg.write_text("estimator: grpo\nnormalize_std: false\n")
    for name, flags in (("b", ["--config", cfg]), ("c", ["--estimator", "grpo", "--normalize-std", "none"]),
                        ("d", ["--estimator", "grpo"])):
        assert invoke("--data", src, "--out", tmp_path / f"{name}.parquet", *flags).exit_code == 0
    b, c, d = (pq.read_table(tmp_path / f"{n}.parquet").column("advantages").to_pylist() for n in "bcd")
    assert b == c != d   # false is none (r - mean), not the default's division by the std


def _verl_style_gae(rewards, values, valid, gamma, lam):
    """One row, float64, written out as verl's masked loop (a masked token carries both the advantage and the
    bootstrap value): independent of pdsr_sdk.gae.reference."""
    adv = np.zeros(len(values))
    last, next_v = 0.0, 0.0
    for t in range(len(values) - 1, -1, -1):
        if valid[t]:
            last = rewards[t] + gamma * next_v - values[t] + gamma * lam * last
            next_v = values[t]
        adv[t] = last
    return adv


def test_rollout_file_with_null_mask_rows(tmp_path):
    # pdsr rollout writes response_mask null for a single-turn sample (every token sampled) and a 0/1 list for a
    # multi-turn one; a scalar reward per row goes on the last sampled token
    rng = np.random.default_rng(11)
    lengths = [5, 9, 1, 7]
    masks = [None, [1, 1, 0, 0, 0, 1, 1, 0, 0], None, [1, 0, 1, 1, 0, 1, 1]]
    values = [rng.standard_normal(n).astype(np.float32).tolist() for n in lengths]
    reward = [1.0, -0.5, 2.0, 0.25]
    table = pa.table({"response_mask": pa.array(masks, pa.list_(pa.int8())), "values": values,
                      "reward": pa.array(reward, pa.float32())})
    src = tmp_path / "rollout.parquet"
    pq.write_table(table, src)
    # no --rewards-column: a rollout file's 'reward' is found by itself
    result = invoke("--data", src, "--out", tmp_path / "out.parquet", "--gamma", 0.9, "--lam", 0.8)
    assert result.exit_code == 0, result.output
    assert f"({sum(lengths) - 7} valid)" in result.output   # 5 + 2 environment tokens
    got = pq.read_table(tmp_path / "out.parquet")
    for i, n in enumerate(lengths):
        valid = np.ones(n, bool) if masks[i] is None else np.asarray(masks[i]) != 0
        token_rewards = np.zeros(n)
        token_rewards[np.flatnonzero(valid)[-1]] = reward[i]
        v = np.asarray(values[i], np.float64)
        adv = _verl_style_gae(token_rewards, v, valid, 0.9, 0.8)
        np.testing.assert_allclose(got.column("advantages")[i].as_py(), adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got.column("returns")[i].as_py(), adv + v, rtol=1e-5, atol=1e-5)
    # a mask row of the wrong length is still named, null rows around it or not
    table = table.set_column(0, "response_mask", pa.array([None, [1] * 8, None, [1] * 7], pa.list_(pa.int8())))
    pq.write_table(table, src)
    result = invoke("--data", src, "--out", tmp_path / "out2.parquet", "--rewards-column", "reward")
    assert result.exit_code == 2
    assert "row 1: 'values' has 9 elements but 'response_mask' has 8" in result.output


def test_rewards_column_default_prefers_rewards_and_names_both_when_absent(tmp_path):
    # with both columns and no --rewards-column, 'rewards' (per-token lists) is used, not the scalar 'reward'
    values = [[0.5, 0.25, 0.0], [1.0, 0.0]]
    rewards = [[0.0, 0.0, 1.0], [0.0, 2.0]]
    table = pa.table({"values": values, "rewards": rewards, "reward": [7.0, 7.0],
                      "response_mask": pa.array([None, None], pa.list_(pa.int8()))})
    src = tmp_path / "both.parquet"
    pq.write_table(table, src)
    result = invoke("--data", src, "--out", tmp_path / "out.parquet", "--gamma", 1.0, "--lam", 1.0)
    assert result.exit_code == 0, result.output
    got = pq.read_table(tmp_path / "out.parquet")
    for i in range(2):
        v = np.asarray(values[i], np.float64)
        adv = _verl_style_gae(np.asarray(rewards[i], np.float64), v, np.ones(len(v), bool), 1.0, 1.0)
        np.testing.assert_allclose(got.column("advantages")[i].as_py(), adv, rtol=1e-6, atol=1e-6)
    # neither column: one line naming both defaults and the flag
    pq.write_table(table.drop(["rewards", "reward"]), src)
    result = invoke("--data", src, "--out", tmp_path / "out3.parquet")
    assert result.exit_code == 2
    assert "neither 'rewards' nor 'reward'" in result.output and "--rewards-column" in result.output
    assert str(src) in result.output and "Traceback" not in result.output


def test_empty_table_summary_names_the_backend(tmp_path):
    """A file of no rows ran no scan block, and the summary line read 'wrote ...: 0 rows, 0 tokens (0 valid), , 0 s':
    the backend's place left empty between two commas. It names the backend the run was set to, as for a file of
    rows."""
    schema = pa.schema([("rewards", pa.list_(pa.float64())), ("values", pa.list_(pa.float64())),
                        ("response_mask", pa.list_(pa.bool_()))])
    src = tmp_path / "in.parquet"
    pq.write_table(schema.empty_table(), src)
    out = tmp_path / "out.parquet"
    for backend in ("numba", "reference"):
        result = invoke("--data", src, "--out", out, "--backend", backend, "--overwrite")
        assert result.exit_code == 0, result.output
        assert f"wrote {out}: 0 rows, 0 tokens (0 valid), backend {backend}, " in result.output
        assert ", ," not in result.output
