"""``pdsr rollout`` as a function: batches through a session, streamed to disk, summarised."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
from dataclasses import dataclass

from pdsr_sdk.dispatch.steps import groups_launched
from pdsr_sdk.dispatch.trajectory import carry_schema, sample_row, trajectory_schema
from pdsr_sdk.dispatch.types import FAILED, Group, Sample
from pdsr_sdk.errors import ConfigError, DataError, Interrupted, PdsrError
from pdsr_sdk.io.output_lock import output_lock, parts_dir
from pdsr_sdk.io.tables import remove_stale_temps, write_text_atomic
from pdsr_sdk.policies.resolve import policy_names
from pdsr_sdk.progress import ProgressFactory, StatusFn, silent_progress, silent_status
from pdsr_sdk.rollout.data import load_prompts
from pdsr_sdk.rollout.preflight import (check_agent_settings, check_model_folder, check_outputs, context_limit,
                                        filtered_path, split_long_prompts, summary_path)
from pdsr_sdk.rollout.resume import (METADATA_KEY, ResumeState, batches_left, carried_groups, nothing_left,
                                     read_resume_state, run_settings, steps_left)
from pdsr_sdk.rollout.reward import config_reward
from pdsr_sdk.rollout.session import RolloutSession
from pdsr_sdk.rollout.reward_totals import GroupRewards
from pdsr_sdk.rollout.summary import BatchTally, RolloutSummary, run_summary
from pdsr_sdk.rollout.writer import TrajectoryWriter, carry_file, write_errors_named


def resolve_model_dir(config) -> str:
    if config.model:
        return check_model_folder(config.model)
    from pdsr_sdk.models.tiny import ensure_tiny_model

    return str(ensure_tiny_model())


def policy_configs(config) -> list:
    """One config per policy ``config.policy`` selects (a name, a comma-separated list or ``all``); with
    more than one, each writes ``<stem>.<policy><suffix>`` beside ``output.path`` (and its own summary)."""
    names = policy_names(config.policy)
    if len(names) == 1:
        return [config.model_copy(update={"policy": names[0]})]
    out = config.output
    configs = []
    for name in names:
        tag = re.sub(r"[^\w.-]+", "_", name)
        paths = {"path": out.path.with_name(f"{out.path.stem}.{tag}{out.path.suffix}")}
        if out.summary_path is not None:
            summary = out.summary_path
            paths["summary_path"] = summary.with_name(f"{summary.stem}.{tag}{summary.suffix}")
        configs.append(config.model_copy(update={"policy": name, "output": out.model_copy(update=paths)}))
    return configs


def run_rollout(config, *, progress: ProgressFactory = silent_progress,
                status: StatusFn = silent_status) -> RolloutSummary:
    """Run ``pdsr rollout`` for ``config`` (a :class:`RolloutConfig`); blocks until done. ``progress`` makes
    the sample and probe bars, ``status`` gets one-line messages (engines starting, ready).
    Ctrl-C (SIGINT) and SIGTERM (what ``kill``, a batch scheduler or a container runtime sends; a
    background job of a non-interactive shell ignores SIGINT) stop it the same way: the running work is
    cancelled, the engines close, and :class:`~pdsr_sdk.errors.Interrupted` says what, if anything, was
    written (exit status 130, or 143 for SIGTERM, in the CLI). The caller's own SIGTERM handler is in place
    again when it returns or raises."""
    state = _RunState()

    async def main() -> RolloutSummary:
        task = asyncio.current_task()
        assert task is not None

        def on_sigterm() -> None:
            state.signal = "SIGTERM"
            task.cancel()

        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):   # not the main thread
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_sigterm)
        return await run_rollout_async(config, progress=progress, status=status, _state=state)

    caller_sigterm = signal.getsignal(signal.SIGTERM)
    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        raise Interrupted(state.describe(config)) from None
    except asyncio.CancelledError:
        if state.signal is None:
            raise
        raise Interrupted(state.describe(config), exit_status=143) from None
    finally:   # closing the loop set SIGTERM's handler to the default: the caller's (a trainer's, the CLI's) again
        if caller_sigterm is not None:
            with contextlib.suppress(ValueError):   # not the main thread: nothing was changed
                signal.signal(signal.SIGTERM, caller_sigterm)


@dataclass
class _RunState:
    """How far a run got, for the message of an interrupted run."""
    writer_made: bool = False
    engines_started: bool = False
    groups_written: int = 0
    finished: bool = False         # every group merged into the output: only the engines' shutdown was left
    agent_failed: int = 0          # multi-turn samples whose agent failed, in the groups written
    signal: str | None = None      # the signal that stopped the run, if not SIGINT

    def describe(self, config) -> str:
        out = config.output.path
        parts = parts_dir(out)
        how = "interrupted" if self.signal is None else f"terminated ({self.signal})"
        # an --overwrite'n output is replaced only once the first new group is written: nothing lost here
        if not self.engines_started:
            when = "before the engines had started" if not self.writer_made else "while the engines were starting"
            return f"{how} {when}: nothing was written"
        if self.finished:
            return f"{how} while the engines were shutting down, after the run had finished: {out} is complete"
        if not self.groups_written:
            return f"{how} before any group had finished: nothing was written"
        n = self.groups_written
        return (f"{how}: {n} finished group{' was' if n == 1 else 's were'} written to {parts}/; "
                f"rerun with --resume to continue")


async def run_rollout_async(config, *, progress: ProgressFactory = silent_progress,
                            status: StatusFn = silent_status, engines: list | None = None,
                            _state: "_RunState | None" = None) -> RolloutSummary:
    """Every check that needs no engine comes first (outputs, options, policy, data, the run resumed, prompt
    lengths); nothing on disk changes before they pass, but for the output's lock (``<out>.lock``, held while the
    run goes on: a second run on the same output is an error)."""
    with output_lock(config.output.path, "pdsr rollout"):
        return await _rollout(config, progress=progress, status=status, engines=engines, _state=_state)


async def _rollout(config, *, progress: ProgressFactory, status: StatusFn, engines: list | None,
                   _state: "_RunState | None") -> RolloutSummary:
    state = _state if _state is not None else _RunState()
    from pdsr_sdk.rollout.sample_data import default_sample_path

    names = policy_names(config.policy)
    if len(names) > 1:
        raise ConfigError(f"policy {config.policy!r} selects {len(names)} policies ({', '.join(names)}); a run has "
                          f"one: run each of policy_configs(config)")
    check_outputs(config)
    check_agent_settings(config)
    model_dir = resolve_model_dir(config)
    # config problems (policy name, its settings) surface before any data or engine work
    session = RolloutSession(config, engines=engines, model_dir=model_dir)
    tokenizer = session.tokenizer
    data_path = config.data.path or default_sample_path()
    records = load_prompts(config.data, tokenizer, path=data_path, n=config.sampling.n, progress=progress,
                           reward=config.reward)
    if config.data.apply_chat_template and not getattr(tokenizer, "chat_template", None):
        status("the tokenizer has no chat template: each prompt is its messages' contents joined by blank lines, "
               "their roles dropped (data.apply_chat_template: false asks for this)")
    # the reward the whole data asks for ('auto': math_verify when any row has a ground truth), for every group
    reward_fn = config_reward(config, any(r.ground_truth is not None for r in records))
    session.reward_for = lambda group: reward_fn
    if config.data.target_lengths_column and not config.sampling.ignore_eos:
        raise DataError(f"{data_path}: data.target_lengths_column forces response lengths; "
                        f"set sampling.ignore_eos (--ignore-eos) so the model's EOS does not end them early")
    out = config.output
    settings = run_settings(config, model_dir)
    prior = read_resume_state(out.path, settings, summary_path(config)) if out.resume else ResumeState()
    limit, source = context_limit(config, model_dir, engines)
    # resumed without --steps: the carried groups run again from their prompts, as any unfinished group
    # with an agent too: a multi-turn sample's agent cannot be resumed mid-conversation
    carried = carried_groups(prior.carried, records, config.sampling.n, config.sampling.max_tokens,
                             str(carry_file(out.path))) if prior.carried and config.streaming and \
        config.agent.function is None else []
    filtered_writer = None
    if filtered_path(config) is not None:
        filtered_writer = TrajectoryWriter(
            filtered_path(config), trajectory_schema(), resume=out.resume, overwrite=out.overwrite,
            flush_groups=out.flush_groups, flush_interval_s=out.flush_interval_s,
            metadata={"logprobs_mode": config.logprobs_mode, "policy": config.policy, "model": model_dir,
                      "run_id": prior.run_id, "filtered": "zero-variance groups (filter_groups)"})
    left = prior.done_ids | {g.prompt_id for g, _ in carried}
    if filtered_writer is not None and out.resume:   # filtered before: not run again
        left |= filtered_writer.finished_prompt_ids()
    if out.resume and not left:   # kept: a run resumed in a loop starts the first time; said, not silent
        status(f"output.resume (--resume): {out.path} holds no finished group to resume; starting a new run")
    _, too_long = split_long_prompts([r for r in records if r.prompt_id not in left], config,
                                     limit, source, data_path, total=len(records))
    batches = batches_left(records, too_long, left, config)
    todo = [r for _, b in batches for r in b]
    steps = steps_left(config, prior)
    idle = out.resume and prior.groups and (not (batches or carried) or (config.streaming and not steps))
    if idle:
        status(nothing_left(out.path, len(records) - len(too_long), config, prior, data_left=bool(batches or carried)))
    running = todo + [r for r in records if r.prompt_id in left and r.prompt_id not in prior.done_ids]
    longest_prompt = max((len(r.token_ids) for r in running), default=0)
    max_model_len = _round_up(longest_prompt + max(
        [config.sampling.max_tokens] + [max(r.target_lengths) for r in running if r.target_lengths]), 256)
    if limit is not None:
        max_model_len = min(max_model_len, limit)
    writer = TrajectoryWriter(
        out.path, trajectory_schema(), resume=out.resume, overwrite=out.overwrite,
        flush_groups=out.flush_groups, flush_interval_s=out.flush_interval_s,
        metadata={"logprobs_mode": config.logprobs_mode, "policy": config.policy, "model": model_dir,
                  "run_id": prior.run_id, METADATA_KEY: json.dumps(settings)})
    state.writer_made = True
    for path in (out.path, summary_path(config), filtered_path(config)):   # what a run killed mid-write left
        if path is not None:
            remove_stale_temps(path)

    total_groups: int | None = len(todo) + len(carried)
    if config.filter_groups is not None:   # how many launch depends on the pass rate: bars count without a total
        total_groups = None
    elif config.streaming:   # K steps take only some of the data's prompts
        total_groups = min(total_groups, groups_launched(config.step_groups or config.batch_size,
                                                         config.over_provision or 0.0, steps))
    sample_bar = probe_bar = None
    # a resumed run's carried samples that finished before the stop never finish again: the bars leave them out
    done_before = [s for g, _ in carried for s in g.samples if s.finished]
    probes_before = sum(s.is_probe for s in done_before)

    def open_sample_bar() -> None:
        """Once the engines are ready: the bar's clock (its elapsed time and rate) counts the run's generation
        from its start, not engine start-up, nor only from the first finished sample."""
        nonlocal sample_bar
        if sample_bar is None:
            sample_bar = progress(desc="samples", total=total_groups and total_groups * config.sampling.n
                                  - len(done_before), unit="sample")

    def on_sample(sample: Sample) -> None:
        nonlocal probe_bar
        open_sample_bar()
        assert sample_bar is not None
        sample_bar.update(1)
        if sample.is_probe:
            if probe_bar is None:
                probe_bar = progress(desc="probes", total=total_groups and total_groups - probes_before, unit="probe")
            probe_bar.update(1)

    def write_group(group: Group, scored: list) -> None:
        rows = [sample_row(s, tokenizer, None, scored=sc) for s, sc in zip(group.samples, scored)]
        writer.add_group(rows)
        rewards[group.prompt_id] = GroupRewards.of_rows(rows, scored)
        state.agent_failed += sum(r["finish_reason"] == FAILED for r in rows)
        state.groups_written += 1   # on disk by the time a run ends, interrupted or not (flush below)

    writes: set[asyncio.Task] = set()

    def on_group(group: Group) -> None:
        """A batch's group is complete: write it once its rewards (computed as its samples finished) are in."""
        async def write() -> None:
            scored = await session.scores(group.samples)
            session.rewards.forget(group.samples)
            write_group(group, scored)
        task = asyncio.ensure_future(write())
        writes.add(task)
        task.add_done_callback(writes.discard)

    async def written() -> None:
        """Every complete group's write done (a reward that stopped the run raises here)."""
        while writes:
            await asyncio.gather(*list(writes))

    def summarise() -> RolloutSummary:
        summary = run_summary(config, model_dir, session, results, prior, rewards, skipped_long=len(too_long))
        if session.agent is not None:   # multi-turn: samples whose agent failed (this call's)
            summary.stats["agent_failed"] = state.agent_failed
        return summary

    session.hooks.on_sample_done.append(on_sample)
    if not config.streaming:   # multi-step runs write a step's groups when it consumes them
        session.hooks.on_group_done.append(on_group)
    session.hooks.on_status.append(status)
    rewards: dict[str, GroupRewards] = {}   # prompt id -> what its written group's rewards add to the summary
    results: list[BatchTally] = []   # (not the batches' groups: they are on disk)
    failure: BaseException | None = None
    try:
        if (batches or carried) and not idle:
            await session.start(max_model_len=max_model_len)
            state.engines_started = True
            open_sample_bar()
            session.run.batch_index = max(session.run.batch_index, prior.next_batch_index)   # numbering goes on
        if config.streaming and not idle:
            todo_left = todo
            source = iter(todo_left)
            consumed = 0
            if prior.batches:   # each step's end was a version change
                session.policy_version = config.policy_version + prior.next_batch_index
            session.restore_carried(carried)
            ran = filtered = dropped = 0
            b = config.step_groups or config.batch_size
            short = None   # (step, groups) of a step the data ran out in, short of b groups
            for k in range(steps):   # the run's steps in all: a resume runs those left
                if consumed == len(todo_left) + len(carried):
                    break
                ran += 1
                out = await session.astep(source if k == 0 else (), last=k == steps - 1)
                scores = iter(out.scores)
                for group in out.groups:
                    write_group(group, [next(scores) for _ in group.samples])
                if filtered_writer is not None:
                    scores = iter(out.filtered_scores)
                    for group in out.filtered:
                        filtered_writer.add_group([sample_row(s, tokenizer, None, scored=next(scores))
                                                   for s in group.samples])
                    filtered_writer.flush()
                # a filtered prompt is done with too, and so is a dropped one (on-policy dynamic sampling)
                consumed += len(out.groups) + len(out.filtered) + len(out.dropped)
                filtered, dropped = filtered + len(out.filtered), dropped + len(out.dropped)
                if len(out.groups) < b:
                    short = (out.step, len(out.groups))
                results.append(BatchTally.of(out.report))
                # the step on disk before its update, whose await a SIGTERM or Ctrl-C would stop the run in
                writer.flush()
                writer.write_carry([{**sample_row(s, tokenizer, None, decode=False), "launch_step": step}
                                    for g, step in session.carried() for s in g.samples], carry_schema())
                _save(summarise(), config)
                await session.anext_version()   # each step's end is a trainer's weight update
            # the groups dynamic sampling took out: why the data ran out sooner than its size says
            taken = (f"; {filtered} of them filtered out (--filter-groups: their rewards all equal)"
                     + (f" and {dropped} dropped at on-policy step ends" if dropped else "")
                     if config.filter_groups is not None else "")
            if ran < steps:   # not an error (the last groups come back in the steps they take), but not what was asked
                # a filtered step the data cut short is named, as when it is the only step asked for
                where = (f", in step {short[0]}, which has {short[1]} of its {b} groups"
                         if short is not None and config.filter_groups is not None else "")
                status(f"the data's prompts ran out after {ran} of the {steps} steps "
                       f"{'left to run' if prior.batches else 'asked for'} (--steps {config.steps}){where}: "
                       f"{len(todo_left) + len(carried)} groups at {b} a step (--step-groups){taken}")
            elif short is not None and config.filter_groups is not None:
                status(f"the data's prompts ran out in step {short[0]}, which has {short[1]} of its {b} groups: "
                       f"{len(todo_left) + len(carried)} groups{taken}")
        for index, batch in ([] if config.streaming else batches):
            session.run.batch_index = index   # a batch cut short before the resume is completed under its index
            result = await session.generate(batch)
            await written()
            results.append(BatchTally.of(result))
            writer.flush()
            _save(summarise(), config)   # an interrupted run keeps its batches
        writer.finalize()
        if filtered_writer is not None:
            filtered_writer.finalize()
        state.finished = True
    except BaseException as exc:
        failure = exc
        raise
    finally:
        # an error or interrupt: groups still waiting for rewards are not written, nor are those the engines'
        # shutdown completes (their write would ask a closed session for rewards)
        if on_group in session.hooks.on_group_done:
            session.hooks.on_group_done.remove(on_group)
        for task in list(writes):
            task.cancel()
        unwritten: DataError | None = None   # a full disk, a deleted folder: reported once the engines are closed
        for w in (writer, filtered_writer):
            try:
                if w is not None:
                    w.flush()  # whatever finished is on disk, even on interrupt or engine failure
            except DataError as exc:
                unwritten = unwritten or exc
        for bar in (sample_bar, probe_bar):
            if bar is not None:
                bar.close()
        await session.close()
        if isinstance(failure, PdsrError):
            if unwritten is not None and str(unwritten) != str(failure):
                failure.add_note(f"also: {unwritten}")
            if writer.groups_on_disk:   # an engine died, a reward stopped the run: what it keeps, and how to go on
                n = writer.groups_on_disk
                failure.add_note(f"{n} finished group{' of this run is' if n == 1 else 's of this run are'} on disk "
                                 f"in {writer.parts_dir}/; rerun with --resume to continue")
        elif failure is None and unwritten is not None:
            raise unwritten
    summary = summarise()
    _save(summary, config)
    return summary


def _save(summary: RolloutSummary, config) -> None:
    path = summary_path(config)
    with write_errors_named(path):
        write_text_atomic(summary.to_json(), path)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m

