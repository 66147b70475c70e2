"""The run on disk that ``--resume`` continues: what it finished, the settings it ran with, its batches.

A rollout records its settings (:func:`run_settings`) in the trajectories' Parquet metadata; resuming with
different ones is an error naming each key. The batches left (:func:`batches_left`) are numbered as in a run
made in one go, up to ``num_batches`` in all, a batch cut short completed under its index; a multi-step run's
steps go on from the last index on disk and its carried groups continue from their tokens
(``<out>.parts/_carry.parquet``). The summary covers the whole run: batches the earlier summary reported
(same ``run_id``), and batches only partly done when the run stopped, counted from the trajectories.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdsr_sdk.dispatch.run import STAT_KEYS
from pdsr_sdk.dispatch.trajectory import restore_sample
from pdsr_sdk.dispatch.types import Group
from pdsr_sdk.errors import ConfigError, DataError, PdsrError
from pdsr_sdk.io.resume_check import check_resume_settings
from pdsr_sdk.policies.resolve import plain_settings
from pdsr_sdk.rollout.data import build_groups
from pdsr_sdk.rollout.reward_totals import GroupRewards, add_extra_sums
from pdsr_sdk.rollout.writer import carry_file, existing_files

#: settings a resumed run must share with the run on disk (config key -> flag)
RESUME_KEYS = {
    "policy": "--policy", "policy_settings": "--set", "model": "--model", "sampling.n": "--n",
    "sampling.max_tokens": "--max-tokens", "sampling.temperature": "--temperature", "sampling.top_p": "--top-p",
    "sampling.top_k": "--top-k", "sampling.stop": "--stop", "sampling.stop_token_ids": "--stop-token-id",
    "sampling.ignore_eos": "--ignore-eos", "sampling.min_p": "--min-p",
    "sampling.presence_penalty": "--presence-penalty", "sampling.frequency_penalty": "--frequency-penalty",
    "sampling.repetition_penalty": "--repetition-penalty",
    "logprobs_mode": "logprobs_mode", "reward": "--reward", "data.path": "--data",
    "data.system_prompt": "--system-prompt", "data.instruction": "--instruction",
    "data.apply_chat_template": "data.apply_chat_template", "data.chat_template_kwargs": "data.chat_template_kwargs",
    "data.target_lengths_column": "--target-lengths-column",
    "batch_size": "--batch-size",   # the run's batches are the data cut by it (batches_left)
    # what the file's rewards and groups are: the reward shaped or not, zero-variance groups left out or not
    "overlong_buffer": "--overlong-buffer", "overlong_penalty": "--overlong-penalty",
    "filter_groups.kind": "--filter-groups", "filter_groups.metric": "--filter-metric",
    # multi-turn: a resume without --agent would write single-turn rows into a multi-turn run
    "agent.function": "--agent", "agent.max_turns": "--max-turns", "agent.turn_max_tokens": "--turn-max-tokens",
    "agent.max_env_turns": "agent.max_env_turns", "agent.max_tool_response_chars": "agent.max_tool_response_chars",
    "agent.tool_response_truncate_side": "agent.tool_response_truncate_side",
}
METADATA_KEY = "pdsr_run"
#: the trajectories' columns a batch cut short adds to the summary's reward counts beside ``reward``
_REWARD_COLUMNS = ("reward_error", "reward_extra")
_COUNTERS = ("moves", "steals", "restarts", "wasted_tokens", "retries")
#: the carry file's columns that carried_groups and restore_sample read
CARRY_COLUMNS = ("prompt_id", "sample_index", "launch_step", "response_token_ids", "response_logprobs",
                 "response_length", "segments", "finish_reason", "stop_reason", "is_probe", "routed_to",
                 "submit_time_s", "first_token_time_s", "finish_time_s", *_COUNTERS)


def run_settings(config, model_dir: str) -> dict[str, Any]:
    """The settings a resumed run must match. Model and data by folder/file name, so a run directory moved to
    another mount still resumes."""
    s = config.sampling
    return {
        "policy": config.policy, "policy_settings": plain_settings(config.policy_settings.get(config.policy)),
        "model": Path(model_dir).name, "sampling.n": s.n, "sampling.max_tokens": s.max_tokens,
        "sampling.temperature": s.temperature, "sampling.top_p": s.top_p, "sampling.top_k": s.top_k,
        "sampling.stop": list(s.stop), "sampling.stop_token_ids": list(s.stop_token_ids),
        "sampling.ignore_eos": s.ignore_eos, "sampling.min_p": s.min_p, "sampling.presence_penalty": s.presence_penalty,
        "sampling.frequency_penalty": s.frequency_penalty, "sampling.repetition_penalty": s.repetition_penalty,
        "logprobs_mode": config.logprobs_mode,
        "reward": config.reward, "data.path": Path(config.data.path).name if config.data.path else None,
        "data.system_prompt": config.data.system_prompt, "data.apply_chat_template": config.data.apply_chat_template,
        "data.chat_template_kwargs": dict(config.data.chat_template_kwargs),
        "data.target_lengths_column": config.data.target_lengths_column, "data.instruction": config.data.instruction,
        "batch_size": config.batch_size, "agent.function": config.agent.function,
        "overlong_buffer": config.overlong_buffer,
        "overlong_penalty": config.overlong_penalty if config.overlong_buffer is not None else None,
        "filter_groups.kind": config.filter_groups.kind if config.filter_groups is not None else None,
        "filter_groups.metric": config.filter_groups.metric if config.filter_groups is not None else None,
        **(_agent_limits(config.agent) if config.agent.function is not None else {}),
    }


def _agent_limits(agent) -> dict[str, Any]:
    """A multi-turn run's agent limits. A single-turn run has none to match: a run recorded before they were an
    error without an agent (``agent.max_turns: 3`` then, ignored) resumes without them."""
    return {f"agent.{name}": getattr(agent, name) for name in ("max_turns", "turn_max_tokens", "max_env_turns",
                                                                "max_tool_response_chars",
                                                                "tool_response_truncate_side")}


@dataclass
class ResumeState:
    """What is on disk for ``path`` (empty when nothing is)."""

    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    done_ids: set[str] = field(default_factory=set)
    groups: int = 0
    samples: int = 0
    batches: list[dict[str, Any]] = field(default_factory=list)   # summary rows of the batches on disk
    busy_s: dict[str, float] = field(default_factory=dict)        # engine busy seconds of the reported batches
    #: rows (carry schema) of the groups a multi-step run had in flight at its last step's end
    carried: list[dict[str, Any]] = field(default_factory=list)

    @property
    def next_batch_index(self) -> int:
        return max((b["batch_index"] for b in self.batches), default=-1) + 1


def read_resume_state(path: Path, settings: dict[str, Any], summary: Path) -> ResumeState:
    """The run on disk at ``path``; a ConfigError naming every setting that differs from ``settings``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = existing_files(path)
    if not files:
        return ResumeState()
    columns = ["prompt_id", "group_size", "batch_index", "is_probe", "response_length", "submit_time_s",
               "finish_time_s", "reward", *_COUNTERS]
    try:
        meta = pq.read_schema(files[0]).metadata or {}
        # what a batch cut short adds to the summary's reward counts; a file written before a column was added
        # reads as null there (the merged file's reward_extra is a struct, a part's JSON text: the same values)
        tables = [pq.read_table(f, columns=columns + [c for c in _REWARD_COLUMNS if c in pq.read_schema(f).names])
                  for f in files]
        table = pa.concat_tables([t.select(columns) for t in tables])
        rewards = [t.select([c for c in _REWARD_COLUMNS if c in t.column_names]).to_pylist() for t in tables]
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types
        raise DataError(f"{path}: cannot read the existing output to resume: {exc}") from None
    rows = table.to_pydict()
    _check_settings(path, settings, meta, set(rows["group_size"]))
    run_id = meta.get(b"run_id", b"").decode() or uuid.uuid4().hex
    state = ResumeState(run_id=run_id, done_ids=set(rows["prompt_id"]), groups=len(set(rows["prompt_id"])),
                        samples=table.num_rows)
    state.carried = _read_carry(path, run_id, state.done_ids)
    reported, state.busy_s = _reported_batches(summary, run_id)
    on_disk = _batches_from_rows(rows, [r for part in rewards for r in part])
    for index, derived in sorted(on_disk.items()):
        report = reported.get(index)
        state.batches.append(report if report and report["groups"] == derived["groups"] else derived)
    return state


def _read_carry(path: Path, run_id: str, done: set[str]) -> list[dict[str, Any]]:
    """The carry rows of this run (groups already on disk as consumed dropped: the run stopped between
    writing a step's groups and its carry)."""
    import pyarrow.parquet as pq

    file = carry_file(path)
    if not file.exists():
        return []
    try:
        schema = pq.read_schema(file)
        if (schema.metadata or {}).get(b"run_id", b"").decode() != run_id:
            return []
        # the file holds every sample's prompt ids and text too (GBs on a long run), which nothing here reads
        table = pq.read_table(file, columns=[c for c in CARRY_COLUMNS if c in schema.names])
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types
        raise DataError(f"{file}: cannot read the groups the run carried between steps: {exc}; remove the file "
                        f"to start them over") from None
    return [r for r in table.to_pylist() if r["prompt_id"] not in done]


def carried_groups(rows: list[dict[str, Any]], records: list, n: int, max_tokens: int,
                   where: str) -> list[tuple[Group, int]]:
    """Groups rebuilt from carry ``rows`` (their prompts from ``records``, the data's prompt records), each
    sample given its tokens, log-probs and segments, with the step each group was launched in."""
    by_id = {r.prompt_id: r for r in records}
    rows_of: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        rows_of.setdefault(row["prompt_id"], []).append(row)
    out = []
    for pid, group_rows in rows_of.items():
        if pid not in by_id:
            raise DataError(f"{where}: the run carried prompt id {pid!r} between steps but the data has no such "
                            f"prompt; resume with the run's data, or start over with --overwrite")
        group = build_groups([by_id[pid]], n, max_tokens)[0]
        if len(group_rows) != len(group.samples):
            raise DataError(f"{where}: carried group {pid!r} has {len(group_rows)} samples, the run makes "
                            f"{len(group.samples)}; resume with the run's --n")
        for row in group_rows:
            restore_sample(group.samples[row["sample_index"]], row)
        out.append((group, group_rows[0]["launch_step"]))
    return out


def _check_settings(path: Path, now: dict[str, Any], meta: dict[bytes, bytes], group_sizes: set[int]) -> None:
    if METADATA_KEY.encode() in meta:
        then = json.loads(meta[METADATA_KEY.encode()])
    else:   # written before settings were recorded: what the file still says
        then = {k: meta[k.encode()].decode() for k in ("policy", "logprobs_mode") if k.encode() in meta}
    if len(group_sizes) == 1:
        then.setdefault("sampling.n", next(iter(group_sizes)))
    check_resume_settings(path, then, now, RESUME_KEYS,
                          same=lambda key: key == "policy_settings" and _same_policy_settings(then, now, path))


def _same_policy_settings(then: dict[str, Any], now: dict[str, Any], path: Path) -> bool:
    """Whether the policy settings recorded with the run and today's are the same settings, however spelt: an
    old key and its new one (``migrate: false`` and ``disable: [migration]``), a value left out and its
    default. The recorded ones are read as a saved run's (a removed setting is ignored, with a warning naming
    the run's file ``path``)."""
    from pdsr_sdk.policies.resolve import resolve_policy

    if then.get("policy") != now.get("policy") or not isinstance(then.get("policy_settings"), dict):
        return False
    try:
        _, old = resolve_policy(now["policy"], then["policy_settings"], saved=True, origin=str(path))
        _, new = resolve_policy(now["policy"], now["policy_settings"])
    except PdsrError:
        return False     # not readable as today's settings: the raw difference is what to report
    return bool(old == new)


def _reported_batches(summary: Path, run_id: str) -> tuple[dict[int, dict], dict[str, float]]:
    """Batches (and engine busy seconds) of the earlier summary, when it is this run's."""
    try:
        data = json.loads(summary.read_text())
    except (OSError, ValueError):
        return {}, {}
    if not isinstance(data, dict) or data.get("run_id") != run_id:
        return {}, {}
    makespan = float(data.get("makespan_s") or 0.0)
    busy = {k: float(v) * makespan for k, v in (data.get("engine_busy_fraction") or {}).items()}
    return {b["batch_index"]: b for b in data.get("batches", []) if isinstance(b, dict)}, busy


def _batches_from_rows(rows: dict[str, list], rewards: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Summary rows counted from the trajectories (a batch cut short: no policy facts, makespan from times), with
    the rewards the rows' ``rewards`` columns (:data:`_REWARD_COLUMNS`, row for row) add: their errors and the
    sums of a dict reward's numeric fields, as the run counted its finished batches (math_verify's timeouts and the
    reward's seconds are on no row)."""
    out: dict[int, dict[str, Any]] = {}
    ids: dict[int, set] = {}
    for i, index in enumerate(rows["batch_index"]):
        b = out.setdefault(index, {"batch_index": index, "groups": 0, "start": float("inf"), "end": 0.0,
                                   "tokens": 0, "l_cut": None, "fast_cap": None, **{k: 0 for k in STAT_KEYS},
                                   "policy": {}, "interrupted": True, "reward_sum": 0.0, "rewarded_samples": 0,
                                   "reward_errors": 0, "reward_extra_sums": {}})
        ids.setdefault(index, set()).add(rows["prompt_id"][i])
        b["tokens"] += rows["response_length"][i]
        b["probes"] += bool(rows["is_probe"][i])
        got = GroupRewards.of_rows([{"reward": rows["reward"][i], "reward_error": None, "reward_extra": None,
                                     **rewards[i]}], [])
        b["reward_sum"] += got.reward_sum
        b["rewarded_samples"] += got.rewarded_samples
        b["reward_errors"] += got.reward_errors
        b["reward_extra_sums"] = add_extra_sums(b["reward_extra_sums"], got.reward_extra_sums)
        for k in _COUNTERS:
            b[k] += rows[k][i] or 0
        b["start"] = min(b["start"], rows["submit_time_s"][i])
        b["end"] = max(b["end"], rows["finish_time_s"][i])
    for index, b in out.items():
        b["groups"] = len(ids[index])
        makespan = max(0.0, b.pop("end") - b.pop("start"))
        b["makespan_s"] = round(makespan, 4)
        b["tokens_per_s"] = round(b["tokens"] / makespan, 2) if makespan > 0 else 0.0
    return out


def batches_left(records: list, too_long: list, left: set[str], config) -> list[tuple[int, list]]:
    """The run's batches still to run, each with its index: the data's prompts (less those skipped as too
    long) cut into ``batch_size`` batches, the first ``num_batches`` of them: the run's batches in all, however
    often it is resumed. Each keeps the prompts not in ``left`` (finished, or carried); a batch cut short
    keeps the rest of its prompts, and a finished one is left out."""
    skipped = {r.prompt_id for r in too_long}
    fits = [r for r in records if r.prompt_id not in skipped]
    size = config.batch_size
    planned = [fits[i:i + size] for i in range(0, len(fits), size)][:config.num_batches]
    out = [(index, [r for r in batch if r.prompt_id not in left]) for index, batch in enumerate(planned)]
    return [(index, batch) for index, batch in out if batch]


def steps_left(config, prior: ResumeState) -> int:
    """A multi-step run's steps still to run: ``steps`` counts the run's steps in all, those on disk included
    (a resume after step k of K runs K - k - 1 more, the last draining what is in flight)."""
    return max(0, (config.steps or 1) - prior.next_batch_index)


def nothing_left(path: Path, prompts: int, config, prior: ResumeState, *, data_left: bool) -> str:
    """The line of a resumed run that finds nothing to run (``prompts``: the data's, less any too long): the steps or
    batches ``prior`` has on disk, and why no more run: every prompt of the data done (``data_left`` False), else
    the run's count of them reached (``--steps``, ``--num-batches``: the run's in all)."""
    if config.streaming:
        done = prior.next_batch_index
        if not data_left:   # a larger --steps would find no prompt either
            return (f"nothing left to run: {path} already has every prompt of the data (in {_count(done, 'step')}); "
                    f"start over with --overwrite to run them again")
        return (f"nothing left to run: {path} already has {_count(done, 'step')}, and --steps {config.steps or 1} "
                f"counts the run's steps in all; raise --steps to run more, or start over with --overwrite")
    planned = -(-prompts // config.batch_size)
    done = len(prior.batches)
    if config.num_batches is not None and config.num_batches < planned:
        return (f"nothing left to run: {path} already has {_count(done, 'batch')}, and --num-batches "
                f"{config.num_batches} counts the run's batches in all; raise --num-batches to run more, or start "
                f"over with --overwrite")
    return (f"nothing left to run: {path} already has every prompt of the data ({planned} batches of "
            f"{config.batch_size}); start over with --overwrite to run them again")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith('ch') else 's'}"


def merged_batches(before: list[dict[str, Any]], now: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The summary rows of the batches on disk before a resume and of this call's, a batch cut short and
    completed now as one row (``resumed``): its groups, tokens, time and counters added up, the policy's
    facts those of the part run now."""
    rows = {b["batch_index"]: b for b in before}
    for b in now:
        old = rows.get(b["batch_index"])
        if old is None:
            rows[b["batch_index"]] = b
            continue
        row = {**old, **b, "resumed": True}
        row.pop("interrupted", None)
        for key in ("groups", "tokens", "makespan_s", "reward_sum", "rewarded_samples", "reward_timeouts",
                    "reward_errors", "reward_s", *STAT_KEYS):
            if isinstance(old.get(key), (int, float)) and isinstance(b.get(key), (int, float)):
                row[key] = old[key] + b[key]
        row["reward_extra_sums"] = add_extra_sums(old.get("reward_extra_sums") or {}, b.get("reward_extra_sums") or {})
        row["makespan_s"] = round(row["makespan_s"], 4)
        row["tokens_per_s"] = round(row["tokens"] / row["makespan_s"], 2) if row["makespan_s"] > 0 else 0.0
        rows[b["batch_index"]] = row
    return sorted(rows.values(), key=lambda b: b["batch_index"])


def check_resume_options(config) -> None:
    out = config.output
    if out.resume and out.overwrite:
        raise ConfigError(f"--resume and --overwrite (output.resume, output.overwrite) conflict: --resume continues "
                          f"the run in {out.path}, --overwrite replaces it; pass one of them")
