"""Agent settings on a run with no agent: an error naming them, unless each is at its default (a config that spells
one out is no different from one that leaves it out)."""

from __future__ import annotations

import pytest

from pdsr_sdk.errors import ConfigError
from pdsr_sdk.rollout.config import RolloutConfig
from pdsr_sdk.rollout.preflight import check_agent_settings


@pytest.mark.parametrize("agent", [{}, {"max_turns": 8, "env_timeout_s": 60, "tool_response_truncate_side": "middle",
                                        "max_env_turns": None}])
def test_agent_settings_at_their_defaults_pass_without_an_agent(agent):
    check_agent_settings(RolloutConfig(agent=agent))


@pytest.mark.parametrize("agent, named", [
    ({"max_turns": 3}, "agent.max_turns (--max-turns): "),
    ({"env_timeout_s": 5}, "agent.env_timeout_s (--agent-timeout): "),
    ({"max_env_turns": 2, "max_turns": 8}, "agent.max_env_turns: "),
])
def test_agent_settings_off_their_defaults_need_an_agent(agent, named):
    with pytest.raises(ConfigError, match="multi-turn settings, and this run is single-turn") as info:
        check_agent_settings(RolloutConfig(agent=agent))
    assert str(info.value).startswith(named), info.value
    check_agent_settings(RolloutConfig(agent={**agent, "function": "pkg.mod:run"}))   # with an agent they apply


def test_run_rollout_refuses_them_before_any_engine_starts(tmp_path):
    from pdsr_sdk.rollout.run import run_rollout

    config = RolloutConfig(agent={"max_tool_response_chars": 100}, output={"path": str(tmp_path / "o.parquet")},
                           engines=[{"name": "f0", "pool": "fast", "backend": "no_such.module:Engine"}])
    with pytest.raises(ConfigError, match=r"^agent\.max_tool_response_chars: multi-turn settings"):
        run_rollout(config)
    assert not (tmp_path / "o.parquet").exists()
