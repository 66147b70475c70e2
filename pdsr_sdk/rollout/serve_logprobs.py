"""Log-probs in ``pdsr serve``'s answers, in vLLM's server's shapes: a request asking for them (chat:
``logprobs: true``; completions: ``logprobs: 0``) gets the engine's log-prob of each sampled token, the one the
sample records for training (as ``logprobs_mode`` says: by default of the distribution sampled from, after
temperature and the rest). No alternatives are recorded, so ``top_logprobs`` above 0 (completions:
``logprobs`` above 0) is refused by :mod:`pdsr_sdk.rollout.serve_sampling`."""

from __future__ import annotations

from typing import Any

from pdsr_sdk.rollout.serve_error import ServeError


def wanted(body: dict[str, Any], *, chat: bool) -> bool | None:
    """None unless the request asks for log-probs; else whether tokens are named ``token_id:ID``
    (``return_tokens_as_token_ids``, vLLM's)."""
    asked = bool(body.get("logprobs")) if chat else body.get("logprobs") is not None
    if not asked:
        return None
    as_ids = body.get("return_tokens_as_token_ids")
    if as_ids is not None and not isinstance(as_ids, bool):
        raise ServeError(400, f"return_tokens_as_token_ids must be true or false, got {as_ids!r:.80}")
    return bool(as_ids)


def choice_logprobs(tokenizer: Any, token_ids: list[int], logprobs: list[float], *, chat: bool,
                    as_ids: bool, start: int = 0) -> dict[str, Any]:
    """A choice's ``logprobs`` object: chat's ``{"content": [{token, logprob, bytes, top_logprobs: []}]}``, or
    completions' ``{tokens, token_logprobs, top_logprobs, text_offset}`` (each top entry the sampled token's own,
    as vLLM's are for ``logprobs: 0``; ``start``: the first token's offset, a stream chunk's after the last's)."""
    if len(logprobs) != len(token_ids):
        raise ServeError(500, f"the engine reported {len(logprobs)} log-probs for {len(token_ids)} sampled tokens")
    tokens = [f"token_id:{i}" if as_ids else tokenizer.decode([i]) for i in token_ids]
    values = [max(lp, -9999.0) for lp in logprobs]   # -inf is not JSON: OpenAI's floor, as vLLM's
    if chat:
        return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8", errors="replace")),
                             "top_logprobs": []} for t, lp in zip(tokens, values)]}
    offsets, at = [], start
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": [{t: lp} for t, lp in zip(tokens, values)],
            "text_offset": offsets}
