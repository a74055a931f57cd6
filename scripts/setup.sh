#!/usr/bin/env bash
# Create .venv (if needed) and install privguard from this checkout with the given
# extras (default: dev, an editable install for working on privguard).
# torch==2.13.0 is installed FIRST: an unpinned torch (or opacus pulling one)
# would download several GB of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1-dev}"
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
if [ "$extras" = dev ]; then
  .venv/bin/python -m pip install --quiet -e ".[dev]"
else
  .venv/bin/python -m pip install --quiet ".[${extras}]"
fi
