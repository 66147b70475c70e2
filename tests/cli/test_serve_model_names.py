"""``pdsr serve --model-name`` (``--served-model-name``, vLLM's flag), repeated for several names, and its default:
the names a request's ``model`` may be (another is a 404: tests/rollout/test_serve_vllm_compat.py)."""

from __future__ import annotations

import pytest

from cli_checks import failed, invoke
from pdsr_sdk.rollout.serve_error import ServeError
from pdsr_sdk.rollout.serve_model import check_model, served_names


@pytest.fixture
def serve_names(monkeypatch):
    """The ``model_name`` each ``pdsr serve`` hands its session, with no engine started and no socket opened."""
    from pdsr_sdk.rollout.session import RolloutSession

    names = []
    monkeypatch.setattr(RolloutSession, "__enter__", lambda self: self)
    monkeypatch.setattr(RolloutSession, "__exit__", lambda self, *exc: None)
    monkeypatch.setattr(RolloutSession, "serve", lambda self, host, port, **kw: names.append(kw["model_name"]))
    return names


def test_both_flags_repeat_into_the_names_in_order(serve_names):
    for args, expect in ((["--served-model-name", "a", "--model-name", "b"], ["a", "b"]),
                         (["--model-name", "a"], ["a"]), ([], None)):
        r = invoke("serve", "--port", 0, "--quiet", *args)
        assert r.exit_code == 0, r.output
        assert serve_names[-1] == expect


def test_an_empty_name_fails_before_engines_start(no_engines):
    failed(invoke("serve", "--port", 0, "--served-model-name", " "), "--model-name: ' ' is not a model name")


def test_the_default_answers_to_the_folder_name_and_to_the_folder_as_given():
    """vLLM's default name is the --model argument as given, which a client of ``vllm serve DIR`` sends; pdsr lists
    the folder's name, and takes both."""
    listed, also = served_names(None, "models/Qwen2.5-0.5B")
    assert (listed, also) == (["Qwen2.5-0.5B"], ["models/Qwen2.5-0.5B"])
    for model in ("Qwen2.5-0.5B", "models/Qwen2.5-0.5B", None, ""):
        check_model({"model": model}, listed, also)
    with pytest.raises(ServeError, match=r"The model `Qwen2.5` does not exist. Valid aliases: Qwen2.5-0.5B\.$"):
        check_model({"model": "Qwen2.5"}, listed, also)
    assert served_names(["a", "b", "a"], "models/x") == (["a", "b"], [])   # given names only, each once
