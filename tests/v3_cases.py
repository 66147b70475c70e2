"""Shared by the v3 tests (tests/policies/test_v3.py, test_v3_lane.py, test_v3_moves.py,
test_v3_settings.py): an engine profile."""

from __future__ import annotations

#: the default engine's slots and KV cache (256 and 262,144 tokens), given for both pools
EQUAL = dict(max_num_seqs=256, kv_cache_tokens=262144)
