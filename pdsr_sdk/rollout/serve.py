"""An OpenAI-style chat server on a rollout session's engines and policy (``pdsr serve``, ``session.aserve()``).

Every request goes through the session's dispatcher: it becomes a group (``n`` samples) handed to the policy
like a step's groups, so the server schedules as a rollout does. The HTTP layer
(:mod:`pdsr_sdk.rollout.serve_app`) is thin: it parses, calls :class:`ChatServer`, and turns a
:class:`ServeError` into an OpenAI-style error.

**Named samples.** A chat request that names a sample (header ``X-Pdsr-Sample: ID``, or ``"pdsr_sample": ID`` in
the body) is recorded token-exact, as an agent's sample is (:mod:`pdsr_sdk.agent`). Its first request's messages
are its prompt; each later request with the same ID sends the whole conversation again, as OpenAI clients do:
pdsr checks that it extends the recorded one (roles, and the content of every message but the model's own),
renders only the new messages after it, and continues from the sampled ids, never from re-encoded text. The
sample ends with ``POST /v1/pdsr/samples/ID/end`` (body ``{"reward": R}``, or no reward: then the session's
reward function scores it), which returns its trajectory; a sample with no request for ``agent.env_timeout_s``
fails, as an agent that hangs does. ``GET /v1/pdsr/samples/ID`` reads it at any time.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any

from pdsr_sdk.dispatch.types import LENGTH, STOP, TRUNCATED, Group, Sample

#: finish reasons as OpenAI's API names them
_FINISH = {STOP: "stop", LENGTH: "length", TRUNCATED: "length"}


class ServeError(Exception):
    """A request pdsr refuses: ``status`` is the HTTP status, the message says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class _Named:
    """A named sample: its group, its agent context once the first turn ended, the request waiting for a turn."""

    sample_id: str
    group: Group
    requests: asyncio.Queue = field(default_factory=asyncio.Queue)
    waiter: asyncio.Future | None = None
    ctx: Any = None
    done: asyncio.Future | None = None


class ChatServer:
    """The server's logic over a started :class:`~pdsr_sdk.rollout.session.RolloutSession`."""

    def __init__(self, session: Any, *, model_name: str | None = None, tool_parser: str | None = None):
        self.session = session
        self.model_name = model_name or "pdsr"
        self.tool_parser = tool_parser
        self._ids = itertools.count()
        self._named: dict[str, _Named] = {}
        self._groups: dict[int, asyncio.Future] = {}
        session.hooks.on_group_done.append(self._group_done)

    # ------------------------------------------------------------- requests
    async def chat(self, body: dict[str, Any], sample_id: str | None = None) -> dict[str, Any]:
        """``POST /v1/chat/completions``."""
        messages = _messages(body.get("messages"))
        n, max_tokens = self._common(body)
        sample_id = sample_id or body.get("pdsr_sample")
        if sample_id is not None:
            if n != 1:
                raise ServeError(400, "a named sample (pdsr_sample) takes n = 1")
            return await self._named_turn(str(sample_id), messages, max_tokens)
        text = self._render(messages)
        ids = self._encode(text)
        group = self._group(ids, text, n, max_tokens, messages)
        await self._run(group)
        return self._chat_response(group.samples, len(ids))

    async def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/completions``: a text prompt (or token ids), no chat template."""
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            text, ids = prompt, self._encode(prompt, special=True)
        elif isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
            ids, text = list(prompt), ""
        else:
            raise ServeError(400, "prompt must be a non-empty string or a list of token ids (one prompt per request)")
        n, max_tokens = self._common(body)
        group = self._group(ids, text, n, max_tokens, None)
        await self._run(group)
        tok = self.session.tokenizer
        choices = [{"index": s.index, "text": tok.decode(s.token_ids, skip_special_tokens=True),
                    "finish_reason": _FINISH.get(s.finish_reason or "", "stop"), "logprobs": None,
                    "token_ids": list(s.token_ids)} for s in group.samples]
        return self._envelope("text_completion", "cmpl", choices, len(ids), group.samples)

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                             "owned_by": "pdsr"}]}

    async def end_sample(self, sample_id: str, reward: Any = None) -> dict[str, Any]:
        """End a named sample (``reward``: its reward, or None for the reward function) and return its row."""
        named = self._get(sample_id)
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))
                                   or not math.isfinite(reward)):
            raise ServeError(400, f"reward must be a finite number or null, got {reward!r}")
        sample = named.group.samples[0]
        if not sample.finished:
            if named.ctx is None:
                raise ServeError(409, f"sample {sample_id!r}: its first turn is still running")
            named.requests.put_nowait(("end", reward))
            await asyncio.shield(named.done)
        return await self.sample_row(sample_id)

    async def sample_row(self, sample_id: str) -> dict[str, Any]:
        """A named sample as a trajectories row (its reward once it ended)."""
        from pdsr_sdk.dispatch.trajectory import sample_row

        sample = self._get(sample_id).group.samples[0]
        scored = (await self.session.scores([sample]))[0] if sample.finished else None
        row = sample_row(sample, self.session.tokenizer, None, scored=scored)
        row["finished"] = sample.finished
        return row

    # ------------------------------------------------------------- named samples
    async def _named_turn(self, sample_id: str, messages: list[dict], max_tokens: int) -> dict[str, Any]:
        named = self._named.get(sample_id)
        loop = asyncio.get_running_loop()
        if named is None:
            text = self._render(messages)
            ids = self._encode(text)
            group = self._group(ids, text, 1, self.session.config.sampling.max_tokens, messages,
                                prompt_id=f"sample-{sample_id}")
            named = _Named(sample_id, group, done=loop.create_future())
            named.waiter = loop.create_future()
            self._named[sample_id] = named
            self.session.agents.prepare([group], self._remote(named))
            group.samples[0].turn_end = max_tokens   # the first turn's limit: this request's max_tokens
            self._add([group])
        else:
            sample = named.group.samples[0]
            if sample.finished or named.ctx is None:
                state = "has ended" if sample.finished else "is still on its first turn"
                raise ServeError(409, f"sample {sample_id!r} {state}")
            if named.waiter is not None and not named.waiter.done():
                raise ServeError(409, f"sample {sample_id!r} has a request running; one turn at a time")
            new = _extension(named.ctx.messages, messages, sample_id)
            named.waiter = loop.create_future()
            named.requests.put_nowait(("turn", new, max_tokens))
        turn = await asyncio.shield(named.waiter)
        sample = named.group.samples[0]
        message = self._message(turn.text, turn.token_ids)
        choice = {"index": 0, "message": message, "finish_reason": turn.finish_reason, "logprobs": None,
                  "token_ids": list(turn.token_ids)}
        return self._envelope("chat.completion", "chatcmpl", [choice], sample.prompt_len + sample.num_generated
                              - len(turn.token_ids), [sample], completion=len(turn.token_ids))

    def _remote(self, named: _Named):
        """The agent of a named sample: each turn answers the request waiting; the next request's new messages
        are appended, until ``end``."""
        from pdsr_sdk.agent import AgentDone

        async def remote(agent):
            named.ctx = agent
            try:
                turn = await agent.generate()
                while True:
                    _resolve(named.waiter, turn)
                    kind, *rest = await named.requests.get()
                    if kind == "end":
                        return rest[0]
                    new, max_tokens = rest
                    agent.append(new)
                    turn = await agent.generate(max_tokens=max_tokens)
            except AgentDone as exc:
                _fail(named.waiter, ServeError(409, f"sample {named.sample_id!r}: {exc}"))
                raise
            except BaseException as exc:
                _fail(named.waiter, ServeError(409, f"sample {named.sample_id!r} failed: {exc!r}"))
                raise
        return remote

    def _get(self, sample_id: str) -> _Named:
        named = self._named.get(sample_id)
        if named is None:
            raise ServeError(404, f"no sample {sample_id!r}")
        return named

    # ------------------------------------------------------------- dispatch
    def _group(self, ids: list[int], text: str, n: int, max_tokens: int, messages: list[dict] | None, *,
               prompt_id: str | None = None) -> Group:
        limit = self._context_limit()
        if limit is not None and len(ids) + max_tokens > limit:
            raise ServeError(400, f"the prompt ({len(ids)} tokens) plus max_tokens ({max_tokens}) exceeds the "
                                  f"engines' context ({limit} tokens)")
        g = Group(prompt_id=prompt_id or f"req-{next(self._ids)}", prompt_token_ids=ids, prompt_text=text, n=n,
                  messages=messages)
        g.samples = [Sample(group=g, index=i, max_tokens=max_tokens) for i in range(n)]
        return g

    async def _run(self, group: Group) -> None:
        done = asyncio.get_running_loop().create_future()
        self._groups[id(group)] = done
        self._add([group])
        await asyncio.shield(done)

    def _add(self, groups: list[Group]) -> None:
        sched = self.session.scheduler
        sched.guarded(sched.add_groups, groups)

    def _group_done(self, group: Group) -> None:
        done = self._groups.pop(id(group), None)
        if done is not None and not done.done():
            done.set_result(None)
        for named in self._named.values():
            if named.group is group and named.done is not None and not named.done.done():
                named.done.set_result(None)
                _fail(named.waiter, ServeError(409, f"sample {named.sample_id!r} ended "
                                                    f"({group.samples[0].finish_reason}: {group.samples[0].error})"))

    def _context_limit(self) -> int | None:
        limits = [getattr(getattr(e, "spec", None), "max_model_len", None) for e in self.session.engines]
        known = [x for x in limits if x]
        return min(known) if known else None

    # ------------------------------------------------------------- helpers
    def _common(self, body: dict[str, Any]) -> tuple[int, int]:
        if body.get("stream"):
            raise ServeError(400, "stream=true is not supported; pdsr answers when the turn ends")
        n = body.get("n") or 1
        cap = self.session.config.sampling.max_tokens
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or cap
        for key, value in (("n", n), ("max_tokens", max_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ServeError(400, f"{key} must be a positive integer, got {value!r}")
        return n, max_tokens

    def _render(self, messages: list[dict]) -> str:
        tok = self.session.tokenizer
        if not getattr(tok, "chat_template", None):
            raise ServeError(400, "the model's tokenizer has no chat template; use /v1/completions")
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _encode(self, text: str, special: bool = False) -> list[int]:
        ids = list(self.session.tokenizer(text, add_special_tokens=special)["input_ids"])
        if not ids:
            raise ServeError(400, "the prompt tokenizes to nothing")
        return ids

    def _message(self, text: str, token_ids: list[int]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.tool_parser:
            from pdsr_sdk.agent import parse_tool_calls

            raw = self.session.tokenizer.decode(token_ids, skip_special_tokens=False)
            content, calls = parse_tool_calls(raw, self.session.tokenizer, self.tool_parser)
            if calls:
                import json

                message["content"] = content or None
                message["tool_calls"] = [{"id": f"call-{next(self._ids)}", "type": "function", "function": {
                    "name": c.name, "arguments": json.dumps(c.arguments)}} for c in calls]
        return message

    def _chat_response(self, samples: list[Sample], prompt_tokens: int) -> dict[str, Any]:
        tok = self.session.tokenizer
        choices = [{"index": s.index, "message": self._message(tok.decode(s.token_ids, skip_special_tokens=True),
                                                               s.token_ids),
                    "finish_reason": _FINISH.get(s.finish_reason or "", "stop"), "logprobs": None,
                    "token_ids": list(s.token_ids)} for s in samples]
        return self._envelope("chat.completion", "chatcmpl", choices, prompt_tokens, samples)

    def _envelope(self, kind: str, prefix: str, choices: list, prompt_tokens: int, samples: list[Sample], *,
                  completion: int | None = None) -> dict[str, Any]:
        completion = sum(s.sampled_tokens for s in samples) if completion is None else completion
        return {"id": f"{prefix}-{next(self._ids)}", "object": kind, "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                          "total_tokens": prompt_tokens + completion}}


def _messages(value: Any) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise ServeError(400, "messages must be a non-empty list of {role, content}")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ServeError(400, f"messages[{i}] must be an object with a string 'role'")
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise ServeError(400, f"messages[{i}].content must be a string (parts are not supported)")
        out.append({**m, "content": content or ""})
    return out


def _extension(recorded: list[dict], messages: list[dict], sample_id: str) -> list[dict]:
    """The messages a named sample's request adds to its recorded conversation (which it must extend)."""
    if len(messages) <= len(recorded):
        raise ServeError(400, f"sample {sample_id!r}: the request has no new message after the recorded "
                              f"conversation ({len(recorded)} messages)")
    for i, (old, new) in enumerate(zip(recorded, messages)):
        if old["role"] != new["role"] or (old["role"] != "assistant" and old.get("content") != new.get("content")):
            raise ServeError(400, f"sample {sample_id!r}: message {i} differs from the recorded conversation "
                                  f"(recorded role {old['role']!r}); send the conversation so far, then new messages")
    return [{"role": m["role"], "content": m.get("content") or ""} for m in messages[len(recorded):]]


def _resolve(future: asyncio.Future | None, value: Any) -> None:
    if future is not None and not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future | None, exc: BaseException) -> None:
    if future is not None and not future.done():
        future.set_exception(exc)
        future.exception()   # seen: nobody may be waiting any more
