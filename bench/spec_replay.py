"""Draft rules replayed offline over recorded responses: what a drafter would have had accepted (issue 50).

Why a replay is fair: a drafter proposes one token per position, so speculative sampling accepts a drafted token
``x`` with probability ``p(x)`` and otherwise samples from ``p`` without ``x``. The emitted tokens are distributed
as without speculation, and a drafted token is accepted exactly when the emitted token equals it. Replaying a rule
over responses sampled without speculation (``bench/spec.py --trajectories``, its ``off`` run) therefore counts,
in expectation, the verify steps and accepted tokens the rule would have had on the engine, in seconds instead of
an engine run per variant. What it does not reproduce: which siblings had finished is taken from the recorded run's
times (a segment drafts from the siblings finished when it was launched, as pdsr does), and speed.

Per step (after the first token, which the prefill makes): the rule drafts up to ``k`` tokens from the context
(prompt + response so far) and its corpus (finished siblings, then ``--history``'s responses to the same prompt);
accepted = how many of them the recorded response continues with; the step moves 1 + accepted tokens on.

    .venv/bin/python bench/spec_replay.py --run DIR/math500.off.parquet --history DIR/math500.ngram.parquet
    .venv/bin/python bench/spec_replay.py --run A.parquet --history B.parquet --rules ngram,vote --k 4 8

Rules: ``ngram`` (the row's own prompt and output, as vLLM's), ``siblings`` (the corpus only), and ``group``'s two
rules as its proposer runs them (``GroupProposer._draft``): ``vote`` (the default: every place the longest n-gram
occurs in the corpus (with ``--corpus-min-n`` tokens or more) and the row's own context votes, the draft grows while
``--share`` of them agree) and ``longest`` (the first rule: the longest match, the row's own on a tie). Printed per
rule: accepted / drafted, per verify step, draft share (accepted / tokens), over the whole step and over the last
``--tail-frac`` of its tokens (by the recorded times), and for ``longest`` and ``vote`` the steps by where the draft
came from and the n-gram length matched; then, per k, ``vote`` and ``longest`` against ``ngram`` in the tail
(accepted per verify step, the ratio bench/spec.py's target of 1.3x is about). Seconds to minutes: no engine.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_args import at_least, existing_file, number_at_least, read_columns  # noqa: E402

RULES = ("ngram", "longest", "vote", "siblings")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=existing_file, required=True, action="append",
                   help="trajectories whose responses are replayed (sampled without speculation); repeatable")
    p.add_argument("--history", type=existing_file, action="append", default=[],
                   help="trajectories of the same prompts from another seed or an earlier step: the history corpus "
                        "(as many as --run, in order, or none)")
    p.add_argument("--history-responses", type=at_least(0), default=8, help="history responses kept per prompt")
    p.add_argument("--rules", default=",".join(RULES), help=f"comma-separated, from {', '.join(RULES)}")
    p.add_argument("--k", type=at_least(1), nargs="+", default=[4], help="drafted tokens per step (each value a run)")
    p.add_argument("--window", type=at_least(1), nargs=2, default=[2, 4], metavar=("MIN", "MAX"), help="n-gram window")
    p.add_argument("--corpus-at", choices=("launch", "token"), default="launch",
                   help="which siblings a step drafts from: those finished when its segment was launched (what pdsr "
                        "does) or those finished by the step itself (a corpus refreshed every step: the bound)")
    p.add_argument("--share", type=number_at_least(0), default=None,
                   help="vote: the share of places a drafted token needs (default: the proposer's, VOTE_SHARE)")
    p.add_argument("--corpus-min-n", type=at_least(1), default=None,
                   help="vote: the shortest n-gram a corpus place counts with (default: the window's longest)")
    p.add_argument("--tail-frac", type=number_at_least(0), default=0.1,
                   help="the tail: the last share of the step's tokens")
    args = p.parse_args(argv)
    args.rules = [x.strip() for x in args.rules.split(",") if x.strip()]
    bad = [r for r in args.rules if r not in RULES]
    if bad or not args.rules:
        p.error(f"--rules: unknown {', '.join(bad) or '(none)'}; valid: {', '.join(RULES)}")
    if args.window[0] > args.window[1]:
        p.error(f"--window: MIN {args.window[0]} is above MAX {args.window[1]}")
    if args.share is not None and not 0 < args.share <= 1:
        p.error(f"argument --share: {args.share:g} is not a share in (0, 1]")
    if not 0 < args.tail_frac < 1:
        p.error(f"argument --tail-frac: {args.tail_frac:g} is not between 0 and 1")
    if args.history and len(args.history) != len(args.run):
        p.error(f"--history: {len(args.history)} given for {len(args.run)} --run; give one per --run, or none")
    return args


def read(path: Path, flag: str) -> list[dict[str, Any]]:
    cols = ["prompt_id", "sample_index", "prompt_token_ids", "response_token_ids", "segments", "finish_time_s"]
    return read_columns(path, cols, flag)


def token_times(row: dict[str, Any]) -> np.ndarray:
    """Each response token's time, spread evenly over its segment (first token to end)."""
    out = np.zeros(len(row["response_token_ids"]))
    for seg in row["segments"]:
        a, n = seg["start_token"], seg["num_tokens"]
        t0 = seg["first_token_time_s"] if seg["first_token_time_s"] is not None else seg["submit_time_s"]
        t1 = seg["end_time_s"] if seg["end_time_s"] is not None else t0
        out[a:a + n] = t0 + (t1 - t0) * (np.arange(n) / max(n, 1))
    return out


def rule_fn(name: str, min_n: int, max_n: int, share: float | None = None,
            corpus_min_n: int | None = None) -> Callable[..., tuple[list[int], str, int]]:
    """``fn(context, corpus, start, k) -> (draft, source, n-gram length)``; ``vote``'s ``share`` and
    ``corpus_min_n`` default to the proposer's (``VOTE_SHARE``, the window's longest)."""
    from pdsr_sdk.engines import group_match
    from pdsr_sdk.engines.group_drafter import VOTE_SHARE, GroupProposer

    share = VOTE_SHARE if share is None else share
    corpus_min_n = max_n if corpus_min_n is None else corpus_min_n

    def ngram(ctx, corpus, start, k):
        m = group_match.best_match(ctx, [ctx], min_n, max_n)
        return ([int(t) for t in ctx[m[2]:m[2] + k]], "own", m[0]) if m else ([], "", 0)

    def siblings(ctx, corpus, start, k):
        m = group_match.best_match(ctx, corpus, min_n, max_n, position=len(ctx) - start)
        return ([int(t) for t in corpus[m[1]][m[2]:m[2] + k]], "corpus", m[0]) if m else ([], "", 0)

    def longest(ctx, corpus, start, k):
        extra = {"min_n": min_n, "max_n": max_n, "start": start, "rule": "longest"}
        draft = GroupProposer._draft(ctx, corpus, extra, k)
        theirs = group_match.best_match(ctx, corpus, min_n, max_n, position=len(ctx) - start)
        own = group_match.best_match(ctx, [ctx], min_n, max_n)
        if theirs is not None and (own is None or theirs[0] > own[0]):
            return draft, "corpus", theirs[0]
        return draft, ("own" if own else ""), own[0] if own else 0

    def vote(ctx, corpus, start, k):
        extra = {"min_n": min_n, "max_n": max_n, "start": start, "rule": "vote", "share": share,
                 "corpus_min_n": corpus_min_n}
        draft = GroupProposer._draft(ctx, corpus, extra, k)
        _, n = group_match.vote_draft(ctx, corpus, min_n, max_n, k, share, corpus_min_n)
        return draft, "vote", n if draft else 0

    return {"ngram": ngram, "siblings": siblings, "longest": longest, "vote": vote}[name]


def replay(rows: list[dict[str, Any]], history: dict[tuple, list[list[int]]], fn, k: int,
           tail_frac: float, corpus_at: str = "launch") -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[r["prompt_id"]].append(r)
    times = {id(r): token_times(r) for r in rows}
    all_t = np.sort(np.concatenate([times[id(r)] for r in rows]))
    cut = all_t[min(int(math.floor((1 - tail_frac) * len(all_t))), len(all_t) - 1)] if len(all_t) else 0.0
    tot = {"whole": np.zeros(4, dtype=np.int64), "tail": np.zeros(4, dtype=np.int64)}   # tokens, steps, drafted, acc
    by_src: dict[tuple[str, int], np.ndarray] = defaultdict(lambda: np.zeros(3, dtype=np.int64))  # steps, dr, acc
    for members in groups.values():
        for r in members:
            prompt = np.asarray(r["prompt_token_ids"], dtype=np.int64)
            resp = np.asarray(r["response_token_ids"], dtype=np.int64)
            ctx_all = np.concatenate([prompt, resp])
            hist = [np.asarray(h, dtype=np.int64) for h in history.get(tuple(r["prompt_token_ids"]), [])]
            tt = times[id(r)]
            segs = sorted(r["segments"], key=lambda s: s["start_token"])
            for key in tot:
                tot[key][0] += len(resp) if key == "whole" else int((tt >= cut).sum())
            t = 1
            si = 0
            while t < len(resp):
                while si + 1 < len(segs) and segs[si + 1]["start_token"] <= t:
                    si += 1
                launched = (segs[si]["submit_time_s"] if segs else 0.0) if corpus_at == "launch" else tt[t]
                corpus = [np.asarray(s["response_token_ids"], dtype=np.int64) for s in members
                          if s is not r and s["finish_time_s"] is not None and s["finish_time_s"] <= launched
                          and s["response_token_ids"]] + hist
                draft, src, n = fn(ctx_all[:len(prompt) + t], corpus, len(prompt), min(k, len(resp) - t))
                if not draft:
                    t += 1
                    continue
                truth = resp[t:t + len(draft)]
                acc = 0
                while acc < len(truth) and truth[acc] == draft[acc]:
                    acc += 1
                for key in ("whole", "tail") if tt[t] >= cut else ("whole",):
                    tot[key][1:] += (1, len(draft), acc)
                by_src[(src, n)] += (1, len(draft), acc)
                t += acc + 1
    out = {key: {"tokens": int(v[0]), "verify_steps": int(v[1]), "drafted": int(v[2]), "accepted": int(v[3])}
           for key, v in tot.items()}
    out["by_source"] = {f"{s} n={n}": [int(x) for x in v] for (s, n), v in sorted(by_src.items())}
    return out


def fmt(c: dict[str, int]) -> str:
    per = c["accepted"] / c["verify_steps"] if c["verify_steps"] else 0.0
    share = c["accepted"] / c["tokens"] if c["tokens"] else 0.0
    return f"{c['accepted']} / {c['drafted']}, {per:.2f} per verify step, {share:.1%} of {c['tokens']} tokens"


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    results: dict[str, Any] = {}
    for i, path in enumerate(args.run):
        rows = read(path, "--run")
        history: dict[tuple, list[list[int]]] = defaultdict(list)
        if args.history:
            for h in read(args.history[i], "--history"):
                if h["response_token_ids"]:
                    history[tuple(h["prompt_token_ids"])].append(h["response_token_ids"])
            history = {p: v[-args.history_responses:] if args.history_responses > 0 else []
                       for p, v in history.items()}
        print(f"{path.name}: {len(rows)} responses, {sum(len(r['response_token_ids']) for r in rows)} tokens; "
              f"history {args.history[i].name if args.history else 'none'}")
        for k in args.k:
            for name in args.rules:
                fn = rule_fn(name, *args.window, args.share, args.corpus_min_n)
                got = replay(rows, history, fn, k, args.tail_frac, args.corpus_at)
                results[f"{path.name} k={k} {name}"] = got
                print(f"  k={k} {name:9s} whole {fmt(got['whole'])}; tail {fmt(got['tail'])}")
                if name in ("longest", "vote"):
                    print("      by source and n-gram length (steps, drafted, accepted): " + "; ".join(
                        f"{key}: {v[0]}, {v[1]}, {v[2]} ({v[2] / max(v[0], 1):.2f})"
                        for key, v in got["by_source"].items()))
            ngram = results.get(f"{path.name} k={k} ngram")
            for name in ("vote", "longest"):
                got = results.get(f"{path.name} k={k} {name}")
                if ngram and got:
                    x = tail_ratio(got, ngram)
                    print(f"  k={k} tail accepted per verify step, {name} / ngram: {x:.2f}x (bench/spec.py's target "
                          f"1.3x: {'met' if x >= 1.3 else 'not met'})")
    return results


def tail_ratio(rule: dict[str, Any], ngram: dict[str, Any]) -> float:
    """Accepted tokens per verify step in the tail, ``rule``'s over ngram's (nan where ngram has none)."""
    def per(c: dict[str, int]) -> float:
        return c["accepted"] / c["verify_steps"] if c["verify_steps"] else 0.0

    return per(rule["tail"]) / per(ngram["tail"]) if per(ngram["tail"]) else float("nan")


if __name__ == "__main__":
    main()
