"""An agent function that cannot be loaded is an error naming where it was given: the config key and flag
(agent.function, --agent) for a run, the argument for the SDK, before any engine starts."""

from __future__ import annotations

import sys

import pytest

from cli_checks import failed, invoke
from pdsr_sdk.errors import ConfigError
from support import requires_torch


@pytest.fixture
def user_pkg(tmp_path, monkeypatch):
    (tmp_path / "pdsr_walk_pkg").mkdir()
    (tmp_path / "pdsr_walk_pkg" / "__init__.py").write_text("")
    (tmp_path / "pdsr_walk_pkg" / "agents.py").write_text(
        "def run(agent):\n    return 1.0\n"
        "async def bare():\n    return 1.0\n"
        "async def two(agent, env):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("pdsr_walk_pkg", "pdsr_walk_pkg.agents"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


@pytest.mark.parametrize("given, says", [
    ("pdsr_walk_pkg.nomod:run", "cannot import module 'pdsr_walk_pkg.nomod' (from 'pdsr_walk_pkg.nomod:run')"),
    ("pdsr_walk_pkg.agents:nope", "module 'pdsr_walk_pkg.agents' has no attribute 'nope'"),
    ("pdsr_walk_pkg.agents", "'pdsr_walk_pkg.agents' is a module, not an agent"),
    ("pdsr_walk_pkg.agents:run", "'pdsr_walk_pkg.agents:run' must be an `async def run(agent)` function"),
    # these started the engines and ran every first turn, then failed each sample with the call's TypeError
    ("pdsr_walk_pkg.agents:bare", "'pdsr_walk_pkg.agents:bare' must take the agent context as its one argument "
                                  "(`async def run(agent)`): too many positional arguments"),
    ("pdsr_walk_pkg.agents:two", "'pdsr_walk_pkg.agents:two' must take the agent context as its one argument "
                                 "(`async def run(agent)`): missing a required argument: 'env'"),
])
def test_a_bad_agent_flag_names_the_flag_and_key(user_pkg, tiny_model_dir, given, says):
    out = user_pkg / "r.parquet"
    failed(invoke("rollout", "--agent", given, "--model", tiny_model_dir, "--out", out),
           f"agent.function (--agent): {says}")
    assert not out.exists()


@requires_torch
def test_the_sdk_names_the_argument(user_pkg, tiny_model_dir):
    from pdsr_sdk.rollout.session import RolloutSession
    from test_agent_session import config

    with pytest.raises(ConfigError, match=r"^RolloutSession\(agent=\.\.\.\): 'pdsr_walk_pkg\.agents:run' must be"):
        RolloutSession(config(tiny_model_dir), agent="pdsr_walk_pkg.agents:run")
    cfg = config(tiny_model_dir, agent={"function": "pdsr_walk_pkg.nomod:run"})
    with pytest.raises(ConfigError, match=r"^agent\.function \(--agent\): cannot import module 'pdsr_walk_pkg\.nomod'"):
        RolloutSession(cfg)
    with RolloutSession(config(tiny_model_dir)) as session:
        with pytest.raises(ConfigError, match=r"^step\(agent=\.\.\.\): module 'pdsr_walk_pkg\.agents' has no "):
            session.step([{"prompt": "2+2?"}], agent="pdsr_walk_pkg.agents:nope")
