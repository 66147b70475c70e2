"""update_weights refuses weights holding a NaN or an infinity, naming the parameter, before anything is loaded (a
diverged trainer's update would otherwise make the engines generate garbage): a state dict, an iterator's bucket,
a model folder."""

from __future__ import annotations

import pytest

from support import requires_torch, requires_vllm, run_on
from pdsr_sdk.errors import DataValueError

pytestmark = requires_torch

NAME = "model.layers.1.mlp.up_proj.weight"


def spoiled(sd, value, dtype=None, at=(3, 5)):
    out = {n: (t.to(dtype) if dtype is not None else t).clone() for n, t in sd.items()}
    out[NAME][at] = value
    return out


@pytest.mark.parametrize("value,word", [(float("nan"), "NaN"), (float("inf"), "infinite"), (-float("inf"), "infinite")])
@pytest.mark.parametrize("dtype", [None, "bfloat16", "float16"])
def test_a_state_dict_with_a_non_finite_value_is_refused_naming_the_parameter(tiny_weights, value, word, dtype):
    """One NaN, +inf or -inf anywhere in one tensor (fp32, bf16, fp16): a DataValueError naming it, in one bucket or
    before the first of several; the same weights without it stage."""
    import torch

    from pdsr_sdk.engines.weights_buckets import stage_update

    sd, ref = tiny_weights
    dt = getattr(torch, dtype) if dtype else None
    for bucket in (1 << 30, 100):
        with pytest.raises(DataValueError, match=rf"parameter '{NAME}' holds {word} values"):
            next(stage_update(spoiled(sd, value, dt), ref, bucket_bytes=bucket))
    clean = next(stage_update(spoiled(sd, 0.5, dt), ref))
    assert len(clean.items) == len(sd) - 1     # all but the tied lm_head
    clean.close()


def test_an_iterator_is_refused_at_the_bucket_holding_the_non_finite_tensor(tiny_weights):
    from pdsr_sdk.engines.weights_buckets import stage_update

    sd, ref = tiny_weights
    handed = []
    with pytest.raises(DataValueError, match=rf"update_weights \(bucket \d+\): parameter '{NAME}' holds NaN"):
        for staged in stage_update(iter(spoiled(sd, float("nan")).items()), ref, bucket_bytes=100):
            handed += [n for n, _ in staged.items]
    assert handed == list(sd)[:list(sd).index(NAME)]


def test_a_model_folder_with_a_non_finite_tensor_is_refused(tiny_weights, tiny_model_dir, tmp_path):
    import shutil

    from safetensors.torch import save_file

    from pdsr_sdk.engines.weights import stage_weights

    sd, ref = tiny_weights
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    tensors = {n: t for n, t in spoiled(sd, float("inf")).items() if n != "lm_head.weight"}
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(DataValueError, match=rf"update_weights\({folder}\): parameter '{NAME}' holds infinite"):
        stage_weights(folder, ref)
    save_file({**tensors, NAME: sd[NAME]}, str(folder / "model.safetensors"))
    assert stage_weights(folder, ref).folder == str(folder.resolve())


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_the_engines_keep_their_weights_when_an_update_holds_a_nan(engine_loop, vllm_pair, tiny_model_dir,
                                                                  tiny_weights):
    """A state dict with a NaN, in buckets: refused before the first loads; the engines' greedy continuation is
    unchanged and the session still generates (no partial update)."""
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    sd, _ = tiny_weights
    cfg = RolloutConfig(model=str(tiny_model_dir), batch_size=1, policy="baseline",
                        sampling={"n": 1, "max_tokens": 8, "temperature": 0.0})

    async def go():
        async with RolloutSession(cfg, engines=vllm_pair) as session:
            before = (await session.astep(["What is 2 + 3?"])).samples[0].token_ids
            with pytest.raises(DataValueError, match=rf"parameter '{NAME}' holds NaN values"):
                await session.aupdate_weights(spoiled(sd, float("nan")), bucket_bytes=1 << 20)
            assert session.policy_version == 0
            after = (await session.astep(["What is 2 + 3?"])).samples[0].token_ids
        return before, after

    before, after = run_on(engine_loop, go(), timeout=600)
    assert before == after and before
