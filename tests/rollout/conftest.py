"""Fixtures of the rollout tests: the session's real engines (tests/conftest.py's ``vllm_pair``), replay data, and
``session.serve`` on fake engines with an ``openai`` client."""

from __future__ import annotations

import pytest

from workloads import write_replay_prompts


@pytest.fixture()
def engines(vllm_pair):
    """The session's two engines (tests/conftest.py: fast-0 and heavy-0, max_model_len 1024)."""
    return vllm_pair


@pytest.fixture()
def replay_data(tmp_path):
    return write_replay_prompts(tmp_path / "prompts.jsonl")


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    """``session.serve`` on fake engines (tests/turn_fakes.py) for the module: (session, openai client, base URL)."""
    pytest.importorskip("openai")
    from serve_client import serving

    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", sampling={"max_tokens": 64},
                        agent={"env_timeout_s": 30},
                        engines=[{"name": "f0", "pool": "fast", "backend": "turn_fakes:TurnEngine",
                                  "max_model_len": 256, "max_num_seqs": 4}])
    with RolloutSession(cfg) as session, serving(session, model_name="tiny") as (client, base):
        yield session, client, base
