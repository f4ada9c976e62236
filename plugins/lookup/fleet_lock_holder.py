# Copyright: inferfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""Lookup inferfleet.fleet.fleet_lock_holder: who this run is, for the fleet's lock."""

from __future__ import annotations

import getpass
import multiprocessing
import os

from ansible.plugins.lookup import LookupBase
from ansible_collections.inferfleet.fleet.plugins.module_utils import fleet_lock as fl

DOCUMENTATION = r"""
name: fleet_lock_holder
short_description: Who this ansible-playbook run is, as the fleet's lock shows it
description:
  - Returns one dict, the user, this controller (host name and boot id) and the process
    of this ansible-playbook run (lookups run in its task workers, whose parent it is),
    so that a later run of this controller can tell a lock whose run has ended.
options: {}
"""

RETURN = r"""
_raw:
  description: "[{user, controller, boot_id, pid}]"
  type: list
  elements: dict
"""


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        parent = multiprocessing.parent_process()
        pid = parent.pid if parent is not None else os.getpid()
        return [{"user": getpass.getuser()} | fl.this_controller(pid)]
