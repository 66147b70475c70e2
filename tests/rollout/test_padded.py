"""trainer_batch: a step's samples in verl's padded layout, each row checked against the sample it came from,
built here token by token."""

from __future__ import annotations

import numpy as np
import pytest

from pdsr_sdk.dispatch.types import Group, Sample, SegmentRecord, TurnRecord
from pdsr_sdk.errors import ConfigValueError, DataValueError
from pdsr_sdk.rollout.padded import trainer_batch

PAD = 0


def sample(pid, prompt, tokens, *, mask=None, spans=((0, None, 0),), reason="stop", index=0):
    g = Group(prompt_id=pid, prompt_token_ids=list(prompt), prompt_text="", n=1)
    s = Sample(group=g, index=index, max_tokens=64, token_ids=list(tokens),
               logprobs=[-0.1 * (k + 1) for k in range(len(tokens))], finish_reason=reason, response_mask=mask)
    s.segments = [SegmentRecord(pool="fast", engine="fast-0", start_token=a, num_tokens=len(tokens) - a if n is None
                                else n, policy_version=v) for a, n, v in spans]
    g.samples = [s]
    return s


def multi_turn(s):
    """``s`` as a model turn, the environment's answer and a second model turn, after its response mask."""
    s.turns = [TurnRecord(role=role, start_token=a, num_tokens=n) for role, a, n in
               (("assistant", 0, 1), ("environment", 1, 2), ("assistant", 3, 1))]
    return s


def samples():
    return [sample("a", [5, 6, 7], [11, 12], spans=((0, 1, 3), (1, 1, 4))),      # crossed an update: versions 3, 4
            multi_turn(sample("b", [8], [13, 14, 15, 16], mask=[1, 0, 0, 1])),   # multi-turn: two environment tokens
            sample("c", [9, 10], [17], reason="length")]


def reference_row(s, p, r, reward):
    """The row verl's vLLM rollout would build for one sample, a list at a time."""
    prompt, resp = s.group.prompt_token_ids, s.token_ids
    pad_p, pad_r = p - len(prompt), r - len(resp)
    pos_prompt = [0] * pad_p + list(range(len(prompt)))
    versions = []
    for t in range(len(resp)):
        versions.append(next(seg.policy_version for seg in reversed(s.segments)
                             if seg.start_token <= t < seg.start_token + seg.num_tokens))
    return {
        "prompts": [PAD] * pad_p + prompt, "responses": resp + [PAD] * pad_r,
        "input_ids": [PAD] * pad_p + prompt + resp + [PAD] * pad_r,
        "attention_mask": [0] * pad_p + [1] * (len(prompt) + len(resp)) + [0] * pad_r,
        "position_ids": pos_prompt + [pos_prompt[-1] + k for k in range(1, r + 1)],
        "response_mask": (s.response_mask or [1] * len(resp)) + [0] * pad_r,
        "rollout_log_probs": s.logprobs + [-1.0] * pad_r,
        "token_versions": versions + [-1] * pad_r,
        "token_level_scores": [0.0] * (len(resp) - 1) + [reward] + [0.0] * pad_r,
    }


@pytest.mark.parametrize("widths", [(None, None), (5, 6)])
def test_rows_are_the_samples_in_verls_layout(widths):
    ss = samples()
    rewards = [1.0, 0.0, 0.5]
    batch = trainer_batch(ss, pad_token_id=PAD, prompt_length=widths[0], response_length=widths[1],
                          rewards=rewards, numpy=True)
    p, r = widths[0] or 3, widths[1] or 4
    assert len(batch) == 3 and batch.tensors["input_ids"].shape == (3, p + r)
    for i, (s, reward) in enumerate(zip(ss, rewards)):
        want = reference_row(s, p, r, reward)
        for key, value in want.items():
            assert batch.tensors[key][i].tolist() == pytest.approx(value), (key, i)
    assert batch.non_tensors["uid"].tolist() == ["a", "b", "c"]
    assert batch.non_tensors["finish_reasons"].tolist() == ["stop", "stop", "length"]
    assert batch.tensors["rollout_log_probs"].dtype == np.float32
    # verl's agent loop's count (user_turns + assistant_turns + 1): 2 for a single-turn sample, the prompt and its
    # turn; "b" is a model turn, a tool's answer and a second model turn: 4
    assert batch.non_tensors["__num_turns__"].tolist() == [2, 4, 2]
    assert batch.non_tensors["__num_turns__"].dtype == np.int32


def verl_reads(nt: dict) -> list[tuple]:
    """What verl's reward managers read of each row (verl/workers/reward_manager/naive.py and dapo.py, the reward
    loop's too): ``non_tensor_batch["reward_model"]["ground_truth"]``, ``["data_source"]`` and ``.get("extra_info",
    {})``, into which they write ``num_turns``."""
    reads = []
    for row in range(len(nt["uid"])):
        item = {k: v[row] for k, v in nt.items()}
        extra_info = item.get("extra_info", {})
        extra_info["num_turns"] = int(item["__num_turns__"])
        reads.append((item["reward_model"]["ground_truth"], item["data_source"], extra_info))
    return reads


def test_verls_reward_inputs_go_with_the_rows():
    """A verl trainer scores a rollout batch with its reward manager, which reads each row as :func:`verl_reads`
    does. trainer_batch had none of them: the batch could not be scored by verl's own reward managers. Now each row
    carries its prompt's, and every row has all three where any prompt had one: ``{"ground_truth": None}``, None
    and a fresh empty dict where its prompt had none (a row of None, or a key missing, failed a batch mixing prompts
    with and without a ground truth in verl's manager); a batch whose prompts had none has none of the keys."""
    ss = samples()
    info = {"split": "test", "index": 3}
    ss[0].group.ground_truth, ss[0].group.reward_info = "18", {"data_source": "openai/gsm8k", "extra_info": info}
    ss[2].group.ground_truth = {"target": ["Paris"]}
    nt = trainer_batch(ss, pad_token_id=PAD).non_tensors
    assert len(nt["reward_model"]) == len(nt["data_source"]) == len(nt["extra_info"]) == 3
    assert nt["reward_model"].dtype == object and nt["reward_model"].ndim == 1
    assert nt["reward_model"].tolist() == [{"ground_truth": "18"}, {"ground_truth": None},
                                           {"ground_truth": {"target": ["Paris"]}}]
    assert verl_reads(nt) == [("18", "openai/gsm8k", {**info, "num_turns": 2}), (None, None, {"num_turns": 4}),
                              ({"target": ["Paris"]}, None, {"num_turns": 2})]
    assert info == {"split": "test", "index": 3} and nt["extra_info"][1] is not nt["extra_info"][2]
    # ground truths alone (no data_source, no extra_info anywhere): the three keys still, as verl reads them
    ss = samples()
    ss[1].group.ground_truth = "7"
    assert verl_reads(trainer_batch(ss, pad_token_id=PAD).non_tensors) == [
        (None, None, {"num_turns": 2}), ("7", None, {"num_turns": 4}), (None, None, {"num_turns": 2})]
    plain = trainer_batch(samples(), pad_token_id=PAD).non_tensors
    assert {"reward_model", "data_source", "extra_info"}.isdisjoint(plain)


def test_torch_tensors_by_default_and_no_scores_without_rewards():
    import torch

    batch = trainer_batch(samples(), pad_token_id=PAD)
    assert all(isinstance(v, torch.Tensor) for v in batch.tensors.values())
    assert batch.tensors["input_ids"].dtype == torch.int64 and "token_level_scores" not in batch.tensors


def test_what_cannot_be_a_row_is_named():
    with pytest.raises(DataValueError, match="sample b/0 has 4 tokens, over response_length=3"):
        trainer_batch(samples(), pad_token_id=PAD, response_length=3)
    with pytest.raises(DataValueError, match="sample a/0 has 3 tokens, over prompt_length=2"):
        trainer_batch(samples(), pad_token_id=PAD, prompt_length=2)
    failed = sample("d", [1], [], reason="failed")
    failed.error = "RuntimeError: the tool crashed"
    with pytest.raises(DataValueError, match=r"sample d/0 has no response tokens \(finish reason 'failed': "
                                             r"RuntimeError: the tool crashed\); pass the samples to train on"):
        trainer_batch([*samples(), failed], pad_token_id=PAD)
    with pytest.raises(DataValueError, match="sample b/0 has no reward; pass the samples to train on, or rewards="):
        trainer_batch(samples(), pad_token_id=PAD, rewards=[1.0, None, 0.0])
    counted = sample("e", [1], [2, 3])
    counted.logprobs = []
    with pytest.raises(DataValueError, match="sample e/0 has 0 log-probs for 2 response tokens"):
        trainer_batch([counted], pad_token_id=PAD)
    with pytest.raises(DataValueError, match="2 rewards for 3 samples"):
        trainer_batch(samples(), pad_token_id=PAD, rewards=[1.0, 0.0])
    # a tokenizer without a pad token (Llama's) has pad_token_id None: it used to fail deep in the padding
    with pytest.raises(ConfigValueError, match=r"trainer_batch: pad_token_id must be a token id \(an int\), got None; "
                                               r"a tokenizer without a pad token gives None: pass its eos_token_id"):
        trainer_batch(samples(), pad_token_id=None)
    for bad in ("0", 1.0, True):
        with pytest.raises(ConfigValueError, match=f"pad_token_id must be a token id \\(an int\\), got {bad!r}$"):
            trainer_batch(samples(), pad_token_id=bad)
    assert trainer_batch(samples(), pad_token_id=np.int64(7), numpy=True).tensors["responses"][2, -1] == 7


def test_a_forward_over_the_batch_gives_each_samples_unbatched_log_probs(tiny_model_dir):
    """The layout is one a model reads as verl's trainer does (left-padded prompts, position_ids, the response's
    columns): its log-probs of the response tokens equal the scorer's, one sample at a time (a float64 model; the
    scorer returns float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk.scoring import per_token_logps

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float64).eval()
    rng = np.random.default_rng(0)
    ss = [sample(f"p{i}", rng.integers(5, 400, size=int(rng.integers(1, 9))).tolist(),
                 rng.integers(5, 400, size=int(rng.integers(1, 12))).tolist()) for i in range(6)]
    t = trainer_batch(ss, pad_token_id=PAD).tensors
    width = t["responses"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"],
                       position_ids=t["position_ids"]).logits[:, -width - 1:-1]
        got = torch.gather(torch.log_softmax(logits, -1), 2, t["responses"][:, :, None]).squeeze(2)
    for i, s in enumerate(ss):
        want = per_token_logps(model, [s.group.prompt_token_ids], [s.token_ids], backend="torch").logps[0]
        assert got[i, :len(s.token_ids)].numpy() == pytest.approx(want, rel=1e-6)
