"""No orphans (issue 15, item 2): engine processes end when their parent dies, SIGKILL included, and
Ctrl-C while the engines start exits with one line saying what was written, no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from process_checks import alive, gone_within
from support import ROOT, WAIT_S, requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]   # real engines start: 30-70 s
psutil = pytest.importorskip("psutil")


ENGINE_SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from pdsr_sdk.engines.vllm_env import apply_cpu_defaults
    apply_cpu_defaults()
    from pdsr_sdk.engines.vllm_engine import VllmEngine
    from pdsr_sdk.rollout.config import EngineSpec

    async def main():
        engine = VllmEngine.from_spec(EngineSpec(name="orphan-0", pool="fast", devices=[0], max_num_seqs=2,
                                                 max_model_len=512, warmup_tokens=0), model=sys.argv[1])
        await engine.start()
        await asyncio.sleep(600)

    if __name__ == "__main__":
        asyncio.run(main())
""")


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)   # the engine core must be a process of its own
    return env


def _sigint_as_at_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _descendants(pid: int) -> list:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _wait_for_worker(proc: subprocess.Popen, timeout: float = WAIT_S) -> list:
    """The process tree once vLLM's worker exists (the core has loaded pdsr's plugin by then)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()[1] if proc.stderr else f"exit {proc.returncode}"
        kids = _descendants(proc.pid)
        names = set()
        for k in kids:
            try:
                names.add(k.name())
            except psutil.Error:
                pass
        if any("Worker" in n for n in names) and any("EngineCore" in n for n in names):
            return kids
        time.sleep(0.1)
    raise TimeoutError("the engine processes did not start")


def test_sigkill_of_the_parent_ends_every_engine_process(tmp_path, tiny_model_dir):
    script = tmp_path / "engine.py"
    script.write_text(ENGINE_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tiny_model_dir)], env=_env(), cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        kids = _wait_for_worker(proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        left = gone_within(kids, 60.0)     # the watch polls each second; 60 s is for a loaded machine
    finally:
        for p in alive(_descendants(proc.pid)):
            p.kill()
    for p in left:
        p.kill()
    assert not left, f"still running 60 s after the parent was killed: {left}"


@pytest.mark.parametrize("stop, status, lead", [
    ("ctrl-c", 130, "interrupted"),
    ("sigterm-to-parent", 143, "terminated (SIGTERM)"),
])
def test_stopped_during_engine_start_up_exits_with_one_line(tmp_path, tiny_model_dir, stop, status, lead):
    """Ctrl-C at a terminal (SIGINT to the whole group), or SIGTERM (kill PID, a scheduler, a container
    runtime) to the pdsr process alone: the run is cancelled, says so in one line, and its engines end."""
    out = tmp_path / "runs" / "r.parquet"
    cmd = [sys.executable, "-m", "pdsr_cli.main", "rollout", "--model", str(tiny_model_dir), "--n", "2",
           "--max-tokens", "8", "--limit", "2", "--out", str(out), "--quiet"]
    # a session of its own, so a SIGINT to its group reaches every process in it, as Ctrl-C at a terminal does
    # and SIGINT handled as at a terminal: a test run started in the background (a non-interactive shell's
    # `&`, nohup) ignores SIGINT, and a child inherits that
    proc = subprocess.Popen(cmd, env=_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=_sigint_as_at_a_terminal)
    try:
        kids = _wait_for_worker(proc)
        if stop == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == status, stderr
    assert "Traceback" not in stdout + stderr, stdout + stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert lines[-1] == f"{lead} while the engines were starting: nothing was written", stderr
    assert sum(lead in ln for ln in lines) == 1
    assert "on disk" not in stderr
    assert not out.exists() and not out.with_name(out.name + ".parts").exists()
    assert not gone_within(kids, 5.0)


def test_sigkill_in_the_first_moments_of_an_engine_core_ends_it_too(tmp_path, tiny_model_dir):
    """The parent dies right after spawning the engine core, before vLLM loads pdsr's plugin: the core
    (which imports the parent's main module, and so pdsr, first) watches its parent from then on and
    ends within seconds, not when vLLM's 600 s handshake timeout ends."""
    out = tmp_path / "r.parquet"
    cmd = [sys.executable, "-m", "pdsr_cli.main", "rollout", "--model", str(tiny_model_dir), "--n", "2",
           "--max-tokens", "8", "--limit", "2", "--out", str(out), "--quiet"]
    proc = subprocess.Popen(cmd, env=_env(), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    core = None
    try:
        end = time.monotonic() + WAIT_S
        while core is None and time.monotonic() < end:
            assert proc.poll() is None, f"exit {proc.returncode}"
            for k in _descendants(proc.pid):
                try:
                    if "spawn_main" in " ".join(k.cmdline()):
                        core = k
                except psutil.Error:
                    pass
            time.sleep(0.02)
        assert core is not None, "no engine core was spawned"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        left = gone_within([core], 60.0)
    finally:
        for p in alive(_descendants(proc.pid) + ([core] if core else [])):
            p.kill()
    assert not left, "the engine core outlived its parent by 60 s"
