"""What a trainer's state dict may hold for ``update_weights`` beyond names and shapes (the staging the session does
before anything reaches an engine; names and shapes: tests/rollout/test_sdk_weights.py, the engines' loads:
tests/rollout/test_rollout_vllm_weights.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import requires_torch
from pdsr_sdk.errors import DataValueError

pytestmark = requires_torch

NAME = "model.layers.0.self_attn.q_proj.weight"


def test_floating_point_tensors_of_any_width_are_taken(tiny_weights):
    """bf16, fp16 and fp64 tensors for the checkpoint's fp32 parameters are staged as given (the engine converts
    them on load)."""
    import torch

    from pdsr_sdk.engines.weights import stage_weights

    sd, ref = tiny_weights
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        staged = stage_weights({n: t.to(dtype) for n, t in sd.items()}, ref)
        assert {t.dtype for _, t in staged.items} == {dtype}
        staged.close()


def test_an_integer_or_bool_tensor_for_a_floating_point_parameter_is_refused_naming_it(tiny_weights):
    """An int or bool tensor used to be taken and loaded as its values converted: the engines then sampled from
    nonsense weights, silently. Now it is a DataValueError naming the parameter, its dtype and the checkpoint's."""
    import torch

    from pdsr_sdk.engines.weights import stage_weights

    sd, ref = tiny_weights
    assert ref.shapes[NAME][1] == "F32"
    for bad, shown in ((sd[NAME].long(), "int64"), (sd[NAME] > 0, "bool"), (sd[NAME].to(torch.int8), "int8")):
        with pytest.raises(DataValueError, match=rf"update_weights: parameter '{NAME}' is {shown}; the model in .* "
                                                 rf"holds it as F32 \(floating point\)"):
            stage_weights({**sd, NAME: bad}, ref)


def test_a_meta_tensor_is_refused_naming_it(tiny_weights):
    """A meta tensor (no data) used to fail inside the engine's copy with torch's message and no parameter name."""
    import torch

    from pdsr_sdk.engines.weights import stage_weights

    sd, ref = tiny_weights
    with pytest.raises(DataValueError, match=rf"parameter '{NAME}' is a meta tensor: it has no data"):
        stage_weights({**sd, NAME: torch.empty_like(sd[NAME], device="meta")}, ref)


def test_a_dtensor_shard_is_refused_saying_how_to_gather_full_tensors(tiny_weights, tmp_path):
    """An FSDP2 trainer's ``model.state_dict()`` holds DTensors: their shapes are the full ones, so the shape check
    passed and the copy failed inside the engine with torch's "mixed torch.Tensor and DTensor". Now it is a
    DataValueError naming the parameter and the call that gathers full tensors (a one-process gloo group here)."""
    import torch
    import torch.distributed as dist

    from pdsr_sdk.engines.weights import stage_weights

    sd, ref = tiny_weights
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor

        shard = distribute_tensor(sd[NAME].clone(), DeviceMesh("cpu", [0]), [Shard(0)])
        assert tuple(shard.shape) == tuple(sd[NAME].shape)
        with pytest.raises(DataValueError, match=rf"parameter '{NAME}' is a DTensor \(sharded: FSDP2 or tensor "
                                                 rf"parallelism\); give full tensors: .*get_model_state_dict\(model, "
                                                 rf"options=StateDictOptions\(full_state_dict=True"):
            stage_weights({**sd, NAME: shard}, ref)
        staged = stage_weights({**sd, NAME: shard.full_tensor()}, ref)   # gathered: taken
        assert torch.equal(dict(staged.items)[NAME], sd[NAME])
        staged.close()
    finally:
        dist.destroy_process_group()


def test_a_head_that_differs_from_the_tied_embedding_is_refused(tiny_weights, tmp_path):
    """The tiny model ties its LM head to its embedding: the engines skip a given ``lm_head.weight`` and use the
    embedding. A trainer whose head is not tied to it (untied on loading, or by its sharding) used to have its head
    dropped without a word, and the engines sampled from another model than the trainer's (log-probs 5.7 nats off
    on a fixed sequence). Now it is a DataValueError naming both tensors: in a state dict, an iterator whose head
    comes buckets after the embedding, and a model folder. The same values (the tied tensor, a copy, another
    layout) are taken."""
    import torch
    from safetensors.torch import save_file

    from pdsr_sdk.engines.weights import stage_weights
    from pdsr_sdk.engines.weights_buckets import stage_update

    sd, ref = tiny_weights
    embed = sd["model.embed_tokens.weight"]
    assert (ref.tied_embeddings and "lm_head.weight" not in ref.shapes
            and sd["lm_head.weight"].data_ptr() == embed.data_ptr())
    untied = embed + 1e-3 * torch.randn_like(embed)
    said = r"'lm_head\.weight' differs from 'model\.embed_tokens\.weight'.*ties them"
    for head in (untied, embed[:1000], embed.to(torch.bfloat16)):
        with pytest.raises(DataValueError, match=said):
            stage_weights({**sd, "lm_head.weight": head}, ref)
    with pytest.raises(DataValueError, match=r"update_weights \(bucket \d+\): .*" + said):
        for staged in stage_update(iter({**sd, "lm_head.weight": untied}.items()), ref, bucket_bytes=1 << 16):
            staged.close()
    for head in (embed, embed.clone(), embed.t().contiguous().t()):
        for staged in stage_update(iter({**sd, "lm_head.weight": head}.items()), ref, bucket_bytes=1 << 16):
            staged.close()
        stage_weights({**sd, "lm_head.weight": head}, ref).close()
    folder = tmp_path / "untied"
    folder.mkdir()
    for f in Path(ref.folder).iterdir():
        if f.suffix != ".safetensors":
            (folder / f.name).write_bytes(f.read_bytes())
    save_file({**{n: t.contiguous() for n, t in sd.items() if n != "lm_head.weight"}, "lm_head.weight": untied},
              str(folder / "model.safetensors"))
    with pytest.raises(DataValueError, match=said):
        stage_weights(folder, ref)
