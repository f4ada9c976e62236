#!/usr/bin/env bash
# The whole test suite (what `make test` runs after setup) in three lanes at once, since
# most of a scenario's time is spent waiting on containers, engines and timers, not on
# the CPU:
#   1. molecule/replicated (the longest);
#   2. the install test, then molecule/pipeline;
#   3. everything else (lint, unit tests, the lab's services, molecule default, lb and
#      gpu_host), then the lab CLI test.
# The install test and the lab CLI test bring up the same lab; they sit at opposite ends
# of their lanes, and the lab_hosts fixture (tests/conftest.py) makes the later one wait
# should they meet. Lane 3 prints as it goes; the other two's output follows when they end.
# Extra arguments go to every lane's pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=.venv/bin/pytest
LANE1=("tests/integration/test_molecule.py::test_scenario[replicated]")
LANE2=(tests/integration/test_install.py "tests/integration/test_molecule.py::test_scenario[pipeline]")
LAST=(tests/integration/test_lab_cli.py)
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

"$PYTEST" "$@" "${LANE1[@]}" >"$logs/lane1.log" 2>&1 &
lane1=$!
"$PYTEST" "$@" "${LANE2[@]}" >"$logs/lane2.log" 2>&1 &
lane2=$!

deselect=()
for t in "${LANE1[@]}" "${LANE2[@]}" "${LAST[@]}"; do deselect+=(--deselect "$t"); done
"$PYTEST" "$@" "${deselect[@]}" tests
rest=$?
"$PYTEST" "$@" "${LAST[@]}"
last=$?

wait "$lane1"
lane1_rc=$?
wait "$lane2"
lane2_rc=$?
echo "=== lane 1: ${LANE1[*]} ==="
cat "$logs/lane1.log"
echo "=== lane 2: ${LANE2[*]} ==="
cat "$logs/lane2.log"
echo "=== lanes: replicated rc=$lane1_rc, install and pipeline rc=$lane2_rc, the rest rc=$rest, lab CLI rc=$last ==="
[ "$lane1_rc" = 0 ] && [ "$lane2_rc" = 0 ] && [ "$rest" = 0 ] && [ "$last" = 0 ]
