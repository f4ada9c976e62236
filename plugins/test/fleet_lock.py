# Copyright: inferfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""Jinja test `holder is inferfleet.fleet.gone_holder`: the fleet's lock was left by a run
of this controller whose process has ended (module_utils.fleet_lock.gone)."""

from __future__ import annotations

from ansible_collections.inferfleet.fleet.plugins.module_utils import fleet_lock as fl

DOCUMENTATION = r"""
name: gone_holder
short_description: Was the fleet's lock left by a run of this controller that has ended?
description:
  - True for a holder of this controller (host name and boot id) whose process is gone;
    false for a live one, and for any of another controller.
positional: _input
options:
  _input:
    description: The lock's holder (fleet_lock's RV(holder)).
    type: dict
    required: true
"""


class TestModule:
    def tests(self):
        return {"gone_holder": fl.gone}
