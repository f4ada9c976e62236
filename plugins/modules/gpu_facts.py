#!/usr/bin/python
# Copyright: inferfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""Ansible module gpu_facts: a node's NVIDIA GPUs, driver and topology as clean facts."""

from __future__ import annotations

import os
import traceback

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.inferfleet.fleet.plugins.module_utils.gpu import (
    GpuFactsError,
    collect_gpu,
    collect_node,
)

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Read a node's NVIDIA GPUs, driver, CUDA version and topology
description:
  - Scans the PCI bus (sysfs) for NVIDIA GPUs and NVSwitches, which works before any
    driver is installed, and reads the loaded kernel module from
    C(/proc/driver/nvidia/version) (version; open or proprietary) and whether C(nouveau)
    is loaded.
  - When C(nvidia-smi) answers, adds per-GPU facts from its CSV query format (index,
    UUID, model, PCI bus id, memory, driver version, MIG mode, persistence mode, compute
    capability), a health verdict per GPU (uncorrectable ECC errors, pending or failed
    row remapping, pending page retirement, hardware slowdown, lost GPUs), the CUDA
    version the driver supports (C(nvidia-smi -q -d COMPUTE)) and the GPU-to-GPU part of
    the topology matrix (C(nvidia-smi topo -m)).
  - Never fails for a node without GPUs or driver; the facts say what is there.
  - Sets the fact C(inferfleet_gpu), and C(inferfleet_node) with O(node=true).
  - The parsing lives in the collection's module_utils C(gpu), which
    C(scripts/gpu-check/gpu_facts.sh) also runs without Ansible.
version_added: "0.1.0"
author: inferfleet contributors
attributes:
  check_mode:
    support: full
    description: It only reads; check mode returns the same facts.
  diff_mode:
    support: none
  platform:
    platforms: posix
options:
  nvidia_smi:
    description: The nvidia-smi command (a name looked up on PATH, or a path).
    type: str
    default: nvidia-smi
  health:
    description: Also read the per-GPU health fields (a second, cheap query).
    type: bool
    default: true
  node:
    description:
      - Also read the node facts the fabric preflight compares across a group
        (interfaces with MTU and addresses, the size of C(/dev/shm), clock
        synchronisation) into C(inferfleet_node).
    type: bool
    default: false
  host_root:
    description:
      - Where C(sys/) and C(proc/) are read from. C(/) on a real node; tests point it at
        a fake tree.
    type: path
    default: /
notes:
  - Supports check mode; reads only.
"""

EXAMPLES = r"""
- name: Read the GPUs
  gpu_facts:

- name: The node has eight healthy GPUs
  ansible.builtin.assert:
    that:
      - inferfleet_gpu.count == 8
      - inferfleet_gpu.healthy
"""

RETURN = r"""
ansible_facts:
  description: The facts.
  returned: always
  type: dict
  contains:
    inferfleet_gpu:
      description:
        - C(present) (any NVIDIA GPU on the PCI bus or in nvidia-smi), C(count), C(model)
          (C(mixed) when models differ), C(models), C(memory_mib) (the smallest GPU's),
          C(memory_mib_total), C(driver_version), C(cuda_version), C(mig_enabled),
          C(nvlink), C(nvlink_all_pairs), C(nvlink_links_max), C(nvswitch), C(healthy),
          C(problems) (one line per finding, naming the GPU).
        - C(driver) (C(loaded), C(version), C(branch), C(kernel_module) open or
          proprietary, C(nouveau_loaded)); C(pci) (C(gpus) with address and device id,
          C(nvswitches) count); C(nvidia_smi) (C(usable), C(error)); C(gpus) (per GPU);
          C(topology) (GPU to GPU link, e.g. NV18, SYS, NODE).
      type: dict
      returned: always
      sample:
        present: true
        count: 2
        model: NVIDIA L40S
        memory_mib: 46068
        driver_version: 570.133.20
        cuda_version: "12.8"
        mig_enabled: false
        nvlink: false
        nvswitch: false
        healthy: true
        problems: []
    inferfleet_node:
      description: With O(node=true) only. C(interfaces) (name to C(mtu), C(state),
        C(addresses)), C(shm_bytes), C(clock) (C(synchronized) true/false/null, C(source)).
      type: dict
      returned: when node is true
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            health=dict(type="bool", default=True),
            node=dict(type="bool", default=False),
            host_root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    smi = module.get_bin_path(params["nvidia_smi"]) or params["nvidia_smi"]

    def run(argv):
        binary = module.get_bin_path(argv[0]) if "/" not in argv[0] else argv[0]
        if binary is None or not os.access(binary, os.X_OK):
            return 127, "", f"{argv[0]}: command not found"
        rc, out, err = module.run_command([binary, *argv[1:]], environ_update={"LC_ALL": "C"})
        return rc, out, err

    try:
        facts = {"inferfleet_gpu": collect_gpu(run, smi, params["host_root"], params["health"])}
        if params["node"]:
            facts["inferfleet_node"] = collect_node(run, params["host_root"])
    except GpuFactsError as err:
        module.fail_json(
            msg=f"cannot read the GPU facts: {err}. Run `nvidia-smi` on the node to see "
            "whether the driver answers.",
            exception=traceback.format_exc(),
        )
    module.exit_json(changed=False, ansible_facts=facts)


if __name__ == "__main__":
    main()
