#!/usr/bin/env bash
# Lint and type check with the tools of the dev extra in .venv (`bash scripts/install.sh cpu,ray,dev`):
# ruff over the repository, mypy (strict) over pdsr_sdk/dispatch/. Settings: pyproject.toml.
# CI runs this before the tests. `ruff check --fix .` fixes what ruff can.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/mypy
