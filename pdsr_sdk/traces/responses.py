"""A length trace from your own rollout log: a table with one row per response (verl, OpenRLHF or vLLM dumps, an
OpenAI-style completions log), in Parquet, Arrow IPC, JSONL or CSV/TSV, its columns named by the caller or found
under their usual names.

Columns (``RESPONSE_COLUMNS``: each role's flag of ``pdsr trace convert`` and the names looked for, in order, when
none is given; a name may be a dotted path into struct columns, a number in it picks a list's item):

- prompt id (``--id-column``; ``prompt_id``, ``uid``): a string or integer; rows with the same id are one group.
- response length (``--length-column``; ``response_length``, ``completion_tokens``, ``usage.completion_tokens``,
  ``response_ids``): a whole number of tokens >= 0 (a float column of whole numbers is read too), or a list of
  token ids, whose count is the length, or the response's text, its tokens counted with the ``tokenizer`` given
  (``--tokenizer DIR``; :func:`pdsr_sdk.traces.tokens.count_tokens`; without one, text is an error).
- prompt length (``--prompt-length-column``; ``prompt_length``, ``prompt_len``, ``prompt_tokens``,
  ``usage.prompt_tokens``): whole numbers, or the prompt's text (counted as a response's), the same for every row of
  a prompt; none found: 0.
- sample index (``--sample-index-column``; ``sample_index``): orders the samples of a prompt (distinct numbers; the
  smallest is sample 0, the probe); none found: the rows' order in the file (a warning when far more prompts than
  chance have their shortest response first: a log written as responses finished).
- reward (``--reward-column``; ``reward``, ``score``): numbers, empty (null) for a response without one.
- finish reason (``--finish-reason-column``; ``finish_reason``, ``choices.0.finish_reason``): strings.

Groups appear in the order of their first row and may differ in size (a ragged trace). ``submit_time_s`` and
``finish_time_s`` (durations) and ``turns`` are read as in a trajectories file when the table has them. Errors
name the file, the row (counted from 0, in the file's order) and the column.

:func:`read_responses_trace` reads the log's schema, then only these columns, a block of rows at a time; a length
column of token ids is kept as the counts (:mod:`pdsr_sdk.traces.log_columns`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pdsr_sdk.errors import DataError
from pdsr_sdk.traces.formats import detect_format, short_repr
from pdsr_sdk.traces.trace import LengthTrace

#: role -> (flag of ``pdsr trace convert``, column names looked for when none is given, in order)
RESPONSE_COLUMNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "id": ("--id-column", ("prompt_id", "uid")),
    "length": ("--length-column", ("response_length", "completion_tokens", "usage.completion_tokens",
                                   "response_ids")),
    "prompt_length": ("--prompt-length-column", ("prompt_length", "prompt_len", "prompt_tokens",
                                                 "usage.prompt_tokens")),
    "sample_index": ("--sample-index-column", ("sample_index",)),
    "reward": ("--reward-column", ("reward", "score")),
    "finish_reason": ("--finish-reason-column", ("finish_reason", "choices.0.finish_reason")),
}

#: the readers of :func:`pdsr_sdk.io.tables.read_table` a content-detected trace format maps to
_TABLE_KIND = {"parquet": "parquet", "arrow_file": "arrow", "arrow_stream": "arrow", "jsonl": "jsonl"}


def read_responses_trace(path: str | Path, *, id_column: str | None = None, length_column: str | None = None,
                         prompt_length_column: str | None = None, sample_index_column: str | None = None,
                         reward_column: str | None = None, finish_reason_column: str | None = None,
                         tokenizer=None) -> LengthTrace:
    """Read a table of one row per response (Parquet, Arrow IPC, JSONL or CSV/TSV, or a folder or glob pattern of
    such shards) and group it into a trace.

    Each ``*_column`` names the column of that role (see the module's docstring); None looks for its usual names.
    ``tokenizer`` (a Hugging Face tokenizer) counts a length or prompt length column of text.
    """
    from pdsr_sdk.io.paths import user_path
    from pdsr_sdk.io.tables import FORMATS
    from pdsr_sdk.traces.log_columns import read_log_columns

    path = user_path(path)
    if path.is_file():
        with path.open("rb") as fh:
            if not fh.read(4096).strip():
                raise DataError(f"{path}: the file is empty; expected a rollout log (one row per response) or a "
                                f"length trace")
    try:
        kind = _TABLE_KIND.get(detect_format(path))   # None: a torch.save file, read by its name (an error)
    except DataError:
        kind = None   # CSV/TSV, or what read_table makes of the name
    if kind == "jsonl" and FORMATS.get(path.suffix.lower()) not in (None, "jsonl"):
        kind = None   # a .csv that starts with "{": read as its name says
    given = {"id": id_column, "length": length_column, "prompt_length": prompt_length_column,
             "sample_index": sample_index_column, "reward": reward_column, "finish_reason": finish_reason_column}
    table, schema, rows = read_log_columns(path, kind, {role: (name,) if name is not None else RESPONSE_COLUMNS[role][1]
                                                  for role, name in given.items()}, _as_in_trajectories,
                                           extra_names=_IN_TRAJECTORIES)
    return _trace(table, schema, rows, str(path), given, tokenizer)


def trace_from_responses(table, *, source: str | None = None, id_column: str | None = None,
                         length_column: str | None = None, prompt_length_column: str | None = None,
                         sample_index_column: str | None = None, reward_column: str | None = None,
                         finish_reason_column: str | None = None, tokenizer=None) -> LengthTrace:
    """Group a pyarrow table of one row per response into a ``LengthTrace`` (columns as in the module's docstring);
    ``tokenizer`` counts a length or prompt length column of text."""
    given = {"id": id_column, "length": length_column, "prompt_length": prompt_length_column,
             "sample_index": sample_index_column, "reward": reward_column, "finish_reason": finish_reason_column}
    return _trace(table, table.schema, table.num_rows, source, given, tokenizer)


def _trace(table, schema, rows: int, source: str | None, given: dict[str, str | None], tokenizer) -> LengthTrace:
    """The trace of ``table``, the columns read of a log of ``rows`` rows whose columns are ``schema`` (what errors
    list); ``given``: role -> the column a flag named, or None."""
    import pyarrow as pa

    from pdsr_sdk.traces.log_columns import LogColumns
    from pdsr_sdk.traces.trajectories import trace_from_trajectories

    where = source or "responses"
    if rows == 0:
        raise DataError(f"{where}: the table has no rows; expected one row per response")
    cols = LogColumns(table, Path(where), schema)
    found: dict[str, tuple[str, object]] = {}   # role -> (column name, column)
    for role, name in given.items():
        flag, defaults = RESPONSE_COLUMNS[role]
        if name is None:
            name = next((c for c in defaults if cols.has(c)), None)
            if name is None:
                if role in ("id", "length"):
                    what = "prompt id" if role == "id" else "response length"
                    raise DataError(f"{where}: no {what} column; name it with {flag} (looked for "
                                    f"{', '.join(defaults)}); columns: {cols.listing()}")
                continue
        found[role] = (name, cols.get(name, None, flag))

    id_name, id_col = found["id"]
    ids = _ids(id_col, id_name, where)
    encoded = ids.dictionary_encode()
    code = np.asarray(encoded.indices, dtype=np.int64)
    len_name, len_col = found["length"]
    lengths = _lengths(len_col, len_name, where, "length", tokenizer)
    canon = {"prompt_id": ids, "response_length": lengths}
    labels = {"response_length": len_name}
    if "prompt_length" in found:
        labels["prompt_length"] = found["prompt_length"][0]
        canon["prompt_length"] = _lengths(found["prompt_length"][1], labels["prompt_length"], where, "prompt_length",
                                          tokenizer)
    else:
        canon["prompt_length"] = np.zeros(rows, dtype=np.int64)
    if "sample_index" in found:
        name, col = found["sample_index"]
        canon["sample_index"] = _rank(code, _whole(col, name, where), encoded.dictionary, name, where)
        labels["sample_index"] = name
    else:
        canon["sample_index"] = _rank(code, None, encoded.dictionary, "", where)
        _warn_if_completion_ordered(code, lengths, where)
    if "reward" in found:
        name, col = found["reward"]
        rewards = _numbers(col, name, where)
        inf = np.isinf(rewards)
        if inf.any():
            raise DataError(f"{where}: column {name!r} row {int(np.argmax(inf))} is {rewards[inf][0]}; expected a "
                            f"finite reward, or an empty value for a response without one")
        canon["reward"] = pa.array(rewards, mask=np.isnan(rewards))
    if "finish_reason" in found:
        canon["finish_reason"] = _strings(found["finish_reason"][1], found["finish_reason"][0], where)
    for field in table.schema:
        if _as_in_trajectories(field):
            canon[field.name] = table[field.name]
    return trace_from_trajectories(pa.table(canon), source=source, labels=labels)


#: the columns _as_in_trajectories may read
_IN_TRAJECTORIES = ("submit_time_s", "finish_time_s", "turns")


def _as_in_trajectories(field) -> bool:
    """Whether a column is read as a trajectories file's: ``submit_time_s`` and ``finish_time_s`` of numbers
    (durations), ``turns`` of pdsr rollout's spans (another tool's "turns", chat messages, is not read)."""
    import pyarrow as pa

    kind = field.type
    if field.name in ("submit_time_s", "finish_time_s"):
        return _numeric_type(kind)
    return (field.name == "turns" and pa.types.is_list(kind) and pa.types.is_struct(kind.value_type)
            and {"role", "num_tokens"} <= {f.name for f in kind.value_type})


def _fail(where: str, name: str, row: int, what: str):
    raise DataError(f"{where}: column {name!r} row {row} {what}")


def _numeric_type(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(kind) or pa.types.is_floating(kind)


def _ids(column, name: str, where: str):
    """Prompt ids as a string array; a null id is an error naming its row."""
    import pyarrow as pa

    kind = column.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)):
        raise DataError(f"{where}: column {name!r} (--id-column) is {kind}; expected a string or integer prompt id")
    column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if column.null_count:
        _fail(where, name, int(np.flatnonzero(np.asarray(column.is_null()))[0]), "is empty (null); every response "
              "needs its prompt's id")
    return column.cast(pa.string())


def _numbers(column, name: str, where: str, hint: str = "") -> np.ndarray:
    """float64 values of a numeric or text (CSV) column, NaN where null; ``hint`` ends a bad value's error."""
    import pyarrow as pa

    kind = column.type
    if _numeric_type(kind) or pa.types.is_boolean(kind) or pa.types.is_null(kind):
        return np.asarray(column.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(f"{where}: column {name!r} is {kind}; expected numbers")
    out = np.empty(len(column), dtype=np.float64)
    for i, text in enumerate(column.to_pylist()):
        if text is None or not text.strip():
            out[i] = np.nan
            continue
        try:
            out[i] = float(text)
        except ValueError:
            _fail(where, name, i, f"is {short_repr(text)}; expected a number{hint}")
    return out


def _lengths(column, name: str, where: str, role: str, tokenizer) -> np.ndarray:
    """Token counts of a length (``role`` "length": token ids counted too) or prompt length column; a column of text
    (a value that is no number) is counted with ``tokenizer``, and without one is an error naming the flag."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        texts = column.to_pylist()
        row = next((i for i, t in enumerate(texts) if t is not None and t.strip() and not _is_number(t)), None)
        if row is not None:
            if tokenizer is None:
                _fail(where, name, row, f"is text ({short_repr(texts[row])}), not a token count; count its tokens "
                      f"with --tokenizer DIR (the policy model's folder; tokenizer= in Python), or name a column of "
                      f"token counts{' or token ids' if role == 'length' else ''} with {RESPONSE_COLUMNS[role][0]}")
            if None in texts:
                _fail(where, name, texts.index(None), "is empty (null); expected text")
            from pdsr_sdk.traces.tokens import count_tokens

            return count_tokens(tokenizer, texts)
    return _whole(column, name, where, token_lists=role == "length")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _whole(column, name: str, where: str, *, token_lists: bool = False) -> np.ndarray:
    """int64 whole numbers >= 0 of a column (numbers, whole floats, or text); with ``token_lists`` a list column
    (token ids) gives each row's count. Null, fractional and negative values are errors naming the row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        if not token_lists:
            raise DataError(f"{where}: column {name!r} is {kind}; expected whole numbers")
        if not (pa.types.is_integer(kind.value_type) or pa.types.is_null(kind.value_type)):
            raise DataError(f"{where}: column {name!r} is {kind}; a list column counts as a length only when it "
                            f"holds token ids (integers)")
        values = np.asarray(pc.list_value_length(column).cast(pa.float64()).to_numpy(zero_copy_only=False))
    elif pa.types.is_boolean(kind):
        raise DataError(f"{where}: column {name!r} is {kind}; expected whole numbers")
    else:
        values = _numbers(column, name, where)
    if np.isnan(values).any():
        _fail(where, name, int(np.argmax(np.isnan(values))), "is empty (null); expected a whole number")
    bad = ~(np.isfinite(values) & (values == np.round(values)) & (np.abs(values) < 2.0**63))
    if bad.any():
        k = int(np.argmax(bad))
        _fail(where, name, k, f"is {float(values[k])!r}; expected a whole number of tokens")
    if (values < 0).any():
        k = int(np.argmax(values < 0))
        _fail(where, name, k, f"is negative ({int(values[k])}); expected a token count >= 0")
    return values.astype(np.int64)


#: the chance that a log whose rows are in random order within each prompt gets the completion-order warning
COMPLETION_ORDER_FALSE_ALARM = 1e-6


def _warn_if_completion_ordered(code: np.ndarray, lengths: np.ndarray, where: str) -> None:
    """Warn when far more prompts than chance have their shortest response in their first row, the probe when no
    sample-index column orders them: a log written as responses finished, whose probes would all be short.

    In random order a prompt's first row is its shortest with probability p = (rows at its minimum) / n, each prompt
    independently; the count of such prompts exceeds its mean by t with probability at most exp(-t^2 / (2 (var +
    t / 3))) (Bernstein), so the warning comes on a log in random order with probability at most
    :data:`COMPLETION_ORDER_FALSE_ALARM`."""
    import warnings

    from pdsr_sdk.errors import PdsrWarning

    order = np.lexsort((np.arange(len(code)), code))   # by prompt, each in the file's order
    starts = np.flatnonzero(np.r_[True, code[order][1:] != code[order][:-1]])
    sorted_lengths = lengths[order]
    low = np.minimum.reduceat(sorted_lengths, starts)
    sizes = np.diff(np.r_[starts, len(code)])
    at_low = np.add.reduceat((sorted_lengths == np.repeat(low, sizes)).astype(np.int64), starts)
    ranked = at_low < sizes   # prompts whose lengths are not all equal (a prompt of one row has all equal)
    if not ranked.any():
        return
    first_low = (sorted_lengths[starts] == low)[ranked]
    p = (at_low / sizes)[ranked]
    count, mean, var = int(first_low.sum()), float(p.sum()), float((p * (1 - p)).sum())
    bound = -np.log(COMPLETION_ORDER_FALSE_ALARM)
    t = bound / 3 + np.sqrt((bound / 3) ** 2 + 2 * bound * var)   # solves t^2 = 2 bound (var + t / 3)
    if count - mean < t:
        return
    prompts = int(ranked.sum())
    warnings.warn(f"{where}: in {count} of {prompts} prompts ({count / prompts:.0%}) the first row is the prompt's "
                  f"shortest response, against {mean / prompts:.1%} expected if each prompt's rows were in random "
                  f"order (1/n of n samples): the log looks written as responses finished. Without a sample-index "
                  f"column a prompt's first row is its sample 0, the probe, so the probes would be the short "
                  f"responses. Name the column that numbers each prompt's samples (--sample-index-column; "
                  f"sample_index_column= in Python), or shuffle each prompt's rows. (Rows in random order get this "
                  f"warning with probability below {COMPLETION_ORDER_FALSE_ALARM:g}.)", PdsrWarning, stacklevel=4)


def _strings(column, name: str, where: str):
    import pyarrow as pa

    kind = column.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(f"{where}: column {name!r} is {kind}; expected strings such as 'stop' or 'length'")
    if column.null_count:
        _fail(where, name, int(np.flatnonzero(np.asarray(column.is_null()))[0]), "is empty (null); expected a "
              "string such as 'stop' or 'length'")
    return column


def _rank(code: np.ndarray, index: np.ndarray | None, group_ids, name: str, where: str) -> np.ndarray:
    """Each row's sample number within its prompt: by ``index`` (distinct within a prompt), else by row order."""
    rows = np.arange(len(code), dtype=np.int64)
    order = np.lexsort((rows, code)) if index is None else np.lexsort((index, code))
    if index is not None:
        same = (code[order][1:] == code[order][:-1]) & (index[order][1:] == index[order][:-1])
        if same.any():
            k = int(np.argmax(same))
            a, b = sorted((int(order[k]), int(order[k + 1])))
            raise DataError(f"{where}: rows {a} and {b} of prompt {group_ids[int(code[a])].as_py()!r} have the same "
                            f"{name} {int(index[a])}; expected distinct values within a prompt")
    counts = np.bincount(code)
    starts = np.repeat(np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
    rank = np.empty(len(code), dtype=np.int64)
    rank[order] = np.arange(len(code), dtype=np.int64) - starts
    return rank


def looks_like_responses(row: dict) -> bool:
    """Whether a JSON object has a response length under one of its usual names (``usage.completion_tokens``
    looked up in nested objects) and no trace line's ``lengths``: a line of a log of one row per response."""
    if "lengths" in row:
        return False
    for name in RESPONSE_COLUMNS["length"][1]:
        value: object = row
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            return True
    return False
