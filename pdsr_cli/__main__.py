"""``python -m pdsr_cli``: the ``pdsr`` command where the console script is not on PATH."""

from pdsr_cli.main import cli

if __name__ == "__main__":
    # Engine processes are spawned, and a spawned process imports its parent's main module, but never a
    # package's __main__ named by its module spec: without one it imports this file by its path, and with it
    # pdsr_sdk, which starts the engine core's watch on this process at once (as under the console script).
    # Otherwise the watch started only at vLLM's start-up handshake, and a core whose pdsr was killed
    # (kill -9) before it waited 5 minutes for it.
    __spec__ = None
    cli(prog_name="pdsr")
