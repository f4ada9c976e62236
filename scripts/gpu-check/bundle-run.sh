#!/usr/bin/env bash
# The GPU check bundle's entry command (scripts/gpu-check/bundle.sh copies it in as
# run.sh). On the GPU machine, from anywhere:
#
#   OUT=DIR bash run.sh          (OUT: where the results go; default a new temporary folder)
#
# Steps, each with its own time limit (all of them under 8 minutes):
#   setup    ansible-core from wheels/ in a virtualenv (pip --target where venv is missing),
#            the collection and community.general from collections/, offline;
#   ansible  the collection's gpu_check playbook in check mode on a local connection:
#            gpu_facts against the real nvidia-smi and driver, gpu_driver's plan for the
#            loaded driver (keep it: no package, no module load, no reboot);
#   memory   measure.py memory: the planner's weight and KV-cache bytes against what
#            PyTorch allocates for the same shapes;
#   profile  measure.py profile, for both shapes: decode and prefill times, fitted into
#            profiles the simulated engine loads, beside the simulator's default.
# OUT gets summary.txt (a line per step), each step's log, gpu_facts.json,
# gpu_driver_plan.json, planned-changes.txt (the role's tasks that would change something
# in check mode), memory.json, profile-*.json. Exit status 0 only when every step
# passed.
# Stand-ins, for the tests on a machine without a GPU only: GPU_CHECK_NVIDIA_SMI (a fake
# nvidia-smi), GPU_CHECK_HOST_ROOT (a fake sys/ + proc/ tree), GPU_CHECK_DEVICE=cpu (small
# shapes on the CPU); GPU_CHECK_PYTHON picks the Python that has PyTorch (default python3).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-$(mktemp -d)}
PY=${GPU_CHECK_PYTHON:-python3}
SMI=${GPU_CHECK_NVIDIA_SMI:-nvidia-smi}
HOST_ROOT=${GPU_CHECK_HOST_ROOT:-/}
DEVICE=${GPU_CHECK_DEVICE:-auto}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SUMMARY=$OUT/summary.txt
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
: > "$SUMMARY"
failed=0

# step NAME LIMIT_S COMMAND...: runs it (a command or an exported function) with its output
# in OUT/NAME.log, and writes a line to the summary.
step() {
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s)
  timeout "$limit" bash -c '"$@"' "$name" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  local took=$(( $(date +%s) - start ))
  if [ "$rc" = 0 ]; then
    echo "$name: passed in ${took} s" | tee -a "$SUMMARY"
  else
    [ "$rc" = 124 ] && echo "($name stopped after its limit of $limit s)" >> "$OUT/$name.log"
    echo "$name: FAILED (exit $rc) in ${took} s; the end of $name.log:" | tee -a "$SUMMARY"
    tail -n 15 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
    failed=1
  fi
  return "$rc"
}

setup() {
  local version wheels=$HERE/wheels
  version=$(cat "$HERE/ansible-core.version")
  "$PY" --version
  if "$PY" -m venv --system-site-packages "$WORK/venv"; then
    "$WORK/venv/bin/pip" install --no-index --find-links "$wheels" "ansible-core==$version" || return 1
  else
    echo "no venv module: pip --target instead"
    rm -rf "$WORK/venv"
    "$PY" -m pip install --no-index --find-links "$wheels" --target "$WORK/site" "ansible-core==$version" \
      || return 1
  fi
  ansible_env
  mkdir -p "$WORK/collections"
  tar -xzf "$HERE/collections/community-general.tar.gz" -C "$WORK/collections" || return 1
  "$ANSIBLE_PY" "$ANSIBLE_BIN/ansible-galaxy" collection install --offline --no-deps \
    -p "$WORK/collections" "$HERE"/collections/inferfleet-fleet-*.tar.gz
}

# ansible_env: the Python and the scripts folder of the ansible-core that setup installed.
ansible_env() {
  if [ -x "$WORK/venv/bin/python" ]; then
    ANSIBLE_PY=$WORK/venv/bin/python ANSIBLE_BIN=$WORK/venv/bin
  else
    ANSIBLE_PY=$PY ANSIBLE_BIN=$WORK/site/bin
    export PYTHONPATH=$WORK/site
  fi
}

ansible_check() {
  # From WORK, with only the bundle's collections: no ansible.cfg or collection of the
  # folder it was started from is used.
  cd "$WORK" || return 1
  ansible_env
  ANSIBLE_COLLECTIONS_PATH=$WORK/collections ANSIBLE_HOME=$WORK/ansible-home \
    ANSIBLE_LOCAL_TEMP=$WORK/ansible-tmp ANSIBLE_NOCOLOR=1 \
    "$ANSIBLE_PY" "$ANSIBLE_BIN/ansible-playbook" --check -i localhost, -c local \
    -e "ansible_python_interpreter=$ANSIBLE_PY" -e "gpu_check_out=$OUT" \
    -e "gpu_check_nvidia_smi=$SMI" -e "gpu_check_host_root=$HOST_ROOT" \
    inferfleet.fleet.gpu_check
}

export -f setup ansible_env ansible_check
export HERE OUT PY SMI HOST_ROOT WORK
if step setup 90 setup; then
  step ansible 120 ansible_check
  # What the role would change on this host, by task (check mode's "changed").
  awk '/^TASK \[/ {task = $0} /^changed: / {print task}' "$OUT/ansible.log" > "$OUT/planned-changes.txt"
else
  echo "ansible: not run (setup failed)" | tee -a "$SUMMARY"
fi
# measure.py reads the planner from the collection's tarball itself, so it runs whether
# setup passed or not.
COLLECTIONS=$WORK/tarball
mkdir -p "$COLLECTIONS/ansible_collections/inferfleet/fleet"
tar -xzf "$HERE"/collections/inferfleet-fleet-*.tar.gz -C "$COLLECTIONS/ansible_collections/inferfleet/fleet"
step memory 150 "$PY" "$HERE/measure.py" memory --collections "$COLLECTIONS" --out "$OUT" --device "$DEVICE"
profiles() {
  local shape
  for shape in llama-3.1-8b qwen2.5-72b; do
    "$PY" "$HERE/measure.py" profile --shape "$shape" --collections "$COLLECTIONS" \
      --out "$OUT" --device "$DEVICE" || return 1
  done
}
export -f profiles
export COLLECTIONS DEVICE
step profile 120 profiles

echo "summary: $SUMMARY"
exit "$failed"
