"""Settings of multi-turn rollouts (an agent function runs each sample)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pdsr_sdk.config import ConfigModel


class AgentConfig(ConfigModel):
    """A multi-turn sample's agent function and its limits."""

    function: str | None = Field(None,
                                 description="The agent: an import path 'pkg.mod:run' to `async def run(agent)`, "
                                             "called once per sample with an AgentContext; None = single-turn rollout.")
    max_turns: int = Field(8, ge=1, description="Most model turns a sample may take; a generate() past it raises "
                                                "AgentDone, which ends the sample as if the agent had returned.")
    max_env_turns: int | None = Field(
        None, ge=1, description="Most environment turns a sample may take (what the environment appends between two "
                                "model turns, one 'environment' span of its turns; verl's multi_turn.max_user_turns): "
                                "a generate() after environment ids past it raises AgentDone, and the sample ends as "
                                "at max_turns (those ids are not in the trajectory). None: no limit but max_turns.")
    turn_max_tokens: int | None = Field(
        None, ge=1, description="Most tokens one model turn may sample; default: what is left of the sample's budget "
                                "(sampling.max_tokens counts every response token, the model's and the environment's).")
    env_timeout_s: float = Field(60.0, gt=0, description="Seconds the agent may spend between a model turn's end and "
                                                         "its next generate() (or its return): the environment's time. "
                                                         "Past it the sample fails (finish_reason 'failed', the error "
                                                         "in its row) and the rest of the step goes on.")
    max_tool_response_chars: int | None = Field(
        None, ge=1, description="Most characters of a 'tool' message's content that an agent function appends: a "
                                "longer one is cut as tool_response_truncate_side says, with a '(truncated)' mark, "
                                "before the chat template renders it (verl's multi_turn.max_tool_response_length, also "
                                "characters; its default is 256). None: no cap. pdsr serve's named samples are not cut "
                                "(their client holds the conversation it sent).")
    tool_response_truncate_side: Literal["left", "middle", "right"] = Field(
        "middle", description="What a cut by max_tool_response_chars keeps, as verl's "
                              "multi_turn.tool_response_truncate_side: 'left' the first characters, then "
                              "'...(truncated)'; 'right' '(truncated)...', then the last; 'middle' the first and last "
                              "half each, '...(truncated)...' between.")
