"""Named samples of ``pdsr serve``: requests that name a sample (header ``X-Pdsr-Sample: ID`` or ``"pdsr_sample"``
in the body) are the turns of one multi-turn sample, recorded token-exact as an agent's sample is
(:mod:`pdsr_sdk.agent`). Each sample is run by an agent function (:meth:`NamedSamples._remote`) whose every turn
answers the request waiting, and whose environment is the next request.

Each request sends the whole conversation so far, as OpenAI clients do; pdsr checks that it extends what it
recorded and appends only what is new, so the next turn continues from the sampled ids, never re-encoded text:

- **chat** (``/v1/chat/completions``): the first request's messages are the prompt; a later request must repeat
  the recorded messages (roles, and the content of every message but the model's own), and its new messages
  are rendered by the chat template after them, with every field the client sent (``tool_call_id``, ``name``,
  ``tool_calls``).
- **completions** (``/v1/completions``): the first request's prompt is the sample's prompt. A later prompt of
  token ids must start with the recorded trajectory (prompt ids, then every sampled and appended id); the ids
  after it are appended. A later text prompt must start with the text the client holds: the first prompt as
  sent, then each response's text as returned and each request's new text; the new text after it is encoded
  (no special tokens added) and appended as ids. The client's text is compared, not the trajectory decoded:
  a response's text skips special tokens (a sampled end of text), and a turn may end inside a character.

A sample keeps its endpoint and, for completions, its prompt form (text or ids): mixing them is refused. A turn
asked with ``stream=true`` streams its tokens as they come (:mod:`pdsr_sdk.rollout.serve_stream`); the sample is
recorded as without it.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from pdsr_sdk.dispatch.types import Group, Sample
from pdsr_sdk.rollout.serve_error import ServeError

CHAT, COMPLETIONS = "chat", "completions"


class RequestHost(Protocol):
    """What named samples use of the server that owns them (:class:`~pdsr_sdk.rollout.serve.ChatServer`); each
    method is called while a request is answered, on the session's event loop."""

    session: Any

    def render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """``messages`` as the chat template renders them, with the generation prompt (and ``tools``)."""

    def encode(self, text: str, special: bool = False) -> list[int]:
        """``text``'s token ids (``special``: with the tokenizer's added special tokens)."""

    def make_group(self, ids: list[int], text: str, n: int, max_tokens: int, messages: list[dict] | None, *,
                   prompt_id: str | None = None) -> Group:
        """A request's group of ``n`` samples (its prompt checked against the engines' context)."""

    def check_ids(self, ids: list[int], what: str) -> None:
        """A 400 naming the first of ``ids`` outside the model's vocabulary."""

    def add(self, groups: list[Group]) -> None:
        """Hand ``groups`` to the dispatcher, as a step's groups are."""

    def check_alive(self) -> None:
        """A 500 once the session failed (its samples never end)."""

    def chat_choice(self, index: int, text: str, token_ids: list[int], finish_reason: str,
                    stop: str | int | None = None, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        """A chat response's choice of a sampled turn (its message, finish reason, stop reason, log-probs and
        token ids)."""

    def logprobs(self, token_ids: list[int], logprobs: list[float], *, chat: bool,
                 want: bool | None) -> dict[str, Any] | None:
        """A choice's ``logprobs`` object, None when ``want`` is (the request did not ask for them)."""

    def envelope(self, kind: str, prefix: str, choices: list, prompt: list[int], samples: list[Sample], *,
                 completion: int | None = None) -> dict[str, Any]:
        """An OpenAI response object around ``choices`` (``prompt``: the ids the turn continued), with its usage."""

    async def stream_turn(self, sample: Sample, turn: asyncio.Future, prompt: list[int],
                          answer: Callable[[], dict[str, Any]], *, chat: bool, want: bool | None,
                          include_usage: bool) -> Any:
        """The events of a running ``turn`` of ``sample`` (``answer``: its choice once it ended)."""


@dataclass
class _Named:
    """A named sample: its group, its agent context once the first turn ended, the request waiting for a turn."""

    sample_id: str
    api: str   # CHAT or COMPLETIONS: the endpoint that started it
    group: Group
    requests: asyncio.Queue = field(default_factory=asyncio.Queue)
    waiter: asyncio.Future | None = None
    ctx: Any = None
    done: asyncio.Future | None = None
    #: a completions sample with text prompts: the text the client holds (see the module); None otherwise
    text: str | None = None
    #: why the sample can take no more turns (its turn limit or token budget is spent): it waits for its end
    spent: str | None = None


class NamedSamples:
    """The named samples of one server (:class:`~pdsr_sdk.rollout.serve.ChatServer`, as a :class:`RequestHost`)."""

    def __init__(self, server: RequestHost):
        self.server = server
        self.samples: dict[str, _Named] = {}
        #: by ``id`` of its group (a named sample keeps its group alive, so the id is its own): a finished group
        #: is looked up, not searched for among every named sample the server has kept
        self._by_group: dict[int, _Named] = {}

    # ------------------------------------------------------------- requests
    async def chat_turn(self, sample_id: str, messages: list[dict], max_tokens: int,
                        tools: list[dict] | None = None, want: bool | None = None,
                        stream: bool | None = None) -> Any:
        """A turn of a chat sample; ``tools`` (the request's) are rendered into its prompt by the first request;
        ``want``: its log-probs (:meth:`RequestHost.logprobs`); ``stream``: None, or whether its stream ends with
        usage (then its events)."""
        server = self.server

        def start() -> Group:
            text = server.render(messages, tools)
            return server.make_group(server.encode(text), text, 1, server.session.config.sampling.max_tokens,
                                     messages, prompt_id=f"sample-{sample_id}")

        def extend(named: _Named) -> dict[str, Any]:
            new = _extension(named.ctx.messages, messages, sample_id)
            # the environment's span is labelled with the tool that answered (a tool message's name), as an agent's is
            tool = next((m["name"] for m in new if m["role"] == "tool" and isinstance(m.get("name"), str)), None)
            return {"messages": new, "tool_name": tool}

        def answer(turn: Any, want: bool | None) -> dict[str, Any]:
            return server.chat_choice(0, turn.text, turn.token_ids, turn.finish_reason, _stop(named, turn),
                                      server.logprobs(turn.token_ids, turn.logprobs, chat=True, want=want))

        named, turn, ids = self._turn(sample_id, CHAT, max_tokens, start, extend)
        return await self._answer(named, turn, ids, answer, want, stream, chat=True)

    async def completion_turn(self, sample_id: str, prompt: str | list[int], max_tokens: int,
                              want: bool | None = None, stream: bool | None = None) -> Any:
        server = self.server

        def start() -> Group:
            text, ids = (prompt, server.encode(prompt, special=True)) if isinstance(prompt, str) else ("", prompt)
            return server.make_group(ids, text, 1, server.session.config.sampling.max_tokens, None,
                                     prompt_id=f"sample-{sample_id}")

        def extend(named: _Named) -> dict[str, Any]:
            if (named.text is not None) != isinstance(prompt, str):
                form = "text" if named.text is not None else "token ids"
                raise ServeError(400, f"sample {sample_id!r} was started with a prompt of {form}; send every "
                                      f"prompt of a sample in one form")
            if isinstance(prompt, list):
                new = _ids_extension(named.ctx.ids, prompt, sample_id)
                server.check_ids(new, f"sample {sample_id!r}: the prompt")
                return {"ids": new}
            new = _text_extension(named.text, prompt, sample_id)
            ids = server.encode(new)   # the new text only, no special tokens added: the recorded ids stay as they are
            named.text = prompt
            return {"ids": ids}

        def answer(turn: Any, want: bool | None) -> dict[str, Any]:
            return {"index": 0, "text": turn.text, "finish_reason": turn.finish_reason,
                    "stop_reason": _stop(named, turn),
                    "logprobs": server.logprobs(turn.token_ids, turn.logprobs, chat=False, want=want),
                    "token_ids": list(turn.token_ids)}

        named, turn, ids = self._turn(sample_id, COMPLETIONS, max_tokens, start, extend)
        return await self._answer(named, turn, ids, answer, want, stream, chat=False)

    async def end(self, sample_id: str, reward: Any = None) -> dict[str, Any]:
        """End a named sample (``reward``: its reward, or None for the reward function) and return its row."""
        named = self._get(sample_id)
        self.server.check_alive()   # its agent would never end it
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))
                                   or not math.isfinite(reward)):
            raise ServeError(400, f"reward must be a finite number or null, got {reward!r}")
        sample = named.group.samples[0]
        if not sample.finished:
            if named.ctx is None:
                raise ServeError(409, f"sample {sample_id!r}: its first turn is still running")
            named.requests.put_nowait(("end", reward))
            await asyncio.shield(named.done)
        row = await self.row(sample_id)
        if reward is not None and row["reward"] != reward:   # it had ended before: its reward is not this one
            raise ServeError(409, f"sample {sample_id!r} had ended ({sample.finish_reason}"
                                  f"{': ' + sample.error if sample.error else ''}) with reward {row['reward']}; "
                                  f"the reward {reward} was not taken")
        return row

    async def row(self, sample_id: str) -> dict[str, Any]:
        """A named sample as a trajectories row (its reward once it ended)."""
        from pdsr_sdk.dispatch.trajectory import sample_row

        session = self.server.session
        sample = self._get(sample_id).group.samples[0]
        scored = (await session.scores([sample]))[0] if sample.finished else None
        row = sample_row(sample, session.tokenizer, None, scored=scored)
        row["finished"] = sample.finished
        return row

    def group_done(self, group: Group) -> None:
        named = self._by_group.get(id(group))
        if named is not None and named.group is group and named.done is not None and not named.done.done():
            named.done.set_result(None)
            sample = group.samples[0]
            fail_future(named.waiter, ServeError(409, f"sample {named.sample_id!r} ended "
                                                f"({sample.finish_reason}: {sample.error})"))

    def fail(self, error: Callable[[], BaseException]) -> None:
        """The session failed: each request waiting on a sample that has not ended (its turn, its end) gets
        ``error()``."""
        for named in self.samples.values():
            if not named.group.samples[0].finished:
                fail_future(named.waiter, error())
                fail_future(named.done, error())

    # ------------------------------------------------------------- turns
    def _turn(self, sample_id: str, api: str, max_tokens: int, start: Callable[[], Group],
              extend: Callable[[_Named], dict[str, Any]]) -> tuple[_Named, asyncio.Future, list[int]]:
        """Start one turn of the sample: ``start()`` makes its group on its first request; ``extend(named)`` gives
        what a later request appends (``agent.append``'s keyword arguments), after checking it. It is appended here,
        while the request is answered, so that what the chat template refuses is the request's 400 and the sample
        goes on. The sample, a future of the turn's result, and the ids the turn continues."""
        named = self.samples.get(sample_id)
        loop = asyncio.get_running_loop()
        if named is None:
            group = start()
            named = _Named(sample_id, api, group, done=loop.create_future())
            if api == COMPLETIONS and group.prompt_text:   # a text prompt (ids leave prompt_text empty)
                named.text = group.prompt_text
            named.waiter = loop.create_future()
            self.samples[sample_id] = named
            self._by_group[id(group)] = named
            session = self.server.session
            session.agents.prepare([group], self._remote(named))
            group.samples[0].turn_end = max_tokens   # the first turn's limit: this request's max_tokens
            self.server.add([group])
        else:
            self.server.check_alive()   # its agent would never take the turn
            if named.api != api:
                raise ServeError(400, f"sample {sample_id!r} was started on /v1/{_route(named.api)}; continue "
                                      f"it there (a sample keeps one endpoint)")
            sample = named.group.samples[0]
            if sample.finished or named.ctx is None:
                state = "has ended" if sample.finished else "is still on its first turn"
                raise ServeError(409, f"sample {sample_id!r} {state}")
            if named.waiter is not None and not named.waiter.done():
                raise ServeError(409, f"sample {sample_id!r} has a request running; one turn at a time")
            if named.spent is not None:
                raise ServeError(409, named.spent)
            new = extend(named)
            try:
                named.ctx.append(**new)   # parked: its agent waits for this request
            except Exception as exc:   # noqa: BLE001 - the template's refusal (jinja's TemplateError, a DataError)
                raise ServeError(400, f"sample {sample_id!r}: the chat template refused the new messages: "
                                      f"{exc}") from None
            named.waiter = loop.create_future()
            named.requests.put_nowait(("turn", max_tokens))
        # the trajectory before the turn: what its environment appended is staged in the agent's context
        prompt = list(named.ctx.ids) if named.ctx is not None else list(named.group.prompt_token_ids)
        return named, named.waiter, prompt

    async def _answer(self, named: _Named, turn: asyncio.Future, prompt: list[int],
                      answer: Callable[[Any, bool | None], dict[str, Any]], want: bool | None, stream: bool | None,
                      *, chat: bool) -> Any:
        """A turn's response once it ended (``answer(turn, want)``: its choice), or its stream's events."""
        sample = named.group.samples[0]
        if stream is not None:   # the choice's log-probs go in its chunks, made as its tokens come
            return await self.server.stream_turn(sample, turn, prompt, lambda: answer(turn.result(), None),
                                                 chat=chat, want=want, include_usage=stream)
        result = await asyncio.shield(turn)
        kind, prefix = ("chat.completion", "chatcmpl") if chat else ("text_completion", "cmpl")
        return self.server.envelope(kind, prefix, [answer(result, want)], prompt, [sample],
                                    completion=len(result.token_ids))

    def _remote(self, named: _Named):
        """The agent of a named sample: each turn answers the request waiting; the next request's new messages
        or ids are appended, until ``end``."""
        from pdsr_sdk.agent import AgentDone

        async def remote(agent):
            named.ctx = agent
            try:
                turn = await agent.generate()
                while True:
                    if named.text is not None:   # before the answer: the client's next prompt starts with it
                        named.text += turn.text
                    _resolve(named.waiter, turn)
                    kind, *rest = await named.requests.get()
                    if kind == "end":
                        return rest[0]
                    (max_tokens,) = rest   # the request appended its messages or ids already
                    try:
                        turn = await agent.generate(max_tokens=max_tokens)
                    except AgentDone as exc:
                        if agent.done:   # the sample ended
                            raise
                        # no turn or token left: the sample waits for its end (and its reward), holding no slot
                        named.spent = (f"sample {named.sample_id!r}: {exc}; end it with POST "
                                       f"/v1/pdsr/samples/{named.sample_id}/end")
                        fail_future(named.waiter, ServeError(409, named.spent))
                        while True:
                            kind, *rest = await named.requests.get()
                            if kind == "end":
                                return rest[0]
            except AgentDone as exc:
                fail_future(named.waiter, ServeError(409, f"sample {named.sample_id!r}: {exc}"))
                raise
            except BaseException as exc:
                fail_future(named.waiter, ServeError(409, f"sample {named.sample_id!r} failed: {exc!r}"))
                raise
        return remote

    def _get(self, sample_id: str) -> _Named:
        named = self.samples.get(sample_id)
        if named is None:
            raise ServeError(404, f"no sample {sample_id!r}")
        return named


def sample_name(header: str | None, body: dict[str, Any]) -> str | None:
    """The sample a request names (header ``X-Pdsr-Sample``, else the body's ``pdsr_sample``), None when neither is
    given. An empty one is a 400: no ``/v1/pdsr/samples/ID`` could read or end it (an empty header named none)."""
    value = header if header is not None else body.get("pdsr_sample")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise ServeError(400, f"a sample's ID (header X-Pdsr-Sample or pdsr_sample) is a non-empty string, got "
                              f"{value!r}", param="pdsr_sample")
    return str(value)


def _stop(named: _Named, turn: Any) -> str | int | None:
    """A turn's ``stop_reason``: the stop string or stop token id that ended it (the sample holds its latest
    turn's), None when the model's EOS or a limit did."""
    return named.group.samples[0].stop_reason if turn.finish_reason == "stop" else None


def _route(api: str) -> str:
    return "chat/completions" if api == CHAT else "completions"


def _extension(recorded: list[dict], messages: list[dict], sample_id: str) -> list[dict]:
    """The messages a chat request adds to its sample's recorded conversation (which it must extend)."""
    for i, (old, new) in enumerate(zip(recorded, messages)):   # where it differs first: a changed message is
        # the client's mistake whether or not the request is longer than the recording
        if old["role"] != new["role"] or (old["role"] != "assistant" and old.get("content") != new.get("content")):
            raise ServeError(400, f"sample {sample_id!r}: message {i} differs from the recorded conversation "
                                  f"(recorded role {old['role']!r}); send the conversation so far, then new "
                                  f"messages")
    if len(messages) <= len(recorded):
        raise ServeError(400, f"sample {sample_id!r}: the request has no new message after the recorded "
                              f"conversation ({len(recorded)} messages)")
    # every field the client sent (a tool result's tool_call_id and name, an assistant message's tool_calls), as
    # vLLM's server passes them: a template may render them (Mistral's, some of Llama's)
    return messages[len(recorded):]


def _ids_extension(recorded: list[int], prompt: list[int], sample_id: str) -> list[int]:
    """The ids a completions prompt of token ids adds after its sample's recorded trajectory."""
    if prompt[:len(recorded)] != recorded:
        at = next((i for i, (a, b) in enumerate(zip(recorded, prompt)) if a != b), len(prompt))
        sent = prompt[at] if at < len(prompt) else "nothing (the prompt ends there)"
        raise ServeError(400, f"sample {sample_id!r}: the prompt does not extend the recorded trajectory "
                              f"({len(recorded)} tokens): token {at} differs (recorded {recorded[at]}, sent "
                              f"{sent}); send the trajectory so far, then new ids")
    if len(prompt) == len(recorded):
        raise ServeError(400, f"sample {sample_id!r}: the prompt has nothing new after the recorded trajectory "
                              f"({len(recorded)} tokens)")
    return prompt[len(recorded):]


def _text_extension(recorded: str, prompt: str, sample_id: str) -> str:
    """The text a completions text prompt adds after the text its sample's client holds (see the module)."""
    if not prompt.startswith(recorded):
        at = next((i for i, (a, b) in enumerate(zip(recorded, prompt)) if a != b), len(prompt))
        raise ServeError(400, f"sample {sample_id!r}: the prompt does not extend the recorded text "
                              f"({len(recorded)} characters: the first prompt, then each response's text and "
                              f"each new text): character {at} differs (recorded {recorded[at:at + 20]!r}, sent "
                              f"{prompt[at:at + 20]!r})")
    if len(prompt) == len(recorded):
        raise ServeError(400, f"sample {sample_id!r}: the prompt has nothing new after the recorded text "
                              f"({len(recorded)} characters)")
    return prompt[len(recorded):]


def _resolve(future: asyncio.Future | None, value: Any) -> None:
    if future is not None and not future.done():
        future.set_result(value)


def fail_future(future: asyncio.Future | None, exc: BaseException) -> None:
    """Fail ``future`` with ``exc`` unless it is done already (a request waiting on it gets the error)."""
    if future is not None and not future.done():
        future.set_exception(exc)
        future.exception()   # seen: nobody may be waiting any more
