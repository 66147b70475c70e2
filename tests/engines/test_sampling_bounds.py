"""Sampling vLLM refuses: pdsr's config refuses it first, naming the key or flag, before any engine starts; and a
request vLLM refuses all the same (a bound pdsr does not know) fails its sample instead of hanging the run."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from support import WAIT_S, requires_vllm, run_on
from pdsr_cli.main import cli
from pdsr_sdk.config import load_config
from pdsr_sdk.dispatch.types import SegmentRequest
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.rollout.config import RolloutConfig, SamplingConfig
from pdsr_sdk.rollout.data import PromptRecord, build_groups


def vllm_refuses(**sampling) -> bool:
    """Whether vLLM's own SamplingParams refuses these settings (the reference pdsr's bounds follow)."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    try:
        SamplingParams(**sampling)
    except VLLMValidationError:
        return True
    return False


@requires_vllm
@pytest.mark.parametrize("sampling, key", [
    ({"temperature": 2.5}, "sampling.temperature"),
    ({"temperature": -0.5}, "sampling.temperature"),
    ({"top_p": 0.0}, "sampling.top_p"),
    ({"stop": ["</answer>", ""]}, "sampling.stop"),
])
def test_the_config_refuses_what_vllm_refuses(sampling, key):
    assert vllm_refuses(**sampling)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(RolloutConfig, None, {f"sampling.{k}": v for k, v in sampling.items()})
    assert not vllm_refuses(temperature=2.0, top_p=1.0, stop=["</answer>"])   # the bounds themselves pass
    SamplingConfig(temperature=2.0, stop=["</answer>"])


@requires_vllm
@pytest.mark.parametrize("temperature", [0.001, 0.0099])
def test_a_temperature_vllm_would_raise_is_refused(temperature):
    """vLLM samples a temperature in (0, 0.01) at 0.01: the config refuses it rather than record one that was not
    sampled at (scoring and the trainer's ratios read the recorded one); 0 and 0.01 pass as vLLM keeps them."""
    from vllm import SamplingParams

    assert SamplingParams(temperature=temperature).temperature == 0.01   # what vLLM does with it
    with pytest.raises(ConfigError, match=r"sampling\.temperature.*0\.01"):
        load_config(RolloutConfig, None, {"sampling.temperature": temperature})
    for kept in (0.0, 0.01):
        assert SamplingParams(temperature=kept).temperature == kept
        assert SamplingConfig(temperature=kept).temperature == kept


def test_a_refused_temperature_flag_stops_before_any_engine(tmp_path):
    """``--temperature 3`` hung a run for ever (every request's SamplingParams raised in its task, unseen); it is
    now one line naming the flag, and nothing starts."""
    out = tmp_path / "r.parquet"
    result = CliRunner().invoke(cli, ["rollout", "--temperature", "3", "--n", "2", "--max-tokens", "8",
                                      "--limit", "1", "--batch-size", "1", "--out", str(out)],
                                catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "--temperature" in result.output and "2" in result.output
    assert "starting" not in result.output and not out.exists()


class Listener:
    def __init__(self):
        self.ends: dict[str, str] = {}
        self.failed: dict[str, str] = {}
        self.tokens: dict[str, int] = {}
        self.dead: list = []

    def on_tokens(self, engine, rid, n, ids, lps):
        self.tokens[rid] = self.tokens.get(rid, 0) + n

    def on_segment_end(self, engine, rid, reason, **_):
        self.ends[rid] = reason

    def on_request_failed(self, engine, rid, error):
        self.failed[rid] = error

    def on_engine_dead(self, engine, error):
        self.dead.append(error)


def _request(rid: str, sampling) -> SegmentRequest:
    ids = [5, 6, 7, 8]
    sample = build_groups([PromptRecord("p", "p", ids)], 1, 8)[0].samples[0]
    return SegmentRequest(request_id=rid, context_ids=ids, context_len=len(ids), max_tokens=8, ignore_eos=True,
                          sampling=sampling, sample=sample)


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_a_request_vllm_refuses_fails_its_sample_and_the_engine_serves_on(engine_loop, vllm_pair):
    """Sampling that passed pdsr's checks and that vLLM refuses (here a temperature past vLLM's bound, the config's
    check bypassed, as a bound of a newer vLLM would be) ends in ``on_request_failed`` with vLLM's own message; the
    engine then serves the next request to its end."""
    import asyncio

    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError) as refused:
        SamplingParams(temperature=3.0)
    engine = vllm_pair[0]
    listener = Listener()
    engine.bind(listener)

    async def scenario():
        engine.submit(_request("bad", SamplingConfig.model_construct(**{**SamplingConfig().model_dump(),
                                                                          "temperature": 3.0})))
        engine.submit(_request("good", SamplingConfig(temperature=1.0)))
        loop = asyncio.get_running_loop()
        end = loop.time() + WAIT_S
        while not ("bad" in listener.failed and "good" in listener.ends) and loop.time() < end and not listener.dead:
            await asyncio.sleep(0.02)

    run_on(engine_loop, scenario())
    assert not listener.dead
    assert str(refused.value) in listener.failed["bad"] and "bad" not in listener.ends
    assert listener.ends["good"] == "length" and listener.tokens["good"] == 8
