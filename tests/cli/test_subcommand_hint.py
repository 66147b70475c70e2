"""A subcommand typed without its group (`pdsr calibrate` for `pdsr simulate calibrate`, as a user of the simulate
page might) was answered click's bare "No such command 'calibrate'."; it now names the command meant."""

from __future__ import annotations

import click

from cli_checks import failed, invoke
from pdsr_cli.main import cli


def nested_commands() -> dict[str, list[str]]:
    """Each subcommand name of a command group -> the groups that have it, read off the CLI itself."""
    ctx = click.Context(cli)
    out: dict[str, list[str]] = {}
    for group in cli.list_commands(ctx):
        command = cli.get_command(ctx, group)
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                out.setdefault(name, []).append(group)
    return out


def test_a_subcommand_without_its_group_names_the_command_meant():
    nested = nested_commands()
    assert {"calibrate": ["simulate"], "synth": ["trace"], "convert": ["trace"]}.items() <= nested.items()
    for name, groups in nested.items():
        meant = [f"pdsr {group} {name}" for group in groups]
        text = failed(invoke(name, "--out", "x.yaml"), f"No such command '{name}'; it is `{meant[0]}`")
        assert "Traceback" not in text
        for command in meant:   # what it names exists
            assert invoke(*command.split()[1:], "--help").exit_code == 0


def test_a_name_of_no_command_keeps_clicks_answer():
    text = failed(invoke("calibrat"), "No such command 'calibrat'.")
    assert "it is" not in text
