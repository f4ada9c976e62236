"""Print this node's side of the route to a peer as JSON: the peer's IPv4 address, the
interface and source address the kernel would use to reach it, and that interface's MTU.

    python3 group_route.py PEER      (a name or an address)

The group network is what the node really uses to reach rank 0, not a guess from the
default route: on a machine with a management and a fabric network they differ.
"""

import json
import socket
import subprocess
import sys


def parse_route(line: str) -> dict:
    """`ip -o route get ADDR` output -> {interface, address}; local routes say `dev lo`."""
    words = line.split()
    out = {}
    for key, name in (("dev", "interface"), ("src", "address")):
        if key in words and words.index(key) + 1 < len(words):
            out[name] = words[words.index(key) + 1]
    return out


def main(peer: str) -> int:
    try:
        address = socket.getaddrinfo(peer, None, socket.AF_INET)[0][4][0]
    except socket.gaierror as err:
        print(f"cannot resolve {peer}: {err}", file=sys.stderr)
        return 2
    done = subprocess.run(["ip", "-o", "route", "get", address], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"no route to {peer} ({address}): {done.stderr.strip()}", file=sys.stderr)
        return 2
    route = parse_route(done.stdout)
    try:
        with open(f"/sys/class/net/{route.get('interface', '')}/mtu") as f:
            route["mtu"] = int(f.read())
    except (OSError, ValueError):
        route["mtu"] = None
    print(json.dumps({"peer": address, **route}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
