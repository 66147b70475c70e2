"""Fixtures of the CLI's bad-input and resume tests: a prompts file, a config on fake engines, and engines
that must not start."""

from __future__ import annotations


import pytest

from cli_checks import fake_rollout, write_jsonl


@pytest.fixture()
def prompts(tmp_path):
    return write_jsonl(tmp_path / "prompts.jsonl", [{"id": f"q{i}", "prompt": f"What is {i}+1?", "answer": str(i + 1)}
                                                    for i in range(5)])


@pytest.fixture()
def fake_run(tmp_path, tiny_model_dir):
    """A config running on fake engines (no vLLM): flags after it make a whole, fast ``pdsr rollout``."""
    return fake_rollout(tmp_path, tiny_model_dir)


@pytest.fixture()
def no_engines(monkeypatch):
    """Engines must not start: every case that takes this fixture fails before."""
    from pdsr_sdk.rollout.session import RolloutSession

    async def refuse(self, **_):
        raise AssertionError("engines started before the input was checked")

    monkeypatch.setattr(RolloutSession, "start", refuse)
