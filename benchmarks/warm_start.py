"""What a warm compile cache saves when a vLLM engine starts, on this machine's CPU build.

One container of the lab's engine image (vLLM's CPU build installed by the role,
inferfleet.lab.image) serves the lab's tiny model compiled (no --enforce-eager, as the
pipeline's members run), and the engine is started again and again, each time timed from
`vllm serve` to the first /health 200:

  cold        vLLM's cache root removed before each start (a node that never ran this
              model with these settings)
  warm        the cache root the previous start left (a node that did, or that fetched
              the cache from one that did)
  modelinfos  only the cache root's modelinfos/ kept, torch_compile_cache/ removed: what
              the compile cache itself is worth

each --repeat times (medians printed). For each start, whether vLLM loaded its compiled
model from the cache ("Directly load AOT compilation") or compiled it: vLLM 0.32's CPU
build never loads it here ("'function' object has no attribute 'finalize_loading'", with
VLLM_USE_MEGA_AOT_ARTIFACT=0 too: the CPU backend runs without Inductor and saves a plain
function), so a warm start compiles again. A start that never answers stops the
benchmark, which says so and exits 1.

    .venv/bin/python benchmarks/warm_start.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from inferfleet.lab import tinymodel
from inferfleet.lab.image import ensure_engine_image, ensure_node_image
from inferfleet.lab.wheelhouse import DEFAULT_DIR, ensure_wheelhouse

NAME = "inferfleet-bench-warm-start"
CACHE_ROOT = "/cache/vllm"
# `vllm serve` from the virtualenv the role installed in the image (its one venv-*)
SERVE = ("$(ls /opt/inferfleet/engine/venv-*/bin/vllm) serve /model --served-model-name tiny "
         "--port 8000 --dtype float32 --max-model-len 1024 --max-num-seqs 8")
START_TIMEOUT_S = 600


def sh(cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "exec", NAME, "bash", "-c", cmd], capture_output=True,
                          text=True, check=check)


MODES = {
    "cold": f"rm -rf {CACHE_ROOT}",
    "warm": "true",
    "modelinfos": f"rm -rf {CACHE_ROOT}/torch_compile_cache",
}


def start_once(mode: str) -> tuple[float, str]:
    """Start the engine, wait for /health, stop it; return (seconds, what the cache did)."""
    sh(MODES[mode])
    sh("rm -f /tmp/serve.log")
    began = time.monotonic()
    sh(f"VLLM_CACHE_ROOT={CACHE_ROOT} VLLM_CPU_KVCACHE_SPACE=1 nohup {SERVE} "
       "> /tmp/serve.log 2>&1 &")
    while sh("curl -sf -o /dev/null http://127.0.0.1:8000/health", check=False).returncode:
        if time.monotonic() - began > START_TIMEOUT_S or sh("pgrep -f '[v]llm serve'",
                                                            check=False).returncode:
            log = sh("grep -E 'Error|error|Exception' /tmp/serve.log | tail -15",
                     check=False).stdout
            sys.exit(f"FAILED: the engine did not answer /health ({mode} start); "
                     f"no figures printed\n{log}")
        time.sleep(0.2)
    took = time.monotonic() - began
    log = sh("cat /tmp/serve.log").stdout
    sh("pkill -f '[v]llm serve'; while pgrep -f '[v]llm serve' >/dev/null; do sleep 0.2; done")
    if "Directly load AOT compilation" in log:
        return took, "loaded"
    if "load failure" in log:
        return took, "load failed, compiled"
    return took, "compiled"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    house = ensure_wheelhouse(DEFAULT_DIR)
    image = ensure_engine_image(ensure_node_image(), house)
    with tempfile.TemporaryDirectory(prefix="inferfleet-warm-") as tmp:
        model = tinymodel.generate(Path(tmp) / "model")
        subprocess.run(["docker", "rm", "-f", NAME], capture_output=True)
        subprocess.run(["docker", "run", "-d", "--init", "--name", NAME, "--shm-size", "1g", "-v",
                        f"{model}:/model:ro", image, "sleep", "infinity"], check=True,
                       capture_output=True)
        try:
            start_once("cold")  # a first start: the image's files into the page cache
            runs = {mode: [start_once(mode) for _ in range(args.repeat)] for mode in MODES}
        finally:
            subprocess.run(["docker", "rm", "-f", NAME], capture_output=True)
    print(f"engine start to /health, {args.repeat} runs each (median; min..max; the cache):")
    medians = {}
    for mode, results in runs.items():
        times = [t for t, _ in results]
        medians[mode] = statistics.median(times)
        what = ", ".join(sorted({w for _, w in results}))
        print(f"  {mode:10} {medians[mode]:6.1f} s  ({min(times):.1f}..{max(times):.1f}; {what})")
    for mode in ("warm", "modelinfos"):
        print(f"  {mode} / cold = {medians[mode] / medians['cold']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
