"""The trajectories table: one row per sample (its Arrow schema, and a sample as a row).

``pdsr rollout`` writes it, ``pdsr simulate`` can (counts only, no token ids), and calibration and
``pdsr trace convert`` read it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import pyarrow as pa

    from pdsr_sdk.dispatch.types import Sample


def _f(name: str, type_: pa.DataType, description: str, nullable: bool = False) -> pa.Field:
    import pyarrow as pa

    return pa.field(name, type_, nullable=nullable, metadata={"description": description})


def segment_type() -> pa.StructType:
    import pyarrow as pa

    return pa.struct([
        _f("pool", pa.string(), "Pool of the engine that ran the span ('fast', 'heavy'; 'fast<-heavy' = fast engine "
                                "running stolen heavy work)."),
        _f("engine", pa.string(), "Engine name."),
        _f("start_token", pa.int32(), "Index of the span's first response token."),
        _f("num_tokens", pa.int32(), "Tokens generated in the span (for a restarted sample, spans before the restart "
                                     "were discarded)."),
        _f("policy_version", pa.int32(), "Weights version that generated the span."),
        _f("submit_time_s", pa.float64(), "When the span was submitted (seconds since run start)."),
        _f("first_token_time_s", pa.float64(),
           "When the span's first token was sampled (after any wait in the engine's queue and the prefill); null if it "
           "produced none.", nullable=True),
        _f("end_time_s", pa.float64(), "When the span ended.", nullable=True),
        _f("end_reason", pa.string(), "stop | length | segment (continued) | cap | moved | truncated | abort | "
                                      "engine_dead | pause (cut by session.pause)."),
        _f("drafted_tokens", pa.int32(),
           "Speculative decoding: drafted tokens the span's verify steps checked; null with speculation off or when "
           "the engine did not report them (an aborted request).", nullable=True),
        _f("accepted_tokens", pa.int32(), "Speculative decoding: of those, the tokens the model accepted, as vLLM "
                                          "counts them: those accepted in the span's last verify step past its token "
                                          "budget or a stop count too, though the span does not keep them (so "
                                          "num_tokens - accepted_tokens is at most the span's steps, short by at most "
                                          "num_speculative_tokens); null as drafted_tokens.", nullable=True),
    ])


def turn_type() -> pa.StructType:
    import pyarrow as pa

    return pa.struct([
        _f("role", pa.string(), "assistant (the model sampled the span) | environment (tool results, user turns and "
                                "the chat template's tokens between turns)."),
        _f("start_token", pa.int32(), "Index of the span's first response token."),
        _f("num_tokens", pa.int32(), "Tokens in the span."),
        _f("tool_name", pa.string(),
           "For an environment span: the tool whose result it holds, when the agent named one.", nullable=True),
        _f("start_s", pa.float64(), "assistant: when the turn started running; environment: when the model's turn "
                                    "before it ended (seconds since run start)."),
        _f("end_s", pa.float64(), "When the span ended (environment: when the agent asked for the next turn).",
           nullable=True),
        _f("finish_reason", pa.string(), "assistant: stop (end of turn) | length (the turn's token limit); null for "
                                         "environment spans.", nullable=True),
    ])


def trajectory_schema() -> pa.Schema:
    """The schema ``pdsr rollout`` writes (also in schemas/trajectory.arrow.json)."""
    import pyarrow as pa

    return pa.schema([
        _f("prompt_id", pa.string(), "Prompt group id."),
        _f("sample_index", pa.int32(), "Sample index within the group (0 = the probe for probing policies)."),
        _f("group_size", pa.int32(), "N: samples in the group."),
        _f("batch_index", pa.int32(), "Index of the batch (GRPO step) the group ran in."),
        _f("is_probe", pa.bool_(), "True if this sample was used to probe the group's difficulty."),
        _f("prompt_token_ids", pa.list_(pa.int32()), "Prompt token ids (after the chat template)."),
        _f("response_token_ids", pa.list_(pa.int32()), "Response token ids."),
        _f("prompt_text", pa.string(), "Prompt text as sent to the model (after the chat template)."),
        _f("response_text", pa.string(), "Decoded response (special tokens skipped)."),
        _f("response_logprobs", pa.list_(pa.float32()), "Engine log-prob of each response token (see the file's "
                                                        "logprobs_mode metadata)."),
        _f("finish_reason", pa.string(), "stop | length | truncated | failed (see error)."),
        _f("stop_reason", pa.string(), "With finish_reason stop: the stop string (sampling.stop) that ended the "
                                       "response, or the stop token id (sampling.stop_token_ids, or one the model's "
                                       "generation config adds to its EOS) as its decimal digits ('151645'); null "
                                       "when the model's EOS ended it. A multi-turn sample's: its last model "
                                       "turn's.", nullable=True),
        _f("prompt_length", pa.int32(), "Prompt tokens."),
        _f("response_length", pa.int32(), "Response tokens."),
        _f("routed_to", pa.string(), "Pool the sample was first queued on after probing (null for probes).",
           nullable=True),
        _f("segments", pa.list_(segment_type()),
           "Every span of generation: pool, engine, tokens, policy version, times."),
        _f("num_segments", pa.int32(), "Number of spans."),
        _f("moves", pa.int32(), "Times the sample was moved between pools (breaker, steal time limit, probe timeout)."),
        _f("restarts", pa.int32(), "Times the sample started over, discarding its tokens."),
        _f("retries", pa.int32(), "Times the sample was re-queued because its engine died."),
        _f("steals", pa.int32(), "Times an engine of another pool took the sample from its queue."),
        _f("wasted_tokens", pa.int32(), "Tokens generated and then discarded by restarts."),
        _f("submit_time_s", pa.float64(), "When the sample was first queued (seconds since run start)."),
        _f("first_token_time_s", pa.float64(), "When its first token arrived.", nullable=True),
        _f("finish_time_s", pa.float64(), "When it finished."),
        _f("policy_versions", pa.list_(pa.int32()), "Distinct weights versions that generated its response tokens "
                                                    "(ascending); not those of tokens a restart threw away (their "
                                                    "spans stay in segments)."),
        _f("ground_truth", pa.string(), "Reference answer, when the data has one: a string or number one as text; "
                                        "a list or struct one (Search-R1's {\"target\": [...]}) as its JSON text.",
           nullable=True),
        _f("reward", pa.float32(), "Reward, when a reward function is set (null where it failed).", nullable=True),
        _f("reward_extra", pa.string(), "The reward function's other fields, when it returned a dict with a "
                                        "'score' (verl): a JSON object; in a finished run's file and a step's "
                                        "table a struct, one field per key, where every row has the same keys.",
           nullable=True),
        _f("reward_error", pa.string(), "Why the reward function failed on this sample (its exception).",
           nullable=True),
        _f("response_mask", pa.list_(pa.int8()), "Multi-turn: 1 for each response token the model sampled, 0 for "
                                                 "each its environment added (their log-probs are 0); null for a "
                                                 "single-turn sample (every token sampled).", nullable=True),
        _f("turns", pa.list_(turn_type()), "Multi-turn: the response's spans in order, the model's turns and the "
                                           "environment's; null for a single-turn sample.", nullable=True),
        _f("env_s", pa.float64(), "Multi-turn: seconds the agent spent between turns (the environment's time, no "
                                  "engine slot held); null for a single-turn sample.", nullable=True),
        _f("error", pa.string(), "Why the sample failed (finish_reason 'failed': its agent function raised, took "
                                 "longer than agent.env_timeout_s between turns, or returned bad content; or an "
                                 "engine refused its request).",
           nullable=True),
    ])


def reward_extra_struct(table: pa.Table) -> pa.Table:
    """``table`` with ``reward_extra`` as a struct column (one field per key, as verl's reward_extra_info keeps
    one column per key) when every row that has one holds an object with the same keys whose values Arrow
    types alike; else as it is, JSON text. Made once all rows are known: a finished run's file, a step's table
    (part files and the carry file stream with the schema's JSON text)."""
    import json

    import pyarrow as pa

    if "reward_extra" not in table.column_names or not pa.types.is_string(table.schema.field("reward_extra").type):
        return table
    values = [None if v is None else json.loads(v) for v in table.column("reward_extra").to_pylist()]
    present = [v for v in values if v is not None]
    if not present or not all(isinstance(v, dict) and v and v.keys() == present[0].keys() for v in present):
        return table
    try:
        column = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):   # e.g. a key both text and number
        return table
    if not pa.types.is_struct(column.type):
        return table
    i = table.schema.get_field_index("reward_extra")
    field = table.schema.field(i)
    return table.set_column(i, pa.field(field.name, column.type, nullable=True, metadata=field.metadata), column)


def reward_extra_json(table: pa.Table) -> pa.Table:
    """``table`` with a struct ``reward_extra`` (:func:`reward_extra_struct`) as JSON text again, as the
    schema has it (a resumed run merges an earlier file with new parts)."""
    import json

    import pyarrow as pa

    if "reward_extra" not in table.column_names or not pa.types.is_struct(table.schema.field("reward_extra").type):
        return table
    text = pa.array([None if v is None else json.dumps(v) for v in table.column("reward_extra").to_pylist()],
                    type=pa.string())
    i = table.schema.get_field_index("reward_extra")
    return table.set_column(i, table.schema.field(i).with_type(pa.string()), text)


#: columns a carried (unfinished) sample may leave empty
_CARRY_NULLABLE = ("finish_reason", "finish_time_s", "submit_time_s")


def carry_schema() -> pa.Schema:
    """The groups in flight at a multi-step run's step end, with every sample's tokens, log-probs and
    segments so far (``<out>.parts/_carry.parquet``; ``--resume`` continues them): the trajectories
    schema, nullable where an unfinished sample has no value yet, plus the step that launched the group."""
    import pyarrow as pa

    fields = [f.with_nullable(True) if f.name in _CARRY_NULLABLE else f for f in trajectory_schema()]
    fields.append(_f("launch_step", pa.int32(), "Step (batch index) the group was launched in; its deadline "
                                               "(group_deadline) counts from it."))
    return pa.schema(fields)


def restore_sample(sample: Sample, row: dict[str, Any]) -> None:
    """Give a fresh ``sample`` (same group and index) the state a carry row recorded, so that it goes on
    from its tokens (or, finished, waits for its group)."""
    from pdsr_sdk.dispatch.types import SegmentRecord

    sample.token_ids = list(row["response_token_ids"] or [])
    sample.logprobs = list(row["response_logprobs"] or [])
    sample.num_generated = row["response_length"]
    sample.segments = [SegmentRecord(**seg) for seg in row["segments"] or []]
    sample.finish_reason = row["finish_reason"]
    sample.stop_reason = stop_value(row.get("stop_reason"), sample.token_ids)
    sample.is_probe = row["is_probe"]
    sample.routed_to = row["routed_to"]
    for key in ("moves", "restarts", "retries", "steals", "wasted_tokens"):
        setattr(sample, key, row[key] or 0)
    # an unfinished sample is submitted afresh in the run that restores it (policies queue unsubmitted ones)
    sample.submit_time_s = row["submit_time_s"] if sample.finished else None
    sample.first_token_time_s = row["first_token_time_s"]
    sample.finish_time_s = row["finish_time_s"]


def sample_row(sample: Sample, tokenizer: Any, reward_fn: Callable[..., float] | None, *,
               decode: bool = True, scored: Any = None) -> dict[str, Any]:
    """A finished :class:`~pdsr_sdk.dispatch.types.Sample` as a trajectories row; ``tokenizer`` decodes
    the response text (when ``decode``), ``reward_fn`` (or None) scores it. ``scored``: its text and
    reward already computed (a :class:`~pdsr_sdk.rollout.reward_runner.Scored`); then neither is done here."""
    from pdsr_sdk.dispatch.types import kept_segments

    g = sample.group
    if scored is not None:
        text, reward, extra, error = scored.text, scored.reward, scored.extra, scored.error
    else:
        text = tokenizer.decode(sample.token_ids, skip_special_tokens=True) if decode and sample.token_ids else ""
        reward, extra, error = (None, None, None) if reward_fn is None else score_sample(reward_fn, text, sample)
    return {
        "prompt_id": g.prompt_id,
        "sample_index": sample.index,
        "group_size": g.n,
        "batch_index": g.batch_index,
        "is_probe": sample.is_probe,
        "prompt_token_ids": g.prompt_token_ids,
        "response_token_ids": sample.token_ids,
        "prompt_text": g.prompt_text,
        "response_text": text,
        "response_logprobs": sample.logprobs,
        "finish_reason": sample.finish_reason,
        "stop_reason": None if sample.stop_reason is None else str(sample.stop_reason),
        "prompt_length": g.prompt_len,
        "response_length": sample.num_generated,
        "routed_to": sample.routed_to,
        "segments": [asdict(seg) for seg in sample.segments],
        "num_segments": len(sample.segments),
        "moves": sample.moves,
        "restarts": sample.restarts,
        "retries": sample.retries,
        "steals": sample.steals,
        "wasted_tokens": sample.wasted_tokens,
        "submit_time_s": sample.submit_time_s,
        "first_token_time_s": sample.first_token_time_s,
        "finish_time_s": sample.finish_time_s,
        # of the tokens it holds: a restart's thrown-away tokens (older, often past max_staleness) are not in it
        "policy_versions": sorted({seg.policy_version for seg in kept_segments(sample) if seg.num_tokens}),
        "ground_truth": truth_text(g.ground_truth),
        "reward": reward,
        "reward_extra": extra,
        "reward_error": error,
        "response_mask": sample.response_mask,
        "turns": None if sample.turns is None else [asdict(t) for t in sample.turns],
        "env_s": None if sample.turns is None else sample.env_s,
        "error": sample.error,
    }


def stop_value(text: str | None, token_ids: list[int]) -> str | int | None:
    """A ``stop_reason`` cell as the sample held it: a stop token id (the digits of the response's last token,
    which a stop token always is) as an int, else the stop string."""
    if text is not None and text.isdigit() and token_ids and token_ids[-1] == int(text):
        return int(text)
    return text


def truth_text(ground_truth: Any) -> str | None:
    """A ground truth as the trajectories' ``ground_truth`` column (one type, a string) holds it: text as it is,
    a number written out, None as None, and any other value (a dict, a list) as its JSON text (a numpy array as
    its list; what JSON cannot hold, as its ``str``)."""
    import json

    if ground_truth is None or isinstance(ground_truth, str):
        return ground_truth
    if isinstance(ground_truth, (int, float)):
        return str(ground_truth)

    def plain(value: Any) -> Any:
        return value.tolist() if hasattr(value, "tolist") else str(value)
    return json.dumps(ground_truth, ensure_ascii=False, default=plain)


def score_sample(reward_fn: Callable[..., Any], text: str,
                 sample: Sample) -> tuple[float | None, str | None, str | None]:
    """(reward, extra fields as JSON, error) of one sample. ``reward_fn(text, ground_truth, **info)`` (info:
    prompt_id, sample_index, prompt_text, response_length and the row's reward columns, e.g. data_source, extra_info)
    returns a number or a dict with a ``score`` (its other fields kept as JSON). Info also has ``response_length``
    (tokens). An exception fails only this sample:
    reward None and the error (``SystemExit`` too: a reward that runs the model's code gets its ``sys.exit()``; and
    a BaseException of the reward's own); pdsr's own
    errors (a reward misconfigured) stop the run."""
    g = sample.group
    return score_text(reward_fn, text, g.ground_truth, {
        "prompt_id": g.prompt_id, "sample_index": sample.index, "prompt_text": g.prompt_text,
        "response_length": sample.num_generated, **(g.reward_info or {})})


def extra_json(fields: dict[str, Any] | None) -> str | None:
    """A reward's (or an agent's) extra fields as a row's ``reward_extra`` JSON text (None when there are none):
    numpy and torch numbers and arrays as the numbers and lists they hold (their ``tolist()``), so that the column
    keeps them numeric and the run's ``reward_extra_means`` counts them; anything else JSON lacks as its text."""
    import json

    return json.dumps(fields, default=_json_plain) if fields else None


def _json_plain(value: Any) -> Any:
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        try:
            return tolist()
        except Exception:  # noqa: BLE001 - an object whose tolist() is not numpy's: its text, as before
            pass
    return str(value)


class RewardStopped(BaseException):
    """Raised into a reward call from outside it (``reward_time_limit_s``'s watchdog): :func:`score_text` lets it
    through, where the call's own exceptions are its sample's error. No ``Exception``, which a reward's own
    ``except`` would swallow."""


def score_text(reward_fn: Callable[..., Any], text: str, ground_truth: Any,
               info: dict[str, Any]) -> tuple[float | None, str | None, str | None]:
    """:func:`score_sample` given the reward's inputs: ``reward_fn(text, ground_truth, **info)``."""
    import math

    from pdsr_sdk.errors import PdsrError

    try:
        got = reward_fn(text, ground_truth, **info)
        extra = None
        if isinstance(got, dict):
            if "score" not in got:
                raise ValueError(f"the reward returned a dict without 'score' (keys: {sorted(got)})")
            extra = extra_json({k: v for k, v in got.items() if k != "score"})
            got = got["score"]
        if got is None:
            raise ValueError("the reward returned None as its score; it returns a number or a dict with a "
                             "numeric 'score'")
        if isinstance(got, (str, bytes)):   # float() would read '0.5' and fail on 'abc' without naming the reward
            raise ValueError(f"the reward returned {got!r} ({type(got).__name__}) as its score; a score is a number")
        try:
            score = float(got)
        except (TypeError, ValueError):   # a list, a (score, info) tuple: float()'s own words name no reward
            raise ValueError(f"the reward returned {got!r:.80} ({type(got).__name__}) as its score; a score is a "
                             f"number") from None
        if not math.isfinite(score):   # one nan makes its group's GRPO advantages, and the loss, nan
            raise ValueError(f"the reward returned {score} as its score; a score is a finite number")
        return score, extra, None
    except (PdsrError, KeyboardInterrupt, GeneratorExit, RewardStopped):
        raise
    except SystemExit as exc:   # a reward running the model's code (unit tests) got its sys.exit(): this sample's
        return None, None, f"SystemExit: the reward called sys.exit({exc.code!r})"[:2000]
    # a BaseException of the reward's own too (func_timeout's FunctionTimedOut, pytest's Failed): one sample's
    except BaseException as exc:   # noqa: BLE001 - one sample's reward, reported in its row
        return None, None, f"{type(exc).__name__}: {exc}"[:2000]
