"""The GRPO loop of ``grpo_train.py`` with the engines as Ray actors.

The trainer (this process) keeps the dispatch policy, the torch model and the optimizer; the vLLM
engines run in Ray actors wherever Ray places them, and ``session.update_weights`` sends each update
once into Ray's object store, from which every actor loads it. The only change to the loop is the
config: ``RolloutConfig(ray={"address": ...})`` makes the automatic layout's engines Ray actors
(backend ``ray``; see docs/ray.md). The loop itself is ``grpo_train.train``, not a copy.

    python examples/ray_engines.py                      # a one-machine Ray cluster started here
    python examples/ray_engines.py --ray auto --model /shared/models/my-policy   # a running cluster
    python examples/ray_engines.py --compare --steps 6  # with updates, then the control

Every flag of grpo_train.py works here; only ``--ray`` defaults to ``local``. On a real cluster the
model folder must be readable at the same path on every node (docs/ray.md, "Model weights"), and
the reward words must be single tokens of its tokenizer (``grpo_train.COMMON_WORDS``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))   # grpo_train, also when imported as examples.*

from grpo_train import GrpoSettings  # noqa: E402
from grpo_train import main as grpo_main  # noqa: E402


def main(argv: Sequence[str] | None = None) -> dict[str, list[dict]]:
    return grpo_main(argv, defaults=GrpoSettings(ray="local"))


if __name__ == "__main__":   # engine processes are spawned: the guard is required
    main()
