"""Prompts for a rollout: read Parquet/JSONL/CSV, apply the chat template, tokenize."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from pdsr_sdk.agent.render import message_text
from pdsr_sdk.dispatch.types import Group, Sample
from pdsr_sdk.errors import ConfigValueError, DataError
from pdsr_sdk.io.columns import TableColumns
from pdsr_sdk.io.paths import user_path
from pdsr_sdk.io.tables import read_table
from pdsr_sdk.progress import ProgressFactory
from pdsr_sdk.rollout.reward import scalar_truth
from pdsr_sdk.rollout.tokenizer import load_tokenizer as load_tokenizer   # its home until it had one of its own

#: looked for in this order when no column is named (verl: prompt as chat messages, reward_model.ground_truth;
#: OpenRLHF: input or context_messages, label); a prompt column of chat messages is used as messages
PROMPT_COLUMNS = ("prompt", "problem", "question", "input", "context_messages")
ID_COLUMNS = ("id", "unique_id", "prompt_id")
TRUTH_COLUMNS = ("answer", "ground_truth", "reward_model.ground_truth", "label")
#: a struct's fields that a ground truth refused for a text reward is likely meant to be (its hint names one)
ANSWER_FIELDS = ("ground_truth", "answer", "label", "target")
#: row columns kept for the reward (verl's compute_score(data_source, solution_str, ground_truth, extra_info))
REWARD_INFO_COLUMNS = ("data_source", "extra_info")
#: verl's multimodal columns (its data.image_key and data.video_key): engines here get text, so a row with them is
#: refused rather than rolled out without what its prompt refers to
MEDIA_COLUMNS = ("images", "videos")
#: data of this many rows or more shows a progress bar while it is tokenized: every prompt is tokenized before the
#: engines start, at about 0.45 ms a prompt on 2 shared cores (200,000 prompts: 89 s), silent until now
TOKENIZE_BAR_ROWS = 4096


@dataclass
class PromptRecord:
    prompt_id: str
    text: str                     # after the chat template
    token_ids: list[int]
    #: the reference answer the reward gets: text (a string or number column's value, as a string), or a list or
    #: struct column's value as pyarrow gives it (``.as_py()``: a dict, a list), e.g. Search-R1's
    #: ``{"target": [...]}``; any value from Python
    ground_truth: Any = None
    target_lengths: list[int] | None = None
    target_finish_reasons: list[str] | None = None
    row: int | None = None        # row of the data file, for messages
    #: the row's REWARD_INFO_COLUMNS that it has (verl's data_source and extra_info), passed to the reward
    reward_info: dict[str, Any] | None = None
    #: the chat messages the prompt was rendered from (system prompt and instruction added), when it went
    #: through the chat template: an agent renders what it appends after them
    messages: list[dict[str, Any]] | None = None


def load_prompts(cfg, tokenizer, *, path: str | Path, n: int | None = None,
                 progress: ProgressFactory | None = None, reward: str | None = "auto") -> list[PromptRecord]:
    """Read prompts as configured by ``cfg`` (a :class:`DataConfig`) and tokenize them. Column names may be
    dotted paths into struct columns (``reward_model.ground_truth``). ``progress``: a factory whose bar counts the
    prompts tokenized, opened for data of :data:`TOKENIZE_BAR_ROWS` rows or more. ``reward``: the reward the
    ground truths are for (``config.reward``; None: none, or a function given in Python): a built-in that compares
    text (``auto``, ``math_verify``, ``math_boxed``) makes a list or struct ground truth a DataError naming its
    row; any other takes the value as it is (:attr:`PromptRecord.ground_truth`)."""
    path = user_path(path)
    table = read_table(path, what="prompt", setting="data.path (--data)")
    if table.num_rows == 0:
        raise DataError(f"{path}: the prompt file is empty")
    if cfg.limit:
        table = table.slice(0, cfg.limit)
    cols = TableColumns(table, path)
    if cfg.messages_column:
        messages_col, prompt_col = cfg.messages_column, None
        cols.get(messages_col, "data.messages_column", "--messages-column")
    else:
        prompt_col = cfg.prompt_column or next((c for c in PROMPT_COLUMNS if cols.has(c)), None)
        if prompt_col is None:
            raise DataError(f"{path}: no prompt column; set data.prompt_column (--prompt-column) to a text column "
                            f"or data.messages_column (--messages-column) to a chat-messages column; columns: "
                            f"{cols.listing()}; tried {', '.join(PROMPT_COLUMNS)}")
        messages_col = None
        if _is_list(cols.get(prompt_col, "data.prompt_column", "--prompt-column").type):
            messages_col, prompt_col = prompt_col, None   # verl/OpenRLHF: the prompt is a list of chat messages
        else:
            cols.expect(prompt_col, _is_text, "text", "data.prompt_column", "--prompt-column")
    id_col = cfg.id_column or next((c for c in ID_COLUMNS if cols.has(c)), None)
    truth_col = cfg.ground_truth_column or next((c for c in TRUTH_COLUMNS if cols.has(c)), None)
    if id_col:
        cols.expect(id_col, lambda t: _is_text(t) or pa.types.is_integer(t) or pa.types.is_null(t),
                    "a string or integer id",
                    "data.id_column", "--id-column")
    if truth_col:
        cols.expect(truth_col, lambda t: _is_scalar(t) or pa.types.is_nested(t), "a string, number, list or struct",
                    "data.ground_truth_column", "--ground-truth-column")
    if cfg.target_lengths_column:
        cols.expect(cfg.target_lengths_column, _is_list, "a list of positive integers", "data.target_lengths_column",
                    "--target-lengths-column")
    for media in (c for c in MEDIA_COLUMNS if c in table.column_names):
        row = next((i for i, v in enumerate(cols.values(media)) if v not in (None, [], "", b"")), None)
        if row is not None:
            raise DataError(f"{path}: row {row}: column {media!r} holds {media} (verl's multimodal data); pdsr "
                            f"rollout generates from text alone, so the model would never see them. Drop the "
                            f"column to roll out the prompts' text without them")
    values = {c: cols.values(c) for c in (prompt_col, messages_col, id_col, truth_col, cfg.target_lengths_column)
              if c}
    reasons = cols.values("finish_reasons") if cfg.target_lengths_column and cols.has("finish_reasons") else None
    info_values = {c: cols.values(c) for c in REWARD_INFO_COLUMNS if c in table.column_names}
    truth_is_text = not truth_col or _is_scalar(cols.get(truth_col, None, "--ground-truth-column").type)
    if not truth_is_text:
        _check_truth_reward(cols, truth_col, values[truth_col], reward)

    template = cfg.apply_chat_template and getattr(tokenizer, "chat_template", None)
    records: list[PromptRecord] = []
    seen: dict[str, int] = {}
    bar = progress(desc="tokenizing", total=table.num_rows, unit="prompt") \
        if progress is not None and table.num_rows >= TOKENIZE_BAR_ROWS else None
    for i in range(table.num_rows):
        if bar is not None and i and i % 1024 == 0:   # not per prompt: a bar's update costs about what a prompt does
            bar.update(1024)
        where = f"{path}: row {i}"
        raw_id = values[id_col][i] if id_col else None
        pid = str(raw_id) if raw_id is not None else f"row-{i}"
        if pid in seen:
            raise DataError(f"{where}: duplicate prompt id {pid!r} (also row {seen[pid]})")
        seen[pid] = i
        if messages_col:
            messages = _messages(values[messages_col][i], where, messages_col)
        else:
            text = values[prompt_col][i]
            if not isinstance(text, str) or not text.strip():
                raise DataError(f"{where}: column {prompt_col!r} must be a non-empty string, got {text!r}")
            messages = [{"role": "user", "content": text}]
        prompt_text, ids = encode_messages(messages, cfg, tokenizer, template=template, where=where)
        if not ids:
            raise DataError(f"{where}: the prompt tokenizes to nothing")
        truth = values[truth_col][i] if truth_col else None
        if isinstance(truth, float) and not math.isfinite(truth):
            raise DataError(f"{where}: column {truth_col!r} is {truth}; expected a finite number or a string")
        if truth is not None and truth_is_text:
            truth = str(truth)   # a number column's too, as text: what the built-in math rewards compare
        targets = fr = None
        if cfg.target_lengths_column:
            targets = _lengths(values[cfg.target_lengths_column][i], where, cfg.target_lengths_column, n)
            got = reasons[i] if reasons is not None else None
            fr = [str(r) for r in got] if isinstance(got, list) and len(got) == len(targets) else None
        records.append(PromptRecord(pid, prompt_text, list(ids), truth, targets, fr, row=i,
                                    reward_info=reward_info({c: v[i] for c, v in info_values.items()}, cfg),
                                    messages=add_system_and_instruction(messages, cfg, where) if template else None))
    if bar is not None:
        bar.update(table.num_rows - (table.num_rows - 1) // 1024 * 1024)
        bar.close()
    return records


def reward_info(found: dict[str, Any], cfg) -> dict[str, Any] | None:
    """A row's reward columns (``found``), with ``cfg.data_source`` where the row has no data_source."""
    if cfg.data_source is not None and found.get("data_source") is None:
        found = {**found, "data_source": cfg.data_source}
    return found or None


def _check_truth_reward(cols: TableColumns, column: str, truths: list, reward: str | None) -> None:
    """A list or struct ground truth ``column`` (its values ``truths``) for a ``reward`` that compares text (a
    built-in): a DataError naming the first row that has one, the column, and what to do; else nothing."""
    from pdsr_sdk.rollout.reward import compares_text

    row = next((i for i, v in enumerate(truths) if v is not None), None)
    name = compares_text(reward)
    if row is None or name is None:
        return
    kind = cols.get(column, None, "--ground-truth-column").type
    hint = ""
    fields = [kind.field(i).name for i in range(kind.num_fields) if _is_scalar(kind.field(i).type)] \
        if pa.types.is_struct(kind) else []
    answer = next((f for f in fields if f in ANSWER_FIELDS), None)
    if answer:   # verl's whole reward_model column named, say: its text answer is likely what was meant
        hint = (f" (name one of its text fields ({', '.join(fields)}) with a dotted path, e.g. "
                f"--ground-truth-column {column}.{answer})")
    raise DataError(f"{cols.path}: row {row}: column {column!r} (data.ground_truth_column, --ground-truth-column) is "
                    f"{kind}, {truths[row]!r:.80}; the {name} reward compares the answer as text and needs a string "
                    f"or number ground truth{hint}, or give a reward that takes this value (--reward pkg.mod:fn: "
                    f"pdsr's fn(response_text, ground_truth, **info) or verl's compute_score)")


def _is_text(kind) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _is_list(kind) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def _is_scalar(kind) -> bool:
    return (_is_text(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_null(kind)
            or pa.types.is_boolean(kind))


def encode_messages(messages: list[dict], cfg, tokenizer, *, template=None,
                    where: str = "prompt") -> tuple[str, list[int]]:
    """Chat ``messages`` as the prompt text and token ids the engines get: :func:`add_system_and_instruction`,
    then the tokenizer's chat template (when ``cfg.apply_chat_template`` and it has one); else the contents
    joined by blank lines. ``cfg`` is a :class:`DataConfig`; ``where`` names the prompt in errors."""
    if template is None:
        template = cfg.apply_chat_template and getattr(tokenizer, "chat_template", None)
    messages = add_system_and_instruction(messages, cfg, where)
    if template:
        prompt_text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                    **cfg.chat_template_kwargs)
        ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    else:
        prompt_text = "\n\n".join(m["content"] for m in messages)
        ids = tokenizer(prompt_text)["input_ids"]
    return prompt_text, list(ids)


def add_system_and_instruction(messages: list[dict], cfg, where: str = "prompt") -> list[dict]:
    """``messages`` with ``cfg.system_prompt`` as a first system message and ``cfg.instruction``'s text
    (:data:`~pdsr_sdk.rollout.config.INSTRUCTIONS`) appended to the last user message, after a newline.
    A prompt that already starts with a system message while ``system_prompt`` is set, or that has no user
    message while ``instruction`` is set, is a DataError naming ``where`` (nothing is silently replaced)."""
    out = [dict(m) for m in messages]
    if getattr(cfg, "instruction", None):
        from pdsr_sdk.rollout.config import INSTRUCTIONS

        users = [i for i, m in enumerate(out) if m["role"] == "user"]
        if not users:
            raise DataError(f"{where}: data.instruction (--instruction) {cfg.instruction!r} is appended to the last "
                            f"user message, but the prompt has none (roles: {', '.join(m['role'] for m in out)})")
        last = out[users[-1]]
        last["content"] = f"{last['content'].rstrip()}\n{INSTRUCTIONS[cfg.instruction]}"
    if cfg.system_prompt:
        if out and out[0]["role"] == "system":
            raise DataError(f"{where}: the prompt already has a system message and data.system_prompt "
                            f"(--system-prompt) is set; drop one of them (pdsr does not replace either)")
        out.insert(0, {"role": "system", "content": cfg.system_prompt})
    return out


def prompt_records(prompts, cfg, tokenizer, *, id_prefix: str = "p", where: str = "prompts",
                   first: int = 0) -> list[PromptRecord]:
    """Prompts a trainer passes (:meth:`RolloutSession.step`) as records. Each item is a
    :class:`PromptRecord` (used as it is), a string (one user message), a list of chat messages
    (``{role, content}``), or a mapping with ``prompt`` (a string, or chat messages as in a verl row) or
    ``messages``, and optionally ``id`` / ``prompt_id``, ``ground_truth`` / ``answer`` (else verl's
    ``reward_model["ground_truth"]``), and ``data_source`` / ``extra_info`` (for the reward). Items without an id
    get ``f"{id_prefix}{i}"``, ``i`` counted from ``first`` (as are the items in messages). Ids must be unique."""
    records: list[PromptRecord] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(prompts, first):
        at = f"{where}[{i}]"
        if isinstance(item, PromptRecord):
            record = item
        else:
            pid, truth = None, None
            if isinstance(item, str):
                messages = [{"role": "user", "content": item}]
            elif isinstance(item, list) and item and all(isinstance(t, int) for t in item):
                raise DataError(f"{at}: a list of ints looks like token ids; give them as a PromptRecord(prompt_id, "
                                f"text, token_ids) (a list prompt is chat messages: {{role, content}} mappings)")
            elif isinstance(item, list):
                messages = _messages(item, at, "messages")
            elif isinstance(item, dict):
                pid = item.get("id", item.get("prompt_id"))
                verl = item["reward_model"] if isinstance(item.get("reward_model"), Mapping) else {}
                truth = item.get("ground_truth", item.get("answer", verl.get("ground_truth")))
                prompt = item.get("prompt")   # a verl row's: chat messages (a numpy array of them from pandas)
                prompt = prompt.tolist() if hasattr(prompt, "tolist") else prompt
                if "messages" in item:
                    messages = _messages(item["messages"], at, "messages")
                elif isinstance(prompt, list):
                    messages = _messages(prompt, at, "prompt")
                elif isinstance(prompt, str) and prompt.strip():
                    messages = [{"role": "user", "content": prompt}]
                else:
                    raise DataError(f"{at}: a prompt mapping needs a non-empty 'prompt' (a string or chat messages) "
                                    f"or 'messages'; got keys {sorted(item)}")
            else:
                raise DataError(f"{at}: a prompt is a string, a list of chat messages, a mapping with 'prompt' or "
                                f"'messages', or a PromptRecord; got {type(item).__name__}")
            if isinstance(item, str) and not item.strip():
                raise DataError(f"{at}: the prompt is empty")
            text, ids = encode_messages(messages, cfg, tokenizer, where=at)
            if not ids:
                raise DataError(f"{at}: the prompt tokenizes to nothing")
            info = reward_info({c: item[c] for c in REWARD_INFO_COLUMNS if isinstance(item, dict) and c in item}, cfg)
            templated = cfg.apply_chat_template and getattr(tokenizer, "chat_template", None)
            record = PromptRecord(str(pid) if pid is not None else f"{id_prefix}{i}", text, ids,
                                  truth_value(truth), reward_info=info,
                                  messages=add_system_and_instruction(messages, cfg, at) if templated else None)
        if record.prompt_id in seen:
            raise DataError(f"{at}: duplicate prompt id {record.prompt_id!r} (also item {seen[record.prompt_id]})")
        seen[record.prompt_id] = i
        records.append(record)
    return records


def truth_value(truth: Any) -> Any:
    """A ground truth given in Python (a prompt mapping's ``ground_truth`` / ``answer``) as a record keeps it: a
    string, number or numpy scalar as text (as a data file's string or number column is read); None, a dict, a
    list or any other value as it is, for a reward that takes it."""
    return str(truth) if scalar_truth(truth) else truth


def step_prompts(prompts: Any, count: int) -> list:
    """The prompts a (non-streaming) step takes: all of a list or tuple, else up to ``count`` from
    :func:`prompt_source`."""
    if isinstance(prompts, (list, tuple)):
        return list(prompts)
    return list(itertools.islice(prompt_source(prompts), count))


def prompt_source(prompts: Any) -> Iterator:
    """What ``session.step(prompts)`` was given, as an iterator of prompts: a list, tuple, iterator or other
    iterable of them; one prompt alone (a string, a mapping, a PromptRecord) is a list of one. Anything else is a
    DataError saying what prompts may be."""
    if isinstance(prompts, (str, Mapping, PromptRecord)):
        return iter([prompts])
    if isinstance(prompts, (bytes, bytearray)) or not isinstance(prompts, Iterable):
        raise DataError(f"step: prompts must be a list (or an iterator) of prompts, each a string, a list of chat "
                        f"messages, a mapping with 'prompt' or 'messages', or a PromptRecord; got "
                        f"{type(prompts).__name__}")
    return iter(prompts)


def group_size(n: Any, default: int) -> int:
    """A step's ``n`` (samples per prompt; None: ``default``, the config's ``sampling.n``): an int of at least 1,
    else a ConfigValueError naming it (0 is no "use the default")."""
    if n is None:
        return default
    if isinstance(n, bool) or not hasattr(n, "__index__") or n < 1:
        raise ConfigValueError(f"n (samples per prompt) must be an int >= 1, or None for config.sampling.n "
                               f"({default}); got {n!r}")
    return int(n)


def build_groups(records: list[PromptRecord], n: int, max_tokens: int) -> list[Group]:
    """A group of ``n`` samples per prompt record (in record order; ``position`` = index in the list).

    A record with ``target_lengths`` gets forced samples that generate exactly those lengths.
    """
    groups = []
    for i, r in enumerate(records):
        g = Group(prompt_id=r.prompt_id, prompt_token_ids=list(r.token_ids), prompt_text=r.text, n=n,
                  ground_truth=r.ground_truth, target_lengths=r.target_lengths,
                  target_finish_reasons=r.target_finish_reasons, position=i, reward_info=r.reward_info,
                  messages=r.messages)
        forced = r.target_lengths is not None
        g.samples = [Sample(group=g, index=k, forced=forced,
                            max_tokens=r.target_lengths[k] if forced else max_tokens) for k in range(n)]
        groups.append(g)
    return groups


def _messages(value: Any, where: str, column: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: column {column!r} must be a non-empty list of {{role, content}} messages")
    out = []
    for j, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise DataError(f"{where}: {column}[{j}] must be a mapping with string 'role' and 'content', got {m!r}")
        try:   # text parts joined as vLLM's server joins them; an image part is refused (engines here get text)
            content = message_text(m.get("content"), f"{column}[{j}]'s content")
        except ValueError as exc:
            raise DataError(f"{where}: {exc}") from None
        out.append({"role": m["role"], "content": content})
    if not any(m["content"].strip() for m in out):
        raise DataError(f"{where}: column {column!r} has no text: every message's content is empty")
    return out


def _lengths(value: Any, where: str, column: str, n: int | None) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(x, int) and x >= 1 for x in value):
        raise DataError(f"{where}: column {column!r} must be a list of positive integers, got {value!r}")
    if n is not None and len(value) < n:
        raise DataError(f"{where}: column {column!r} has {len(value)} lengths but the group size n is {n}")
    return list(value[:n] if n else value)
