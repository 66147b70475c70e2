"""An AReaL trainer's inputs from a partial rollout on real engines whose weights change at every update
(docs/partial-rollout.md, "Coming from AReaL"): each token's version is checked against the numerics, not
against pdsr's segments (the weights whose recomputed log-prob of it is the engine's), and the page's block,
run as written, gives AReaL's decoupled-loss weights exp(prox - behave), rejected above 5.0."""

from __future__ import annotations

import asyncio
import math
import re

import numpy as np
import pytest

from support import ROOT, WAIT_S, requires_vllm, run_on

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines start: 30-70 s

#: per group, forced lengths of its 4 samples: the 240-token ones are still running when a step's 2 groups of
#: short ones are complete, so they cross the updates
LENGTHS = [[8, 8, 8, 8], [8, 8, 8, 240], [8, 16, 8, 8], [240, 8, 8, 8], [16, 8, 8, 8], [8, 240, 8, 8]]
#: the engines (fp32) against the trainer's fp32 forward: what one token's log-probs differ by at most
TOL = 1e-3


def the_block() -> str:
    """The first python block of the page's "Coming from AReaL" section, as the reader copies it."""
    text = (ROOT / "docs" / "partial-rollout.md").read_text()
    section = text.split("## Coming from AReaL", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


async def until(cond) -> None:
    """Poll ``cond`` on the event loop (the engines' callbacks run meanwhile)."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def response_logps(model, prompt: list[int], response: list[int]) -> np.ndarray:
    """The trainer's log p(token | prompt, earlier tokens) of each response token, float64."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].double()
    lp = torch.log_softmax(logits[len(prompt) - 1:-1], -1)
    return lp[torch.arange(len(response)), torch.tensor(response)].numpy()


@pytest.mark.parametrize("pipelined", [False, True], ids=["between-steps", "mid-step"])
def test_areal_versions_and_decoupled_weights_from_a_partial_rollout(engine_loop, vllm_pair, tiny_model_dir,
                                                                     pipelined):
    """Three steps with a trainer's update of other weights before each of the last two: between steps, or, as
    AReaL's loop, while the step generates (the update interrupts the running samples)."""
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk import token_versions_of_rows
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.data import PromptRecord
    from pdsr_sdk.rollout.session import RolloutSession

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    torch.manual_seed(0)
    weights = []   # three policies, each a trainer's step from the one before
    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        weights.append({k: v.clone() for k, v in model.state_dict().items()})
    cfg = RolloutConfig(model=str(tiny_model_dir), policy="v3", segments={"min_tokens": 16, "max_tokens": 32},
                        sampling={"n": 4, "max_tokens": 256, "temperature": 1.0, "ignore_eos": True},
                        over_provision=1.0, step_groups=2, max_staleness=2)

    async def scenario():
        async with RolloutSession(cfg, engines=vllm_pair) as session:
            try:
                of_version = {await session.aupdate_weights(weights[0]): 0}   # the engines may hold other weights
                tok = session.tokenizer
                records = iter([PromptRecord(prompt_id=f"g{i}", text=f"Question {i}: what is {i} + {i}?",
                                             token_ids=tok.encode(f"Question {i}: what is {i} + {i}?"),
                                             target_lengths=lengths) for i, lengths in enumerate(LENGTHS)])
                steps = [await session.astep(records)]
                for k in (1, 2):
                    if not pipelined:
                        of_version[await session.aupdate_weights(weights[k])] = k   # the trainer's update
                        steps.append(await session.astep((), last=k == 2))
                        continue
                    step = asyncio.ensure_future(session.astep((), last=k == 2, wait_for_update=True))
                    await until(lambda: step.done() or session.scheduler.idle
                                or any(s.num_generated for s in session.scheduler.running()))
                    of_version[await session.aupdate_weights(weights[k])] = k   # while tokens are generated
                    steps.append(await asyncio.wait_for(step, WAIT_S))
                return steps, of_version, tok
            finally:
                await session.aupdate_weights(str(tiny_model_dir))   # the model folder's weights back

    steps, of_version, tokenizer = run_on(engine_loop, scenario(), timeout=600)
    assert sorted(g.prompt_id for out in steps for g in out.groups) == [f"g{i}" for i in range(len(LENGTHS))]
    crossed = 0
    for out in steps:
        rows = out.table.to_pylist()
        tagged = token_versions_of_rows(rows)
        prox = []   # the trainer's log-probs before this step's update: the weights of out.policy_version
        for row, versions in zip(rows, tagged):
            engine = np.asarray(row["response_logprobs"], dtype=np.float64)
            recomputed = {}
            for v in set(versions.tolist()) | {out.policy_version}:
                model.load_state_dict(weights[of_version[v]])
                recomputed[v] = response_logps(model, row["prompt_token_ids"], row["response_token_ids"])
            # the numerics name each token's weights: its tag's recomputation is the engine's log-prob
            for t, v in enumerate(versions.tolist()):
                assert abs(recomputed[v][t] - engine[t]) < TOL, (row["prompt_id"], row["sample_index"], t, v)
            if len(set(versions.tolist())) > 1:   # and another version's recomputation is not, on most tokens
                crossed += 1
                off = [abs(recomputed[u][t] - engine[t]) for t, v in enumerate(versions.tolist())
                       for u in recomputed if u != v]
                assert np.mean(np.asarray(off) > 10 * TOL) > 0.8, (row["prompt_id"], row["sample_index"])
            prox.append(recomputed[out.policy_version])
        width = max(len(p) for p in prox)
        prox_logp = torch.tensor([list(p) + [0.0] * (width - len(p)) for p in prox], dtype=torch.float32)
        space = {"out": out, "tokenizer": tokenizer, "prox_logp": prox_logp, "pg_loss": torch.ones_like(prox_logp)}
        exec(the_block(), space)
        weight, keep, mask = (np.asarray(space[k]) for k in ("behave_imp_weight", "keep", "loss_mask"))
        assert (np.asarray(space["versions"]) == np.asarray([list(v) + [-1] * (width - len(v)) for v in tagged])).all()
        for i, row in enumerate(rows):
            for t in range(width):   # AReaL's token mask: exp(prox - behave), 0 above the cap; no lower bound
                ratio = math.exp(float(prox_logp[i, t]) - float(row["response_logprobs"][t])) \
                    if t < row["response_length"] else None
                want = 0.0 if ratio is None or ratio > 5.0 else ratio
                assert keep[i, t] == (want > 0) and abs(weight[i, t] - want) <= 1e-6 * max(1.0, want), (i, t)
                if ratio is not None and tagged[i][t] == out.policy_version:   # on-policy: weight 1
                    assert abs(weight[i, t] - 1.0) < 5 * TOL
        assert float(space["loss"]) == pytest.approx(weight.sum() / mask.sum(), rel=1e-6)
    # samples ran across the updates between steps (the 240-token ones outlive a step's short groups); whether one
    # runs across an update in the middle of a step is the engines' timing
    assert crossed > 0 or pipelined
