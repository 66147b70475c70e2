"""The token ids an environment adds to a conversation, rendered by the chat template (pure; no engine).

Token-in, token-out: a multi-turn sample's context is its prompt, then every sampled id as sampled, then the
environment's ids. Only what the environment adds is ever encoded: the text the template renders for the
conversation with the new messages, past the model's last turn. The conversation's own tokens are never decoded
and encoded again, because templates are not append-only (Qwen3's renders a turn otherwise once a message
follows it) and decode-encode does not give back sampled ids.

The template's tokens after a sampled end of turn (ChatML's ``<|im_end|>`` closes the assistant turn and a
newline follows it) belong to the environment: the model sampled ``<|im_end|>``, the newline is template.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence


def render(tokenizer: Any, messages: list[dict[str, Any]], *, generation_prompt: bool,
           template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The chat template's text for ``messages`` (``generation_prompt``: with the assistant header after;
    ``template_kwargs``: the template's extra variables, ``data.chat_template_kwargs``)."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                         **(template_kwargs or {}))


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of template text (its special tokens spelled out, no BOS added)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


#: content part types whose ``text`` is text, as vLLM's server reads them
TEXT_PARTS = ("text", "input_text", "output_text")


def message_text(content: Any, where: str) -> str:
    """A chat message's ``content`` as the text the chat template gets, as vLLM's server passes it: a string as it
    is, null as empty, a list of text parts (``{"type": "text", "text": ...}``, or strings) joined with newlines.
    A ValueError naming ``where`` for anything else: an image part, or a dict or number, which a template would
    print as Python's repr (``{'a': 1}``), not the JSON a tool meant."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"{where}[{j}] is a {kind!r} part; only text parts ({{'type': 'text', 'text': "
                                 f"...}}) are taken")
        return "\n".join(texts)
    raise ValueError(f"{where} must be a string, a list of text parts or null, got {type(content).__name__} "
                     f"{content!r:.60} (json.dumps a tool's structured result)")


#: stands in for the last message's content when finding what the template renders after it: a plain word that no
#: template trims, splits or escapes (the decoded turn itself may be empty, end in whitespace a template trims,
#: or hold text a template rewrites, such as a reasoning block)
CONTENT_MARK = "PDSRCONTENTMARK7f3a"


def closing_text(tokenizer: Any, messages: list[dict[str, Any]],
                 template_kwargs: Mapping[str, Any] | None = None) -> str:
    """What the template renders after the last (assistant) message's content: its end-of-turn text (ChatML:
    ``<|im_end|>\\n``), found by rendering the conversation with :data:`CONTENT_MARK` as that content. Empty if the
    template does not render the content."""
    marked = [*messages[:-1], {**messages[-1], "content": CONTENT_MARK}]
    rendered = render(tokenizer, marked, generation_prompt=False, template_kwargs=template_kwargs)
    at = rendered.rfind(CONTENT_MARK)
    return rendered[at + len(CONTENT_MARK):] if at >= 0 else ""


def unsampled_closing(closing: str, sampled_tail: str) -> str:
    """The part of the template's ``closing`` text the model did not sample: ``closing`` less its longest
    prefix that ends ``sampled_tail`` (the last sampled tokens' text, special tokens spelled out)."""
    for k in range(min(len(closing), len(sampled_tail)), 0, -1):
        if sampled_tail.endswith(closing[:k]):
            return closing[k:]
    return closing


def environment_ids(tokenizer: Any, conversation: list[dict[str, Any]], new: list[dict[str, Any]], *,
                    last_turn_ids: Sequence[int] | None, template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    """Ids the environment adds with ``new`` messages after ``conversation`` (whose last message may be the
    model's turn, rendered from its decoded text; ``last_turn_ids`` are that turn's sampled ids, None if the
    conversation does not end with a model turn): the rest of the model turn's closing that the model did not
    sample, then what the template renders for ``new``, with the generation prompt."""
    if conversation and conversation[-1].get("role") == "assistant":
        text = _after_model_turn(tokenizer, conversation, new, last_turn_ids, template_kwargs)
        if text is not None:
            return encode(tokenizer, text)
    before = render(tokenizer, conversation, generation_prompt=False, template_kwargs=template_kwargs)
    after = render(tokenizer, conversation + new, generation_prompt=True, template_kwargs=template_kwargs)
    if not after.startswith(before):
        from pdsr_sdk.errors import DataError

        raise DataError("the chat template does not render the conversation with new messages as an extension "
                        "of the conversation alone; append token ids (agent.append(ids=...)) instead")
    return encode(tokenizer, after[len(before):])


def _after_model_turn(tokenizer: Any, conversation: list[dict[str, Any]], new: list[dict[str, Any]],
                      last_turn_ids: Sequence[int] | None, template_kwargs: Mapping[str, Any] | None) -> str | None:
    """The text after the model turn's content in the template's rendering of the whole conversation with ``new``,
    less what the model sampled of the turn's closing (all of it when ``last_turn_ids`` is None: ids appended
    after the turn took its place). Only the text after the turn is taken, so a template that renders earlier
    turns otherwise once a message follows them (Qwen3's drops a turn's empty reasoning block when it is no
    longer the last message, and a turn's reasoning once a user message follows) still gives the new messages'
    text; the earlier turns stay as sampled. None if the template does not render the turn's content."""
    marked = [*conversation[:-1], {**conversation[-1], "content": CONTENT_MARK}]
    rendered = render(tokenizer, marked + new, generation_prompt=True, template_kwargs=template_kwargs)
    at = rendered.find(CONTENT_MARK)
    if at < 0 or rendered.count(CONTENT_MARK) != 1:
        return None
    closing = closing_text(tokenizer, conversation, template_kwargs)
    text = rendered[at + len(CONTENT_MARK):]
    if last_turn_ids is None:
        return text[len(closing):] if text.startswith(closing) else text
    tail = tokenizer.decode(list(last_turn_ids)[-8:], skip_special_tokens=False)
    return unsampled_closing(text[:len(closing)], tail) + text[len(closing):]
