"""``pdsr serve`` where vLLM's OpenAI server answers otherwise than pdsr did, on real vLLM engines (CPU build, tiny
model) with the ``openai`` client, one server for the module: a request naming a model not served (vLLM's 404), a
completions batch (``prompt`` as a list of prompts), and ``/tokenize`` and ``/detokenize``. What vLLM's engines
received (their own view, a PromptLog) is the reference for the ids pdsr reports; vLLM's own response models are
the reference for the shapes."""

from __future__ import annotations

import asyncio
import json
import queue
import re
from http import HTTPStatus

import httpx
import pytest

from pdsr_sdk.engines.request_observer import PromptLog
from support import WAIT_S, requires_vllm
from test_chat_template_kwargs import THINKING

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # uses the shared real engines (tests/conftest.py)

openai = pytest.importorskip("openai")

NAMES = ["tiny", "tiny-alias"]
PROMPTS = ["Once upon a time", "The capital of France is", "1, 2, 3,"]


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
    root = base.removesuffix("/v1")
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
    for url, body in ((f"{base}/completions", {"prompt": "x"}), (f"{base}/chat/completions", {"messages": msgs}),
                      (f"{root}/tokenize", {"prompt": "x"}), (f"{root}/detokenize", {"tokens": [5]})):
        got = post(url, {**body, "model": "gpt-4o", "max_tokens": 2})
        assert (got.status_code, got.json()) == (404, vllm_404), url
    assert post(f"{base}/completions", {"prompt": "x", "max_tokens": 2}).status_code == 200   # no model: served


def test_a_completions_batch_is_served_prompt_major_with_summed_usage(vserved):
    """pdsr refused a list of prompts. Each prompt of a batch is now a group as a single prompt's is; choices are
    indexed prompt * n + sample and carry their prompt's ids, which are what vLLM received; usage sums them."""
    session, client, _, log = vserved
    tok = session.tokenizer
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    seen = len(log.entries)
    r = client.completions.create(model="tiny", prompt=PROMPTS, n=2, max_tokens=4)
    received = [p for _, p in log.entries[seen:]]
    assert [c.index for c in r.choices] == list(range(6))
    assert [c.prompt_token_ids for c in r.choices] == [i for i in ids for _ in range(2)]
    assert all(received.count(i) >= 2 for i in ids)   # each prompt's two samples reached vLLM with those ids
    assert all(c.text == tok.decode(c.token_ids, skip_special_tokens=True) for c in r.choices)
    assert r.usage.prompt_tokens == sum(map(len, ids))
    assert r.usage.completion_tokens == sum(len(c.token_ids) for c in r.choices) and 0 < r.usage.completion_tokens
    # token-id lists too; one list of ids stays one prompt
    batch = client.completions.create(model="tiny", prompt=ids[:2], max_tokens=3)
    assert [c.prompt_token_ids for c in batch.choices] == ids[:2] and batch.usage.prompt_tokens == len(ids[0] + ids[1])
    one = client.completions.create(model="tiny", prompt=ids[0], n=2, max_tokens=3)
    assert len(one.choices) == 2 and one.model_extra["prompt_token_ids"] == ids[0]


def test_a_batch_streams_with_vllms_indexes_and_a_summed_usage_chunk(vserved):
    session, _, base, _ = vserved
    tok = session.tokenizer
    body = {"model": "tiny", "prompt": PROMPTS[:2], "n": 2, "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{base}/completions", json=body, timeout=WAIT_S) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    choices = [c for chunk in chunks for c in chunk["choices"]]
    first = {c["index"]: c for c in reversed(choices)}   # each index's first chunk
    finished = sorted(c["index"] for c in choices if c["finish_reason"] is not None)
    assert sorted(first) == finished == [0, 1, 2, 3]
    assert [first[i]["prompt_token_ids"] for i in range(4)] == [tok(PROMPTS[i // 2])["input_ids"] for i in range(4)]
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["prompt_tokens"] == sum(len(tok(p)["input_ids"]) for p in PROMPTS[:2])
    assert usage["completion_tokens"] == sum(len(c["token_ids"]) for c in choices)


@pytest.mark.parametrize("prompt, expect", [
    ([], "prompt must be non-empty"),
    (["a", [5, 6]], r"prompt\[1\] is \[5, 6\], where prompt\[0\] is a string"),
    ([[5, 6], "a"], r"prompt\[1\] is 'a', where prompt\[0\] is a list of token ids"),
    ([{"text": "a"}], r"prompt\[0\] is \{'text': 'a'\}, prompt must be a string, a list of token ids"),
    (["a", ""], r"prompt\[1\] is empty"),
    ([[5, 6], [10 ** 9]], r"prompt\[1\]: token id 1000000000 is out of the vocabulary"),
    ([[5, 6], []], r"prompt\[1\] is empty"),
])
def test_a_bad_batch_is_a_400_naming_the_prompt_and_nothing_of_it_runs(vserved, prompt, expect):
    _, client, _, log = vserved
    seen = len(log.entries)
    with pytest.raises(openai.BadRequestError, match=expect):
        client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    assert len(log.entries) == seen
    with pytest.raises(openai.BadRequestError, match="a named sample .* takes one prompt"):
        client.completions.create(model="tiny", prompt=["a", "b"], max_tokens=2, extra_body={"pdsr_sample": "b"})


def test_tokenize_counts_a_chat_as_a_chat_request_is_sent(vserved):
    """A chat's ``/tokenize`` renders as ``/v1/chat/completions`` does (the request's chat_template_kwargs, tools,
    generation prompt): its count is the chat request's usage.prompt_tokens, its ids what vLLM received."""
    from vllm.entrypoints.serve.tokenize.protocol import DetokenizeResponse, TokenizeResponse

    session, client, base, log = vserved
    tok, root = session.tokenizer, base.removesuffix("/v1")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    counts = {}
    for kwargs in ({}, {"enable_thinking": False}):
        t = post(f"{root}/tokenize", {"model": "tiny", "messages": msgs, "chat_template_kwargs": kwargs}).json()
        assert set(t) == set(TokenizeResponse.model_fields) and t["token_strs"] is None
        seen = len(log.entries)
        r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2,
                                           extra_body={"chat_template_kwargs": kwargs})
        assert t["count"] == r.usage.prompt_tokens == len(t["tokens"])
        assert t["tokens"] == log.entries[seen][1] and t["max_model_len"] == vllm_context(session)
        counts[bool(kwargs)] = t["count"]
    think = tok("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]
    assert counts[True] == counts[False] + len(think)   # the template took the kwargs
    # a prompt, as /v1/completions encodes it; and back
    t = post(f"{root}/tokenize", {"prompt": "Hello world", "return_token_strs": True}).json()
    assert t["tokens"] == tok("Hello world")["input_ids"] and t["token_strs"] == tok.convert_ids_to_tokens(t["tokens"])
    d = post(f"{root}/detokenize", {"model": "tiny", "tokens": t["tokens"] + [tok.eos_token_id]}).json()
    assert set(d) == set(DetokenizeResponse.model_fields)
    assert d["prompt"] == "Hello world" + tok.eos_token   # special tokens kept, as vLLM's server decodes


@pytest.mark.parametrize("route, body, expect", [
    ("tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "one of them"),
    ("tokenize", {}, "a prompt .* or messages"),
    ("tokenize", {"prompt": [5, 6]}, "prompt must be a string"),
    ("tokenize", {"messages": []}, "messages must be a non-empty list"),
    ("tokenize", {"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ x }}"}, "chat_template"),
    ("tokenize", {"prompt": "x", "add_special_tokens": "yes"}, "add_special_tokens must be true or false"),
    ("detokenize", {"tokens": "5 6"}, "tokens must be a list of token ids"),
    ("detokenize", {"tokens": [5, -1]}, "tokens: token id -1 is out of the vocabulary"),
])
def test_bad_tokenize_requests_are_400s_naming_the_field(vserved, route, body, expect):
    _, _, base, _ = vserved
    r = post(f"{base.removesuffix('/v1')}/{route}", body)
    assert r.status_code == 400
    assert re.search(expect, r.json()["error"]["message"]), r.json()


def vllm_context(session) -> int:
    return min(e.spec.max_model_len for e in session.engines)
