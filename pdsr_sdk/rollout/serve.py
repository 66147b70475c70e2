"""An OpenAI-style server on a rollout session's engines and policy (``pdsr serve``, ``session.aserve()``).

Every request goes through the session's dispatcher: it becomes a group (``n`` samples) handed to the policy
like a step's groups, so the server schedules as a rollout does. The HTTP layer
(:mod:`pdsr_sdk.rollout.serve_app`) is thin: it parses, calls :class:`ChatServer`, and turns a
:class:`ServeError` into vLLM's server's error body.

**Named samples.** A chat or completions request that names a sample (header ``X-Pdsr-Sample: ID``, or
``"pdsr_sample": ID`` in the body) is a turn of one multi-turn sample, recorded token-exact as an agent's sample
is (:mod:`pdsr_sdk.rollout.serve_named`). Each later request with the same ID sends the whole conversation
(chat: the messages; completions: the prompt) again, as OpenAI clients do: pdsr checks that it extends the
recorded one, appends only what is new, and continues from the sampled ids, never from re-encoded text. A
sample keeps the endpoint it started on. It ends with ``POST /v1/pdsr/samples/ID/end`` (body ``{"reward": R}``,
or no reward: then the session's reward function scores it), which returns its trajectory; a sample with no
request for ``agent.env_timeout_s`` fails, as an agent that hangs does. ``GET /v1/pdsr/samples/ID`` reads it
at any time.

**A failed session.** Once the session fails (a policy's exception, a pool's last engine lost), every request
still running gets vLLM's 500 saying why (a stream that started: its error chunk, then ``[DONE]``), as each new
one does, and ``/health`` answers 503: no client waits on samples that will never end. A server shutting down
(Ctrl-C, the session closed) answers what it has not finished with a 503 saying so (:data:`SHUTTING_DOWN`), not
the SDK's words for a closed session.

**Streaming.** ``stream=true`` streams a request's tokens as the engines make them (a named sample's turn's too), in
vLLM's server's chunk shapes (:mod:`pdsr_sdk.rollout.serve_stream`); with ``hermes``, a chat's tool calls as they
are written.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from pdsr_sdk.dispatch.types import FAILED, Group, Sample
from pdsr_sdk.errors import RunError
from pdsr_sdk.rollout.serve_error import ServeError
from pdsr_sdk.rollout.serve_logprobs import wanted
from pdsr_sdk.rollout.serve_model import check_model, model_cards
from pdsr_sdk.rollout.serve_shapes import ResponseShapes
from pdsr_sdk.rollout.serve_options import (check_named_template, include_stop, messages_of, template_options,
                                             tools_of)
from pdsr_sdk.rollout.serve_named import NamedSamples, fail_future, sample_name

#: what a request the server will not finish hears once it shuts down (a 503, as the body's message)
SHUTTING_DOWN = "the server is shutting down and did not finish this request; send it again to a running server"


class ChatServer(ResponseShapes):
    """The server's logic over a started :class:`~pdsr_sdk.rollout.session.RolloutSession`."""

    def __init__(self, session: Any, *, model_name: str | list[str] | None = None, aliases: list[str] | None = None,
                 tool_parser: str | None = None):
        self.session = session
        #: the names a request's ``model`` may be (listed by /v1/models; the first names every response), and
        #: ``aliases`` taken too, unlisted (:mod:`pdsr_sdk.rollout.serve_model`)
        self.model_names = [model_name] if isinstance(model_name, str) else list(model_name or ["pdsr"])
        self.model_name = self.model_names[0]
        self.aliases = list(aliases or [])
        self.tool_parser = tool_parser
        self._ids = itertools.count()
        self.named = NamedSamples(self)
        self._groups: dict[int, asyncio.Future] = {}
        self._vocab: int | None = None
        self._hub: Any = None   # the streams' StreamHub, from the first stream on
        self._stopping = False   # close() ran: the server is shutting down
        session.hooks.on_group_done.append(self._group_done)
        session.hooks.on_fatal.append(self._session_failed)

    # ------------------------------------------------------------- requests
    async def chat(self, body: dict[str, Any], sample_id: str | None = None, stream: bool | None = None) -> Any:
        """``POST /v1/chat/completions``; ``stream``: None, or whether a stream ends with usage (then the stream's
        events)."""
        self.check_model(body)
        messages = messages_of(body.get("messages"))
        tools = tools_of(body.get("tools"))
        n, max_tokens = self.common(body, chat=True)
        template = template_options(body, self.session.config.data.chat_template_kwargs)
        want = wanted(body, chat=True)
        sample_id = sample_name(sample_id, body)
        if sample_id is not None:
            if n != 1:
                raise ServeError(400, "a named sample (pdsr_sample) takes n = 1")
            check_named_template(template, self.session.config.data.chat_template_kwargs)
            return await self.named.chat_turn(str(sample_id), messages, max_tokens, tools, want, stream)
        include = include_stop(body)
        text = self.render(messages, tools, **template)
        ids = self.encode(text)
        group = self.make_group(ids, text, n, max_tokens, messages, fit=no_max_tokens(body))
        if stream is not None:
            return await self.stream([group], chat=True, include_stop=include, want=want, include_usage=stream)
        await self.run([group])
        check_failed(group)
        return self._chat_response(group.samples, ids, include, want)

    async def completions(self, body: dict[str, Any], sample_id: str | None = None, stream: bool | None = None) -> Any:
        """``POST /v1/completions``: a text prompt or token ids, no chat template; or a batch of either
        (:mod:`pdsr_sdk.rollout.serve_batch`); ``stream`` as :meth:`chat`'s."""
        from pdsr_sdk.rollout.serve_batch import completions

        return await completions(self, body, sample_id, stream)

    def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /tokenize``: a prompt's or a chat's ids, as a request's (:mod:`pdsr_sdk.rollout.serve_tokenize`)."""
        from pdsr_sdk.rollout.serve_tokenize import tokenize

        return tokenize(self, body)

    def detokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /detokenize``: token ids' text."""
        from pdsr_sdk.rollout.serve_tokenize import detokenize

        return detokenize(self, body)

    def check_model(self, body: dict[str, Any]) -> None:
        """A 404 unless the request's ``model`` is a name this server answers to, as vLLM's server's."""
        check_model(body, self.model_names, self.aliases)

    def models(self) -> dict[str, Any]:
        """``GET /v1/models``: vLLM's card of the model per name it answers to (:func:`model_cards`)."""
        return model_cards(self.model_names, self.session.model_dir or "", self.context_limit())

    def refusal(self) -> ServeError | None:
        """The error a request gets now in place of an answer, or None while the server serves: a 503 once it shuts
        down (:meth:`close` ran, or the session was closed: an HTTP client is told to retry elsewhere, not to open a
        RolloutSession), vLLM's 500 once the session failed (a policy's exception, a pool's last engine lost)."""
        if self._stopping or self.session.closed:
            return ServeError(503, SHUTTING_DOWN)
        try:
            self.session.check_usable("serve")
        except RunError as exc:
            return ServeError(500, str(exc))
        return None

    async def end_sample(self, sample_id: str, reward: Any = None) -> dict[str, Any]:
        """End a named sample (``reward``: its reward, or None for the reward function) and return its row."""
        return await self.named.end(sample_id, reward)

    async def sample_row(self, sample_id: str) -> dict[str, Any]:
        """A named sample as a trajectories row (its reward once it ended)."""
        return await self.named.row(sample_id)

    # ------------------------------------------------------------- dispatch
    def make_group(self, ids: list[int], text: str, n: int, max_tokens: int, messages: list[dict] | None, *,
                   prompt_id: str | None = None, fit: bool = False, what: str = "the prompt") -> Group:
        """A request's group of ``n`` samples (its prompt checked against the engines' context). ``fit``: the
        request set no max_tokens, so ``max_tokens`` (the session's) shrinks to the room the prompt leaves, as
        vLLM's server's default does; a max_tokens the request set is a 400 when it does not fit. ``what``: the
        prompt as an error names it (a batch's ``prompt[i]``)."""
        self.check_ids(ids, what)
        limit = self.context_limit()
        if fit and limit is not None and len(ids) < limit:
            max_tokens = min(max_tokens, limit - len(ids))
        if limit is not None and len(ids) >= limit:
            raise ServeError(400, f"{what} ({len(ids)} tokens) leaves no room for a response in the engines' "
                                  f"context ({limit} tokens)")
        if limit is not None and len(ids) + max_tokens > limit:
            raise ServeError(400, f"{what} ({len(ids)} tokens) plus max_tokens ({max_tokens}) exceeds the "
                                  f"engines' context ({limit} tokens)")
        g = Group(prompt_id=prompt_id or f"req-{next(self._ids)}", prompt_token_ids=ids, prompt_text=text, n=n,
                  messages=messages)
        g.samples = [Sample(group=g, index=i, max_tokens=max_tokens) for i in range(n)]
        return g

    async def run(self, groups: list[Group]) -> None:
        """Hand a request's ``groups`` to the dispatcher together and wait until each is done."""
        await asyncio.shield(asyncio.gather(*self.launch(groups)))

    def launch(self, groups: list[Group]) -> list[asyncio.Future]:
        """Hand a request's ``groups`` to the dispatcher together; a future per group, done when it is."""
        loop = asyncio.get_running_loop()
        done = [loop.create_future() for _ in groups]
        self._groups.update((id(g), d) for g, d in zip(groups, done))
        try:
            self.add(groups)
        except ServeError:
            for g in groups:
                self._groups.pop(id(g), None)
            raise
        return done

    async def stream(self, groups: list[Group], **kw: Any) -> Any:
        """Run ``groups`` streamed: their events once their first tokens came (``kw``:
        :func:`~pdsr_sdk.rollout.serve_stream.stream_groups`')."""
        from pdsr_sdk.rollout.serve_stream import stream_groups

        return await stream_groups(self, groups, **kw)

    async def stream_turn(self, sample: Sample, turn: asyncio.Future, prompt: list[int], answer: Any,
                          **kw: Any) -> Any:
        """A named sample's running ``turn`` streamed (:func:`~pdsr_sdk.rollout.serve_stream.stream_turn`)."""
        from pdsr_sdk.rollout.serve_stream import stream_turn

        return await stream_turn(self, sample, turn, prompt, answer, **kw)

    def stream_hub(self) -> Any:
        """The streams' :class:`~pdsr_sdk.rollout.serve_stream.StreamHub` (heard from a server's first stream on)."""
        if self._hub is None:
            from pdsr_sdk.rollout.serve_stream import StreamHub

            self._hub = StreamHub(self.session.hooks)
        return self._hub

    def add(self, groups: list[Group]) -> None:
        """Hand ``groups`` to the dispatcher, as a step's groups are (with speculative 'group', each with the earlier
        responses to its prompt to draft from)."""
        self.check_alive()
        if self.session.weights_partial:   # no sample from weights part old, part new, or differing by engine
            raise ServeError(503, f"the engines hold a partial weight update ({self.session.weights_partial}); ask "
                                  f"again once the trainer's next update_weights completes")
        self.session.give_history(groups)
        sched = self.session.scheduler
        sched.guarded(sched.add_groups, groups)

    def check_alive(self) -> None:
        """vLLM's 500 for a request once its engine died: here, once the session failed; a 503 once the server shuts
        down (:meth:`refusal`)."""
        error = self.refusal()
        if error is not None:
            raise error

    def _session_failed(self, _: Any = None) -> None:
        """The session failed (or closed): its samples still running will never end, so each request waiting on one
        gets the error now (a plain request's groups, a named sample's turn or end; a stream wakes to end with it)."""
        def error() -> ServeError:
            return self.refusal() or ServeError(500, "the session failed")

        waiting, self._groups = list(self._groups.values()), {}
        for done in waiting:
            fail_future(done, error())
        self.named.fail(error)
        if self._hub is not None:
            self._hub.wake_all()

    def close(self) -> None:
        """Serving ends (the session calls it once the HTTP server stopped, or was stopped by Ctrl-C): a request
        still waiting gets the 503 of :data:`SHUTTING_DOWN`; then stop hearing the session's groups and tokens."""
        self._stopping = True
        self._session_failed()
        if self._session_failed in self.session.hooks.on_fatal:
            self.session.hooks.on_fatal.remove(self._session_failed)
        if self._group_done in self.session.hooks.on_group_done:
            self.session.hooks.on_group_done.remove(self._group_done)
        if self._hub is not None:
            self._hub.close()

    def _group_done(self, group: Group) -> None:
        done = self._groups.pop(id(group), None)
        if done is not None:
            # a request's samples are answered now and never scored for anyone (a named sample's reward is read
            # from the runner: it is not in _groups): the runner lets them go, as a step's result does
            rewards = self.session.rewards
            if rewards is not None:
                rewards.forget(group.samples)
            if not done.done():
                done.set_result(None)
        self.named.group_done(group)

    def check_ids(self, ids: list[int], what: str) -> None:
        """A 400 naming the first of ``ids`` outside the model's vocabulary (the engines would refuse it)."""
        if self._vocab is None:
            from pdsr_sdk.rollout.preflight import model_vocab

            self._vocab = model_vocab(self.session.tokenizer, self.session.model_dir or "")
        bad = next((i for i in ids if not 0 <= i < self._vocab), None)
        if bad is not None:
            raise ServeError(400, f"{what}: token id {bad} is out of the vocabulary (ids 0 to {self._vocab - 1})")

    def context_limit(self) -> int | None:
        limits = [getattr(getattr(e, "spec", None), "max_model_len", None) for e in self.session.engines]
        known = [x for x in limits if x]
        return min(known) if known else None

    # ------------------------------------------------------------- helpers
    def common(self, body: dict[str, Any], *, chat: bool) -> tuple[int, int]:
        """A request's ``n`` and ``max_tokens``, after checking that its sampling fields ask for what the session
        samples with (:mod:`pdsr_sdk.rollout.serve_sampling`). Its ``model`` is checked by :meth:`check_model`."""
        from pdsr_sdk.rollout.serve_sampling import check_sampling

        n = 1 if body.get("n") is None else body["n"]   # null or absent: the default; 0 is an error, not 1
        max_tokens = next((body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None),
                          self.session.config.sampling.max_tokens)
        for key, value in (("n", n), ("max_tokens", max_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ServeError(400, f"{key} must be a positive integer, got {value!r}")
        check_sampling(body, self.session.config.sampling, chat=chat, n=n)
        return n, max_tokens

    def render(self, messages: list[dict], tools: list[dict] | None = None, *,
               template_kwargs: dict[str, Any] | None = None, add_generation_prompt: bool = True,
               continue_final_message: bool = False) -> str:
        """``messages`` as the chat template renders them, with the generation prompt (and the request's ``tools``,
        which a tool-calling template describes to the model, as vLLM's server passes them); ``template_kwargs``:
        the template's extra variables (default the session's ``data.chat_template_kwargs``)."""
        tok = self.session.tokenizer
        if not getattr(tok, "chat_template", None):
            raise ServeError(400, "the model's tokenizer has no chat template; use /v1/completions")
        if template_kwargs is None:
            template_kwargs = self.session.config.data.chat_template_kwargs
        if continue_final_message and messages[-1]["role"] != "assistant":
            raise ServeError(400, f"continue_final_message continues the last message, an assistant's; it is "
                                  f"{messages[-1]['role']!r}")
        try:
            return tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                           add_generation_prompt=add_generation_prompt,
                                           continue_final_message=continue_final_message, **template_kwargs)
        except Exception as exc:   # noqa: BLE001 - the template's refusal (raise_exception: jinja's TemplateError)
            raise ServeError(400, f"the chat template refused the messages: {exc}") from None

    def encode(self, text: str, special: bool = False, what: str = "the prompt") -> list[int]:
        """``text``'s token ids (``special``: with the tokenizer's added special tokens); ``what``: the prompt as
        the 400 for no ids names it."""
        ids = list(self.session.tokenizer(text, add_special_tokens=special)["input_ids"])
        if not ids:
            raise ServeError(400, f"{what} tokenizes to nothing")
        return ids


def no_max_tokens(body: dict[str, Any]) -> bool:
    return body.get("max_tokens") is None and body.get("max_completion_tokens") is None


def check_failed(group: Group) -> None:
    """A 400 naming why when a request's sample failed, never an empty answer: an engine refused it (vLLM's
    validation of the request; vLLM's own server answers those with a 400 too, which clients do not retry)."""
    failed = [s for s in group.samples if s.finish_reason == FAILED]
    if failed:
        raise ServeError(400, f"{len(failed)} of {len(group.samples)} choices failed: {failed[0].error}")

