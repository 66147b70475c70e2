"""``pdsr serve``'s check of a request's sampling fields for the options a verl or vLLM user sets (stop_token_ids,
...): a request that asks for other values than the session samples with is a 400 naming the field and the
session's value; the session's own values pass."""

from __future__ import annotations

import pytest

from pdsr_sdk.dispatch.config import SamplingConfig
from pdsr_sdk.rollout.serve_error import ServeError
from pdsr_sdk.rollout.serve_sampling import check_sampling


def _refused(body, sampling, match):
    with pytest.raises(ServeError, match=match) as caught:
        check_sampling(body, sampling, chat=True, n=1)
    assert caught.value.status == 400


def test_stop_token_ids_other_than_the_sessions_are_a_400_and_the_sessions_pass():
    plain, with_ids = SamplingConfig(), SamplingConfig(stop_token_ids=[151645])
    _refused({"stop_token_ids": [151645]}, plain, r"stop_token_ids \[151645\]: .* with stop_token_ids \[\]; "
                                                  r".*sampling\.stop_token_ids")
    _refused({"stop_token_ids": [2]}, with_ids, r"with stop_token_ids \[151645\]")
    _refused({"stop_token_ids": "151645"}, with_ids, r"stop_token_ids must be a list of token ids")
    for body, sampling in [({"stop_token_ids": [151645]}, with_ids), ({"stop_token_ids": []}, plain),
                           ({"stop_token_ids": None}, with_ids), ({}, with_ids)]:
        check_sampling(body, sampling, chat=True, n=1)


@pytest.mark.parametrize("key, value", [("min_p", 0.1), ("repetition_penalty", 1.2), ("presence_penalty", 0.5),
                                        ("frequency_penalty", -0.5)])
def test_min_p_and_penalties_other_than_the_sessions_are_a_400_and_the_sessions_pass(key, value):
    plain, with_value = SamplingConfig(), SamplingConfig(**{key: value})
    _refused({key: value}, plain, rf"{key} {value}: this session samples every request with {key} "
                                  rf"{getattr(plain, key)}; .*sampling\.{key}")
    _refused({key: "high"}, with_value, rf"{key} must be a number")
    check_sampling({key: value}, with_value, chat=True, n=1)
    check_sampling({key: None}, with_value, chat=True, n=1)
