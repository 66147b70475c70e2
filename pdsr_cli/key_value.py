"""Hydra's ``key=value`` arguments (verl's command lines: ``actor_rollout_ref.rollout.n=8``), which pdsr does not
read: answered in one error saying that pdsr takes flags, and each one's flag or config key where pdsr's own flags
or the rows of :mod:`pdsr_cli.foreign_flags` name it."""

from __future__ import annotations

import os
import re
import shlex
from typing import Iterator

import click

from pdsr_cli.foreign_flags import command_name, key_rows, rows_answer


#: a Hydra override as verl's command lines give them: key=value, +key=value (a new key), ++key=value; keys dotted
_OVERRIDE = re.compile(r"\+{0,2}([A-Za-z_][\w.\-]*)=(.*)", re.DOTALL)


def extra_arguments(ctx: click.Context, argv: list[str]) -> list[str] | None:
    """The words of ``argv`` (the command line after ``pdsr``) that ``ctx``'s command has no place for, read again
    with each command's parser down to it, as click read them (its error keeps only their text); None where that
    reading fails."""
    chain, node = [], ctx
    while node is not None:
        chain.append(node)
        node = node.parent
    args = list(argv)
    for node in reversed(chain):
        try:
            _, args, _ = node.command.make_parser(node).parse_args(args=args)
        except click.UsageError:
            return None
        if node is not ctx:
            args = args[1:]   # the subcommand's name
    return args


class KeyValueArguments(click.UsageError):
    """The key=value answer, raised as it is: :meth:`pdsr_cli.main.LazyGroup.invoke` answers only a plain
    UsageError (an argument's callback raises this one before click's "unexpected extra argument")."""


def with_key_value_answer(exc: click.UsageError, argv: list[str]) -> click.UsageError:
    """``exc``, click's "unexpected extra argument" or a group's "No such command", as one error saying that pdsr
    takes flags (and ``--config FILE`` where the command has it; a command first, on a group) and what each
    ``key=value`` argument is in pdsr, where some are; else ``exc``."""
    ctx = exc.ctx
    if ctx is None:
        return exc
    extra = extra_arguments(ctx, argv) or []
    if isinstance(ctx.command, click.Group):   # it read the first word as a subcommand's name
        if not extra or not _OVERRIDE.fullmatch(extra[0]):
            return exc
        if not ctx.command.invoke_without_command:   # pdsr, pdsr trace: no flags of its own to name
            return _group_key_value_error(ctx, extra)
    return key_value_error(ctx, extra) or exc


def key_value_error(ctx: click.Context, extra: list[str], note: str = "") -> click.UsageError | None:
    """The key=value answer for ``ctx``'s command given the words ``extra``, ``note`` last; None where none is one."""
    pairs = [(arg, m) for arg in extra if (m := _OVERRIDE.fullmatch(arg))]
    if not pairs:
        return None
    command = command_name(ctx)
    options = _options(ctx.command)
    config = " and --config FILE" if "--config" in options else ""   # pdsr trace convert, pdsr model: flags only
    lines = [f"pdsr {command} takes flags{config}, not key=value arguments (Hydra's overrides):"]
    lines += [f"  {arg}: {_key_value_answer(command, m[1], m[2], options)}" for arg, m in pairs]
    others = [arg for arg in extra if not _OVERRIDE.fullmatch(arg)]
    if others and not isinstance(ctx.command, click.Group):   # a group's words after its "subcommand" were not read
        lines.append(f"  also unexpected: {' '.join(others)}")
    return KeyValueArguments("\n".join(lines + ([f"  {note}"] if note else [])), ctx=ctx)


def key_value_argument(ctx: click.Context, param: click.Parameter, value):
    """A path argument's callback (analyze's TRACE): a key=value word there that names no file is a Hydra override,
    answered as the words after it are, not as a missing file. A glob pattern (SOURCE's ``step=*.parquet``, Hive's
    partition folders) is left to the command."""
    text = str(value) if value is not None else ""
    if (value is None or ctx.resilient_parsing or not _OVERRIDE.fullmatch(text) or os.path.lexists(value)
            or any(c in text for c in "*?[")):
        return value
    from pdsr_cli.main import ARGV

    extra = extra_arguments(ctx, ctx.find_root().meta.get(ARGV, [])) or []
    error = key_value_error(ctx, [str(value), *extra], f"({param.human_readable_name}: no file is named {value})")
    assert error is not None   # value is a pair
    raise error


def _group_key_value_error(ctx: click.Context, extra: list[str]) -> click.UsageError:
    """The key=value answer of a group that needs a command: each pair's flag or key on the commands under it."""
    group = ctx.command
    assert isinstance(group, click.Group)
    where = command_name(ctx)
    prefix = f"pdsr {where}".strip()
    lines = [f"{prefix} takes a command ({', '.join(group.list_commands(ctx))}) and its flags, not key=value "
             "arguments (Hydra's overrides):"]
    commands = list(_commands_under(ctx, group, where))
    for arg in extra:
        if (m := _OVERRIDE.fullmatch(arg)) is None:
            continue
        said: dict[str, list[str]] = {}
        for name, command in commands:
            answer = _known_answer(name, m[1], m[2], _options(command))
            if answer is not None:
                said.setdefault(answer, []).append(f"pdsr {name}")
        answers = [f"{', '.join(names)}: {answer}" for answer, names in said.items()]
        lines.append(f"  {arg}: " + ("; ".join(answers) if answers else
                                     f"not a name any {prefix} command knows: {prefix} COMMAND --help lists its flags"))
    return KeyValueArguments("\n".join(lines), ctx=ctx)


def _commands_under(ctx: click.Context, group: click.Group, where: str) -> Iterator[tuple[str, click.Command]]:
    """``(name without pdsr, command)`` of each command that runs under ``group``, groups that run alone too."""
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        full = f"{where} {name}".strip()
        if command is None:
            continue
        if not isinstance(command, click.Group) or command.invoke_without_command:
            yield full, command
        if isinstance(command, click.Group):
            yield from _commands_under(ctx, command, full)


def _options(command: click.Command) -> dict[str, click.Option]:
    return {opt: p for p in command.params if isinstance(p, click.Option) for opt in p.opts}


def _key_value_answer(command: str, key: str, value: str, options: dict[str, click.Option]) -> str:
    said = _known_answer(command, key, value, options)
    if said is None:
        keys = ", a --config file's keys in docs/configuration.md" if "--config" in options else ""
        return f"not a name pdsr {command} knows: its flags are in pdsr {command} --help{keys}"
    return said


def _known_answer(command: str, key: str, value: str, options: dict[str, click.Option]) -> str | None:
    """``key=value`` as ``command``'s own flag (``n=8``: ``--n 8``) or another tool's name for one; None: neither."""
    own = options.get("--" + key.replace("_", "-"))
    if own is not None:
        return _as_flag(own, value)
    rows = key_rows(command, key)
    said = rows_answer(rows)
    if said is None:
        return None
    same = len({(r.flag, r.note) for r in rows}) == 1 and not rows[0].note   # their value is pdsr's as it is
    flag = options.get(rows[0].flag or "") if same else None
    return f"{_as_flag(flag, value)}; {said}" if flag is not None else said


def _as_flag(option: click.Option, value: str) -> str:
    """``option`` given ``value`` on a command line: ``--n 8``; a boolean flag by the value's truth."""
    name = max(option.opts, key=len)
    if not option.is_flag:
        return f"{name} {shlex.quote(value)}"
    if value.strip().lower() in ("true", "1", "yes", "on"):
        return name
    if option.secondary_opts:
        return option.secondary_opts[0]
    return f"leave out {name} (off unless given)"   # an on switch alone: given, it turns its setting on
