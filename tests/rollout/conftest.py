"""Fixtures of the rollout tests on the session's real engines (tests/conftest.py's ``vllm_pair``)."""

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
