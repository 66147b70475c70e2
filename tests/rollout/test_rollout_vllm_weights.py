"""The session on real vLLM engines: ``update_weights`` into every engine, pause modes, the KV cache across an
update, sleep on the CPU build (the session's shared engines, tests/conftest.py)."""

from __future__ import annotations

import asyncio

import pytest

from support import WAIT_S, requires_vllm, run_on
from pdsr_sdk.rollout.config import RolloutConfig

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines start: 30-70 s


# ------------------------------------------------------------- update_weights (issue 13)
#: a fixed prompt + response whose per-token log-probs the engines and the trainer compare
FIXED_IDS = [5, 17, 250, 3, 99, 42, 7, 600, 31, 8, 77, 500, 12, 64, 300, 9, 150, 21, 40, 2]


async def engine_logps(engine, ids=FIXED_IDS):
    """The engine's log-prob of every token of ``ids`` after the first (vLLM prompt log-probs)."""
    import uuid

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    out = None
    async for out in engine._llm.generate(TokensPrompt(prompt_token_ids=ids), params, f"lp-{uuid.uuid4().hex}"):
        pass
    return [step[tok].logprob for step, tok in zip(out.prompt_logprobs[1:], ids[1:])]


def torch_logps(model, ids=FIXED_IDS):
    import torch

    with torch.no_grad():
        x = torch.tensor([ids])
        lp = torch.log_softmax(model(x).logits.float(), -1)[0, :-1]
        return lp.gather(-1, x[0, 1:, None])[:, 0].tolist()


def mean_abs(a, b):
    assert len(a) == len(b)
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)


def test_update_weights_reaches_every_engine_and_bumps_the_version(engine_loop, engines, tiny_model_dir, tmp_path,
                                                                   monkeypatch):
    """fp32 engines: after update_weights(state dict) both engines' log-probs of a fixed response equal
    the trainer's torch log-probs of the new weights (and not the old ones); segments after it carry
    version 1; an iterator of pairs of other weights works (rewritten into the session's one shared
    block, which is removed when the session closes); bad names/shapes are PdsrErrors naming the
    parameter (checked before anything changes, and again inside the engine process, with the engine's
    name); the model folder restores the old weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk.engines.weights import StagedWeights
    from pdsr_sdk.errors import DataError, EngineError
    from pdsr_sdk.rollout.session import RolloutSession

    cfg = RolloutConfig(model=str(tiny_model_dir), batch_size=2, policy="baseline",
                        sampling={"n": 2, "max_tokens": 24}, segments={"min_tokens": 8, "max_tokens": 16})
    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    old = torch_logps(policy)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    new = torch_logps(policy)
    prompts = ["What is 2 + 3?", {"id": "q", "messages": [{"role": "user", "content": "Hi"}], "ground_truth": "5"}]
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setenv("PDSR_SHM_DIR", str(shm))

    async def scenario():
        got = {}
        async with RolloutSession(cfg, engines=engines) as session:
            got["before"] = [await engine_logps(e) for e in engines]
            first = await session.astep(prompts)
            assert await session.aupdate_weights(policy.state_dict()) == 1
            got["after"] = [await engine_logps(e) for e in engines]
            second = await session.astep(iter(prompts))
            # bad input: nothing reaches the engines, the error names the parameter
            sd = policy.state_dict()
            with pytest.raises(DataError,
                               match=r"unknown parameter 'model\.layers\.0\.mlp\.up_proj\.weigth'.*did you mean"):
                await session.aupdate_weights({**sd, "model.layers.0.mlp.up_proj.weigth": sd["model.norm.weight"]})
            bad = dict(sd)
            bad["model.layers.1.self_attn.q_proj.weight"] = torch.zeros(3, 7)
            with pytest.raises(DataError, match=r"'model\.layers\.1\.self_attn\.q_proj\.weight' has shape \[3, 7\]"):
                await session.aupdate_weights(bad)
            # the engine process checks too (here bypassing the session's check): an EngineError with its name
            staged = StagedWeights(items=list(bad.items()))
            with pytest.raises(EngineError,
                               match=r"engine 'fast-0'.*'model\.layers\.1\.self_attn\.q_proj\.weight' has "
                                     r"shape") as info:
                await engines[0].update_weights(staged)
            staged.close()
            assert "Traceback" not in str(info.value)
            got["after_bad"] = await engine_logps(engines[0])
            assert session.policy_version == 1
            with torch.no_grad():
                for p in policy.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            got["new2"] = torch_logps(policy)
            assert await session.aupdate_weights(iter(policy.state_dict().items())) == 2
            got["after2"] = [await engine_logps(e) for e in engines]
            got["blocks"] = sorted(f.name for f in shm.iterdir())
            got["gpus"] = [await e.device_uuid() for e in engines]     # CPU engines: no CUDA IPC
            assert await session.aupdate_weights(tiny_model_dir) == 3   # a model folder: the original weights
            got["restored"] = [await engine_logps(e) for e in engines]
        got["blocks_after_close"] = list(shm.iterdir())
        return got, first, second

    got, first, second = run_on(engine_loop, scenario(), timeout=600)
    for before, after, after2, restored in zip(got["before"], got["after"], got["after2"], got["restored"]):
        assert mean_abs(before, old) <= 1e-3
        assert mean_abs(after, new) <= 1e-3 and mean_abs(after, old) > 0.05
        assert mean_abs(after2, got["new2"]) <= 1e-3 and mean_abs(after2, new) > 0.05
        assert mean_abs(restored, old) <= 1e-3
    assert len(got["blocks"]) == 1 and got["blocks"][0].startswith("pdsr-weights-")   # one block, reused
    assert got["blocks_after_close"] == []
    assert got["gpus"] == [None, None]
    assert got["after_bad"] == got["after"][0]    # the refused update changed nothing
    assert (first.policy_version, second.policy_version) == (0, 1)
    for result, version in ((first, 0), (second, 1)):
        assert result.table.num_rows == 4 and result.summary["samples"] == 4
        assert {seg.policy_version for s in result.samples for seg in s.segments} == {version}
        assert all(r == [version] for r in result.table.column("policy_versions").to_pylist())
    assert sorted(g.prompt_id for g in second.groups) == ["q", "s1-p0"]
    # the step as a trainer's padded batch (verl's layout): each row is the sample as the engines made it
    from pdsr_sdk.rollout.padded import trainer_batch

    with pytest.raises(DataError, match="sample s1-p0/[01] has no reward"):   # only 'q' has a ground truth
        trainer_batch(second, pad_token_id=-9)
    rewards = [sc.reward if sc.reward is not None else 0.0 for sc in second.scores]
    batch = trainer_batch(second, pad_token_id=-9, rewards=rewards, numpy=True)
    t = batch.tensors
    for i, s in enumerate(second.samples):
        row = t["input_ids"][i][t["attention_mask"][i] == 1].tolist()
        assert row == s.group.prompt_token_ids + s.token_ids and batch.non_tensors["uid"][i] == s.group.prompt_id
        assert t["rollout_log_probs"][i][:len(s.token_ids)].tolist() == pytest.approx(s.logprobs)
        assert set(t["token_versions"][i][:len(s.token_ids)].tolist()) == {1}
        assert t["token_level_scores"][i].tolist() == [0.0] * (len(s.token_ids) - 1) + [rewards[i]] + [0.0] * (
            t["responses"].shape[1] - len(s.token_ids))


# ------------------------------------------------------------------------------------ pause / sleep
MAX_TOKENS = 64


def pause_config(tiny_model_dir, segments=None):
    # greedy, EOS ignored: every sample has exactly MAX_TOKENS tokens, the same in every run (fp32 engines);
    # 3 prompts x 6 = 18 samples on 16 slots: two wait in the engines' queues
    return RolloutConfig(model=str(tiny_model_dir), policy="baseline",
                         sampling={"n": 6, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True},
                         segments=segments or {"min_tokens": 16, "max_tokens": 32})


PAUSE_PROMPTS = [{"id": "a", "prompt": "What is 2 + 3?"}, {"id": "b", "prompt": "Name a color."},
                 {"id": "c", "prompt": "Count to five."}]


def tokens_of(result):
    return {s.key: list(s.token_ids) for s in result.samples}


async def until(pred, timeout=WAIT_S):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.005)


def assert_whole(result, reference):
    assert sorted(s.key for s in result.samples) == sorted(reference)
    for s in result.samples:
        assert s.finish_reason == "length" and s.num_generated == MAX_TOKENS == len(s.token_ids) == len(s.logprobs)
        assert s.token_ids == reference[s.key], s.key
        assert sum(seg.num_tokens for seg in s.segments) == MAX_TOKENS
    assert result.table.num_rows == 18


async def next_token(engine, ids, salt):
    """Greedy next token of ``ids`` on ``engine`` with prefix-cache salt ``salt``: (token, its log-prob, how many
    context tokens the engine found in its prefix cache)."""
    import uuid

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=0)
    out = None
    async for out in engine._llm.generate(TokensPrompt(prompt_token_ids=ids, cache_salt=salt), params,
                                          f"next-{uuid.uuid4().hex}"):
        pass
    comp = out.outputs[0]
    tok = comp.token_ids[0]
    return tok, comp.logprobs[0][tok].logprob, out.num_cached_tokens or 0


def test_kv_on_update_keep_goes_on_from_the_cached_kv_and_recompute_resets_it(engine_loop, engines, tiny_model_dir):
    """fp32 engine, a 300-token context computed under the original weights, then new weights: loaded with
    ``reset_prefix_cache=False`` (kv_on_update: keep) the same context finds its whole blocks cached and its next
    token's log-prob is not the new weights' (it attends to KV of the old ones); a request with another salt
    (a sample started under another version) finds nothing and gets exactly the trainer's log-prob of the new
    weights; after ``reset_prefix_cache`` (recompute) so does the first request's salt."""
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk.engines.weights import stage_weights

    engine = engines[0]
    ids = [3 + (i * 37) % 1000 for i in range(300)]
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    torch.manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)

    def new_logp(tok):
        return torch_logps(model, ids + [tok])[-1]

    async def scenario():
        got = {}
        await engine.reset_prefix_cache()
        got["old"] = await next_token(engine, ids, "pdsr-v0")
        staged = stage_weights(model.state_dict())
        try:
            await engine.update_weights(staged, reset_prefix_cache=False)
        finally:
            staged.close()
        got["keep"] = await next_token(engine, ids, "pdsr-v0")
        got["other_salt"] = await next_token(engine, ids, "pdsr-v1")
        await engine.reset_prefix_cache()
        got["recompute"] = await next_token(engine, ids, "pdsr-v0")
        original = stage_weights(str(tiny_model_dir))
        await engine.update_weights(original)   # back to the weights the other tests expect
        got["restored"] = await next_token(engine, ids, "pdsr-v0")
        return got

    got = run_on(engine_loop, scenario(), timeout=300)
    assert got["old"][2] == 0
    assert got["keep"][2] > 0                                   # whole blocks of the old context, reused
    assert got["other_salt"][2] == 0 and got["recompute"][2] == 0
    for key in ("other_salt", "recompute"):
        tok, lp, _ = got[key]
        assert lp == pytest.approx(new_logp(tok), abs=2e-3), key
    tok, lp, _ = got["keep"]
    assert abs(lp - new_logp(tok)) > 2e-2   # the old weights' KV shows
    assert got["restored"][:2] == pytest.approx(got["old"][:2], abs=1e-4) and got["restored"][2] == 0


def test_every_pause_mode_keeps_every_sample_and_its_tokens(engine_loop, engines, tiny_model_dir):
    """A step runs as a task; mid-step the trainer pauses, loads weights (the model folder again: the
    greedy tokens must then equal an uninterrupted run's, token for token) and resumes. abort: the running
    samples come back held with their tokens and continue after the update in new segments of version 1;
    wait: the running samples finish, nothing else starts while paused; keep: the requests stay in the
    engines, frozen (no token while paused), and go on; their segment is split at the version change."""
    from pdsr_sdk.rollout.session import RolloutSession

    async def scenario():
        out = {}
        # one segment a sample: the 16 running samples hold their slots until they end, so the moment all 16
        # run with a few tokens each lasts ~60 tokens, whatever the load (with shorter segments a segment's end
        # gave its slot to a queued sample, and a loaded machine could miss every such moment)
        whole = {"min_tokens": MAX_TOKENS, "max_tokens": MAX_TOKENS}
        async with RolloutSession(pause_config(tiny_model_dir, whole), engines=engines) as session:
            reference = await session.astep(PAUSE_PROMPTS)
            sched = session.scheduler
            ref = tokens_of(reference)
            for mode in ("abort", "wait", "keep"):
                task = asyncio.ensure_future(session.astep(PAUSE_PROMPTS))
                await until(lambda: sched.in_flight == 16 and all(s.num_generated >= 4 for s in sched.running()))
                running = set(sched.running())
                await session.apause(mode)
                assert session.paused == mode
                await asyncio.sleep(0.1)          # let what the engines sent before the pause arrive
                info = {"running": running, "held": set(sched.held()), "in_flight": sched.in_flight,
                        "generated": {s: s.num_generated for s in running}}
                await asyncio.sleep(0.3)          # nothing may move while paused
                info["generated_later"] = {s: s.num_generated for s in running}
                info["launched_while_paused"] = sched.in_flight
                version = await session.aupdate_weights(tiny_model_dir)
                await session.aresume()
                info["result"] = result = await asyncio.wait_for(task, 120)
                info["version"] = version
                assert_whole(result, ref)
                out[mode] = info
        return out

    out = run_on(engine_loop, scenario(), timeout=300)

    abort = out["abort"]
    assert abort["in_flight"] == 0 and abort["held"] == abort["running"] and len(abort["held"]) == 16
    assert abort["generated_later"] == abort["generated"]
    for s in abort["held"]:
        cut = [i for i, seg in enumerate(s.segments) if seg.end_reason == "pause"]
        assert len(cut) == 1 and s.segments[cut[0]].num_tokens > 0
        assert {seg.policy_version for seg in s.segments[:cut[0] + 1]} == {abort["version"] - 1}
        assert {seg.policy_version for seg in s.segments[cut[0] + 1:]} == {abort["version"]}

    wait = out["wait"]
    assert wait["in_flight"] == 0 and not wait["held"]
    assert all(s.finished for s in wait["running"])           # they ran to their end before pause returned
    others = [s for s in wait["result"].samples if s not in wait["running"]]
    assert len(others) == 2 and all(seg.policy_version == wait["version"] for s in others for seg in s.segments)

    keep = out["keep"]
    assert keep["in_flight"] == 16 and keep["launched_while_paused"] == 16 and not keep["held"]
    assert keep["generated_later"] == keep["generated"]      # frozen inside the engines
    split = 0
    for s in keep["running"]:
        versions = [seg.policy_version for seg in s.segments]
        assert versions == sorted(versions) and versions[-1] == keep["version"]
        cut = [seg for seg in s.segments if seg.end_reason == "pause"]
        split += len(cut)
        if cut:
            assert cut[0].policy_version == keep["version"] - 1 and cut[0].num_tokens > 0
    assert split >= 1
    assert [out[m]["result"].policy_version for m in ("abort", "wait", "keep")] == [0, 1, 2]


def test_sleep_on_the_cpu_build_says_it_cannot_free_memory(engine_loop, engines, tiny_model_dir):
    from pdsr_sdk.errors import UnsupportedError
    from pdsr_sdk.rollout.session import RolloutSession

    async def scenario():
        async with RolloutSession(pause_config(tiny_model_dir), engines=engines) as session:
            with pytest.raises(UnsupportedError, match=r"sleep: engine memory cannot be freed here \(fast-0: vLLM's "
                                                       r"CPU build cannot free engine memory .*heavy-0: ") as info:
                await session.asleep()
            assert isinstance(info.value, NotImplementedError)
            await session.awake()                      # never asleep: nothing
            result = await session.astep(PAUSE_PROMPTS[:1])  # the engines still serve
            return result

    result = run_on(engine_loop, scenario(), timeout=WAIT_S)
    assert result.table.num_rows == 6
