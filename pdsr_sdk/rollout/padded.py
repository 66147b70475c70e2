"""A step's samples as the padded tensors a trainer takes: verl's rollout batch (``DataProto``'s keys).

``trainer_batch(out, pad_token_id=tokenizer.pad_token_id)`` turns a :class:`~pdsr_sdk.rollout.results.StepResult`
(or a list of samples) into :class:`TrainerBatch`: ``tensors`` keyed as verl's vLLM rollout returns them, and
``non_tensors`` (``uid``, the prompt id GRPO groups by). In verl: ``DataProto.from_dict(tensors=b.tensors,
non_tensors=b.non_tensors)``. The layout, one row per sample (P prompt columns, R response columns):

- ``prompts`` [B, P]: the prompt's ids, left-padded with ``pad_token_id``; ``responses`` [B, R]: the response's
  ids (a multi-turn response with the environment's tokens), right-padded; ``input_ids`` [B, P + R] the two;
- ``attention_mask`` [B, P + R]: 1 on every prompt and response token, 0 on padding;
- ``position_ids`` [B, P + R]: verl's: a prompt's positions count from 0 at its first token (0 on the padding
  before it), the response's go on from the prompt's last, one a column;
- ``response_mask`` [B, R]: 1 on the tokens the model sampled (the loss mask: 0 on the environment's tokens of a
  multi-turn response and on padding);
- ``rollout_log_probs`` [B, R] (float32): the engine's log-prob of each response token, -1 on padding (verl's
  pad); ``token_versions`` [B, R]: the policy version each token was sampled with, -1 on padding (partial
  rollout: :func:`~pdsr_sdk.offpolicy.importance_weights` corrects the older ones);
- ``token_level_scores`` [B, R] (float32), where rewards are known: the sample's reward on its last response
  token, as verl's reward managers place it.

``non_tensors``: ``uid``, ``finish_reasons``, and ``__num_turns__`` (int32) as verl's agent loop counts a sample's
turns (``user_turns + assistant_turns + 1``): the prompt, then each model turn and each environment turn (a span of
the sample's ``turns``); 2 for a single-turn sample, as verl's single-turn agent loop gives. Where any prompt had
one of them, also verl's reward inputs, all three on every row, so that its reward managers score the batch as they
score one of its own rollout (each reads ``reward_model["ground_truth"]`` and ``data_source`` on every row, and
``extra_info``, which it adds ``num_turns`` to): ``reward_model`` (``{"ground_truth": ...}``, ``{"ground_truth":
None}`` on a row whose prompt had none), ``data_source`` (a data row's, or a prompt mapping's; None where none) and
``extra_info`` (the same; an empty dict where none, a copy per row). A batch whose prompts had none of them has
none of the three keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from pdsr_sdk.io.padding import pad_rows
from pdsr_sdk.dispatch.types import Sample
from pdsr_sdk.errors import ConfigValueError, DataValueError
from pdsr_sdk.offpolicy.correction import token_versions
from pdsr_sdk.scoring.api import as_ragged

__all__ = ["TrainerBatch", "trainer_batch"]


@dataclass
class TrainerBatch:
    """:func:`trainer_batch`'s result: ``tensors`` (name -> torch tensor, or numpy array with ``numpy=True``, each
    [B, ...]) and ``non_tensors`` (name -> numpy array of B: ``uid``, ``finish_reasons``, ``__num_turns__``)."""

    tensors: dict[str, Any]
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.non_tensors["uid"])


def trainer_batch(step: Any, *, pad_token_id: int, prompt_length: int | None = None,
                  response_length: int | None = None, rewards: Sequence[float | None] | None = None,
                  numpy: bool = False) -> TrainerBatch:
    """The samples of ``step`` (a :class:`~pdsr_sdk.rollout.results.StepResult`, or samples) as padded arrays in
    verl's layout (see the module). ``prompt_length`` / ``response_length``: the widths P and R (verl's
    ``data.max_prompt_length`` and ``rollout.response_length``); default the longest in the batch, and a row
    longer than either is an error naming the sample. ``rewards``: one per sample (default: a StepResult's
    scores, unless it has none; none for plain samples), and without them no ``token_level_scores``; a sample
    without a reward among samples with one is an error naming it. ``numpy``: numpy arrays instead of torch
    tensors."""
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, (int, np.integer)):
        # tokenizer.pad_token_id is None for tokenizers without a pad token (Llama's): verl pads with eos then
        raise ConfigValueError(f"trainer_batch: pad_token_id must be a token id (an int), got {pad_token_id!r}"
                               + ("; a tokenizer without a pad token gives None: pass its eos_token_id, as verl does"
                                  if pad_token_id is None else ""))
    samples: list[Sample] = list(step.samples) if hasattr(step, "samples") else list(step)
    if rewards is None and getattr(step, "scores", None):
        rewards = [s.reward for s in step.scores]
        if all(r is None for r in rewards):   # no reward function ran: no scores to place
            rewards = None
    if not samples:
        raise DataValueError("trainer_batch: no samples")
    if rewards is not None and len(rewards) != len(samples):
        raise DataValueError(f"trainer_batch: {len(rewards)} rewards for {len(samples)} samples")
    for i, s in enumerate(samples):
        _check(s, i, rewards)
    prompts = as_ragged([s.group.prompt_token_ids for s in samples], "prompt_token_ids")
    responses = as_ragged([s.token_ids for s in samples], "token_ids")
    p = _width(prompts.lengths, prompt_length, "prompt_length", samples)
    r = _width(responses.lengths, response_length, "response_length", samples)
    flat_p, p_off, flat_r, r_off = prompts.values, prompts.offsets, responses.values, responses.offsets
    ones_p, ones_r = np.ones(len(flat_p), np.int64), np.ones(len(flat_r), np.int64)
    prompt_ids = pad_rows(flat_p, p_off, p, side="left", fill=pad_token_id)
    response_ids = pad_rows(flat_r, r_off, r, fill=pad_token_id)
    prompt_mask = pad_rows(ones_p, p_off, p, side="left")
    response_attn = pad_rows(ones_r, r_off, r)
    prompt_pos = np.clip(np.cumsum(prompt_mask, axis=1) - 1, 0, None)
    last = prompt_pos[:, -1:] if p else np.full((len(samples), 1), -1, np.int64)
    sampled = np.concatenate([np.asarray(s.response_mask if s.response_mask is not None else [1] * len(s.token_ids),
                                         dtype=np.int64) for s in samples])
    logprobs = np.concatenate([np.asarray(s.logprobs, dtype=np.float32) for s in samples])
    versions = np.concatenate([token_versions([g.start_token for g in s.segments], [g.num_tokens for g in s.segments],
                                              [g.policy_version for g in s.segments], len(s.token_ids))
                               for s in samples])
    out = {
        "prompts": prompt_ids,
        "responses": response_ids,
        "input_ids": np.concatenate([prompt_ids, response_ids], axis=1),
        "attention_mask": np.concatenate([prompt_mask, response_attn], axis=1),
        "position_ids": np.concatenate([prompt_pos, last + np.arange(1, r + 1)[None, :]], axis=1),
        "response_mask": pad_rows(sampled, r_off, r),
        "rollout_log_probs": pad_rows(logprobs, r_off, r, fill=-1.0),
        "token_versions": pad_rows(versions, r_off, r, fill=-1),
    }
    if rewards is not None:
        scores = np.zeros((len(samples), r), np.float32)
        scores[np.arange(len(samples)), np.diff(r_off) - 1] = np.asarray(rewards, dtype=np.float32)
        out["token_level_scores"] = scores
    non_tensors = {"uid": np.array([s.group.prompt_id for s in samples], dtype=object),
                   "finish_reasons": np.array([s.finish_reason for s in samples], dtype=object),
                   "__num_turns__": np.array([1 + (len(s.turns) if s.turns else 1) for s in samples], dtype=np.int32)}
    non_tensors.update(_reward_inputs(samples))
    if not numpy:
        import torch

        out = {k: torch.from_numpy(v) for k, v in out.items()}
    return TrainerBatch(tensors=out, non_tensors=non_tensors)


def _reward_inputs(samples: list[Sample]) -> dict[str, np.ndarray]:
    """verl's reward inputs of the samples' prompts (its ``non_tensor_batch`` keys), all three on every row where any
    prompt has one: verl's reward managers index ``reward_model["ground_truth"]`` and ``data_source`` on every row,
    so a row of None (or a key missing) failed a batch mixing prompts with and without a ground truth."""
    infos = [s.group.reward_info or {} for s in samples]
    truths = [s.group.ground_truth for s in samples]
    extra = [i.get("extra_info") for i in infos]
    sources = [i.get("data_source") for i in infos]
    if all(t is None for t in truths) and all(e is None for e in extra) and all(d is None for d in sources):
        return {}
    # extra_info: a copy per row, verl's reward managers write num_turns into it
    return {"reward_model": _objects([{"ground_truth": t} for t in truths]), "data_source": _objects(sources),
            "extra_info": _objects([dict(e) if isinstance(e, dict) else {} if e is None else e for e in extra])}


def _objects(values: list) -> np.ndarray:
    """A 1-D object array of ``values`` as they are (np.array would make a list of lists 2-D)."""
    out = np.empty(len(values), dtype=object)
    for k, v in enumerate(values):
        out[k] = v
    return out


def _check(s: Sample, i: int, rewards: Sequence[float | None] | None) -> None:
    """What a row needs: tokens, a log-prob each, a reward where rewards are given (errors name the sample)."""
    if not s.token_ids:
        what = f"no response tokens (finish reason {s.finish_reason!r}" + (f": {s.error}" if s.error else "") + ")"
        raise DataValueError(f"trainer_batch: sample {s.key} has {what}; pass the samples to train on")
    if len(s.logprobs) != len(s.token_ids):
        raise DataValueError(f"trainer_batch: sample {s.key} has {len(s.logprobs)} log-probs for "
                             f"{len(s.token_ids)} response tokens (an engine that reports only counts?)")
    if rewards is not None and rewards[i] is None:
        raise DataValueError(f"trainer_batch: sample {s.key} has no reward" + (f" ({s.error})" if s.error else "")
                             + "; pass the samples to train on, or rewards=")


def _width(lengths: np.ndarray, width: int | None, name: str, samples: list[Sample]) -> int:
    longest = int(lengths.max())
    if width is None:
        return longest
    if longest > width:
        i = int(np.argmax(lengths))
        raise DataValueError(f"trainer_batch: sample {samples[i].key} has {longest} tokens, over {name}={width}")
    return int(width)
