"""What ``pdsr serve`` does with a request's sampling fields: every request samples with the session's settings
(``config.sampling``), as a rollout's samples do, so a field that asks for something else (``temperature: 0``,
``top_logprobs: 5``, a ``seed``, a vLLM option such as ``skip_special_tokens: false``) is a 400 that names it, what the
session uses, and how to change that, never silently ignored (an RL user's importance ratios or greedy evaluation would
be wrong without a word). A field left out, null, or equal to what the session does passes. ``n`` and ``max_tokens`` are
the request's own (:meth:`~pdsr_sdk.rollout.serve.ChatServer.common`)."""

from __future__ import annotations

from typing import Any, Callable

from pdsr_sdk.rollout.serve_error import ServeError

#: a field the session has a setting for: what it samples with, and where that is changed
_SET = ("this session samples every request with {field} {session!r}; to sample with another, serve with {how}, "
        "or leave {field} out")
#: a field the session has no setting for
_NONE = ("pdsr does not apply a request's {field} (every request samples alike, with the session's settings); leave "
         "it out or null")
#: a field that changes what a response holds beyond the sampled text
_PLAIN = ("pdsr answers with the sampled text alone (no echoed prompt, suffix or structured output); leave {field} "
          "out or null")
#: a vLLM or OpenAI option pdsr has no counterpart of, asked for with a value other than its default
_OPTION = "pdsr does not apply a request's {field} (it answers as with {default!r}); leave it out, null or {default!r}"
#: tool_choice other than auto
_TOOLS = ("pdsr does not constrain the model's tool calls (tool_choice 'auto' only: the model decides, and "
          "--tool-parser parses its calls); leave tool_choice out or 'auto'")
#: a request that asks for log-probs pdsr does not record
_LOGPROBS = ("pdsr records the log-prob of each sampled token only (chat: logprobs true; completions: logprobs 0), "
             "no alternatives and no prompt's; leave {field} out, null or {session!r}")


def _number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ServeError(400, f"{field} must be a number, got {value!r:.80}")
    return float(value)


def _stop(value: Any) -> list[str]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ServeError(400, f"stop must be a string or a list of strings, got {value!r:.80}")
    return stops


def _token_ids(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise ServeError(400, f"stop_token_ids must be a list of token ids (integers), got {value!r:.80}")
    return value


def _bad_count(field: str, value: Any) -> int:
    raise ServeError(400, f"{field} must be a non-negative integer, got {value!r:.80}")


def _fields(sampling: Any, chat: bool) -> list[tuple[str, Any, Callable[[Any], Any], str]]:
    """(field, the session's value, the request's value as compared, why it is refused) per checked field (the
    response's own fields too: echo, suffix, response_format)."""
    def number(field: str) -> Callable[[Any], float]:
        return lambda v: _number(field, v)

    def setting(field: str, session: Any, how: str) -> str:
        return _SET.format(field=field, session=session, how=how)

    config = "sampling.{} (a --config file; RolloutConfig.sampling in the SDK)".format
    top_k = sampling.top_k if sampling.top_k > 0 else 0
    same = lambda v: v  # noqa: E731
    fields = [
        ("temperature", sampling.temperature, number("temperature"),
         setting("temperature", sampling.temperature, "pdsr serve --temperature or " + config("temperature"))),
        ("top_p", sampling.top_p, number("top_p"),
         setting("top_p", sampling.top_p, "pdsr serve --top-p or " + config("top_p"))),
        ("top_k", top_k, lambda v: max(_number("top_k", v), 0.0),   # 0 and -1 both turn it off, as in vLLM
         setting("top_k", top_k, config("top_k"))),
        ("stop", list(sampling.stop), _stop, setting("stop", list(sampling.stop), config("stop"))),
        ("stop_token_ids", list(sampling.stop_token_ids), _token_ids,
         setting("stop_token_ids", list(sampling.stop_token_ids), config("stop_token_ids"))),
        *[(k, getattr(sampling, k), number(k), setting(k, getattr(sampling, k), config(k)))
          for k in ("min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")],
        ("ignore_eos", sampling.ignore_eos, bool, setting("ignore_eos", sampling.ignore_eos, config("ignore_eos"))),
    ]
    fields += [(field, session, read, _NONE.format(field=field)) for field, session, read in [
        ("seed", None, same), ("min_tokens", 0, same), ("logit_bias", {}, same),
        ("use_beam_search", False, bool)]]
    # chat: logprobs is a bool (served: serve_logprobs) and top_logprobs how many alternatives; completions:
    # logprobs is how many alternatives (0: the sampled token's own, served)
    def flag(v: Any) -> bool:
        if not isinstance(v, bool):
            raise ServeError(400, f"logprobs must be true or false, got {v!r:.80}")
        return False   # either way: served

    def count(field: str) -> Callable[[Any], Any]:
        return lambda v: v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else _bad_count(field, v)

    logprobs = ([("logprobs", False, flag), ("top_logprobs", 0, count("top_logprobs"))] if chat
                else [("logprobs", 0, count("logprobs"))])
    fields += [(field, session, read, _LOGPROBS.format(field=field, session=session))
               for field, session, read in logprobs + [("prompt_logprobs", None, same)]]
    text_format = lambda v: None if v == {"type": "text"} else v  # noqa: E731 - plain text is the default
    fields += [(field, session, read, _PLAIN.format(field=field))
               for field, session, read in [("echo", False, same), ("suffix", None, same),
                                            ("response_format", None, text_format)]]
    # vLLM's own options (extra_body) and OpenAI's that change what is sampled or answered: their defaults pass
    options = [("skip_special_tokens", True), ("spaces_between_special_tokens", True),
               ("truncate_prompt_tokens", None), ("allowed_token_ids", None), ("bad_words", []),
               ("structured_outputs", None), ("length_penalty", 1.0), ("reasoning_effort", None)]
    options += ([("add_special_tokens", False), ("chat_template", None), ("documents", None),
                 ("parallel_tool_calls", True)] if chat else [("add_special_tokens", True)])
    fields += [(field, default, same, _OPTION.format(field=field, default=default)) for field, default in options]
    if chat:
        fields.append(("tool_choice", "auto", same, _TOOLS))
    return fields


def check_sampling(body: dict[str, Any], sampling: Any, *, chat: bool, n: int) -> None:
    """A 400 for the first sampling field of a request ``body`` that asks for other sampling than the session's
    (``sampling``: its ``SamplingConfig``), naming the field, the session's value and how to change it."""
    for field, session, read, why in _fields(sampling, chat):
        value = body.get(field)
        if value is not None and read(value) != session:
            raise ServeError(400, f"{field} {value!r:.80}: {why}")
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise ServeError(400, f"best_of {best_of!r:.80}: pdsr returns every sample of a request (n = {n}); leave "
                              f"best_of out or equal to n")
