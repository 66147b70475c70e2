"""A complete GRPO loop on the CPU: pdsr rollout -> rewards -> group advantages -> old/ref log-probs ->
clipped policy-gradient step in torch -> ``session.update_weights`` -> next step.

The task, chosen so that learning shows within minutes with the built-in tiny (random) model:
"answer in digits". The reward of a response is the fraction of its tokens whose text contains a
digit (a format reward; the random model starts near its base rate). The trainer's copy of the
same model is trained with GRPO; the engines sample from the trained weights after each
``update_weights``.

- rollout: ``RolloutSession.step`` (B prompts x N samples, engine log-probs of the sampled tokens);
- advantages: ``pdsr_sdk.grpo_advantages`` (group-normalised, one scalar per sample);
- old and reference log-probs: ``pdsr_sdk.per_token_logps`` (torch backend, fp32) on the trainer's
  model before the update and on a frozen copy of the initial model;
- the gradient-carrying log-probs come from the torch model directly (a scorer returns numbers,
  not a graph): one forward over the padded batch, gathered at the sampled tokens;
- loss: PPO-clipped surrogate (token mean per sample, then mean over samples), optional k3 KL to
  the reference (``--kl-coef``).

Per step it prints: reward mean, mean response length, KL(policy || reference) on the sampled
tokens (k3 estimator, after the update), and mean |engine log-prob - trainer log-prob| on the
sampled tokens (engine bf16 vs trainer fp32, before the update; the weights are the same).

``--no-update`` is the control: the trainer still trains, but the engines keep the initial weights.

    python examples/grpo_train.py --steps 8
    python examples/grpo_train.py --steps 8 --no-update

Status (measured on the shared 2-core machine, defaults, seed 0): reward per step 0.512 0.586 0.552
0.548 0.561 0.585 0.619 0.599 with updates, 0.512 0.581 0.540 0.587 0.543 0.582 0.579 0.574 without;
last-3 minus first-3 is +0.051 vs +0.034, so learning is NOT shown yet. kl_ref is tens of nats after
the first step: lr 2e-3 with 2 inner steps moves the random model far too much; the task (base rate
~0.5) and step sizes still need tuning before a test can assert a margin.
"""

from __future__ import annotations

import argparse
import copy
import json
import time


def digit_reward(text_tokens: list[str]) -> float:
    """Fraction of the response's tokens whose text contains a digit."""
    if not text_tokens:
        return 0.0
    return sum(any(c.isdigit() for c in t) for t in text_tokens) / len(text_tokens)


def train(steps: int = 8, *, update: bool = True, batch_size: int = 4, n: int = 8, max_tokens: int = 24,
          lr: float = 2e-3, inner_steps: int = 2, clip: float = 0.2, kl_coef: float = 0.0, seed: int = 0,
          session=None, emit=print) -> list[dict]:
    """Run ``steps`` GRPO steps; returns one dict of numbers per step. ``session``: an open
    RolloutSession to use (its engines are reset to the initial weights first), else one is opened."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk import RolloutConfig, RolloutSession, grpo_advantages, per_token_logps

    if session is None:
        config = RolloutConfig(batch_size=batch_size, seed=seed,
                               sampling={"n": n, "max_tokens": max_tokens, "temperature": 1.0})
        with RolloutSession(config) as s:
            return train(steps, update=update, batch_size=batch_size, n=n, max_tokens=max_tokens, lr=lr,
                         inner_steps=inner_steps, clip=clip, kl_coef=kl_coef, seed=seed, session=s, emit=emit)

    torch.manual_seed(seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = AutoModelForCausalLM.from_pretrained(session.model_dir, dtype=torch.float32)
    ref = copy.deepcopy(model).eval()
    session.update_weights(model.state_dict())        # engines start from exactly these weights
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    tok = session.tokenizer
    records = session.load_prompts()
    history = []
    for step in range(steps):
        t0 = time.perf_counter()
        start = (step * batch_size) % len(records)
        batch = [records[(start + i) % len(records)] for i in range(batch_size)]
        out = session.step(batch, n=n)
        samples = [s for s in out.samples if s.token_ids]
        prompts = [list(s.group.prompt_token_ids) for s in samples]
        comps = [list(s.token_ids) for s in samples]
        rewards = np.array([digit_reward(tok.convert_ids_to_tokens(c)) for c in comps], dtype=np.float64)
        adv = np.asarray(grpo_advantages(rewards, [s.group.prompt_id for s in samples]), dtype=np.float32)

        old = per_token_logps(model, prompts, comps, backend="torch").logps      # = sampling policy
        refl = per_token_logps(ref, prompts, comps, backend="torch").logps
        engine_gap = float(np.mean(np.concatenate(
            [np.abs(np.asarray(s.logprobs[:len(c)], dtype=np.float32) - o) for s, c, o in zip(samples, comps, old)])))

        # padded batch for the gradient-carrying forward
        lens = [len(p) + len(c) for p, c in zip(prompts, comps)]
        T = max(lens)
        ids = torch.zeros(len(samples), T, dtype=torch.long)
        attn = torch.zeros(len(samples), T, dtype=torch.long)
        mask = torch.zeros(len(samples), T - 1)
        old_t = torch.zeros(len(samples), T - 1)
        for i, (p, c) in enumerate(zip(prompts, comps)):
            ids[i, :lens[i]] = torch.tensor(p + c)
            attn[i, :lens[i]] = 1
            mask[i, len(p) - 1:lens[i] - 1] = 1          # positions predicting the completion tokens
            old_t[i, len(p) - 1:lens[i] - 1] = torch.from_numpy(old[i])
        ref_t = torch.zeros_like(old_t)
        for i, (p, c) in enumerate(zip(prompts, comps)):
            ref_t[i, len(p) - 1:lens[i] - 1] = torch.from_numpy(refl[i])
        adv_t = torch.from_numpy(adv)[:, None]
        tokens_per_row = mask.sum(1).clamp(min=1)

        model.train()
        for _ in range(inner_steps):
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            new = torch.gather(torch.log_softmax(logits, -1), 2, ids[:, 1:, None]).squeeze(2)
            ratio = torch.exp(new - old_t)
            surr = torch.minimum(ratio * adv_t, ratio.clamp(1 - clip, 1 + clip) * adv_t)
            per_tok = -surr
            if kl_coef:
                d = ref_t - new
                per_tok = per_tok + kl_coef * (torch.exp(d) - d - 1)
            loss = ((per_tok * mask).sum(1) / tokens_per_row).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            new = torch.gather(torch.log_softmax(logits, -1), 2, ids[:, 1:, None]).squeeze(2)
            d = ref_t - new
            kl = float(((torch.exp(d) - d - 1) * mask).sum() / mask.sum())
        if update:
            session.update_weights(model.state_dict())
        row = {"step": step, "policy_version": out.policy_version, "reward_mean": round(float(rewards.mean()), 4),
               "response_len": round(float(np.mean([len(c) for c in comps])), 2), "kl_ref": round(kl, 5),
               "engine_trainer_logp_gap": round(engine_gap, 5), "loss": round(loss.item(), 5),
               "samples": len(samples), "step_s": round(time.perf_counter() - t0, 2)}
        history.append(row)
        emit(json.dumps(row))
    return history


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--no-update", action="store_true", help="control: never push the trained weights")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--kl-coef", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    train(a.steps, update=not a.no_update, batch_size=a.batch_size, n=a.n, max_tokens=a.max_tokens, lr=a.lr,
          kl_coef=a.kl_coef, seed=a.seed, emit=lambda line: print(line, flush=True))


if __name__ == "__main__":   # engine processes are spawned: the guard is required
    main()
