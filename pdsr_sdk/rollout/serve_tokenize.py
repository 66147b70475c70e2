"""``pdsr serve``'s ``POST /tokenize`` and ``POST /detokenize``, in the shapes of vLLM's server: a client counts a
prompt's tokens, or checks what the chat template makes of a conversation, before it asks.

``/tokenize`` takes ``{"model", "prompt"}`` (a completions prompt: ``add_special_tokens`` default true, as
``/v1/completions`` encodes it) or ``{"model", "messages", "tools", "chat_template_kwargs",
"add_generation_prompt", "continue_final_message"}`` (a chat, rendered as ``/v1/chat/completions`` renders it:
``add_special_tokens`` default false), and answers ``{"count", "max_model_len", "tokens", "token_strs"}``
(``token_strs`` with ``return_token_strs: true``, else null): a chat's ``count`` is the ``usage.prompt_tokens`` of a
chat request with the same fields. ``/detokenize`` takes ``{"model", "tokens"}`` and answers ``{"prompt"}``, the
text with its special tokens, as vLLM's."""

from __future__ import annotations

from typing import Any

from pdsr_sdk.rollout.serve import ChatServer
from pdsr_sdk.rollout.serve_options import messages_of, tools_of
from pdsr_sdk.rollout.serve_error import ServeError
from pdsr_sdk.rollout.serve_options import template_options


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise ServeError(400, f"{key} must be true or false, got {value!r:.80}", param=key)
    return default if value is None else value


def tokenize(server: ChatServer, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /tokenize`` on ``server`` (the module says what it takes)."""
    server.check_model(body)
    tok = server.session.tokenizer
    strs = _flag(body, "return_token_strs", False)
    chat = body.get("messages") is not None
    if chat == (body.get("prompt") is not None):
        raise ServeError(400, "tokenize takes a prompt (text, as /v1/completions) or messages (a chat, as "
                              "/v1/chat/completions), one of them")
    if chat:
        if body.get("chat_template") is not None:
            raise ServeError(400, "chat_template: pdsr renders with the model's chat template (the one its chat "
                                  "requests use); leave chat_template out or null", param="chat_template")
        text = server.render(messages_of(body["messages"]), tools_of(body.get("tools")),
                             **template_options(body, server.session.config.data.chat_template_kwargs))
        special = _flag(body, "add_special_tokens", False)
    else:
        text = body["prompt"]
        if not isinstance(text, str):
            raise ServeError(400, f"prompt must be a string (one prompt's text), got {text!r:.80}", param="prompt")
        special = _flag(body, "add_special_tokens", True)
    ids = list(tok(text, add_special_tokens=special)["input_ids"])
    return {"count": len(ids), "max_model_len": server.context_limit(), "tokens": ids,
            "token_strs": tok.convert_ids_to_tokens(ids) if strs else None}


def detokenize(server: ChatServer, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /detokenize`` on ``server``: ``tokens``' text (special tokens kept, as vLLM's server decodes them)."""
    server.check_model(body)
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ServeError(400, f"tokens must be a list of token ids (integers), got {ids!r:.80}", param="tokens")
    server.check_ids(ids, "tokens")
    return {"prompt": server.session.tokenizer.decode(ids)}
