"""A reward's (or an agent's) extra fields that are numpy or torch numbers stay numbers in ``reward_extra``: they were
written as their text (``json.dumps(default=str)``), so the column held '0.5' and the run's ``reward_extra_means``
left them out."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pdsr_sdk.dispatch.trajectory import extra_json, score_text
from pdsr_sdk.rollout.session import RolloutSession
from support import requires_torch
from test_reward_runner import PROMPTS, config

FIELDS = {"acc": np.float32(0.5), "hits": np.int64(3), "ok": np.bool_(True), "per_step": np.array([1.5, 2.0]),
          "note": "text", "truth": None}
#: the same fields as plain Python values, written by hand
PLAIN = {"acc": 0.5, "hits": 3, "ok": True, "per_step": [1.5, 2.0], "note": "text", "truth": None}


def numpy_reward(text, ground_truth, **info):
    return {"score": np.float64(1.0), **FIELDS}


def test_numpy_fields_are_written_as_the_numbers_they_hold():
    reward, extra, error = score_text(numpy_reward, "an answer", "2", {})
    assert (reward, error) == (1.0, None)
    got = json.loads(extra)
    assert got == PLAIN
    assert type(got["acc"]) is float and type(got["hits"]) is int and type(got["ok"]) is bool


def test_other_objects_are_still_written_as_their_text():
    assert json.loads(extra_json({"obj": object, "ok": True})) == {"obj": str(object), "ok": True}
    assert extra_json({}) is None and extra_json(None) is None


@requires_torch
def test_a_torch_number_is_a_number():
    import torch

    assert json.loads(extra_json({"t": torch.tensor(0.25), "v": torch.tensor([1, 2])})) == {"t": 0.25, "v": [1, 2]}


@requires_torch
def test_a_run_keeps_numpy_fields_numeric_and_averages_them(tiny_model_dir):
    with RolloutSession(config(tiny_model_dir), reward=numpy_reward) as session:
        out = session.step(PROMPTS)
    rows = out.table.to_pylist()
    assert len(rows) == 12 and all(r["reward_extra"]["acc"] == 0.5 and r["reward_extra"]["hits"] == 3 for r in rows)
    assert str(out.table.schema.field("reward_extra").type.field("acc").type) == "double"
    assert out.summary["reward_extra_means"] == pytest.approx({"acc": 0.5, "hits": 3.0, "ok": 1.0})
