"""The GPU check bundle (scripts/gpu-check/bundle.sh), built from this tree and run the
way the GPU machine runs it, on stand-ins: a FAKE nvidia-smi answering from the L40S
samples of tests/fixtures/nvidia-smi with a fake sys/ + proc/ tree (the loaded driver
550.144.03, proprietary), and a Python like the machine's (PyTorch, transformers and
safetensors, no Ansible), here the CPU build from the lab's wheelhouse. The bundle installs
ansible-core and the collections from what it carries, offline; the check playbook reads
the fake GPUs and plans gpu_driver in check mode; measure.py compares the planner with
what PyTorch allocates (small shapes of the same structure on the CPU) and fits profiles
that the simulated engine loads."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "nvidia-smi"
FAKE_FILES = REPO / "molecule" / "gpu_host" / "files"
L40S_BUS = ["0000:41:00.0", "0000:c1:00.0"]


def fake_l40s(base: Path) -> tuple[Path, Path]:
    """Two FAKE L40S GPUs with driver 550.144.03 loaded: (fake nvidia-smi, host root)."""
    spec = importlib.util.spec_from_file_location("fake_gpu_tree", FAKE_FILES / "fake_gpu_tree.py")
    tree = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tree)
    root = Path(tree.build(str(base), [[a, "0x26b9"] for a in L40S_BUS], [],
                          ["nvidia", "nvidia_uvm"]))
    for kind in ("query.csv", "health.csv", "q-compute.txt", "topo.txt"):
        shutil.copy(FIXTURES / f"l40sx2.{kind}", base / "nvidia-smi" / kind)
    smi = base / "bin" / "fake-nvidia-smi"
    shutil.copy(FAKE_FILES / "fake-nvidia-smi", smi)
    smi.chmod(0o755)
    shutil.copy(FIXTURES / "proc-driver-version-proprietary.txt",
                root / "proc" / "driver" / "nvidia" / "version")
    return smi, root


@pytest.fixture(scope="module")
def torch_python(request, tmp_path_factory) -> Path:
    """A Python like the GPU validation machine's: PyTorch (here the CPU build from the
    lab's wheelhouse), transformers and safetensors, no Ansible. INFERFLEET_TORCH_PYTHON
    names one to use instead."""
    if os.environ.get("INFERFLEET_TORCH_PYTHON"):
        return Path(os.environ["INFERFLEET_TORCH_PYTHON"])
    wheelhouse = request.getfixturevalue("wheelhouse")
    venv = tmp_path_factory.mktemp("torch") / "python"
    subprocess.run(["python3", "-m", "venv", venv], check=True)
    subprocess.run([venv / "bin" / "pip", "install", "--quiet", "--no-index", "--find-links",
                    wheelhouse, "torch", "transformers", "safetensors"], check=True)
    return venv / "bin" / "python"


def test_the_bundle_runs_the_shipped_code_on_stand_ins(torch_python, tmp_path, free_port):
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
    kinds = ["weights_bf16", "weights_fp8", "kv_per_token"]  # this torch has float8
    assert sorted((r["shape"], r["what"]) for r in memory["rows"]) == sorted(
        (shape, kind) for shape in ("llama-3.1-8b", "qwen2.5-72b") for kind in kinds)
    for row in memory["rows"]:
        assert row["within_1pct"] and abs(row["ratio"] - 1) <= 0.01, row
        assert row["measured_bytes"] > 0 and row["planner_bytes"] > 0, row

    # The fitted profile, loaded and served by the simulated engine.
    profiles = sorted(p for p in out.glob("profile-*.json") if not p.name.endswith(".points.json"))
    assert [p.name for p in profiles] == ["profile-llama-3.1-8b.json", "profile-qwen2.5-72b.json"]
    fitted, other = (json.loads(p.read_text()) for p in profiles)
    assert sorted(other) == sorted(fitted)
    assert (fitted["name"], other["name"]) == ("cpu-small-llama", "cpu-small-qwen")
    assert (fitted["block_size"], fitted["max_num_seqs"]) == (16, 256) and fitted["kv_blocks"] > 0
    assert all(v >= 0 for k, v in fitted.items() if k.endswith("_ms")), fitted
    assert fitted["decode_base_ms"] > 0 and fitted["prefill_per_token_ms"] > 0, fitted
    points = json.loads((out / "profile-llama-3.1-8b.points.json").read_text())
    assert {p["kind"] for p in points["points"]} == {"decode", "prefill"}
    assert points["ceilings"] == "unknown"  # a CPU has no known peak
    assert points["simulator_default"]["name"] == "l4-qwen2.5-0.5b"
    port = free_port()
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


def test_measure_names_a_folder_without_the_planner(torch_python, tmp_path):
    missing = tmp_path / "no-such-collections"
    done = subprocess.run([torch_python, REPO / "scripts" / "gpu-check" / "measure.py", "memory",
                           "--collections", missing, "--out", tmp_path / "out", "--device", "cpu"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert str(missing) in done.stderr
