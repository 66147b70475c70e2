"""The model folder of a Ray engine: a relative path is made absolute where the orchestrator runs (an actor's
working directory is its node's), and an actor whose node lacks the folder says so before vLLM starts (vLLM
takes a path it cannot find for a hub repository id). No cluster: the actor class is driven in this process."""

from __future__ import annotations

import asyncio
import re

from support import requires_vllm
from pdsr_sdk.rollout.config import EngineSpec


def _spec() -> EngineSpec:
    return EngineSpec(name="r", pool="fast", backend="ray", max_model_len=256, max_num_seqs=4)


def test_a_relative_model_path_goes_to_the_actor_absolute(tmp_path, monkeypatch):
    from pdsr_sdk.engines.ray_engine import RayEngine

    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "tok").mkdir()
    monkeypatch.chdir(tmp_path)
    engine = RayEngine.from_spec(_spec(), model="models/m", tokenizer="./tok")
    assert engine.model == str(tmp_path / "models" / "m") and engine.tokenizer == str(tmp_path / "tok")
    # what does not exist here is not a path of this machine (a hub id): it goes as given
    hub = RayEngine.from_spec(_spec(), model="Qwen/Qwen2.5-0.5B")
    assert hub.model == "Qwen/Qwen2.5-0.5B" and hub.tokenizer is None


@requires_vllm
def test_an_actor_whose_node_lacks_the_model_folder_says_so_before_vllm_starts(tmp_path):
    from pdsr_sdk.engines.ray_actor import EngineActor

    empty = tmp_path / "half-copied"
    empty.mkdir()
    for folder, what in ((tmp_path / "gone", "does not exist"), (empty, r"is not a model folder \(no config.json\)")):
        actor = EngineActor(_spec(), str(folder), None, 0, "processed_logprobs")
        err = asyncio.run(actor.start())
        assert err is not None and err.remote_traceback is None
        assert err.message.startswith(f"the model folder {folder} ")
        assert re.search(what, err.message), err.message
        assert "on this node; every node needs the model at the same path" in err.message
        assert "Model weights" in err.message
