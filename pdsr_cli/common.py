"""Helpers shared by the CLI commands: config assembly, error and deprecation reporting, the policy
flags (``--policy``, ``--set [POLICY:]KEY=VALUE``) of ``pdsr rollout`` and ``pdsr simulate``."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, TypeVar

import click
from click.core import ParameterSource

from pdsr_cli.foreign_flags import foreign_key_hints
from pdsr_sdk.errors import Interrupted, PdsrDeprecationWarning, PdsrError, PdsrWarning

F = TypeVar("F", bound=Callable[..., Any])


class UserPathType(click.Path):
    """``click.Path`` with a leading ``~`` expanded to the home folder: a shell leaves it in ``--out=~/x`` and in a
    quoted ``'~/x/*.parquet'``, and a folder named ``~`` would be made in the working one."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return super().convert(os.path.expanduser(value) if isinstance(value, str) else value, param, ctx)


def config_option(f: F) -> F:
    """``--config FILE``: a YAML/JSON file of the command's config; flags override it."""
    return click.option(
        "--config", "config_path", type=UserPathType(dir_okay=False, path_type=Path), default=None,
        help="YAML or JSON config file; command-line flags override its values.",
    )(f)


def handle_errors(f: F) -> F:
    """Print pdsr's user errors as one clean message (exit 2), never a deep traceback. SIGTERM stops a command
    as Ctrl-C does (exit 143): a file it was writing is removed, not left half-written beside its output."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with warnings.catch_warnings(), _sigterm_interrupts(), foreign_key_hints():
                warnings.simplefilter("always", PdsrDeprecationWarning)
                warnings.simplefilter("always", PdsrWarning)
                warnings.showwarning = functools.partial(_show_warning, warnings.showwarning, set())
                return f(*args, **kwargs)
        except PdsrError as exc:
            click.echo(f"error: {exc}", err=True)
            for note in getattr(exc, "__notes__", ()):   # what a run kept, and how to go on (pdsr_sdk.rollout.run)
                click.echo(note, err=True)
            sys.exit(2)
        except KeyboardInterrupt as exc:
            # one line; what was written is said only where the command knows (pdsr_sdk.errors.Interrupted)
            lead = "\n" if sys.stderr.isatty() else ""   # past the terminal's ^C
            click.echo(lead + (str(exc) or "interrupted"), err=True)
            sys.exit(getattr(exc, "exit_status", 130))

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises :class:`~pdsr_sdk.errors.Interrupted` (exit status 143) while the command runs, so the
    clean-up that Ctrl-C gets runs (an atomic write removes its temp file); by default it ended the process at
    once. ``pdsr rollout`` handles it itself inside its run (saying what it wrote)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: Any) -> None:
        raise Interrupted("terminated (SIGTERM)", exit_status=143)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)   # None: set outside Python


def _show_warning(fallback: Callable[..., None], shown: set[str], message, category, filename, lineno, file=None,
                  line=None) -> None:
    """pdsr's own warnings (deprecations, input partly ignored) as one ``warning:`` line on stderr, each once a
    command (a preset's settings are read again where ``--set`` meets them); others go to ``fallback``."""
    if issubclass(category, (PdsrDeprecationWarning, PdsrWarning)):
        if str(message) not in shown:
            shown.add(str(message))
            click.echo(f"warning: {message}", err=True)
    else:
        fallback(message, category, filename, lineno, file, line)


def deprecated_flag(old: str, new: str, dest: str, **kwargs: Any) -> Callable[[F], F]:
    """A hidden old spelling ``old`` of flag ``new``: it still works, and says on stderr what to use."""
    def warn(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value:
            click.echo(f"warning: {old} is deprecated; use {new}", err=True)
        return value

    return click.option(old, dest, hidden=True, callback=warn, **kwargs)


class _PolicyOption(click.Option):
    """An option whose help names the registered policies, looked up only when help is shown."""

    def get_help_record(self, ctx: click.Context):
        if self.help and "{runnable}" in self.help:
            from pdsr_sdk.policies.resolve import reference_policies, runnable_policies

            self.help = self.help.format(runnable=", ".join(runnable_policies()),
                                         references=", ".join(reference_policies()))
        return super().get_help_record(ctx)


def policy_option(help: str) -> Callable[[F], F]:
    """``--policy``: ``{runnable}`` and ``{references}`` in ``help`` become the registry's policy lists."""
    return click.option("--policy", cls=_PolicyOption, default=None, help=help)


POLICY_SET_METAVAR = "[POLICY:]KEY=VALUE"


def policy_set_option(f: F) -> F:
    """``--set [POLICY:]KEY=VALUE`` (repeatable): one policy setting."""
    return click.option(
        "--set", "policy_set", multiple=True, metavar=POLICY_SET_METAVAR,
        help="Override a policy setting (repeatable); without POLICY: it applies to every selected policy that "
             "has the setting; a dotted KEY sets a nested one, e.g. --set cap_multiplier=2.0, --set v2:steal=false "
             "or --set v3:migration.stall_share=0.5.",
    )(f)


def parse_policy_sets(values: tuple[str, ...], flag: str = "--set") -> list[tuple[str | None, str, Any]]:
    """``[POLICY:]KEY=VALUE`` strings -> ``(policy or None, key, value)``; values are read as YAML."""
    import yaml

    out = []
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected {POLICY_SET_METAVAR}, got {item!r}", param_hint=flag)
        policy, colon, name = key.strip().rpartition(":")
        out.append((policy if colon else None, name, yaml.safe_load(raw)))
    return out


def check_policy_set_targets(items: list[tuple[str | None, str, Any]], selected: list[str],
                             flag: str = "--set") -> None:
    """The SDK's check (:func:`~pdsr_sdk.policies.resolve.check_set_targets`), naming the flag."""
    from pdsr_sdk.policies.resolve import check_set_targets

    check_set_targets(items, selected, flag)


def quiet_option(f: F) -> F:
    """``--quiet``: see :mod:`pdsr_cli.quiet`."""
    return click.option(
        "--quiet", is_flag=True,
        help="No progress bars and no third-party warnings or logs (vLLM, transformers, torch, Triton, Python "
             "warnings), also in the engine processes; pdsr's 'pdsr: ...' status lines and the summary stay.",
    )(f)


def echo_status(message: str) -> None:
    """One status line on stderr, ``pdsr: <message>`` (the CLI's ``status`` callback for the SDK)."""
    click.echo(f"pdsr: {message}", err=True)


def cli_progress(quiet: bool):
    """The progress factory of a command: none with --quiet, else tqdm bars on a terminal or plain lines
    in a log file (:func:`pdsr_sdk.progress.stderr_progress`)."""
    from pdsr_sdk.progress import silent_progress, stderr_progress

    return silent_progress if quiet else stderr_progress


def speculative_options(group: str, history: str) -> Callable[[F], F]:
    """``--speculative``, ``--num-speculative-tokens`` and ``--draft-history`` (``pdsr rollout`` and ``pdsr serve``);
    ``group`` says what the group method drafts from, ``history`` what the history file's responses are."""
    def add(f: F) -> F:
        f = click.option("--draft-history", type=UserPathType(dir_okay=False), metavar="FILE",
                         help=f"With --speculative group: a trajectories file {history}.  [default: none]")(f)
        f = click.option("--num-speculative-tokens", type=int, metavar="K",
                         help="Tokens drafted per request per step with --speculative.  [default: 4]")(f)
        return click.option("--speculative", metavar="METHOD",
                            help=f"Speculative decoding in the engines: off; ngram (vLLM's n-gram lookup over each "
                                 f"request's own prompt and output); or group (the same lookup over {group}). Same "
                                 f"outputs, drafts verified in one pass. See docs/engines.md.  [default: off]")(f)
    return add


def check_speculative_flags(cfg: Any, num_speculative_tokens: int | None) -> None:
    """``--num-speculative-tokens`` on a run whose speculative decoding is off is an error (it would be ignored)."""
    from pdsr_sdk.errors import ConfigError

    if num_speculative_tokens is not None and cfg.speculative == "off":
        raise ConfigError("--num-speculative-tokens: tokens drafted per step, and speculative decoding is off; pass "
                          "--speculative ngram or group (or set speculative in the config) or leave it out")


def build_config(model: type, config_path: Path | None, overrides: Mapping[str, Any]):
    """Load ``model`` from ``--config`` plus flag overrides (dotted keys; None = not given)."""
    from pdsr_sdk.config import load_config

    return load_config(model, config_path, overrides, origins=flag_names(overrides))


def flag_names(overrides: Mapping[str, Any]) -> dict[str, str]:
    """The flag each override came from (dotted key -> ``--flag``), so that a bad value's error names what the
    user typed: the running command's option named like the key (``sampling.max_tokens`` -> ``--max-tokens``)
    whose parsed value is the override's; else the one option given on the command line, and not named like
    another key, whose value is the override's (``segments.min_tokens`` <- ``--segment-min``; of several with
    equal values, the one whose value object it is). A key with no such option, or with several, is left out (the
    error says "command line")."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return {}
    options = {p.name: max(p.opts, key=len) for p in ctx.command.params if isinstance(p, click.Option) and p.name}
    found: dict[str, str] = {}
    by_name: set[str] = set()
    for dotted, value in overrides.items():
        for name in (dotted.replace(".", "_"), dotted.rsplit(".", 1)[-1]):
            if name in options and ctx.params.get(name) is value:
                found[dotted] = options[name]
                by_name.add(name)
                break
    given = [name for name in options if name not in by_name
             and ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE]
    for dotted, value in overrides.items():
        if dotted in found or value is None:
            continue
        same = [name for name in given if _same_value(ctx.params.get(name), value)]
        if len(same) > 1:   # equal values (--data x --out x): the option whose own value object the override is
            same = [name for name in same if ctx.params.get(name) is value]
        if len(same) == 1:
            found[dotted] = options[same[0]]
    return found


def _same_value(a: Any, b: Any) -> bool:
    """``a is b``, or equal values of one type (so that 0 is not False); a repeatable flag's tuple equals the list
    it became (``--stop`` -> ``sampling.stop``)."""
    if isinstance(a, tuple) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    try:
        return a is b or (type(a) is type(b) and bool(a == b))
    except Exception:  # noqa: BLE001 - a value whose == does not give a truth value (an array)
        return False


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def is_empty(value: Any) -> bool:
    """A counter or fact that says nothing: 0, None, an empty dict or list."""
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0) \
        or (isinstance(value, (dict, list)) and not value)


def format_counters(counters: Mapping[str, Any]) -> str:
    """``probes 8, moves 2``: the counters that are not zero, in order ('' when all are)."""
    return ", ".join(f"{k} {_number(v)}" for k, v in counters.items() if not is_empty(v))


def format_summary(title: str, lead: list[tuple[str, Any]], counters: Mapping[str, Any] | None = None,
                   details: list[str] | None = None) -> str:
    """What the commands print after a run, one shape for all: ``title: lead, lead, ...`` (what matters:
    makespan, tokens/s, reward), then ``counters: ...`` without the zero ones (the line is left out when all
    are zero), then ``details`` (tables, notes). Lead items whose value is None are left out; a value is a
    number (printed to 4 significant places) or text."""
    head = ", ".join(f"{label} {_number(v)}".strip() for label, v in lead if v is not None)
    lines = [f"{title}: {head}" if head else title]
    shown = format_counters(counters or {})
    if shown:
        lines.append(f"counters: {shown}")
    return "\n".join(lines + list(details or []))


def _number(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.0f}"
    return str(v)


def format_table(rows: list[dict[str, Any]], columns: list[str] | None = None, *,
                 hide_empty: tuple[str, ...] | list[str] = ()) -> str:
    """A plain fixed-width table (numbers right-aligned, floats to 4 significant places, those from 1,000 up
    whole with thousands separators). Columns named
    in ``hide_empty`` are left out when every row's value is empty (0 or None)."""
    if not rows:
        return "(no rows)"
    columns = columns or list(rows[0])
    columns = [c for c in columns if c not in hide_empty or not all(is_empty(r.get(c)) for r in rows)]

    def cell(v: Any) -> str:
        # 4 significant places; from 1,000 whole (the same digits) with separators, never e-notation
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 1e3 else f"{v:.4g}"
        return "" if v is None else str(v)

    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    # "n/a" (a number that does not apply) keeps a column numeric
    numeric = [all(isinstance(r.get(c), (int, float)) or r.get(c) in (None, "n/a") for r in rows) for c in columns]
    def line(vals: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(vals, widths, numeric)).rstrip()
    out = [line(columns), line(["-" * w for w in widths])]
    out += [line(row) for row in cells]
    return "\n".join(out)


def build_config_replacing(model: type, config_path: Path | None, overrides: Mapping[str, Any], *,
                           drop_from_file: tuple[str, ...] = (), required: Mapping[str, str] | None = None):
    """:func:`build_config`, for a command whose flags do more than override a key of the file.

    ``drop_from_file``: dotted keys removed from the ``--config`` file's values
    before the flags apply (a flag that replaces a *different* key, e.g. one of
    two exclusive modes: ``pdsr score --max-tokens-per-mb`` replaces the
    file's ``mbs``). ``required``: dotted key -> flag; a key set neither by the
    file nor by a flag is a ConfigError naming both.
    """
    from pydantic import ValidationError

    from pdsr_sdk.config import read_config_file, set_dotted
    from pdsr_sdk.config.base import format_validation_error
    from pdsr_sdk.errors import ConfigError

    data = read_config_file(config_path) if config_path is not None else {}
    for dotted in drop_from_file:
        *parents, last = dotted.split(".")
        node: Any = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    given = {k: v for k, v in overrides.items() if v is not None}
    for dotted, value in given.items():
        set_dotted(data, dotted, value)
    for dotted, flag in (required or {}).items():
        node = data
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            raise ConfigError(f"{flag} is required (or '{dotted}:' in the --config file)")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, model, source=config_path, overrides=given,
                                                  origins=flag_names(given))) from None
