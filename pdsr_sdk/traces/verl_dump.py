"""A length trace from verl's generation dumps: what ``trainer.rollout_data_dir`` (and ``validation_data_dir``)
write, a JSONL file per step named ``{step}.jsonl``, one line per response::

    {"input": "<prompt text>", "output": "<response text>", "gts": ..., "score": 1.0, "step": 12, ...}

(the reward function's extra values, such as ``acc``, follow as more keys). The text is what verl decoded with
special tokens skipped; no token count, uid or request id is written, and the lines of a prompt need not be
consecutive (verl's ``balance_batch`` reorders the batch). So:

- a group is the lines of one prompt text within one step (of one file): two dataset rows of the same text in one
  step become one group of 2n;
- lengths are counted with the policy's tokenizer (:func:`pdsr_sdk.traces.tokens.count_tokens`): the response's
  text, and the prompt's text for ``prompt_len``, which lacks the chat template's special tokens;
- a group's samples are its lines in a seeded random order (the same dump gives the same trace), so sample 0, the
  probe, is any of its responses alike: verl's ``balance_batch`` (on by default) orders each data-parallel rank's
  lines by length, shortest at both ends, so a group's first line is biased short (on one rank it was the group's
  shortest half the time);
- ``score`` (or another key) is the reward.

Errors name the file and its line (from 1) and the key.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from pdsr_sdk.errors import DataError
from pdsr_sdk.io.json_rows import json_lines
from pdsr_sdk.io.paths import resolve_inputs, user_path
from pdsr_sdk.traces.formats import detect_format, short_repr
from pdsr_sdk.traces.trace import LengthTrace

#: the keys every line of verl's dump has; a JSONL log whose first line has them all is read as one
VERL_DUMP_KEYS = ("input", "output", "score", "step")
#: seeds the order of a group's samples (:func:`_shuffled_ranks`): the same dump always gives the same trace
SAMPLE_ORDER_SEED = 0
TOKENIZER_HINT = "count them with a tokenizer: pdsr trace convert --tokenizer DIR (the policy model's folder)"


def looks_like_verl_dump(row: object) -> bool:
    """Whether a parsed JSON line is one of verl's generation dump (its keys, and no trace line's ``lengths``)."""
    return isinstance(row, dict) and "lengths" not in row and all(k in row for k in VERL_DUMP_KEYS)


def verl_dump_files(path: str | Path) -> list[Path]:
    """The JSONL files of ``path``: the file itself, a folder's ``*.jsonl`` files or a glob pattern's matches, in
    order of step (a ``{step}.jsonl`` name's number; other names after, by name). A folder or pattern of files of
    another format, or of several, is a DataError (:func:`~pdsr_sdk.io.paths.resolve_inputs`)."""
    from pdsr_sdk.io.tables import FORMATS   # the formats a folder may hold, as any table input

    files = resolve_inputs(path, FORMATS, what="verl dump", order="step")
    if files != [user_path(path)] and FORMATS[files[0].suffix.lower()] != "jsonl":
        raise DataError(f"{path}: holds {files[0].suffix} files; verl's generation dumps are {{step}}.jsonl files, "
                        f"as trainer.rollout_data_dir writes them")
    return files


def is_verl_dump(path: str | Path) -> bool:
    """Whether ``path`` (a file, folder or pattern) reads as verl's dump: its first file's first line does. Any
    file it cannot read so is not (its reader names what is wrong with it)."""
    try:
        files = verl_dump_files(path)
        if detect_format(files[0]) != "jsonl":
            return False
        for _, row in json_lines(files[0]):
            return looks_like_verl_dump(row)
    except DataError:
        return False
    return False


def read_verl_dump(path: str | Path, tokenizer, *, reward_key: str = "score",
                   finish_reason_key: str | None = None) -> LengthTrace:
    """Read verl's generation dumps (a ``{step}.jsonl`` file, a folder of them, or a glob pattern) into a trace.

    ``tokenizer`` (a Hugging Face tokenizer, the policy's) counts the response and prompt texts; ``reward_key`` names
    the reward (``score``, or a reward function's extra key such as ``acc``; a null value: that response has none);
    ``finish_reason_key`` a key of finish reasons, if the dump has one (verl's own has none).
    """
    import pyarrow as pa

    from pdsr_sdk.traces.tokens import count_tokens
    from pdsr_sdk.traces.trajectories import trace_from_trajectories

    files = verl_dump_files(path)
    if tokenizer is None:
        raise DataError(f"{files[0]}: verl's generation dump holds text ('input', 'output'), not token counts; "
                        f"{TOKENIZER_HINT}")
    names = [f.name for f in files]
    labels = names if len(set(names)) == len(names) else [str(f) for f in files]
    row_ids: list[str] = []
    response_len: list[np.ndarray] = []
    prompt_len: list[np.ndarray] = []
    sample_index: list[np.ndarray] = []
    rewards: list[float | None] = []
    reasons: list[str] = []
    rng = np.random.default_rng(SAMPLE_ORDER_SEED)
    for file, label in zip(files, labels, strict=True):
        outputs: list[str] = []
        prompts: list[str] = []        # each group's prompt text
        group_ids: list[str] = []      # each group's id: where its first line is, so a user can find it
        group_of: list[int] = []       # each line's group
        first: dict[tuple[int, str], int] = {}
        for lineno, row in json_lines(file):   # errors name the line
            where = f"{file}:{lineno}"
            output, prompt, step = _text(row, "output", where), _text(row, "input", where), _step(row, where)
            group = first.setdefault((step, prompt), len(prompts))
            if group == len(prompts):
                prompts.append(prompt)
                group_ids.append(f"{label}:{lineno}")
            group_of.append(group)
            outputs.append(output)
            rewards.append(_reward(row, reward_key, where))
            if finish_reason_key is not None:
                reasons.append(_reason(row, finish_reason_key, where))
        if not outputs:
            raise DataError(f"{file}: the file has no lines; expected one JSON object per response")
        groups = np.asarray(group_of, dtype=np.int64)
        row_ids.extend(group_ids[g] for g in group_of)
        response_len.append(count_tokens(tokenizer, outputs))
        prompt_len.append(count_tokens(tokenizer, prompts)[groups])
        sample_index.append(_shuffled_ranks(groups, len(prompts), rng))
    canon = {"prompt_id": pa.array(row_ids, pa.string()),
             "sample_index": pa.array(np.concatenate(sample_index)),
             "prompt_length": pa.array(np.concatenate(prompt_len)),
             "response_length": pa.array(np.concatenate(response_len)),
             "reward": pa.array(rewards, pa.float64())}
    if finish_reason_key is not None:
        canon["finish_reason"] = pa.array(reasons, pa.string())
    source = str(files[0]) if len(files) == 1 else str(path)
    return trace_from_trajectories(pa.table(canon), source=source)


def _shuffled_ranks(groups: np.ndarray, num_groups: int, rng: np.random.Generator) -> np.ndarray:
    """Each line's sample number within its group, in a random order of the group's lines (not the file's: verl's
    balance_batch sorts lines by length, so the first would be a short one, not a random one)."""
    keys = rng.random(groups.size)
    order = np.lexsort((keys, groups))               # by group, then by key
    starts = np.zeros(num_groups, dtype=np.int64)
    np.cumsum(np.bincount(groups, minlength=num_groups)[:-1], out=starts[1:])
    rank = np.empty(groups.size, dtype=np.int64)
    rank[order] = np.arange(groups.size) - starts[groups[order]]
    return rank


def _text(row: dict, key: str, where: str) -> str:
    if key not in row:
        what = "the response text" if key == "output" else "the prompt text"
        raise DataError(f"{where}: no {key!r} ({what}); a line of verl's dump has {', '.join(VERL_DUMP_KEYS)}")
    value = row[key]
    if not isinstance(value, str):
        raise DataError(f"{where}: {key!r} is {short_repr(value)}; expected text")
    return value


def _step(row: dict, where: str) -> int:
    value = row.get("step")
    if type(value) is not int:
        raise DataError(f"{where}: 'step' is {short_repr(value)}; expected the training step (a whole number)")
    return value


def _reward(row: dict, key: str, where: str) -> float | None:
    if key not in row:
        raise DataError(f"{where}: no {key!r} (the reward, --reward-column); keys: {', '.join(row)}")
    value = row[key]
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise DataError(f"{where}: {key!r} is {short_repr(value)}; expected a finite number (the reward) or null")
    return float(value)


def _reason(row: dict, key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        raise DataError(f"{where}: {key!r} (--finish-reason-column) is {short_repr(value)}; expected a string such "
                        f"as 'stop' or 'length'")
    return value
