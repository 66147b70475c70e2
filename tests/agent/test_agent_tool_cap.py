"""agent.max_tool_response_chars and tool_response_truncate_side (verl's multi_turn.max_tool_response_length and
tool_response_truncate_side): what the model sees of a long tool message, on the fake turn engine."""

from __future__ import annotations

import pytest

from pdsr_sdk.rollout.session import RolloutSession
from support import requires_torch
from test_agent_session import PROMPTS, config

LONG = "".join(f"{i:02d}," for i in range(40))   # 120 characters, each position told apart


async def long_tool(agent):
    await agent.generate()
    added = agent.append([{"role": "tool", "content": LONG}, {"role": "user", "content": LONG[:30]}],
                         tool_name="dump")
    await agent.generate()
    return {"score": float(len(added)), "env": agent.tokenizer.decode(added), "messages": agent.messages[-3:-1]}


def expected(side: str | None, cap: int) -> str:
    """verl's cut of LONG, written out: left keeps the start, right the end, middle half of each."""
    if side is None:
        return LONG
    return {"left": LONG[:cap] + "...(truncated)", "right": "(truncated)..." + LONG[-cap:],
            "middle": LONG[:cap // 2] + "...(truncated)..." + LONG[-(cap // 2):]}[side]


@requires_torch
@pytest.mark.parametrize("side", [None, "left", "middle", "right"])
def test_a_long_tool_message_is_cut_as_verl_cuts_it(tiny_model_dir, side):
    cap = 41
    agent = {} if side is None else {"max_tool_response_chars": cap, "tool_response_truncate_side": side}
    with RolloutSession(config(tiny_model_dir, agent=agent)) as session:
        out = session.step(PROMPTS[:1], agent=long_tool)
    row = out.table.to_pylist()[0]
    tool = expected(side, cap)
    # the tool's message is cut, the user's is not; the trajectory and the agent's messages hold what the model saw
    assert row["reward_extra"]["env"] == (f"\n<|im_start|>tool\n{tool}<|im_end|>\n<|im_start|>user\n"
                                          f"{LONG[:30]}<|im_end|>\n<|im_start|>assistant\n")
    assert row["reward_extra"]["messages"] == [{"role": "tool", "content": tool},
                                               {"role": "user", "content": LONG[:30]}]
    env = row["turns"][1]
    assert env["role"] == "environment" and env["tool_name"] == "dump"
    assert row["response_mask"].count(0) == env["num_tokens"] == row["reward"]


def test_truncate_tool_response_bounds():
    from pdsr_sdk.agent.tools import truncate_tool_response

    assert truncate_tool_response("abc", 3, "middle") == "abc"
    assert truncate_tool_response("abcd", 1, "middle") == "...(truncated)..."
    assert truncate_tool_response("abcd", 1, "left") == "a...(truncated)"
    assert truncate_tool_response("abcd", 1, "right") == "(truncated)...d"


def test_the_config_names_a_bad_side():
    from pdsr_sdk.agent import AgentConfig
    from pdsr_sdk.errors import ConfigValueError

    with pytest.raises(ConfigValueError, match="tool_response_truncate_side: Input should be 'left', 'middle' or"):
        AgentConfig(tool_response_truncate_side="top")
    with pytest.raises(ConfigValueError, match="max_tool_response_chars"):
        AgentConfig(max_tool_response_chars=0)


@requires_torch
def test_a_served_named_sample_is_not_cut(tiny_model_dir):
    """pdsr serve's client holds the conversation it sent and sends it again with each request: its tool messages
    reach the template whole (cut, the next request would no longer extend the recorded conversation)."""
    openai = pytest.importorskip("openai")
    import httpx
    from serve_client import serving

    from support import WAIT_S

    cfg = config(tiny_model_dir, agent={"max_tool_response_chars": 5, "env_timeout_s": 30})
    with RolloutSession(cfg) as session, serving(session, model_name="tiny") as (client, base):
        convo = [{"role": "user", "content": "What is 2+2?"}]
        for _ in range(2):
            r = client.chat.completions.create(model="tiny", messages=convo, max_tokens=3,
                                               extra_body={"pdsr_sample": "cap-1"})
            convo += [{"role": "assistant", "content": r.choices[0].message.content},
                      {"role": "tool", "content": LONG[:30]}]
        client.chat.completions.create(model="tiny", messages=convo, max_tokens=3, extra_body={"pdsr_sample": "cap-1"})
        row = httpx.post(f"{base}/pdsr/samples/cap-1/end", json={"reward": 1.0}, timeout=WAIT_S).json()
    assert isinstance(client, openai.OpenAI)
    tok = session.tokenizer
    for env in [t for t in row["turns"] if t["role"] == "environment"]:
        ids = row["response_token_ids"][env["start_token"]:env["start_token"] + env["num_tokens"]]
        # a turn cut at max_tokens gets its <|im_end|> from the environment
        assert tok.decode(ids) == f"<|im_end|>\n<|im_start|>tool\n{LONG[:30]}<|im_end|>\n<|im_start|>assistant\n"
    assert [t["role"] for t in row["turns"]] == ["assistant", "environment"] * 2 + ["assistant"]
