#!/usr/bin/env bash
# Create .venv (if needed) and install privguard with the given extras.
# torch==2.13.0 is installed FIRST: an unpinned torch (or opacus pulling one)
# would download several GB of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1-test}"
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "torch==2.13.0"
if [ -n "$extras" ]; then spec=".[${extras}]"; else spec="."; fi
python -m pip install --quiet -e "$spec"
