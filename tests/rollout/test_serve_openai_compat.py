"""``pdsr serve`` as a drop-in for vLLM's OpenAI-compatible server, with the real ``openai`` client on fake engines
(tests/turn_fakes.py): the fields vLLM's responses carry that clients read, and the request fields vLLM takes."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.session import RolloutSession
from support import WAIT_S, requires_torch

openai = pytest.importorskip("openai")

from serve_client import serving  # noqa: E402


def stop_config(tiny_model_dir) -> RolloutConfig:
    return RolloutConfig(model=str(tiny_model_dir), policy="v3", sampling={"max_tokens": 64},
                         engines=[{"name": "f0", "pool": "fast", "backend": "turn_fakes:StopTurnEngine",
                                   "max_model_len": 256, "max_num_seqs": 4}])


def stream_finish(base: str, route: str, body: dict) -> list[dict]:
    """The stream's chunks that carry a finish reason."""
    with httpx.stream("POST", f"{base}/{route}", json={**body, "stream": True}, timeout=WAIT_S) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    return [c for chunk in map(json.loads, lines) for c in chunk["choices"] if c["finish_reason"] is not None]


def streamed_text(base: str, route: str, body: dict) -> str:
    """The stream's deltas joined (chat: ``delta.content``; completions: ``text``)."""
    with httpx.stream("POST", f"{base}/{route}", json={**body, "stream": True}, timeout=WAIT_S) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    return "".join(c.get("text") or (c.get("delta") or {}).get("content") or "" for ch in chunks for c in ch["choices"])


@requires_torch
@pytest.mark.parametrize("stop", ["</answer>", 7])
def test_each_choice_carries_its_stop_reason_as_vllms_does(tiny_model_dir, stop):
    """vLLM's choices name the stop string or stop token id that ended them (``stop_reason``); pdsr's had none,
    though the sample records it. A turn cut at its limit has none, in a named sample's turns too."""
    from turn_fakes import StopTurnEngine

    StopTurnEngine.STOP_REASON = stop
    try:
        with RolloutSession(stop_config(tiny_model_dir)) as session, serving(session, model_name="m") as (client, base):
            msgs = [{"role": "user", "content": "x"}]
            r = client.chat.completions.create(model="m", messages=msgs, n=2)
            assert [(c.finish_reason, c.stop_reason) for c in r.choices] == [("stop", stop)] * 2
            c = client.completions.create(model="m", prompt="x")
            assert (c.choices[0].finish_reason, c.choices[0].stop_reason) == ("stop", stop)
            cut = client.completions.create(model="m", prompt="x", max_tokens=2)
            assert (cut.choices[0].finish_reason, cut.choices[0].stop_reason) == ("length", None)
            for route, body in (("chat/completions", {"messages": msgs}), ("completions", {"prompt": "x"})):
                assert [c["stop_reason"] for c in stream_finish(base, route, body)] == [stop]
            named = client.chat.completions.create(model="m", messages=msgs, max_tokens=2,
                                                   extra_body={"pdsr_sample": "s"})
            assert named.choices[0].stop_reason is None   # cut at the turn's max_tokens
            msgs += [{"role": "assistant", "content": named.choices[0].message.content},
                     {"role": "user", "content": "y"}]
            named = client.chat.completions.create(model="m", messages=msgs, extra_body={"pdsr_sample": "s"})
            assert (named.choices[0].finish_reason, named.choices[0].stop_reason) == ("stop", stop)
            text = client.completions.create(model="m", prompt="x", extra_body={"pdsr_sample": "t"})
            assert text.choices[0].stop_reason == stop
    finally:
        StopTurnEngine.STOP_REASON = None


@requires_torch
def test_a_choice_the_models_eos_ended_has_no_stop_reason(served):
    _, client, _ = served
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].stop_reason is None
    assert "stop_reason" in r.choices[0].model_dump()   # present, null, as vLLM's


@requires_torch
def test_a_requests_template_options_reach_the_template_as_vllms_do(tiny_model_dir):
    """``chat_template_kwargs`` (over the session's ``data.chat_template_kwargs``, as vLLM merges a request's over
    its server's), ``add_generation_prompt`` and ``continue_final_message`` were ignored without a word: the prompt
    was rendered with the session's variables and a generation prompt whatever the request said."""
    from test_chat_template_kwargs import THINKING

    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", sampling={"max_tokens": 8},
                        data={"chat_template_kwargs": {"enable_thinking": True}},
                        engines=[{"name": "f0", "pool": "fast", "backend": "turn_fakes:TurnEngine",
                                  "max_model_len": 256, "max_num_seqs": 4}])
    with RolloutSession(cfg) as session, serving(session, model_name="m") as (client, _):
        tok = session.tokenizer
        tok.chat_template = THINKING
        engine = session.engines[0]
        user = [{"role": "user", "content": "hi"}]

        def sent(messages, **extra) -> str:
            client.chat.completions.create(model="m", messages=messages, max_tokens=2, extra_body=extra)
            return tok.decode(engine.requests[-1].context_ids, skip_special_tokens=False)

        head = "<|im_start|>user\nhi<|im_end|>\n"
        assert sent(user) == head + "<|im_start|>assistant\n"   # the session's: thinking on
        assert sent(user, chat_template_kwargs={"enable_thinking": False}) == (
            head + "<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert sent(user, add_generation_prompt=False) == head
        partial = user + [{"role": "assistant", "content": "The answer is"}]
        assert sent(partial, add_generation_prompt=False, continue_final_message=True) == (
            head + "<|im_start|>assistant\nThe answer is")
        with pytest.raises(openai.BadRequestError, match="continue_final_message .* takes add_generation_prompt: "
                                                         "false"):
            client.chat.completions.create(model="m", messages=partial, extra_body={"continue_final_message": True})
        with pytest.raises(openai.BadRequestError, match="an assistant's; it is 'user'"):
            client.chat.completions.create(model="m", messages=user, extra_body={
                "continue_final_message": True, "add_generation_prompt": False})
        with pytest.raises(openai.BadRequestError, match="chat_template_kwargs must be an object"):
            client.chat.completions.create(model="m", messages=user, extra_body={"chat_template_kwargs": "no"})
        # a named sample's later messages are rendered with the session's: a request asking for others is refused
        with pytest.raises(openai.BadRequestError, match=r"chat_template_kwargs \{'enable_thinking': False\}: a "
                                                         r"named sample's messages .*data\.chat_template_kwargs"):
            client.chat.completions.create(model="m", messages=user, extra_body={
                "pdsr_sample": "n", "chat_template_kwargs": {"enable_thinking": False}})
        with pytest.raises(openai.BadRequestError, match="add_generation_prompt False: a named sample's"):
            client.chat.completions.create(model="m", messages=user, extra_body={
                "pdsr_sample": "n", "add_generation_prompt": False})
        r = client.chat.completions.create(model="m", messages=user, max_tokens=2, extra_body={
            "pdsr_sample": "n", "chat_template_kwargs": {"enable_thinking": True}})   # the session's: taken
        assert len(r.choices[0].token_ids) == 2


#: vLLM's and OpenAI's request options pdsr has no counterpart of: a value other than the default, then the default
OPTIONS = [("skip_special_tokens", False, True), ("spaces_between_special_tokens", False, True),
           ("truncate_prompt_tokens", 8, None), ("allowed_token_ids", [5, 6], None), ("bad_words", ["no"], []),
           ("structured_outputs", {"regex": "[0-9]+"}, None), ("length_penalty", 2.0, 1.0),
           ("reasoning_effort", "low", None)]
CHAT_OPTIONS = [("add_special_tokens", True, False), ("chat_template", "{{ messages }}", None),
                ("documents", [{"title": "a", "text": "b"}], None), ("parallel_tool_calls", False, True)]


@requires_torch
@pytest.mark.parametrize("field, value, default", OPTIONS + CHAT_OPTIONS)
def test_a_vllm_option_pdsr_does_not_apply_is_a_400_naming_it(served, field, value, default):
    """They were taken and ignored without a word (skip_special_tokens: false answered with the special tokens
    skipped, allowed_token_ids sampled from the whole vocabulary, parallel_tool_calls: false answered with every
    call). The default (vLLM's), or null, passes."""
    _, client, _ = served
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.BadRequestError, match=f"{field} .*: pdsr does not apply a request's {field} "
                                                     f"\\(it answers as with {re.escape(repr(default))}\\)"):
        client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, extra_body={field: value})
    for ok in (default, None):
        r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, extra_body={field: ok})
        assert len(r.choices[0].token_ids) == 2
    if (field, value, default) in OPTIONS:
        with pytest.raises(openai.BadRequestError, match=f"pdsr does not apply a request's {field}"):
            client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={field: value})
        assert len(client.completions.create(model="tiny", prompt="x", max_tokens=2,
                                             extra_body={field: default}).choices) == 1


@requires_torch
def test_completions_add_special_tokens_defaults_to_true_as_vllms(served):
    _, client, _ = served
    with pytest.raises(openai.BadRequestError, match="add_special_tokens False: .*as with True"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"add_special_tokens": False})


@requires_torch
@pytest.mark.parametrize("choice", ["none", "required", {"type": "function", "function": {"name": "f"}}])
def test_tool_choice_other_than_auto_is_a_400(served, choice):
    """The model was left to decide, whatever the request asked for (a required or named call, none)."""
    _, client, _ = served
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    with pytest.raises(openai.BadRequestError, match="tool_choice .*: pdsr does not constrain the model's tool "
                                                     "calls"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       tools=tools, tool_choice=choice)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       tools=tools, tool_choice="auto")
    assert r.choices[0].finish_reason == "length"


@requires_torch
def test_the_answer_text_ends_before_its_stop_string_as_vllms_does(tiny_model_dir):
    """vLLM's text ends before the stop string that ended it (include_stop_str_in_output: true, after it); pdsr's
    was every sampled token decoded, the stop string and what the token completing it held after it too. The
    sampled ids and a named sample's turns keep them: they are its trajectory."""
    from turn_fakes import StopTurnEngine

    with RolloutSession(stop_config(tiny_model_dir)) as session, serving(session, model_name="m") as (client, base):
        StopTurnEngine.TURN_IDS = session.tokenizer("A</a>", add_special_tokens=False)["input_ids"]
        StopTurnEngine.STOP_REASON = "</a>"
        try:
            msgs = [{"role": "user", "content": "x"}]
            r = client.chat.completions.create(model="m", messages=msgs)
            assert r.choices[0].message.content == "A"
            assert session.tokenizer.decode(r.choices[0].token_ids).startswith("A</a>")   # the ids are whole
            r = client.chat.completions.create(model="m", messages=msgs,
                                               extra_body={"include_stop_str_in_output": True})
            assert r.choices[0].message.content == "A</a>"
            assert client.completions.create(model="m", prompt="x").choices[0].text == "A"
            c = client.completions.create(model="m", prompt="x", extra_body={"include_stop_str_in_output": True})
            assert c.choices[0].text == "A</a>"
            for route, body in (("chat/completions", {"messages": msgs}), ("completions", {"prompt": "x"})):
                for include, text in ((False, "A"), (True, "A</a>")):   # streamed as answered
                    assert streamed_text(base, route, {"model": "m", **body,
                                                       "include_stop_str_in_output": include}) == text
            with pytest.raises(openai.BadRequestError, match="include_stop_str_in_output must be true or false"):
                client.completions.create(model="m", prompt="x", extra_body={"include_stop_str_in_output": "y"})
            named = client.completions.create(model="m", prompt="x", extra_body={"pdsr_sample": "k"})
            assert named.choices[0].text == session.tokenizer.decode(named.choices[0].token_ids)
            StopTurnEngine.STOP_REASON = 32   # a stop token id: the text is every token's
            r = client.completions.create(model="m", prompt="x")
            assert r.choices[0].text == session.tokenizer.decode(r.choices[0].token_ids) != "A"
        finally:
            StopTurnEngine.TURN_IDS = StopTurnEngine.STOP_REASON = None


@requires_torch
def test_logprobs_are_the_sampled_tokens_as_vllm_shapes_them(served):
    """logprobs: true (completions: logprobs 0) was a 400, though each sample records its engine's log-prob of
    every sampled token (an RL client's behaviour log-probs); they come back in vLLM's shapes now. The fake engine
    samples each token with log-prob -0.25."""
    session, client, base = served
    tok = session.tokenizer
    msgs = [{"role": "user", "content": "x"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, logprobs=True, n=2)
    for c in r.choices:
        assert [(t.token, t.logprob, t.top_logprobs) for t in c.logprobs.content] == [
            (tok.decode([i]), -0.25, []) for i in c.token_ids]
        assert all(t.bytes == list(t.token.encode()) for t in c.logprobs.content)
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=3, logprobs=True, top_logprobs=0,
                                       extra_body={"return_tokens_as_token_ids": True})
    assert [t.token for t in r.choices[0].logprobs.content] == [f"token_id:{i}" for i in r.choices[0].token_ids]
    assert client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2).choices[0].logprobs is None
    c = client.completions.create(model="tiny", prompt="x", max_tokens=4, logprobs=0).choices[0]
    tokens = [tok.decode([i]) for i in c.token_ids]
    assert c.logprobs.tokens == tokens and c.logprobs.token_logprobs == [-0.25] * 4
    assert c.logprobs.top_logprobs == [{t: -0.25} for t in tokens]
    assert c.logprobs.text_offset == [sum(len(t) for t in tokens[:k]) for k in range(4)]
    # a named sample's turns: the log-probs its row records for them
    first = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=3, logprobs=True,
                                           extra_body={"pdsr_sample": "lp"})
    msgs += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "y"}]
    second = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, logprobs=True,
                                            extra_body={"pdsr_sample": "lp"})
    row = httpx.post(f"{base}/pdsr/samples/lp/end", json={"reward": 0.0}, timeout=WAIT_S).json()
    turns = [t for t in row["turns"] if t["role"] == "assistant"]
    for turn, response in zip(turns, (first, second)):
        recorded = row["response_logprobs"][turn["start_token"]:turn["start_token"] + turn["num_tokens"]]
        assert [t.logprob for t in response.choices[0].logprobs.content] == recorded
    text = client.completions.create(model="tiny", prompt="x", max_tokens=2, logprobs=0,
                                     extra_body={"pdsr_sample": "lp-text"})
    assert text.choices[0].logprobs.token_logprobs == [-0.25] * 2
    # a stream's content chunk carries them
    with httpx.stream("POST", f"{base}/chat/completions", timeout=WAIT_S, json={
            "model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "logprobs": True,
            "stream": True}) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    assert [len(lp["content"]) for ch in chunks for c in ch["choices"] if (lp := c["logprobs"])] == [2]


@requires_torch
@pytest.mark.parametrize("chat, extra, expect", [
    (True, {"logprobs": True, "top_logprobs": 2}, r"top_logprobs 2: pdsr records the log-prob of each sampled "
                                                  r"token only .*leave top_logprobs out, null or 0"),
    (True, {"logprobs": "yes"}, "logprobs must be true or false"),
    (True, {"prompt_logprobs": 1}, "prompt_logprobs 1: pdsr records the log-prob of each sampled token only"),
    (False, {"logprobs": 2}, r"logprobs 2: pdsr records the log-prob of each sampled token only .*null or 0"),
    (False, {"logprobs": -1}, "logprobs must be a non-negative integer, got -1"),
])
def test_logprobs_pdsr_does_not_record_are_a_400(served, chat, extra, expect):
    _, client, _ = served
    with pytest.raises(openai.BadRequestError, match=expect):
        if chat:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                           extra_body=extra)
        else:
            client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body=extra)


@requires_torch
def test_a_request_without_max_tokens_gets_the_room_its_prompt_leaves(served):
    """With no max_tokens, vLLM's server samples up to the end of the context; pdsr refused a prompt within 64
    tokens (the session's max_tokens) of its 256-token context with a 400 the client had not asked for. A
    max_tokens the request sets that does not fit is still a 400 naming the lengths, and so is a prompt that
    fills the context."""
    session, client, _ = served
    prompt = list(range(10, 10 + 254))   # 2 tokens of room
    c = client.completions.create(model="tiny", prompt=prompt).choices[0]
    assert (len(c.token_ids), c.finish_reason) == (2, "length")
    with pytest.raises(openai.BadRequestError, match=r"the prompt \(254 tokens\) plus max_tokens \(64\) exceeds the "
                                                     r"engines' context \(256 tokens\)"):
        client.completions.create(model="tiny", prompt=prompt, max_tokens=64)
    with pytest.raises(openai.BadRequestError, match=r"the prompt \(256 tokens\) leaves no room for a response in "
                                                     r"the engines' context \(256 tokens\)"):
        client.completions.create(model="tiny", prompt=list(range(10, 10 + 256)))
    tok = session.tokenizer
    text = "y" * 240
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    room = 256 - len(tok(rendered, add_special_tokens=False)["input_ids"])
    assert 0 < room < 5   # shorter than the fake's 5-token turn: cut at the context's end
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": text}])
    assert (len(r.choices[0].token_ids), r.choices[0].finish_reason) == (room, "length")


@requires_torch
def test_a_response_carries_its_prompt_token_ids(served):
    """vLLM's server gives prompt_token_ids (with return_token_ids) next to each choice's token_ids; pdsr gave the
    choices' only, so a client could not see the ids its prompt was rendered to."""
    session, client, base = served
    tok = session.tokenizer
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2,
                                       extra_body={"return_token_ids": True})
    rendered = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert r.prompt_token_ids == tok(rendered, add_special_tokens=False)["input_ids"]
    assert r.usage.prompt_tokens == len(r.prompt_token_ids)
    c = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=2)
    assert c.prompt_token_ids == [5, 6, 7]
    first = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=3, extra_body={"pdsr_sample": "p"})
    msgs += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "tool", "content": "4"}]
    second = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, extra_body={"pdsr_sample": "p"})
    row = httpx.post(f"{base}/pdsr/samples/p/end", json={"reward": 1.0}, timeout=WAIT_S).json()
    assert first.prompt_token_ids == row["prompt_token_ids"]
    assert second.prompt_token_ids == row["prompt_token_ids"] + row["response_token_ids"][:-2]
    assert second.usage.prompt_tokens == len(second.prompt_token_ids)


#: ChatML that renders an assistant's tool calls as Qwen2.5's template does (``arguments | tojson``)
TOOL_CALLS = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
              "{% for c in m.get('tool_calls', []) %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": "
              "{{ c.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@requires_torch
def test_an_assistants_tool_call_arguments_reach_the_template_as_an_object(tiny_model_dir):
    """OpenAI's clients send a tool call's arguments as a JSON string; vLLM's server parses it before the template,
    whose ``tojson`` would otherwise quote it again. pdsr passed the string: the model saw
    ``"arguments": "{\\"a\\": 1}"``, not the ``{"a": 1}`` it had written."""
    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", sampling={"max_tokens": 8},
                        engines=[{"name": "f0", "pool": "fast", "backend": "turn_fakes:TurnEngine",
                                  "max_model_len": 256, "max_num_seqs": 4}])
    with RolloutSession(cfg) as session, serving(session, model_name="m") as (client, _):
        tok = session.tokenizer
        tok.chat_template = TOOL_CALLS
        call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
        msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "2"}]
        client.chat.completions.create(model="m", messages=msgs, max_tokens=2)
        sent = tok.decode(session.engines[0].requests[-1].context_ids, skip_special_tokens=False)
        assert sent == ('<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n<tool_call>{"name": "add", '
                        '"arguments": {"a": 1}}</tool_call><|im_end|>\n<|im_start|>tool\n2<|im_end|>\n'
                        '<|im_start|>assistant\n')
        msgs[1] = {"role": "assistant", "content": "ok", "tool_calls": []}   # empty: dropped, as vLLM drops it
        client.chat.completions.create(model="m", messages=msgs, max_tokens=2)
        assert "<|im_start|>assistant\nok<|im_end|>" in tok.decode(session.engines[0].requests[-1].context_ids)
        for arguments, expect in (("{oops", r"messages\[1\]\.tool_calls\[0\]\.function\.arguments is not JSON"),
                                  ("[1]", r"messages\[1\]\.tool_calls\[0\]\.function\.arguments must be a JSON "
                                          r"object")):
            msgs[1] = {"role": "assistant", "content": None,
                       "tool_calls": [{**call, "function": {"name": "add", "arguments": arguments}}]}
            with pytest.raises(openai.BadRequestError, match=expect):
                client.chat.completions.create(model="m", messages=msgs, max_tokens=2)


@requires_torch
def test_health_answers_200_as_vllms_does(served):
    """Launch scripts written for vLLM poll GET /health before their first request; pdsr answered it with a 404,
    so they waited until their timeout."""
    _, _, base = served
    root = base.removesuffix("/v1")
    r = httpx.get(f"{root}/health", timeout=WAIT_S)
    assert (r.status_code, r.content) == (200, b"")
    assert "GET /health" in httpx.get(f"{root}/nope", timeout=WAIT_S).json()["error"]["message"]


@requires_torch
def test_models_lists_the_context_as_vllms_does(served):
    """vLLM's model card has max_model_len (clients budget a conversation with it); pdsr's had none."""
    session, client, _ = served
    [card] = client.models.list().data
    assert (card.id, card.max_model_len, card.root) == ("tiny", 256, session.model_dir)   # the fake engine's limit
