"""What an agent function gets: :class:`AgentContext`, one per sample.

``async def run(agent)`` drives one sample: ``await agent.generate()`` is a model turn, ``agent.append(...)``
adds what the environment says, and the return value is the sample's reward (or None: the reward function
scores the whole trajectory). The first turn runs on the data row's prompt; the agent starts when it ends.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from pdsr_sdk.agent.render import environment_ids, message_text
from pdsr_sdk.agent.tools import truncate_tool_response
from pdsr_sdk.errors import PdsrError

if TYPE_CHECKING:
    from pdsr_sdk.dispatch.types import Sample


class AgentDone(Exception):
    """The sample can take no more model turns (its turn limit or token budget is spent, or the dispatch policy
    ended it). Raised by :meth:`AgentContext.generate`; an agent may let it propagate: the sample then ends as
    if the agent had returned None. Raised for the budget, it ends the sample ``length``, caught or not."""


class AgentError(PdsrError):
    """An agent function misused its context (two generate() at once, append after the end, ...)."""


@dataclass(frozen=True)
class TurnResult:
    """One model turn: the sampled ids as sampled, their text, their engine log-probs, and why it ended
    (``stop``: end of turn; ``length``: the turn's token limit)."""

    token_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: str
    turn: int


class AgentContext:
    """One sample's conversation, token-exact: the prompt ids, then each sampled id and each id the
    environment added, in order (``ids``; ``response_mask`` says which were sampled). Made by the agent runner;
    an agent function reads it and calls :meth:`generate` and :meth:`append`."""

    def __init__(self, sample: Sample, tokenizer: Any, *, max_turns: int, turn_max_tokens: int | None,
                 runner: Any, tool_cap: tuple[int, str] | None = None, max_env_turns: int | None = None):
        g = sample.group
        #: (most characters, side) a 'tool' message's content is cut to (agent.max_tool_response_chars); None: not cut
        self.tool_cap = tool_cap
        self.sample = sample
        self.tokenizer = tokenizer
        self.max_turns = max_turns
        self.max_env_turns = max_env_turns
        self.turn_max_tokens = turn_max_tokens
        self._runner = runner
        #: the conversation as chat messages (the model's turns as their decoded text): what new messages are
        #: rendered after; the ids never come from it
        self.messages: list[dict[str, Any]] = [dict(m) for m in g.messages] if g.messages else []
        self._staged: list[int] = []
        self._staged_tool: str | None = None
        #: the messages appended since the model's turn with nothing between them, rendered together: (where their
        #: ids start in _staged, the conversation before them, the messages, the model turn's ids or None)
        self._block: tuple[int, list[dict[str, Any]], list[dict[str, Any]], list[int] | None] | None = None
        self._last_turn_ids: list[int] | None = None
        self._pending: asyncio.Future | None = None
        self._first: TurnResult | None = None
        self.turns = 0
        #: environment turns taken: appended ids a model turn followed (the trajectory's 'environment' spans)
        self.env_turns = 0
        self.done = False
        #: a generate() was refused because the sample's response budget (sampling.max_tokens) is spent or the
        #: environment's tokens do not fit in it, or the agent called stop_for_budget(): the sample ends ``length``,
        #: as a trainer's overlong filter reads it
        self.budget_spent = False
        self._stopped_for_budget = False
        #: generate() calls refused (AgentDone, AgentError) since the model's last turn: named by a timeout's error
        self.refused = 0

    # ------------------------------------------------------------ read
    @property
    def prompt_id(self) -> str:
        return self.sample.group.prompt_id

    @property
    def sample_index(self) -> int:
        return self.sample.index

    @property
    def ground_truth(self) -> Any:
        """The prompt's reference answer, as the reward gets it: text, or a list or struct column's value as
        pyarrow gives it (a dict, a list), or what a Python prompt gave; None without one."""
        return self.sample.group.ground_truth

    @property
    def info(self) -> dict[str, Any]:
        """The data row's reward columns (verl's ``data_source``, ``extra_info``) when it has them."""
        return dict(self.sample.group.reward_info or {})

    @property
    def ids(self) -> list[int]:
        """The trajectory so far: prompt ids, then the response's (sampled and environment) ids; what the next
        turn's prompt will be, after any staged environment ids."""
        return self.sample.group.prompt_token_ids + self.sample.token_ids + self._staged

    @property
    def tokens_left(self) -> int:
        """Response tokens the sample may still take (model's and environment's)."""
        return self.sample.max_tokens - self.sample.num_generated - len(self._staged)

    @property
    def turns_left(self) -> int:
        return self.max_turns - self.turns

    @property
    def env_pending(self) -> int:
        """Ids the environment appended since the model's last turn: the next turn's prompt takes them; an agent
        that returns leaves them out of the trajectory."""
        return len(self._staged)

    # ----------------------------------------------------------- act
    def stop_for_budget(self) -> None:
        """Say that the agent stops because what is left of the response budget (``tokens_left``) is too little
        for another useful turn: the sample ends ``length`` when the agent returns, as when the budget refuses a
        generate() (a trainer's overlong filter reads it so), and a later generate() raises AgentDone."""
        if self.done:
            raise AgentError(f"sample {self.sample.key}: stop_for_budget after the sample ended")
        self.budget_spent = self._stopped_for_budget = True

    def append(self, messages: Sequence[dict[str, Any]] | None = None, *, ids: Sequence[int] | None = None,
               tool_name: str | None = None) -> list[int]:
        """Add what the environment says before the next turn: chat ``messages`` (rendered by the chat template
        after the conversation, with the assistant header after them) or raw token ``ids``. Returns the ids
        added. Messages appended right after other appended messages are rendered with them, as the template
        renders them together (one assistant header, after the last; Qwen3's puts consecutive tool results in one
        message): the ids returned are then those of all of them, in place of the ids the earlier call returned.
        ``tool_name`` labels the span in the trajectory's turns (several appends before one turn make one span: their
        names joined by ``,``, each once). A ``tool`` message's content longer than
        ``agent.max_tool_response_chars`` is cut (``tool_cap``), in ``messages`` too: what the model sees."""
        if self.done:
            raise AgentError(f"sample {self.sample.key}: append after the sample ended")
        if self._first is not None:
            raise AgentError(f"sample {self.sample.key}: the first turn ran on the data row's prompt; take it with "
                             f"`await agent.generate()` before appending")
        if (messages is None) == (ids is None):
            raise AgentError(f"sample {self.sample.key}: append: give messages or ids (one of them)")
        if tool_name is not None and not isinstance(tool_name, str):   # else the step's rows could not be written
            raise AgentError(f"sample {self.sample.key}: append: tool_name must be a string (or None), got "
                             f"{type(tool_name).__name__} {tool_name!r:.60}")
        if ids is not None:
            new = self._checked_ids(ids)
            self._staged.extend(new)
            self._block = None
        else:
            msgs = self._checked(messages)
            if self.tool_cap is not None:
                msgs = [{**m, "content": truncate_tool_response(m["content"], *self.tool_cap)}
                        if m["role"] == "tool" else m for m in msgs]
            if not self.messages:
                raise AgentError(f"sample {self.sample.key}: its prompt was not given as chat messages; append ids")
            start, conversation, before, last = self._block or (
                len(self._staged), list(self.messages), [], None if self._staged else self._last_turn_ids)
            new = environment_ids(self.tokenizer, conversation, before + msgs, last_turn_ids=last,
                                  template_kwargs=self._runner.template_kwargs)
            self._staged[start:] = new
            self._block = (start, conversation, before + msgs, last)
            self.messages.extend(msgs)
        if tool_name and tool_name not in (self._staged_tool or "").split(","):   # one span: every tool it holds
            self._staged_tool = f"{self._staged_tool},{tool_name}" if self._staged_tool else tool_name
        return new

    def _checked_ids(self, ids: Sequence[int]) -> list[int]:
        """``ids`` as a list of ints, or an AgentError naming the first that is not a token id of the vocabulary
        (a negative one stopped the whole step where its row was decoded; one past the vocabulary cost a request
        the engine refused)."""
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise AgentError(f"sample {self.sample.key}: append(ids=...) takes a list of token ids, got "
                             f"{type(ids).__name__} {ids!r:.60}")
        vocab = self._runner.vocab()
        out = []
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not hasattr(t, "__index__") or t < 0 or (vocab is not None and t >= vocab):
                within = f"0 to {vocab - 1}" if vocab is not None else "0 or more"
                raise AgentError(f"sample {self.sample.key}: append: ids[{i}] = {t!r:.40} is not a token id of the "
                                 f"vocabulary (ints {within})")
            out.append(int(t))
        return out

    def _checked(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` with their content as the template's text (:func:`message_text`), or an AgentError naming
        the message that is not a chat message."""
        if not isinstance(messages, (list, tuple)):
            raise AgentError(f"sample {self.sample.key}: append takes a list of messages ([{{'role': ..., 'content': "
                             f"...}}]), got {type(messages).__name__}")
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise AgentError(f"sample {self.sample.key}: append: messages[{i}] must be a dict with a string "
                                 f"'role', got {m!r:.60}")
            try:
                out.append({**m, "content": message_text(m.get("content"), f"messages[{i}].content")})
            except ValueError as exc:
                raise AgentError(f"sample {self.sample.key}: append: {exc}") from None
        return out

    async def generate(self, messages: Sequence[dict[str, Any]] | None = None, *, ids: Sequence[int] | None = None,
                       max_tokens: int | None = None, tool_name: str | None = None) -> TurnResult:
        """One model turn after the conversation so far (``messages`` or ``ids`` are appended first, as
        :meth:`append`). ``max_tokens`` bounds this turn (default: the config's ``turn_max_tokens``, else the
        budget left). Raises :class:`AgentDone` when no turn or token is left."""
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens < 1):
            raise AgentError(f"sample {self.sample.key}: generate(max_tokens={max_tokens!r}): a turn's limit is a "
                             f"positive int, or None for the default (agent.turn_max_tokens, else the budget left)")
        if self._first is not None:   # the first turn ran on the data row's prompt before the agent started
            if messages is not None or ids is not None:
                raise AgentError(f"sample {self.sample.key}: the first turn runs on the data row's prompt; call "
                                 f"generate() without messages first (put what the first turn needs in the data)")
            # that turn ran under turn_max_tokens (else the budget): a lower max_tokens here was silently not applied
            ran_under = min(self.turn_max_tokens or self.sample.max_tokens, self.sample.max_tokens)
            if max_tokens is not None and max_tokens < ran_under:
                now = (f"now {self.turn_max_tokens}" if self.turn_max_tokens is not None
                       else "not set: the budget, sampling.max_tokens")
                raise AgentError(f"sample {self.sample.key}: generate(max_tokens={max_tokens!r}) cannot bound the "
                                 f"first turn: it runs on the data row's prompt before the agent starts, under "
                                 f"agent.turn_max_tokens (--turn-max-tokens; {now}, so up to {ran_under} tokens); "
                                 f"set that, or call the first generate() without max_tokens")
            first, self._first = self._first, None
            return first
        # yield to the event loop first: an agent that catches AgentDone (or an AgentError) and calls again would
        # otherwise hold the loop for good, its env_timeout_s timer and every other sample with it
        await asyncio.sleep(0)
        try:
            return await self._next_turn(messages, ids, max_tokens, tool_name)
        except (AgentDone, AgentError):
            self.refused += 1
            raise

    async def _next_turn(self, messages: Sequence[dict[str, Any]] | None, ids: Sequence[int] | None,
                         max_tokens: int | None, tool_name: str | None) -> TurnResult:
        if messages is not None or ids is not None:
            self.append(messages, ids=ids, tool_name=tool_name)
        if self._pending is not None and not self._pending.done():
            raise AgentError(f"sample {self.sample.key}: generate() while another generate() waits")
        if self.done:
            raise AgentDone(f"sample {self.sample.key} has ended")
        if self._stopped_for_budget:
            raise AgentDone(f"sample {self.sample.key}: the agent stopped for its budget (stop_for_budget)")
        if self.turns >= self.max_turns:
            raise AgentDone(f"sample {self.sample.key}: {self.turns} turns, the limit (agent.max_turns)")
        if self._staged and self.max_env_turns is not None and self.env_turns >= self.max_env_turns:
            raise AgentDone(f"sample {self.sample.key}: {self.env_turns} environment turns, the limit "
                            f"(agent.max_env_turns); the {len(self._staged)} ids appended since the last turn are "
                            f"not in the trajectory")
        if self.tokens_left <= 0:
            self.budget_spent = True
            budget = f"{self.sample.max_tokens} response tokens (sampling.max_tokens)"
            left = self.sample.max_tokens - self.sample.num_generated
            if left > 0:   # the environment's tokens do not fit, not the model's: an agent can shorten them
                raise AgentDone(f"sample {self.sample.key}: the {len(self._staged)} tokens the environment appended "
                                f"since the last turn do not fit in the {left} left of its {budget}; they are not "
                                f"in the trajectory")
            raise AgentDone(f"sample {self.sample.key}: its {budget} are spent")
        limit = self.turn_max_tokens if max_tokens is None else max_tokens
        staged, tool = self._staged, self._staged_tool
        self.env_turns += bool(staged)
        self._staged, self._staged_tool, self._block = [], None, None
        self._pending = asyncio.get_running_loop().create_future()
        self._runner.continue_turn(self, staged, limit, tool)
        return await self._pending

    # ------------------------------------------------------- runner side
    def turn_ended(self, result: TurnResult) -> None:
        """The runner: a model turn ended (the first one before the agent starts)."""
        self.turns += 1
        self.refused = 0
        self._last_turn_ids = result.token_ids
        self.messages.append({"role": "assistant", "content": result.text})
        if self.turns == 1:
            self._first = result
        elif self._pending is not None and not self._pending.done():
            self._pending.set_result(result)

    def end(self, reason: str) -> None:
        """The runner: the sample ended (``reason``); a generate() waiting raises AgentDone."""
        self.done = True
        if self._pending is not None and not self._pending.done():
            self._pending.set_exception(AgentDone(f"sample {self.sample.key} ended ({reason})"))
            self._pending.exception()   # seen: an agent that no longer awaits it is not an error to log
