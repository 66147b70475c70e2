"""``check_resume_settings``, the comparison ``pdsr rollout --resume`` and ``pdsr score --resume`` share: each
setting that differs is named with its flag and both values, values compared as JSON gives them back."""

from __future__ import annotations

import json

import pytest

from pdsr_sdk.errors import ConfigError
from pdsr_sdk.io.resume_check import check_resume_settings

FLAGS = {"sampling.n": "--n", "sampling.stop": "--stop", "sampling.temperature": "--temperature",
         "data.chat_template_kwargs": "data.chat_template_kwargs", "policy_settings": "--set", "new.key": "--new"}


@pytest.mark.parametrize("then, now, complete, says", [
    # equal, however spelt: a tuple and the list JSON reads back, 1 and 1.0, dicts in another key order
    ({"sampling.stop": ["a", "b"], "sampling.temperature": 1, "policy_settings": {"a": {"x": [1, 2]}, "b": 2}},
     {"sampling.stop": ("a", "b"), "sampling.temperature": 1.0, "policy_settings": {"b": 2, "a": {"x": (1, 2)}}},
     False, []),
    # a float, a list and a nested dict that differ, listed in the order of the flags
    ({"sampling.stop": ["a"], "sampling.temperature": 0.7, "data.chat_template_kwargs": {"t": {"on": True}}},
     {"data.chat_template_kwargs": {"t": {"on": False}}, "sampling.temperature": 0.70001, "sampling.stop": ["a", "b"]},
     False, ["sampling.stop (--stop) is ['a', 'b'] now but was ['a']",
             "sampling.temperature (--temperature) is 0.70001 now but was 0.7",
             "data.chat_template_kwargs (data.chat_template_kwargs) is {'t': {'on': False}} now but was "
             "{'t': {'on': True}}"]),
    # a key the saved run lacks: not compared (written before it was recorded) ...
    ({"sampling.n": 2}, {"sampling.n": 2, "new.key": 5}, False, []),
    # ... unless the run recorded every setting it had
    ({"sampling.n": 2}, {"sampling.n": 2, "new.key": 5}, True, ["new.key (--new) is 5 now but was not recorded"]),
    # a key this run lacks is not compared, whatever the saved run says; nor is one no flag names
    ({"sampling.n": 2, "new.key": 5, "other": 1}, {"sampling.n": 4, "other": 2}, True,
     ["sampling.n (--n) is 4 now but was 2"]),
    # None against a value, and a value of another type
    ({"sampling.n": None, "sampling.temperature": "1.0"}, {"sampling.n": 0, "sampling.temperature": 1.0}, False,
     ["sampling.n (--n) is 0 now but was None", "sampling.temperature (--temperature) is 1.0 now but was '1.0'"]),
])
def test_each_setting_that_differs_is_named_with_its_flag_and_both_values(tmp_path, then, now, complete, says):
    where = tmp_path / "o.parquet"
    then = json.loads(json.dumps(then))   # as a run's metadata gives it back
    if not says:
        check_resume_settings(where, then, now, FLAGS, complete=complete)
        return
    with pytest.raises(ConfigError) as caught:
        check_resume_settings(where, then, now, FLAGS, complete=complete)
    assert str(caught.value) == (f"{where}: --resume continues a run made with other settings: {'; '.join(says)}. "
                                 f"Resume with the run's settings (the values it was made with), or start over with "
                                 f"--overwrite (which replaces it)")


def test_same_says_which_differing_values_are_one_setting(tmp_path):
    then, now = {"policy_settings": {"migrate": False}, "sampling.n": 2}, {"policy_settings": {"disable": ["m"]},
                                                                           "sampling.n": 3}
    asked = []

    def same(key):
        asked.append(key)
        return key == "policy_settings"

    with pytest.raises(ConfigError) as caught:
        check_resume_settings(tmp_path, then, now, FLAGS, same=same)
    assert "policy_settings" not in str(caught.value) and "sampling.n (--n) is 3 now but was 2" in str(caught.value)
    assert asked == ["sampling.n", "policy_settings"]   # asked only of values that differ, in the flags' order
