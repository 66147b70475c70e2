"""``stream=true`` in ``pdsr serve``: a plain request's tokens as the engines make them, as Server-Sent Events in
vLLM's server's chunk shapes.

A streamed request runs as any other (its groups through the policy), and the server hears each of its samples'
new tokens through the session's ``hooks.on_tokens`` (:class:`StreamHub`). The HTTP response starts at the
request's first tokens (an engine's refusal before any is a 400, as without streaming). Then, as vLLM's:

- chat: per choice a first chunk with ``delta: {"role": "assistant", "content": ""}`` (and the prompt's
  ``prompt_token_ids``); completions: a choice's first chunk carries its prompt's ``prompt_token_ids``;
- a chunk per choice each time tokens arrive: the text they made stable (:mod:`pdsr_sdk.rollout.serve_deltas`;
  possibly empty), their ``token_ids`` and, when asked, their ``logprobs``;
- per choice a chunk with ``finish_reason`` and ``stop_reason``, carrying the rest of its text: the joined deltas
  are the text a request without ``stream`` gets;
- with ``stream_options.include_usage`` a chunk with ``usage`` and no choices (the others carry ``usage: null``);
- ``data: [DONE]``.

An error once the stream has started (a choice that failed, or that its policy restarted after some of its tokens
were sent: they cannot be taken back) is a chunk ``{"error": {...}}`` then ``[DONE]``, as vLLM's server ends a
stream. A restart before any of a choice's tokens was sent is no error: the choice streams its new tokens. A named sample's turn,
and a chat with a tool parser (calls are parsed from the whole turn), stream the whole turn at its end
(:func:`stream_chunks`)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from pdsr_sdk.dispatch.types import FAILED, Group, Sample
from pdsr_sdk.rollout.serve import FINISH, check_failed
from pdsr_sdk.rollout.serve_deltas import TextDeltas
from pdsr_sdk.rollout.serve_error import ServeError
from pdsr_sdk.rollout.serve_logprobs import choice_logprobs


class StreamHub:
    """Wakes the streams waiting on samples: on a sample's new tokens and its end (the session's hooks; a sample
    is let go at its end, so a stream whose client left before it began holds none)."""

    def __init__(self, hooks: Any):
        self.hooks = hooks
        self._waiting: dict[Sample, asyncio.Event] = {}
        hooks.on_tokens.append(self._wake)
        hooks.on_sample_done.append(self._done)

    def _wake(self, sample: Sample, n: int) -> None:
        event = self._waiting.get(sample)
        if event is not None:
            event.set()

    def _done(self, sample: Sample) -> None:
        event = self._waiting.pop(sample, None)
        if event is not None:
            event.set()

    def watch(self, samples: list[Sample], event: asyncio.Event) -> None:
        self._waiting.update((s, event) for s in samples)

    def unwatch(self, samples: list[Sample]) -> None:
        for s in samples:
            self._waiting.pop(s, None)

    def close(self) -> None:
        for hooks, fn in ((self.hooks.on_tokens, self._wake), (self.hooks.on_sample_done, self._done)):
            if fn in hooks:
                hooks.remove(fn)


@dataclass
class _Choice:
    index: int
    sample: Sample
    deltas: TextDeltas
    restarts: int
    consumed: int = 0     # the sample's tokens streamed
    offset: int = 0       # completions' logprobs: the text offset of the next token
    started: bool = False
    closed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)   # the first chunk's additions


class LiveStream:
    """One streamed request over ``groups`` (choice ``i * n + j``: group i's sample j, as vLLM's batch)."""

    def __init__(self, server: Any, hub: StreamHub, groups: list[Group], *, chat: bool, include_stop: bool,
                 want: bool | None, include_usage: bool):
        self.server, self.hub, self.groups, self.chat = server, hub, groups, chat
        self.include_stop, self.want, self.include_usage = include_stop, want, include_usage
        tok, stops = server.session.tokenizer, list(server.session.config.sampling.stop)
        self.choices = [_Choice(i * g.n + s.index, s, TextDeltas(tok, stops), s.restarts)
                        for i, g in enumerate(groups) for s in g.samples]
        if not chat:
            for c in self.choices:
                c.extra["prompt_token_ids"] = list(c.sample.group.prompt_token_ids)
        kind = "chat.completion.chunk" if chat else "text_completion"
        self.head = {"id": server.response_id("chatcmpl" if chat else "cmpl"), "object": kind,
                     "created": int(time.time()), "model": server.model_name}
        self.wake = asyncio.Event()

    @property
    def samples(self) -> list[Sample]:
        return [c.sample for c in self.choices]

    async def open(self) -> AsyncIterator[str]:
        """Hand the groups to the dispatcher and wait for their first tokens; the stream's events. A 400 when every
        choice failed before any token (an engine refused the prompt)."""
        hub = self.hub
        hub.watch(self.samples, self.wake)
        try:
            self.server.launch(self.groups)
            while not any(s.num_generated or s.finished for s in self.samples):
                await self.wake.wait()
                self.wake.clear()
            if all(s.finished for s in self.samples):
                for g in self.groups:
                    check_failed(g)
        except BaseException:
            hub.unwatch(self.samples)
            raise
        return self.events()

    async def events(self) -> AsyncIterator[str]:
        try:
            if self.chat:
                prompt = list(self.groups[0].prompt_token_ids)
                for c in self.choices:
                    yield self._event([{"index": c.index, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}], prompt_token_ids=prompt)
            while True:
                self.wake.clear()
                try:
                    chunks = [chunk for c in self.choices if not c.closed for chunk in self._step(c)]
                except ServeError as exc:
                    yield f"data: {json.dumps(error_body(exc))}\n\n"
                    break
                for chunk in chunks:
                    yield self._event([chunk])
                if all(c.closed for c in self.choices):
                    if self.include_usage:
                        yield f"data: {json.dumps({**self.head, 'choices': [], 'usage': self._usage()})}\n\n"
                    break
                await self.wake.wait()
            yield "data: [DONE]\n\n"
        finally:
            self.hub.unwatch(self.samples)

    def _step(self, c: _Choice) -> list[dict[str, Any]]:
        """Choice ``c``'s chunk for the tokens that arrived since the last (none when none did), or its last."""
        s = c.sample
        if s.restarts != c.restarts or len(s.token_ids) < c.consumed:
            if c.consumed:
                raise ServeError(500, f"choice {c.index} was started over by the dispatch policy after {c.consumed} "
                                      f"of its tokens were streamed, which a stream cannot take back; serve with a "
                                      f"policy that resumes a moved sample (on_break / on_probe_timeout: resume), or "
                                      f"without stream")
            c.restarts = s.restarts   # nothing sent yet: the choice streams its new tokens
        if s.finish_reason == FAILED:
            raise ServeError(400, f"choice {c.index} failed: {s.error}")
        ids, lps = s.token_ids[c.consumed:], s.logprobs[c.consumed:len(s.token_ids)]
        c.consumed = len(s.token_ids)
        if s.finished:
            final = self.server.text_of(s, self.include_stop)
            sent = c.deltas.text[:c.deltas.sent]
            if not final.startswith(sent):
                raise ServeError(500, f"choice {c.index}: the text streamed ({sent[-40:]!r} at its end) is not the "
                                      f"start of the response's text; the tokenizer decodes tokens otherwise alone "
                                      f"than together")
            c.closed = True
            return [self._chunk(c, final[len(sent):], ids, lps, finish=s)]
        if not ids:
            return []
        return [self._chunk(c, c.deltas.push(ids), ids, lps)]

    def _chunk(self, c: _Choice, text: str, ids: list[int], lps: list[float],
               finish: Sample | None = None) -> dict[str, Any]:
        logprobs = None
        if self.want is not None and ids:
            logprobs = choice_logprobs(self.server.session.tokenizer, ids, lps, chat=self.chat, as_ids=self.want,
                                       start=c.offset)
            if not self.chat:
                c.offset = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
        body: dict[str, Any] = {"delta": {"content": text} if text or finish is None else {}} if self.chat \
            else {"text": text}
        out = {"index": c.index, **body, "logprobs": logprobs,
               "finish_reason": None if finish is None else FINISH.get(finish.finish_reason or "", "stop")}
        if finish is not None:
            out["stop_reason"] = finish.stop_reason
        out["token_ids"] = list(ids)
        if not c.started:
            out.update(c.extra)
            c.started = True
        return out

    def _usage(self) -> dict[str, int]:
        prompt = sum(len(g.prompt_token_ids) for g in self.groups)
        completion = sum(s.sampled_tokens for s in self.samples)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        usage = {"usage": None} if self.include_usage else {}
        return f"data: {json.dumps({**self.head, 'choices': choices, **usage, **extra})}\n\n"


def error_body(exc: ServeError) -> dict[str, Any]:
    """OpenAI's error body for ``exc`` (vLLM's server's, in a response and in a stream)."""
    return {"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.status}}


def stream_chunks(response: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """A whole response as OpenAI's stream chunks (a named sample's turn, a chat with a tool parser): per choice,
    one chunk with all its content, then one with its finish reason; then, with ``include_usage``, one with the
    usage and no choices (the others carry ``usage: null``, as OpenAI's do)."""
    chat = response["object"] == "chat.completion"
    head = {"id": response["id"], "object": "chat.completion.chunk" if chat else "text_completion",
            "created": response["created"], "model": response["model"]}
    usage = {"usage": None} if include_usage else {}
    chunks = []
    for c in response["choices"]:
        if chat:
            delta = dict(c["message"])
            if "tool_calls" in delta:   # a stream's tool calls carry their position
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(delta["tool_calls"])]
            content: dict[str, Any] = {"delta": delta}
            closing: dict[str, Any] = {"delta": {}}
        else:
            content, closing = {"text": c["text"]}, {"text": ""}
        if "prompt_token_ids" in c:   # completions: each choice's prompt, in its first chunk as vLLM's
            content["prompt_token_ids"] = c["prompt_token_ids"]
        chunks.append({**head, "choices": [{"index": c["index"], **content, "logprobs": c.get("logprobs"),
                                            "finish_reason": None,
                                            "token_ids": c["token_ids"]}], **usage})
        chunks.append({**head, "choices": [{"index": c["index"], **closing, "logprobs": None,
                                            "finish_reason": c["finish_reason"], "stop_reason": c.get("stop_reason")}],
                       **usage})
    if include_usage:
        chunks.append({**head, "choices": [], "usage": response["usage"]})
    return chunks


def stream_events(response: dict[str, Any], include_usage: bool) -> list[str]:
    """The Server-Sent Events of :func:`stream_chunks`, then ``data: [DONE]``."""
    return [f"data: {json.dumps(chunk)}\n\n" for chunk in stream_chunks(response, include_usage)] + ["data: [DONE]\n\n"]
