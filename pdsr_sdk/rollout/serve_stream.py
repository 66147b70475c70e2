"""``stream=true`` in ``pdsr serve``: a request's tokens as the engines make them, as Server-Sent Events in vLLM's
server's chunk shapes.

A streamed request runs as any other (a plain request's groups through the policy, a named sample's turn as its
agent runs it: its trajectory is recorded as without ``stream``), and the server hears each of its samples' new
tokens through the session's ``hooks.on_tokens`` (:class:`StreamHub`). The HTTP response starts at the request's
first tokens (an error before any, such as an engine's refusal, is the error response the request gets without
``stream``). Then, as vLLM's:

- chat: per choice a first chunk with ``delta: {"role": "assistant", "content": ""}`` (and the prompt's
  ``prompt_token_ids``); completions: a choice's first chunk carries its prompt's ``prompt_token_ids``;
- a chunk per choice each time tokens arrive: the text they made stable (:mod:`pdsr_sdk.rollout.serve_deltas`;
  possibly empty), their ``token_ids`` and, when asked, their ``logprobs``;
- with ``--tool-parser hermes``, a chat choice's text up to its first ``<tool_call>``, then its calls as they are
  written (:mod:`pdsr_sdk.agent.tool_stream`): per call a ``delta.tool_calls`` entry with its ``index``, ``id``,
  ``type``, name and ``arguments: ""`` once its arguments began, then its arguments in fragments, as vLLM's server
  streams them; with another parser, the text up to where its calls begin (where pdsr knows that place,
  :func:`~pdsr_sdk.agent.tools.tool_call_marker`; else the whole text is held to its end), and the calls, parsed
  from the whole turn as without ``stream``, at its end, a chunk per call with its whole arguments;
- per choice a chunk with ``finish_reason`` and ``stop_reason``, carrying the rest of its text: the joined deltas
  (and calls) are the answer a request without ``stream`` gets (but for a call streamed that then turned out
  malformed, which the stream keeps as sent);
- with ``stream_options.include_usage`` a chunk with ``usage`` and no choices (the others carry ``usage: null``);
- ``data: [DONE]``.

An error once the stream has started (a choice that failed, or that its policy restarted after some of its tokens
were sent: they cannot be taken back; the session's failure, or an unexpected exception, a 500) is a chunk with the
error body (:func:`~pdsr_sdk.rollout.serve_error.error_body`) then ``[DONE]``, as vLLM's server ends a stream. A restart
before any of a choice's tokens was sent is no error: the choice streams its new tokens."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from pdsr_sdk.dispatch.types import FAILED, Group, Sample
from pdsr_sdk.rollout.serve import check_failed
from pdsr_sdk.rollout.serve_shapes import FINISH
from pdsr_sdk.agent.tool_stream import HermesCallStream, json_text
from pdsr_sdk.rollout.serve_deltas import TextDeltas, close_calls, text_holds
from pdsr_sdk.rollout.serve_error import ServeError, error_body, internal_error
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

    def unwatch(self, samples: list[Sample], event: asyncio.Event) -> None:
        """Stop waking ``event`` for ``samples``; a named sample's next turn may be watched by its own stream
        already (its client read the last turn's end before this one's generator closed)."""
        for s in samples:
            if self._waiting.get(s) is event:
                del self._waiting[s]

    def wake_all(self) -> None:
        """Wake every stream (the session failed: its samples never end, the streams end with its error)."""
        for event in self._waiting.values():
            event.set()

    def close(self) -> None:
        for hooks, fn in ((self.hooks.on_tokens, self._wake), (self.hooks.on_sample_done, self._done)):
            if fn in hooks:
                hooks.remove(fn)


@dataclass
class _Choice:
    index: int
    sample: Sample
    deltas: TextDeltas
    #: the choice's answer as a request without ``stream`` gets it (its message or text, finish and stop reason),
    #: asked once the choice ended
    answer: Callable[[], dict[str, Any]]
    restarts: int = 0
    #: a named sample's turn: its TurnResult once it ended (None: a plain request's sample, which ends finished)
    turn: asyncio.Future | None = None
    start: int = 0        # the sample's tokens before the choice's own (a named sample's earlier turns)
    live: bool = True     # its text is streamed as it comes; False: held to its end (a tool parser's)
    calls: HermesCallStream | None = None   # its hermes calls, streamed as they come
    consumed: int = 0     # the choice's tokens streamed
    offset: int = 0       # completions' logprobs: the text offset of the next token
    started: bool = False
    closed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)   # the first chunk's additions

    def ended(self) -> bool:
        return self.turn.done() if self.turn is not None else self.sample.finished

    def tokens(self) -> tuple[list[int], list[float]]:
        """The choice's ids and log-probs so far (an ended turn's: its sample may have gone on)."""
        if self.turn is not None and self.turn.done() and self.turn.exception() is None:
            t = self.turn.result()
            return list(t.token_ids), list(t.logprobs)
        s = self.sample
        return s.token_ids[self.start:], s.logprobs[self.start:len(s.token_ids)]


class LiveStream:
    """One streamed request's ``choices``. ``groups``: a plain request's, handed to the dispatcher when the stream
    opens (None: a named sample's turn, already running); ``prompt``: the ids a chat's role chunks carry;
    ``prompt_tokens``: its usage's."""

    def __init__(self, server: Any, choices: list[_Choice], *, chat: bool, want: bool | None, include_usage: bool,
                 prompt: list[int], prompt_tokens: int, groups: list[Group] | None = None):
        self.server, self.hub, self.choices, self.groups = server, server.stream_hub(), choices, groups
        self.chat, self.want, self.include_usage = chat, want, include_usage
        self.prompt, self.prompt_tokens = prompt, prompt_tokens
        kind = "chat.completion.chunk" if chat else "text_completion"
        self.head = {"id": server.response_id("chatcmpl" if chat else "cmpl"), "object": kind,
                     "created": int(time.time()), "model": server.model_name}
        self.wake = asyncio.Event()
        for c in choices:
            if c.turn is not None:
                c.turn.add_done_callback(lambda _: self.wake.set())

    @property
    def samples(self) -> list[Sample]:
        return [c.sample for c in self.choices]

    async def open(self) -> AsyncIterator[str]:
        """Hand a plain request's groups to the dispatcher and wait for the first tokens; the stream's events. The
        request's error response when every choice ended before any token: a 400 when an engine refused the
        prompt, a named sample's turn's error."""
        self.hub.watch(self.samples, self.wake)
        try:
            if self.groups is not None:
                self.server.launch(self.groups)
            while not any(len(c.sample.token_ids) > c.start or c.ended() for c in self.choices):
                self.server.check_alive()   # a failed session's samples never end
                await self.wake.wait()
                self.wake.clear()
            if all(c.ended() for c in self.choices):
                for g in self.groups or []:
                    check_failed(g)
                for c in self.choices:
                    if c.turn is not None and c.turn.exception() is not None:
                        raise c.turn.exception()
        except BaseException:
            self.hub.unwatch(self.samples, self.wake)
            raise
        return self.events()

    async def events(self) -> AsyncIterator[str]:
        try:
            if self.chat:
                for c in self.choices:
                    yield self._event([{"index": c.index, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}], prompt_token_ids=self.prompt)
            while True:
                self.wake.clear()
                try:
                    chunks = [chunk for c in self.choices if not c.closed for chunk in self._step(c)]
                except Exception as exc:   # noqa: BLE001 - a bug too ends the stream as vLLM's does, not cut off
                    error = exc if isinstance(exc, ServeError) else internal_error(exc)
                    yield f"data: {json_text(error_body(error))}\n\n"
                    break
                for chunk in chunks:
                    yield self._event([chunk])
                if all(c.closed for c in self.choices):
                    if self.include_usage:
                        yield f"data: {json_text({**self.head, 'choices': [], 'usage': self._usage()})}\n\n"
                    break
                await self.wake.wait()
            yield "data: [DONE]\n\n"
        finally:
            self.hub.unwatch(self.samples, self.wake)

    def _step(self, c: _Choice) -> list[dict[str, Any]]:
        """Choice ``c``'s chunk for the tokens that arrived since the last (none when none did), or its last."""
        s = c.sample
        if c.turn is None:
            if s.restarts != c.restarts or len(s.token_ids) < c.consumed:
                if c.consumed:
                    raise ServeError(500, f"choice {c.index} was started over by the dispatch policy after "
                                          f"{c.consumed} of its tokens were streamed, which a stream cannot take "
                                          f"back; serve with a policy that resumes a moved sample (on_break / "
                                          f"on_probe_timeout: resume), or without stream")
                c.restarts = s.restarts   # nothing sent yet: the choice streams its new tokens
            if s.finish_reason == FAILED:
                raise ServeError(400, f"choice {c.index} failed: {s.error}")
        elif c.turn.done() and c.turn.exception() is not None:
            raise c.turn.exception()
        ended = c.ended()
        if not ended:
            self.server.check_alive()   # a failed session's sample never ends: its stream ends with the 500
        ids, lps = c.tokens()
        ids, lps = ids[c.consumed:], lps[c.consumed:]
        c.consumed += len(ids)
        if ended:
            c.closed = True
            return self._close(c, ids, lps)
        if not ids:
            return []
        text = c.deltas.push(ids) if c.live else ""
        return [self._chunk(c, text, ids, lps, calls=c.calls.push(c.deltas.text) if c.calls else None)]

    def _close(self, c: _Choice, ids: list[int], lps: list[float]) -> list[dict[str, Any]]:
        """Choice ``c``'s last chunks: the rest of its answer's text, its tool calls, its finish reason."""
        answer = c.answer()
        if self.chat:
            message = answer["message"]
            final, calls = message.get("content") or "", message.get("tool_calls") or []
        else:
            final, calls = answer["text"], []
        sent = c.deltas.text[:c.deltas.sent]
        entries = [[{"index": i, **call}] for i, call in enumerate(calls)]
        if c.calls is not None:
            final, entries, answer = close_calls(c.deltas, c.calls, ids, c.index, answer)
        if not final.startswith(sent):
            raise ServeError(500, f"choice {c.index}: the text streamed ({sent[-40:]!r} at its end) is not the start "
                                  f"of the answer's text ({final[:len(sent)][-40:]!r} there); the tokenizer decodes "
                                  f"these tokens otherwise alone than together")
        rest = final[len(sent):]
        chunks = [self._chunk(c, rest if i == 0 else "", [], [], calls=e) for i, e in enumerate(entries)]
        return chunks + [self._chunk(c, "" if entries else rest, ids, lps, finish=answer)]

    def _chunk(self, c: _Choice, text: str, ids: list[int], lps: list[float], *, calls: list[dict] | None = None,
               finish: dict[str, Any] | None = None) -> dict[str, Any]:
        logprobs = None
        if self.want is not None and ids:
            logprobs = choice_logprobs(self.server.session.tokenizer, ids, lps, chat=self.chat, as_ids=self.want,
                                       start=c.offset)
            if not self.chat:
                c.offset = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
        if self.chat:
            delta: dict[str, Any] = {"content": text} if text or (finish is None and not calls) else {}
            if calls:
                delta["tool_calls"] = calls
            body: dict[str, Any] = {"delta": delta}
        else:
            body = {"text": text}
        out = {"index": c.index, **body, "logprobs": logprobs,
               "finish_reason": None if finish is None else finish["finish_reason"]}
        if finish is not None:
            out["stop_reason"] = finish.get("stop_reason")
        out["token_ids"] = list(ids)
        if not c.started:
            out.update(c.extra)
            c.started = True
        return out

    def _usage(self) -> dict[str, int]:
        completion = sum(c.consumed for c in self.choices)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        usage = {"usage": None} if self.include_usage else {}
        return f"data: {json_text({**self.head, 'choices': choices, **usage, **extra})}\n\n"


def _calls(server: Any, chat: bool, live: bool) -> HermesCallStream | None:
    """A chat choice's hermes call reader, where its text streams (the calls are read from the text)."""
    if chat and live and server.tool_parser == "hermes":
        return HermesCallStream(lambda: server.response_id("call"))
    return None


async def stream_groups(server: Any, groups: list[Group], *, chat: bool, include_stop: bool, want: bool | None,
                        include_usage: bool) -> AsyncIterator[str]:
    """A plain request's ``groups`` run streamed (choice ``i * n + j``: group i's sample j, as vLLM's batch): their
    events once their first tokens came."""
    live, holds = text_holds(server.session.tokenizer, server.tool_parser, chat,
                             list(server.session.config.sampling.stop))

    def answer(index: int, s: Sample) -> Callable[[], dict[str, Any]]:
        def made() -> dict[str, Any]:
            text = server.text_of(s, include_stop)
            if chat:
                return server.chat_choice(index, text, s.token_ids, s.finish_reason or "", s.stop_reason)
            return {"text": text, "finish_reason": FINISH.get(s.finish_reason or "", "stop"),
                    "stop_reason": s.stop_reason}
        return made

    choices = [_Choice(i * g.n + s.index, s, TextDeltas(server.session.tokenizer, holds), answer(i * g.n + s.index, s),
                       restarts=s.restarts, live=live, calls=_calls(server, chat, live))
               for i, g in enumerate(groups) for s in g.samples]
    if not chat:
        for c in choices:
            c.extra["prompt_token_ids"] = list(c.sample.group.prompt_token_ids)
    stream = LiveStream(server, choices, chat=chat, want=want, include_usage=include_usage,
                        prompt=list(groups[0].prompt_token_ids),
                        prompt_tokens=sum(len(g.prompt_token_ids) for g in groups), groups=groups)
    return await stream.open()


async def stream_turn(server: Any, sample: Sample, turn: asyncio.Future, prompt: list[int],
                      answer: Callable[[], dict[str, Any]], *, chat: bool, want: bool | None,
                      include_usage: bool) -> AsyncIterator[str]:
    """A named sample's running ``turn`` streamed as a plain request's choice 0 (``prompt``: the ids the turn
    continues; ``answer``: the turn's choice without ``stream``, once it ended). Its text keeps the stop string that
    ended it, as the trajectory's does: only a tool call's tag holds it back."""
    live, holds = text_holds(server.session.tokenizer, server.tool_parser, chat, [])
    choice = _Choice(0, sample, TextDeltas(server.session.tokenizer, holds), answer, turn=turn,
                     start=len(prompt) - len(sample.group.prompt_token_ids), live=live,
                     calls=_calls(server, chat, live))
    if not chat:
        choice.extra["prompt_token_ids"] = list(prompt)
    stream = LiveStream(server, [choice], chat=chat, want=want, include_usage=include_usage, prompt=list(prompt),
                        prompt_tokens=len(prompt))
    return await stream.open()
