"""What a vLLM user sets on an engine reaches vLLM: the engine entry's own keys and ``engine_args`` as read back from
the started engine's ``vllm_config``; and an ``engine_args`` key vLLM does not take, or one pdsr sets from its own
settings, is an error naming the engine and the key when the engines are built, before any starts."""

from __future__ import annotations

import dataclasses

import pytest

from support import requires_vllm, run_on
from pdsr_sdk.engines.vllm_args import OWNED
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.rollout.config import EngineSpec, RolloutConfig
from pdsr_sdk.rollout.session import RolloutSession

pytestmark = requires_vllm


def _session(tiny_model_dir, engine_args):
    return RolloutSession(RolloutConfig(model=str(tiny_model_dir), batch_size=1, sampling={"n": 2, "max_tokens": 8},
                                        engine_defaults={"max_model_len": 256, "engine_args": engine_args}))


def test_a_misspelt_engine_arg_is_refused_naming_it_before_any_engine_starts(engine_loop, tiny_model_dir):
    from vllm.engine.arg_utils import AsyncEngineArgs

    assert "enable_prefix_caching" in {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    session = _session(tiny_model_dir, {"enable_prefx_caching": True})
    with pytest.raises(ConfigError, match=r"engine 'fast-0': engine_args\.enable_prefx_caching: not an argument of "
                                          r"vLLM .*did you mean enable_prefix_caching"):
        run_on(engine_loop, session.start())
    assert session.engines == [] and not session._started    # refused while building: nothing started


@pytest.mark.parametrize("key", sorted(OWNED))
def test_an_engine_arg_pdsr_sets_itself_is_refused_naming_what_to_set(engine_loop, tiny_model_dir, key):
    from vllm.engine.arg_utils import AsyncEngineArgs

    assert key in {f.name for f in dataclasses.fields(AsyncEngineArgs)}   # a real vLLM argument
    session = _session(tiny_model_dir, {key: 1})
    with pytest.raises(ConfigError, match=rf"engine_args\.{key}: pdsr sets vLLM's {key} itself; set "):
        run_on(engine_loop, session.start())
    assert session.engines == []


@pytest.mark.vllm
@pytest.mark.slow
def test_engine_settings_and_engine_args_reach_vllm(engine_loop, tiny_model_dir):
    """Each setting differs from vLLM's default and pdsr's, so reading it back shows it came from the spec."""
    from pdsr_sdk.engines.vllm_engine import VllmEngine

    spec = EngineSpec(name="args-0", pool="fast", devices=[0], max_num_seqs=3, max_model_len=320, dtype="float32",
                      warmup_tokens=0, engine_args={"max_num_batched_tokens": 640, "max_logprobs": 3})
    engine = VllmEngine.from_spec(spec, model=str(tiny_model_dir), seed=7, logprobs_mode="raw_logprobs")
    try:
        run_on(engine_loop, engine.start())
        config = engine._llm.vllm_config
    finally:
        run_on(engine_loop, engine.close())
    import torch

    model = config.model_config
    assert ((model.dtype, model.max_model_len, model.seed, model.logprobs_mode)
            == (torch.float32, 320, 7, "raw_logprobs"))
    assert model.max_logprobs == 3
    assert config.scheduler_config.max_num_seqs == 3 and config.scheduler_config.max_num_batched_tokens == 640
    assert config.cache_config.enable_prefix_caching is True   # segment continuations resubmit their context
    assert model.enforce_eager is True                          # the CPU build runs eager (vllm_engine.py)
