# Copyright: inferfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""GPU and node facts for inferfleet: parsers of `nvidia-smi` output, PCI and procfs
readers, and the collection that joins them.

Standard library only, and no Ansible import: the gpu_facts module runs it on the node
(as module_utils.gpu), the unit tests call the parsers on written
samples, and ``scripts/gpu-check/gpu_facts.sh`` runs it with a plain ``python3``.
Every command is run through a ``run(argv) -> (rc, stdout, stderr)`` callable, so the
caller decides how (AnsibleModule.run_command, or subprocess).
"""

from __future__ import annotations

import csv
import io
import os
import re

NVIDIA_VENDOR = "0x10de"
# PCI class codes (the first 4 hex digits of sysfs `class`): VGA and 3D controllers are
# GPUs; an NVIDIA "other bridge" is an NVSwitch (HGX A100/H100 baseboards show 6 or 4).
GPU_CLASSES = ("0x0300", "0x0302")
NVSWITCH_CLASS = "0x0680"

# The fields of the inventory query: long-standing ones only (an unknown field makes
# nvidia-smi refuse the whole query).
QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "memory.total",
    "driver_version",
    "mig.mode.current",
    "persistence_mode",
    "compute_cap",
)
# Health fields, queried apart: some are missing on older drivers, and a failing
# health query must not hide the inventory.
HEALTH_FIELDS = (
    "index",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "clocks_throttle_reasons.hw_slowdown",
    "temperature.gpu",
)
HEALTH_FIELDS_MINIMAL = ("index", "ecc.errors.uncorrected.volatile.total", "temperature.gpu")

_MISSING = {"", "n/a", "[n/a]", "[not supported]", "not supported"}
_BROKEN = ("[gpu requires reset]", "[unknown error]", "[gpu is lost]", "[error]")


class GpuFactsError(Exception):
    """The facts cannot be read; the message says why and what to check."""


def _value(raw: str | None) -> str | None:
    """A CSV value with nvidia-smi's placeholders for 'not available' turned into None."""
    if raw is None:
        return None
    text = raw.strip()
    return None if text.lower() in _MISSING else text


def _int(raw: str | None) -> int | None:
    text = _value(raw)
    if text is None:
        return None
    try:
        return int(float(text))
    except ValueError:
        return None


def _field_name(header: str) -> str:
    """`memory.total [MiB]` -> `memory.total` (the header keeps units even with nounits)."""
    return re.sub(r"\s*\[.*\]\s*$", "", header.strip())


def parse_query_csv(text: str, required: str = "index") -> list[dict[str, str]]:
    """Rows of `nvidia-smi --query-gpu=... --format=csv[,nounits]` (with its header) as
    dicts keyed by field name; the header must name `required` (--query-compute-apps has
    no index: pid)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    reader = csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True)
    rows = list(reader)
    header = [_field_name(h) for h in rows[0]]
    if required not in header:
        raise GpuFactsError(f"nvidia-smi printed no CSV header: {lines[0][:120]!r}")
    out = []
    for row in rows[1:]:
        if len(row) != len(header):
            raise GpuFactsError(
                f"nvidia-smi printed a row of {len(row)} values for {len(header)} fields: "
                f"{','.join(row)[:120]!r}"
            )
        out.append({name: value.strip() for name, value in zip(header, row, strict=True)})
    return out


def parse_memory_mib(raw: str | None) -> int | None:
    """`81559` or `81559 MiB` -> 81559."""
    text = _value(raw)
    if text is None:
        return None
    match = re.match(r"^(\d+)(?:\s*MiB)?$", text)
    return int(match.group(1)) if match else None


def parse_cuda_version(text: str) -> str | None:
    """The CUDA version the driver supports, from `nvidia-smi -q` (any display section) or
    the banner of plain `nvidia-smi`."""
    match = re.search(r"CUDA Version\s*:\s*([0-9][0-9.]*)", text)
    return match.group(1) if match else None


def parse_topology(text: str) -> dict[str, dict[str, str]]:
    """`nvidia-smi topo -m`: the GPU-to-GPU part of the matrix, e.g.
    {"GPU0": {"GPU1": "NV18", ...}, ...}. NIC rows and columns, affinities and the legend
    are left out."""
    header: list[str] | None = None
    matrix: dict[str, dict[str, str]] = {}
    # Some versions underline the header with terminal escapes even into a pipe.
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    for line in text.splitlines():
        if not line.strip():
            if header is not None and matrix:
                break
            continue
        cells = [c.strip() for c in line.split("\t")]
        if header is None:
            if any(re.fullmatch(r"GPU\d+", c) for c in cells):
                header = cells
            continue
        name = cells[0]
        if not re.fullmatch(r"GPU\d+", name):
            if name.startswith(("NIC", "mlx")):
                continue
            break
        row = {}
        for column, cell in zip(header[1:], cells[1:], strict=False):
            if re.fullmatch(r"GPU\d+", column) and column != name:
                row[column] = cell
        matrix[name] = row
    return matrix


def topology_summary(matrix: dict[str, dict[str, str]]) -> dict:
    """NVLink presence from the matrix: any pair joined by NV<n>, and whether every pair is."""
    pairs = [(a, b, link) for a, row in matrix.items() for b, link in row.items() if a < b]
    nvlinked = [p for p in pairs if re.fullmatch(r"NV\d+", p[2])]
    return {
        "nvlink": bool(nvlinked),
        "nvlink_all_pairs": bool(pairs) and len(nvlinked) == len(pairs),
        "nvlink_links_max": max((int(p[2][2:]) for p in nvlinked), default=0),
    }


def parse_driver_version_file(text: str) -> dict:
    """`/proc/driver/nvidia/version`: the loaded module's version and flavour."""
    first = text.splitlines()[0] if text.strip() else ""
    match = re.search(r"(\d+\.\d+(?:\.\d+)?)", first)
    if not first.startswith("NVRM") or not match:
        return {"version": None, "kernel_module": None}
    flavour = "open" if "Open Kernel Module" in first else "proprietary"
    return {"version": match.group(1), "kernel_module": flavour}


def driver_branch(version: str | None) -> str | None:
    """`570.133.20` -> `570`."""
    return version.split(".", 1)[0] if version else None


def _gpu_problems(gpu: dict[str, str | None], health: dict[str, str] | None) -> list[str]:
    where = f"GPU{gpu['index']} ({gpu['pci_bus_id']})"
    problems = []
    values = list(gpu.values()) + (list(health.values()) if health else [])
    if any(str(v).strip().lower() in _BROKEN for v in values if v):
        problems.append(f"{where}: nvidia-smi reports it lost or in need of a reset")
    if not health:
        return problems
    ecc = _int(health.get("ecc.errors.uncorrected.volatile.total"))
    if ecc:
        problems.append(f"{where}: {ecc} uncorrectable ECC error(s) since the driver loaded")
    if (_value(health.get("remapped_rows.failure")) or "").lower() == "yes":
        problems.append(f"{where}: row remapping failed (the GPU needs service)")
    if (_value(health.get("remapped_rows.pending")) or "").lower() == "yes":
        problems.append(f"{where}: a row remapping is pending (reset the GPU or reboot)")
    if (_value(health.get("retired_pages.pending")) or "").lower() == "yes":
        problems.append(f"{where}: a page retirement is pending (reset the GPU or reboot)")
    if (_value(health.get("clocks_throttle_reasons.hw_slowdown")) or "").lower() == "active":
        problems.append(f"{where}: hardware slowdown is active (power or thermal)")
    return problems


def build_gpus(query_rows: list[dict[str, str]], health_rows: list[dict[str, str]] | None):
    """Per-GPU facts from the inventory rows and (when read) the health rows."""
    health_by_index = {row["index"]: row for row in health_rows or []}
    gpus = []
    for row in query_rows:
        gpu = {
            "index": int(row["index"]),
            "uuid": _value(row.get("uuid")),
            "name": _value(row.get("name")),
            "pci_bus_id": _value(row.get("pci.bus_id")),
            "memory_mib": parse_memory_mib(row.get("memory.total")),
            "driver_version": _value(row.get("driver_version")),
            "mig_mode": _value(row.get("mig.mode.current")),
            "persistence_mode": _value(row.get("persistence_mode")),
            "compute_cap": _value(row.get("compute_cap")),
        }
        health = health_by_index.get(row["index"])
        problems = _gpu_problems({**gpu, "index": row["index"]}, health)
        gpu["temperature_c"] = _int(health.get("temperature.gpu")) if health else None
        gpu["ecc_uncorrected_volatile"] = (
            _int(health.get("ecc.errors.uncorrected.volatile.total")) if health else None
        )
        gpu["health_read"] = health is not None
        gpu["healthy"] = not problems
        gpu["problems"] = problems
        gpus.append(gpu)
    return gpus


def summarize(gpus: list[dict], cuda_version: str | None, topology: dict) -> dict:
    """The fleet-level view of one node's GPUs: what the planner and preflights compare."""
    models = sorted({g["name"] for g in gpus if g["name"]})
    memories = [g["memory_mib"] for g in gpus if g["memory_mib"] is not None]
    drivers = sorted({g["driver_version"] for g in gpus if g["driver_version"]})
    return {
        "count": len(gpus),
        "model": models[0] if len(models) == 1 else ("mixed" if models else None),
        "models": models,
        "memory_mib": min(memories) if memories else None,
        "memory_mib_total": sum(memories),
        "driver_version": drivers[0] if len(drivers) == 1 else (drivers[-1] if drivers else None),
        "cuda_version": cuda_version,
        "mig_enabled": any((g["mig_mode"] or "").lower() == "enabled" for g in gpus),
        "healthy": all(g["healthy"] for g in gpus),
        "problems": [p for g in gpus for p in g["problems"]],
        **topology_summary(topology),
    }


# --- readers of the node ----------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def scan_pci(host_root: str = "/") -> dict:
    """NVIDIA GPUs and NVSwitches on the PCI bus, read from sysfs: works before any driver
    is installed."""
    base = os.path.join(host_root, "sys/bus/pci/devices")
    gpus, switches = [], []
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        entries = []
    for address in entries:
        vendor = (_read(os.path.join(base, address, "vendor")) or "").strip().lower()
        if vendor != NVIDIA_VENDOR:
            continue
        klass = (_read(os.path.join(base, address, "class")) or "").strip().lower()
        device = (_read(os.path.join(base, address, "device")) or "").strip().lower()
        entry = {"address": address, "device_id": device}
        if klass.startswith(GPU_CLASSES):
            gpus.append(entry)
        elif klass.startswith(NVSWITCH_CLASS):
            switches.append(entry)
    return {"gpus": gpus, "nvswitches": switches}


def loaded_modules(host_root: str = "/") -> set[str]:
    text = _read(os.path.join(host_root, "proc/modules")) or ""
    return {line.split(" ", 1)[0] for line in text.splitlines() if line.strip()}


def read_driver(host_root: str = "/") -> dict:
    """The kernel side: the loaded nvidia module (version, open or proprietary) and
    whether nouveau holds the GPUs."""
    modules = loaded_modules(host_root)
    text = _read(os.path.join(host_root, "proc/driver/nvidia/version"))
    parsed = parse_driver_version_file(text) if text else {"version": None, "kernel_module": None}
    return {
        "loaded": parsed["version"] is not None,
        "version": parsed["version"],
        "branch": driver_branch(parsed["version"]),
        "kernel_module": parsed["kernel_module"],
        "nouveau_loaded": "nouveau" in modules,
    }


def _smi(run, nvidia_smi: str, *args: str) -> tuple[int, str, str]:
    return run([nvidia_smi, *args])


def collect_gpu(run, nvidia_smi: str = "nvidia-smi", host_root: str = "/", health: bool = True):
    """All GPU facts of the node. Never raises for a node without GPUs or driver: the
    result says what is there (`present`, `driver.loaded`, `nvidia_smi.usable`)."""
    pci = scan_pci(host_root)
    driver = read_driver(host_root)
    facts: dict = {
        "pci": {"gpus": pci["gpus"], "nvswitches": len(pci["nvswitches"])},
        "driver": driver,
        "nvidia_smi": {"usable": False, "error": None},
        "gpus": [],
        "topology": {},
    }
    rc, out, err = _smi(
        run, nvidia_smi, "--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,nounits"
    )
    if rc != 0:
        facts["nvidia_smi"]["error"] = (err or out or f"exit status {rc}").strip()[:500]
        facts.update(summarize([], None, {}))
    else:
        query_rows = parse_query_csv(out)
        health_rows = None
        health_error = None
        if health:
            for fields in (HEALTH_FIELDS, HEALTH_FIELDS_MINIMAL):
                hrc, hout, herr = _smi(
                    run, nvidia_smi, "--query-gpu=" + ",".join(fields), "--format=csv,nounits"
                )
                if hrc == 0:
                    health_rows = parse_query_csv(hout)
                    break
                health_error = (herr or hout).strip()[:300]
        crc, cout, _ = _smi(run, nvidia_smi, "-q", "-d", "COMPUTE")
        cuda = parse_cuda_version(cout) if crc == 0 else None
        trc, tout, _ = _smi(run, nvidia_smi, "topo", "-m")
        topology = parse_topology(tout) if trc == 0 else {}
        gpus = build_gpus(query_rows, health_rows)
        facts["nvidia_smi"]["usable"] = True
        facts["nvidia_smi"]["health_error"] = None if health_rows is not None else health_error
        facts["gpus"] = gpus
        facts["topology"] = topology
        facts.update(summarize(gpus, cuda, topology))
        if not driver["loaded"] and facts["driver_version"]:
            # No procfs view (a container): nvidia-smi's word for the version.
            driver.update(
                version=facts["driver_version"],
                branch=driver_branch(facts["driver_version"]),
                loaded=True,
            )
    facts["present"] = bool(pci["gpus"]) or facts["count"] > 0
    facts["nvswitch"] = facts["pci"]["nvswitches"] > 0
    return facts


# --- node facts for the fabric preflight -------------------------------------------------


def shm_bytes(path: str = "/dev/shm") -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def parse_timedatectl(text: str) -> bool | None:
    """`timedatectl show` -> NTPSynchronized as a bool (None when absent)."""
    match = re.search(r"^NTPSynchronized=(yes|no)$", text, re.MULTILINE)
    return None if not match else match.group(1) == "yes"


def parse_chronyc_tracking(text: str) -> bool | None:
    """`chronyc tracking` -> synchronized when a reference is selected and the leap status
    is normal."""
    leap = re.search(r"^Leap status\s*:\s*(.+)$", text, re.MULTILINE)
    ref = re.search(r"^Reference ID\s*:\s*(\S+)", text, re.MULTILINE)
    if not leap:
        return None
    return leap.group(1).strip() == "Normal" and bool(ref) and ref.group(1) != "00000000"


def clock_sync(run) -> dict:
    """Is the clock disciplined? chrony first (the usual daemon on servers), then
    systemd's view (timesyncd or any NTP service that reports to it)."""
    for argv, parser, source in (
        (["chronyc", "-n", "tracking"], parse_chronyc_tracking, "chrony"),
        (["timedatectl", "show"], parse_timedatectl, "timedatectl"),
    ):
        try:
            rc, out, _ = run(argv)
        except OSError:
            continue
        if rc == 0:
            synced = parser(out)
            if synced is not None:
                return {"synchronized": synced, "source": source}
    return {"synchronized": None, "source": None}


def interfaces(host_root: str = "/", run=None) -> dict:
    """Network interfaces with MTU, state and IPv4/IPv6 addresses (from `ip -j addr` when
    given a runner, else sysfs only)."""
    base = os.path.join(host_root, "sys/class/net")
    result: dict[str, dict] = {}
    try:
        names = sorted(os.listdir(base))
    except OSError:
        names = []
    for name in names:
        mtu = (_read(os.path.join(base, name, "mtu")) or "").strip()
        state = (_read(os.path.join(base, name, "operstate")) or "").strip()
        result[name] = {
            "mtu": int(mtu) if mtu.isdigit() else None,
            "state": state or None,
            "addresses": [],
        }
    if run is not None:
        import json

        try:
            rc, out, _ = run(["ip", "-j", "addr", "show"])
        except OSError:
            rc, out = 1, ""
        if rc == 0 and out.strip():
            for link in json.loads(out):
                entry = result.setdefault(
                    link["ifname"], {"mtu": link.get("mtu"), "state": None, "addresses": []}
                )
                entry["mtu"] = link.get("mtu", entry["mtu"])
                entry["state"] = (link.get("operstate") or entry["state"] or "").lower() or None
                entry["addresses"] = [
                    f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", [])
                ]
    return result


def collect_node(run, host_root: str = "/") -> dict:
    return {
        "interfaces": interfaces(host_root, run),
        "shm_bytes": shm_bytes(os.path.join(host_root, "dev/shm")),
        "clock": clock_sync(run),
    }
