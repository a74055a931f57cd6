#!/usr/bin/env bash
# Set up a fresh machine and run the whole test suite (what CI runs, `.ci/run`).
#
# The suite tests the package as users install it, not the source tree:
#   1. build the sdist, then the wheel from that sdist (`python -m build`);
#   2. install the wheel (not editable) with the [test] extra into a fresh venv,
#      torch==2.13.0 first (an unpinned torch would pull several GB of CUDA wheels);
#   3. lint (ruff) the source and type-check (mypy) the installed package;
#   4. run the tests and the installed package's doctests from an empty directory,
#      where the source tree cannot shadow the installed package;
#   5. run `privguard demo` (CI mode) from the same wheel in a second fresh venv
#      that has only the [examples] extra.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k ledger -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
py=${PYTHON:-python3}
ci=$root/build/ci
rm -rf "$ci"
mkdir -p "$ci/run"

echo "== building the sdist and the wheel (from the sdist)"
"$py" -m venv "$ci/build-venv"
"$ci/build-venv/bin/python" -m pip install --quiet --upgrade pip build
"$ci/build-venv/bin/python" -m build --outdir "$ci/dist" . > "$ci/build.log" 2>&1 \
  || { cat "$ci/build.log"; exit 1; }
wheel=$(ls "$ci"/dist/privguard-*.whl)
echo "   $(basename "$wheel")"

fresh_venv() {  # fresh_venv DIR EXTRAS
  "$py" -m venv "$1"
  "$1/bin/python" -m pip install --quiet --upgrade pip
  "$1/bin/python" -m pip install --quiet "torch==2.13.0"
  "$1/bin/python" -m pip install --quiet "${wheel}[$2]"
}

echo "== installing the wheel with [test] into a fresh venv"
fresh_venv "$ci/test-venv" test
export PRIVGUARD_WHEEL=$wheel PRIVGUARD_SOURCE=$root PRIVGUARD_REQUIRE_INSTALLED=1

echo "== ruff and mypy"
"$ci/test-venv/bin/ruff" check privguard integrations tests benchmarks examples
# mypy reads the installed package (from an empty directory): only there is
# privguard.integrations where the package-dir mapping puts it.
(cd "$ci/run" && "$ci/test-venv/bin/mypy" --config-file "$root/pyproject.toml" -p privguard)

echo "== pytest against the installed package (from $ci/run)"
cd "$ci/run"
"$ci/test-venv/bin/python" -m pytest -c "$root/pyproject.toml" --rootdir "$ci/run" \
  -p no:cacheprovider "$root/tests" --pyargs privguard "$@"

echo "== privguard demo from the same wheel with only [examples]"
fresh_venv "$ci/demo-venv" examples
CI=true "$ci/demo-venv/bin/privguard" demo --quick --db "$ci/run/demo.db"
