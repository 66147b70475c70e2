"""Weights staging for the SDK's weight updates (docs/sdk-weights.md): checked against the model, written once to
shared memory (or a session's kept block), CPU tensors through the block, CUDA IPC handles opened in another
process and refused by an engine on another device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT, WAIT_S, requires_torch
from pdsr_sdk.errors import DataError, DataValueError


@requires_torch
def test_weights_are_checked_against_the_model_and_written_once_to_shared_memory(tiny_model_dir):
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk.engines.weights import WeightsBlock, stage_weights
    from pdsr_sdk.engines.weights_check import ModelWeights
    from pdsr_sdk.engines.weights_shm import read_block, write_block, write_buffer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.bfloat16)
    sd = model.state_dict()
    ref = ModelWeights.read(tiny_model_dir)
    assert ref.tied_embeddings and "lm_head.weight" in sd and "lm_head.weight" not in ref.shapes

    staged = stage_weights(sd, ref)            # the tied head is left out (vLLM skips it)
    assert [n for n, _ in staged.items] == [n for n in sd if n != "lm_head.weight"]
    try:
        block = staged.shared()
        assert Path(block.path).exists() and staged.shared() is block     # written once
        back = dict(read_block(block.path, block.size, block.entries))
        assert back.keys() == ref.shapes.keys()
        assert all(back[n].dtype == torch.bfloat16 and torch.equal(back[n], sd[n]) for n in back)
        raw = np.fromfile(block.path, dtype=np.uint8)        # as Ray's object store hands it over
        raw.flags.writeable = False
        copy = write_buffer(raw, block.entries)
        try:
            again = dict(read_block(copy.path, copy.size, copy.entries))
            assert all(torch.equal(again[n], sd[n]) for n in again)
        finally:
            os.unlink(copy.path)
    finally:
        staged.close()
    assert not Path(block.path).exists()
    forgotten = stage_weights(sd, ref)          # never closed: the block goes with the object
    path = forgotten.shared().path
    del forgotten
    assert not Path(path).exists()
    assert stage_weights(iter(sd.items()), ref).items is not None       # an iterator of pairs

    name = "model.layers.0.self_attn.q_proj.weight"
    with pytest.raises(DataValueError,
                       match=rf"unknown parameter 'model.layers.0.self_attn.q_proj.weights'.*did you mean '{name}'"):
        stage_weights({**sd, name + "s": sd[name]}, ref)
    with pytest.raises(DataError, match=rf"parameter '{name}' has shape \[2, 2\]; .* expects \[256, 256\]"):
        stage_weights({**sd, name: torch.zeros(2, 2)}, ref)
    with pytest.raises(DataError, match=rf"1 parameter\(s\) .* missing: '{name}'"):
        stage_weights({k: v for k, v in sd.items() if k != name}, ref)
    with pytest.raises(DataError, match=r"item 0 is not a \(name, tensor\) pair"):
        stage_weights([3], ref)
    with pytest.raises(DataError, match="not a model folder"):
        stage_weights(str(tiny_model_dir / "nowhere"), ref)
    assert stage_weights(tiny_model_dir, ref).folder == str(Path(tiny_model_dir).resolve())

    # a block kept across updates (a session's): rewritten in place, kept by close(), freed by its owner
    kept = WeightsBlock()
    first = stage_weights(sd, ref, block=kept)
    assert first.shared().path == kept.path
    first.close()
    assert Path(kept.path).exists()
    halved = {n: t / 2 for n, t in sd.items()}
    second = stage_weights(halved, ref, block=kept)
    back = dict(read_block(kept.path, second.shared().size, second.shared().entries))
    assert all(torch.equal(back[n], halved[n]) for n in back)
    second.close()
    other = write_block([("x", torch.ones(3))], kept.path)      # another layout: a block of its own size
    assert other.path == kept.path and os.path.getsize(kept.path) == other.size == 64
    kept.close()
    assert not Path(kept.path).exists()


@requires_torch
def test_cpu_weights_take_the_shared_block_and_a_worker_refuses_ipc_weights_of_another_gpu(tiny_model_dir):
    """CUDA IPC is chosen only for an engine on the GPU the tensors sit on; CPU tensors always travel
    through the shared block, and an engine handed IPC handles of another device says so (as data)."""
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk.engines.vllm_worker import PdsrWorkerExtension
    from pdsr_sdk.engines.weights import stage_weights
    from pdsr_sdk.engines.weights_check import ModelWeights
    from pdsr_sdk.engines.weights_shm import SharedWeights

    sd = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).state_dict()
    ref = ModelWeights.read(tiny_model_dir)
    staged = stage_weights(sd, ref)
    try:
        assert staged.cuda_uuid is None
        assert isinstance(staged.local("GPU-0000"), SharedWeights) and isinstance(staged.local(None), SharedWeights)
    finally:
        staged.close()

    worker = PdsrWorkerExtension()
    worker.device = torch.device("cpu")
    worker._pdsr_reference_weights = ref
    assert worker.pdsr_device_uuid() is None
    err = worker.pdsr_load_weights({"kind": "cuda_ipc", "device_uuid": "GPU-0000", "names": [], "shapes": [],
                                    "handles": b""})
    assert err is not None and err["message"] == ("the new weights are on GPU GPU-0000, shared by CUDA IPC, but "
                                                  "this engine runs on the CPU")


CUDA_IPC_READER = """
import json, pickle, sys
from pdsr_sdk.engines.weights_cuda import open_cuda_tensors
message = pickle.load(sys.stdin.buffer)
print(json.dumps({n: float(t.double().sum()) for n, t in open_cuda_tensors(message, 0)}))
"""


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.cuda
@pytest.mark.skipif(not has_cuda(), reason="needs a CUDA device (CUDA IPC)")
def test_cuda_ipc_weights_open_in_another_process():
    """Tensors on a GPU, shared by handle, read by another process on the same GPU (what a colocated
    engine does): same values, and a non-contiguous tensor shared through its contiguous copy."""
    import pickle

    import torch

    from pdsr_sdk.engines.weights import StagedWeights
    from pdsr_sdk.engines.weights_cuda import CudaIpcWeights

    a = torch.arange(12.0, device="cuda").view(3, 4)
    b = torch.randn(6, 5, device="cuda", dtype=torch.bfloat16).t()     # not contiguous
    staged = StagedWeights(items=[("a", a), ("b", b)])
    try:
        assert staged.cuda_uuid == str(torch.cuda.get_device_properties(0).uuid)
        ipc = staged.local(staged.cuda_uuid)
        assert isinstance(ipc, CudaIpcWeights) and ipc.shapes == ((3, 4), (5, 6))
        out = subprocess.run([sys.executable, "-c", CUDA_IPC_READER], input=pickle.dumps(ipc.message()),
                             capture_output=True, cwd=ROOT, timeout=WAIT_S)
        assert out.returncode == 0, out.stderr.decode()
        sums = json.loads(out.stdout.decode().strip().splitlines()[-1])
        assert sums == {"a": 66.0, "b": float(b.double().sum())}
    finally:
        staged.close()
