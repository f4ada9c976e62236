"""Who a node takes model pieces from: the engine nodes that take part (model_sync_peers),
with the address their peers reach them at (docs/model-sync.md, "Between nodes")."""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible_collections.inferfleet.fleet.plugins.filter.firewall import (
    FirewallError,
    _on,
    host_addresses,
)


def model_sync_peer_list(groups: Mapping, hostvars: Mapping, defaults: Mapping) -> list[dict]:
    """[{name, address, url}] of the inventory's engine nodes that take part, by name.

    `defaults`: {peers, port}, the values of model_sync_peers and model_sync_peer_port
    for hosts that do not set their own."""
    found = []
    for host in sorted(groups.get("inference", [])):
        hv = hostvars[host]
        if not _on(hv.get("model_sync_peers", defaults["peers"])):
            continue
        try:
            address = host_addresses(host, hv)[0]
        except FirewallError as err:
            raise AnsibleFilterError(f"model_sync_peers: {err}") from err
        port = int(hv.get("model_sync_peer_port", defaults["port"]))
        shown = f"[{address}]" if ":" in address else address
        found.append({"name": host, "address": address, "url": f"http://{shown}:{port}"})
    return found


class FilterModule:
    def filters(self):
        return {"model_sync_peer_list": model_sync_peer_list}
