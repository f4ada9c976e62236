"""FAKE GPU host layout, for tests only; it never touches a GPU. For one shape, under BASE:
bin/ and nvidia-smi/ (where the fake nvidia-smi and its samples go) and root/, the sys/ and
proc/ tree gpu_facts reads as its host_root: a PCI device per GPU and NVSwitch (vendor,
device, class) beside an Intel host bridge, proc/driver/nvidia/ and proc/modules.

    python3 fake_gpu_tree.py '{"base": BASE, "gpus": [[BUS, DEVICE_ID], ...],
                               "switches": [[BUS, DEVICE_ID], ...], "modules": [NAME, ...]}'
"""

import json
import os
import sys


def build(base, gpus, switches, modules):
    """Writes the layout under base; returns its root/ folder."""
    root = os.path.join(base, "root")
    for folder in ("bin", "nvidia-smi", "root/proc/driver/nvidia"):
        os.makedirs(os.path.join(base, folder), exist_ok=True)
    devices = [(a, "0x10de", d, "0x030200") for a, d in gpus]
    devices += [(a, "0x10de", d, "0x068000") for a, d in switches]
    devices.append(("0000:00:00.0", "0x8086", "0x09a2", "0x060000"))
    for address, vendor, device, klass in devices:
        folder = os.path.join(root, "sys", "bus", "pci", "devices", address)
        os.makedirs(folder, exist_ok=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", klass)):
            with open(os.path.join(folder, name), "w", encoding="utf-8") as handle:
                handle.write(value + "\n")
    with open(os.path.join(root, "proc", "modules"), "w", encoding="utf-8") as handle:
        for module in modules:
            handle.write(f"{module} 16384 0 - Live 0x0000000000000000\n")
    return root


if __name__ == "__main__":
    shape = json.loads(sys.argv[1])
    build(shape["base"], shape["gpus"], shape["switches"], shape["modules"])
