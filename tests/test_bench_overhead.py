"""bench/overhead.py: its flags refused by name, the prompts and forced lengths both sides get, and one tiny round of
each side on a real engine generating exactly the forced tokens."""

from __future__ import annotations

import pytest

from support import load_bench, requires_vllm, run_on


def load():
    return load_bench("overhead")


@pytest.mark.parametrize("argv, flag", [
    (["--sides", "baseline,v3"], "--sides"),              # no vLLM alone to compare with
    (["--sides", "vllm,v4"], "--sides"),
    (["--sides", "vllm,vllm"], "--sides"),
    (["--sides", "vllm,vllm-noseg"], "--sides"),          # -noseg is a pdsr policy's
    (["--prompts", "0"], "--prompts"),
    (["--n", "two"], "--n"),
    (["--rounds", "-1"], "--rounds"),
    (["--kv-gib", "0"], "--kv-gib"),
    (["--median-length", "600", "--max-length", "512"], "--median-length"),
])
def test_bad_flags_are_refused_by_name(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        load().parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and f"{flag}" in err


def test_sides_parse_and_alternate():
    bench = load()
    args = bench.parse_args(["--sides", "vllm, baseline-noseg,v3"])
    assert args.sides == ["vllm", "baseline-noseg", "v3"]
    assert bench.order(args.sides, 0) == ["vllm", "baseline-noseg", "v3"]
    assert bench.order(args.sides, 1) == ["v3", "baseline-noseg", "vllm"]


def test_ratio_is_tokens_per_second_over_vllm_alones_in_the_same_round():
    bench = load()
    runs = {"vllm": [bench.Side(10.0, 1000, 1.0, 8), bench.Side(20.0, 1000, 1.0, 8)],
            "baseline": [bench.Side(12.5, 1000, 2.0, 10), bench.Side(16.0, 1000, 2.0, 10)]}
    assert bench.ratios(runs, "baseline") == [pytest.approx(0.8), pytest.approx(1.25)]
    assert runs["baseline"][0].cpu_per_1k == 2.0


def test_records_are_pdsr_rollouts_prompts_with_seeded_forced_lengths(tiny_model_dir):
    from pdsr_sdk.rollout.config import DataConfig
    from pdsr_sdk.rollout.data import load_prompts, load_tokenizer
    from pdsr_sdk.rollout.sample_data import default_sample_path

    bench = load()
    made = bench.make_records(str(tiny_model_dir), None, 6, 3, seed=4, median_length=20, max_length=40)
    path = default_sample_path()
    ref = load_prompts(DataConfig(path=path, limit=6), load_tokenizer(tiny_model_dir), path=path, n=3)
    assert [(r.prompt_id, r.token_ids) for r in made] == [(r.prompt_id, r.token_ids) for r in ref]
    lengths = [r.target_lengths for r in made]
    assert all(len(x) == 3 and all(1 <= t <= 40 for t in x) for x in lengths)
    again = bench.make_records(str(tiny_model_dir), None, 6, 3, seed=4, median_length=20, max_length=40)
    other = bench.make_records(str(tiny_model_dir), None, 6, 3, seed=5, median_length=20, max_length=40)
    assert [r.target_lengths for r in again] == lengths != [r.target_lengths for r in other]


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_every_side_generates_exactly_the_forced_tokens(vllm_pair, engine_loop, tiny_model_dir):
    bench = load()
    engine = vllm_pair[0]
    records = bench.make_records(str(tiny_model_dir), None, 4, 2, seed=1, median_length=6, max_length=24)
    want = sum(sum(r.target_lengths) for r in records)
    for side in ("vllm", "vllm-delta", "baseline", "v3-noseg"):
        got = run_on(engine_loop, bench.run_side(engine, records, side, model=str(tiny_model_dir), n=2, tag="-t"))
        assert got.tokens == want, side
        if side.startswith("vllm") or side.endswith("-noseg"):
            assert got.requests == 8, side   # one request a sample
        else:
            assert got.requests >= 8         # a sample's segments each a request
        assert got.probes == (4 if side.startswith("v3") else 0)   # v3: one probe a group
        assert got.wall_s > 0 and got.cpu_s > 0
