"""One module per ``pdsr`` subcommand; each defines ``command``."""
