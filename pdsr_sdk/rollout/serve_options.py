"""A ``pdsr serve`` request's messages and tools (:func:`messages_of`, :func:`tools_of`) and its options that shape
its prompt or its text, as vLLM's server takes them: the chat template's (``chat_template_kwargs``,
``add_generation_prompt``, ``continue_final_message``), an assistant message's ``tool_calls`` as the template gets them,
``include_stop_str_in_output`` and ``stream_options``."""

from __future__ import annotations

import json
from typing import Any

from pdsr_sdk.agent.render import message_text
from pdsr_sdk.rollout.serve_error import ServeError


def template_options(body: dict[str, Any], session: dict[str, Any]) -> dict[str, Any]:
    """A chat request's template options (:meth:`~pdsr_sdk.rollout.serve.ChatServer.render`'s keywords): its
    ``chat_template_kwargs`` over the session's (``session``: ``data.chat_template_kwargs``), as vLLM's server
    merges them over its defaults, ``add_generation_prompt`` (default true) and ``continue_final_message``
    (default false; the last message, the assistant's, is continued)."""
    extra = body.get("chat_template_kwargs")
    if extra is not None and not isinstance(extra, dict):
        raise ServeError(400, f"chat_template_kwargs must be an object, got {extra!r:.80}")
    flags = {}
    for key, default in (("add_generation_prompt", True), ("continue_final_message", False)):
        value = body.get(key)
        if value is not None and not isinstance(value, bool):
            raise ServeError(400, f"{key} must be true or false, got {value!r:.80}")
        flags[key] = default if value is None else value
    if flags["add_generation_prompt"] and flags["continue_final_message"]:
        raise ServeError(400, "continue_final_message continues the last message; it takes "
                              "add_generation_prompt: false (as vLLM's server says)")
    return {"template_kwargs": {**session, **(extra or {})}, **flags}


def check_named_template(options: dict[str, Any], session: dict[str, Any]) -> None:
    """A 400 unless a named sample's request renders as the sample's later messages are (the session's
    ``data.chat_template_kwargs``, a generation prompt): each turn must start where the template puts the next."""
    if options["template_kwargs"] != session:
        raise ServeError(400, f"chat_template_kwargs {options['template_kwargs']!r:.120}: a named sample's messages "
                              f"are rendered with the session's data.chat_template_kwargs ({session!r:.120}); serve "
                              f"with those set (a --config file), or leave chat_template_kwargs out")
    for key, default in (("add_generation_prompt", True), ("continue_final_message", False)):
        if options[key] != default:
            raise ServeError(400, f"{key} {options[key]}: a named sample's every turn starts at the template's "
                                  f"generation prompt; leave {key} out")


def include_stop(body: dict[str, Any]) -> bool:
    """A request's ``include_stop_str_in_output`` (vLLM's; default false)."""
    value = body.get("include_stop_str_in_output")
    if value is not None and not isinstance(value, bool):
        raise ServeError(400, f"include_stop_str_in_output must be true or false, got {value!r:.80}")
    return bool(value)


def with_tool_arguments(message: dict[str, Any], where: str) -> dict[str, Any]:
    """An assistant ``message`` whose ``tool_calls`` carry their ``function.arguments`` as objects, as vLLM's server
    hands them to the chat template (OpenAI's clients send a JSON string, which a template's ``arguments | tojson``
    would quote again); an empty ``tool_calls`` dropped, as vLLM drops it. A 400 naming ``where`` for arguments
    that are not a JSON object (vLLM's server renders them as ``{}``, a call the model never made)."""
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or calls is None:
        return message
    if not isinstance(calls, list):
        raise ServeError(400, f"{where}.tool_calls must be a list, got {calls!r:.80}")
    if not calls:
        return {k: v for k, v in message.items() if k != "tool_calls"}
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise ServeError(400, f"{where}.tool_calls[{j}] must be {{'type': 'function', 'function': {{name, "
                                  f"arguments}}}}, got {call!r:.80}")
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                raise ServeError(400, f"{where}.tool_calls[{j}].function.arguments is not JSON ({exc.msg}): "
                                      f"{function['arguments']!r:.80}") from None
        elif arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise ServeError(400, f"{where}.tool_calls[{j}].function.arguments must be a JSON object, got "
                                  f"{function.get('arguments')!r:.80}")
        out.append({**call, "function": {**function, "arguments": arguments}})
    return {**message, "tool_calls": out}


def stream_usage(body: dict[str, Any]) -> bool | None:
    """None when the request does not stream; else whether its stream ends with a usage chunk
    (``stream_options: {"include_usage": true}``)."""
    if not body.get("stream"):
        return None
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ServeError(400, f"stream_options must be an object, got {options!r}")
    return bool(options.get("include_usage"))


def messages_of(value: Any) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise ServeError(400, "messages must be a non-empty list of {role, content}")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ServeError(400, f"messages[{i}] must be an object with a string 'role'")
        try:   # text parts joined, as vLLM's server passes them to a template of string content
            m = {**m, "content": message_text(m.get("content"), f"messages[{i}].content")}
        except ValueError as exc:
            raise ServeError(400, str(exc)) from None
        out.append(with_tool_arguments(m, f"messages[{i}]"))
    return out


def tools_of(value: Any) -> list[dict] | None:
    """A chat request's ``tools`` (OpenAI's function definitions), for the chat template; None when it has none."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ServeError(400, f"tools must be a list of objects (OpenAI's {{'type': 'function', 'function': ...}}), "
                              f"got {value!r:.80}")
    return value or None
