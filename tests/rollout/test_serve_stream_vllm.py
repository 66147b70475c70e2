"""``pdsr serve`` streams tokens as the engines make them (real vLLM engines, CPU build, tiny model, greedy; one server
for the module), read with the ``openai`` client. The order of events is held by a weight-update pause, never by
time: a hook on the session's tokens pauses the streamed sample part-way, the test reads the stream's first content
while the sample is held unfinished, then resumes it, and the stream goes on to the end. The joined deltas are the
text, ids and log-probs the same request gets without ``stream``; a named sample's streamed turns are recorded as
unstreamed ones are."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest

from support import WAIT_S, requires_vllm, serving

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # uses the shared real engines (tests/conftest.py)

openai = pytest.importorskip("openai")

MAX_TOKENS = 48
PAUSE_AT = 6   # tokens a streamed sample has when the hook pauses it


@pytest.fixture(scope="module")
def streamed(engine_loop, vllm_pair, tiny_model_dir):
    """``session.aserve`` on the shared real engines, greedy, every response MAX_TOKENS long: (session, openai client,
    base URL)."""
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    cfg = RolloutConfig(model=str(tiny_model_dir), sampling={"max_tokens": MAX_TOKENS, "temperature": 0.0,
                                                             "ignore_eos": True})
    session = RolloutSession(cfg, engines=vllm_pair)
    with serving(session, engine_loop) as root:
        base = f"{root}/v1"
        yield session, openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=WAIT_S), base


class PauseAt:
    """A hook on the session's tokens: the first sample to reach PAUSE_AT tokens pauses the session (a weight
    update's pause, 'abort': the sample keeps its tokens and goes on after resume); ``paused`` is set once it is."""

    def __init__(self, session):
        self.session, self.sample, self.generated = session, None, None
        self.paused = threading.Event()
        session.hooks.on_tokens.append(self)

    def __call__(self, sample, n):
        if self.sample is None and sample.num_generated >= PAUSE_AT:
            self.sample = sample
            asyncio.ensure_future(self._pause())

    async def _pause(self):
        await self.session.apause("abort")
        self.generated = self.sample.num_generated
        self.paused.set()

    def resume(self, loop):
        self.session.hooks.on_tokens.remove(self)
        asyncio.run_coroutine_threadsafe(self.session.aresume(), loop).result(WAIT_S)


def test_a_chat_stream_sends_tokens_as_they_come_and_goes_on_after_a_pause(streamed, engine_loop):
    session, client, _ = streamed
    msgs = [{"role": "user", "content": "Tell me a story."}]
    plain = client.chat.completions.create(model="tiny", messages=msgs, logprobs=True)
    gate = PauseAt(session)
    try:
        stream = iter(client.chat.completions.create(model="tiny", messages=msgs, logprobs=True, stream=True,
                                                     stream_options={"include_usage": True}))
        chunks = [next(stream)]
        while not (chunks[-1].choices and chunks[-1].choices[0].delta.content):
            chunks.append(next(stream))
        # the first content is read while its sample is held part-way by the pause: made before the sample ended
        assert gate.paused.wait(WAIT_S)
        assert gate.sample.finish_reason is None and PAUSE_AT <= gate.generated < MAX_TOKENS
        assert len(chunks) > 1 and sum(len(c.choices[0].token_ids) for c in chunks[1:]) <= gate.generated
    finally:
        gate.resume(engine_loop)
    chunks += list(stream)
    role, *content, usage = chunks
    assert role.choices[0].delta.role == "assistant" and role.choices[0].delta.content == ""
    assert "token_ids" not in role.choices[0].model_extra   # as vLLM's role chunk
    assert role.model_extra["prompt_token_ids"] == plain.model_extra["prompt_token_ids"]
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    assert sum(1 for c in content if c.choices[0].delta.content) > 1
    assert [c.choices[0].finish_reason for c in content] == [None] * (len(content) - 1) + ["length"]
    assert content[-1].choices[0].stop_reason is None and all(c.usage is None for c in content)
    # the joined deltas: the answer without stream, to the token and its log-prob
    assert "".join(c.choices[0].delta.content or "" for c in content) == plain.choices[0].message.content
    assert [i for c in content for i in c.choices[0].token_ids] == plain.choices[0].token_ids
    streamed_lps = [(t.token, t.logprob)
                    for c in content if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert streamed_lps == [(t.token, t.logprob) for t in plain.choices[0].logprobs.content]
    assert usage.choices == [] and usage.usage == plain.usage


def test_a_completions_stream_of_n_choices_joins_to_the_plain_answer(streamed):
    """n = 2 with log-probs: each choice's deltas, ids and log-probs (text offsets running on across chunks) join to
    the plain answer's; each choice's first chunk carries its prompt's ids, as vLLM's."""
    _, client, base = streamed
    body = {"model": "tiny", "prompt": "Once upon a time", "n": 2, "logprobs": 0}
    plain = httpx.post(f"{base}/completions", json=body, timeout=WAIT_S).json()
    with httpx.stream("POST", f"{base}/completions", json={**body, "stream": True}, timeout=WAIT_S) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert all("usage" not in c and len(c["choices"]) == 1 for c in chunks)
    for want in plain["choices"]:
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == want["index"]]
        assert len(mine) > 1 and mine[0]["prompt_token_ids"] == want["prompt_token_ids"]
        assert all("prompt_token_ids" not in c for c in mine[1:])
        assert [c["finish_reason"] for c in mine] == [None] * (len(mine) - 1) + ["length"]
        assert "".join(c["text"] for c in mine) == want["text"]
        assert [i for c in mine for i in c["token_ids"]] == want["token_ids"]
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            assert [x for c in mine if c["logprobs"] for x in c["logprobs"][key]] == want["logprobs"][key]


def test_a_named_samples_streamed_turns_are_recorded_as_unstreamed_ones(streamed):
    """Two turns of a named chat sample streamed, against the same two turns of one without stream (greedy): each
    turn's joined deltas and ids are the unstreamed turn's, and the two trajectories are the same."""
    _, client, base = streamed
    convos = {"plain": [{"role": "user", "content": "Hi"}], "streamed": [{"role": "user", "content": "Hi"}]}
    for turn in range(2):
        plain = client.chat.completions.create(model="tiny", messages=convos["plain"], max_tokens=12,
                                               extra_body={"pdsr_sample": "plain"}).choices[0]
        chunks = list(client.chat.completions.create(model="tiny", messages=convos["streamed"], max_tokens=12,
                                                     stream=True, extra_body={"pdsr_sample": "streamed"}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert text == plain.message.content and chunks[-1].choices[0].finish_reason == plain.finish_reason
        assert [i for c in chunks[1:] for i in c.choices[0].token_ids] == plain.token_ids
        for name, said in (("plain", plain.message.content), ("streamed", text)):
            convos[name] += [{"role": "assistant", "content": said}, {"role": "user", "content": f"and {turn}?"}]
    rows = [httpx.post(f"{base}/pdsr/samples/{s}/end", json={"reward": 1.0}, timeout=WAIT_S).json()
            for s in ("plain", "streamed")]
    for key in ("prompt_token_ids", "response_token_ids", "response_mask"):
        assert rows[0][key] == rows[1][key], key
    assert [t["num_tokens"] for t in rows[0]["turns"]] == [t["num_tokens"] for t in rows[1]["turns"]]
