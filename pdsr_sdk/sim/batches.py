"""A length trace cut into batches of prompt groups (:func:`trace_batches`), and a batch's groups of forced
samples (:func:`build_batch`): what the simulator replays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pdsr_sdk.dispatch.types import Group, Sample
from pdsr_sdk.errors import DataError
from pdsr_sdk.sim.config import SimulateConfig


@dataclass
class TraceBatches:
    """The trace cut into batches: per batch, the groups' ids, prompt lengths and forced lengths."""

    source: str
    #: per batch, its groups as (prompt id, prompt length, lengths, finish reasons or None, turns or None)
    batches: list[list[tuple[str, int, list[int], list[str] | None, list | None]]]
    zero_length_samples: int
    n: int | None

    @property
    def multi_turn(self) -> bool:
        """Whether any group has samples with turns (a trace of turns)."""
        return any(g[4] is not None for b in self.batches for g in b)

    @property
    def num_groups(self) -> int:
        return sum(len(b) for b in self.batches)

    @property
    def num_samples(self) -> int:
        return sum(len(g[2]) for b in self.batches for g in b)


def trace_batches(trace, cfg: SimulateConfig) -> TraceBatches:
    """Cut ``trace`` (a LengthTrace) into batches of ``cfg.batch_size`` groups; lengths 0 become 1."""
    source = trace.source or "trace"
    sizes = trace.group_sizes
    if cfg.n is not None and trace.num_groups and sizes.min() < cfg.n:
        bad = int(np.argmax(sizes < cfg.n))
        raise DataError(f"{source}: n is {cfg.n} but group {bad} ({trace.prompt_ids[bad]!r}) has only "
                        f"{sizes[bad]} samples")
    lengths = trace.lengths.tolist()
    offsets = trace.offsets.tolist()
    plens = trace.prompt_lens.tolist()
    reasons = [str(r) for r in trace.finish_reasons] if trace.finish_reasons is not None else None
    turns = trace.turns if getattr(trace, "multi_turn", False) else None
    groups = []
    zero = 0
    for g, pid in enumerate(trace.prompt_ids):
        lo = offsets[g]
        hi = lo + cfg.n if cfg.n is not None else offsets[g + 1]
        lens = lengths[lo:hi]
        if 0 in lens:
            zero += lens.count(0)
            lens = [max(1, x) for x in lens]
        group_turns = None if turns is None else [turns.of(i) for i in range(lo, hi)]
        groups.append((pid, plens[g], lens, reasons[lo:hi] if reasons is not None else None, group_turns))
    b = cfg.batch_size
    batches = [groups[i:i + b] for i in range(0, len(groups), b)]
    if cfg.num_batches is not None:
        batches = batches[:cfg.num_batches]
    if not batches:
        raise DataError(f"{source}: the trace has no groups")
    check_fits(source, batches, cfg)
    return TraceBatches(source, batches, zero, cfg.n)


def check_fits(source: str, batches, cfg: SimulateConfig) -> None:
    """A DataError naming the first group whose prompt and longest response cannot fit in any simulated engine
    (``max_model_len``, and the KV cache: an engine fails such a request mid-run, where the message could
    name only a segment's context)."""
    pools = [p for p, count in ((cfg.profiles.fast, cfg.fast), (cfg.profiles.heavy, cfg.heavy)) if count]
    limit = max(p.max_context for p in pools) if pools else None
    if limit is None:
        return
    index = 0
    for batch in batches:
        for pid, plen, lens, *_ in batch:
            if plen + max(lens) > limit:
                i = lens.index(max(lens))
                raise DataError(f"{source}: group {index} ({pid!r}), sample {i}: a context of {plen + max(lens):,} "
                                f"tokens (prompt {plen:,} + response {max(lens):,}); the simulated engines hold at "
                                f"most {limit:,} (max_model_len, kv_cache_tokens: raise them in a --profile file's "
                                f"fast / heavy sections, or take a family member's engines with --family NAME)")
            index += 1


def build_batch(rows) -> list[Group]:
    """Groups of forced samples (prompt ids not kept: only lengths matter to the simulator)."""
    groups = []
    for i, (pid, plen, lens, reasons, turns) in enumerate(rows):
        g = Group(prompt_id=pid, prompt_token_ids=[], prompt_text="", n=len(lens), target_lengths=lens,
                  target_finish_reasons=reasons, position=i, prompt_length=plen, target_turns=turns)
        g.samples = [Sample(group=g, index=k, max_tokens=n, forced=True) for k, n in enumerate(lens)]
        if turns is not None:
            for s, t in zip(g.samples, turns):
                if t is not None:   # counts only: no ids, so no mask either (the trajectory's turns say it)
                    s.turns = []
                    s.turn_end = t[0][0]
        groups.append(g)
    return groups
