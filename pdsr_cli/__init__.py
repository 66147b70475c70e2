"""The ``pdsr`` command line: thin wrappers that parse, build a config, call the SDK."""
