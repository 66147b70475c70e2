"""``pdsr serve``'s output modes: what reaches the engines it starts (the engines themselves: tests/rollout/)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pdsr_cli.main import cli


@pytest.fixture
def served(monkeypatch):
    """The config of each session ``pdsr serve`` would serve, with no engine started and no socket opened."""
    from pdsr_sdk.rollout.session import RolloutSession

    configs = []
    monkeypatch.setattr(RolloutSession, "__enter__", lambda self: self)
    monkeypatch.setattr(RolloutSession, "__exit__", lambda self, *exc: None)
    monkeypatch.setattr(RolloutSession, "serve", lambda self, host, port, **kw: configs.append(self.config))
    return configs


@pytest.mark.parametrize("flags", [["--quiet"], []], ids=["quiet", "log-file"])
def test_serve_turns_off_the_engines_weight_loading_bar_as_rollout_does(served, flags):
    """vLLM draws that bar in the engine process, where TQDM_DISABLE does not reach it: --quiet and a stderr
    that is no terminal (CliRunner's) need ``use_tqdm_on_load: false`` in the engine args, as pdsr rollout sets."""
    r = CliRunner().invoke(cli, ["serve", "--port", "0", *flags])
    assert r.exit_code == 0, r.output
    assert [c.engine_defaults["engine_args"]["use_tqdm_on_load"] for c in served] == [False]


def test_an_unknown_tool_parser_fails_before_the_engines_start(served):
    """pdsr serve --tool-parser hermess (a typo) started the engines and listened; the name was looked up only when
    a chat answer was parsed. It is refused first now, with the installed vLLM's names; a known one still serves."""
    r = CliRunner().invoke(cli, ["serve", "--port", "0", "--tool-parser", "hermess"])
    assert r.exit_code == 2, r.output
    assert "--tool-parser 'hermess': not a tool parser of the installed vLLM; it has: " in r.output
    assert "hermes" in r.output.split("it has: ")[1].split(", ") and served == []
    r = CliRunner().invoke(cli, ["serve", "--port", "0", "--tool-parser", "hermes"])
    assert r.exit_code == 0, r.output
    assert len(served) == 1


def test_hermes_needs_no_vllm_and_another_parser_without_it_is_named(served, monkeypatch):
    """The tool-parser check imported vLLM's parsers for every name, hermes too, which pdsr parses itself: pdsr
    serve --tool-parser hermes failed with an ImportError traceback where vLLM's tool parsers cannot be imported."""
    import sys

    monkeypatch.setitem(sys.modules, "vllm.tool_parsers", None)   # an import of it raises ImportError
    r = CliRunner().invoke(cli, ["serve", "--port", "0", "--tool-parser", "hermes"])
    assert r.exit_code == 0, r.output
    assert len(served) == 1
    r = CliRunner().invoke(cli, ["serve", "--port", "0", "--tool-parser", "qwen3_xml"])
    assert r.exit_code == 2, r.output
    assert "--tool-parser 'qwen3_xml': a parser other than hermes is the installed vLLM's" in r.output
    assert len(served) == 1


def test_the_sdks_serve_refuses_an_unknown_tool_parser_before_the_engines_start(tiny_model_dir, monkeypatch):
    """RolloutSession.serve(tool_parser="hermess") started the engines and listened; the name was looked up only
    when a chat answer was parsed (the CLI's check was the CLI's alone). The SDK refuses it first now."""
    import asyncio

    from pdsr_sdk import RolloutConfig, RolloutSession
    from pdsr_sdk.errors import ConfigValueError

    class Started(Exception):
        pass

    async def start(self):
        raise Started   # the engines would start here

    monkeypatch.setattr(RolloutSession, "start", start)
    session = RolloutSession(RolloutConfig(model=str(tiny_model_dir)))
    with pytest.raises(ConfigValueError, match=r"^tool_parser 'hermess': not a tool parser of the installed vLLM"):
        asyncio.run(session.aserve("127.0.0.1", 0, tool_parser="hermess"))
    with pytest.raises(Started):   # a known one goes on to start them
        asyncio.run(session.aserve("127.0.0.1", 0, tool_parser="hermes"))
