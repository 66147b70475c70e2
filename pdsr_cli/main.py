"""``pdsr``: the command group.

Subcommands are imported only when invoked (or when their help is shown),
so ``pdsr --help`` stays fast and works without torch or vLLM installed.
"""

from __future__ import annotations

import importlib
import os

import click

if os.environ.get("PDSR_ORCHESTRATOR_PID"):
    import pdsr_sdk  # noqa: F401 - in an engine process spawned by pdsr: starts its parent watch at once

if os.environ.get("PDSR_QUIET") == "1":
    # an engine process spawned by a --quiet run imports this module first (multiprocessing's spawn
    # re-imports the main module): quiet its loggers before vLLM's import-time warnings
    from pdsr_cli.quiet import quiet_logging

    quiet_logging()

#: command name -> (module under pdsr_cli.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "rollout": ("rollout", "Generate GRPO groups with a P-DSR dispatch policy on vLLM engines."),
    "score": ("score", "Per-token log-probs of completions under a model, micro-batched."),
    "gae": ("gae", "Per-token advantages of a rollout's file: GAE, or GRPO, RLOO, REINFORCE++ (no critic)."),
    "simulate": ("simulate", "Replay a length trace through dispatch policies on simulated engines."),
    "analyze": ("analyze", "Statistics and plots of a length trace or trajectories file."),
    "trace": ("trace", "Length traces: synthesize or convert."),
    "serve": ("serve", "An OpenAI-style endpoint on vLLM engines, every request through the dispatch policy."),
    "model": ("model", "Prepare local models: the built-in tiny model, SmolLM2-135M."),
    "schema": ("schema", "Write the JSON/Arrow schemas of configs and outputs into schemas/."),
}


#: ``ctx.meta`` key of the command line after ``pdsr``
ARGV = "pdsr.argv"


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if self._available(name)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"pdsr_cli.commands.{COMMANDS[name][0]}")
        return module.command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[ARGV] = list(args)   # the answers below read it: click's errors keep no command line
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:   # `pdsr calibrate`: a subcommand of one of ours, named without its group
            groups = [group for group in self.list_commands(ctx) if args and self._has_subcommand(ctx, group, args[0])]
            if not groups:
                raise
            where = " or ".join(f"`pdsr {group} {args[0]}`" for group in groups)
            raise click.UsageError(f"No such command {args[0]!r}; it is {where}.", ctx) from exc

    def _has_subcommand(self, ctx: click.Context, group: str, name: str) -> bool:
        command = self.get_command(ctx, group)
        return isinstance(command, click.Group) and name in command.list_commands(ctx)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.NoSuchOption as exc:   # another tool's name for a pdsr setting: say pdsr's
            from pdsr_cli.foreign_flags import with_foreign_answer

            raise with_foreign_answer(exc, ctx.meta.get(ARGV, [])) from None
        except click.UsageError as exc:
            # "unexpected extra argument", or a group's "No such command" (click < 8.3: a plain UsageError too);
            # a missing option where key=value words were given (click checks required options first); a bad value
            # or a missing one otherwise: click's message says it
            plain = type(exc) is click.UsageError or type(exc).__name__ == "NoSuchCommand"
            if not plain and not isinstance(exc, click.MissingParameter):
                raise
            from pdsr_cli.key_value import with_key_value_answer   # Hydra's key=value: say pdsr's flags

            answer = with_key_value_answer(exc, ctx.meta.get(ARGV, []))
            if answer is exc:
                raise
            raise answer from None

    @staticmethod
    def _available(name: str) -> bool:
        return importlib.util.find_spec(f"pdsr_cli.commands.{COMMANDS[name][0]}") is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="pdsr")
def cli() -> None:
    """pdsr: fast rollout side of LLM reinforcement learning (GRPO/PPO).

    Probe-based Dynamic Segment Rollout over vLLM engines, micro-batched
    log-prob scoring, per-token advantages (chunk-scan GAE; GRPO, RLOO,
    REINFORCE++), and a simulator and analyser for rollout length traces. Every command that runs a job takes --config
    FILE (YAML/JSON); flags override the file.

    Paths: a leading ~ is the home folder. An output's missing folders are
    made; an output file where a folder is, or a folder where a file is, is
    an error; an existing --out or --json file is replaced only with
    --overwrite (an --out-dir folder's files are replaced).
    """


if __name__ == "__main__":
    cli()
