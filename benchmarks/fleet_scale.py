"""How throughput through the load balancer grows with the replicas, on a simulated fleet.

Needs `inferfleet lab up --nodes N --engine sim`: every engine is the SIMULATED engine
(docs/engine.md), which admits the lab's 8 sequences at a time, so one replica's capacity
is a bound this machine's client can reach (two vLLM CPU engines cannot show it: they
share two cores). For k = N, N/2, ... 1 replicas in service (the others set to
maintenance through HAProxy's runtime API, none brought back in between, so no slow start
is measured), the same load per replica goes through HAProxy: guidellm (the field's
benchmark client, benchmarks/load_client.py) with --per-replica requests in flight per
replica until --requests-per-replica per replica are done, each a --prompt-tokens
synthetic prompt answered with --max-tokens. Prints req/s, latency p50 and p99, TTFT p50
and output tokens/s per k and the ratio of each throughput to k = 1's, measured in the
same run (ideal: k). Beside each k, the CPU each part used during it: the client
(guidellm and its worker processes), the load balancer's container, the engines'
containers (their cgroups' counters), and how busy the machine's cores were: a phase whose
client, HAProxy or machine was near its limit measures the CPU, not the fleet. A run in
which any request failed says so and exits 1 without ratios.

    make .venv-bench/bin/guidellm
    .venv/bin/python benchmarks/fleet_scale.py [--per-replica 8] [--max-tokens 128]

With --deploy it times, instead, a no-change `inferfleet deploy` of the lab with Ansible's
own strategy and with Mitogen's (INFERFLEET_MITOGEN=1), alternately --deploy-runs times
each, and prints the ratio of their medians; a run that fails or changes anything says so
and exits 1 without ratios. Beside each: the controller's CPU (the CLI, ansible-playbook,
its workers and the docker commands they start) and the lab containers' CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from lb_overhead import set_state
from load_client import guidellm, require

from inferfleet.commands.common import LAB_INVENTORY
from inferfleet.fleet import load

LB_CONTAINER = "inferfleet-lab-lb"


def version(base: str, key: str) -> str:
    request = urllib.request.Request(f"{base}/version", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)["version"]


def container_cpu_file(name: str) -> Path:
    """The file that counts a container's CPU time: cgroup v2's cpu.stat, or v1's
    cpuacct.usage (systemd's or cgroupfs' layout)."""
    full = subprocess.run(["docker", "inspect", "-f", "{{.Id}}", name], capture_output=True,
                          text=True, check=True).stdout.strip()
    root = Path("/sys/fs/cgroup")
    for candidate in (root / "system.slice" / f"docker-{full}.scope" / "cpu.stat",
                      root / "docker" / full / "cpu.stat",
                      root / "cpuacct" / "system.slice" / f"docker-{full}.scope" / "cpuacct.usage",
                      root / "cpuacct" / "docker" / full / "cpuacct.usage"):
        if candidate.is_file():
            return candidate
    raise SystemExit(f"cannot read the CPU time of container {name}: no cgroup counter under "
                     f"{root} for {full[:12]}")


def cpu_seconds(counter: Path) -> float:
    text = counter.read_text()
    if counter.name == "cpu.stat":
        return int(text.split("usage_usec", 1)[1].split()[0]) / 1e6
    return int(text) / 1e9


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores since boot (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


class CpuMeter:
    """CPU used while the `with` block runs: this process and the children it waited for
    (the client), each group of containers (CPU seconds per second of wall time, 1.0 = one
    core), and the machine's cores (busy share)."""

    def __init__(self, groups: dict[str, list[str]]):
        self.counters = {g: [container_cpu_file(c) for c in names] for g, names in groups.items()}

    def _read(self):
        return (time.monotonic(), time.process_time() + children_cpu(), machine_busy(),
                {g: sum(cpu_seconds(c) for c in cs) for g, cs in self.counters.items()})

    def __enter__(self):
        self.start = self._read()
        return self

    def __exit__(self, *exc):
        (w0, p0, (b0, t0), g0), (w1, p1, (b1, t1), g1) = self.start, self._read()
        self.wall = wall = w1 - w0
        self.cores = {"client": (p1 - p0) / wall,
                      **{g: (g1[g] - g0[g]) / wall for g in g0}}
        self.machine = (b1 - b0) / max(1, t1 - t0)


def steps(n: int) -> list[int]:
    """n, n/2, n/4, ... 1 (n first: replicas only leave, none returns)."""
    out = [n]
    while out[-1] > 1:
        out.append(out[-1] // 2)
    return out


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_deploy(mitogen: bool, containers: list[str]) -> dict:
    """One `inferfleet deploy` of the lab: its wall time, CPU and record."""
    env = dict(os.environ, INFERFLEET_MITOGEN="1" if mitogen else "0")
    cli = Path(sys.executable).parent / "inferfleet"
    controller = children_cpu()
    with CpuMeter({"containers": containers}) as meter:
        done = subprocess.run([cli, "deploy", "-i", LAB_INVENTORY], env=env, capture_output=True,
                              text=True)
    found = re.search(r"record: (\S+record\.json)", done.stdout)
    record = json.loads(Path(found[1]).read_text()) if found else {}
    changed = sum(record.get("stats", {}).get("changed", {}).values())
    return {"mitogen": mitogen, "rc": done.returncode, "changed": changed,
            "wall": meter.wall, "controller": (children_cpu() - controller) / meter.wall,
            "containers": meter.cores["containers"], "machine": meter.machine,
            "record": found[1] if found else done.stdout[-2000:] + done.stderr[-2000:]}


def deploy_phase(nodes: list, runs: int) -> int:
    containers = [LB_CONTAINER, *(n.host for n in nodes)]
    results = []
    for _ in range(runs):
        for mitogen in (False, True):
            results.append(timed_deploy(mitogen, containers))
            r = results[-1]
            print(f"{'mitogen' if mitogen else 'ansible'}: rc {r['rc']}, {r['changed']} changed, "
                  f"{r['wall']:.1f} s", flush=True)
    print(f"\nno-change `inferfleet deploy`: {len(nodes)} engine nodes and a load balancer, "
          f"{os.cpu_count()} cores shared by the controller and every host")
    print("CPU in cores (1.0 = one core busy) while each ran, and the machine's busy share")
    print(f"{'strategy':>9} {'rc':>3} {'changed':>7} {'wall s':>7} {'controller':>10} "
          f"{'containers':>10} {'machine':>7}")
    for r in results:
        print(f"{'mitogen' if r['mitogen'] else 'ansible':>9} {r['rc']:3d} {r['changed']:7d} "
              f"{r['wall']:7.1f} {r['controller']:10.2f} {r['containers']:10.2f} "
              f"{r['machine']:7.0%}")
    bad = [r for r in results if r["rc"] or r["changed"]]
    if bad:
        for r in bad:
            print(f"FAILED or not idempotent: rc {r['rc']}, {r['changed']} changed: {r['record']}")
        print("no ratio: a deploy that failed or changed something is not a no-change run")
        return 1
    walls = {m: statistics.median(r["wall"] for r in results if r["mitogen"] == m)
             for m in (False, True)}
    print(f"median: Ansible's strategy {walls[False]:.1f} s, Mitogen's {walls[True]:.1f} s: "
          f"{walls[False] / walls[True]:.2f} x faster with Mitogen (same run)")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-replica", type=int, default=8, help="requests at once per replica")
    p.add_argument("--requests-per-replica", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--deploy", action="store_true",
                   help="time no-change deploys (Ansible's strategy, Mitogen's) instead")
    p.add_argument("--deploy-runs", type=int, default=1, help="deploys of each strategy")
    args = p.parse_args()
    if args.deploy_runs < 1:
        p.error("--deploy-runs: at least 1 deploy of each strategy")
    fleet = load(LAB_INVENTORY)
    nodes = fleet.serving
    if not nodes:
        sys.exit("no lab: run `inferfleet lab up --nodes 16 --engine sim` first")
    if args.deploy:
        return deploy_phase(nodes, args.deploy_runs)
    engine = version(nodes[0].base, fleet.engine_key)
    if not engine.endswith("+sim"):
        sys.exit(f"the lab's engines are vLLM {engine}, not simulated: this benchmark needs "
                 "`inferfleet lab down && inferfleet lab up --nodes 16 --engine sim`")
    require()
    results: list[tuple[int, dict]] = []
    cpu: dict[int, CpuMeter] = {}
    groups = {"haproxy": [LB_CONTAINER], "engines": [n.host for n in nodes]}
    data = {"prompt_tokens": args.prompt_tokens, "output_tokens": args.max_tokens}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            in_service = len(nodes)
            for k in steps(len(nodes)):
                for node in nodes[k:in_service]:
                    set_state(LB_CONTAINER, node.host, "maint")
                in_service = k
                with CpuMeter(groups) as cpu[k]:
                    report = guidellm(fleet.balancers[0], fleet.api_key, fleet.model,
                                      streams=args.per_replica * k,
                                      requests=args.requests_per_replica * k, data=data,
                                      seed=k, work=Path(tmp))
                results.append((k, report))
                print(f"k={k}: {report['ok']} ok, {report['failed']} failed, "
                      f"{report['req_s']:.1f} req/s", flush=True)
        finally:
            for node in nodes:
                set_state(LB_CONTAINER, node.host, "ready")

    print(f"\ncores on this machine: {os.cpu_count()}; {len(nodes)} simulated engines, HAProxy"
          " and the client (guidellm) share them")
    print("CPU in cores (1.0 = one core busy) while each k ran, and the machine's busy share")
    print(f"{'replicas':>8} {'ok':>6} {'failed':>6} {'p50 ms':>8} {'p99 ms':>8} {'TTFT ms':>8}"
          f" {'req/s':>8} {'tok/s':>8} {'client':>7} {'haproxy':>7} {'engines':>7} {'machine':>7}")
    for k, r in results:
        c = cpu[k].cores
        print(f"{k:8d} {r['ok']:6d} {r['failed']:6d} {r['p50'] * 1000:8.1f} {r['p99'] * 1000:8.1f}"
              f" {r['ttft_p50'] * 1000:8.1f} {r['req_s']:8.1f} {r['tokens_s']:8.1f}"
              f" {c['client']:7.2f} {c['haproxy']:7.2f} {c['engines']:7.2f} {cpu[k].machine:7.0%}")
    busy = [k for k, _ in results if cpu[k].machine >= 0.9 or cpu[k].cores["client"] >= 0.9]
    if busy:
        print(f"CPU-bound at k = {', '.join(map(str, busy))}: the machine's cores (or the "
              "client's main process) were near their limit, so those throughputs measure the "
              "CPU, not the fleet; lower --per-replica or raise --max-tokens")
    failed = [(k, r) for k, r in results if r["failed"]]
    if failed:
        for k, r in failed:
            print(f"FAILED with {k} replicas: {r['failed']} of {r['ok'] + r['failed']} requests")
        print("no ratio: a run with failed requests measures nothing")
        return 1
    base = dict(results)[1]["req_s"]
    print("throughput against 1 replica (same run):")
    for k, r in sorted(results):
        print(f"  {k:3d} replicas: {r['req_s'] / base:6.2f} x  (ideal {k}, efficiency "
              f"{r['req_s'] / base / k:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
