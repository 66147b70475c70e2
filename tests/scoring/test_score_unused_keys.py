"""``pdsr score --resume`` compares only the settings the run's scoring reads (``unused_keys``): each key it
leaves out changes no log-prob, bit for bit, in the mode it is left out of, on the tiny model; a key it keeps
does change them there, so the check of both is not vacuous."""

from __future__ import annotations

import numpy as np
import pytest

from pdsr_sdk.scoring import per_token_logps
from pdsr_sdk.scoring.config import ScoreConfig
from pdsr_sdk.scoring.resume import RESUMED_KEYS, unused_keys

#: a value other than the default for each key a mode may leave out
OTHER = dict(token_grouping="none", max_padding_fraction=0.5, length_bucket=7, attention_mask=False, pad_id=977,
             packed_attention="model")
MODES = {"quota": dict(max_tokens_per_micro_batch=512, pack=False), "mbs": dict(mbs=5, pack=False),
         "packed": dict(max_tokens_per_micro_batch=512, pack=True)}


def _bits(result):
    return [np.asarray(row, dtype=np.float32).view(np.int32) for row in result.logps]


@pytest.mark.parametrize("mode", MODES)
def test_an_unused_key_changes_no_log_prob(model, samples, mode):
    config = ScoreConfig(data="in.parquet", out="out.parquet", backend="torch", **MODES[mode])
    unused = unused_keys(config, "cpu")
    assert unused and unused <= set(RESUMED_KEYS) and unused <= set(OTHER)
    base = _bits(per_token_logps(model, *samples, **MODES[mode]))
    for key in unused:
        other = _bits(per_token_logps(model, *samples, **{**MODES[mode], key: OTHER[key]}))
        assert all(np.array_equal(a, b) for a, b in zip(base, other)), key


def test_a_read_key_changes_log_probs_where_unread_it_did_not(model, samples):
    """Packed, length_bucket is unused and changes nothing (above); unpacked it pads, and padding moves the last
    bits of an fp32 forward: the test above would catch a mode that read a key it called unused."""
    config = ScoreConfig(data="in.parquet", out="out.parquet", mbs=5, pack=False)
    assert "length_bucket" not in unused_keys(config, "cpu") and "packed_attention" in unused_keys(config, "cpu")
    base = _bits(per_token_logps(model, *samples, mbs=5, pack=False, attention_mask=True))
    other = _bits(per_token_logps(model, *samples, mbs=5, pack=False, attention_mask=True, length_bucket=7))
    assert not all(np.array_equal(a, b) for a, b in zip(base, other))


def test_vllm_and_a_backend_by_import_path():
    vllm = unused_keys(ScoreConfig(data="in.parquet", out="o.parquet", backend="vllm"), "auto")
    assert {"device", "pack", "length_bucket", "row_chunk"} <= vllm and not {"mbs", "dtype", "temperature"} & vllm
    assert unused_keys(ScoreConfig(data="in.parquet", out="o.parquet", backend="torch", pack=None), "cpu") == \
        {"packed_attention"}   # the measured rule: unpacked on the CPU
    assert unused_keys(ScoreConfig(data="in.parquet", out="o.parquet", backend="mypkg.scoring:Mine"), "cpu") == set()
