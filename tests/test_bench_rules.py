"""bench/rules.py's table logic: the ratios, the medians over seeds and members, and the issue's criterion."""

from __future__ import annotations

import random
import statistics

from support import load_bench


def load():
    return load_bench("rules")


def test_summary_matches_a_naive_computation():
    rules = load()
    rng = random.Random(3)
    names = ("migration", "locality", "balance")
    cells: dict[str, dict[int, dict[str, float]]] = {}
    for member in ("a", "b", "c", "d"):
        for seed in range(5):
            times = {"all": rng.uniform(50, 100)}
            times.update({r: times["all"] * rng.uniform(0.95, 1.08) for r in names})
            cells.setdefault(member, {})[seed] = rules.rule_ratios(times)
            assert set(cells[member][seed]) == set(names)   # "all" is the reference, not a rule
    got = rules.summarize(cells)
    for r in names:
        med = {m: statistics.median([cells[m][s][r] for s in range(5)]) for m in cells}
        assert got[r]["members"] == med
        assert got[r]["family"] == statistics.median(med.values())
        assert got[r]["worst"] == min(med.items(), key=lambda kv: kv[1])
        assert got[r]["acts"]
    quiet = rules.summarize({"a": {1: {"x": 1.0}, 2: {"x": 1.0}, 3: {"x": 0.98}}, "b": {1: {"x": 1.0}}})
    assert quiet["x"]["members"] == {"a": 1.0, "b": 1.0} and quiet["x"]["acts"]   # medians of 1, yet it acted
    assert rules.verdict(quiet["x"]).startswith("remove")
    assert not rules.summarize({"a": {1: {"x": 1.0}}})["x"]["acts"]


def test_ratio_above_one_means_the_rule_gains():
    rules = load()
    assert rules.rule_ratios({"all": 10.0, "migration": 12.0}) == {"migration": 1.2}
    assert rules.variants(("migration", "balance")) == {"all": [], "migration": ["migration"], "balance": ["balance"]}


def test_criterion():
    rules = load()

    def row(fam, worst, members=None):
        return dict(family=fam, worst=("m", worst), members=members or {"m": worst})

    assert rules.verdict(row(1.02, 0.995)) == "keep"                       # gains, costs under 1% somewhere
    assert rules.verdict(dict(row(1.0, 1.0), acts=False)).startswith("no effect")   # never acts in this mode
    assert "no family gain" in rules.verdict(row(0.999, 0.999, {"m": 0.999, "n": 1.0}))
    assert "costs 2.0% on m" in rules.verdict(row(1.05, 0.98))
    assert rules.verdict(row(1.05, 0.98)).startswith("remove")


def test_read_log_takes_the_per_seed_lines():
    rules = load()
    lines = ["noise", "batch B=128 heavy 101: migration 1.124, lead_guard 0.966",
             "batch B=128 heavy 102: migration 1.100, lead_guard 1.000", "| table | row |",
             "stream B=128 kv-bound 101: migration 0.990, lead_guard 0.990",
             "stream B=128 kv-bound 101 preemptions: all 3, migration 4, lead_guard 0"]
    got = rules.read_log(lines)
    assert got[("batch", 128)] == {"heavy": {101: {"migration": 1.124, "lead_guard": 0.966},
                                             102: {"migration": 1.1, "lead_guard": 1.0}}}
    assert got[("stream", 128)] == {"kv-bound": {101: {"migration": 0.99, "lead_guard": 0.99}}}


def test_together_is_one_more_variant():
    rules = load()
    got = rules.variants(("balance",), ("migration", "lead_guard"))
    assert got == {"all": [], "balance": ["balance"], "together": ["migration", "lead_guard"]}
    assert rules.variants((), ("lead_guard",)) == {"all": [], "together": ["lead_guard"]}


def test_preemptions_are_summed_over_seeds_per_member_and_over_the_family():
    rules = load()
    got = rules.preemption_table({"all": {"heavy": [1, 2], "kv-bound": [10, 0]},
                                  "together": {"heavy": [0, 0], "kv-bound": [7, 5]}}, ["heavy", "kv-bound"])
    assert got.splitlines()[-2:] == ["| all | 3 | 10 | 13 |", "| together | 0 | 12 | 12 |"]
