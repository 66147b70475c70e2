"""examples/grpo_train.py refuses bad flags in one line naming the flag, before any engine starts."""

from __future__ import annotations

import sys

import pytest

from support import ROOT

if str(ROOT) not in sys.path:   # `examples` is imported by path, as a user's own package would be
    sys.path.insert(0, str(ROOT))

from examples import grpo_train  # noqa: E402

#: (flags, the flag the error names, what it says of the value)
BAD_VALUES = [
    (["--steps", "0"], "--steps", "0 is below 1"),
    (["--batch-size", "0"], "--batch-size", "0 is below 1"),
    (["--n", "-2"], "--n", "-2 is below 1"),
    (["--max-tokens", "0"], "--max-tokens", "0 is below 1"),
    (["--inner-steps", "0"], "--inner-steps", "0 is below 1"),
    (["--lr", "0"], "--lr", "0.0 is not above 0"),
    (["--lr", "nan"], "--lr", "nan is not above 0"),
    (["--clip", "-0.1"], "--clip", "-0.1 is below 0"),
    (["--kl-coef", "-1"], "--kl-coef", "-1.0 is below 0"),
    (["--over-provision", "-1", "--max-staleness", "1"], "--over-provision", "-1.0 is below 0"),
    (["--over-provision", "1", "--max-staleness", "-1"], "--max-staleness", "-1 is below 0"),
    (["--over-provision", "1", "--max-staleness", "1.5"], "--max-staleness", "'1.5' is not a whole number"),
    (["--over-provision", "1", "--tis", "0"], "--tis", "0.0 is not above 0"),
    (["--over-provision", "1", "--tis", "-2"], "--tis", "-2.0 is not above 0"),
]


@pytest.fixture
def no_run(monkeypatch):
    """A flag that got through would start engines: fail instead."""
    def refuse(*args, **kwargs):
        raise AssertionError("the run started")

    monkeypatch.setattr(grpo_train, "train", refuse)
    monkeypatch.setattr(grpo_train, "compare", refuse)


@pytest.mark.parametrize("argv,flag,says", BAD_VALUES, ids=[" ".join(a) for a, _, _ in BAD_VALUES])
def test_a_bad_value_is_one_line_naming_its_flag(argv, flag, says, no_run, capsys):
    with pytest.raises(SystemExit) as exc:
        grpo_train.main(argv)
    assert exc.value.code == 2   # argparse's usage error, not a traceback from the config or torch
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert ": error: argument " in err and flag in err and says in err, err


@pytest.mark.parametrize("argv,flag", [
    (["--pipeline"], "--pipeline"),
    (["--max-staleness", "1"], "--max-staleness"),
    (["--multi-turn", "--over-provision", "1", "--max-staleness", "1"], "--max-staleness"),
    (["--multi-turn", "--max-tokens", "1"], "--max-tokens"),
])
def test_a_bad_combination_is_one_line_naming_its_flag(argv, flag, no_run):
    with pytest.raises(SystemExit) as exc:
        grpo_train.main(argv)
    assert isinstance(exc.value.code, str) and "\n" not in exc.value.code and flag in exc.value.code


def test_good_values_pass():
    a = grpo_train.parse_args(["--steps", "1", "--lr", "1e-3", "--clip", "0", "--over-provision", "0",
                               "--max-staleness", "0", "--tis", "1.5"])
    assert (a.steps, a.lr, a.clip, a.over_provision, a.max_staleness, a.tis) == (1, 1e-3, 0.0, 0.0, 0, 1.5)
    assert grpo_train.parse_args(["--tis", "off"]).tis == 0.0   # no correction, also with --over-provision
