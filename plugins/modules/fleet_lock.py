#!/usr/bin/python
# Copyright: inferfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""Ansible module fleet_lock: take or release the fleet's lock (module_utils.fleet_lock)."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.inferfleet.fleet.plugins.module_utils import fleet_lock as fl

DOCUMENTATION = r"""
---
module: fleet_lock
short_description: One operation at a time on a fleet, across controllers
description:
  - Takes (O(state=held)) or releases (O(state=absent)) a lock directory on the host it
    runs on, made with mkdir so that of two takers exactly one gets it. The lock names its
    holder (O(holder), plus O(token)).
  - A taker with the holder's token holds it already. Any other taker fails, and the
    failure returns the holder, unless O(force) or O(break_token) (the token of a holder
    the caller proved gone) says to break it; RV(broken) is then the holder it broke.
version_added: "0.3.0"
author: inferfleet contributors
attributes:
  check_mode:
    support: none
  diff_mode:
    support: none
  platform:
    platforms: posix
options:
  path:
    description: The lock directory.
    type: path
    required: true
  state:
    description: V(held) takes the lock for O(token), V(absent) releases it.
    type: str
    choices: [held, absent]
    default: held
  token:
    description: The holder's secret-free identity of this run (random per run).
    type: str
    required: true
  holder:
    description: Who holds it, shown to whoever is refused (user, controller, command, since, ...).
    type: dict
    default: {}
  force:
    description: Break whoever holds it (the operator's --force-unlock).
    type: bool
    default: false
  break_token:
    description: Break the lock only if this token holds it (a holder proved gone).
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Take the fleet's lock
  inferfleet.fleet.fleet_lock:
    path: /var/lib/inferfleet/lock
    token: "{{ token }}"
    holder: {user: ops, controller: bastion1, command: inferfleet rollout}
"""

RETURN = r"""
refused:
  description: True when another holder has the lock (the module then fails).
  returned: failure
  type: bool
done:
  description: True when the lock is held (V(held)) or free (V(absent)) as asked.
  returned: success
  type: bool
holder:
  description: The holder the lock has after this run (on a refusal, the one that holds it).
  returned: always
  type: dict
broken:
  description: The holder that was broken (O(force) or O(break_token)); null when none.
  returned: always
  type: dict
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["held", "absent"], "default": "held"},
            "token": {"type": "str", "required": True, "no_log": False},
            "holder": {"type": "dict", "default": {}},
            "force": {"type": "bool", "default": False},
            "break_token": {"type": "str", "default": "", "no_log": False},
        },
        supports_check_mode=False,
    )
    p = module.params
    try:
        if p["state"] == "held":
            changed, broken = fl.take(
                p["path"], p["token"], p["holder"], p["force"], p["break_token"]
            )
        else:
            changed, broken = fl.release(p["path"], p["token"], p["force"]), None
    except fl.LockHeld as held:
        module.fail_json(
            msg="the fleet's lock is held", refused=True, holder=held.holder, broken=None
        )
    module.exit_json(changed=changed, done=True, holder=fl.holder_of(p["path"]), broken=broken)


if __name__ == "__main__":
    main()
