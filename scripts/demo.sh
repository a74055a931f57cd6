#!/usr/bin/env bash
# Set up a fresh machine and run the main job: `privguard demo` (tune, train and
# report a private model on digits under one persistent ledger).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh examples
.venv/bin/privguard demo "$@"
