"""Speculative method ``group`` without engines: the draft lookup (pdsr_sdk/engines/group_match.py) against its
loop twin, the corpus a segment request carries, and the vLLM proposer over a fake model runner."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pdsr_sdk.dispatch.types import SegmentRequest
from pdsr_sdk.errors import DataError
from fakes import LoopEngine
from pdsr_sdk.engines.group_drafter import (EXTRA_KEY, DraftHistory, GroupProposer, draft_corpus, group_extra_args,
                                            sibling_responses)
from pdsr_sdk.engines.group_match import find_draft, find_draft_naive
from pdsr_sdk.rollout.config import SamplingConfig
from pdsr_sdk.rollout.data import PromptRecord, build_groups
from support import requires_torch


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("vocab, min_n, max_n, k", [(2, 1, 3, 4), (3, 2, 4, 4), (4, 2, 2, 1), (5, 1, 6, 8)])
def test_find_draft_matches_its_loop_twin(seed, vocab, min_n, max_n, k):
    rng = np.random.default_rng(seed)
    context = rng.integers(0, vocab, rng.integers(0, 12)).tolist()
    corpus = [rng.integers(0, vocab, rng.integers(0, 30)).tolist() for _ in range(rng.integers(0, 4))]
    position = None if seed % 3 == 0 else int(rng.integers(0, 30))
    fast = find_draft(np.array(context, dtype=np.int32), [np.array(c, dtype=np.int64) for c in corpus],
                      min_n, max_n, k, position)
    assert fast.tolist() == find_draft_naive(context, corpus, min_n, max_n, k, position)


def test_find_draft_rules():
    ctx = np.array([9, 1, 2, 3])
    # the longest n-gram wins over a nearer, shorter one
    assert find_draft(ctx, [np.array([2, 3, 7, 7]), np.array([1, 2, 3, 8, 8])], 2, 4, 2, position=2).tolist() == [8, 8]
    # of equal length, the continuation nearest the row's own position, then the first sequence, then the earliest
    seq = np.array([2, 3, 5, 0, 0, 0, 2, 3, 6])
    assert find_draft(ctx, [seq], 2, 4, 1, position=8).tolist() == [6]
    assert find_draft(ctx, [seq], 2, 4, 1, position=1).tolist() == [5]
    assert find_draft(ctx, [seq], 2, 4, 1).tolist() == [5]
    assert find_draft(ctx, [np.array([2, 3, 4]), np.array([2, 3, 5])], 2, 4, 1, position=2).tolist() == [4]
    # too short a match, none at all, a match at a sequence's end (nothing follows), k cuts the draft
    assert find_draft(ctx, [np.array([3, 4])], 2, 4, 4).size == 0
    assert find_draft(ctx, [np.array([4, 4, 4])], 1, 4, 4).size == 0
    assert find_draft(ctx, [np.array([1, 2, 3])], 2, 4, 4).size == 0
    assert find_draft(ctx, [np.array([1, 2, 3, 4, 5, 6])], 2, 4, 2).tolist() == [4, 5]


def make_group(responses: list[list[int] | None]):
    g = build_groups([PromptRecord("p", "p", [7, 8, 9])], len(responses), 64)[0]
    for s, r in zip(g.samples, responses):
        if r is not None:
            s.add_tokens(len(r), r, None)
            s.finish_reason = "stop"
    return g


def test_a_request_carries_its_finished_siblings_responses():
    g = make_group([[1, 2, 3], None, [4, 5], []])
    running = g.samples[1]
    running.add_tokens(2, [6, 6], None)
    assert sibling_responses(running) == [[1, 2, 3], [4, 5]]   # not itself, not an empty response
    assert sibling_responses(g.samples[0]) == [[4, 5]]
    req = SegmentRequest(request_id="r", context_ids=running.context_ids(), context_len=5, max_tokens=4,
                         ignore_eos=False, sampling=SamplingConfig(), sample=running)
    extra = group_extra_args(req, 2, 4)[EXTRA_KEY]
    assert [np.frombuffer(b, dtype="<i4").tolist() for b in extra["drafts"]] == [[1, 2, 3], [4, 5]]
    assert (extra["min_n"], extra["max_n"], extra["start"]) == (2, 4, 3)
    lone = make_group([None])
    req.sample = lone.samples[0]
    assert group_extra_args(req, 2, 4)[EXTRA_KEY]["drafts"] == []   # nothing finished: an empty corpus


def test_the_proposer_drafts_per_row_from_that_rows_corpus():
    # the finished sibling's response holds row 0's last 4 tokens (the whole window: a corpus place needs it)
    g = make_group([[8, 9, 1, 2, 3, 4, 5, 6], None, None])
    a, b = g.samples[1], g.samples[2]
    a.add_tokens(2, [1, 2], None)

    def params(sample):
        req = SegmentRequest(request_id="r", context_ids=sample.context_ids(), context_len=len(sample.context_ids()),
                             max_tokens=4, ignore_eos=False, sampling=SamplingConfig(), sample=sample)
        return SimpleNamespace(extra_args=group_extra_args(req, 2, 4))

    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3),
                             model_config=SimpleNamespace(max_model_len=64))
    proposer = GroupProposer(config)
    tokens = np.zeros((4, 64), dtype=np.int32)
    rows = [[7, 8, 9, 1, 2], [7, 8, 9, 1, 2], [7, 8, 9, 1, 2], [7, 8, 9, 1, 2, 7, 8]]
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
    num = np.array([len(r) for r in rows], dtype=np.int32)
    sampled = [[2], [2], [], [2]]
    assert proposer.propose(sampled, num, tokens) == [[]] * 4   # not attached yet: no drafts
    runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=["a", "plain", "prefill", "a2"]),
                             requests={"a": SimpleNamespace(sampling_params=params(a)),
                                       "plain": SimpleNamespace(sampling_params=SimpleNamespace(extra_args=None)),
                                       "prefill": SimpleNamespace(sampling_params=params(b)),
                                       "a2": SimpleNamespace(sampling_params=params(b))})
    proposer.attach(runner)
    # row 3: no sibling has "... 7, 8" followed by anything, its own context has: vLLM's ngram lookup
    assert proposer.propose(sampled, num, tokens) == [[3, 4, 5], [], [], [9, 1, 2]]
    # a finished request's decoded corpus is let go
    del runner.requests["a2"]
    runner.input_batch.req_ids = ["a"]
    assert proposer.propose([[2]], num[:1], tokens[:1]) == [[3, 4, 5]]
    assert set(proposer._corpora) == {"a"}


@pytest.mark.parametrize("seed", range(30))
def test_own_context_lookup_is_vllms_ngram(seed):
    """The fallback (``find_draft(context, [context], ...)``) drafts what vLLM's ngram proposer drafts."""
    pytest.importorskip("vllm")
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as vllm_ngram

    rng = np.random.default_rng(seed)
    context = rng.integers(0, 3 + seed % 4, rng.integers(1, 40)).astype(np.int32)
    min_n, max_n, k = 1 + seed % 3, 3 + seed % 3, 1 + seed % 5
    want = vllm_ngram(context, min_n, max_n, 1024, k)
    assert find_draft(context, [context], min_n, max_n, k).tolist() == want.tolist()


def test_ray_engines_carry_the_corpus_to_the_actors_engine():
    """A Ray engine's sample stays in the orchestrator: its corpus is made there and travels with the Submit
    message; the actor's VllmEngine uses it for the request, which reaches it without a sample."""
    import pickle

    from pdsr_sdk.engines.ray_actor import Submit
    from pdsr_sdk.engines.ray_engine import RayEngine
    from pdsr_sdk.engines.vllm_engine import VllmEngine
    from pdsr_sdk.rollout.config import EngineSpec, RolloutConfig

    speculative = RolloutConfig(speculative="group").vllm_speculative_config()
    g = make_group([[1, 2, 3], None])
    s = g.samples[1]
    req = SegmentRequest(request_id="g/1#0", context_ids=s.context_ids(), context_len=3, max_tokens=4,
                         ignore_eos=False, sampling=SamplingConfig(), sample=s)
    ray_engine = RayEngine(EngineSpec(name="r", pool="fast"), model="/nonexistent", speculative=speculative)
    sent = []
    ray_engine._actor = object()
    ray_engine._send = sent.append
    ray_engine.submit(req)
    (cmd,) = sent
    cmd = pickle.loads(pickle.dumps(cmd))   # plain data across the wire
    assert isinstance(cmd, Submit) and cmd.draft_args == group_extra_args(req, 2, 4)

    local = VllmEngine(EngineSpec(name="e", pool="fast"), model="/nonexistent", speculative=speculative)
    try:
        local.carried_draft_args[cmd.request_id] = cmd.draft_args
        wire = cmd.request()
        assert wire.sample is None and local._draft_args(wire) == cmd.draft_args
        assert local.carried_draft_args == {} and local._draft_args(wire) is None
        assert local._draft_args(req) == group_extra_args(req, 2, 4)     # a local request: from its sample
        off = VllmEngine(EngineSpec(name="o", pool="fast"), model="/nonexistent")
        assert off._draft_args(req) is None                             # without group: nothing extra
        off._error_file.unlink(missing_ok=True)
    finally:
        local._error_file.unlink(missing_ok=True)
    plain = RayEngine(EngineSpec(name="p", pool="fast"), model="/nonexistent")
    plain._actor, plain._send = object(), sent.append
    plain.submit(req)
    assert sent[-1].draft_args is None


def test_the_longer_match_drafts_and_the_rows_own_wins_ties():
    extra = {"min_n": 1, "max_n": 4, "start": 0}
    ctx = np.array([4, 1, 2, 7, 7, 1, 2])
    assert GroupProposer._draft(ctx, [np.array([1, 2, 3, 3])], extra, 2) == [7, 7]        # tie at 2: own
    assert GroupProposer._draft(ctx, [np.array([7, 1, 2, 3, 3])], extra, 2) == [3, 3]     # siblings' 3 beats 2
    assert GroupProposer._draft(ctx, [], extra, 2) == [7, 7]                              # no corpus: ngram
    assert GroupProposer._draft(np.array([1, 2]), [np.array([1, 2, 5])], extra, 2) == [5]  # own has none


def test_history_keeps_the_most_recent_responses_per_prompt():
    history = DraftHistory(3)
    old = make_group([[1], [2], None])
    old.samples[2].finish_reason = "dropped"            # dropped unfinished by dynamic sampling: not kept
    old.samples[2].add_tokens(1, [9], None)
    history.record(old)
    history.record(make_group([[3], [4]]))
    new = make_group([[5], None])
    assert history.responses(new) == [[2], [3], [4]]    # the 3 most recent
    # plain lists of Python ints (they travel to vLLM's workers in a request's extra args), not the kept arrays
    assert all(type(r) is list and all(type(t) is int for t in r) for r in history.responses(new))
    old.samples[1].token_ids.append(99)                 # a recorded response changed later: the history is not
    assert history.responses(new)[0] == [2]
    assert draft_corpus(new.samples[1]) == [[5]]        # no history until the session gives it to the group
    new.draft_responses = history.responses(new)
    assert draft_corpus(new.samples[1]) == [[5], [2], [3], [4]]   # siblings first
    other = build_groups([PromptRecord("q", "q", [1, 1])], 2, 8)[0]
    assert history.responses(other) == [] and draft_corpus(other.samples[0]) == []
    DraftHistory(0).record(old)


@pytest.mark.parametrize("seed", range(5))
def test_history_token_bound_drops_the_prompts_recorded_least_recently(seed):
    # naive twin: replay every record, keep each prompt's last per_prompt responses, then drop whole prompts in
    # the order of their last record, oldest first, until the tokens fit (the latest prompt always stays)
    rng = np.random.default_rng(seed)
    per_prompt, bound = 2, 12
    history, log = DraftHistory(per_prompt, max_tokens=bound), []
    groups = [build_groups([PromptRecord(f"p{i}", f"p{i}", [i, i])], 2, 8)[0] for i in range(6)]
    for step in range(40):
        i = int(rng.integers(6))
        responses = [list(rng.integers(0, 50, size=int(rng.integers(1, 7)))) for _ in range(int(rng.integers(1, 3)))]
        group = make_group([[int(t) for t in r] for r in responses] + [None])
        group.prompt_token_ids = [i, i]
        history.record(group)
        log.append((i, [[int(t) for t in r] for r in responses]))
        kept: dict[int, list] = {}
        for p, rs in log:
            kept[p] = (kept.pop(p, []) + rs)[-per_prompt:]   # re-inserted: the dict's order is the last record's
        dropped = set()
        for p in list(kept):
            if sum(len(r) for q in kept if q not in dropped for r in kept[q]) <= bound or p == log[-1][0]:
                break
            dropped.add(p)
        for p in range(6):
            assert history.responses(groups[p]) == ([] if p not in kept or p in dropped else kept[p]), (step, p)
        assert history.tokens == sum(len(r) for q in kept if q not in dropped for r in kept[q])
        # dropped prompts are gone for good: forget them in the twin too
        log = [(p, rs) for p, rs in log if p not in dropped]


def test_history_without_a_token_bound_keeps_every_prompt():
    history = DraftHistory(1, max_tokens=None)
    groups = []
    for i in range(50):
        group = make_group([[i] * 100, None])
        group.prompt_token_ids = [i]
        history.record(group)
        groups.append(group)
    assert history.tokens == 5000
    assert [history.responses(g) for g in groups] == [[[i] * 100] for i in range(50)]
    one = DraftHistory(2, max_tokens=10)           # the latest prompt's responses stay, whatever their size
    one.record(groups[0])
    assert one.responses(groups[0]) == [[0] * 100] and one.tokens == 100


def test_history_reads_a_trajectories_file_in_row_order(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [([7, 8, 9], [10], "stop"), ([7, 8, 9], [11], "length"), ([3], [12], "failed"), ([7, 8, 9], [13], "dropped"),
            ([3], [], "stop"), ([3], [14], "truncated"), ([7, 8, 9], [15], "stop")]
    path = tmp_path / "earlier.parquet"
    pq.write_table(pa.table({"prompt_token_ids": [r[0] for r in rows], "response_token_ids": [r[1] for r in rows],
                             "finish_reason": [r[2] for r in rows], "response_text": ["x"] * len(rows)}), path)
    history = DraftHistory(2)
    assert history.read(path) == 4                      # failed, dropped and empty responses are skipped
    first, second = (build_groups([PromptRecord(p, p, ids)], 2, 8)[0] for p, ids in (("a", [7, 8, 9]), ("b", [3])))
    assert history.responses(first) == [[11], [15]] and history.responses(second) == [[14]]
    history.record(make_group([[16], None]))            # this session's groups come after the file's
    assert history.responses(first) == [[15], [16]]
    pq.write_table(pa.table({"prompt_token_ids": [[1]]}), tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"bad\.parquet: missing column\(s\) 'response_token_ids'"):
        DraftHistory(2).read(tmp_path / "bad.parquet")
    with pytest.raises(DataError, match="draft history file does not exist"):
        DraftHistory(2).read(tmp_path / "none.parquet")


def test_a_history_file_needs_group_speculation_that_keeps_history():
    from pdsr_sdk.rollout.config import RolloutConfig

    with pytest.raises(ValueError, match="speculative_settings.history_file is drafted from by speculative 'group' "
                                         "only, and speculative is 'ngram'"):
        RolloutConfig(speculative="ngram", speculative_settings={"history_file": "earlier.parquet"})
    with pytest.raises(ValueError, match="history_responses is 0"):
        RolloutConfig(speculative="group", speculative_settings={"history_file": "x.parquet", "history_responses": 0})


class DraftingEngine(LoopEngine):
    """A fake engine that keeps each request's draft corpus, as vLLM and Ray engines make it."""

    def submit(self, req) -> None:
        self.corpora = getattr(self, "corpora", {})
        self.corpora[req.request_id] = draft_corpus(req.sample)
        super().submit(req)


def drafting_config(tiny_model_dir, **speculative_settings):
    from pdsr_sdk.rollout.config import RolloutConfig

    return RolloutConfig(model=str(tiny_model_dir), policy="baseline", batch_size=1, speculative="group",
                         speculative_settings=speculative_settings, sampling={"n": 2, "max_tokens": 5},
                         segments={"enabled": False},
                         engines=[{"name": "f0", "pool": "fast", "backend": "test_group_drafter:DraftingEngine",
                                   "max_model_len": 256, "max_num_seqs": 1}])


@requires_torch
def test_a_session_drafts_later_groups_from_earlier_groups_of_the_same_prompt(tiny_model_dir, tmp_path):
    import pyarrow.parquet as pq

    from pdsr_sdk.rollout.session import RolloutSession

    prompt = [{"id": "q0", "prompt": "What is 1+1?", "answer": "2"}]
    with RolloutSession(drafting_config(tiny_model_dir)) as session:
        first = session.step(prompt).table
        second = session.step(prompt).table.to_pylist()
        engine = session.engines[0]
    earlier = [r["response_token_ids"] for r in first.to_pylist()]
    corpora = list(engine.corpora.values())
    # one sample at a time: step 1's second sample drafts from its finished sibling; step 2's from step 1's
    # responses, and its second sample from its sibling too
    assert corpora[0] == [] and corpora[1] == [earlier[0]]
    assert corpora[2] == earlier and corpora[3] == [second[0]["response_token_ids"]] + earlier

    # --draft-history: a new session starts from the first step's output file, as if that step were its own
    pq.write_table(first, tmp_path / "first.parquet")
    with RolloutSession(drafting_config(tiny_model_dir, history_file=str(tmp_path / "first.parquet"))) as session:
        session.step(prompt)
        engine = session.engines[0]
    assert list(engine.corpora.values())[0] == earlier


def test_the_session_bounds_its_history_by_history_tokens():
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.rollout.session import RolloutSession

    for bound in (1 << 30, 64, None):
        cfg = RolloutConfig(speculative="group", speculative_settings={"history_tokens": bound})
        assert RolloutSession(cfg).draft_history.max_tokens == bound
