"""Speculative method ``group`` (issue 50): drafts from the same group's finished siblings, as a vLLM
``custom_class`` proposer.

Two sides:

- In the orchestrator, :func:`group_extra_args` puts a request's draft corpus in its ``SamplingParams.extra_args``
  (key :data:`EXTRA_KEY`) when :class:`~pdsr_sdk.engines.vllm_engine.VllmEngine` launches a segment: the
  response token ids of the sample's siblings that had finished by then, then its group's earlier responses to the
  same prompt (``Group.draft_responses``: :class:`DraftHistory`), with the lookup window and where the response
  starts in the request's context. pdsr launches every segment as a new request (a continuation, a
  moved or stolen sample, one after a pause), so each carries the corpus as it is at its launch.
- In vLLM's worker, :class:`GroupProposer` (``speculative_config = {"method": "custom_class", "model":
  GROUP_PROPOSER, ...}``; vLLM 0.32 builds it in ``GPUModelRunner.__init__`` from the ``VllmConfig`` alone,
  ``vllm/v1/spec_decode/custom_class_proposer.py``) drafts for each row of the batch by looking the row's last
  n-gram up in that row's corpus (:func:`pdsr_sdk.engines.group_match.find_draft`) and in the row's own prompt
  and output as vLLM's ``ngram`` does; the longer match drafts (the row's own on a tie).

vLLM calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` with the batch's
rows but not their request ids (``GPUModelRunner.propose_draft_token_ids``). The ids, and each request's
``SamplingParams``, are on the model runner (``input_batch.req_ids``, ``requests[id].sampling_params``), which
the proposer is not given: pdsr's worker extension hands it over (``PdsrWorkerExtension.pdsr_attach_drafter``,
called once by the engine at start-up). That is the plugin boundary: the proposer reads the runner's
``input_batch.req_ids`` and ``requests`` and nothing else of it. Until attached it drafts nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pdsr_sdk.dispatch.types import DROPPED, FAILED
from pdsr_sdk.engines.config import GROUP_PROPOSER
from pdsr_sdk.engines.group_match import best_match, vote_draft
from pdsr_sdk.errors import DataError

#: the key of a request's corpus in ``SamplingParams.extra_args``
EXTRA_KEY = "pdsr_group"
#: the draft rules a request may name (``extra_args[EXTRA_KEY]["rule"]``; see :meth:`GroupProposer._draft`)
RULES = ("vote", "longest")
DEFAULT_RULE = "vote"
#: ``vote``: the share of the agreeing places a drafted token needs (0.6: two places that disagree draft nothing;
#: in replays of SmolLM2-135M at temperature 1 it accepted more per verify step than 0.5 at about the same share
#: of tokens from drafts, docs/notes/speculation.md)
VOTE_SHARE = 0.6
#: how the corpus travels: one little-endian int32 byte string per response (a list of ints is walked item by
#: item by SamplingParams' argument check and msgpack)
_DTYPE = np.dtype("<i4")
#: the trajectories columns :meth:`DraftHistory.read` uses, and the finish reasons it skips
HISTORY_COLUMNS = ("prompt_token_ids", "response_token_ids", "finish_reason")
_NOT_DRAFTED = (FAILED, DROPPED)


def is_group(speculative: dict[str, Any] | None) -> bool:
    """Whether vLLM's ``speculative_config`` is pdsr's group drafter."""
    return bool(speculative) and speculative.get("model") == GROUP_PROPOSER


class DraftHistory:
    """Earlier responses to each prompt (keyed by its token ids, ``per_prompt`` most recent kept), drafted from by
    later groups of that prompt: the session records every group it finishes, and may start from a trajectories
    file (:meth:`read`); a group gets its prompt's responses when the session hands it to the engines
    (:attr:`Group.draft_responses <pdsr_sdk.dispatch.types.Group.draft_responses>`).

    At most ``max_tokens`` response tokens are kept in all (None: no bound): past it, the prompts recorded least
    recently lose their responses first (the latest prompt's are kept whatever their size). In training a dataset bounds
    the history; under ``serve`` every distinct request prompt would add to it for good."""

    def __init__(self, per_prompt: int, max_tokens: int | None = None):
        self.per_prompt = per_prompt
        self.max_tokens = max_tokens
        #: int32 arrays, not lists of ints: a list holds about 36 bytes a token, and a history of every prompt of a
        #: dataset (100k prompts x 8 responses of 1k tokens) would take about 29 GB that way, 3.2 GB this way;
        #: ordered from the prompt recorded least recently to the latest (the order the bound evicts in)
        self._responses: OrderedDict[tuple[int, ...], list[np.ndarray]] = OrderedDict()
        self._tokens = 0   # response tokens kept, over every prompt

    @property
    def tokens(self) -> int:
        """The response tokens kept, over every prompt."""
        return self._tokens

    def record(self, group: Any) -> None:
        """Keep ``group``'s finished responses (not those dynamic sampling dropped unfinished)."""
        self._add(group.prompt_token_ids,
                  [s.token_ids for s in group.samples if s.finished and s.finish_reason != DROPPED and s.token_ids])

    def read(self, path: str | Path, setting: str | None = None) -> int:
        """Keep the responses in a trajectories file (``pdsr rollout``'s output: ``prompt_token_ids``,
        ``response_token_ids``, ``finish_reason``), in its row order, as if their groups had finished before any
        of this session's; those that failed or were dropped are skipped. Returns the responses read. ``setting``:
        the flag or config key that gave ``path``, named in the errors about the file. Only these three columns are
        read, a batch of rows at a time (a rollout output also holds log-probs, text and segments)."""
        from pdsr_sdk.io.blocks import open_table_batches   # pyarrow: not in vLLM's workers, which import this module

        log = open_table_batches(path, HISTORY_COLUMNS, what="draft history", setting=setting)
        where = f"{setting} {log.path}" if setting else str(log.path)
        _check_history_types(log.schema, where)
        count = start = 0
        for batch in log.batches(HISTORY_COLUMNS):
            _check_no_null_ids(batch, start, where)
            prompts, reasons = batch["prompt_token_ids"].to_pylist(), batch["finish_reason"].to_pylist()
            # the responses as numpy, not lists: a batch's Python ints took 4/5 of the read
            ids = batch["response_token_ids"].combine_chunks()
            offsets, valid = np.asarray(ids.offsets), np.asarray(ids.is_valid())
            values = ids.values.to_numpy(zero_copy_only=False)
            for i, (prompt, reason) in enumerate(zip(prompts, reasons)):
                if reason in _NOT_DRAFTED or not valid[i] or offsets[i] == offsets[i + 1]:
                    continue
                if prompt is None:
                    raise DataError(f"{where}: column 'prompt_token_ids' row {start + i} is empty (null); expected "
                                    f"the prompt's token ids")
                self._add(prompt, [values[offsets[i]:offsets[i + 1]].astype(np.int32)])   # a copy: not the batch's
                count += 1
            start += batch.num_rows
        return count

    def responses(self, group: Any) -> list[list[int]]:
        """The kept responses to ``group``'s prompt, most recent last (none before a group of it finished)."""
        kept = self._responses.get(tuple(group.prompt_token_ids), ()) if self._responses else ()
        return [r.tolist() for r in kept]

    def _add(self, prompt: Sequence[int], responses: list[Sequence[int]]) -> None:
        if self.per_prompt <= 0 or not responses:
            return
        key = tuple(prompt)
        old = self._responses.pop(key, [])
        kept = (old + [np.asarray(r, dtype=np.int32) for r in responses])[-self.per_prompt:]
        self._responses[key] = kept   # now the latest recorded
        self._tokens += sum(r.size for r in kept) - sum(r.size for r in old)
        while self.max_tokens is not None and self._tokens > self.max_tokens and len(self._responses) > 1:
            _, evicted = self._responses.popitem(last=False)
            self._tokens -= sum(r.size for r in evicted)


def _check_history_types(schema: Any, where: str) -> None:
    """A DataError naming ``where`` and the column unless the token id columns are lists of integers and
    ``finish_reason`` is text (read as they are, a column of text would be split into characters or fail deep in
    the read)."""
    import pyarrow as pa

    from pdsr_sdk.io.columns import is_token_ids

    for name in HISTORY_COLUMNS:
        kind = schema.field(name).type
        if name == "finish_reason":
            ok = pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)
            expected = "text (stop, length, failed, ...)"
        else:
            ok = is_token_ids(kind)
            expected = "lists of token ids (integers)"
        if not ok:
            raise DataError(f"{where}: column {name!r} is {kind}; expected {expected}, as pdsr rollout writes it")


def _check_no_null_ids(batch: Any, start: int, where: str) -> None:
    """A DataError naming the row (``start``: the batch's first row in the file) of the first null token id."""
    import pyarrow.compute as pc

    for name in HISTORY_COLUMNS[:2]:
        column = batch[name].combine_chunks()
        flat = pc.list_flatten(column)
        if flat.null_count:
            rows = pc.list_parent_indices(column)
            row = start + int(np.asarray(rows)[np.flatnonzero(np.asarray(flat.is_null()))[0]])
            raise DataError(f"{where}: column {name!r} row {row} has an empty (null) token id")


def draft_corpus(sample: Any) -> list[list[int]]:
    """What ``sample``'s next segment drafts from: its finished siblings' responses, then earlier responses to its
    prompt (its group's ``draft_responses``)."""
    corpus = sibling_responses(sample)
    group = getattr(sample, "group", None)
    if group is not None:
        corpus += group.draft_responses
    return corpus


def sibling_responses(sample: Any) -> list[list[int]]:
    """The response token ids of ``sample``'s finished siblings (in the group's order), the corpus its next
    segment drafts from; none for a sample without a group (a bare request)."""
    group = getattr(sample, "group", None)
    if group is None:
        return []
    return [s.token_ids for s in group.samples if s is not sample and s.finished and s.token_ids]


def group_extra_args(request: Any, min_n: int, max_n: int) -> dict[str, Any]:
    """``SamplingParams.extra_args`` for a segment request under ``group``: its corpus (:func:`draft_corpus`; empty
    while nothing has finished: the row then drafts from its own context only), window, where its response
    starts and the draft rule (:data:`DEFAULT_RULE`)."""
    corpus = draft_corpus(request.sample)
    return {EXTRA_KEY: {"drafts": [np.asarray(r, dtype=_DTYPE).tobytes() for r in corpus],
                        "min_n": int(min_n), "max_n": int(max_n), "start": int(request.sample.prompt_len),
                        "rule": DEFAULT_RULE}}


def in_vocabulary(draft: list[int], vocab_size: int | None) -> list[int]:
    """``draft`` up to its first id outside the model's vocabulary (a history from another tokenizer or model):
    vLLM checks no drafted id, and the model's embedding lookup fails on one (the engine core dies); the model
    never samples such an id, so the tokens after it could not be accepted either."""
    if vocab_size is None:
        return draft
    for j, t in enumerate(draft):
        if not 0 <= t < vocab_size:
            return draft[:j]
    return draft


class GroupProposer:
    """vLLM's ``custom_class`` proposer for ``group`` (one per worker, built by vLLM)."""

    def __init__(self, vllm_config: Any):
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        #: the model's token ids are 0 .. vocab_size - 1 (None: unknown, nothing cut)
        vocab = getattr(vllm_config.model_config, "get_vocab_size", None)
        self.vocab_size: int | None = int(vocab()) if callable(vocab) else None
        #: drafted tokens by running batch size (index = rows), from vLLM's batch-size schedule, or None: k always
        self._k_by_batch: list[int] | None = None
        schedule = getattr(spec, "num_speculative_tokens_per_batch_size", None)
        if schedule:
            from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

            self._k_by_batch = build_dynamic_sd_schedule_lookup(
                schedule, int(vllm_config.scheduler_config.max_num_seqs), self.k)
        self._runner: Any = None
        #: request id -> (its extra_args entry, the decoded corpus): decoded once per request
        self._corpora: dict[str, tuple[Any, list[np.ndarray]]] = {}

    def k_for(self, rows: int) -> int:
        """Tokens to draft per row in a batch of ``rows`` (vLLM's scheduler picks the same for ``ngram``)."""
        if self._k_by_batch is None:
            return self.k
        return self._k_by_batch[min(rows, len(self._k_by_batch) - 1)]

    def attach(self, runner: Any) -> None:
        """Called by pdsr's worker extension: the model runner whose batch rows :meth:`propose` drafts for."""
        self._runner = runner

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        pass   # no draft model

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        runner = self._runner
        k_batch = self.k_for(len(sampled_token_ids))
        if runner is None:
            return drafts
        req_ids = runner.input_batch.req_ids
        requests = runner.requests
        live = set()
        for i, sampled in enumerate(sampled_token_ids):
            if not len(sampled) or i >= len(req_ids):
                continue   # as vLLM's ngram: no token sampled this step (a prefill chunk), no draft
            rid = req_ids[i]
            live.add(rid)
            state = requests.get(rid)
            params = getattr(state, "sampling_params", None)
            extra = (getattr(params, "extra_args", None) or {}).get(EXTRA_KEY)
            if not extra:
                continue
            num_tokens = int(num_tokens_no_spec[i])
            k = min(k_batch, self.max_model_len - num_tokens)   # 0 above the schedule's batch size
            if k <= 0:
                continue
            draft = self._draft(token_ids_cpu[i, :num_tokens], self._corpus(rid, extra), extra, k)
            drafts[i] = in_vocabulary(draft, self.vocab_size)
        for rid in [r for r in self._corpora if r not in live and r not in requests]:
            del self._corpora[rid]   # finished or aborted requests
        return drafts

    @staticmethod
    def _draft(context: np.ndarray, corpus: list[np.ndarray], extra: dict[str, Any], k: int) -> list[int]:
        """The request's rule (``extra["rule"]``, :data:`RULES`: :func:`group_extra_args` names
        :data:`DEFAULT_RULE`; a corpus that names none, from before rules existed, gets ``longest``):

        - ``vote``: every place the row's longest n-gram occurs, in the corpus and in the row's own prompt and
          output, votes; the draft grows while at least :data:`VOTE_SHARE` of the places still agreeing with it
          continue with the same token (:func:`~pdsr_sdk.engines.group_match.vote_draft`). A lone place drafts
          its continuation, as ``ngram`` does. A place in the corpus counts only where the whole window
          (``max_n`` tokens) matches: other responses part from the row within a few tokens, and their shorter
          matches were accepted a fifth as often as the row's own (docs/notes/speculation.md).
        - ``longest`` (the first rule): the siblings' match where its n-gram is longer than the row's own match
          (vLLM's ngram lookup in its prompt and output: the earliest of the longest matches), else the row's own.

        ``vote`` accepted more per verify step than ``longest`` and ``ngram`` at about the same share of tokens
        drafted, on SmolLM2-135M at temperature 1 (docs/notes/speculation.md)."""
        min_n, max_n = int(extra["min_n"]), int(extra["max_n"])
        if extra.get("rule", "longest") == "vote":
            draft, _ = vote_draft(context, corpus, min_n, max_n, k, float(extra.get("share", VOTE_SHARE)),
                                  int(extra.get("corpus_min_n", max_n)))
            return [int(t) for t in draft]
        theirs = best_match(context, corpus, min_n, max_n, position=len(context) - int(extra["start"]))
        own = best_match(context, [context], min_n, max_n)
        if theirs is not None and (own is None or theirs[0] > own[0]):
            _, s, start = theirs
            return [int(t) for t in corpus[s][start:start + k]]
        if own is not None:
            return [int(t) for t in context[own[2]:own[2] + k]]
        return []

    def _corpus(self, rid: str, extra: dict[str, Any]) -> list[np.ndarray]:
        cached = self._corpora.get(rid)
        if cached is not None and cached[0] is extra:
            return cached[1]
        corpus = [np.frombuffer(b, dtype=_DTYPE).astype(np.int64) for b in extra["drafts"]]
        self._corpora[rid] = (extra, corpus)
        return corpus

