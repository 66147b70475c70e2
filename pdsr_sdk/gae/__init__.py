"""Generalized advantage estimation (GAE) with a response mask; GRPO, RLOO and REINFORCE++ advantages
(:mod:`pdsr_sdk.gae.outcome`).

Semantics (verl's ``compute_gae_advantage_return``), per row, walking t
backwards from the end with ``lastgae = 0`` and ``next_v = 0``::

    delta = r[t] + gamma * next_v - V[t]
    cand  = delta + gamma * lam * lastgae
    if mask[t]:  lastgae, next_v = cand, V[t]      # valid token
    else:        lastgae, next_v unchanged          # masked: skipped
    advantages[t] = lastgae
    returns = advantages + values

So at an interior masked position the advantage is the carried advantage of
the next valid token, after the last valid token it is 0, and rewards (and
values) at masked positions never enter the state. No whitening is applied:
verl's ``compute_gae_advantage_return`` returns ``masked_whiten(advantages,
mask)`` and the unwhitened ``returns``; :func:`masked_whiten` gives those.

How this relates to other conventions:

- Right-padded masks (valid tokens are a prefix of each row): identical to
  plain unmasked GAE on the valid prefix with bootstrap V = 0 after the
  last valid token; the padding gets advantage 0.
- Zero-masked, unmasked GAE (slime pads ``full_rewards``/``full_values``
  with zeros and runs the plain recurrence with no mask): for right padding
  with padded values 0 the two agree on every valid token. They differ for
  interior masks (e.g. tool-output spans in multi-turn RL): pdsr skips the
  span, so the token before it bootstraps from the next valid token with
  one gamma and one lambda, whereas the zero-padded recurrence discounts
  through every masked position and bootstraps from the zero values there.

Backends (:data:`GAE_BACKENDS`, each a :class:`GaeBackend`):
``reference`` (float64 loop, the oracle), ``numba`` (CPU, parallel over
rows), ``torch`` (chunk-scan, CPU or CUDA tensors), ``triton`` (fused
chunked scan, CUDA tensors); ``auto`` picks triton for CUDA tensors when
triton is installed (torch otherwise) and numba for everything else.
"""

from pdsr_sdk.gae.api import GAE_BACKENDS, GaeBackend, compute_gae, get_backend, resolve_backend_name
from pdsr_sdk.gae.grpo import grpo_advantages
from pdsr_sdk.gae.outcome import reinforce_pp_advantages, reinforce_pp_baseline_advantages, rloo_advantages
from pdsr_sdk.gae.whiten import masked_whiten

__all__ = ["GAE_BACKENDS", "GaeBackend", "compute_gae", "get_backend", "grpo_advantages", "masked_whiten",
           "reinforce_pp_advantages", "reinforce_pp_baseline_advantages", "resolve_backend_name",
           "rloo_advantages"]
