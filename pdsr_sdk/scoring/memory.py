"""Peak memory of a block of work: CUDA allocator peak on GPUs, peak RSS growth on Linux CPUs.

- CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``,
  minus what was allocated at the start (tensors the block created, at peak).
- CPU (Linux): the process's resident-set high-water mark (``VmHWM``), reset
  at the start by writing ``5`` to ``/proc/self/clear_refs``, minus the RSS at
  the start. Free heap memory is first returned to the OS (``malloc_trim``) so
  that reuse of already-resident memory hides as little as possible; the
  number is still a lower bound when the block reuses memory the process
  already held, and it counts every thread of the process.
- Elsewhere: unavailable (``None``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(key: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _malloc_trim() -> None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Context manager; after exit ``bytes`` is the peak growth (or None) and ``method`` says how it was measured."""

    def __init__(self, device: str = "cpu"):
        self.device = str(device)
        self.bytes: int | None = None
        self.method = "unavailable"
        self._base = 0

    def __enter__(self) -> "PeakMemory":
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            self.method = "CUDA max_memory_allocated growth"
            return self
        _malloc_trim()
        try:
            _CLEAR_REFS.write_text("5")
        except OSError:
            return self
        rss = _status_kib("VmRSS")
        if rss is not None:
            self._base = rss * 1024
            self.method = "peak RSS growth of the process (Linux VmHWM)"
        return self

    def __exit__(self, *exc) -> None:
        if self.method.startswith("CUDA"):
            import torch

            torch.cuda.synchronize(self.device)
            self.bytes = max(0, torch.cuda.max_memory_allocated(self.device) - self._base)
        elif self.method.startswith("peak RSS"):
            hwm = _status_kib("VmHWM")
            self.bytes = None if hwm is None else max(0, hwm * 1024 - self._base)
            if self.bytes is None:
                self.method = "unavailable"


def format_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
