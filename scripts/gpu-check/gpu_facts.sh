#!/usr/bin/env bash
# GPU check for a real NVIDIA machine: runs gpu_facts' own code (the module's parsing and
# collection, plugins/module_utils/gpu.py, with plain python3: no Ansible) and
# the fabric preflight's single-node checks, then prints the facts.
#
#   scripts/gpu-check/gpu_facts.sh [CAPTURE_DIR]
#
# CAPTURE_DIR (default: $OUT when set) receives the raw outputs the facts were parsed from
# (nvidia-smi queries, -q, topo -m, /proc/driver/nvidia/version) and facts.json, so real
# samples can be compared with the written fixtures in tests/fixtures/nvidia-smi.
# Exit status: 0 all checks passed; 1 a check failed (listed); 2 the facts could not be
# read at all. Environment: FABRIC_SHM_MIN_MIB (default 1024), NVIDIA_SMI (default
# nvidia-smi), REQUIRE_CLOCK_SYNC (default 1).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
UTILS="$HERE/../../plugins/module_utils"
if [ ! -f "$UTILS/gpu.py" ]; then
  echo "gpu_facts.sh: plugins/module_utils/gpu.py not found beside $HERE/../..;" \
       "run it from an inferfleet checkout" >&2
  exit 2
fi
CAPTURE=${1:-${OUT:-}}
command -v python3 >/dev/null || { echo "gpu_facts.sh: python3 is needed" >&2; exit 2; }

exec python3 - "$UTILS" "$CAPTURE" <<'PY'
import json
import os
import subprocess
import sys

utils, capture = sys.argv[1], sys.argv[2]
sys.path.insert(0, utils)
import gpu as g  # noqa: E402

smi = os.environ.get("NVIDIA_SMI", "nvidia-smi")
shm_min_mib = int(os.environ.get("FABRIC_SHM_MIN_MIB", "1024"))
require_clock = os.environ.get("REQUIRE_CLOCK_SYNC", "1") == "1"
raw = {}


def run(argv):
    """Run a command the way the module does (LC_ALL=C), keeping its output."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "LC_ALL": "C"})
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: command not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{' '.join(argv)}: timed out after 120 s"
    raw[" ".join(argv[1:]) if argv[0] == smi else " ".join(argv)] = (
        done.returncode, done.stdout, done.stderr)
    return done.returncode, done.stdout, done.stderr


try:
    gpu = g.collect_gpu(run, smi, "/", True)
    node = g.collect_node(run, "/")
except g.GpuFactsError as err:
    print(f"gpu_facts.sh: cannot read the GPU facts: {err}", file=sys.stderr)
    sys.exit(2)

# Cross-checks of the parsing against nvidia-smi's own list.
rc, listing, _ = run([smi, "-L"])
listed = [line for line in listing.splitlines() if line.startswith("GPU ")] if rc == 0 else []
rc_route, route, _ = run(["ip", "-j", "route", "show", "default"])
default_if = None
if rc_route == 0 and route.strip():
    try:
        default_if = json.loads(route)[0].get("dev")
    except (ValueError, IndexError):
        default_if = None

checks = []


def check(ok, what):
    checks.append((bool(ok), what))


check(gpu["present"], "an NVIDIA GPU is on the PCI bus or in nvidia-smi")
check(gpu["nvidia_smi"]["usable"], f"nvidia-smi answers ({gpu['nvidia_smi']['error'] or 'ok'})")
check(gpu["driver"]["loaded"], f"the driver is loaded ({gpu['driver']['version']}, "
      f"{gpu['driver']['kernel_module']} kernel module)")
check(not gpu["driver"]["nouveau_loaded"], "nouveau is not loaded")
check(gpu["count"] == len(listed), f"the parsed GPU count ({gpu['count']}) matches nvidia-smi -L "
      f"({len(listed)})")
check(gpu["count"] == 0 or gpu["cuda_version"], f"the CUDA version was read ({gpu['cuda_version']})")
check(gpu["count"] == 0 or all(x["memory_mib"] for x in gpu["gpus"]),
      "every GPU's memory was read")
check(gpu["healthy"], "every GPU is healthy" + (": " + "; ".join(gpu["problems"])
                                                if gpu["problems"] else ""))
check(gpu["count"] < 2 or gpu["topology"], "the topology matrix was read")
check(not gpu["nvswitch"] or gpu["nvlink_all_pairs"],
      "with NVSwitches, every GPU pair is joined by NVLink (Fabric Manager running)")
shm = node["shm_bytes"] or 0
check(shm >= shm_min_mib * 1024 * 1024,
      f"/dev/shm is {shm // (1024 * 1024)} MiB (at least {shm_min_mib})")
clock = node["clock"]
check(clock["synchronized"] or not require_clock,
      f"the clock is synchronised ({clock['source'] or 'no chrony, no timedatectl'}: "
      f"{clock['synchronized']})")
iface = node["interfaces"].get(default_if or "", {})
check(iface, f"the default route's interface ({default_if}) was read")

facts = {"inferfleet_gpu": gpu, "inferfleet_node": node, "default_route_interface": default_if}
print(json.dumps(facts, indent=2, sort_keys=True))
print()
print("== GPUs")
print(f"  {gpu['count']} x {gpu['model']}  memory {gpu['memory_mib']} MiB each, "
      f"{gpu['memory_mib_total']} MiB in all")
print(f"  driver {gpu['driver_version']} (branch {gpu['driver']['branch']}, "
      f"{gpu['driver']['kernel_module']} module)  CUDA {gpu['cuda_version']}")
print(f"  MIG {'on' if gpu['mig_enabled'] else 'off'}  NVLink {gpu['nvlink']} "
      f"(all pairs {gpu['nvlink_all_pairs']}, up to NV{gpu['nvlink_links_max']})  "
      f"NVSwitches {gpu['pci']['nvswitches']}")
for x in gpu["gpus"]:
    print(f"  GPU{x['index']} {x['pci_bus_id']} {x['name']} {x['memory_mib']} MiB "
          f"cc {x['compute_cap']} MIG {x['mig_mode']} persistence {x['persistence_mode']} "
          f"{x['temperature_c']} C {'healthy' if x['healthy'] else 'UNHEALTHY'}")
print("== Node (fabric preflight, single-node parts)")
for name, entry in sorted(node["interfaces"].items()):
    mark = "  <- default route" if name == default_if else ""
    print(f"  {name}: {entry['state']} mtu {entry['mtu']} {' '.join(entry['addresses'])}{mark}")
print(f"  /dev/shm {shm // (1024 * 1024)} MiB; clock synchronised: {clock['synchronized']} "
      f"({clock['source']})")
print("== Checks")
for ok, what in checks:
    print(f"  [{'ok' if ok else 'FAIL'}] {what}")

if capture:
    os.makedirs(capture, exist_ok=True)
    for i, (cmd, (code, out, err)) in enumerate(sorted(raw.items())):
        name = "".join(c if c.isalnum() or c in "-." else "_" for c in cmd)[:80]
        with open(os.path.join(capture, f"{i:02d}-{name}.txt"), "w") as handle:
            handle.write(f"# {cmd}\n# exit status {code}\n{out}")
            if err:
                handle.write(f"# stderr:\n{err}")
    version = "/proc/driver/nvidia/version"
    if os.path.exists(version):
        with open(version) as src, open(os.path.join(capture, "proc-driver-nvidia-version.txt"),
                                        "w") as dst:
            dst.write(src.read())
    with open(os.path.join(capture, "facts.json"), "w") as handle:
        json.dump(facts, handle, indent=2, sort_keys=True)
    print(f"== Raw outputs and facts.json written to {capture}")

sys.exit(0 if all(ok for ok, _ in checks) else 1)
PY
