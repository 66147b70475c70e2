"""bench/policies.py --settings: v3's settings reach every cell, and a bad one is an error naming the key."""

from __future__ import annotations

import argparse

import pytest

from support import load_bench


def load():
    return load_bench("policies")


def test_settings_reach_v3_and_leave_baseline_alone():
    bench = load()
    cell = dict(fam="informative", n_eng=8, b=64, batches=1, seed=101, policies=["baseline", "v3"])
    preset, _, _ = bench.run_cell(**cell)
    early, _, _ = bench.run_cell(**cell, settings={"migration": {"quantile": 0.5}})
    off, _, _ = bench.run_cell(**cell, settings={"disable": ["migration"]})
    assert preset["baseline"] == early["baseline"] == off["baseline"] == 1.0
    assert len({preset["v3"], early["v3"], off["v3"]}) == 3   # each setting changes v3's schedule


@pytest.mark.parametrize("text, message", [('{"migration": {"quantil": 0.9}}', "migration.quantil: unknown"),
                                           ("[1]", "not a JSON mapping"), ("{", "Expecting")])
def test_a_bad_setting_is_an_error_naming_it(text, message, capsys):
    bench = load()
    with pytest.raises(SystemExit):
        bench.check_settings(text, argparse.ArgumentParser(prog="policies.py"))
    assert message in capsys.readouterr().err
    assert bench.check_settings(None, argparse.ArgumentParser()) is None
