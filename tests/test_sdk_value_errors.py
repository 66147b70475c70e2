"""The pure SDK functions a trainer calls raise, on bad values, the ValueError variants of pdsr's errors
(DataValueError / ConfigValueError: a PdsrError and a ValueError), with a message naming what is wrong;
a registry lookup miss is a ConfigValueError listing the valid names."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pdsr_sdk import (compute_gae, grpo_advantages, importance_weights, inverse_permutation, masked_whiten,
                      partition_by_tokens, partition_for_data_parallel, per_token_logps, restore_order,
                      token_versions_of_rows)
from pdsr_sdk.errors import ConfigError, ConfigValueError, DataValueError, PdsrError
from pdsr_sdk.io import pad_rows

Z = np.zeros((2, 3), np.float32)
#: what the torch backend reads a vocabulary size from, for checks that come before any forward
MODEL = SimpleNamespace(config=SimpleNamespace(vocab_size=10))

CASES = [
    ("grpo shape", lambda: grpo_advantages(np.zeros(3), np.zeros(2)), DataValueError, "group_ids has shape"),
    ("grpo None", lambda: grpo_advantages([1.0, None], [0, 0]), DataValueError, r"rewards\[1\] = None"),
    ("gae shape", lambda: compute_gae(Z, np.zeros((2, 4), np.float32), Z, 1.0, 1.0), DataValueError,
     r"values has shape \(2, 4\)"),
    ("gae gamma", lambda: compute_gae(Z, Z, Z, 2.0, 1.0), ConfigValueError, r"gamma: expected a number in \[0, 1\]"),
    ("gae backend", lambda: compute_gae(Z, Z, Z, 1.0, 1.0, backend="fast"), ConfigValueError,
     "unknown GAE backend 'fast'; valid names: .*numba"),
    ("whiten", lambda: masked_whiten(np.zeros(3), np.array([1, 0, 0])), DataValueError, "at least 2 masked-in"),
    ("partition length", lambda: partition_by_tokens([5, -1], 8), DataValueError, r"lengths\[1\] = -1"),
    ("partition cap", lambda: partition_by_tokens([5], 0), ConfigValueError, "max_tokens_per_micro_batch"),
    ("partition too long", lambda: partition_by_tokens([5, 9], 8), DataValueError, "9"),
    ("dp", lambda: partition_for_data_parallel([], 8), ConfigValueError, "lengths_per_rank is empty"),
    ("inverse", lambda: inverse_permutation([[0, 5]]), DataValueError, "index 5 is outside"),
    ("restore", lambda: restore_order([np.zeros(1)], [[0], [1]]), DataValueError, "1 outputs for 2 micro-batches"),
    ("logps rows", lambda: per_token_logps(MODEL, [[1]], [[1], [2]]), DataValueError,
     "prompt_ids has 1 rows but completion_ids has 2"),
    ("logps option", lambda: per_token_logps(None, [[1]], [[1]], mbs=0), ConfigValueError, "mbs"),
    ("logps backend", lambda: per_token_logps(None, [[1]], [[1]], backend="nope"), ConfigValueError,
     "unknown scoring backend 'nope'; valid names: "),
    ("iw ragged", lambda: importance_weights([[0.0, 0.0], [0.0]], Z[:, :2], Z[:, :2]), DataValueError,
     r"trainer_logprobs must be a \[B, T\] array .*row lengths 2, 1"),
    ("iw ragged rollout", lambda: importance_weights(Z, [np.zeros(3), np.zeros(1)], Z), DataValueError,
     r"rollout_logprobs must be a \[B, T\] array"),
    ("iw level", lambda: importance_weights(Z, Z, Z, level="word"), ConfigValueError, "level: expected one of"),
    ("versions row", lambda: token_versions_of_rows([{"segments": [], "response_length": 0},
                                                     {"prompt_id": "p7", "sample_index": 2, "segments": []}]),
     DataValueError, r"row 1 \(prompt 'p7', sample 2\) has no response_length"),
    ("versions span", lambda: token_versions_of_rows([{"segments": [{"start_token": 0}], "response_length": 1}]),
     DataValueError, r"row 0 has no segments\[\]\.num_tokens, segments\[\]\.policy_version"),
    ("pad width", lambda: pad_rows(np.arange(5), np.array([0, 2, 5]), 2), DataValueError, "row 1 has 3 values"),
    ("pad side", lambda: pad_rows(np.arange(2), np.array([0, 2]), 2, side="up"), ConfigValueError, "side must be"),
]


@pytest.mark.parametrize("call, kind, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_values_raise_value_error_variants_naming_the_problem(call, kind, match):
    with pytest.raises(kind, match=match) as exc:
        call()
    assert isinstance(exc.value, ValueError) and isinstance(exc.value, PdsrError)


@pytest.mark.parametrize("registry, kind", [("pdsr_sdk.policies:POLICIES", "policy"),
                                            ("pdsr_sdk.gae:GAE_BACKENDS", "GAE backend"),
                                            ("pdsr_sdk.scoring:SCORING_BACKENDS", "scoring backend")])
def test_a_registry_miss_lists_the_valid_names(registry, kind):
    from pdsr_sdk.registry import import_object

    reg = import_object(registry)
    with pytest.raises(ConfigValueError, match=f"unknown {kind} 'nope'; valid names: {reg.names()[0]}") as exc:
        reg.get("nope")
    assert isinstance(exc.value, ConfigError) and isinstance(exc.value, ValueError)
