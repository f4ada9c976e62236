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

With --operations 2,4,8,16,32 it times, instead, the operator's life cycle at each fleet
size, each on a lab of its own (`lab down`, then `lab up --nodes N+1 --engine sim
--no-deploy`, node N+1 kept in `standby` for the scale-out): a cold `deploy`, a no-change
`deploy` (0 changed), `verify`, `rollout` of a new version one instance at a time and 25 %
at a time, `scale --add` of the fresh node, and `verify --failover`. Prints one table
(seconds per operation and N; each operation's growth from the smallest N to the largest
and its slope in seconds per added node), where each operation's time goes (the
controller's CPU, the lab containers' CPU, the machine's busy share: the rest is waiting),
the rollouts' batches against one instance's switch (the median batch of the one-at-a-time
rollout), and the failover's figures against HAProxy's bound (inter x fall). Any command
that fails, a no-change deploy that changes something, or a failover that failed requests
started after the stop: said, and exit 1 without growth figures. The lab is left up at
the largest N. Every command runs with the environment's INFERFLEET_MITOGEN.
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
from datetime import datetime
from pathlib import Path

from lb_overhead import set_state
from load_client import guidellm, require

from inferfleet import inventory_edit
from inferfleet.commands.common import LAB_INVENTORY
from inferfleet.commands.lab import lab_vars
from inferfleet.fleet import duration, load, role_defaults
from inferfleet.lab.fleet import node_name

LB_CONTAINER = "inferfleet-lab-lb"
CLI = Path(sys.executable).parent / "inferfleet"


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


def timed_cli(args: list[str], containers: list[str], env: dict | None = None) -> dict:
    """One `inferfleet` command: its rc, wall time, CPU (the controller: the CLI and every
    process it starts; the lab containers; the machine's busy share), the changes its run
    made (from its record) and its output."""
    controller = children_cpu()
    with CpuMeter({"containers": containers}) as meter:
        done = subprocess.run([CLI, *args], env=env, capture_output=True, text=True)
    found = re.findall(r"record: (\S+record\.json)", done.stdout)
    stats = json.loads(Path(found[-1]).read_text()).get("stats", {}) if found else {}
    return {"rc": done.returncode, "changed": sum(stats.get("changed", {}).values()),
            "wall": meter.wall, "controller": (children_cpu() - controller) / meter.wall,
            "containers": meter.cores["containers"], "machine": meter.machine,
            "record": found[-1] if found else None, "stdout": done.stdout,
            "tail": done.stdout[-2000:] + done.stderr[-2000:]}


def timed_deploy(mitogen: bool, containers: list[str]) -> dict:
    """One `inferfleet deploy` of the lab with Ansible's strategy or Mitogen's."""
    env = dict(os.environ, INFERFLEET_MITOGEN="1" if mitogen else "0")
    r = timed_cli(["deploy", "-i", str(LAB_INVENTORY)], containers, env)
    return {**r, "mitogen": mitogen, "record": r["record"] or r["tail"]}


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


ROLL_PLAY = "Roll the instances, one batch at a time"  # playbooks/rolling_update.yml
OPERATIONS = ("cold deploy", "no-change deploy", "verify", "rollout 1 at a time",
              "rollout 25 % at a time", "scale --add 1", "verify --failover")


def batch_seconds(record: str) -> list[float]:
    """The seconds each batch of a rollout took: from the start of each run of the play
    that rolls the instances (Ansible starts it once per batch) to the next play's start."""
    marks = []
    for path in Path(record).parent.glob("artifacts/*/job_events/*.json"):
        event = json.loads(path.read_text())
        if event["event"] in ("playbook_on_play_start", "playbook_on_stats"):
            marks.append((event["counter"], datetime.fromisoformat(event["created"]),
                          event["event_data"].get("play")))
    marks.sort()
    out = [(b[1] - a[1]).total_seconds() for a, b in zip(marks, marks[1:], strict=False)
           if a[2] == ROLL_PLAY]
    if not out:
        raise SystemExit(f"no batch of the play {ROLL_PLAY!r} in the events beside {record}: "
                         "was it renamed in playbooks/rolling_update.yml?")
    return out


def lab_of(nodes: int) -> str:
    """A fresh lab of `nodes` engine nodes and one more, in standby (the scale-out's new
    node: nothing installed on it). Returns that node's name."""
    subprocess.run([CLI, "lab", "down"], capture_output=True, text=True, check=True)
    up = subprocess.run([CLI, "lab", "up", "--nodes", str(nodes + 1), "--engine", "sim",
                         "--no-deploy"], capture_output=True, text=True)
    if up.returncode:
        raise SystemExit(f"lab up --nodes {nodes + 1}: rc {up.returncode}\n{up.stdout[-2000:]}"
                         f"{up.stderr[-2000:]}")
    new = node_name(nodes + 1)
    hosts = inventory_edit.group_file(LAB_INVENTORY, [new])
    hosts.write_text(inventory_edit.leave(hosts.read_text(), [new]))
    return new


def operations_at(nodes: int) -> dict[str, dict]:
    """Every operation of OPERATIONS on a fresh lab of `nodes` engine nodes."""
    new = lab_of(nodes)
    containers = [LB_CONTAINER, *(node_name(i) for i in range(1, nodes + 2))]
    inv = ["-i", str(LAB_INVENTORY)]
    quarter = max(1, nodes // 4)
    steps_ = {
        "cold deploy": ["deploy", *inv],
        "no-change deploy": ["deploy", *inv],
        "verify": ["verify", *inv, "--json"],
        "rollout 1 at a time": ["rollout", *inv, "--version", "v2", "--serial", "1"],
        "rollout 25 % at a time": ["rollout", *inv, "--version", "v3", "--serial", str(quarter)],
        "scale --add 1": ["scale", *inv, "--add", new],
        "verify --failover": ["verify", *inv, "--failover", "--json"],
    }
    out: dict[str, dict] = {}
    for name, args in steps_.items():
        if name.startswith("rollout"):
            version = args[args.index("--version") + 1]
            subprocess.run([CLI, "lab", "publish", version, "--seed", version[1:]],
                           capture_output=True, text=True, check=True)
        r = out[name] = timed_cli(args, containers)
        if name.startswith("rollout") and not r["rc"]:
            r["batches"] = batch_seconds(r["record"])
        if name == "verify --failover" and not r["rc"]:
            r["report"] = json.loads(r["stdout"])
        print(f"N={nodes} {name}: rc {r['rc']}, {r['changed']} changed, {r['wall']:.1f} s "
              f"(controller {r['controller']:.2f}, containers {r['containers']:.2f} cores, "
              f"machine {r['machine']:.0%})"
              + (f", batches {' '.join(f'{b:.1f}' for b in r['batches'])} s" if "batches" in r
                 else ""), flush=True)
        if r["rc"] or (name == "no-change deploy" and r["changed"]):
            break
    return out


def slope(xs: list[int], ys: list[float]) -> float:
    """Least squares: seconds per added node."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    return (sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
            / sum((x - mx) ** 2 for x in xs))


def operations_phase(sizes: list[int]) -> int:
    runs = {}
    for n in sizes:
        runs[n] = operations_at(n)
        bad = [(op, r) for op, r in runs[n].items()
               if r["rc"] or (op == "no-change deploy" and r["changed"])]
        if bad:
            for op, r in bad:
                print(f"FAILED at N={n}: {op}: rc {r['rc']}, {r['changed']} changed; "
                      f"{r['record'] or r['tail']}")
            print("no growth figures: an operation that failed or a no-change deploy that "
                  "changed something measures nothing")
            return 1
    print(f"\nthe operator's life cycle per fleet size: seconds (N engine nodes, one HAProxy; "
          f"{os.cpu_count()} cores shared by the controller and every host; "
          f"INFERFLEET_MITOGEN={os.environ.get('INFERFLEET_MITOGEN', '0')})")
    head = "".join(f"{'N=' + str(n):>9}" for n in sizes)
    print(f"{'operation':24}{head} {'growth':>8} {'s/node':>7}")
    for op in OPERATIONS:
        walls = [runs[n][op]["wall"] for n in sizes]
        grow = (f"{walls[-1] / walls[0]:7.2f}x {slope(sizes, walls):7.2f}" if len(sizes) > 1
                else "")
        print(f"{op:24}" + "".join(f"{w:9.1f}" for w in walls) + f" {grow}")
    print("\nwhere the time goes: the controller's CPU / the lab containers' CPU in cores "
          "(1.0 = one core) / the machine's busy share; the rest of the wall time is waiting")
    print(f"{'operation':24}" + "".join(f"{'N=' + str(n):>17}" for n in sizes))
    for op in OPERATIONS:
        print(f"{op:24}" + "".join(
            f"{runs[n][op]['controller']:6.2f}/{runs[n][op]['containers']:4.2f}/"
            f"{runs[n][op]['machine']:4.0%}".rjust(17) for n in sizes))
    print("\nrollouts: one instance's switch = the median batch of the one-at-a-time rollout")
    print(f"{'N':>4} {'switch s':>9} {'batches':>8} {'25 %: s':>8} {'batches':>8} "
          f"{'x switch':>9}")
    for n in sizes:
        switch = statistics.median(runs[n]["rollout 1 at a time"]["batches"])
        quarter = runs[n]["rollout 25 % at a time"]
        print(f"{n:4d} {switch:9.1f} {len(runs[n]['rollout 1 at a time']['batches']):8d} "
              f"{quarter['wall']:8.1f} {len(quarter['batches']):8d} "
              f"{quarter['wall'] / switch:9.2f}")
    lb = {**role_defaults("load_balancer"), **lab_vars()}
    bound = duration(lb["load_balancer_health_inter"]) * int(lb["load_balancer_health_fall"])
    print(f"\nfailover: the last instance's engine stopped under load; HAProxy's bound "
          f"inter x fall = {bound:g} s")
    print(f"{'N':>4} {'out after s':>12} {'back after s':>13} {'sent':>6} {'failed':>7}")
    for n in sizes:
        f = runs[n]["verify --failover"]["report"]["failover"]
        print(f"{n:4d} {f['taken_out_after_s']:12.1f} {f['put_back_after_s']:13.1f} "
              f"{f['sent']:6d} {f['failed']:7d}")
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
    p.add_argument("--operations", metavar="N,N,...",
                   help="time the operator's life cycle on a fresh lab of each size instead")
    args = p.parse_args()
    if args.deploy_runs < 1:
        p.error("--deploy-runs: at least 1 deploy of each strategy")
    if args.operations is not None:
        try:
            sizes = sorted({int(n) for n in args.operations.split(",")})
        except ValueError:
            p.error(f"--operations {args.operations}: fleet sizes, e.g. 2,4,8,16,32")
        if sizes[0] < 2 or sizes[-1] > 63:
            p.error(f"--operations {args.operations}: sizes from 2 to 63 (the lab holds 64 "
                    "nodes, one of them the scale-out's)")
        return operations_phase(sizes)
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
