"""``python -m pdsr_cli``: the ``pdsr`` command where the console script is not on PATH."""

from pdsr_cli.main import cli

if __name__ == "__main__":
    cli(prog_name="pdsr")
