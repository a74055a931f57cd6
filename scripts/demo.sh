#!/usr/bin/env bash
# Set up a fresh machine and run the main job: a ledger under a simulated DP-SGD run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh ""
. .venv/bin/activate
python examples/simulated_dp_sgd.py "$@"
