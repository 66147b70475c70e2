"""``LengthTrace``: per-prompt-group response lengths, the input of ``analyze`` and ``simulate``.

A trace holds G prompt groups; group g has n_g samples whose lengths are
``lengths[offsets[g]:offsets[g+1]]`` (flat, ragged storage). Sample 0 of every
group is the probe. Most consumers want the equal-N view ``matrix()`` ([G, N]),
which raises a clear ``DataError`` when group sizes differ.

A trace of turns (multi-turn samples: an agent with tools) also holds each sample's turns
(:class:`SampleTurns`): per turn the tokens the model sampled, then the tokens its environment added and
the environment's delay in seconds; a sample's length is its sampled and environment tokens together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from pdsr_sdk.errors import DataError


@dataclass(frozen=True, eq=False)
class SampleTurns:
    """Per-sample turns of a trace (flat, ragged): sample i's turns are rows ``offsets[i]:offsets[i + 1]``. Turn j
    samples ``sampled[j]`` tokens, then its environment adds ``env_tokens[j]`` tokens after ``env_s[j]`` seconds
    (after the last turn: what the agent adds before the sample ends, usually nothing). A sample with no rows is
    single-turn.

    Attributes:
        offsets: int64 [S + 1].
        sampled: int64 [T], >= 1.
        env_tokens: int64 [T], >= 0.
        env_s: float64 [T], finite, >= 0.
    """

    offsets: np.ndarray
    sampled: np.ndarray
    env_tokens: np.ndarray
    env_s: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "offsets", np.asarray(self.offsets, dtype=np.int64))
        object.__setattr__(self, "sampled", np.asarray(self.sampled, dtype=np.int64))
        object.__setattr__(self, "env_tokens", np.asarray(self.env_tokens, dtype=np.int64))
        object.__setattr__(self, "env_s", np.asarray(self.env_s, dtype=np.float64))

    @classmethod
    def from_lists(cls, turns: Sequence[Sequence[Sequence[float]] | None]) -> "SampleTurns":
        """From one entry per sample: None (single-turn) or a list of ``(sampled, env_tokens, env_s)``."""
        sizes = [0 if t is None else len(t) for t in turns]
        offsets = np.zeros(len(turns) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        rows = [row for t in turns if t is not None for row in t]
        return cls(offsets, [int(r[0]) for r in rows], [int(r[1]) for r in rows], [float(r[2]) for r in rows])

    @property
    def num_samples(self) -> int:
        return len(self.offsets) - 1

    def of(self, i: int) -> list[tuple[int, int, float]] | None:
        """Sample ``i``'s turns as ``(sampled, env_tokens, env_s)``, or None for a single-turn sample."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        if lo == hi:
            return None
        return list(zip(self.sampled[lo:hi].tolist(), self.env_tokens[lo:hi].tolist(), self.env_s[lo:hi].tolist()))

    def take(self, samples: np.ndarray) -> "SampleTurns":
        """The turns of ``samples`` (indices), in that order."""
        return SampleTurns.from_lists([self.of(int(i)) for i in samples])

    def lengths(self) -> np.ndarray:
        """int64 [S]: each sample's sampled plus environment tokens (0 for a single-turn sample)."""
        per_row = self.sampled + self.env_tokens
        out = np.zeros(self.num_samples, dtype=np.int64)
        counts = np.diff(self.offsets)
        has = counts > 0
        if per_row.size:
            out[has] = np.add.reduceat(per_row, self.offsets[:-1][has])
        return out


@dataclass(frozen=True, eq=False)
class LengthTrace:
    """Response lengths of G prompt groups (sample 0 of each group is the probe).

    Attributes:
        prompt_ids: G prompt identifiers, unique.
        prompt_lens: int64 [G], prompt length in tokens.
        lengths: int64 [S], response lengths of all samples, group after group.
        offsets: int64 [G + 1], group g is ``lengths[offsets[g]:offsets[g + 1]]``.
        durations_s: float64 [S] wall time of each sample in seconds, or None.
        finish_reasons: object [S] of str (``"stop"``, ``"length"``, ...), or None.
        rewards: float64 [S] reward of each sample (NaN where it has none), or None (dynamic sampling in the
            simulator reads it).
        source: where the trace was read from (used in error messages), or None.
        turns: each sample's turns (:class:`SampleTurns`; a trace of turns), or None (every sample single-turn).
    """

    prompt_ids: list[str]
    prompt_lens: np.ndarray
    lengths: np.ndarray
    offsets: np.ndarray
    durations_s: np.ndarray | None = None
    finish_reasons: np.ndarray | None = None
    source: str | None = field(default=None)
    rewards: np.ndarray | None = None
    turns: SampleTurns | None = None

    def __post_init__(self) -> None:
        where = self.source or "LengthTrace"
        g = len(self.prompt_ids)
        offsets = np.asarray(self.offsets, dtype=np.int64)
        lengths = np.asarray(self.lengths, dtype=np.int64)
        prompt_lens = np.asarray(self.prompt_lens, dtype=np.int64)
        if offsets.shape != (g + 1,) or offsets[0] != 0 or offsets[-1] != len(lengths):
            raise DataError(f"{where}: offsets must have G + 1 = {g + 1} entries from 0 to {len(lengths)}")
        sizes = np.diff(offsets)
        if g and sizes.min() < 1:
            bad = int(np.argmax(sizes < 1))
            raise DataError(f"{where}: group {bad} ({self.prompt_ids[bad]!r}) has no samples")
        if prompt_lens.shape != (g,):
            raise DataError(f"{where}: prompt_lens has {prompt_lens.size} entries, expected one per group ({g})")
        if lengths.size and lengths.min() < 0:
            bad = int(np.searchsorted(offsets, int(np.argmax(lengths < 0)), side="right") - 1)
            raise DataError(f"{where}: group {bad} ({self.prompt_ids[bad]!r}) has a negative length")
        if g and prompt_lens.min() < 0:
            bad = int(np.argmax(prompt_lens < 0))
            raise DataError(f"{where}: group {bad} ({self.prompt_ids[bad]!r}) has a negative prompt_len")
        durations = None
        if self.durations_s is not None:
            durations = np.asarray(self.durations_s, dtype=np.float64)
            if durations.shape != lengths.shape:
                raise DataError(f"{where}: durations_s has {durations.size} entries, expected one per sample "
                                f"({lengths.size})")
        reasons = None
        if self.finish_reasons is not None:
            reasons = np.asarray(self.finish_reasons, dtype=object)
            if reasons.shape != lengths.shape:
                raise DataError(f"{where}: finish_reasons has {reasons.size} entries, expected one per sample "
                                f"({lengths.size})")
        rewards = None
        if self.rewards is not None:
            rewards = np.asarray(self.rewards, dtype=np.float64)
            if rewards.shape != lengths.shape:
                raise DataError(f"{where}: rewards has {rewards.size} entries, expected one per sample "
                                f"({lengths.size})")
        object.__setattr__(self, "rewards", rewards)
        if self.turns is not None:
            self._check_turns(where, lengths, offsets)
        object.__setattr__(self, "prompt_ids", [str(p) for p in self.prompt_ids])
        object.__setattr__(self, "prompt_lens", prompt_lens)
        object.__setattr__(self, "lengths", lengths)
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "durations_s", durations)
        object.__setattr__(self, "finish_reasons", reasons)

    def _check_turns(self, where: str, lengths: np.ndarray, offsets: np.ndarray) -> None:
        t = self.turns
        assert t is not None
        if t.num_samples != lengths.size:
            raise DataError(f"{where}: turns has {t.num_samples} entries, expected one per sample ({lengths.size})")
        for name, arr, ok in (("sampled", t.sampled, t.sampled >= 1), ("environment tokens", t.env_tokens,
                                                                        t.env_tokens >= 0),
                              ("environment delay", t.env_s, np.isfinite(t.env_s) & (t.env_s >= 0))):
            if arr.size and not ok.all():
                row = int(np.argmax(~ok))
                i = int(np.searchsorted(t.offsets, row, side="right") - 1)
                raise DataError(f"{where}: sample {i}, turn {row - int(t.offsets[i])}: {name} is {arr[row].item()!r}; "
                                f"expected {'>= 1' if name == 'sampled' else '>= 0'}")
        has = np.diff(t.offsets) > 0
        wrong = has & (t.lengths() != lengths)
        if wrong.any():
            i = int(np.argmax(wrong))
            g = int(np.searchsorted(offsets, i, side="right") - 1)
            raise DataError(f"{where}: group {g} ({self.prompt_ids[g]!r}) sample {i - int(offsets[g])}: its turns "
                            f"add up to {int(t.lengths()[i])} tokens (sampled + environment) but its length is "
                            f"{int(lengths[i])}")

    @property
    def multi_turn(self) -> bool:
        """Whether any sample has turns."""
        return self.turns is not None and bool(self.turns.sampled.size)

    # -- construction -----------------------------------------------------------------

    @classmethod
    def from_matrix(cls, lengths, *, prompt_ids: Sequence[str] | None = None, prompt_lens=None,
                    durations_s=None, finish_reasons=None, source: str | None = None,
                    rewards=None, turns: SampleTurns | None = None) -> "LengthTrace":
        """Build from an equal-N [G, N] array (and optional [G, N] durations / finish reasons / rewards, and the
        samples' turns in row-major order)."""
        matrix = np.asarray(lengths)
        if matrix.ndim != 2 or matrix.shape[1] < 1:
            raise DataError(f"{source or 'LengthTrace'}: lengths must be a [G, N] array with N >= 1, "
                            f"got shape {matrix.shape}")
        if matrix.size and not np.issubdtype(matrix.dtype, np.integer):
            raise DataError(f"{source or 'LengthTrace'}: lengths must be integers, got dtype {matrix.dtype}")
        g, n = matrix.shape
        ids = list(prompt_ids) if prompt_ids is not None else [f"p{i}" for i in range(g)]
        if len(ids) != g:
            raise DataError(f"{source or 'LengthTrace'}: {len(ids)} prompt_ids for {g} groups")
        plens = np.zeros(g, dtype=np.int64) if prompt_lens is None else prompt_lens
        durations = None if durations_s is None else np.asarray(durations_s, dtype=np.float64).reshape(-1)
        reasons = None if finish_reasons is None else np.asarray(finish_reasons, dtype=object).reshape(-1)
        return cls(prompt_ids=ids, prompt_lens=plens, lengths=matrix.reshape(-1),
                   offsets=np.arange(g + 1, dtype=np.int64) * n, durations_s=durations,
                   finish_reasons=reasons, source=source,
                   rewards=None if rewards is None else np.asarray(rewards, dtype=np.float64).reshape(-1),
                   turns=turns)

    # -- shape ------------------------------------------------------------------------

    @property
    def num_groups(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_samples(self) -> int:
        return int(self.lengths.size)

    @property
    def group_sizes(self) -> np.ndarray:
        """int64 [G]: number of samples of each group."""
        return np.diff(self.offsets)

    @property
    def is_rectangular(self) -> bool:
        """True when every group has the same number of samples."""
        sizes = self.group_sizes
        return bool(sizes.size == 0 or (sizes == sizes[0]).all())

    @property
    def samples_per_group(self) -> int:
        """N, the common group size; raises ``DataError`` when groups differ in size."""
        self.require_rectangular("this needs")
        return int(self.group_sizes[0]) if self.num_groups else 0

    def __len__(self) -> int:
        return self.num_groups

    # -- views ------------------------------------------------------------------------

    def matrix(self) -> np.ndarray:
        """int64 [G, N] lengths (column 0 is the probe); raises ``DataError`` if groups differ in size."""
        n = self.samples_per_group
        return self.lengths.reshape(self.num_groups, n)

    def duration_matrix(self) -> np.ndarray | None:
        """float64 [G, N] durations in seconds, or None when the trace has none."""
        if self.durations_s is None:
            return None
        return self.durations_s.reshape(self.num_groups, self.samples_per_group)

    def group(self, i: int) -> dict:
        """One group as the JSON-able mapping of its trace line."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        row: dict = {"prompt_id": self.prompt_ids[i], "prompt_len": int(self.prompt_lens[i]),
                     "lengths": self.lengths[lo:hi].tolist()}
        if self.durations_s is not None:
            row["durations_s"] = self.durations_s[lo:hi].tolist()
        if self.finish_reasons is not None:
            row["finish_reasons"] = [str(r) for r in self.finish_reasons[lo:hi]]
        if self.rewards is not None:
            row["rewards"] = [None if np.isnan(r) else float(r) for r in self.rewards[lo:hi]]
        if self.turns is not None:
            row["turns"] = [None if (t := self.turns.of(i)) is None else [list(x) for x in t] for i in range(lo, hi)]
        return row

    def group_rewards(self) -> dict[str, list[float | None]]:
        """Each group's sample rewards by prompt id (None where a sample has none); empty without rewards."""
        if self.rewards is None:
            return {}
        offsets = self.offsets.tolist()
        values = [None if np.isnan(r) else float(r) for r in self.rewards.tolist()]
        return {pid: values[offsets[g]:offsets[g + 1]] for g, pid in enumerate(self.prompt_ids)}

    def require_rectangular(self, what: str = "this needs") -> None:
        """Raise ``DataError`` naming two groups of different sizes unless all groups have the same N."""
        if self.is_rectangular:
            return
        sizes = self.group_sizes
        bad = int(np.argmax(sizes != sizes[0]))
        raise DataError(
            f"{self.source or 'LengthTrace'}: {what} the same number of samples in every group, but group 0 "
            f"({self.prompt_ids[0]!r}) has {sizes[0]} and group {bad} ({self.prompt_ids[bad]!r}) has {sizes[bad]}"
        )
