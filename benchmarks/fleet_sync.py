"""What one pull per fleet saves: a model version to every engine node of the lab, with
and without peers, in the same run.

Needs a running lab deployed with model_sync_peers (the lab's default), e.g.
`inferfleet lab up --nodes 6 --engine sim`. Publishes a random model of --size-mib in
--files shards (format 2: pieces of 16 MiB) to the lab's object store, then syncs it
from cold caches (removed first), through the model_sync role (benchmarks/fleet_sync.yml):

  one node   the first engine node alone, from the store (one node's sync time)
  per node   every engine node at once, each from the store (before peers)
  peers      every engine node at once, taking pieces from each other

For each: the sync task's wall time from the first node's start to the last node's end
(Ansible's json callback), each node's own time (min / median / max), the bytes the
object store's container sent (its network interface's counter: what left the store,
headers included) against the model's size, and what came from peers. Every node's
result must name the published digest: the module verified every byte before it
switched. A run in which any node failed says so and exits 1 without ratios.

Here every node shares this machine's disk and two cores, so N nodes writing and hashing
N copies take about N times one node's local work whatever the design; a fleet's nodes
each have their own. --store-mbit N shapes what the store's container sends to N
megabits a second (tc in its network namespace, removed at the end): the regime of an
object store behind one link, where peers pay off, and where one node's sync is bound
by the store as on a real fleet.

    .venv/bin/python benchmarks/fleet_sync.py [--size-mib 1024] [--files 4] [--repeat 1]
        [--store-mbit 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml
from model_sync import make_model

from inferfleet.commands.common import LAB_INVENTORY
from inferfleet.lab.services import S3_ACCESS_KEY, S3_PORT, S3_SECRET_KEY
from inferfleet.publish import publish

REPO = Path(__file__).resolve().parents[1]
PLAYBOOK = REPO / "benchmarks" / "fleet_sync.yml"
STORE = "inferfleet-lab-s3"
MiB = 1024 * 1024
NAME = "fleet-sync-bench"


def engine_nodes() -> list[str]:
    out = subprocess.run([str(Path(sys.executable).parent / "ansible-inventory"), "-i",
                          str(LAB_INVENTORY), "--list"], capture_output=True, text=True,
                         check=True, cwd=REPO)
    return sorted(json.loads(out.stdout)["inference"]["hosts"])


def store_sent() -> int:
    return int(subprocess.run(["docker", "exec", STORE, "cat",
                               "/sys/class/net/eth0/statistics/tx_bytes"],
                              capture_output=True, text=True, check=True).stdout)


def shape_store(mbit: int) -> None:
    """Limit what the store's container sends (0: remove the limit)."""
    pid = subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", STORE],
                         capture_output=True, text=True, check=True).stdout.strip()
    tc = ["nsenter", "-t", pid, "-n", "tc", "qdisc"]
    if mbit:
        subprocess.run([*tc, "replace", "dev", "eth0", "root", "tbf", "rate", f"{mbit}mbit",
                        "burst", "1mb", "latency", "100ms"], check=True)
    else:
        subprocess.run([*tc, "del", "dev", "eth0", "root"], capture_output=True, check=False)


def sync(hosts: list[str], version: str, peers: bool) -> dict:
    """One run of the playbook on `hosts`; the sync task's results and wall time."""
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_FORKS=str(max(20, len(hosts))))
    before = store_sent()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(LAB_INVENTORY),
         str(PLAYBOOK), "--limit", ",".join(hosts), "-e",
         json.dumps({"bench_name": NAME, "bench_version": version, "bench_peers": peers})],
        capture_output=True, text=True, cwd=REPO, env=env)
    sent = store_sent() - before
    try:
        report = json.loads(done.stdout)
    except ValueError:
        sys.exit(f"the playbook printed no JSON report (rc {done.returncode}):\n"
                 f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    task = next((t for play in report["plays"] for t in play["tasks"]
                 if "Sync | Fetch and verify" in t["task"]["name"]), None)
    if task is None or done.returncode:
        failed = {h: r.get("msg", "") for play in report["plays"] for t in play["tasks"]
                  for h, r in t["hosts"].items() if r.get("failed")}
        sys.exit(f"FAILED: the sync did not run on every node (rc {done.returncode}): {failed}")
    span = task["task"]["duration"]
    wall = (datetime.fromisoformat(span["end"].replace("Z", "+00:00"))
            - datetime.fromisoformat(span["start"].replace("Z", "+00:00"))).total_seconds()
    return {"wall": wall, "hosts": task["hosts"], "store_sent": sent}


def check(run: dict, hosts: list[str], digest: str, label: str) -> None:
    bad = {h: r.get("msg", "no result") for h, r in run["hosts"].items()
           if r.get("failed") or r.get("manifest_digest") != digest}
    missing = sorted(set(hosts) - set(run["hosts"]))
    if bad or missing:
        sys.exit(f"FAILED ({label}): nodes that did not end with the published version "
                 f"{digest}: {bad or ''} {missing or ''}; no ratios")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each mode")
    parser.add_argument("--store-mbit", type=int, default=0,
                        help="shape the store's link to this many megabits a second")
    args = parser.parse_args()
    hosts = engine_nodes()
    if len(hosts) < 2:
        sys.exit("the lab has fewer than two engine nodes: `inferfleet lab up --nodes 6 "
                 "--engine sim` first")
    store_ip = subprocess.run(["docker", "inspect", "-f",
                               "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                               STORE], capture_output=True, text=True, check=True).stdout
    lab = yaml.safe_load((LAB_INVENTORY / "group_vars" / "all" / "lab.yml").read_text())
    version = f"r{int(time.time())}"
    with tempfile.TemporaryDirectory(prefix="fleet-sync-") as work:
        make_model(Path(work) / "model", args.size_mib * MiB, args.files)
        result = publish(Path(work) / "model",
                         f"s3://{lab['model_sync_s3_bucket']}/"
                         f"{lab['model_sync_s3_prefix']}/{NAME}/{version}",
                         endpoint_url=f"http://{store_ip.strip()}:{S3_PORT}",
                         access_key=S3_ACCESS_KEY, secret_key=S3_SECRET_KEY)
    size = sum(f["size"] for f in result.manifest["files"])
    digest = result.manifest["digest"]
    print(f"{NAME}/{version}: {size / MiB:.0f} MiB in {len(result.manifest['files'])} files, "
          f"{digest}; {len(hosts)} engine nodes", flush=True)

    modes = [("one node", hosts[:1], False), ("per node", hosts, False),
             ("peers", hosts, True)]
    rows = {label: [] for label, _, _ in modes}
    if args.store_mbit:
        print(f"the store's link: {args.store_mbit} Mbit/s", flush=True)
    shape_store(args.store_mbit)
    try:
        for _ in range(args.repeat):
            for label, targets, peers in modes:
                run = sync(targets, version, peers)
                check(run, targets, digest, label)
                rows[label].append(run)
                print(f"  {label}: {run['wall']:.1f} s, store sent "
                      f"{run['store_sent'] / size:.2f} x the model", flush=True)
    finally:
        shape_store(0)

    base = statistics.median(r["wall"] for r in rows["one node"])
    print(f"\n| run | nodes | wall (median of {args.repeat}) | x one node | each node min / "
          "median / max | store sent / model size | from peers / model size |")
    print("|---|---|---|---|---|---|---|")
    for label, targets, _ in modes:
        wall = statistics.median(r["wall"] for r in rows[label])
        last = rows[label][-1]
        each = sorted(r["seconds"] for r in last["hosts"].values())
        sent = statistics.median(r["store_sent"] for r in rows[label]) / size
        peers = sum(sum(r.get("bytes_from_peers", {}).values())
                    for r in last["hosts"].values()) / size
        print(f"| {label} | {len(targets)} | {wall:.1f} s | {wall / base:.2f} x | "
              f"{each[0]:.1f} / {statistics.median(each):.1f} / {each[-1]:.1f} s | "
              f"{sent:.2f} x | {peers:.2f} x |")


if __name__ == "__main__":
    main()
