#!/usr/bin/python
# Copyright: inferfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""Ansible module model_sync_info: which model version a node serves, read-only."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.inferfleet.fleet.plugins.module_utils.model_sync_cache import ModelCache

DOCUMENTATION = r"""
---
module: model_sync_info
short_description: Read which verified model version a node's cache serves
description:
  - Reads the cache that M(inferfleet.fleet.model_sync) keeps in C(CACHE_ROOT/NAME),
    the version the C(current) link points at, and the manifest digest that version was
    verified against (its completion marker), without reading the weights.
  - A version without a completion marker (an interrupted copy, or none at all) has an
    empty RV(digest); nothing is ever written.
version_added: "0.2.0"
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
  name:
    description: The model's name (its folder under O(cache_root)).
    type: str
    required: true
  cache_root:
    description: The local folder holding one sub-folder per model.
    type: path
    required: true
"""

EXAMPLES = r"""
- name: Read what the node serves
  inferfleet.fleet.model_sync_info:
    name: tiny-llama
    cache_root: /var/lib/inferfleet/models
  register: served

- name: Refuse a node without a verified version
  ansible.builtin.assert:
    that: served.digest | length > 0
"""

RETURN = r"""
version:
  description: The version C(current) points at; empty when there is none.
  returned: always
  type: str
  sample: v2
digest:
  description: The manifest digest that version was verified against; empty when it is not complete.
  returned: always
  type: str
  sample: sha256:4f2a...
path:
  description: The C(current) link (what the engine loads).
  returned: always
  type: str
  sample: /var/lib/inferfleet/models/tiny-llama/current
cache_dir:
  description: The model's folder in the cache (every version it keeps).
  returned: always
  type: str
  sample: /var/lib/inferfleet/models/tiny-llama
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={"name": {"type": "str", "required": True},
                       "cache_root": {"type": "path", "required": True}},
        supports_check_mode=True,
    )
    module.exit_json(changed=False,
                     **ModelCache(module.params["cache_root"], module.params["name"]).served())


if __name__ == "__main__":
    main()
