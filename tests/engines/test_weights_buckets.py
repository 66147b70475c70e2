"""update_weights in buckets (pdsr_sdk/engines/weights_buckets.py): a model bigger than the bucket goes to the
engines a bucket at a time, an iterator consumed lazily, each bucket checked before it loads; the engines end up
with the same weights as after a one-block update, and a bucketed update stopped part-way leaves a session that
refuses to generate until a whole update."""

from __future__ import annotations

import pytest

from support import requires_torch, requires_vllm, run_on
from pdsr_sdk.errors import DataValueError, RunError

pytestmark = requires_torch


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk.engines.weights_check import ModelWeights

    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    return policy, ModelWeights.read(tiny_model_dir)


def nbytes(t) -> int:
    return t.numel() * t.element_size()


def counted(pairs, taken: list):
    for pair in pairs:
        taken.append(pair[0])
        yield pair


def test_an_iterator_is_taken_a_bucket_at_a_time_into_blocks_of_the_bucket_size(model, tmp_path, monkeypatch):
    """Each bucket is handed on once the tensor after it is taken (never the whole iterator); the buckets partition
    the update in order; every block is the bucket's size, or one tensor's where it is bigger; an update that fits
    is one block of its own size (the one-block path)."""
    from pdsr_sdk.engines.weights_buckets import stage_update

    monkeypatch.setenv("PDSR_SHM_DIR", str(tmp_path))
    policy, ref = model
    sd = policy.state_dict()
    largest = max(nbytes(t) for t in sd.values())
    total = sum(nbytes(t) for t in sd.values())
    for bucket in (100, 3 * largest):
        taken: list[str] = []
        names, sizes = [], []
        for i, staged in enumerate(stage_update(counted(sd.items(), taken), ref, bucket_bytes=bucket)):
            assert staged.bucket.index == i
            if bucket == 100:   # one tensor a bucket: this one and the one after it have been taken, no more
                assert len(taken) == (i + 2 if not staged.bucket.last else len(sd))
            names += [n for n, _ in staged.items]
            sizes.append(staged.shared().size)
            staged.close()
        assert staged.bucket.last and names == [n for n in sd if n != "lm_head.weight"]
        assert max(sizes) <= max(bucket, largest) + 64 and len(sizes) >= total // max(bucket, largest)
    whole = list(stage_update(iter(sd.items()), ref, bucket_bytes=total))
    assert len(whole) == 1 and whole[0].bucket is None
    assert whole[0].shared().size >= total - nbytes(sd["lm_head.weight"])
    whole[0].close()


def test_a_bucket_kept_for_a_later_load_holds_its_tensors_as_they_were(model, tmp_path, monkeypatch):
    """StagedWeights.again() of a bucket (a staggered update's engines that load later): a block of its own, written
    at once, so the next bucket rewriting the session's block and the trainer changing its tensors leave it as it
    was; close() frees it; a closed bucket cannot be kept."""
    import torch

    from pdsr_sdk.engines.weights import WeightsBlock
    from pdsr_sdk.engines.weights_buckets import stage_update
    from pdsr_sdk.engines.weights_shm import read_block

    monkeypatch.setenv("PDSR_SHM_DIR", str(tmp_path))
    policy, ref = model
    sd = {k: v.clone() for k, v in policy.state_dict().items()}
    want = {k: v.clone() for k, v in sd.items()}
    block = WeightsBlock()
    kept = []
    for staged in stage_update(iter(sd.items()), ref, bucket_bytes=1 << 16, block=block):
        staged.shared()   # what the engines loading now read, in the session's block
        kept.append(staged.again())
        for _, t in staged.items:
            t.add_(1.0)   # the trainer's next step
        staged.close()
    assert len(kept) > 2 and [k.bucket.index for k in kept] == list(range(len(kept))) and kept[-1].last
    paths = {k.shared().path for k in kept}
    assert len(paths) == len(kept) and block.path not in paths
    for k in kept:
        shared = k.shared()
        for name, t in read_block(shared.path, shared.size, shared.entries):
            assert torch.equal(t, want[name]), name
    for k in kept:
        k.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [block.path.rsplit("/", 1)[-1]]
    with pytest.raises(ValueError, match="this bucket was closed"):
        staged.again()
    block.close()


def test_an_update_s_size_is_the_checkpoint_s_parameters_at_the_trainer_s_dtype(model):
    """update_bytes (a staggered update's check that a copy of a bucketed one fits): the checkpoint's parameters
    at the element size of the tensors sent, fp32 or bf16."""
    import torch

    from pdsr_sdk.engines.weights_buckets import stage_update, update_bytes

    policy, ref = model
    for dtype in (torch.float32, torch.bfloat16):
        sd = {k: v.to(dtype) for k, v in policy.state_dict().items() if k in ref.shapes}
        first = next(stage_update(iter(sd.items()), ref, bucket_bytes=1 << 16))
        assert update_bytes(ref, first) == sum(nbytes(t) for t in sd.values()) > 0
        first.close()


def test_bad_buckets_are_refused_before_they_load(model):
    """A state dict is checked whole before its first bucket; an iterator's bad shape or missing tensor is found
    at the bucket that has it (or the last), after the earlier ones were handed on, naming the parameter."""
    import torch

    from pdsr_sdk.engines.weights_buckets import stage_update

    policy, ref = model
    sd = dict(policy.state_dict())
    name = "model.layers.1.mlp.down_proj.weight"
    bad = {**sd, name: torch.zeros(3, 7)}
    with pytest.raises(DataValueError, match=rf"'{name}' has shape \[3, 7\]"):
        next(stage_update(bad, ref, bucket_bytes=100))
    parts = stage_update(iter(bad.items()), ref, bucket_bytes=100)
    handed = []
    with pytest.raises(DataValueError, match=rf"update_weights \(bucket \d+\): parameter '{name}' has shape"):
        for staged in parts:
            handed.append(staged.items[0][0])
    assert handed == list(sd)[:list(sd).index(name)]
    short = [(n, t) for n, t in sd.items() if n != "model.norm.weight"]
    with pytest.raises(DataValueError, match=r"1 parameter\(s\) .* missing: 'model\.norm\.weight'"):
        list(stage_update(iter(short), ref, bucket_bytes=100))
    with pytest.raises(DataValueError, match="bucket_bytes must be a positive int"):
        next(stage_update(sd, ref, bucket_bytes=0))


# ------------------------------------------------------------------------------- real engines
FIXED_IDS = [5, 17, 250, 3, 99, 42, 7, 600, 31, 8, 77, 500, 12, 64, 300, 9, 150, 21, 40, 2]


async def engine_logps(engine):
    """The engine's log-prob of every token of FIXED_IDS after the first (vLLM prompt log-probs)."""
    import uuid

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    out = None
    async for out in engine._llm.generate(TokensPrompt(prompt_token_ids=FIXED_IDS), params, f"lp-{uuid.uuid4().hex}"):
        pass
    return [step[tok].logprob for step, tok in zip(out.prompt_logprobs[1:], FIXED_IDS[1:])]


def torch_logps(policy):
    import torch

    with torch.no_grad():
        x = torch.tensor([FIXED_IDS])
        lp = torch.log_softmax(policy(x).logits.float(), -1)[0, :-1]
        return lp.gather(-1, x[0, 1:, None])[:, 0].tolist()


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_bucketed_updates_load_what_one_block_loads(engine_loop, vllm_pair, tiny_model_dir, model, tmp_path,
                                                    monkeypatch):
    """Both fp32 engines: after an update in buckets smaller than one tensor (an iterator) and in buckets of a few
    tensors (a state dict), their log-probs of a fixed sequence are those after a one-block update of the same
    weights (and the trainer's); every block written is at most the bucket (or one tensor); a bad tensor in the
    iterator's last bucket is a DataError saying the engines hold a partial update, after which step, resume and
    next_version are RunErrors until a whole update, which makes the engines right again."""
    import copy

    import torch

    import pdsr_sdk.engines.weights as weights_mod
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    monkeypatch.setenv("PDSR_SHM_DIR", str(tmp_path))
    blocks: list[int] = []
    write_block = weights_mod.write_block

    def recording(items, path=None, **kw):
        shared = write_block(items, path, **kw)
        blocks.append(shared.size)
        return shared

    monkeypatch.setattr(weights_mod, "write_block", recording)
    policy = copy.deepcopy(model[0])
    torch.manual_seed(3)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    new = torch_logps(policy)
    sd = policy.state_dict()
    largest = max(nbytes(t) for t in sd.values())
    few = 3 * largest
    name = "model.norm.weight"
    cfg = RolloutConfig(model=str(tiny_model_dir), batch_size=1, policy="baseline", sampling={"n": 1, "max_tokens": 4})

    async def scenario():
        got = {}
        async with RolloutSession(cfg, engines=vllm_pair) as session:
            got["old"] = [await engine_logps(e) for e in vllm_pair]
            await session.aupdate_weights(sd)
            got["one_block"] = [await engine_logps(e) for e in vllm_pair]
            got["one_block_sizes"] = list(blocks)
            for weights, bucket in ((iter(sd.items()), 100), (sd, few)):
                await session.aupdate_weights(tiny_model_dir)
                blocks.clear()
                await session.aupdate_weights(weights, bucket_bytes=bucket)
                got[bucket] = ([await engine_logps(e) for e in vllm_pair], list(blocks))
            await session.aupdate_weights(tiny_model_dir)
            bad = [*((n, t) for n, t in sd.items() if n != name), (name, torch.zeros(5))]
            with pytest.raises(DataValueError, match=rf"'{name}' has shape \[5\].*partial update"):
                await session.aupdate_weights(iter(bad), bucket_bytes=few)
            version = session.policy_version
            with pytest.raises(RunError, match="partial weight update"):
                await session.astep(["Hi"])
            with pytest.raises(RunError, match="partial weight update"):
                await session.anext_version()
            await session.apause("abort")
            with pytest.raises(RunError, match="partial weight update"):
                await session.aresume()
            assert await session.aupdate_weights(sd, bucket_bytes=few) == version + 1
            await session.aresume()
            got["after_partial"] = [await engine_logps(e) for e in vllm_pair]
            got["step"] = ((await session.astep(["Hi"])).policy_version, version + 1)
            await session.aupdate_weights(tiny_model_dir)    # the shared engines get their weights back
            got["restored"] = [await engine_logps(e) for e in vllm_pair]
        return got

    got = run_on(engine_loop, scenario(), timeout=600)
    for i in range(2):
        one = got["one_block"][i]
        assert (max(abs(a - b) for a, b in zip(one, new)) <= 1e-3
                and max(abs(a - b) for a, b in zip(one, got["old"][i])) > 0.05)
        for bucket in (100, few):
            assert got[bucket][0][i] == one
        assert got["after_partial"][i] == one
        assert got["restored"][i] == got["old"][i]
    assert got["one_block_sizes"] == [sum(-(-nbytes(t) // 64) * 64 for n, t in sd.items() if n != "lm_head.weight")]
    for bucket in (100, few):
        sizes = got[bucket][1]
        assert len(sizes) > 2 and max(sizes) <= max(bucket, largest) + 64
    assert got["step"][0] == got["step"][1]
