"""The JSONL length trace (one prompt group per line; the format is described in :mod:`pdsr_sdk.traces.io`): its
reader, with vectorised checks of every line's values, and its writer."""

from __future__ import annotations

import difflib
import json
import warnings
from pathlib import Path

import numpy as np

from pdsr_sdk.errors import DataError, PdsrWarning
from pdsr_sdk.io.json_rows import not_json_line
from pdsr_sdk.io.tables import write_text_atomic
from pdsr_sdk.traces.formats import short_repr
from pdsr_sdk.traces.responses import looks_like_responses
from pdsr_sdk.traces.trace import LengthTrace, SampleTurns
from pdsr_sdk.traces.verl_dump import looks_like_verl_dump

REQUIRED_KEYS = ("prompt_id", "prompt_len", "lengths")
#: optional per-sample keys of a JSONL trace line
OPTIONAL_KEYS = ("durations_s", "finish_reasons", "rewards", "turns")
_KEYS = frozenset(REQUIRED_KEYS + OPTIONAL_KEYS)


def read_trace_jsonl(path: str | Path) -> LengthTrace:
    """Parse a JSONL length trace; errors name ``path:line`` and the offending key.

    Lines are checked for structure as they are read; the values of all lines
    are then converted and checked at once (vectorised), and only when that
    fails are the lines re-scanned to name the first bad one.
    """
    path = Path(path)
    ids: list[str] = []
    prompt_lens: list[int] = []
    lines: list[int] = []                      # line number of each group
    sizes: list[int] = []
    flat: dict[str, list] = {"lengths": [], "durations_s": [], "finish_reasons": [], "rewards": [], "turns": []}
    seen: dict[str, int] = {}
    has_opt: dict[str, int] = {}  # optional key -> +line / -line of the first group that has / lacks it
    unknown: dict[str, int] = {}  # a key no trace line defines -> the first line holding it
    for lineno, row in _parse_lines(path):
        where = f"{path}:{lineno}"
        if type(row) is not dict:
            raise DataError(f"{where}: expected a JSON object per line, got {type(row).__name__}")
        missing = [k for k in REQUIRED_KEYS if k not in row]
        if missing and looks_like_responses(row):
            keys = ", ".join(list(row)[:8]) + (", ..." if len(row) > 8 else "")
            raise DataError(f"{where}: this looks like one row per response (keys: {keys}), "
                            f"not a length trace (one prompt group per line: {', '.join(REQUIRED_KEYS)}); "
                            f"`pdsr trace convert {path} --out trace.jsonl` reads such a log into a trace (name its "
                            f"columns with --id-column, --length-column, ...)")
        if missing and looks_like_verl_dump(row):
            raise DataError(f"{where}: this is a line of verl's generation dump (input, output, score, step), not a "
                            f"length trace; `pdsr trace convert {path.parent} --tokenizer DIR --out trace.jsonl` "
                            f"counts its text with the policy's tokenizer into a trace")
        if missing:
            raise DataError(f"{where}: missing key(s) {', '.join(map(repr, missing))}; a trace line needs "
                            f"{', '.join(REQUIRED_KEYS)}")
        if not row.keys() <= _KEYS:
            for key in row.keys() - _KEYS:
                unknown.setdefault(key, lineno)
        pid = row["prompt_id"]
        if type(pid) is not str:
            if type(pid) is not int:
                raise DataError(f"{where}: prompt_id must be a string, got {short_repr(pid)}")
            pid = str(pid)
        if pid in seen:
            raise DataError(f"{where}: duplicate prompt_id {pid!r} (first on line {seen[pid]})")
        seen[pid] = lineno
        plen = row["prompt_len"]
        if type(plen) is not int or plen < 0:
            raise DataError(f"{where}: prompt_len must be a non-negative integer, got {short_repr(plen)}")
        lens = row["lengths"]
        if type(lens) is not list or not lens:
            raise DataError(f"{where}: lengths must be a non-empty list of integers, got {short_repr(lens)}")
        n = len(lens)
        flat["lengths"].extend(lens)
        for key in OPTIONAL_KEYS:
            value = row.get(key)
            present = value is not None
            first = has_opt.setdefault(key, lineno if present else -lineno)
            if present != (first > 0):
                raise DataError(f"{where}: this line {'has' if present else 'lacks'} {key!r} but line "
                                f"{abs(first)} {'has it' if first > 0 else 'does not'}; give it for every "
                                f"group or for none")
            if present:
                if type(value) is not list:
                    raise DataError(f"{where}: {key} must be a list, got {short_repr(value)}")
                if len(value) != n:
                    raise DataError(f"{where}: {key} has {len(value)} entries but lengths has {n}; "
                                    f"expected one per sample")
                flat[key].extend(value)
        ids.append(pid)
        prompt_lens.append(plen)
        lines.append(lineno)
        sizes.append(n)
    if not ids:
        # every line that is not blank is a group or an error, so the file is empty (whatever its name says)
        raise DataError(f"{path}: the file is empty (no groups); expected a length trace (JSONL, one JSON object per "
                        f"prompt group) or a trajectories Parquet/Arrow file")
    if unknown:
        _warn_unknown(path, unknown)
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    check = _FlatCheck(path, offsets, lines)
    lengths = check.integers(flat["lengths"], "lengths")
    durations = check.seconds(flat["durations_s"], "durations_s") if has_opt["durations_s"] > 0 else None
    reasons = check.strings(flat["finish_reasons"], "finish_reasons") if has_opt["finish_reasons"] > 0 else None
    rewards = check.rewards(flat["rewards"], "rewards") if has_opt["rewards"] > 0 else None
    turns = check.turns(flat["turns"], lengths) if has_opt["turns"] > 0 else None
    return LengthTrace(prompt_ids=ids, prompt_lens=np.asarray(prompt_lens, dtype=np.int64), lengths=lengths,
                       offsets=offsets, durations_s=durations, finish_reasons=reasons, source=str(path),
                       rewards=rewards, turns=turns)


def _warn_unknown(path: Path, unknown: dict[str, int]) -> None:
    """One :class:`~pdsr_sdk.errors.PdsrWarning` for the keys of a trace no trace line defines (a misspelt
    ``reward`` would otherwise leave the trace without its rewards, unsaid), each with the first line holding it
    and the key it most likely meant."""
    said = []
    for key, lineno in sorted(unknown.items(), key=lambda kv: (kv[1], kv[0]))[:5]:
        close = difflib.get_close_matches(key, sorted(_KEYS), n=1, cutoff=0.6)
        said.append(f"{key!r} (line {lineno}{f'; did you mean {close[0]!r}?' if close else ''})")
    more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
    warnings.warn(f"{path}: key(s) {', '.join(said)}{more} are not length-trace keys and are ignored; a trace line "
                  f"holds {', '.join(REQUIRED_KEYS)} and optionally {', '.join(OPTIONAL_KEYS)}", PdsrWarning,
                  stacklevel=3)


def _parse_lines(path: Path) -> list[tuple[int, object]]:
    """(line number, parsed value) of every non-blank line.

    One ``json.loads`` of all lines joined as an array is several times
    faster than one call per line; only if it fails are lines parsed one by
    one to name the bad line.
    """
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read trace: {getattr(exc, 'strerror', None) or exc}") from None
    numbered = [(i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    try:
        rows = json.loads("[" + ",".join(line for _, line in numbered) + "]")
        if len(rows) == len(numbered):
            return [(i, row) for (i, _), row in zip(numbered, rows)]
    except json.JSONDecodeError:
        pass
    parsed = []
    for lineno, line in numbered:
        try:
            parsed.append((lineno, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise not_json_line(path, lineno, exc) from None
    return parsed


class _FlatCheck:
    """Vectorised checks of one per-sample key over all lines; errors name the first bad line and index."""

    def __init__(self, path: Path, offsets: np.ndarray, lines: list[int]):
        self.path, self.offsets, self.lines = path, offsets, lines

    def _fail(self, key: str, flat_index: int, what: str):
        g = int(np.searchsorted(self.offsets, flat_index, side="right") - 1)
        i = flat_index - int(self.offsets[g])
        raise DataError(f"{self.path}:{self.lines[g]}: {key}[{i}] {what}")

    def _first_bad_type(self, values: list, ok: tuple[type, ...]) -> int | None:
        if set(map(type, values)) <= set(ok):
            return None
        return next(k for k, v in enumerate(values) if type(v) not in ok)

    def integers(self, values: list, key: str) -> np.ndarray:
        bad = self._first_bad_type(values, (int, float))
        if bad is not None:
            self._fail(key, bad, f"is {short_repr(values[bad])}; expected an integer token count")
        try:
            arr = np.asarray(values)
        except OverflowError:
            arr = np.asarray(values, dtype=object)
        if arr.dtype.kind == "f":
            wrong = ~(np.isfinite(arr) & (arr == np.round(arr)))
            if wrong.any():
                k = int(np.argmax(wrong))
                self._fail(key, k, f"is {values[k]!r}; expected an integer token count")
        elif arr.dtype.kind not in "iu":
            k = next(k for k, v in enumerate(values) if abs(v) >= 2**63)
            self._fail(key, k, f"is {short_repr(values[k])}; too large for a token count")
        arr = arr.astype(np.int64)
        if arr.min() < 0:
            k = int(np.argmax(arr < 0))
            self._fail(key, k, f"is negative ({int(arr[k])}); lengths are token counts >= 0")
        return arr

    def seconds(self, values: list, key: str) -> np.ndarray:
        bad = self._first_bad_type(values, (int, float))
        if bad is not None:
            self._fail(key, bad, f"is {short_repr(values[bad])}; expected a number of seconds")
        arr = np.asarray(values, dtype=np.float64)
        wrong = ~(np.isfinite(arr) & (arr >= 0))
        if wrong.any():
            k = int(np.argmax(wrong))
            self._fail(key, k, f"is {values[k]!r}; expected a finite number of seconds >= 0")
        return arr

    def rewards(self, values: list, key: str) -> np.ndarray:
        """Rewards: finite numbers, or null (NaN) for a sample without one."""
        for k, v in enumerate(values):
            if v is not None and (type(v) not in (int, float) or not np.isfinite(v)):
                self._fail(key, k,
                           f"is {short_repr(v)}; expected a finite number, or null for a sample without a reward")
        return np.asarray([np.nan if v is None else float(v) for v in values], dtype=np.float64)

    def turns(self, values: list, lengths: np.ndarray) -> SampleTurns:
        """Turns: per sample null or a non-empty list of ``[sampled, env_tokens, env_s]`` whose tokens add up to
        the sample's length."""
        out: list[list[tuple[int, int, float]] | None] = []
        for k, v in enumerate(values):
            if v is None:
                out.append(None)
                continue
            if type(v) is not list or not v:
                self._fail("turns", k, f"is {short_repr(v)}; expected null (a single-turn sample) or a non-empty list "
                                       f"of turns [sampled, env_tokens, env_s]")
            rows = []
            for j, turn in enumerate(v):
                what = f"turn {j} is {short_repr(turn)}; expected [sampled, env_tokens, env_s]: the tokens the model " \
                       f"sampled (>= 1), then the environment's tokens (>= 0) and its delay in seconds (>= 0)"
                if type(turn) is not list or len(turn) != 3 or not all(type(x) in (int, float) for x in turn):
                    self._fail("turns", k, what)
                sampled, env, delay = turn
                if (sampled != int(sampled) or env != int(env) or sampled < 1 or env < 0
                        or not np.isfinite(delay) or delay < 0):
                    self._fail("turns", k, what)
                rows.append((int(sampled), int(env), float(delay)))
            total = sum(r[0] + r[1] for r in rows)
            if total != int(lengths[k]):
                self._fail("turns", k, f"adds up to {total} tokens (sampled + environment) but lengths[] says "
                                       f"{int(lengths[k])}; a sample's length counts both")
            out.append(rows)
        return SampleTurns.from_lists(out)

    def strings(self, values: list, key: str) -> np.ndarray:
        bad = self._first_bad_type(values, (str,))
        if bad is not None:
            self._fail(key, bad, f"is {short_repr(values[bad])}; expected a string such as 'stop' or 'length'")
        return np.asarray(values, dtype=object)


def write_trace_jsonl(trace: LengthTrace, path: str | Path) -> Path:
    """Write ``trace`` as JSONL (one group per line), atomically (temp file + rename)."""
    lengths = trace.lengths.tolist()
    durations = trace.durations_s.tolist() if trace.durations_s is not None else None
    reasons = [str(r) for r in trace.finish_reasons] if trace.finish_reasons is not None else None
    offsets = trace.offsets.tolist()
    prompt_lens = trace.prompt_lens.tolist()
    lines = []
    for g, pid in enumerate(trace.prompt_ids):
        lo, hi = offsets[g], offsets[g + 1]
        row: dict = {"prompt_id": pid, "prompt_len": prompt_lens[g], "lengths": lengths[lo:hi]}
        if durations is not None:
            row["durations_s"] = durations[lo:hi]
        if reasons is not None:
            row["finish_reasons"] = reasons[lo:hi]
        if trace.rewards is not None:
            row["rewards"] = [None if r != r else r for r in trace.rewards[lo:hi].tolist()]
        if trace.turns is not None:
            row["turns"] = [None if (t := trace.turns.of(i)) is None else [list(x) for x in t] for i in range(lo, hi)]
        lines.append(json.dumps(row))  # ASCII (non-ASCII ids escaped): safe under any locale encoding
    return write_text_atomic("\n".join(lines) + "\n", path)
