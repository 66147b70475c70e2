"""A length trace from slime's rollout dumps: what ``--save-debug-rollout-data PATH_TEMPLATE`` writes (read in
THUDM/slime at 624b824: ``save_debug_rollout_data`` in slime/observability/rollout_data_utils.py, ``Sample.to_dict``
in slime/utils/types.py), one ``torch.save`` file per rollout, ``PATH_TEMPLATE.format(rollout_id=...)``
(``--dump-details DIR`` sets it to ``DIR/rollout_data/{rollout_id}.pt``)::

    {"rollout_id": 3, "samples": [sample.to_dict(), ...]}

Each sample is the ``Sample`` dataclass's fields as a dict: ``group_index``, ``index``, ``prompt``, ``tokens`` (the
prompt's token ids then the response's), ``response``, ``response_length`` (the response's tokens, counted as
generated; a multi-turn sample's include its tools' tokens, ``loss_mask`` 0), ``reward`` (a number, a dict when
slime's ``--reward-key`` picks from it, or None), ``status`` (``"completed"``, ``"truncated"``, ``"aborted"``,
``"failed"``, ``"pending"``), ``metadata``, ``rollout_log_probs`` ... The samples are the rollout's groups one after
another, each group's n samples in order. An evaluation writes ``eval_{rollout_id}`` in place of the id, its
datasets' samples one after another. So:

- a group is the samples of one ``group_index`` within one file (slime numbers groups across the run), in order of
  its first sample; where a sample has none (evaluations), consecutive samples of one ``prompt``;
- lengths are exact: ``response_length``, and ``len(tokens) - response_length`` for ``prompt_len`` (the first
  sample's); no tokenizer;
- a multi-turn sample's turns from ``loss_mask`` (one 0 or 1 per response token; None or all 1: single-turn): each
  run of 1s is a turn the model sampled, the run of 0s after it the tokens its tools added; slime records only the
  sample's whole ``non_generation_time``, shared equally by the turns its tools answered;
- finish reasons from ``status`` (:data:`STATUS_REASONS`: ``truncated`` is ``length``);
- the reward is ``reward``; a dict reward's ``score`` (:data:`DICT_REWARD_KEY`, as slime's examples'
  ``--reward-key score``) or the key named;
- several files (a folder, a glob pattern) are one trace, in order of their ``rollout_id``; of a folder or pattern
  holding training and evaluation dumps, the evaluation ones (``eval_N`` in the name) are left out.

The files are read without running code from them (:func:`pdsr_sdk.traces.torch_file.load_torch_file`). Errors
name the file, the sample (``samples[i]``, from 0) and the key.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pdsr_sdk.errors import DataError
from pdsr_sdk.io.paths import resolve_inputs
from pdsr_sdk.traces.formats import detect_format, short_repr
from pdsr_sdk.traces.trace import LengthTrace, SampleTurns

#: slime's ``Sample.Status`` values and the finish reason each is here
STATUS_REASONS = {"completed": "stop", "truncated": "length", "aborted": "abort", "failed": "failed",
                  "pending": "pending"}
#: the key of a dict reward read when none is named
DICT_REWARD_KEY = "score"
_EVAL_NAME = re.compile(r"eval_\d+")
_LAYOUT = "slime's --save-debug-rollout-data writes {'rollout_id': N, 'samples': [Sample.to_dict(), ...]}"


def slime_dump_files(path: str | Path) -> list[Path]:
    """The ``.pt`` files of ``path``: the file itself, a folder's or a glob pattern's (the evaluation dumps left out
    when training dumps are beside them), in order of name (``2.pt`` before ``10.pt``)."""
    files = resolve_inputs(path, {".pt": "torch"}, what="slime rollout dump", order="step")
    training = [f for f in files if not _EVAL_NAME.search(f.name)]
    return training if len(files) > 1 and training else files


def is_slime_dump(path: str | Path) -> bool:
    """Whether ``path`` (a file, folder or pattern) is read as slime's dump: its first file is a ``torch.save`` file
    (its contents are checked when read), and a folder or pattern has no tables beside its ``.pt`` files."""
    from pdsr_sdk.io.tables import FORMATS

    try:
        resolve_inputs(path, {**FORMATS, ".pt": "torch"})   # a folder of tables and a stray .pt: the tables
        return detect_format(slime_dump_files(path)[0]) == "torch"
    except DataError:
        return False


@dataclass
class _Rollout:
    """One file's groups: ids and prompt lengths per group, the rest per sample, group after group."""

    rollout_id: object
    ids: list[str]
    prompt_lens: list[int]
    sizes: list[int]
    lengths: list[int]
    reasons: list[str]
    rewards: list[float]
    turns: list[list[tuple[int, int, float]] | None]


def read_slime_dump(path: str | Path, *, reward_key: str | None = None) -> LengthTrace:
    """Read slime's rollout dumps (a ``.pt`` file, a folder of them, or a glob pattern) into a trace.

    ``reward_key``: the key of a dict reward (slime's ``--reward-key``; none: ``score``); a number reward is the
    reward as it is, and naming a key for one is a DataError.
    """
    files = slime_dump_files(path)
    names = [f.name for f in files]
    labels = names if len(set(names)) == len(names) else [str(f) for f in files]
    rollouts = [_read_rollout(f, label, reward_key) for f, label in zip(files, labels, strict=True)]
    if all(type(r.rollout_id) is int for r in rollouts):
        rollouts.sort(key=lambda r: r.rollout_id)   # stable: files of one id stay in name order
    sizes = [s for r in rollouts for s in r.sizes]
    rewards = np.asarray([x for r in rollouts for x in r.rewards], dtype=np.float64)
    turns = [t for r in rollouts for t in r.turns]
    return LengthTrace(prompt_ids=[i for r in rollouts for i in r.ids],
                       prompt_lens=np.asarray([p for r in rollouts for p in r.prompt_lens], dtype=np.int64),
                       lengths=np.asarray([x for r in rollouts for x in r.lengths], dtype=np.int64),
                       offsets=np.r_[0, np.cumsum(sizes, dtype=np.int64)],
                       finish_reasons=np.asarray([x for r in rollouts for x in r.reasons], dtype=object),
                       rewards=None if np.isnan(rewards).all() else rewards,
                       source=str(files[0]) if len(files) == 1 else str(path),
                       turns=SampleTurns.from_lists(turns) if any(t is not None for t in turns) else None)


def _read_rollout(file: Path, label: str, reward_key: str | None) -> _Rollout:
    from pdsr_sdk.traces.torch_file import load_torch_file

    data = load_torch_file(file)
    if not isinstance(data, dict):
        raise DataError(f"{file}: holds {type(data).__name__}, not a dict; {_LAYOUT}")
    if "samples" not in data:
        raise DataError(f"{file}: no 'samples' key (keys: {', '.join(map(repr, data)) or 'none'}); {_LAYOUT}")
    samples = data["samples"]
    if not isinstance(samples, list):
        raise DataError(f"{file}: 'samples' is {type(samples).__name__}, not a list; {_LAYOUT}")
    if not samples:
        raise DataError(f"{file}: 'samples' is empty; nothing to read")
    for i, sample in enumerate(samples):
        if not isinstance(sample, dict):
            raise DataError(f"{file}: samples[{i}] is {short_repr(sample)}, not a dict (Sample.to_dict())")
    ids = _groups(samples, file, label)
    members: dict[str, list[int]] = {}
    for i, gid in enumerate(ids):
        members.setdefault(gid, []).append(i)
    out = _Rollout(data.get("rollout_id"), list(members), [], [], [], [], [], [])
    for gid, rows in members.items():
        for i in rows:
            where = f"{file}: samples[{i}]"
            sample = samples[i]
            length = _response_length(sample, where)
            prompt_len = _prompt_length(sample, length, where)   # each checked; the group's is its first's
            if i == rows[0]:
                out.prompt_lens.append(prompt_len)
            out.lengths.append(length)
            out.reasons.append(_reason(sample, where))
            out.rewards.append(_reward(sample, reward_key, where))
            out.turns.append(_turns(sample, length, where))
        out.sizes.append(len(rows))
    return out


def _groups(samples: list[dict], file: Path, label: str) -> list[str]:
    """Each sample's group id: ``{file}:g{group_index}`` when every sample has a group_index, else ``{file}:{i}``,
    ``i`` the first sample of its run of one prompt."""
    if all(type(s.get("group_index")) is int for s in samples):
        ids = [f"{label}:g{s['group_index']}" for s in samples]
    else:
        ids, start = [], 0
        for i, sample in enumerate(samples):
            if "prompt" not in sample:
                raise DataError(f"{file}: samples[{i}]: no 'group_index' nor 'prompt' to group it by; "
                                f"keys: {', '.join(map(str, sample))}")
            if i and sample["prompt"] != samples[i - 1]["prompt"]:
                start = i
            ids.append(f"{label}:{start}")
    return ids


def _response_length(sample: dict, where: str) -> int:
    if "response_length" not in sample:
        raise DataError(f"{where}: no 'response_length' (the response's token count); "
                        f"keys: {', '.join(map(str, sample))}")
    value = sample["response_length"]
    if type(value) is not int:
        raise DataError(f"{where}: 'response_length' is {short_repr(value)}; expected a whole number of tokens")
    if value < 0:
        raise DataError(f"{where}: 'response_length' is {value}; a token count is >= 0")
    return value


def _prompt_length(sample: dict, response_length: int, where: str) -> int:
    if "tokens" not in sample:
        raise DataError(f"{where}: no 'tokens' (the prompt's token ids, then the response's); "
                        f"keys: {', '.join(map(str, sample))}")
    tokens = sample["tokens"]
    shape = getattr(tokens, "shape", None)
    if isinstance(tokens, list | tuple):
        count = len(tokens)
    elif shape is not None and len(shape) == 1:
        count = int(shape[0])
    else:
        raise DataError(f"{where}: 'tokens' is {short_repr(tokens)}; expected a list of token ids")
    if count < response_length:
        raise DataError(f"{where}: 'tokens' holds {count} token ids, fewer than 'response_length' "
                        f"{response_length}; slime's tokens are the prompt's then the response's")
    return count - response_length


def _reason(sample: dict, where: str) -> str:
    value = sample.get("status")
    if value not in STATUS_REASONS:
        raise DataError(f"{where}: 'status' is {short_repr(value)}; expected one of slime's Sample.Status values: "
                        f"{', '.join(map(repr, STATUS_REASONS))}")
    return STATUS_REASONS[value]


def _reward(sample: dict, key: str | None, where: str) -> float:
    """The reward, NaN for none."""
    if "reward" not in sample:
        raise DataError(f"{where}: no 'reward'; keys: {', '.join(map(str, sample))}")
    value, named = sample["reward"], "'reward'"
    if isinstance(value, dict):
        used = key or DICT_REWARD_KEY
        if used not in value:
            hint = ("" if key else "; name the reward's key: pdsr trace convert FILE --reward-column KEY "
                                   "--out trace.jsonl (slime's --reward-key)")
            raise DataError(f"{where}: 'reward' is a dict without {used!r} (keys: "
                            f"{', '.join(map(repr, value)) or 'none'}){hint}")
        value, named = value[used], f"'reward'[{used!r}]"
    elif key is not None and value is not None:
        raise DataError(f"{where}: 'reward' is {short_repr(value)}, not a dict: no key {key!r} to read "
                        f"(--reward-column names a key of a dict reward)")
    if value is None:
        return math.nan
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise DataError(f"{where}: {named} is {short_repr(value)}; expected a finite number (the reward) or None")
    return float(value)


def _turns(sample: dict, response_length: int, where: str) -> list[tuple[int, int, float]] | None:
    """A multi-turn sample's ``(sampled, tool tokens, tool seconds)`` per turn from its ``loss_mask``; None for a
    single-turn one (no mask, or every token sampled)."""
    mask = sample.get("loss_mask")
    if mask is None:
        return None
    if hasattr(mask, "tolist") and not isinstance(mask, list | tuple):
        mask = mask.tolist()   # a tensor torch read (values); a shape alone has no tolist
    if not isinstance(mask, list | tuple) or any(type(v) is not int or v not in (0, 1) for v in mask):
        raise DataError(f"{where}: 'loss_mask' is {short_repr(mask)}; expected a list of 0 and 1, one per response "
                        f"token (0: a tool's)")
    if len(mask) != response_length:
        raise DataError(f"{where}: 'loss_mask' has {len(mask)} entries, not one per response token "
                        f"('response_length' {response_length})")
    if all(mask):
        return None
    if mask[0] == 0:
        raise DataError(f"{where}: 'loss_mask' starts with 0: the response starts with a tool's tokens, before the "
                        f"model sampled any; a turn starts with sampled tokens")
    runs: list[list[int]] = []   # [sampled, tool tokens] per turn: a turn starts where a 1 follows a 0
    prev = 0
    for v in mask:
        if v and not prev:
            runs.append([0, 0])
        runs[-1][0 if v else 1] += 1
        prev = v
    tool_s = sample.get("non_generation_time") or 0.0
    if isinstance(tool_s, bool) or not isinstance(tool_s, int | float) or not math.isfinite(tool_s) or tool_s < 0:
        raise DataError(f"{where}: 'non_generation_time' is {short_repr(tool_s)}; expected seconds, >= 0")
    answered = sum(1 for _, tools in runs if tools)
    return [(sampled, tools, tool_s / answered if tools else 0.0) for sampled, tools in runs]
