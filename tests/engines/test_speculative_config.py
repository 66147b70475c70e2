"""``speculative`` (issue 50, item 1): the setting, its vLLM ``speculative_config``, the conflict with one
given in ``engine_args``, and the CLI flags. No vLLM needed: the engine arguments are built, not used."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.config import load_config
from pdsr_sdk.engines.config import NO_BATCH_LIMIT
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.rollout.config import EngineSpec, RolloutConfig
from support import requires_vllm


def engine_args(speculative=None, cpu: bool = True, **spec):
    from pdsr_sdk.engines.vllm_engine import VllmEngine

    engine = VllmEngine(EngineSpec(name="e", pool="fast", dtype="float32", **spec), model="/nonexistent",
                        speculative=speculative)
    try:
        return engine._engine_args(cpu)
    finally:
        engine._error_file.unlink(missing_ok=True)


def test_off_is_the_default_and_changes_no_engine_argument():
    cfg = RolloutConfig()
    assert cfg.speculative == "off" and cfg.vllm_speculative_config() is None
    for cpu in (True, False):
        args = engine_args(cfg.vllm_speculative_config(), cpu=cpu)
        assert "speculative_config" not in args
        assert args == engine_args(cpu=cpu)
    # a speculative_config of the user's own still passes through unchanged while speculative is off
    own = {"method": "ngram", "num_speculative_tokens": 2}
    assert RolloutConfig(engines=[EngineSpec(name="a", pool="fast", engine_args={"speculative_config": own})])
    assert engine_args(engine_args={"speculative_config": own})["speculative_config"] == own


def test_ngram_becomes_vllms_speculative_config():
    cfg = load_config(RolloutConfig, None, {"speculative": "ngram",
                                            "speculative_settings.num_speculative_tokens": 3,
                                            "speculative_settings.prompt_lookup_min": 1})
    expected = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 4,
                "num_speculative_tokens_per_batch_size": [[1, 32, 3], [33, NO_BATCH_LIMIT, 0]]}
    assert cfg.vllm_speculative_config() == expected
    assert engine_args(cfg.vllm_speculative_config())["speculative_config"] == expected


def test_group_becomes_a_custom_class_config_naming_pdsrs_proposer():
    cfg = load_config(RolloutConfig, None, {"speculative": "group", "speculative_settings.num_speculative_tokens": 3})
    expected = {"method": "custom_class", "model": "pdsr_sdk.engines.group_drafter.GroupProposer",
                "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4,
                "num_speculative_tokens_per_batch_size": [[1, 32, 3], [33, NO_BATCH_LIMIT, 0]]}
    assert cfg.vllm_speculative_config() == expected
    assert engine_args(cfg.vllm_speculative_config())["speculative_config"] == expected
    from pdsr_sdk.engines.group_drafter import GroupProposer

    assert GroupProposer.__module__ + "." + GroupProposer.__name__ == expected["model"]


@pytest.mark.parametrize("method", ["ngram", "group"])
def test_vllm_accepts_the_config(method):
    """The dict is one vLLM's SpeculativeConfig takes as it is (the installed version's field names)."""
    pytest.importorskip("vllm")
    from vllm.config.speculative import SpeculativeConfig

    fields = set(SpeculativeConfig.__dataclass_fields__)
    assert set(RolloutConfig(speculative=method).vllm_speculative_config()) <= fields


@pytest.mark.parametrize("limit", [1, 2, 32, None])
@pytest.mark.parametrize("method", ["ngram", "group"])
def test_drafting_stops_above_the_batch_size_limit_by_vllms_schedule(method, limit):
    """``max_batch_size``: vLLM's own lookup of the schedule (what its scheduler passes ngram) drafts k tokens up to
    the limit and none above it, and group's proposer reads the same; no limit drafts k at every size."""
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    from pdsr_sdk.engines.group_drafter import GroupProposer

    spec = RolloutConfig(speculative=method, speculative_settings={"max_batch_size": limit}).vllm_speculative_config()
    want = [4 if limit is None or b <= limit else 0 for b in range(1, 65)]
    if limit is None:
        assert "num_speculative_tokens_per_batch_size" not in spec
    else:
        lookup = build_dynamic_sd_schedule_lookup(spec["num_speculative_tokens_per_batch_size"], 64, 4)
        assert lookup[1:] == want
    proposer = GroupProposer(SimpleNamespace(speculative_config=SimpleNamespace(**spec),
                                             model_config=SimpleNamespace(max_model_len=64),
                                             scheduler_config=SimpleNamespace(max_num_seqs=64)))
    assert [proposer.k_for(b) for b in range(1, 65)] == want


@pytest.mark.parametrize("where, overrides", [
    ("engines[1].engine_args.speculative_config",
     {"engines": [{"name": "a", "pool": "fast"},
                  {"name": "b", "pool": "heavy", "engine_args": {"speculative_config": {"method": "ngram"}}}]}),
    ("engine_defaults.engine_args.speculative_config",
     {"engine_defaults": {"engine_args": {"speculative_config": {"method": "ngram"}}}}),
])
def test_both_speculative_and_a_speculative_config_is_an_error_naming_both(where, overrides):
    with pytest.raises(ConfigError) as err:
        load_config(RolloutConfig, None, {"speculative": "ngram", **overrides})
    assert "speculative ('ngram')" in str(err.value) and where in str(err.value)


@pytest.mark.parametrize("where, overrides", [
    ("speculative ('ngram')", {"speculative": "ngram"}),
    ("speculative ('group')", {"speculative": "group"}),
    ("engines[0].engine_args.speculative_config",
     {"engines": [{"name": "a", "pool": "fast", "engine_args": {"speculative_config": {"method": "ngram"}}}]}),
    ("engine_defaults.engine_args.speculative_config",
     {"engine_defaults": {"engine_args": {"speculative_config": {"method": "ngram"}}}}),
])
def test_min_p_with_speculation_is_an_error_naming_both(where, overrides):
    """vLLM 0.32 builds no min-p processor in an engine with a speculative_config and refuses every request with
    min_p there ('VLLMValidationError: The min_p and logit_bias sampling parameters are not yet supported with
    speculative decoding'): each sample failed, after the engines had started. Refused with the config instead."""
    with pytest.raises(ConfigError) as err:
        load_config(RolloutConfig, None, {"sampling.min_p": 0.1, **overrides})
    assert "sampling.min_p (0.1)" in str(err.value) and where in str(err.value)
    # either alone is fine
    assert load_config(RolloutConfig, None, {"sampling.min_p": 0.1}).sampling.min_p == 0.1
    assert load_config(RolloutConfig, None, {"sampling.min_p": 0, **overrides})


def test_the_engine_refuses_both_too():
    """An SDK user who builds engines directly gets the same error, before the engine process starts."""
    with pytest.raises(ConfigError, match="speculative.*engine_args.speculative_config"):
        engine_args({"method": "ngram", "num_speculative_tokens": 2},
                    engine_args={"speculative_config": {"method": "ngram"}})


@pytest.mark.parametrize("method, says", [("suffix", "needs Arctic Inference"),
                                          ("eagle", "unknown speculative method")])
def test_methods_not_built_are_refused(method, says):
    with pytest.raises(ConfigError) as err:
        load_config(RolloutConfig, None, {"speculative": method})
    assert "speculative" in str(err.value) and says in str(err.value) and "off, ngram, group" in str(err.value)


def test_a_yaml_config_saying_off_is_off(tmp_path):
    """YAML reads the bare word of the docs' `speculative: off` as false: that was 'unknown speculative method
    False'. On (true) names no method, and says so."""
    path = tmp_path / "c.yaml"
    path.write_text("speculative: off\n")
    assert load_config(RolloutConfig, path).speculative == "off"
    path.write_text("speculative: on\n")
    with pytest.raises(ConfigError) as err:
        load_config(RolloutConfig, path)
    assert "speculative is true" in str(err.value) and "ngram, group" in str(err.value)


def test_ngram_window_must_be_ordered():
    with pytest.raises(ConfigError, match="prompt_lookup_min .5. must be <= prompt_lookup_max .4."):
        load_config(RolloutConfig, None, {"speculative_settings.prompt_lookup_min": 5})


def test_cli_flags_set_the_config(monkeypatch, tmp_path):
    """``--speculative ngram --num-speculative-tokens 3`` reach the config run_rollout gets; a method not
    built is exit 2 with the config key named, before any engine starts."""
    import pdsr_sdk.rollout.run as run

    seen = []

    class Stop(Exception):
        pass

    def fake_run(cfg, **_):
        seen.append(cfg)
        raise Stop

    monkeypatch.setattr(run, "run_rollout", fake_run)
    runner = CliRunner()
    out = ["--out", str(tmp_path / "o.parquet")]
    with pytest.raises(Stop):
        runner.invoke(cli, ["rollout", "--quiet", "--speculative", "ngram", "--num-speculative-tokens", "3", *out],
                      catch_exceptions=False)
    assert seen[0].speculative == "ngram" and seen[0].vllm_speculative_config()["num_speculative_tokens"] == 3
    r = runner.invoke(cli, ["rollout", "--quiet", "--speculative", "suffix", *out], catch_exceptions=False)
    assert r.exit_code == 2 and "speculative" in r.output and "needs Arctic Inference" in r.output
    assert "Traceback" not in r.output and len(seen) == 1
    with pytest.raises(Stop):
        runner.invoke(cli, ["rollout", "--quiet", "--speculative", "group", "--draft-history", "last.parquet", *out],
                      catch_exceptions=False)
    assert seen[1].speculative_settings.history_file == "last.parquet"
    r = runner.invoke(cli, ["rollout", "--quiet", "--draft-history", "last.parquet", *out], catch_exceptions=False)
    assert r.exit_code == 2 and "speculative_settings.history_file" in r.output and "'off'" in r.output
    assert "Traceback" not in r.output and len(seen) == 2


@pytest.mark.parametrize("dtype", ["float32", "int32", "int64"])
def test_the_cpu_sampler_fix_expands_like_the_triton_kernel(dtype):
    """pdsr's replacement of vLLM's CPU expand_kernel fallback (vllm_fixes.py): request i's value over its
    tokens, in the output's own dtype (vLLM 0.32's wrote an int64 copy and left a float output unset)."""
    torch = pytest.importorskip("torch")
    from pdsr_sdk.engines.vllm_fixes import expand_kernel_impl

    values = torch.tensor([0.7, 5.0, -1.0, 2.0]).to(getattr(torch, dtype))
    cu = torch.tensor([2, 2, 5, 6], dtype=torch.int32)       # 2, 0, 3 and 1 drafted tokens
    out = torch.full((6,), 99, dtype=values.dtype)
    expand_kernel_impl(out, values, cu, -1, 1)               # -1 is replaced by 1 (vLLM: greedy temperature 0 -> 1)
    v = values.tolist()
    assert out.tolist() == [v[0], v[0], 1, 1, 1, v[3]] and out.dtype == values.dtype
    if dtype == "float32":
        assert out[0].item() == pytest.approx(0.7)
    empty = torch.empty(0)
    expand_kernel_impl(empty, empty, torch.zeros(0, dtype=torch.int32), 0, 0)


def test_the_cpu_sampler_fix_applies_where_vllm_has_no_triton():
    pytest.importorskip("vllm")
    from vllm.triton_utils import HAS_TRITON
    from vllm.utils import cpu_triton_utils

    from vllm.v1.sample.ops import topk_topp_sampler as sampler

    from pdsr_sdk.engines import vllm_fixes

    before, top_k = cpu_triton_utils._expand_kernel_impl, sampler.apply_top_k_only
    try:
        assert vllm_fixes.apply_cpu_sampler_fix() == (not HAS_TRITON)
        if not HAS_TRITON:
            assert cpu_triton_utils._expand_kernel_impl is vllm_fixes.expand_kernel_impl
    finally:
        cpu_triton_utils._expand_kernel_impl, sampler.apply_top_k_only = before, top_k


def test_the_cpu_top_k_fix_takes_a_step_that_drafted_nothing():
    """vLLM's CPU rejection sampler applies top-k alone (top_p 1) to the drafted positions through
    ``apply_top_k_only``, and on an engine step where no request drafted those are zero rows: vLLM 0.32 raised
    there ('max(): Expected reduction dim ... numel() == 0') and the engine core died (an ngram engine sampling at
    temperature 1.5 with top_k 5, on the tiny model). With pdsr's fix zero rows come back as they are, and rows
    are masked as vLLM masks them."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    from vllm.triton_utils import HAS_TRITON
    from vllm.utils import cpu_triton_utils
    from vllm.v1.sample.ops import topk_topp_sampler as sampler

    from pdsr_sdk.engines import vllm_fixes

    if HAS_TRITON:
        pytest.skip("vLLM runs its Triton top-k here")
    before, expand = sampler.apply_top_k_only, cpu_triton_utils._expand_kernel_impl
    original = getattr(before, "pdsr_wrapped", before)   # an engine loaded in this process may have applied it
    try:
        assert vllm_fixes.apply_cpu_sampler_fix()
        no_rows = torch.empty(0, 16)
        assert sampler.apply_top_k_top_p_pytorch(no_rows, torch.empty(0, dtype=torch.int64), None,
                                                 allow_cpu_sync=True).shape == (0, 16)
        logits = torch.tensor([[0.1, 3.0, 2.0, -1.0], [5.0, 4.0, 3.0, 2.0]])
        got = sampler.apply_top_k_top_p_pytorch(logits.clone(), torch.tensor([2, 4]), None, allow_cpu_sync=True)
        inf = float("-inf")
        assert got.tolist() == [[inf, 3.0, 2.0, inf], [5.0, 4.0, 3.0, 2.0]]
        assert vllm_fixes.apply_cpu_sampler_fix()   # applied again (two plugin loads): wrapped once
        assert getattr(sampler.apply_top_k_only, "pdsr_wrapped", None) is original
    finally:
        sampler.apply_top_k_only, cpu_triton_utils._expand_kernel_impl = before, expand


def test_the_run_summary_carries_each_engines_speculation_counts():
    """``pdsr rollout``'s summary: each engine's counts with speculative on (engines that report them), nothing
    with it off."""
    from types import SimpleNamespace

    from pdsr_sdk.rollout.summary import speculation_counts

    counts = {"drafts": 3, "drafted_tokens": 9, "accepted_tokens": 7}
    session = SimpleNamespace(engines=[SimpleNamespace(name="fast-0", speculation_stats=lambda: counts),
                                       SimpleNamespace(name="ray-0")])
    assert speculation_counts(RolloutConfig(speculative="ngram"), session, "fast-0") == {"speculation": counts}
    assert speculation_counts(RolloutConfig(speculative="ngram"), session, "ray-0") == {}
    assert speculation_counts(RolloutConfig(), session, "fast-0") == {}


def test_the_run_summary_totals_the_engines_counts_with_rates():
    """The summary's run-level speculation (summed over the engines that report counts) and the line `pdsr rollout`
    prints for it; before, a user had per-engine raw counts only and the printed summary said nothing."""
    from pdsr_cli.commands.rollout import render_summary
    from pdsr_sdk.rollout.summary import RolloutSummary, speculation_totals

    engines = [{"name": "fast-0", "speculation": {"drafts": 3, "drafted_tokens": 9, "accepted_tokens": 7}},
               {"name": "heavy-0", "speculation": {"drafts": 5, "drafted_tokens": 11, "accepted_tokens": 3}},
               {"name": "ray-0"}]
    totals = speculation_totals(engines)
    assert totals == {"drafts": 8, "drafted_tokens": 20, "accepted_tokens": 10, "acceptance_rate": 10 / 20,
                      "accepted_per_verify_step": 10 / 8}
    assert speculation_totals([{"name": "ray-0"}]) is None
    assert speculation_totals(
        [{"name": "e", "speculation": dict.fromkeys(("drafts", "drafted_tokens", "accepted_tokens"), 0)}]
    )["acceptance_rate"] is None
    summary = RolloutSummary(policy="v3", model="m", output="o", groups=1, samples=2, skipped_groups=0, batches=[],
                             makespan_s=1.0, tokens=40, tokens_per_s=40.0, engine_busy_fraction={}, stats={},
                             engines=engines, speculation=totals)
    assert "speculation: 20 tokens drafted in 8 verify steps, 10 accepted (50.0%), 1.25 accepted a verify step" \
        in render_summary(summary)
    summary.speculation = None
    assert "speculation" not in render_summary(summary)


@requires_vllm
def test_the_warm_up_requests_drafts_are_not_counted():
    """The engine's counters are the run's: the throw-away warm-up request's drafts (vLLM's stats of its steps) were
    counted, so the summary's totals exceeded the trajectories' sums by them (769 drafted against 768 seen)."""
    import asyncio
    from types import SimpleNamespace

    from pdsr_sdk.engines.vllm_engine import VllmEngine

    engine = VllmEngine(EngineSpec(name="e", pool="fast"), model="/nonexistent",
                        speculative={"method": "ngram", "num_speculative_tokens": 4})
    logger = engine._stats.factory(None)

    class WarmUpLLM:
        async def generate(self, prompt, params, request_id):
            for drafted, accepted in ((2, 1), (4, 4)):   # two verify steps, recorded as vLLM's output handler does
                spec = SimpleNamespace(num_drafts=1, num_draft_tokens=drafted, num_accepted_tokens=accepted)
                logger.record(SimpleNamespace(num_running_reqs=1, num_waiting_reqs=0, kv_cache_usage=0.1,
                                              spec_decoding_stats=spec), None)
                yield None

    engine._llm = WarmUpLLM()
    try:
        asyncio.run(engine._warm_up(4))
        assert engine.speculation_stats() == {"drafts": 0, "drafted_tokens": 0, "accepted_tokens": 0}
        spec = SimpleNamespace(num_drafts=1, num_draft_tokens=3, num_accepted_tokens=2)   # a run's step: counted
        logger.record(SimpleNamespace(num_running_reqs=1, num_waiting_reqs=0, kv_cache_usage=0.1,
                                      spec_decoding_stats=spec), None)
        assert engine.speculation_stats() == {"drafts": 1, "drafted_tokens": 3, "accepted_tokens": 2}
    finally:
        engine._error_file.unlink(missing_ok=True)


def test_serve_flags_set_the_config(monkeypatch):
    """`pdsr serve` had no speculation flags (only a config file's speculative turned it on); they reach the
    session's config as `pdsr rollout`'s do, and --num-speculative-tokens without a method is the same error."""
    import pdsr_sdk.rollout.session as session_module

    seen = []

    class Stop(Exception):
        pass

    def fake_session(cfg, *args, **kwargs):
        seen.append(cfg)
        raise Stop

    monkeypatch.setattr(session_module, "RolloutSession", fake_session)
    runner = CliRunner()
    with pytest.raises(Stop):
        runner.invoke(cli, ["serve", "--quiet", "--port", "0", "--speculative", "group", "--num-speculative-tokens",
                            "3", "--draft-history", "last.parquet"], catch_exceptions=False)
    assert seen[0].speculative == "group" and seen[0].vllm_speculative_config()["num_speculative_tokens"] == 3
    assert seen[0].speculative_settings.history_file == "last.parquet"
    r = runner.invoke(cli, ["serve", "--quiet", "--port", "0", "--num-speculative-tokens", "3"], catch_exceptions=False)
    assert r.exit_code == 2 and "--num-speculative-tokens" in r.output and "speculative decoding is off" in r.output
    r = runner.invoke(cli, ["serve", "--quiet", "--port", "0", "--speculative", "eagle"], catch_exceptions=False)
    assert r.exit_code == 2 and "unknown speculative method 'eagle'" in r.output and len(seen) == 1
