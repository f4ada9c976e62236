"""What a compile cache taken from a peer saves at an engine's first start, through the roles.

Needs the lab's two vLLM engine nodes up (`inferfleet lab up`, deployed or not). Each round
stops both engines, removes vLLM's cache root and the model cache's vllm-compile-cache on
both, and runs `inferfleet deploy` with the engines compiled (inference_engine_extra_args:
[]; the lab runs them eager), with inference_engine_compile_cache_share off (node2
compiles cold) and on (node2 takes node1's cache before it starts), alternately. site.yml
starts node1 first and alone: with the sharing on, node1 compiles and offers its cache.

For node2's start, from its engine unit's journal: systemd's start to vLLM's "Application
startup complete", and vLLM's "init engine ... took" (the compile is in it). Medians and
the ratios shared / cold are printed. A deploy that fails, a start without those lines,
or a node2 that did (or did not) take the cache against the setting stops the benchmark,
which says so and exits 1 without figures (the lab's engines are then left compiled:
`inferfleet lab up` again). At the end the lab is deployed as it was (eager engines).

    .venv/bin/python benchmarks/compile_cache_share.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from inferfleet.lab import fleet

NODES = [fleet.node_name(1), fleet.node_name(2)]
RESET = ("systemctl stop inferfleet-engine; rm -rf /var/lib/inferfleet/engine/.cache/vllm "
         "/var/lib/inferfleet/models/vllm-compile-cache; journalctl --rotate -q; "
         "journalctl --vacuum-time=1s -q")
TAKEN = "test -e /var/lib/inferfleet/models/vllm-compile-cache/current"
CLI = Path(sys.executable).parent / "inferfleet"


def on(node: str, cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "exec", node, "bash", "-c", cmd], capture_output=True,
                          text=True, check=check)


def deploy(extra: dict) -> None:
    for node in NODES:
        on(node, RESET)
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
        yaml.safe_dump(extra, f)
        f.flush()
        done = subprocess.run([str(CLI), "deploy", "-e", f"@{f.name}"], capture_output=True,
                              text=True)
    if done.returncode:
        sys.exit(f"FAILED: inferfleet deploy with {extra}: rc {done.returncode}; no figures "
                 f"printed\n{done.stdout[-3000:]}{done.stderr[-1000:]}")


def node2_start(share: bool) -> tuple[float, float]:
    deploy({"inference_engine_extra_args": [], "inference_engine_compile_cache_share": share})
    taken = on(NODES[1], TAKEN, check=False).returncode == 0
    if taken != share:
        sys.exit(f"FAILED: with the sharing {'on' if share else 'off'}, {NODES[1]} "
                 f"{'took' if taken else 'did not take'} a compile cache; no figures printed")
    log = on(NODES[1], "journalctl -u inferfleet-engine -o short-unix --no-pager").stdout
    started = [float(line.split()[0]) for line in log.splitlines()
               if re.search(r"systemd\[1\]: Start(ed|ing) inferfleet-engine", line)]
    ready = [float(line.split()[0]) for line in log.splitlines()
             if "Application startup complete" in line]
    init = re.findall(r"init engine .* took ([0-9.]+) s", log)
    if not (started and ready and init):
        sys.exit(f"FAILED: {NODES[1]}'s journal shows no complete engine start; no figures "
                 "printed")
    return ready[-1] - started[-1], float(init[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs = {False: [], True: []}
    for _ in range(args.rounds):
        for share in (False, True):
            runs[share].append(node2_start(share))
    deploy({})  # the lab as `lab up` leaves it
    print(f"{NODES[1]}'s first start of a compiled configuration, {args.rounds} rounds:")
    medians = {}
    for share, label in ((False, "cold (no sharing)"), (True, "cache from node1")):
        starts = [s for s, _ in runs[share]]
        inits = [i for _, i in runs[share]]
        medians[share] = (statistics.median(starts), statistics.median(inits))
        print(f"  {label:18} start to ready {medians[share][0]:5.1f} s "
              f"({', '.join(f'{s:.1f}' for s in starts)}); vLLM's init engine "
              f"{medians[share][1]:5.1f} s")
    print(f"  shared / cold: start {medians[True][0] / medians[False][0]:.2f}, "
          f"init engine {medians[True][1] / medians[False][1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
