"""The flags of a multi-step run (partial rollout across steps), shared by ``pdsr rollout`` and ``pdsr simulate``."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def step_stream_options(stream: str, over_provision_default: str, *, auto_update: bool = False) -> Callable[[F], F]:
    """The flags of a multi-step run (partial rollout across steps), the same in ``pdsr rollout`` and
    ``pdsr simulate`` (config keys ``steps``, ``over_provision``, ``step_groups``, ``max_staleness``,
    ``group_deadline``, ``kv_on_update``, ``update``, ``filter_groups.kind``). ``stream``: what the groups come from;
    ``auto_update``: ``--update auto`` too (the simulator runs both updates and names the faster)."""
    options = [
        click.option("--steps", type=int, default=None,
                     help=f"Multi-step run: K training steps over a stream of {stream}; unfinished samples carry "
                          f"into the next step with their tokens (partial rollout)."),
        click.option("--over-provision", type=float, default=None,
                     help=f"With --steps: keep ceil(B x (1 + F)) groups in flight; a step ends when B are "
                          f"complete.  [default: {over_provision_default}; with --filter-groups: adapted to the "
                          f"measured pass rate]"),
        click.option("--step-groups", type=int, default=None,
                     help="With --steps: groups a step consumes (B).  [default: --batch-size]"),
        click.option("--max-staleness", type=int, default=None,
                     help="With --steps: restart samples whose tokens are more than S policy versions old.  "
                          "[default: no bound]"),
        click.option("--group-deadline", type=int, default=None,
                     help="With --steps: a group launched at step t is consumed by step t + D (the step waits "
                          "for it).  [default: none]"),
        click.option("--kv-on-update", type=click.Choice(["recompute", "keep"]), default=None,
                     help="With --steps: what each weight update does to the engines' KV cache. recompute: reset "
                          "it (carried samples prefill their context again under the new weights); keep: go on "
                          "from it (PipelineRL's in-flight updates: no re-prefill, but their later tokens attend "
                          "to KV of the weights their earlier tokens were sampled with).  [default: recompute]"),
        click.option("--update", type=click.Choice(["all", "staggered"] + (["auto"] if auto_update else [])),
                     default=None,
                     help="With --steps: how each weight update reaches the engines. all: every engine loads it at "
                          "the step's end; staggered: responses of the ending version finish under it on the fewest "
                          "engines, which load once those end (off-policy by one, not partial)"
                          + ("; auto: run each F with both (with --max-partial-share, name the fastest of either "
                             "within the budget)" if auto_update else "")
                          + ".  [default: all]"),
        click.option("--filter-groups", type=click.Choice(["zero-variance"]), default=None,
                     help="Dynamic sampling (DAPO): filter out groups whose N rewards are all equal as they "
                          "complete; a step ends when B groups that pass are complete (multi-step; the filtered "
                          "groups are counted).  [default: off]"),
    ]

    def decorate(f: F) -> F:
        for option in reversed(options):
            f = option(f)
        return f
    return decorate
