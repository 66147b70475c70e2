"""The timed spans calibrate fits (:class:`Span`): read from the ``segments`` of ``pdsr rollout`` trajectories
files, with what each prefilled and, from a run with speculation, the steps it took."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pdsr_sdk.errors import DataError
from pdsr_sdk.sim.cost import cached_prefix, uncached_tokens


@dataclass
class Span:
    engine: str          # unique per run: "<file index>/<engine name>"
    pool: str
    start: float
    end: float
    tokens: int
    context: int         # prompt + tokens before this span
    prefill: int         # uncached tokens prefilled when it joined
    steps: float = 0.0   # the steps it took: tokens, less the drafted tokens accepted with speculation
    drafted: float = 0.0  # drafted tokens its verify steps checked (speculation)
    #: speculation's counts: True when the engine reported them, False for a span of a speculative run that
    #: has none (vLLM reports none for an aborted request; they are estimated from the pool's other spans)
    counted: bool = True
    drafting_steps: float = 0.0   # of its steps, those in intervals where drafting ran (the fit's estimate)

    def __post_init__(self) -> None:
        if not self.steps:
            self.steps = float(self.tokens)



def read_spans(paths, *, block_size: int = 16) -> list[Span]:
    """Every timed span of every trajectories file (engines namespaced per file)."""
    import pyarrow.parquet as pq

    spans: list[Span] = []
    first_span = 0
    for fi, path in enumerate(paths):
        path = Path(path)
        if not path.exists():
            raise DataError(f"{path}: trajectories file does not exist")
        try:
            table = _read_table(path, pq)
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many types
            raise DataError(f"{path}: cannot read trajectories: {exc}") from None
        missing = [c for c in ("prompt_length", "segments") if c not in table.column_names]
        if missing:
            raise DataError(f"{path}: missing column(s) {', '.join(missing)}; calibrate needs a trajectories file "
                            f"written by `pdsr rollout` (with its 'segments' timings)")
        plens = table["prompt_length"].to_pylist()
        prompts = table["prompt_id"].to_pylist() if "prompt_id" in table.column_names else [None] * len(plens)
        by_prompt: dict[tuple[str, object], list[tuple[float, int, int, int]]] = {}   # (engine, prompt) -> its spans
        for row, (plen, segs) in enumerate(zip(plens, table["segments"].to_pylist())):
            prev = None
            for k, seg in enumerate(segs or []):
                try:
                    engine, pool = seg["engine"], str(seg["pool"]).split("<-")[0]
                    a, b, n, start = seg["submit_time_s"], seg["end_time_s"], seg["num_tokens"], seg["start_token"]
                except (KeyError, TypeError):
                    raise DataError(f"{path}: row {row}: segments[{k}] lacks engine/pool/submit_time_s/end_time_s/"
                                    f"num_tokens/start_token") from None
                context = int(plen) + int(start)
                cont = (prev is not None and prev["engine"] == engine and prev["end_time_s"] is not None
                        and abs(prev["end_time_s"] - a) < 1e-6 and prev["start_token"] + prev["num_tokens"] == start)
                prev = seg
                first = seg.get("first_token_time_s")
                if first is not None and n is not None:
                    # The span really ran from its first token on (before: a wait in the engine's
                    # queue, then the prefill step that sampled the first token): n - 1 decode steps.
                    a, n, context = first, n - 1, context + 1
                if b is None or n is None or n <= 0 or not (b > a):
                    continue
                prefill = uncached_tokens(context, context, block_size) if cont else context
                if prompts[row] is not None:
                    by_prompt.setdefault((engine, prompts[row]), []).append((float(a), row, len(spans), int(plen)))
                drafted, accepted = seg.get("drafted_tokens"), seg.get("accepted_tokens")
                counted = drafted is not None and accepted is not None
                steps = n - min(int(accepted), n - 1) if counted else n   # (a verify step yields its own token)
                spans.append(Span(f"{fi}/{engine}", pool, float(a), float(b), int(n), context, int(prefill),
                                  float(steps), float(drafted or 0), counted))
        _share_prompts(spans, by_prompt, block_size)
        _estimate_uncounted(spans[first_span:])
        first_span = len(spans)
    return spans


def _estimate_uncounted(spans: list[Span]) -> None:
    """A run without speculation has no counts: every span is plain. In a run with it, a span without counts
    (an aborted request) gets the run's mean steps per token and drafted tokens per step."""
    counted = [s for s in spans if s.counted]
    if not counted:
        for s in spans:
            s.counted = True
        return
    per_token = sum(s.steps for s in counted) / sum(s.tokens for s in counted)
    per_step = sum(s.drafted for s in counted) / sum(s.steps for s in counted)
    for s in spans:
        if not s.counted:
            s.steps = max(1.0, s.tokens * per_token)
            s.drafted = s.steps * per_step


def _share_prompts(spans: list[Span], by_prompt: dict, block: int) -> None:
    """A span that joined while another span of its prompt ran on its engine found the prompt's whole blocks
    cached: its prefill is at most what lies past them (``by_prompt``: (engine, prompt) -> (start, row, span
    index, prompt length); earlier joins, by start then row, count as running)."""
    for members in by_prompt.values():
        if len(members) < 2:
            continue
        members.sort()
        for i, (start, row, k, plen) in enumerate(members):
            if any(spans[j].end > start and r != row for _, r, j, _ in members[:i]):
                sp = spans[k]
                sp.prefill = min(sp.prefill, uncached_tokens(sp.context, cached_prefix(plen, block), block))


def _read_table(path: Path, pq):
    import pyarrow as pa

    from pdsr_sdk.traces.formats import detect_format

    if path.is_file() and path.stat().st_size == 0:   # detect_format calls an empty file JSONL (a trace of none)
        raise DataError(f"{path}: the trajectories file is empty; calibrate reads the Parquet or Arrow trajectories "
                        f"`pdsr rollout` writes (with their 'segments' timings)")
    try:
        kind = detect_format(path)
    except DataError:
        kind = "other"
    if kind not in ("parquet", "arrow_file", "arrow_stream"):
        what = "is a length trace (JSONL)" if kind == "jsonl" else "is neither Parquet nor Arrow IPC"
        raise DataError(f"{path}: {what}, not a trajectories file; calibrate reads the Parquet or Arrow "
                        f"trajectories `pdsr rollout` writes (with their 'segments' timings)")
    if kind == "parquet":
        names = pq.read_schema(path).names
        return pq.read_table(path, columns=[c for c in ("prompt_id", "prompt_length", "segments") if c in names])
    with pa.memory_map(str(path)) as source:
        reader = pa.ipc.open_file(source) if kind == "arrow_file" else pa.ipc.open_stream(source)
        return reader.read_all()
