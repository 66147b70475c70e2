"""A staggered weight update (``update: staggered``) whose engine held back is in a Ray actor: it loads the update
in buckets later, from the copies the session kept of each bucket (the local engines' case:
tests/rollout/test_rollout_vllm_stagger.py)."""

from __future__ import annotations

from ray_checks import engine_test, greedy_continuations
from support import run_on, weight_blocks

PROMPT = [5, 17, 250, 3, 99, 42, 7, 600]
#: per group, its 4 samples' forced lengths: a few long ones run on past each step's end
LENGTHS = [[8, 8, 8, 120], [8, 16, 8, 8], [120, 8, 8, 8], [16, 16, 16, 16], [8, 8, 120, 8], [8, 8, 8, 16],
           [16, 8, 8, 8], [8, 120, 8, 8]] * 2
UPDATES = 6   # at most: the run ends after the first update that holds an engine back


@engine_test
def test_a_ray_engine_held_back_loads_a_bucketed_update_from_its_kept_copies(engine_loop, live_ray_engines,
                                                                             tiny_model_dir):
    """Two engines in Ray actors, steps of 2 groups with 2 more in flight, each update in 64 KiB buckets, until an
    update holds an engine back; the next step is the last. Once it ends, the engine held back has loaded that
    update from the session's copies of its buckets (the session's own block was rewritten by each next bucket
    meanwhile): both engines continue a prompt greedily alike, and not as the model folder's weights do. The
    copies are freed."""
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk.engines.weights import StagedWeights
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.data import PromptRecord
    from pdsr_sdk.rollout.session import RolloutSession

    engines = live_ray_engines("fast-ray-0", "heavy-ray-1")
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    torch.manual_seed(5)
    weights = []
    for _ in range(UPDATES):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        weights.append({k: v.clone() for k, v in model.state_dict().items()})
    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", segments={"min_tokens": 16, "max_tokens": 32},
                        sampling={"n": 4, "max_tokens": 128, "temperature": 0.0, "ignore_eos": True},
                        over_provision=1.0, step_groups=2, max_staleness=2, update="staggered")

    async def go():
        seen: dict = {"lagging": [], "blocks": weight_blocks()}
        try:
            async with RolloutSession(cfg, engines=list(engines)) as session:
                tok = session.tokenizer
                records = iter([PromptRecord(prompt_id=f"g{i}", text=f"Question {i}: what is {i} + {i}?",
                                             token_ids=tok.encode(f"Question {i}: what is {i} + {i}?"),
                                             target_lengths=lengths) for i, lengths in enumerate(LENGTHS)])
                last = False
                for k in range(UPDATES + 1):
                    out = await session.astep(records if k == 0 else (), last=last or k == UPDATES)
                    assert out.summary["max_token_age"] <= 2
                    if last or k == UPDATES:
                        break
                    await session.aupdate_weights(weights[k], bucket_bytes=1 << 16)
                    seen["lagging"].append(dict(session.scheduler.lagging()))
                    last = bool(seen["lagging"][-1])
                seen["lagging_at_end"] = dict(session.scheduler.lagging())
            seen["blocks_after"] = weight_blocks()
            seen["updated"] = await greedy_continuations(engines, "updated", PROMPT, 24)
        finally:   # the shared actors go back to the model folder's weights
            for e in engines:
                await e.update_weights(StagedWeights(folder=str(tiny_model_dir)))
        seen["folder"] = await greedy_continuations(engines, "folder", PROMPT, 24)
        return seen

    seen = run_on(engine_loop, go(), timeout=600)
    assert seen["lagging"][-1], f"no update held an engine back ({seen['lagging']})"
    assert not seen["lagging_at_end"]
    assert seen["blocks_after"] == seen["blocks"]
    assert seen["updated"][0] == seen["updated"][1] != seen["folder"][0]
    assert seen["folder"][0] == seen["folder"][1]
