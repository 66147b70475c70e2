"""bench/multi_turn.py: a bad flag is refused by name before any seed runs, and a small run prints its table."""

from __future__ import annotations

import pytest

from support import load_bench


@pytest.mark.parametrize("argv, message", [
    (["--policies", "v3,nope"], "--policies: 'nope': invalid config"),
    (["--policies", "v3-no-bogus"], "--policies: 'v3-no-bogus': invalid config"),
    (["--engines", "0"], "argument --engines: '0' is not a whole number >= 1"),
    (["--groups", "x"], "argument --groups: 'x' is not a whole number >= 1"),
])
def test_a_bad_flag_is_refused_by_name(argv, message, monkeypatch, capsys):
    """An unknown policy or v3 rule ended in a ConfigValueError traceback after the table's header, and --engines 0 or
    --groups 0 in one from the simulator's config; argparse now refuses them, naming the flag."""
    mt = load_bench("multi_turn")
    monkeypatch.setattr("sys.argv", ["multi_turn.py", *argv])
    with pytest.raises(SystemExit) as exc:
        mt.main()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_small_run_prints_every_policy_and_no_held_slots(monkeypatch, capsys):
    mt = load_bench("multi_turn")
    monkeypatch.setattr("sys.argv", ["multi_turn.py", "--seeds", "101", "--groups", "8", "--engines", "2",
                                     "--batch-size", "4", "--max-num-seqs", "16", "--policies", "v3,v3-no-migration"])
    mt.main()
    out = capsys.readouterr().out
    assert "v3-no-migration/baseline over 1 seeds" in out and "slot-time held by samples waiting" in out
    assert "pdsr 0.000" in out   # pdsr parks a sample waiting on its environment: it holds no slot
