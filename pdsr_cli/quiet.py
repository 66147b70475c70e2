"""What the long-running commands show besides their own lines: ``--quiet`` and log-file output.

``--quiet`` hides progress bars and third-party warnings and logs (vLLM, transformers, torch, Triton,
Python warnings) in this process and in the engine processes it spawns (they inherit the environment set
here); pdsr's own ``pdsr: ...`` status lines, warnings and the summary stay. When stderr is not a terminal
(a log file, a pipe), third-party progress bars, which redraw with carriage returns, are turned off.
Everything is restored when the command ends (tests run commands in one process).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from typing import Iterator

from pdsr_sdk.environ import patched_environ

#: the environment of a --quiet run (forced: the flag says what the user wants), inherited by engine processes
QUIET_ENV = {
    "PDSR_QUIET": "1",                        # read by pdsr_cli.main when an engine process imports it
    "VLLM_LOGGING_LEVEL": "ERROR",
    "PYTHONWARNINGS": "ignore",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TORCH_CPP_LOG_LEVEL": "ERROR",           # torch's C++ warnings (e.g. NUMA binding on the CPU build)
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
}
#: the environment when stderr is not a terminal: no redrawing third-party bars (defaults, not forced)
LOG_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}
#: loggers a --quiet run sets to errors only
QUIET_LOGGERS = ("", "vllm", "transformers", "torch", "triton", "ray", "numba", "urllib3", "filelock", "httpx")


def stderr_is_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty is not None and isatty())


def quiet_logging() -> None:
    """Errors only from the loggers of :data:`QUIET_LOGGERS` (before vLLM's own set-up: its import-time
    warnings, like Triton's, otherwise reach Python's last-resort handler)."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


@contextlib.contextmanager
def output_mode(quiet: bool) -> Iterator[None]:
    """``--quiet`` (see the module docstring), and third-party bars off when stderr is not a terminal."""
    env = dict(QUIET_ENV) if quiet else {}
    if not stderr_is_terminal():
        env.update({k: v for k, v in LOG_ENV.items() if k not in os.environ})
    saved_levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    try:
        with patched_environ(env), warnings.catch_warnings():
            if quiet:
                from pdsr_sdk.errors import PdsrDeprecationWarning, PdsrWarning

                quiet_logging()
                warnings.simplefilter("ignore")
                for own in (PdsrDeprecationWarning, PdsrWarning):   # pdsr's own: a one-line 'warning:'
                    warnings.simplefilter("always", own)
            yield
    finally:
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)


def quiet_engine_args(config, quiet: bool = False):
    """``config`` (a RolloutConfig) with vLLM's weight-loading bar off (``use_tqdm_on_load: false``) on every
    vLLM/Ray engine whose ``engine_args`` do not set it: for --quiet and for log files. (That bar is drawn
    in the engine process with an explicit setting, so TQDM_DISABLE does not reach it.) Ray actors do not
    inherit this process's environment: with ``config.ray`` set they get the environment of the mode
    (:data:`QUIET_ENV` with ``quiet``, else :data:`LOG_ENV`) in ``ray.env_vars``, the user's values first."""
    key = "use_tqdm_on_load"
    update: dict = {}
    if config.ray is not None:
        env = QUIET_ENV if quiet else LOG_ENV
        update["ray"] = config.ray.model_copy(update={"env_vars": {**env, **config.ray.env_vars}})
    defaults = dict(config.engine_defaults)
    if defaults.get("backend", "vllm") in ("vllm", "ray"):
        defaults["engine_args"] = {key: False, **(defaults.get("engine_args") or {})}
        update["engine_defaults"] = defaults
    if config.engines is not None:
        update["engines"] = [e.model_copy(update={"engine_args": {key: False, **e.engine_args}})
                             if e.backend in ("vllm", "ray") else e for e in config.engines]
    return config.model_copy(update=update)
