"""Settings of multi-turn rollouts (an agent function runs each sample)."""

from __future__ import annotations

from pydantic import Field

from pdsr_sdk.config import ConfigModel


class AgentConfig(ConfigModel):
    """A multi-turn sample's agent function and its limits."""

    function: str | None = Field(None, description="The agent: an import path 'pkg.mod:run' to `async def run(agent)`, called once per sample with an AgentContext; None = single-turn rollout.")
    max_turns: int = Field(8, ge=1, description="Most model turns a sample may take; a generate() past it raises AgentDone, which ends the sample as if the agent had returned.")
    turn_max_tokens: int | None = Field(None, ge=1, description="Most tokens one model turn may sample; default: what is left of the sample's budget (sampling.max_tokens counts every response token, the model's and the environment's).")
    env_timeout_s: float = Field(60.0, gt=0, description="Seconds the agent may spend between a model turn's end and its next generate() (or its return): the environment's time. Past it the sample fails (finish_reason 'failed', the error in its row) and the rest of the step goes on.")
