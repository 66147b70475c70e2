"""Prompts for a rollout: read Parquet/JSONL, apply the chat template, tokenize."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdsr_sdk.dispatch.types import Group, Sample
from pdsr_sdk.errors import DataError
from pdsr_sdk.io.tables import read_table

PROMPT_COLUMNS = ("prompt", "problem", "question")
ID_COLUMNS = ("id", "unique_id", "prompt_id")
TRUTH_COLUMNS = ("answer", "ground_truth")


@dataclass
class PromptRecord:
    prompt_id: str
    text: str                     # after the chat template
    token_ids: list[int]
    ground_truth: str | None = None
    target_lengths: list[int] | None = None
    target_finish_reasons: list[str] | None = None


def load_prompts(cfg, tokenizer, *, path: str | Path, n: int | None = None) -> list[PromptRecord]:
    """Read prompts as configured by ``cfg`` (a :class:`DataConfig`) and tokenize them."""
    path = Path(path)
    table = read_table(path, what="prompt")
    if table.num_rows == 0:
        raise DataError(f"{path}: the prompt file is empty")
    columns = table.column_names
    messages_col = cfg.messages_column
    prompt_col = None
    if messages_col is None:
        prompt_col = cfg.prompt_column or next((c for c in PROMPT_COLUMNS if c in columns), None)
        if prompt_col is None:
            raise DataError(f"{path}: no prompt column; set data.prompt_column (or --prompt-column) to one of: "
                            f"{', '.join(columns)}; tried {', '.join(PROMPT_COLUMNS)}")
    for name, col in (("data.prompt_column", prompt_col), ("data.messages_column", messages_col),
                      ("data.id_column", cfg.id_column), ("data.ground_truth_column", cfg.ground_truth_column),
                      ("data.target_lengths_column", cfg.target_lengths_column)):
        if col is not None and col not in columns:
            raise DataError(f"{path}: {name} is {col!r} but the file has no such column; columns: {', '.join(columns)}")
    id_col = cfg.id_column or next((c for c in ID_COLUMNS if c in columns), None)
    truth_col = cfg.ground_truth_column or next((c for c in TRUTH_COLUMNS if c in columns), None)
    rows = table.slice(0, cfg.limit).to_pylist() if cfg.limit else table.to_pylist()

    template = cfg.apply_chat_template and getattr(tokenizer, "chat_template", None)
    records: list[PromptRecord] = []
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        where = f"{path}: row {i}"
        pid = str(row[id_col]) if id_col and row.get(id_col) is not None else f"row-{i}"
        if pid in seen:
            raise DataError(f"{where}: duplicate prompt id {pid!r} (also row {seen[pid]})")
        seen[pid] = i
        if messages_col:
            messages = _messages(row.get(messages_col), where, messages_col)
        else:
            text = row.get(prompt_col)
            if not isinstance(text, str) or not text.strip():
                raise DataError(f"{where}: column {prompt_col!r} must be a non-empty string, got {text!r}")
            messages = [{"role": "user", "content": text}]
        prompt_text, ids = encode_messages(messages, cfg, tokenizer, template=template)
        if not ids:
            raise DataError(f"{where}: the prompt tokenizes to nothing")
        truth = row.get(truth_col) if truth_col else None
        targets = reasons = None
        if cfg.target_lengths_column:
            targets = _lengths(row.get(cfg.target_lengths_column), where, cfg.target_lengths_column, n)
            fr = row.get("finish_reasons")
            reasons = [str(r) for r in fr] if isinstance(fr, list) and len(fr) == len(targets) else None
        records.append(PromptRecord(pid, prompt_text, list(ids), None if truth is None else str(truth),
                                    targets, reasons))
    return records


def encode_messages(messages: list[dict], cfg, tokenizer, *, template=None) -> tuple[str, list[int]]:
    """Chat ``messages`` as the prompt text and token ids the engines get: the tokenizer's chat template
    (when ``cfg.apply_chat_template`` and it has one) after ``cfg.system_prompt``; else the contents
    joined by blank lines. ``cfg`` is a :class:`DataConfig`."""
    if template is None:
        template = cfg.apply_chat_template and getattr(tokenizer, "chat_template", None)
    if cfg.system_prompt and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": cfg.system_prompt}] + messages
    if template:
        prompt_text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    else:
        prompt_text = "\n\n".join(m["content"] for m in messages)
        ids = tokenizer(prompt_text)["input_ids"]
    return prompt_text, list(ids)


def prompt_records(prompts, cfg, tokenizer, *, id_prefix: str = "p", where: str = "prompts") -> list[PromptRecord]:
    """Prompts a trainer passes (:meth:`RolloutSession.step`) as records. Each item is a
    :class:`PromptRecord` (used as it is), a string (one user message), a list of chat messages
    (``{role, content}``), or a mapping with ``prompt`` (str) or ``messages``, and optionally
    ``id`` / ``prompt_id`` and ``ground_truth`` / ``answer``. Items without an id get
    ``f"{id_prefix}{i}"``. Ids must be unique."""
    records: list[PromptRecord] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(prompts):
        at = f"{where}[{i}]"
        if isinstance(item, PromptRecord):
            record = item
        else:
            pid, truth = None, None
            if isinstance(item, str):
                messages = [{"role": "user", "content": item}]
            elif isinstance(item, list):
                messages = _messages(item, at, "messages")
            elif isinstance(item, dict):
                pid = item.get("id", item.get("prompt_id"))
                truth = item.get("ground_truth", item.get("answer"))
                if "messages" in item:
                    messages = _messages(item["messages"], at, "messages")
                elif isinstance(item.get("prompt"), str) and item["prompt"].strip():
                    messages = [{"role": "user", "content": item["prompt"]}]
                else:
                    raise DataError(f"{at}: a prompt mapping needs a non-empty 'prompt' string or 'messages'; "
                                    f"got keys {sorted(item)}")
            else:
                raise DataError(f"{at}: a prompt is a string, a list of chat messages, a mapping with 'prompt' or "
                                f"'messages', or a PromptRecord; got {type(item).__name__}")
            if isinstance(item, str) and not item.strip():
                raise DataError(f"{at}: the prompt is empty")
            text, ids = encode_messages(messages, cfg, tokenizer)
            if not ids:
                raise DataError(f"{at}: the prompt tokenizes to nothing")
            record = PromptRecord(str(pid) if pid is not None else f"{id_prefix}{i}", text, ids,
                                  None if truth is None else str(truth))
        if record.prompt_id in seen:
            raise DataError(f"{at}: duplicate prompt id {record.prompt_id!r} (also item {seen[record.prompt_id]})")
        seen[record.prompt_id] = i
        records.append(record)
    return records


def build_groups(records: list[PromptRecord], n: int, max_tokens: int) -> list[Group]:
    """A group of ``n`` samples per prompt record (in record order; ``position`` = index in the list).

    A record with ``target_lengths`` gets forced samples that generate exactly those lengths.
    """
    groups = []
    for i, r in enumerate(records):
        g = Group(prompt_id=r.prompt_id, prompt_token_ids=list(r.token_ids), prompt_text=r.text, n=n,
                  ground_truth=r.ground_truth, target_lengths=r.target_lengths,
                  target_finish_reasons=r.target_finish_reasons, position=i)
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
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: {column}[{j}] must be a mapping with string 'role' and 'content', got {m!r}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _lengths(value: Any, where: str, column: str, n: int | None) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(x, int) and x >= 1 for x in value):
        raise DataError(f"{where}: column {column!r} must be a list of positive integers, got {value!r}")
    if n is not None and len(value) < n:
        raise DataError(f"{where}: column {column!r} has {len(value)} lengths but the group size n is {n}")
    return list(value[:n] if n else value)


def load_tokenizer(path: str | Path):
    """A Hugging Face tokenizer from a local directory, with a clear error when it is not one."""
    path = Path(path)
    if not path.is_dir():
        raise DataError(f"{path}: model/tokenizer directory does not exist")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001 - transformers raises many types
        raise DataError(f"{path}: cannot load a tokenizer: {exc}") from None
