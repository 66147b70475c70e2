"""After ``update_weights`` the engines sample from exactly the new weights, by every path docs/sdk-weights.md offers,
held to an independent reference: a float64 transformers forward of the same weights, to fp32 tolerance (the
engines are fp32). The weights change every parameter (the tied embedding and so the head, norms, biases), each by
enough that leaving any one of them old moves the reference far outside the tolerance. A refused update (unknown
name, wrong shape, NaN, a missing tensor, a stale version) leaves the engines' log-probs bit for bit as they were."""

from __future__ import annotations

import pytest

from support import requires_vllm, run_on

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]

#: a fixed sequence whose prompt log-probs the engines and the reference compare
IDS = [5, 17, 250, 3, 99, 42, 7, 600, 31, 8, 77, 500, 12, 64, 300, 9, 150, 21, 40, 2, 900, 1000, 333, 1, 0, 1023]
#: fp32 engines against a float64 forward: 1-2e-5 measured
TOL = 1e-4


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """``(logps(weights, ids), base)``: the float64 forward of a state dict, and the checkpoint's fp32 state dict."""
    import torch
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).state_dict()
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float64).eval()

    def logps(weights, ids=IDS):
        full = {n: t.to(torch.float64) for n, t in weights.items()}
        full["lm_head.weight"] = full["model.embed_tokens.weight"]
        with torch.no_grad():
            model.load_state_dict(full, strict=False)
            x = torch.tensor([ids])
            return torch.log_softmax(model(x).logits, -1)[0, :-1].gather(-1, x[0, 1:, None])[:, 0]

    return logps, {n: t.clone() for n, t in base.items()}


def changed(base, seed):
    """Every tensor of ``base`` moved by 0.3 of its scale (at least 0.05: the zero biases), the head tied."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, t in base.items():
        if n != "lm_head.weight":
            scale = max(float(t.std()) if t.numel() > 1 else 0.0, float(t.abs().mean()), 0.05)
            out[n] = t + 0.3 * scale * torch.randn(t.shape, generator=g)
    out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


async def engine_logps(engine, ids=IDS):
    import uuid

    import torch
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    out = None
    async for out in engine._llm.generate(TokensPrompt(prompt_token_ids=ids), params, f"lp-{uuid.uuid4().hex}"):
        pass
    return torch.tensor([s[t].logprob for s, t in zip(out.prompt_logprobs[1:], ids[1:])], dtype=torch.float64)


def test_every_path_loads_exactly_the_new_weights_and_a_refused_one_changes_nothing(engine_loop, vllm_pair,
                                                                                     tiny_model_dir, reference):
    import torch

    from pdsr_sdk.errors import ConfigValueError, DataValueError
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    logps, base = reference
    first = changed(base, 1)
    new = logps(first)
    for name in first:   # the check sees every parameter: any one left old moves the log-probs well past TOL
        if name != "lm_head.weight":
            assert float((logps({**first, name: base[name]}) - new).abs().max()) > 30 * TOL, name
    paths = [("state dict", lambda w: w, {}), ("iterator", lambda w: iter(list(w.items())), {}),
             ("state dict, a tensor a bucket", lambda w: w, {"bucket_bytes": 1}),
             ("iterator, 64 KiB buckets", lambda w: iter(list(w.items())), {"bucket_bytes": 1 << 16}),
             ("bfloat16 state dict", lambda w: {n: t.to(torch.bfloat16) for n, t in w.items()}, {}),
             ("float64 iterator in buckets", lambda w: ((n, t.double()) for n, t in w.items()),
              {"bucket_bytes": 1 << 18})]
    cfg = RolloutConfig(model=str(tiny_model_dir), batch_size=2, policy="baseline",
                        sampling={"n": 2, "max_tokens": 16, "temperature": 1.0})

    async def scenario():
        got = []
        async with RolloutSession(cfg, engines=vllm_pair) as session:
            for seed, (label, form, kw) in enumerate(paths, start=1):
                weights = {n: t.to(torch.bfloat16).double() for n, t in changed(base, seed).items()} \
                    if label.startswith("bfloat16") else changed(base, seed)
                version = await session.aupdate_weights(form(weights), **kw)
                out = await session.astep(["What is 2 + 3?", "Hi"])
                sampled = max(float((torch.tensor(s.logprobs, dtype=torch.float64) - logps(
                    weights, s.group.prompt_token_ids + s.token_ids)[len(s.group.prompt_token_ids) - 1:]).abs().max())
                    for s in out.samples)
                got.append((label, [float((await engine_logps(e) - logps(weights)).abs().max()) for e in vllm_pair],
                            sampled, version, {seg.policy_version for s in out.samples for seg in s.segments}))
            held = [await engine_logps(e) for e in vllm_pair]
            version = session.policy_version
            other = changed(base, 99)
            bad_nan = other["model.layers.3.mlp.down_proj.weight"].clone()
            bad_nan[5, 7] = float("nan")
            refused = [({**other, "model.layers.0.mlp.up_proj.weigth": other["model.norm.weight"]}, {}),
                       ({**other, "model.norm.weight": torch.zeros(255)}, {}),
                       ({**other, "model.layers.3.mlp.down_proj.weight": bad_nan}, {"bucket_bytes": 1 << 16}),
                       ({n: t for n, t in other.items() if n != "model.layers.2.self_attn.v_proj.bias"}, {}),
                       ({n: t for n, t in other.items() if ".layers.0." in n}, {"bucket_bytes": 1 << 16})]
            for weights, kw in refused:
                with pytest.raises(DataValueError):
                    await session.aupdate_weights(weights, **kw)
            for stale in (version, version - 1):
                with pytest.raises(ConfigValueError, match="greater than the current policy version"):
                    await session.aupdate_weights(other, version=stale)
            after = [await engine_logps(e) for e in vllm_pair]
            kept = (session.policy_version == version, session.weights_partial, held, after)
            await session.aupdate_weights(tiny_model_dir)     # the shared engines get their weights back
            restored = [float((await engine_logps(e) - logps(base)).abs().max()) for e in vllm_pair]
        return got, kept, restored

    got, (same_version, partial, held, after), restored = run_on(engine_loop, scenario(), timeout=600)
    for i, (label, prompt, sampled, version, stamped) in enumerate(got, start=1):
        assert max(prompt) <= TOL and sampled <= TOL, (label, prompt, sampled)
        assert version == i and stamped == {i}, label
    assert same_version and partial is None and all(torch.equal(a, b) for a, b in zip(held, after))
    assert max(restored) <= TOL
