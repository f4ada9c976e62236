"""How fast is model_sync, verifying every byte, against the tools people use instead?

Publishes a synthetic model (several shards, --size-gib in total) to a local SeaweedFS,
then times, in the same run and alternating their order on each repetition:

  (a)  s5cmd cp of the version into an empty folder (fast, verifies nothing, no fsync)
  (a') the same followed by `sync` (what it costs to make those bytes durable)
  (b)  model_sync of the version into an empty cache (ranged GETs, SHA-256 of every
       byte, fsync, rename, current switched)
  (c)  model_sync re-run on the complete version (the module alone, and through a
       whole ansible-playbook run for scale)
  (d)  cp -r of the same bytes from a local folder

and prints the medians, (b)/(a), (b)/(d) and (c). Targets: (b) <= 1.1 x (a); (c) < 0.5 s.

    .venv/bin/python benchmarks/model_sync.py --size-gib 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from inferfleet.lab.s3 import SeaweedS3  # noqa: E402
from inferfleet.publish import publish  # noqa: E402

BIN = Path(sys.executable).parent
BUCKET = "bench"
MiB = 1024 * 1024
# Runs the module file the way Ansible does (arguments from a JSON file); its module_utils
# import from the collection (ansible_collections.inferfleet.fleet, on the venv's path).
MODULE_RUNNER = "import runpy, sys; runpy.run_path(sys.argv.pop(1), run_name='__main__')"


def make_model(root: Path, total: int, shards: int) -> None:
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "llama", "synthetic": true}\n')
    rnd = random.Random(1234)
    (root / "tokenizer.json").write_bytes(rnd.randbytes(2 * MiB))
    per = total // shards
    for i in range(shards):
        size = per if i < shards - 1 else total - per * (shards - 1)
        with open(root / f"model-{i + 1:05d}-of-{shards:05d}.safetensors", "wb") as f:
            left = size
            while left:
                n = min(left, 64 * MiB)
                f.write(rnd.randbytes(n))
                left -= n


def drop(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run(["sync"], check=True)


CPU = {"client": 0.0, "server": 0.0}  # core-seconds of the last timed() command
SERVER_PID = [0]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _server_cpu() -> float:
    try:
        with open(f"/proc/{SERVER_PID[0]}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, str]:
    """Run a command; wall seconds and stdout. Its CPU (and the server's) go to CPU."""
    client0, server0 = _children_cpu(), _server_cpu()
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    CPU["client"] = _children_cpu() - client0
    CPU["server"] = _server_cpu() - server0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])}... failed:\n{done.stdout[-2000:]}"
                         f"\n{done.stderr[-2000:]}")
    return elapsed, done.stdout


def run_module(work: Path, args: dict) -> tuple[float, dict]:
    path = work / "module-args.json"
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    elapsed, out = timed([str(BIN / "python"), "-c", MODULE_RUNNER,
                          str(REPO / "plugins" / "modules" / "model_sync.py"), str(path)])
    result = json.loads(out[out.index("{"):])
    if result.get("failed"):
        raise SystemExit(f"model_sync failed: {result.get('msg')}")
    return elapsed, result


def run_playbook(work: Path, args: dict) -> float:
    play = work / "play.json"  # JSON is YAML
    play.write_text(json.dumps([{
        "name": "bench", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": sys.executable},
        "tasks": [{"name": "model_sync", "inferfleet.fleet.model_sync": args}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_LOCALHOST_WARNING="false")
    elapsed, _ = timed([str(BIN / "ansible-playbook"), "-i", "localhost,", str(play)], env)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gib", type=float, default=2.0)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--part-size-mb", type=int, default=16)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="scratch folder on the disk to measure (default: a temp folder)")
    opts = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="inferfleet-bench-", dir=opts.workdir))
    total = int(opts.size_gib * 1024 * MiB)
    server = SeaweedS3(work / "s3").start()
    SERVER_PID[0] = server._proc.pid if server._proc else 0
    try:
        print(f"work folder {work}; SeaweedFS at {server.endpoint}", flush=True)
        src = work / "src"
        start = time.perf_counter()
        make_model(src, total, opts.shards)
        size = sum(p.stat().st_size for p in src.iterdir())
        print(f"synthetic model: {opts.shards} shards + 2 small files, {size / MiB:.0f} MiB "
              f"({time.perf_counter() - start:.1f} s)", flush=True)
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
        published = publish(src, f"s3://{BUCKET}/models/bench/v1", client=client)
        print(f"published in {published.seconds:.1f} s, digest {published.manifest['digest']}",
              flush=True)

        env = dict(os.environ, **server.env())
        s5cmd = [str(BIN / "s5cmd"), "--endpoint-url", server.endpoint, "cp",
                 f"s3://{BUCKET}/models/bench/v1/*"]
        module_args = {
            "name": "bench", "version": "v1", "source": "s3", "s3_endpoint": server.endpoint,
            "s3_bucket": BUCKET, "s3_prefix": "models", "access_key": server.access_key,
            "secret_key": server.secret_key, "concurrency": opts.concurrency,
            "part_size_mb": opts.part_size_mb,
        }
        times: dict[str, list[float]] = {k: [] for k in ("a", "a_sync", "b", "c", "c_module",
                                                         "c_playbook", "d")}
        cpu: dict[str, list[tuple[float, float]]] = {"a": [], "b": [], "d": []}
        verified = 0

        def step_a() -> None:
            dest = work / "s5cmd-out"
            drop(dest)
            elapsed, _ = timed([*s5cmd, f"{dest}/"], env)
            cpu["a"].append((CPU["client"], CPU["server"]))
            start = time.perf_counter()
            subprocess.run(["sync"], check=True)
            times["a"].append(elapsed)
            times["a_sync"].append(elapsed + time.perf_counter() - start)
            drop(dest)

        def step_b_c() -> None:
            nonlocal verified
            cache = work / "cache"
            drop(cache)
            cache.mkdir()
            args = dict(module_args, cache_root=str(cache))
            elapsed, result = run_module(work, args)
            cpu["b"].append((CPU["client"], CPU["server"]))
            assert result["changed"] and result["bytes_hashed"] == size, result
            verified += result["bytes_hashed"]
            times["b"].append(elapsed)
            elapsed, result = run_module(work, args)
            assert not result["changed"] and result["bytes_downloaded"] == 0, result
            times["c"].append(elapsed)
            times["c_module"].append(result["seconds"])
            times["c_playbook"].append(run_playbook(work, args))
            drop(cache)

        def step_d() -> None:
            dest = work / "cp-out"
            drop(dest)
            elapsed, _ = timed(["cp", "-r", str(src), str(dest)])
            cpu["d"].append((CPU["client"], CPU["server"]))
            times["d"].append(elapsed)
            drop(dest)

        steps = [step_a, step_b_c, step_d]
        for i in range(opts.repeat):
            order = steps if i % 2 == 0 else list(reversed(steps))
            for step in order:
                step()
            print(f"repetition {i + 1}/{opts.repeat}: a={times['a'][-1]:.2f} s "
                  f"b={times['b'][-1]:.2f} s c={times['c'][-1]:.3f} s d={times['d'][-1]:.2f} s",
                  flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    rows = [
        ("(a)  s5cmd cp (no verification, no fsync)", "a"),
        ("(a') s5cmd cp + sync", "a_sync"),
        ("(b)  model_sync, empty cache (SHA-256 + fsync)", "b"),
        ("(c)  model_sync re-run (process)", "c"),
        ("     ... time inside the module", "c_module"),
        ("     ... whole ansible-playbook run", "c_playbook"),
        ("(d)  cp -r, local", "d"),
    ]
    print()
    print(f"{size / MiB:.0f} MiB in {opts.shards + 2} files, {opts.repeat} repetitions, "
          f"{os.cpu_count()} CPUs, concurrency {opts.concurrency}, "
          f"part size {opts.part_size_mb} MiB")
    print(f"{'run':50} {'median s':>9} {'best s':>9} {'MiB/s':>8}")
    for label, key in rows:
        rate = f"{size / MiB / med[key]:8.0f}" if key in ("a", "a_sync", "b", "d") else ""
        print(f"{label:50} {med[key]:9.3f} {best[key]:9.3f} {rate:>8}")
    print()
    print("CPU (core-seconds, medians; the machine has "
          f"{os.cpu_count()} cores shared by client and server; load average at the end "
          f"{os.getloadavg()[0]:.1f})")
    print(f"{'run':50} {'client':>9} {'server':>9} {'total':>9}")
    for label, key in (("(a) s5cmd", "a"), ("(b) model_sync", "b"), ("(d) cp -r", "d")):
        client = statistics.median(c for c, _ in cpu[key])
        srv = statistics.median(s for _, s in cpu[key])
        print(f"{label:50} {client:9.2f} {srv:9.2f} {client + srv:9.2f}")
    cpu_a = statistics.median(c + s for c, s in cpu["a"])
    cpu_b = statistics.median(c + s for c, s in cpu["b"])
    ratio_a = med["b"] / med["a"]
    print()
    print(f"(b)/(a)  = {ratio_a:.2f}  (best/best {best['b'] / best['a']:.2f}; "
          f"target <= 1.10: {'met' if ratio_a <= 1.10 else 'NOT met'})")
    print(f"(b)/(a') = {med['b'] / med['a_sync']:.2f}  (against s5cmd made durable)")
    print(f"(b)/(d)  = {med['b'] / med['d']:.2f}")
    print(f"CPU (b)/(a) = {cpu_b / cpu_a:.2f}  (client + server core-seconds; when every "
          "core is busy, as on a small machine that also runs the store, wall time follows "
          "this ratio)")
    print(f"(c)      = {med['c']:.3f} s  (module {med['c_module']:.3f} s; target < 0.5 s: "
          f"{'met' if med['c'] < 0.5 else 'NOT met'})")
    print(f"bytes verified by model_sync: {verified / MiB:.0f} MiB")


if __name__ == "__main__":
    main()
