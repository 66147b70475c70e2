"""Off-policy bookkeeping for a trainer: which policy version sampled each token, and the standard
importance-sampling corrections computed from the engine's log-probs.

A rollout that carries samples across steps (partial rollout) or an engine whose numerics differ from
the trainer's samples tokens from a policy other than the one being trained. The trainer corrects with
the per-token ratio ``pi_train / pi_rollout`` of its own log-probs to the engine's
(``response_logprobs`` in the trajectories):

- TIS, truncated importance sampling: weight ``min(ratio, upper)``;
- MIS, masked importance sampling: weight ``ratio``, and tokens whose ratio is outside
  ``[lower, upper]`` are left out of the loss (its mask *and* its denominator, as verl does; slime since May
  2026 keeps them in its denominator: divide by the mask for its numbers, docs/sdk-batch.md);
- at token, sequence (product of the token ratios) or geometric (their geometric mean) level;
- optionally normalized to mean 1 over the batch, and with a veto rejecting a sequence that holds a token whose
  ratio is below a threshold (verl's ``rollout_is_batch_normalize`` and ``rollout_token_veto_threshold``).

verl's ``rollout_rs`` k1 options bound ``1 / ratio`` by ``"lower_upper"``: ``lower=1/upper_verl,
upper=1/lower_verl`` here gives its rejections (docs/sdk-batch.md, "Off-policy corrections").

``token_versions`` turns a trajectory row's ``segments`` into the policy version of each response
token; ``off_policy_share`` is the share of tokens sampled before the current version.
"""

from pdsr_sdk.offpolicy.correction import (
    LEVELS,
    MODES,
    importance_weights,
    off_policy_share,
    token_versions,
    token_versions_of_rows,
)

__all__ = ["LEVELS", "MODES", "importance_weights", "off_policy_share", "token_versions",
           "token_versions_of_rows"]
