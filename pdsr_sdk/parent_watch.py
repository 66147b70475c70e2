"""No orphans: engine processes end when the process that started them dies, SIGKILL included.

A process killed with SIGKILL runs no clean-up, so its engine processes must notice on their own.
pdsr's vLLM plugin (run in every vLLM process) calls :func:`arm_from_env`; in a process that
pdsr's orchestrator started, directly (the engine core) or through vLLM (its tensor-parallel
workers, started by the core), it starts a daemon thread that polls ``os.getppid()``. When the
parent is gone the process is re-parented (to init or a sub-reaper), so ``getppid()`` no longer
names the pid that started it: the thread then SIGKILLs the process's own descendants and the
process itself. The chain covers any depth: a worker watches its core, the core the orchestrator.

Polling (every 0.2 s) rather than ``PR_SET_PDEATHSIG``: Linux sends the death signal when the
*thread* that forked the child ends, and pdsr spawns engine cores from a pool thread that can end
while the orchestrator lives on. Polling works on every POSIX system too.

When it starts: a spawned process imports the parent's main module first (multiprocessing's spawn),
so ``import pdsr_sdk`` there (a trainer script, or ``pdsr`` itself) calls :func:`arm_early`: an engine
core starts its watch (and leaves the terminal's process group) within a fraction of a second of
being spawned. Otherwise (a main module that does not import pdsr) the watch starts when vLLM loads
its plugins (a few seconds later, after its first handshake with the orchestrator); a core whose
parent dies before then waits for that handshake and exits when vLLM's timeout ends
(``VLLM_ENGINE_READY_TIMEOUT_S``, 600 s).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading

#: pid of the pdsr process that started the engines (set while an engine core is spawned)
ORCHESTRATOR_PID_ENV = "PDSR_ORCHESTRATOR_PID"
#: pid of the engine core, set in the core itself: its children (vLLM's workers) are not direct children
ENGINE_CORE_PID_ENV = "PDSR_ENGINE_CORE_PID"
POLL_S = 0.2

_armed = False


def arm_from_env() -> bool:
    """Start watching this process's parent if pdsr's orchestrator started it (directly or through
    vLLM). Returns whether a watch was started. Does nothing in the orchestrator itself."""
    orchestrator = os.environ.get(ORCHESTRATOR_PID_ENV)
    parent = multiprocessing.parent_process()
    if not orchestrator or parent is None or parent.pid is None or str(os.getpid()) == orchestrator:
        return False
    if str(parent.pid) == orchestrator:
        os.environ[ENGINE_CORE_PID_ENV] = str(os.getpid())
        leave_terminal_group()
    # the engine core (a direct child) also removes the error file its dead orchestrator can no longer read
    error_file = os.environ.get("PDSR_ENGINE_ERROR_FILE") if str(parent.pid) == orchestrator else None
    return watch_parent(parent.pid, remove=(error_file,) if error_file else ())


def arm_early() -> bool:
    """Start the watch in an engine core (a direct child of pdsr's orchestrator) while it imports the main
    module, before multiprocessing knows its parent. Returns whether a watch was started; in the
    orchestrator and in vLLM's workers (whose environment names their core) nothing. If the orchestrator
    is already gone, the core ends here."""
    orchestrator = os.environ.get(ORCHESTRATOR_PID_ENV)
    if not orchestrator or str(os.getpid()) == orchestrator or os.environ.get(ENGINE_CORE_PID_ENV):
        return False
    os.environ[ENGINE_CORE_PID_ENV] = str(os.getpid())   # what this core spawns (vLLM's workers) inherits it
    leave_terminal_group()
    error_file = os.environ.get("PDSR_ENGINE_ERROR_FILE")
    return watch_parent(int(orchestrator), remove=(error_file,) if error_file else ())


def leave_terminal_group() -> None:
    """Put the engine core in a process group of its own, before it starts vLLM's workers (which
    join it): Ctrl-C at a terminal goes to the foreground group, and it is the orchestrator's to
    handle (it shuts its engines down); a worker that got it too would die mid-start-up with a
    traceback. The parent watch still ends the group's processes if the orchestrator dies."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)


def watch_parent(parent_pid: int, *, interval: float = POLL_S, remove: tuple[str, ...] = ()) -> bool:
    """End this process (and its descendants) once ``parent_pid`` is no longer its parent."""
    global _armed, _fork_hooked
    if _armed:
        return False
    _armed = True
    if os.getppid() != parent_pid:   # the parent died before the watch started
        _end(remove)
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(interval):
            if os.getppid() != parent_pid:
                _end(remove)

    threading.Thread(target=watch, name="pdsr-parent-watch", daemon=True).start()
    if not _fork_hooked:
        _fork_hooked = True
        os.register_at_fork(after_in_child=_watch_forker)
    return True


_fork_hooked = False


def _watch_forker() -> None:
    """In a process forked from a watched one (vLLM's worker forked from its engine core, see
    vllm_plugin.py): the watch thread did not survive the fork; watch the process that forked this one."""
    global _armed, _fork_hooked
    _armed = False
    _fork_hooked = True   # the hook is inherited: it runs in this process's own forks too
    watch_parent(os.getppid())


def _end(remove: tuple[str, ...]) -> None:
    for path in remove:
        with contextlib.suppress(OSError):
            os.unlink(path)
    for pid in _descendants():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _descendants() -> list[int]:
    try:
        import psutil  # a vLLM dependency

        return [p.pid for p in psutil.Process().children(recursive=True)]
    except Exception:  # noqa: BLE001 - fall back to the children multiprocessing knows of
        return [p.pid for p in multiprocessing.active_children() if p.pid]
