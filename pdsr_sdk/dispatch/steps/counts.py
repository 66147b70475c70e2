"""How many groups a step stream keeps in flight and launches, the group filters of dynamic sampling, and the
check that a multi-turn source can stream."""

from __future__ import annotations

import math
from typing import Callable, Sequence

from pdsr_sdk.errors import ConfigValueError


def in_flight(b: int, over_provision: float) -> int:
    """Groups kept in flight for steps of ``b`` groups with over-provision ``over_provision``."""
    return max(b, math.ceil(b * (1.0 + over_provision) - 1e-9))


def has_reward_variance(rewards: Sequence[float | None]) -> bool:
    """The ``zero-variance`` filter: a group passes when its rewards (failed ones, None, left out) are not all
    equal, i.e. at least two differ; all right or all wrong gives every GRPO advantage 0. A group of one sample
    (n = 1) passes when it has its reward, as verl's DAPO trainer keeps it: its GRPO advantage is the score
    itself. Values are compared exactly, where verl's ``np.std(...) > 0`` can keep three equal 0.1s (1e-17)."""
    if len(rewards) == 1:
        return rewards[0] is not None
    return len({r for r in rewards if r is not None}) > 1


#: the filters ``filter_groups.kind`` names: rewards of a group's samples -> passes
GROUP_FILTERS: dict[str, Callable[[Sequence[float | None]], bool]] = {"zero-variance": has_reward_variance}


def adaptive_in_flight(b: int, pass_rate: float) -> int:
    """Groups to keep in flight so that ``b`` of them are expected to pass the filter at ``pass_rate``."""
    return max(b, math.ceil(b / pass_rate - 1e-9))


def needed_launches(need: int, incomplete: int, pass_rate: float) -> int:
    """New groups to launch when ``need`` passing groups are still missing and ``incomplete`` groups are in
    flight, each expected to pass with ``pass_rate``: enough that ``incomplete x pass_rate >= need``."""
    if need <= 0:
        return 0
    return max(0, math.ceil(need / pass_rate - 1e-9) - incomplete)


def groups_launched(b: int, over_provision: float, steps: int) -> int:
    """Groups a stream of ``steps`` steps launches (carried ones included) when every step consumes
    exactly ``b``: the first fills the in-flight count, each middle step refills ``b``, and the last
    launches only what brings the groups in flight to ``b`` (it drains). A step that must also take
    due groups consumes more, so this is what a progress bar expects, not a bound."""
    if steps <= 1:
        return b
    return b * (steps - 2) + max(in_flight(b, over_provision), 2 * b)

def check_agent_streaming(max_staleness: int | None, filtering: bool, what: str = "with an agent") -> None:
    """ConfigValueError where a step stream would restart multi-turn samples for staleness (their agents hold
    the conversation, so they are never restarted): a bound other than none, or 0 with filter_groups. ``what``
    names the multi-turn source in the message (an agent, a simulated trace of turns)."""
    if max_staleness is None or (max_staleness == 0 and filtering):
        return
    raise ConfigValueError(f"max_staleness {max_staleness} {what}: a multi-turn sample is never restarted "
                           f"(its agent holds the conversation), so partial rollout {what} keeps its "
                           f"samples' older tokens (drop max_staleness; correct them with importance weights), "
                           f"or, with filter_groups, max_staleness 0 drops the groups a step's end leaves")
