#!/usr/bin/env bash
# The whole test suite (what `make test` runs after setup) in two lanes at once, since
# most of a scenario's time is spent waiting on containers, engines and timers, not on
# the CPU: the heavy lane runs the install test (the installed CLI's whole path on the
# lab, with two models on three engines), molecule/replicated (the longest),
# molecule/gpu_host, the simulated fleet, then the GPU check bundle's tests (since the
# migration phases made molecule/pipeline longer); the other runs molecule/pipeline, then
# everything else (lint, unit tests, the lab's services, molecule default and lb). In a
# fresh-clone run here with lb in the heavy lane, that lane took 85 minutes (lb 8 of
# them), the other 71. The
# second lane prints as it goes, the heavy lane's output follows when it ends. The
# install test and the simulated fleet's both run the lab (its container names), one
# after the other in the heavy lane (tests/conftest.py, lab_names, would make one wait
# for the other anywhere).
# Extra arguments go to both lanes' pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=.venv/bin/pytest
HEAVY=(tests/integration/test_install.py
       "tests/integration/test_molecule.py::test_scenario[replicated]"
       "tests/integration/test_molecule.py::test_scenario[gpu_host]"
       tests/integration/test_sim_fleet.py
       tests/integration/test_gpu_bundle.py)
FIRST=("tests/integration/test_molecule.py::test_scenario[pipeline]")
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# Stopped from outside (CI's time limit): the heavy lane's output so far, so that what it
# was doing is not lost with it.
trap 'echo "=== stopped; the heavy lane so far: ${HEAVY[*]} ==="; cat "$logs/heavy.log"; exit 143' TERM INT

"$PYTEST" "$@" "${HEAVY[@]}" >"$logs/heavy.log" 2>&1 &
heavy=$!

"$PYTEST" "$@" "${FIRST[@]}"
first=$?
deselect=()
for t in "${HEAVY[@]}" "${FIRST[@]}"; do deselect+=(--deselect "$t"); done
"$PYTEST" "$@" "${deselect[@]}" tests
rest=$?

wait "$heavy"
heavy_rc=$?
echo "=== heavy lane: ${HEAVY[*]} ==="
cat "$logs/heavy.log"
echo "=== lanes: pipeline rc=$first, the rest rc=$rest, heavy rc=$heavy_rc ==="
[ "$first" = 0 ] && [ "$rest" = 0 ] && [ "$heavy_rc" = 0 ]
