"""A script that starts engines at import (no ``if __name__ == "__main__":``) failed with only "engine 'fast-0':
failed to start: RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}":
vLLM's engine core is a spawned process that imports the script again, and the real cause (Python's bootstrapping
error) was in the child's traceback above. The error now names the script and the guard. (The whole failure, on a
real engine, takes a minute: the hint's rule is checked here on module objects.)"""

from __future__ import annotations

import types

from pdsr_sdk.engines.vllm_spawn import unguarded_script_hint


def _module(path) -> types.ModuleType:
    mod = types.ModuleType("__main__")
    if path is not None:
        mod.__file__ = str(path)
    return mod


def test_a_script_without_the_guard_is_named(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("from pdsr_sdk.rollout import RolloutSession\nsession = RolloutSession(cfg)\n")
    hint = unguarded_script_hint(_module(script))
    assert hint.startswith(f"; {script} has no `if __name__ == \"__main__\":`") and "docs/sdk.md" in hint


def test_no_hint_where_the_script_is_guarded_or_there_is_no_script(tmp_path):
    guarded = tmp_path / "train.py"
    guarded.write_text("def main(): ...\n\nif __name__ == '__main__':\n    main()\n")
    assert unguarded_script_hint(_module(guarded)) == ""
    assert unguarded_script_hint(_module(None)) == ""                       # an interactive session
    assert unguarded_script_hint(_module(tmp_path / "gone.py")) == ""       # unreadable
    assert unguarded_script_hint(_module(tmp_path / "pdsr")) == ""          # a console script, not a .py file
