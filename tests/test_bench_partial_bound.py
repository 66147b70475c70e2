"""bench/partial_bound.py: the work bound and the two floors sit below what a schedule reaches, and each
member gets its kind's target."""

from __future__ import annotations

import pytest

from support import load_bench


def load():
    return load_bench("partial_bound")


def test_targets_follow_the_members_kind():
    pb = load()
    assert pb.target_for("kv-bound", 128) == (0.75, 0.75) and pb.target_for("longcot", 512) is None
    assert pb.target_for("recorded-math", 128) == (0.45, 0.50) and pb.target_for("seed002", 512) == (0.62, 0.66)
    assert pb.target_for("uninformative", 128) is None and pb.target_for("multi-turn", 128) is None


@pytest.mark.parametrize("member", ["seed002", "recorded-math"])
def test_the_work_bound_is_below_the_stream_it_is_taken_from(member):
    """Lower bounds on any schedule's steady step: below the step the F = 0 stream itself takes (which makes no
    token partial), and positive; both floors at least the work bound."""
    bound, floor, f0, steps = load().bound_cell(member, 101, 16)
    assert 0 < bound <= floor < f0 and bound <= steps < f0


def test_a_trace_of_ones_own(tmp_path, monkeypatch, capsys):
    """``--trace``: the same four numbers for a user's trace, a row per B, and a clear exit when it is too short."""
    from pdsr_sdk.traces import synth_trace, write_trace_jsonl

    path = write_trace_jsonl(synth_trace(family="seed002", groups=88, seed=5), tmp_path / "mine.jsonl")
    pb = load()
    monkeypatch.setattr("sys.argv", ["partial_bound.py", "--trace", str(path), "--batch-sizes", "8", "--steps", "10"])
    pb.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 8 |")]
    assert len(rows) == 1
    bound, floor, steps, f0 = (float(x) for x in rows[0].strip("|").split("|")[1:])
    assert 0 < bound <= floor < f0 and bound <= steps < f0
    monkeypatch.setattr("sys.argv", ["partial_bound.py", "--trace", str(path), "--batch-sizes", "16"])
    with pytest.raises(SystemExit, match="need 176 groups; it has 88"):
        pb.main()


@pytest.mark.parametrize("argv, message", [
    (["--family", "seed002,nope"], "--family: unknown workload 'nope'"),
    (["--family", "heavy", "--seeds", "101,x"], "argument --seeds: '101,x' is not comma-separated whole numbers"),
])
def test_a_bad_flag_is_refused_by_name(argv, message, monkeypatch, capsys):
    """An unknown member or a seed that is no number stops at argparse, naming the flag, before any cell runs."""
    pb = load()
    monkeypatch.setattr("sys.argv", ["partial_bound.py", *argv])
    with pytest.raises(SystemExit) as exc:
        pb.main()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
