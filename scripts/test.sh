#!/usr/bin/env bash
# Set up a fresh machine and run the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
. .venv/bin/activate
python -m pytest "$@"
