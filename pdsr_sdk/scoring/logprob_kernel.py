"""Per-token log-probs (and entropy) from hidden states, in row chunks, in fp32.

Pure tensor math: no IO, no configs, no models beyond a ``head`` callable.

``chunked_token_logps`` never materialises fp32 logits for more than
``row_chunk`` positions at once: for each chunk of rows it applies the head
(lm_head) in the model's dtype, upcasts that chunk to fp32, divides by the
temperature, and reduces it to ``target logit - logsumexp`` (and optionally
``entropy = logsumexp - sum(softmax * logits)``) before the next chunk.
Logits, exponentials and row sums are fp32; the log and the final
subtraction are float64, so each result is rounded to fp32 once.
Peak extra memory is one fp32 ``row_chunk x vocab`` buffer (two with
entropy), plus the head's output in the model dtype while it is upcast,
independent of the number of tokens.

``naive_token_logps`` is its independent twin: full float64 ``log_softmax``
over all rows and a gather.
"""

from __future__ import annotations

from typing import Callable

import torch

Head = Callable[[torch.Tensor], torch.Tensor]


def chunked_token_logps(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    head: Head | None = None,
    *,
    temperature: float = 1.0,
    row_chunk: int = 512,
    return_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of ``targets[i]`` under ``softmax(head(hidden[i]) / temperature)``, chunk by chunk.

    Args:
        hidden: [N, H] hidden states (any float dtype), or [N, V] logits when ``head`` is None.
        targets: [N] int token ids.
        head: maps [n, H] -> [n, V] logits (e.g. ``model.lm_head``); None = ``hidden`` are logits.
        temperature: logits are divided by it (in fp32) before the softmax.
        row_chunk: rows per chunk.
        return_entropy: also return the entropy of each row's distribution.

    Returns:
        (logps [N] float32, entropy [N] float32 or None), on ``hidden``'s device.
    """
    if hidden.dim() != 2:
        raise ValueError(f"hidden: expected [N, H], got shape {tuple(hidden.shape)}")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets: expected shape [{hidden.shape[0]}], got {tuple(targets.shape)}")
    if row_chunk < 1:
        raise ValueError(f"row_chunk: expected >= 1, got {row_chunk}")
    if not temperature > 0:
        raise ValueError(f"temperature: expected > 0, got {temperature}")
    n = hidden.shape[0]
    logps = torch.empty(n, dtype=torch.float32, device=hidden.device)
    entropy = torch.empty(n, dtype=torch.float32, device=hidden.device) if return_entropy else None
    targets = targets.to(device=hidden.device, dtype=torch.long)
    hidden_storage = hidden.untyped_storage().data_ptr()
    for start in range(0, n, row_chunk):
        stop = min(start + row_chunk, n)
        chunk = hidden[start:stop]
        z = (head(chunk) if head is not None else chunk).float()
        # modify in place only our own copy, never the caller's tensor
        owned = z.untyped_storage().data_ptr() != hidden_storage
        if temperature != 1.0:
            z = z.div_(temperature) if owned else z / temperature
            owned = True
        shift = z.amax(dim=-1, keepdim=True)
        z = z.sub_(shift) if owned else z - shift  # z - max: every exp() <= 1
        target = z.gather(-1, targets[start:stop, None]).squeeze(-1)
        if entropy is None:
            s = z.exp_().sum(dim=-1)  # in place: a single [rows, vocab] fp32 buffer
        else:
            e = torch.exp(z)
            s = e.sum(dim=-1)
            # H = logsumexp - sum(softmax * logits) = log s - sum(e * (z - max)) / s;
            # clamp: a -inf logit has e == 0 and must add 0, not 0 * -inf = nan
            ez = e.mul_(z.clamp_min_(torch.finfo(torch.float32).min)).sum(dim=-1)
            del e
        # fp32 logits, exp and row sums (a float64 sum would copy the chunk to
        # float64); the log and the final subtraction run in float64 so each
        # result is rounded to fp32 once
        log_s = torch.log(s.double())
        logps[start:stop] = (target.double() - log_s).float()
        if entropy is not None:
            entropy[start:stop] = (log_s - ez.double() / s.double()).float()
        del z
    return logps, entropy


def naive_token_logps(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference twin: float64 full ``log_softmax(logits / temperature)`` and a gather.

    Entropy is ``-sum(p * log p)`` (a different formula from the chunked one).
    Returns float64 tensors.
    """
    z = logits.to(torch.float64) / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    logps = logp_all.gather(-1, targets.to(torch.long)[:, None]).squeeze(-1)
    entropy = None
    if return_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logps, entropy
