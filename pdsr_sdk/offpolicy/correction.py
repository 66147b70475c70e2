"""Vectorised kernels of the off-policy corrections (numpy, or torch tensors in and out).

Plain arrays and numbers in and out; the float64 loop twins are in :mod:`pdsr_sdk.offpolicy.reference`.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from pdsr_sdk.errors import ConfigValueError, DataValueError

LEVELS = ("token", "sequence", "geometric")
MODES = ("truncate", "mask")

#: log-ratios are clamped here before exp(): a token the trainer finds e^20 times likelier is an outlier
#: either way, and exp() of more overflows float32
LOG_RATIO_CLAMP = 20.0


def token_versions(starts: Any, counts: Any, versions: Any, length: int) -> np.ndarray:
    """Policy version of each of ``length`` response tokens, from a sample's spans in order.

    Span ``i`` covers tokens ``[starts[i], starts[i] + counts[i])``; a later span overwrites an earlier
    one (after a restart the spans start at 0 again and the discarded tokens are gone). A token no span
    covers is -1: a multi-turn row's environment tokens (no policy sampled them), else a row whose spans do not
    cover every sampled token.
    """
    out = np.full(int(length), -1, dtype=np.int64)
    for start, count, version in zip(np.asarray(starts), np.asarray(counts), np.asarray(versions)):
        out[int(start):int(start) + int(count)] = int(version)
    return out


def token_versions_of_rows(rows: Iterable[Mapping[str, Any]]) -> list[np.ndarray]:
    """:func:`token_versions` of every trajectory row (dicts with ``segments`` and ``response_length``,
    e.g. ``table.to_pylist()`` of a ``pdsr rollout`` output)."""
    out = []
    for i, row in enumerate(rows):
        missing = [k for k in ("segments", "response_length") if k not in row]
        spans = row.get("segments") or []
        missing += sorted({f"segments[].{k}" for s in spans for k in _SPAN_KEYS if k not in s})
        if missing:
            which = f"row {i}" + (f" (prompt {row['prompt_id']!r}, sample {row.get('sample_index')})"
                                  if "prompt_id" in row else "")
            raise DataValueError(f"token_versions_of_rows: {which} has no {', '.join(missing)}; expected "
                                 f"trajectory rows with segments (start_token, num_tokens, policy_version) and "
                                 f"response_length, e.g. out.table.to_pylist() of a step's result")
        out.append(token_versions([s["start_token"] for s in spans], [s["num_tokens"] for s in spans],
                                  [s["policy_version"] for s in spans], row["response_length"]))
    return out


_SPAN_KEYS = ("start_token", "num_tokens", "policy_version")


def _as_2d(x: Any, name: str, xp: Any, dtype: Any, device: Any = None) -> Any:
    """``x`` as a [B, T] array (numpy) or tensor (torch); ragged rows are a DataValueError naming ``name``."""
    try:
        return xp.as_tensor(x, device=device).detach().to(dtype) if xp is not np else np.asarray(x, dtype)
    except (ValueError, TypeError) as exc:
        lengths = [len(r) for r in x] if isinstance(x, (list, tuple)) and all(hasattr(r, "__len__") for r in x) \
            else None
        shown = f" (row lengths {', '.join(map(str, lengths[:8]))}{', ...' if len(lengths) > 8 else ''})" \
            if lengths else ""
        raise DataValueError(f"importance_weights: {name} must be a [B, T] array or tensor with rows of one length, "
                             f"got {type(x).__name__}{shown}: {exc}; pad ragged rows first (per_token_logps(...)."
                             f"padded(width), trainer_batch's layout)") from None


def _kept_mean(weights: Any, keep: Any, level: str, xp: Any) -> float:
    """The mean weight over the kept tokens, or (per sequence) over the sequences with one, each counted once;
    1 where nothing is kept or the mean is under 1e-8 (verl's guard), so nothing divides by 0."""
    if level == "token":
        total, count = float((weights * keep).sum()), int(keep.sum())
    else:   # a sequence's kept tokens share its weight
        rows = keep.any(1)
        per_row = (weights * keep).sum(1) / xp.clip(keep.sum(1), 1, None)
        total, count = float((per_row * rows).sum()), int(rows.sum())
    mean = total / count if count else 1.0
    return mean if mean > 1e-8 else 1.0


def _bound(key: str, value: Any) -> float | None:
    """``value`` as a float (None stays None for ``lower`` and ``veto``); text or a bool is a ConfigValueError naming
    ``key`` (float('2') would pass)."""
    if value is None and key in ("lower", "veto"):
        return None
    try:
        if value is None or isinstance(value, (str, bytes, bool)):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise ConfigValueError(f"{key}: expected a number, got {value!r}") from None


def off_policy_share(versions: Any, current: int, mask: Any = None) -> float:
    """Share of the (masked) tokens sampled with a policy version older than ``current``; 0 when none. A token
    with no version (-1: the environment's tokens of a multi-turn response, padding) was not sampled: it counts
    on neither side."""
    v = np.asarray(versions)
    keep = (np.ones(v.shape, bool) if mask is None else np.asarray(mask, bool)) & (v >= 0)
    total = int(keep.sum())
    return float(((v < current) & keep).sum() / total) if total else 0.0


def importance_weights(trainer_logprobs: Any, rollout_logprobs: Any, mask: Any, *, level: str = "token",
                       mode: str = "truncate", upper: float = 2.0, lower: float | None = None,
                       normalize: bool = False, veto: float | None = None) -> tuple[Any, Any]:
    """(weights, keep) for [B, T] log-probs of the sampled tokens and their [B, T] mask.

    ``ratio = exp(trainer - rollout)`` per token (``level="token"``), or per sequence: the product
    (``"sequence"``) or geometric mean (``"geometric"``) of the masked token ratios, given to each of its
    tokens. ``mode="truncate"`` (TIS): ``weights = min(ratio, upper)``, or ``clip(ratio, lower, upper)`` when
    ``lower`` is given (TRL's ``clip_min``, OpenRLHF's TIS low), ``keep = mask``.
    ``mode="mask"`` (MIS): ``weights = ratio``, ``keep = mask & (lower <= ratio <= upper)`` with
    ``lower`` defaulting to ``1 / upper``. Weights are 0 where ``keep`` is false. Multiply the
    per-token loss by ``weights`` and normalise by ``keep.sum()``, so rejected tokens leave the
    denominator too. ``normalize=True`` divides the weights by their mean over the kept tokens (``level="token"``)
    or over the sequences with a kept token (the others: one weight per sequence), as verl's
    ``rollout_is_batch_normalize`` (over this call's batch: verl averages over every data-parallel rank's).
    ``veto`` rejects a whole sequence holding a masked-in token whose own ratio is below it (``keep`` false on
    every token, after normalizing), as verl's ``rollout_token_veto_threshold`` and slime's veto do.
    Torch tensors in give tensors out on their device (no gradient: the weights are constants of the loss).
    The weights are float64 when ``trainer_logprobs`` is, else float32 (bf16 or fp16 in too, as AReaL's
    ``behave_imp_weight``: a bf16 weight could exceed ``upper``); the ratios are computed in float64.
    Ragged rows (lists of unequal length), mismatched shapes and NaN log-probs are a
    :class:`~pdsr_sdk.errors.DataValueError` naming the argument or row.
    """
    if level not in LEVELS:
        raise ConfigValueError(f"level: expected one of {', '.join(LEVELS)}, got {level!r}")
    if mode not in MODES:
        raise ConfigValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    upper, lower = _bound("upper", upper), _bound("lower", lower)
    veto = _bound("veto", veto)
    if veto is not None and not veto > 0:
        raise ConfigValueError(f"veto: expected a ratio above 0 (a sequence with a token ratio below it is "
                               f"rejected), got {veto}")
    if not isinstance(normalize, bool):
        raise ConfigValueError(f"normalize: expected True or False, got {normalize!r}")
    if not upper > 0 or (lower is not None and not 0 <= lower <= upper):
        raise ConfigValueError(f"expected 0 <= lower <= upper and upper > 0, got lower={lower}, upper={upper}")
    low = 1.0 / upper if lower is None else lower   # mask's default; truncate clamps below only when given
    if mode == "mask" and low > upper:   # every token would be rejected
        raise ConfigValueError(f"upper: mode='mask' keeps 1 / upper <= ratio <= upper unless lower is given; upper="
                               f"{upper} < 1 keeps no token: give upper >= 1, or lower")
    if type(trainer_logprobs).__module__.startswith("torch"):   # stay on the tensors' device
        import torch as xp

        lp_t = trainer_logprobs.detach().double()
        lp_r = _as_2d(rollout_logprobs, "rollout_logprobs", xp, xp.float64, lp_t.device)
        m = _as_2d(mask, "mask", xp, xp.float64, lp_t.device)
    else:
        xp = np   # type: ignore[assignment]
        lp_t = _as_2d(trainer_logprobs, "trainer_logprobs", np, np.float64)
        lp_r = _as_2d(rollout_logprobs, "rollout_logprobs", np, np.float64)
        m = _as_2d(mask, "mask", np, np.float64)
    bad_mask = ~xp.isfinite(m)
    if bad_mask.any():   # bool(nan) is True: a NaN in the mask would keep its token
        raise DataValueError(f"mask row {int(bad_mask.nonzero()[0][0])}: a value is NaN or infinite; a mask holds "
                             f"0 or 1 per token")
    m = m != 0
    if tuple(lp_t.shape) != tuple(lp_r.shape) or tuple(lp_t.shape) != tuple(m.shape) or lp_t.ndim != 2:
        raise DataValueError(f"expected [B, T] trainer log-probs, rollout log-probs and mask of one shape, got "
                             f"{tuple(lp_t.shape)}, {tuple(lp_r.shape)} and {tuple(m.shape)}")
    with np.errstate(invalid="ignore", over="ignore"):   # padding's -inf - -inf is NaN: masked out, not a warning
        delta = xp.where(m, lp_t - lp_r, 0.0)
    bad = ~xp.isfinite(delta)
    if bad.any():
        raise DataValueError(f"row {int(bad.nonzero()[0][0])}: a masked-in log-prob is NaN or infinite")
    if level == "token":
        log_ratio = delta
    else:   # one ratio per sequence, given to each of its tokens
        per_seq = delta.sum(1)[:, None]
        if level == "geometric":
            per_seq = per_seq / xp.clip(m.sum(1)[:, None], 1, None)
        log_ratio = per_seq + 0.0 * delta
    ratio = xp.exp(xp.clip(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    if mode == "truncate":
        keep, weights = m, xp.clip(ratio, lower, upper)
    else:
        keep, weights = m & (ratio >= low) & (ratio <= upper), ratio
    if normalize:
        weights = weights / _kept_mean(weights, keep, level, xp)
    if veto is not None:   # the raw token ratio (not the level's), unclamped: log(veto) in log space
        keep = keep & ~(m & (delta < float(np.log(veto)))).any(1)[:, None]
    weights = xp.where(keep, weights, 0.0)
    # float64 in, float64 out; anything else float32, never narrower: a bf16 weight of min(ratio, 1.2) is 1.203125
    wide = (trainer_logprobs if xp is not np else np.asarray(trainer_logprobs)).dtype == xp.float64
    out = xp.float64 if wide else xp.float32
    return (weights.to(out) if xp is not np else weights.astype(out)), keep
