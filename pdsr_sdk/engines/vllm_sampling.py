"""A request's sampling settings as vLLM's ``SamplingParams`` keys, from a ``SamplingConfig`` or the Ray wire's
``WireSampling`` (the same names)."""

from __future__ import annotations

from typing import Any


def sampling_args(s: Any, ignore_eos: bool) -> dict[str, Any]:
    """The keys of ``SamplingParams`` that ``s`` sets (the request's own: max_tokens, logprobs ... are not here)."""
    return dict(
        temperature=s.temperature, top_p=s.top_p, top_k=s.top_k if s.top_k > 0 else 0, min_p=s.min_p,
        presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
        repetition_penalty=s.repetition_penalty,
        stop=list(s.stop) or None,
        # extra EOS ids (verl's): ignored with the EOS, as vLLM ignores the model's generation-config ones
        stop_token_ids=None if ignore_eos else list(s.stop_token_ids) or None,
        ignore_eos=ignore_eos,
    )
