"""The OpenAI response objects :class:`~pdsr_sdk.rollout.serve.ChatServer` answers with: a sampled turn's message
(its tool calls parsed), a choice, its text and log-probs, and the envelope with its usage, in vLLM's server's
shapes."""

from __future__ import annotations

import itertools
import time
from typing import Any

from pdsr_sdk.dispatch.types import LENGTH, STOP, TRUNCATED, Sample
from pdsr_sdk.rollout.serve_logprobs import choice_logprobs

__all__ = ["FINISH", "ResponseShapes"]

#: finish reasons as OpenAI's API names them
FINISH = {STOP: "stop", LENGTH: "length", TRUNCATED: "length"}


class ResponseShapes:
    """The response-building half of :class:`~pdsr_sdk.rollout.serve.ChatServer`: it reads the server's
    ``session`` (its tokenizer), ``tool_parser``, ``model_name`` and ``_ids`` (the server's counter of ids)."""

    session: Any
    tool_parser: str | None
    model_name: str
    _ids: itertools.count

    def message(self, text: str, token_ids: list[int]) -> dict[str, Any]:
        """The assistant message of a sampled turn, its tool calls parsed with ``tool_parser``."""
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.tool_parser:
            from pdsr_sdk.agent import parse_tool_calls

            raw = self.session.tokenizer.decode(token_ids, skip_special_tokens=False)
            content, calls = parse_tool_calls(raw, self.session.tokenizer, self.tool_parser)
            if calls:
                from pdsr_sdk.agent.tool_stream import json_text

                message["content"] = content or None
                message["tool_calls"] = [{"id": f"call-{next(self._ids)}", "type": "function", "function": {
                    "name": c.name, "arguments": json_text(c.arguments)}} for c in calls]
        return message

    def chat_choice(self, index: int, text: str, token_ids: list[int], finish_reason: str,
                    stop: str | int | None = None, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        """A chat response's choice of a sampled turn; its finish reason ``tool_calls`` where the turn ended
        calling tools, as OpenAI's (and vLLM's) is; ``stop``: its ``stop_reason`` as vLLM's server fills it (the stop
        string or stop token id that ended the turn; None when the model's EOS or a limit did); ``logprobs``: its
        log-probs object (:meth:`logprobs`), None when not asked for."""
        message = self.message(text, token_ids)
        finish = FINISH.get(finish_reason, "stop")
        if finish == "stop" and message.get("tool_calls"):
            finish = "tool_calls"
        return {"index": index, "message": message, "finish_reason": finish, "stop_reason": stop, "logprobs": logprobs,
                "token_ids": list(token_ids)}

    def text_of(self, sample: Sample, include_stop: bool) -> str:
        """A plain request's answer text, as vLLM's server gives it: the sampled text, special tokens skipped, cut
        before the stop string that ended it (``include_stop``: after it). The sampled ids hold the stop string
        (the token that completed it too); a named sample's turn keeps it, as its trajectory does."""
        text = self.session.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        stop = sample.stop_reason
        at = text.find(stop) if isinstance(stop, str) and stop else -1
        return text if at < 0 else text[:at + (len(stop) if include_stop else 0)]

    def logprobs(self, token_ids: list[int], logprobs: list[float], *, chat: bool,
                 want: bool | None) -> dict[str, Any] | None:
        """A choice's ``logprobs`` (:mod:`pdsr_sdk.rollout.serve_logprobs`); ``want``: None when the request did
        not ask for them, else whether tokens are named by id."""
        if want is None:
            return None
        return choice_logprobs(self.session.tokenizer, list(token_ids), list(logprobs), chat=chat, as_ids=want)

    def _chat_response(self, samples: list[Sample], prompt: list[int], include_stop: bool = False,
                       want: bool | None = None) -> dict[str, Any]:
        choices = [self.chat_choice(s.index, self.text_of(s, include_stop), s.token_ids, s.finish_reason or "",
                                    s.stop_reason, self.logprobs(s.token_ids, s.logprobs, chat=True, want=want))
                   for s in samples]
        return self.envelope("chat.completion", "chatcmpl", choices, prompt, samples)

    def envelope(self, kind: str, prefix: str, choices: list, prompt: list, samples: list[Sample], *,
                 completion: int | None = None, batch: bool = False) -> dict[str, Any]:
        """An OpenAI response object around ``choices``, with its usage and, as vLLM's with ``return_token_ids``,
        ``prompt_token_ids`` (``prompt``: the ids the engines continued; ``batch``: a list of prompts' ids, whose
        usage is summed, and the response's ``prompt_token_ids`` null: each choice carries its own)."""
        completion = sum(s.sampled_tokens for s in samples) if completion is None else completion
        prompt_tokens = sum(map(len, prompt)) if batch else len(prompt)
        return {"id": self.response_id(prefix), "object": kind, "created": int(time.time()),
                "model": self.model_name, "choices": choices, "prompt_token_ids": None if batch else list(prompt),
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                          "total_tokens": prompt_tokens + completion}}

    def response_id(self, prefix: str) -> str:
        """A new response's id (``chatcmpl-N``, ``cmpl-N``)."""
        return f"{prefix}-{next(self._ids)}"
