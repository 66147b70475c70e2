"""docs/simulate.md's profile of a 7B model on an H200, written for a user with no GPU at hand: it reads as a
profile, its memory-bound numbers follow from the H200's memory as its comments say (recomputed here from the
model's shape), and the numbers it takes from bench/data/profile-h100-7b.yaml are that file's."""

from __future__ import annotations

import re

import pytest

from pdsr_sdk.sim.config import SimulateConfig, load_profile_file
from support import ROOT

KV_BYTES = 2 * 32 * 4096 * 2   # K and V, 32 layers, hidden 4096 (no GQA), bf16: Llama-2-7B's shape, 512 KiB


def doc_profile(tmp_path):
    page = (ROOT / "docs" / "simulate.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", page, flags=re.S) if b.startswith("# h200-7b.yaml"))
    path = tmp_path / "h200-7b.yaml"
    path.write_text(block)
    return load_profile_file(path)


def test_the_h200_profile_of_the_docs_follows_from_its_memory_and_the_h100_files_numbers(tmp_path):
    h200 = doc_profile(tmp_path)
    h100 = load_profile_file(ROOT / "bench" / "data" / "profile-h100-7b.yaml")
    assert h200["fast"] == h200["heavy"] and KV_BYTES == 512 * 1024
    assert h200["fast"]["kv_cache_tokens"] == pytest.approx((0.9 * 141e9 - 13.5e9 - 2e9) / KV_BYTES, abs=16)
    assert h200["fast"]["c2_s_per_token"] == pytest.approx(KV_BYTES / 4.8e12, rel=0.01)
    assert h100["fast"]["c2_s_per_token"] == pytest.approx(KV_BYTES / 3.35e12, rel=0.03)   # the same rule
    for key in ("max_num_seqs", "c0_s", "c1_s_per_seq", "prefill_s_per_token"):
        assert h200["fast"][key] == h100["fast"][key], key
    cfg = SimulateConfig(profiles=h200)
    assert cfg.profiles.heavy.kv_cache_tokens == h200["fast"]["kv_cache_tokens"]
    assert cfg.profiles.fast.max_model_len == 32_768   # the "32k context" the page answers
