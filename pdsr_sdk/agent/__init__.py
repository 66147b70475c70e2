"""Multi-turn rollouts: an agent function per sample, token-exact trajectories (see docs/agents.md).

``async def run(agent)`` gets an :class:`AgentContext`; ``await agent.generate()`` is a model turn and
``agent.append(messages or ids)`` what the environment adds. ``pdsr rollout --agent pkg.mod:run`` and
``RolloutSession.step(prompts, agent=run)`` run it.
"""

from pdsr_sdk.agent.config import AgentConfig
from pdsr_sdk.agent.context import AgentContext, AgentDone, AgentError, TurnResult
from pdsr_sdk.agent.render import environment_ids
from pdsr_sdk.agent.runner import AgentOutcome, AgentRunner, load_agent
from pdsr_sdk.agent.tools import ToolCall, parse_tool_calls, tool_parser_names

__all__ = ["AgentConfig", "AgentContext", "AgentDone", "AgentError", "AgentOutcome", "AgentRunner", "ToolCall",
           "TurnResult", "environment_ids", "load_agent", "parse_tool_calls", "tool_parser_names"]
