#!/usr/bin/python
# Copyright: inferfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""Ansible module release_info: what a node runs, read-only, in one step."""

from __future__ import annotations

import json
import os
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.inferfleet.fleet.plugins.module_utils.model_sync_cache import ModelCache

DOCUMENTATION = r"""
---
module: release_info
short_description: Read a node's release record, whether its engine serves, and its model version
description:
  - Reads, without changing anything, what the rollout role needs to know of a node
    before a run: the release record a rolling update left in O(state_dir)
    (C(release.json), its C(vars)), whether the engine's systemd unit is active, and the
    model version the cache of M(inferfleet.fleet.model_sync) serves (as
    M(inferfleet.fleet.model_sync_info) reads it).
  - One module, not three tasks, because every task costs the controller a process on
    every node of the fleet.
version_added: "0.3.0"
author: inferfleet contributors
attributes:
  check_mode:
    support: full
    description: It only reads; check mode returns the same.
  diff_mode:
    support: none
  platform:
    platforms: posix
options:
  state_dir:
    description: The rollout role's state folder (C(release.json) in it; none is an empty record).
    type: path
    required: true
  unit:
    description: The engine's systemd unit.
    type: str
    required: true
  model_name:
    description: The model's name (its folder under O(cache_root)).
    type: str
    required: true
  cache_root:
    description: The local folder holding one sub-folder per model.
    type: path
    required: true
"""

EXAMPLES = r"""
- name: Read what the node runs
  inferfleet.fleet.release_info:
    state_dir: /var/lib/inferfleet/rollout
    unit: inferfleet-engine.service
    model_name: tiny-llama
    cache_root: /var/lib/inferfleet/models
  register: node
"""

RETURN = r"""
recorded:
  description: The variables the last rolling update recorded on the node; empty when none did.
  returned: always
  type: dict
  sample: {inferfleet_model_version: v2}
serving:
  description: Whether the engine's unit is active.
  returned: always
  type: bool
served:
  description: The model version the node serves, as M(inferfleet.fleet.model_sync_info) returns it.
  returned: always
  type: dict
  sample:
    version: v2
    digest: sha256:4f2a...
    path: /var/lib/inferfleet/models/tiny-llama/current
    cache_dir: /var/lib/inferfleet/models/tiny-llama
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state_dir": {"type": "path", "required": True},
            "unit": {"type": "str", "required": True},
            "model_name": {"type": "str", "required": True},
            "cache_root": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    record = os.path.join(p["state_dir"], "release.json")
    recorded = {}
    if os.path.exists(record):
        try:
            with open(record, encoding="utf-8") as f:
                recorded = json.load(f).get("vars") or {}
        except (OSError, ValueError, AttributeError) as e:
            module.fail_json(msg=f"{record} is not a release record ({e}): restore it from another "
                             "node of the same instance, or remove it to run with the inventory")
    active = subprocess.run(
        ["systemctl", "show", p["unit"], "--property", "ActiveState", "--value"],
        capture_output=True, text=True, check=False,
    )
    module.exit_json(
        changed=False,
        recorded=recorded,
        serving=active.stdout.strip() == "active",
        served=ModelCache(p["cache_root"], p["model_name"]).served(),
    )


if __name__ == "__main__":
    main()
