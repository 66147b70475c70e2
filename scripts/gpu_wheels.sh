#!/usr/bin/env bash
# Download the wheels scripts/gpu_check.sh installs on a GPU machine that has Python 3.12, torch, triton and
# transformers but no pydantic, pytest, ...: the pins of scripts/gpu_wheels.txt, for CPython 3.12 on
# manylinux x86-64, without dependencies (the list is complete), into .gpu_wheels/ (git ignores it; the device
# tool carries it with the checkout when named in its carry list).
#
#   bash scripts/gpu_wheels.sh            # into .gpu_wheels/
#   bash scripts/gpu_wheels.sh DIR        # into DIR
#
# Run it where the package registry can be reached (here), then on the GPU machine: scripts/gpu_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.gpu_wheels}"
py="${PYTHON:-.venv/bin/python}"
[ -x "$py" ] || py=python3
mkdir -p "$dest"
reqs=$(grep -v '^[[:space:]]*#' scripts/gpu_wheels.txt | grep -v '^[[:space:]]*$')
# shellcheck disable=SC2086  # one requirement per word
"$py" -m pip download --quiet --only-binary=:all: --no-deps \
    --python-version 3.12 --implementation cp --abi cp312 --platform manylinux2014_x86_64 \
    --dest "$dest" $reqs
count=$(echo "$reqs" | wc -l)
got=$(find "$dest" -maxdepth 1 -name '*.whl' | wc -l)
echo "gpu_wheels.sh: $got wheels in $dest ($count pinned in scripts/gpu_wheels.txt), $(du -sh "$dest" | cut -f1)"
