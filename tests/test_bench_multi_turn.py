"""bench/multi_turn.py: a small run prints its table (its bad flags: tests/test_bench_real_args.py)."""

from __future__ import annotations


from support import load_bench


def test_a_small_run_prints_every_policy_and_no_held_slots(monkeypatch, capsys):
    mt = load_bench("multi_turn")
    monkeypatch.setattr("sys.argv", ["multi_turn.py", "--seeds", "101", "--groups", "8", "--engines", "2",
                                     "--batch-size", "4", "--max-num-seqs", "16", "--policies", "v3,v3-no-migration"])
    mt.main()
    out = capsys.readouterr().out
    assert "v3-no-migration/baseline over 1 seeds" in out and "slot-time held by samples waiting" in out
    assert "pdsr 0.000" in out   # pdsr parks a sample waiting on its environment: it holds no slot
