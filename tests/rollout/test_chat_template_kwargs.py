"""``data.chat_template_kwargs`` (verl's ``data.apply_chat_template_kwargs``, e.g. Qwen3's ``enable_thinking``)
reach the chat template wherever pdsr renders one: the data's prompts, what an agent appends, serve's chat
requests; a resume with other ones names the key."""

from __future__ import annotations

import json

import pytest

from support import requires_torch

pytestmark = requires_torch

#: ChatML whose generation prompt opens an empty reasoning block when enable_thinking is false (as Qwen3's does)
THINKING = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
NO_THINK = {"enable_thinking": False}


@pytest.fixture
def tok(tiny_model_dir):
    from pdsr_sdk.rollout.data import load_tokenizer

    t = load_tokenizer(tiny_model_dir)
    t.chat_template = THINKING
    return t


@pytest.mark.parametrize("kwargs, tail", [({}, "<|im_start|>assistant\n"),
                                          (NO_THINK, "<|im_start|>assistant\n<think>\n\n</think>\n\n")])
def test_the_data_prompts_are_rendered_with_them(tmp_path, tok, kwargs, tail):
    from pdsr_sdk.rollout.config import DataConfig
    from pdsr_sdk.rollout.data import load_prompts

    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "What is 1+1?"}) + "\n")
    [record] = load_prompts(DataConfig(chat_template_kwargs=kwargs), tok, path=path)
    assert record.text == "<|im_start|>user\nWhat is 1+1?<|im_end|>\n" + tail
    assert record.token_ids == tok(record.text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("kwargs, tail", [({}, "<|im_start|>assistant\n"),
                                          (NO_THINK, "<|im_start|>assistant\n<think>\n\n</think>\n\n")])
def test_an_agents_new_messages_end_with_the_same_generation_prompt(tok, kwargs, tail):
    from pdsr_sdk.agent.render import environment_ids

    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    sampled = tok("hello", add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    new = environment_ids(tok, conversation, [{"role": "tool", "content": "42"}], last_turn_ids=sampled,
                          template_kwargs=kwargs)
    assert tok.decode(new, skip_special_tokens=False) == "\n<|im_start|>tool\n42<|im_end|>\n" + tail


def test_the_session_hands_them_to_its_agents_and_serve(tiny_model_dir):
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.serve import ChatServer
    from pdsr_sdk.rollout.session import RolloutSession

    session = RolloutSession(RolloutConfig(model=str(tiny_model_dir), data={"chat_template_kwargs": NO_THINK}))
    assert session.agents.template_kwargs == NO_THINK
    session.tokenizer.chat_template = THINKING
    text = ChatServer(session).render([{"role": "user", "content": "hi"}])
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_a_resume_with_other_template_kwargs_names_the_key(tmp_path, tiny_model_dir):
    from cli_checks import failed, fake_rollout, invoke, write_jsonl

    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"q{i}", "prompt": f"What is {i}+1?"} for i in range(4)])
    out = tmp_path / "o.parquet"
    run = fake_rollout(tmp_path, tiny_model_dir)
    assert invoke(*run, "--data", prompts, "--out", out, "--limit", 2).exit_code == 0
    cfg = json.loads((tmp_path / "run.yaml").read_text())
    (tmp_path / "run.yaml").write_text(json.dumps({**cfg, "data": {"chat_template_kwargs": NO_THINK}}))
    failed(invoke(*run, "--data", prompts, "--out", out, "--resume"),
           "data.chat_template_kwargs (data.chat_template_kwargs) is {'enable_thinking': False} now but was {}")
