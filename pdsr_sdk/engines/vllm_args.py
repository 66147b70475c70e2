"""An engine's ``engine_args`` (vLLM engine arguments passed through) checked when the engine is built, before any
engine starts: a key vLLM's ``AsyncEngineArgs`` does not have, or one pdsr sets from a setting of its own (which
the rest of pdsr reads), is a ConfigError naming the engine and the key."""

from __future__ import annotations

import difflib
import importlib.util
from typing import Any

from pdsr_sdk.errors import ConfigError

#: vLLM arguments pdsr sets from its own settings, and the setting to use instead: pdsr reads those (the scheduler an
#: engine's slots, the prompt checks its context, the trajectories the log-probs' kind), so an override in
#: engine_args would leave pdsr and vLLM disagreeing
OWNED = {
    "model": "the run's model (RolloutConfig.model, --model)",
    "tokenizer": "the run's tokenizer (RolloutConfig.tokenizer)",
    "seed": "the run's seed (RolloutConfig.seed, --seed)",
    "logprobs_mode": "the run's logprobs_mode",
    "max_model_len": "the engine's own max_model_len key",
    "max_num_seqs": "the engine's own max_num_seqs key",
    "tensor_parallel_size": "the engine's own tensor_parallel_size key",
    "worker_extension_cls": "nothing: pdsr's weight updates need its own",
}


def check_engine_args(spec: Any) -> None:
    """Refuse a key of ``spec.engine_args`` that vLLM does not take or that pdsr owns (:data:`OWNED`); without vLLM
    installed only the latter (the engine cannot start anyway)."""
    where = f"engine {spec.name!r}: engine_args"
    for key in spec.engine_args:
        if key in OWNED:
            raise ConfigError(f"{where}.{key}: pdsr sets vLLM's {key} itself; set {OWNED[key]}")
    if importlib.util.find_spec("vllm") is None:
        return
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    for key in spec.engine_args:
        if key not in known:
            import vllm

            close = difflib.get_close_matches(str(key), sorted(known), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"{where}.{key}: not an argument of vLLM {vllm.__version__}'s AsyncEngineArgs{hint}")
