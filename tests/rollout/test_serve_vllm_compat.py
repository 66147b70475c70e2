"""``pdsr serve`` where vLLM's OpenAI server answers otherwise than pdsr did, on real vLLM engines (CPU build, tiny
model) with the ``openai`` client, one server for the module: a request naming a model not served (vLLM's 404).
What vLLM's engines received (their own view, a PromptLog) is the reference for the ids pdsr reports; vLLM's own
response models are the reference for the shapes."""

from __future__ import annotations

import asyncio
import queue
from http import HTTPStatus

import httpx
import pytest

from pdsr_sdk.engines.request_observer import PromptLog
from support import WAIT_S, requires_vllm
from test_chat_template_kwargs import THINKING

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # uses the shared real engines (tests/conftest.py)

openai = pytest.importorskip("openai")

NAMES = ["tiny", "tiny-alias"]


@pytest.fixture(scope="module")
def vserved(engine_loop, vllm_pair, tiny_model_dir):
    """``session.aserve`` on the shared real engines, answering to NAMES, with the THINKING template (a
    ``chat_template_kwargs`` changes its prompt): (session, openai client, base URL, the prompts vLLM received)."""
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    session = RolloutSession(RolloutConfig(model=str(tiny_model_dir), sampling={"max_tokens": 16}), engines=vllm_pair)
    session.tokenizer.chat_template = THINKING
    log = PromptLog()
    ready: queue.Queue = queue.Queue()

    async def serve():
        for e in vllm_pair:
            e.observer = log
        try:
            async with session:
                await session.aserve(port=0, on_ready=ready.put, model_name=NAMES)
        finally:
            for e in vllm_pair:
                e.observer = None

    running = asyncio.run_coroutine_threadsafe(serve(), engine_loop)
    try:
        base = f"http://127.0.0.1:{ready.get(timeout=WAIT_S)}/v1"
        yield session, openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=WAIT_S), base, log
    finally:
        session.stop_serving()
        running.result(WAIT_S)


def post(url: str, body: dict) -> httpx.Response:
    return httpx.post(url, json=body, timeout=WAIT_S)


def test_a_model_not_served_is_vllms_404(vserved):
    """pdsr answered any model name with its own model; vLLM's server answers a 404 NotFoundError listing its names
    (the openai client raises NotFoundError), and takes a request with no model as one for the served model."""
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

    _, client, base, _ = vserved
    assert [m.id for m in client.models.list().data] == NAMES
    msgs = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="tiny-alias", messages=msgs, max_tokens=2)
    assert r.model == "tiny" and len(r.choices[0].token_ids) <= 2   # answered by its first name
    with pytest.raises(openai.NotFoundError, match="The model `gpt-4o` does not exist"):
        client.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4o", prompt="x", max_tokens=2, extra_body={"pdsr_sample": "x"})
    vllm_404 = create_error_response("The model `gpt-4o` does not exist. Valid aliases: tiny, tiny-alias.",
                                     err_type="NotFoundError", status_code=HTTPStatus.NOT_FOUND,
                                     param="model").model_dump()
    for url, body in ((f"{base}/completions", {"prompt": "x"}), (f"{base}/chat/completions", {"messages": msgs})):
        got = post(url, {**body, "model": "gpt-4o", "max_tokens": 2})
        assert (got.status_code, got.json()) == (404, vllm_404), url
    assert post(f"{base}/completions", {"prompt": "x", "max_tokens": 2}).status_code == 200   # no model: served
