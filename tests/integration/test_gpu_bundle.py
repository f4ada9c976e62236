"""The GPU check bundle (scripts/gpu-check/bundle.sh), built from this tree and run the
way the GPU machine runs it, on stand-ins: a FAKE nvidia-smi answering from the L40S
samples of tests/fixtures/nvidia-smi with a fake sys/ + proc/ tree (the loaded driver
550.144.03, proprietary), and a Python like the machine's (PyTorch, transformers and
safetensors, no Ansible), here the CPU build from the lab's wheelhouse. The bundle installs
ansible-core and the collections from what it carries, offline; the check playbook reads
the fake GPUs and plans gpu_driver in check mode; measure.py compares the planner with
what PyTorch allocates and fits a profile that the simulated engine loads."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "nvidia-smi"
FAKE_SMI = REPO / "molecule" / "gpu_host" / "files" / "fake-nvidia-smi"
L40S_BUS = ["0000:41:00.0", "0000:c1:00.0"]


def fake_l40s(base: Path) -> tuple[Path, Path]:
    """Two FAKE L40S GPUs with driver 550.144.03 loaded: (fake nvidia-smi, host root)."""
    (base / "bin").mkdir(parents=True)
    samples = base / "nvidia-smi"
    samples.mkdir()
    for kind in ("query.csv", "health.csv", "q-compute.txt", "topo.txt"):
        shutil.copy(FIXTURES / f"l40sx2.{kind}", samples / kind)
    smi = base / "bin" / "fake-nvidia-smi"
    shutil.copy(FAKE_SMI, smi)
    smi.chmod(0o755)
    root = base / "root"
    devices = [(a, "0x10de", "0x26b9", "0x030200") for a in L40S_BUS]
    devices.append(("0000:00:00.0", "0x8086", "0x09a2", "0x060000"))
    for address, vendor, device, klass in devices:
        folder = root / "sys" / "bus" / "pci" / "devices" / address
        folder.mkdir(parents=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", klass)):
            (folder / name).write_text(value + "\n")
    (root / "proc" / "driver" / "nvidia").mkdir(parents=True)
    shutil.copy(FIXTURES / "proc-driver-version-proprietary.txt",
                root / "proc" / "driver" / "nvidia" / "version")
    (root / "proc" / "modules").write_text(
        "".join(f"{m} 16384 0 - Live 0x0000000000000000\n" for m in ("nvidia", "nvidia_uvm")))
    return smi, root


def test_the_bundle_runs_the_shipped_code_on_stand_ins(torch_python, tmp_path):
    bundle = tmp_path / "bundle"
    built = subprocess.run([REPO / "scripts" / "gpu-check" / "bundle.sh", bundle],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    size = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    assert size < 64 * 2**20, f"the bundle is {size / 2**20:.1f} MiB"
    assert not any(p.name.startswith("ansible") and p.suffix == ".whl"
                   and "core" not in p.name for p in (bundle / "wheels").iterdir())

    smi, root = fake_l40s(tmp_path / "fake-gpu")
    out = tmp_path / "out"
    env = {
        "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
        "HOME": str(tmp_path / "home"),
        "OUT": str(out),
        "GPU_CHECK_PYTHON": str(torch_python),
        "GPU_CHECK_NVIDIA_SMI": str(smi),
        "GPU_CHECK_HOST_ROOT": str(root),
        "GPU_CHECK_DEVICE": "cpu",
        # No pip configuration (no index, no find-links of this machine): the bundle's
        # wheels alone must install ansible-core, as on the GPU machine without network.
        "PIP_CONFIG_FILE": os.devnull,
    }
    start = time.monotonic()
    ran = subprocess.run(["bash", bundle / "run.sh"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    took = time.monotonic() - start
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(out.glob("*.log")))
    assert ran.returncode == 0, f"{ran.stdout}\n{ran.stderr}\n{logs}"
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary] == ["setup", "ansible", "memory", "profile"]
    assert all(": passed in " in line for line in summary), summary
    print(f"run.sh took {took:.0f} s: {summary}")

    facts = json.loads((out / "gpu_facts.json").read_text())
    assert facts["count"] == 2 and facts["model"] == "NVIDIA L40S"
    assert facts["driver"]["version"] == "550.144.03"
    assert facts["driver"]["kernel_module"] == "proprietary"
    plan = json.loads((out / "gpu_driver_plan.json").read_text())
    assert (plan["driver"], plan["load"], plan["packages"]) == ("keep", "none", [])
    assert plan["branch"] == "550" and plan["flavour"] == "proprietary"
    # On a host it never ran on, the role would write its own two files and nothing else.
    planned = (out / "planned-changes.txt").read_text().splitlines()
    assert len(planned) == 2, planned
    assert "Hold the NVIDIA driver packages to branch 550" in planned[0]
    assert "Blacklist nouveau" in planned[1]

    memory = json.loads((out / "memory.json").read_text())
    rows = memory["rows"]
    assert {r["what"] for r in rows} >= {"weights_bf16", "kv_per_token"}
    assert {r["shape"] for r in rows} == {"llama-3.1-8b", "qwen2.5-72b"}
    assert all(r["within_1pct"] for r in rows), rows

    # The fitted profile, loaded and served by the simulated engine.
    profiles = sorted(p for p in out.glob("profile-*.json") if not p.name.endswith(".points.json"))
    assert [p.name for p in profiles] == ["profile-llama-3.1-8b.json", "profile-qwen2.5-72b.json"]
    fitted = json.loads(profiles[0].read_text())
    assert fitted["decode_base_ms"] > 0 and fitted["prefill_per_token_ms"] > 0, fitted
    points = json.loads((out / "profile-llama-3.1-8b.points.json").read_text())
    assert points["simulator_default"]["name"] == "l4-qwen2.5-0.5b"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    engine = subprocess.Popen(
        ["python3", REPO / "roles" / "inference_engine" / "files" / "sim_engine.py", "/models/m",
         "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(port),
         "--profile", profiles[0]],
        stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/v1/completions"
        body = json.dumps({"model": "m", "prompt": "one two three", "max_tokens": 4}).encode()
        for _ in range(100):
            try:
                request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=10) as answer:
                    assert answer.status == 200
                    assert json.load(answer)["usage"]["completion_tokens"] == 4
                break
            except (ConnectionError, urllib.error.URLError):
                time.sleep(0.1)
        else:
            pytest.fail(f"the simulated engine did not answer on port {port}")
    finally:
        engine.terminate()
        log = engine.communicate(timeout=30)[1]
    assert f"profile {fitted['name']}" in log, log
