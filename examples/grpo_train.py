"""A complete GRPO loop on the CPU: pdsr rollout -> rewards -> group advantages -> old/ref log-probs ->
clipped policy-gradient step in torch -> ``session.update_weights`` -> next step.

The task, chosen so that learning shows within minutes with the built-in tiny (random) model:
**"write with common words"**. A prompt asks for a few words about a topic; the reward of a response is
the number of its tokens that are one of 16 common English words (" the", " a", " of", " to", ...,
``COMMON_WORDS``; each is one token in the tiny model's vocabulary) divided by ``--max-tokens``.
The random model starts near 0.01; a policy that writes only those words gets 1.0.
Each word's logit is one embedding row (the tiny model ties input and output embeddings), so what a
step learns carries over to every context: the reward mean rises within a few steps.

- rollout: ``RolloutSession.step`` (B prompts x N samples, engine log-probs of the sampled tokens);
- advantages: ``pdsr_sdk.grpo_advantages`` (group-normalised, one scalar per sample);
- old and reference log-probs: ``pdsr_sdk.per_token_logps`` (torch backend, fp32) on the trainer's
  model before the update and on a frozen copy of the initial model;
- the gradient-carrying log-probs come from the torch model directly (a scorer returns numbers,
  not a graph): one forward over the padded batch (``pdsr_sdk.trainer_batch``, verl's layout), gathered at
  the sampled tokens;
- loss: PPO-clipped surrogate (token mean per sample, then mean over samples), optional k3 KL to
  the reference (``--kl-coef``).

Per step it prints one JSON line: reward mean, mean response length, ``kl_ref`` (KL of the policy that
sampled the step to the reference, k3 estimator on the sampled tokens) and ``engine_trainer_logp_gap``
(mean |engine log-prob - trainer log-prob| of the same weights on the sampled tokens: the engine's dtype,
bf16 where the CPU has it, against the trainer's fp32; 0 where both are fp32).

**Partial rollout** (``--over-provision F``, ``--max-staleness S``): steps stream instead of waiting
for their longest sample (docs/sdk-partial.md, "Partial rollout across steps"). ``ceil(B x (1 + F))`` groups
stay in flight, a step trains on the first B that complete, and unfinished samples carry into the
next step and continue under the new weights, so some of a step's tokens were sampled by an older
policy (never more than S versions old). ``--tis UPPER`` (default 2 with ``--over-provision``)
corrects for that with truncated importance sampling: each token's loss is weighted by
``min(pi_old / pi_engine, UPPER)``, the trainer's log-prob before the update over the engine's
log-prob of the policy that sampled it (``pdsr_sdk.importance_weights``); ``--tis off`` trains
without it. The step's line then adds ``off_policy_share`` (tokens sampled by an older version),
``max_token_age`` (versions, at the step's end), ``trained_token_age`` (at the trainer's weights) and
``tis_weight`` (the mean weight; null with ``--tis off``); ``kl_ref`` and ``engine_trainer_logp_gap`` are
measured on the tokens the trainer's own weights sampled (the gap thus stays a numerics check). ``--tis UPPER``
without ``--over-provision`` corrects the engine's numerics only (bf16 engines, an fp32 trainer) and adds
``tis_weight`` to the line too.

``--pipeline`` (with ``--over-provision``) starts the next step before training on this one, as a
trainer that overlaps generation and training does: the weight update lands in the middle of the next
step, whose samples go on under the new weights (``RolloutSession.update_weights`` stops and resumes
the engines itself), and that step does not end before it (``step(..., wait_for_update=True)``), so its
token ages count at the weights the trainer trains it with.

``--multi-turn`` trains on two-turn samples (``pdsr_sdk.agent``): each sample writes, a scripted user turn
asks for more, and it writes again (with ``--over-provision`` too: a sample carried into the next step goes on
with its conversation; no ``--max-staleness``, since a multi-turn sample is never restarted). Each turn gets
``--max-tokens`` // 2 tokens and the reward counts only the sampled tokens. The loss mask is the trajectory's
``response_mask``: the tokens the chat template and the user turn add between the model's turns carry no loss. The
step's line adds ``env_tokens`` (masked out).

``--no-update`` is the control: the trainer still trains on every step's samples, but the engines
keep the initial weights (so ``kl_ref`` is 0 there). ``--compare`` runs both in one session (the
engines start once; they get the initial weights back before the control) and prints the change of
the reward mean (mean of the last 3 steps minus the first 3) of each.

    python examples/grpo_train.py                  # 12 steps with updates
    python examples/grpo_train.py --no-update      # the control
    python examples/grpo_train.py --compare        # both, one session
    python examples/grpo_train.py --ray local      # the same on Ray engines (see examples/ray_engines.py)
    python examples/grpo_train.py --over-provision 1 --max-staleness 1   # partial rollout, TIS-corrected
    python examples/grpo_train.py --over-provision 1 --max-staleness 1 --pipeline   # and one step overlapped
    python examples/grpo_train.py --multi-turn     # two model turns per sample, the loss masked to them

Measured on the shared 2-core machine (defaults, seed 0): see docs/sdk.md ("A complete GRPO loop").
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterator, Sequence

#: the task's rewarded words: each is one token of the built-in tiny model (checked at start)
COMMON_WORDS = (" the", " a", " of", " to", " and", " is", " in", " that",
                " for", " it", " as", " with", " was", " on", " be", " by")
TOPICS = ("cats", "rain", "music", "bread", "rivers", "stars", "games", "trees",
          "snow", "tea", "clocks", "ships", "maps", "birds", "paint", "glass")


@dataclass(frozen=True)
class GrpoSettings:
    """Everything one run depends on (the command-line flags)."""

    steps: int = 12
    batch_size: int = 4          # prompts per step (B)
    n: int = 8                   # samples per prompt (the group size N)
    max_tokens: int = 16
    lr: float = 3e-3
    inner_steps: int = 1         # optimizer steps per rollout (>1: the PPO clip matters)
    clip: float = 0.2
    kl_coef: float = 0.0
    seed: int = 0                # engine seed (LLM(seed=...)) and torch seed
    update: bool = True          # False: the control (engines keep the initial weights)
    model: str | None = None     # None: the built-in tiny model
    ray: str | None = None       # a Ray address ("local", "auto", ...): engines as Ray actors
    over_provision: float | None = None   # partial rollout: ceil(B x (1 + F)) groups in flight
    max_staleness: int | None = None      # partial rollout: restart tokens more than S versions old
    tis: float | None = None     # TIS's upper bound (None: 2 with over-provision, else off; 0: off)
    pipeline: bool = False       # partial rollout: the next step generates while this one trains
    multi_turn: bool = False     # two model turns per sample (an agent), the loss masked to the sampled tokens


#: --multi-turn: the user turn between the model's two turns
MORE = "Go on."


async def two_turns(agent) -> None:
    """--multi-turn's agent: a turn, a scripted user turn, a second turn; the trainer computes the reward."""
    await agent.generate()
    await agent.generate([{"role": "user", "content": MORE}])


def task_prompts() -> list[dict]:
    return [{"id": f"words-{t}", "prompt": f"Write a few words about {t}."} for t in TOPICS]


def prompt_stream(s: GrpoSettings, tag: str) -> Iterator[dict]:
    """The prompts of a partial-rollout run, in the order the steps take them: the topics over and
    over, each with its own id (``tag`` keeps two runs in one session apart). Finite: B prompts a step
    and the over-provision once, so a session's stream never waits on an exhausted source."""
    topics = task_prompts()
    total = s.batch_size * (s.steps + 1) + math.ceil(s.batch_size * (s.over_provision or 0.0))
    for i in range(total):
        p = topics[i % len(topics)]
        yield {**p, "id": f"{tag}-{p['id']}-{i}"}


def word_token_ids(tokenizer, words: Sequence[str] = COMMON_WORDS) -> set[int]:
    """The token id of each rewarded word; a word the tokenizer splits is refused (use another model's
    words, or pass --model with a tokenizer that has them as single tokens)."""
    ids = set()
    for w in words:
        enc = tokenizer.encode(w, add_special_tokens=False)
        if len(enc) != 1:
            raise SystemExit(f"the reward word {w!r} is {len(enc)} tokens in this tokenizer; expected 1")
        ids.add(enc[0])
    return ids


def common_word_reward(token_ids: Sequence[int], targets: set[int], max_tokens: int) -> float:
    """Rewarded-word tokens / max_tokens (an early stop earns less: it wrote fewer words)."""
    return sum(t in targets for t in token_ids) / max_tokens


def rollout_config(s: GrpoSettings):
    from pdsr_sdk import RolloutConfig

    # multi-turn: max_tokens is the whole response (the model's two turns and the user turn between them)
    turn = s.max_tokens // 2
    return RolloutConfig(model=s.model, batch_size=s.batch_size, seed=s.seed,
                         ray={"address": s.ray} if s.ray else None,
                         over_provision=s.over_provision, max_staleness=s.max_staleness,
                         sampling={"n": s.n, "max_tokens": s.max_tokens + (64 if s.multi_turn else 0),
                                   "temperature": 1.0},
                         agent={"turn_max_tokens": turn} if s.multi_turn else {})


def train(s: GrpoSettings, session=None, emit: Callable[[str], Any] = print) -> list[dict]:
    """Run ``s.steps`` GRPO steps; returns one dict of numbers per step. ``session``: an open
    RolloutSession to use (its engines get the initial weights first), else one is opened."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk import RolloutSession, grpo_advantages, importance_weights, per_token_logps, trainer_batch

    if session is None:
        with RolloutSession(rollout_config(s)) as opened:
            return train(s, opened, emit)

    torch.manual_seed(s.seed)
    # one thread: the engines share the machine's cores, and an oversubscribed OpenMP pool is far slower
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(session.model_dir, dtype=torch.float32)
    ref = copy.deepcopy(model).eval()
    session.update_weights(model.state_dict())        # engines start from exactly these weights
    opt = torch.optim.Adam(model.parameters(), lr=s.lr)
    targets = word_token_ids(session.tokenizer)
    prompts_all = task_prompts()
    partial = s.over_provision is not None
    stream = prompt_stream(s, "updates" if s.update else "control") if partial else None
    history = []
    agent = two_turns if s.multi_turn else None
    # not `with`: its exit would join a pipelined step that waits for this loop's update, so an error here would
    # hang the run; the step ends instead when the session closes, and the thread with it
    stepping = ThreadPoolExecutor(1)
    try:
        nxt = None
        for step in range(s.steps):
            t0 = time.perf_counter()
            if partial:   # the iterator once; the last step returns every group in flight (nothing carried)
                last = step == s.steps - 1
                out = nxt.result() if nxt is not None else session.step(stream if step == 0 else (), n=s.n, last=last,
                                                                        agent=agent)
                nxt = None
                if s.pipeline and not last:   # the next step generates while this one trains: the update lands in
                    # it, and the step waits for it (so its token ages count at the weights it is trained with)
                    nxt = stepping.submit(session.step, (), n=s.n, last=step + 1 == s.steps - 1,
                                          wait_for_update=s.update, agent=agent)
            else:
                start = (step * s.batch_size) % len(prompts_all)
                out = session.step([prompts_all[(start + i) % len(prompts_all)] for i in range(s.batch_size)], n=s.n,
                                   agent=agent)
            samples = [x for x in out.samples if x.token_ids]
            prompts = [list(x.group.prompt_token_ids) for x in samples]
            comps = [list(x.token_ids) for x in samples]
            # 1 on the tokens the model sampled; multi-turn responses hold the environment's too (0: no loss)
            sampled = [np.asarray(x.response_mask if x.response_mask is not None else [1] * len(c), dtype=bool)
                       for x, c in zip(samples, comps)]
            rewards = np.array([common_word_reward([t for t, m in zip(c, k) if m], targets, s.max_tokens)
                                for c, k in zip(comps, sampled)], dtype=np.float64)
            adv = np.asarray(grpo_advantages(rewards, [x.group.prompt_id for x in samples]), dtype=np.float32)

            old_scores = per_token_logps(model, prompts, comps, backend="torch")     # the trainer's policy now
            ref_scores = per_token_logps(ref, prompts, comps, backend="torch")
            old, refl = old_scores.logps, ref_scores.logps                          # one array per sample
            # the weights the engines sampled with (this version's tokens)
            sampler = old if s.update else refl
            # the padded batch for the gradient-carrying forward, in verl's layout: prompts left-padded, responses
            # right-padded, the loss mask (sampled tokens), the engine's log-probs and each token's policy version
            batch = trainer_batch(samples, pad_token_id=0).tensors
            ids, attn, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
            width = batch["responses"].shape[1]
            mask = batch["response_mask"].float()
            eng_t = batch["rollout_log_probs"]
            # the same log-probs in the batch's layout: [B, width], right-padded (-1 on padding)
            old_t, ref_t = (torch.from_numpy(x.padded(width)) for x in (old_scores, ref_scores))
            # carried tokens came from older weights than the trainer's now
            trainer_version = session.policy_version   # the weights the trainer holds now
            token_version = batch["token_versions"][batch["attention_mask"][:, -width:].bool()].numpy()   # flat
            current = (token_version == trainer_version) & np.concatenate(sampled)
            gaps = np.concatenate([np.abs(np.asarray(x.logprobs[:len(c)], dtype=np.float32) - o)
                                   for x, c, o in zip(samples, comps, sampler)])
            engine_gap = float(np.mean(gaps[current])) if current.any() else float("nan")
            # k3: E[exp(d) - d - 1] over the sampler's tokens
            d = (np.concatenate(refl) - np.concatenate(sampler))[current]
            kl = float(np.mean(np.exp(d) - d - 1)) if current.any() else float("nan")

            adv_t = torch.from_numpy(adv)[:, None]
            tis_upper = (s.tis or None) if s.tis is not None else (2.0 if partial else None)   # 0: off
            if tis_upper is not None:   # the behaviour policy (older weights, the engine's numerics) -> the trainer's
                weights, keep = importance_weights(old_t, eng_t, mask, level="token", mode="truncate", upper=tis_upper)
            else:
                weights, keep = mask, mask.bool()
            tokens_per_row = keep.sum(1).clamp(min=1)

            model.train()
            for _ in range(s.inner_steps):
                # the logits at column j predict token j + 1: the response's from the prompt's last column on
                logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -width - 1:-1].float()
                new = torch.gather(torch.log_softmax(logits, -1), 2, batch["responses"][:, :, None]).squeeze(2)
                ratio = torch.exp(new - old_t)
                surr = torch.minimum(ratio * adv_t, ratio.clamp(1 - s.clip, 1 + s.clip) * adv_t)
                per_tok = -surr * weights
                if s.kl_coef:
                    dk = ref_t - new
                    per_tok = per_tok + s.kl_coef * (torch.exp(dk) - dk - 1)
                loss = ((per_tok * keep).sum(1) / tokens_per_row).mean()
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
            model.eval()
            if s.update:
                session.update_weights(model.state_dict())
            row = {"step": step, "policy_version": out.policy_version, "reward_mean": round(float(rewards.mean()), 4),
                   "response_len": round(float(np.mean([k.sum() for k in sampled])), 2), "kl_ref": round(kl, 5),
                   "engine_trainer_logp_gap": round(engine_gap, 5), "loss": round(loss.item(), 5),
                   "samples": len(samples), "step_s": round(time.perf_counter() - t0, 2)}
            if s.multi_turn:
                row["env_tokens"] = int(sum((~k).sum() for k in sampled))
                row["turns_mean"] = out.summary.get("turns_mean")
            if partial:
                row.update(off_policy_share=round(out.summary["off_policy_share"], 4),
                           max_token_age=out.summary["max_token_age"],
                           # the age the trainer sees: its weights may be newer than the step's end
                           # of sampled tokens: an environment's (multi-turn) have no version (-1)
                           trained_token_age=int(trainer_version - token_version[np.concatenate(sampled)].min()))
            if partial or tis_upper is not None:   # null: --tis off
                row["tis_weight"] = round(float(weights[keep].mean()), 4) if tis_upper is not None else None
            history.append(row)
            emit(json.dumps(row))
    finally:
        stepping.shutdown(wait=False)
    return history


def reward_change(history: list[dict], k: int = 3) -> float:
    """Mean reward of the last ``k`` steps minus that of the first ``k``."""
    r = [h["reward_mean"] for h in history]
    return sum(r[-k:]) / len(r[-k:]) - sum(r[:k]) / len(r[:k])


def compare(s: GrpoSettings, emit: Callable[[str], Any] = print) -> dict[str, list[dict]]:
    """The run with updates, then the control, in one session (the engines start once)."""
    from pdsr_sdk import RolloutSession

    runs = {}
    with RolloutSession(rollout_config(s)) as session:
        for name, update in (("updates", True), ("control", False)):
            emit(f"# {name}")
            runs[name] = train(replace(s, update=update), session, emit)
    return runs


def at_least(kind: type, low: float, above: bool = False) -> Callable[[str], Any]:
    """An argparse type: a number of ``kind`` of at least ``low`` (``above``: more than it), so a bad value is a
    one-line error naming its flag before any engine starts."""
    name = "whole number" if kind is int else "number"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {name}") from None
        if not (value > low if above else value >= low):   # also refuses nan
            raise argparse.ArgumentTypeError(f"{value} is {'not above' if above else 'below'} {low}")
        return value

    parse.__name__ = f"{name} {'>' if above else '>='} {low}"   # argparse names the type in its own messages
    return parse


def tis_bound(text: str) -> float:
    """--tis: an upper bound above 0, or ``off`` (0.0: no correction, also with --over-provision)."""
    return 0.0 if text == "off" else at_least(float, 0, above=True)(text)


def parse_args(argv: Sequence[str] | None = None, defaults: GrpoSettings = GrpoSettings()) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--steps", type=at_least(int, 1), default=defaults.steps)
    ap.add_argument("--batch-size", type=at_least(int, 1), default=defaults.batch_size, help="prompts per step")
    ap.add_argument("--n", type=at_least(int, 1), default=defaults.n, help="samples per prompt (group size)")
    ap.add_argument("--max-tokens", type=at_least(int, 1), default=defaults.max_tokens)
    ap.add_argument("--lr", type=at_least(float, 0, above=True), default=defaults.lr)
    ap.add_argument("--inner-steps", type=at_least(int, 1), default=defaults.inner_steps)
    ap.add_argument("--clip", type=at_least(float, 0), default=defaults.clip)
    ap.add_argument("--kl-coef", type=at_least(float, 0), default=defaults.kl_coef)
    ap.add_argument("--seed", type=int, default=defaults.seed)
    ap.add_argument("--model", default=defaults.model, help="model folder (default: the built-in tiny model)")
    ap.add_argument("--ray", default=defaults.ray, metavar="ADDRESS",
                    help="run the engines as Ray actors: 'local' starts a one-machine cluster (docs/ray.md)")
    ap.add_argument("--over-provision", type=at_least(float, 0), default=defaults.over_provision, metavar="F",
                    help="partial rollout: keep ceil(B x (1 + F)) groups in flight; a step trains on the first B "
                         "complete, the rest carry on under the new weights")
    ap.add_argument("--max-staleness", type=at_least(int, 0), default=defaults.max_staleness, metavar="S",
                    help="partial rollout: restart samples whose tokens are more than S versions old")
    ap.add_argument("--tis", type=tis_bound, default=defaults.tis, metavar="UPPER",
                    help="truncated importance sampling: weight each token's loss by min(pi_old / pi_engine, "
                         "UPPER) (default: 2 with --over-provision, else off; 'off': none)")
    ap.add_argument("--pipeline", action="store_true", default=defaults.pipeline,
                    help="partial rollout: start the next step before training on this one (one step off-policy); "
                         "the weight update lands in the middle of the next step")
    ap.add_argument("--multi-turn", action="store_true", default=defaults.multi_turn,
                    help="two model turns per sample with a scripted user turn between; the loss masked to them")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--no-update", action="store_true", help="control: never push the trained weights")
    mode.add_argument("--compare", action="store_true", help="the run with updates, then the control, one session")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None, defaults: GrpoSettings = GrpoSettings()) -> dict[str, list[dict]]:
    a = parse_args(argv, defaults)
    s = GrpoSettings(steps=a.steps, batch_size=a.batch_size, n=a.n, max_tokens=a.max_tokens, lr=a.lr,
                     inner_steps=a.inner_steps, clip=a.clip, kl_coef=a.kl_coef, seed=a.seed, update=not a.no_update,
                     model=a.model, ray=a.ray, over_provision=a.over_provision, max_staleness=a.max_staleness,
                     tis=a.tis, pipeline=a.pipeline, multi_turn=a.multi_turn)
    if (s.max_staleness is not None or s.pipeline) and s.over_provision is None:
        raise SystemExit("--max-staleness and --pipeline apply to partial rollout: set --over-provision too")
    if s.multi_turn and s.max_staleness is not None:
        raise SystemExit("--max-staleness: a multi-turn sample is never restarted (its agent holds the conversation), "
                         "so --multi-turn takes no staleness bound; TIS corrects its older tokens")
    if s.multi_turn and s.max_tokens < 2:
        raise SystemExit("--max-tokens: --multi-turn gives each of its two turns max-tokens // 2; expected 2 or more")

    def emit(line: str) -> None:
        print(line, flush=True)

    emit("# settings " + json.dumps(asdict(s)))
    t0 = time.perf_counter()
    runs = compare(s, emit) if a.compare else {"updates" if s.update else "control": train(s, emit=emit)}
    for name, hist in runs.items():
        emit(f"# {name}: reward mean {hist[0]['reward_mean']} at the first step, {hist[-1]['reward_mean']} at the "
             f"last; last 3 minus first 3: {reward_change(hist):+.4f}")
    emit(f"# wall time {time.perf_counter() - t0:.0f} s")
    return runs


if __name__ == "__main__":   # engine processes are spawned: the guard is required
    main()
