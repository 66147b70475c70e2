"""pdsr_sdk.scoring's plug-in surface: the backend registry, the options object, a backend from outside.

No model is loaded here except in the keyword/options equivalence test; the
outside backend is a numpy bigram table, so its exact log-probs are known.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pdsr_sdk.config import load_config
from pdsr_sdk.errors import ConfigError, DataError, PdsrError, RunError
from pdsr_sdk.scoring import (
    SCORING_BACKENDS,
    BackendOutput,
    ScoreConfig,
    ScoreOptions,
    ScoringBackend,
    get_backend,
    per_token_logps,
)
from support import ROOT



# -------------------------------------------------------------- registry

def test_registry_rejects_a_taken_name():
    with pytest.raises(PdsrError, match="scoring backend 'torch' is already registered"):
        SCORING_BACKENDS.register("torch", "pdsr_sdk.scoring.vllm_backend:VllmScoring")
    assert SCORING_BACKENDS.names() == ["torch", "vllm"]


def test_unknown_backend_lists_the_valid_names():
    with pytest.raises(PdsrError, match=r"unknown scoring backend 'jax'; valid names: torch, vllm"):
        SCORING_BACKENDS.get("jax")
    with pytest.raises(ConfigError, match=r"backend: unknown scoring backend 'jax'; valid names: torch, vllm"):
        per_token_logps("unused", [[1]], [[2]], backend="jax")
    with pytest.raises(ConfigError, match=r"backend: .*valid names: torch, vllm"):
        load_config(ScoreConfig, None, {"data": "a.parquet", "out": "b.parquet", "backend": "jax"})


def test_import_path_that_is_not_a_backend_is_named():
    with pytest.raises(ConfigError, match=r"'json:JSONDecoder' is not a ScoringBackend \(missing method\(s\): "
                                          r"check, load, vocab_size, score\)"):
        per_token_logps("unused", [[1]], [[2]], backend="json:JSONDecoder")


def test_builtin_backends_follow_the_protocol_and_stay_lazy():
    code = ("import sys, json\nfrom pdsr_sdk.scoring import SCORING_BACKENDS, ScoreOptions, get_backend\n"
            "ScoreOptions(backend='vllm', mbs=4); get_backend('vllm')\n"
            "print(json.dumps([m for m in ('torch', 'vllm', 'transformers', 'numba') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    for name in SCORING_BACKENDS.names():
        assert isinstance(get_backend(name), ScoringBackend)


# --------------------------------------------------------------- options

@pytest.mark.parametrize("options,key", [
    ({"row_chunk": 0}, "row_chunk"),
    ({"mbs": True}, "mbs"),
    ({"temperature": -1}, "temperature"),
    ({"device": "gpu"}, "device"),
    ({"token_grouping": "random"}, "token_grouping"),
    ({"max_padding_fraction": 1.0}, "max_padding_fraction"),
])
def test_option_errors_name_the_key(options, key):
    with pytest.raises(ConfigError, match=rf"ScoreOptions: {key}: "):
        per_token_logps("unused", [[1]], [[2]], options)
    with pytest.raises(ConfigError, match=rf"ScoreOptions: {key}: "):
        per_token_logps("unused", [[1]], [[2]], **options)  # the same as keywords
    with pytest.raises(ConfigError, match=rf"ScoreOptions: {key}: "):
        ScoreOptions(**options)  # built directly: the same message


def test_unknown_option_lists_the_valid_keys():
    with pytest.raises(ConfigError, match=r"mbz: unknown config key; valid keys here: attention_mask, backend, .*mbs"):
        per_token_logps("unused", [[1]], [[2]], mbz=4)
    with pytest.raises(ConfigError, match="return_entropy and entropy are the same option"):
        ScoreOptions.resolve(None, {"return_entropy": True, "entropy": True})
    with pytest.raises(ConfigError, match="options: expected a ScoreOptions"):
        ScoreOptions.resolve(42)


def test_options_resolve_and_config_options():
    base = ScoreOptions(mbs=8, temperature=0.7)
    assert ScoreOptions.resolve(base) is base
    merged = ScoreOptions.resolve(base, {"return_entropy": True, "mbs": 4})
    assert (merged.mbs, merged.temperature, merged.entropy) == (4, 0.7, True) and base.mbs == 8
    assert ScoreOptions.resolve({"device": "cuda:1"}).device == "cuda:1"
    config = ScoreConfig(data="in.parquet", out="out.parquet", max_tokens_per_micro_batch=512, entropy=True)
    options = config.options()
    assert type(options) is ScoreOptions
    assert options.model_dump() == config.model_dump(include=set(ScoreOptions.model_fields))
    assert ScoreOptions.resolve(config) == options  # a ScoreConfig passed as options: just its options
    assert set(ScoreConfig.model_fields) - set(ScoreOptions.model_fields) == {
        "data", "out", "overwrite", "resume", "block_tokens", "model", "prompt_column", "response_column", "column"}


# -------------------------------------------------------- outside backend

class BigramModel:
    """log p(next | previous) from a [V, V] table: exact answers for the test."""

    def __init__(self, vocab: int, seed: int = 0):
        logits = np.random.default_rng(seed).normal(size=(vocab, vocab))
        self.logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))


class BigramScoring:
    """A backend written outside pdsr: blocks of consecutive samples, reported in reverse order."""

    calls: list[str] = []

    def check(self, options):
        self.calls.append("check")
        if options.temperature != 1.0:
            raise ConfigError("temperature: the bigram backend has none")

    def load(self, model_dir, options):
        self.calls.append("load")
        return BigramModel(int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]))

    def vocab_size(self, model):
        self.calls.append("vocab_size")
        return model.logp.shape[0]

    def score(self, model, inputs, options, meter):
        self.calls.append("score")
        n = len(inputs.seqs)
        size = options.mbs or max(n, 1)
        blocks = [list(range(i, min(i + size, n))) for i in range(0, n, size)][::-1]
        logps, entropy = [], []
        meter.start(len(blocks))
        try:
            for block in blocks:
                rows_l, rows_e = [], []
                for i in block:
                    seq, p = inputs.seqs[i], int(inputs.prompt_lens[i])
                    prev, nxt = seq[p - 1:-1], seq[p:]
                    rows_l.append(model.logp[prev, nxt].astype(np.float32))
                    dist = model.logp[prev]
                    rows_e.append((-(np.exp(dist) * dist).sum(-1)).astype(np.float32))
                logps.append(rows_l)
                entropy.append(rows_e)
                meter.advance(block)
        finally:
            meter.stop()
        return BackendOutput(partitions=blocks, logps=logps, entropy=entropy if options.entropy else None,
                             mode=f"bigram blocks of {size}", head="bigram table",
                             computed_tokens=int(inputs.lengths.sum()))


@pytest.fixture
def bigram_backend():
    name = "zz-bigram"
    SCORING_BACKENDS.register(name, BigramScoring)
    BigramScoring.calls = []
    try:
        yield name
    finally:
        del SCORING_BACKENDS._entries[name]


def _bigram_samples(vocab=50, n=9, seed=3):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, vocab, int(rng.integers(1, 6))).tolist() for _ in range(n)]
    completions = [rng.integers(0, vocab, int(rng.integers(1, 12))).tolist() for _ in range(n)]
    return prompts, completions


def _bigram_expected(model, prompts, completions):
    out = []
    for p, c in zip(prompts, completions):
        seq = np.array(p + c)
        out.append(model.logp[seq[len(p) - 1:-1], seq[len(p):]].astype(np.float32))
    return out


def test_outside_backend_through_per_token_logps(bigram_backend):
    model = BigramModel(50)
    prompts, completions = _bigram_samples()
    assert isinstance(BigramScoring(), ScoringBackend)
    res = per_token_logps(model, prompts, completions, ScoreOptions(backend=bigram_backend, mbs=4), return_entropy=True)
    assert BigramScoring.calls == ["check", "vocab_size", "score"]
    for got, want in zip(res.logps, _bigram_expected(model, prompts, completions), strict=True):
        np.testing.assert_array_equal(got, want)  # input order restored from the reversed blocks
    assert [len(e) for e in res.entropy] == [len(c) for c in completions]
    st = res.stats
    assert (st.backend, st.mode, st.micro_batches, st.head) == (bigram_backend, "bigram blocks of 4", 3, "bigram table")
    assert st.scored_tokens == sum(map(len, completions)) and st.padding_efficiency == 1.0
    # the shared checks run before the backend scores: a token outside its vocabulary names the row
    with pytest.raises(DataError, match=r"row 1: token id 50 in completion_ids .*vocab size 50"):
        per_token_logps(model, [[1], [2]], [[3], [4, 50]], backend=bigram_backend)
    # and its own option check runs first
    with pytest.raises(ConfigError, match="the bigram backend has none"):
        per_token_logps(model, prompts, completions, backend=bigram_backend, temperature=0.5)


def test_outside_backend_by_import_path_and_model_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 50}))
    prompts, completions = _bigram_samples()
    BigramScoring.calls = []
    res = per_token_logps(tmp_path, prompts, completions, backend=f"{__name__}:BigramScoring")
    assert BigramScoring.calls == ["check", "load", "vocab_size", "score"]
    assert res.stats.mode == f"bigram blocks of {len(prompts)}" and res.entropy is None
    for got, want in zip(res.logps, _bigram_expected(BigramModel(50), prompts, completions), strict=True):
        np.testing.assert_array_equal(got, want)
    # rows are checked against config.json before load() runs
    BigramScoring.calls = []
    with pytest.raises(DataError, match="row 0: token id 77"):
        per_token_logps(tmp_path, [[77]], [[1]], backend=f"{__name__}:BigramScoring")
    assert BigramScoring.calls == ["check"]


class MisalignedScoring(BigramScoring):
    """A backend of one's own that gets its output wrong in the way ``mistake`` says."""

    mistake = ""

    def score(self, model, inputs, options, meter):
        out = super().score(model, inputs, options, meter)
        if self.mistake == "short":       # one log-prob too few for every sample
            out.logps = [[row[:-1] for row in block] for block in out.logps]
        elif self.mistake == "dropped":   # the last sample left out
            keep = [[j for j, i in enumerate(part) if i != len(inputs.seqs) - 1] for part in out.partitions]
            out.logps = [[block[j] for j in k] for block, k in zip(out.logps, keep)]
            out.partitions = [[part[j] for j in k] for part, k in zip(out.partitions, keep)]
        elif self.mistake == "no entropy":
            out.entropy = None
        return out


@pytest.mark.parametrize("mistake, says", [
    ("short", "returned 0 logps values for sample 0 (row 0), which has 1 completion tokens"),
    ("dropped", "returned partitions that do not hold each of the 3 samples exactly once (missing: [2], more than "
                "once: [])"),
    ("no entropy", "returned entropy for 0 partitions, not 1"),
])
def test_an_outside_backends_misaligned_output_is_an_error_naming_it(monkeypatch, mistake, says):
    """A backend returning one log-prob too few per sample was written as it was (the columns misaligned with the
    tokens, silently); one that left a sample out failed inside restore_order or Arrow."""
    monkeypatch.setattr(MisalignedScoring, "mistake", mistake)
    path = f"{__name__}:MisalignedScoring"
    with pytest.raises(RunError, match=re.escape(f"scoring backend {path!r} {says}; see "
                                                 f"pdsr_sdk.scoring.backend.BackendOutput")):
        per_token_logps(BigramModel(50), [[1], [2], [3]], [[4], [5, 6], [7, 8, 9]], backend=path,
                        return_entropy=True)


# ------------------------------------------------------- torch: same numbers

def test_options_object_equals_keywords(tiny_model_dir):
    pytest.importorskip("torch")
    from pdsr_sdk.scoring.torch_backend import load_model

    model = load_model(tiny_model_dir, "cpu", "float32")
    prompts, completions = _bigram_samples(vocab=1024, n=10)
    by_keywords = per_token_logps(model, prompts, completions, mbs=3, return_entropy=True, row_chunk=7)
    by_options = per_token_logps(model, prompts, completions, ScoreOptions(mbs=3, entropy=True, row_chunk=7))
    by_mapping = per_token_logps(model, prompts, completions, {"mbs": 3, "entropy": True}, row_chunk=7)
    for res in (by_options, by_mapping):
        assert res.stats.mode == by_keywords.stats.mode == "mbs=3"
        for a, b in zip(res.logps + res.entropy, by_keywords.logps + by_keywords.entropy, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("config, expected", [
    ({"torch_dtype": "float32"}, "float32"),
    ({"dtype": "bfloat16"}, "bfloat16"),          # newer transformers write "dtype"
    ({"torch_dtype": "float16", "dtype": "bfloat16"}, "float16"),
    ({"torch_dtype": "float"}, "float32"),
    ({"torch_dtype": "int8"}, "auto"),           # none we score in: the backend's own choice
    ({}, "auto"),
])
def test_checkpoint_dtype_is_what_config_json_names(tmp_path, config, expected):
    from pdsr_sdk.scoring.checkpoint import checkpoint_dtype

    (tmp_path / "config.json").write_text(json.dumps(config))
    assert checkpoint_dtype(tmp_path) == expected
    (tmp_path / "config.json").write_text("{not json")
    assert checkpoint_dtype(tmp_path) == "auto"
