"""Shared by the scoring tests: random samples for the tiny model and an independent per-sample reference.

The reference is one unpadded full-model forward per sample, ``log_softmax(model(ids).logits.float(), -1)``
gathered; :func:`max_diff` compares relative to max(1, |log-prob|) (see tests/scoring/test_scoring.py).
"""

from __future__ import annotations

import numpy as np
import torch


def random_samples(seed, n, vocab=1024, max_prompt=40, max_completion=150):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, vocab, int(rng.integers(1, max_prompt))).tolist() for _ in range(n)]
    completions = [rng.integers(0, vocab, int(rng.integers(1, max_completion))).tolist() for _ in range(n)]
    return prompts, completions


def naive_logps(model, prompts, completions, temperature=1.0, entropy=False):
    """One unpadded full-model forward per sample; fp32 log_softmax of the full logits, gathered."""
    out, ents = [], []
    for p, c in zip(prompts, completions):
        ids = torch.tensor([p + c])
        with torch.inference_mode():
            logits = model(ids).logits.float()[0, len(p) - 1:-1] / temperature
        logp = torch.log_softmax(logits, -1)
        out.append(logp.gather(-1, torch.tensor(c)[:, None])[:, 0].numpy())
        ents.append((-(logp.double().exp() * logp.double()).sum(-1)).numpy())
    return (out, ents) if entropy else out


def max_diff(a, b):
    """max |a - b| / max(1, |b|) over all tokens of all samples (shapes must match)."""
    assert len(a) == len(b)
    worst = 0.0
    for x, y in zip(a, b):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        assert x.shape == y.shape
        worst = max(worst, float((np.abs(x - y) / np.maximum(1.0, np.abs(y))).max()))
    return worst
