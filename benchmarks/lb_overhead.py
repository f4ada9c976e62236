"""What the load balancer costs and what a second replica buys, measured on the lab.

Needs the lab (`inferfleet lab up`). The same bounded load is sent (a) straight to one
engine, (b) through HAProxy with only that engine in service (the other one set to
maintenance through the runtime API), (c) through HAProxy to both. Prints latency
p50/p99 and throughput for each, and the ratios (b)/(a) for p50 latency (target: under
1.05) and (c)/(b) for throughput (target: at least 1.8, machine permitting). A run in
which any request failed says so and exits 1 without ratios.

    .venv/bin/python benchmarks/lb_overhead.py [--concurrency 4] [--count 80] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from inferfleet.commands.common import LAB_INVENTORY
from inferfleet.fleet import load
from inferfleet.verify import LoadReport, run_load


def set_state(lb: str, server: str, state: str) -> None:
    cmd = f"set server inferfleet_engines/{server} state {state}"
    subprocess.run(
        [
            "docker",
            "exec",
            lb,
            "sh",
            "-c",
            f"echo '{cmd}' | socat stdio UNIX-CONNECT:/run/haproxy/admin.sock",
        ],
        check=True,
        capture_output=True,
    )


def row(name: str, r: LoadReport) -> str:
    return (
        f"{name:34} {r.sent:5d} {r.failed:6d} {r.p50 * 1000:9.1f} {r.p99 * 1000:9.1f}"
        f" {r.throughput:8.2f}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--count", type=int, default=80)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()
    fleet = load(LAB_INVENTORY)
    first, second = fleet.serving[0], fleet.serving[1]
    lb_container = "inferfleet-lab-lb"

    def measure(base: str, key: str) -> LoadReport:
        run_load(
            base,
            fleet.model,
            key,
            args.concurrency,
            args.concurrency * 2,
            max_tokens=args.max_tokens,
        )  # warm-up, not counted
        return run_load(
            base, fleet.model, key, args.concurrency, args.count, max_tokens=args.max_tokens
        )

    direct = measure(first.base, fleet.engine_key)
    # Both first: a server put back from maintenance ramps up over `slowstart`, which
    # would be measured as queueing.
    both = measure(fleet.balancers[0], fleet.api_key)
    set_state(lb_container, second.host, "maint")
    try:
        one = measure(fleet.balancers[0], fleet.api_key)
    finally:
        set_state(lb_container, second.host, "ready")

    print(
        f"cores on this machine: {os.cpu_count()}; each engine's worker is pinned to one, its"
        " API server and engine core, HAProxy and this client share them"
    )
    print(f"{'':34} {'sent':>5} {'failed':>6} {'p50 ms':>9} {'p99 ms':>9} {'req/s':>8}")
    print(row("(a) one engine, direct", direct))
    print(row("(b) HAProxy, one backend", one))
    print(row("(c) HAProxy, two backends", both))
    failed = [r for r in (direct, one, both) if r.failed]
    if failed:
        for r in failed:
            print(f"FAILED: {r.failed} of {r.sent} requests: {r.errors[:3]}")
        print("no ratio: a run with failed requests measures nothing")
        return 1
    print(f"(b)/(a) p50 latency: {one.p50 / direct.p50:.3f}  (target < 1.05)")
    print(f"(c)/(b) throughput:  {both.throughput / one.throughput:.3f}  (target >= 1.8)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
