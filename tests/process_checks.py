"""Shared by the tests that check no engine process outlives a run (tests/engines/test_orphans.py,
tests/rollout/test_faults_engine.py): which processes still run, and waiting for them to end."""

from __future__ import annotations

import time

import pytest

psutil = pytest.importorskip("psutil")


def alive(procs: list) -> list:
    """Those of ``procs`` still running (a zombie, exited but not reaped, counts as ended)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def gone_within(procs: list, seconds: float) -> list:
    """Wait up to ``seconds`` for ``procs`` to end; those still running then."""
    end = time.monotonic() + seconds
    while alive(procs) and time.monotonic() < end:
        time.sleep(0.1)
    return alive(procs)
