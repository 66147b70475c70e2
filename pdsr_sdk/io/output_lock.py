"""One run at a time on an output: ``pdsr rollout`` and ``pdsr score`` hold :func:`output_lock` on theirs while they
write it (part files under ``<out>.parts/`` included), so a second run on the same ``--out`` is refused instead of
both writing parts under the same numbers."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from pdsr_sdk.errors import DataError


@contextlib.contextmanager
def output_lock(path: str | Path, command: str) -> Iterator[None]:
    """Held while a run (``command``, such as ``"pdsr score"``) writes ``path``: an exclusive lock (``flock``) on
    ``<path>.lock``, which holds the process id and ``command``, removed at the end. A second run on the same
    output (a ``--resume`` started while the first still runs: a background job ignores Ctrl-C's SIGINT) is a
    DataError naming the path, the running one's command and process id, instead of both writing part files under
    the same numbers (each replacing the other's) and doing the same work twice. The output's folder is made for
    the lock where it is missing (two runs into a new folder are kept apart too), and removed again if the run
    leaves it empty. Where it cannot be made, or on a system without ``fcntl``, nothing is locked (the output
    checks name a folder that cannot be written)."""
    try:
        import fcntl
    except ImportError:   # not POSIX
        yield
        return
    path = Path(path)
    lock = _beside(path, ".lock")
    made = _missing_folders(lock.parent)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = _locked(lock, fcntl)
    except OSError:
        _remove_empty(made)
        yield
        return
    except DataError as e:
        _remove_empty(made)
        raise DataError(f"{path}: {e}") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {command}".encode())
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)
    finally:
        os.close(fd)
        _remove_empty(made)


def _locked(lock: Path, fcntl) -> int:
    """A descriptor of ``lock`` holding its exclusive flock. A run that ends unlinks its lock file, so one that opened
    the file just before that would lock a file no longer on disk while a third run locks a new one: the lock is
    kept only if ``lock`` still names the locked file, else taken again on the file there now."""
    for _ in range(100):
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pid, command = _holder(os.read(fd, 256).decode(errors="replace"))
            os.close(fd)
            pid, command = pid or "unknown", command or "pdsr run"
            raise DataError(f"another {command} is writing this output (process {pid}, holding {lock.name}); let it "
                            f"finish or stop it (kill {pid}: it keeps what it finished) before running again with "
                            f"--resume") from None
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)   # unlinked or replaced by the run that held it: lock the file there now
    raise OSError(f"{lock}: replaced again and again while locking it")


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those above it that do not exist, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) that are empty: made for a lock by a run that wrote nothing there."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:   # not empty (the run wrote), or gone
            return


def unfinished_output(path: str | Path, read_parts: str) -> str | None:
    """Why an output ``path`` that does not exist is not there yet, where a run writing it left traces: a run
    (``pdsr rollout``) streams its finished groups into part files under ``<path>.parts/`` and writes ``path`` only
    at its end, holding ``<path>.lock`` meanwhile; an input that names the output of a run still going, or of one
    stopped before its end, read only "file does not exist". None when neither is there. ``read_parts``: how the
    caller's user reads the part files (``{parts}`` is the folder), said where there are some."""
    path = Path(path)
    parts, lock = parts_dir(path), _beside(path, ".lock")
    has_parts = parts.is_dir() and any(parts.glob("part-*.parquet"))
    finished = (f"the part files of what it has finished so far are in {parts}/: {read_parts.format(parts=parts)}"
                if has_parts else "it has finished nothing yet")
    holder = _live_holder(lock)
    if holder is not None:
        pid, command = holder
        return (f"{command} (process {pid}, holding {lock.name}) is still writing it and writes it at its end; "
                f"{finished}")
    if has_parts:
        return (f"a run writing it stopped before its end (--resume finishes it); the part files of what it "
                f"finished are in {parts}/: {read_parts.format(parts=parts)}")
    return None


def _live_holder(lock: Path) -> tuple[int, str] | None:
    """(process id, command) written in ``lock`` where that process still runs (a lock of a run killed with
    SIGKILL stays on disk: its process is gone)."""
    try:
        text, command = _holder(lock.read_text(errors="replace"))
        pid = int(text)
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except OSError:   # another user's process: it runs
        pass
    return pid, command or "a pdsr run"


def output_in_progress(path: str | Path) -> str | None:
    """Where a file that exists is the output of a run still writing it (its ``<path>.lock`` names a process that
    runs: a ``--resume`` adding groups, or an ``--overwrite`` run): what reading it now gets. Such a run writes what
    it finishes into ``<path>.parts/`` and ``path`` only at its end, so the file read now is what was there when
    the run started, and a reader of it was told nothing. None otherwise."""
    path = Path(path)
    holder = _live_holder(_beside(path, ".lock"))
    if holder is None:
        return None
    pid, command = holder
    parts = parts_dir(path)
    return (f"{command} (process {pid}, holding {path.name}.lock) is writing this output now: the file read is what "
            f"it held when that run started; the groups finished since are in {parts}/ and join it at the run's end")


def parts_dir(path: str | Path) -> Path:
    """``<path>.parts/``: the folder of an output's part files while a run writes it (``pdsr rollout``'s groups,
    ``pdsr score``'s blocks), kept by an interrupted run for ``--resume``."""
    return _beside(Path(path), ".parts")


def _beside(path: Path, suffix: str) -> Path:
    """``<path><suffix>``: the lock file (``.lock``) or the part files' folder (``.parts``) of an output."""
    return path.with_name(path.name + suffix)


def _holder(text: str) -> tuple[str, str | None]:
    """A lock file's words, ``"<process id> <command>"``: (the process id as written, "" where none; the command,
    None where a pdsr that wrote only its process id held it)."""
    held = text.split(maxsplit=1)
    return (held[0] if held else ""), (held[1] if len(held) > 1 else None)
