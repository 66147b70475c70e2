"""PromptLog, the request observer that records the prompt ids vLLM received (no engine needed: vLLM's outputs are
stood in for by objects with the one attribute it reads)."""

from __future__ import annotations

from types import SimpleNamespace

from pdsr_sdk.engines.request_observer import PromptLog


def test_prompt_log_records_each_request_once_from_its_first_output_with_prompt_ids():
    log = PromptLog()
    extra = {"k": 1}
    assert log.on_launch(None, extra) is extra and log.on_launch(None, None) is None   # args pass through untouched
    log.on_output("a#0", SimpleNamespace(prompt_token_ids=None))   # not known yet: nothing recorded
    log.on_output("a#0", SimpleNamespace(prompt_token_ids=(1, 2, 3)))
    log.on_output("b#1", SimpleNamespace(prompt_token_ids=[7]))
    log.on_output("a#0", SimpleNamespace(prompt_token_ids=(9, 9)))   # a later output of the same request
    assert log.entries == [("a#0", [1, 2, 3]), ("b#1", [7])]
