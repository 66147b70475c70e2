"""Rewards of a rollout session's samples, the part of :class:`~pdsr_sdk.rollout.session.RolloutSession` that
chooses the reward function of a group, reads an agent's own reward, and builds a step's result with its rewards."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Iterable

from pdsr_sdk.dispatch.types import FAILED, Group, Sample
from pdsr_sdk.errors import ConfigError, RunError
from pdsr_sdk.rollout.results import BatchResult, StepResult
from pdsr_sdk.rollout.reward_totals import GroupRewards, extra_means


class SessionRewards:
    """Which reward scores a group, dynamic sampling's filter from the config, and a step's result with its
    rewards (a mixin of :class:`~pdsr_sdk.rollout.session.RolloutSession`, whose config, tokenizer and agents it
    uses). :meth:`_init_rewards` sets its state when the session is made; the session's ``start()`` makes the
    :class:`~pdsr_sdk.rollout.reward_runner.RewardRunner` (:attr:`rewards`) that scores finished samples with
    :meth:`reward_for` and :meth:`_agent_score`, and checks :meth:`_check_rewards_pickle` first."""

    def _init_rewards(self, reward: Callable[..., Any] | None) -> None:
        # by whether the data has a ground truth; a reward pdsr cannot call is an error here, before any engine
        from pdsr_sdk.rollout.reward import adapt_reward, config_reward, with_overlong

        config = self.config
        self._reward_fns: dict[bool, Any] = {True: config_reward(config, True)}
        self._reward_override = None if reward is None else with_overlong(
            adapt_reward(reward, getattr(reward, "__name__", "reward")), config)
        #: scores finished samples off the event loop (made when the session starts)
        self.rewards = None

    def _config_group_filter(self) -> Callable[[Group, list[float | None]], bool]:
        """Dynamic sampling's predicate for ``config.filter_groups`` (its kind, on a group's rewards)."""
        from pdsr_sdk.dispatch.steps import GROUP_FILTERS

        config = self.config
        kind = GROUP_FILTERS[config.filter_groups.kind]
        metric = config.filter_groups.metric

        def group_filter(group: Group, rewards: list[float | None]) -> bool:
            if self.reward_for(group) is None:
                raise ConfigError(f"filter_groups filters groups by their rewards, and group {group.prompt_id!r} "
                                  f"has none: reward is {config.reward!r} and its prompt has no ground truth; "
                                  f"give the data a ground truth column or set a reward")
            scores = [self.rewards.result(s) for s in group.samples] if self.rewards is not None else []
            if not scores:
                return kind(rewards)
            return kind([filter_value(sc, metric, f"group {group.prompt_id!r} sample {s.index}")
                         for s, sc in zip(group.samples, scores)])

        return group_filter

    def _data_reward(self) -> str | None:
        """The reward name data read for this session is checked against (a built-in text reward refuses a list or
        struct ground truth); None with a reward function of the session's own, which takes any value."""
        return None if self._reward_override is not None else self.config.reward

    def reward_for(self, group: Group):
        """The reward function for a group's samples: the one given to the session, else ``config.reward``
        resolved for data with a ground truth or without (None: no reward)."""
        if self._reward_override is not None:
            return self._reward_override
        has_truth = group.ground_truth is not None
        if has_truth not in self._reward_fns:
            from pdsr_sdk.rollout.reward import config_reward

            self._reward_fns[has_truth] = config_reward(self.config, has_truth)
        return self._reward_fns[has_truth]

    def _check_rewards_pickle(self) -> None:
        """``reward_executor: process``: the reward functions must pickle (ConfigError naming them if not)."""
        from pdsr_sdk.rollout.reward import config_reward
        from pdsr_sdk.rollout.reward_runner import check_picklable

        if self._reward_override is not None:
            check_picklable(self._reward_override)
            return
        for has_truth in (True, False):
            if has_truth not in self._reward_fns:
                self._reward_fns[has_truth] = config_reward(self.config, has_truth)
            check_picklable(self._reward_fns[has_truth], f"reward {self.config.reward!r}")

    def _agent_score(self, sample: Sample) -> tuple[float | None, str | None, str | None] | None:
        """A multi-turn sample's reward when its agent decided it: (reward, extra as JSON, error); None when the
        reward function scores it (see RewardRunner's ``given``). A failed sample (its agent failed, or an engine
        refused its request) has none."""
        from pdsr_sdk.dispatch.trajectory import extra_json

        if sample.turns is None:
            return (None, None, None) if sample.finish_reason == FAILED else None
        outcome = self.agents.outcomes.pop(sample, None)
        if sample.finish_reason == FAILED:
            return None, None, None   # no reward; the row's error says why
        if outcome is None or outcome.reward is None:
            return None
        return outcome.reward, extra_json(outcome.extra), None

    async def scores(self, samples: Iterable[Sample]) -> list:
        """The rewards of finished samples (:class:`~pdsr_sdk.rollout.reward_runner.Scored`, in order), waiting
        for those still being computed; a reward misconfigured (a pdsr error) raises here."""
        if self.rewards is None:
            raise RunError("scores: start the session first")
        return await self.rewards.wait(samples)

    async def _step_result(self, result: BatchResult, version: int) -> StepResult:
        import pyarrow as pa

        from pdsr_sdk.dispatch.trajectory import reward_extra_struct, sample_row, trajectory_schema

        samples = [s for g in result.groups for s in g.samples]
        loop = asyncio.get_running_loop()
        began = loop.time()
        scored = await self.scores(samples)
        waited = loop.time() - began
        self.rewards.forget(samples)
        rows = [sample_row(s, self.tokenizer, None, scored=sc) for s, sc in zip(samples, scored)]
        totals = GroupRewards.of_rows(rows, scored)
        table = reward_extra_struct(pa.Table.from_pylist(rows, schema=trajectory_schema()))
        summary = {
            "step": result.batch_index, "policy_version": version, "groups": len(result.groups),
            "samples": len(rows), "tokens": result.tokens, "makespan_s": result.makespan_s,
            "tokens_per_s": result.tokens_per_s,
            "mean_response_length": result.tokens / len(rows) if rows else 0.0,
            "reward_mean": totals.reward_sum / totals.rewarded_samples if totals.rewarded_samples else None,
            "reward_extra_means": extra_means(totals.reward_extra_sums), "reward_timeouts": totals.reward_timeouts,
            "reward_errors": totals.reward_errors, "reward_s": totals.reward_s, "reward_wait_s": waited,
            "engine_busy_s": dict(result.engine_busy_s), **result.stats, "engine_errors": list(result.engine_errors),
        }
        multi = [s for s in samples if s.turns is not None]
        if multi:
            summary.update({
                "agent_failed": sum(s.finish_reason == FAILED for s in multi),
                "turns_mean": sum(sum(t.role == "assistant" for t in s.turns) for s in multi) / len(multi),
                "env_tokens": sum(s.env_tokens for s in multi), "env_s": sum(s.env_s for s in multi)})
        return StepResult(step=result.batch_index, policy_version=version, groups=result.groups, table=table,
                          summary=summary, report=result, scores=scored)


def filter_value(scored: Any, metric: str, where: str) -> float | None:
    """The value of one sample that dynamic sampling's filter compares (``filter_groups.metric``, verl's
    ``algorithm.filter_groups.metric``), from its :class:`~pdsr_sdk.rollout.reward_runner.Scored`; None where
    its reward failed or its ``acc`` is NaN or infinite: left out, as a failed reward is, and the others
    compared (verl's ``np.std`` of a group holding a NaN is NaN, so verl filters that group whatever the others
    are). ``acc``: the reward's ``acc`` field, else its score before overlong shaping; ``score``: that score;
    ``seq_reward``: the reward after shaping. ``where`` names the sample in an error."""
    import json
    import math

    if scored is None or scored.reward is None:
        return None
    if metric == "seq_reward":
        return scored.reward
    fields = json.loads(scored.extra) if metric == "acc" and scored.extra else {}
    if not isinstance(fields, dict) or "acc" not in fields:
        return scored.unshaped   # a number reward's acc is its score, as verl logs it
    acc = fields["acc"]
    # a numpy bool or integer reaches the JSON of the extra fields as its text ('True', '3')
    acc = {"True": 1.0, "False": 0.0}.get(acc, acc) if isinstance(acc, str) else acc
    try:
        value = float(acc) if isinstance(acc, (bool, int, float, str)) else None
    except ValueError:
        value = None
    if value is not None:
        return value if math.isfinite(value) else None
    raise ConfigError(f"filter_groups.metric 'acc': {where}: the reward's acc is {acc!r:.60}, not a number or bool; "
                      f"compare the score instead (filter_groups.metric: score)")
