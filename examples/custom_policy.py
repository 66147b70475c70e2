"""A dispatch policy written outside pdsr, used by the CLI and by the SDK.

``GroupAffinityPolicy`` keeps each prompt's group together on one engine (its samples share the
prompt's prefix-cache blocks there) and places groups greedily on the engine with the least work
assigned so far, counting each group as ``n`` x its prompt length + ``weight_per_sample`` tokens.
It subclasses the public base, ``pdsr_sdk.policies.base.Policy``, and has one setting.

Use it by import path (the folder holding ``examples/`` must be importable, e.g. the repository
root on ``PYTHONPATH``)::

    pdsr simulate --trace examples/traces/synth_256x8.jsonl --policy examples.custom_policy:GroupAffinityPolicy \\
        --set weight_per_sample=512 --fast 2 --heavy 0 --batch-size 16 --num-batches 2
    pdsr rollout --policy examples.custom_policy:GroupAffinityPolicy --n 4 --batch-size 4 --max-tokens 32

or register it under a name (``register()`` below, then ``--policy group-affinity`` /
``RolloutConfig(policy="group-affinity")`` in that process). Run this file for the SDK form::

    python examples/custom_policy.py      # two steps of the built-in tiny model with this policy
"""

from __future__ import annotations

from pydantic import Field

from pdsr_sdk.config import ConfigModel
from pdsr_sdk.policies.base import Policy

NAME = "group-affinity"
IMPORT_PATH = "examples.custom_policy:GroupAffinityPolicy"


class GroupAffinitySettings(ConfigModel):
    """Settings of the group-affinity example policy."""

    weight_per_sample: int = Field(256, ge=0, description="Tokens of work assumed per sample, besides its "
                                                           "prompt, when placing a group.")


class GroupAffinityPolicy(Policy):
    """Each group on one engine; groups placed greedily on the least-assigned engine."""

    name = NAME
    config_model = GroupAffinitySettings
    streaming = True   # each on_batch places only its own groups; the per-engine totals carry over

    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self.assigned: dict[str, int] = {}
        self.groups_placed = 0

    def on_batch(self, groups) -> None:
        engines = sorted((e for pool in self.ctx.pools().values() for e in pool), key=lambda e: e.name)
        for group in groups:
            engine = min(engines, key=lambda e: (self.assigned.get(e.name, 0), e.name))
            prompt_len = group.prompt_length or len(group.prompt_token_ids)
            self.assigned[engine.name] = (self.assigned.get(engine.name, 0)
                                          + group.n * (prompt_len + self.cfg.weight_per_sample))
            for sample in group.samples:
                self.ctx.submit(sample, engine=engine)
            self.groups_placed += 1
        self.ctx.count("affinity_groups", len(groups))

    def batch_report(self) -> dict:
        return {"affinity_engines_used": len(self.assigned)}


def register() -> str:
    """Register the policy under ``group-affinity`` in this process (idempotent); returns the name."""
    from pdsr_sdk.policies import POLICIES

    if NAME not in POLICIES:
        POLICIES.register(NAME, GroupAffinityPolicy)
    return NAME


def main(policy: str = IMPORT_PATH, steps: int = 2) -> list[dict]:
    from pdsr_sdk import RolloutConfig, RolloutSession

    config = RolloutConfig(policy=policy, batch_size=4, sampling={"n": 4, "max_tokens": 32})
    summaries = []
    with RolloutSession(config) as session:
        prompts = iter(session.load_prompts())
        for _ in range(steps):
            out = session.step(prompts)
            engines = {seg.engine for s in out.samples for seg in s.segments}
            per_group = [{seg.engine for s in g.samples for seg in s.segments} for g in out.groups]
            print(f"step {out.step}: {out.table.num_rows} samples, {out.summary['tokens']} tokens, "
                  f"engines used {sorted(engines)}, every group on one engine: "
                  f"{all(len(e) == 1 for e in per_group)}", flush=True)
            summaries.append(out.summary)
    return summaries


if __name__ == "__main__":   # engine processes are spawned: the guard is required
    import sys

    main(sys.argv[1] if len(sys.argv) > 1 else IMPORT_PATH)
