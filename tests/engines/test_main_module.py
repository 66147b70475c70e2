"""``python -m pdsr_cli`` (the ``pdsr`` command where the console script is not on PATH): an engine process it
spawns imports pdsr at once, so that its watch on pdsr (pdsr_sdk/parent_watch.py) starts before vLLM's
start-up handshake, as under the console script. No vLLM: a spawned process stands in for the engine core."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from support import ROOT

# what ``python -m pdsr_cli`` runs, its command replaced by one that spawns a process (as vLLM spawns its
# engine core, pdsr's orchestrator pid in its environment) whose exit status says whether its watch started
SPAWNING_CLI = textwrap.dedent("""
    import multiprocessing, os, runpy, sys
    import pdsr_cli.main
    from pdsr_sdk.parent_watch import ENGINE_CORE_PID_ENV, ORCHESTRATOR_PID_ENV

    def spawn_an_engine_core(**_):
        os.environ[ORCHESTRATOR_PID_ENV] = str(os.getpid())
        armed = f"import os, sys; sys.exit(0 if os.environ.get({ENGINE_CORE_PID_ENV!r}) == str(os.getpid()) else 3)"
        core = multiprocessing.get_context("spawn").Process(target=exec, args=(armed,))
        core.start()
        core.join()
        sys.exit(core.exitcode)

    pdsr_cli.main.cli = spawn_an_engine_core
    sys.argv = ["pdsr"]
    runpy.run_module("pdsr_cli", run_name="__main__", alter_sys=True)   # python -m pdsr_cli
""")


def test_an_engine_process_spawned_under_python_m_pdsr_cli_watches_pdsr_at_once(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", SPAWNING_CLI], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
