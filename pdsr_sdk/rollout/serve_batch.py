"""``pdsr serve``'s ``POST /v1/completions``, whose ``prompt`` is one prompt (a string, or a list of token ids) or,
as vLLM's server takes it, a batch: a list of strings or a list of token-id lists. Each prompt of a batch is a
group of ``n`` samples made as a single prompt's is, and the groups go to the dispatcher together; the choices are
indexed prompt-major (``index = prompt_i * n + sample_j``, as vLLM's, streamed too), each carries its prompt's
``prompt_token_ids`` (vLLM's place for them), and ``usage`` sums the prompts'. A named sample takes one prompt."""

from __future__ import annotations

from typing import Any

from pdsr_sdk.rollout.serve import ChatServer, check_failed, no_max_tokens
from pdsr_sdk.rollout.serve_shapes import FINISH
from pdsr_sdk.rollout.serve_error import ServeError
from pdsr_sdk.rollout.serve_logprobs import wanted
from pdsr_sdk.rollout.serve_named import sample_name
from pdsr_sdk.rollout.serve_options import include_stop

_FORMS = "a string, a list of token ids, or a batch: a list of strings or a list of token-id lists"


def _ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)


def prompts(value: Any) -> tuple[list[str | list[int]], bool]:
    """A completions request's prompts and whether they are a batch of several (a list of strings or of token-id
    lists; a list of token ids is one prompt). A 400 naming ``prompt`` (or ``prompt[i]``) for any other value."""
    if isinstance(value, str) and value:
        return [value], False
    if isinstance(value, list) and value and _ids(value):
        return [list(value)], False
    if not isinstance(value, list) or not value:
        raise ServeError(400, f"prompt must be non-empty: {_FORMS}; got {value!r:.80}", param="prompt")
    strings = isinstance(value[0], str)
    kind = "a string" if strings else "a list of token ids"
    for i, p in enumerate(value):
        if not (isinstance(p, str) if strings else _ids(p)):
            why = f"where prompt[0] is {kind}: a batch's prompts are all strings or all token-id lists" if i \
                else f"prompt must be {_FORMS}"
            raise ServeError(400, f"prompt[{i}] is {p!r:.60}, {why}", param="prompt")
        if not p:
            raise ServeError(400, f"prompt[{i}] is empty", param="prompt")
    return list(value), len(value) > 1   # a batch of one answers as its prompt alone, as before


async def completions(server: ChatServer, body: dict[str, Any], sample_id: str | None = None,
                      stream: bool | None = None) -> Any:
    """``POST /v1/completions`` on ``server``: each prompt a group through the policy, answered once all are done,
    or streamed (``stream``: whether the stream ends with usage; :mod:`pdsr_sdk.rollout.serve_stream`)."""
    server.check_model(body)
    batch, is_batch = prompts(body.get("prompt"))
    n, max_tokens = server.common(body, chat=False)
    want = wanted(body, chat=False)
    sample_id = sample_name(sample_id, body)
    if sample_id is not None:
        if n != 1 or len(batch) != 1:
            raise ServeError(400, "a named sample (pdsr_sample) takes one prompt and n = 1")
        return await server.named.completion_turn(str(sample_id), batch[0], max_tokens, want, stream)
    include = include_stop(body)
    groups = []
    for i, prompt in enumerate(batch):   # every prompt checked before any runs
        what = f"prompt[{i}]" if is_batch else "the prompt"
        text, ids = (prompt, server.encode(prompt, special=True, what=what)) if isinstance(prompt, str) \
            else ("", prompt)
        groups.append(server.make_group(ids, text, n, max_tokens, None, fit=no_max_tokens(body), what=what))
    if stream is not None:
        return await server.stream(groups, chat=False, include_stop=include, want=want, include_usage=stream)
    await server.run(groups)
    for group in groups:
        check_failed(group)
    choices = [{"index": i * n + s.index, "text": server.text_of(s, include),
                "finish_reason": FINISH.get(s.finish_reason or "", "stop"), "stop_reason": s.stop_reason,
                "logprobs": server.logprobs(s.token_ids, s.logprobs, chat=False, want=want),
                "token_ids": list(s.token_ids), "prompt_token_ids": list(g.prompt_token_ids)}
               for i, g in enumerate(groups) for s in g.samples]
    samples = [s for g in groups for s in g.samples]
    if is_batch:
        return server.envelope("text_completion", "cmpl", choices, [g.prompt_token_ids for g in groups], samples,
                               batch=True)
    return server.envelope("text_completion", "cmpl", choices, groups[0].prompt_token_ids, samples)
