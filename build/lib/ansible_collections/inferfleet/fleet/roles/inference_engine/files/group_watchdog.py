"""Watchdog of one member of a multi-node instance (vLLM's native multi-node runtime).

A group is only as alive as its weakest member, and vLLM does not notice a lost one:
when a headless rank dies, rank 0 keeps answering /health while every request hangs.
systemd restarts the dead member alone, which cannot rejoin a group that has moved on.
So each member watches the group's own sign of life, the TCP connections every rank
holds to rank 0's torch.distributed store (the master port) for its whole life:

- the group is formed once rank 0 answers /health (the engine is up on every rank);
  then this member notes its connections: on rank 0 those from each peer to the master
  port, elsewhere its own to rank 0's master port;
- if one of those connections is gone (its process died, or rank 0 restarted), or the
  group did not form within the rendezvous timeout, this member restarts its engine.
  Rank 0 stopping takes the instance out of the load balancer (its /health fails) until
  the group has formed again; the other members, seeing their connection gone, restart
  too: the whole group restarts as one.

    python3 group_watchdog.py --unit U --rank R --master-addr A --master-port P
        --health-url URL [--peer ADDR ...] [--timeout S] [--interval S]

Runs as a systemd service PartOf= the engine's unit (it stops, and starts afresh, with it).
Standard library only; its log lines go to the journal.
"""

from __future__ import annotations

import argparse
import ipaddress
import subprocess
import time
import urllib.request

ESTABLISHED = "01"


def _addr(hex_addr: str) -> tuple[str, int]:
    """/proc/net/tcp{,6} `ADDR:PORT` (little-endian hex words) -> (IP, port); IPv4-mapped
    IPv6 addresses come back as IPv4."""
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    # the kernel prints each 32-bit word in host (little-endian) order
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return str(ip), int(port, 16)


def connections(tables: list[str]) -> set[tuple[str, int, str, int]]:
    """Established TCP connections (local ip, local port, remote ip, remote port) from the
    text of /proc/net/tcp and /proc/net/tcp6."""
    out = set()
    for text in tables:
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == ESTABLISHED:
                out.add(_addr(fields[1]) + _addr(fields[2]))
    return out


def group_links(conns, rank: int, master_addr: str, master_port: int, peers: list[str]):
    """The connections that show this member is joined: rank 0, those from each peer to
    its master port; another rank, its own to rank 0's master port."""
    if rank == 0:
        return {c for c in conns if c[1] == master_port and c[2] in peers}
    return {c for c in conns if c[2] == master_addr and c[3] == master_port}


def missing_peers(links, peers: list[str]) -> list[str]:
    return [p for p in peers if not any(c[2] == p for c in links)]


def read_tables() -> list[str]:
    out = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                out.append(f.read())
        except OSError:
            pass
    return out


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as reply:
            return reply.status == 200
    except OSError:
        return False


def active_seconds(unit: str) -> float | None:
    """Seconds the unit has been active, None when it is not (stopped, starting, failed)."""
    done = subprocess.run(
        ["systemctl", "show", unit, "--property=ActiveState,ActiveEnterTimestampMonotonic"],
        capture_output=True, text=True)
    props = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    if props.get("ActiveState") != "active":
        return None
    with open("/proc/uptime") as f:
        now = float(f.read().split()[0])
    return now - int(props.get("ActiveEnterTimestampMonotonic") or 0) / 1e6


def restart(unit: str, why: str) -> None:
    print(f"restarting {unit}: {why}", flush=True)
    # A broken group cannot finish what it holds: no graceful drain (its /health would
    # keep the instance in the load balancer meanwhile). Kill, then start afresh;
    # --no-block, since this service is PartOf the engine and restarts with it.
    subprocess.run(["systemctl", "kill", "--signal=SIGKILL", unit], check=False)
    subprocess.run(["systemctl", "restart", "--no-block", unit], check=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unit", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--health-url", required=True, help="rank 0's /health")
    parser.add_argument("--peer", action="append", default=[],
                        help="(rank 0) each other member's group address")
    parser.add_argument("--timeout", type=float, default=600, help="to form the group")
    parser.add_argument("--interval", type=float, default=5)
    args = parser.parse_args(argv)
    expected = args.peer if args.rank == 0 else [args.master_addr]
    joined = None  # the connections noted when the group formed
    restarted = None  # how long the engine had been up when this watchdog restarted it
    print(f"watching rank {args.rank} of a group: master {args.master_addr}:{args.master_port}"
          f", expecting links with {', '.join(expected)}", flush=True)
    while True:
        time.sleep(args.interval)
        up_for = active_seconds(args.unit)
        if up_for is None or (restarted is not None and up_for >= restarted):
            # stopped (on purpose, or restarting): not ours to judge; after our own
            # restart, wait for the new start
            joined = None
            restarted = None if up_for is None else restarted
            continue
        restarted = None
        links = group_links(connections(read_tables()), args.rank, args.master_addr,
                            args.master_port, args.peer)
        why = None
        if joined is None:
            if healthy(args.health_url):
                missing = missing_peers(links, expected)
                if missing:
                    why = (f"the group answers but {', '.join(missing)} holds no connection "
                           f"to the master port {args.master_port}")
                else:
                    joined = links
                    print(f"group formed after {up_for:.0f} s; {len(links)} link(s) noted",
                          flush=True)
            elif up_for > args.timeout:
                why = (f"the group did not form within {args.timeout:.0f} s (rank 0's "
                       f"{args.health_url} does not answer 200); no link with: "
                       f"{', '.join(missing_peers(links, expected)) or 'none'}")
        elif joined - links:
            who = sorted({c[2] for c in joined - links})
            why = (f"the group lost its link with {', '.join(who)} (a member stopped or "
                   "restarted): restarting to form it again")
        if why:
            restart(args.unit, why)
            joined, restarted = None, up_for

if __name__ == "__main__":
    main()
