"""``pdsr rollout`` on real vLLM engines (CPU build, tiny model).

Two engines (fast-0 on core 0, heavy-0 on core 1) are started once for the
module and shared by every test through one background event loop.
"""

from __future__ import annotations

import asyncio

import pyarrow.parquet as pq
import pytest

from support import WAIT_S, requires_vllm, run_on
from pdsr_sdk.config import load_config
from pdsr_sdk.rollout.config import RolloutConfig
from workloads import LENGTHS, write_replay_prompts

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines start: 30-70 s



@pytest.fixture()
def engines(vllm_pair):
    """The session's two engines (tests/conftest.py)."""
    return vllm_pair


@pytest.fixture()
def replay_data(tmp_path):
    return write_replay_prompts(tmp_path / "prompts.jsonl")


def rollout(engine_loop, engines, tiny_model_dir, tmp_path, data, policy, settings=None, **over):
    from pdsr_sdk.rollout.run import run_rollout_async

    overrides = {
        "model": str(tiny_model_dir), "data.path": str(data), "data.target_lengths_column": "lengths",
        "sampling.ignore_eos": True, "sampling.n": 4, "sampling.max_tokens": 256, "batch_size": 5,
        "policy": policy, "output.path": str(tmp_path / f"{policy}.parquet"),
        "segments.min_tokens": 16, "segments.max_tokens": 64,
        **over,
    }
    cfg = load_config(RolloutConfig, None, overrides, base={"policy_settings": {policy: settings or {}}})
    summary = run_on(engine_loop, run_rollout_async(cfg, engines=engines))
    return summary, pq.read_table(cfg.output.path).to_pylist()


def by_key(rows):
    return {(r["prompt_id"], r["sample_index"]): r for r in rows}


@pytest.mark.parametrize("policy", ["baseline", "v1", "v2", "v2.5", "lpt"])
def test_every_policy_writes_b_x_n_consistent_samples(policy, engine_loop, engines, tiny_model_dir, tmp_path,
                                                     replay_data):
    from transformers import AutoTokenizer

    summary, rows = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, policy)
    assert summary.samples == len(rows) == 20
    assert set(by_key(rows)) == {(p, i) for p in LENGTHS for i in range(4)}
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    for r in rows:
        want = LENGTHS[r["prompt_id"]][r["sample_index"]]
        assert r["response_length"] == len(r["response_token_ids"]) == len(r["response_logprobs"]) == want
        assert all(lp <= 0.0 for lp in r["response_logprobs"])
        assert r["response_text"] == tok.decode(r["response_token_ids"], skip_special_tokens=True)
        assert r["prompt_length"] == len(r["prompt_token_ids"]) and r["prompt_token_ids"]
        assert sum(s["num_tokens"] for s in r["segments"]) - r["wasted_tokens"] == want
        assert r["finish_time_s"] >= r["submit_time_s"] >= 0
        for seg in r["segments"]:   # a span with tokens saw its first one after submit, at or before its end
            if seg["num_tokens"]:
                assert seg["submit_time_s"] <= seg["first_token_time_s"] <= seg["end_time_s"]
        assert r["reward"] in (0.0, 1.0)
        assert r["policy_versions"] == [0] and r["batch_index"] == 0
    if policy != "baseline":
        assert sum(r["is_probe"] for r in rows) == 5
        assert summary.stats["probes"] == 5


def test_v25_dispatch_matches_the_hand_computed_one(engine_loop, engines, tiny_model_dir, tmp_path, replay_data):
    # probes 100, 40, 10, 60, 20: top 40% = p0, p3; L_cut = 60; fast cap = 90;
    # fast samples longer than 90 break: p1/2 (130) and p2/3 (91); p4/1 (90) fits exactly.
    summary, rows = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v2.5",
                            {"offload_fraction": 0.4})
    s = by_key(rows)
    assert summary.batches[0]["l_cut"] == 60 and summary.batches[0]["fast_cap"] == 90
    assert {p for p in LENGTHS if s[(p, 1)]["routed_to"] == "heavy"} == {"p0", "p3"}
    assert {k for k, r in s.items() if r["moves"]} == {("p1", 2), ("p2", 3)}
    assert summary.stats["breaks"] == 2 and summary.stats["offloaded_prompts"] == 2
    for k, r in s.items():
        on_fast = sum(seg["num_tokens"] for seg in r["segments"] if seg["engine"] == "fast-0")
        if r["routed_to"] == "fast":
            assert on_fast <= 90          # the fast cap is never exceeded on the fast engine
        if k in {("p1", 2), ("p2", 3)}:
            assert on_fast == 90 and r["segments"][-1]["engine"] == "heavy-0"


def test_a_moved_sample_equals_an_unmoved_greedy_run(engine_loop, engines, tiny_model_dir, tmp_path, replay_data):
    # Greedy: every sample of a prompt is the same sequence. Under v2.5 some samples break at the cap and
    # continue on the other engine from prompt + generated ids; under baseline without segments nothing
    # moves. Token for token, the results must agree.
    greedy = {"sampling.temperature": 0.0}
    _, moved = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v2.5",
                       {"offload_fraction": 0.4}, **greedy)
    _, plain = rollout(engine_loop, engines, tiny_model_dir, tmp_path / "plain", replay_data, "baseline",
                       **greedy, **{"segments.enabled": False})
    m, p = by_key(moved), by_key(plain)
    broken = [k for k, r in m.items() if r["moves"]]
    assert broken
    for k in broken:
        assert m[k]["response_token_ids"] == p[k]["response_token_ids"], k
    for k in m:
        assert m[k]["response_token_ids"] == p[k]["response_token_ids"], k


def test_resume_after_an_interrupted_run_has_every_sample_once(engine_loop, engines, tiny_model_dir, tmp_path,
                                                               replay_data):
    from pdsr_sdk.rollout import run as run_mod

    # interrupt the first run after its first batch (of 2 prompts) is on disk
    calls = {"n": 0}
    real_generate = run_mod.RolloutSession.generate

    class SimulatedCrash(Exception):
        pass

    # (not KeyboardInterrupt: raised inside a task it would stop the shared test loop itself)
    async def generate_then_crash(self, records, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise SimulatedCrash()
        return await real_generate(self, records, **kw)

    run_mod.RolloutSession.generate = generate_then_crash
    try:
        with pytest.raises(SimulatedCrash):
            rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v2.5", batch_size=2)
    finally:
        run_mod.RolloutSession.generate = real_generate
    parts = list((tmp_path / "v2.5.parquet.parts").glob("part-*.parquet"))
    assert parts and not (tmp_path / "v2.5.parquet").exists()
    first = pq.read_table(parts).to_pylist() if len(parts) == 1 else [r for f in parts for r in pq.read_table(f).to_pylist()]
    assert {r["prompt_id"] for r in first} == {"p0", "p1"}

    summary, rows = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v2.5", batch_size=2,
                            **{"output.resume": True})
    # the summary covers the whole run; batch numbering goes on after the batch on disk
    assert summary.skipped_groups == 2 and summary.groups == 5 and summary.samples == 20
    assert [(b["batch_index"], b["groups"]) for b in summary.batches] == [(0, 2), (1, 2), (2, 1)]
    assert summary.tokens == sum(r["response_length"] for r in rows)
    assert {r["prompt_id"]: r["batch_index"] for r in rows} == {"p0": 0, "p1": 0, "p2": 1, "p3": 1, "p4": 2}
    keys = [(r["prompt_id"], r["sample_index"]) for r in rows]
    assert len(keys) == len(set(keys)) == 20
    assert not (tmp_path / "v2.5.parquet.parts").exists()


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
            with pytest.raises(DataError, match=r"unknown parameter 'model\.layers\.0\.mlp\.up_proj\.weigth'.*did you mean"):
                await session.aupdate_weights({**sd, "model.layers.0.mlp.up_proj.weigth": sd["model.norm.weight"]})
            bad = dict(sd)
            bad["model.layers.1.self_attn.q_proj.weight"] = torch.zeros(3, 7)
            with pytest.raises(DataError, match=r"'model\.layers\.1\.self_attn\.q_proj\.weight' has shape \[3, 7\]"):
                await session.aupdate_weights(bad)
            # the engine process checks too (here bypassing the session's check): an EngineError with its name
            staged = StagedWeights(items=list(bad.items()))
            with pytest.raises(EngineError, match=r"engine 'fast-0'.*'model\.layers\.1\.self_attn\.q_proj\.weight' has shape") as info:
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


# ----------------------------------------------------------------------- partial rollout across steps
#: per group, forced lengths of its 4 samples: a few long samples make most groups finish late
STREAM_LENGTHS = [[8, 8, 8, 8], [8, 8, 8, 120], [8, 16, 8, 8], [120, 8, 8, 8], [16, 16, 16, 16], [8, 8, 120, 8],
                  [8, 8, 8, 16], [16, 8, 8, 8], [8, 120, 8, 8], [8, 8, 16, 8]]


def stream_records(session):
    from pdsr_sdk.rollout.data import PromptRecord

    tok = session.tokenizer
    return [PromptRecord(prompt_id=f"g{i}", text=f"Question {i}: what is {i} + {i}?",
                         token_ids=tok.encode(f"Question {i}: what is {i} + {i}?"), target_lengths=lengths)
            for i, lengths in enumerate(STREAM_LENGTHS)]


@pytest.mark.parametrize("policy,staleness,kv", [("v3", 1, "recompute"), ("baseline", 0, "recompute"),
                                                 ("v2.5", 1, "recompute"), ("v3", 1, "keep")])
def test_partial_rollout_carries_every_sample_with_its_tokens(engine_loop, engines, tiny_model_dir, policy,
                                                              staleness, kv):
    """Steps of 2 groups with 2 more in flight: a step ends when 2 groups are complete; the samples still
    running are carried into the next step with their tokens and log-probs and continue under the next
    policy version (greedy, fp32 engines: the joined tokens equal an uninterrupted run's, whether the version
    change resets the prefix caches (kv_on_update recompute) or the carried samples go on from their cached KV
    (keep)). No group is lost or returned twice; with max_staleness S no consumed token is older than S
    versions (S=0: every carried sample starts over, its thrown-away tokens counted); the last step drains."""
    from pdsr_sdk.rollout.session import RolloutSession

    base = dict(model=str(tiny_model_dir), policy=policy, segments={"min_tokens": 16, "max_tokens": 32},
                sampling={"n": 4, "max_tokens": 128, "temperature": 0.0, "ignore_eos": True})

    async def scenario():
        async with RolloutSession(RolloutConfig(**base), engines=engines) as session:
            reference = await session.astep(stream_records(session))
        cfg = RolloutConfig(**base, over_provision=1.0, step_groups=2, max_staleness=staleness, kv_on_update=kv)
        steps, carried = [], {}
        async with RolloutSession(cfg, engines=engines) as session:
            records = iter(stream_records(session))
            for k in range(5):   # 10 groups, 2 a step; 4 in flight until the data runs out
                out = await session.astep(records if k == 0 else (), last=k == 4)
                steps.append(out)
                for s in session.scheduler.held():   # what the next step resumes from
                    carried.setdefault(s.key, []).append((out.step, list(s.token_ids), list(s.logprobs)))
                await session.anext_version()        # the trainer's update
            assert not session.carried() and not session.scheduler.held()
        return reference, steps, carried

    reference, steps, carried = run_on(engine_loop, scenario(), timeout=300)
    ref = {s.key: s for s in reference.samples}
    got = [s for out in steps for s in out.samples]
    assert sorted(s.key for s in got) == sorted(ref)                    # every sample once
    assert [len(out.groups) for out in steps] == [2] * 5
    assert sum(len(out.groups) for out in steps) == len(STREAM_LENGTHS)
    assert carried, "some samples must cross a step end"
    for s in got:
        assert s.token_ids == ref[s.key].token_ids and s.num_generated == len(s.logprobs) == ref[s.key].num_generated
    by_key = {s.key: s for s in got}
    for key, snaps in carried.items():
        final = by_key[key]
        for _, tokens, logprobs in snaps:
            if staleness:   # kept exactly across the step end
                assert final.token_ids[:len(tokens)] == tokens and final.logprobs[:len(logprobs)] == logprobs
    for out in steps:
        assert out.summary["max_token_age"] <= staleness
        assert out.record.off_policy_tokens == round(out.summary["off_policy_share"] * out.record.tokens)
        for s in out.samples:
            kept = [seg for seg in s.segments[max(i for i, seg in enumerate(s.segments) if seg.start_token == 0):]]
            assert sum(seg.num_tokens for seg in kept) == s.num_generated
            assert all(out.policy_version - seg.policy_version <= staleness for seg in kept if seg.num_tokens)
    crossed = [by_key[k] for k in carried]
    if staleness:
        assert any(len({seg.policy_version for seg in s.segments if seg.num_tokens}) > 1 for s in crossed)
        assert any(out.summary["off_policy_share"] > 0 for out in steps)
    else:
        assert sum(out.summary["stale_restarts"] for out in steps) >= 1
        assert sum(out.summary["wasted_tokens"] for out in steps) > 0


def test_a_step_whose_groups_completed_before_it_began_returns_with_the_engines_stopped(engine_loop, engines,
                                                                                      tiny_model_dir):
    """One engine, 4 groups of 2 equal forced-length samples in flight for steps of 2: all 8 run in
    lockstep and end in one engine step, so the 2 groups a step does not take are complete by its end
    (they finish while it stops the engine) and the next step's B groups are complete at its refill: it
    ends at once. It must still hand back a stopped session (nothing running while the trainer trains,
    so update_weights is allowed) with its new groups queued for the next step. It used to restart the
    engine after such a step had ended: update_weights then refused ("a step is running"), or the next
    step waited forever for a drain that never came."""
    from pdsr_sdk.rollout.data import PromptRecord
    from pdsr_sdk.rollout.session import RolloutSession

    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", over_provision=1.0, step_groups=2,
                        sampling={"n": 2, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True})

    async def scenario():
        returned, between = [], []
        async with RolloutSession(cfg, engines=engines[:1]) as session:
            tok = session.tokenizer
            records = iter([PromptRecord(prompt_id=f"g{i}", text=f"Say {i}.", token_ids=tok.encode(f"Say {i}."))
                            for i in range(10)])
            for k in range(5):
                out = await asyncio.wait_for(session.astep(records if k == 0 else (), last=k == 4), 60)
                returned.append(sorted(g.prompt_id for g in out.groups))
                await asyncio.sleep(0.3)   # the trainer's work: nothing may run meanwhile
                between.append((session.scheduler.paused, session.scheduler.in_flight))
                session.policy_version += 1
        return returned, between

    returned, between = run_on(engine_loop, scenario(), timeout=300)
    assert [len(r) for r in returned] == [2] * 5
    assert sorted(p for r in returned for p in r) == sorted(f"g{i}" for i in range(10))
    assert all(paused is not None and running == 0 for paused, running in between[:-1]), between


async def _until(cond, what: str, timeout: float = WAIT_S) -> None:
    """Poll ``cond`` on the event loop (the engines' callbacks run meanwhile)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("wait_for_update", [False, True])
def test_partial_rollout_takes_weight_updates_in_the_middle_of_steps(engine_loop, engines, tiny_model_dir,
                                                                      wait_for_update):
    """A pipelined trainer: it starts step k + 1 as soon as step k returns and, while it generates, trains on
    step k and calls update_weights without pausing. The session stops the engines keeping every token,
    loads the weights, and goes on: samples running at the update continue under the new version, and a
    step's token ages count from the version at its end. Greedy fp32 engines reloaded with the same weights:
    every sample is returned once with the tokens of an uninterrupted run, each step's result names the
    version at its end (one more than at its start when the update came in its middle), and no token is
    older than max_staleness there. ``wait_for_update``: no step ends before the trainer's update, so every
    later step ends one version above its start (the trainer's weights)."""
    from pdsr_sdk.rollout.session import RolloutSession

    base = dict(model=str(tiny_model_dir), policy="v3", segments={"min_tokens": 16, "max_tokens": 32},
                sampling={"n": 4, "max_tokens": 128, "temperature": 0.0, "ignore_eos": True})

    async def scenario():
        async with RolloutSession(RolloutConfig(**base), engines=engines) as session:
            reference = await session.astep(stream_records(session))
        cfg = RolloutConfig(**base, over_provision=1.0, step_groups=2, max_staleness=1)
        steps, starts = [], []
        async with RolloutSession(cfg, engines=engines) as session:
            records = iter(stream_records(session))
            steps.append(await session.astep(records))
            for k in range(1, 5):
                starts.append(session.policy_version)
                step = asyncio.ensure_future(session.astep((), last=k == 4, wait_for_update=wait_for_update))
                # the update lands while tokens are generated, or at once when nothing is left to generate
                # (on a loaded machine every sample may have ended before this step began)
                await _until(lambda: step.done() or session.scheduler.idle
                             or any(s.num_generated for s in session.scheduler.running()), "tokens")
                await session.aupdate_weights(str(tiny_model_dir))   # trained on the previous step
                steps.append(await asyncio.wait_for(step, 120))
            assert not session.carried() and not session.scheduler.held()
        return reference, steps, starts

    reference, steps, starts = run_on(engine_loop, scenario(), timeout=300)
    ref = {s.key: s for s in reference.samples}
    got = [s for out in steps for s in out.samples]
    assert sorted(s.key for s in got) == sorted(ref)
    for s in got:
        assert s.token_ids == ref[s.key].token_ids and len(s.logprobs) == s.num_generated
    # an update lands in the middle of its step unless that step ended first (e.g. at once, its groups
    # complete when it began): then it lands between steps
    assert steps[0].policy_version == 0
    mid = [out.policy_version == start + 1 for out, start in zip(steps[1:], starts)]
    assert all(out.policy_version in (start, start + 1) for out, start in zip(steps[1:], starts))
    assert starts == sorted(starts) and sum(mid) >= (4 if wait_for_update else 2), (starts, mid)
    for out in steps:
        assert out.summary["max_token_age"] <= 1 and out.summary["policy_version"] == out.policy_version
        for s in out.samples:
            kept = s.segments[max(i for i, seg in enumerate(s.segments) if seg.start_token == 0):]
            assert all(0 <= out.policy_version - seg.policy_version <= 1 for seg in kept if seg.num_tokens)
    # samples that ran across an update in the middle of the step that returned them
    assert any(len({seg.policy_version for seg in s.segments if seg.num_tokens}) > 1 and
               min(seg.policy_version for seg in s.segments if seg.num_tokens) == out.policy_version - 1
               for out, m in zip(steps[1:], mid) if m for s in out.samples)


def test_a_mid_step_update_that_would_restart_a_sample_twice_waits_for_the_steps_end(engine_loop, engines,
                                                                                     tiny_model_dir):
    """max_staleness 0: a weight update in the middle of a step restarts every sample holding tokens (each
    at most once); a second update in the same step would make those restarted samples stale again. Paused
    by the caller, it is refused with a RunError naming them; unpaused, it waits for the step's end, which
    consumes their groups (they are due), and then loads."""
    from pdsr_sdk.errors import RunError
    from pdsr_sdk.rollout.data import PromptRecord
    from pdsr_sdk.rollout.session import RolloutSession

    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", over_provision=1.0, step_groups=2, max_staleness=0,
                        sampling={"n": 4, "max_tokens": 400, "temperature": 0.0, "ignore_eos": True})

    async def scenario():
        async with RolloutSession(cfg, engines=engines) as session:
            tok = session.tokenizer
            records = [PromptRecord(prompt_id=f"g{i}", text=f"Count to {i}.", token_ids=tok.encode(f"Count to {i}."),
                                    target_lengths=[24, 24, 24, 300 if i % 2 else 24]) for i in range(4)]
            step = asyncio.ensure_future(session.astep(records))
            running = lambda: [s for s in session.scheduler.running() if s.num_generated]   # noqa: E731
            await _until(lambda: len(running()) >= 2, "tokens")
            assert await session.aupdate_weights(str(tiny_model_dir)) == 1   # restarts what has tokens
            restarted = lambda: [s for g, _ in session.carried() for s in g.samples   # noqa: E731
                                 if s.restarts and s.num_generated > 8]
            await _until(lambda: restarted() or step.done(), "a restarted sample's new tokens")
            assert not step.done()
            await session.apause("abort")
            blocked = {s.key for s in session._stream.blocked_by(2)}
            with pytest.raises(RunError, match="restarted for staleness once and would be too stale again"):
                await session.aupdate_weights(str(tiny_model_dir))
            assert session.policy_version == 1 and not step.done()
            await session.aresume()
            assert await session.aupdate_weights(str(tiny_model_dir)) == 2
            assert step.done()   # it waited for the step's end
            out = step.result()
            assert out.policy_version == 1 and out.summary["max_token_age"] == 0
            keys = {s.key for s in out.samples}
            assert blocked and blocked <= keys   # consumed at the step's end they waited for
            rest = []   # the step took every due group: perhaps all four
            if session.carried():
                last = await asyncio.wait_for(session.astep((), last=True), 120)
                assert keys.isdisjoint(s.key for s in last.samples) and last.summary["max_token_age"] == 0
                rest = last.groups
            assert len(out.groups) + len(rest) == 4
            return out

    out = run_on(engine_loop, scenario(), timeout=300)
    assert out.summary["stale_restarts"] >= 1


def test_rollout_steps_writes_every_group_once_in_the_step_that_consumed_it(engine_loop, engines, tiny_model_dir,
                                                                           tmp_path, replay_data):
    """``pdsr rollout --steps 3 --step-groups 2 --over-provision 0.5``: 3 groups in flight, 2 consumed a
    step, the last step drains: 5 groups in 2 + 2 + 1, each sample whole, each step summarised with its
    off-policy share."""
    summary, rows = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v3",
                            steps=3, step_groups=2, over_provision=0.5)
    assert summary.samples == len(rows) == 20
    assert set(by_key(rows)) == {(p, i) for p in LENGTHS for i in range(4)}
    for r in rows:
        want = LENGTHS[r["prompt_id"]][r["sample_index"]]
        assert r["response_length"] == len(r["response_token_ids"]) == len(r["response_logprobs"]) == want
        assert sum(s["num_tokens"] for s in r["segments"]) - r["wasted_tokens"] == want
        assert set(r["policy_versions"]) <= set(range(r["batch_index"] + 1))
    per_step = [len({r["prompt_id"] for r in rows if r["batch_index"] == k}) for k in range(3)]
    assert per_step == [2, 2, 1]
    assert [b["batch_index"] for b in summary.batches] == [0, 1, 2]
    assert all({"off_policy_share", "max_token_age", "carried_groups"} <= set(b) for b in summary.batches)
    assert summary.batches[-1]["carried_groups"] == 0


def test_an_interrupted_steps_run_resumes_with_the_groups_left_and_goes_on_numbering(engine_loop, engines,
                                                                                    tiny_model_dir, tmp_path,
                                                                                    replay_data):
    """A multi-step run of 2 steps (4 of 5 groups on disk) resumed with ``--steps 3``: the groups on disk are
    skipped, the rest run in the third step, numbered after the last one, and the summary covers the whole
    run. ``--steps`` counts the run's steps in all: resuming it again runs nothing."""
    first, before = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v3", steps=2,
                            step_groups=2, over_provision=0.0)
    assert first.groups == 4 and [b["batch_index"] for b in first.batches] == [0, 1]
    again, _ = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v3", steps=2,
                       step_groups=2, over_provision=0.0, **{"output.resume": True})
    assert again.groups == 4 and [b["batch_index"] for b in again.batches] == [0, 1]
    summary, rows = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v3", steps=3,
                            step_groups=2, over_provision=0.0, **{"output.resume": True})
    assert set(by_key(rows)) == {(p, i) for p in LENGTHS for i in range(4)} and len(rows) == 20
    assert summary.groups == 5 and summary.skipped_groups == 4
    assert [b["batch_index"] for b in summary.batches] == [0, 1, 2]
    done = {r["prompt_id"] for r in before}
    assert len(done) == 4 and {r["batch_index"] for r in rows if r["prompt_id"] not in done} == {2}


def test_an_interrupted_steps_run_resumes_its_carried_samples_from_their_tokens(engine_loop, engines, tiny_model_dir,
                                                                                tmp_path, replay_data, monkeypatch):
    """A multi-step run that stopped right after its first step (the summary write after it failed) left
    the groups it carried on disk with their tokens, log-probs and segments (``<out>.parts/_carry.parquet``).
    ``--resume`` continues them from those tokens under the next version: every sample once and whole, each
    carried prefix (tokens, log-probs, segments) kept exactly, and the carry file gone once the run ends."""
    from pdsr_sdk.rollout import run as run_module
    from pdsr_sdk.rollout.writer import carry_file

    write = run_module.write_text_atomic

    def stop(*args, **kwargs):
        raise RuntimeError("stopped after a step")

    monkeypatch.setattr(run_module, "write_text_atomic", stop)
    opts = dict(steps=4, step_groups=1, over_provision=2.0)   # 3 groups in flight, 1 consumed a step
    with pytest.raises(RuntimeError, match="stopped after a step"):
        rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v3", **opts)
    monkeypatch.setattr(run_module, "write_text_atomic", write)
    out = tmp_path / "v3.parquet"
    before = pq.read_table(out.with_name(out.name + ".parts")).to_pylist()
    carry = pq.read_table(carry_file(out)).to_pylist()
    assert len({r["prompt_id"] for r in before}) == 1 and {r["batch_index"] for r in before} == {0}
    assert len({r["prompt_id"] for r in carry}) == 2 and not {r["prompt_id"] for r in carry} & {r["prompt_id"] for r in before}
    partial = [r for r in carry if r["finish_reason"] is None and r["response_length"]]
    assert partial, "some carried sample must hold tokens without being finished"
    assert all(r["launch_step"] == 0 and r["response_length"] == len(r["response_token_ids"])
               == len(r["response_logprobs"]) for r in carry)

    summary, rows = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v3", **opts,
                            **{"output.resume": True})
    assert sorted(by_key(rows)) == sorted((p, i) for p in LENGTHS for i in range(4)) and len(rows) == 20
    assert summary.groups == 5 and summary.skipped_groups == 1
    got = by_key(rows)
    for r in rows:
        assert r["response_length"] == len(r["response_token_ids"]) == LENGTHS[r["prompt_id"]][r["sample_index"]]
    for c in carry:
        r = got[(c["prompt_id"], c["sample_index"])]
        n = c["response_length"]
        assert r["response_token_ids"][:n] == c["response_token_ids"]
        assert r["response_logprobs"][:n] == c["response_logprobs"]
        assert r["segments"][:len(c["segments"])] == c["segments"]
        assert r["restarts"] == 0 and r["batch_index"] >= 1
    for c in partial:   # continued under the version after the first step's update
        r = got[(c["prompt_id"], c["sample_index"])]
        assert 0 in r["policy_versions"] and max(r["policy_versions"]) >= 1
    assert not carry_file(out).exists() and not out.with_name(out.name + ".parts").exists()


# ------------------------------------------------------------------------- dynamic sampling (DAPO)

def _signal_for_odd_prompts(text, ground_truth, *, prompt_id, sample_index, **info):
    """p1 and p3 get rewards that differ within the group; the others all 1.0 (no GRPO signal)."""
    return float(sample_index % 2) if prompt_id in ("p1", "p3") else 1.0


def test_rollout_steps_with_filter_groups_writes_only_groups_with_signal(engine_loop, engines, tiny_model_dir,
                                                                         tmp_path, replay_data):
    """``pdsr rollout --steps 2 --step-groups 1 --filter-groups zero-variance --write-filtered`` on real engines:
    the trajectories hold the groups whose rewards differ (each sample whole), the filtered file the others,
    and the summary counts them."""
    summary, rows = rollout(engine_loop, engines, tiny_model_dir, tmp_path, replay_data, "v3", steps=2,
                            step_groups=1, max_staleness=0,
                            reward="test_rollout_vllm:_signal_for_odd_prompts",
                            **{"filter_groups.kind": "zero-variance", "filter_groups.write_filtered": True})
    kept = {r["prompt_id"] for r in rows}
    filtered = pq.read_table(tmp_path / "v3.filtered.parquet").to_pylist()
    assert kept and kept <= {"p1", "p3"} and {r["prompt_id"] for r in filtered} <= {"p0", "p2", "p4"}
    for r in rows + filtered:
        assert r["response_length"] == len(r["response_token_ids"]) == LENGTHS[r["prompt_id"]][r["sample_index"]]
        assert r["reward"] == _signal_for_odd_prompts("", None, prompt_id=r["prompt_id"],
                                                      sample_index=r["sample_index"])
    assert summary.filtered_groups == len({r["prompt_id"] for r in filtered}) > 0
    assert sum(b["filtered_groups"] for b in summary.batches) == summary.filtered_groups
