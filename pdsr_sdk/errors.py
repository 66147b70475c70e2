"""User-facing errors.

Everything pdsr raises on bad input derives from :class:`PdsrError`; the CLI
prints these as one clean message (no traceback) and exits with status 2.
"""

from __future__ import annotations


class PdsrError(Exception):
    """An error the user can fix: bad input, bad config, unknown name."""


class ConfigError(PdsrError):
    """A config file or flag is invalid; the message names the file and dotted key."""


class DataError(PdsrError):
    """An input data file is invalid; the message names the file, row or column."""


class ConfigValueError(ConfigError, ValueError):
    """A config value or SDK argument out of range. Also a ValueError: pydantic validators raise it (and
    :func:`~pdsr_sdk.config.load_config` reports it naming the file and key), callers may catch ValueError."""


class DataValueError(DataError, ValueError):
    """Input data of the wrong shape or size; also a ValueError."""


class RunError(PdsrError, RuntimeError):
    """A run cannot go on (no live engine left in a pool a policy needs), or an SDK call came out of
    order (a batch report before the batch finished). Also a RuntimeError."""


class UnsupportedError(PdsrError, NotImplementedError):
    """An engine cannot do what was asked (e.g. free its memory with ``session.sleep()`` on vLLM's CPU
    build); the message names the engines and what works instead. Also a NotImplementedError."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM stopped a run; the message (one line, starting "interrupted" or
    "terminated (SIGTERM)") says what, if anything, was written; ``exit_status`` is the CLI's (130 for
    SIGINT, 143 for SIGTERM, as a shell reports a process those signals ended). Still a
    KeyboardInterrupt, so code that catches that keeps working."""

    def __init__(self, message: str = "", exit_status: int = 130) -> None:
        super().__init__(message)
        self.exit_status = exit_status


class PdsrDeprecationWarning(DeprecationWarning):
    """An old spelling (config key, flag) that still works; the message names what to use instead."""


class PdsrWarning(UserWarning):
    """Input that pdsr reads but partly ignores (a key a trace line does not define); the message names the file,
    the line and what is ignored."""


class EngineError(PdsrError):
    """An engine failed; carries the engine's name, exit status and its own traceback."""

    def __init__(self, engine: str, message: str, *, exit_status: int | None = None,
                 remote_traceback: str | None = None):
        self.engine = engine
        self.message = message
        self.exit_status = exit_status
        self.remote_traceback = remote_traceback
        parts = [f"engine {engine!r}: {message}"]
        if exit_status is not None:
            parts.append(f"(exit status {exit_status}{_signal_name(exit_status)})")
        text = " ".join(parts)
        if remote_traceback:
            text += "\n--- engine traceback ---\n" + remote_traceback.rstrip()
        super().__init__(text)

    def __reduce__(self):
        # so it crosses process boundaries (multiprocessing, Ray) intact
        return (_rebuild_engine_error, (self.engine, self.message, self.exit_status, self.remote_traceback))


def _signal_name(exit_status: int) -> str:
    """``: killed by SIGKILL`` for a negative exit status (a process a signal ended, as multiprocessing reports it)."""
    import signal

    try:
        return f": killed by {signal.Signals(-exit_status).name}" if exit_status < 0 else ""
    except ValueError:
        return ""


def _rebuild_engine_error(engine, message, exit_status, remote_traceback) -> EngineError:
    return EngineError(engine, message, exit_status=exit_status, remote_traceback=remote_traceback)
